"""kill-zombies' GPU half through the one host mapping of `gpus` (commands/gpus.py, analysis/hostgpus.py): which
process holds which GPU, read where the driver's pids are real, and mapped to containers by cgroup and NSpid. Our
container's holders go to the classifier (analysis/zombies.py) by the pid they have in here; every other
container's and the host's are only named, never touched."""

from __future__ import annotations

from dflashctl.analysis.hostgpus import host_gpu_report, named_elsewhere
from dflashctl.commands import gpus
from dflashctl.errors import DflashError
from dflashctl.model import HostGpuReport
from dflashctl.remote.target import Target


def host_gpu(target: Target, timeout: float | None = 60) -> tuple[HostGpuReport, list[str]]:
    """(the host's GPU processes as the classifier reads them, a line naming each one kill-zombies must leave)."""
    try:
        doc = gpus.host_reading(target, timeout)
    except DflashError as e:
        return HostGpuReport((), e.message), []
    view = gpus.view_of(target, [doc], None)
    error = str(doc.get("apps_error")) if doc.get("apps_error") and doc.get("apps_error") != "nvidia-smi not found" \
        else None
    return host_gpu_report(view, error), named_elsewhere(view)
