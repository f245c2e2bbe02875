"""`python -m trainer.eval`: the lossless check can fail, and bad input is one line with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from hf_paths import REPO

from trainer.config import DrafterConfig, TargetConfig
from trainer.eval import evaluate
from trainer.model import build_drafter
from trainer.speculative import forward_fn
from trainer.tiny_target import TinyTarget


def run_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.eval", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})


class LengthDependentTarget:
    """A target whose logits depend on how long the input is: verification then disagrees with greedy
    decoding, which is exactly what the lossless check exists to catch."""

    def __init__(self) -> None:
        self.inner = TinyTarget(TargetConfig(num_layers=4))
        self.mask_token_id, self.embed_tokens = self.inner.mask_token_id, self.inner.embed_tokens
        self.forward = forward_fn(self.inner, [1, 2])

    def forward_all(self, ids, layer_ids):
        logits, feats = self.forward(ids)
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
    from trainer.eval import render

    assert "NO (first diff at token" in render(report)


def test_tiny_target_untrained_baseline_from_a_config(tmp_path):
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("\n".join(json.dumps({"ids": ids}) for ids in ([1, 2, 3, 4], [50, 60, 70])) + "\n")
    done = run_eval("--config", "trainer/configs/tiny-cpu.toml", "--untrained", "--prompts", str(prompts),
                    "--max-new-tokens", "12", "--set", "drafter.block_size=4")
    assert done.returncode == 0, done.stderr
    assert "lossless on 2/2 prompts" in done.stdout
    tau = float(done.stdout.split("tau = ")[1].split()[0])
    assert 1.0 <= tau < 1.3


def test_bad_inputs_exit_2_with_one_line(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    empty_run = tmp_path / "run"
    empty_run.mkdir()
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    cases = [
        (["--checkpoint", str(tmp_path / "missing.pt")], "no such checkpoint"),
        (["--checkpoint", str(junk)], "cannot load checkpoint"),
        (["--checkpoint", str(empty_run)], "no checkpoints/step-*.pt"),
        (["--checkpoint", str(other)], "not a trainer checkpoint"),
        (["--config", str(tmp_path / "nope.toml")], "file not found"),
        (["--config", "trainer/configs/tiny-cpu.toml", "--device", "cuda:99"], "not available on this machine"),
        (["--config", "trainer/configs/tiny-cpu.toml", "--device", "gpu0"], "bad device 'gpu0'"),
    ]
    for args, message in cases:
        done = run_eval(*args, "--prompts", "trainer/prompts/eval.jsonl")
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("eval: error: ") and message in lines[0], done.stderr


def test_periodic_eval_from_config_runs_every_interval_and_at_the_end(tmp_path):
    from types import SimpleNamespace

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
    report = ev(build_drafter(target, DrafterConfig(block_size=4), 2, "cpu"))
    assert report.summary().startswith("acc_len=") and "lossless=1/1" in report.summary()
    cfg.eval.interval = 0
    assert PeriodicEval.from_config(cfg, target, [1, 2]) is None

