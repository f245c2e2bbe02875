"""What LogScanner hands out: the events of one feed() and the LogReport snapshot of the whole log so far."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflashctl.analysis.tracebacks import Traceback
from dflashctl.analysis.workers import WorkerFailure
from dflashctl.model import ProgressPoint, SignatureHit, ThreadState


@dataclass
class LogReport:
    """What a log said so far. Built by LogScanner.report(); lists are bounded (see logscan.KEEP_*)."""

    tracebacks: list[Traceback]
    progress: list[ProgressPoint]
    hits: list[SignatureHit]
    threads: dict[str, ThreadState]
    last_line_no: int
    bytes_scanned: int = 0
    last_finite_loss_line: int | None = None
    end: tuple[str, int] | None = None  # the trainer's `training finished|aborted|stopped` line, if any
    workers: dict[str, WorkerFailure] = field(default_factory=dict)  # ranks a launcher reported failed
    root_cause: str | None = None  # the worker a launcher named as the first observed failure
    last_nonzero_loss_line: int | None = None  # a later non-zero loss means an earlier run of 0.0 recovered

    @property
    def last_progress(self) -> ProgressPoint | None:
        """The last training step (evaluation lines are kept apart: see last_eval)."""
        return next((p for p in reversed(self.progress) if p.kind == "train"), None)

    @property
    def last_eval(self) -> ProgressPoint | None:
        """The last periodic evaluation (`eval step=N acc_len=…`): τ measured by real speculative decoding."""
        return next((p for p in reversed(self.progress) if p.kind == "eval"), None)

    @property
    def last_step_point(self) -> ProgressPoint | None:
        """The last training point that counted a step (a Hugging Face dict line between two bars counts none)."""
        return next((p for p in reversed(self.progress) if p.kind == "train" and "step" in p.values), None)

    @property
    def final_exception(self) -> str | None:
        """The exception type of the last exception the log printed, exactly as printed: a worker's (thread, rank)
        always; the main stream's only when training did not go on after it (then it was caught and survived)."""
        last = self.last_progress
        for tb in reversed(self.tracebacks):
            if not tb.exc_type or tb.ignored:
                continue
            if tb.thread is None and last is not None and last.line > tb.last_line:
                continue
            return tb.exc_type
        return None

    def crashed_workers(self) -> list[tuple[int, str]]:
        """(first line, name) of every crashed thread or rank, in the order they failed."""
        first: dict[str, int] = {}
        for tb in self.tracebacks:
            if tb.thread is not None and not tb.ignored:
                first.setdefault(tb.thread, tb.first_line)
        for name, f in self.workers.items():
            first[name] = min(first.get(name, f.line), f.line)
        return sorted((line, name) for name, line in first.items())
