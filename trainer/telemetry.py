"""Telemetry: the per-interval log line (a contract with dflashctl's log scanner) and heartbeat.json."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.checkpoint import atomic_write_bytes


def log_line(step: int, loss: float, tok_s: float, lr: float, acc: float, **extra: float | int | str) -> str:
    """`step=12 loss=4.1234 tok/s=1834.2 lr=3.00e-04 acc=0.123 acc_len=1.52 ...` — these keys are stable."""
    parts = [f"step={step}", f"loss={loss:.4f}", f"tok/s={tok_s:.1f}", f"lr={lr:.2e}", f"acc={acc:.3f}"]
    for key, value in extra.items():
        parts.append(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts)


_PREFIX = [""]


def set_prefix(prefix: str) -> None:
    """Ranks other than 0 of a torch.distributed run mark their lines (`[rank 1] `): only rank 0's parse as the run's
    log lines (`step=...` at the start of a line)."""
    _PREFIX[0] = prefix


def emit(line: str) -> None:
    print(_PREFIX[0] + line, flush=True)


@dataclass
class Progress:
    """Latest training figures, written by the logging drafter thread, read by the heartbeat."""

    step: int = 0
    tok_s: float = 0.0
    loss: float | None = None


class _Nvml:
    """NVML where it initialises (real GPU hosts); silently absent elsewhere (CPU, containers without it)."""

    def __init__(self) -> None:
        self.ok = False
        self.handles: dict[int, Any] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv, self.ok = pynvml, True
        except Exception:
            self.ok = False

    def handle(self, cuda_index: int) -> Any:
        """NVML's handle for torch's `cuda:N`. NVML numbers every GPU of the machine (ignoring
        CUDA_VISIBLE_DEVICES, and in PCI order where CUDA defaults to fastest-first), so `N` is not NVML's index:
        match the device's UUID, else let torch translate through CUDA_VISIBLE_DEVICES."""
        import torch

        try:
            uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
            return self.nv.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        except Exception:
            pass
        try:
            return self.nv.nvmlDeviceGetHandleByIndex(torch.cuda._get_nvml_device_index(cuda_index))
        except Exception:
            return self.nv.nvmlDeviceGetHandleByIndex(cuda_index)

    def sample(self, index: int) -> dict[str, float]:
        """Memory used and utilisation of `cuda:index` (torch's numbering)."""
        if not self.ok:
            return {}
        try:
            if index not in self.handles:
                self.handles[index] = self.handle(index)
            h = self.handles[index]
            mem = self.nv.nvmlDeviceGetMemoryInfo(h)
            util = self.nv.nvmlDeviceGetUtilizationRates(h)
            return {"memory_used_mib": mem.used / 2**20, "utilization_pct": float(util.gpu)}
        except Exception:
            return {}


def _rss_mib() -> float:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


class Heartbeat:
    """Writes <run-dir>/heartbeat.json atomically; the main thread calls `write` every interval."""

    def __init__(self, run_dir: Path, devices: list[str], compile_strategy: str,
                 layout: dict[str, Any] | None = None) -> None:
        self.path = run_dir / "heartbeat.json"
        self.layout = layout
        self.devices = list(dict.fromkeys(devices))
        self.compile_strategy = compile_strategy
        self.nvml = _Nvml() if any(d.startswith("cuda") for d in self.devices) else None

    def device_stats(self) -> list[dict[str, Any]]:
        out = []
        for dev in self.devices:
            if dev.startswith("cuda"):
                import torch

                idx = int(dev.partition(":")[2] or 0)
                row: dict[str, Any] = {"device": dev, "memory_allocated_mib": torch.cuda.memory_allocated(idx) / 2**20,
                                       "max_memory_allocated_mib": torch.cuda.max_memory_allocated(idx) / 2**20}
                if self.nvml is not None:
                    row.update(self.nvml.sample(idx))
            else:
                row = {"device": dev, "memory_allocated_mib": _rss_mib()}  # CPU: the process's resident memory
            out.append(row)
        return out

    def write(self, progress: Progress, threads: list[dict[str, Any]], recompiles: int, phase: str) -> None:
        doc = {"time": time.time(), "pid": os.getpid(), "step": progress.step, "tok_s": progress.tok_s,
               "loss": progress.loss, "phase": phase, "threads": threads, "devices": self.device_stats(),
               "recompiles": recompiles, "compile_strategy": self.compile_strategy}
        if self.layout is not None:
            doc["layout"] = self.layout
        atomic_write_bytes(self.path, json.dumps(doc).encode())
