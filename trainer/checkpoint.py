"""Checkpoints: drafter weights + optimizer + step + config, written atomically (temp, fsync, rename)."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import torch

from trainer.oneline import first_line

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
    if not list_checkpoints(run_dir):
        return None
    return read_checkpoint(run_dir)[1]


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and says why."""


def read_checkpoint(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(file, state) of a step-*.pt file or a run directory's newest one, checked for the current drafter layout."""
    path = Path(path)
    if path.is_dir():
        found = list_checkpoints(path)
        if not found:
            raise CheckpointError(f"{path}: no checkpoints/step-*.pt in this run directory")
        path = found[-1]
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except Exception as e:
        raise CheckpointError(f"{path}: cannot load checkpoint ({first_line(e)})") from None
    if not isinstance(state, dict) or "drafter" not in state or "config" not in state:
        raise CheckpointError(f"{path}: not a trainer checkpoint (needs 'drafter' and 'config')")
    check_layout(state, path)
    return path, state


def check_layout(state: dict[str, Any], path: Path | str) -> None:
    from trainer.drafter_format import LAYOUT

    layout = (state.get("drafter_meta") or {}).get("layout")
    if layout != LAYOUT:
        raise CheckpointError(f"{path}: drafter layout {layout or 'of an older trainer (no q_norm/k_norm)'} is not "
                              f"{LAYOUT}; retrain, or evaluate it with the trainer version that wrote it")


def checkpoint_config(state: dict[str, Any]) -> Any:
    """The Config a checkpoint was trained under, with the MASK id and target layers its drafter_meta recorded
    (what the weights mean, whatever today's defaults would pick)."""
    from trainer.config import config_from_dict

    cfg = config_from_dict(state["config"])
    meta = state.get("drafter_meta") or {}
    if "mask_token_id" in meta:
        cfg.drafter.mask_token_id = int(meta["mask_token_id"])
    if meta.get("target_layer_ids"):
        cfg.target.layer_ids = list(meta["target_layer_ids"])
    return cfg
