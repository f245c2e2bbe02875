"""stop: end one run's whole process tree (SIGTERM, grace, SIGKILL) and record that the user did.

The tree is found again in the container at stop time (agent/reaper.py end_tree): the trainer or adopted process,
what adopt recorded, everything below them by parent links and everything carrying the run's marker, each pid's
start time checked right before each signal, so a reused pid is never signalled. The signal goes first; the
`stopped` marker and `exit_code` are best effort (a full disk): what could not be written is reported in
`unwritten`. A process of the tree still alive afterwards is a survivor, named with its pid: the run is not STOPPED
then."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dflashctl.analysis.gpus import memory_by_index
from dflashctl.commands.runs import get_run
from dflashctl.errors import DflashError, ExitCode
from dflashctl.model import GpuReport
from dflashctl.remote import agentcall
from dflashctl.remote.target import Target


@dataclass
class StopResult:
    run_id: str
    pid: int
    exit_code: int
    escalated: bool  # SIGKILL was needed after the grace period
    recorded_by: str  # "supervisor" (normal) or "stop" (the supervisor was gone)
    gpu_released_mib: dict[int, float] | None  # per GPU index, where GPUs exist
    members: list[dict[str, Any]] = field(default_factory=list)  # {pid, cmdline, outcome}: the tree it ended
    survivors: list[dict[str, Any]] = field(default_factory=list)  # {pid, cmdline}: alive after SIGKILL
    unwritten: list[str] = field(default_factory=list)  # "stopped: No space left on device": records not written
    cache_removed: list[str] = field(default_factory=list)  # half-written compile-cache artefacts removed

    @property
    def disk_full(self) -> bool:
        return any("No space left" in u or "quota" in u.lower() for u in self.unwritten)

    def to_record(self) -> dict[str, Any]:
        """`stop --json`."""
        return {"run": self.run_id, "pid": self.pid, "exit_code": self.exit_code, "escalated": self.escalated,
                "recorded_by": self.recorded_by, "gpu_released_mib": self.gpu_released_mib,
                "members": self.members, "survivors": self.survivors, "unwritten": self.unwritten,
                "disk_full": self.disk_full, "cache_removed": self.cache_removed}


ENDING_WAIT_S = 15.0  # the supervisor's grace + kill wait for leftovers of the group, with margin


class NotRunning(DflashError):
    exit_code = ExitCode.USAGE


def stop(target: Target, run: str | None, *, grace_s: float = 30.0) -> StopResult:
    info, before = get_run(target, run, gpus=True)
    deadline = time.monotonic() + ENDING_WAIT_S
    while info.ending and not info.survivors and time.monotonic() < deadline:  # ending by itself: see how it ends
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
    res = agentcall.call(target, "stop", spec, timeout=grace_s + 60)
    if res.get("outcome") != "stopped":
        if identity is not None:
            why = ("its pid now names another process, which is left alone" if res.get("changed")
                   else "it is gone")
            raise NotRunning(f"run {info.id} ended before it could be stopped ({why})")
        raise NotRunning(f"run {info.id} ended before it could be stopped (exit code {res.get('exit_code')})")
    _, after = get_run(target, info.id, gpus=True)
    return StopResult(info.id, int(res.get("pid") or 0), int(res["exit_code"]), bool(res.get("escalated")),
                      str(res.get("recorded_by")), _gpu_delta(before.gpus, after.gpus),
                      members=list(res.get("members") or []), survivors=list(res.get("survivors") or []),
                      unwritten=[str(u) for u in res.get("unwritten") or []],
                      cache_removed=[str(p) for p in res.get("cache_removed") or []])


def _gpu_delta(before: GpuReport | None, after: GpuReport | None) -> dict[int, float] | None:
    b, a = memory_by_index(before), memory_by_index(after)
    if not b or not a:
        return None
    return {i: round(b[i] - a.get(i, b[i]), 1) for i in sorted(b)}
