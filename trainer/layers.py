"""Building blocks shared by the tiny target and the drafter: RMSNorm, rotary tables, SwiGLU, SDPA. Pure torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# attend(q, k, v, mask) -> out: q [B, H, Q, D], k/v [B, Hkv, KV, D] with Hkv dividing H (GQA: the attention
# kernel maps query heads to key/value heads itself, `enable_gqa`, so repeated k/v are never materialised);
# `mask` is whatever the chosen attention path wants.
AttendFn = Callable[[Tensor, Tensor, Tensor, Any], Tensor]


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype matmuls run in at this point: autocast's when it is on for x's device, else x's own."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def same_dtype(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v cast to the compute dtype. Under bf16 autocast the fp32 RMSNorm weights make q_norm/k_norm return
    fp32 while v stays bf16: SDPA/flex then either refuse ("Expected query, key, and value to have the same
    dtype") or run fp32 kernels (about 12x slower backward at head_dim 128)."""
    dt = compute_dtype(v)
    return q.to(dt), k.to(dt), v.to(dt)


def check_attention_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Where attention is called: one dtype for q, k and v (a dtype check is static: free inside torch.compile)."""
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"attention inputs differ in dtype: q {q.dtype}, k {k.dtype}, v {v.dtype}")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """Rotary tables for integer positions [B, L] -> cos, sin [B, 1, L, head_dim]."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    ang = positions.float()[..., None] * inv
    emb = torch.cat([ang, ang], dim=-1)[:, None]
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Keeps x's dtype (the fp32 tables would promote bf16 q/k, and flex_attention needs q, k, v alike)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def sdpa_attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """SDPA; `mask` is a bool [B, 1, Q, KV] (True = may attend) or None for causal self-attention."""
    check_attention_inputs(q, k, v)
    gqa = q.shape[1] != k.shape[1]
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
