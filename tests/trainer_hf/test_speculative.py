"""Block speculative decoding keeps exactly the target's greedy tokens, whatever the drafts are."""

from __future__ import annotations

import pytest
import torch

from trainer.config import DrafterConfig, TargetConfig
from trainer.model import build_drafter
from trainer.speculative import drafter_fn, forward_fn, greedy_decode, speculative_decode
from trainer.tiny_target import TinyTarget

LAYERS = [1, 3]
BLOCK = 8


@pytest.fixture(scope="module")
def tiny():
    target = TinyTarget(TargetConfig(num_layers=4))
    return target, forward_fn(target, LAYERS)


def oracle(forward, prompt, max_new, wrong_at=None):
    """Drafts from the true greedy continuation; `wrong_at(step) -> k` spoils the k-th draft token."""
    ref = greedy_decode(forward, prompt, max_new + BLOCK, None)
    calls = []

    def draft(ctx, ids):
        done = len(ids) - len(prompt)
        out = (ref[done:done + BLOCK - 1] + [0] * BLOCK)[: BLOCK - 1]
        k = wrong_at(len(calls)) if wrong_at else None
        if k is not None:
            out[k] = (out[k] + 1) % 255
        calls.append((ctx, list(ids)))
        return out

    return draft, calls


def test_speculative_equals_greedy_and_accepts_whole_blocks_with_a_perfect_drafter(tiny):
    target, forward = tiny
    prompt = [5, 17, 42, 9]
    draft, _ = oracle(forward, prompt, 40)
    res = speculative_decode(forward, draft, prompt, 40, None)
    assert res.tokens == greedy_decode(forward, prompt, 40, None)
    # prefill gives 1 token, then 39 more in blocks of BLOCK (draft B-1 + the target's own)
    assert res.accepted == [8, 8, 8, 8, 7]
    assert res.target_forwards == 1 + len(res.accepted)


def test_acceptance_stops_at_the_first_wrong_draft_token(tiny):
    target, forward = tiny
    prompt = [1, 2, 3]
    spoil = [3, 0, 6, None, 2]
    draft, _ = oracle(forward, prompt, 30, wrong_at=lambda i: spoil[i] if i < len(spoil) else None)
    res = speculative_decode(forward, draft, prompt, 30, None)
    assert res.tokens == greedy_decode(forward, prompt, 30, None)
    # a wrong token at draft index k keeps k accepted drafts + the target's correction
    assert res.accepted[:5] == [4, 1, 7, 8, 3]


def test_rejected_drafts_cost_one_forward_per_token_and_stay_lossless(tiny):
    target, forward = tiny
    prompt = [7, 7, 8]
    draft, _ = oracle(forward, prompt, 20, wrong_at=lambda i: 0)
    res = speculative_decode(forward, draft, prompt, 20, None)
    assert res.tokens == greedy_decode(forward, prompt, 20, None)
    assert set(res.accepted) == {1}
    assert res.target_forwards == 20


def test_drafter_sees_target_features_strictly_before_the_anchor(tiny):
    target, forward = tiny
    prompt = [11, 12, 13, 14, 15]
    draft, calls = oracle(forward, prompt, 40, wrong_at=lambda i: 2 if i % 2 else None)
    speculative_decode(forward, draft, prompt, 40, None)
    assert len(calls) >= 5
    for ctx, ids in calls:
        _, feats = forward(torch.tensor([ids]))
        assert ctx.shape[1] == len(ids) - 1
        torch.testing.assert_close(ctx, feats[:, : len(ids) - 1])


def test_generation_stops_after_eos_inside_an_accepted_block(tiny):
    target, forward = tiny
    prompt = [3, 1, 4, 1, 5]
    ref = greedy_decode(forward, prompt, 30, None)
    eos = ref[13]
    expected = ref[: ref.index(eos) + 1]
    draft, _ = oracle(forward, prompt, 30)
    res = speculative_decode(forward, draft, prompt, 30, eos)
    assert res.tokens == expected == greedy_decode(forward, prompt, 30, eos)


def test_untrained_dflash_drafter_is_lossless_with_acceptance_near_one(tiny):
    target, forward = tiny
    torch.manual_seed(0)
    drafter = build_drafter(target, DrafterConfig(block_size=BLOCK), len(LAYERS), "cpu")
    for prompt in ([9, 8, 7, 6], [100, 3, 55, 21, 2, 90]):
        res = speculative_decode(forward, drafter_fn(drafter, BLOCK, target.mask_token_id), prompt, 24, None)
        assert res.tokens == greedy_decode(forward, prompt, 24, None)
        assert sum(res.accepted) / len(res.accepted) < 1.3


def test_empty_prompt_is_refused(tiny):
    _, forward = tiny
    with pytest.raises(ValueError, match="non-empty prompt"):
        speculative_decode(forward, lambda c, i: [0] * (BLOCK - 1), [], 5, None)
