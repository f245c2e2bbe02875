"""Token sampling and speculative sampling's accept/reject rule, ported from the reference (the paper authors'
`dflash` 0.1.0, dflash/model.py: `_sampling_probs`, `_sample_probs`, `_rejection_sample`). Pure torch.

Temperature 0 is greedy (argmax). Above 0 the target's and the draft's distributions both go through
`sampling_probs` (temperature, then top-k, then top-p, as the reference orders them). A draft token x is accepted
with probability min(1, p(x)/q(x)) (drawn as `rand * q < p`), left to right until the first rejection; on a
rejection the token is drawn from the normalised residual max(p - q, 0), and when every draft is accepted a bonus
token is drawn from p at the last position. The output then has exactly the target's own sampling distribution
whatever q is (tests/trainer_hf/test_speculative.py checks this statistically). A deterministic draft (prompt
lookup) has a one-hot q: acceptance is `rand < p(x)` and the residual is p with x removed, renormalised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    """0 = greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest prefix of tokens (by probability) reaching top_p; 1 = off."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 = off."""
    seed: int = 0
    """Seeds the generators of one evaluation (the reference seeds torch once, with 0)."""

    def __post_init__(self) -> None:  # the reference's `_validate_sampling`
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("temperature and top_k must be non-negative, and top_p in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


GREEDY = Sampling()


class Rng:
    """Seeded generators, one per device (created on first use, each seeded with `seed`): a run's draws are the same
    for the same seed and the same sequence of calls, and never touch torch's global generator (the periodic
    evaluation runs next to training threads)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._gens: dict[str, torch.Generator] = {}

    def on(self, device: torch.device | str) -> torch.Generator:
        dev = torch.device(device)
        key = str(dev)
        if key not in self._gens:
            self._gens[key] = torch.Generator(device=dev).manual_seed(self.seed)
        return self._gens[key]


def sampling_probs(logits: Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> Tensor:
    """[..., V] logits -> [..., V] fp32 probabilities (the reference's `_sampling_probs`, line for line)."""
    scores = logits.float() / temperature
    vocab_size = scores.shape[-1]
    indices = None
    if 0 < top_k < vocab_size:
        scores, indices = torch.topk(scores, top_k, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        keep = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs * keep)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if indices is not None:
        probs = torch.zeros_like(logits, dtype=probs.dtype).scatter(-1, indices, probs)
    return probs


def sample_probs(probs: Tensor, gen: torch.Generator) -> Tensor:
    """One token per row of [..., V] probabilities -> [...] long."""
    shape = probs.shape[:-1]
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=gen).view(shape)


def pick(logits: Tensor, sampling: Sampling, rng: Rng | None) -> int:
    """The next token from one row of logits [V]: argmax at temperature 0, else a draw."""
    if sampling.greedy:
        return int(logits.argmax(-1))
    probs = sampling_probs(logits, sampling.temperature, sampling.top_p, sampling.top_k)
    return int(sample_probs(probs, _need(rng).on(probs.device)))


def greedy_verify(draft: list[int], logits: Tensor) -> tuple[int, int]:
    """(accepted draft tokens, the target's token after them) for logits [len(draft) + 1, V] over the block."""
    posterior = logits.argmax(-1).tolist()
    accepted = 0
    while accepted < len(draft) and draft[accepted] == posterior[accepted]:
        accepted += 1
    return accepted, posterior[accepted]


def rejection_sample(draft: list[int], target_probs: Tensor, draft_probs: Tensor | None,
                     gen: torch.Generator) -> tuple[int, int]:
    """(accepted draft tokens, the next token) by the reference's `_rejection_sample`.

    `target_probs` [g + 1, V]: p after the anchor and after each draft token; `draft_probs` [g, V]: the q each draft
    token was drawn from, None for a deterministic draft (one-hot q). With g = 0 this is one plain draw from p."""
    g, dev = len(draft), target_probs.device
    tokens = torch.tensor(draft, dtype=torch.long, device=dev)
    accepted = 0
    if g:
        p = target_probs[:g].gather(-1, tokens[:, None])[:, 0]
        if draft_probs is None:
            q = torch.ones_like(p)
        else:
            draft_probs = draft_probs[:g].to(dev)
            q = draft_probs.gather(-1, tokens[:, None])[:, 0]
        ok = torch.rand(q.shape, generator=gen, device=dev, dtype=q.dtype) * q < p
        accepted = int(ok.to(torch.int32).cumprod(-1).sum())
    if accepted == g:
        return accepted, int(sample_probs(target_probs[g], gen))
    residual = target_probs[accepted].clone()
    if draft_probs is None:
        residual[draft[accepted]] = 0.0  # p - onehot(x), clamped at 0
    else:
        residual.sub_(draft_probs[accepted])
    residual.clamp_min_(0)
    total = residual.sum()
    residual = torch.where(total > 0, residual / total.clamp_min(torch.finfo(residual.dtype).tiny),
                           target_probs[accepted])
    return accepted, int(sample_probs(residual, gen))


def _need(rng: Rng | None) -> Rng:
    if rng is None:
        raise ValueError("sampling at temperature > 0 needs an Rng")
    return rng
