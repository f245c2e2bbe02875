"""One signature rule: a stable id with its summary and remedy, and how it is recognised (signatures.py holds the
table; sigcompile.py the torch.compile family's rules)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflashctl.model import Signature


@dataclass(frozen=True)
class Rule:
    """How one signature is recognised.

    lines: regexes searched in every log line (ANSI stripped). exc_types: exception types (the last
    dotted component is compared, so `torch.OutOfMemoryError` and `torch.cuda.OutOfMemoryError` both
    match `OutOfMemoryError`). frames: substrings of a traceback's `File "…"` paths, used only for
    tracebacks of crashed worker threads (and of DataParallel replicas, which are threads too). sticky: still
    worth reporting after training made progress past it (a warning that costs speed, not a crash).

    Every line pattern must contain one of ANCHORS literally: the scanner looks only at lines holding an
    anchor (or inside a traceback), which is what lets it read gigabytes at near-grep speed. Anchors start
    with an upper-case letter or `_`, so the regex engine skips ordinary lower-case text cheaply (the scanner
    finds the few that cannot with bytes.find).
    """

    signature: Signature
    lines: tuple[str, ...] = ()
    exc_types: tuple[str, ...] = ()
    frames: tuple[str, ...] = ()
    sticky: bool = False
    progress_loss: bool = False  # also: a progress line whose loss or grad norm is NaN/inf (found by the scanner)
    progress_zero: bool = False  # also: consecutive progress lines whose loss is exactly 0.0 (found by the scanner)
    death: str | None = None  # also: a worker the launcher reports dead this way ("kill": signal 9, "segv": 11)
    exc_frames: tuple[str, ...] = ()  # exc_types count only for a traceback through one of these paths (any thread)
    supersedes: tuple[str, ...] = ()  # ids this one explains better: dropped from a report that holds this one
    examples: tuple[str, ...] = field(default=(), compare=False)  # real lines it must match (tested)


def sig(id_: str, summary: str, remedy: str) -> Signature:
    return Signature(id=id_, summary=summary, remedy=remedy)
