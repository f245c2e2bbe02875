"""Short responses trimmed (trainer/trim.py): a batch builds only the blocks that can hold a supervised token, in one
of a few fixed block counts; the kept blocks' masks, labels and weights — hence the loss and every gradient — are
those of the untrimmed batch."""

from __future__ import annotations

import copy
import json

import torch
from global_loss_case import BS, models, weights

from trainer import trim
from trainer.compile import drafter_forward
from trainer.dataset import GeneratedData, write_shard
from trainer.loss import block_inputs, label_mask
from trainer.masks import dense_mask

# the same rows in a shorter key/value sequence: the attention sums over fewer (all masked) keys in another
# blocking, so equal to a few fp32 ulps, not bit for bit
RTOL, ATOL = 1e-5, 1e-7


def _data(tmp_path, responses: list[int]) -> GeneratedData:
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 97, "pad_token_id": 0}))
    samples = [([11, 12, 13, 14], [20 + i for i in range(n)], True) for n in responses]
    write_shard(tmp_path / "shard-00000.pt", list(range(len(samples))), samples)
    return GeneratedData(tmp_path, seq_len=40, block_size=BS, num_anchors=16, seed=0)


def test_bucket_sizes_and_the_blocks_a_batch_keeps():
    assert trim.buckets(512, 4) == [512, 256, 128, 64]
    assert trim.buckets(5, 4) == [5, 3, 2, 1] and trim.buckets(2, 4) == [2, 1] and trim.buckets(512, 1) == [512]
    anchors = torch.tensor([[4, 5, 6, 9, 9, 9], [4, 5, 6, 7, 8, 9]])
    assert trim.needed(anchors, torch.tensor([10, 40])).tolist() == [3, 6]
    sizes = trim.buckets(6, 3)  # 6, 3, 2
    assert trim.kept_blocks(anchors[:1], torch.tensor([10]), sizes) == 3
    assert trim.kept_blocks(anchors[:1], torch.tensor([7]), sizes) == 2  # 6 + 1 = 7: that block is empty
    assert trim.kept_blocks(anchors, torch.tensor([10, 40]), sizes) == 6  # the batch's longest row decides
    assert trim.possible(None, 6, sizes) == [6] and trim.possible([2, 3, 40], 6, sizes) == [6, 3, 2]


def test_a_short_response_builds_fewer_blocks_with_the_same_loss_and_gradients(tmp_path):
    data = _data(tmp_path, [5, 7])
    assert data.rooms() == [4, 6]
    batch = data.batch(0, 2)
    sizes = trim.buckets(16, 4)  # 16, 8, 4, 2
    kept = trim.kept_blocks(batch.anchors, batch.ends, sizes)
    assert kept == 8 and trim.possible(data.rooms(), 16, sizes) == [8, 4]
    short = trim.trim(batch.anchors, kept)
    assert torch.equal(short, batch.anchors[:, :kept])

    target, base = models()
    out = {}
    for name, anchors in (("full", batch.anchors), ("trimmed", short)):
        drafter = base if name == "full" else copy.deepcopy(base)
        drafter.zero_grad(set_to_none=True)
        hidden = target.hidden_states(batch.ids, [0, 2])
        block_ids, block_pos, labels = block_inputs(batch.ids, anchors, BS, target.mask_token_id)
        real = label_mask(block_pos, batch.ends)
        loss, acc, acc_len = drafter_forward(drafter, block_ids, block_pos, hidden,
                                             dense_mask(anchors, batch.ids.shape[1], BS), labels, weights(), False,
                                             real, None, 5)
        loss.backward()
        out[name] = (block_ids, labels, real, loss.detach(), acc, acc_len,
                     {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None})
    full, cut = out["full"], out["trimmed"]
    assert cut[0].shape[1] == kept * BS < full[0].shape[1] == 16 * BS  # fewer blocks built
    rows = kept * BS  # the kept blocks: the same inputs, labels and real-label mask as before
    assert all(torch.equal(c, f[:, :rows]) for c, f in zip(cut[:3], full[:3], strict=True))
    dropped = full[2][:, rows:].reshape(2, -1, BS)
    assert dropped.shape[1] == 16 - kept and not dropped[:, :, 1:].any()  # what was dropped supervised nothing
    torch.testing.assert_close(cut[3], full[3], rtol=RTOL, atol=ATOL)
    assert cut[4] == full[4] and cut[5] == full[5]
    assert cut[6].keys() == full[6].keys() and cut[6]
    for name, g in full[6].items():
        torch.testing.assert_close(cut[6][name], g, rtol=RTOL, atol=ATOL, msg=name)
