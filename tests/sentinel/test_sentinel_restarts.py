"""Restarts on the local host: which endings get another attempt, our trainer resuming from its checkpoint, and a
stop while the next attempt waits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from harness.poll import wait_until

from dflashctl.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

EXITS = '''\
import os, sys, time
print("step 1 loss 1.0", flush=True)
time.sleep(float(os.environ.get("HOLD", "0")))
sys.exit(int(os.environ["CODE"]))
'''
FAST = ["--set", "runtime.compile_strategy=off", "--set", "train.batch_size=2", "--set", "train.seq_len=64",
        "--set", "train.log_interval=1", "--set", "runtime.heartbeat_interval_s=0.2"]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1]) if out else {}


def chain(capsys: pytest.CaptureFixture[str], name: str) -> list[dict]:
    _, listing = run_json(capsys, "runs", "--json")
    return sorted((r for r in listing["runs"] if r["name"] == name), key=lambda r: r["id"])


def deploy(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "exits.py").write_text(EXITS)
    assert main(["deploy", "--source", str(src)]) == 0


def test_a_config_error_exit_2_is_never_retried(local_host, tmp_path, capsys) -> None:  # noqa: ANN001
    deploy(tmp_path)
    code, _ = run_json(capsys, "launch", "--exec", "--name", "two", "--restart-on", "crashed", "--max-restarts", "3",
                       "--backoff", "1s", "--env", "CODE=2", "--wait-for", "exit", "--json", "--", "python3",
                       "exits.py")
    assert code == 100
    runs = chain(capsys, "two")
    assert [(r["attempt"], r["exit_code"]) for r in runs] == [(1, 2)]
    assert not (Path(runs[0]["dir"]) / "restart.json").exists()


def test_a_run_the_user_stopped_is_never_restarted(local_host, tmp_path, capsys) -> None:  # noqa: ANN001
    deploy(tmp_path)
    code, doc = run_json(capsys, "launch", "--exec", "--name", "held", "--restart-on", "crashed", "--env", "CODE=1",
                         "--env", "HOLD=600", "--json", "--", "python3", "exits.py")
    assert code == 0, doc
    assert main(["stop", doc["run_id"]]) == 103
    runs = chain(capsys, "held")
    assert [(r["attempt"], r["verdict"]) for r in runs] == [(1, "stopped")]
    assert not (Path(doc["run_dir"]) / "restart.json").exists()


def test_stopping_the_next_attempt_while_it_waits_starts_no_program(local_host, tmp_path, capsys) -> None:  # noqa: ANN001
    deploy(tmp_path)
    code, doc = run_json(capsys, "launch", "--exec", "--name", "later", "--restart-on", "crashed", "--backoff", "10m",
                         "--env", "CODE=1", "--json", "--", "python3", "exits.py")
    assert code == 0, doc
    runs_dir = Path(doc["run_dir"]).parent
    nxt = wait_until(lambda: [r for r in chain(capsys, "later") if r["attempt"] == 2], timeout=90,
                     what="the second attempt")[0]
    wait_until(lambda: (runs_dir / nxt["id"] / "supervisor.pid").exists(), what="its supervisor")
    assert main(["stop", nxt["id"]]) == 103
    second = runs_dir / nxt["id"]
    assert (second / "exit_code").read_text().strip() == "143" and not (second / "pid").exists()
    assert "its program was never started" in (second / "train.log").read_text()
    assert [(r["attempt"], r["verdict"]) for r in chain(capsys, "later")] == [(1, "crashed"), (2, "stopped")]


def test_our_trainer_restarts_from_the_newest_checkpoint_of_the_attempt_that_crashed(local_host, capsys) -> None:  # noqa: ANN001
    code, doc = run_json(capsys, "launch", "--name", "ckpt", "--restart-on", "crashed", "--max-restarts", "1",
                         "--backoff", "1s", "--env", "DFLASH_FAULT=drafter-1@6", "--wait-for", "exit", "--json", "--",
                         *FAST, "--set", "train.steps=400", "--set", "train.checkpoint_interval=2")
    # attempt 2 resumes at a checkpoint before the fault (a crash breaks the group: none is written past it) and
    # meets it again; were it resumed past the fault it would finish its 400 steps (exit 0), not hang
    assert code == 100, doc
    first, second = chain(capsys, "ckpt")
    meta = json.loads((Path(second["dir"]) / "meta.json").read_text())
    assert meta["restart_of"] == first["id"] and meta["resumed_from"]["run"] == first["id"]
    step = meta["resumed_from"]["step"]
    assert 4 <= step <= 6 and os.path.exists(Path(second["dir"]) / "checkpoints" / f"step-{step:08d}.pt")
    assert f"resume: continuing from the checkpoint of step {step}" in (Path(second["dir"]) / "train.log").read_text()
    launch = json.loads((Path(second["dir"]) / "launch.json").read_text())
    assert "--resume" in launch["argv"] and launch["env"]["DFLASH_RESUME_FROM"] == first["dir"]
