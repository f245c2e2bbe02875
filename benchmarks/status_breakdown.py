"""Where a one-shot `status --json` over ssh spends its time (issue 16): each step a new process, measured alone.

    .venv/bin/python benchmarks/status_breakdown.py [--calls 11] [--out benchmarks/results/status_breakdown.md]

Loopback sshd + `pct` stand-in + nvidia-smi stand-in (benchmarks/loopback.py), a run frozen on a 700 kB log. Rows:
ssh's floor, `pct exec`'s, a container interpreter's, the probe in the container from the compiled-code cache of
--cache-rev (agent/codecache.py, the way before the agent archive) and from the installed agent archive (now; and
the same archive without the bytecode its installer adds, and what the one-time install costs), the Proxmox host's
half (agent/hostpair.py) from the archive installed there, the laptop side alone
(parse + judge + print of a recorded reply, a new process), the seed's raw one-liner, the probe (with the host's Xid
read) through a warm master (each request a fresh channel of its connection: issue 25 removed the resident runners),
and the whole status with persist = 0 and through a warm master.
Rows alternate call by call; each gives the median wall time and the median machine CPU (all processes, /proc/stat:
sshd and the container are not our children) per call. Needs root and sshd.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from loopback import DFLASHCTL, alternate, frozen_run, loopback_pve, publish, raw_oneliner, result_path, sshd_missing
from startup import exported, hosts_with_persist

from dflashctl.remote import agentcall, agentpack
from dflashctl.remote.probe import probe_args

OLD_PROBE = ("import sys; from dflashctl.remote.probe import build_script, loader_source; "
             "sys.stdout.write(loader_source() + '\\0' + build_script())")

LAPTOP = """
import json, sys
from dflashctl.commands.status import with_events
from dflashctl.analysis.watcher import Watcher
from dflashctl.analysis.logscan import LogScanner
from dflashctl.analysis.judging import watcher
from dflashctl.config import load_inventory
from dflashctl.report import parse_report
from dflashctl.cli.common import print_json
host = load_inventory().get(None)
doc = parse_report(json.loads(sys.stdin.read()))
view = with_events(watcher(host.name, host.judge).update(doc), doc)
print_json(view.to_record())
"""

PROBE = """
import sys
from dflashctl.config import load_inventory
from dflashctl.remote import connect
from dflashctl.remote.probe import probe_doc
host = load_inventory().get(None)
with connect(host) as target:
    doc = probe_doc(target, host.workspace, sys.argv[1], events=True, xid=True)
assert doc.get("run") and "xid" in doc, doc
print("{}")
"""


def machine_cpu() -> float:
    """Seconds of CPU all processes used so far (user + nice + system + irq + softirq)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:8]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def once(argv: list[str], env: dict[str, str], stdin: bytes | None) -> tuple[float, float, bytes]:
    """(wall seconds, machine CPU seconds, stdout) of one new process; its stderr when it has no stdout."""
    c0, t0 = machine_cpu(), time.perf_counter()
    res = subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=120, check=False)
    dt, dc = time.perf_counter() - t0, machine_cpu() - c0
    return dt, dc, res.stdout or f"exit {res.returncode}: ".encode() + res.stderr[-300:]


def in_process(env: dict[str, str], hosts: dict[str, object], run: str, ct: str,
               calls: int) -> dict[str, list[float]]:
    """Round trips through the warm master from this one process (no process start, no imports in the figure):
    the probe with the host's Xid read, and `pct exec CT -- python3 -c pass`, alternating call by call."""
    from dflashctl.config import load_inventory
    from dflashctl.remote import connect
    from dflashctl.remote.probe import probe_doc

    os.environ.update(env)  # the same connection key as the commands that started the masters
    targets = {name: connect(load_inventory(path).get(None)) for name, path in hosts.items()}
    kinds = {"probe + host xid": lambda t: probe_doc(t, t.host.workspace, run, events=True, xid=True),
             "pct exec CT -- python3 -c pass": lambda t: t.transport.run(["pct", "exec", ct, "--", "python3", "-c",
                                                                          "pass"], timeout=60)}
    times: dict[str, list[float]] = {f"{k}, {n}": [] for k in kinds for n in targets}
    for i in range(calls + 1):
        for kind, call in kinds.items():
            for name, target in targets.items():
                t0 = time.perf_counter()
                call(target)
                if i:  # the first is untimed
                    times[f"{kind}, {name}"].append(time.perf_counter() - t0)
    for target in targets.values():
        target.close()
    return times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=11)
    ap.add_argument("--before", default="683f534", help="the tree to compare the whole status with (git rev)")
    ap.add_argument("--cache-rev", default="683f534", help="a tree with the compiled-code cache (agent/codecache.py)")
    ap.add_argument("--out", default=result_path("status_breakdown.md"))
    args = ap.parse_args()
    if sshd_missing():
        return 2
    load = os.getloadavg()
    with loopback_pve("dflash-breakdown-") as (sshd, pve):
        env = {k: v for k, v in {**os.environ, **sshd.env}.items() if k != "PYTHONDONTWRITEBYTECODE"}
        run_dir = frozen_run(pve, "20261201-2300-breakdown")
        ct = str(pve.ctid)

        def ssh(command: str) -> list[str]:
            argv = sshd.ssh_argv(command)
            return [argv[0], "-o", "ControlMaster=no", *argv[1:]]

        pargs = probe_args("/workspace/dflash", run_dir.name, events=True)
        pct = ["pct", "exec", ct, "--"]
        cached = exported(args.cache_rev)
        old_loader, old_probe = subprocess.run([sys.executable, "-c", OLD_PROBE], capture_output=True, check=True,
                                               cwd=cached, env={**env, "PYTHONPATH": str(cached)}
                                               ).stdout.decode().split("\0")
        sha, ws_ct = agentpack.sha256(), "/workspace/dflash"
        install_ct = [*pct, "python3", "-c", agentcall.installer_source(), f"{ws_ct}/.agent", sha]
        install_host = ["python3", "-c", agentcall.installer_source(), agentcall.HOST_FOLDER, sha]
        for argv in (install_ct, install_host):
            subprocess.run(argv, input=agentpack.archive(), capture_output=True, env=env, check=True, timeout=120)
        (pve.workspace_dir / "dflash" / "source-only.pyz").write_bytes(agentpack.archive())  # no .pyc beside
        off, on = hosts_with_persist(pve.hosts_file, 0), hosts_with_persist(pve.hosts_file, 120)
        probe = [sys.executable, "-P", "-c", PROBE, run_dir.name]
        status = [str(DFLASHCTL), "status", "--json"]
        mod = [sys.executable, "-P", "-m", "dflashctl", "status", "--json"]  # -P: the tree PYTHONPATH names
        old = exported(args.before)
        archived = [*pct, "python3", "-c", agentcall.BOOT, f"{ws_ct}/.agent/{sha}.pyz", "probe", *pargs]
        reply = subprocess.run(archived, capture_output=True, env=env, check=True).stdout.decode().split(" ", 1)[1]
        recorded = json.dumps(json.loads(reply)["doc"]).encode()
        rows: dict[str, tuple[list[str], dict[str, str], bytes | None]] = {
            "ssh host true": (ssh("true"), env, None),
            "ssh host pct exec CT -- true": (ssh(" ".join([*pct, "true"])), env, None),
            "ssh host pct exec CT -- python3 -c pass": (ssh(" ".join([*pct, "python3", "-c", "pass"])), env, None),
            f"probe in the container, from the code cache ({args.cache_rev}: pasted source on stdin)":
                ([*pct, "python3", "-c", old_loader, *pargs], env, old_probe.encode()),
            "probe in the container, from the installed agent archive (now)": (archived, env, None),
            "probe in the container, the same archive without its bytecode": (
                [*pct, "python3", f"{ws_ct}/source-only.pyz", "probe", *pargs], env, None),
            "install the archive in the container (once per version)": (install_ct, env, agentpack.archive()),
            "host half (hostpair --apps) from the archive on the host": (
                ["python3", "-c", agentcall.BOOT, f"{agentcall.HOST_FOLDER}/{sha}.pyz", "hostpair", "--apps"], env,
                None),
            "laptop side alone: parse + judge + print a recorded reply": ([sys.executable, "-c", LAPTOP], env,
                                                                          recorded),
            "raw one-liner (ControlMaster=no)": (raw_oneliner(sshd, pve, run_dir, "-o", "ControlMaster=no"), env,
                                                 None),
            "probe + host xid through a warm master": (probe, {**env, "DFLASHCTL_HOSTS": str(on)}, None),
            "dflashctl status --json, persist = 0": (status, {**env, "DFLASHCTL_HOSTS": str(off)}, None),
            "dflashctl status --json, warm master": (status, {**env, "DFLASHCTL_HOSTS": str(on)}, None),
            "python -m dflashctl status --json, persist = 0": (mod, {**env, "DFLASHCTL_HOSTS": str(off)}, None),
            f"python -m dflashctl status --json, persist = 0, before ({args.before})":
                (mod, {**env, "DFLASHCTL_HOSTS": str(off), "PYTHONPATH": str(old)}, None),
        }
        for name, (argv, e, stdin) in rows.items():  # untimed: bytecode, the code cache, the master
            _, _, out = once(argv, e, stdin)
            if "dflashctl" in name or name.startswith("laptop"):  # a fast wrong answer is no answer
                assert out.startswith(b"{") and json.loads(out).get("verdict"), (name, out[:300])
            if name.startswith(("probe +", "raw")):
                assert out.startswith(b"{}") or b"===" in out, (name, out[:300])
        wall, cpu = alternate(rows, args.calls, once)
        rounds = in_process(env, {"warm master": on}, run_dir.name, ct, args.calls * 2)
        imports = subprocess.run([sys.executable, "-X", "importtime", "-c", "import dflashctl.cli.status"],
                                 capture_output=True, env=env, check=True).stderr.decode().splitlines()
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(cached, ignore_errors=True)
        for hosts in (on,):
            subprocess.run([str(DFLASHCTL), "hosts", "disconnect"], env={**env, "DFLASHCTL_HOSTS": str(hosts)},
                           capture_output=True, timeout=60, check=False)
    times = [line.split(":", 1)[1].split("|") for line in imports if line.startswith("import time:")]
    times = [(int(a), int(b), c.strip()) for a, b, c in times if a.strip().isdigit()]
    total_us = sum(own for own, _, _ in times)
    heavy = sorted(((cum, name) for _, cum, name in times), reverse=True)[:8]
    out = [f"# status --json over ssh, step by step ({time.strftime('%Y-%m-%d %H:%M:%S %Z')})", "",
           f"{os.cpu_count()} CPUs (shared), load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start; "
           f"{args.calls} calls a row, alternating, after one untimed call a row; each call a new process. "
           "CPU = the whole machine's CPU seconds during the call (sshd, container and all; other load included).",
           "", "Command: `.venv/bin/python benchmarks/status_breakdown.py`", "",
           "| step | median wall | median machine CPU | wall / raw one-liner |", "|---|---:|---:|---:|"]
    raw = statistics.median(wall["raw one-liner (ControlMaster=no)"])
    for name in rows:
        out.append(f"| {name} | {statistics.median(wall[name]) * 1000:.0f} ms | "
                   f"{statistics.median(cpu[name]) * 1000:.0f} ms | {statistics.median(wall[name]) / raw:.2f}x |")
    out += ["", f"Round trips through the warm master from one process (no process start or import in the "
            f"figure), {args.calls * 2} calls each, alternating:", "",
            "| round trip | median wall |", "|---|---:|"]
    for name, got in rounds.items():
        out.append(f"| {name} | {statistics.median(got) * 1000:.1f} ms |")
    out += ["", f"`python -X importtime -c 'import dflashctl.cli.status'`: {total_us / 1000:.0f} ms self time in all; "
            "the largest cumulative: " + ", ".join(f"{name} {us / 1000:.0f} ms" for us, name in heavy)]
    return publish(out, args.out)


if __name__ == "__main__":
    sys.exit(main())
