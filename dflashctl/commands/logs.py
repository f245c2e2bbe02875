"""logs: the run's train.log: its tail, a live follow, or only the crashed threads' tracebacks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dflashctl.analysis import logscan
from dflashctl.analysis.judging import progress_pattern
from dflashctl.analysis.safe_names import safe_name
from dflashctl.analysis.verdict import EndWatch
from dflashctl.analysis.watcher import RUN_GONE, gone_text
from dflashctl.analysis.workers import WorkerFailure
from dflashctl.commands.runlookup import RunInfo, run_from_probe
from dflashctl.commands.runs import get_run
from dflashctl.errors import NotFound
from dflashctl.remote import probe
from dflashctl.remote.target import Target
from dflashctl.report import ProbeReport

TAIL_BYTES_PER_LINE = 512
# The run's supervisor writes exit_code only after reaping the trainer's group (up to the launcher's
# GROUP_GRACE_S of 5 s): a dead trainer without one yet is still ending, not lost, for this long.
ERRORS_MAX_BYTES = 64 << 20  # --errors reads at most this much of the log's end


@dataclass
class LogTail:
    run: RunInfo
    text: str
    truncated: bool  # the log has more before `text`
    next_offset: int = 0  # where a follow continues

    def to_record(self) -> dict[str, Any]:
        """`logs --json`."""
        return {"run": self.run.id, "path": self.run.log_path, "text": self.text, "truncated": self.truncated}


@dataclass
class Timeline:
    run: RunInfo
    events: list[dict[str, Any]]

    def to_record(self) -> dict[str, Any]:
        """`logs --events --json`."""
        return {"run": self.run.id, "path": f"{self.run.dir}/events.jsonl", "events": self.events}


def _get_run(target: Target, run: str | None, **kw: Any) -> tuple[RunInfo, ProbeReport]:
    """get_run, the run id the container reports checked before it is shown or asked for again."""
    info, doc = get_run(target, run, **kw)
    safe_name(info.id, "run id", target.host.name)
    return info, doc


def gone(host: str, run_id: str) -> NotFound:
    """A run whose directory disappeared while it was followed or watched (exit 102, as an unknown run)."""
    return NotFound(gone_text(RUN_GONE, host, run_id), hint="list what is left with `dflashctl runs`")


def events(target: Target, run: str | None) -> Timeline:
    """The run's sentinel's events (events.jsonl), read with sentinel/events.py."""
    from dflashctl.analysis.events import read_events

    info, doc = _get_run(target, run, events=True)
    return Timeline(info, [e.to_record() for e in read_events(doc.events_data or b"")])


def tail(target: Target, run: str | None, lines: int = 50) -> LogTail:
    want = max(64 << 10, lines * TAIL_BYTES_PER_LINE)
    info, doc = _get_run(target, run, log_max=want)
    log = doc.log
    text = doc.log_data.decode("utf-8", "replace")
    kept = text.splitlines()[-lines:] if lines > 0 else text.splitlines()
    truncated = bool(log and log.offset) or len(kept) < len(text.splitlines())
    body = "\n".join(kept) + ("\n" if kept and text.endswith("\n") else "")
    return LogTail(info, body, truncated, log.next_offset if log else 0)


@dataclass
class FollowEvent:
    data: bytes  # new log bytes (may be empty)
    run: RunInfo
    rotated: bool = False


def follow(target: Target, run: str | None, *, from_start: bool = False, lines: int = 10,
           interval: float = 0.5) -> Iterator[FollowEvent]:
    """The log as it grows, from one long-running probe; ends once the run has ended and its log
    is drained. Closing the iterator (Ctrl-C) stops only the probe, never the run."""
    if from_start:
        info, _ = _get_run(target, run)
        offset = 0
    else:
        first = tail(target, run, lines)
        info = first.run
        yield FollowEvent(first.text.encode(), info)
        offset = first.next_offset
    stream = probe.probe_stream(target, target.host.workspace, info.id, offset, interval, gpus=False)
    end = EndWatch()  # a trainer gone without an exit code is lost only after the grace
    try:
        for doc in stream:
            if doc.run is None:
                raise gone(target.host.name, info.id)
            info = run_from_probe(doc.run)
            yield FollowEvent(doc.log_data, info, bool(doc.log and doc.log.rotated))
            if not doc.log_drained or info.pid is None:  # the grace counts from a drained log
                end.gone_since = None
                continue
            # an adopted run has no supervisor of ours to record its end; nobody wrote an exit code: lost
            if end.see(info.process, doc.time or 0.0, supervised=info.kind != "adopted") == "ended":
                return
    finally:
        stream.close()


@dataclass
class ErrorsView:
    run: RunInfo
    tracebacks: list[logscan.Traceback]
    error_files: dict[str, dict] = field(default_factory=dict)  # errors/<thread>.json written by the trainer
    final_exception: str | None = None
    scanned_from: int = 0  # byte offset where the scan began (0: the whole log)
    workers: dict[str, WorkerFailure] = field(default_factory=dict)  # ranks a launcher reported failed
    root_cause: str | None = None

    @property
    def files_only(self) -> dict[str, dict]:
        """errors/<thread>.json of threads whose traceback is not in the log (shown from the file instead)."""
        in_log = {tb.thread for tb in self.tracebacks}
        return {k: d for k, d in self.error_files.items() if k not in in_log}

    def to_record(self) -> dict[str, Any]:
        """`logs --errors --json`: whole tracebacks, the ranks a launcher reported, the trainer's error files."""
        return {"run": self.run.id, "final_exception": self.final_exception,
                "tracebacks": [{"thread": tb.thread, "rank": tb.rank, "first_line": tb.first_line,
                                "last_line": tb.last_line, "exception": tb.exc_line, "text": tb.text}
                               for tb in self.tracebacks],
                "workers": [{"name": f.name, "line": f.line, "exit_code": f.exit_code, "how": f.how}
                            for f in self.workers.values()],
                "root_cause": self.root_cause, "error_files": self.error_files}


def errors(target: Target, run: str | None) -> ErrorsView:
    """Whole tracebacks of crashed threads and ranks, launcher-reported rank failures and the final exception,
    never just the header line."""
    info, doc = _get_run(target, run, log_max=ERRORS_MAX_BYTES)
    report = logscan.scan(doc.log_data, progress_pattern(target.host.judge))
    tbs = [tb for tb in report.tracebacks if not tb.ignored]
    order = report.crashed_workers()
    return ErrorsView(info, tbs, info.errors, report.final_exception, doc.log.offset if doc.log else 0,
                      report.workers, report.root_cause or (order[0][1] if order else None))
