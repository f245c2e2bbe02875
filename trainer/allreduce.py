"""The drafters' gradient all-reduce: a barrier over the drafter threads that averages their gradients in one
fixed order, so every replica steps on bit-identical values; a rank that crashed leaves, and the others go on —
unless the run is going to abort for it (`break_group`): then no rank finishes another step, so nothing (a log line,
a checkpoint) gets past the step the crash happened at, however slowly the main thread notices.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch import Tensor

from trainer.streams import mark, receive

Fill = Callable[[int, int], None]
"""Writes elements [a, b) of the in-process mean into the result buffer."""
Cross = Callable[[Tensor, Fill], Tensor]
"""The cross-process mean (trainer/distributed.py Dist.all_reduce_mean): fills and reduces the buffer bucket by
bucket, returns the global mean."""


def mean_of(parts: list[Tensor], cross: Cross | None = None) -> Tensor:
    """The mean of `parts`, summed in list order and divided once, element range by element range (the ops are
    elementwise, so any split gives the same bits as one pass). With `cross`, each range goes to the other
    processes as soon as it is summed, overlapping the sum of the next range with its collective."""
    out = torch.empty_like(parts[0])

    def fill(a: int, b: int) -> None:
        piece = out[a:b]
        piece.copy_(parts[0][a:b])
        for p in parts[1:]:
            piece.add_(p[a:b].to(piece.device))
        piece.div_(len(parts))

    if cross is None:
        fill(0, out.numel())
        return out
    return cross(out, fill)


class Aborted(Exception):
    """Raised inside a worker when the run is being aborted because another thread failed (not a crash)."""


class AllReduce:
    """Mean of one flat tensor per drafter thread, every step.

    The last thread to arrive sums the slots in rank order and divides once; everyone copies that one result,
    so every replica applies bit-identical gradients (and sees the same metrics and stop flag: the threads' host
    flags OR-ed by that last thread, so agreeing on a stop needs no device value). A thread that
    leaves (finished or crashed) is dropped from the group so the others never wait for it. On CUDA each slot
    and the result carry the event of the stream that wrote them (trainer/streams.py)."""

    def __init__(self, ranks: list[int], cross: Cross | None = None) -> None:
        """`cross`: several processes (trainer/distributed.py): the in-process mean goes through it (bucketed
        collectives, by the thread that completes the step) and every thread gets its global result."""
        self.cross = cross
        self.cond = threading.Condition()
        self.active = set(ranks)
        self.slots: dict[int, tuple[Tensor, torch.cuda.Event | None]] = {}
        self.stops: dict[int, bool] = {}
        self.stop = False
        self.generation = 0
        self.result: Tensor | None = None
        self.result_ready: torch.cuda.Event | None = None
        self.group: tuple[int, ...] = ()
        self.broken = False

    def _maybe_finish(self) -> None:
        if self.broken or not self.active or not self.active.issubset(self.slots):
            return
        ranks = sorted(self.active)
        first = self.slots[ranks[0]][0]
        for r in ranks:
            receive(*self.slots[r], first.device)
        self.result = mean_of([self.slots[r][0] for r in ranks], self.cross)
        self.result_ready = mark(self.result)
        self.group = tuple(ranks)
        self.stop = any(self.stops.get(r, False) for r in ranks)
        self.slots.clear()
        self.stops.clear()
        self.generation += 1
        self.cond.notify_all()

    def mean(self, rank: int, tensor: Tensor, abort: threading.Event,
             stop: bool = False) -> tuple[Tensor, tuple[int, ...], bool]:
        """Returns the mean, the ranks that took part (the lowest one is this step's leader) and whether any of
        them passed `stop` (this process's threads only: other processes' flags travel in the tensor)."""
        with self.cond:
            if self.broken:
                raise Aborted()
            gen = self.generation
            self.slots[rank] = (tensor, mark(tensor))
            self.stops[rank] = stop
            self._maybe_finish()
            while self.generation == gen:
                if abort.is_set() or self.broken:
                    raise Aborted()
                self.cond.wait(0.2)
            assert self.result is not None
            return receive(self.result, self.result_ready, tensor.device), self.group, self.stop

    def break_group(self) -> None:
        """A rank crashed and the run will abort: everyone waiting (or arriving) raises Aborted."""
        with self.cond:
            self.broken = True
            self.cond.notify_all()

    def leave(self, rank: int) -> None:
        with self.cond:
            self.active.discard(rank)
            self.slots.pop(rank, None)
            self.stops.pop(rank, None)
            self._maybe_finish()
