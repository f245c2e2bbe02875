"""Watching a launched run: wait() until it started / printed its first training step / ended, the bounded log it
keeps, and the one report of a run that died before it got there (failure(), LaunchFailed, exit 100).

Split out of launch.py: confirm() (launch's alive window) and wait() (the CLI's --wait-for, eval, generate) report an
early death with the same failure(), so the report lives here, next to the watching, and launch.py re-exports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from dflashctl.analysis.progress import is_training_step
from dflashctl.analysis.verdict import EndWatch
from dflashctl.analysis.watcher import RUN_GONE, gone_text
from dflashctl.commands.runlookup import RunInfo, run_from_probe
from dflashctl.errors import DflashError, ExitCode, NotFound
from dflashctl.remote import probe
from dflashctl.remote.target import Target
from dflashctl.report import RunRecord

WaitFor = Literal["started", "step", "exit"]
HEAD_LINES = 20
ERROR_LINES = 40


class LaunchFailed(DflashError):
    """The run did not stay up (exit 100); `log_head` holds the first lines of its log."""

    exit_code = ExitCode.CRASHED

    def __init__(self, message: str, *, hint: str | None = None, log_head: str = "", run_id: str | None = None,
                 exit_code: int | None = None):
        super().__init__(message, hint=hint)
        self.log_head = log_head
        self.run_id = run_id
        self.run_exit_code = exit_code  # the run's own exit code (the CLI's is always 100)

    def to_record(self, host: str) -> dict[str, Any]:
        """The --json document of a failed launch (the host is the caller's: the error does not carry it)."""
        return {"host": host, "run_id": self.run_id, "launched": False, "error": self.message,
                "exit_code": self.run_exit_code, "log_head": self.log_head}


class LogKeeper:
    """The log of a run being watched, kept bounded: its first KEEP bytes and its last KEEP bytes — what the
    report of a failed run shows (the first lines, and the error lines at the end)."""

    KEEP = 64 << 10

    def __init__(self) -> None:
        self.head = b""
        self.tail = b""
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.KEEP - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail = (self.tail + data)[-self.KEEP:]

    @property
    def text(self) -> bytes:
        """head and tail joined; a gap between them is marked by a line of its own."""
        if not self.tail:
            return self.head
        gap = self.total - len(self.head) - len(self.tail)
        joint = b"\n[... %d bytes ...]\n" % gap if gap > 0 else b""
        return self.head + joint + self.tail


def failure(run_id: str, info: RunInfo, log: bytes) -> LaunchFailed:
    """The one report of a run that died before the command got what it waited for (issue 10): the same text,
    exit code and JSON whether it died inside confirm()'s alive window or just after it, while wait() watched.
    It says how the run ended, never how long that took, so no part of it depends on the machine's speed."""
    why = (f"exited with code {info.exit_code}" if info.exit_code is not None
           else "was stopped" if info.stopped
           else "exited (its supervisor is still stopping leftovers of its process group)" if info.ending
           else "ended without an exit code (killed, or its supervisor died)" if info.pid is not None
           else "never started")
    return LaunchFailed(f"run {run_id} {why}", log_head=log_excerpt(log), run_id=run_id, exit_code=info.exit_code,
                        hint=f"whole log: dflashctl logs {run_id}")


def log_excerpt(log: bytes) -> str:
    """The first HEAD_LINES lines, and, where the log goes on past them, its last traceback or exception line
    (the error lines a person scrolls down for)."""
    from dflashctl.analysis.logscan import scan

    lines = log.decode("utf-8", "replace").splitlines()
    out = lines[:HEAD_LINES]
    if len(lines) <= HEAD_LINES:
        return "\n".join(out)
    report = scan(log)
    last = next((tb for tb in reversed(report.tracebacks) if not tb.ignored), None)
    if last is None or last.last_line <= HEAD_LINES:
        return "\n".join(out + (["…"] if len(lines) > HEAD_LINES else []))
    first = max(last.first_line, HEAD_LINES + 1, last.last_line - ERROR_LINES + 1)
    skipped = first - HEAD_LINES - 1
    return "\n".join(out + ([f"… ({skipped} lines) …"] if skipped else []) + lines[first - 1:last.last_line])


@dataclass
class WaitResult:
    reached: bool
    run: RunInfo
    line: str | None  # the first training step line seen (what --wait-for step waits for)
    waited_s: float
    log: LogKeeper = field(default_factory=LogKeeper)
    waited_for: WaitFor = "exit"

    @property
    def exit_code(self) -> int:
        """DESIGN §5: 0 reached (or finished), 100 crashed/lost, 103 stopped, 101 timed out."""
        if self.reached:
            return int(self.run.verdict().exit_code) if not self.run.alive else 0
        if self.run.alive:
            return int(ExitCode.NOT_FINISHED)
        return int(self.run.verdict().exit_code)

    def died_early(self, ok_codes: tuple[int, ...] = (0,)) -> bool:
        """It ended in failure before its first training step (or, for a job that logs no steps, at all): the
        program died at once, as far as the person waiting can tell — the case failure() reports."""
        run = self.run
        if run.alive or run.stopped or self.line is not None:
            return False
        return run.exit_code not in ok_codes

    def failure(self) -> LaunchFailed:
        return failure(self.run.id, self.run, self.log.text)

    def to_record(self, *, job: bool = False) -> dict[str, Any]:
        """The `wait` record of --json: launch's names what it waited for and the step line; a job's (eval,
        generate: always the end, no step line) leaves both out."""
        rec: dict[str, Any] = {} if job else {"for": self.waited_for}
        rec.update(reached=self.reached, verdict=str(self.run.verdict()), exit_code=self.run.exit_code)
        if not job:
            rec["line"] = self.line
        rec["waited_s"] = round(self.waited_s, 1)
        return rec


NEXT_ATTEMPT_WAIT_S = 30.0  # the supervisor starts the next attempt right after it records the exit code


def next_attempt(target: Target, run: RunRecord) -> str | None:
    """The id of the attempt that follows `run` (its sentinel asked for one), once `latest` names it; None if none
    comes within NEXT_ATTEMPT_WAIT_S."""
    deadline = time.monotonic() + NEXT_ATTEMPT_WAIT_S
    while time.monotonic() < deadline:
        doc = probe.probe_once(target, target.host.workspace, "latest", gpus=False, log_max=0, require_run=False)
        if doc.run is not None and doc.run.id != run.id and doc.run.meta.restart_of == run.id:
            return doc.run.id
        time.sleep(0.25)
    return None


def wait(target: Target, run_id: str, what: WaitFor, timeout_s: float | None,
         on_log: Callable[[bytes], None] | None = None) -> WaitResult:
    """Block until the run has started / printed its first step / ended, or it died, or timeout. The log is
    kept (bounded) so that a run that died early is reported by failure(), exactly as confirm() reports it."""
    start = time.monotonic()
    pending = b""
    first_step: str | None = None
    log = LogKeeper()
    end = EndWatch()  # dead with no exit code: ended (lost) only after the grace
    stream = probe.probe_stream(target, target.host.workspace, run_id, 0, 0.5, gpus=False)
    info: RunInfo | None = None

    def result(reached: bool) -> WaitResult:
        assert info is not None
        return WaitResult(reached, info, first_step, time.monotonic() - start, log, what)

    try:
        while True:
            for doc in stream:
                if doc.run is None:  # the stream is for one named run: its directory was deleted meanwhile
                    raise NotFound(gone_text(RUN_GONE, target.host.name, run_id),
                                   hint="list what is left with `dflashctl runs`")
                info = run_from_probe(doc.run)
                data = doc.log_data
                if on_log and data:
                    on_log(data)
                log.add(data)
                if first_step is None:  # one scan per line until the first training step, then no more
                    pending += data
                    lines = pending.split(b"\n")
                    pending = lines.pop()[-(1 << 20):]
                    first_step = next((t.strip() for t in (raw.decode("utf-8", "replace") for raw in lines)
                                       if is_training_step(t)), None)
                    if first_step is not None and what == "step":
                        return result(True)
                drained = doc.log_drained
                ended = info.pid is not None and end.see(info.process, doc.time or time.time()) == "ended"
                if what == "started" and info.alive and not info.ending:
                    return result(True)
                if ended and drained:
                    break
                if timeout_s is not None and time.monotonic() - start > timeout_s:
                    return result(False)
            else:
                return result(False)
            nxt = next_attempt(target, info) if info.restart else None
            if nxt is None:
                return result(what == "exit")
            stream.close()  # the chain goes on: wait on the next attempt (--restart-on)
            end, pending = EndWatch(), b""
            stream = probe.probe_stream(target, target.host.workspace, nxt, 0, 0.5, gpus=False)
    finally:
        stream.close()
