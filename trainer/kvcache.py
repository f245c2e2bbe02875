"""The tiny target's KV cache for decoding: per layer the keys/values of every position processed so far, cropped
back on a rejected draft. The HF target uses transformers' DynamicCache behind the same two members (trainer/hf.py).
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Per layer (k, v) [B, Hkv, L, D] (before GQA repetition); `length` positions, `crop(n)` keeps positions < n."""

    def __init__(self, num_layers: int) -> None:
        self.kv: list[tuple[Tensor, Tensor] | None] = [None] * num_layers

    @property
    def length(self) -> int:
        first = self.kv[0]
        return 0 if first is None else first[0].shape[2]

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new positions' k, v to `layer`; returns the layer's whole (k, v)."""
        old = self.kv[layer]
        if old is not None:
            k, v = torch.cat([old[0], k], dim=2), torch.cat([old[1], v], dim=2)
        self.kv[layer] = (k, v)
        return k, v

    def crop(self, length: int) -> None:
        self.kv = [None if e is None else (e[0][:, :, :length], e[1][:, :, :length]) for e in self.kv]


def causal_mask(past: int, new: int, device: torch.device | str) -> Tensor | None:
    """Bool [1, 1, new, past + new]: the query at position past + i sees keys 0..past + i. None without a past
    (plain `is_causal` SDPA; with a past, `is_causal`'s top-left alignment would be wrong)."""
    if past == 0:
        return None
    q = torch.arange(past, past + new, device=device)[:, None]
    k = torch.arange(past + new, device=device)[None, :]
    return (k <= q)[None, None]
