"""status on the loopback Proxmox stand-in: crash detection latency, and one-shot cost vs the raw one-liner.

    .venv/bin/python benchmarks/status_latency.py [--trials 10] [--before-trials 5] [--idle-s 30] [--calls 10]
        [--before REV] [--out FILE]

Needs root and OpenSSH's sshd (it starts the test harness: a real sshd on 127.0.0.1, the `pct` stand-in
with a real PID+mount namespace as the container, the nvidia-smi stand-in with 8 GPUs).

(a) detection latency: a program in the container prints steps; a drafter thread raises, at a random
    point of the watch interval. The time from the moment just before its traceback is written (the
    program records it) to the moment `dflashctl status --watch --json --exit-on-failure` prints the
    degraded record (read by this script as it is written). Same clock: the container shares this one's.
    At redraw intervals 1 s and 5 s, for this tree and for the tree before the probe's log wait ("before":
    REV, by default the parent of the commit that added agent/probe/logwait.py, in a temporary `git worktree`,
    run there as `python -m dflashctl`; probe_cpu.py).
(b) one-shot: `dflashctl status --json` (a new process each call: Python start, ssh connect, the probe)
    against the seed's raw `ssh … "pct exec … grep …; nvidia-smi …"` one-liner, alternating, same host.
(c) the streaming probe's CPU share of one core (utime+stime, /proc/PID/stat, over --idle-s seconds), run through
    ssh + pct exec with the arguments `status --watch -i 1` sends, watching a quiet run (alive, log still) and a
    busy one (a progress line every 1 ms), before and after.
Numbers are from one run on one machine; compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from loopback import (
    DFLASHCTL,
    ROOT,
    PveEnv,
    frozen_run,
    loopback_pve,
    raw_oneliner,
    result_path,
    sshd_missing,
    start_in_container,
    timed,
    wait_for,
)
from probe_cpu import before_tree, probe_cpu, probe_script


def detection_trial(pve: PveEnv, k: int, interval: float, before: Path | None = None) -> tuple[float, float]:
    """Seconds from a drafter's traceback to `status --watch` printing it, and of those, to the start of the probe
    report that carried it (the record's `time`, the container's clock: this one's); before: that tree's CLI."""
    run_dir = start_in_container(pve, f"20261129-1100{k:02d}-latency", step_s=0.2)
    wait_for(lambda: b"step=3" in (run_dir / "train.log").read_bytes(), what="steps")
    cli = [sys.executable, "-m", "dflashctl"] if before else [str(DFLASHCTL)]
    env = {**os.environ, "PYTHONPATH": str(before)} if before else os.environ
    proc = subprocess.Popen([*cli, "status", "--watch", "--json", "-i", f"{interval:g}", "--exit-on-failure"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=before)
    lines: queue.Queue[tuple[float, dict]] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put((time.time(), json.loads(raw)))

    threading.Thread(target=pump, daemon=True).start()
    try:
        lines.get(timeout=60)  # the watch is up
        lines.get(timeout=60)  # and streaming
        time.sleep(random.uniform(0, interval))  # crash at a random point of the probe's interval
        (run_dir / "crash").touch()
        while True:
            seen, doc = lines.get(timeout=60)
            if doc["verdict"] == "degraded":
                break
        assert proc.wait(timeout=30) == 105
        crashed = float((run_dir / "crash.t").read_text())
        return seen - crashed, doc["time"] - crashed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pve.exec(["sh", "-c", f"kill -9 $(cat /workspace/dflash/runs/{run_dir.name}/pid)"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10, help="latency trials per interval, this tree")
    ap.add_argument("--before-trials", type=int, default=5, help="latency trials per interval, the tree before")
    ap.add_argument("--idle-s", type=float, default=30.0, help="seconds of each CPU row")
    ap.add_argument("--before", help="the commit to compare with (default: the one before agent/probe/logwait.py)")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--out", default=result_path("status_latency.txt"))
    args = ap.parse_args()
    if sshd_missing():
        return 2
    out = [f"status benchmark: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} CPUs, "
           f"load {os.getloadavg()[0]:.1f}; loopback sshd + pct stand-in + nvidia-smi stand-in (8 GPUs)"]
    with before_tree(args.before) as (tree, sha), loopback_pve() as (sshd, pve):
        scripts = (probe_script(tree, pve), probe_script(ROOT, pve))
        # (a) detection latency at the redraw intervals 1 s and 5 s, this tree and the one before the log wait
        out += ["", "(a) crash detection latency: traceback written -> `status --watch` prints it",
                f"{'tree':<14} | {'interval':>8} | {'trials':>6} | {'min':>7} | {'median':>7} | {'max':>7} | "
                f"{'median/interval':>15} | {'to report':>12}", "-" * 98]
        k = 0
        for name, tree_dir, trials in (("after", None, args.trials), (f"before {sha}", tree, args.before_trials)):
            for interval in (1.0, 5.0):
                lat, at_probe = [], []
                for _ in range(trials):
                    k += 1
                    total, probe_part = detection_trial(pve, k, interval, tree_dir)
                    lat.append(total)
                    at_probe.append(probe_part)
                    print(f"  {name} interval {interval:g}s trial {len(lat)}: {total:.3f} s "
                          f"(report started after {probe_part:.3f} s)", flush=True)
                if lat:
                    med = statistics.median(lat)
                    out.append(f"{name:<14} | {interval:>6g} s | {len(lat):>6} | {min(lat):>5.2f} s | {med:>5.2f} s | "
                               f"{max(lat):>5.2f} s | {med / interval:>15.2f} | {statistics.median(at_probe):>10.3f} s")
        out += ["to report: median from the traceback to the start of the probe report that carried it (the rest is",
                "building that report, ssh + pct exec, the CLI's judgement and print; all of it grows with the load)"]
        # (c) the watch probe's CPU while it watches: a quiet run, and one printing a progress line every ms
        out += ["", f"(c) watch probe CPU (-i 1, --gpus --events as `status --watch` sends), {args.idle_s:g} s each",
                f"{'tree':<14} | {'run':<22} | {'log kB/s':>8} | {'CPU % of one core':>17} | {'ratio':>5}", "-" * 78]
        for label, step_s in (("quiet (log still)", 3600.0), ("busy (a line per ms)", 0.001)):
            base = None
            for name, script in ((f"before {sha}", scripts[0]), ("after", scripts[1])):
                k += 1
                share, rate = probe_cpu(pve, sshd, script, f"20261201-1900{k:02d}-cpu", step_s, args.idle_s)
                base = share if base is None else base
                out.append(f"{name:<14} | {label:<22} | {rate:>8.1f} | {100 * share:>16.2f}% | "
                           f"{share / base if base else float('nan'):>5.2f}")
                print(out[-1], flush=True)
        # (b) one-shot status vs the raw one-liner, on a run with 10 k log lines
        run_dir = frozen_run(pve, "20261129-1200-oneshot")
        raw = raw_oneliner(sshd, pve, run_dir)
        env = {**os.environ, **sshd.env}
        ours = [str(DFLASHCTL), "status", "--json"]
        t_raw, t_ours = [], []
        for _ in range(args.calls):
            dt, text = timed(raw, env)
            assert b"===" in text, text
            t_raw.append(dt)
            dt, text = timed(ours, env)
            assert json.loads(text)["verdict"], text
            t_ours.append(dt)
        m_raw, m_ours = statistics.median(t_raw), statistics.median(t_ours)
        size_kb = (run_dir / "train.log").stat().st_size // 1024
        out += ["", f"(b) one-shot cost on the same host ({args.calls} calls each, alternating; log {size_kb} kB)",
                f"{'command':<58} | {'median':>7} | {'min':>7} | {'ratio':>5}", "-" * 86,
                f"{'raw: ssh … pct exec … grep -E …|tail -15; nvidia-smi':<58} | {m_raw:>5.2f} s | "
                f"{min(t_raw):>5.2f} s | {1:>5.2f}",
                f"{'dflashctl status --json (new process each call)':<58} | {m_ours:>5.2f} s | "
                f"{min(t_ours):>5.2f} s | {m_ours / m_raw:>5.2f}",
                "",
                "the raw one-liner returns 15 grep lines and 8 CSV rows; status returns the verdict, every thread,",
                "whole tracebacks, signatures with remedies, per-GPU findings, progress, process state, heartbeat."]
    text = "\n".join(out)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
