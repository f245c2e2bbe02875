"""Compile strategies: how the drafter's training forward is (or is not) put through torch.compile.

`warmup` (default) is the safe way to use torch.compile from threads (docs/trainer.md, "thread-safety rules"):
fixed shapes, every compiled function built and run forward+backward once per device on the main thread before
any worker starts, dynamo/inductor settings applied inside every thread, no eager flex_attention anywhere.
`naive` is the seed's way, kept because it reproduces the real crash: workers compile on first use,
concurrently, while the coordinator runs eager flex_attention. `off` runs eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from trainer.config import RuntimeConfig
from trainer.layers import check_attention_inputs, sdpa_attend
from trainer.loss import chunked_dflash_loss, dflash_loss
from trainer.model import Drafter

StepFn = Callable[..., tuple[Tensor, Tensor, Tensor]]


def flex_attend(q: Tensor, k: Tensor, v: Tensor, block_mask: Any) -> Tensor:
    """flex_attention with a BlockMask. Inside a compiled region it becomes the fused kernel; called eagerly it
    wraps itself in torch.compile and toggles the process-global FX-tracing flag (the seed's crash)."""
    from torch.nn.attention.flex_attention import flex_attention

    check_attention_inputs(q, k, v)
    return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])


def resolve_attention(attention: str, device: str) -> str:
    """auto -> flex on CUDA, sdpa on CPU (flex_attention has no backward on the CPU in torch 2.13)."""
    if attention == "auto":
        return "flex" if device.startswith("cuda") else "sdpa"
    return attention


def drafter_forward(drafter: Drafter, block_ids: Tensor, block_pos: Tensor, hidden: Tensor, mask: Any,
                    labels: Tensor, weights: Tensor, use_flex: bool, label_mask: Tensor | None = None,
                    denom: Tensor | None = None, loss_chunk: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Drafter forward + DFlash loss. `loss_chunk` > 0: the chunked LM head + CE (trainer/loss.py
    chunked_dflash_loss, never the full logits); 0: the full logits and `dflash_loss`. `label_mask`: which labels
    are real tokens (None = all); `denom`: the loss's divisor (trainer/loss.py global_denominator; None = this
    batch's own weight sum)."""
    if loss_chunk > 0:
        states = drafter_hidden(drafter, block_ids, block_pos, hidden, mask, use_flex)
        return chunked_dflash_loss(states, drafter.lm_head_weight, labels, weights, label_mask, loss_chunk, denom)
    logits = drafter(block_ids, block_pos, hidden, flex_attend if use_flex else sdpa_attend, mask)
    return dflash_loss(logits, labels, weights, label_mask, denom)


def drafter_hidden(drafter: Drafter, block_ids: Tensor, block_pos: Tensor, hidden: Tensor, mask: Any,
                   use_flex: bool) -> Tensor:
    """The drafter's pre-LM-head states: what gets compiled when the loss is chunked."""
    return drafter.hidden(block_ids, block_pos, hidden, flex_attend if use_flex else sdpa_attend, mask)


def apply_thread_settings(rt: RuntimeConfig) -> None:
    """Dynamo/inductor settings and intra-op threads. torch 2.13 keeps config values per thread (ContextVar),
    so this runs at the top of every thread, not once in main: a value set in main is unseen by workers."""
    if rt.torch_threads:
        torch.set_num_threads(rt.torch_threads)
    torch._dynamo.config.recompile_limit = rt.recompile_limit
    torch._dynamo.config.automatic_dynamic_shapes = False  # fixed shapes: a shape change must show as a recompile
    torch._dynamo.config.assume_static_by_default = True


def compile_mode(rt: RuntimeConfig, device: str, threads_on_device: int = 1) -> str | None:
    """torch.compile's mode for the drafter threads on `device`: "reduce-overhead" (inductor CUDA graph trees) only
    when `runtime.cuda_graphs` is set, the device is CUDA and exactly one drafter thread uses it.

    Why not with two drafter threads on one device: the compiled backward runs on the autograd engine's single
    worker thread for that device, and inductor caches its CUDA-graph wrapper per Python thread
    (`thread_local.compiled_fn` in torch/_inductor/compile_fx.py `cudagraphify`; a process-wide `nonlocal` in older
    releases), bound to the tree of whichever thread ran the first backward. Both drafters' backwards would then
    replay one recorded graph whose outputs (the gradients) live at fixed addresses: the second replay can overwrite
    the first thread's gradients while that thread still reads them for the all-reduce."""
    if not (rt.cuda_graphs and device.startswith("cuda")):
        return None
    return "reduce-overhead" if threads_on_device == 1 else None


def threads_per_device(devices: list[str]) -> dict[str, int]:
    """Drafter threads per device string, "cuda" counted as "cuda:0" (the same GPU)."""
    def key(d: str) -> str:
        return "cuda:0" if d == "cuda" else d

    return {d: sum(key(e) == key(d) for e in devices) for d in devices}


def build_step_fn(rt: RuntimeConfig, device: str, threads_on_device: int = 1, loss_chunk: int = 0) -> StepFn:
    """One step function per device (dynamo caches per code object; replicas on one device share its graphs),
    called like `drafter_forward` without its `loss_chunk`.

    With `loss_chunk` > 0 only the drafter's hidden states are compiled and the chunked loss runs eagerly after
    them. Compiled whole, AOTAutograd merges the backward's recomputed chunk logits with the forward's (the same
    matmul) and saves every chunk's logits for the backward: measured on the CPU (rows 2048, vocab 32,000, chunk
    256), 250 MiB still live after the compiled forward, the size of the full logits, against 95 MiB peak for the
    eager chunked loss. The eager loop is a handful of large matmuls per step: its launch overhead is noise."""
    if loss_chunk <= 0:
        if rt.compile_strategy == "off":
            return drafter_forward
        # reduce-overhead = inductor CUDA graph trees: the forward's tree is per calling thread, captured with
        # capture_error_mode="thread_local" so one thread's capture does not fail another thread's CUDA calls.
        return torch.compile(drafter_forward, mode=compile_mode(rt, device, threads_on_device))
    if rt.compile_strategy == "off":
        hidden_fn = drafter_hidden
    else:
        hidden_fn = torch.compile(drafter_hidden, mode=compile_mode(rt, device, threads_on_device))

    def step(drafter: Drafter, block_ids: Tensor, block_pos: Tensor, hidden: Tensor, mask: Any, labels: Tensor,
             weights: Tensor, use_flex: bool, label_mask: Tensor | None = None,
             denom: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        states = hidden_fn(drafter, block_ids, block_pos, hidden, mask, use_flex)
        return chunked_dflash_loss(states, drafter.lm_head_weight, labels, weights, label_mask, loss_chunk, denom)

    return step


class CompileCounter:
    """Counts dynamo frame compilations; everything after `mark_warm()` is a recompile (fixed shapes => 0)."""

    def __init__(self) -> None:
        self._warm_at: int | None = None

    @staticmethod
    def frames() -> int:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["total"])

    def mark_warm(self) -> None:
        self._warm_at = self.frames()

    @property
    def recompiles(self) -> int:
        return 0 if self._warm_at is None else self.frames() - self._warm_at
