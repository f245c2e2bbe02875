"""Speculative decoding the paper's way: the loop of the reference's `dflash_generate` (dflash 0.1.0,
dflash/model.py), with a KV cache on both sides and any draft source.

State: the committed tokens `ids`, positions 0..start; the target's cache holds positions < start, and the last
committed token (position `start`) is the anchor. One verification step:

1. The draft source proposes up to min(B, budget) - 1 tokens after the anchor. The DFlash drafter gets the
   target's features of the committed positions it has not seen yet (its cache holds the rest) and
   `[anchor, MASK...]`; prompt lookup proposes from an n-gram match in `ids`; target-only decoding proposes none.
2. The target runs once over [anchor, drafts] with its cache, which then holds them too.
3. Temperature 0: drafts are kept while they equal the target's argmax, plus the target's token after them.
   Above 0: speculative sampling (trainer/sampling.py). Either way the output has the target's own distribution
   (at 0: exactly its greedy decoding).
4. `produced` = accepted + 1, cut at the token budget and just after a stop token; the target's cache is cropped
   to the committed positions (the rejected drafts' K/V go), and the features of the committed block positions
   become the drafter's next new context. The step's acceptance length is `produced`.

The prefill makes the first token; it is not a step. Timing follows the reference: the decode time (after the
prefill) divided by every output token, the first included.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from trainer.sampling import GREEDY, Rng, Sampling, greedy_verify, pick, rejection_sample, sample_probs, sampling_probs


class CachedTarget(Protocol):
    """What decoding needs from a target (TinyTarget and HFTarget both provide it)."""

    embed_tokens: Any  # its weight's device is where ids go and logits come back

    def new_cache(self) -> Any: ...

    def forward_cached(self, ids: Tensor, cache: Any, layer_ids: list[int],
                       logits_to_keep: int = 0) -> tuple[Tensor, Tensor]: ...


@dataclass
class Proposal:
    tokens: list[int]
    q: Tensor | None = None
    """[len(tokens), V]: the distribution each token was drawn from (temperature > 0); None = deterministic
    proposals (one-hot q: argmax drafts at temperature 0, prompt lookup)."""


class DraftSource(Protocol):
    needs_features: bool
    """Whether `propose` reads the target's captured features (the target then returns them)."""

    def begin(self) -> None:
        """A new request: forget the previous one (caches)."""

    def propose(self, ids: list[int], new_ctx: Tensor, ctx_start: int, num: int, sampling: Sampling,
                rng: Rng | None) -> Proposal:
        """At most `num` tokens after ids[-1]. `new_ctx` [1, m, n*H]: target features of positions
        ctx_start..ctx_start+m-1 (= len(ids) - 1), the committed positions not given to the source before."""


def drafter_mask_id(drafter: Any) -> int:
    """The MASK token a DFlash drafter's blocks are filled with (recorded on the drafter; trainer/model.py)."""
    return int(drafter.mask_token_id)


class DFlashSource:
    """The DFlash drafter with its KV cache (`new_cache` / `draft_logits`, trainer/model.py): one forward per
    block; argmax drafts at temperature 0, else drafts drawn from q = sampling_probs(draft logits)."""

    needs_features = True

    def __init__(self, drafter: Any) -> None:
        self.drafter, self.mask_id = drafter, drafter_mask_id(drafter)
        self.cache: Any = None

    def begin(self) -> None:
        self.cache = self.drafter.new_cache()

    def propose(self, ids: list[int], new_ctx: Tensor, ctx_start: int, num: int, sampling: Sampling,
                rng: Rng | None) -> Proposal:
        block = torch.full((1, num + 1), self.mask_id, dtype=torch.long)
        block[0, 0] = ids[-1]
        logits = self.drafter.draft_logits(new_ctx, ctx_start, block, self.cache)[0, 1:]
        if sampling.greedy:
            return Proposal(logits.argmax(-1).tolist())
        q = sampling_probs(logits, sampling.temperature, sampling.top_p, sampling.top_k)
        return Proposal(sample_probs(q, rng.on(q.device)).tolist(), q)


class NgramSource:
    """Prompt lookup (trainer/prompt_lookup.py): the tokens that followed the latest earlier occurrence of the
    sequence's last n-gram. Deterministic: q is one-hot."""

    needs_features = False

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        from trainer.prompt_lookup import propose_ngram

        self.propose_ngram, self.max_ngram, self.min_ngram = propose_ngram, max_ngram, min_ngram

    def begin(self) -> None:
        pass

    def propose(self, ids: list[int], new_ctx: Tensor, ctx_start: int, num: int, sampling: Sampling,
                rng: Rng | None) -> Proposal:
        return Proposal(list(self.propose_ngram(ids, num, self.max_ngram, self.min_ngram)))


@dataclass
class GenResult:
    tokens: list[int]
    """Generated tokens (the prompt excluded), the prefill's first token included."""
    acceptance_lengths: list[int] = field(default_factory=list)
    """Per verification step: tokens committed (accepted drafts + the target's own token), within budget/stop."""
    target_forwards: int = 0
    """Target forward passes, the prefill included."""
    decode_s: float = 0.0
    """Wall time after the prefill (CUDA synchronised)."""

    @property
    def tau(self) -> float | None:
        """This request's mean acceptance length; None without a step (the first token already stopped it)."""
        steps = self.acceptance_lengths
        return sum(steps) / len(steps) if steps else None

    @property
    def time_per_token_s(self) -> float:
        return self.decode_s / len(self.tokens)


def target_device(target: Any) -> torch.device:
    return target.embed_tokens.weight.device


def stop_set(stop_ids: int | Iterable[int] | None) -> frozenset[int]:
    if stop_ids is None:
        return frozenset()
    return frozenset([stop_ids] if isinstance(stop_ids, int) else stop_ids)


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.no_grad()
def generate(target: CachedTarget, source: DraftSource | None, prompt: list[int], max_new_tokens: int,
             stop_ids: int | Iterable[int] | None = None, layer_ids: list[int] | None = None, block_size: int = 1,
             sampling: Sampling = GREEDY, rng: Rng | None = None) -> GenResult:
    """Decode `prompt` (see the module doc). `source` None or `block_size` 1: target-only decoding with its KV
    cache, the baseline. `layer_ids`: the target layers a feature-reading source needs."""
    if not prompt:
        raise ValueError("generate needs a non-empty prompt")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if rng is None and not sampling.greedy:
        rng = Rng(sampling.seed)
    stops = stop_set(stop_ids)
    drafting = source is not None and block_size > 1
    feature_layers = list(layer_ids or []) if drafting and source.needs_features else []
    dev = target_device(target)
    cache = target.new_cache()
    logits, ctx = target.forward_cached(torch.tensor([prompt], device=dev), cache, feature_layers, logits_to_keep=1)
    res = GenResult([pick(logits[0, -1], sampling, rng)], target_forwards=1)
    t1 = _clock(dev)
    ids, start, ctx_start = list(prompt) + res.tokens, len(prompt), 0
    max_length = len(prompt) + max_new_tokens
    stopped = res.tokens[0] in stops
    if drafting:
        source.begin()
    while start + 1 < max_length and not stopped:
        num = min(block_size, max_length - start) - 1
        prop = source.propose(ids, ctx, ctx_start, num, sampling, rng) if drafting and num else Proposal([])
        draft = prop.tokens[:num]
        logits, feats = target.forward_cached(torch.tensor([[ids[start], *draft]], device=dev), cache,
                                              feature_layers)
        res.target_forwards += 1
        if sampling.greedy:
            accepted, bonus = greedy_verify(draft, logits[0])
        else:
            p = sampling_probs(logits[0], sampling.temperature, sampling.top_p, sampling.top_k)
            accepted, bonus = rejection_sample(draft, p, prop.q, rng.on(p.device))
        new = (draft[:accepted] + [bonus])[: max_length - start - 1]
        cut = next((i for i, tok in enumerate(new) if tok in stops), None)
        if cut is not None:
            new, stopped = new[: cut + 1], True
        ids += new
        res.tokens += new
        res.acceptance_lengths.append(len(new))
        cache.crop(start + len(new))
        ctx, ctx_start = feats[:, : len(new)], start  # the anchor and the accepted drafts: now committed
        start += len(new)
    res.decode_s = _clock(dev) - t1
    return res
