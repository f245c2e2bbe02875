"""Find literal anchors near memchr speed: each anchor is looked for by one of its bytes (its pivot).

Python's regex engine has no multi-literal search: an alternation of words makes it try a match at nearly every
position (~30-100 MB/s), while `bytes.find` of one byte is memchr (GB/s) and a regex that starts with one literal
byte skips to it in a tight C loop. So the anchors are split among three kinds of sources, chosen per buffer from
the byte counts of a sample of the log (a weighted set cover: each step takes the source with the least cost per
anchor it newly covers):

- a rare byte: found with memchr, each hit checked by one small regex (`a(?:(?<=Fa)iled|(?<=Na)N)`: the
  lookbehind holds the anchor's bytes before the pivot) — cheapest while hits are rare;
- a common byte: the same regex searched by the regex engine, which checks the many hits in C;
- a whole word: bytes.find (Horspool: a long word skips far), for an anchor whose every byte is common.

A log full of one letter thus simply uses another. The answer is the same whatever the choice; only speed differs.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import NamedTuple

WINDOW = 1 << 19  # bytes every source searches before the next window (fits in L2/L3 cache)
SAMPLE = 1 << 13  # bytes counted at each of up to three places (start, middle, end) to choose the sources
# Costs in ns per byte of text or per hit, measured with CPython 3.11 on a shared 2-core x86-64 machine over
# cached windows (what matters is their ratios): a memchr pass, a regex pass, a pivot hit checked in Python,
# one checked by the regex engine.
MEMCHR, REGEX_PASS, PY_HIT, REGEX_HIT = 0.11, 0.8, 1200.0, 250.0


def find_cost(m: int) -> float:
    """bytes.find of an m-byte word, per byte of text (Horspool: longer words skip further)."""
    return 0.1 + 5.0 / m


class Source(NamedTuple):
    kind: str  # "memchr" | "regex" | "word"
    key: bytes  # the pivot byte, or the word
    anchors: tuple[tuple[bytes, int], ...]  # (anchor, offset of the pivot in it)


@lru_cache(maxsize=128)
def pivot_regex(pivot: int, anchors: tuple[tuple[bytes, int], ...]) -> re.Pattern[bytes]:
    """Matches, at a pivot byte, any of the anchors holding it at their offset k; it starts with the pivot as a
    literal, so a search skips to it in C."""
    alts = sorted({(b"(?<=" + re.escape(a[:k + 1]) + b")" if k else b"") + re.escape(a[k + 1:]) for a, k in anchors})
    return re.compile(re.escape(bytes((pivot,))) + b"(?:" + b"|".join(alts) + b")")


def sample_counts(buf: bytes, end: int) -> tuple[Counter[int], int]:
    """How often each byte occurs in up to three SAMPLE-sized slices of buf[:end] (start, middle, end)."""
    if end <= 3 * SAMPLE:
        sample = buf[:end]
    else:
        mid = end // 2
        sample = buf[:SAMPLE] + buf[mid:mid + SAMPLE] + buf[end - SAMPLE:end]
    return Counter(sample), len(sample)


def choose_sources(anchors: tuple[bytes, ...], counts: Counter[int] | dict[int, int], n: int) -> list[Source]:
    """The sources that together find every anchor, by the cost model above. Rates are rounded to powers of two
    first, so that nearby samples share one (cached) answer: an incremental feed does not pay for the choice."""
    n = max(n, 1)
    shift = max(0, n.bit_length() - 16)  # rates as counts per 64 Ki bytes, rounded to a power of two
    rates = tuple((b, (1 << ((counts.get(b, 0) >> shift).bit_length())) >> 1) for b in _alphabet(anchors))
    return list(_choose(anchors, rates, n >> shift or 1))


@lru_cache(maxsize=64)
def _alphabet(anchors: tuple[bytes, ...]) -> tuple[int, ...]:
    """The bytes the anchors use: asked on every incremental feed (a byte-by-byte feed spent most of its time here)."""
    return tuple(sorted({b for a in anchors for b in a}))


@lru_cache(maxsize=256)
def _choose(anchors: tuple[bytes, ...], rates: tuple[tuple[int, int], ...], n: int) -> tuple[Source, ...]:
    """Greedy weighted set cover: each step takes the source with the least cost per anchor it newly covers."""
    rate = {b: c / n for b, c in rates}
    holders = {b: {a for a in anchors if b in a} for b in rate}
    left = set(anchors)
    chosen: dict[tuple[str, bytes], list[tuple[bytes, int]]] = {}
    while left:
        best: tuple[float, str, bytes] = (float("inf"), "", b"")
        for byte, has in holders.items():
            covers = len(has & left)
            if not covers:
                continue
            for kind, pass_cost, hit in (("memchr", MEMCHR, PY_HIT), ("regex", REGEX_PASS, REGEX_HIT)):
                key = bytes((byte,))
                # a source already paid for: more anchors only make its check a little longer
                cost = rate[byte] * hit * 0.1 if (kind, key) in chosen else pass_cost + rate[byte] * hit
                best = min(best, (cost / covers, kind, key))
        for a in left:
            best = min(best, (find_cost(len(a)), "word", a))
        _, kind, key = best
        for a in sorted(left):
            if (kind == "word" and a == key) or (kind != "word" and key in a):
                chosen.setdefault((kind, key), []).append((a, a.index(key)))
                left.discard(a)
    return tuple(Source(kind, key, tuple(v)) for (kind, key), v in sorted(chosen.items()))


class AnchorFinder:
    """Where the next anchor of buf[:end] is, at or after a line start: a position inside it (on the anchor's line,
    which is all the scanner needs), or -1. The sources search window by window (WINDOW bytes, which stay in
    the CPU's cache while every source passes over them), each keeping its last answer. `extra`: a user's
    progress regex, searched as one more source (as slow as it is; not windowed, its matches may be long)."""

    def __init__(self, buf: bytes, end: int, sources: list[Source], extra: re.Pattern[bytes] | None = None) -> None:
        self.buf, self.end = buf, end
        # a memchr source's check is compiled at its pivot's first hit: in most logs most rare bytes never occur
        self.sources: list[tuple[str, bytes, re.Pattern[bytes] | None]] = [
            (s.kind, s.key, pivot_regex(s.key[0], s.anchors) if s.kind == "regex" else None) for s in sources]
        self._anchors = [s.anchors for s in sources]
        if extra is not None:
            self.sources.append(("extra", b"", extra))
        self.overlap = max((len(a) for s in sources for a, _ in s.anchors), default=0)
        self.found = [-1] * len(self.sources)  # each source's next anchor, or -1: none in [.., upto)
        self.upto = [0] * len(self.sources)
        self.hi = 0  # the current window's end

    @classmethod
    def build(cls, buf: bytes, end: int, anchors: tuple[bytes, ...],
              extra: re.Pattern[bytes] | None = None) -> AnchorFinder:
        counts, n = sample_counts(buf, end)
        return cls(buf, end, choose_sources(anchors, counts, n), extra)

    def close(self) -> None:
        """Nothing to stop (the finders share one interface: GrepFinder's stops its grep)."""

    def at(self, pos: int) -> int:
        buf, end, found, upto = self.buf, self.end, self.found, self.upto
        hi = self.hi
        if pos >= hi:  # the window moves only when passed: sources that found nothing in it are not asked again
            hi = self.hi = min(end, pos + WINDOW)
        while True:
            best = -1
            lim = min(end, hi + self.overlap)  # an anchor whose pivot is before hi ends before lim
            for j, (kind, key, rx) in enumerate(self.sources):
                at = found[j]
                if at < pos and (at >= 0 or upto[j] < hi):
                    start = max(pos, upto[j]) if at < 0 else pos
                    if kind == "word":
                        at = buf.find(key, start, lim)
                    elif kind == "memchr":
                        at = buf.find(key, start, lim)
                        if at >= 0:
                            match = (rx or self._check(j)).match
                            while at >= 0 and not match(buf, at, end):
                                at = buf.find(key, at + 1, lim)
                    else:
                        m = rx.search(buf, start, lim if kind == "regex" else end)
                        at = m.start() if m else -1
                    found[j], upto[j] = at, (hi if kind != "extra" else end)
                if at >= pos and (best < 0 or at < best):
                    best = at
            if 0 <= best < hi or hi >= end:
                return best
            hi = self.hi = min(end, hi + WINDOW)

    def _check(self, j: int) -> re.Pattern[bytes]:
        kind, key, _ = self.sources[j]
        rx = pivot_regex(key[0], self._anchors[j])
        self.sources[j] = (kind, key, rx)
        return rx
