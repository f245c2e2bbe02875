"""Room for a new run: a launch onto a full disk is a refusal naming the filesystem and what is free, and leaves
nothing half-made (issue 26; stdlib only)."""

from __future__ import annotations

import contextlib
import os


def readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


SPACE_MARGIN = 256 << 10  # beyond the files the launcher writes: the first lines of train.log, meta rewrites


def no_space(runs_dir: str, need: int) -> str | None:
    """One line when the filesystem holding runs_dir has less than need bytes free: which filesystem (its mount
    point) and how much is free; None when there is room."""
    try:
        st = os.statvfs(runs_dir)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= need:
        return None
    mount = os.path.realpath(runs_dir)
    while mount != "/" and not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    total = st.f_blocks * st.f_frsize
    return (f"no space for a new run in {runs_dir}: the filesystem mounted at {mount} has {_human_size(free)} free "
            f"of {_human_size(total)}")


def _human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n:.1f} GiB"


def point_back(runs_dir: str, run_id: str, previous: str | None) -> None:
    """runs/latest must not name a run directory that was removed: it names the run it named before."""
    latest = os.path.join(runs_dir, "latest")
    with contextlib.suppress(OSError):
        if os.readlink(latest) == run_id:
            os.unlink(latest)
            if previous:
                os.symlink(previous, latest)
