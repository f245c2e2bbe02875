"""The DFlash drafter in plain torch. Pure: no I/O, no threads, no config files."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.config import DrafterConfig
from trainer.kvcache import KVCache
from trainer.layers import AttendFn, RMSNorm, SwiGLU, apply_rope, check_attention_inputs, rope_cos_sin, same_dtype
from trainer.tiny_target import TargetModel


class DrafterAttention(nn.Module):
    """The reference's `Qwen3DFlashAttention`: queries from the block; keys/values from [projected target context ;
    block]; a per-head RMSNorm on queries and keys before the rotary (`q_norm`, `k_norm`), as in Qwen3."""

    def __init__(self, hidden: int, dcfg: DrafterConfig, head_dim: int, eps: float) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = dcfg.num_heads, dcfg.num_kv_heads, head_dim
        bias = dcfg.attention_bias
        self.q_proj = nn.Linear(hidden, self.nh * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.nkv * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.nkv * head_dim, bias=bias)
        self.o_proj = nn.Linear(self.nh * head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def keys_values(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """x [B, L, H] -> k, v [B, Hkv, L, D] (k normed and rotated): per position, so a cache can hold them."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.nkv, self.hd).transpose(1, 2)
        return apply_rope(k, *rope), v

    def forward(self, h: Tensor, k: Tensor, v: Tensor, rope_q: tuple[Tensor, Tensor], attend: AttendFn,
                mask: Any) -> Tensor:
        """h [B, Q, H] (the normed block), k/v [B, Hkv, KV, D] -> [B, Q, H]."""
        b, nq, _ = h.shape
        q = apply_rope(self.q_norm(self.q_proj(h).view(b, nq, self.nh, self.hd)).transpose(1, 2), *rope_q)
        q, k, v = same_dtype(q, k, v)  # the compute dtype: q_norm/k_norm return fp32 under bf16 autocast
        out = attend(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, nq, -1))


class DrafterLayer(nn.Module):
    """The reference's `Qwen3DFlashDecoderLayer` (parameter names included, so exports load there)."""

    def __init__(self, hidden: int, dcfg: DrafterConfig, head_dim: int, eps: float) -> None:
        super().__init__()
        self.self_attn = DrafterAttention(hidden, dcfg, head_dim, eps)
        self.mlp = SwiGLU(hidden, dcfg.intermediate_size)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: Tensor, ctx: Tensor, rope_q: tuple[Tensor, Tensor], rope_kv: tuple[Tensor, Tensor],
                attend: AttendFn, mask: Any) -> Tensor:
        """Training: `ctx` [B, T, H] is the whole projected context, `mask` the DFlash mask over [ctx ; blocks]."""
        h = self.input_layernorm(x)
        k, v = self.self_attn.keys_values(torch.cat([ctx, h], dim=1), rope_kv)
        x = x + self.self_attn(h, k, v, rope_q, attend, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def decode(self, x: Tensor, ctx: Tensor, rope_q: tuple[Tensor, Tensor], rope_kv: tuple[Tensor, Tensor],
               past: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Decoding one block: `ctx` holds only the context positions new since `past`; the block sees all the
        context and itself (what the training mask gives a block whose anchor is the next position). Returns the
        block's output and the context keys/values to keep."""
        h = self.input_layernorm(x)
        k, v = self.self_attn.keys_values(torch.cat([ctx, h], dim=1), rope_kv)
        m = ctx.shape[1]
        k_ctx, v_ctx = k[:, :, :m], v[:, :, :m]
        if past is not None:
            k_ctx, v_ctx = torch.cat([past[0], k_ctx], dim=2), torch.cat([past[1], v_ctx], dim=2)
        k_all, v_all = torch.cat([k_ctx, k[:, :, m:]], dim=2), torch.cat([v_ctx, v[:, :, m:]], dim=2)
        x = x + self.self_attn(h, k_all, v_all, rope_q, full_attend, None)
        return x + self.mlp(self.post_attention_layernorm(x)), (k_ctx, v_ctx)


def full_attend(q: Tensor, k: Tensor, v: Tensor, mask: Any) -> Tensor:
    """Unmasked SDPA: a decoding block attends to every cached context position and to its whole self."""
    check_attention_inputs(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])


class Drafter(nn.Module):
    """The DFlash drafter, parameter for parameter the reference's `DFlashDraftModel` (dflash 0.1.0,
    dflash/model.py): `fc` over the concatenated target layers, `hidden_norm`, Qwen3-style layers whose keys and
    values come from [context ; block], a final `norm`. The target's embedding and LM head are frozen
    non-persistent buffers: copied per replica, never trained, never checkpointed (they belong to the target,
    which is also where the reference takes them from).

    Precision follows the target: the trained parameters stay fp32 (master weights, fp32 grads for the
    all-reduce and AdamW); when the target is bf16/fp16 (an HF checkpoint on CUDA) its buffers and hidden states
    are too, and the forward runs under autocast in that dtype on whatever device the drafter is on. Casting the
    buffers up to fp32 instead would cost 2 x vocab x hidden x 2 bytes per replica (2.5 GB for Qwen3-8B)."""

    def __init__(self, hidden: int, dcfg: DrafterConfig, num_captured: int, rope_theta: float, eps: float,
                 embed_weight: Tensor, lm_head_weight: Tensor, head_dim: int = 0,
                 mask_token_id: int = -1) -> None:
        super().__init__()
        h = hidden
        self.head_dim = head_dim or h // dcfg.num_heads
        self.block_size, self.rope_theta = dcfg.block_size, rope_theta
        self.mask_token_id = mask_token_id if mask_token_id >= 0 else embed_weight.shape[0] - 1
        self.fc = nn.Linear(num_captured * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, eps)
        self.layers = nn.ModuleList(DrafterLayer(h, dcfg, self.head_dim, eps) for _ in range(dcfg.num_layers))
        self.norm = RMSNorm(h, eps)
        for m in self.modules():  # SpecForge's init (its config's initializer_range through HF's _init_weights)
            if isinstance(m, nn.Linear) and dcfg.init_std > 0:
                nn.init.normal_(m.weight, mean=0.0, std=dcfg.init_std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        self.register_buffer("embed_weight", embed_weight.detach().clone(), persistent=False)
        self.register_buffer("lm_head_weight", lm_head_weight.detach().clone(), persistent=False)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The target's dtype when it is a low-precision one (autocast), else fp32."""
        dt = self.embed_weight.dtype
        return dt if dt in (torch.bfloat16, torch.float16) else torch.float32

    def _autocast(self, device: torch.device) -> torch.autocast:
        dt = self.compute_dtype
        return torch.autocast(device.type, dtype=dt, enabled=dt != torch.float32)

    def forward(self, block_ids: Tensor, block_pos: Tensor, target_hidden: Tensor, attend: AttendFn,
                mask: Any) -> Tensor:
        """block_ids/block_pos [B, A*Bs]; target_hidden [B, T, n*H] -> logits [B, A*Bs, V] (compute dtype)."""
        return self.logits(self.hidden(block_ids, block_pos, target_hidden, attend, mask))

    def hidden(self, block_ids: Tensor, block_pos: Tensor, target_hidden: Tensor, attend: AttendFn,
               mask: Any) -> Tensor:
        """The final normed hidden states [B, A*Bs, H] before the LM head: what a chunked loss consumes, so the
        full [B, A*Bs, V] logits never exist at once."""
        with self._autocast(block_ids.device):
            b, t, _ = target_hidden.shape
            ctx = self.hidden_norm(self.fc(target_hidden))
            x = F.embedding(block_ids, self.embed_weight)
            ctx_pos = torch.arange(t, device=block_pos.device).expand(b, t)
            rope_q = rope_cos_sin(block_pos, self.head_dim, self.rope_theta)
            rope_kv = rope_cos_sin(torch.cat([ctx_pos, block_pos], dim=1), self.head_dim, self.rope_theta)
            for layer in self.layers:
                x = layer(x, ctx, rope_q, rope_kv, attend, mask)
            return self.norm(x)

    def logits(self, hidden: Tensor) -> Tensor:
        """The target's frozen LM head over drafter hidden states."""
        with self._autocast(hidden.device):
            return F.linear(hidden, self.lm_head_weight)

    # ---- decoding ----------------------------------------------------------------------------------------
    def new_cache(self) -> KVCache:
        """Per layer, the keys/values of the context positions the drafter has seen, never a block's own: the
        reference's draft DynamicCache as it is after its crop to `start` following every draft."""
        return KVCache(len(self.layers))

    @torch.no_grad()
    def draft_logits(self, new_ctx: Tensor, ctx_start: int, block_ids: Tensor, cache: KVCache) -> Tensor:
        """One block with a KV cache, as the reference's `dflash_generate` drafts. `new_ctx` [1, m, n*H]: target
        features of positions ctx_start..ctx_start+m-1, not yet given to the drafter (`cache.length` must be
        ctx_start); `block_ids` [1, Bs]: [anchor, MASK...] at the positions right after. Returns logits
        [1, Bs, V] (fp32); afterwards the cache holds the context up to the anchor, never the block."""
        if cache.length != ctx_start:
            raise ValueError(f"draft cache holds {cache.length} positions, the new context starts at {ctx_start}")
        dev = self.fc.weight.device
        new_ctx, block_ids = new_ctx.to(dev, self.embed_weight.dtype), block_ids.to(dev)
        m, bs = new_ctx.shape[1], block_ids.shape[1]
        with self._autocast(dev):
            ctx = self.hidden_norm(self.fc(new_ctx))
            x = F.embedding(block_ids, self.embed_weight)
            pos = torch.arange(ctx_start, ctx_start + m + bs, device=dev)[None]
            rope_q = rope_cos_sin(pos[:, m:], self.head_dim, self.rope_theta)
            rope_kv = rope_cos_sin(pos, self.head_dim, self.rope_theta)
            for i, layer in enumerate(self.layers):
                x, cache.kv[i] = layer.decode(x, ctx, rope_q, rope_kv, cache.kv[i])
            return F.linear(self.norm(x), self.lm_head_weight).float()


def build_drafter(target: TargetModel, dcfg: DrafterConfig, num_captured: int, device: str) -> Drafter:
    tcfg = target.cfg
    head_dim = dcfg.head_dim or getattr(tcfg, "head_dim", 0) or tcfg.hidden_size // dcfg.num_heads
    return Drafter(tcfg.hidden_size, dcfg, num_captured, tcfg.rope_theta, tcfg.rms_eps, target.embed_tokens.weight,
                   target.lm_head_proj.weight, head_dim, target.mask_token_id).to(device)
