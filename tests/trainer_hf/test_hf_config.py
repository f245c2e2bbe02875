"""config.json -> target dimensions, without torch or transformers (config validation must stay instant)."""

from __future__ import annotations

import json

import pytest

from trainer.hf_config import HFConfigError, target_dims


def write(tmp_path, **cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_qwen3_dims_with_transformers5_rope_parameters(tmp_path):
    d = write(tmp_path, model_type="qwen3", vocab_size=151936, hidden_size=4096, num_hidden_layers=36,
              num_attention_heads=32, num_key_value_heads=8, intermediate_size=12288, rms_norm_eps=1e-6,
              head_dim=128, rope_parameters={"rope_theta": 1000000, "rope_type": "default"})
    assert target_dims(d) == {"vocab_size": 151936, "hidden_size": 4096, "num_layers": 36, "num_heads": 32,
                              "num_kv_heads": 8, "intermediate_size": 12288, "rope_theta": 1e6, "rms_eps": 1e-6,
                              "head_dim": 128, "model_type": "qwen3"}


def test_llama_dims_with_legacy_rope_theta_and_no_kv_heads(tmp_path):
    d = write(tmp_path, model_type="llama", vocab_size=32000, hidden_size=512, num_hidden_layers=8,
              num_attention_heads=8, intermediate_size=1024, rope_theta=500000.0)
    dims = target_dims(d)
    assert dims["num_kv_heads"] == 8 and dims["rope_theta"] == 500000.0 and dims["num_layers"] == 8
    assert dims["head_dim"] == 64 and dims["model_type"] == "llama"  # no head_dim key: hidden_size // heads


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "no config.json"),
    (lambda p: (p / "config.json").write_text("{not json"), "cannot read"),
    (lambda p: (p / "config.json").write_text(json.dumps({"model_type": "gpt2"})), "'gpt2' is not supported"),
    (lambda p: (p / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 5})),
     "missing key 'num_attention_heads'"),
])
def test_bad_checkpoint_directories_give_one_line_reasons(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(HFConfigError, match=message) as err:
        target_dims(tmp_path)
    assert "\n" not in str(err.value)


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(HFConfigError, match="not a directory"):
        target_dims(tmp_path / "nope")
