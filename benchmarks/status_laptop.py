"""The laptop's part of a one-shot `status --json` and the probe's own compute, this tree against an earlier one
(issue 25 speed), each as a new process, rows alternating call by call in one run:

    .venv/bin/python benchmarks/status_laptop.py [--before 683f534] [--calls 11] [--out FILE]

Rows: the seed's raw one-liner (the ratio's base), the laptop side alone (parse + judge + print one recorded probe
reply, no connection), the probe program run directly in the container (`pct exec CT -- python3 -m
dflashctl.agent.probe.main`, each tree copied under /workspace: the figure does not depend on how the code reaches
the container), and the whole
`python -m dflashctl status --json` through a warm connection master; each for this tree and for `--before`
(exported with `git archive`, run with the same interpreter). Loopback sshd + `pct` stand-in + nvidia-smi stand-in,
a run frozen on a 700 kB log (benchmarks/loopback.py). Wall time and the child's CPU (user + system, rusage) per
call; ratios are what to compare (the machine is shared). Needs root and sshd.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

from loopback import ROOT, alternate, frozen_run, loopback_pve, publish, raw_oneliner, result_path, sshd_missing
from startup import exported, hosts_with_persist

LAPTOP = """
import json, sys
from dflashctl.commands.status import with_events
from dflashctl.analysis.judging import watcher
from dflashctl.config import load_inventory
from dflashctl.report import parse_report
from dflashctl.cli.common import print_json
host = load_inventory().get(None)
doc = parse_report(json.loads(sys.stdin.read()))
view = with_events(watcher(host.name, host.judge).update(doc), doc)
print_json(view.to_record())
"""


def once(argv: list[str], env: dict[str, str], stdin: bytes | None) -> tuple[float, float, bytes]:
    """(wall seconds, the child's CPU seconds, stdout) of one new process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=120, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, res.stdout or f"exit {res.returncode}: ".encode() + res.stderr[-300:]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=11)
    ap.add_argument("--before", default="683f534", help="the tree to compare with (git rev)")
    ap.add_argument("--out", default=result_path("status_laptop.md"))
    args = ap.parse_args()
    if sshd_missing():
        return 2
    load = os.getloadavg()
    old = exported(args.before)
    with loopback_pve("dflash-laptop-") as (sshd, pve):
        env = {k: v for k, v in {**os.environ, **sshd.env}.items() if k != "PYTHONDONTWRITEBYTECODE"}
        run_dir = frozen_run(pve, "20261201-2300-laptop")
        on = hosts_with_persist(pve.hosts_file, 120)
        py = [sys.executable, "-P"]  # -P: the tree PYTHONPATH names, not the script's folder
        # each tree's agent/ where the container sees it (/workspace), its probe run there by hand
        inside = {}
        for tree, src in (("now", ROOT / "dflashctl"), ("before", old / "dflashctl")):
            dest = pve.workspace_dir / f"bench-{tree}" / "dflashctl"
            shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
            inside[tree] = ["pct", "exec", str(pve.ctid), "--", "env", f"PYTHONPATH=/workspace/bench-{tree}",
                            "python3", "-P", "-m", "dflashctl.agent.probe.main", "--workspace", "/workspace/dflash",
                            "--run", run_dir.name, "--gpus", "--events"]
        reply = subprocess.run(inside["now"], capture_output=True, env=env, check=True).stdout.decode()
        recorded = json.dumps(json.loads(reply.rsplit("DFLASH-RESULT ", 1)[1])["doc"]).encode()
        status = [*py, "-m", "dflashctl", "status", "--json"]
        trees = {"now": {"PYTHONPATH": str(ROOT)}, f"before ({args.before})": {"PYTHONPATH": str(old)}}
        rows: dict[str, tuple[list[str], dict[str, str], bytes | None]] = {
            "raw one-liner (ControlMaster=no)": (raw_oneliner(sshd, pve, run_dir, "-o", "ControlMaster=no"), env, None)}
        for tree, extra in trees.items():
            rows[f"laptop side alone: parse + judge + print a recorded reply, {tree}"] = (
                [*py, "-c", LAPTOP], {**env, **extra}, recorded)
            rows[f"probe in the container, run directly (pct exec … python3 -m …probe.main), {tree}"] = (
                inside["now" if tree == "now" else "before"], env, None)
            rows[f"python -m dflashctl status --json, warm master, {tree}"] = (
                status, {**env, **extra, "DFLASHCTL_HOSTS": str(on)}, None)
        for name, (argv, e, stdin) in rows.items():  # untimed: bytecode, the archive, the master
            _, _, out = once(argv, e, stdin)
            if "status" in name or name.startswith("laptop"):  # a fast wrong answer is no answer
                assert out.startswith(b"{") and json.loads(out).get("verdict"), (name, out[:300])
            elif name.startswith("probe"):
                assert b"DFLASH-RESULT " in out, (name, out[:300])
        wall, cpu = alternate(rows, args.calls, once)
        subprocess.run([*py, "-m", "dflashctl", "hosts", "disconnect"], env={**env, "PYTHONPATH": str(ROOT),
                       "DFLASHCTL_HOSTS": str(on)}, capture_output=True, timeout=60, check=False)
    shutil.rmtree(old, ignore_errors=True)
    end = os.getloadavg()
    raw = statistics.median(wall["raw one-liner (ControlMaster=no)"])
    out = [f"# status --json: the laptop's part and the probe's compute, now against {args.before} "
           f"({time.strftime('%Y-%m-%d %H:%M:%S %Z')})", "",
           f"{os.cpu_count()} CPUs (shared), load average {load[0]:.2f} at the start, {end[0]:.2f} at the end; "
           f"{args.calls} calls a row, alternating, after one untimed call a row; each call a new process; CPU = "
           "the child's own user + system time with what it waited for (the ssh rows: the laptop's process only).", "",
           f"Command: `.venv/bin/python benchmarks/status_laptop.py --before {args.before}`", "",
           "| step | median wall | median CPU | wall / raw one-liner |", "|---|---:|---:|---:|"]
    for name in rows:
        out.append(f"| {name} | {statistics.median(wall[name]) * 1000:.0f} ms | "
                   f"{statistics.median(cpu[name]) * 1000:.0f} ms | {statistics.median(wall[name]) / raw:.2f}x |")
    pairs = [k.rsplit(", now", 1)[0] for k in rows if k.endswith(", now")]
    out += ["", "| step | wall now / before | CPU now / before |", "|---|---:|---:|"]
    for base in pairs:
        a, b = f"{base}, now", f"{base}, before ({args.before})"
        out.append(f"| {base} | {statistics.median(wall[a]) / statistics.median(wall[b]):.2f} | "
                   f"{statistics.median(cpu[a]) / statistics.median(cpu[b]):.2f} |")
    return publish(out, args.out)


if __name__ == "__main__":
    sys.exit(main())
