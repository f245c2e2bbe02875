"""The parts of the CUDA-only paths that a CPU can check: which devices get CUDA graphs, and that the compiled
step takes a fresh flex BlockMask (new mask_mod closure, new anchors) every step without recompiling."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from trainer.compile import compile_mode, threads_per_device
from trainer.config import RuntimeConfig
from trainer.masks import dense_mask, flex_block_mask


def test_cuda_graphs_only_on_a_cuda_device_with_one_drafter_thread():
    graphs = RuntimeConfig(cuda_graphs=True)
    assert compile_mode(graphs, "cuda:5", 1) == "reduce-overhead"
    # two drafter threads on one GPU would replay one backward CUDA graph (one autograd thread per device)
    assert compile_mode(graphs, "cuda:0", 2) is None
    assert compile_mode(graphs, "cpu", 1) is None
    assert compile_mode(RuntimeConfig(cuda_graphs=False), "cuda:0", 1) is None


def test_threads_per_device_counts_cuda_and_cuda0_as_one_gpu():
    assert threads_per_device(["cuda:5", "cuda:6", "cuda:7"]) == {"cuda:5": 1, "cuda:6": 1, "cuda:7": 1}
    assert threads_per_device(["cuda", "cuda:0", "cuda:1"]) == {"cuda": 2, "cuda:0": 2, "cuda:1": 1}
    assert threads_per_device(["cpu", "cpu"]) == {"cpu": 2}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compiled_flex_takes_a_fresh_block_mask_every_step_without_recompiling():
    """The pipeline builds a BlockMask per step from that step's anchors (a new mask_mod closure each time) and
    passes it into the compiled step: dynamo must treat the closure's tensor as an input, not guard on it."""
    from torch.nn.attention.flex_attention import flex_attention

    def step(q, k, v, block_mask):
        return flex_attention(q, k, v, block_mask=block_mask)

    compiled = torch.compile(step, backend="eager")  # guards are dynamo's, whatever the backend
    gen = torch.Generator().manual_seed(0)
    ctx, bs, n_anchors = 64, 16, 4
    before = counters["frames"]["total"]
    for _ in range(4):
        anchors = torch.randint(1, ctx, (2, n_anchors), generator=gen).sort(-1).values
        q = torch.randn(2, 2, n_anchors * bs, 16, generator=gen)
        k, v = (torch.randn(2, 2, ctx + n_anchors * bs, 16, generator=gen) for _ in range(2))
        got = compiled(q, k, v, flex_block_mask(anchors, ctx, bs))
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(anchors, ctx, bs))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # this step's anchors, not the first step's
    assert counters["frames"]["total"] - before == 1
