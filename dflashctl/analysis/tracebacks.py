"""Traceback assembly: a Python traceback read line by line into one Traceback, with its chain, frames and hits.

A traceback opens on `Traceback (most recent call last):` (or a bare exception line, or `Exception ignored in`),
takes frames, then the final `Type: message` line and the message's tail, and closes on the first line that
cannot be its own. Tracebacks of threads that crashed together interleave: one still in its frames when another
starts counts it (`concurrent`), and each final exception line then closes one of them (`_split`).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from dflashctl.analysis import signatures
from dflashctl.analysis.progress import parse_progress
from dflashctl.analysis.threadheaders import FRAG, HEADER_RE, HEADER_TTL, Header, ThreadHeaders
from dflashctl.model import ProgressPoint, SignatureHit, ThreadState

MAX_TB_LINES = 2000  # a traceback longer than this keeps its head and tail
MAX_CONTINUATION = 40  # lines after the final `Type: message` still taken as the message's tail

TB_START = "Traceback (most recent call last):"
# The trainer's last line (trainer/pipeline.py): how the run ended, for offline diagnosis of a copied log.
END_RE = re.compile(r"^training (finished|aborted|stopped)\b")
# Lines that end a traceback's message: they come from some other writer, never from a message's own
# newlines. `[dflashctl] …` (the launcher's tag), `trainer: …` / `fatal: …` (a program's `name: text` line;
# exception types are class names, which carry a capital), `Exception ignored in …`.
_REPLICA_RE = re.compile(r"Caught \w+ in replica \d+ on device \d+")  # DataParallel: the replica ran in a thread
_THREAD_FRAMES = ("/threading.py", "/concurrent/futures/thread.py")  # frames only a thread's stack holds
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
BARE_EXC_RE = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Interrupt|Failed|Fault)|OutOfResources|Unsupported"
    r"|FailOnRecompileLimitHit|RecompileLimitExceeded|StopIteration|KeyboardInterrupt|InvalidCxxCompiler"
    r"|(?<![\w.])Exception(?=: \S)))"
    r"(?::(?: (.*))?$|(?<=Error)$|(?<=Exception)$)"  # `…errors.CompilationError` alone: its message was cut off
)


def _cut_name(m: re.Match[str]) -> bool:
    """An exception line cut inside its dotted path (`torch.distr` where the excerpt stopped): no colon, and the last
    part not a class name (exception classes are CamelCase; a module path's parts are lower-case)."""
    return m.group(2) is None and ":" not in m.group(0) and m.group(1).rsplit(".", 1)[-1][:1].islower()


# pytest's short summary: `FAILED tests/x.py::test_y - torch.OutOfMemoryError: CUDA out of memory …` names the
# exception after ` - ` (`ERROR tests/x.py - ModuleNotFoundError: …` too); a bare `PASSED …`/`ERROR tests/x.py` does not
PYTEST_SUMMARY_RE = re.compile(r"^(?:FAILED|ERROR) \S+ - ")


def bare_exception(t: str) -> re.Match[str] | None:
    """An exception line with no traceback above it: the line itself, or the part of a pytest summary line after
    its ` - `."""
    m = BARE_EXC_RE.match(t)
    if m is None and t[:1] in "FE" and (ps := PYTEST_SUMMARY_RE.match(t)):
        m = BARE_EXC_RE.match(t[ps.end():])
    return m


# C++: `terminate called after throwing an instance of 'c10::DistBackendError'` (then `  what():  …`)
TERMINATE_RE = re.compile(r"terminate called after throwing an instance of '([\w:<>]+)'")
_LOGREC_RE = re.compile(
    r"^(?:\[?\d{4}[-/]\d\d[-/]\d\d[ T]\d\d:\d\d|\[?(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\b"
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d|\[rank\d+\]|\d\d:\d\d:\d\d\b)"
)


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


Event = Traceback | ProgressPoint | SignatureHit  # what one feed() hands out


def event_line(e: Event) -> int:
    """The line an event sorts by (a traceback's first line)."""
    return e.first_line if isinstance(e, Traceback) else e.line


@dataclass
class OpenTraceback:
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


def copy_open(tb: OpenTraceback | None) -> OpenTraceback | None:
    if tb is None:
        return None
    return OpenTraceback(tb.thread, tb.first_line, list(tb.lines), tb.state, list(tb.excs), list(tb.frames),
                         tb.concurrent, tb.continuation, tb.garbage, tb.ignored, tb.rank, tb.record, tb.bare,
                         tb.threaded)


class TracebackAssembly(ThreadHeaders):
    """LogScanner's traceback half (a mixin): opens, grows and closes the current stream's traceback (`_tb`),
    pairing it with the thread headers waiting in `_pending`. The state is set by LogScanner.reset()."""

    _tb: OpenTraceback | None
    _rank: int | None  # the current line's rank
    _record: str  # the current line's record prefix shape
    _out: list[Event]  # events completed by the current feed()
    tracebacks: deque[Traceback]
    threads: dict[str, ThreadState]

    def _hit(self, hit: SignatureHit) -> None:
        """Keep a signature hit (LogScanner's bookkeeping)."""
        raise NotImplementedError

    def _worker(self, header: Header | None) -> str | None:
        """Who printed it: the thread of its header, the rank of its stream (`rank3`, `rank3/drafter-1`), or None
        (the main thread of a single process)."""
        if self._rank is None:
            return header.name if header else None
        return f"rank{self._rank}/{header.name}" if header else f"rank{self._rank}"

    def _open(self, n: int, t: str, *, ignored: bool = False) -> None:
        header = None if ignored or not self._pending else self._pending.popleft()
        tb = OpenTraceback(thread=None if ignored else self._worker(header),
                           first_line=header.line if header else n, ignored=ignored, rank=self._rank,
                           record=self._record, threaded=header is not None)
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
        tb = OpenTraceback(thread=self._worker(header), first_line=header.line if header else n, rank=self._rank,
                           record=self._record, bare=True, threaded=header is not None)
        if header:
            tb.add(header.line, header.text)
        tb.add(n, t)
        tb.excs.append((m.group(1), m.group(2) if m.re is BARE_EXC_RE else None, n))
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
        m = HEADER_RE.search(t)
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
        if FRAG in t:
            self._cut_headers(n, t.count(FRAG))
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
            if em and not _cut_name(em):
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
        if (parse_progress(t, n) is not None or _LOGREC_RE.match(t) or END_RE.match(t) or _FOREIGN_RE.match(t)
                or PYTEST_SUMMARY_RE.match(t) or tb.continuation >= MAX_CONTINUATION):
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
        nxt = OpenTraceback(thread=self._worker(header), first_line=header.line if header else n, rank=tb.rank,
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
        """The open traceback is complete: hand it out as a Traceback."""
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

    def _header_only(self, h: Header) -> None:
        """A thread header whose traceback never came (or was grepped away, as in the seed)."""
        self._finish(Traceback(self._worker(h), h.line, h.line, h.text, None, None, rank=self._rank),
                     [(h.line, h.text)], h.line)

    def _finish(self, tb: Traceback, lines: list[tuple[int, str]], exc_line: int, *, threaded: bool = True) -> None:
        """A finished traceback's signature hits, its thread's crashed state, and the event itself."""
        seen: set[str] = set()
        # the exception lines first: a frame's source line (`raise RuntimeError("…")`) is weaker evidence
        for n, t in sorted(lines, key=lambda nt: nt[1][:1].isspace()):
            for rule in signatures.match_line(t):
                if rule.signature.id not in seen:
                    seen.add(rule.signature.id)
                    tb.hits.append(SignatureHit(rule.signature, n, t.strip()[:500]))
        exc_text = next((t for n, t in lines if n == exc_line), tb.exc_line)
        for rule in signatures.match_exception(tb.exc_type, tb.frames):
            if rule.signature.id not in seen:
                seen.add(rule.signature.id)
                text = exc_text.strip()[:500]
                if rule.exc_frames and (path := signatures.cache_artifact(tb.text)) and path not in text:
                    text = f"{text} (loading {path})"[:500]
                tb.hits.append(SignatureHit(rule.signature, exc_line, text))
        # a thread's traceback: under its `Exception in thread` header, or without one (lost, or a replica of
        # DataParallel, or a pool's worker) when its frames show it ran in a thread
        in_thread = ((threaded and tb.thread is not None) or _REPLICA_RE.search(tb.text) is not None
                     or any(p.endswith(_THREAD_FRAMES) for p in tb.frames))
        if not seen and in_thread and tb.exc_type is not None:
            # a worker *thread* (ranks are processes), or a DataParallel replica (a thread of this process)
            for rule in signatures.match_frames(tb.frames):
                seen.add(rule.signature.id)
                tb.hits.append(SignatureHit(rule.signature, exc_line, exc_text.strip()[:500]))
        if len(seen) > 1:  # one traceback, one cause: drop what a better explanation in it supersedes
            keep = {r.signature.id for r in signatures.drop_superseded([signatures.BY_ID[i] for i in seen])}
            tb.hits[:] = [h for h in tb.hits if h.signature.id in keep]
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
