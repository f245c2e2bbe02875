"""The one sentence that says which GPUs a run left out (`launch --exclude-unhealthy-gpus`, stdlib only): the
launch's note (analysis/gpuexclude.py `Exclusion.note`), a restart's event and the next attempt's log line
(agent/lib/attempts.py) all print it, on the laptop and in the container alike."""

from __future__ import annotations


def left_out_note(why: object, visible: object, who: str = "the attempt") -> str:
    """`left out GPU 1 (xid-79: …); the attempt gets CUDA_VISIBLE_DEVICES=0,2`."""
    return f"left out {why}; {who} gets CUDA_VISIBLE_DEVICES={visible}"
