"""`dflashctl generate`: the target answers a prompt set in the container (`trainer.data generate`), as a run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    """A tiny random Qwen3 checkpoint with its tokenizer (trainer.hf_tiny, transformers' save_pretrained)."""
    out = tmp_path / "ckpt"
    subprocess.run([sys.executable, "-m", "trainer.hf_tiny", "--out", str(out)], cwd=REPO, check=True,
                   capture_output=True, timeout=240)
    return out


def test_generate_runs_detached_as_a_run_and_the_same_command_resumes(local_host, cli, tmp_path, tiny_checkpoint):
    data = tmp_path / "data"
    args = ["generate", "--target", str(tiny_checkpoint), "--prompts", "trainer/prompts/demo.jsonl",
            "--out", str(data), "--wait", "--json", "--", "--limit", "6", "--shard-size", "3",
            "--max-new-tokens", "8"]
    first = cli(*args)
    assert first.code == 0, first.err
    doc = first.json()
    assert doc["wait"]["verdict"] == "finished" and doc["out"] == str(data)
    shards = sorted(data.glob("shard-*.pt"))
    assert [s.name for s in shards] == ["shard-00000.pt", "shard-00001.pt"]
    assert json.loads((data / "meta.json").read_text())["summary"]["samples"] == 6
    rd = Path(doc["run_dir"])
    meta = json.loads((rd / "meta.json").read_text())
    assert meta["kind"] == "generate" and meta["name"] == "datagen-data"
    assert "generate     6/6 prompts" in (rd / "train.log").read_text()  # the progress bar, a line per update

    stamps = [s.stat().st_mtime_ns for s in shards]
    again = cli(*args)  # a new run that finds every shard done: nothing is rewritten
    assert again.code == 0, again.err
    assert again.json()["run_id"] != doc["run_id"]
    assert [s.stat().st_mtime_ns for s in shards] == stamps

    nothing = cli("launch", "--resume-from", "latest")  # `latest` means a training run: generation is not one
    assert nothing.code == 102 and "no training run" in nothing.err


def test_generate_reports_bad_input_in_one_line(local_host, cli, tmp_path):
    empty = cli("generate", "--target", " ", "--prompts", "p.jsonl", "--out", str(tmp_path / "d"))
    assert empty.code == 2 and "--target is empty" in empty.err and "Traceback" not in empty.err
    missing = cli("generate", "--target", str(tmp_path / "no-such-ckpt"), "--prompts", "trainer/prompts/demo.jsonl",
                  "--out", str(tmp_path / "d"), "--wait")
    assert missing.code == 100 and "Traceback" not in missing.err
    assert "generate: error:" in missing.err and "no-such-ckpt" in missing.err


def test_generate_from_a_server_passes_server_and_thinking_to_the_trainer(local_host, cli, tmp_path, tiny_checkpoint,
                                                                          monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(str(REPO / "tests" / "trainer_hf"))
    from openai_standin import OpenAIStandIn  # the tiny target behind /v1/chat/completions on 127.0.0.1

    server = OpenAIStandIn(tiny_checkpoint).start()
    try:
        data = tmp_path / "data"
        done = cli("generate", "--target", str(tiny_checkpoint), "--prompts", "trainer/prompts/eval.jsonl",
                   "--out", str(data), "--server", server.url, "--thinking", "off", "--wait", "--json", "--",
                   "--limit", "3", "--max-new-tokens", "4", "--concurrency", "2")
        assert done.code == 0, done.err
        assert [e["body"]["chat_template_kwargs"] for e in server.log] == [{"enable_thinking": False}] * 3
        meta = json.loads((data / "meta.json").read_text())
        assert meta["sampling"]["backend"] == "server" and meta["sampling"]["thinking"] is False
        assert meta["sampling"]["concurrency"] == 2 and meta["summary"]["samples"] == 3
    finally:
        server.close()
    bad = cli("generate", "--target", str(tiny_checkpoint), "--prompts", "p.jsonl", "--out", str(tmp_path / "d"),
              "--thinking", "maybe")
    assert bad.code == 2 and "--thinking must be on or off" in bad.err and "Traceback" not in bad.err
