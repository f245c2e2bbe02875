"""The independent reference the cached decoding paths are tested against: plain greedy decoding, one full forward
(`forward_all`, no cache) per token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

ForwardFn = Callable[[Tensor], tuple[Tensor, Tensor]]


def forward_fn(target: Any, layer_ids: list[int]) -> ForwardFn:
    """A full forward without a cache (`forward_all`)."""
    return lambda ids: target.forward_all(ids, layer_ids)


def greedy_decode(forward: ForwardFn, prompt: list[int], max_new_tokens: int, eos_id: int | None,
                  device: torch.device | str = "cpu") -> list[int]:
    """Plain greedy decoding, one full recompute per token, no cache."""
    ids, out = list(prompt), []
    while len(out) < max_new_tokens:
        logits, _ = forward(torch.tensor([ids], device=device))
        tok = int(logits[0, -1].argmax())
        out.append(tok)
        ids.append(tok)
        if tok == eos_id:
            break
    return out
