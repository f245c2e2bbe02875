"""Short responses trimmed: a replica's batch builds only the blocks that can hold a supervised token.

A generated sample whose response has fewer anchor positions than `train.num_anchors` fills the rest with empty
blocks at its last token (trainer/dataset.py): every label masked, weight 0, yet each costs a full block of drafter
compute (512 blocks x 16 queries at the seed's recipe, however short the answer). Anchors are sorted and the empty
blocks sit at the last token, after every real anchor, so the blocks that hold supervised tokens are a prefix of
each row: the batch keeps the first `kept` blocks of every row, `kept` = the batch's largest such prefix, rounded up
to one of a few fixed block counts (`buckets`: num_anchors, /2, /4, ...), each compiled once at warm-up, so shapes
stay static and the recompile count stays 0. The kept blocks' masks, labels and weights are the untrimmed ones.
"""

from __future__ import annotations

from torch import Tensor


def buckets(num_anchors: int, levels: int) -> list[int]:
    """The block counts a batch may be trimmed to, largest first: num_anchors, ceil(/2), ceil(/4), ... (`levels` of
    them, duplicates dropped); `levels` <= 1: num_anchors only (no trimming)."""
    out: list[int] = []
    for k in range(max(1, levels)):
        n = -(-num_anchors // (1 << k))
        if n not in out:
            out.append(n)
    return out


def needed(anchors: Tensor, ends: Tensor) -> Tensor:
    """[B] how many leading blocks of each row hold a real label (anchor + 1 < end)."""
    return (anchors + 1 < ends[:, None]).sum(1)


def bucket_for(need: int, sizes: list[int]) -> int:
    """The smallest of `sizes` that holds `need` blocks (at least one)."""
    return min((s for s in sizes if s >= max(need, 1)), default=sizes[0])


def kept_blocks(anchors: Tensor, ends: Tensor, sizes: list[int]) -> int:
    """The block count a batch (CPU anchors [B, A], ends [B]) is trimmed to: no device, no sync."""
    return bucket_for(int(needed(anchors, ends).max()), sizes)


def possible(rooms: list[int] | None, num_anchors: int, sizes: list[int]) -> list[int]:
    """The block counts a data set can produce (what warm-up compiles), from each sample's number of anchor
    positions (`rooms`; None = every sample fills all `num_anchors`)."""
    if rooms is None:
        return [bucket_for(num_anchors, sizes)]
    return sorted({bucket_for(min(r, num_anchors), sizes) for r in rooms}, reverse=True)


def trim(anchors: Tensor, kept: int) -> Tensor:
    """The first `kept` blocks of every row."""
    return anchors[:, :kept] if kept < anchors.shape[1] else anchors


