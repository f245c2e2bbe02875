"""DFlash objective: position k of a block predicts token anchor+k, weighted exp(-(k-1)/gamma), k >= 1.

Blocks may run past the end of a response (SpecForge's layout): label positions at or past the sequence's end
(`ends`, the first position that is not real response: padding, or past seq_len) are masked — weight 0 in the loss,
not counted in acc, and the correct prefix behind acc_len stops there. Two ways to the same numbers:
`dflash_loss` over full logits, and `chunked_dflash_loss` over the drafter's pre-LM-head hidden states, which
computes the logits a chunk of rows at a time in forward and again in backward, so the [rows, vocab] logits
never exist whole (512 blocks x 16 x 151,936 fp32 logits are 5 GB per sequence).

Normalisation (SpecForge's global token count: specforge/training/controller.py `_normalize_gradients`): a step's
loss is sum(w * CE) over every label of every live replica, divided by the sum of w over them all — not a mean of
per-replica means, which would weigh a token of a replica with few real labels more than one of a replica with
many. Each replica divides its own sum by `denom` = the global weight sum / the number of replicas whose gradients
are averaged (`global_denominator`: known on the CPU before the backward, no collective). That is exact while every
replica takes part; the threads layout also averages each replica's own weight sum (`weight_total`) with its
gradients and rescales by `denom / that mean` (trainer/train_step.py), so a replica that died under
`on_worker_failure = "continue"` takes its labels out of the divisor too. The process layout needs no rescale: a
dead rank ends the run (`continue` is refused there). `denom=None`: the replica's own weight sum (one replica alone).
"""

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


def block_positions(anchors: Tensor, block_size: int) -> Tensor:
    """anchors [B, A] -> [B, A*Bs]: block k of an anchor a sits at position a + k."""
    pos = anchors[:, :, None] + torch.arange(block_size, device=anchors.device)
    return pos.reshape(anchors.shape[0], -1)


def block_inputs(ids: Tensor, anchors: Tensor, block_size: int, mask_token_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """ids [B, T], anchors [B, A] -> (block_ids, block_pos, labels), each [B, A*Bs].

    block = [anchor token, MASK x (Bs-1)] at positions anchor+k; labels[k] = ids[anchor+k]. A block may run past
    T: its positions keep counting (rotary needs no table), its labels there repeat ids[T-1] and must be masked
    (`label_mask`)."""
    bsz, num_anchors = anchors.shape
    pos = block_positions(anchors, block_size)
    labels = torch.gather(ids, 1, pos.clamp(max=ids.shape[1] - 1))
    block_ids = torch.full_like(pos, mask_token_id).view(bsz, num_anchors, block_size)
    block_ids[:, :, 0] = torch.gather(ids, 1, anchors)
    return block_ids.reshape(bsz, -1), pos, labels


def label_mask(block_pos: Tensor, ends: Tensor) -> Tensor:
    """block_pos [B, A*Bs], ends [B] -> bool [B, A*Bs]: True where the label is a real token (position < end)."""
    return block_pos < ends[:, None]


def _row_weights(weights: Tensor, shape: torch.Size, mask: Tensor | None) -> Tensor:
    """Per-row loss weight [B * A*Bs]: the position weight, 0 where masked."""
    w = weights.repeat(shape.numel() // weights.shape[0])
    return w if mask is None else w * mask.reshape(-1).to(w.dtype)


def weight_total(anchors: Tensor, ends: Tensor, weights: Tensor) -> Tensor:
    """anchors [B, A], ends [B], weights [Bs] -> the loss weight summed over every real label (0-d float64): the
    loss's own `_row_weights` over these blocks, from the batch alone (on the CPU: no device sync)."""
    pos = block_positions(anchors, weights.shape[0])
    return _row_weights(weights.to(torch.float64), pos.shape, label_mask(pos, ends)).sum()


def global_denominator(anchors: Tensor, ends: Tensor, weights: Tensor, replicas: int) -> Tensor:
    """The `denom` of every replica's loss for one step: the whole global batch's weight sum / `replicas` (those
    whose gradients are averaged: DDP's world size, or the threads layout's processes x drafter threads). Every
    rank holds the global batch (batches are a pure function of the step), so every rank computes the same value
    on its CPU: no collective, no host sync. fp32 0-d."""
    return (weight_total(anchors, ends, weights.cpu()) / replicas).to(torch.float32)


def _accuracy(correct: Tensor, mask: Tensor | None, block_size: int) -> tuple[Tensor, Tensor]:
    """correct/mask [B, A*Bs] bool -> (acc over valid k >= 1, 1 + mean correct prefix over blocks whose k = 1 is
    valid). The prefix stops at the first miss or the first masked position."""
    bsz = correct.shape[0]
    c = correct.view(bsz, -1, block_size)[:, :, 1:]
    if mask is None:
        valid = torch.ones_like(c)
    else:
        valid = mask.view(bsz, -1, block_size)[:, :, 1:]
        c = c & valid
    acc = c.sum().float() / valid.sum().clamp_min(1).float()
    prefix = c.long().cumprod(-1).sum(-1)
    blocks = valid[:, :, 0].sum().clamp_min(1).float()
    return acc, 1.0 + prefix.sum().float() / blocks


def _denominator(w: Tensor, denom: Tensor | None) -> Tensor:
    return w.sum().clamp_min(1e-12) if denom is None else denom.to(w.device, w.dtype)


def dflash_loss(logits: Tensor, labels: Tensor, weights: Tensor, mask: Tensor | None = None,
                denom: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """logits [B, A*Bs, V], labels [B, A*Bs], weights [Bs], mask [B, A*Bs] bool (None = every label real), denom:
    the loss's divisor (module docstring; None = the weight sum of these real labels).

    Returns (loss, acc, acc_len): the weighted CE summed over the real labels / denom; top-1 accuracy
    over real labels at k >= 1; acc_len = 1 + mean length of each block's correct prefix (k = 1, 2, ... until the
    first miss or masked label) — the acceptance length tau a verifier would get from greedy drafts (+1 for the
    target's own token)."""
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    w = _row_weights(weights, labels.shape, mask)
    loss = (ce * w).sum() / _denominator(w, denom)
    acc, acc_len = _accuracy(logits.argmax(-1) == labels, mask, weights.shape[0])
    return loss, acc, acc_len


def _exp_shifted_(logits: Tensor) -> tuple[Tensor, Tensor]:
    """In place: logits -> exp(logits - rowmax); returns (that, rowmax [c, 1]). One [c, V] buffer, not three
    (logsumexp and softmax each allocate their own temporaries)."""
    top = logits.amax(-1, keepdim=True)
    return logits.sub_(top).exp_(), top


class _ChunkedCE(torch.autograd.Function):
    """sum_i w_i * CE(h_i @ W^T, y_i) and argmax(h_i @ W^T) == y_i, `chunk` rows of logits at a time.

    The matmul runs in W's dtype (the target's: bf16 on GPU, like the autocast LM head it replaces), the CE in
    fp32, in place on one [chunk, V] fp32 buffer. Backward recomputes each chunk's logits:
    grad_h = ((softmax - onehot) * w * grad) @ W. W is frozen: no gradient."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, labels: Tensor, w: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        hit = torch.empty(h.shape[0], dtype=torch.bool, device=h.device)
        for s in range(0, h.shape[0], chunk):
            logits = F.linear(h[s:s + chunk].to(weight.dtype), weight).float()
            y = labels[s:s + chunk]
            hit[s:s + chunk] = logits.argmax(-1) == y
            target = logits.gather(1, y[:, None])
            exp, top = _exp_shifted_(logits)
            ce = (exp.sum(-1, keepdim=True).log() + top - target).squeeze(1)  # logsumexp - target logit
            total = total + (ce * w[s:s + chunk]).sum()
            del logits, exp
        ctx.save_for_backward(h, weight, labels, w)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(hit)
        return total, hit

    @staticmethod
    def backward(ctx, grad_total: Tensor, _grad_hit: Tensor | None):
        h, weight, labels, w = ctx.saved_tensors
        chunk = ctx.chunk
        scale = (w * grad_total)[:, None]
        grad = torch.empty_like(h)
        for s in range(0, h.shape[0], chunk):
            exp, _ = _exp_shifted_(F.linear(h[s:s + chunk].to(weight.dtype), weight).float())
            g = exp.div_(exp.sum(-1, keepdim=True))  # softmax
            g.scatter_add_(1, labels[s:s + chunk, None], torch.full_like(g[:, :1], -1.0))
            g.mul_(scale[s:s + chunk])
            grad[s:s + chunk] = (g.to(weight.dtype) @ weight).to(h.dtype)
            del exp, g
        return grad, None, None, None, None


def chunked_dflash_loss(hidden: Tensor, lm_head_weight: Tensor, labels: Tensor, weights: Tensor,
                        mask: Tensor | None = None, chunk: int = 2048,
                        denom: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """`dflash_loss(F.linear(hidden, lm_head_weight), labels, weights, mask, denom)` without the full logits: hidden
    [B, A*Bs, H] (the drafter's normed pre-LM-head states), lm_head_weight [V, H] (frozen), `chunk` rows of logits
    at a time. Same (loss, acc, acc_len), same gradient w.r.t. hidden. `chunk` <= 0 = one chunk."""
    rows = labels.numel()
    chunk = rows if chunk <= 0 else min(chunk, rows)
    w = _row_weights(weights, labels.shape, mask)
    w = w / _denominator(w, denom)
    loss, hit = _ChunkedCE.apply(hidden.reshape(rows, -1), lm_head_weight, labels.reshape(-1), w, chunk)
    acc, acc_len = _accuracy(hit.view(labels.shape), mask, weights.shape[0])
    return loss, acc, acc_len
