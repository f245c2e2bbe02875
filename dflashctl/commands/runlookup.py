"""What every run verb shares: a run's recorded state as one record, and its process verdict.

The verdict here comes from process state only (pid alive / exit_code / stopped marker), which is
what `runs`, `stop` and `launch` need; `status` judges more (logs, heartbeat, GPUs) in analysis/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from dflashctl.analysis.events import read_events
from dflashctl.analysis.verdict import ProcessState, process_verdict
from dflashctl.analysis.watcher import stopped_why
from dflashctl.model import Verdict
from dflashctl.report import RunRecord


@dataclass(frozen=True)
class RunInfo(RunRecord):
    """The probe's record of a run, with what the verbs derive from it: its last step, kind and verdict."""

    last_step: int | None = None  # from the log's tail (any trainer's format), else the heartbeat

    @property
    def is_job(self) -> bool:
        """An evaluation or a data generation: it logs no training steps (exec and adopted runs train)."""
        return self.meta.is_job

    @property
    def kind(self) -> str:
        """"train"; "eval" / "generate" for `dflashctl eval` / `generate` runs; "exec", "adopted" (meta.json)."""
        return self.meta.kind

    @property
    def started_at(self) -> float | None:
        return self.meta.started_at_epoch

    @property
    def process(self) -> ProcessState:
        """The run's process as the verdict rules read it (the same record `status` judges)."""
        return ProcessState(alive=self.alive, exit_code=self.exit_code, stopped=self.stopped,
                            stopped_why=stopped_why(self), started_at=self.started_at, ending=self.ending,
                            job=self.kind if self.is_job else None, survivors=self.survivors)

    def verdict(self, now: float | None = None) -> Verdict:
        """From process state alone: the one rule of analysis/verdict.py."""
        return process_verdict(self.process, stepped=self.last_step is not None, pid_known=self.pid is not None,
                               now=now)

    def to_record(self, *, verdict: str | None = None, now: float | None = None, last_step: int | None = None,
                  last_event: dict[str, Any] | None = None) -> dict[str, Any]:
        """The one shape of a run (report.RunRecord.to_record), judged from process state, with its last step and
        its sentinel's last event."""
        return super().to_record(verdict=verdict or str(self.verdict(now)), now=now,
                                 last_step=self.last_step if last_step is None else last_step,
                                 last_event=self.last_event if last_event is None else last_event)

    @property
    def last_event(self) -> dict[str, Any] | None:
        """The newest record of the run's sentinel (events.jsonl), from the tail the probe sent with --runs."""
        found = read_events(self.events_tail) if self.events_tail else []  # a line the tail cut is skipped
        return found[-1].to_record() if found else None

    @property
    def attempt(self) -> int | None:
        """Which attempt of a launch with --restart-on this run is (None: a launch without restarts)."""
        return self.meta.attempt

    @property
    def attempt_label(self) -> str:
        return self.meta.attempt_label


def run_from_probe(rec: RunRecord, progress_regex: re.Pattern[str] | None = None) -> RunInfo:
    """The run as the verbs read it, from the probe's record (its last step from the log's tail when sent, else the
    heartbeat's)."""
    hb = rec.heartbeat
    step = _last_step(rec.log_tail, progress_regex)
    if step is None and hb is not None and isinstance(hb.get("step"), int):
        step = hb["step"]
    return RunInfo(**{f.name: getattr(rec, f.name) for f in fields(rec)}, last_step=step)


def _last_step(tail: bytes, progress_regex: re.Pattern[str] | None) -> int | None:
    """The last training step in a log's tail, by the engine status and diagnose use (any trainer's format)."""
    if not tail:
        return None
    from dflashctl.analysis.logscan import scan

    point = scan(tail, progress_regex).last_step_point
    return int(point.values["step"]) if point is not None else None


def runs_dir(workspace: str) -> str:
    return f"{workspace.rstrip('/')}/runs"
