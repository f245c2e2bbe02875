"""A workspace's run directories: fresh ones, the launch lock, `runs/latest` (stdlib only)."""

from __future__ import annotations

import fcntl
import os
import time

HASH_FILE = ".dflash-code-hash"  # at the root of each deployed code version (agent/codetree.py); never shipped


def mkdir_exclusive(runs_dir: str, base_id: str) -> tuple[str, str]:
    """A fresh directory: never reuse one; a collision gets -2, -3 ... appended."""
    os.makedirs(runs_dir, exist_ok=True)
    for i in range(1, 100):
        run_id = base_id if i == 1 else f"{base_id}-{i}"
        path = os.path.join(runs_dir, run_id)
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return run_id, path
    raise RuntimeError(f"no free run directory for {base_id} in {runs_dir}")


def lock_runs(runs_dir: str) -> int:
    """`<workspace>/.launch.lock`, held until this program exits: two launches (or adopts) at once cannot both
    pass the live-run check."""
    os.makedirs(runs_dir, exist_ok=True)
    fd = os.open(os.path.join(os.path.dirname(runs_dir.rstrip("/")), ".launch.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def point_latest(runs_dir: str, run_id: str) -> None:
    tmp_link = os.path.join(runs_dir, f".latest-{os.getpid()}")
    os.symlink(run_id, tmp_link)
    os.replace(tmp_link, os.path.join(runs_dir, "latest"))


def now_iso(epoch: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
