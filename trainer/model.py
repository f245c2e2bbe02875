"""The tiny target LM and the DFlash drafter, in plain torch. Pure: no I/O, no threads, no config files.

The target is a Llama/Qwen3-style causal LM (RMSNorm, rotary, GQA, SwiGLU). The trainer only needs the small
`TargetModel` interface (embed, lm_head, hidden states at a few layers), so an HF checkpoint can stand in later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.config import DrafterConfig, TargetConfig

# attend(q, k, v, mask) -> out, all [B, H, L, D]; `mask` is whatever the chosen attention path wants.
AttendFn = Callable[[Tensor, Tensor, Tensor, Any], Tensor]


class TargetModel(Protocol):
    """What the trainer needs from a target: frozen embedding and LM head, hidden states at given layers.
    `TinyTarget` implements it; an HF-backed target (issue 5) only has to provide the same."""

    cfg: TargetConfig  # dimensions (hidden_size, vocab_size, rope_theta, rms_eps, ...)
    vocab_size: int
    hidden_size: int
    mask_token_id: int
    embed_tokens: nn.Embedding  # frozen; the drafter copies its weight
    lm_head_proj: nn.Linear  # frozen; the drafter copies its weight

    def embed(self, ids: Tensor) -> Tensor: ...

    def lm_head(self, hidden: Tensor) -> Tensor: ...

    def hidden_states(self, ids: Tensor, layer_ids: list[int]) -> Tensor:
        """[B, T] token ids -> [B, T, len(layer_ids) * H], the outputs of those layers concatenated."""
        ...


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


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """GQA: [B, Hkv, L, D] -> [B, Hkv * n_rep, L, D] (explicit, so every attention path sees the same heads)."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def sdpa_attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """SDPA; `mask` is a bool [B, 1, Q, KV] (True = may attend) or None for causal self-attention."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class TargetLayer(nn.Module):
    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        h, self.nh, self.nkv = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads
        self.hd = h // self.nh
        self.q = nn.Linear(h, self.nh * self.hd, bias=False)
        self.k = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.v = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.o = nn.Linear(self.nh * self.hd, h, bias=False)
        self.attn_norm = RMSNorm(h, cfg.rms_eps)
        self.mlp_norm = RMSNorm(h, cfg.rms_eps)
        self.mlp = SwiGLU(h, cfg.intermediate_size)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: AttendFn, mask: Any) -> Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.nh // self.nkv
        out = attend(q, repeat_kv(k, rep), repeat_kv(v, rep), mask)
        x = x + self.o(out.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.mlp_norm(x))


class TinyTarget(nn.Module):
    """A randomly initialised causal LM of the Llama/Qwen3 family; the last vocab id is the drafter's MASK."""

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size, self.hidden_size = cfg.vocab_size, cfg.hidden_size
        self.mask_token_id = cfg.vocab_size - 1
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(TargetLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head_proj = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        gen = torch.Generator().manual_seed(cfg.init_seed)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() == 2:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.5 / p.shape[1] ** 0.5)
            self.embed_tokens.weight.copy_(torch.randn(self.embed_tokens.weight.shape, generator=gen))
        self.requires_grad_(False)
        # causal attention: SDPA(is_causal) by default; the naive strategy swaps in eager flex_attention.
        self.attend: AttendFn = sdpa_attend
        self.causal_mask: Any = None
        self.layer_devices: list[str] = ["cpu"] * cfg.num_layers

    def place(self, devices: list[str]) -> TinyTarget:
        """Spread the layers over `devices` in contiguous chunks (pipeline split); embed/head on the first."""
        self.layer_devices = [devices[i * len(devices) // len(self.layers)] for i in range(len(self.layers))]
        self.embed_tokens.to(devices[0])
        self.norm.to(devices[0])
        self.lm_head_proj.to(devices[0])
        for layer, dev in zip(self.layers, self.layer_devices, strict=True):
            layer.to(dev)
        return self

    def embed(self, ids: Tensor) -> Tensor:
        return self.embed_tokens(ids)

    def lm_head(self, hidden: Tensor) -> Tensor:
        return self.lm_head_proj(hidden)

    @torch.no_grad()
    def hidden_states(self, ids: Tensor, layer_ids: list[int]) -> Tensor:
        _, features = self._run(ids, layer_ids, self.attend, self.causal_mask)
        return features

    @torch.no_grad()
    def forward_all(self, ids: Tensor, layer_ids: list[int]) -> tuple[Tensor, Tensor]:
        """Logits and captured features in one pass, for decoding (same entry point as the HF target). Always
        plain causal SDPA: decoding never touches the trainer's attention path (eager flex under threads)."""
        x, features = self._run(ids, layer_ids, sdpa_attend, None)
        return self.lm_head(self.norm(x.to(ids.device))), features

    def _run(self, ids: Tensor, layer_ids: list[int], attend: AttendFn, causal_mask: Any) -> tuple[Tensor, Tensor]:
        """The layer loop over the target's devices: final hidden state, and the captured layers concatenated."""
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device).expand(b, t)
        cos, sin = rope_cos_sin(pos, self.layers[0].hd, self.cfg.rope_theta)
        x, captured = self.embed(ids), []
        for i, (layer, dev) in enumerate(zip(self.layers, self.layer_devices, strict=True)):
            if x.device != torch.device(dev):
                x, cos, sin = x.to(dev), cos.to(dev), sin.to(dev)
            mask = causal_mask
            if mask is not None and hasattr(mask, "to") and x.device != ids.device:
                mask = mask.to(dev)
            x = layer(x, cos, sin, attend, mask)
            if i in layer_ids:
                captured.append(x.to(ids.device))
        return x, torch.cat(captured, dim=-1)


class DrafterLayer(nn.Module):
    """Queries from the block only; keys/values from [projected target context ; block]."""

    def __init__(self, hidden: int, dcfg: DrafterConfig, eps: float) -> None:
        super().__init__()
        self.nh, self.nkv = dcfg.num_heads, dcfg.num_kv_heads
        self.hd = hidden // self.nh
        self.q = nn.Linear(hidden, self.nh * self.hd, bias=False)
        self.k = nn.Linear(hidden, self.nkv * self.hd, bias=False)
        self.v = nn.Linear(hidden, self.nkv * self.hd, bias=False)
        self.o = nn.Linear(self.nh * self.hd, hidden, bias=False)
        self.attn_norm = RMSNorm(hidden, eps)
        self.mlp_norm = RMSNorm(hidden, eps)
        self.mlp = SwiGLU(hidden, dcfg.intermediate_size)

    def forward(self, x: Tensor, ctx: Tensor, rope_q: tuple[Tensor, Tensor], rope_kv: tuple[Tensor, Tensor],
                attend: AttendFn, mask: Any) -> Tensor:
        b, nq, _ = x.shape
        h = self.attn_norm(x)
        kv_in = torch.cat([ctx, h], dim=1)
        nkv = kv_in.shape[1]
        q = self.q(h).view(b, nq, self.nh, self.hd).transpose(1, 2)
        k = self.k(kv_in).view(b, nkv, self.nkv, self.hd).transpose(1, 2)
        v = self.v(kv_in).view(b, nkv, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, *rope_q), apply_rope(k, *rope_kv)
        rep = self.nh // self.nkv
        out = attend(q, repeat_kv(k, rep), repeat_kv(v, rep), mask)
        x = x + self.o(out.transpose(1, 2).reshape(b, nq, -1))
        return x + self.mlp(self.mlp_norm(x))


class Drafter(nn.Module):
    """DFlash drafter. Frozen target embedding / LM head are non-persistent buffers: copied per replica, never
    trained, never checkpointed (they belong to the target).

    Precision follows the target: the trained parameters stay fp32 (master weights, fp32 grads for the
    all-reduce and AdamW); when the target is bf16/fp16 (an HF checkpoint on CUDA) its buffers and hidden states
    are too, and the forward runs under autocast in that dtype on whatever device the drafter is on. Casting the
    buffers up to fp32 instead would cost 2 x vocab x hidden x 2 bytes per replica (2.5 GB for Qwen3-8B)."""

    def __init__(self, hidden: int, dcfg: DrafterConfig, num_captured: int, rope_theta: float, eps: float,
                 embed_weight: Tensor, lm_head_weight: Tensor) -> None:
        super().__init__()
        h = hidden
        self.block_size, self.rope_theta = dcfg.block_size, rope_theta
        self.fc = nn.Linear(num_captured * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, eps)
        self.layers = nn.ModuleList(DrafterLayer(h, dcfg, eps) for _ in range(dcfg.num_layers))
        self.norm = RMSNorm(h, eps)
        self.register_buffer("embed_weight", embed_weight.detach().clone(), persistent=False)
        self.register_buffer("lm_head_weight", lm_head_weight.detach().clone(), persistent=False)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The target's dtype when it is a low-precision one (autocast), else fp32."""
        dt = self.embed_weight.dtype
        return dt if dt in (torch.bfloat16, torch.float16) else torch.float32

    def forward(self, block_ids: Tensor, block_pos: Tensor, target_hidden: Tensor, attend: AttendFn,
                mask: Any) -> Tensor:
        """block_ids/block_pos [B, A*Bs]; target_hidden [B, T, n*H] -> logits [B, A*Bs, V] (compute dtype)."""
        dt = self.compute_dtype
        with torch.autocast(block_ids.device.type, dtype=dt, enabled=dt != torch.float32):
            return self._forward(block_ids, block_pos, target_hidden, attend, mask)

    def _forward(self, block_ids: Tensor, block_pos: Tensor, target_hidden: Tensor, attend: AttendFn,
                 mask: Any) -> Tensor:
        b, t, _ = target_hidden.shape
        ctx = self.hidden_norm(self.fc(target_hidden))
        x = F.embedding(block_ids, self.embed_weight)
        hd = self.layers[0].hd
        ctx_pos = torch.arange(t, device=block_pos.device).expand(b, t)
        rope_q = rope_cos_sin(block_pos, hd, self.rope_theta)
        rope_kv = rope_cos_sin(torch.cat([ctx_pos, block_pos], dim=1), hd, self.rope_theta)
        for layer in self.layers:
            x = layer(x, ctx, rope_q, rope_kv, attend, mask)
        return F.linear(self.norm(x), self.lm_head_weight)


def build_drafter(target: TargetModel, dcfg: DrafterConfig, num_captured: int, device: str) -> Drafter:
    tcfg = target.cfg
    return Drafter(tcfg.hidden_size, dcfg, num_captured, tcfg.rope_theta, tcfg.rms_eps, target.embed_tokens.weight,
                   target.lm_head_proj.weight).to(device)
