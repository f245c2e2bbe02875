"""The first full scan through GNU grep (grepfind.py) against the pivot search and the line-by-line reference: a
mapped file scanned with grep finding its special lines gives the report its bytes give, and so does every
fallback (grep missing, grep failing at once, grep failing mid-way)."""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflashctl.analysis import grepfind, logscan
from dflashctl.analysis.grepfind import GrepFinder
from dflashctl.analysis.logscan import LogReport, LogScanner
from dflashctl.analysis.rawlines import ANCHORS
from tests.analysis.test_fullscan import LOGS, TRICKY, report_of, same, special_lines, truth
from tests.analysis.test_logscan import LINE_KINDS


@pytest.fixture(autouse=True)
def grep_for_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Here every mapped file goes to grep, however small."""
    monkeypatch.setattr(grepfind, "GREP_MIN", 0)


def fake_grep(tmp_path: Path, body: str) -> str:
    """A stand-in for a grep that breaks (the real one, cut short, or none at all), as a program on disk."""
    exe = tmp_path / "broken-grep"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def mapped(path: Path) -> tuple[LogReport, list[GrepFinder]]:
    """The mapped scan of path, and the grep finders it used (to see which path ran and that grep was reaped)."""
    used: list[GrepFinder] = []
    real_start = grepfind.start

    def spy(*args):  # noqa: ANN002, ANN202
        f = real_start(*args)
        if f is not None:
            used.append(f)
        return f

    grepfind.start = spy
    try:
        s = LogScanner()
        with path.open("rb") as f:
            s.feed_file(f)
        s.flush()
        return s.report(), used
    finally:
        grepfind.start = real_start


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_grep_finds_the_lines_holding_an_anchor_in_every_real_log(path: Path) -> None:
    data = path.read_bytes()
    with path.open("rb") as f:
        if not data:
            return
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        finders: list[GrepFinder] = []

        def make(buf, end):  # noqa: ANN001, ANN202
            finders.append(grepfind.start(f.fileno(), buf, end, ANCHORS))
            return finders[-1]

        assert special_lines(m, make) == truth(data)
        finders[0].close()
        assert finders[0].fallback is None and finders[0].proc.returncode is not None


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_a_mapped_real_log_scanned_through_grep_reports_what_the_reference_does(path: Path) -> None:
    data = path.read_bytes()
    got, used = mapped(path)
    if data.rfind(b"\n") > 0:
        assert used and used[0].fallback is None  # grep ran, to the end
        assert used[0].proc.returncode is not None  # and was reaped
    same(got, report_of(data, None, fast=False))
    same(got, report_of(data, [4096]))


@pytest.mark.parametrize("broken", ["exit 2", 'grep "$@" | head -n 3; exit 2', "kill -9 $$"])
@pytest.mark.parametrize("path", LOGS[::7], ids=lambda p: p.name)
def test_when_grep_fails_the_pivot_search_takes_the_rest_and_the_report_is_the_same(
        path: Path, broken: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grepfind, "GREP", fake_grep(tmp_path, broken))
    data = path.read_bytes()
    got, used = mapped(path)
    if "head" not in broken and used and truth(data):  # asked at byte 0, grep had already failed
        assert used[0].fallback is not None
    same(got, report_of(data, None, fast=False))


def test_grep_failing_after_some_answers_hands_the_rest_to_the_pivot_search(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grepfind, "GREP", fake_grep(tmp_path, 'grep "$@" | head -n 3; exit 2'))
    data = b"".join(b"step=%d loss=2.0 tok/s=5.0\neval: NaN check passed\n" % i for i in range(50)) + TRICKY[0]
    log = tmp_path / "train.log"
    log.write_bytes(data)
    got, used = mapped(log)
    assert used[0].fallback is not None and got.tracebacks
    same(got, report_of(data, None, fast=False))


@pytest.mark.parametrize("odd", [
    "grep \"$@\" | sed 's/^[0-9]*://'",  # no line numbers (a grep without -n's format)
    "grep \"$@\" | awk -F: -v OFS=: '{ $2 = $2 + 1; print }'",  # offsets that do not point at the match
    "echo 'Binary file matches'; exit 0",
])
def test_answers_that_are_not_gnu_greps_or_miss_the_buffer_hand_the_scan_to_the_pivot_search(
        odd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grepfind, "GREP", fake_grep(tmp_path, odd))
    data = b"".join(b"step=%d loss=2.0 tok/s=5.0\neval: NaN check passed\n" % i for i in range(50)) + TRICKY[0]
    log = tmp_path / "train.log"
    log.write_bytes(data)
    got, used = mapped(log)
    assert used and used[0].fallback is not None and used[0].proc.returncode is not None
    assert got.tracebacks
    same(got, report_of(data, None, fast=False))


@pytest.mark.parametrize("path", LOGS[::5], ids=lambda p: p.name)
def test_without_grep_the_pivot_search_scans_alone(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grepfind, "GREP", "dflash-no-such-grep")
    got, used = mapped(path)
    assert not used
    same(got, report_of(path.read_bytes(), None, fast=False))


@pytest.mark.parametrize("tricky", range(len(TRICKY)))
def test_tricky_logs_through_grep(tricky: int, tmp_path: Path) -> None:
    line = b"step=7 loss=1.2500 tok/s=1800.0 lr=3.00e-04 acc=0.5 acc_len=2.10\n"
    data = line * 500 + TRICKY[tricky] + line * 3 + b"step=8 loss=1.0 tok/s=2.0"  # and a truncated last line
    log = tmp_path / "train.log"
    log.write_bytes(data)
    got, used = mapped(log)
    assert used and (got.tracebacks or got.hits)
    same(got, report_of(data, None, fast=False))


def test_a_file_that_grew_after_it_was_mapped_gives_the_mapped_part_only(tmp_path: Path) -> None:
    first = TRICKY[0] + b"eval: NaN check\n" * 50
    log = tmp_path / "train.log"
    log.write_bytes(first)
    with log.open("rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        with log.open("ab") as w:  # the trainer writes on: more special lines past the map's end
            w.write(TRICKY[2] * 2000)
        finder = grepfind.start(f.fileno(), m, len(first), ANCHORS)
        assert special_lines(m, lambda b, e: finder) == truth(first)
        finder.close()
        assert finder.fallback is None and finder.proc.returncode is not None
        assert f.tell() == 0  # grep read its own copy of the file: the caller's position is left alone


def test_a_users_progress_regex_keeps_the_python_search(tmp_path: Path) -> None:
    import re
    log = tmp_path / "train.log"
    log.write_bytes(b"it 5 of 10 loss 2.5\n" * 100 + TRICKY[0])
    rx = re.compile(r"it (?P<step>\d+) of (?P<total>\d+) loss (?P<loss>[\d.]+)")
    used: list[object] = []
    real_start = grepfind.start
    grepfind.start = lambda *a: used.append(a) or real_start(*a)  # type: ignore[assignment]
    try:
        s = LogScanner(rx)
        with log.open("rb") as f:
            s.feed_file(f)
        s.flush()
    finally:
        grepfind.start = real_start
    assert not used
    ref = LogScanner(rx)
    ref.fast = False
    ref.feed(log.read_bytes())
    ref.flush()
    same(s.report(), ref.report())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, len(LINE_KINDS) - 1), st.integers(0, 10**6)), max_size=120),
       st.sampled_from([2, 5, 1024]))
def test_fast_path_through_grep_reports_what_the_line_by_line_reference_reports(
        tmp_path: Path, lines, keep) -> None:  # noqa: ANN001
    data = b"".join((LINE_KINDS[k] % n if b"%d" in LINE_KINDS[k] else LINE_KINDS[k]) + b"\n" for k, n in lines)
    log = tmp_path / f"fuzz-{os.getpid()}.log"
    log.write_bytes(data)
    saved, logscan.KEEP_PROGRESS = logscan.KEEP_PROGRESS, keep
    try:
        got, _ = mapped(log)
        same(got, report_of(data, None, fast=False), every_hit=False)
        same(got, report_of(data, None), every_hit=True)
    finally:
        logscan.KEEP_PROGRESS = saved
