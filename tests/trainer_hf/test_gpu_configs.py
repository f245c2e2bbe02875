"""The shipped GPU layouts say what they mean: seed = 8 ranks of target + drafter; seed-threads = the 5+3 split."""

from __future__ import annotations

import tomllib

from hf_paths import REPO

from trainer.config import spread_layers

CONFIGS = REPO / "trainer" / "configs"


def load(name: str) -> dict:
    return tomllib.loads((CONFIGS / name).read_text())


def test_seed_uses_the_process_layout_one_target_and_drafter_per_rank():
    cfg = load("seed-8gpu.toml")
    assert cfg["runtime"]["layout"] == "processes" and cfg["runtime"]["grad_reduce_dtype"] == "bf16"
    assert cfg["devices"] == {"target": ["cuda:0"], "drafters": ["cuda:0"]}  # shifted per torchrun local rank
    assert spread_layers(36, cfg["target"]["num_captured"]) == [1, 9, 17, 25, 33]
    assert 4096 % cfg["drafter"]["num_heads"] == 0
    assert cfg["runtime"]["cuda_graphs"] is False and cfg["runtime"]["attention"] == "auto"
    assert cfg["runtime"]["dist_warmup_timeout_s"] >= 600  # a cold compile of the recipe's shapes takes minutes
    text = (CONFIGS / "seed-8gpu.toml").read_text()
    assert "--thinking off" in text and "--server" in text  # the recipe's data command: non-reasoning, every turn
    assert "H100 80 GB" in text and "H200 141 GB" in text


def test_threaded_seed_layout_splits_target_over_five_gpus_and_drafters_over_three():
    cfg = load("seed-8gpu-threads.toml")
    assert cfg["devices"]["target"] == [f"cuda:{i}" for i in range(5)]
    assert cfg["devices"]["drafters"] == ["cuda:5", "cuda:6", "cuda:7"]
    assert cfg["runtime"].get("layout", "threads") == "threads" and cfg["runtime"]["cuda_graphs"] is False
    assert cfg["runtime"]["cuda_streams"] is True


def test_one_gpu_layout_shares_cuda0():
    cfg = load("one-gpu.toml")
    assert cfg["devices"] == {"target": ["cuda:0"], "drafters": ["cuda:0"]}
    assert cfg["data"]["kind"] == "generated" and cfg["eval"]["interval"] > 0
