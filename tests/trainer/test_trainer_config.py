"""Config loading: typed overrides, and every bad input is one stderr line naming file and key, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from trainer_harness import REPO, TINY

from trainer.config import ConfigError, load_config, spread_layers


def test_tiny_config_loads_and_overrides_are_typed_by_the_default():
    cfg = load_config(REPO / TINY, ["train.steps=50", "runtime.compile_strategy=off", "train.lr=1",
                                    "devices.drafters=[\"cpu\"]", "runtime.cuda_graphs=true"])
    assert cfg.train.steps == 50 and isinstance(cfg.train.steps, int)
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert cfg.devices.drafters == ["cpu"]
    assert cfg.runtime.cuda_graphs is True
    assert cfg.runtime.compile_strategy == "off"


def test_default_layer_ids_spread_over_1_to_L_minus_3():
    assert spread_layers(36, 5) == [1, 9, 17, 25, 33]


@pytest.mark.parametrize("body, key", [
    ("[train]\nstepz = 3\n", "train.stepz"),
    ("[train]\nsteps = \"ten\"\n", "train.steps"),
    ("[runtime]\ncompile_strategy = \"fast\"\n", "runtime.compile_strategy"),
    ("[nosuch]\nx = 1\n", "nosuch"),
    ("[train]\nseq_len = 20\n", "train.seq_len"),
    ("[train]\nblock_buckets = 9\n[runtime]\ncompile_strategy = \"warmup\"\nrecompile_limit = 8\n",
     "train.block_buckets"),
])
def test_bad_config_raises_naming_file_and_key(tmp_path, body, key):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and key in str(e.value)


def test_bad_override_names_the_key():
    with pytest.raises(ConfigError, match="train.steps"):
        load_config(None, ["train.steps=abc"])
    with pytest.raises(ConfigError, match="unknown key 'train.nope'"):
        load_config(None, ["train.nope=1"])


@pytest.mark.parametrize("args", [
    ["--config", "BAD", "--set", "runtime.compile_strategy=fast"],
    ["--config", "BAD"],
    ["--config", "does/not/exist.toml"],
    ["--config", TINY, "--set", "train.steps"],
    ["--bogus-flag"],
])
def test_cli_bad_config_is_one_stderr_line_and_exit_2(tmp_path, args):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nunknown_key = 1\n")
    args = [str(bad) if a == "BAD" else a for a in args]
    proc = subprocess.run([sys.executable, "-m", "trainer", *args, "--run-dir", str(tmp_path / "r")], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    if "--config" in args and args[1] != TINY:
        assert args[1] in lines[0]
