"""The shipped GPU layouts say what they mean: seed = target over cuda:0-4, drafters on cuda:5-7."""

from __future__ import annotations

import tomllib

from hf_paths import REPO

from trainer.config import spread_layers

CONFIGS = REPO / "trainer" / "configs"


def load(name: str) -> dict:
    return tomllib.loads((CONFIGS / name).read_text())


def test_seed_layout_splits_target_over_five_gpus_and_drafters_over_three():
    cfg = load("seed-8gpu.toml")
    assert cfg["devices"]["target"] == [f"cuda:{i}" for i in range(5)]
    assert cfg["devices"]["drafters"] == ["cuda:5", "cuda:6", "cuda:7"]
    # Qwen3-8B has 36 layers: DFlash's spread 1, 9, 17, 25, 33
    assert spread_layers(36, cfg["target"]["num_captured"]) == [1, 9, 17, 25, 33]
    assert 4096 % cfg["drafter"]["num_heads"] == 0
    assert cfg["runtime"]["cuda_graphs"] is True and cfg["runtime"]["attention"] == "auto"
    assert cfg["runtime"]["cuda_streams"] is True


def test_one_gpu_layout_shares_cuda0():
    cfg = load("one-gpu.toml")
    assert cfg["devices"] == {"target": ["cuda:0"], "drafters": ["cuda:0"]}
    assert cfg["data"]["kind"] == "generated" and cfg["eval"]["interval"] > 0
