"""The trainer's progress line (and the common forms of other trainers) → ProgressPoint.

`step=12 loss=4.1234 tok/s=1834.2 lr=3.00e-04 acc=0.123 acc_len=3.1` is the contract with trainer/
(telemetry.log_line); `step: 10  loss: 2.31` (torchtitan), `{'loss': 2.31, 'learning_rate': 5e-05}` (HF)
and `iter 100: loss 2.3` (nanoGPT) are understood too. A line is progress only when it carries a loss, or a
step with some other measurement: `error_rate=0.01` is not, and neither is a line that only names a step
(`resume: continuing from checkpoint step=285`, printed before the warm-up, would otherwise count as training).
"""

from __future__ import annotations

import re

from dflashctl.model import ProgressPoint

PROGRESS_TOKENS = ("step", "loss", "iter", "Step", "Loss", "STEP", "LOSS")  # no progress line lacks all of these

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)\b"
_KV_RE = re.compile(rf"(?<![\w/.])['\"]?([A-Za-z_][\w./-]*?)['\"]?\s*[=:]\s*['\"]?({_NUM})", re.IGNORECASE)
_EVAL_RE = re.compile(r"\s*eval\b", re.IGNORECASE)  # the trainer's `eval step=100 acc_len=6.81 …` (PeriodicEval)
_SPACED_RE = re.compile(rf"\b(step|iter|loss|epoch)\s+({_NUM})", re.IGNORECASE)
_KEY_ALIASES = {
    "iter": "step", "global_step": "step", "tps": "tok/s", "tokens/s": "tok/s", "tok/sec": "tok/s",
    "tokens_per_sec": "tok/s", "tokens_per_second": "tok/s", "tok_per_s": "tok/s", "wps": "tok/s",
    "learning_rate": "lr", "train_loss": "loss", "train/loss": "loss",
}


def parse_progress(text: str, line: int) -> ProgressPoint | None:
    """A progress point when the line carries a step or a loss as key=value / key: value / dict form."""
    if not any(k in text for k in PROGRESS_TOKENS):
        return None
    values: dict[str, float] = {}
    for key, num in _KV_RE.findall(text):
        k = key.lower()
        k = _KEY_ALIASES.get(k, k)
        if k not in values:
            values[k] = float(num)
    for key, num in _SPACED_RE.findall(text):
        k = _KEY_ALIASES.get(key.lower(), key.lower())
        values.setdefault(k, float(num))
    if "loss" not in values and not ("step" in values and len(values) > 1):
        return None
    return ProgressPoint(line=line, values=values, kind="eval" if _EVAL_RE.match(text) else "train")
