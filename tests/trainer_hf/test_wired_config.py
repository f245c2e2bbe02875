"""The HF / generated-data / eval keys are part of the one trainer config, and bad values fail in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hf_paths import REPO

from trainer.config import ConfigError, load_config


def fake_qwen3_8b(tmp_path: Path) -> Path:
    """Qwen3-8B's config.json (dimensions only, no weights): enough for config validation, which reads no torch."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 12288,
        "rope_parameters": {"rope_theta": 1000000}}))
    return tmp_path


def run_trainer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


@pytest.mark.parametrize("name", ["seed-8gpu.toml", "seed-8gpu-threads.toml", "one-gpu.toml"])
def test_gpu_configs_validate_against_a_checkpoint_config(tmp_path, name):
    cfg = load_config(REPO / "trainer" / "configs" / name, [f"target.path={fake_qwen3_8b(tmp_path)}"])
    assert cfg.target.num_layers == 36 and cfg.target.hidden_size == 4096 and cfg.target.vocab_size == 151936
    assert cfg.layer_ids == [1, 9, 17, 25, 33]
    assert cfg.target.rope_theta == 1e6
    assert cfg.data.kind == "generated" and cfg.data.dir and cfg.eval.interval > 0


def test_checkpoint_dimensions_override_the_toml(tmp_path):
    cfg = load_config(None, [f"target.path={fake_qwen3_8b(tmp_path)}", "target.hidden_size=64",
                             "target.num_layers=6"])
    assert cfg.target.hidden_size == 4096 and cfg.target.num_layers == 36


def test_generated_data_needs_a_dir():
    with pytest.raises(ConfigError, match="data.dir"):
        load_config(None, ["data.kind=generated"])


def test_generated_data_needs_an_hf_target():
    with pytest.raises(ConfigError, match="target.path.*needed when data.kind = 'generated'"):
        load_config(None, ["data.kind=generated", "data.dir=data/x"])


def test_unknown_data_kind_is_rejected():
    with pytest.raises(ConfigError, match="data.kind.*one of"):
        load_config(None, ["data.kind=parquet"])


def test_periodic_eval_needs_prompts():
    with pytest.raises(ConfigError, match="eval.prompts"):
        load_config(None, ["eval.interval=10"])


def test_bad_target_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="target.path.*no config.json"):
        load_config(None, [f"target.path={tmp_path}"])


def test_unsupported_model_type_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ConfigError, match="model_type 'gpt2' is not supported"):
        load_config(None, [f"target.path={tmp_path}"])


def test_cli_bad_target_path_is_one_line_with_exit_2(tmp_path):
    done = run_trainer("--set", f"target.path={tmp_path / 'none'}", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"trainer: config error: <defaults>: key 'target.path': {tmp_path / 'none'}: not a directory "
        "(expected a local Hugging Face checkpoint)"]


def test_cli_checkpoint_without_weights_is_one_line_with_exit_2(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    fake_qwen3_8b(ckpt)
    done = run_trainer("--set", f"target.path={ckpt}", "--set", "devices.drafters=['cpu']",
                       "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"trainer: error: {ckpt}: cannot load the checkpoint"), lines


@pytest.mark.parametrize("name", ["seed-8gpu.toml", "seed-8gpu-threads.toml", "one-gpu.toml"])
def test_cli_gpu_config_with_a_target_path_gets_past_config_validation(tmp_path, name):
    """No unknown keys: the run fails only later, at the devices (no GPU here) or, on a GPU machine, at the data
    directory the config names (not generated here; checked before the weights, which the fake lacks)."""
    done = run_trainer("--config", f"trainer/configs/{name}", "--set", f"target.path={fake_qwen3_8b(tmp_path)}",
                       "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "config error" not in lines[0], lines
    assert any(why in lines[0] for why in ("devices not available", "not a generated data directory")), lines


def test_cli_generated_data_dir_that_is_not_one_is_one_line(tiny_qwen3, tmp_path):
    done = run_trainer("--set", f"target.path={tiny_qwen3}", "--set", "data.kind=generated",
                       "--set", f"data.dir={tmp_path}", "--set", "devices.drafters=['cpu']",
                       "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"trainer: error: {tmp_path}: not a generated data directory (no meta.json)"]


def test_data_from_a_larger_vocabulary_target_is_refused(tmp_path):
    from trainer.dataset import DataError, GeneratedData

    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 151936, "target": "/models/Qwen3-8B"}))
    with pytest.raises(DataError, match="vocab_size 151936 > this target's 385"):
        GeneratedData(tmp_path, 96, 8, 4, 0, vocab_size=385)


def test_tiny_hf_demo_config_needs_only_the_two_paths(tiny_qwen3, tmp_path):
    name = REPO / "trainer" / "configs" / "tiny-hf-cpu.toml"
    with pytest.raises(ConfigError, match="data.dir"):
        load_config(name, [f"target.path={tiny_qwen3}"])
    cfg = load_config(name, [f"target.path={tiny_qwen3}", f"data.dir={tmp_path}"])
    assert cfg.data.kind == "generated" and cfg.eval.interval == 100 and len(cfg.devices.drafters) == 2
    assert cfg.target.vocab_size == 385  # from the checkpoint's config.json, not the tiny-model default
