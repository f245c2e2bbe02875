"""The DFlash mask against a brute-force reading of the rules, and flex_attention vs SDPA on the CPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.config import Config
from trainer.layers import sdpa_attend
from trainer.masks import dense_mask, dflash_mask_mod, flex_block_mask
from trainer.model import build_drafter
from trainer.tiny_target import TinyTarget

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def reference_mask(anchors: list[list[int]], ctx_len: int, bs: int) -> torch.Tensor:
    """Loops over every (query, key) pair applying the rules as written in the issue."""
    n_blocks = len(anchors[0])
    q_len, kv_len = n_blocks * bs, ctx_len + n_blocks * bs
    out = torch.zeros(len(anchors), 1, q_len, kv_len, dtype=torch.bool)
    for b, row in enumerate(anchors):
        for q in range(q_len):
            j = q // bs
            for kv in range(kv_len):
                if kv < ctx_len:
                    out[b, 0, q, kv] = kv < row[j]  # context strictly before the anchor
                else:
                    out[b, 0, q, kv] = (kv - ctx_len) // bs == j  # own block, bidirectional; no other block
    return out


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_dense_mask_matches_brute_force_rules(data):
    bs = data.draw(st.sampled_from([2, 4, 16]))
    ctx_len = data.draw(st.integers(bs + 1, 48))
    n_blocks = data.draw(st.integers(1, 4))
    batch = data.draw(st.integers(1, 3))
    anchors = [sorted(data.draw(st.lists(st.integers(0, ctx_len - bs), min_size=n_blocks, max_size=n_blocks)))
               for _ in range(batch)]
    got = dense_mask(torch.tensor(anchors), ctx_len, bs)
    assert torch.equal(got, reference_mask(anchors, ctx_len, bs))


def test_every_query_sees_at_least_its_own_block():
    anchors = torch.tensor([[0, 5]])
    m = dense_mask(anchors, 20, 4)
    assert m.any(-1).all()
    assert not m[0, 0, :4, :20].any()  # anchor 0: no context at all


def test_flex_block_mask_encodes_the_same_mask():
    anchors = torch.tensor([[3, 40, 70], [10, 11, 90]])
    bm = flex_block_mask(anchors, 128, 16)
    mod = dflash_mask_mod(anchors, 128, 16)
    assert bm.mask_mod is not None
    dense = dense_mask(anchors, 128, 16)
    # BlockMask.to_dense() is block-granular; re-evaluate its mask_mod elementwise instead
    b = torch.arange(2).view(2, 1, 1, 1)
    q = torch.arange(48).view(1, 1, 48, 1)
    kv = torch.arange(176).view(1, 1, 1, 176)
    assert torch.equal(bm.mask_mod(b, torch.zeros(1, 1, 1, 1, dtype=torch.long), q, kv), dense)
    assert torch.equal(mod(b, torch.zeros(1, 1, 1, 1, dtype=torch.long), q, kv), dense)


def test_flex_forward_and_sdpa_agree_on_the_drafter():
    """Same drafter, same inputs: flex_attention with the BlockMask == SDPA with the materialised mask."""
    from torch.nn.attention.flex_attention import flex_attention

    cfg = Config()
    target = TinyTarget(cfg.target)
    torch.manual_seed(0)
    drafter = build_drafter(target, cfg.drafter, len(cfg.layer_ids), "cpu")
    ids = torch.randint(0, 255, (2, 64))
    anchors = torch.tensor([[16, 30], [20, 48]])
    hidden = target.hidden_states(ids, cfg.layer_ids)
    from trainer.loss import block_inputs

    block_ids, block_pos, _ = block_inputs(ids, anchors, 16, target.mask_token_id)
    with torch.no_grad():
        ref = drafter(block_ids, block_pos, hidden, sdpa_attend, dense_mask(anchors, 64, 16))
        got = drafter(block_ids, block_pos, hidden,
                      lambda q, k, v, m: flex_attention(q, k, v, block_mask=m, enable_gqa=q.shape[1] != k.shape[1]),
                      flex_block_mask(anchors, 64, 16))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_target_causal_flex_matches_sdpa():
    from trainer.compile import flex_attend
    from trainer.masks import causal_block_mask

    cfg = Config()
    target = TinyTarget(cfg.target)
    ids = torch.randint(0, 255, (2, 64))
    ref = target.hidden_states(ids, [1, 3])
    target.attend, target.causal_mask = flex_attend, causal_block_mask(64, "cpu")
    torch.testing.assert_close(target.hidden_states(ids, [1, 3]), ref, rtol=1e-4, atol=1e-4)
