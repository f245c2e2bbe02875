"""`dflashctl eval`: the real trainer's τ evaluation, run in the container as a run of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import FAKE_TRAINER, write_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def id_prompts(tmp_path: Path) -> Path:
    """Token-id prompts: the tiny CPU target has no tokenizer."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"ids": [1 + i, 7, 42, 99, 5 + i]}) + "\n" for i in range(2)))
    return path


def test_eval_measures_the_latest_training_run_as_a_run_of_its_own_and_reports_its_errors(local_host, cli,
                                                                                        tmp_path):
    trained = cli("launch", "--name", "tiny", "--wait-for", "exit", "--timeout", "240", "--json", "--",
                  "--set", "train.steps=20")
    assert trained.code == 0, trained.err
    train_id = trained.json()["run_id"]
    prompts = id_prompts(tmp_path)

    for untrained in (True, False):  # the second `latest` must still mean the training run, not the evaluation
        res = cli("eval", "--prompts", str(prompts), "--json", "--", "--max-new-tokens", "16",
                  *(["--untrained"] if untrained else []))
        assert res.code == 0, res.err
        doc = res.json()
        assert doc["evaluated"] == train_id and doc["run_id"] != train_id
        report = doc["report"]
        assert report["num_prompts"] == 2 and report["lossless_count"] == 2 and report["tau"] >= 1.0
        assert report["untrained"] is untrained
        rd = Path(doc["run_dir"])
        assert json.loads((rd / "eval.json").read_text())["tau"] == report["tau"]
        meta = json.loads((rd / "meta.json").read_text())
        assert meta["kind"] == "eval" and meta["evaluates"] == train_id and meta["name"] == "eval-tiny"
        assert "mean acceptance length tau" in (rd / "train.log").read_text()

    not_training = cli("launch", "--resume-from", doc["run_id"])
    assert not_training.code == 2 and "is not a training run (kind eval)" in not_training.err

    missing = cli("eval", train_id, "--prompts", str(tmp_path / "nope.jsonl"))
    assert missing.code == 100 and "Traceback" not in missing.err
    assert "first lines of the log" in missing.err and "eval: error:" in missing.err and "nope.jsonl" in missing.err


def test_eval_refuses_a_live_run_and_a_host_without_training_runs(local_host, cli, tmp_path):
    nothing = cli("eval", "--prompts", "trainer/prompts/eval.jsonl")
    assert nothing.code == 102 and "no training run" in nothing.err

    cfg = write_config(tmp_path / "long.toml", mode="train", step_s=0.05)
    live = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", "live")
    assert live.code == 0, live.err
    busy = cli("eval", "--source", str(FAKE_TRAINER), "--prompts", "x.jsonl")
    assert busy.code == 2 and "still running; evaluate it once it has ended" in busy.err
    assert cli("stop").code == 103
