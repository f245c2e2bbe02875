"""Incremental log scanner: progress lines, whole tracebacks per thread, failure signatures.

`LogScanner.feed(bytes)` takes the log from where the last call stopped (line count, partial last line,
open traceback and pending thread headers are kept), so a 5 GB log is read once and then only its new
bytes. Most lines cannot matter and are never decoded: the next "special" line (one holding a literal
anchor, rawlines.py) is found at C speed, each anchor by a pivot byte (anchorfind.py: memchr, near grep);
every line is read only while a traceback is open; in the ordinary stretches between, only the latest
KEEP_PROGRESS progress lines are parsed (found backwards with rfind), since nothing older can reach the
report. So a first full scan is cheapest as ONE buffer: `feed_file(f)` maps the file and feeds it whole
(every feed() parses its own latest progress lines: 8 MB pieces of a 256 MB log cost ~40 % more than 64 MB);
a big one has its special lines found by GNU grep in a process of its own, which also numbers them, so the
pages of the ordinary stretches are never touched (grepfind.py; the pivot search where grep is missing).

API (stable; `logs --errors`, `runs`, `status`, `diagnose` use it): `LogScanner.feed(data) -> [Event]`,
`.feed_file(f) -> [Event]`, `.flush()` at end of input, `.reset()` on rotation, `.report() -> LogReport`;
`scan(data) -> LogReport`.

Real logs are messy, and this is written for them: `\\r` progress bars, ANSI colour, invalid UTF-8, a
truncated last line, rotation (`reset()`), and tracebacks of threads that crashed at the same moment,
whose lines (even half-lines) interleave in the file. Interleaved tracebacks are split apart by pairing
`Exception in thread NAME:` headers, in order, with the final exception lines.

The halves live beside it: tracebacks.py assembles a traceback, threadheaders.py puts cut headers back together,
progresslines.py takes progress in. They are mixins of LogScanner, not objects of their own, so the per-line path
stays plain method calls on one object (no extra call layer or attribute hop per line).
"""

from __future__ import annotations

import mmap
import re
from collections import deque
from typing import TYPE_CHECKING, BinaryIO

from dflashctl.analysis import lineprefix, signatures
from dflashctl.analysis.anchorfind import AnchorFinder
from dflashctl.analysis.logreport import LogReport
from dflashctl.analysis.progress import parse_progress
from dflashctl.analysis.progresslines import ProgressLines
from dflashctl.analysis.rawlines import NextSpecial, clean, next_special
from dflashctl.analysis.threadheaders import FRAG, HEADER_RE, HEADER_TTL, NAME_BEFORE_FRAME_RE, NAME_RE, Header
from dflashctl.analysis.tracebacks import (
    MAX_CONTINUATION,
    MAX_TB_LINES,
    TB_START,
    TERMINATE_RE,
    Event,
    OpenTraceback,
    Traceback,
    TracebackAssembly,
    bare_exception,
    copy_open,
)
from dflashctl.analysis.workers import WorkerTracker, signal_kind
from dflashctl.model import ProgressPoint, SignatureHit, ThreadState

if TYPE_CHECKING:
    from dflashctl.analysis.grepfind import GrepFinder  # a big mapped file's finder (rawlines.next_special)

__all__ = [  # the public names, importable from here as before the split
    "HEADER_TTL", "KEEP_HITS_PER_ID", "KEEP_PROGRESS", "KEEP_TRACEBACKS", "MAX_CONTINUATION", "MAX_LINE",
    "MAX_TB_LINES", "TB_START", "Event", "LogReport", "LogScanner", "Traceback", "scan",
]

READ_PIECE = 64 << 20  # feed_file's reads where the file cannot be mapped
MAX_LINE = 1 << 20  # a partial line longer than this (a \r progress bar with no \n) is processed anyway
KEEP_PROGRESS = 1024  # progress points kept (and, per stretch of ordinary lines, parsed: the latest)
KEEP_TRACEBACKS = 500
KEEP_HITS_PER_ID = 50

_IGNORED_RE = re.compile(r"^Exception ignored (?:in|on)\b")
_RANK_BEFORE_RE = re.compile(r"\[(?:rank|default)(\d+)\]:\s?$")  # `…bar…][rank3]: Traceback (most recent …`


class LogScanner(TracebackAssembly, ProgressLines):
    """Feed it log bytes in order; it keeps every bit of state needed to continue."""

    def __init__(self, progress_regex: re.Pattern[str] | None = None) -> None:
        """progress_regex: the user's own progress format (named groups step, total, loss …; progress.custom);
        lines it matches are read like the known progress forms, at the same speed."""
        self.progress_regex = progress_regex
        # a user's regex is one more source of special lines: as slow as it is, but theirs
        self._extra = None if progress_regex is None else re.compile(progress_regex.pattern.encode())
        self.reset()

    def reset(self) -> None:
        """Forget everything: the log was rotated or truncated and is read again from byte 0."""
        self.line_no = 0
        self.bytes_scanned = 0
        self._partial = b""
        self._tb: OpenTraceback | None = None
        self._pending: deque[Header] = deque()
        self._frag_line: int | None = None  # a header was cut after `Exception in thread `: names follow
        self._frags = 0  # how many such cut headers wait for their names
        self._out: list[Event] = []
        self._batch: list[tuple[ProgressPoint, str | None]] = []
        self.tracebacks: deque[Traceback] = deque(maxlen=KEEP_TRACEBACKS)
        self.progress: deque[ProgressPoint] = deque(maxlen=KEEP_PROGRESS)
        self.hits: list[SignatureHit] = []
        self._hit_counts: dict[str, int] = {}
        self._hit_last: dict[str, int] = {}  # id → index in self.hits of its latest kept hit
        self.last_finite_loss_line: int | None = None  # a later finite loss means an earlier NaN recovered
        self.end: tuple[str, int] | None = None  # ("finished"|"aborted"|"stopped", line): the trainer's last word
        self.threads: dict[str, ThreadState] = {}
        self.workers = WorkerTracker()
        self.last_nonzero_loss_line: int | None = None
        self._zero_run = 0
        self._nan_open: set[str] = set()
        # one traceback state per stream: ranks' tracebacks interleave line by line (`[rank3]: …`, `[rank1]: …`)
        self._streams: dict[int | None, tuple[OpenTraceback | None, deque[Header], int | None, int]] = {}
        self._key: int | None = None
        self._rank: int | None = None  # the current line's rank
        self._record = ""  # the current line's record prefix shape

    # -- streams -------------------------------------------------------------------------------------

    def _switch(self, key: int | None) -> None:
        """Make `key`'s traceback state the current one (the others wait, untouched)."""
        if key == self._key:
            return
        if not self._stream_idle():
            self._streams[self._key] = (self._tb, self._pending, self._frag_line, self._frags)
        self._key = key
        self._tb, self._pending, self._frag_line, self._frags = self._streams.pop(key, (None, deque(), None, 0))

    def _stream_idle(self) -> bool:
        return self._tb is None and not self._pending and self._frag_line is None

    def _idle(self) -> bool:
        """No stream has a traceback open or a thread header waiting: ordinary lines may be skipped."""
        return self._stream_idle() and not self._streams

    # -- input ---------------------------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Event]:
        """Scan the next bytes of the log; returns the events they completed."""
        self._out = []
        self.bytes_scanned += len(data)
        buf = self._partial + data if self._partial else data
        end = buf.rfind(b"\n") + 1  # complete lines end here
        self._scan(buf, end)
        self._partial = buf[end:]
        if len(self._partial) > MAX_LINE:  # a \r-only progress bar: take what is there, keep the tail
            cut = self._partial.rfind(b"\r")
            cut = cut if cut > 0 else len(self._partial)
            self._line(self.line_no + 1, self._partial[:cut])
            self._partial = self._partial[cut:]
        self._commit()
        return self._out

    def feed_file(self, f: BinaryIO) -> list[Event]:
        """Scan the rest of an open file in one go (diagnose: a whole copied log). Mapped, not read: one buffer
        however big, so only the end's progress lines are parsed (each feed() parses its own latest ones) and
        nothing is copied. A pipe, an empty file, a file read from before, or a partial line left by an earlier
        feed: read in big pieces."""
        try:
            m = None if self._partial or f.tell() else _Mapped(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError, AttributeError):  # not a regular file, empty, or no file descriptor
            m = None
        if m is not None:
            m.fd = f.fileno()  # a big one goes to grep (rawlines.next_special)
            with m:
                return self.feed(m)
        out: list[Event] = []
        while chunk := f.read(READ_PIECE):
            out += self.feed(chunk)
        return out

    def flush(self) -> list[Event]:
        """End of input: take the truncated last line as a line and close what is open."""
        self._out = []
        if self._partial:
            self.line_no += 1
            self._line(self.line_no, self._partial)
            self._partial = b""
        for key in [self._key, *self._streams]:
            self._switch(key)
            self._rank, self._record = key, ""
            if self._tb is not None:
                self._close()
            while self._pending:
                self._header_only(self._pending.popleft())
            self._frag_line, self._frags = None, 0
        self._commit()
        return self._out

    fast = True  # False: every line through the per-line path (the reference the fast path is tested against)

    def _scan(self, buf: bytes, end: int) -> None:
        ordinary: list[tuple[int, int, int]] = []  # stretches of ordinary lines: (start, stop, last line no)
        special = next_special(buf, end, self._extra, getattr(buf, "fd", None))
        try:
            self._walk(buf, end, special, ordinary)
        finally:
            special.close()
        budget = KEEP_PROGRESS  # only the latest points can end up in the report: parse those, newest first
        for start, stop, last_line in reversed(ordinary):
            if budget <= 0:
                break
            budget -= self._bulk_progress(buf, start, stop, last_line, budget)

    def _walk(self, buf: bytes, end: int, special: AnchorFinder | NextSpecial | GrepFinder,
              ordinary: list[tuple[int, int, int]]) -> None:
        """Special lines one by one through the per-line path; the stretches of ordinary lines between, noted."""
        pos, base = 0, self.line_no
        find, count = buf.find, buf.count
        known = getattr(special, "lines_before", None)  # grep numbers the lines: no newlines to count here
        while pos < end:
            if self.fast and self._idle():
                at = special.at(pos)
                stop = end if at < 0 else buf.rfind(b"\n", pos, at) + 1  # start of the special line
                if stop > pos:  # ordinary lines: only progress can be there
                    before = known(at) if known is not None and at >= 0 else None
                    self.line_no = base + before if before is not None else self.line_no + count(b"\n", pos, stop)
                    ordinary.append((pos, stop, self.line_no))
                    pos = stop
                if at < 0:
                    break
            nl = find(b"\n", pos, end)
            self.line_no += 1
            self._line(self.line_no, buf[pos:nl])
            pos = nl + 1

    def _line(self, n: int, raw: bytes) -> None:
        text = clean(raw)
        if text.endswith("^M"):  # a `\r` as an editor or terminal shows it, copied as two characters
            text = text[:-2]
        if "\r" in text:
            for seg in text.split("\r"):
                if seg.strip():
                    self._segment(n, seg.rstrip())
        else:
            self._segment(n, text.rstrip())

    # -- per line ------------------------------------------------------------------------------------

    def _segment(self, n: int, t: str) -> None:
        i = t.find(TB_START)
        if i > 0 and t[:i].strip():  # a traceback glued to the end of another line (a tqdm bar without \n)
            m = _RANK_BEFORE_RE.search(t, 0, i)
            j = m.start() if m else i
            if t[:j].strip():
                self._segment_or_name(n, t[:j])
                t = t[j:]
        elif self._frag_line is not None and (fm := NAME_BEFORE_FRAME_RE.match(t)):
            self._names(n, fm.group(1) + ":")  # `drafter-1  File "…"`: a cut header's name, then a frame
            t = t[fm.end(1):]
        sp = lineprefix.split(t)
        t, self._rank, self._record = sp.body, sp.rank, sp.record
        self._switch(sp.rank)
        deaths = len(self.workers.deaths)
        self.workers.feed(n, t, sp.rank)
        for line, code, sig, text in self.workers.deaths[deaths:]:
            for rule in signatures.match_death(signal_kind(code, sig)):
                self._hit(SignatureHit(rule.signature, line, text.strip()[:500]))
        if FRAG in t:
            t = self._unglue(n, t)
        if self._tb is not None:
            verdict = self._in_traceback(n, t)
            if verdict == "consumed":
                return
        self._expire_pending(n)
        m = HEADER_RE.search(t)
        if m:
            self._header(n, t, m)
            return
        if FRAG in t:
            self._cut_headers(n, t.count(FRAG))
            for piece in t.split(FRAG)[1:-1]:  # `Exception in thread A` + `Exception in thread ` (A's `:` later)
                if NAME_RE.match(piece.strip()):
                    self._names(n, piece.strip() + ":")
            return
        if self._frag_line is not None:
            if self._names(n, t):
                return
            if n - self._frag_line > HEADER_TTL:
                self._frag_line, self._frags = None, 0
        i = t.find(TB_START)
        if i >= 0:
            self._open(n, t[i:])
            return
        if _IGNORED_RE.match(t):
            self._open(n, t, ignored=True)
            return
        self._plain(n, t)

    def _segment_or_name(self, n: int, t: str) -> None:
        """What came before a glued `Traceback (most recent …`: the bare name of a cut header (its `:` comes
        on a later line) or a line of its own."""
        if self._frag_line is not None and NAME_RE.match(t.strip()):
            self._names(n, t.strip() + ":")
        else:
            self._segment(n, t)

    def _plain(self, n: int, t: str) -> None:
        m = bare_exception(t) or TERMINATE_RE.search(t)
        if m:
            self._open_bare(n, t, m)
            return
        self._end_marker(t, n)
        for rule in signatures.match_line(t):
            self._hit(SignatureHit(rule.signature, n, t.strip()[:500]))
            if self._rank is not None and not rule.sticky:  # a rank that reports a failure of its own has failed
                self.workers.failed_by_message(f"rank{self._rank}", n, t)
        p = parse_progress(t, n, self.progress_regex)
        if p is not None:
            self._progress(p, t)

    def _hit(self, hit: SignatureHit) -> None:
        """Keep the first KEEP_HITS_PER_ID hits of an id, and always its latest (in the last slot)."""
        k = hit.signature.id
        self._hit_counts[k] = self._hit_counts.get(k, 0) + 1
        if self._hit_counts[k] <= KEEP_HITS_PER_ID:
            self._hit_last[k] = len(self.hits)
            self.hits.append(hit)
        else:
            self.hits[self._hit_last[k]] = hit
        self._out.append(hit)

    # -- output --------------------------------------------------------------------------------------

    def report(self) -> LogReport:
        """A snapshot, including the traceback still being read and headers still waiting, so that a
        crash shows up the moment its lines arrive (not when the next unrelated line closes it)."""
        tracebacks = list(self.tracebacks)
        threads = dict(self.threads)
        hits = list(self.hits)
        if not self._idle():
            probe = _copy_state(self)
            probe.flush()
            tracebacks += [e for e in probe._out if isinstance(e, Traceback)]
            hits += [e for e in probe._out if isinstance(e, SignatureHit)]
            threads.update(probe.threads)
        return LogReport(
            tracebacks=tracebacks,
            progress=list(self.progress),
            hits=hits,
            threads=threads,
            last_line_no=self.line_no,
            bytes_scanned=self.bytes_scanned,
            last_finite_loss_line=self.last_finite_loss_line,
            end=self.end,
            workers=dict(self.workers.failures),
            root_cause=self.workers.root_cause,
            last_nonzero_loss_line=self.last_nonzero_loss_line,
        )


class _Mapped(mmap.mmap):
    """A read-only map of a log file that the scanner reads as it reads bytes (mmap lacks only count); fd: the
    file it maps, for grep to read."""

    fd: int | None = None

    def count(self, sub: bytes, start: int = 0, end: int | None = None) -> int:
        return self[start:end].count(sub)


def _copy_state(s: LogScanner) -> LogScanner:
    """A throwaway scanner holding only s's open tracebacks and pending headers (every stream's), to flush them."""
    c = LogScanner(s.progress_regex)
    c.line_no = s.line_no
    c._tb, c._key, c._rank = copy_open(s._tb), s._key, s._rank
    c._streams = {k: (copy_open(tb), deque(p), f, n) for k, (tb, p, f, n) in s._streams.items()}
    c._pending = deque(s._pending)
    c._hit_counts = dict(s._hit_counts)
    c._hit_last, c.hits = dict(s._hit_last), list(s.hits)
    return c


def scan(data: bytes, progress_regex: re.Pattern[str] | None = None) -> LogReport:
    """Scan a whole log at once (diagnose, tests)."""
    s = LogScanner(progress_regex)
    s.feed(data)
    s.flush()
    return s.report()
