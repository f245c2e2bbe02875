"""DFlash objective: position k of a block predicts token anchor+k, weighted exp(-(k-1)/gamma), k >= 1."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def position_weights(block_size: int, gamma: float, device: torch.device | str = "cpu") -> Tensor:
    """[Bs] weights: 0 for k = 0 (the anchor is given), exp(-(k-1)/gamma) for k >= 1."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def block_inputs(ids: Tensor, anchors: Tensor, block_size: int, mask_token_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """ids [B, T], anchors [B, A] -> (block_ids, block_pos, labels), each [B, A*Bs].

    block = [anchor token, MASK x (Bs-1)] at positions anchor+k; labels[k] = ids[anchor+k]."""
    bsz, num_anchors = anchors.shape
    offs = torch.arange(block_size, device=ids.device)
    pos = anchors[:, :, None] + offs  # [B, A, Bs]
    labels = torch.gather(ids, 1, pos.reshape(bsz, -1))
    block_ids = torch.full_like(pos, mask_token_id)
    block_ids[:, :, 0] = torch.gather(ids, 1, anchors)
    return block_ids.reshape(bsz, -1), pos.reshape(bsz, -1), labels


def dflash_loss(logits: Tensor, labels: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """logits [B, A*Bs, V], labels [B, A*Bs], weights [Bs].

    Returns (loss, acc, acc_len): the weighted CE normalised by the weight sum; top-1 accuracy over k >= 1;
    acc_len = 1 + mean length of each block's correct prefix (k = 1, 2, ... until the first miss) — the
    acceptance length tau a verifier would get from greedy drafts (+1 for the target's own token)."""
    bs = weights.shape[0]
    bsz = labels.shape[0]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    w = weights.repeat(labels.numel() // bs)
    loss = (ce * w).sum() / w.sum()
    correct = (logits.argmax(-1) == labels).view(bsz, -1, bs)[:, :, 1:]
    acc = correct.float().mean()
    acc_len = 1.0 + correct.long().cumprod(-1).sum(-1).float().mean()
    return loss, acc, acc_len

