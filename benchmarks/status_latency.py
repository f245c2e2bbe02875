"""status on the loopback Proxmox stand-in: crash detection latency, and one-shot cost vs the raw one-liner.

    .venv/bin/python benchmarks/status_latency.py [--trials 5] [--calls 10] [--out FILE]

Needs root and OpenSSH's sshd (it starts the test harness: a real sshd on 127.0.0.1, the `pct` stand-in
with a real PID+mount namespace as the container, the nvidia-smi stand-in with 8 GPUs).

(a) detection latency: a program in the container prints steps; a drafter thread raises, at a random
    point of the watch interval. The time from the moment just before its traceback is written (the
    program records it) to the moment `dflashctl status --watch --json --exit-on-failure` prints the
    degraded record (read by this script as it is written). Same clock: the container shares this one's.
(b) one-shot: `dflashctl status --json` (a new process each call: Python start, ssh connect, the probe)
    against the seed's raw `ssh … "pct exec … grep …; nvidia-smi …"` one-liner, alternating, same host.
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
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from harness.envs import PveEnv  # noqa: E402
from harness.sshd import SshdServer, why_sshd_cannot_run  # noqa: E402
from status.runprog import start_in_container, wait_for  # noqa: E402

DFLASHCTL = Path(sys.executable).parent / "dflashctl"
SEED_GPUS = [{"index": i, "memory.used": m, "utilization.gpu": 0} for i, m in
             enumerate([88283, 96779, 88443, 96905, 76779, 46901, 48861, 47421])]


def detection_trial(pve: PveEnv, k: int, interval: float) -> float:
    run_dir = start_in_container(pve, f"20261129-1100{k:02d}-latency", step_s=0.2)
    wait_for(lambda: b"step=3" in (run_dir / "train.log").read_bytes(), what="steps")
    proc = subprocess.Popen([str(DFLASHCTL), "status", "--watch", "--json", "-i", f"{interval:g}",
                             "--exit-on-failure"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ)
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
        return seen - crashed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pve.exec(["sh", "-c", f"kill -9 $(cat /workspace/dflash/runs/{run_dir.name}/pid)"])


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, env=env, timeout=120, check=False)
    return time.perf_counter() - t0, res.stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "status_latency.txt"))
    args = ap.parse_args()
    reason = why_sshd_cannot_run()
    if reason:
        print(f"cannot run: {reason}")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="dflash-bench-"))
    sshd = SshdServer(tmp / "sshd").start()
    out = [f"status benchmark: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} CPUs, "
           f"load {os.getloadavg()[0]:.1f}; loopback sshd + pct stand-in + nvidia-smi stand-in (8 GPUs)"]
    pve = None
    try:
        pve = PveEnv(sshd, tmp / "pve")
        os.environ.update(pve.env)
        pve.set_gpus(SEED_GPUS)
        # (a) detection latency at the default interval (1 s) and at 0.5 s
        out += ["", "(a) crash detection latency: traceback written -> `status --watch` prints it",
                f"{'interval':>8} | {'trials':>6} | {'min':>7} | {'median':>7} | {'max':>7} | {'median/interval':>15}",
                "-" * 66]
        k = 0
        for interval in (1.0, 0.5):
            lat = []
            for _ in range(args.trials):
                k += 1
                lat.append(detection_trial(pve, k, interval))
                print(f"  interval {interval:g}s trial {len(lat)}: {lat[-1]:.3f} s", flush=True)
            med = statistics.median(lat)
            out.append(f"{interval:>6g} s | {len(lat):>6} | {min(lat):>5.2f} s | {med:>5.2f} s | {max(lat):>5.2f} s | "
                       f"{med / interval:>15.2f}")
        # (b) one-shot status vs the raw one-liner, on a run with 10 k log lines
        run_dir = start_in_container(pve, "20261129-1200-oneshot", step_s=0.001)
        wait_for(lambda: (run_dir / "train.log").stat().st_size > 700_000, what="a 700 kB log")
        pve.exec(["sh", "-c", f"kill -STOP $(cat /workspace/dflash/runs/{run_dir.name}/pid)"])  # freeze the log
        log = f"/workspace/dflash/runs/{run_dir.name}/train.log"
        raw = sshd.ssh_argv(
            f"pct exec {pve.ctid} -- /bin/bash -c 'grep -E \"Exception|tok/s|step=\" {log} | tail -15; echo ===; "
            "nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader'")
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
    finally:
        if pve is not None:
            pve.close()  # the container's init and the frozen program go with it
        sshd.stop()
    text = "\n".join(out)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
