"""One rank of tests/trainer/test_allreduce_buckets.py: `python allreduce_worker.py RANK WORLD PORT OUT`.

Joins a gloo group on loopback, reduces the same per-thread gradients once with a single blocking collective (the
trainer's old path) and once per bucket size through `mean_of` + `Dist.all_reduce_mean` (the trainer's path), and
saves every result and the fill calls to OUT/rank-RANK.pt for the test to compare."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trainer.allreduce import mean_of  # noqa: E402
from trainer.distributed import Dist  # noqa: E402

NUMEL = 86464 + 4  # the tiny config's drafter gradients + the 4 stats the trainer appends
THREADS = 3
BUCKET_MB = (0.001, 0.1, 25.0, 0.0)  # 262 floats (< fc.weight's 12288), 4 buckets, larger than the whole, one


def thread_parts(rank: int) -> list[torch.Tensor]:
    """The flat gradients of this rank's drafter threads: a pure function of the rank."""
    gen = torch.Generator().manual_seed(1000 + rank)
    return [torch.randn(NUMEL, generator=gen) * (10.0 ** torch.randint(-3, 3, (NUMEL,), generator=gen))
            for _ in range(THREADS)]


def main(rank: int, world: int, port: int, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    d, parts = Dist(rank=rank, world_size=world), thread_parts(rank)
    one = mean_of(parts).clone()
    dist.all_reduce(one, op=dist.ReduceOp.SUM)
    results: dict[str, object] = {"one": one / world}
    for mb in BUCKET_MB:
        calls: list[tuple[int, int]] = []

        def cross(buf: torch.Tensor, fill, mb: float = mb, calls: list = calls) -> torch.Tensor:  # noqa: ANN001
            def recorded(a: int, b: int) -> None:
                calls.append((a, b))
                fill(a, b)

            return d.all_reduce_mean(buf, recorded, bucket_mb=mb)

        results[f"bucketed-{mb}"] = mean_of(parts, cross)
        results[f"calls-{mb}"] = calls
    out.mkdir(parents=True, exist_ok=True)
    torch.save(results, out / f"rank-{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
