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

from trainer import checkpoint, compile_cache, graph_probe, trim
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
from trainer.devices import gpu_uuids
from trainer.distributed import Dist, resume_state
from trainer.eval import PeriodicEval
from trainer.export import load_exported, read_exported
from trainer.hf import build_target
from trainer.loss import block_inputs, global_denominator, label_mask, position_weights, weight_total
from trainer.main_thread import MainThread
from trainer.masks import causal_block_mask, dense_mask, flex_block_mask
from trainer.model import Drafter, build_drafter
from trainer.schedule import resolve
from trainer.streams import mark, receive, thread_streams
from trainer.supervise import CRASHED, FINISHED, RUNNING, Fault, Supervisor
from trainer.telemetry import Heartbeat, Progress, emit
from trainer.train_step import Pending, Steps, defers_stats


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
    denom: Tensor | None = None
    """CPU 0-d: the loss's divisor, alike for every replica of the step (trainer/loss.py global_denominator)."""
    weight: Tensor | None = None
    """CPU 0-d: this replica's own label weight total (trainer/loss.py weight_total); averaged with the gradients."""


class Trainer(MainThread, Steps):
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
        self.cpu_weights = position_weights(cfg.drafter.block_size, cfg.gamma)
        # every replica's gradient is averaged with the others': n threads here x world_size processes
        self.replicas_averaged = self.dist.world_size * self.n
        self.block_sizes = trim.buckets(tr.num_anchors, tr.block_buckets)  # what a short batch is trimmed to
        rooms = self.data.rooms() if isinstance(self.data, GeneratedData) else None
        self.warm_sizes = trim.possible(rooms, tr.num_anchors, self.block_sizes)  # compiled at warm-up
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
        self._pending: dict[int, Pending] = {}  # per drafter thread: its last step's stats (trainer/train_step.py)
        self.defer_stats = defers_stats(self.devices)
        if self.defer_stats and cfg.runtime.layout == "threads":
            self.notes.append("step stats: read one step late (no host sync per step; the log line follows suit)")
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
        layout: dict[str, object] = {"kind": self.cfg.runtime.layout, "rank": self.dist.rank,
                                     "world_size": self.dist.world_size, "devices": held}
        uuids = gpu_uuids(list(held))
        if uuids:
            layout["uuids"] = uuids
        return layout

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
        """Build and run every compiled function once per device (forward + backward) on this one thread, at every
        block count the data can trim a batch to (trainer/trim.py)."""
        t0 = time.perf_counter()
        batch = self.data.batch(self.start_step, self.cfg.train.batch_size)
        hidden = self.target.hidden_states(batch.ids.to(self.target_device), self.layer_ids)
        denom = global_denominator(batch.anchors, batch.ends, self.cpu_weights, 1)
        for kept in self.warm_sizes:
            anchors = trim.trim(batch.anchors, kept)
            for rank, replica in enumerate(self.replicas):
                if self.sup.stop.is_set():
                    break
                loss, _, _ = self._forward(rank, Work(-1, batch.ids, anchors, hidden, batch.ends, mark(hidden), denom))
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
        ids, anchors = item.ids.to(dev, non_blocking=True), item.anchors.to(dev, non_blocking=True)
        hidden = receive(item.hidden, item.ready, dev).to(dev)
        block_ids, block_pos, labels = block_inputs(ids, anchors, bs, self.target.mask_token_id)
        real = label_mask(block_pos, item.ends.to(dev, non_blocking=True))
        denom = item.denom.to(dev, non_blocking=True) if item.denom is not None else None
        use_flex = self.attention[rank] == "flex"
        mask = (flex_block_mask if use_flex else dense_mask)(anchors, ids.shape[1], bs)
        if self.ddp is not None:  # the process layout: DDP's hooks reduce the gradients during the backward
            return self.ddp(block_ids, block_pos, hidden, mask, labels, self.weights[dev], use_flex, real, denom)
        return self.step_fns[dev](self.replicas[rank], block_ids, block_pos, hidden, mask, labels,
                                  self.weights[dev], use_flex, real, denom)

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
                # where the stop is agreed a step late (trainer/train_step.py) the drafters decide when to stop and
                # the coordinator feeds them until they do
                if self.sup.stop.is_set() and (not self._stop_late() or self._drafters_done()):
                    break
                self.fault.check("coordinator", step, self.sup.stop)
                batch = self.data.batch(step, self.dist.world_size * self.n * bs)
                ids, anchors, ends = batch.ids[part], batch.anchors[part], batch.ends[part]
                # the whole global batch's weight sum, on the CPU: every rank gets the same divisor, no collective
                denom = global_denominator(batch.anchors, batch.ends, self.cpu_weights, self.replicas_averaged)
                hidden = self.target.hidden_states(ids.to(self.target_device), self.layer_ids)
                ready = mark(hidden)  # no host sync: each drafter's stream waits for this event instead
                for rank in range(self.n):
                    sl = slice(rank * bs, (rank + 1) * bs)
                    kept = trim.kept_blocks(anchors[sl], ends[sl], self.block_sizes)  # CPU tensors: no sync
                    mine = trim.trim(anchors[sl], kept)
                    self._put(rank, Work(step, ids[sl], mine, hidden[sl], ends[sl], ready, denom,
                                         weight_total(mine, ends[sl], self.cpu_weights)))
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
