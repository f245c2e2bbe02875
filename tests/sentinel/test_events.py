"""EventTracker: consecutive views of a run (real probe reports through the Watcher `status` uses) → the events
each adds, each said once."""

from __future__ import annotations

import base64
import json
from typing import Any

from dflashctl.analysis.events import Event, read_events
from dflashctl.analysis.watcher import StatusView, Watcher
from dflashctl.analysis.watchspec import Policy
from dflashctl.report import parse_report
from dflashctl.sentinel.events import HOLD_S, EventTracker

# the probe's query, as nvidia-smi prints it with --format=csv,nounits (header included)
SMI_HEADER = "index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], power.draw [W]\n"


def smi(*gpus: tuple[float, float]) -> str:
    """nvidia-smi CSV for GPUs given as (memory used MiB, utilisation %)."""
    return SMI_HEADER + "".join(
        f"{i}, GPU-{i:08d}-0000-4000-8000-000000000000, NVIDIA H200, {mem:g}, 143771, {util:g}, "
        f"{118.0 if util < 5 else 640.0:.2f}\n" for i, (mem, util) in enumerate(gpus))


BUSY = (88283, 97)
IDLE = (88283, 0)


def steps(a: int, b: int) -> bytes:
    return b"".join(b"step=%d loss=3.0 tok/s=100.0 lr=1.00e-04 acc=0.1\n" % i for i in range(a, b))


def thread_oom(name: str) -> bytes:
    """What Python's threading excepthook prints when a drafter thread dies of a CUDA OOM."""
    return (f"Exception in thread {name}:\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/lib/python3.12/threading.py", line 1075, in _bootstrap_inner\n'
            "    self.run()\n"
            '  File "/usr/lib/python3.12/threading.py", line 1012, in run\n'
            "    self._target(*self._args, **self._kwargs)\n"
            '  File "/workspace/dflash/trainer/drafters.py", line 141, in drafter_loop\n'
            "    logits = drafter(hidden, positions)\n"
            "             ^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a total capacity of "
            "79.11 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory "
            "in use.\n").encode()


MAIN_CRASH = (b"Traceback (most recent call last):\n"
              b'  File "/workspace/dflash/trainer/__main__.py", line 12, in <module>\n'
              b"    main()\n"
              b"RuntimeError: loader exhausted\n")


class Run:
    """One run as the sentinel sees it: its log grows, each look is a probe report fed to one Watcher."""

    def __init__(self, run_id: str = "r1", kind: str = "train") -> None:
        self.run_id, self.kind = run_id, kind
        self.watcher = Watcher("pve", live=True)
        self.offset = 0

    def look(self, t: float, data: bytes = b"", *, alive: bool = True, exit_code: int | None = None,
             gpus: str | None = None, errors: dict[str, Any] | None = None) -> StatusView:
        doc = {
            "probe_version": 1, "time": t, "hostname": "ct200",
            "run": {"id": self.run_id, "dir": f"/ws/runs/{self.run_id}", "pid": 42, "alive": alive,
                    "exit_code": exit_code, "stopped": False, "heartbeat": None, "errors": errors or {},
                    "meta": {"started_at_epoch": 0.0, "kind": self.kind}},
            "log": {"path": f"/ws/runs/{self.run_id}/train.log", "size": self.offset + len(data), "inode": 7,
                    "offset": self.offset, "next_offset": self.offset + len(data), "mtime": t,
                    "data_b64": base64.b64encode(data).decode()},
            "gpus": {"source": "nvidia-smi" if gpus else None, "nvml": [], "smi_csv": gpus, "error": None},
        }
        self.offset += len(data)
        return self.watcher.update(parse_report(doc))


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def test_first_step_is_said_once_when_the_first_step_is_logged() -> None:
    run, tr = Run(), EventTracker("r1")
    assert tr.update(run.look(10.0, b"loading target on cuda:0-4, drafters on cuda:5-7\n")) == []
    first = tr.update(run.look(11.0, steps(1, 4)))
    assert kinds(first) == ["first-step", "verdict"]
    assert first[0].data == {"step": 3} and first[0].t == 11.0 and first[0].run == "r1"
    assert first[0].verdict == "training" and first[0].message == "first step: 3"
    assert tr.update(run.look(12.0, steps(4, 9))) == []


def test_a_drafter_oom_is_one_worker_crashed_event_carrying_the_cuda_oom_remedy() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    events = tr.update(run.look(11.0, thread_oom("drafter-1")))
    assert kinds(events) == ["verdict", "worker-crashed"]  # the signature rides on the crash: no second event
    crash = events[1]
    assert crash.data["worker"] == "drafter-1" and crash.data["exception"] == "torch.OutOfMemoryError"
    assert crash.data["exception_message"].startswith("CUDA out of memory. Tried to allocate 2.00 GiB")
    sig = crash.data["signature"]
    assert sig["id"] == "cuda-oom" and "kill-zombies" in sig["remedy"] and sig["summary"]
    assert crash.verdict == "degraded"
    assert crash.message.startswith("drafter-1 crashed: torch.OutOfMemoryError: CUDA out of memory.")
    assert "\n" not in crash.message and len(crash.message) <= 200
    assert events[0].data["from"] == "training" and events[0].data["to"] == "degraded"


def test_the_same_crash_seen_again_adds_nothing() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    tr.update(run.look(11.0, thread_oom("drafter-1")))
    assert tr.update(run.look(12.0)) == []
    assert tr.update(run.look(13.0, steps(6, 20))) == []  # the other drafters train on
    assert tr.update(run.look(14.0, b"CUDA out of memory. Tried to allocate 1.00 GiB\n")) == []  # cuda-oom: said


def test_a_traceback_still_being_written_waits_for_its_exception_line() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    tb = thread_oom("drafter-2")
    cut = tb.index(b"  File \"/workspace")
    assert kinds(tr.update(run.look(11.0, tb[:cut]))) == ["verdict"]  # degraded, but who died of what: not yet
    crash = tr.update(run.look(12.0, tb[cut:]))
    assert kinds(crash) == ["worker-crashed"]
    assert crash[0].data["exception"] == "torch.OutOfMemoryError" and crash[0].data["signature"]["id"] == "cuda-oom"


def test_a_crashed_worker_whose_traceback_never_comes_is_reported_after_the_hold() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    header_only = b"Exception in thread drafter-3:\n" + steps(6, 30)  # the traceback was grepped away
    assert "worker-crashed" not in kinds(tr.update(run.look(11.0, header_only)))
    late = tr.update(run.look(11.0 + HOLD_S))
    assert kinds(late) == ["worker-crashed"]
    assert late[0].data == {"worker": "drafter-3", "exception": None, "exception_message": None, "signature": None,
                            "first": False, "traceback_tail": ["Exception in thread drafter-3:"]}
    assert late[0].message == "drafter-3 crashed"


def test_sixteen_drafters_dying_at_once_are_sixteen_events_in_one_update() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    events = tr.update(run.look(11.0, b"".join(thread_oom(f"drafter-{i}") for i in range(16))))
    crashes = [e for e in events if e.kind == "worker-crashed"]
    assert sorted(e.data["worker"] for e in crashes) == sorted(f"drafter-{i}" for i in range(16))
    assert all(e.data["signature"]["id"] == "cuda-oom" for e in crashes)
    assert "signature" not in kinds(events)
    assert tr.update(run.look(12.0)) == []


def thread_compile_race(name: str) -> bytes:
    """A drafter thread killed by torch.compile racing another thread (the seed run's crash)."""
    return (f"Exception in thread {name}:\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner\n'
            "    self.run()\n"
            '  File "/venv/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 1120, in compile_wrapper\n'
            "    raise RuntimeError(\n"
            "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function. This is "
            "not supported at the moment.\n").encode()


def test_each_crashed_worker_carries_the_signature_of_its_own_traceback() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    events = tr.update(run.look(11.0, thread_compile_race("drafter-0") + thread_oom("drafter-1")))
    crashes = {e.data["worker"]: e.data["signature"]["id"] for e in events if e.kind == "worker-crashed"}
    assert crashes == {"drafter-0": "compile-thread-race", "drafter-1": "cuda-oom"}
    assert "signature" not in kinds(events)


def test_an_error_file_crash_is_reported_like_a_logged_one() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    text = thread_oom("drafter-4").decode().split("\n", 1)[1]  # error files carry the traceback, no header
    errors = {"drafter-4": {"thread": "drafter-4", "type": "torch.OutOfMemoryError",
                            "message": "CUDA out of memory. Tried to allocate 2.00 GiB", "traceback": text}}
    crash = [e for e in tr.update(run.look(11.0, errors=errors)) if e.kind == "worker-crashed"]
    assert [e.data["worker"] for e in crash] == ["drafter-4"] and crash[0].data["signature"]["id"] == "cuda-oom"


def test_a_signature_with_no_crashed_worker_is_its_own_event_once() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    line = (b"[E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
            b"OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600005 milliseconds before "
            b"timing out.\n")
    events = tr.update(run.look(11.0, line))
    assert kinds(events) == ["signature"]
    sig = events[0]
    assert sig.data["signature"]["id"] == "nccl-timeout" and "NCCL_DEBUG=INFO" in sig.data["signature"]["remedy"]
    assert sig.data["line"] == 6 and "Watchdog caught collective operation timeout" in sig.data["text"]
    assert sig.message.startswith("nccl-timeout: ") and "(log line 6)" in sig.message
    assert tr.update(run.look(12.0, line)) == []


def test_a_rank_that_reports_its_own_failure_is_a_crashed_worker_with_that_signature() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    line = (b"[rank3]:[E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
            b"OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600005 milliseconds before "
            b"timing out.\n")
    events = tr.update(run.look(11.0, line))
    assert kinds(events) == ["verdict", "worker-crashed"]
    crash = events[1].data
    assert crash["worker"] == "rank3" and crash["exception"] is None
    assert "Watchdog caught" in crash["exception_message"] and crash["signature"]["id"] == "nccl-timeout"


def test_verdict_changes_are_events_and_each_stall_is_said() -> None:
    run, tr = Run(), EventTracker("r1")
    assert tr.update(run.look(10.0, b"loading\n")) == []  # the first view: nothing changed yet
    assert kinds(tr.update(run.look(20.0, steps(1, 6)))) == ["first-step", "verdict"]
    stall = tr.update(run.look(321.0))
    assert kinds(stall) == ["verdict", "stalled"]
    assert stall[0].data == {"from": "training", "to": "stalled", "reasons": stall[1].data["reasons"]}
    assert stall[1].data["seconds_since_progress"] == 301.0 and stall[1].message.startswith("run stalled: no new step")
    assert tr.update(run.look(330.0)) == []
    assert kinds(tr.update(run.look(331.0, steps(6, 8)))) == ["verdict"]  # training again
    assert kinds(tr.update(run.look(700.0))) == ["verdict", "stalled"]  # a second stall is a second event


def test_the_end_is_said_once_with_its_exit_code() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    events = tr.update(run.look(11.0, MAIN_CRASH, alive=False, exit_code=1))
    assert kinds(events) == ["verdict", "ended"]
    end = events[-1]
    assert end.data["exit_code"] == 1 and end.verdict == "crashed" and end.message == "run ended: crashed (exit 1)"
    assert end.data["reasons"] and "exited with code 1" in end.data["reasons"][0]
    assert tr.update(run.look(12.0, alive=False, exit_code=1)) == []


def test_a_run_gone_while_its_exit_code_is_written_is_not_called_lost() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    assert tr.update(run.look(11.0, b"training finished\n", alive=False)) == []  # the supervisor is reaping
    events = tr.update(run.look(12.0, alive=False, exit_code=0))
    assert kinds(events) == ["verdict", "ended"] and events[0].data["to"] == "finished"
    assert events[1].message == "run ended: finished (exit 0)"


def test_a_run_gone_with_nothing_recorded_ends_lost_after_the_grace() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    assert tr.update(run.look(11.0, alive=False)) == []
    events = tr.update(run.look(25.0, alive=False))
    assert kinds(events) == ["verdict", "ended"]
    assert events[1].data["exit_code"] is None and events[1].message == "run ended: lost (no exit code)"


def test_idle_gpus_are_one_event_per_episode() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(100.0, steps(1, 6), gpus=smi(BUSY, BUSY)))
    first = tr.update(run.look(200.0, steps(6, 8), gpus=smi(IDLE, BUSY)))  # the window holds only this reading
    assert kinds(first) == ["idle-gpus"] and first[0].data["gpus"] == [0]
    assert first[0].message == "GPU 0 holds memory at ≈0 % utilisation"
    assert any("hold memory at ≈0 %" in r for r in first[0].data["reasons"])
    assert tr.update(run.look(210.0, steps(8, 9), gpus=smi(IDLE, BUSY))) == []
    grew = tr.update(run.look(300.0, steps(9, 10), gpus=smi(IDLE, IDLE)))
    assert kinds(grew) == ["idle-gpus"] and grew[0].data["gpus"] == [0, 1]
    assert grew[0].message == "GPUs 0-1 hold memory at ≈0 % utilisation"
    assert tr.update(run.look(310.0, steps(10, 11), gpus=smi(IDLE, BUSY))) == []  # shrank: the same episode
    assert tr.update(run.look(400.0, steps(11, 12), gpus=smi(BUSY, BUSY))) == []  # over
    again = tr.update(run.look(500.0, steps(12, 13), gpus=smi(IDLE, BUSY)))
    assert kinds(again) == ["idle-gpus"] and again[0].data["gpus"] == [0]


def test_gpus_idle_while_the_run_starts_are_no_event() -> None:
    run, tr = Run(), EventTracker("r1")
    # compiling holds memory at 0 % too: within the startup grace that is `starting`, not idle
    view = run.look(100.0, b"compiling\n", gpus=smi(IDLE, IDLE))
    assert view.health.verdict.value == "starting" and tr.update(view) == []


def test_a_program_that_is_not_our_trainer_says_it_keeps_running_without_the_worker() -> None:
    run, tr = Run(kind="exec"), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    crash = [e for e in tr.update(run.look(11.0, thread_oom("loader-0"))) if e.kind == "worker-crashed"][0]
    assert crash.message.startswith("loader-0 crashed: torch.OutOfMemoryError")
    assert crash.message.endswith("; the program keeps running without it; dflashctl will not stop it "
                                  "(launch with --on-worker-failure stop)")
    run, tr = Run(kind="exec"), EventTracker("r1", policy=Policy(on_worker_failure="stop"))
    tr.update(run.look(10.0, steps(1, 6)))
    crash = [e for e in tr.update(run.look(11.0, thread_oom("loader-0"))) if e.kind == "worker-crashed"][0]
    assert crash.message.endswith("; the sentinel stops the run (--on-worker-failure stop)")
    run, tr = Run(), EventTracker("r1")  # our trainer: no such sentence
    tr.update(run.look(10.0, steps(1, 6)))
    crash = [e for e in tr.update(run.look(11.0, thread_oom("drafter-0"))) if e.kind == "worker-crashed"][0]
    assert "keeps running" not in crash.message


def test_a_different_run_starts_over() -> None:
    tr = EventTracker("r1")
    run = Run("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    tr.update(run.look(11.0, MAIN_CRASH, alive=False, exit_code=1))
    nxt = Run("r2")
    events = tr.update(nxt.look(40.0, steps(1, 3)))
    assert kinds(events) == ["first-step"] and events[0].run == "r2"  # its first view: no verdict change yet


def test_events_survive_the_events_file() -> None:
    run, tr = Run(), EventTracker("r1")
    tr.update(run.look(10.0, steps(1, 6)))
    events = tr.update(run.look(11.0, thread_oom("drafter-1")))
    text = b"".join(e.to_line() for e in events)
    back = read_events(text)
    assert [(e.kind, e.t, e.run, e.verdict, e.message) for e in back] == \
        [(e.kind, e.t, e.run, e.verdict, e.message) for e in events]
    assert [e.data for e in back] == [json.loads(json.dumps(e.data)) for e in events]
