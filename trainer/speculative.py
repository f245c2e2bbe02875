"""Block speculative decoding with a DFlash drafter, and plain greedy decoding to check it against.

One step: the sequence so far is `ids` (length n); the target has seen positions 0..n-2 and the last token is
the anchor. The drafter gets `[anchor, MASK x (B-1)]` at positions n-1.., the target's captured features of the
context strictly before the anchor (exactly the training mask), and proposes B-1 tokens in one forward. The target
then runs once over the anchor and the proposal; proposal tokens are accepted while they equal the target's own
greedy choice, and the target's token after the accepted prefix is kept too. Every kept token is the target's
greedy token, so the output must equal greedy decoding: `lossless` checks exactly that.

The target is reached through `ForwardFn(ids [1, T]) -> (logits [1, T, V], features [1, T, n*H])`, a full
recompute per step. That keeps this independent of any KV-cache API (which changes between transformers
releases) at the cost of speed; the figures reported (acceptance length tau, tokens per target forward) do not
depend on caching.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from trainer.layers import sdpa_attend
from trainer.masks import dense_mask
from trainer.model import Drafter

ForwardFn = Callable[[Tensor], tuple[Tensor, Tensor]]
DraftFn = Callable[[Tensor, list[int]], list[int]]
"""draft(ctx [1, n-1, n*H], ids (length n)) -> the proposed tokens after ids[-1]."""


@dataclass
class SpecResult:
    tokens: list[int]
    """Generated tokens (the prompt excluded)."""
    accepted: list[int] = field(default_factory=list)
    """Per verification step: tokens kept (accepted draft tokens + the target's own token)."""
    target_forwards: int = 0
    """Target forward passes, the prefill included."""


def forward_fn(target: Any, layer_ids: list[int]) -> ForwardFn:
    """The decoding entry point of either kind of target: both have `forward_all(ids, layer_ids)`."""
    return lambda ids: target.forward_all(ids, layer_ids)


def target_device(target: Any) -> torch.device:
    return target.embed_tokens.weight.device


def greedy_decode(forward: ForwardFn, prompt: list[int], max_new_tokens: int, eos_id: int | None,
                  device: torch.device | str = "cpu") -> list[int]:
    """Plain greedy decoding, one target forward per token: the reference the speculative output must equal."""
    ids, out = list(prompt), []
    while len(out) < max_new_tokens:
        logits, _ = forward(torch.tensor([ids], device=device))
        tok = int(logits[0, -1].argmax())
        out.append(tok)
        ids.append(tok)
        if tok == eos_id:
            break
    return out


@torch.no_grad()
def propose(drafter: Drafter, ctx: Tensor, anchor_token: int, anchor_pos: int, block_size: int,
            mask_token_id: int) -> list[int]:
    """One drafter forward from `[anchor, MASK...]`: the B-1 greedy draft tokens after the anchor.

    `ctx` [1, anchor_pos, n*H] are the target features of every position strictly before the anchor."""
    dev = drafter.fc.weight.device
    ctx = ctx.to(dev, drafter.fc.weight.dtype)
    block_ids = torch.full((1, block_size), mask_token_id, dtype=torch.long, device=dev)
    block_ids[0, 0] = anchor_token
    block_pos = torch.arange(anchor_pos, anchor_pos + block_size, device=dev)[None]
    anchors = torch.tensor([[anchor_pos]], device=dev)
    mask = dense_mask(anchors, ctx.shape[1], block_size)
    logits = drafter(block_ids, block_pos, ctx, sdpa_attend, mask)  # autocast inside when the target is bf16
    return logits[0, 1:].argmax(-1).tolist()


def drafter_fn(drafter: Drafter, block_size: int, mask_token_id: int) -> DraftFn:
    """The DFlash drafter as a DraftFn (tests also plug in drafts with known right and wrong tokens)."""
    return lambda ctx, ids: propose(drafter, ctx, ids[-1], len(ids) - 1, block_size, mask_token_id)


def _keep(tokens: list[int], room: int, eos_id: int | None) -> list[int]:
    """Cut at the token budget and just after an end-of-sequence token."""
    tokens = tokens[:room]
    if eos_id is not None and eos_id in tokens:
        tokens = tokens[: tokens.index(eos_id) + 1]
    return tokens


@torch.no_grad()
def speculative_decode(forward: ForwardFn, draft_fn: DraftFn, prompt: list[int], max_new_tokens: int,
                       eos_id: int | None, device: torch.device | str = "cpu") -> SpecResult:
    """Greedy block speculative decoding (see the module doc). `prompt` must be non-empty."""
    if not prompt:
        raise ValueError("speculative_decode needs a non-empty prompt")
    logits, feats = forward(torch.tensor([prompt], device=device))
    res = SpecResult(tokens=[int(logits[0, -1].argmax())], target_forwards=1)
    ids = list(prompt) + res.tokens
    ctx = feats  # features of positions 0..n-2: strictly before the anchor ids[-1]
    while len(res.tokens) < max_new_tokens and res.tokens[-1] != eos_id:
        n = len(ids)
        draft = draft_fn(ctx, ids)
        logits, feats = forward(torch.tensor([ids + draft], device=device))
        res.target_forwards += 1
        verify = logits[0, n - 1:].argmax(-1).tolist()  # the target's greedy token after each block position
        accepted = 0
        while accepted < len(draft) and draft[accepted] == verify[accepted]:
            accepted += 1
        kept = _keep(draft[:accepted] + [verify[accepted]], max_new_tokens - len(res.tokens), eos_id)
        res.tokens += kept
        res.accepted.append(len(kept))
        ids += kept
        # features of every position before the new anchor: all of them came from accepted tokens
        ctx = feats[:, : len(ids) - 1]
    return res
