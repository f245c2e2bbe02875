"""One training step on a drafter thread, in either layout, and what follows it: the step's log line, progress,
eval and checkpoint (leader only).

No per-step host sync on CUDA: the step's [loss, acc, acc_len, stop] leave the device by a non-blocking copy and are
read one step later, after the next step's backward and before its optimizer step (the weights are still those
the pending step produced, so a checkpoint taken there is that step's). The stop flag (SIGTERM) is agreed without
the device where it can be: by one process's threads on the host, under the all-reduce's lock (trainer/allreduce.py);
across processes it is the reduced flag, read at once on the CPU and a step late on CUDA, alike on every rank.

`Steps` is a part of `trainer.pipeline.Trainer`, which builds every attribute used here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import Tensor

from trainer import checkpoint, ddp
from trainer.distributed import save_positions
from trainer.export import drafter_meta
from trainer.schedule import lr_at
from trainer.streams import mark
from trainer.telemetry import emit, log_line


def defers_stats(devices: list[str]) -> bool:
    """Whether the threads layout reads a step's stats a step late: on CUDA (reading them at once would block the
    host). DFLASH_DEFER_STATS=1 does it on the CPU too: how the tests run that path without a GPU."""
    return any(d.startswith("cuda") for d in devices) or os.environ.get("DFLASH_DEFER_STATS") == "1"


class Pending:
    """A step's stats on their way to the host."""

    def __init__(self, step: int, stats: Tensor, lr: float, n_ranks: int, leader: bool) -> None:
        self.step, self.lr, self.n_ranks, self.leader = step, lr, n_ranks, leader
        self.host = stats.to("cpu", non_blocking=True) if stats.is_cuda else stats
        self.ready = mark(stats) if stats.is_cuda else None

    def values(self) -> list[float]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


class Steps:
    """`_train_step` (threads), `_train_step_ddp` (processes), `_settle`, `_report`, `_save`; mixed into Trainer."""

    def _stop_late(self) -> bool:
        """The group's stop is agreed a step late: under DDP, and for threads across processes on CUDA (the reduced
        flag is on the device). The coordinator then feeds the drafters until they stop."""
        return self.ddp is not None or (self.dist.active and self.defer_stats)

    def _train_step(self, rank: int, item) -> bool:  # noqa: ANN001 - trainer.pipeline.Work
        """Forward, backward, all-reduce, clip, step. Returns True when the group agreed to stop (SIGTERM).

        Each replica's own label weight total travels with its gradients (no extra collective): the mean of those
        over the replicas that took part, against the `denom` every loss divided by, rescales the averaged
        gradients and loss to the live replicas' global token-weighted mean (trainer/loss.py) — 1 up to rounding
        while all are alive, their share when one died under `on_worker_failure = "continue"`."""
        replica, opt, dev = self.replicas[rank], self.opts[rank], self.devices[rank]
        params = [p for p in replica.parameters() if p.requires_grad]
        for p in params:
            p.grad = None
        loss, acc, acc_len = self._forward(rank, item)
        loss.backward()
        stopping = self.sup.stop.is_set()
        stop_flag = torch.full((), float(stopping), device=dev)  # a fill on the device, no host-to-device copy
        own = item.weight.to(dev, torch.float32, non_blocking=True)
        stats = torch.stack([loss.detach().float(), acc.float(), acc_len.float(), stop_flag, own])
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [stats])
        avg, group, any_stop = self.allreduce.mean(rank, flat, self.sup.abort, stopping)
        late_stop = self._settle(rank) if self.defer_stats else False  # the previous step's; weights are its own
        avg = avg.to(dev)
        off = 0
        for p in params:
            p.grad.copy_(avg[off:off + p.numel()].view_as(p))
            off += p.numel()
        scale = item.denom.to(dev, non_blocking=True) / avg[off + 4].clamp_min(1e-12)
        torch._foreach_mul_([p.grad for p in params], scale)  # one fused kernel; `avg` is shared: not in place
        torch.nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
        lr = lr_at(item.step, self.cfg.train)
        for param_group in opt.param_groups:
            param_group["lr"] = lr
        opt.step()
        step_stats = torch.cat([avg[off:off + 1] * scale, avg[off + 1:off + 4]])
        self._pending[rank] = Pending(item.step, step_stats, lr, len(group), rank == group[0])
        if self.defer_stats:
            return late_stop if self.dist.active else any_stop
        now_stop = self._settle(rank)  # CPU: no device to wait for, reported at once
        return now_stop if self.dist.active else any_stop

    def _train_step_ddp(self, rank: int, item) -> bool:  # noqa: ANN001 - trainer.pipeline.Work
        """The process layout's step: DDP reduces the gradients during the backward (bf16 buckets, overlapped); the
        step's [loss, acc, acc_len, stop] are summed across ranks asynchronously and read one step later, after
        the next step's work is queued, so the host never waits for the device at a step's end. The stop flag is
        thereby agreed one step late, alike on every rank. Returns True when the group agreed to stop."""
        replica, opt, dev = self.replicas[rank], self.opts[rank], self.devices[rank]
        opt.zero_grad(set_to_none=True)
        loss, acc, acc_len = self._forward(rank, item)
        loss.backward()
        stop_flag = torch.full((), float(self.sup.stop.is_set()), device=dev)
        stats = torch.stack([loss.detach().float(), acc.float(), acc_len.float(), stop_flag])
        work = ddp.reduce_stats_async(stats)
        stop = self._settle(rank)  # the previous step's stats: weights are still those after that step
        params = [p for p in replica.parameters() if p.requires_grad]
        torch.nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
        lr = lr_at(item.step, self.cfg.train)
        for param_group in opt.param_groups:
            param_group["lr"] = lr
        opt.step()
        work.wait()  # on NCCL: the stream waits, not the host
        stats.div_(self.dist.world_size)
        self._pending[rank] = Pending(item.step, stats, lr, 1, True)
        return stop

    def _settle(self, rank: int) -> bool:
        """Report this thread's pending step (leader: log line, eval, checkpoint); True when its stop flag is set."""
        pending = self._pending.pop(rank, None)
        if pending is None:
            return False
        loss_v, acc_v, acc_len_v, stop_v = pending.values()
        if pending.leader:
            self._report(rank, pending.n_ranks, pending.step, loss_v, acc_v, acc_len_v, pending.lr)
        return stop_v > 0

    def _report(self, rank: int, n_ranks: int, step: int, loss: float, acc: float, acc_len: float, lr: float) -> None:
        """Leader only: the log line every interval, progress for the heartbeat, periodic checkpoints."""
        tr = self.cfg.train
        done = step + 1
        now = time.perf_counter()
        t_prev, s_prev = self._last_report or (now, step)
        tokens = (done - s_prev) * n_ranks * self.dist.world_size * tr.batch_size * tr.seq_len
        tok_s = tokens / max(now - t_prev, 1e-9)
        self.progress.step, self.progress.loss = done, loss
        if self.dist.rank:
            return  # rank 0 alone logs, evaluates and checkpoints
        if done % tr.log_interval == 0 or done == tr.steps:
            self.progress.tok_s = tok_s
            emit(log_line(done, loss, tok_s, lr, acc, acc_len=acc_len, recompiles=self.counter.recompiles,
                          elapsed_s=round(time.monotonic() - self._t_start, 3)))
            self._last_report = (now, done)
        if self.evals and self.evals.due(done, tr.steps):
            emit(f"eval step={done} {self.evals(self.replicas[rank]).summary()}")
        if tr.checkpoint_interval and done % tr.checkpoint_interval == 0 and done < tr.steps:
            self._save(rank, done)

    def _save(self, rank: int, step: int) -> Path:
        state = {"step": step, "drafter": self.replicas[rank].state_dict(), "optimizer": self.opts[rank].state_dict(),
                 "config": self.cfg.to_dict(), "drafter_meta": drafter_meta(self.cfg)}
        if self.dist.active:
            state.update(save_positions(self.dist, self.n, step))
        return checkpoint.save(self.run_dir, step, state, self.cfg.train.keep_checkpoints)
