"""Fixtures: tiny Hugging Face checkpoints written by the test session itself (never downloaded)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing in these tests may reach a hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_paths import PROMPTS  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores: oversubscribed OpenMP spins are slower than one thread
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from trainer.hf_tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-qwen3", "qwen3")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from trainer.hf_tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-llama", "llama", seed=1)


@pytest.fixture(scope="session")
def generated(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 topic prompts answered greedily by the tiny Qwen3 (48 new tokens each), in shards of 16."""
    import torch

    from trainer.datagen import GenSettings, generate_dataset

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("data") / "gen"
    generate_dataset(str(tiny_qwen3), PROMPTS / "topics.jsonl", out,
                     GenSettings(max_new_tokens=48, shard_size=16, batch_size=8), ["cpu"], limit=40,
                     stream=io.StringIO())
    return out


def tiny_train_config(tiny_qwen3: Path, data_dir: Path, steps: int, extra: list[str] = ()):
    """The config `python -m trainer --set ...` would build: tiny HF target, generated data, 2 CPU drafters."""
    from trainer.config import load_config

    return load_config(None, [
        f"target.path={tiny_qwen3}", "data.kind=generated", f"data.dir={data_dir}",
        "devices.drafters=['cpu', 'cpu']", f"train.steps={steps}", "train.seq_len=96", "train.batch_size=4",
        "train.num_anchors=4", "train.lr=1e-2", "train.min_lr=1e-3", "train.warmup_steps=5",
        "train.log_interval=10", "train.checkpoint_interval=0", "drafter.block_size=8", "data.prompt_len=8",
        "runtime.compile_strategy=off", "runtime.heartbeat_interval_s=0.5", *extra])


@pytest.fixture(scope="session")
def trained_run(tiny_qwen3: Path, generated: Path, tmp_path_factory: pytest.TempPathFactory):
    """120 steps of the real `Trainer`, 2 drafter threads on the CPU, periodic eval every 60 steps on the
    prompts of the first 2 generated samples; returns (run_dir, trainer, rc)."""
    import torch

    from trainer.pipeline import Trainer

    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("runs") / "hf"
    cfg = tiny_train_config(tiny_qwen3, generated, 120, [
        "eval.interval=60", f"eval.prompts={generated}", "eval.num_prompts=2", "eval.max_new_tokens=24"])
    trainer = Trainer(cfg, run_dir)
    rc = trainer.run()
    return run_dir, trainer, rc
