"""The engine on other trainers' logs: per-line prefixes, ranks as workers, launcher summaries, headerless exception
lines, the common progress forms, and failure shapes that are not Python exceptions. The lines are real formats
(torch.distributed, torchrun's ChildFailedError, DeepSpeed's launcher, tqdm, Lightning, Megatron, mmengine, HF
Trainer); the whole-log figures on logs copied from public issues are in test_real_corpus.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflashctl.analysis import progress
from dflashctl.analysis.health import Evidence, active_hits, judge
from dflashctl.analysis.lineprefix import split
from dflashctl.analysis.logscan import LogReport, LogScanner, scan
from dflashctl.analysis.progress import parse_progress

REAL = Path(__file__).parent / "data" / "real"


def _ids(report: LogReport) -> list[str]:
    return [h.signature.id for h in active_hits(report)]


def _crashed(report: LogReport) -> dict[str, str | None]:
    health = judge(Evidence(now=None, log=report))
    return {t.name: t.exception for t in health.threads if t.state == "crashed"}


# -- prefixes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "body", "rank"), [
    ("[rank3]:   File \"train.py\", line 7, in <module>", "  File \"train.py\", line 7, in <module>", 3),
    ("[rank0]:[rank0]: RuntimeError: boom", "RuntimeError: boom", 0),
    ("[default1]:Traceback (most recent call last):", "Traceback (most recent call last):", 1),
    ("rank2: ValueError: bad", "ValueError: bad", 2),
    ("[1,5]<stderr>:  File \"x.py\", line 1", "  File \"x.py\", line 1", 5),
    ("stderr: Traceback (most recent call last):", "Traceback (most recent call last):", None),
    ("2023-04-29 06:01:12.977 [177/train/578 (pid 28936)] [09c5-4795] OSError: [Errno 28] No space left on device",
     "OSError: [Errno 28] No space left on device", None),
    ("ERROR 03-25 12:23:00 [engine.py:448] RuntimeError: CUDA error", "RuntimeError: CUDA error", None),
    ("[E ProcessGroupNCCL.cpp:458] [Rank 7] Watchdog caught collective operation timeout",
     "Watchdog caught collective operation timeout", 7),
    ("INFO:root:step=3 loss=1.0", "step=3 loss=1.0", None),
    ("  File \"plain.py\", line 3, in f", "  File \"plain.py\", line 3, in f", None),
    ("[1]:", "[1]:", None),
])
def test_prefixes_come_off_and_name_the_rank(line: str, body: str, rank: int | None) -> None:
    got = split(line)
    assert (got.body, got.rank) == (body, rank)


# -- ranks as workers --------------------------------------------------------------------------------------

INTERLEAVED_RANKS = b"""\
[rank1]: Traceback (most recent call last):
[rank0]: Traceback (most recent call last):
[rank1]:   File "/w/train.py", line 40, in <module>
[rank0]:   File "/w/train.py", line 40, in <module>
[rank1]:     loss.backward()
[rank0]:     dist.all_reduce(t)
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.1 GiB
[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, \
remote process exited or there was a network error, NCCL version 2.21.5
[rank0]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
"""


def test_interleaved_rank_tracebacks_are_taken_apart_and_the_first_rank_is_the_root_cause() -> None:
    report = scan(INTERLEAVED_RANKS)
    by_rank = {tb.thread: tb for tb in report.tracebacks}
    assert set(by_rank) == {"rank0", "rank1"}
    assert by_rank["rank1"].exc_type == "torch.OutOfMemoryError" and "loss.backward()" in by_rank["rank1"].text
    assert by_rank["rank0"].exc_type == "torch.distributed.DistBackendError"
    assert "loss.backward()" not in by_rank["rank0"].text  # no line of one rank in the other's traceback
    health = judge(Evidence(now=None, log=report))
    assert _crashed(report) == {"rank0": "torch.distributed.DistBackendError", "rank1": "torch.OutOfMemoryError"}
    assert health.root_cause == "rank1"  # its traceback began first
    assert {h.signature.id for h in health.hits} == {"cuda-oom", "nccl-error"}


CHILD_FAILED = b"""\
E0325 20:57:27.620000 2606 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] failed \
(exitcode: -9) local_rank: 5 (pid: 2630) of binary: /root/miniconda3/bin/python
Traceback (most recent call last):
  File "/root/miniconda3/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/root/miniconda3/lib/python3.12/site-packages/torch/distributed/launcher/api.py", line 269, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2025-03-25_20:57:27
  host      : node1
  rank      : 3 (local_rank: 3)
  exitcode  : -15 (pid: 2628)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 2628
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-03-25_20:57:27
  host      : node1
  rank      : 5 (local_rank: 5)
  exitcode  : -9 (pid: 2630)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 2630
============================================================
"""


def test_torchrun_summary_names_the_root_cause_rank_and_sigkill_reads_as_host_oom() -> None:
    report = scan(CHILD_FAILED)
    health = judge(Evidence(now=None, log=report))
    assert health.root_cause == "rank5"
    assert _crashed(report) == {"rank5": None}  # rank 3 was only sent SIGTERM by the agent
    [rank5] = [t for t in health.threads if t.name == "rank5"]
    assert rank5.message == "exit code -9 (SIGKILL)"
    assert health.final_exception == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
    assert [h.signature.id for h in health.hits] == ["host-oom"]


def test_deepspeed_launcher_exit_codes_name_the_local_rank() -> None:
    log = (b"[2023-07-10 04:26:35,999] [ERROR] [launch.py:324:sigkill_handler] ['/venv/bin/python3.10', '-u', "
           b"'trainCLM.py', '--local_rank=1', '--deepspeed', 'ds.json'] exits with return code = -11\n")
    report = scan(log)
    assert _crashed(report) == {"rank1": None} and _ids(report) == ["segfault"]


def test_a_watchdog_timeout_names_the_rank_that_reported_it() -> None:
    log = (b"[rank4]:[E1206 18:44:12.755262105 ProcessGroupNCCL.cpp:607] [Rank 4] Watchdog caught collective "
           b"operation timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=5, NumelOut=6, "
           b"Timeout(ms)=600000) ran for 600099 milliseconds before timing out.\n"
           b"[E ProcessGroupNCCL.cpp:458] [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=64, "
           b"OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25625251 milliseconds before timing out.\n")
    report = scan(log)
    assert set(_crashed(report)) == {"rank4", "rank7"} and _ids(report) == ["nccl-timeout"]


# -- exceptions without a traceback ------------------------------------------------------------------------


def test_an_exception_line_without_a_traceback_sets_the_final_exception_and_its_signature() -> None:
    report = scan(b"Epoch 1: 10%|\xe2\x96\x88 | 30/300 [00:20<03:00, 1.5it/s]\n"
                  b"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 23.65 GiB "
                  b"total capacity; 21.9 GiB already allocated)\n")
    assert report.final_exception == "torch.cuda.OutOfMemoryError" and _ids(report) == ["cuda-oom"]


def test_an_exception_the_training_survived_is_not_the_final_exception() -> None:
    report = scan(b"step=10 loss=2.0\n"
                  b"ConnectionResetError: [Errno 104] Connection reset by peer\n"
                  b"retrying in 2 s\n"
                  b"step=11 loss=1.9\n")
    assert report.final_exception is None and _ids(report) == []


def test_warnings_and_log_levels_are_not_exceptions() -> None:
    report = scan(b"UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly\n"
                  b"ERROR: could not find a version that satisfies the requirement flash-attn (retrying)\n"
                  b"FutureWarning: `resume_download` is deprecated\n")
    assert report.final_exception is None and report.tracebacks == []


# -- failure shapes that are not Python exceptions ----------------------------------------------------------


@pytest.mark.parametrize(("log", "sig"), [
    (b"python train.py --bs 64\nKilled\n", "host-oom"),
    (b"./run.sh: line 12: 48213 Killed                  torchrun --nproc-per-node 8 train.py\n", "host-oom"),
    (b"[ 9123.1] Memory cgroup out of memory: Killed process 4123 (python) total-vm:12GB\n", "host-oom"),
    (b"[ 9123.4] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task=python,pid=4123,uid=0\n", "host-oom"),
    (b"NVRM: GPU at PCI:0000:41:00: GPU-5a1b has fallen off the bus.\n", "gpu-hardware"),
    (b"/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [3,0,0], thread: [64,0,0] "
     b"Assertion `srcIndex < srcSelectDimSize` failed.\n", "cuda-illegal-access"),
    (b"Segmentation fault (core dumped)\n", "segfault"),
    (b"{'loss': 1.4, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.3}\n", "nan-loss"),
    (b" iteration      120/  250000 | lm loss: 2.1E+00 | grad norm: nan | number of nan iterations:   0 |\n",
     "nan-loss"),
])
def test_failure_shapes_that_are_not_exceptions(log: bytes, sig: str) -> None:
    assert _ids(scan(log)) == [sig]


@pytest.mark.parametrize("log", [
    b" iteration      120/  250000 | lm loss: 2.1E+00 | grad norm: 1.02 | number of nan iterations:   0 |\n",
    b"oom_score_adj set to 500 for the data workers\n",
    b"Timeout set to 1800 s for NCCL collectives; 0 NaN batches skipped\n",
    b"{'eval_loss': 0.41, 'eval_runtime': 12.3, 'epoch': 1.0}\n",
    b"killed 0 stale workers; no process was Killed-by-signal\n",
])
def test_look_alikes_raise_no_signature(log: bytes) -> None:
    assert _ids(scan(log)) == []


# -- progress ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "expected"), [
    ("  5%|\u258c         | 123/1752 [00:34<1:20:50,  2.79s/it]",
     {"step": 123, "total": 1752, "eta_s": 4850.0}),
    ("Epoch 3:  45%|\u2588\u2588\u2588\u2588\u258c     | 120/266 [00:40<00:49,  2.95it/s, v_num=1, train_loss=2.31]",
     {"step": 120, "total": 266, "it/s": 2.95, "loss": 2.31, "eta_s": 49.0}),
    ("Training:  62%|\u2588\u2588\u2588\u2588\u2588\u2588\u258e   | 40/64 [00:16<00:07,  3.06step/s, loss=7.9108]",
     {"step": 40, "total": 64, "loss": 7.9108}),
    (" iteration      100/    1000 | consumed samples: 800 | lm loss: 2.300000E+00 | grad norm: 0.912 |",
     {"step": 100, "total": 1000, "loss": 2.3, "grad_norm": 0.912}),
    ("Epoch(train)  [1][ 250/735]  lr: 1.0000e-04  eta: 0:10:00  loss: 2.3012  grad_norm: 1.5",
     {"step": 250, "total": 735, "loss": 2.3012, "grad_norm": 1.5}),
    ("steps: 100 loss: 2.3100 iter time (s): 0.512 samples/sec: 62.5", {"step": 100, "loss": 2.31}),
    ("step: 10  loss:  9.7320  memory: 20.15GiB(25.46%)  tps: 1,234", {"step": 10, "loss": 9.732}),
])
def test_progress_of_the_common_trainers(line: str, expected: dict[str, float]) -> None:
    point = parse_progress(line, 1)
    assert point is not None
    for key, value in expected.items():
        assert point.values[key] == pytest.approx(value), key


@pytest.mark.parametrize("line", [
    "Loading checkpoint shards:  50%|\u2588\u2588\u2588\u2588\u2588     | 2/4 [00:05<00:05,  2.51s/it]",
    "Map: 100%|" + "\u2588" * 10 + "| 5000/5000 [00:01<00:00, 4210.11 examples/s]",
    "Validation DataLoader 0:  40%|\u2588\u2588\u2588\u2588      | 8/20 [00:01<00:02,  5.9it/s]",
    "[2023-07-25 21:03:17,269] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | forward: 652.41 | step: 1172.13",
])
def test_bars_and_timers_of_other_work_are_not_training_steps(line: str) -> None:
    point = parse_progress(line, 1)
    assert point is None or "step" not in point.values


def test_status_progress_keeps_the_bars_step_total_and_eta_beside_the_dict_lines() -> None:
    """HF Trainer: a dict line (loss, no step) between two bars still shows step/total and the ETA."""
    log = ("  5%|\u258c         | 100/2000 [01:23<26:18,  1.20it/s]\r"
           "  5%|\u258c         | 101/2000 [01:24<26:17,  1.20it/s]\n"
           "{'loss': 1.234, 'grad_norm': 0.8, 'learning_rate': 4.9e-05, 'epoch': 0.05}\n").encode()
    health = judge(Evidence(now=None, log=scan(log)))
    assert health.progress["step"] == 101 and health.progress["total"] == 2000
    assert health.progress["loss"] == 1.234 and health.progress["eta_s"] == 26 * 60 + 17


def test_a_users_own_progress_format_by_regex() -> None:
    rx = progress.custom(r"it (?P<step>\d+) of (?P<total>\d+) .* xent (?P<loss>[\d.]+|nan)")
    report = scan(b"boot\nit 5 of 100 | xent 2.5\nit 6 of 100 | xent nan\n", rx)
    assert report.last_progress.values == {"step": 6, "total": 100, "loss": pytest.approx(float("nan"), nan_ok=True)}
    assert _ids(report) == ["nan-loss"]
    for bad in ("it (\\d+", "no groups here", "(?P<step>\\d*)"):
        with pytest.raises(progress.ProgressRegexError):
            progress.custom(bad)


# -- the fast path on real logs ----------------------------------------------------------------------------


def _cases() -> list[Path]:
    return sorted(REAL.glob("*.log"))


@pytest.mark.parametrize("path", _cases(), ids=lambda p: p.stem)
def test_the_fast_path_reads_real_logs_as_the_line_by_line_reference_does(path: Path) -> None:
    data = path.read_bytes()

    def run(fast: bool) -> LogReport:
        s = LogScanner()
        s.fast = fast
        s.feed(data)
        s.flush()
        return s.report()

    fast, ref = run(True), run(False)
    assert [(t.thread, t.first_line, t.exc_type) for t in fast.tracebacks] == [
        (t.thread, t.first_line, t.exc_type) for t in ref.tracebacks]
    assert [(h.signature.id, h.line) for h in active_hits(fast)] == [(h.signature.id, h.line) for h in active_hits(ref)]
    assert repr(fast.last_step_point) == repr(ref.last_step_point)  # repr: nan == nan
    assert fast.workers == ref.workers and fast.root_cause == ref.root_cause


def test_spawned_processes_and_srun_tasks_are_workers() -> None:
    spawn = (b"torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL\n")
    report = scan(spawn)
    assert _crashed(report) == {"rank1": None} and _ids(report) == ["host-oom"]
    assert report.final_exception == "torch.multiprocessing.spawn.ProcessExitedException"
    raised = (b"-- Process 2 terminated with the following error:\n"
              b"Traceback (most recent call last):\n"
              b'  File "/usr/lib/python3/dist-packages/torch/multiprocessing/spawn.py", line 69, in _wrap\n'
              b"    fn(i, *args)\n"
              b"KeyError: 'labels'\n")
    assert set(_crashed(scan(raised))) == {"rank2"} and scan(raised).final_exception == "KeyError"
    srun = (b"0: step=10 loss=2.1\n"
            b"3: Traceback (most recent call last):\n"
            b'3:   File "train.py", line 9, in <module>\n'
            b"3: ValueError: Expected input batch_size (8) to match target batch_size (16).\n"
            b"srun: error: gpu-node7: task 3: Exited with exit code 1\n")
    report = scan(srun)
    assert _crashed(report) == {"rank3": "ValueError"} and report.final_exception == "ValueError"
