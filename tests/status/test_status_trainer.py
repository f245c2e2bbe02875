"""`status --watch` on the real trainer (tiny CPU config) with an injected drafter fault: its real log
line, its real `Exception in thread drafter-1:` output, errors/drafter-1.json and heartbeat.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl.cli import main
from status.runprog import new_run_dir

REPO = Path(__file__).resolve().parents[2]
FAST = ["--set", "runtime.compile_strategy=off", "--set", "train.batch_size=2", "--set", "train.seq_len=64",
        "--set", "train.log_interval=1", "--set", "runtime.heartbeat_interval_s=0.2"]


def start_trainer(workspace: Path, run_id: str, policy: str) -> subprocess.Popen:
    run = new_run_dir(workspace, run_id)
    with (run / "train.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer", "--config", "trainer/configs/tiny-cpu.toml", "--run-dir", str(run),
             *FAST, "--set", f"runtime.on_worker_failure={policy}"],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "DFLASH_RUN_ID": run_id, "DFLASH_RUN_DIR": str(run), "DFLASH_FAULT": "drafter-1@3"})
    (run / "pid").write_text(f"{proc.pid}\n")
    return proc


def watch_json(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, list[dict]]:
    capsys.readouterr()
    code = main(["status", "--watch", "--json", "-i", "0.3", *extra])
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "code", "verdict"), [("continue", 105, "degraded"), ("abort", 100, "crashed")])
def test_watch_names_the_trainers_crashed_drafter(local_host, capsys, policy: str, code: int,  # noqa: ANN001
                                                   verdict: str) -> None:
    """continue: --exit-on-failure stops at the dead thread (105). abort: the trainer ends itself within
    seconds; the watch follows it to the end (no --exit-on-failure, which could stop one report earlier)."""
    proc = start_trainer(local_host.workspace_dir, f"20261129-103000-{policy}", policy)
    try:
        got, docs = watch_json(capsys, *(["--exit-on-failure"] if policy == "continue" else []))
        last = docs[-1]
        assert (got, last["verdict"]) == (code, verdict), last["reasons"]
        crashed = [t for t in last["threads"] if t["state"] == "crashed"]
        assert [(t["name"], t["exception"]) for t in crashed] == [("drafter-1", "RuntimeError")]
        assert crashed[0]["message"] == "DFLASH_FAULT: injected fault in drafter-1 at step 3"
        assert "Traceback (most recent call last):" in crashed[0]["traceback"]
        assert last["final_exception"] == "RuntimeError"
        assert last["layout"]["summary"] == "threads: target + 3 drafters on cpu"  # its heartbeat's layout
        if policy == "continue":  # the other threads go on, as the heartbeat says
            assert {t["name"] for t in last["threads"]} >= {"drafter-0", "drafter-1"}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_the_trainers_periodic_eval_line_is_read_as_an_evaluation_beside_its_training_steps(tmp_path) -> None:
    """The contract between trainer/ (PeriodicEval's `eval step=N …` line) and the log reader, on a real run."""
    from dflashctl.analysis.logscan import scan

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"ids": [1 + i, 7, 42, 99, 5 + i]}) + "\n" for i in range(2)))
    run = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", "trainer/configs/tiny-cpu.toml", "--run-dir", str(run), *FAST,
         "--set", "train.steps=6", "--set", "eval.interval=3", "--set", f"eval.prompts={prompts}",
         "--set", "eval.max_new_tokens=8", "--set", "train.checkpoint_interval=0"],
        cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, timeout=240)
    assert res.returncode == 0, res.stdout.decode()[-2000:] + res.stderr.decode()[-2000:]
    report = scan(res.stdout + res.stderr)
    assert report.last_progress is not None and report.last_progress.kind == "train"
    assert report.last_progress.values["step"] == 6 and "loss" in report.last_progress.values
    evaluated = report.last_eval
    assert evaluated is not None and evaluated.values["step"] == 6 and evaluated.values["acc_len"] >= 1.0
    assert "tokens_per_forward" in evaluated.values


@pytest.mark.slow
def test_status_shows_every_ranks_layout_of_the_real_trainer_under_torchrun(local_host, capsys) -> None:  # noqa: ANN001
    """The process layout on the CPU (2 ranks, gloo): rank 0's heartbeat in the run directory, rank 1's in rank-1/,
    both read by the real probe and shown as one layout."""
    from harness.poll import wait_until
    from harness.sshd import free_port

    run_id = "20261203-150000-procs"
    run = new_run_dir(local_host.workspace_dir, run_id)
    launcher = ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2", "--master-addr",
                "127.0.0.1", "--master-port", str(free_port())]
    with (run / "train.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *launcher, "-m", "trainer", "--config", "trainer/configs/tiny-cpu.toml", "--run-dir",
             str(run), *FAST, "--set", 'devices.drafters=["cpu"]', "--set", "runtime.layout=processes",
             "--set", "train.steps=100000", "--set", "train.checkpoint_interval=0"],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "DFLASH_RUN_ID": run_id, "DFLASH_RUN_DIR": str(run), "OMP_NUM_THREADS": "1"})
    (run / "pid").write_text(f"{proc.pid}\n")
    try:
        beats = [run / "heartbeat.json", run / "rank-1" / "heartbeat.json"]
        wait_until(lambda: all(b.exists() and b"layout" in b.read_bytes() for b in beats), timeout=240,
                   what="both ranks' heartbeats")
        capsys.readouterr()
        main(["status", "--json"])
        lay = json.loads(capsys.readouterr().out)["layout"]
        assert lay["summary"] == "processes: 2 ranks, each on cpu (target + drafter)"
        assert [(r["rank"], r["devices"]) for r in lay["ranks"]] == [
            (r, [{"device": "cpu", "gpu": None, "holds": ["target", f"drafter-{r}"]}]) for r in (0, 1)]
        assert lay["gpus"] == []  # the CPU holds no GPU row
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
