"""Progress lines, as the scanner takes them in: found in bulk, committed in line order, judged by their loss.

In the ordinary stretches between special lines only the latest progress points can reach the report: they are
found backwards with rfind. Every call's points then go in in line order; a NaN loss or a run of zeros is a
signature hit, and a later finite (non-zero) loss says an earlier one recovered.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from dflashctl.analysis import signatures
from dflashctl.analysis.progress import PROGRESS_TOKENS, parse_progress
from dflashctl.analysis.rawlines import clean
from dflashctl.analysis.tracebacks import END_RE, event_line
from dflashctl.model import ProgressPoint, SignatureHit

if TYPE_CHECKING:
    from collections import deque

    from dflashctl.analysis.tracebacks import Event

_PROGRESS_TOKENS = tuple(t.encode() for t in PROGRESS_TOKENS)
_WINDOW = 1 << 16  # bytes below a stretch's end first looked at for its latest progress lines (~1000 lines of ours)


class ProgressLines:
    """LogScanner's progress half (a mixin): the state is set by LogScanner.reset()."""

    progress_regex: re.Pattern[str] | None
    progress: deque[ProgressPoint]
    _batch: list[tuple[ProgressPoint, str | None]]  # points found by the current feed(), any order
    _out: list[Event]
    end: tuple[str, int] | None
    last_finite_loss_line: int | None
    last_nonzero_loss_line: int | None
    _zero_run: int
    _nan_open: set[str]  # grad_norm / an epoch's mean loss whose latest value was NaN: only its own finite value heals

    def _hit(self, hit: SignatureHit) -> None:
        """Keep a signature hit (LogScanner's bookkeeping)."""
        raise NotImplementedError

    def _bulk_progress(self, buf: bytes, start: int, stop: int, last_line: int, budget: int) -> int:
        """Progress in a stretch of ordinary lines [start, stop): the latest `budget` points, found backwards
        with rfind (C speed). Nothing older could matter: the report keeps the latest points, and a NaN
        loss followed by finite ones is history. Returns how many it found."""
        found = 0
        hi, line_no = stop, last_line  # hi: end of the region still to look at; line_no: its last line
        # each token's latest occurrence in [lo, hi), or -1: none starts there. The tokens are looked for above lo
        # only, a floor that goes down (doubling the span) only once none is left above it: the latest `budget`
        # lines are near the stretch's end, and a token the log never prints (most of them) then costs one pass
        # over that much, not over the whole stretch (a one-shot status scans a 1 MiB tail)
        lo = max(start, stop - _WINDOW)
        last_at = {t: buf.rfind(t, lo, hi) for t in _PROGRESS_TOKENS}
        while found < budget:
            for t, a in last_at.items():
                if a >= hi:  # that occurrence is in a line already looked at: find the one before it
                    last_at[t] = buf.rfind(t, lo, hi)
            at = max(last_at.values())
            if at < 0:  # none starts in [lo, hi): each token's latest starts below lo (and ends by hi)
                if lo <= start:
                    break
                lo, floor = max(start, lo - (stop - lo)), lo
                for t in last_at:
                    last_at[t] = buf.rfind(t, lo, min(hi, floor + len(t) - 1))
                continue
            ls = buf.rfind(b"\n", start, at) + 1 or start
            le = buf.find(b"\n", at, hi)
            line_no -= buf.count(b"\n", le + 1, hi) if le >= 0 else 0
            text = clean(buf[max(ls, start):le if le >= 0 else hi])
            self._end_marker(text, line_no)
            p = parse_progress(text.rsplit("\r", 1)[-1], line_no, self.progress_regex)
            if p is not None:
                found += 1
                self._progress(p, None)
            hi, line_no = max(ls, start), line_no - 1
            if hi <= start:
                break
        return found

    def _end_marker(self, t: str, n: int) -> None:
        m = END_RE.match(t)
        if m and (self.end is None or self.end[1] < n):
            self.end = (m.group(1), n)

    def _progress(self, p: ProgressPoint, text: str | None) -> None:
        self._batch.append((p, text))

    def _commit(self) -> None:
        """Progress found in this call goes in, in line order (the fast path finds it newest first)."""
        self._batch.sort(key=lambda pt: pt[0].line)
        merge = bool(self._out)  # only progress (a healthy stretch): already in line order
        for p, text in self._batch:
            self.progress.append(p)
            self._out.append(p)
            loss, norm = p.values.get("loss"), p.values.get("grad_norm")
            mean = p.values.get("loss_mean")
            for key, v in (("grad_norm", norm), ("loss_mean", mean)):
                if v is not None:
                    (self._nan_open.discard if math.isfinite(v) else self._nan_open.add)(key)
            if loss is not None and math.isfinite(loss) and not self._nan_open:
                self.last_finite_loss_line = p.line
            if any(v is not None and not math.isfinite(v) for v in (loss, norm, mean)):
                for rule in signatures.LOSS_RULES:
                    self._hit(SignatureHit(rule.signature, p.line, _evidence(p, text)))
            if loss is not None and p.kind == "train":
                if loss == 0.0:
                    self._zero_run += 1
                    if self._zero_run == signatures.ZERO_RUN:
                        for rule in signatures.ZERO_LOSS_RULES:
                            self._hit(SignatureHit(rule.signature, p.line, _evidence(p, text)))
                elif math.isfinite(loss):
                    self._zero_run = 0
                    self.last_nonzero_loss_line = p.line
        self._batch = []
        if merge:
            self._out.sort(key=event_line)


def _evidence(p: ProgressPoint, text: str | None) -> str:
    """A hit's evidence line: the line as read, or (found in bulk, not kept) the values it gave. Made only for a
    hit: a one-shot status commits a thousand points and hits none."""
    line = text if text is not None else " ".join(f"{k}={v:g}" for k, v in p.values.items())
    return line.strip()[:500]
