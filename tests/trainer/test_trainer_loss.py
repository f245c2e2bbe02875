"""The DFlash objective: position weights, the weighted CE, block inputs, acceptance length."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainer.loss import block_inputs, dflash_loss, label_mask, position_weights


def test_position_weights_exclude_the_anchor_and_decay_from_k1():
    w = position_weights(16, 7.0)
    assert w[0] == 0
    assert w[1] == 1
    assert math.isclose(w[8].item(), math.exp(-1), rel_tol=1e-6)
    assert torch.all(w[2:] < w[1:-1])


def test_weighted_loss_is_per_position_ce_weighted_and_normalised():
    torch.manual_seed(0)
    bsz, blocks, bs, vocab = 2, 3, 4, 11
    logits = torch.randn(bsz, blocks * bs, vocab)
    labels = torch.randint(0, vocab, (bsz, blocks * bs))
    w = position_weights(bs, 2.0)
    loss, _, _ = dflash_loss(logits, labels, w)
    num = den = 0.0
    for b in range(bsz):
        for j in range(blocks):
            for k in range(1, bs):
                i = j * bs + k
                ce = F.cross_entropy(logits[b, i][None], labels[b, i][None]).item()
                wk = math.exp(-(k - 1) / 2.0)
                num, den = num + wk * ce, den + wk
    assert math.isclose(loss.item(), num / den, rel_tol=1e-5)


def test_anchor_position_does_not_affect_loss():
    torch.manual_seed(1)
    logits = torch.randn(1, 8, 5)
    labels = torch.randint(0, 5, (1, 8))
    w = position_weights(4, 3.0)
    changed = logits.clone()
    changed[0, 0] += 100
    changed[0, 4] -= 50
    assert torch.equal(dflash_loss(logits, labels, w)[0], dflash_loss(changed, labels, w)[0])


def test_acc_len_counts_the_correct_prefix_of_each_block():
    bs, vocab = 4, 6
    labels = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])
    pred = torch.tensor([[5, 1, 2, 5, 5, 5, 2, 3]])  # block 0: k=1,2 right then miss -> 2; block 1: miss at k=1 -> 0
    logits = F.one_hot(pred, vocab).float()
    _, acc, acc_len = dflash_loss(logits, labels, position_weights(bs, 7.0))
    assert math.isclose(acc.item(), 4 / 6, rel_tol=1e-6)
    assert math.isclose(acc_len.item(), 1 + (2 + 0) / 2, rel_tol=1e-6)


def test_block_inputs_are_anchor_then_masks_and_labels_are_the_next_tokens():
    ids = torch.arange(100, 120)[None]
    block_ids, block_pos, labels = block_inputs(ids, torch.tensor([[3, 10]]), 4, mask_token_id=99)
    assert block_ids.tolist() == [[103, 99, 99, 99, 110, 99, 99, 99]]
    assert block_pos.tolist() == [[3, 4, 5, 6, 10, 11, 12, 13]]
    assert labels.tolist() == [[103, 104, 105, 106, 110, 111, 112, 113]]


def test_a_block_past_the_end_clamps_its_labels_and_masks_them():
    ids = torch.arange(100, 110)[None]
    block_ids, block_pos, labels = block_inputs(ids, torch.tensor([[7]]), 4, mask_token_id=99)
    assert block_pos.tolist() == [[7, 8, 9, 10]]  # positions keep counting past T = 10
    assert labels.tolist() == [[107, 108, 109, 109]]  # no out-of-range gather
    assert label_mask(block_pos, torch.tensor([10])).tolist() == [[True, True, True, False]]
    assert label_mask(block_pos, torch.tensor([9])).tolist() == [[True, True, False, False]]


def test_masked_labels_are_not_counted_and_stop_the_correct_prefix():
    bs, vocab = 4, 6
    labels = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]])
    pred = torch.tensor([[5, 1, 2, 3, 5, 1, 5, 5, 5, 5, 5, 5]])  # block 0 all right; block 1 right at k=1 only
    mask = torch.tensor([[1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)  # block 2: empty
    logits = F.one_hot(pred, vocab).float() * 10
    w = position_weights(bs, 7.0)
    loss, acc, acc_len = dflash_loss(logits, labels, w, mask)
    assert math.isclose(acc.item(), 3 / 5, rel_tol=1e-6)  # valid k >= 1: block 0 k=1,2; block 1 k=1,2,3
    assert math.isclose(acc_len.item(), 1 + (2 + 1) / 2, rel_tol=1e-6)  # the empty block is not a block
    changed = logits.clone()
    changed[0, 3] = -changed[0, 3]  # a masked position's logits do not matter
    changed[0, 9:] += 3
    assert torch.equal(dflash_loss(changed, labels, w, mask)[0], loss)
    unmasked = dflash_loss(logits, labels, w, torch.ones_like(mask))
    assert unmasked[1] < acc and not torch.equal(unmasked[0], loss)
    assert all(torch.equal(a, b) for a, b in zip(dflash_loss(logits, labels, w, torch.ones_like(mask)),
                                                 dflash_loss(logits, labels, w), strict=True))
