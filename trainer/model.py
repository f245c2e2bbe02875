"""The DFlash drafter in plain torch. Pure: no I/O, no threads, no config files."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.config import DrafterConfig
from trainer.layers import AttendFn, RMSNorm, SwiGLU, apply_rope, repeat_kv, rope_cos_sin
from trainer.tiny_target import TargetModel


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
        return self.logits(self.hidden(block_ids, block_pos, target_hidden, attend, mask))

    def hidden(self, block_ids: Tensor, block_pos: Tensor, target_hidden: Tensor, attend: AttendFn,
               mask: Any) -> Tensor:
        """The final normed hidden states [B, A*Bs, H] before the LM head: what a chunked loss consumes, so the
        full [B, A*Bs, V] logits never exist at once."""
        dt = self.compute_dtype
        with torch.autocast(block_ids.device.type, dtype=dt, enabled=dt != torch.float32):
            return self._forward(block_ids, block_pos, target_hidden, attend, mask)

    def logits(self, hidden: Tensor) -> Tensor:
        """The target's frozen LM head over drafter hidden states."""
        dt = self.compute_dtype
        with torch.autocast(hidden.device.type, dtype=dt, enabled=dt != torch.float32):
            return F.linear(hidden, self.lm_head_weight)

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
        return self.norm(x)


def build_drafter(target: TargetModel, dcfg: DrafterConfig, num_captured: int, device: str) -> Drafter:
    tcfg = target.cfg
    return Drafter(tcfg.hidden_size, dcfg, num_captured, tcfg.rope_theta, tcfg.rms_eps, target.embed_tokens.weight,
                   target.lm_head_proj.weight).to(device)
