"""`python -m trainer.eval`: the paper's τ averaging, the lossless check can fail, multi-turn requests, bad input is
one line with exit 2, and the periodic evaluation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from hf_paths import REPO

from trainer.config import DrafterConfig, TargetConfig
from trainer.eval import Settings, evaluate, evaluate_sets, main
from trainer.eval_report import EvalReport, RequestResult, SetReport, render
from trainer.model import build_drafter
from trainer.speculative import DFlashSource
from trainer.tiny_target import TinyTarget


def run_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.eval", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def request(index: int, lengths: list[int], base: float | None = None, spec: float | None = None) -> RequestResult:
    tau = sum(lengths) / len(lengths) if lengths else None
    return RequestResult(index, 0, 5, 1 + sum(lengths), len(lengths), tau, 1 + len(lengths), None, lengths,
                         base, spec)


def test_tau_is_the_mean_over_requests_of_each_requests_mean_acceptance_length():
    # request 0: steps 4, 4, 1 -> 3.0; request 1: a single step of 1 -> 1.0; request 2 stopped at its first token
    s = SetReport("set", 4, [request(0, [4, 4, 1], 0.02, 0.01), request(1, [1], 0.03, 0.03), request(2, [])])
    assert s.tau == pytest.approx((3.0 + 1.0) / 2)  # the paper's figure: 2.0, request 2 left out
    assert s.pooled_tau == pytest.approx((4 + 4 + 1 + 1) / 4)  # token-weighted: 2.5
    assert s.tokens_per_forward == pytest.approx((10 + 2 + 1) / (4 + 2 + 1))
    assert s.histogram() == [0.0, 0.5, 0.0, 0.0, 0.5]
    assert s.baseline_tpot_s == pytest.approx(0.025) and s.spec_tpot_s == pytest.approx(0.02)
    assert s.speedup == pytest.approx(1.25)
    other = SetReport("other", 4, [request(0, [2, 2])])
    report = EvalReport(4, "dflash", {"temperature": 0.0}, 16, [s, other])
    assert report.tau == pytest.approx((3.0 + 1.0 + 2.0) / 3)  # every request of every set
    doc = report.to_dict()
    assert [x["name"] for x in doc["sets"]] == ["set", "other"] and doc["sets"][0]["tau"] == pytest.approx(2.0)
    assert doc["num_prompts"] == 4 and doc["prompts"][3]["set"] == "other"
    assert "set: tau 2.000 (pooled 2.500)" in render(report) and "speedup 1.25x" in render(report)


class LengthDependentTarget:
    """A target whose logits depend on how many tokens one forward gets: verification then disagrees with
    target-only decoding, which is exactly what the lossless check exists to catch."""

    def __init__(self) -> None:
        self.inner = TinyTarget(TargetConfig(num_layers=4))
        self.embed_tokens = self.inner.embed_tokens

    def new_cache(self):
        return self.inner.new_cache()

    def forward_cached(self, ids, cache, layer_ids, logits_to_keep=0):
        logits, feats = self.inner.forward_cached(ids, cache, layer_ids, logits_to_keep)
        bump = torch.zeros_like(logits)
        bump[..., ids.shape[1] % 7] = 100.0
        return logits + bump, feats


def test_lossless_check_reports_the_first_differing_token():
    target = LengthDependentTarget()
    torch.manual_seed(0)
    drafter = build_drafter(target.inner, DrafterConfig(block_size=4), 2, "cpu")
    report = evaluate(target, drafter, [[1, 2, 3], [4, 5, 6, 7]], [1, 2], 4, 12, None)
    assert not report.lossless
    assert all(p.lossless is False and p.first_mismatch is not None for p in report.prompts)
    assert all(p.mismatch_gap is not None and p.mismatch_gap >= 0 for p in report.prompts)
    assert "NO (first diff at token" in render(report)


class ByteChat:
    """A stand-in tokenizer chat: one token per character of the rendered conversation; records what it rendered."""

    def __init__(self) -> None:
        self.rendered: list[list[dict[str, str]]] = []

    def encode(self, messages):
        self.rendered.append([dict(m) for m in messages])
        return [1 + ord(c) % 200 for m in messages for c in f"{m['role']}:{m['content']}"]

    def decode(self, tokens):
        return "".join(chr(97 + t % 26) for t in tokens)


def test_each_turn_is_a_request_and_the_speculative_reply_joins_the_conversation():
    target = TinyTarget(TargetConfig(num_layers=4))
    torch.manual_seed(0)
    drafter = build_drafter(target, DrafterConfig(block_size=4), 2, "cpu").eval()
    chat = ByteChat()
    convo = SimpleNamespace(turns=["hi", "more"], source="test")
    report = evaluate_sets(target, DFlashSource(drafter), {"mt": [convo, [5, 6, 7]]}, Settings([1, 2], 4, 6),
                           chat)
    first, second, plain = report.sets[0].requests
    assert (first.index, first.turn, second.index, second.turn, plain.index) == (0, 0, 0, 1, 1)
    assert [m["role"] for m in chat.rendered[1]] == ["user", "assistant", "user"]
    assert len(chat.rendered[1][1]["content"]) == first.new_tokens == 6  # the first turn's speculative output
    assert second.prompt_tokens == len(chat.encode(chat.rendered[1]))
    assert all(r.lossless for r in report.requests) and report.checked == 3


def test_tiny_target_untrained_baseline_from_a_config(tmp_path):
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("\n".join(json.dumps({"ids": ids}) for ids in ([1, 2, 3, 4], [50, 60, 70])) + "\n")
    common = ["--config", "trainer/configs/tiny-cpu.toml", "--untrained", "--prompts", str(prompts),
              "--max-new-tokens", "12", "--set", "drafter.block_size=4"]
    done = run_eval(*common)
    assert done.returncode == 0, done.stderr
    assert "lossless on 2/2 prompts" in done.stdout and "speedup" in done.stdout
    tau = float(done.stdout.split("tau = ")[1].split()[0])
    assert 1.0 <= tau < 1.3
    sampled = run_eval(*common, "--temperature", "0.8", "--top-k", "50", "--seed", "3", "--json")
    assert sampled.returncode == 0, sampled.stderr
    doc = json.loads(sampled.stdout)
    assert doc["temperature"] == 0.8 and doc["top_k"] == 50 and doc["checked"] == 0 and doc["lossless"]
    assert doc["sets"][0]["name"] == "ids" and doc["sets"][0]["spec_tpot_s"] > 0
    assert doc["speedup"] > 0 and all(p["new_tokens"] == 12 for p in doc["prompts"])


def test_bench_sets_through_the_command_line(tiny_qwen3, capsys):
    """--bench trainer/prompts/bench: every published set, MT-Bench's second turn after the first turn's reply."""
    rc = main(["--config", "trainer/configs/tiny-cpu.toml", "--target", str(tiny_qwen3), "--untrained",
               "--bench", "trainer/prompts/bench", "--limit", "1", "--max-new-tokens", "8",
               "--set", "drafter.block_size=4", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["lossless"] and doc["lossless_count"] == doc["num_prompts"] == 6
    assert [(s["name"], s["num_prompts"]) for s in doc["sets"]] == [
        ("gsm8k", 1), ("math500", 1), ("humaneval", 1), ("mbpp", 1), ("mt-bench", 2)]
    mt = [p for p in doc["prompts"] if p["set"] == "mt-bench"]
    assert [p["turn"] for p in mt] == [0, 1]
    assert mt[1]["prompt_tokens"] > mt[0]["prompt_tokens"] + 8  # the first reply and the next turn are in there
    assert all(s["speedup"] > 0 for s in doc["sets"])


def test_prompt_lookup_drafts_stay_lossless_and_accept_repeats():
    from trainer.speculative import NgramSource

    target = TinyTarget(TargetConfig(num_layers=4))
    prompt = [5, 6, 7, 8, 9] * 4
    report = evaluate_sets(target, NgramSource(), {"rep": [prompt]}, Settings([], 8, 24), draft="ngram")
    (r,) = report.requests
    assert r.lossless and r.new_tokens == 24
    assert r.tau > 1.0  # a random target's greedy output repeats itself, and prompt lookup finds the repeats


def test_bad_inputs_exit_2_with_one_line(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    empty_run = tmp_path / "run"
    empty_run.mkdir()
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    tiny = ["--config", "trainer/configs/tiny-cpu.toml"]
    cases = [
        (["--checkpoint", str(tmp_path / "missing.pt")], "no such checkpoint"),
        (["--checkpoint", str(junk)], "cannot load checkpoint"),
        (["--checkpoint", str(empty_run)], "no checkpoints/step-*.pt"),
        (["--checkpoint", str(other)], "not a trainer checkpoint"),
        (["--config", str(tmp_path / "nope.toml")], "file not found"),
        ([*tiny, "--device", "cuda:99"], "not available on this machine"),
        ([*tiny, "--device", "gpu0"], "bad device 'gpu0'"),
    ]
    for args, message in cases:
        done = run_eval(*args, "--prompts", "trainer/prompts/eval.jsonl")
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("eval: error: ") and message in lines[0], done.stderr


def test_bad_sampling_arguments_and_a_missing_bench_exit_2_with_one_line(tmp_path, capsys):
    tiny = ["--config", "trainer/configs/tiny-cpu.toml", "--prompts", "trainer/prompts/eval.jsonl"]
    cases = [
        ([*tiny, "--temperature", "-1"], "temperature and top_k must be non-negative"),
        ([*tiny, "--top-p", "0"], "top_p in (0, 1]"),
        ([*tiny, "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--config", "trainer/configs/tiny-cpu.toml", "--bench", str(tmp_path / "nope")], "no such file"),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("eval: error: ") and message in lines[0], lines


def test_periodic_eval_from_config_runs_every_interval_and_at_the_end(tmp_path):
    from trainer.eval import PeriodicEval

    prompts = tmp_path / "ids.jsonl"
    prompts.write_text(json.dumps({"ids": [3, 4, 5]}) + "\n" + json.dumps({"ids": [9, 9]}) + "\n")
    target = TinyTarget(TargetConfig(num_layers=4))
    cfg = SimpleNamespace(eval=SimpleNamespace(interval=50, prompts=str(prompts), num_prompts=1, max_new_tokens=6),
                          target=SimpleNamespace(path=""), drafter=DrafterConfig(block_size=4))
    ev = PeriodicEval.from_config(cfg, target, [1, 2])
    assert ev is not None and ev.prompts == [[3, 4, 5]]
    assert [s for s in range(1, 121) if ev.due(s, 120)] == [50, 100, 120]
    torch.manual_seed(0)
    drafter = build_drafter(target, DrafterConfig(block_size=4), 2, "cpu")
    report = ev(drafter)
    assert report.summary().startswith("acc_len=") and "lossless=1/1" in report.summary()
    assert drafter.training  # put back as it was
    cfg.eval.interval = 0
    assert PeriodicEval.from_config(cfg, target, [1, 2]) is None
