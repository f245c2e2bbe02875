"""The DFlash objective: position weights, the weighted CE, block inputs, acceptance length."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainer.loss import block_inputs, dflash_loss, position_weights


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
