"""Generated data: the target's own answers, stored with the prompt/response boundary, resumable."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from greedy_reference import forward_fn, greedy_decode  # noqa: E402
from hf_paths import PROMPTS, REPO  # noqa: E402

from trainer.config import TargetConfig  # noqa: E402
from trainer.datagen import GenSettings, generate_dataset  # noqa: E402
from trainer.dataset import DataError, GeneratedData, read_meta, read_samples, window  # noqa: E402
from trainer.hf import load_hf_target, load_tokenizer  # noqa: E402
from trainer.prompt_file import encode_prompt, load_prompts  # noqa: E402

SETTINGS = GenSettings(max_new_tokens=48, shard_size=16, batch_size=8)


def test_stored_boundary_splits_the_chat_prompt_from_the_targets_greedy_answer(generated, tiny_qwen3):
    tok = load_tokenizer(str(tiny_qwen3))
    records = load_prompts(PROMPTS / "topics.jsonl")[:40]
    samples = read_samples(generated)
    assert [s.index for s in samples] == list(range(40))
    user, assistant = tok.convert_tokens_to_ids(["<|user|>", "<|assistant|>"])
    target = load_hf_target(TargetConfig(path=str(tiny_qwen3)), ["cpu"])
    forward = forward_fn(target, [1])
    for s in samples[:3]:
        prompt, response = s.ids[: s.prompt_len].tolist(), s.ids[s.prompt_len:].tolist()
        assert prompt == encode_prompt(tok, records[s.index])
        assert prompt[0] == user and prompt[-1] == assistant  # rendered through the chat template
        assert response == greedy_decode(forward, prompt, 48, tok.eos_token_id)
    meta = read_meta(generated)
    assert meta["chat_template"] is True and meta["summary"]["samples"] == 40
    assert sorted(p.name for p in generated.glob("shard-*.pt")) == [f"shard-0000{i}.pt" for i in range(3)]


def test_batches_draw_anchors_from_responses_only(generated):
    data = GeneratedData(generated, seq_len=96, block_size=8, num_anchors=4, seed=3)
    samples = {tuple(s.ids.tolist()): s for s in read_samples(generated)}
    for step in range(3):
        batch = data.batch(step, 6)
        assert batch.ids.shape == (6, 96) and batch.anchors.shape == (6, 4)
        for row, anchors, end in zip(batch.ids, batch.anchors, batch.ends, strict=True):
            s = next(v for k, v in samples.items() if row[: len(k)].tolist() == list(k))
            assert end == len(s.ids)  # labels from here on are masked: a block may run past the response
            assert (anchors >= s.prompt_len).all() and (anchors + 1 < len(s.ids)).all()
            assert anchors.tolist() == sorted(anchors.tolist())
    again = GeneratedData(generated, seq_len=96, block_size=8, num_anchors=4, seed=3).batch(1, 6)
    assert torch.equal(again.ids, data.batch(1, 6).ids) and torch.equal(again.anchors, data.batch(1, 6).anchors)
    assert not torch.equal(data.batch(2, 6).anchors, data.batch(1, 6).anchors)


def test_window_keeps_the_response_and_a_quarter_window_of_prompt():
    assert window(length=50, prompt_len=20, seq_len=64) == (0, 20)  # fits: untouched
    assert window(length=300, prompt_len=100, seq_len=64) == (84, 16)  # long answer: 16 prompt tokens kept
    assert window(length=110, prompt_len=100, seq_len=64) == (46, 54)  # short answer: ends at the last token


def test_resume_regenerates_only_the_missing_shard_and_reproduces_it(generated, tiny_qwen3, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(generated, out)
    before = {p.name: torch.load(p, weights_only=True) for p in out.glob("shard-*.pt")}
    mtime0 = (out / "shard-00000.pt").stat().st_mtime_ns
    (out / "shard-00001.pt").unlink()
    log = tmp_path / "progress.txt"
    with open(log, "w") as stream:
        generate_dataset(str(tiny_qwen3), PROMPTS / "topics.jsonl", out, SETTINGS, ["cpu"], limit=40, stream=stream)
    assert "resume: 2/3 shards" in log.read_text()
    assert "40/40 prompts" in log.read_text()
    assert (out / "shard-00000.pt").stat().st_mtime_ns == mtime0
    again = torch.load(out / "shard-00001.pt", weights_only=True)
    for key, value in before["shard-00001.pt"].items():
        assert torch.equal(again[key], value), key


def test_resume_with_other_settings_is_refused(generated, tiny_qwen3, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(generated, out)
    other = GenSettings(max_new_tokens=12, shard_size=16)
    with pytest.raises(DataError, match="different generation"):
        generate_dataset(str(tiny_qwen3), PROMPTS / "topics.jsonl", out, other, ["cpu"], limit=40)


def test_sampling_is_seeded_and_differs_from_greedy(tiny_qwen3, tmp_path):
    runs = []
    for name, sample, seed in (("a", True, 1), ("b", True, 1), ("g", False, 1)):
        s = GenSettings(max_new_tokens=10, sample=sample, temperature=1.5, seed=seed, shard_size=4, batch_size=4)
        generate_dataset(str(tiny_qwen3), PROMPTS / "demo.jsonl", tmp_path / name, s, ["cpu"], limit=4,
                         stream=io.StringIO())
        runs.append([x.ids.tolist() for x in read_samples(tmp_path / name)])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_messages_drop_a_trailing_assistant_turn_and_keep_system(tiny_qwen3):
    tok = load_tokenizer(str(tiny_qwen3))
    rec = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Old answer"}]}
    text = tok.decode(encode_prompt(tok, rec))
    assert text == "<|system|>Be brief.<|end|><|user|>Hi<|end|><|assistant|>"


def test_without_a_chat_template_prompts_are_plain_text(tiny_qwen3):
    tok = load_tokenizer(str(tiny_qwen3))
    tok.chat_template = None
    assert tok.decode(encode_prompt(tok, {"prompt": "Why is snow white?"})) == "Why is snow white?"
    msgs = {"messages": [{"role": "user", "content": "Hi"}]}
    assert tok.decode(encode_prompt(tok, msgs)) == "user: Hi\nassistant:"
    assert encode_prompt(None, {"ids": [4, 5, 6]}) == [4, 5, 6]


@pytest.mark.parametrize("line, message", [
    ("{oops", ":2: invalid JSON"),
    ('{"text": "hi"}', ":2: needs a non-empty 'prompt'"),
    ('{"messages": [{"role": "user"}]}', ":2: each message needs string 'role' and 'content'"),
    ("[1, 2]", ":2: expected a JSON object"),
])
def test_bad_prompt_lines_are_named_by_file_and_line(tmp_path, line, message):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "fine"}) + "\n" + line + "\n")
    with pytest.raises(DataError, match=message):
        load_prompts(f)


def test_cli_generates_with_progress_and_rejects_bad_input_in_one_line(tiny_qwen3, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "cli"
    cmd = [sys.executable, "-m", "trainer.datagen", "generate", "--target", str(tiny_qwen3), "--prompts",
           str(PROMPTS / "eval.jsonl"), "--out", str(out), "--max-new-tokens", "6", "--shard-size", "4",
           "--devices", "cpu"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "6/6 prompts" in done.stderr
    assert "generated 6 samples" in done.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    cmd[cmd.index("--prompts") + 1] = str(bad)
    cmd[cmd.index("--out") + 1] = str(tmp_path / "cli2")
    failed = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines()[-1].startswith("generate: error: ")
    assert "Traceback" not in failed.stderr
    cmd[cmd.index("--devices") + 1] = "cuda:99"
    missing = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines()[-1].startswith(
        "generate: error: devices not available on this machine: cuda:99")
