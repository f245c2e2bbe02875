"""Cause first (issue 28): `status`/`diagnose` and every notification start with the signature, the worker that failed
first, the last lines of its traceback and the remedy; then the rest."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from dflashctl.analysis.cause import TAIL_LINES, cause_of, tail_lines
from dflashctl.cli.statusview import render
from dflashctl.commands.diagnose import diagnose
from dflashctl.sentinel.deliver import text_of
from dflashctl.sentinel.events import EventTracker
from dflashctl.sentinel.notify import compose
from tests.sentinel.test_events import Run, steps, thread_oom

REAL = Path(__file__).parent / "data" / "real"


def _health(stem: str):  # noqa: ANN202
    return diagnose([REAL / f"{stem}.log"], []).health


def test_a_crashed_threads_cause_names_signature_worker_traceback_tail_and_remedy() -> None:
    cause = cause_of(_health("i28-gloo-recv-timeout-thread-pipedream"))
    assert cause is not None
    lines = cause.lines()
    assert lines[0].startswith("cause: nccl-timeout — A collective operation timed out")
    assert lines[1] == "in: Thread-9"
    tail = [ln for ln in lines if ln.startswith("  | ")]
    assert len(tail) == TAIL_LINES and tail[-1].endswith("Timed out waiting 1800000ms for recv operation to complete")
    assert lines[-1].startswith("what to do: Find the rank that stopped first")


def test_the_root_cause_rank_is_named_first_of_several_and_its_evidence_line_stands_in_for_a_traceback() -> None:
    cause = cause_of(_health("dist-torchrun-sigkill-rank7-drafter"))
    assert cause is not None and cause.signature == "host-oom"
    assert cause.worker == "rank7"
    assert any(ln.startswith("  | ") for ln in cause.lines())


def test_a_healthy_log_has_no_cause() -> None:
    healthy = next(p.stem for p in sorted(REAL.glob("*.json")) if '"healthy": true' in p.read_text())
    assert cause_of(_health(healthy)) is None


def test_tail_lines_keeps_the_last_non_blank_lines_and_cuts_long_ones() -> None:
    tb = "Traceback (most recent call last):\n  File \"a.py\", line 1\n\n    f()\nValueError: " + "x" * 500 + "\n"
    tail = tail_lines(tb, 3)
    assert tail[0] == '  File "a.py", line 1' and tail[1] == "    f()" and tail[2].startswith("ValueError: xxx")
    assert len(tail[2]) == 200 and tail[2].endswith("…")
    assert tail_lines(None) == ()


def test_status_view_starts_with_the_cause_right_under_its_header() -> None:
    console = Console(width=300, record=True, color_system=None)
    console.print(render("diagnose", _health("i28-gloo-recv-timeout-thread-pipedream")))
    lines = console.export_text().splitlines()
    assert lines[0].startswith("diagnose")
    assert lines[1].startswith("cause: nccl-timeout")
    assert lines[2] == "in: Thread-9"
    why = next(i for i, ln in enumerate(lines) if ln.strip().startswith("why:"))
    assert why > 3 and any(ln.startswith("what to do:") for ln in lines[:why])


def test_a_crash_notification_starts_with_the_cause_then_the_headline() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    events = tr.update(run.look(11.0, thread_oom("drafter-1")))
    crash = next(e for e in events if e.kind == "worker-crashed")
    assert crash.data["traceback_tail"][-1].startswith("torch.OutOfMemoryError: CUDA out of memory.")
    text = text_of(compose(events, "pve")).splitlines()
    assert text[0].startswith("cause: cuda-oom — A GPU ran out of memory.")
    assert text[1] == "in: drafter-1"
    assert text[2].startswith("  | ") and any("torch.OutOfMemoryError" in ln for ln in text[2:2 + TAIL_LINES])
    remedy = next(i for i, ln in enumerate(text) if ln.startswith("what to do:"))
    headline = next(i for i, ln in enumerate(text) if ln.startswith("pve run r1: drafter-1 crashed"))
    assert remedy < headline and not any(ln.startswith("remedy:") for ln in text)


def test_a_notification_without_a_cause_is_as_before() -> None:
    run, tr = Run(), EventTracker("r1")
    first = tr.update(run.look(11.0, steps(1, 4)))
    text = text_of(compose(first, "pve")).splitlines()
    assert text[0].startswith("pve run r1: first step")
