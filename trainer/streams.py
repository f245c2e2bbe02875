"""Per-thread CUDA streams, and handing tensors from one thread's stream to another's.

Every worker thread runs its kernels on streams of its own: the coordinator one per target device, each drafter
one on its device. On a shared GPU (the one-GPU layout, or two drafter threads on one device) the target's
forward for the next batch then overlaps the drafters' step instead of queueing behind it on the device's
default stream, and two drafters on one GPU interleave rather than serialise.

A tensor that crosses threads therefore crosses streams, and the caching allocator knows nothing of threads:
the producer `mark`s the tensor (an event recorded on its stream), the consumer `receive`s it (its streams wait
for the event, and are recorded on the tensor so its memory is not handed back to the producer's stream while
the consumer's reads are still queued). A thread drains its streams before it leaves, so whatever it wrote is
complete for whoever reads it next (the main thread's final checkpoint).

Off CUDA there are no streams: every function here is a no-op, so the CPU path is unchanged. `enabled=False`
(`runtime.cuda_streams = false`) keeps every thread on the device's default stream, as before, for comparison.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import Tensor


@contextmanager
def thread_streams(devices: Iterable[str], enabled: bool = True) -> Iterator[list[torch.cuda.Stream]]:
    """A new stream made current on each CUDA device in `devices`, for the calling thread only (current streams
    are per thread). The first device is entered last, so it is also this thread's current device."""
    cuda = list(dict.fromkeys(torch.device(d) for d in devices if torch.device(d).type == "cuda"))
    if not enabled or not cuda:
        yield []
        return
    streams = [torch.cuda.Stream(d) for d in cuda]
    with ExitStack() as stack:
        for s in reversed(streams):
            stack.enter_context(torch.cuda.stream(s))
        yield streams
    # not in a `finally`: after a crash a synchronize would raise again and bury the thread's real traceback
    for s in streams:
        s.synchronize()


def mark(t: Tensor) -> torch.cuda.Event | None:
    """The point on this thread's stream after which `t` is fully written (None off CUDA)."""
    if not t.is_cuda:
        return None
    return torch.cuda.current_stream(t.device).record_event()


def receive(t: Tensor, ready: torch.cuda.Event | None, *devices: str | torch.device) -> Tensor:
    """Make this thread's current streams on `t`'s device and on `devices` wait for `ready` before they read `t`.

    `t`'s own device matters even for a copy to another device: PyTorch runs a device-to-device copy on the
    current stream of the source device."""
    if ready is None or not t.is_cuda:
        return t
    targets = dict.fromkeys([t.device, *(torch.device(d) for d in devices)])
    for dev in targets:
        if dev.type != "cuda":
            continue
        stream = torch.cuda.current_stream(dev)
        stream.wait_event(ready)
        if dev == t.device:
            t.record_stream(stream)
    return t
