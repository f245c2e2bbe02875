"""The small trained target: a very small build learns (held-out stdlib loss falls clearly below the untrained
model's), is saved as a loadable HF checkpoint with the MASK row, is deterministic, and is cached by version."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from trainer import small_target  # noqa: E402
from trainer.small_target import (  # noqa: E402
    META,
    SmallTargetConfig,
    ensure_at,
    ensure_small_target,
    heldout_loss,
    new_model,
    split_corpus,
    token_stream,
)

# seconds on one core: near-byte vocab (300), 80 steps of 8 x 64 tokens; held-out loss falls ~5.7 -> ~4.5
TINY = SmallTargetConfig(steps=80, corpus_bytes=300_000, heldout_every=4, vocab_size=300, hidden_size=64,
                         num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=128, seq_len=64,
                         batch_size=8, lr=3e-2, min_lr=3e-3, warmup_steps=5, log_interval=40, eval_windows=8,
                         threads=1)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_small_target(tmp_path_factory.mktemp("cache"), TINY, log=lambda line: None)


def test_trained_model_beats_the_untrained_one_on_heldout_text(built: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built, local_files_only=True)
    trained = AutoModelForCausalLM.from_pretrained(built, local_files_only=True)
    ids = token_stream(tok, split_corpus(TINY)[1])  # files never seen in training nor by the tokenizer
    untrained_loss = heldout_loss(new_model(TINY, tok), ids, TINY.seq_len, 16)
    trained_loss = heldout_loss(trained, ids, TINY.seq_len, 16)
    assert trained_loss < 0.85 * untrained_loss, (trained_loss, untrained_loss)
    meta = json.loads((built / META).read_text())
    assert meta["heldout_loss_final"] < 0.85 * meta["heldout_loss_init"]
    assert meta["curve"][-1]["loss"] < meta["curve"][0]["loss"]


def test_checkpoint_layout(built: Path):
    from transformers import AutoConfig, AutoTokenizer

    from trainer.config import TargetConfig
    from trainer.hf import load_hf_target

    tok = AutoTokenizer.from_pretrained(built, local_files_only=True)
    cfg = AutoConfig.from_pretrained(built, local_files_only=True)
    assert cfg.model_type == "qwen3" and cfg.vocab_size == len(tok) + 1
    meta = json.loads((built / META).read_text())
    assert meta["mask_token_id"] == len(tok) == load_hf_target(TargetConfig(path=str(built)), ["cpu"]).mask_token_id
    assert meta["version"] == small_target.VERSION and meta["steps"] == TINY.steps
    assert meta["config"] == dataclasses.asdict(TINY) and len(meta["corpus_sha256"]) == 64
    msgs = [{"role": "user", "content": "hi"}]
    plain = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert plain == "<|user|>hi<|end|><|assistant|>"
    for thinking in (True, False):
        assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                       enable_thinking=thinking) == plain
    assert "enable_thinking" in tok.chat_template  # what dflash's benchmark looks for before passing the flag


def test_same_seed_same_weights(tmp_path: Path):
    short = dataclasses.replace(TINY, steps=4, log_interval=2)
    one, two = (ensure_at(tmp_path / name, short, log=lambda line: None) for name in ("one", "two"))
    assert (one / "model.safetensors").read_bytes() == (two / "model.safetensors").read_bytes()
    assert (one / "tokenizer.json").read_bytes() == (two / "tokenizer.json").read_bytes()
    other = ensure_at(tmp_path / "seed1", dataclasses.replace(short, seed=1), log=lambda line: None)
    assert (other / "model.safetensors").read_bytes() != (one / "model.safetensors").read_bytes()


def test_cache_reused_when_valid_rebuilt_when_stale(built: Path, monkeypatch: pytest.MonkeyPatch):
    calls = []

    def fake_build(out, cfg, log):
        calls.append(out)
        raise RuntimeError("build called")

    monkeypatch.setattr(small_target, "build", fake_build)
    assert ensure_small_target(built.parent, TINY) == built and not calls
    with pytest.raises(RuntimeError, match="build called"):  # another config: not this build
        ensure_small_target(built.parent, dataclasses.replace(TINY, steps=61))
    meta_path = built / META
    original = meta_path.read_text()
    try:
        meta_path.write_text(json.dumps({**json.loads(original), "version": small_target.VERSION - 1}))
        with pytest.raises(RuntimeError, match="build called"):  # an older version: rebuilt
            ensure_small_target(built.parent, TINY)
    finally:
        meta_path.write_text(original)
    assert len(calls) == 2
    assert sorted(p.name for p in built.parent.iterdir()) == [built.name]  # failed builds left no temp dirs
    assert ensure_small_target(built.parent, TINY) == built


def test_never_replaces_a_directory_that_is_not_a_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(small_target, "build", lambda out, cfg, log: None)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="holds no train_meta.json"):
        ensure_at(precious, TINY)
    assert (precious / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious"]


def test_config_is_checked():
    with pytest.raises(ValueError, match="heldout_every"):
        SmallTargetConfig(heldout_every=1)
    with pytest.raises(ValueError, match="num_kv_heads"):
        SmallTargetConfig(num_heads=4, num_kv_heads=3)
