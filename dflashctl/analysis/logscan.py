"""Incremental log scanner: progress lines, whole tracebacks per thread, failure signatures.

`LogScanner.feed(bytes)` takes the log from where the last call stopped (line count, partial last line,
open traceback and pending thread headers are kept), so a 5 GB log is read once and then only its new
bytes. Most lines cannot matter and are never decoded: a regex of literal anchors (signatures.ANCHORS,
`Traceback`, `Exception`) finds the next "special" line at C speed; every line is read only while a
traceback is open; in the ordinary stretches between, only the latest KEEP_PROGRESS progress lines are
parsed (found backwards with rfind), since nothing older can reach the report.

API (stable; `logs --errors`, `runs`, `status`, `diagnose` use it): `LogScanner.feed(data) -> [Event]`,
`.flush()` at end of input, `.reset()` on rotation, `.report() -> LogReport`; `scan(data) -> LogReport`.

Real logs are messy, and this is written for them: `\\r` progress bars, ANSI colour, invalid UTF-8, a
truncated last line, rotation (`reset()`), and tracebacks of threads that crashed at the same moment,
whose lines (even half-lines) interleave in the file. Interleaved tracebacks are split apart by pairing
`Exception in thread NAME:` headers, in order, with the final exception lines.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field

from dflashctl.analysis import lineprefix, signatures
from dflashctl.analysis.progress import PROGRESS_TOKENS, parse_progress
from dflashctl.analysis.workers import ANCHORS as WORKER_ANCHORS
from dflashctl.analysis.workers import WorkerFailure, WorkerTracker, signal_kind
from dflashctl.model import ProgressPoint, SignatureHit, ThreadState

MAX_LINE = 1 << 20  # a partial line longer than this (a \r progress bar with no \n) is processed anyway
MAX_TB_LINES = 2000  # a traceback longer than this keeps its head and tail
MAX_CONTINUATION = 40  # lines after the final `Type: message` still taken as the message's tail
HEADER_TTL = 50  # lines a thread header waits for its `Traceback (most recent call last):`
KEEP_PROGRESS = 1024  # progress points kept (and, per stretch of ordinary lines, parsed: the latest)
KEEP_TRACEBACKS = 500
KEEP_HITS_PER_ID = 50

TB_START = "Traceback (most recent call last):"
_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_HEADER_RE = re.compile(r"Exception in thread ((?:(?!Exception in thread ).)+?):\s*$")
_FRAG = "Exception in thread "
_FRAG_NAME_RE = re.compile(  # the name half of a header cut in two; never a traceback's own lines
    r"^(?!Traceback \(most|The above exception|During handling|.*(?:Error|Exception|Interrupt|Exit|Warning):\s*$)"
    r"(\S[^:]{0,120}):\s*$"
)
_IGNORED_RE = re.compile(r"^Exception ignored (?:in|on)\b")
# The trainer's last line (trainer/pipeline.py): how the run ended, for offline diagnosis of a copied log.
_END_RE = re.compile(r"^training (finished|aborted|stopped)\b")
# Lines that end a traceback's message: they come from some other writer, never from a message's own
# newlines. `[dflashctl] …` (the launcher's tag), `trainer: …` / `fatal: …` (a program's `name: text` line;
# exception types are class names, which carry a capital), `Exception ignored in …`.
_FOREIGN_RE = re.compile(r"^(?:\[[A-Za-z][\w.-]*\]\s|[a-z][a-z0-9_-]*: \S|Exception ignored (?:in|on)\b)")
_CHAIN_RE = re.compile(
    r"^\s*(?:The above exception was the direct cause of the following exception:"
    r"|During handling of the above exception, another exception occurred:)\s*$"
)
_EXC_RE = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?::(?: (.*))?)?\s*$")
_FRAME_RE = re.compile(r'^\s+File "([^"]*)", line (\d+)')
_CARET_RE = re.compile(r"^[\s^~]+$")
# An exception line with no traceback above it (users and launchers often keep only the last line): a dotted
# CamelCase type that ends like an exception, or one of the few exception types that do not (never a Warning).
_BARE_EXC_RE = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Interrupt|Failed|Fault)|OutOfResources|Unsupported"
    r"|FailOnRecompileLimitHit|RecompileLimitExceeded|StopIteration|KeyboardInterrupt))"
    r"(?::(?: (.*))?$|(?<=Error)$|(?<=Exception)$)"  # `…errors.CompilationError` alone: its message was cut off
)
# C++: `terminate called after throwing an instance of 'c10::DistBackendError'` (then `  what():  …`)
_TERMINATE_RE = re.compile(r"terminate called after throwing an instance of '([\w:<>]+)'")
_RANK_BEFORE_RE = re.compile(r"\[(?:rank|default)(\d+)\]:\s?$")  # `…bar…][rank3]: Traceback (most recent …`
_LOGREC_RE = re.compile(
    r"^(?:\[?\d{4}[-/]\d\d[-/]\d\d[ T]\d\d:\d\d|\[?(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\b"
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d|\[rank\d+\]|\d\d:\d\d:\d\d\b)"
)

# A "special" line can start or hold a traceback or a signature; every other line can at most be progress.
# Literal anchors only (see signatures.ANCHORS): the regex engine then skips ordinary text at C speed.
_ALL_ANCHORS = ("Traceback (most recent call last)", "Exception", "Failed", "Interrupt", "terminate called",
                "OutOfResources", "Unsupported", *signatures.ANCHORS, *WORKER_ANCHORS)
# Python's regex engine skips text quickly only while the next character cannot start an alternative: anchors that
# start with a lower-case letter would make nearly every position a candidate. Those are found with bytes.find
# (C speed, one pass each); the regex keeps the rest.
_LOWER_ANCHORS = tuple(sorted({a.encode() for a in _ALL_ANCHORS if a[:1].islower()}))


def _trie(words: list[str]) -> str:
    """A regex for literal words, factored by common prefixes: at each candidate position the engine follows one
    branch per first character instead of trying every word in turn (a third faster on trainer logs)."""
    groups: dict[str, list[str]] = {}
    for w in words:
        groups.setdefault(w[:1], []).append(w[1:])
    ends = "" in groups
    alts = [re.escape(c) + _trie(rest) for c, rest in sorted(groups.items()) if c]
    if not alts:
        return ""
    body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
    return f"(?:{body})?" if ends else body


_SPECIAL_RE = re.compile(_trie(sorted({a for a in _ALL_ANCHORS if not a[:1].islower()})).encode())
_PROGRESS_TOKENS = tuple(t.encode() for t in PROGRESS_TOKENS)


@dataclass
class Traceback:
    """One Python traceback with its whole text, attributed to a thread (None: main thread or unknown)."""

    thread: str | None
    first_line: int  # 1-based line of the `Exception in thread` header, else of `Traceback (most recent …`
    last_line: int
    text: str
    exc_type: str | None  # as printed, e.g. torch.OutOfMemoryError; None when only the header survived
    message: str | None
    chain: list[tuple[str, str]] = field(default_factory=list)  # earlier (type, message) of the chain
    frames: list[str] = field(default_factory=list)  # file paths of `File "…"` lines, in order
    hits: list[SignatureHit] = field(default_factory=list)
    ignored: bool = False  # `Exception ignored in …` (unraisable): printed, not fatal
    rank: int | None = None  # the rank whose stream printed it (`[rank3]: …` prefixes)
    bare: bool = False  # an exception line with no `Traceback (most recent call last):` above it

    @property
    def exc_line(self) -> str:
        if self.exc_type is None:
            return "(traceback lost)"
        return f"{self.exc_type}: {self.message}" if self.message else self.exc_type


Event = Traceback | ProgressPoint | SignatureHit


@dataclass
class LogReport:
    """What a log said so far. Built by LogScanner.report(); lists are bounded (see KEEP_*)."""

    tracebacks: list[Traceback]
    progress: list[ProgressPoint]
    hits: list[SignatureHit]
    threads: dict[str, ThreadState]
    last_line_no: int
    bytes_scanned: int = 0
    progress_count: int = 0
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


@dataclass
class _Header:
    name: str
    line: int
    text: str


@dataclass
class _Open:
    """A traceback being read. `concurrent` counts other threads' tracebacks interleaved into it."""

    thread: str | None
    first_line: int
    lines: list[tuple[int, str]] = field(default_factory=list)
    state: str = "frames"  # frames | exc (after a `Type: message` line) | chain (after "The above …")
    excs: list[tuple[str, str | None, int]] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)
    concurrent: int = 0
    continuation: int = 0
    garbage: int = 0
    ignored: bool = False
    rank: int | None = None
    record: str = ""  # the record prefix shape of its first line (lines of the same record share it)
    bare: bool = False
    threaded: bool = False  # under an `Exception in thread NAME:` header

    def add(self, n: int, t: str) -> None:
        if len(self.lines) < MAX_TB_LINES:
            self.lines.append((n, t))
        else:
            self.lines[-1] = (n, t)  # keep the head and the very last line (the final exception)


def _clean(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    if "\x1b" in text:
        text = _ANSI_RE.sub("", text)
    return text


class _NextSpecial:
    """Where the next special line of buf[:end] starts (an anchor's position), each source searched once per pass:
    the regex of upper-case anchors and one bytes.find per lower-case anchor, their last answers kept."""

    def __init__(self, buf: bytes, end: int, regex: re.Pattern[bytes]) -> None:
        self.buf, self.end, self.regex = buf, end, regex
        self.found = {a: -2 for a in _LOWER_ANCHORS}  # -2: not searched yet, -1: none left
        self.match = -2

    def at(self, pos: int) -> int:
        buf, end = self.buf, self.end
        if self.match == -2 or 0 <= self.match < pos:
            m = self.regex.search(buf, pos, end)
            self.match = m.start() if m else -1
        best = self.match
        for a, at in self.found.items():
            if at == -2 or 0 <= at < pos:
                at = self.found[a] = buf.find(a, pos, end)
            if at >= 0 and (best < 0 or at < best):
                best = at
        return best


class LogScanner:
    """Feed it log bytes in order; it keeps every bit of state needed to continue."""

    def __init__(self, progress_regex: re.Pattern[str] | None = None) -> None:
        """progress_regex: the user's own progress format (named groups step, total, loss …; progress.custom);
        lines it matches are read like the known progress forms, at the same speed."""
        self.progress_regex = progress_regex
        self._special = _SPECIAL_RE if progress_regex is None else re.compile(
            _SPECIAL_RE.pattern + b"|" + progress_regex.pattern.encode())  # a user's regex: slower, but theirs
        self.reset()

    def reset(self) -> None:
        """Forget everything: the log was rotated or truncated and is read again from byte 0."""
        self.line_no = 0
        self.bytes_scanned = 0
        self._partial = b""
        self._tb: _Open | None = None
        self._pending: deque[_Header] = deque()
        self._frag_line: int | None = None  # a header was cut after `Exception in thread `: names follow
        self._frags = 0  # how many such cut headers wait for their names
        self._out: list[Event] = []
        self._batch: list[tuple[ProgressPoint, str | None]] = []
        self.tracebacks: deque[Traceback] = deque(maxlen=KEEP_TRACEBACKS)
        self.progress: deque[ProgressPoint] = deque(maxlen=KEEP_PROGRESS)
        self.progress_count = 0
        self.hits: list[SignatureHit] = []
        self._hit_counts: dict[str, int] = {}
        self._hit_last: dict[str, int] = {}  # id → index in self.hits of its latest kept hit
        self.last_finite_loss_line: int | None = None  # a later finite loss means an earlier NaN recovered
        self.end: tuple[str, int] | None = None  # ("finished"|"aborted"|"stopped", line): the trainer's last word
        self.threads: dict[str, ThreadState] = {}
        self.workers = WorkerTracker()
        self.last_nonzero_loss_line: int | None = None
        self._zero_run = 0
        # one traceback state per stream: ranks' tracebacks interleave line by line (`[rank3]: …`, `[rank1]: …`)
        self._streams: dict[int | None, tuple[_Open | None, deque[_Header], int | None, int]] = {}
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
        pos = 0
        find, count = buf.find, buf.count
        ordinary: list[tuple[int, int, int]] = []  # stretches of ordinary lines: (start, stop, last line no)
        special = _NextSpecial(buf, end, self._special)
        while pos < end:
            if self.fast and self._idle():
                at = special.at(pos)
                stop = end if at < 0 else buf.rfind(b"\n", pos, at) + 1  # start of the special line
                if stop > pos:  # ordinary lines: only progress can be there
                    lines = count(b"\n", pos, stop)
                    self.line_no += lines
                    ordinary.append((pos, stop, self.line_no))
                    pos = stop
                if at < 0:
                    break
            nl = find(b"\n", pos, end)
            self.line_no += 1
            self._line(self.line_no, buf[pos:nl])
            pos = nl + 1
        budget = KEEP_PROGRESS  # only the latest points can end up in the report: parse those, newest first
        for start, stop, last_line in reversed(ordinary):
            if budget <= 0:
                break
            budget -= self._bulk_progress(buf, start, stop, last_line, budget)
        for start, stop, _ in ordinary:
            for tok in (b"step=", b"step:"):
                self.progress_count += count(tok, start, stop)

    def _bulk_progress(self, buf: bytes, start: int, stop: int, last_line: int, budget: int) -> int:
        """Progress in a stretch of ordinary lines [start, stop): the latest `budget` points, found backwards
        with rfind (C speed). Nothing older could matter: the report keeps the latest points, and a NaN
        loss followed by finite ones is history. Returns how many it found."""
        found = 0
        hi, line_no = stop, last_line  # hi: end of the region still to look at; line_no: its last line
        last_at = {t: buf.rfind(t, start, hi) for t in _PROGRESS_TOKENS}  # each token's latest occurrence
        while found < budget:
            for t, a in last_at.items():
                if a >= hi:  # that occurrence is in a line already looked at: find the one before it
                    last_at[t] = buf.rfind(t, start, hi)
            at = max(last_at.values())
            if at < 0:
                break
            ls = buf.rfind(b"\n", start, at) + 1 or start
            le = buf.find(b"\n", at, hi)
            line_no -= buf.count(b"\n", le + 1, hi) if le >= 0 else 0
            text = _clean(buf[max(ls, start):le if le >= 0 else hi])
            self._end_marker(text, line_no)
            p = parse_progress(text.rsplit("\r", 1)[-1], line_no, self.progress_regex)
            if p is not None:
                found += 1
                self._progress(p, None)
            hi, line_no = max(ls, start), line_no - 1
            if hi <= start:
                break
        return found

    def _line(self, n: int, raw: bytes) -> None:
        text = _clean(raw)
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
        elif self._frag_line is not None and (fm := _NAME_BEFORE_FRAME_RE.match(t)):
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
        if _FRAG in t:
            t = self._unglue(n, t)
        if self._tb is not None:
            verdict = self._in_traceback(n, t)
            if verdict == "consumed":
                return
        self._expire_pending(n)
        m = _HEADER_RE.search(t)
        if m:
            self._header(n, t, m)
            return
        if _FRAG in t:
            self._cut_headers(n, t.count(_FRAG))
            for piece in t.split(_FRAG)[1:-1]:  # `Exception in thread A` + `Exception in thread ` (A's `:` later)
                if _NAME_RE.match(piece.strip()):
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
        if self._frag_line is not None and _NAME_RE.match(t.strip()):
            self._names(n, t.strip() + ":")
        else:
            self._segment(n, t)

    def _unglue(self, n: int, t: str) -> str:
        """`Exception in thread ` + another thread's line (`Traceback (most recent call last):`): count the
        cut header, return the other line to be read on its own."""
        m = _HEADER_RE.search(t)
        if m is None or _plausible_name(m.group(1)):
            return t
        self._cut_headers(n, t[: m.start(1)].count(_FRAG))
        return t[m.start(1):]

    def _header(self, n: int, t: str, m: re.Match[str]) -> None:
        """`Exception in thread NAME:`; an earlier bare `Exception in thread ` on the same line is another
        thread's header cut in two by an interleaved write: its name comes on a later line."""
        head = t[: m.start()]
        if self._frags and head.strip() and _FRAG not in head and " " not in head.strip():
            self._names(n, head.strip() + ":")  # `drafter-2` (an earlier cut header's name) + a new header
        cut = head.count(_FRAG)  # other headers cut short on this line (their names may be glued here)
        name = _without_glued_type(m.group(1).strip())
        names: list[str] = []
        for c in range(max(cut + 1, 4), 1, -1):  # glued names split on their common prefix
            names = _split_names(name, c)
            if names:
                break
        pieced = bool(names) or cut > 0  # from an interleaved line: keep only what looks like a thread name
        names = [x for x in names or [name] if not pieced or _NAME_RE.match(x)]
        for name in names:
            self._pending.append(_Header(name, n, f"{_FRAG}{name}:"))
        for piece in head.split(_FRAG)[1:]:
            if _NAME_RE.match(piece.strip()):  # `Exception in thread A` + `Exception in thread B:`
                self._pending.append(_Header(piece.strip(), n, f"{_FRAG}{piece.strip()}:"))
                cut -= 1
        if cut - (len(names) - 1) > 0:
            self._cut_headers(n, cut - (len(names) - 1))

    def _cut_headers(self, n: int, count: int) -> None:
        self._frag_line = n
        self._frags += count

    def _names(self, n: int, t: str) -> bool:
        """The name half of cut headers: `drafter-1:`, or several glued, `drafter-1drafter-2:`. Glued
        names are split on their common prefix; what cannot be split is dropped, never invented."""
        fm = _FRAG_NAME_RE.match(t)
        if not fm:
            return False
        names: list[str] = []
        for c in range(max(self._frags, 4), 0, -1):
            names = _split_names(_without_glued_type(fm.group(1).strip()), c)
            if names:
                break
        names = [x for x in names if _NAME_RE.match(x)]  # a name pieced together must look like one
        for name in names:
            self._pending.append(_Header(name, n, f"{_FRAG}{name}:"))
        self._frags -= max(1, len(names))
        if self._frags <= 0:
            self._frag_line, self._frags = None, 0
        return True

    def _end_marker(self, t: str, n: int) -> None:
        m = _END_RE.match(t)
        if m and (self.end is None or self.end[1] < n):
            self.end = (m.group(1), n)

    def _plain(self, n: int, t: str) -> None:
        m = _BARE_EXC_RE.match(t) or _TERMINATE_RE.search(t)
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
            self.progress_count += 1
            self._progress(p, t)

    def _progress(self, p: ProgressPoint, text: str | None) -> None:
        self._batch.append((p, text))

    def _commit(self) -> None:
        """Progress found in this call goes in, in line order (the fast path finds it newest first)."""
        self._batch.sort(key=lambda pt: pt[0].line)
        for p, text in self._batch:
            self.progress.append(p)
            self._out.append(p)
            loss, norm = p.values.get("loss"), p.values.get("grad_norm")
            line = text if text is not None else " ".join(f"{k}={v:g}" for k, v in p.values.items())
            if loss is not None and math.isfinite(loss) and (norm is None or math.isfinite(norm)):
                self.last_finite_loss_line = p.line
            if any(v is not None and not math.isfinite(v) for v in (loss, norm)):
                for rule in signatures.LOSS_RULES:
                    self._hit(SignatureHit(rule.signature, p.line, line.strip()[:500]))
            if loss is not None and p.kind == "train":
                if loss == 0.0:
                    self._zero_run += 1
                    if self._zero_run == signatures.ZERO_RUN:
                        for rule in signatures.ZERO_LOSS_RULES:
                            self._hit(SignatureHit(rule.signature, p.line, line.strip()[:500]))
                elif math.isfinite(loss):
                    self._zero_run = 0
                    self.last_nonzero_loss_line = p.line
        self._batch = []
        self._out.sort(key=_event_line)

    def _hit(self, hit: SignatureHit, tb: _Open | None = None) -> None:
        """Keep the first KEEP_HITS_PER_ID hits of an id, and always its latest (in the last slot)."""
        k = hit.signature.id
        self._hit_counts[k] = self._hit_counts.get(k, 0) + 1
        if self._hit_counts[k] <= KEEP_HITS_PER_ID:
            self._hit_last[k] = len(self.hits)
            self.hits.append(hit)
        else:
            self.hits[self._hit_last[k]] = hit
        self._out.append(hit)

    def _worker(self, header: _Header | None) -> str | None:
        """Who printed it: the thread of its header, the rank of its stream (`rank3`, `rank3/drafter-1`), or None
        (the main thread of a single process)."""
        if self._rank is None:
            return header.name if header else None
        return f"rank{self._rank}/{header.name}" if header else f"rank{self._rank}"

    def _open(self, n: int, t: str, *, ignored: bool = False) -> None:
        header = None if ignored or not self._pending else self._pending.popleft()
        tb = _Open(thread=None if ignored else self._worker(header), first_line=header.line if header else n,
                   ignored=ignored, rank=self._rank, record=self._record, threaded=header is not None)
        if header:
            tb.add(header.line, header.text)
        tb.add(n, t)
        if ignored:
            tb.state = "chain"  # the `Traceback (most recent call last):` follows
        self._tb = tb

    def _open_bare(self, n: int, t: str, m: re.Match[str]) -> None:
        """`torch.OutOfMemoryError: CUDA out of memory …` with no traceback above it: an exception all the same
        (its message may go on over the next lines, as a traceback's does)."""
        header = self._pending.popleft() if self._pending else None
        tb = _Open(thread=self._worker(header), first_line=header.line if header else n, rank=self._rank,
                   record=self._record, bare=True, threaded=header is not None)
        if header:
            tb.add(header.line, header.text)
        tb.add(n, t)
        tb.excs.append((m.group(1), m.group(2) if m.re is _BARE_EXC_RE else None, n))
        tb.state = "exc"
        self._tb = tb

    def _in_traceback(self, n: int, t: str) -> str:
        """Take line t into the open traceback: 'consumed', 'foreign' (not ours, tb stays open) or 'closed'."""
        tb = self._tb
        assert tb is not None
        st = tb.state
        if self._record and self._record != tb.record:  # another writer's log record between its lines
            if st == "exc":
                self._close()
                return "closed"
            return "foreign"
        m = _HEADER_RE.search(t)
        if m:
            if st == "exc" and tb.concurrent == 0:
                self._close()
                return "closed"
            self._header(n, t, m)
            return "consumed"
        if TB_START in t:
            if st == "chain":
                tb.state = "frames"
            elif st == "frames":
                tb.concurrent += 1  # another thread's traceback interleaved with this one
            elif tb.concurrent > 0:
                self._split(n, t)
                return "consumed"
            else:
                self._close()
                return "closed"
            tb.add(n, t[t.find(TB_START):])
            return "consumed"
        if _CHAIN_RE.match(t):
            tb.state = "chain"
            tb.add(n, t)
            return "consumed"
        if not t.strip():
            tb.add(n, t)
            return "consumed"
        indented = t[:1].isspace()
        if _FRAG in t:
            self._cut_headers(n, t.count(_FRAG))
        elif self._frag_line is not None and not indented and self._names(n, t):
            return "consumed"
        if st in ("frames", "chain"):
            if indented or _CARET_RE.match(t):
                fm = _FRAME_RE.match(t)
                if fm:
                    tb.frames.append(fm.group(1))
                tb.add(n, t)
                return "consumed"
            em = _EXC_RE.match(t)
            if em:
                tb.excs.append((em.group(1), em.group(2), n))
                tb.state, tb.continuation = "exc", 0
                tb.add(n, t)
                return "consumed"
            if parse_progress(t, n) is not None or _LOGREC_RE.match(t):
                return "foreign"  # another thread's log line between two frames
            tb.garbage += 1
            tb.add(n, t)
            if tb.garbage > 50:
                self._close()
            return "consumed"
        # st == "exc": the message may go on (torch prints paragraphs after the exception line)
        if tb.concurrent > 0 and (indented or _EXC_RE.match(t)):
            self._split(n, t)
            return "consumed"
        if (parse_progress(t, n) is not None or _LOGREC_RE.match(t) or _END_RE.match(t) or _FOREIGN_RE.match(t)
                or tb.continuation >= MAX_CONTINUATION):
            self._close()
            return "closed"
        tb.continuation += 1
        tb.add(n, t)
        return "consumed"

    def _split(self, n: int, t: str) -> None:
        """Interleaved tracebacks: the one that just printed its final line is done; the rest go on."""
        tb = self._tb
        assert tb is not None
        rest = tb.concurrent - 1
        self._close()
        header = self._pending.popleft() if self._pending else None
        nxt = _Open(thread=self._worker(header), first_line=header.line if header else n, rank=tb.rank,
                    record=tb.record, threaded=header is not None)
        if header:
            nxt.add(header.line, header.text)
        nxt.concurrent = rest
        self._tb = nxt
        if TB_START in t:
            nxt.add(n, t[t.find(TB_START):])
        else:
            self._in_traceback(n, t)

    def _close(self) -> None:
        tb = self._tb
        assert tb is not None
        self._tb = None
        exc_type = message = None
        if tb.excs:
            exc_type, message, _ = tb.excs[-1]
        out = Traceback(
            thread=tb.thread,
            first_line=tb.first_line,
            last_line=tb.lines[-1][0] if tb.lines else tb.first_line,
            text="\n".join(t for _, t in tb.lines),
            exc_type=exc_type,
            message=message,
            chain=[(t, m or "") for t, m, _ in tb.excs[:-1]],
            frames=tb.frames,
            ignored=tb.ignored,
            rank=tb.rank,
            bare=tb.bare,
        )
        self._finish(out, tb.lines, tb.excs[-1][2] if tb.excs else tb.first_line, threaded=tb.threaded)

    def _header_only(self, h: _Header) -> None:
        """A thread header whose traceback never came (or was grepped away, as in the seed)."""
        self._finish(Traceback(self._worker(h), h.line, h.line, h.text, None, None, rank=self._rank),
                     [(h.line, h.text)], h.line)

    def _finish(self, tb: Traceback, lines: list[tuple[int, str]], exc_line: int, *, threaded: bool = True) -> None:
        seen: set[str] = set()
        # the exception lines first: a frame's source line (`raise RuntimeError("…")`) is weaker evidence
        for n, t in sorted(lines, key=lambda nt: nt[1][:1].isspace()):
            for rule in signatures.match_line(t):
                if rule.signature.id not in seen:
                    seen.add(rule.signature.id)
                    tb.hits.append(SignatureHit(rule.signature, n, t.strip()[:500]))
        exc_text = next((t for n, t in lines if n == exc_line), tb.exc_line)
        for rule in signatures.match_exception(tb.exc_type):
            if rule.signature.id not in seen:
                seen.add(rule.signature.id)
                tb.hits.append(SignatureHit(rule.signature, exc_line, exc_text.strip()[:500]))
        if not seen and threaded and tb.thread is not None and tb.exc_type is not None:
            for rule in signatures.match_frames(tb.frames):  # a worker *thread* (ranks are processes)
                seen.add(rule.signature.id)
                tb.hits.append(SignatureHit(rule.signature, exc_line, exc_text.strip()[:500]))
        for hit in tb.hits:
            self._hit(hit)
        if tb.thread is not None and not tb.ignored:
            self.threads[tb.thread] = ThreadState(
                name=tb.thread, state="crashed", exception=tb.exc_type, message=tb.message, traceback=tb.text
            )
        self.tracebacks.append(tb)
        self._out.append(tb)

    def _expire_pending(self, n: int) -> None:
        while self._pending and n - self._pending[0].line > HEADER_TTL:
            self._header_only(self._pending.popleft())

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
            progress_count=self.progress_count,
            last_finite_loss_line=self.last_finite_loss_line,
            end=self.end,
            workers=dict(self.workers.failures),
            root_cause=self.workers.root_cause,
            last_nonzero_loss_line=self.last_nonzero_loss_line,
        )


_NAME_RE = re.compile(r"^[\w.\-]{1,80}(?: \([\w.<>\-]{1,80}\))?$")  # drafter-1, Thread-3 (work), MainThread


def _plausible_name(name: str) -> bool:
    """A thread name, not a piece of some other line that an interleaved write glued on."""
    return 0 < len(name) <= 120 and not any(x in name for x in ("Traceback (", 'File "', "Exception in thread"))


_NAME_BEFORE_FRAME_RE = re.compile(r'^([\w.\-]{1,80}?)\s+File "')  # `drafter-1  File "…/threading.py", …`
# Another thread's exception type, written between a cut header's `Exception in thread ` and its name:
# `ValueErrordrafter-1:` (the type's `: message` follows on a later line).
_GLUED_TYPE_RE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*?(?:Error|Exception|Interrupt|Exit|Warning|Failed|Fault)(?=\S)"
)


def _without_glued_type(name: str) -> str:
    """`ValueErrordrafter-1` → `drafter-1`; a name with nothing glued on comes back as it is."""
    m = _GLUED_TYPE_RE.match(name)
    rest = name[m.end():] if m else ""
    return rest if rest and _NAME_RE.match(rest) else name


def _split_names(glued: str, count: int) -> list[str]:
    """`drafter-1drafter-2` with count 2 → [drafter-1, drafter-2]; [] when it does not split that way."""
    if count <= 1:
        return [glued]
    for plen in range(len(glued) // count, 2, -1):
        prefix = glued[:plen]
        parts = [prefix + p for p in glued.split(prefix)[1:]]
        if len(parts) == count and "".join(parts) == glued:
            return parts
    return []


def _event_line(e: Event) -> int:
    return e.first_line if isinstance(e, Traceback) else e.line


def _copy_open(tb: _Open | None) -> _Open | None:
    if tb is None:
        return None
    return _Open(tb.thread, tb.first_line, list(tb.lines), tb.state, list(tb.excs), list(tb.frames), tb.concurrent,
                 tb.continuation, tb.garbage, tb.ignored, tb.rank, tb.record, tb.bare, tb.threaded)


def _copy_state(s: LogScanner) -> LogScanner:
    """A throwaway scanner holding only s's open tracebacks and pending headers (every stream's), to flush them."""
    c = LogScanner(s.progress_regex)
    c.line_no = s.line_no
    c._tb, c._key, c._rank = _copy_open(s._tb), s._key, s._rank
    c._streams = {k: (_copy_open(tb), deque(p), f, n) for k, (tb, p, f, n) in s._streams.items()}
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
