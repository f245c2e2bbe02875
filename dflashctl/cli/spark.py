"""Sparklines and bars in text: the one drawing of a series for status, its watch and `gpus --watch`."""

from __future__ import annotations

from collections.abc import Sequence

SPARK = "▁▂▃▄▅▆▇█"


def spark(values: Sequence[float | None], width: int, top: float = 100.0) -> str:
    """One block per value (the newest `width`), its height the value's share of `top` (blank: no reading)."""
    top = top if top > 0 else 1.0
    return "".join(" " if v is None else SPARK[max(0, min(7, int(v / top * 7.999)))] for v in list(values)[-width:])


def bar(value: float | None, top: float | None, width: int) -> str:
    """A horizontal bar of `width` cells, filled to value's share of top (all light when unknown)."""
    if value is None or not top or top <= 0:
        return "░" * width
    filled = max(0, min(width, round(value / top * width)))
    return "█" * filled + "░" * (width - filled)
