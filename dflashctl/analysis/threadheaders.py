"""`Exception in thread NAME:` headers, put back together when threads that crashed at once cut them in pieces.

Each thread header is paired, in order, with the next traceback (LogScanner keeps the waiting headers per stream).
Interleaved writes cut a header after `Exception in thread ` (its name comes on a later line, maybe glued to other
threads' names or to another thread's exception type), or glue several names into one: these pieces are counted
and matched here; a name that cannot be recovered is dropped, never invented.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

HEADER_TTL = 50  # lines a thread header waits for its `Traceback (most recent call last):`

HEADER_RE = re.compile(r"Exception in thread ((?:(?!Exception in thread ).)+?):\s*$")
FRAG = "Exception in thread "
_FRAG_NAME_RE = re.compile(  # the name half of a header cut in two; never a traceback's own lines
    r"^(?!Traceback \(most|The above exception|During handling|.*(?:Error|Exception|Interrupt|Exit|Warning):\s*$)"
    r"(\S[^:]{0,120}):\s*$"
)
NAME_RE = re.compile(r"^[\w.\-]{1,80}(?: \([\w.<>\-]{1,80}\))?$")  # drafter-1, Thread-3 (work), MainThread

NAME_BEFORE_FRAME_RE = re.compile(r'^([\w.\-]{1,80}?)\s+File "')  # `drafter-1  File "…/threading.py", …`
# Another thread's exception type, written between a cut header's `Exception in thread ` and its name:
# `ValueErrordrafter-1:` (the type's `: message` follows on a later line).
_GLUED_TYPE_RE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*?(?:Error|Exception|Interrupt|Exit|Warning|Failed|Fault)(?=\S)"
)


@dataclass
class Header:
    """A thread header waiting for its traceback: the name and where (and as what text) it was printed."""

    name: str
    line: int
    text: str


def _plausible_name(name: str) -> bool:
    """A thread name, not a piece of some other line that an interleaved write glued on."""
    return 0 < len(name) <= 120 and not any(x in name for x in ("Traceback (", 'File "', "Exception in thread"))


def _without_glued_type(name: str) -> str:
    """`ValueErrordrafter-1` → `drafter-1`; a name with nothing glued on comes back as it is."""
    m = _GLUED_TYPE_RE.match(name)
    rest = name[m.end():] if m else ""
    return rest if rest and NAME_RE.match(rest) else name


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


class ThreadHeaders:
    """LogScanner's header half (a mixin): counts cut headers, recovers their names, queues whole headers.
    The state is the current stream's, set by LogScanner.reset() and swapped by LogScanner._switch()."""

    _pending: deque[Header]  # whole headers, oldest first, each waiting for its traceback
    _frag_line: int | None  # a header was cut after `Exception in thread `: names follow
    _frags: int  # how many such cut headers wait for their names

    def _unglue(self, n: int, t: str) -> str:
        """`Exception in thread ` + another thread's line (`Traceback (most recent call last):`): count the
        cut header, return the other line to be read on its own."""
        m = HEADER_RE.search(t)
        if m is None or _plausible_name(m.group(1)):
            return t
        self._cut_headers(n, t[: m.start(1)].count(FRAG))
        return t[m.start(1):]

    def _header(self, n: int, t: str, m: re.Match[str]) -> None:
        """`Exception in thread NAME:`; an earlier bare `Exception in thread ` on the same line is another
        thread's header cut in two by an interleaved write: its name comes on a later line."""
        head = t[: m.start()]
        if self._frags and head.strip() and FRAG not in head and " " not in head.strip():
            self._names(n, head.strip() + ":")  # `drafter-2` (an earlier cut header's name) + a new header
        cut = head.count(FRAG)  # other headers cut short on this line (their names may be glued here)
        name = _without_glued_type(m.group(1).strip())
        names: list[str] = []
        for c in range(max(cut + 1, 4), 1, -1):  # glued names split on their common prefix
            names = _split_names(name, c)
            if names:
                break
        pieced = bool(names) or cut > 0  # from an interleaved line: keep only what looks like a thread name
        names = [x for x in names or [name] if not pieced or NAME_RE.match(x)]
        for name in names:
            self._pending.append(Header(name, n, f"{FRAG}{name}:"))
        for piece in head.split(FRAG)[1:]:
            if NAME_RE.match(piece.strip()):  # `Exception in thread A` + `Exception in thread B:`
                self._pending.append(Header(piece.strip(), n, f"{FRAG}{piece.strip()}:"))
                cut -= 1
        if cut - (len(names) - 1) > 0:
            self._cut_headers(n, cut - (len(names) - 1))

    def _cut_headers(self, n: int, count: int) -> None:
        """`count` headers were cut after `Exception in thread ` on line n: their names come on later lines."""
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
        names = [x for x in names if NAME_RE.match(x)]  # a name pieced together must look like one
        for name in names:
            self._pending.append(Header(name, n, f"{FRAG}{name}:"))
        self._frags -= max(1, len(names))
        if self._frags <= 0:
            self._frag_line, self._frags = None, 0
        return True
