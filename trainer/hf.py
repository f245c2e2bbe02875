"""A local Hugging Face checkpoint (Qwen3 / Llama family) as the trainer's target.

`HFTarget` implements the `TargetModel` protocol of trainer/model.py (embed, lm_head, hidden states at captured
layers) and quacks like `TinyTarget` where the pipeline reaches inside (`cfg`, `embed_tokens`, `lm_head_proj`,
`layer_devices`), so `build_drafter` gives a drafter with the target's hidden size and a frozen copy of its
embedding and LM head. The model is split layer-wise over the target devices the way accelerate's device maps
do (a pre-hook moves each layer's inputs to its device), without needing accelerate; captured layers are read
wherever they land and gathered on the first device. `target.dtype`: auto = bf16 when any target device is
CUDA, fp32 on the CPU.
Loading is local only: `local_files_only=True`, never a hub download.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import torch
from torch import Tensor, nn

from trainer.config import Config, TargetConfig
from trainer.hf_config import HFConfigError, target_dims
from trainer.oneline import first_line


def split_layers(num_layers: int, devices: list[str]) -> list[str]:
    """Contiguous chunks, as even as possible: 36 layers over 5 GPUs -> 8,7,7,7,7 (same rule as TinyTarget)."""
    return [devices[i * len(devices) // num_layers] for i in range(num_layers)]


def default_dtype(devices: list[str]) -> torch.dtype:
    return torch.bfloat16 if any(d.startswith("cuda") for d in devices) else torch.float32


def target_dtype(name: str, devices: list[str], hf: bool) -> torch.dtype:
    """`target.dtype`: auto = bf16 for an HF checkpoint on CUDA, fp32 otherwise (CPU, the tiny model)."""
    if name == "auto":
        return default_dtype(devices) if hf else torch.float32
    return getattr(torch, name)


def _move(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, Tensor):
        return obj if obj.device == device else obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_move(o, device) for o in obj)
    if isinstance(obj, list):
        return [_move(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _move(v, device) for k, v in obj.items()}
    return obj


def _inputs_to(module: nn.Module, device: str) -> None:
    """Pre-hook: every tensor argument (hidden states, rotary tables, masks) follows the module to `device`."""
    dev = torch.device(device)

    def hook(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _move(args, dev), _move(kwargs, dev)

    module.register_forward_pre_hook(hook, with_kwargs=True)


def sync_target_config(tcfg: TargetConfig) -> TargetConfig:
    """A copy of `tcfg` with the dimensions read from the checkpoint's config.json (they are the truth)."""
    return dataclasses.replace(tcfg, **target_dims(tcfg.path))


class HFCache:
    """transformers' DynamicCache behind the decoding cache interface of trainer/kvcache.py: `length`, and
    `crop(n)` keeping positions < n (DynamicCache.crop wants minus the number to remove, as the reference calls it:
    a positive argument means "keep n" on transformers 4 and is refused on 5)."""

    def __init__(self, config: Any) -> None:
        from transformers import DynamicCache

        try:
            self.inner = DynamicCache(config=config)
        except TypeError:  # transformers releases whose DynamicCache takes no config
            self.inner = DynamicCache()
        if hasattr(self.inner, "activate_past_recording"):  # sliding-window / linear layers: keep what crop needs
            self.inner.activate_past_recording()

    @property
    def length(self) -> int:
        return int(self.inner.get_seq_length())

    def crop(self, length: int) -> None:
        remove = self.length - length
        if remove > 0:  # crop(0) would empty the cache on transformers 4
            self.inner.crop(-remove)


class HFTarget:
    """Frozen HF causal LM behind the trainer's target interface."""

    def __init__(self, model: nn.Module, tcfg: TargetConfig, devices: list[str]) -> None:
        self.model = model.eval().requires_grad_(False)
        self.cfg = tcfg
        self.vocab_size, self.hidden_size = tcfg.vocab_size, tcfg.hidden_size
        # the last embedding row: unused on checkpoints whose embedding is padded past the tokenizer (Qwen3,
        # our tiny checkpoints); on Llama 3 it is a reserved special token that never occurs in data.
        self.mask_token_id = tcfg.vocab_size - 1
        self.embed_tokens: nn.Embedding = model.get_input_embeddings()
        self.lm_head_proj: nn.Linear = model.get_output_embeddings()
        self.devices = list(devices)
        self.layer_devices: list[str] = ["cpu"] * tcfg.num_layers
        # set by the pipeline's `naive` strategy on TinyTarget; HF attention ignores them
        self.attend: Any = None
        self.causal_mask: Any = None
        self._place(self.devices)

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self.model.model.layers

    def _place(self, devices: list[str]) -> None:
        """Embedding + rotary on the first device, layers in chunks, final norm + LM head on the last; logits
        come back to the first device so `generate` sees one device."""
        base = self.model.model
        self.layer_devices = split_layers(len(self.decoder_layers), devices)
        first, last = devices[0], devices[-1]
        base.embed_tokens.to(first)
        if hasattr(base, "rotary_emb"):
            base.rotary_emb.to(first)
        for layer, dev in zip(self.decoder_layers, self.layer_devices, strict=True):
            layer.to(dev)
        base.norm.to(last)
        self.model.lm_head.to(last)
        if len(set(devices)) > 1:
            for layer, dev in zip(self.decoder_layers, self.layer_devices, strict=True):
                _inputs_to(layer, dev)
            _inputs_to(base.norm, last)
            _inputs_to(self.model.lm_head, last)
            first_dev = torch.device(first)
            self.model.lm_head.register_forward_hook(lambda mod, args, out: _move(out, first_dev))

    @property
    def first_device(self) -> torch.device:
        return self.embed_tokens.weight.device

    # ---- TargetModel protocol ----------------------------------------------------------------------------
    def embed(self, ids: Tensor) -> Tensor:
        return self.embed_tokens(ids.to(self.first_device))

    def lm_head(self, hidden: Tensor) -> Tensor:
        w = self.lm_head_proj.weight
        return self.lm_head_proj(hidden.to(w.device, w.dtype)).to(hidden.device)

    @torch.no_grad()
    def hidden_states(self, ids: Tensor, layer_ids: list[int]) -> Tensor:
        """[B, T] -> [B, T, len(layer_ids) * H]: outputs of those decoder layers, on `ids`' device.

        `target.micro_batches` = m > 1: the batch goes through in m micro-batches, issued one after another
        without a host synchronisation (the pre-hooks' device-to-device copies and the gather are asynchronous).
        On CUDA each device then executes its layers for micro-batch i while the next device still runs i-1, so
        the stages of a layer-split target overlap instead of waiting in turn; on the CPU it is the same output
        computed in pieces. Sequences are independent (no padding mask), so splitting changes no result."""
        parts = [p for p in ids.to(self.first_device).tensor_split(max(1, self.cfg.micro_batches)) if len(p)]
        feats = []
        for part in parts:
            out = self.model.model(input_ids=part, output_hidden_states=True, use_cache=False)
            feats.append(self._gather(out.hidden_states, layer_ids, ids.device))
            del out  # one micro-batch's hidden states of every layer at a time
        return feats[0] if len(feats) == 1 else torch.cat(feats)

    @torch.no_grad()
    def forward_all(self, ids: Tensor, layer_ids: list[int]) -> tuple[Tensor, Tensor]:
        """Logits [B, T, V] and captured features [B, T, n*H] from one full forward (for decoding)."""
        out = self.model(input_ids=ids.to(self.first_device), output_hidden_states=True, use_cache=False)
        return out.logits.to(ids.device), self._gather(out.hidden_states, layer_ids, ids.device)

    def new_cache(self) -> HFCache:
        return HFCache(self.model.config)

    @functools.cached_property
    def _cache_arg(self) -> str:
        """`cache` on recent transformers (5.x deprecates `past_key_values`), `past_key_values` before."""
        return "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    @torch.no_grad()
    def forward_cached(self, ids: Tensor, cache: HFCache, layer_ids: list[int],
                       logits_to_keep: int = 0) -> tuple[Tensor, Tensor]:
        """Decoding with transformers' KV cache (the `TinyTarget.forward_cached` contract): `ids` [1, t] continue
        the `cache.length` cached positions (explicit position_ids); logits [1, t, V] (the last `logits_to_keep`,
        0 = all) and the captured features [1, t, n*H] of the new positions, both on `ids`' device. Split over
        devices, each layer's cache stays on that layer's device (the cache object itself is not moved)."""
        first, past = self.first_device, cache.length
        pos = torch.arange(past, past + ids.shape[1], device=first)[None]
        kw = {self._cache_arg: cache.inner, **({"logits_to_keep": logits_to_keep} if logits_to_keep else {})}
        out = self.model(input_ids=ids.to(first), position_ids=pos, use_cache=True,
                         output_hidden_states=bool(layer_ids), **kw)
        if not layer_ids:
            return out.logits.to(ids.device), ids.new_zeros(*ids.shape, 0, dtype=out.logits.dtype)
        return out.logits.to(ids.device), self._gather(out.hidden_states, layer_ids, ids.device)

    @staticmethod
    def _gather(hidden_states: tuple[Tensor, ...], layer_ids: list[int], device: torch.device) -> Tensor:
        # hidden_states[0] is the embedding output, hidden_states[i + 1] the output of decoder layer i
        return torch.cat([hidden_states[i + 1].to(device) for i in layer_ids], dim=-1)


def load_hf_target(tcfg: TargetConfig, devices: list[str], dtype: torch.dtype | None = None) -> HFTarget:
    """Load `tcfg.path` (local only), dimensions synced from its config.json, placed over `devices`."""
    from transformers import AutoModelForCausalLM

    synced = sync_target_config(tcfg)
    dtype = dtype or default_dtype(devices)
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(tcfg.path, dtype=dtype, local_files_only=True)
        except TypeError:  # transformers < 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_pretrained(tcfg.path, torch_dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as e:  # no weights, truncated safetensors, unreadable files: one line, not a trace
        raise HFConfigError(f"{tcfg.path}: cannot load the checkpoint ({first_line(e)})") from None
    return HFTarget(model, synced, devices)


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def build_target(cfg: Config) -> Any:
    """The target a config names: the HF checkpoint at `target.path`, else H1's tiny random model."""
    devices = list(cfg.devices.target)
    if cfg.target.path:
        target = load_hf_target(cfg.target, devices, target_dtype(cfg.target.dtype, devices, hf=True))
    else:
        from trainer.tiny_target import TinyTarget

        target = TinyTarget(cfg.target).place(devices).to(target_dtype(cfg.target.dtype, devices, hf=False))
    target.mask_token_id = cfg.mask_token_id
    return target
