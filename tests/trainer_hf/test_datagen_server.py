"""`trainer.data generate --server URL`: an OpenAI-compatible server answers, shards resume, failures are retried or
reported in one line, multi-turn records are regenerated turn by turn, `--thinking` reaches server and tokenizer.

The server is tests/trainer_hf/openai_standin.py on 127.0.0.1 (the tiny Qwen3 behind it), scripted per test.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from hf_paths import PROMPTS, REPO  # noqa: E402
from openai_standin import OpenAIStandIn  # noqa: E402

from trainer.datagen import main as generate_main  # noqa: E402
from trainer.dataset import read_meta, read_samples  # noqa: E402
from trainer.hf import load_tokenizer  # noqa: E402
from trainer.hf_tiny import CHAT_TEMPLATE  # noqa: E402
from trainer.prompt_file import encode_prompt, load_prompts  # noqa: E402

FAST = ["--max-new-tokens", "6", "--temperature", "0", "--retries", "3", "--backoff", "0.01", "--timeout", "30"]
THINK_TEMPLATE = CHAT_TEMPLATE.replace(
    "<|assistant|>{% endif %}",
    "<|assistant|>{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def server(tiny_qwen3: Path):
    s = OpenAIStandIn(tiny_qwen3).start()
    yield s
    s.close()


@pytest.fixture
def standin(server: OpenAIStandIn):
    server.reset()
    yield server
    server.reset()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = generate_main(["generate", *argv])
    got = capsys.readouterr()
    return rc, got.out, got.err


def args(server: OpenAIStandIn, target: Path, prompts: Path, out: Path, *more: str) -> list[str]:
    return ["--server", server.url, "--target", str(target), "--prompts", str(prompts), "--out", str(out), *FAST,
            *more]


def shards(out: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {p.name: torch.load(p, weights_only=True) for p in sorted(out.glob("shard-*.pt"))}


def user_text(body: dict) -> str:
    return body["messages"][-1]["content"]


@pytest.fixture(scope="module")
def reference(server: OpenAIStandIn, tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 demo prompts answered by a healthy server, shards of 2: what every interrupted run must end up as."""
    server.reset()
    out = tmp_path_factory.mktemp("server") / "ref"
    rc = generate_main(["generate", *args(server, tiny_qwen3, PROMPTS / "demo.jsonl", out, "--limit", "6",
                                          "--shard-size", "2", "--concurrency", "3")])
    assert rc == 0
    return out


def test_a_server_failure_keeps_whole_shards_and_the_rerun_resumes_to_the_same_data(
        standin, reference, tiny_qwen3, tmp_path, capsys):
    failing = {r["prompt"] for r in load_prompts(PROMPTS / "demo.jsonl")[2:6]}
    standin.policy = lambda n, body: 500 if user_text(body) in failing else None  # down from prompt 2 on
    out = tmp_path / "data"
    cmd = args(standin, tiny_qwen3, PROMPTS / "demo.jsonl", out, "--limit", "6", "--shard-size", "2",
               "--concurrency", "2")
    rc, _, err = run(capsys, *cmd)
    assert rc == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"generate: error: {standin.url}/v1/chat/completions: prompt ")
    assert "HTTP 500" in last and "(after 4 attempts)" in last
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "shard-00000.pt"]  # nothing half-written
    first = (out / "shard-00000.pt").stat().st_mtime_ns

    standin.reset()  # healthy again, log emptied
    rc, stdout, err = run(capsys, *cmd)
    assert rc == 0, err
    assert "resume: 1/3 shards" in err and "6/6 prompts" in err
    assert "generated 6 samples" in stdout
    assert (out / "shard-00000.pt").stat().st_mtime_ns == first
    assert sorted(user_text(e["body"]) for e in standin.log) == sorted(failing)  # only the missing shards asked
    ref, got = shards(reference), shards(out)
    assert list(got) == list(ref) == ["shard-00000.pt", "shard-00001.pt", "shard-00002.pt"]
    for name, state in ref.items():
        for key, value in state.items():
            assert torch.equal(got[name][key], value), (name, key)
    assert read_meta(out)["summary"] == read_meta(reference)["summary"]


def test_every_assistant_turn_is_regenerated_in_order_one_sample_each(standin, tiny_qwen3, tmp_path, capsys):
    prompts = tmp_path / "chat.jsonl"
    chat = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Name a fruit that is red."},
            {"role": "assistant", "content": "ORIGINAL one"},
            {"role": "user", "content": "And one that is yellow?"},
            {"role": "assistant", "content": "ORIGINAL two"}]
    prompts.write_text(json.dumps({"messages": chat}) + "\n" + json.dumps({"prompt": "Why is snow white?"}) + "\n")
    out = tmp_path / "data"
    rc, _, err = run(capsys, *args(standin, tiny_qwen3, prompts, out, "--concurrency", "2"))
    assert rc == 0, err
    turns = [e for e in standin.log if e["body"]["messages"][0]["role"] == "system"]
    assert [len(e["body"]["messages"]) for e in turns] == [2, 4]
    first, second = turns
    assert second["body"]["messages"][:2] == chat[:2]
    assert second["body"]["messages"][2] == {"role": "assistant", "content": first["reply"]}  # regenerated
    assert second["body"]["messages"][3] == chat[3]
    assert "ORIGINAL" not in json.dumps([e["body"] for e in standin.log])

    tok = load_tokenizer(str(tiny_qwen3))
    samples = read_samples(out)
    assert [s.index for s in samples] == [0, 0, 1]  # one sample per assistant turn, in turn order
    for s, entry in zip(samples[:2], turns, strict=True):
        assert s.ids[: s.prompt_len].tolist() == encode_prompt(tok, {"messages": entry["body"]["messages"]})
        assert tok.decode(s.ids[s.prompt_len:].tolist(), skip_special_tokens=True) == entry["reply"]
    meta = read_meta(out)
    assert meta["sample_unit"].startswith("one sample per assistant turn") and meta["summary"]["samples"] == 3


@pytest.fixture(scope="module")
def think_target(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with a template that honours enable_thinking (off adds `[no-think]`), as Qwen3's."""
    copy = tmp_path_factory.mktemp("think") / "ckpt"
    shutil.copytree(tiny_qwen3, copy)
    tok = load_tokenizer(str(copy))
    tok.chat_template = THINK_TEMPLATE
    tok.save_pretrained(copy)
    return copy


@pytest.mark.parametrize("flag, kwargs, recorded, suffix", [
    (["--thinking", "off"], {"enable_thinking": False}, False, "<|assistant|>[no-think]"),
    (["--thinking", "on"], {"enable_thinking": True}, True, "<|assistant|>"),
    ([], None, "default", "<|assistant|>"),
])
def test_thinking_switch_reaches_the_server_the_tokenizer_and_the_metadata(
        standin, think_target, tmp_path, capsys, flag, kwargs, recorded, suffix):
    out = tmp_path / "data"
    rc, _, err = run(capsys, *args(standin, think_target, PROMPTS / "eval.jsonl", out, "--limit", "2", *flag))
    assert rc == 0, err
    assert [e["body"].get("chat_template_kwargs") for e in standin.log] == [kwargs, kwargs]
    tok = load_tokenizer(str(think_target))
    for s in read_samples(out):
        assert tok.decode(s.ids[: s.prompt_len].tolist()).endswith(suffix)
    meta = read_meta(out)
    assert meta["sampling"] == {"backend": "server", "server": standin.url.removeprefix("http://"),
                                "model": "tiny-target", "temperature": 0.0, "top_p": 0.95, "max_new_tokens": 6,
                                "thinking": recorded, "seed": None, "concurrency": 64}
    assert meta["generation"]["thinking"] == (None if recorded == "default" else recorded)


def test_the_hugging_face_path_takes_the_same_switch_and_records_the_same_keys(think_target, tmp_path, capsys):
    out = tmp_path / "hf"
    rc, _, err = run(capsys, "--target", str(think_target), "--prompts", str(PROMPTS / "eval.jsonl"), "--out",
                     str(out), "--limit", "1", "--max-new-tokens", "4", "--devices", "cpu", "--thinking", "off")
    assert rc == 0, err
    tok = load_tokenizer(str(think_target))
    (s,) = read_samples(out)
    assert tok.decode(s.ids[: s.prompt_len].tolist()).endswith("<|assistant|>[no-think]")
    sampling = read_meta(out)["sampling"]
    assert sampling == {"backend": "hf", "server": None, "model": str(think_target.resolve()), "temperature": 0.0,
                        "top_p": None, "max_new_tokens": 4, "thinking": False, "seed": 0, "concurrency": 8}


def test_429_and_500_are_retried_with_backoff_then_succeed(standin, reference, tiny_qwen3, tmp_path, capsys):
    standin.policy = lambda n, body: 429 if n < 2 else 500 if n == 2 else None
    out = tmp_path / "data"
    rc, _, err = run(capsys, *args(standin, tiny_qwen3, PROMPTS / "demo.jsonl", out, "--limit", "6",
                                   "--shard-size", "2", "--concurrency", "1"))
    assert rc == 0, err
    assert [e["status"] for e in standin.log[:4]] == [429, 429, 500, 200]
    assert len({user_text(e["body"]) for e in standin.log[:4]}) == 1  # the same request, four times
    assert "10 requests, 3 retried" in err  # GET /v1/models, 4 attempts of prompt 0, prompts 1-5
    for name, state in shards(reference).items():
        assert torch.equal(shards(out)[name]["ids"], state["ids"]), name


def test_a_timed_out_request_is_retried(standin, tiny_qwen3, tmp_path, capsys):
    standin.policy = lambda n, body: "hang" if n == 0 else None  # held until the test lets go (reset)
    out = tmp_path / "data"
    rc, _, err = run(capsys, *args(standin, tiny_qwen3, PROMPTS / "eval.jsonl", out, "--limit", "2",
                                   "--concurrency", "1", "--timeout", "2"))
    assert rc == 0, err
    assert standin.log[0]["status"] == "hang"
    held = user_text(standin.log[0]["body"])
    assert any(e["status"] == 200 and user_text(e["body"]) == held for e in standin.log[1:])
    assert len(read_samples(out)) == 2


def test_a_split_off_reasoning_is_joined_back_into_the_response(standin, tiny_qwen3, tmp_path, capsys):
    standin.reasoning = "Snow scatters all light."
    out = tmp_path / "data"
    rc, _, err = run(capsys, *args(standin, tiny_qwen3, PROMPTS / "eval.jsonl", out, "--limit", "1"))
    assert rc == 0, err
    (s,) = read_samples(out)
    response = load_tokenizer(str(tiny_qwen3)).decode(s.ids[s.prompt_len:].tolist(), skip_special_tokens=True)
    assert response == f"<think>\nSnow scatters all light.\n</think>\n\n{standin.log[0]['reply']}"


def test_exhausted_retries_exit_2_in_one_line_and_leave_no_shard(standin, tiny_qwen3, tmp_path):
    standin.policy = lambda n, body: 503
    out = tmp_path / "data"
    cmd = [sys.executable, "-m", "trainer.data", "generate",
           *args(standin, tiny_qwen3, PROMPTS / "eval.jsonl", out, "--retries", "2", "--concurrency", "2")]
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0] == done.stderr.strip().splitlines()[-1]
    assert errors[0].startswith(f"generate: error: {standin.url}/v1/chat/completions: prompt ")
    assert "HTTP 503" in errors[0] and "(after 3 attempts)" in errors[0]
    assert sorted(p.name for p in out.iterdir()) == ["meta.json"]


def test_a_client_error_is_not_retried(standin, tiny_qwen3, tmp_path, capsys):
    standin.policy = lambda n, body: 400
    rc, _, err = run(capsys, *args(standin, tiny_qwen3, PROMPTS / "eval.jsonl", tmp_path / "d", "--limit", "1"))
    assert rc == 2 and "HTTP 400" in err and "attempts" not in err
    assert len(standin.log) == 1


def test_no_server_listening_is_retried_then_named_in_one_line(tiny_qwen3, tmp_path, capsys):
    with socket.socket() as s:  # a port nobody listens on (bound, then closed)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, _, err = run(capsys, "--server", f"http://127.0.0.1:{port}", "--target", str(tiny_qwen3), "--prompts",
                     str(PROMPTS / "eval.jsonl"), "--out", str(tmp_path / "d"), "--retries", "1", "--backoff", "0")
    assert rc == 2
    (line,) = err.strip().splitlines()
    assert line.startswith(f"generate: error: http://127.0.0.1:{port}/v1/models: cannot list the served models")
    assert "Connection refused" in line and "(after 2 attempts)" in line


@pytest.mark.parametrize("extra, message", [
    (["--server", "ftp://example.invalid"], "is not an http(s) URL"),
    (["--concurrency", "4"], "--concurrency needs --server URL"),
    (["--server", "http://127.0.0.1:9", "--concurrency", "0"], "--concurrency must be >= 1"),
])
def test_bad_options_are_one_line(tiny_qwen3, tmp_path, capsys, extra, message):
    rc, _, err = run(capsys, "--target", str(tiny_qwen3), "--prompts", str(PROMPTS / "eval.jsonl"), "--out",
                     str(tmp_path / "d"), *extra)
    assert rc == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("generate: error: ") and message in line


def test_token_id_prompts_need_the_hugging_face_path(standin, tiny_qwen3, tmp_path, capsys):
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text('{"ids": [5, 6, 7]}\n')
    rc, _, err = run(capsys, *args(standin, tiny_qwen3, prompts, tmp_path / "d"))
    assert rc == 2 and "prompt 0 holds token ids" in err and not standin.log
