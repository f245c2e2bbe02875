"""Device lists given on a command line or in a config: which of them this machine really has.

A leaf for every entry point (`python -m trainer`, `trainer.eval`, `trainer.datagen`): a missing GPU is a one-line
error before minutes of model loading, not a CUDA traceback from deep inside it. torch is imported only when a list
names a CUDA device or asks for `auto`.
"""

from __future__ import annotations


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def unavailable_devices(devices: list[str]) -> list[str]:
    """`cuda:N` entries this machine does not have."""
    count = cuda_count() if any(d.startswith("cuda") for d in devices) else 0
    return sorted({d for d in devices if d.startswith("cuda") and int(d.partition(":")[2] or 0) >= count})


def device_problem(devices: list[str]) -> str | None:
    """What is wrong with a device list given on a command line (a bad name, or a GPU this machine lacks), as one
    line; None when every device is usable. For the CLIs whose devices bypass the config's validation."""
    for d in devices:
        if not (d in ("cpu", "cuda") or (d.startswith("cuda:") and d[5:].isdigit())):
            return f"bad device {d!r} (cpu, cuda or cuda:N)"
    missing = unavailable_devices(devices)
    if missing:
        return f"devices not available on this machine: {', '.join(missing)} ({cuda_count()} CUDA devices visible)"
    return None


def parse_devices(text: str) -> list[str]:
    """A `--devices` comma list; `auto` is every GPU, else the CPU."""
    if text == "auto":
        n = cuda_count()
        return [f"cuda:{i}" for i in range(n)] if n else ["cpu"]
    return [d.strip() for d in text.split(",") if d.strip()]


def gpu_uuids(devices: list[str]) -> dict[str, str]:
    """The UUID of each CUDA device's GPU (torch's bare form; nvidia-smi prints it after `GPU-`): the one name of a
    GPU that survives CUDA_VISIBLE_DEVICES and CUDA's fastest-first order, so `dflashctl status` can put each device
    on the GPU table's right row. {} without CUDA, or on a torch whose device properties carry no uuid."""
    import torch

    if not any(d.startswith("cuda") for d in devices) or not torch.cuda.is_available():
        return {}
    out = {}
    for d in devices:
        if d.startswith("cuda"):
            uuid = getattr(torch.cuda.get_device_properties(torch.device(d)), "uuid", None)
            if uuid is not None:
                out[d] = str(uuid)
    return out
