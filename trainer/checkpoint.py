"""Checkpoints: drafter weights + optimizer + step + config, written atomically (temp, fsync, rename)."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^step-(\d{8})\.pt$")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file in the same dir, fsync, rename over `path`, fsync the dir: readers see old or new."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save(run_dir: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Save `state` (must include 'step') as checkpoints/step-XXXXXXXX.pt; keep the newest `keep`."""
    ckdir = checkpoint_dir(run_dir)
    ckdir.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    path = ckdir / f"step-{step:08d}.pt"
    atomic_write_bytes(path, buf.getvalue())
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temp files never match the name pattern)."""
    ckdir = checkpoint_dir(run_dir)
    if not ckdir.is_dir():
        return []
    return sorted((p for p in ckdir.iterdir() if _NAME.match(p.name)), key=lambda p: int(_NAME.match(p.name)[1]))


def load_latest(run_dir: Path) -> dict[str, Any] | None:
    found = list_checkpoints(run_dir)
    if not found:
        return None
    return torch.load(found[-1], map_location="cpu", weights_only=True)
