"""The chunked LM head + CE equals the full-logits loss (values and gradients); masked labels carry nothing."""

from __future__ import annotations

import json

import pytest
import torch

from trainer.compile import build_step_fn, drafter_forward
from trainer.config import Config, DrafterConfig, RuntimeConfig, TargetConfig
from trainer.dataset import GeneratedData, write_shard
from trainer.layers import sdpa_attend
from trainer.loss import block_inputs, chunked_dflash_loss, dflash_loss, label_mask, position_weights
from trainer.masks import dense_mask
from trainer.model import build_drafter
from trainer.tiny_target import TinyTarget

BS = 4


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    target = TinyTarget(TargetConfig(vocab_size=97, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                                     intermediate_size=64))
    drafter = build_drafter(target, DrafterConfig(num_layers=1, block_size=BS, num_heads=4, num_kv_heads=2,
                                                  intermediate_size=64), 2, "cpu")
    return target, drafter


def _inputs(target, ids, anchors, ends):
    hidden = target.hidden_states(ids, [0, 2])
    block_ids, block_pos, labels = block_inputs(ids, anchors, BS, target.mask_token_id)
    return block_ids, block_pos, hidden, dense_mask(anchors, ids.shape[1], BS), labels, label_mask(block_pos, ends)


def _loss_and_grads(drafter, args, chunk):
    drafter.zero_grad(set_to_none=True)
    out = drafter_forward(drafter, *args[:5], position_weights(BS, 2.0), False, args[5], loss_chunk=chunk)
    out[0].backward()
    return [o.detach() for o in out], {n: p.grad.clone() for n, p in drafter.named_parameters()}


def test_chunked_equals_unchunked_loss_metrics_and_drafter_gradients(tiny):
    target, drafter = tiny
    torch.manual_seed(1)
    ids = torch.randint(0, 96, (3, 20))
    anchors = torch.tensor([[2, 7, 15, 17], [0, 5, 9, 19], [4, 6, 11, 12]])  # blocks run past T = 20
    ends = torch.tensor([20, 14, 11])  # row 2: its blocks at 11 and 12 are wholly masked (zero-weight rows)
    args = _inputs(target, ids, anchors, ends)
    assert not args[5].all() and (~args[5]).sum() > 2 * BS
    (loss, acc, acc_len), grads = _loss_and_grads(drafter, args, 0)
    assert args[4].numel() % 5 != 0
    for chunk in (5, 7, 48, 10_000):  # 48 rows: 5 and 7 don't divide them; 10,000 = one chunk
        (c_loss, c_acc, c_len), c_grads = _loss_and_grads(drafter, args, chunk)
        torch.testing.assert_close(c_loss, loss, rtol=1e-6, atol=1e-6)
        assert c_acc == acc and c_len == acc_len
        for name, g in grads.items():
            torch.testing.assert_close(c_grads[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_chunked_gradient_wrt_hidden_matches_autograd_through_full_logits():
    torch.manual_seed(2)
    h = torch.randn(2, 6 * BS, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64)
    labels = torch.randint(0, 50, (2, 6 * BS))
    mask = torch.rand(2, 6 * BS) > 0.3
    w = position_weights(BS, 3.0).double()
    ref = dflash_loss(h @ weight.T, labels, w, mask)
    (g_ref,) = torch.autograd.grad(ref[0], h)
    out = chunked_dflash_loss(h, weight, labels, w, mask, chunk=7)
    (g,) = torch.autograd.grad(out[0], h)
    torch.testing.assert_close(out[0], ref[0])
    assert torch.equal(out[1], ref[1]) and torch.equal(out[2], ref[2])
    torch.testing.assert_close(g, g_ref)
    assert (g.reshape(-1, 16)[~mask.reshape(-1)] == 0).all()  # masked rows: no gradient at all


def test_step_fn_with_chunking_is_the_chunked_drafter_forward(tiny):
    target, drafter = tiny
    ids = torch.randint(0, 96, (2, 16))
    args = _inputs(target, ids, torch.tensor([[3, 9], [1, 12]]), torch.tensor([16, 13]))
    step = build_step_fn(RuntimeConfig(compile_strategy="off"), "cpu", loss_chunk=3)
    w = position_weights(BS, 2.0)
    got = step(drafter, *args[:5], w, False, args[5])
    want = drafter_forward(drafter, *args[:5], w, False, args[5], loss_chunk=3)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def _data_dir(tmp_path, samples):
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 97, "pad_token_id": 0}))
    write_shard(tmp_path / "shard-00000.pt", list(range(len(samples))), samples)
    return tmp_path


def test_a_five_token_response_yields_anchors_and_its_overflow_carries_no_gradient(tiny, tmp_path):
    target, drafter = tiny
    prompt, response = [11, 12, 13, 14, 15, 16], [21, 22, 23, 24, 25]
    data = GeneratedData(_data_dir(tmp_path, [(prompt, response, True)]), seq_len=24, block_size=BS,
                         num_anchors=6, seed=0)
    batch = data.batch(0, 1)
    assert batch.ends.tolist() == [11]
    # every response position with a next token is an anchor; the two left over are empty blocks at the last token
    assert batch.anchors.tolist() == [[6, 7, 8, 9, 10, 10]]
    assert torch.equal(data.batch(0, 1).anchors, batch.anchors)  # a pure function of (seed, step)
    args = _inputs(target, batch.ids, batch.anchors, batch.ends)
    real = args[5].view(6, BS)
    assert real[:, 1:].sum(1).tolist() == [3, 3, 2, 1, 0, 0]  # labels past the response are masked
    states = drafter.hidden(*args[:3], sdpa_attend, args[3])
    states.retain_grad()
    loss, acc, acc_len = chunked_dflash_loss(states, drafter.lm_head_weight, args[4], position_weights(BS, 2.0),
                                             args[5], chunk=5)
    loss.backward()
    per_row = states.grad.reshape(6 * BS, -1).abs().sum(-1)
    supervised = real.clone()
    supervised[:, 0] = False  # the anchor itself is given: weight 0
    assert (per_row[~supervised.reshape(-1)] == 0).all() and (per_row[supervised.reshape(-1)] > 0).all()
    assert 0 <= acc <= 1 and 1 <= acc_len <= 1 + 3
    # what sits at a masked label position (padding, or the clamped last token) does not matter
    relabeled = args[4].clone()
    relabeled[~args[5]] = 5
    again = chunked_dflash_loss(states.detach(), drafter.lm_head_weight, relabeled, position_weights(BS, 2.0),
                                args[5], chunk=5)
    torch.testing.assert_close(again[0], loss.detach())
    assert again[1] == acc and again[2] == acc_len


def test_a_one_token_response_is_skipped(tmp_path):
    data = GeneratedData(_data_dir(tmp_path, [([1, 2, 3], [4], True), ([1, 2], [5, 6], True)]), seq_len=8,
                         block_size=BS, num_anchors=2, seed=0)
    assert len(data) == 1
    assert data.batch(0, 1).anchors.tolist() == [[2, 3]]  # one real anchor, one empty block


def test_markov_anchors_reach_the_last_response_token_but_one():
    from trainer.data import MarkovData

    cfg = Config()
    data = MarkovData(cfg.data, 64, seq_len=24, block_size=16, num_anchors=7, seed=0)
    seen = torch.cat([data.batch(s, 4).anchors.reshape(-1) for s in range(20)])
    assert seen.min() >= cfg.data.prompt_len and seen.max() == 22  # past T - block_size = 8
    assert data.batch(0, 4).ends.tolist() == [24] * 4
