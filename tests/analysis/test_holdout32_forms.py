"""The wording families the fourth blind set (tests/analysis/data/holdout32) found missing, each proven on a variant
that is not the held-out line: mmengine's `Iter(train) [ N/M]` step, fairseq's `epoch 001:  N / M` position, a line
ending in a carriage return (or its copied `^M`) under a `LEVEL pid [file:line]` prefix, and pytest's `FAILED … - Type:
message` summary. The look-alikes beside each stay as they were."""

from __future__ import annotations

import pytest

from dflashctl.analysis.logscan import scan
from dflashctl.analysis.progress import parse_progress

TB = 'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    main()\n'


def _step(line: str) -> tuple[float | None, float | None]:
    point = parse_progress(line, 1)
    assert point is not None, line
    return point.values.get("step"), point.values.get("total")


@pytest.mark.parametrize(("line", "want"), [
    ("2025/01/02 10:00:00 - mmengine - INFO - Iter(train) [1230/5000]  lr: 2.0000e-05  eta: 3:10:00  time: 1.2031  "
     "data_time: 0.0102  memory: 20311  loss: 1.2340", (1230, 5000)),
    ("01/02 10:00:00 - mmengine - INFO - Epoch(train)  [3][ 80/420]  lr: 1.0e-03  eta: 0:41:07  loss: 0.5120",
     (80, 420)),
])
def test_an_mmengine_train_line_gives_its_iteration_and_total(line: str, want: tuple[int, int]) -> None:
    assert _step(line) == want


def test_an_mmengine_validation_iteration_is_not_a_training_step() -> None:
    point = parse_progress("01/02 10:05:00 - mmengine - INFO - Iter(val) [ 50/100]  eta: 0:00:10  time: 0.3  "
                           "loss: 0.41", 1)
    assert point is not None and "step" not in point.values


@pytest.mark.parametrize(("line", "want"), [
    ("| epoch 003:    120 / 4410 loss=5.201, nll_loss=4.12, ppl=17.39, wps=21033, ups=1.2, wpb=3072, bsz=96, "
     "num_updates=8940, lr=0.0005, gnorm=0.9, clip=0%, oom=0", (120, 4410)),
    ("| epoch 004 |   700 / 2100 loss=2.31 (2.40) | wps 812 | wpb 512 | bsz 16 | clip 100%", (700, 2100)),
])
def test_a_fairseq_line_gives_its_position_in_the_epoch_not_a_field(line: str, want: tuple[int, int]) -> None:
    assert _step(line) == want


@pytest.mark.parametrize("line", [
    "| epoch 004 | valid on 'valid' subset   200 / 311 loss=1.62",  # a validation bar's position
    "| epoch 004 | train loss 1.44 | train ppl 2.72 | words/s    961 | words/batch    512 | bsz    16",  # a size
])
def test_fairseq_validation_and_epoch_summary_lines_give_no_step(line: str) -> None:
    point = parse_progress(line, 1)
    assert point is not None and "step" not in point.values


def test_the_last_fairseq_step_is_the_last_train_lines_position_past_its_summary_and_validation() -> None:
    log = ("| epoch 004 |   600 / 2100 loss=2.35 | wps 812 | wpb 512\n| epoch 004 |   700 / 2100 loss=2.31 | wps 812\n"
           "| epoch 004 | train loss 1.44 | words/batch    512 | bsz    16\n"
           "| epoch 004 | valid on 'valid' subset   200 / 311 loss=1.62\n")
    point = scan(log.encode()).last_step_point
    assert point is not None and (point.values["step"], point.values["total"]) == (700, 2100)


@pytest.mark.parametrize("eol", ["\r\n", "^M\n"])
def test_a_traceback_whose_lines_end_in_a_carriage_return_gives_its_exception(eol: str) -> None:
    log = (TB + "RuntimeError: CUDA error: device-side assert triggered\n").replace("\n", eol)
    assert scan(log.encode()).final_exception == "RuntimeError"


@pytest.mark.parametrize("eol", ["\r\n", "^M\n"])
def test_a_bare_exception_name_cut_before_its_message_and_ending_in_a_carriage_return_is_found(eol: str) -> None:
    log = ("step=1 loss=2.1\ntorch.distributed.DistBackendError\n").replace("\n", eol)
    assert scan(log.encode()).final_exception == "torch.distributed.DistBackendError"


@pytest.mark.parametrize("eol", ["\r\n", "^M\n"])
def test_an_exception_under_a_level_pid_file_prefix_is_found(eol: str) -> None:
    pre = "2025-02-01 08:00:01 WARNING 4242 [engine.py:12] "
    log = (f"{pre}    out = self.step()\n{pre}ValueError: expected a tensor on cuda:0\n"
           f"{pre}see the log above for details\n").replace("\n", eol)
    assert scan(log.encode()).final_exception == "ValueError"


def test_a_healthy_log_of_caret_m_ended_lines_keeps_its_step_and_no_exception() -> None:
    log = "".join(f"INFO 4242 [train.py:80] step={i} loss=2.{i}^M\n" for i in range(1, 6))
    report = scan(log.encode())
    assert report.final_exception is None
    assert report.last_step_point is not None and report.last_step_point.values["step"] == 5


@pytest.mark.parametrize(("log", "want"), [
    ("FAILED tests/test_fsdp.py::test_shard[2] - RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970\n",
     "RuntimeError"),
    ("ERROR tests/test_data.py - ModuleNotFoundError: No module named 'datasets'\n", "ModuleNotFoundError"),
    ("FAILED tests/a.py::test_x - ValueError: bad shape\nFAILED tests/b.py::test_y - torch.OutOfMemoryError: CUDA out "
     "of memory. Tried to allocate 20.00 MiB\n", "torch.OutOfMemoryError"),
    # a traceback after the summary gives a later exception: it is the final one
    ("FAILED tests/a.py::test_x - ValueError: bad shape\n" + TB + "KeyError: 'input_ids'\n", "KeyError"),
])
def test_a_pytest_summary_line_names_the_exception_after_its_dash(log: str, want: str) -> None:
    assert scan(log.encode()).final_exception == want


@pytest.mark.parametrize("line", [
    "PASSED tests/test_fsdp.py::test_shard[2]",
    "ERROR tests/test_data.py",
    "FAILED tests/test_math.py::test_add - assert 3 == 4",
    "FAILED tests/test_math.py::test_add",
    "tests/test_fsdp.py::test_shard[2] PASSED                                  [ 50%]",
])
def test_pytest_lines_that_name_no_exception_give_none(line: str) -> None:
    log = line + "\n========================= 1 failed, 3 passed in 2.01s =========================\n"
    assert scan(log.encode()).final_exception is None
