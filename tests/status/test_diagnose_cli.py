"""`dflashctl diagnose`: offline files in, the JSON contract and the verdict's exit code out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dflashctl.cli import main

DATA = Path(__file__).resolve().parents[1] / "analysis" / "data"
SEED_LOG = DATA / "seed_train.log"
SEED_GPUS = DATA / "seed_nvidia_smi.csv"


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["diagnose", *argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_seed_scenario_json_contract_and_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(capsys, str(SEED_LOG), "--gpus", str(SEED_GPUS))
    assert code == 105
    assert set(doc) == {"schema", "verdict", "final_exception", "root_cause", "stall_shape", "stall_remedy",
                        "progress", "threads", "signatures", "gpus", "gpu_findings", "gpu_action"}
    assert doc["stall_shape"] is None  # degraded: the dead threads are the cause, the idle GPUs their effect
    assert doc["schema"] == 1 and doc["verdict"] == "degraded"
    assert doc["root_cause"] == "drafter-0"  # the first of the three to fail
    assert doc["final_exception"] == "RuntimeError"
    assert [(t["name"], t["state"], t["exception"]) for t in doc["threads"]] == [
        (f"drafter-{i}", "crashed", "RuntimeError") for i in range(3)]
    for t in doc["threads"]:
        assert set(t) == {"name", "state", "exception", "message", "traceback"}
        assert t["message"].startswith("Detected that you are using FX to symbolically trace")
        assert t["traceback"].startswith(f"Exception in thread {t['name']}:\nTraceback (most recent call last):")
    [sig] = doc["signatures"]
    assert sig["id"] == "compile-thread-race" and 'compile_strategy = "warmup"' in sig["remedy"]
    assert set(sig["evidence"]) == {"line", "text"} and isinstance(sig["evidence"]["line"], int)
    lines = SEED_LOG.read_text().splitlines()
    assert lines[sig["evidence"]["line"] - 1].strip() == sig["evidence"]["text"]
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    assert all(isinstance(g["index"], int) and g["finding"] == "idle-allocated" for g in doc["gpus"])
    assert doc["gpus"][0] == {"index": 0, "memory_used_mib": 88283, "memory_total_mib": None,
                              "utilization_pct": 0, "power_w": None, "finding": "idle-allocated",
                              "health": None, "health_findings": []}
    assert doc["gpu_findings"] == [] and doc["gpu_action"] is None


def test_seed_grep_output_alone_still_names_the_crashed_threads(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(capsys, str(DATA / "seed_grep.txt"), "--gpus", str(SEED_GPUS))
    assert (code, doc["verdict"]) == (105, "degraded")  # what the whole log says: the grep keeps the threads
    assert [t["name"] for t in doc["threads"] if t["state"] == "crashed"] == ["drafter-0", "drafter-1", "drafter-2"]
    assert doc["signatures"] == [] and doc["final_exception"] is None


def test_gpus_alone_all_idle_allocated_is_stalled(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(capsys, "--gpus", str(SEED_GPUS))
    assert (code, doc["verdict"]) == (104, "stalled")
    assert doc["stall_shape"] == "idle-held" and "dflashctl stacks" in doc["stall_remedy"]


def test_table_output_names_threads_signature_and_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diagnose", str(SEED_LOG), "--gpus", str(SEED_GPUS)])
    out = capsys.readouterr().out
    assert code == 105
    for needle in ("DEGRADED", "drafter-0", "drafter-2", "RuntimeError", "compile-thread-race",
                   'compile_strategy = "warmup"', "idle-allocated"):
        assert needle in out


def test_healthy_log_is_training_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "train.log"
    log.write_text("".join(f"step={i} loss={4 - i / 100:.4f} tok/s=1834.2 lr=3.00e-04 acc=0.1\n" for i in range(50)))
    code, doc = run_json(capsys, str(log))
    assert (code, doc["verdict"], doc["signatures"], doc["threads"]) == (0, "training", [], [])


def test_main_thread_oom_crash_exit_100(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "train.log"
    log.write_text('step=1 loss=3.0\nTraceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
                   "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    code, doc = run_json(capsys, str(log))
    assert (code, doc["verdict"], doc["final_exception"]) == (100, "crashed", "torch.OutOfMemoryError")
    assert [s["id"] for s in doc["signatures"]] == ["cuda-oom"]


def test_copied_run_directory_brings_error_files_and_exit_code(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    (run / "errors").mkdir(parents=True)
    shutil.copy(SEED_LOG, run / "train.log.1")
    (run / "train.log").write_text("step=4 loss=4.1\n")
    (run / "errors" / "drafter-1.json").write_text(json.dumps({
        "thread": "drafter-1", "type": "torch.OutOfMemoryError", "message": "CUDA out of memory.",
        "traceback": "Traceback (most recent call last):\n  File \"d.py\", line 1, in f\n"
                     "torch.OutOfMemoryError: CUDA out of memory.\n", "time": 1.0}))
    (run / "exit_code").write_text("1\n")
    code, doc = run_json(capsys, str(run))
    assert (code, doc["verdict"]) == (100, "crashed")
    threads = {t["name"]: t["exception"] for t in doc["threads"]}
    assert threads["drafter-1"] == "torch.OutOfMemoryError" and threads["drafter-0"] == "RuntimeError"
    assert {s["id"] for s in doc["signatures"]} == {"compile-thread-race", "cuda-oom"}


@pytest.mark.parametrize(
    "argv",
    [["missing.log"], ["--gpus", "missing.csv"], []],
)
def test_missing_input_is_one_line_error_exit_2(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["diagnose", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR: ") and "Traceback" not in err and len(err.strip().splitlines()) <= 2


def test_unreadable_gpu_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "gpus.txt"
    bad.write_text("this is not nvidia-smi output\nat all\n")
    assert main(["diagnose", "--gpus", str(bad)]) == 2
    assert "not nvidia-smi" in capsys.readouterr().err


def test_real_trainer_naive_compile_race_log(capsys: pytest.CaptureFixture[str]) -> None:
    """data/trainer_naive_race.log: the real trainer (trainer/, compile_strategy = "naive", 3 drafter threads
    on CPU) dying of the seed's error, then `training aborted` (recorded by the trainer's benchmark)."""
    code, doc = run_json(capsys, str(DATA / "trainer_naive_race.log"))
    assert (code, doc["verdict"], doc["final_exception"]) == (100, "crashed", "RuntimeError")
    assert [(t["name"], t["state"]) for t in doc["threads"]] == [(f"drafter-{i}", "crashed") for i in range(3)]
    assert all(t["message"].startswith("Detected that you are using FX") for t in doc["threads"])
    assert [(s["id"], s["evidence"]["line"]) for s in doc["signatures"]] == [("compile-thread-race", 28)]


def test_diagnose_json_carries_the_progress_record_and_root_cause_of_another_trainers_log(
        capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    """The same `progress` record as `status --json` (health.to_record builds both): step, total, loss, rate, ETA."""
    log = tmp_path / "hf.log"
    log.write_text("  5%|\u258c         | 100/2000 [01:23<26:18,  1.20it/s]\n"
                   "{'loss': 1.234, 'grad_norm': 0.8, 'learning_rate': 4.9e-05, 'epoch': 0.05}\n"
                   "[rank1]: Traceback (most recent call last):\n"
                   "[rank1]:   File \"train.py\", line 9, in <module>\n"
                   "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    code, doc = run_json(capsys, str(log))
    assert code == 105 and doc["root_cause"] == "rank1" and doc["final_exception"] == "torch.OutOfMemoryError"
    p = doc["progress"]
    assert (p["step"], p["total"], p["loss"], p["it/s"], p["eta_s"]) == (100, 2000, 1.234, 1.2, 26 * 60 + 18)
    assert [s["id"] for s in doc["signatures"]] == ["cuda-oom"]
