"""Fan-out to many hosts: results in the order given, a bounded pool, and a host that never answers costs its
deadline — a row saying so — without holding up the others or the command."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from dflashctl.commands.fanout import fan_out
from dflashctl.commands.hosts import check_hosts
from dflashctl.commands.status import status_all
from dflashctl.errors import ExitCode
from dflashctl.remote import connect


def test_results_come_back_in_the_order_given_with_at_most_workers_calls_at_once() -> None:
    lock, active, peak = threading.Lock(), [0], [0]
    gate = threading.Barrier(3)

    def call(i: int) -> int:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        if i < 3:
            gate.wait(30)  # the first three meet: three really ran at once
        with lock:
            active[0] -= 1
        return i * i

    assert fan_out(list(range(10)), call, lambda i, s: -1, workers=3) == [i * i for i in range(10)]
    assert peak[0] == 3


def test_a_call_that_never_returns_is_the_late_row_and_the_rest_are_not_held() -> None:
    release = threading.Event()

    def call(i: int) -> str:
        if i == 1:
            release.wait()  # a host that accepted the connection and then went silent
        return f"ok {i}"

    try:
        out = fan_out([0, 1, 2], call, lambda i, s: f"late {i} after {s:g} s", deadline_s=3)
    finally:
        release.set()
    assert out == ["ok 0", "late 1 after 3 s", "ok 2"]


def test_a_failing_call_is_raised_in_the_callers_thread() -> None:
    def call(i: int) -> int:
        raise ValueError(f"bug {i}")

    with pytest.raises(ValueError, match="bug"):
        fan_out([7], call, lambda i, s: 0)


HANGS = "#!/bin/sh\nexec sleep 600\n"  # a host's python that never answers


@pytest.mark.slow
def test_status_all_and_hosts_check_give_a_hung_host_its_row_and_the_healthy_one_its_status(local_host,
                                                                                             tmp_path: Path) -> None:
    hung_python = tmp_path / "hung-python"
    hung_python.write_text(HANGS)
    hung_python.chmod(0o755)
    hung = replace(local_host.host, name="stuck", python=str(hung_python))
    lines = status_all([hung, local_host.host], connect, deadline_s=15)  # generous: the healthy one answers in it
    assert [ln.host for ln in lines] == ["stuck", "local"]
    assert lines[0].error == "host stuck: no answer within 15 s" and lines[0].exit_code == ExitCode.NOT_FINISHED
    assert lines[1].error is not None and "no run" in lines[1].error  # it answered: an empty workspace
    reports = check_hosts([local_host.host, hung], timeout=10)
    assert [r.host.name for r in reports] == ["local", "stuck"]
    assert reports[0].checks[0].status == "ok"
    assert not reports[1].ok and reports[1].exit_code in (ExitCode.NOT_FINISHED, ExitCode.NOT_FOUND)
