"""The tiny target LM in plain torch (Llama/Qwen3 style: RMSNorm, rotary, GQA, SwiGLU), and the interface the
trainer needs from any target. Pure: no I/O, no threads, no config files. An HF checkpoint stands in through
trainer/hf.py's `HFTarget`, which provides the same interface.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor, nn

from trainer.config import TargetConfig
from trainer.kvcache import KVCache, causal_mask
from trainer.layers import AttendFn, RMSNorm, SwiGLU, apply_rope, rope_cos_sin, sdpa_attend


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

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: AttendFn, mask: Any,
                cache: KVCache | None = None, index: int = 0) -> Tensor:
        """With `cache`, x holds only the new positions; their k, v join layer `index` of the cache first."""
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.append(index, k, v)
        out = attend(q, k, v, mask)
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

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers))

    @torch.no_grad()
    def forward_cached(self, ids: Tensor, cache: KVCache, layer_ids: list[int],
                       logits_to_keep: int = 0) -> tuple[Tensor, Tensor]:
        """Decoding with a KV cache: `ids` [1, t] are the positions after the `cache.length` already cached; their
        k, v join the cache. Returns logits [1, t, V] (the last `logits_to_keep` only, 0 = all) and the captured
        features [1, t, len(layer_ids) * H] of the new positions (width 0 for no layers)."""
        x, features = self._run(ids, layer_ids, sdpa_attend, causal_mask(cache.length, ids.shape[1], ids.device),
                                cache)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.lm_head(self.norm(x.to(ids.device))), features

    def _run(self, ids: Tensor, layer_ids: list[int], attend: AttendFn, causal_mask: Any,
             cache: KVCache | None = None) -> tuple[Tensor, Tensor]:
        """The layer loop over the target's devices: final hidden state, and the captured layers concatenated.
        With a cache, `ids` continue the cached positions."""
        b, t = ids.shape
        past = cache.length if cache is not None else 0
        pos = torch.arange(past, past + t, device=ids.device).expand(b, t)
        cos, sin = rope_cos_sin(pos, self.layers[0].hd, self.cfg.rope_theta)
        x, captured = self.embed(ids), []
        for i, (layer, dev) in enumerate(zip(self.layers, self.layer_devices, strict=True)):
            if x.device != torch.device(dev):
                x, cos, sin = x.to(dev), cos.to(dev), sin.to(dev)
            mask = causal_mask
            if mask is not None and hasattr(mask, "to") and x.device != ids.device:
                mask = mask.to(dev)
            x = layer(x, cos, sin, attend, mask, cache, i)
            if i in layer_ids:
                captured.append(x.to(ids.device))
        if not captured:
            return x, x.new_zeros(b, t, 0, device=ids.device)
        return x, torch.cat(captured, dim=-1)
