"""Pieces of the judged run's record shared by its writers: Health.to_record (analysis/health.py, the
`diagnose --json` contract, `status --json` around it) uses `progress_record`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def progress_record(values: Mapping[str, float]) -> dict[str, Any] | None:
    """The `progress` record of `status --json` and `diagnose --json` alike: the latest values as the log gave them
    (step, total, loss, grad_norm, lr, tok/s, it/s, eta_s, epoch, acc_len …), step and total as integers."""
    if not values:
        return None
    return {k: int(v) if k in ("step", "total") and float(v).is_integer() else v for k, v in values.items()}
