"""How fast `dflashctl` starts (issues 16 and 25): each command a new process, against baselines measured in the
same run.

    .venv/bin/python benchmarks/startup.py [--calls 15] [--before REV] [--status-before REV]
                                           [--out benchmarks/results/startup.md]

Rows: `dflashctl version`, `--help` (typer's own, rendered each time: issue 25 removed the help cache), `status
--json` on a local run, `status --json` over ssh (loopback sshd + a `pct` over real LXC containers,
benchmarks/loopback.py) through the default path (the host's connection master, warm: one untimed call first) and
with no master (`persist = 0`), and the plain `status` (the table) through the warm master. No command server and no
runners (issue 25 removed both): every row is the one path a user gets. Masters live in a state directory of the
run's own (DFLASHCTL_STATE_DIR), ended at the end with `hosts disconnect`. Baselines: `python -c pass` (the
interpreter's floor), `ssh -o ControlMaster=no host true` (ssh's floor) and the seed's raw one-liner; and `version` /
`--help` of the tree before issue 16 (--before REV, default the last commit before it, exported with `git archive`
and run as `python -P -m dflashctl` beside this tree run the same way). Calls alternate between the rows of a group,
so load drifts hit all of them alike; the table gives median and best of N and the ratios of medians. A last table
repeats the warm-master status with NVML readable in the container (the fake pynvml of tests/harness/fakes), as on
a GPU host whose image has nvidia-ml-py, beside the one-liner (which runs nvidia-smi either way). Goals (issue 25):
`version` ≤ 2.5× `python -c pass`; one-shot status over ssh through the default path ≤ 1.0× the raw one-liner.
Needs root and sshd, as the real-sshd tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from loopback import (
    DFLASHCTL,
    ROOT,
    SEED_GPUS,
    PveEnv,
    frozen_run,
    loopback_pve,
    publish,
    raw_oneliner,
    result_path,
    sshd_missing,
    summary,
    timed,
    wait_for,
)
from status.runprog import start_local

Check = Callable[[bytes], bool]
BEFORE = "9d0c31e"  # the tree before issue 16's start-up work (ece89f0, the next, took its first lazy imports)


def hosts_with_persist(base: Path, seconds: float) -> Path | None:
    """A copy of the harness hosts.toml with `persist` on the ssh host; None when this dflashctl has no master."""
    from dflashctl.config import load_inventory
    from dflashctl.errors import ConfigError

    path = base.with_name(f"hosts-persist-{seconds:g}.toml")
    head, _, rest = base.read_text().partition("[hosts.pve]\n")
    body, nxt, tail = rest.partition("\n[")  # the pve entry's own lines: any `persist` of the harness's goes
    body = "\n".join(line for line in body.split("\n") if not line.startswith("persist ="))
    path.write_text(f"{head}[hosts.pve]\npersist = {seconds:g}\n{body}{nxt}{tail}")
    try:
        load_inventory(path)
    except ConfigError:
        return None
    return path


def nvml_rows(pve: PveEnv, raw: list[str], status: list[str], env: dict[str, str],
              calls: int) -> list[str]:
    """The same status with NVML readable in the container, as on a GPU host whose image has nvidia-ml-py (env: the
    warm-master row's; its hosts file is copied with a wrapper as `python`): the probe reads the GPUs in-process
    (tests/harness/fakes/pynvml stands in for the bindings and the driver) while the raw one-liner still runs
    nvidia-smi. The stand-in nvidia-smi's cost is mostly a Python start (see gpu_probe_cost.md), so the table above
    charges both sides a GPU read a real host charges neither exactly."""
    fakes = pve.workspace_dir / ".fakes"  # the container sees /workspace only, not this checkout
    shutil.copytree(ROOT / "tests" / "harness" / "fakes" / "pynvml", fakes / "pynvml",
                    ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    scenario = fakes / "nvml-startup.json"
    scenario.write_text(json.dumps({"gpus": [{"memory_used_mib": g["memory.used"], "utilization_pct": 0,
                                              "name": "NVIDIA H100 80GB HBM3 (fake NVML)"} for g in SEED_GPUS]}))
    # the container's python3 with the bindings on its path: a wrapper named as the host's `python` (the running
    # container's LXC config, lxc.environment included, was made at its start; one `sh` exec more per probe)
    wrapper = fakes / "python3"
    wrapper.write_text("#!/bin/sh\nPYTHONPATH=/workspace/.fakes DFLASH_FAKE_NVML=/workspace/.fakes/nvml-startup.json "
                       "exec python3 \"$@\"\n")
    wrapper.chmod(0o755)
    hosts = Path(env["DFLASHCTL_HOSTS"])
    nvml_hosts = hosts.with_name("hosts-nvml.toml")
    head, _, rest = hosts.read_text().partition("[hosts.pve]\n")
    nvml_hosts.write_text(f"{head}[hosts.pve]\n" + rest.replace('python = "python3"\n',
                                                                 'python = "/workspace/.fakes/python3"\n', 1))
    env = {**env, "DFLASHCTL_HOSTS": str(nvml_hosts)}
    _, first = timed(status, env)  # untimed: starts this hosts file's master
    if b"(fake NVML)" not in first:
        return ["", f"(NVML rows left out: the probe did not read the fake NVML: {first[:200]!r})"]
    rows: dict[str, tuple[list[str], dict[str, str], Check]] = {
        "raw one-liner (ControlMaster=no)": (raw, env, lambda o: b"===" in o)}
    rows["dflashctl status --json, warm master, NVML in the container"] = (status, env, is_json_status)
    seconds = measure(rows, calls)
    return table("status --json over ssh, NVML readable in the container (fake pynvml; the one-liner: nvidia-smi)",
                 seconds, "raw one-liner (ControlMaster=no)", {})


def exported(rev: str) -> Path:
    """REV's dflashctl package in a temporary directory (for PYTHONPATH): the code before, the same interpreter."""
    dest = Path(tempfile.mkdtemp(prefix="dflash-before-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "dflashctl"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def measure(rows: dict[str, tuple[list[str], dict[str, str], Check]], calls: int) -> dict[str, list[float]]:
    """Each row `calls` times, round-robin, after one untimed call each (it writes the bytecode caches an installed
    dflashctl has from pip); every call's output checked (a fast wrong answer is no answer)."""
    seconds: dict[str, list[float]] = {k: [] for k in rows}
    for argv, env, _ in rows.values():
        timed(argv, env)
    for _ in range(calls):
        for name, (argv, env, ok) in rows.items():
            dt, out = timed(argv, env)
            if not ok(out):
                again = subprocess.run(argv, capture_output=True, env=env, timeout=120, check=False)
                raise AssertionError(f"{name}: unexpected output {out[:300]!r} (again: exit {again.returncode}, "
                                     f"stderr {again.stderr[-600:]!r})")
            seconds[name].append(dt)
    return seconds


def is_json_status(out: bytes) -> bool:
    try:
        return bool(json.loads(out).get("verdict"))
    except ValueError:
        return False


def table(title: str, seconds: dict[str, list[float]], baseline: str, goals: dict[str, str]) -> list[str]:
    base = summary(seconds[baseline])[0]
    lines = ["", f"### {title}", "", f"| command | median | best | median / {baseline} | goal |",
             "|---|---:|---:|---:|---|"]
    for name, ts in seconds.items():
        med, best = summary(ts)
        goal = goals.get(name, "")
        lines.append(f"| {name} | {med * 1000:.0f} ms | {best * 1000:.0f} ms | {med / base:.2f} | {goal} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--before", default=BEFORE, help="the tree to compare version and --help with")
    ap.add_argument("--out", default=result_path("startup.md"))
    ap.add_argument("--only-ssh", action="store_true",
                    help="only the status-over-ssh group (and its NVML table): the CLI-start and local groups left out")
    ap.add_argument("--status-before", metavar="REV", default=None,
                    help="also time `python -P -m dflashctl status --json` (warm master) of REV's tree beside this "
                         "tree's, in the ssh group (a before/after of the one-shot status in the same run)")
    args = ap.parse_args()
    if sshd_missing():
        return 2
    import typer

    load = os.getloadavg()
    out = [f"# dflashctl start-up ({time.strftime('%Y-%m-%d %H:%M:%S %Z')})", "",
           f"{os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min) at the "
           f"start; Python {sys.version.split()[0]}, typer {typer.__version__}; {args.calls} calls a row, "
           "alternating within each group, after one untimed call a row (bytecode cached, as installed); each call "
           "a new process. Compare the ratios, not the milliseconds "
           "(machine shared, load noisy).", "",
           "Command: `.venv/bin/python benchmarks/startup.py" + (" --only-ssh" if args.only_ssh else "")
           + (f" --status-before {args.status_before}" if args.status_before else "") + "`"]
    local_proc = None
    prev: Path | None = None  # --status-before's tree
    state = Path(tempfile.mkdtemp(prefix="dfs-", dir="/tmp"))  # short: UNIX socket paths
    with loopback_pve("dflash-startup-") as (sshd, pve):
        try:
            # bytecode written as a pip install has it (this machine sets PYTHONDONTWRITEBYTECODE: every start would
            # compile our modules from source, a cost no installed dflashctl pays)
            env = {k: v for k, v in {**os.environ, **sshd.env}.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env["DFLASHCTL_STATE_DIR"] = str(state)
            dfl = str(DFLASHCTL)
            mod = [sys.executable, "-P", "-m", "dflashctl"]  # -P: not the cwd's tree first
            if not args.only_ssh:
                old = exported(args.before)
                old_env = {**env, "PYTHONPATH": str(old)}
                is_version, is_help = (lambda o: o.strip() == b"0.1.0"), (lambda o: b"Usage: dflashctl" in o)
                seconds = measure({
                    "python -c pass": ([sys.executable, "-c", "pass"], env, lambda o: o == b""),
                    "dflashctl version": ([dfl, "version"], env, is_version),
                    "dflashctl --help": ([dfl, "--help"], env, is_help),
                    "python -m dflashctl version": ([*mod, "version"], env, is_version),
                    f"python -m dflashctl version, before ({args.before})": ([*mod, "version"], old_env, is_version),
                    "python -m dflashctl --help": ([*mod, "--help"], env, is_help),
                    f"python -m dflashctl --help, before ({args.before})": ([*mod, "--help"], old_env, is_help),
                }, args.calls)
                shutil.rmtree(old, ignore_errors=True)
                floor = summary(seconds["python -c pass"])[0]
                out += table("CLI start (no host contacted)", seconds, "python -c pass",
                             {"dflashctl version": "≤ 2.5× python -c pass"
                              + (" ✓" if summary(seconds["dflashctl version"])[0] <= 2.5 * floor else " ✗")})

                run_dir, local_proc = start_local(pve.local_workspace_dir, "20261201-1900-startup", step_s=0.001)
                wait_for(lambda: (run_dir / "train.log").stat().st_size > 700_000, what="a 700 kB local log")
                local_proc.send_signal(signal.SIGSTOP)  # frozen: every call reads the same log
                rows: dict[str, tuple[list[str], dict[str, str], Check]] = {
                    "python -c pass": ([sys.executable, "-c", "pass"], env, lambda o: o == b"")}
                rows["dflashctl status --json --host local"] = ([dfl, "status", "--json", "--host", "local"], env,
                                                                is_json_status)
                seconds = measure(rows, args.calls)
                out += table("status --json, local host (a run with a 700 kB log)", seconds, "python -c pass", {})

            ssh_run = frozen_run(pve, "20261201-1901-startup")
            no_master = raw_oneliner(sshd, pve, ssh_run, "-o", "ControlMaster=no")
            rows = {
                "ssh -o ControlMaster=no host true": (sshd.ssh_argv("true")[:1] + ["-o", "ControlMaster=no"]
                                                      + sshd.ssh_argv("true")[1:], env, lambda o: o == b""),
                "raw one-liner (ControlMaster=no)": (no_master, env, lambda o: b"===" in o),
            }
            off = hosts_with_persist(pve.hosts_file, 0)
            on = hosts_with_persist(pve.hosts_file, 120)
            status = [dfl, "status", "--json"]
            if off is not None:
                rows["dflashctl status --json, persist = 0"] = (status, {**env, "DFLASHCTL_HOSTS": str(off)},
                                                                is_json_status)
            else:
                rows["dflashctl status --json (no master in this tree)"] = (status, env, is_json_status)
            master_note = "n/a (no master)"
            if on is not None:
                warm_env = {**env, "DFLASHCTL_HOSTS": str(on)}
                timed(status, warm_env)  # untimed: starts the master
                rows["dflashctl status --json, default path (warm master)"] = (status, warm_env, is_json_status)
                # what a person types: the table
                rows["dflashctl status (the table), warm master"] = ([dfl, "status"], warm_env,
                                                                     lambda o: ssh_run.name.encode() in o)
                if args.status_before:
                    prev = exported(args.status_before)
                    rows["python -m dflashctl status --json, warm master"] = ([*mod, "status", "--json"], warm_env,
                                                                              is_json_status)
                    rows[f"python -m dflashctl status --json, warm master, before ({args.status_before})"] = (
                        [*mod, "status", "--json"], {**warm_env, "PYTHONPATH": str(prev)}, is_json_status)
            seconds = measure(rows, args.calls)
            base = summary(seconds["raw one-liner (ControlMaster=no)"])[0]
            goals = {name: "≤ 1.0× raw" + (" ✓" if summary(seconds[name])[0] <= base else " ✗")
                     for name in ("dflashctl status --json, default path (warm master)",) if name in seconds}
            out += table("status --json over ssh (loopback sshd + pct stand-in, 700 kB log)", seconds,
                         "raw one-liner (ControlMaster=no)", goals)
            if on is None:
                out.append(f"| dflashctl status --json, warm master | {master_note} | | | ≤ 0.5× raw |")
            else:
                out += nvml_rows(pve, no_master, status, warm_env, args.calls)
        finally:
            # every master of this run's state dir
            subprocess.run([dfl, "hosts", "disconnect"], env={**os.environ, "DFLASHCTL_STATE_DIR": str(state)},
                           capture_output=True, timeout=60, check=False)
            shutil.rmtree(state, ignore_errors=True)
            if prev is not None:
                shutil.rmtree(prev, ignore_errors=True)
            if local_proc is not None:
                local_proc.kill()
                local_proc.wait()
    return publish(out, args.out)


if __name__ == "__main__":
    sys.exit(main())
