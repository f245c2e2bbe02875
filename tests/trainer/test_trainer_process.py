"""The real trainer as a subprocess: faults, SIGTERM, resume, heartbeat, a real compile warm-up run."""

from __future__ import annotations

import json
import signal
import time

import pytest
from trainer_harness import FAST

pytestmark = pytest.mark.slow


def test_worker_fault_exits_nonzero_within_10s_with_error_file_and_standard_traceback(start_trainer):
    run = start_trainer(*FAST, "--set", "train.steps=500", env={"DFLASH_FAULT": "drafter-1@3"})
    err = run.run_dir / "errors" / "drafter-1.json"
    run.wait_for(err.exists, timeout=90, what="errors/drafter-1.json")
    doc = json.loads(err.read_text())
    rc = run.wait(timeout=max(0.5, doc["time"] + 10 - time.time()))  # raises TimeoutExpired past 10 s
    assert rc == 1
    assert doc["thread"] == "drafter-1" and doc["type"] == "RuntimeError"
    assert doc["message"] == "DFLASH_FAULT: injected fault in drafter-1 at step 3"
    assert doc["traceback"].startswith("Traceback (most recent call last):")
    log = run.log
    assert "Exception in thread drafter-1:\nTraceback (most recent call last):" in log
    assert "RuntimeError: DFLASH_FAULT: injected fault in drafter-1 at step 3" in log
    assert "training aborted" in log
    hb = run.heartbeat()
    assert {t["name"]: t["state"] for t in hb["threads"]}["drafter-1"] == "crashed"


def test_oom_fault_records_the_type_as_the_traceback_prints_it(start_trainer):
    run = start_trainer(*FAST, "--set", "train.steps=500", env={"DFLASH_FAULT": "drafter-0@1:oom"})
    assert run.wait(timeout=90) == 1
    doc = json.loads((run.run_dir / "errors" / "drafter-0.json").read_text())
    assert doc["type"] == "torch.OutOfMemoryError"
    assert "torch.OutOfMemoryError: DFLASH_FAULT" in run.log


def test_continue_policy_finishes_with_the_surviving_drafters(start_trainer):
    run = start_trainer(*FAST, "--set", "train.steps=8", "--set", "runtime.on_worker_failure=continue",
                        env={"DFLASH_FAULT": "drafter-2@2"})
    assert run.wait(timeout=90) == 0
    assert (run.run_dir / "errors" / "drafter-2.json").exists()
    assert "training finished steps=8" in run.log and "crashed_threads=drafter-2" in run.log
    states = {t["name"]: t["state"] for t in run.heartbeat()["threads"]}
    assert states == {"coordinator": "finished", "drafter-0": "finished", "drafter-1": "finished",
                      "drafter-2": "crashed"}


def test_sigterm_checkpoints_and_exits_143_and_resume_continues(start_trainer):
    run = start_trainer(*FAST, "--set", "train.steps=100000")
    run.wait_for(lambda: len(run.steps()) >= 3, timeout=90, what="three steps")
    hb = run.heartbeat()
    assert {t["name"] for t in hb["threads"]} == {"coordinator", "drafter-0", "drafter-1", "drafter-2"}
    assert {"time", "pid", "step", "tok_s", "loss", "devices", "recompiles", "compile_strategy"} <= set(hb)
    assert hb["pid"] == run.proc.pid and hb["devices"][0]["device"] == "cpu"
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 143
    stopped = [ln for ln in run.log.splitlines() if ln.startswith("training stopped by SIGTERM")]
    assert stopped, run.log[-2000:]
    step = int(stopped[0].split("step=")[1].split()[0])
    assert step >= 3 and max(run.steps()) == step
    assert (run.run_dir / "checkpoints" / f"step-{step:08d}.pt").exists()
    resumed = start_trainer(*FAST, "--set", f"train.steps={step + 2}", "--resume", run_dir=run.run_dir)
    assert resumed.wait(timeout=90) == 0
    assert f"resume: continuing from the checkpoint of step {step}" in resumed.log
    assert f"training finished steps={step + 2}" in resumed.log


def test_resume_continues_the_same_loss_curve(start_trainer, tmp_path):
    args = (*FAST, "--set", "train.steps=10", "--set", "train.checkpoint_interval=5")
    full = start_trainer(*args, run_dir=tmp_path / "full")
    assert full.wait(timeout=90) == 0
    curve = full.steps()
    assert sorted(curve) == list(range(1, 11))
    half = tmp_path / "half" / "checkpoints"
    half.mkdir(parents=True)
    (half / "step-00000005.pt").write_bytes((full.run_dir / "checkpoints" / "step-00000005.pt").read_bytes())
    resumed = start_trainer(*args, "--resume", run_dir=tmp_path / "half")
    assert resumed.wait(timeout=90) == 0
    again = resumed.steps()
    assert sorted(again) == list(range(6, 11))
    assert again == {s: curve[s] for s in range(6, 11)}


def test_warmup_compiles_before_workers_and_trains_without_recompiles(start_trainer):
    """A real torch.compile run of the tiny config (inductor on the CPU), 3 drafter threads."""
    run = start_trainer("--set", "train.steps=60", "--set", "train.log_interval=10")
    assert run.wait(timeout=300) == 0, run.log[-3000:]
    log = run.log
    assert "warmup done" in log and "Exception in thread" not in log
    assert "training finished steps=60 recompiles=0" in log
    losses = {s: float(v) for s, v in run.steps().items()}
    assert losses[60] < losses[10] - 0.2, losses
    assert run.heartbeat()["compile_strategy"] == "warmup"


def test_sigterm_during_warmup_compile_exits_143_with_a_step_0_checkpoint(start_trainer):
    run = start_trainer("--set", "train.steps=50")
    run.wait_for(lambda: (run.run_dir / "heartbeat.json").exists(), timeout=120, what="the first heartbeat")
    assert run.heartbeat()["phase"] == "warmup"
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(timeout=180) == 143
    assert "training stopped by SIGTERM step=0" in run.log
    assert (run.run_dir / "checkpoints" / "step-00000000.pt").exists()
    assert not run.steps()
