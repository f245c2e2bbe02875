"""The cross-process gradient mean: one blocking collective vs bucketed, overlapped collectives (issue 17).

    .venv/bin/python benchmarks/allreduce_buckets.py [--large-mb 100] [--rounds 5] [--steps 3] [--out FILE]

Two gloo processes on loopback (this machine's CPUs, torch_threads 1 each, as the trainer), each holding the flat
gradients of two drafter threads. One step = what the thread completing the in-process barrier does
(trainer/allreduce.py mean_of): sum the threads' tensors in order, divide, and average across the processes.

- baseline: the trainer's former code: the whole in-process mean, then one blocking `dist.all_reduce`.
- N MiB buckets: `Dist.all_reduce_mean` with that bucket size, each bucket launched async as soon as its part of
  the in-process mean is summed (the trainer's path); `0 MiB` = one bucket through the same code.
- N MiB, no overlap: the whole in-process mean first, then the same buckets (bucketing alone).

Sizes: the tiny config's drafter (86,468 floats with the stats, 0.33 MiB) and --large-mb. Every row of a size runs
once per round, rounds interleaved, after a barrier; per-step time = (time of `steps` steps on rank 0) / steps,
median and best over the rounds. Ratios are time / baseline time of the same size in the same run (< 1 = faster);
`0 MiB` runs the baseline's work through the new code, so its ratio shows the run's noise.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TINY = 86464 + 4
THREADS = 2


def rows_for(numel: int) -> list[tuple[str, float, bool]]:
    """(label, bucket MiB, overlap) per row; baseline first. Bucket sizes scale with the tensor: a few buckets."""
    mib = numel * 4 / 2**20
    sizes = [0.0, round(mib / 16, 4), round(mib / 4, 4), 25.0] if mib < 25 else [0.0, 5.0, 25.0, 50.0]
    rows = [("baseline: one blocking collective", -1.0, False)]
    rows += [(f"{mb:g} MiB buckets, overlapped", mb, True) for mb in sizes]
    rows += [(f"{mb:g} MiB buckets, no overlap", mb, False) for mb in sizes[1:3]]
    return rows


def worker(rank: int, port: int, large: int, rounds: int, steps: int) -> None:
    import torch
    import torch.distributed as dist

    from trainer.allreduce import mean_of
    from trainer.distributed import Dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=300))
    d = Dist(rank=rank, world_size=2)

    def baseline(parts: list) -> torch.Tensor:
        out = mean_of(parts)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out / 2

    def step_fn(mb: float, overlap: bool):  # noqa: ANN202
        if mb < 0:
            return baseline
        if overlap:
            return lambda parts: mean_of(parts, lambda out, fill: d.all_reduce_mean(out, fill, bucket_mb=mb))
        return lambda parts: d.all_reduce_mean(mean_of(parts), bucket_mb=mb)

    for numel in (TINY, large):
        gen = torch.Generator().manual_seed(rank)
        parts = [torch.randn(numel, generator=gen) for _ in range(THREADS)]
        rows = rows_for(numel)
        times: dict[str, list[float]] = {label: [] for label, _, _ in rows}
        reference = baseline(parts)
        for label, mb, overlap in rows:  # warm-up, and every row gives the baseline's bits (two ranks)
            assert torch.equal(step_fn(mb, overlap)(parts), reference), label
        for _ in range(rounds):
            for label, mb, overlap in rows:
                fn = step_fn(mb, overlap)
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(steps):
                    fn(parts)
                times[label].append((time.perf_counter() - t0) / steps)
        if rank == 0:
            base, base_min = statistics.median(times[rows[0][0]]), min(times[rows[0][0]])
            for label, _, _ in rows:
                t, t_min = statistics.median(times[label]), min(times[label])
                print(f"ROW\t{numel}\t{label}\t{t * 1e3:.2f}\t{t / base:.2f}\t{t_min * 1e3:.2f}\t"
                      f"{t_min / base_min:.2f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large-mb", type=float, default=100.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "allreduce_buckets.md"))
    ap.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    large = int(a.large_mb * 2**20 / 4)
    if a.worker >= 0:
        worker(a.worker, a.port, large, a.rounds, a.steps)
        return
    load0, t_start, port = os.getloadavg(), time.monotonic(), free_port()
    cmd = [sys.executable, __file__, "--large-mb", str(a.large_mb), "--rounds", str(a.rounds), "--steps",
           str(a.steps), "--port", str(port), "--worker"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([*cmd, str(r)], stdout=subprocess.PIPE, text=True, env=env) for r in range(2)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"allreduce_buckets: a worker failed (exit codes {[p.returncode for p in procs]})")
    rows = [line.split("\t")[1:] for line in outs[0].splitlines() if line.startswith("ROW\t")]
    load1, wall = os.getloadavg(), time.monotonic() - t_start
    lines = ["# Cross-process gradient mean: one blocking collective vs bucketed, overlapped", "",
             f"    .venv/bin/python benchmarks/allreduce_buckets.py --large-mb {a.large_mb:g} --rounds {a.rounds} "
             f"--steps {a.steps}", "",
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; 2 gloo processes on loopback, {THREADS} drafter threads' "
             f"tensors each, fp32; {os.cpu_count()} CPUs (shared), torch_threads 1; torch "
             f"{__import__('torch').__version__}, Python {platform.python_version()}; load average "
             f"{load0[0]:.2f} before, {load1[0]:.2f} after; {wall:.0f} s wall. Per-step time: median and best of "
             f"{a.rounds} interleaved rounds of {a.steps} steps, rank 0. Ratio = time / baseline of the same size "
             "(< 1 = faster). Every row's result was checked bit-equal to the baseline's first.", "",
             "| tensor | row | median ms / step | ratio vs baseline | best ms / step | best ratio |",
             "|---|---|---:|---:|---:|---:|"]
    for numel, label, *figures in rows:
        lines.append(f"| {int(numel):,} floats ({int(numel) * 4 / 2**20:.2f} MiB) | {label} | "
                     + " | ".join(figures) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
