"""Before the next attempt, the GPUs again (`launch --exclude-unhealthy-gpus`, issue 28 part 3).

The attempt that just ended may have ended BECAUSE a GPU failed (Xid 79, an uncorrectable ECC error): starting the
next one on the same GPUs fails it the same way. So when the sentinel asks for another attempt it first reads the
GPUs and the kernel log as the launch did (the probe's own report, in-process) and applies the launch's rule
(analysis/gpuexclude.py `decide`, the very module the laptop runs) to what the launch recorded (launch spec
`gpu_health`: the GPUs the run may use before any was left out, how many it needs, whether they are fixed).

In a container the kernel log is often unreadable (dmesg_restrict, a journal of its own): the Xid half is then
missing and the check says so (`xid_error`); NVML / nvidia-smi's ECC and row-remap readings still count.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from dflashctl.agent.probe.gpus import GpuReader
from dflashctl.agent.probe.main import report
from dflashctl.agent.probe.request import ProbeRequest
from dflashctl.analysis.gpuexclude import Exclusion, decide, report_findings
from dflashctl.report import parse_report


@dataclass(frozen=True)
class Recheck:
    exclusion: Exclusion
    visible: str | None  # CUDA_VISIBLE_DEVICES for the next attempt; None: the user's own (or none)
    xid_error: str | None  # why the kernel log could not be read here (None: it was)

    def to_record(self) -> dict[str, Any]:
        """restart.json `gpus`, and the refusal event's."""
        return {**self.exclusion.to_record(), "visible": self.visible, "xid_error": self.xid_error}


def recheck(gpu_health: dict, reader: GpuReader | None = None) -> Recheck:
    """The GPUs the next attempt gets, from a fresh reading; exclusion.refused says why it cannot start."""
    doc = parse_report(report(ProbeRequest(gpus=True, xid=True), None, None, reader))
    pool = tuple(int(g) for g in gpu_health.get("pool") or () if isinstance(g, int))
    ex = decide(pool, report_findings(doc), need=int(gpu_health.get("need") or 1),
                fixed=bool(gpu_health.get("fixed")))
    user = gpu_health.get("visible")
    visible = ex.visible() if ex.left_out and not ex.refused else (str(user) if user is not None else None)
    xid_error = None
    if doc.xid is not None and doc.xid.source is None:
        xid_error = doc.xid.error or "the kernel log could not be read"
    return Recheck(ex, visible, xid_error)


def recheck_within(gpu_health: dict, wait_s: float) -> Recheck | str:
    """recheck() given at most wait_s, or why not (one line). It reads in a thread with a reader of its own; past
    wait_s that reader's nvidia-smi is killed then and there, not at its own SMI_TIMEOUT_S (longer, so that the wait
    decides): the sentinel exits right after, and an orphaned nvidia-smi hung after an Xid 79 would outlive the run.
    (A hung NVML call cannot be ended: its thread is a daemon and ends with the sentinel.)"""
    reader = GpuReader()
    got: list = []

    def check_now() -> None:
        try:
            got.append(recheck(gpu_health, reader))
        except Exception as e:  # noqa: BLE001 - a broken reading must not cost the restart
            got.append(f"{type(e).__name__}: {e}")

    t = threading.Thread(target=check_now, daemon=True, name="gpu-recheck")
    t.start()
    t.join(wait_s)
    if not got:
        reader.smi.cut(0)
        return f"no answer within {wait_s:g} s"
    reader.close()
    return got[0]


def refusal_message(attempt: int, check: Recheck) -> str:
    ex = check.exclusion
    return (f"attempt {attempt} not started: {ex.refused}"
            + (f" (kernel log not readable here: {check.xid_error})" if check.xid_error else ""))
