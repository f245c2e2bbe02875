"""stop: end one run (SIGTERM to its process group, grace, SIGKILL) and record that the user did.

An adopted run (`dflashctl adopt`) is stopped the same way, its process's identity (pid + start time + argv)
checked again in the container right before each signal: a pid reused since the adopt is never signalled."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dflashctl.analysis.gpus import memory_by_index
from dflashctl.commands.runs import get_run
from dflashctl.errors import DflashError, ExitCode
from dflashctl.model import GpuReport
from dflashctl.remote import scripts
from dflashctl.remote.target import Target


@dataclass
class StopResult:
    run_id: str
    pid: int
    exit_code: int
    escalated: bool  # SIGKILL was needed after the grace period
    recorded_by: str  # "supervisor" (normal) or "stop" (the supervisor was gone)
    gpu_released_mib: dict[int, float] | None  # per GPU index, where GPUs exist

    def to_record(self) -> dict[str, Any]:
        """`stop --json`."""
        return {"run": self.run_id, "pid": self.pid, "exit_code": self.exit_code, "escalated": self.escalated,
                "recorded_by": self.recorded_by, "gpu_released_mib": self.gpu_released_mib}


ENDING_WAIT_S = 15.0  # the supervisor's grace + kill wait for leftovers of the group, with margin


class NotRunning(DflashError):
    exit_code = ExitCode.USAGE


def stop(target: Target, run: str | None, *, grace_s: float = 30.0) -> StopResult:
    info, before = get_run(target, run, gpus=True)
    deadline = time.monotonic() + ENDING_WAIT_S
    while info.ending and time.monotonic() < deadline:  # already ending by itself: report how it ended
        time.sleep(0.25)
        info, before = get_run(target, info.id, gpus=True)
    identity = info.meta.adopted_identity
    if not info.alive:
        if info.exit_code is None and identity is not None:
            state = "has ended (adopted: its exit code is unknown, it was not started by dflashctl)"
        elif info.exit_code is None:
            state = "is not running (no live process and no exit code: lost)"
        elif info.stopped:
            state = f"was already stopped (exit code {info.exit_code})"
        else:
            state = f"has already ended with exit code {info.exit_code}"
        raise NotRunning(f"run {info.id} {state}; nothing to stop",
                         hint="see `dflashctl runs` for what is running")
    spec = {"run_dir": info.dir, "run_id": info.id, "grace_s": grace_s, "identity": identity}
    res = scripts.call(target, "reaper", "stop", spec, timeout=grace_s + 60)
    if res.get("outcome") != "stopped":
        if identity is not None:
            why = ("its pid now names another process, which is left alone" if res.get("changed")
                   else "it is gone")
            raise NotRunning(f"run {info.id} ended before it could be stopped ({why})")
        raise NotRunning(f"run {info.id} ended before it could be stopped (exit code {res.get('exit_code')})")
    _, after = get_run(target, info.id, gpus=True)
    return StopResult(info.id, int(res["pid"]), int(res["exit_code"]), bool(res.get("escalated")),
                      str(res.get("recorded_by")), _gpu_delta(before.gpus, after.gpus))


def _gpu_delta(before: GpuReport | None, after: GpuReport | None) -> dict[int, float] | None:
    b, a = memory_by_index(before), memory_by_index(after)
    if not b or not a:
        return None
    return {i: round(b[i] - a.get(i, b[i]), 1) for i in sorted(b)}
