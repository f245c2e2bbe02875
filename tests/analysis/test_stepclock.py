"""The watch's timing rules (analysis/stepclock.py): when the run's last new step happened, as far as it is known."""

from __future__ import annotations

from dflashctl.analysis.stepclock import StepClock


def test_a_step_found_at_the_first_look_is_dated_by_the_logs_mtime() -> None:
    c = StepClock(stall_window_s=300.0)
    assert c.see(40.0, now=1000.0, log_mtime=640.0) == 640.0  # written 6 minutes ago: a stall can be judged at once
    assert c.see(40.0, now=1001.0, log_mtime=640.0) == 640.0


def test_without_an_mtime_a_first_step_has_no_age_until_it_stands_still_a_whole_window() -> None:
    c = StepClock(stall_window_s=300.0)
    assert c.see(40.0, now=1000.0, log_mtime=None) is None
    assert c.see(40.0, now=1299.0, log_mtime=None) is None
    assert c.see(40.0, now=1300.0, log_mtime=None) == 1000.0


def test_a_live_watch_counts_the_first_step_as_fresh_and_dates_each_new_one() -> None:
    c = StepClock(stall_window_s=300.0, live=True)
    assert c.see(40.0, now=1000.0, log_mtime=None) == 1000.0
    assert c.see(41.0, now=1010.0, log_mtime=1009.0) == 1010.0  # a new step: seen now (mtime only dates a first look)
    assert c.see(41.0, now=1500.0, log_mtime=1009.0) == 1010.0


def test_reset_forgets_the_last_runs_step() -> None:
    c = StepClock(stall_window_s=300.0)
    c.see(40.0, now=1000.0, log_mtime=900.0)
    c.reset()
    assert c.step is None and c.see(3.0, now=2000.0, log_mtime=None) is None  # a first look again
