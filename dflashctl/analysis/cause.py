"""The cause of a failure, said first (issue 28): which known failure, what to do, which worker failed first, and the
last lines of its traceback. `status`, `diagnose` and the sentinel's notifications all start with these lines, so a
person reads why before the tables (and a phone shows it before the rest is cut off).

Pure: built from a Health (status, diagnose) or from the fields a notification carries (the sentinel, stdlib only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dflashctl.analysis.health import Health
    from dflashctl.model import SignatureHit, ThreadState

TAIL_LINES = 4  # traceback lines shown: the innermost frame and the exception line, the usual two frames above it
TAIL_WIDTH = 200  # a line longer than this is cut (a message with a tensor dump)


@dataclass(frozen=True)
class Cause:
    """What failed and what to do about it, as far as the log says."""

    signature: str | None  # the signature id (docs/failures.md); None: no known failure, only a crash
    summary: str | None
    remedy: str | None
    worker: str | None  # the thread or rank that failed (the first to fail, when several did)
    first: bool  # the worker is the first of several to fail (torchrun's root cause, the earliest crash)
    exception: str | None  # `RuntimeError: …`, the worker's or the run's final exception
    tail: tuple[str, ...] = ()  # the last lines of the worker's traceback

    def lines(self) -> list[str]:
        return cause_lines(self.signature, self.summary, self.remedy, self.worker, self.first, self.exception,
                           self.tail)


def tail_lines(traceback: str | None, n: int = TAIL_LINES) -> tuple[str, ...]:
    """The last n non-blank lines of a traceback, each cut to TAIL_WIDTH."""
    if not traceback:
        return ()
    lines = [ln.rstrip() for ln in traceback.splitlines() if ln.strip()]
    return tuple(ln if len(ln) <= TAIL_WIDTH else ln[: TAIL_WIDTH - 1] + "…" for ln in lines[-n:])


def cause_lines(signature: str | None, summary: str | None, remedy: str | None, worker: str | None, first: bool,
                exception: str | None, tail: Sequence[str]) -> list[str]:
    """The cause as plain lines, the same for a terminal and a notification: `cause: <id> — <summary>`, `in: <worker>`,
    the traceback's tail, `what to do: <remedy>`. Empty when there is nothing to say."""
    out: list[str] = []
    if signature:
        out.append(f"cause: {signature}" + (f" — {summary}" if summary else ""))
    elif exception or worker:
        out.append(f"cause: {exception or 'crash'} (no known failure signature)")
    if worker:
        out.append(f"in: {worker}" + (" (the first to fail)" if first else ""))
    if tail:
        out += [f"  | {ln}" for ln in tail]
    elif exception and signature:
        out.append(f"  | {exception}")
    if remedy:
        out.append(f"what to do: {remedy}")
    return out


def _worker_of(health: Health) -> ThreadState | None:
    crashed = [t for t in health.threads if t.state == "crashed"]
    if health.root_cause is not None:
        return next((t for t in crashed if t.name == health.root_cause), None)
    return crashed[0] if crashed else None


def _hit_of(hits: Sequence[SignatureHit], worker: ThreadState | None) -> SignatureHit | None:
    """The hit the worker's own traceback is evidence of, else the first active hit."""
    if worker is not None and worker.traceback:
        own = {ln.strip()[:500] for ln in worker.traceback.splitlines()}
        mine = next((h for h in hits if h.text in own), None)
        if mine is not None:
            return mine
    return hits[0] if hits else None


def cause_of(health: Health) -> Cause | None:
    """The cause of a run's trouble; None while it has none to show (no signature hit, no crashed worker, no final
    exception)."""
    worker = _worker_of(health)
    hit = _hit_of(health.hits, worker)
    if hit is None and worker is None and not health.final_exception:
        return None
    exception = None
    if worker is not None and worker.exception:
        exception = worker.exception + (f": {worker.message.splitlines()[0][:160]}" if worker.message else "")
    elif health.final_exception:
        exception = health.final_exception
    crashed = sum(1 for t in health.threads if t.state == "crashed")
    sig = hit.signature if hit is not None else None
    tail = tail_lines(worker.traceback if worker is not None else None)
    if not tail and hit is not None:
        tail = (f"log line {hit.line}: {hit.text[:TAIL_WIDTH]}",)
    return Cause(
        signature=sig.id if sig else None, summary=sig.summary if sig else None, remedy=sig.remedy if sig else None,
        worker=worker.name if worker is not None else None, first=worker is not None and crashed > 1,
        exception=exception, tail=tail,
    )
