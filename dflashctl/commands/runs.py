"""runs: every run directory of a host with its process verdict, newest first."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dflashctl.analysis.judging import progress_pattern
from dflashctl.commands.runlookup import RunInfo, run_from_probe
from dflashctl.remote import probe
from dflashctl.remote.target import Target
from dflashctl.report import ProbeReport


@dataclass
class RunList:
    host: str
    workspace: str
    runs: list[RunInfo]
    latest: str | None
    now: float  # the container's clock, for durations

    def to_record(self) -> dict[str, Any]:
        """`runs --json`: each run in the one shape of a run (RunInfo.to_record), durations against the container's
        clock."""
        return {"host": self.host, "workspace": self.workspace, "latest": self.latest,
                "runs": [r.to_record(now=self.now) for r in self.runs]}


def list_runs(target: Target) -> RunList:
    doc = probe.probe_once(target, target.host.workspace, "latest", runs=True, gpus=False, log_max=0,
                           require_run=False)
    regex = progress_pattern(target.host.judge)
    runs = [run_from_probe(r, regex) for r in doc.runs]
    latest = doc.run.id if doc.run else None
    return RunList(target.host.name, target.host.workspace, runs, latest, doc.time or time.time())


def get_run(target: Target, run: str | None, *, log_offset: int | None = None, log_max: int = 0,
            gpus: bool = False, events: bool = False) -> tuple[RunInfo, ProbeReport]:
    """One run (None or "latest": the newest) with the probe's report; NotFound (102) if absent."""
    doc = probe.probe_once(target, target.host.workspace, run or "latest", log_offset=log_offset, log_max=log_max,
                           gpus=gpus, events=events)
    assert doc.run is not None  # probe_once raised NotFound otherwise
    return run_from_probe(doc.run), doc
