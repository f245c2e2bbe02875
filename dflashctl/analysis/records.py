"""The record of a judged run: `diagnose --json`, and `status --json` around it; the table is drawn from the same
Health, so the two cannot drift (every GPU column the table shows is here too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dflashctl.analysis.health import Health


def progress_record(values: Mapping[str, float]) -> dict[str, Any] | None:
    """The `progress` record of `status --json` and `diagnose --json` alike: the latest values as the log gave them
    (step, total, loss, grad_norm, lr, tok/s, it/s, eta_s, epoch, acc_len …), step and total as integers."""
    if not values:
        return None
    return {k: int(v) if k in ("step", "total") and float(v).is_integer() else v for k, v in values.items()}


def to_record(h: Health) -> dict[str, Any]:
    """The `diagnose --json` contract (issue 4); `status --json` adds run and host fields around it."""
    health = {r.index: r.to_record() for r in h.gpu_health}
    return {
        "verdict": str(h.verdict),
        "final_exception": h.final_exception,
        "root_cause": h.root_cause,
        "stall_shape": h.stall_shape,  # stalled: "idle-held" | "spinning" (docs/failures.md), else null
        "stall_remedy": h.stall_remedy,
        "progress": progress_record(h.progress),
        "threads": [
            {"name": t.name, "state": t.state, "exception": t.exception, "message": t.message,
             "traceback": t.traceback}
            for t in h.threads
        ],
        "signatures": [
            {"id": x.signature.id, "summary": x.signature.summary, "remedy": x.signature.remedy,
             "evidence": {"line": x.line, "text": x.text}}
            for x in h.hits
        ],
        "gpus": [
            {"index": int(g.sample.index), "memory_used_mib": g.sample.memory_used_mib,
             "memory_total_mib": g.sample.memory_total_mib, "utilization_pct": g.sample.utilization_pct,
             "power_w": g.sample.power_w, "finding": str(g.finding) if g.finding is not None else None,
             "health": health.get(int(g.sample.index)),
             "health_findings": [f.id for f in h.gpu_findings if f.gpu == int(g.sample.index)]}
            for g in h.gpus
        ],
        "gpu_findings": [f.to_record() for f in h.gpu_findings],  # docs/failures.md "GPU health findings"
        "gpu_action": None if h.gpu_action is None else str(h.gpu_action),
    }
