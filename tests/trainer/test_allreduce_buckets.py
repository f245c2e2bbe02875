"""The bucketed, overlapped cross-process gradient mean (trainer/distributed.py, trainer/allreduce.py): real gloo
process groups on loopback. Bucketing changes neither the bits nor, with two ranks, the result of the one
blocking collective it replaced; every rank gets the same result."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from allreduce_worker import BUCKET_MB, NUMEL, THREADS, thread_parts
from harness.sshd import free_port

from trainer.allreduce import mean_of
from trainer.distributed import MIB, bucket_spans

WORKER = Path(__file__).with_name("allreduce_worker.py")


def test_bucket_spans_cover_the_tensor_in_order():
    assert bucket_spans(10, 4, 0) == [(0, 10)]
    assert bucket_spans(10, 4, 400) == [(0, 10)]  # larger than the whole: one bucket
    assert bucket_spans(10, 4, 12) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert bucket_spans(10, 4, 1) == [(a, a + 1) for a in range(10)]  # below one element: one element each
    assert bucket_spans(0, 4, 12) == [(0, 0)]
    spans = bucket_spans(NUMEL, 4, 25 * MIB // 1000)
    assert spans[0][0] == 0 and spans[-1][1] == NUMEL
    assert all(b == c for (_, b), (c, _) in zip(spans, spans[1:], strict=False))


def test_in_process_mean_by_ranges_has_the_bits_of_one_pass():
    parts = thread_parts(0)
    total = parts[0].clone()  # the all-reduce's former code: sum in rank order, divide once
    for p in parts[1:]:
        total += p
    reference = total / len(parts)
    assert torch.equal(mean_of(parts), reference)

    def by_ranges(out: torch.Tensor, fill) -> torch.Tensor:  # noqa: ANN001 - what Dist.all_reduce_mean does locally
        for a, b in bucket_spans(out.numel(), out.element_size(), 1000):
            fill(a, b)
        return out

    assert torch.equal(mean_of(parts, by_ranges), reference)


def run_world(world: int, out: Path) -> list[dict]:
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(world), str(port), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), logs
    return [torch.load(out / f"rank-{r}.pt", weights_only=True) for r in range(world)]


@pytest.mark.parametrize("world", [2, 3])
def test_bucketed_mean_is_identical_on_every_rank_and_equals_one_collective(world, tmp_path):
    ranks = run_world(world, tmp_path)
    expected = torch.stack([torch.stack(thread_parts(r)).double() for r in range(world)]).mean((0, 1))
    for res in ranks:
        for mb in BUCKET_MB:
            per = int(mb * MIB) // 4 or NUMEL
            calls = res[f"calls-{mb}"]  # one fill per bucket, in order, covering the tensor
            assert len(calls) == math.ceil(NUMEL / per) and calls[0][0] == 0 and calls[-1][1] == NUMEL
            got = res[f"bucketed-{mb}"]
            assert torch.equal(got, ranks[0][f"bucketed-{mb}"]), (mb, "ranks differ")
            torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6 * THREADS)
            if world == 2:  # a + b == b + a: any bucketing sums each element exactly as the one collective did
                assert torch.equal(got, res["one"]), mb
    assert len(ranks[0]["calls-0.001"]) > NUMEL // 12288  # buckets smaller than the largest parameter
