"""`--restart-on` takes causes (issue 28 part 3): signature ids restart an attempt that ended with them; import-error
and config errors never restart, whatever `--restart-on` says."""

from __future__ import annotations

import pytest

from dflashctl.analysis.watchspec import Restart, parse_restart
from dflashctl.errors import ConfigError
from dflashctl.sentinel.chain import restart_why
from tests.sentinel.test_events import Run, steps

WATCHDOG = (b"[rank1]:[E1002 18:16:40.662329700 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
            b"operation timeout: WorkNCCL(SeqNum=2521, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
            b"ran for 600000 milliseconds before timing out.\n")
IMPORT = (b"Traceback (most recent call last):\n  File \"/ws/train.py\", line 3, in <module>\n    import flash_attn\n"
          b"ModuleNotFoundError: No module named 'flash_attn'\n")


def _ended(log: bytes, exit_code: int = 1):  # noqa: ANN202
    run = Run()
    run.look(10.0, steps(1, 6))
    return run.look(20.0, log, alive=False, exit_code=exit_code)


def test_restart_on_takes_signature_ids_beside_endings_in_a_fixed_order() -> None:
    assert parse_restart("nccl-timeout,host-oom", 2, None) == Restart(("nccl-timeout", "host-oom"), 2, 10.0)
    assert parse_restart("host-oom,crashed,host-oom", None, None).on == ("crashed", "host-oom")


@pytest.mark.parametrize("value, says", [("import-error", "never restarted"), ("crashed,import-error", "never"),
                                         ("nccl-timeot", "nccl-timeot is not a restartable ending")])
def test_restart_on_refuses_a_cause_that_never_passes_or_is_unknown_in_one_line(value: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_restart(value, None, None)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_an_attempt_that_ended_with_a_named_cause_restarts_and_says_why() -> None:
    why = restart_why(Restart(("nccl-timeout", "host-oom"), 3), 1, _ended(WATCHDOG), 1)
    assert why == "attempt 1 crashed (exit code 1, cause nccl-timeout); restart 1 of 3"


def test_an_attempt_that_ended_with_another_cause_does_not() -> None:
    assert restart_why(Restart(("host-oom",), 3), 1, _ended(WATCHDOG), 1) is None


def test_import_error_never_restarts_even_under_restart_on_crashed() -> None:
    view = _ended(IMPORT)
    assert [h.signature.id for h in view.health.hits] == ["import-error"]
    assert restart_why(Restart(("crashed",), 3), 1, view, 1) is None
    assert restart_why(Restart(("crashed",), 3), 1, _ended(b"RuntimeError: loader exhausted\n"), 1) is not None


def test_a_config_error_exit_never_restarts_on_a_cause_either() -> None:
    assert restart_why(Restart(("nccl-timeout",), 3), 1, _ended(WATCHDOG, exit_code=2), 2) is None
