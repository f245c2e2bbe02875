"""The trainer's main thread: start-up (resume, warm-up, the ranks' warm-up barrier, DDP), then supervision of
the coordinator and drafter threads (heartbeat, abort, SIGTERM) until the run ends, and the exit code.

`MainThread` is a part of `trainer.pipeline.Trainer`, which builds every attribute used here and the thread
bodies it starts; it is kept apart so that each file reads in one sitting.
"""

from __future__ import annotations

import os
import threading
import time

from trainer import ddp
from trainer.distributed import DistError, dump_replicas, failure_line
from trainer.supervise import CRASHED
from trainer.telemetry import emit
from trainer.threaddump import note_threads

EXIT_OK, EXIT_FAILED, EXIT_SIGTERM = 0, 1, 143
STOP_GRACE_S = 60.0


class MainThread:
    """`run()` and what it needs on the main thread; mixed into `Trainer` (trainer/pipeline.py)."""

    def _beat(self) -> None:
        note_threads()  # the dump signal's thread names (trainer/threaddump.py), for threads started since
        try:
            self.heartbeat.write(self.progress, self.sup.snapshot(), self.counter.recompiles, self._phase)
        except OSError as e:
            emit(f"heartbeat: write failed: {e}")

    def run(self) -> int:
        cfg, rt = self.cfg, self.cfg.runtime
        self.sup.install()
        self.rank_dir.mkdir(parents=True, exist_ok=True)  # the run dir itself on rank 0
        n_params = sum(p.numel() for p in self.replicas[0].parameters() if p.requires_grad)
        emit(f"trainer starting pid={os.getpid()} steps={cfg.train.steps} drafters={self.n} "
             f"devices={','.join(self.devices)} target={','.join(cfg.devices.target)} "
             f"compile_strategy={rt.compile_strategy} attention={','.join(sorted(set(self.attention)))} "
             f"target_layers={self.layer_ids} drafter_params={n_params} block_size={cfg.drafter.block_size} "
             f"drafter_compute={str(self.replicas[0].compute_dtype).removeprefix('torch.')} layout={rt.layout} "
             f"tokens_per_step={self.dist.world_size * self.n * cfg.train.batch_size * cfg.train.seq_len}"
             + (f" rank={self.dist.rank} world_size={self.dist.world_size}" if self.dist.active else ""))
        for note in self.notes:
            emit(note)
        if self.resume:
            self._restore()
        self._phase = "warmup"
        self._beat()
        if rt.compile_strategy == "warmup" and self.start_step < cfg.train.steps:
            secs = self._warmup_recovering()
            emit(f"warmup done compile_s={secs:.1f} graphs={self.counter.frames()}")
        self.counter.mark_warm()
        if self.dist.active:
            try:
                t0 = time.monotonic()
                self.dist.warm_barrier(rt.dist_warmup_timeout_s)
                emit(f"warm-up barrier passed waited_s={time.monotonic() - t0:.1f} ranks={self.dist.world_size}")
            except DistError as e:
                self.sup.first_error = self.sup.first_error or f"warm-up: {e}"
                self._remote = str(e) if "crashed" in str(e) else None
                return self._abort()
            if rt.layout == "processes":
                self.ddp = ddp.wrap(self.replicas[0], self.step_fns[self.devices[0]], self.devices[0],
                                    rt.dist_bucket_mb, rt.grad_reduce_dtype)
        self._phase = "training"
        self._last_report = (time.perf_counter(), self.start_step)
        threads = [threading.Thread(target=self._coordinator, name="coordinator", daemon=True)]
        threads += [threading.Thread(target=self._drafter, args=(i,), name=f"drafter-{i}", daemon=True)
                    for i in range(self.n)]
        for t in threads:
            self.sup.register(t.name)
        if self.start_step < cfg.train.steps and not self.sup.stop.is_set():
            for t in threads:
                t.start()
            note_threads()
        try:
            return self._supervise(threads)
        finally:
            if not self.sup.abort.is_set():  # on abort the process is about to exit; keep recording crashes
                self.sup.uninstall()

    def _supervise(self, threads: list[threading.Thread]) -> int:
        last_beat, stop_seen = 0.0, None
        while any(t.is_alive() for t in threads):
            now = time.monotonic()
            if self.dist.active and not self.sup.abort.is_set() and (msg := self.dist.poll_failure(now)):
                self._remote = msg
                self.sup.abort.set()
            if self.sup.abort.is_set():
                return self._abort()
            if self.sup.stop.is_set():
                stop_seen = stop_seen or now
                if now - stop_seen > STOP_GRACE_S:
                    self._phase = "stopped"
                    self._beat()
                    emit(f"stop: threads did not finish within {STOP_GRACE_S:.0f}s; exiting without checkpoint")
                    return EXIT_SIGTERM
            if now - last_beat >= self.cfg.runtime.heartbeat_interval_s:
                self._beat()
                last_beat = now
            time.sleep(0.05)
        if self.sup.abort.is_set():
            return self._abort()
        survivors = [int(n.split("-")[1]) for n, t in self.sup.threads.items()
                     if n.startswith("drafter-") and t.state != CRASHED]
        if not survivors:
            return self._abort()
        path = self._save(survivors[0], self.progress.step) if not self.dist.rank else "(rank 0 writes it)"
        dump_replicas(self.dist.rank, self.replicas)  # test hook: DFLASH_DUMP_REPLICAS=DIR
        if self.dist.active and (lost := self.dist.finish()):
            self._remote = lost
            return self._abort()
        self._phase = "stopped" if self.sup.stop.is_set() else "finished"
        self._beat()
        crashed = [n for n, t in self.sup.threads.items() if t.state == CRASHED]
        if self.sup.stop.is_set():
            emit(f"training stopped by SIGTERM step={self.progress.step} checkpoint={path}")
            return EXIT_SIGTERM
        note = f" crashed_threads={','.join(crashed)}" if crashed else ""
        emit(f"training finished steps={self.progress.step} recompiles={self.counter.recompiles}{note}")
        return EXIT_OK

    def _abort(self) -> int:
        self._phase = "aborted"
        self._beat()
        why = self.sup.first_error
        if self.dist.active:  # name the rank and thread on every rank, then leave together (bounded)
            why = self._remote or failure_line(self.dist.rank, why)
            if not self._remote:
                self.dist.publish_failure(why)
            emit(why)
            self.dist.exit_together()
        emit(f"training aborted: {why} (on_worker_failure={self.cfg.runtime.on_worker_failure})")
        return EXIT_FAILED
