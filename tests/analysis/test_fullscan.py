"""The first full scan: the pivot search of special lines (anchorfind.py) against the plain truth, and one big
buffer or a mapped file (LogScanner.feed_file) against chunked feeds and the line-by-line reference: whatever
sources the cost model picks, and wherever a window boundary falls, the same lines and the same report."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflashctl.analysis import anchorfind, logscan, progresslines, rawlines
from dflashctl.analysis.anchorfind import AnchorFinder, Source, choose_sources
from dflashctl.analysis.health import active_hits
from dflashctl.analysis.logscan import LogReport, LogScanner
from dflashctl.analysis.rawlines import ANCHORS, NextSpecial, special_re

DATA = Path(__file__).parent / "data"
LOGS = sorted(p for p in DATA.rglob("*") if p.is_file() and (p.suffix in (".log", ".txt")))
ALPHABET = sorted({b for a in ANCHORS for b in a})


def special_lines(data: bytes, finder_of) -> list[int]:  # noqa: ANN001 - a factory (buf, end) -> finder
    """Line starts of the special lines a finder reports, walked the way LogScanner walks them."""
    end = data.rfind(b"\n") + 1
    finder, pos, out = finder_of(data, end), 0, []
    while pos < end:
        at = finder.at(pos)
        if at < 0:
            break
        start = max(pos, data.rfind(b"\n", pos, at) + 1)
        out.append(start)
        pos = data.find(b"\n", at, end) + 1
    return out


def truth(data: bytes) -> list[int]:
    """Line starts of the complete lines holding an anchor, by plain substring tests."""
    out, pos = [], 0
    for line in data.split(b"\n")[:-1]:
        if any(a in line for a in ANCHORS):
            out.append(pos)
        pos += len(line) + 1
    return out


def forced(kind: str):  # noqa: ANN201 - a finder factory whose every source is of one kind
    def make(buf: bytes, end: int) -> AnchorFinder:
        if kind == "word":
            sources = [Source("word", a, ((a, 0),)) for a in ANCHORS]
        else:  # each anchor by its first byte, found with memchr or searched by the regex engine
            by: dict[int, list[tuple[bytes, int]]] = {}
            for a in ANCHORS:
                by.setdefault(a[len(a) // 2], []).append((a, len(a) // 2))
            sources = [Source(kind, bytes((b,)), tuple(v)) for b, v in sorted(by.items())]
        return AnchorFinder(buf, end, sources)
    return make


@pytest.fixture(autouse=True)
def pivots_for_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Here even a small feed takes the pivot search (the other scanner tests cover the plain regex there)."""
    monkeypatch.setattr(rawlines, "SMALL", 0)


@pytest.fixture
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(anchorfind, "WINDOW", 37)  # boundaries everywhere, anchors straddling them


@pytest.mark.parametrize("path", LOGS, ids=lambda p: str(p.relative_to(DATA)))
def test_every_real_log_gives_the_lines_holding_an_anchor(path: Path) -> None:
    data = path.read_bytes()
    want = truth(data)
    assert special_lines(data, lambda b, e: NextSpecial(b, e, special_re())) == want  # the reference agrees
    assert special_lines(data, lambda b, e: AnchorFinder.build(b, e, ANCHORS)) == want
    for kind in ("memchr", "regex", "word"):
        assert special_lines(data, forced(kind)) == want, kind


@pytest.mark.usefixtures("small_windows")
@pytest.mark.parametrize("path", LOGS[::3], ids=lambda p: str(p.relative_to(DATA)))
def test_window_boundaries_anywhere_lose_no_anchor(path: Path) -> None:
    data = path.read_bytes()
    for kind in ("memchr", "regex", "word"):
        assert special_lines(data, forced(kind)) == truth(data), kind


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([*ANCHORS, b"x", b"step=1 loss=2", b"\n", b" ", b"INFO ", b"\xff\xfe", b"\r"]),
                max_size=60),
       st.dictionaries(st.sampled_from(ALPHABET), st.integers(0, 5000)), st.integers(1, 200))
def test_any_choice_of_sources_finds_the_same_lines(parts: list[bytes], counts: dict[int, int], window: int) -> None:
    data = b"".join(parts) + b"\n"
    saved, anchorfind.WINDOW = anchorfind.WINDOW, window
    try:
        got = special_lines(data, lambda b, e: AnchorFinder(b, e, choose_sources(ANCHORS, counts, 4096)))
    finally:
        anchorfind.WINDOW = saved
    assert got == truth(data)


def test_the_cost_model_finds_rare_bytes_by_memchr_and_dense_words_whole() -> None:
    """Upper-case letters that never occur go by memchr; an anchor made only of common letters by its own find."""
    common = {b: 2000 for b in b"abcdefghijklmnopqrstuvwxyz_ "}
    kinds = {s.key: s.kind for s in choose_sources(ANCHORS, common, 1 << 16)}
    assert kinds[b"X"] == "memchr"
    assert kinds[b"terminate called"] == "word"
    assert {a for s in choose_sources(ANCHORS, common, 1 << 16) for a, _ in s.anchors} == set(ANCHORS)


def report_of(data: bytes, cuts: list[int] | None, fast: bool = True) -> LogReport:
    s = LogScanner()
    s.fast = fast
    if cuts is None:
        s.feed(data)
    else:
        pos, i = 0, 0
        while pos < len(data):
            n = cuts[i % len(cuts)]
            s.feed(data[pos:pos + n])
            pos, i = pos + n, i + 1
    s.flush()
    return s.report()


def same(a: LogReport, b: LogReport, every_hit: bool = True) -> None:
    """Equal reports; every_hit=False: only the hits still active (with few progress points kept, the fast path
    never parses a NaN loss that later points already made history)."""
    assert [(t.thread, t.rank, t.first_line, t.text, t.exc_type) for t in a.tracebacks] == [
        (t.thread, t.rank, t.first_line, t.text, t.exc_type) for t in b.tracebacks]
    assert [(p.line, repr(p.values)) for p in a.progress] == [(p.line, repr(p.values)) for p in b.progress]
    if every_hit:
        assert [(h.signature.id, h.line) for h in a.hits] == [(h.signature.id, h.line) for h in b.hits]
    assert [(h.signature.id, h.line) for h in active_hits(a)] == [(h.signature.id, h.line) for h in active_hits(b)]
    assert (a.threads, a.end, a.workers, a.root_cause, a.last_line_no) == (
        b.threads, b.end, b.workers, b.root_cause, b.last_line_no)


@pytest.mark.parametrize("path", LOGS, ids=lambda p: str(p.relative_to(DATA)))
def test_one_big_buffer_equals_chunked_feeds_and_the_line_by_line_reference(path: Path) -> None:
    data = path.read_bytes()
    whole = report_of(data, None)
    assert whole.last_line_no == data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    for cuts in ([1 << 20], [4096], [97, 13, 1000], [1]):
        if cuts == [1] and len(data) > 3000:
            continue  # byte by byte: the small logs carry that case
        if len(cuts) == 1 and 0 < len(data) <= cuts[0]:
            continue  # one chunk holding the whole log is the very feed(data) call of `whole`: nothing to compare
        same(whole, report_of(data, cuts))
    same(whole, report_of(data, None, fast=False))


TRICKY = [
    # two threads' tracebacks interleaved line by line, progress between
    b"step=1 loss=3.0 tok/s=10.0\nException in thread drafter-0:\nException in thread drafter-1:\n"
    b"Traceback (most recent call last):\nTraceback (most recent call last):\n"
    b'  File "/ws/a.py", line 1, in run\n  File "/ws/b.py", line 2, in run\n'
    b"RuntimeError: drafter 0 lost its block\nKeyError: 'block-1'\nstep=2 loss=2.9 tok/s=11.0\n",
    # \r bars, a traceback glued to the end of one, ANSI colour and invalid UTF-8
    b"\r 10%|\xe2\x96\x88 | 1/10\r 20%|\xe2\x96\x88\xe2\x96\x88 | 2/10Traceback (most recent call last):\n"
    b'  File "\x1b[35mtrain.py\x1b[0m", line 3, in <module>\n'
    b"\x1b[1;35mtorch.OutOfMemoryError\x1b[0m: CUDA out of memory. \xff\xfe Tried to allocate 2.00 GiB\n"
    b"bad bytes \xff\xfe here step=3 loss=nan\n",
    # ranks' tracebacks interleaved by prefix, a launcher's root cause
    b"[rank1]: Traceback (most recent call last):\n[rank0]: Traceback (most recent call last):\n"
    b'[rank1]:   File "/ws/t.py", line 9, in <module>\n[rank0]:   File "/ws/t.py", line 9, in <module>\n'
    b"[rank1]: RuntimeError: NCCL error: unhandled system error\n[rank0]: ValueError: bad shape\n"
    b"Root Cause (first observed failure):\n  exitcode  : -9 (pid: 12)\n  local_rank: 1\n",
]


@pytest.mark.parametrize("filler", [0, 37, 4096, (1 << 19) - 40, (1 << 19) - 7])
@pytest.mark.parametrize("tricky", range(len(TRICKY)))
def test_tricky_logs_at_any_offset_scan_the_same_whole_or_chunked(tricky: int, filler: int) -> None:
    """Filler of ordinary lines puts the tricky part at, and across, a 512 KiB window boundary."""
    line = b"step=7 loss=1.2500 tok/s=1800.0 lr=3.00e-04 acc=0.5 acc_len=2.10\n"
    full, rest = divmod(filler, len(line))
    pad = line * full + (b"x" * (rest - 1) + b"\n" if rest else b"")
    assert len(pad) == filler
    data = pad + TRICKY[tricky] + line * 3
    whole = report_of(data, None)
    assert whole.tracebacks or whole.hits
    same(whole, report_of(data, None, fast=False))
    same(whole, report_of(data, [65536, 1000, 7]))


@pytest.mark.usefixtures("small_windows")
@pytest.mark.parametrize("seed", range(4))
def test_random_mixes_scan_the_same_with_tiny_windows(seed: int) -> None:
    rng = random.Random(seed)
    kinds = [t + b"\n" for t in TRICKY] + [b"step=%d loss=2.0 tok/s=5.0\n" % i for i in range(5)] + [
        b"INFO data: shard 17 loaded\n", b"eval: error_rate=0.0123 retries=0 NaN check passed\n"]
    data = b"".join(rng.choice(kinds) for _ in range(200))
    saved, logscan.KEEP_PROGRESS = logscan.KEEP_PROGRESS, 5
    try:
        whole = report_of(data, None)
        same(whole, report_of(data, None, fast=False), every_hit=False)
        same(whole, report_of(data, [rng.randint(1, 500) for _ in range(5)]), every_hit=False)
    finally:
        logscan.KEEP_PROGRESS = saved


PROGRESS_PIECES = [b"step=%d loss=%.3f", b"iter %d: loss 2.1", b"Step %d/100 [00:01<00:02, 3.1it/s]", b"x" * 50,
                   b"s", b"te", b"p=3", b"loss=nan", b"10/20 [00:01<00:02, 1.5s/it]", b"LOSS: 3",
                   b"eval step=3 acc=1", b"finished", b"", b"ordinary"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(PROGRESS_PIECES), max_size=3), max_size=60),
       st.sampled_from([1, 2, 3, 5, 8, 13, 40, 100, 1 << 16]), st.sampled_from([1, 2, 3, 7, 1024]), st.booleans())
def test_the_latest_progress_lines_are_found_whatever_window_they_are_first_looked_for_in(
        lines: list[list[bytes]], window: int, keep: int, glued: bool) -> None:
    """The fast path looks for the progress tokens just below a stretch's end first and further down only when none
    is left there: any window, any number of points kept, tokens cut by the window's floor, lines without a
    newline at the end — the points of the line-by-line reference (its hits may differ with few points kept: a NaN
    loss older than the kept points is never parsed, window or not)."""
    text = [(b"" if glued else b" ").join(p % ((i,) * p.count(b"%")) if b"%" in p else p for p in parts)
            for i, parts in enumerate(lines)]
    data = b"\n".join(text)
    saved = progresslines._WINDOW, logscan.KEEP_PROGRESS
    progresslines._WINDOW, logscan.KEEP_PROGRESS = window, keep
    try:
        fast, ref = report_of(data, None), report_of(data, None, fast=False)
    finally:
        progresslines._WINDOW, logscan.KEEP_PROGRESS = saved
    assert [(p.line, repr(p.values), p.kind) for p in fast.progress] == [
        (p.line, repr(p.values), p.kind) for p in ref.progress]
    assert (fast.end, fast.last_line_no) == (ref.end, ref.last_line_no)


def _mapped_scan(path: Path, before: bytes = b"") -> LogReport:
    s = LogScanner()
    if before:
        s.feed(before)
    with path.open("rb") as f:
        s.feed_file(f)
    s.flush()
    return s.report()


@pytest.mark.parametrize("path", LOGS[::2], ids=lambda p: str(p.relative_to(DATA)))
def test_a_mapped_file_scans_as_its_bytes_do(path: Path) -> None:
    same(_mapped_scan(path), report_of(path.read_bytes(), None))


def test_feed_file_takes_empty_files_pipes_and_a_partial_line_left_before(tmp_path: Path) -> None:
    data = TRICKY[0] + b"step=9 loss=1.0 tok/s=3.0\n" * 5000
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert _mapped_scan(empty).last_line_no == 0
    log = tmp_path / "train.log"
    cut = data.index(b"Traceback") + 4  # an earlier feed left `Trac` waiting for the rest of its line
    log.write_bytes(data[cut:])
    same(_mapped_scan(log, before=data[:cut]), report_of(data, None))
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, data), os.close(w)))
    writer.start()
    s = LogScanner()
    with os.fdopen(r, "rb") as f:
        s.feed_file(f)
    writer.join()
    s.flush()
    same(s.report(), report_of(data, None))
