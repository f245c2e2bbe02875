"""The process layout's gradient reduction: torch DDP around one drafter per rank.

DDP reduces gradients in buckets (`runtime.dist_bucket_mb`) as the backward produces them, so communication
overlaps the rest of the backward; with `runtime.grad_reduce_dtype = "bf16"` each bucket travels in bf16 (DDP's
`bf16_compress_hook`: half the bytes; the mean is cast back into the fp32 gradients). The drafter's frozen
embedding and LM head are buffers: never broadcast per step (`broadcast_buffers=False`); they are the target's,
identical on every rank by construction. Built after the warm-up barrier: its constructor's parameter broadcast
is then the group's first collective, with every rank already compiled.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor, nn

ONE_BUCKET_MB = 1 << 20
"""`dist_bucket_mb = 0` (one bucket): a cap no drafter reaches."""


class StepModule(nn.Module):
    """The drafter with its step function (forward + loss) as `forward`: what DDP wraps, so the hooks DDP needs
    around forward run while the compiled step function stays the one the warm-up built."""

    def __init__(self, drafter: nn.Module, step_fn: Any) -> None:
        super().__init__()
        self.drafter = drafter
        self.step_fn = step_fn

    def forward(self, *args: Any) -> tuple[Tensor, Tensor, Tensor]:
        return self.step_fn(self.drafter, *args)


def wrap(drafter: nn.Module, step_fn: Any, device: str, bucket_mb: float, reduce_dtype: str) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    ids = [torch.device(device).index or 0] if device.startswith("cuda") else None
    with warnings.catch_warnings():  # broadcast_buffers=False is still the only way to skip the init sync too
        warnings.simplefilter("ignore", FutureWarning)
        ddp = DistributedDataParallel(StepModule(drafter, step_fn), device_ids=ids, broadcast_buffers=False,
                                      bucket_cap_mb=bucket_mb if bucket_mb > 0 else ONE_BUCKET_MB,
                                      gradient_as_bucket_view=True)
    if reduce_dtype == "bf16":
        ddp.register_comm_hook(None, bf16_mean_hook)
    return ddp


def bf16_mean_hook(state, bucket):  # noqa: ANN001, ANN201 - DDP checks the annotations it finds; none is accepted
    """DDP's `bf16_compress_hook` under another name: torch refuses that name unless CUDA+NCCL are there, though
    the hook itself is backend-neutral (gloo reduces bf16 too), so the CPU test runs the GPU path's arithmetic:
    each bucket cast to bf16 and divided by the world size, summed, and copied back into the fp32 gradients."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks._compress_hook(torch.bfloat16, state, bucket)


def reduce_stats_async(stats: Tensor) -> Any:
    """Sum the per-rank [loss, acc, acc_len, stop] across ranks without blocking the host (the caller waits on the
    work before reading, one step later)."""
    import torch.distributed as dist

    return dist.all_reduce(stats, op=dist.ReduceOp.SUM, async_op=True)
