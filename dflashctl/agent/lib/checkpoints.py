"""A run's checkpoints as the trainer names them, and handing the newest to a new run (stdlib only)."""

from __future__ import annotations

import os
import re
import shutil

CHECKPOINT = re.compile(r"^step-(\d{8})\.pt$")  # trainer/checkpoint.py's names: temp files never match


def newest_checkpoint(run_dir: str) -> str | None:
    try:
        names = [n for n in os.listdir(os.path.join(run_dir, "checkpoints")) if CHECKPOINT.match(n)]
    except OSError:
        return None
    return os.path.join(run_dir, "checkpoints", max(names)) if names else None


def take_checkpoint(checkpoint: str, run_dir: str, source_run: str) -> dict:
    """The new run starts with the source run's newest checkpoint in its own checkpoints/: a hard link (no copy
    of gigabytes; safe because checkpoints are written by rename and never changed in place, and each run's pruning
    only unlinks its own names), a copy where a link is impossible. The source run directory is not touched."""
    dest_dir = os.path.join(run_dir, "checkpoints")
    os.mkdir(dest_dir)
    dest = os.path.join(dest_dir, os.path.basename(checkpoint))
    try:
        os.link(checkpoint, dest)
        linked = True
    except OSError:
        shutil.copyfile(checkpoint, dest + ".tmp")
        os.replace(dest + ".tmp", dest)
        linked = False
    step = int(CHECKPOINT.match(os.path.basename(checkpoint)).group(1))
    return {"run": source_run, "checkpoint": checkpoint, "step": step, "linked": linked}
