"""Speculative decoding the paper's way: KV caches and their rollback, the greedy output is the target's, and at
temperature 1 the output has the target's own sampling distribution, whatever the draft distribution."""

from __future__ import annotations

import itertools

import pytest
import torch
from greedy_reference import forward_fn, greedy_decode
from torch import nn

from trainer.config import DrafterConfig, TargetConfig
from trainer.model import build_drafter
from trainer.sampling import Rng, Sampling, rejection_sample, sampling_probs
from trainer.speculative import DFlashSource, Proposal, generate
from trainer.tiny_target import TinyTarget

LAYERS = [1, 3]
BLOCK = 8


@pytest.fixture(scope="module")
def tiny():
    return TinyTarget(TargetConfig(num_layers=4))


class Scripted:
    """Drafts read off a known continuation of the prompt (the target's own greedy tokens); `spoil(step) -> k`
    corrupts the k-th draft token of that step. Records what it was given."""

    needs_features = True

    def __init__(self, prompt: list[int], continuation: list[int], spoil=lambda step: None) -> None:
        self.prompt, self.cont, self.spoil = prompt, continuation, spoil
        self.calls: list[tuple[list[int], torch.Tensor, int]] = []

    def begin(self) -> None:
        self.calls = []

    def propose(self, ids, new_ctx, ctx_start, num, sampling, rng):
        done = len(ids) - len(self.prompt)
        out = (self.cont[done:done + num] + [0] * num)[:num]
        k = self.spoil(len(self.calls))
        if k is not None:
            out[k] = (out[k] + 1) % 255
        self.calls.append((list(ids), new_ctx, ctx_start))
        return Proposal(out)


def test_cached_forward_gives_the_uncached_logits_and_features(tiny):
    ids = torch.tensor([[5, 17, 42, 9, 100, 3, 7, 8, 1]])
    full, feats = tiny.forward_all(ids, LAYERS)
    cache = tiny.new_cache()
    parts = [tiny.forward_cached(ids[:, a:b], cache, LAYERS) for a, b in ((0, 4), (4, 5), (5, 9))]
    torch.testing.assert_close(torch.cat([p[0] for p in parts], 1), full)
    torch.testing.assert_close(torch.cat([p[1] for p in parts], 1), feats)
    cache.crop(5)  # roll back positions 5..8, then feed different tokens there
    other = torch.tensor([[11, 12]])
    logits, _ = tiny.forward_cached(other, cache, LAYERS)
    ref, _ = tiny.forward_all(torch.cat([ids[:, :5], other], 1), LAYERS)
    torch.testing.assert_close(logits, ref[:, 5:])
    last, none = tiny.forward_cached(torch.tensor([[2]]), cache, [], logits_to_keep=1)
    assert last.shape == (1, 1, tiny.vocab_size) and none.shape == (1, 1, 0) and cache.length == 8


def test_hf_cached_forward_gives_the_uncached_logits_after_a_rollback(tiny_qwen3):
    from trainer.hf import load_hf_target

    target = load_hf_target(TargetConfig(path=str(tiny_qwen3)), ["cpu"])
    ids = torch.tensor([[5, 17, 42, 9, 100, 3, 7]])
    full, feats = target.forward_all(ids, [1, 3])
    cache = target.new_cache()
    a, fa = target.forward_cached(ids[:, :3], cache, [1, 3])
    b, fb = target.forward_cached(torch.tensor([[9, 200, 201]]), cache, [1, 3])  # two wrong drafts
    cache.crop(4)
    assert cache.length == 4
    c, fc = target.forward_cached(ids[:, 4:], cache, [1, 3])
    torch.testing.assert_close(torch.cat([a, b[:, :1], c], 1), full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat([fa, fb[:, :1], fc], 1), feats, atol=1e-4, rtol=1e-4)


def test_perfect_drafts_are_accepted_whole_and_the_output_is_greedy(tiny):
    prompt = [5, 17, 42, 9]
    ref = greedy_decode(forward_fn(tiny, LAYERS), prompt, 48, None)
    res = generate(tiny, Scripted(prompt, ref), prompt, 40, None, LAYERS, BLOCK)
    assert res.tokens == ref[:40] == generate(tiny, None, prompt, 40).tokens
    # the prefill gives 1 token, then 39 more: 4 whole blocks (7 drafts + the target's token), the last cut to 7
    assert res.acceptance_lengths == [8, 8, 8, 8, 7] and res.tau == 39 / 5
    assert res.target_forwards == 1 + len(res.acceptance_lengths)


def test_a_corrupted_draft_token_is_exactly_where_acceptance_stops_and_the_caches_roll_back(tiny):
    prompt = [1, 2, 3]
    ref = greedy_decode(forward_fn(tiny, LAYERS), prompt, 48, None)
    spoil = [3, 0, 6, None, 2]
    source = Scripted(prompt, ref, lambda i: spoil[i] if i < len(spoil) else None)
    res = generate(tiny, source, prompt, 30, None, LAYERS, BLOCK)
    assert res.tokens == ref[:30]  # the wrong tokens' K/V were cropped: later steps still verify correctly
    # a wrong token at draft index k keeps k drafts + the target's correction
    assert res.acceptance_lengths[:5] == [4, 1, 7, 8, 3]
    # each step's new context is exactly the committed positions since the last step, features as uncached
    _, feats = tiny.forward_all(torch.tensor([prompt + ref[:30]]), LAYERS)
    seen = 0
    for ids, new_ctx, ctx_start in source.calls:
        assert ctx_start == seen and new_ctx.shape[1] == len(ids) - 1 - seen
        torch.testing.assert_close(new_ctx, feats[:, seen:len(ids) - 1])
        seen = len(ids) - 1


def test_stop_token_inside_an_accepted_block_ends_the_output_after_it(tiny):
    prompt = [3, 1, 4, 1, 5]
    ref = greedy_decode(forward_fn(tiny, LAYERS), prompt, 40, None)
    stop = ref[13]
    expected = ref[: ref.index(stop) + 1]
    res = generate(tiny, Scripted(prompt, ref), prompt, 30, [stop], LAYERS, BLOCK)
    assert res.tokens == expected == generate(tiny, None, prompt, 30, [stop]).tokens
    assert sum(res.acceptance_lengths) == len(expected) - 1  # the prefill's token is not a step


def test_untrained_dflash_drafter_is_lossless_with_its_kv_cache(tiny):
    torch.manual_seed(0)
    drafter = build_drafter(tiny, DrafterConfig(block_size=BLOCK), len(LAYERS), "cpu")
    for prompt in ([9, 8, 7, 6], [100, 3, 55, 21, 2, 90]):
        res = generate(tiny, DFlashSource(drafter), prompt, 24, None, LAYERS, BLOCK)
        assert res.tokens == greedy_decode(forward_fn(tiny, LAYERS), prompt, 24, None)
        assert res.tau < 1.3


def test_empty_prompt_is_refused(tiny):
    with pytest.raises(ValueError, match="non-empty prompt"):
        generate(tiny, None, [], 5)


# ---- sampling ----------------------------------------------------------------------------------------------
def test_sampling_probs_applies_top_k_then_top_p_as_the_reference():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0]).log_softmax(-1)  # probs ∝ e^2, e^1, e^0, e^-1
    p = torch.softmax(torch.tensor([2.0, 1.0, 0.0, -1.0]), -1)
    torch.testing.assert_close(sampling_probs(logits, 1.0), p)
    top3 = p[:3] / p[:3].sum()
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_k=3), torch.cat([top3, torch.zeros(1)]))
    # top_p keeps a token while the mass before it is < top_p: 0.665 < 0.8, so the 2nd stays, the 3rd goes
    kept = p[:2] / p[:2].sum()
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_p=0.8), torch.cat([kept, torch.zeros(2)]))
    torch.testing.assert_close(sampling_probs(logits * 2, 2.0), p)
    with pytest.raises(ValueError):
        Sampling(temperature=1.0, top_p=0.0)


def test_one_hot_drafts_accept_with_p_and_resample_without_the_rejected_token():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    gen = torch.Generator().manual_seed(0)
    draws = [rejection_sample([1], p, None, gen) for _ in range(4000)]
    accepted = sum(a for a, _ in draws) / len(draws)
    assert abs(accepted - 0.3) < 0.03  # 4 sigma of a binomial(4000, 0.3) mean
    assert all(tok != 1 for a, tok in draws if a == 0)  # the residual never gives back the rejected token


class Count:
    """A stand-in cache: only its length matters to TableTarget (positions), and crop must keep it right."""

    def __init__(self) -> None:
        self.length = 0

    def crop(self, length: int) -> None:
        assert length <= self.length
        self.length = length


class TableTarget:
    """A target whose next-token logits depend on the previous token and on the position: cheap enough to draw
    thousands of samples, and position-aware so a wrongly cropped cache would show in the distribution."""

    def __init__(self, vocab: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.by_token = torch.randn(vocab, vocab, generator=gen) * 1.5
        self.by_pos = torch.randn(8, vocab, generator=gen)
        self.embed_tokens = nn.Embedding(vocab, 1)

    def new_cache(self) -> Count:
        return Count()

    def forward_cached(self, ids, cache, layer_ids, logits_to_keep=0):
        pos = torch.arange(cache.length, cache.length + ids.shape[1])
        cache.length += ids.shape[1]
        logits = (self.by_token[ids[0]] + self.by_pos[pos % 8])[None]
        return logits[:, -logits_to_keep:] if logits_to_keep else logits, torch.zeros(1, ids.shape[1], 0)

    def p_next(self, seq: list[int]) -> torch.Tensor:
        """The target's exact distribution of the token after `seq` (temperature 1)."""
        return torch.softmax(self.by_token[seq[-1]] + self.by_pos[(len(seq) - 1) % 8], -1)


class FixedQ:
    """Drafts drawn from a distribution deliberately unlike the target's (with zeros: some tokens never proposed);
    with `one_hot`, fixed tokens and no q, as prompt lookup proposes."""

    needs_features = False

    def __init__(self, q: torch.Tensor, one_hot: bool) -> None:
        self.q, self.one_hot = q, one_hot

    def begin(self) -> None:
        pass

    def propose(self, ids, new_ctx, ctx_start, num, sampling, rng):
        q = self.q[:num]
        if self.one_hot:
            return Proposal(q.argmax(-1).tolist())
        return Proposal(torch.multinomial(q, 1, generator=rng.on("cpu"))[:, 0].tolist(), q)


def chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test with cells of expected count < 5 pooled into one; P(chi2_df > X^2) by the incomplete gamma."""
    small = expected < 5
    o = torch.cat([observed[~small], observed[small].sum()[None]])
    e = torch.cat([expected[~small], expected[small].sum()[None]])
    x2 = ((o - e) ** 2 / e).sum()
    df = torch.tensor((len(e) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, x2.double() / 2))


@pytest.mark.parametrize("one_hot", [False, True], ids=["sampled-q", "one-hot-q"])
def test_temperature_1_speculative_sampling_has_the_target_distribution(one_hot):
    """The first 4 tokens of N seeded samples against the target's exact joint distribution (all 4^4 sequences
    enumerated). Block 3 with 4 new tokens covers every path: a rejection at draft 0 or 1 (residual draw), both
    drafts accepted (the bonus from p), and a second step after an early rejection.

    Under a correct sampler Pearson's X^2 over the (pooled, expected >= 5) cells is asymptotically chi-square with
    df = cells - 1, and the test fails when its p-value is < 1e-6: a false-failure probability of 1e-6 over the
    choice of seed. The seeds are fixed, so the outcome is deterministic. Power: with this N, accepting every
    draft is rejected outright (checked below on its exact distribution); with sampled drafts a residual drawn
    from p instead of max(p - q, 0), or the bonus from the wrong position, gave p-values < 1e-8 when tried.
    `one-hot-q`: fixed drafts with no q (prompt lookup's case: accept with p(x), residual p without x)."""
    vocab, n_samples, prompt = 4, 1500, [1, 2, 0]
    target = TableTarget(vocab)
    q = torch.tensor([[0.5, 0.0, 0.2, 0.3], [0.1, 0.6, 0.3, 0.0]])
    if one_hot:
        q = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    cells = list(itertools.product(range(vocab), repeat=4))

    def prob(seq_tail, drafted=False):
        pr, seq = 1.0, list(prompt)
        for j, tok in enumerate(seq_tail):
            dist = q[j - 1] if drafted and j in (1, 2) else target.p_next(seq)
            pr *= float(dist[tok])
            seq.append(tok)
        return pr

    exact = torch.tensor([prob(c) for c in cells], dtype=torch.float64)
    assert abs(float(exact.sum()) - 1) < 1e-5  # fp32 softmax rows
    rng, sampling, counts = Rng(0), Sampling(temperature=1.0), dict.fromkeys(cells, 0)
    for _ in range(n_samples):
        counts[tuple(generate(target, FixedQ(q, one_hot), prompt, 4, None, [], 3, sampling, rng).tokens)] += 1
    observed = torch.tensor([counts[c] for c in cells], dtype=torch.float64)
    assert chi_square_p_value(observed, exact * n_samples) > 1e-6
    # the test's power: the "accept every draft" distribution, at its expected counts, is rejected outright
    naive = torch.tensor([prob(c, drafted=True) for c in cells], dtype=torch.float64)
    assert chi_square_p_value(naive * n_samples, exact * n_samples) < 1e-12
