"""The DFlash attention mask, one definition for both attention paths.

Keys/values are laid out as [context (T positions) ; block 0 ; block 1 ; ...], each block `Bs` long; queries are
the blocks only. A query in block j (anchor a_j) may see context positions kv < a_j, every position of its own block
(bidirectional), and nothing of other blocks. The same `mask_mod` feeds `create_block_mask` (flex_attention, CUDA)
and is evaluated on broadcast index grids to materialise the bool mask for SDPA (CPU, where flex has no backward).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def dflash_mask_mod(anchors: Tensor, ctx_len: int, block_size: int) -> MaskMod:
    """anchors: [B, A] long. Returns mask_mod(b, h, q_idx, kv_idx) -> bool (True = may attend)."""

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        block = q_idx // block_size
        in_ctx = kv_idx < ctx_len
        sees_ctx = in_ctx & (kv_idx < anchors[b, block])
        same_block = (~in_ctx) & ((kv_idx - ctx_len) // block_size == block)
        return sees_ctx | same_block

    return mask_mod


def dense_mask(anchors: Tensor, ctx_len: int, block_size: int) -> Tensor:
    """The mask as a bool tensor [B, 1, Q, KV] for scaled_dot_product_attention."""
    bsz, num_anchors = anchors.shape
    q_len = num_anchors * block_size
    dev = anchors.device
    b = torch.arange(bsz, device=dev).view(bsz, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=dev)
    q = torch.arange(q_len, device=dev).view(1, 1, q_len, 1)
    kv = torch.arange(ctx_len + q_len, device=dev).view(1, 1, 1, ctx_len + q_len)
    return dflash_mask_mod(anchors, ctx_len, block_size)(b, h, q, kv)


def flex_block_mask(anchors: Tensor, ctx_len: int, block_size: int):  # -> BlockMask
    """The mask as a flex_attention BlockMask (built eagerly; create_block_mask itself does not torch.compile)."""
    from torch.nn.attention.flex_attention import create_block_mask

    bsz, num_anchors = anchors.shape
    q_len = num_anchors * block_size
    return create_block_mask(dflash_mask_mod(anchors, ctx_len, block_size), bsz, None, q_len,
                             ctx_len + q_len, device=anchors.device)


def causal_block_mask(seq_len: int, device: str | torch.device):  # -> BlockMask
    """Plain causal BlockMask for the target (used only by the `naive` strategy's eager flex_attention)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, q, kv: q >= kv, None, None, seq_len, seq_len, device=device)
