"""Raw log bytes, read fast: where the next "special" line starts (at C speed), and how a line is decoded.

A special line is one that can start or hold a traceback, a signature or a worker's death (it holds one of the
literal anchors below); every other line can at most be progress, so LogScanner never decodes the ordinary ones.
next_special() finds them by pivot bytes (anchorfind.py), or in a big mapped file by GNU grep (grepfind.py);
NextSpecial, the plain regex way, is kept as the reference they are tested against.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

from dflashctl.analysis import signatures
from dflashctl.analysis.anchorfind import AnchorFinder
from dflashctl.analysis.workers import ANCHORS as WORKER_ANCHORS

if TYPE_CHECKING:
    from dflashctl.analysis.grepfind import GrepFinder

_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")

# The anchors: literal words only (see signatures.ANCHORS), so the regex engine skips ordinary text at C speed.
_ALL_ANCHORS = ("Traceback (most recent call last)", "Exception", "Failed", "Interrupt", "terminate called",
                "OutOfResources", "Unsupported", *signatures.ANCHORS, *WORKER_ANCHORS)
# Python's regex engine skips text quickly only while the next character cannot start an alternative: anchors that
# start with a lower-case letter would make nearly every position a candidate. Those are found with bytes.find
# (C speed, one pass each); the regex keeps the rest.
_LOWER_ANCHORS = tuple(sorted({a.encode() for a in _ALL_ANCHORS if a[:1].islower()}))
ANCHORS = tuple(sorted({a.encode() for a in _ALL_ANCHORS}))


SMALL = 1 << 14  # below this many bytes, choosing pivots costs more than the plain regex's pass


def next_special(buf: bytes, end: int, extra: re.Pattern[bytes] | None = None,
                 fd: int | None = None) -> AnchorFinder | NextSpecial | GrepFinder:
    """Where the special lines of buf[:end] are: each anchor by a pivot byte (anchorfind.py, several times faster
    than special_re() on a big buffer); `extra`, a user's progress regex, as one more source. A small feed (the
    live watch's few new lines) takes the plain regex, which needs no choosing. A big mapped file (fd: the file
    buf maps from byte 0) goes to GNU grep, in parallel (grepfind.py), unless a user's regex must be searched too
    (grep's dialect is not Python's)."""
    if fd is not None and extra is None:  # grepfind (and shutil, subprocess) loaded only for a mapped file
        from dflashctl.analysis import grepfind

        if end >= grepfind.GREP_MIN:
            finder = grepfind.start(fd, buf, end, ANCHORS)
            if finder is not None:
                return finder
    if end < SMALL:
        return NextSpecial(buf, end, special_re() if extra is None else _joined(extra))
    return AnchorFinder.build(buf, end, ANCHORS, extra)


@lru_cache(maxsize=16)
def _joined(extra: re.Pattern[bytes]) -> re.Pattern[bytes]:
    return re.compile(special_re().pattern + b"|" + extra.pattern)


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


@lru_cache(maxsize=1)
def special_re() -> re.Pattern[bytes]:
    """The upper-case anchors as one regex (LogScanner adds a user's progress regex). Built on first use: only small
    feeds take it, and a one-shot status (a new process, one 1 MiB tail: the pivot search) never does."""
    return re.compile(_trie(sorted({a for a in _ALL_ANCHORS if not a[:1].islower()})).encode())


class NextSpecial:
    """Where the next special line of buf[:end] starts (an anchor's position), each source searched once per pass:
    the regex of upper-case anchors and one bytes.find per lower-case anchor, their last answers kept. The plain
    way: the reference next_special is tested against."""

    def __init__(self, buf: bytes, end: int, regex: re.Pattern[bytes]) -> None:
        self.buf, self.end, self.regex = buf, end, regex
        self.found = {a: -2 for a in _LOWER_ANCHORS}  # -2: not searched yet, -1: none left
        self.match = -2

    def close(self) -> None:
        """Nothing to stop (the finders share one interface: GrepFinder's stops its grep)."""

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


def clean(raw: bytes) -> str:
    """A line's text: invalid UTF-8 replaced, ANSI colour and cursor codes dropped."""
    text = raw.decode("utf-8", "replace")
    if "\x1b" in text:
        text = _ANSI_RE.sub("", text)
    return text
