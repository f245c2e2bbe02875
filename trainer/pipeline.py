"""The training pipeline: one coordinator thread (target model -> per-drafter queues), N drafter threads (one
replica each), a barrier-based gradient all-reduce that keeps the replicas bit-identical, and the main thread
supervising (heartbeat, abort, SIGTERM: trainer/main_thread.py).
"""

from __future__ import annotations

import copy
import queue
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import Tensor

from trainer import checkpoint, compile_cache, ddp, graph_probe
from trainer.allreduce import Aborted, AllReduce
from trainer.compile import (
    CompileCounter,
    apply_thread_settings,
    build_step_fn,
    compile_mode,
    flex_attend,
    resolve_attention,
    threads_per_device,
)
from trainer.config import Config
from trainer.data import MarkovData
from trainer.dataset import GeneratedData
from trainer.distributed import Dist, resume_state, save_positions
from trainer.eval import PeriodicEval
from trainer.export import drafter_meta, load_exported, read_exported
from trainer.hf import build_target
from trainer.loss import block_inputs, label_mask, position_weights
from trainer.main_thread import MainThread
from trainer.masks import causal_block_mask, dense_mask, flex_block_mask
from trainer.model import Drafter, build_drafter
from trainer.schedule import lr_at, resolve
from trainer.streams import mark, receive, thread_streams
from trainer.supervise import CRASHED, FINISHED, RUNNING, Fault, Supervisor
from trainer.telemetry import Heartbeat, Progress, emit, log_line


@dataclass
class Work:
    step: int
    ids: Tensor
    anchors: Tensor
    hidden: Tensor
    ends: Tensor
    """[n] the first position past each sequence's real tokens (labels there are masked)."""
    ready: torch.cuda.Event | None = None
    """When the coordinator's stream has finished writing `hidden` (trainer/streams.py)."""


class Trainer(MainThread):
    """Builds everything from a Config and runs it; `run()` returns the process exit code."""

    def __init__(self, cfg: Config, run_dir: Path, resume: bool = False, fault: Fault | None = None,
                 dist: Dist | None = None) -> None:
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume
        self.dist = dist or Dist()
        self.rank_dir = run_dir / f"rank-{self.dist.rank}" if self.dist.rank else run_dir  # heartbeat, errors/
        self._remote: str | None = None  # another rank's failure, from the store
        tr, rt = cfg.train, cfg.runtime
        self.sup = Supervisor(self.rank_dir, rt.on_worker_failure)
        self.fault = fault or Fault.from_env(self.dist.rank)
        self.devices = list(cfg.devices.drafters)
        self.n = len(self.devices)
        self.layer_ids = cfg.layer_ids
        self.attention = [resolve_attention(rt.attention, d) for d in self.devices]
        apply_thread_settings(rt)
        # data before the target: a bad data dir fails in a second, not after minutes of loading a checkpoint
        if cfg.data.kind == "generated":
            self.data = GeneratedData(cfg.data.dir, tr.seq_len, cfg.drafter.block_size, tr.num_anchors, tr.seed,
                                      cfg.target.vocab_size)
        else:
            self.data = MarkovData(cfg.data, cfg.target.vocab_size, tr.seq_len, cfg.drafter.block_size,
                                   tr.num_anchors, tr.seed)
        # steps from epochs, warm-up from a ratio: fixed once, here (trainer/schedule.py)
        samples = len(self.data) if isinstance(self.data, GeneratedData) else None
        self.cfg.train = tr = resolve(tr, samples, self.dist.world_size * self.n * tr.batch_size)
        init_weights = read_exported(cfg.drafter.init_from) if cfg.drafter.init_from else None  # before the target
        self.target = build_target(cfg)
        self.target_device = cfg.devices.target[0]
        if rt.compile_strategy == "naive":
            # the seed's way: the coordinator runs eager flex_attention while workers compile
            self.target.attend = flex_attend
            self.target.causal_mask = causal_block_mask(tr.seq_len, self.target_device)
        self.evals = PeriodicEval.from_config(cfg, self.target, self.layer_ids)
        torch.manual_seed(tr.seed)
        base = build_drafter(self.target, cfg.drafter, len(self.layer_ids), "cpu")
        if cfg.drafter.init_from:
            load_exported(base, cfg.drafter.init_from, init_weights)
        self.replicas: list[Drafter] = [copy.deepcopy(base).to(d) for d in self.devices]
        # fused on CUDA: one kernel per step for all parameters, not one per tensor (SpecForge's optimizer too)
        self.opts = [torch.optim.AdamW(r.parameters(), lr=tr.lr, betas=tuple(map(float, tr.betas)),
                                       weight_decay=tr.weight_decay, fused=True if d.startswith("cuda") else None)
                     for r, d in zip(self.replicas, self.devices, strict=True)]
        self.weights = {d: position_weights(cfg.drafter.block_size, cfg.gamma, d) for d in set(self.devices)}
        per_dev = threads_per_device(self.devices)
        self.notes: list[str] = []
        if rt.cuda_graphs and rt.compile_strategy != "off":  # honoured only where the probe shows it is safe
            found = graph_probe.probe(self.devices[0])
            self.notes.append(found.line(self.devices[0]))
            if not found.safe:
                rt.cuda_graphs = False
                self.notes.append(f"cuda_graphs: off: the start-up probe says {found.verdict} ({found.detail})")
        self.step_fns = {d: build_step_fn(rt, d, n, tr.loss_chunk) for d, n in per_dev.items()}
        self.notes += [f"cuda_graphs: off on {d}: {n} drafter threads share it (one autograd thread would replay "
                      "one backward graph for all of them; see trainer/compile.py compile_mode)"
                      for d, n in sorted(per_dev.items())
                      if rt.cuda_graphs and rt.compile_strategy != "off" and d.startswith("cuda")
                      and compile_mode(rt, d, n) is None]
        self.queues: list[queue.Queue[Work | None]] = [queue.Queue(maxsize=tr.queue_depth) for _ in self.devices]
        cross = partial(self.dist.all_reduce_mean, bucket_mb=rt.dist_bucket_mb) if self.dist.active else None
        self.allreduce = AllReduce(list(range(self.n)), cross)  # bucketed, overlapped with the in-process sum
        self.counter = CompileCounter()
        self.progress = Progress()
        self.heartbeat = Heartbeat(self.rank_dir, list(cfg.devices.target) + self.devices, rt.compile_strategy,
                                   layout=self.layout_info())
        self.ddp: torch.nn.Module | None = None  # layout = processes under torchrun: built after the warm-up barrier
        self._pending: tuple[int, Tensor, float, torch.cuda.Event | None] | None = None  # last step's stats
        self.start_step = 0
        self._phase = "starting"
        self._last_report: tuple[float, int] | None = None
        self._t_start = time.monotonic()

    def layout_info(self) -> dict[str, object]:
        """The heartbeat's `layout`: which device of this rank holds what (`dflashctl status` shows it)."""
        held: dict[str, list[str]] = {}
        for dev in self.cfg.devices.target:
            held.setdefault(dev, []).append("target" if len(self.cfg.devices.target) == 1 else "target-shard")
        for i, dev in enumerate(self.devices):
            held.setdefault(dev, []).append(f"drafter-{self.dist.rank * self.n + i}")
        return {"kind": self.cfg.runtime.layout, "rank": self.dist.rank, "world_size": self.dist.world_size,
                "devices": held}

    # ---- setup -------------------------------------------------------------------------------------------
    def _restore(self) -> None:
        try:
            state = resume_state(self.dist, self.run_dir, self.n, self.devices[0])
        except checkpoint.CheckpointError as e:
            print(f"trainer: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        if state is None:
            emit("resume: no checkpoint found, starting from step 0")
            return
        for replica, opt in zip(self.replicas, self.opts, strict=True):
            replica.load_state_dict(state["drafter"])
            # a copy per replica: load_state_dict keeps CPU tensors as they are, and optimizers sharing
            # exp_avg tensors would apply every update N times
            opt.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.start_step = self.progress.step = int(state["step"])
        emit(f"resume: continuing from the checkpoint of step {self.start_step}")  # no step=: not a training step

    def _warmup(self) -> float:
        """Build and run every compiled function once per device (forward + backward) on this one thread."""
        t0 = time.perf_counter()
        batch = self.data.batch(self.start_step, self.cfg.train.batch_size)
        hidden = self.target.hidden_states(batch.ids.to(self.target_device), self.layer_ids)
        for rank, replica in enumerate(self.replicas):
            if self.sup.stop.is_set():
                break
            loss, _, _ = self._forward(rank, Work(-1, batch.ids, batch.anchors, hidden, batch.ends, mark(hidden)))
            loss.backward()
            replica.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    def _warmup_recovering(self) -> float:
        """`_warmup`, surviving a half-written inductor cache once (trainer/compile_cache.py): the corrupt
        artefacts are removed from the cache directory, the log says so, and everything compiles again."""
        try:
            return self._warmup()
        except Exception as e:
            root = compile_cache.cache_dir()
            failure = compile_cache.diagnose(e, root)
            if failure is None:
                raise
            removed = compile_cache.remove_corrupt(failure, root)
            emit(compile_cache.recovered_line(failure, removed, root))
        compile_cache.reset_inprocess()
        try:
            return self._warmup()
        except Exception as e:
            emit(compile_cache.failed_again_line(e, root))
            raise

    # ---- worker bodies -----------------------------------------------------------------------------------
    def _forward(self, rank: int, item: Work) -> tuple[Tensor, Tensor, Tensor]:
        dev, bs = self.devices[rank], self.cfg.drafter.block_size
        ids, anchors = item.ids.to(dev), item.anchors.to(dev)
        hidden = receive(item.hidden, item.ready, dev).to(dev)
        block_ids, block_pos, labels = block_inputs(ids, anchors, bs, self.target.mask_token_id)
        real = label_mask(block_pos, item.ends.to(dev))
        use_flex = self.attention[rank] == "flex"
        mask = (flex_block_mask if use_flex else dense_mask)(anchors, ids.shape[1], bs)
        if self.ddp is not None:  # the process layout: DDP's hooks reduce the gradients during the backward
            return self.ddp(block_ids, block_pos, hidden, mask, labels, self.weights[dev], use_flex, real)
        return self.step_fns[dev](self.replicas[rank], block_ids, block_pos, hidden, mask, labels,
                                  self.weights[dev], use_flex, real)

    def _put(self, rank: int, item: Work | None) -> None:
        name = f"drafter-{rank}"
        while True:
            try:
                self.queues[rank].put(item, timeout=0.2)
                return
            except queue.Full:
                if self.sup.abort.is_set():
                    raise Aborted() from None
                if self.sup.threads[name].state in (CRASHED, FINISHED):
                    return  # nobody will consume it

    def _get(self, rank: int) -> Work | None:
        while True:
            try:
                return self.queues[rank].get(timeout=0.2)
            except queue.Empty:
                if self.sup.abort.is_set():
                    raise Aborted() from None

    def _coordinator(self) -> None:
        apply_thread_settings(self.cfg.runtime)
        with thread_streams(self.cfg.devices.target, self.cfg.runtime.cuda_streams):
            self._coordinate()
        self.sup.set_state("coordinator", FINISHED)

    def _coordinate(self) -> None:
        tr, bs = self.cfg.train, self.cfg.train.batch_size
        first = self.dist.rank * self.n * bs  # global replica rank * n + i trains sequences [(rank * n + i) * bs, ...)
        part = slice(first, first + self.n * bs)
        self.sup.set_state("coordinator", RUNNING)
        info = self.sup.threads["coordinator"]
        try:
            for step in range(self.start_step, tr.steps):
                # the process layout agrees on its stop a step late (_train_step_ddp): the drafters decide when
                # to stop and the coordinator feeds them until they do
                if self.sup.stop.is_set() and (self.ddp is None or self._drafters_done()):
                    break
                self.fault.check("coordinator", step, self.sup.stop)
                batch = self.data.batch(step, self.dist.world_size * self.n * bs)
                ids, anchors, ends = batch.ids[part], batch.anchors[part], batch.ends[part]
                hidden = self.target.hidden_states(ids.to(self.target_device), self.layer_ids)
                ready = mark(hidden)  # no host sync: each drafter's stream waits for this event instead
                for rank in range(self.n):
                    sl = slice(rank * bs, (rank + 1) * bs)
                    self._put(rank, Work(step, ids[sl], anchors[sl], hidden[sl], ends[sl], ready))
                info.step = step + 1
            for rank in range(self.n):
                self._put(rank, None)
        except Aborted:
            pass

    def _drafters_done(self) -> bool:
        return all(self.sup.threads[f"drafter-{r}"].state in (CRASHED, FINISHED) for r in range(self.n))

    def _drafter(self, rank: int) -> None:
        name = f"drafter-{rank}"
        apply_thread_settings(self.cfg.runtime)
        info = self.sup.threads[name]
        self.sup.set_state(name, RUNNING)
        try:
            with thread_streams([self.devices[rank]], self.cfg.runtime.cuda_streams):
                while True:
                    item = self._get(rank)
                    if item is None:
                        break
                    self.fault.check(name, item.step, self.sup.stop)
                    stop = (self._train_step_ddp if self.ddp is not None else self._train_step)(rank, item)
                    info.step = item.step + 1
                    if stop:
                        break
                self._settle(rank)
        except Aborted:
            pass
        except BaseException:
            if self.sup.on_worker_failure == "abort":
                self.allreduce.break_group()  # before leave(): the others must not finish this step without us
            raise
        finally:
            self.allreduce.leave(rank)
        self.sup.set_state(name, FINISHED)

    def _train_step(self, rank: int, item: Work) -> bool:
        """Forward, backward, all-reduce, clip, step. Returns True when the group agreed to stop (SIGTERM)."""
        replica, opt, dev = self.replicas[rank], self.opts[rank], self.devices[rank]
        params = [p for p in replica.parameters() if p.requires_grad]
        for p in params:
            p.grad = None
        loss, acc, acc_len = self._forward(rank, item)
        loss.backward()
        stop_flag = torch.tensor(float(self.sup.stop.is_set()), device=dev)
        stats = torch.stack([loss.detach().float(), acc.float(), acc_len.float(), stop_flag])
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [stats])
        avg, group = self.allreduce.mean(rank, flat, self.sup.abort)
        avg = avg.to(dev)
        off = 0
        for p in params:
            p.grad.copy_(avg[off:off + p.numel()].view_as(p))
            off += p.numel()
        torch.nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
        lr = lr_at(item.step, self.cfg.train)
        for param_group in opt.param_groups:
            param_group["lr"] = lr
        opt.step()
        loss_v, acc_v, acc_len_v, stop_v = avg[off:].tolist()
        if rank == group[0]:
            self._report(rank, len(group), item.step, loss_v, acc_v, acc_len_v, lr)
        return stop_v > 0

    def _train_step_ddp(self, rank: int, item: Work) -> bool:
        """The process layout's step: DDP reduces the gradients during the backward (bf16 buckets, overlapped); the
        step's [loss, acc, acc_len, stop] are summed across ranks asynchronously and read one step later, after
        the next step's work is queued, so the host never waits for the device at a step's end. The stop flag is
        thereby agreed one step late, alike on every rank. Returns True when the group agreed to stop."""
        replica, opt, dev = self.replicas[rank], self.opts[rank], self.devices[rank]
        opt.zero_grad(set_to_none=True)
        loss, acc, acc_len = self._forward(rank, item)
        loss.backward()
        stop_flag = torch.tensor(float(self.sup.stop.is_set()), device=dev)
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
        host = stats.to("cpu", non_blocking=True) if stats.is_cuda else stats
        self._pending = (item.step, host, lr, mark(stats) if stats.is_cuda else None)
        return stop

    def _settle(self, rank: int) -> bool:
        """Report the pending step (log line, eval, checkpoint); True when its stop flag is set."""
        if self._pending is None:
            return False
        step, host, lr, ready = self._pending
        self._pending = None
        if ready is not None:
            ready.synchronize()
        loss_v, acc_v, acc_len_v, stop_v = host.tolist()
        self._report(rank, 1, step, loss_v, acc_v, acc_len_v, lr)
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
