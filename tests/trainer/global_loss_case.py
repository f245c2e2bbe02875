"""A fixed case for the global token-weighted loss tests: a tiny target and drafter, and a global batch of two
replicas whose rows hold very different numbers of real labels (a full row and two short ones), shared by the
in-process test and the DDP worker (tests/trainer/global_loss_worker.py)."""

from __future__ import annotations

import torch

from trainer.compile import drafter_forward
from trainer.config import DrafterConfig, TargetConfig
from trainer.loss import block_inputs, label_mask, position_weights
from trainer.masks import dense_mask
from trainer.model import build_drafter
from trainer.tiny_target import TinyTarget

BS, T, REPLICAS = 4, 24, 2
LAYERS = [0, 2]


def models():
    torch.manual_seed(0)
    target = TinyTarget(TargetConfig(vocab_size=97, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                                     intermediate_size=64))
    drafter = build_drafter(target, DrafterConfig(num_layers=1, block_size=BS, num_heads=4, num_kv_heads=2,
                                                  intermediate_size=64), len(LAYERS), "cpu")
    return target, drafter


def global_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [4, T], anchors [4, 5], ends [4]: replica 0 = rows 0-1 (full: 18 real blocks' labels), replica 1 = rows
    2-3 (responses ending at 9 and 8: most of their blocks are empty)."""
    ids = torch.randint(0, 96, (4, T), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[4, 8, 12, 16, 20], [5, 9, 13, 17, 21], [4, 6, 8, 8, 8], [5, 6, 7, 7, 7]])
    ends = torch.tensor([T, T, 9, 8])
    return ids, anchors, ends


def weights() -> torch.Tensor:
    return position_weights(BS, 2.0)


def forward(target, drafter, ids, anchors, ends, denom=None, loss_chunk=0):  # noqa: ANN001, ANN201
    """The trainer's forward + loss for these rows (`drafter` may be a DDP-wrapped step module's drafter)."""
    hidden = target.hidden_states(ids, LAYERS)
    block_ids, block_pos, labels = block_inputs(ids, anchors, BS, target.mask_token_id)
    return drafter_forward(drafter, block_ids, block_pos, hidden, dense_mask(anchors, ids.shape[1], BS), labels,
                           weights(), False, label_mask(block_pos, ends), denom, loss_chunk)
