"""The recipe's scale in the config: γ per block size, epochs and warm-up ratio, 512 anchors at 3072 tokens."""

from __future__ import annotations

import json
import math

import pytest
from trainer_harness import REPO

from trainer.config import ConfigError, TrainConfig, load_config
from trainer.schedule import lr_at, resolve


@pytest.mark.parametrize("block_size, gamma", [(16, 7.0), (10, 5.0), (8, 4.0), (4, 1.75), (32, 14.0)])
def test_gamma_is_the_published_value_per_block_size_and_scales_otherwise(block_size, gamma):
    cfg = load_config(None, [f"drafter.block_size={block_size}"])
    assert cfg.gamma == gamma
    assert load_config(None, [f"drafter.block_size={block_size}", "drafter.gamma=3"]).gamma == 3.0


def test_512_anchors_at_seq_len_3072_is_a_valid_config():
    cfg = load_config(None, ["train.seq_len=3072", "train.num_anchors=512", "train.batch_size=4"])
    assert cfg.train.loss_chunk == 2048  # 4 x 512 x 16 rows in 16 chunks, never all logits at once


def test_the_shipped_recipe_config_is_specforges_qwen3_8b_dflash_recipe(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({  # Qwen3-8B's dimensions, no weights
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 12288, "rope_theta": 1e6}))
    cfg = load_config(REPO / "trainer" / "configs" / "seed-8gpu.toml", [f"target.path={tmp_path}"])
    tr = cfg.train
    assert (tr.seq_len, tr.num_anchors, tr.batch_size, tr.steps, tr.epochs) == (3072, 512, 4, 10_000, 6)
    assert (tr.lr, tr.min_lr, tr.warmup_ratio, tr.schedule, tr.grad_clip) == (6e-4, 0.0, 0.04, "cosine", 1.0)
    assert (tr.betas, tr.weight_decay, tr.seed) == ([0.9, 0.999], 0.0, 42)
    assert cfg.gamma == 7.0 and cfg.layer_ids == [1, 9, 17, 25, 33] and cfg.drafter.block_size == 16
    assert resolve(tr, samples=120_000, seqs_per_step=12).warmup_steps == 400


def test_epochs_set_the_length_capped_by_steps_and_warmup_ratio_the_warmup():
    tr = TrainConfig(steps=0, epochs=6, warmup_ratio=0.04)
    assert resolve(tr, samples=1000, seqs_per_step=12) == TrainConfig(steps=6 * 83, epochs=6, warmup_ratio=0.04,
                                                                     warmup_steps=int(0.04 * 498))
    assert resolve(TrainConfig(steps=100, epochs=6), 1000, 12).steps == 100  # steps caps the epochs
    assert resolve(TrainConfig(steps=10_000, warmup_ratio=0.04), None, 12).warmup_steps == 400
    assert resolve(TrainConfig(steps=50, warmup_steps=7), None, 12) == TrainConfig(steps=50, warmup_steps=7)


def test_cosine_after_warmup_reaches_min_lr_at_the_last_step():
    tr = resolve(TrainConfig(steps=1000, warmup_ratio=0.04, lr=6e-4, min_lr=0.0), None, 1)
    assert math.isclose(lr_at(0, tr), 6e-4 / 40) and math.isclose(lr_at(39, tr), 6e-4)
    assert math.isclose(lr_at(40, tr), 6e-4) and lr_at(520, tr) < 6e-4 / 2 + 1e-6
    assert math.isclose(lr_at(1000, tr), 0.0, abs_tol=1e-12)


@pytest.mark.parametrize("sets, key", [
    (["train.epochs=2"], "train.epochs"),  # the Markov data has no end
    (["train.steps=0"], "train.steps"),
    (["train.warmup_ratio=1.0"], "train.warmup_ratio"),
    (["train.betas=[0.9]"], "train.betas"),
    (["train.loss_chunk=-1"], "train.loss_chunk"),
    (["target.micro_batches=0"], "target.micro_batches"),
])
def test_bad_schedule_settings_name_the_key(sets, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, sets)
