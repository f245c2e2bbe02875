"""The run's loss and τ (acc_len) over its logged steps, for sparklines beside the GPU histories (issue 29): a glance
tells training (loss falling, τ rising) from stuck (flat, or no new points). Pure: progress points in, lists out."""

from __future__ import annotations

from collections.abc import Sequence

from dflashctl.model import ProgressPoint

KEYS = ("loss", "acc_len")
POINTS = 40  # the newest points kept per series (a sparkline's width)


def training_series(points: Sequence[ProgressPoint]) -> dict[str, list[float]]:
    """Each key's values over the training steps that logged it (evaluation lines apart: `eval_acc_len`), the
    newest POINTS, oldest first; keys no point carries are left out."""
    out: dict[str, list[float]] = {}
    for p in points:
        for key in KEYS:
            v = p.values.get(key)
            if isinstance(v, int | float) and v == v:  # NaN: not a point to draw
                out.setdefault(key if p.kind == "train" else f"{p.kind}_{key}", []).append(float(v))
    return {k: v[-POINTS:] for k, v in out.items()}
