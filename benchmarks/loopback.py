"""The loopback Proxmox stand-in that the status benchmarks share (status_latency.py, startup.py).

A real OpenSSH sshd on 127.0.0.1, the `pct` stand-in with a real PID+mount namespace as the container, the nvidia-smi
stand-in with the seed's 8 GPUs (tests/harness), a run frozen on a long log, and the seed's raw one-liner against it.
Needs root and sshd, as the real-sshd tests do.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from harness.envs import PveEnv  # noqa: E402
from harness.poll import wait_until  # noqa: E402
from harness.sshd import SshdServer, why_sshd_cannot_run  # noqa: E402
from status.runprog import start_in_container  # noqa: E402

__all__ = ["DFLASHCTL", "ROOT", "SEED_GPUS", "PveEnv", "SshdServer", "frozen_run", "loopback_pve", "raw_oneliner",
           "start_in_container", "summary", "timed", "wait_for", "why_sshd_cannot_run"]

DFLASHCTL = Path(sys.executable).parent / "dflashctl"
SEED_GPUS = [{"index": i, "memory.used": m, "utilization.gpu": 0} for i, m in
             enumerate([88283, 96779, 88443, 96905, 76779, 46901, 48861, 47421])]


def wait_for(cond: Callable[[], object], *, what: str, timeout: float = 120.0) -> None:
    """Poll until cond() holds (a benchmark waits longer than a test: its machine is loaded)."""
    wait_until(cond, timeout=timeout, what=what)


@contextmanager
def loopback_pve(prefix: str = "dflash-bench-") -> Iterator[tuple[SshdServer, PveEnv]]:
    """sshd + a running container with the seed GPUs; os.environ points dflashctl at its hosts.toml."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    sshd = SshdServer(tmp / "sshd").start()
    pve = None
    try:
        pve = PveEnv(sshd, tmp / "pve")
        os.environ.update(pve.env)
        pve.set_gpus(SEED_GPUS)
        yield sshd, pve
    finally:
        if pve is not None:
            pve.close()  # the container's init and any frozen program go with it
        sshd.stop()


def frozen_run(pve: PveEnv, run_id: str, *, min_bytes: int = 700_000) -> Path:
    """A run that printed a long log (10 k lines at 700 kB), then stopped (SIGSTOP): every call reads the same."""
    run_dir = start_in_container(pve, run_id, step_s=0.001)
    wait_for(lambda: (run_dir / "train.log").stat().st_size > min_bytes, what=f"a {min_bytes // 1000} kB log")
    pve.exec(["sh", "-c", f"kill -STOP $(cat /workspace/dflash/runs/{run_dir.name}/pid)"])
    return run_dir


def raw_oneliner(sshd: SshdServer, pve: PveEnv, run_dir: Path, *ssh_options: str) -> list[str]:
    """The seed's status: `ssh … "pct exec … grep …| tail -15; nvidia-smi …"` (one connection per call)."""
    log = f"/workspace/dflash/runs/{run_dir.name}/train.log"
    argv = sshd.ssh_argv(
        f"pct exec {pve.ctid} -- /bin/bash -c 'grep -E \"Exception|tok/s|step=\" {log} | tail -15; echo ===; "
        "nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader'")
    return [argv[0], *ssh_options, *argv[1:]]


def timed(argv: Sequence[str], env: dict[str, str]) -> tuple[float, bytes]:
    """Seconds for one new process to run argv to its end, and its stdout."""
    t0 = time.perf_counter()
    res = subprocess.run(list(argv), capture_output=True, env=env, timeout=120, check=False)
    return time.perf_counter() - t0, res.stdout


def sshd_missing() -> bool:
    """True, having said why, where the loopback sshd cannot run here (the script then exits 2)."""
    reason = why_sshd_cannot_run()
    if reason:
        print(f"cannot run: {reason}")
    return bool(reason)


def result_path(name: str) -> str:
    """Where a benchmark's table is saved by default."""
    return str(ROOT / "benchmarks" / "results" / name)


def publish(lines: list[str], out: str | Path) -> int:
    """The table printed and saved under benchmarks/results/ (the script's exit status: 0)."""
    text = "\n".join(lines) + "\n"
    print(text)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    return 0


def summary(seconds: list[float]) -> tuple[float, float]:
    """(median, best) of one row's calls."""
    return statistics.median(seconds), min(seconds)


def alternate(rows: dict, calls: int, once: Callable) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall, cpu) seconds of every row, `calls` rounds, the rows alternating within each round (so load drifts hit
    them alike). rows: name -> (argv, env, stdin); once(argv, env, stdin) -> (wall, cpu, stdout)."""
    wall: dict[str, list[float]] = {k: [] for k in rows}
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(calls):
        for name, (argv, e, stdin) in rows.items():
            dt, dc, _ = once(argv, e, stdin)
            wall[name].append(dt)
            cpu[name].append(dc)
    return wall, cpu
