"""Several trainer processes (torchrun or any launcher that sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT):
one process group, a cross-process all-reduce of the in-process mean per step (bucketed, each bucket launched as
soon as its part of the in-process mean is summed), and a failure flag in the group's store so a crash on any rank
ends every rank within seconds, naming the rank and the thread.

Without those variables (or WORLD_SIZE=1) `Dist` is the single process and nothing here touches torch.distributed:
the trainer behaves exactly as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from trainer.oneline import first_line

FAILURE_KEY = "dflash/failure"
"""Set once, by the first rank whose run aborts: `rank R THREAD crashed: TYPE: MESSAGE`."""
ACK_KEY = "dflash/abort-acks"
"""Ranks that have logged the failure and are exiting; the failing rank waits for them (bounded)."""
WARM_KEY = "dflash/warm"
"""Ranks that finished their warm-up (the barrier before the first training collective)."""
ACK_WAIT_S = 3.0
POLL_INTERVAL_S = 0.5
MIB = 1 << 20


def bucket_spans(numel: int, element_size: int, bucket_bytes: int) -> list[tuple[int, int]]:
    """[start, end) element ranges of a flat tensor, each at most `bucket_bytes` (at least one element); a bucket
    may split a parameter (the tensor is flat). `bucket_bytes <= 0`, or a tensor no larger: one range."""
    per = max(1, bucket_bytes // element_size) if bucket_bytes > 0 else numel
    return [(a, min(a + per, numel)) for a in range(0, numel, max(per, 1))] or [(0, 0)]


class DistError(Exception):
    """The launcher's variables are wrong or the process group cannot form; the message says which and what to do."""


@dataclass
class Dist:
    """This process's place in the run: rank, world size, and (when world_size > 1) the group's store."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    store: Any = None
    _last_poll: float = field(default=0.0, repr=False)

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def all_reduce_mean(self, out: Any, fill: Callable[[int, int], None] | None = None, bucket_mb: float = 25.0) -> Any:
        """The mean over the ranks of each rank's flat `out` (its in-process mean), identical on every rank: one SUM
        all-reduce per bucket of `bucket_mb` MiB (0 = one; each element is reduced once and copied to all ranks,
        gloo and NCCL alike), then one division. `out` is reduced in place.

        `fill(a, b)`, when given, writes out[a:b] first: bucket k goes on the wire (async) as soon as it is filled,
        while the caller sums bucket k+1. On CUDA the collective waits for the current stream (the fill) and
        `wait()` makes the current stream wait for it, so the host never blocks on the device. A hung or dead peer
        fails the first wait after the group's timeout; the buckets still in flight are abandoned (the run
        aborts and the process exits without waiting for them)."""
        import torch.distributed as dist

        works = []
        for a, b in bucket_spans(out.numel(), out.element_size(), int(bucket_mb * MIB)):
            if fill is not None:
                fill(a, b)
            works.append(dist.all_reduce(out[a:b], op=dist.ReduceOp.SUM, async_op=True))
        for work in works:
            work.wait()
        return out / self.world_size

    def broadcast(self, obj: Any, device: str = "cpu") -> Any:
        """Rank 0's `obj` on every rank (a checkpoint read on rank 0 only: other nodes need no shared disk)."""
        import torch
        import torch.distributed as dist

        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, device=torch.device(device) if device.startswith("cuda") else None)
        return box[0]

    def publish_failure(self, message: str) -> None:
        """Tell every rank why this one aborts (first writer wins: later failures are consequences)."""
        try:
            if not self.store.check([FAILURE_KEY]):
                self.store.set(FAILURE_KEY, message)
        except Exception:  # the store's host is gone: the peers notice through their own collectives
            pass

    def poll_failure(self, now: float) -> str | None:
        """Another rank's failure, at most every POLL_INTERVAL_S; a store that cannot be reached is one too."""
        if now - self._last_poll < POLL_INTERVAL_S:
            return None
        self._last_poll = now
        try:
            if self.store.check([FAILURE_KEY]):
                return self.store.get(FAILURE_KEY).decode(errors="replace")
        except Exception as e:
            return f"rank {self.rank} lost the process group's store: {type(e).__name__}: {e}"
        return None

    def warm_barrier(self, timeout_s: float, poll_s: float = 0.1) -> None:
        """Every rank has finished its warm-up (model load and cold compile), through the store: its own timeout
        (`runtime.dist_warmup_timeout_s`), not the collectives' shorter one, so rank skew in compile time never
        trips a collective's watchdog at step 1. Raises DistError naming how many ranks arrived, or another rank's
        failure."""
        self.store.add(WARM_KEY, 1)
        deadline = time.monotonic() + timeout_s
        while (ready := self.store.add(WARM_KEY, 0)) < self.world_size:
            if self.store.check([FAILURE_KEY]):
                raise DistError(self.store.get(FAILURE_KEY).decode(errors="replace"))
            if time.monotonic() > deadline:
                raise DistError(f"rank {self.rank}: {ready} of {self.world_size} ranks finished warm-up within "
                                f"{timeout_s:.0f}s; raise runtime.dist_warmup_timeout_s if a cold compile takes "
                                "longer, or look at the missing ranks' logs")
            time.sleep(poll_s)

    def exit_together(self) -> None:
        """On abort: count this rank out, then wait (bounded) until every rank has, so the failing rank's message
        reaches the others' logs before its exit tears the collectives down."""
        try:
            self.store.add(ACK_KEY, 1)
            deadline = time.monotonic() + ACK_WAIT_S
            while self.store.add(ACK_KEY, 0) < self.world_size and time.monotonic() < deadline:
                time.sleep(0.05)
        except Exception:
            pass

    def finish(self) -> str | None:
        """Normal end or SIGTERM stop: wait for every rank (rank 0 may still be writing the checkpoint), then leave
        the group so the interpreter exits cleanly. Returns why not, when a peer failed meanwhile (its message from
        the store if it left one) — then this rank aborts too."""
        import torch.distributed as dist

        try:
            dist.barrier()
            dist.destroy_process_group()
            return None
        except Exception as e:
            self._last_poll = 0.0
            remote = self.poll_failure(time.monotonic())
            return remote or f"rank {self.rank} lost its peers at the end: {type(e).__name__}: {first_line(e)}"


def _env_int(env: dict[str, str], key: str, default: int | None) -> int:
    text = env.get(key)
    if text is None or text == "":
        if default is None:
            raise DistError(f"{key} is not set but WORLD_SIZE is; launch with torchrun, or set RANK, WORLD_SIZE, "
                            "MASTER_ADDR and MASTER_PORT together")
        return default
    try:
        return int(text)
    except ValueError:
        raise DistError(f"{key}={text!r} is not an integer; fix the launcher's environment") from None


def read_env(env: dict[str, str] | None = None) -> Dist:
    """The layout from the launcher's variables, without joining anything (no torch import)."""
    env = dict(os.environ if env is None else env)
    world = _env_int(env, "WORLD_SIZE", 1)
    if world < 1:
        raise DistError(f"WORLD_SIZE={world} must be >= 1")
    if world == 1:
        return Dist()
    rank = _env_int(env, "RANK", None)
    if not 0 <= rank < world:
        raise DistError(f"RANK={rank} is outside [0, WORLD_SIZE={world})")
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if not env.get(key):
            raise DistError(f"{key} is not set but WORLD_SIZE={world}; launch with torchrun, or set it")
    _env_int(env, "MASTER_PORT", None)
    local = _env_int(env, "LOCAL_RANK", 0)
    return Dist(rank=rank, world_size=world, local_rank=local,
                local_world_size=_env_int(env, "LOCAL_WORLD_SIZE", 1))


def backend_for(drafters: list[str], choice: str) -> str:
    """auto = NCCL when the drafters are on CUDA, gloo on the CPU."""
    if choice != "auto":
        return choice
    return "nccl" if all(d.startswith("cuda") for d in drafters) else "gloo"


def place_devices(target: list[str], drafters: list[str], d: Dist) -> tuple[list[str], list[str]]:
    """Several processes on one node share its GPUs: process `local_rank` takes the config's CUDA indices (target and
    drafters alike) shifted by local_rank * (highest index + 1): `cuda:0, cuda:1` with two processes a node is
    cuda:0-1 for local rank 0 and cuda:2-3 for local rank 1."""
    idx = [int(x.partition(":")[2] or 0) for x in [*target, *drafters] if x.startswith("cuda")]
    if os.environ.get("DFLASH_RANKS_SHARE_DEVICES") == "1":  # benchmarks/gpu_check.sh: 2 ranks on its one GPU
        return list(target), list(drafters)
    if not d.active or d.local_world_size <= 1 or not idx:
        return list(target), list(drafters)
    shift = d.local_rank * (max(idx) + 1)

    def moved(devs: list[str]) -> list[str]:
        return [f"cuda:{int(x.partition(':')[2] or 0) + shift}" if x.startswith("cuda") else x for x in devs]

    return moved(target), moved(drafters)


def join(d: Dist, backend: str, timeout_s: float, device: str | None = None) -> Dist:
    """init_process_group from the environment with a short timeout: a dead or hung peer fails a collective within
    `timeout_s`, not torch's default 30 minutes."""
    if not d.active:
        return d
    import torch
    import torch.distributed as dist

    if backend == "nccl" and device:
        torch.cuda.set_device(torch.device(device))
    try:
        dist.init_process_group(backend=backend, init_method="env://", rank=d.rank, world_size=d.world_size,
                                timeout=timedelta(seconds=timeout_s))
    except Exception as e:
        raise DistError(f"rank {d.rank}: cannot join the process group ({backend}, "
                        f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}): {first_line(e)}") from None
    d.store = dist.distributed_c10d._get_default_store()
    return d


def failure_line(rank: int, first_error: str | None) -> str:
    """`rank 1 drafter-1 crashed: RuntimeError: ...` from the supervisor's `drafter-1: RuntimeError: ...`."""
    thread, sep, rest = (first_error or "unknown: no error recorded").partition(": ")
    return f"rank {rank} {thread} crashed: {rest}" if sep else f"rank {rank} failed: {first_error}"


def save_positions(d: Dist, n: int, step: int) -> dict[str, Any]:
    """Checkpoint entries: the layout and every rank's data position. Batches are a pure function of the global
    step and the global replica index (rank * n + thread), and all ranks step in lockstep (the same collectives
    every step), so rank 0 knows them all: resuming every rank at `next_step` is exact."""
    return {"distributed": {"world_size": d.world_size, "drafters_per_process": n},
            "data_positions": [{"rank": r, "replicas": list(range(r * n, (r + 1) * n)), "next_step": step}
                               for r in range(d.world_size)]}


def _layout_problem(state: dict[str, Any], d: Dist, n: int) -> str | None:
    saved = state.get("distributed") or {"world_size": 1,
                                         "drafters_per_process": len(state["config"]["devices"]["drafters"])}
    sw, sn = int(saved["world_size"]), int(saved["drafters_per_process"])
    if sw * sn != d.world_size * n:
        return (f"checkpoint of step {state['step']} was trained by {sw} process(es) x {sn} drafters = {sw * sn} "
                f"replicas, this run has {d.world_size} x {n} = {d.world_size * n}: resume with the same number of "
                "replicas (the data is sharded by global replica)")
    positions = state.get("data_positions") or []
    if any(int(p["next_step"]) != int(state["step"]) for p in positions):
        return f"checkpoint of step {state['step']}: ranks' data positions disagree ({positions})"
    return None


def resume_state(d: Dist, run_dir: Any, n: int, device: str) -> dict[str, Any] | None:
    """The newest checkpoint: read by rank 0 and broadcast (other nodes need no shared disk), with its error, if
    any, raised on every rank alike (CheckpointError), so no rank is left waiting in a collective."""
    from trainer import checkpoint

    if not d.active:  # one process: as before, unless the checkpoint came from several
        state = checkpoint.load_latest(run_dir)
        error = _layout_problem(state, d, n) if state is not None and "distributed" in state else None
        if error:
            raise checkpoint.CheckpointError(error)
        return state
    state, error = None, None
    if d.rank == 0:
        try:
            state = checkpoint.load_latest(run_dir)
            error = _layout_problem(state, d, n) if state is not None else None
        except checkpoint.CheckpointError as e:
            error = str(e)
    state, error = d.broadcast((None, error) if error else (state, None), device)
    if error:
        raise checkpoint.CheckpointError(error)
    return state


def dump_replicas(rank: int, replicas: list[Any]) -> None:
    """Test hook: env DFLASH_DUMP_REPLICAS=DIR writes DIR/rank-R.pt, every replica's final weights."""
    out = os.environ.get("DFLASH_DUMP_REPLICAS")
    if not out:
        return
    import torch

    os.makedirs(out, exist_ok=True)
    torch.save({f"drafter-{i}": {k: v.detach().cpu() for k, v in r.state_dict().items()}
                for i, r in enumerate(replicas)}, os.path.join(out, f"rank-{rank}.pt"))
