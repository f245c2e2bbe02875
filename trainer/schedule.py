"""The run's length and learning-rate schedule: steps or epochs, warm-up in steps or as a ratio, cosine/constant.

SpecForge's DFlash recipe (specforge/optimizer.py, specforge/lr_scheduler.py): AdamW, linear warm-up over
int(warmup_ratio * total_steps) steps, then cosine to eta_min = 0 (`min_lr` here) over the remaining steps.
"""

from __future__ import annotations

import dataclasses
import math

from trainer.config import TrainConfig
from trainer.dataset import DataError


def resolve(tr: TrainConfig, samples: int | None, seqs_per_step: int) -> TrainConfig:
    """A copy of `tr` with `steps` and `warmup_steps` fixed for this run.

    steps = min(steps, epochs * (samples // seqs_per_step)) when `epochs` is set (steps = 0: no cap), so the
    schedule always spans the run (SpecForge instead keeps `max_steps` as the cosine horizon even when its epochs
    end first); warmup_steps = int(warmup_ratio * steps) when `warmup_ratio` is set."""
    steps = tr.steps
    if tr.epochs:
        if samples is None:
            raise DataError("train.epochs needs a data set with a size (data.kind = 'generated')")
        per_epoch = samples // seqs_per_step
        if per_epoch < 1:
            raise DataError(f"train.epochs: {samples} samples make no step of {seqs_per_step} sequences")
        steps = min(steps, tr.epochs * per_epoch) if steps else tr.epochs * per_epoch
    warmup = int(tr.warmup_ratio * steps) if tr.warmup_ratio else tr.warmup_steps
    return dataclasses.replace(tr, steps=steps, warmup_steps=warmup)


def warmup_cosine(step: int, lr: float, min_lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up ((step + 1) / warmup * lr), then cosine from lr to min_lr over the remaining steps (the
    small target's pre-training uses it too: trainer/small_target.py)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, steps - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * frac))


def lr_at(step: int, tr: TrainConfig) -> float:
    """`warmup_cosine`, or constant at lr after the warm-up (`train.schedule`)."""
    if tr.schedule == "constant" and step >= tr.warmup_steps:
        return tr.lr
    return warmup_cosine(step, tr.lr, tr.min_lr, tr.warmup_steps, tr.steps)
