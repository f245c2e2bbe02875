"""The one process-verdict rule (analysis/verdict.py) and the ordered Verdict (DESIGN §5)."""

from __future__ import annotations

import itertools

import pytest

from dflashctl.analysis.health import Evidence, judge
from dflashctl.analysis.verdict import EXIT_CODE_GRACE_S, STARTING_GRACE_S, EndWatch, ProcessState, process_verdict
from dflashctl.commands.runlookup import RunInfo
from dflashctl.model import Verdict


def test_verdicts_sort_in_designs_order_live_before_ended() -> None:
    assert list(Verdict) == sorted(Verdict, key=lambda v: ["starting", "training", "degraded", "stalled", "crashed",
                                                             "finished", "stopped", "lost"].index(v.value))
    live = [v for v in Verdict if not v.is_terminal]
    assert live == [Verdict.STARTING, Verdict.TRAINING, Verdict.DEGRADED, Verdict.STALLED]
    assert all(a < b for a in live for b in Verdict if b.is_terminal)
    assert max([Verdict.TRAINING, Verdict.STALLED, Verdict.STARTING]) == Verdict.STALLED
    assert sorted([Verdict.LOST, Verdict.TRAINING, Verdict.CRASHED]) == [Verdict.TRAINING, Verdict.CRASHED,
                                                                         Verdict.LOST]
    assert Verdict.TRAINING == "training" and str(Verdict.LOST) == "lost"  # still the JSON values


def test_failures_are_the_verdicts_that_need_a_person() -> None:
    assert {v for v in Verdict if v.is_failure} == {Verdict.DEGRADED, Verdict.STALLED, Verdict.CRASHED, Verdict.LOST}
    assert {v for v in Verdict if v.exit_code != 0} == {v for v in Verdict if v.is_failure} | {Verdict.STOPPED}


@pytest.mark.parametrize(("proc", "stepped", "pid_known", "now", "want"), [
    (ProcessState(alive=True), False, True, 0.0, Verdict.STARTING),
    (ProcessState(alive=True), True, True, 0.0, Verdict.TRAINING),
    (ProcessState(alive=True, job="evaluating run x"), False, True, 0.0, Verdict.TRAINING),
    (ProcessState(alive=True, stopped=True), True, True, 0.0, Verdict.STOPPED),  # being stopped: already stopped
    (ProcessState(alive=False, exit_code=0), True, True, 0.0, Verdict.FINISHED),
    (ProcessState(alive=False, exit_code=1), True, True, 0.0, Verdict.CRASHED),
    (ProcessState(alive=False, exit_code=143, stopped=True), True, True, 0.0, Verdict.STOPPED),
    (ProcessState(alive=False, started_at=100.0), False, False, 100.0 + STARTING_GRACE_S - 1, Verdict.STARTING),
    (ProcessState(alive=False, started_at=100.0), False, False, 100.0 + STARTING_GRACE_S, Verdict.LOST),
    (ProcessState(alive=False, started_at=100.0), False, True, 101.0, Verdict.LOST),  # its pid lived and is gone
])
def test_process_verdict(proc: ProcessState, stepped: bool, pid_known: bool, now: float, want: Verdict) -> None:
    assert process_verdict(proc, stepped=stepped, pid_known=pid_known, now=now) == want


@pytest.mark.parametrize(("alive", "exit_code", "stopped"),
                         list(itertools.product([True, False], [None, 0, 1, 137], [False, True])))
def test_runs_and_status_give_a_run_the_same_ended_verdict(alive: bool, exit_code: int | None,
                                                           stopped: bool) -> None:
    """`runs` (process state only) and `status` (health.judge, with no log to add) never disagree about how a run
    ended: one rule, analysis/verdict.recorded_end, decides both."""
    info = RunInfo(id="r", dir="/w/runs/r", pid=7, alive=alive, exit_code=exit_code, stopped=stopped, meta=None)
    by_runs = info.verdict(now=0.0)
    by_status = judge(Evidence(now=0.0, process=info.process)).verdict
    if by_runs.is_terminal or by_status.is_terminal:
        assert by_runs == by_status


def test_a_gone_run_settles_for_the_grace_then_is_ended() -> None:
    w = EndWatch()
    gone = ProcessState(alive=False)
    assert w.see(ProcessState(alive=True), 10.0) == "running"
    assert w.see(gone, 20.0) == "settling"
    assert w.see(gone, 20.0 + EXIT_CODE_GRACE_S - 0.5) == "settling"
    assert w.see(gone, 20.0 + EXIT_CODE_GRACE_S) == "ended"


def test_an_exit_code_or_a_run_nobody_supervises_ends_at_once_and_life_resets_the_grace() -> None:
    assert EndWatch().see(ProcessState(alive=False, exit_code=3), 0.0) == "ended"
    assert EndWatch().see(ProcessState(alive=False), 0.0, supervised=False) == "ended"  # adopted: no exit code
    w = EndWatch()
    assert w.see(ProcessState(alive=False), 0.0) == "settling"
    assert w.see(ProcessState(alive=True), 1.0) == "running"  # the supervisor (ending) was still there
    assert w.see(ProcessState(alive=False), EXIT_CODE_GRACE_S) == "settling"  # the grace counts afresh
