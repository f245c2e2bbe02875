"""A tiny HF checkpoint trains through the real pipeline with 2 drafter threads, and the result speeds decoding."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from hf_paths import REPO  # noqa: E402

from trainer.checkpoint import list_checkpoints  # noqa: E402

pytestmark = pytest.mark.slow


def test_tiny_hf_target_trains_for_a_few_steps_on_two_drafter_threads(trained_run, capfd):
    run_dir, trainer, rc = trained_run
    assert rc == 0
    assert trainer.n == 2 and all(d == "cpu" for d in trainer.devices)
    assert type(trainer.target).__name__ == "HFTarget"
    # replicas stay bit-identical (gradients averaged every step)
    for a, b in zip(trainer.replicas[0].parameters(), trainer.replicas[1].parameters(), strict=True):
        assert torch.equal(a, b)
    ckpt = list_checkpoints(run_dir)[-1]
    state = torch.load(ckpt, weights_only=True)
    assert state["step"] == 120 and state["config"]["target"]["path"]
    assert state["config"]["target"]["hidden_size"] == trainer.target.hidden_size


def test_periodic_eval_logs_acc_len_and_trained_drafter_beats_the_start(trained_run):
    _, trainer, _ = trained_run
    report = trainer.evals.last
    assert report is not None and report.lossless and report.lossless_count == 2
    assert report.tau > 1.5  # an untrained drafter sits at ~1.0 (test_eval_cli checks that baseline)


def _eval(args, timeout=180):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "trainer.eval", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_eval_cli_reports_tau_above_the_untrained_baseline_and_lossless(trained_run, generated):
    run_dir, _, _ = trained_run
    common = ["--checkpoint", str(run_dir), "--prompts", str(generated), "--limit", "3", "--max-new-tokens", "24",
              "--json"]
    trained, untrained = _eval(common), _eval([*common, "--untrained"])
    assert trained.returncode == 0, trained.stderr
    assert untrained.returncode == 0, untrained.stderr
    t, u = json.loads(trained.stdout), json.loads(untrained.stdout)
    assert t["lossless"] and u["lossless"] and t["lossless_count"] == u["lossless_count"] == 3
    assert u["tau"] < 1.3
    assert t["tau"] > u["tau"] + 0.5
    assert t["tokens_per_forward"] > u["tokens_per_forward"]
