"""Our drafter and the paper authors' reference code (`dflash` 0.1.0 from PyPI, installed with --no-deps by the
Makefile) load each other's weights and compute the same thing: exported drafters load in
`dflash.model.DFlashDraftModel`, give the same logits, decode losslessly in the reference's `spec_generate`, and
a drafter written in the reference layout loads here (`drafter.init_from`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

dflash_model = pytest.importorskip("dflash.model", reason="pip install --no-deps dflash==0.1.0 (make test does)")

from trainer import checkpoint  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.drafter_format import DrafterFormatError  # noqa: E402
from trainer.export import drafter_meta, export, load_exported  # noqa: E402
from trainer.hf import build_target  # noqa: E402
from trainer.layers import sdpa_attend  # noqa: E402
from trainer.masks import dense_mask  # noqa: E402
from trainer.model import build_drafter  # noqa: E402

BLOCK = 8


def config(tiny_qwen3: Path, *extra: str):
    return load_config(None, [f"target.path={tiny_qwen3}", f"drafter.block_size={BLOCK}", "target.dtype=float32",
                              "target.num_captured=3", *extra])


def randomized_drafter(cfg, target, seed: int = 3):
    """A drafter whose every parameter (norm weights included) is random: a layout mix-up cannot cancel out."""
    torch.manual_seed(seed)
    drafter = build_drafter(target, cfg.drafter, len(cfg.layer_ids), "cpu")
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.05) + (1.0 if p.dim() == 1 else 0.0))
    return drafter.eval()


def save_checkpoint(run_dir: Path, cfg, drafter) -> Path:
    state = {"step": 7, "drafter": drafter.state_dict(), "optimizer": {}, "config": cfg.to_dict(),
             "drafter_meta": drafter_meta(cfg)}
    return checkpoint.save(run_dir, 7, state, keep=1)


def reference_logits(ref, target, feats, block_ids, ctx_len: int):
    """The reference's own draft step (dflash/model.py dflash_generate): embeddings of the block from the target,
    positions of context + block, then compute_logits with the target's LM head."""
    noise = dflash_model._raw_input_embeddings(target.model, block_ids)
    pos = torch.arange(ctx_len + block_ids.shape[1])[None]
    hidden = ref(target_hidden=feats, noise_embedding=noise, position_ids=pos)
    return ref.compute_logits(hidden, dflash_model._output_head(target.model))


def test_an_exported_drafter_loads_in_the_reference_class_with_the_same_logits(tiny_qwen3, tmp_path):
    cfg = config(tiny_qwen3)
    target = build_target(cfg)
    drafter = randomized_drafter(cfg, target)
    out = export(save_checkpoint(tmp_path / "run", cfg, drafter), tmp_path / "drafter", dtype="float32")
    meta = json.loads((out / "config.json").read_text())
    assert meta["dflash_config"] == {"mask_token_id": cfg.mask_token_id, "target_layer_ids": cfg.layer_ids,
                                     "block_size": BLOCK}
    ref = dflash_model.DFlashDraftModel.from_pretrained(str(out), dtype=torch.float32).eval()
    assert ref.target_layer_ids == cfg.layer_ids and ref.mask_token_id == cfg.mask_token_id
    assert ref.block_size == BLOCK

    ids = torch.randint(0, 300, (1, 21))
    with torch.no_grad():
        out_hf = target.model(ids, output_hidden_states=True)
        feats = dflash_model.extract_context_feature(out_hf.hidden_states, ref.target_layer_ids)
        assert torch.equal(feats, target.hidden_states(ids, cfg.layer_ids))  # the same captured features
        block = torch.full((1, BLOCK), cfg.mask_token_id)
        block[0, 0] = 17
        theirs = reference_logits(ref, target, feats, block, ids.shape[1])
        cached = drafter.draft_logits(feats, 0, block, drafter.new_cache())
        anchors = torch.tensor([[ids.shape[1]]])
        trained_path = drafter(block, torch.arange(21, 21 + BLOCK)[None], feats, sdpa_attend,
                               dense_mask(anchors, ids.shape[1], BLOCK))
    assert theirs.abs().max() > 1.0  # not a degenerate all-zero comparison
    torch.testing.assert_close(cached, theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(trained_path, theirs, rtol=1e-5, atol=1e-5)


def test_the_reference_spec_generate_with_our_drafter_returns_exactly_the_target_greedy_tokens(tiny_qwen3, tmp_path):
    cfg = config(tiny_qwen3)
    target = build_target(cfg)
    drafter = randomized_drafter(cfg, target, seed=5)
    out = export(save_checkpoint(tmp_path / "run", cfg, drafter), tmp_path / "drafter", dtype="float32")
    ref = dflash_model.DFlashDraftModel.from_pretrained(str(out), dtype=torch.float32)
    ids = torch.randint(0, 300, (1, 12))
    spec = ref.spec_generate(target.model, ids, max_new_tokens=40, stop_token_ids=None)
    greedy = target.model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert spec.shape[1] == ids.shape[1] + 40
    assert spec[0].tolist() == greedy[0].tolist()


def test_a_drafter_saved_in_the_reference_layout_loads_here_with_the_same_logits(tiny_qwen3, tmp_path):
    from transformers import Qwen3Config

    hf = json.loads((tiny_qwen3 / "config.json").read_text())
    ref_cfg = Qwen3Config(hidden_size=hf["hidden_size"], intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=hf["vocab_size"],
                          rms_norm_eps=hf["rms_norm_eps"], max_position_embeddings=512,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    ref_cfg.num_target_layers, ref_cfg.block_size = hf["num_hidden_layers"], BLOCK
    ref_cfg.dflash_config = {"target_layer_ids": [1, 3], "mask_token_id": hf["vocab_size"] - 1}
    ref_cfg.architectures = ["DFlashDraftModel"]
    torch.manual_seed(11)
    ref = dflash_model.DFlashDraftModel(ref_cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ref.save_pretrained(tmp_path / "published")

    cfg = config(tiny_qwen3, f"drafter.init_from={tmp_path / 'published'}")
    assert (cfg.drafter.num_layers, cfg.drafter.head_dim, cfg.drafter.intermediate_size) == (2, 16, 96)
    assert cfg.layer_ids == [1, 3] and cfg.mask_token_id == hf["vocab_size"] - 1
    target = build_target(cfg)
    drafter = build_drafter(target, cfg.drafter, len(cfg.layer_ids), "cpu")
    load_exported(drafter, cfg.drafter.init_from)
    ids = torch.randint(0, 300, (1, 15))
    feats = target.hidden_states(ids, cfg.layer_ids)
    block = torch.full((1, BLOCK), cfg.mask_token_id)
    block[0, 0] = 5
    with torch.no_grad():
        theirs = reference_logits(ref, target, feats, block, ids.shape[1])
    ours = drafter.eval().draft_logits(feats, 0, block, drafter.new_cache())
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_drafter_for_another_target_is_refused_before_any_model_loads(tiny_qwen3, tmp_path):
    from trainer.config import ConfigError

    bad = tmp_path / "other"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "hidden_size": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 1, "intermediate_size": 12288, "num_target_layers": 36,
        "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}}))
    with pytest.raises(ConfigError, match=r"drafter.init_from.*hidden_size 4096 does not match the target's 64"):
        config(tiny_qwen3, f"drafter.init_from={bad}")
    with pytest.raises(ConfigError, match=r"drafter.init_from.*config.json: missing"):
        config(tiny_qwen3, f"drafter.init_from={tmp_path}")


def test_export_never_overwrites_and_refuses_checkpoints_of_the_old_layout(tiny_qwen3, tmp_path):
    cfg = config(tiny_qwen3)
    drafter = randomized_drafter(cfg, build_target(cfg))
    ckpt = save_checkpoint(tmp_path / "run", cfg, drafter)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    run = [sys.executable, "-m", "trainer.export", "--checkpoint", str(tmp_path / "run"), "--out"]
    proc = subprocess.run([*run, str(tmp_path / "taken")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "already exists" in proc.stderr
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"

    old = torch.load(ckpt, weights_only=True)
    del old["drafter_meta"]
    torch.save(old, tmp_path / "old.pt")
    proc = subprocess.run([*run, str(tmp_path / "new"), "--checkpoint", str(tmp_path / "old.pt")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "older trainer" in proc.stderr
    assert not (tmp_path / "new").exists()

    proc = subprocess.run([*run, str(tmp_path / "new")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((tmp_path / "new" / "config.json").read_text())["dtype"] == "bfloat16"
    with pytest.raises(DrafterFormatError, match="already exists"):
        export(ckpt, tmp_path / "new")


def test_training_starts_from_an_exported_drafter(tiny_qwen3, generated, tmp_path):
    from conftest import tiny_train_config

    from trainer.pipeline import Trainer

    cfg = config(tiny_qwen3)
    drafter = randomized_drafter(cfg, build_target(cfg), seed=9)
    out = export(save_checkpoint(tmp_path / "run0", cfg, drafter), tmp_path / "drafter", dtype="float32")
    train_cfg = tiny_train_config(tiny_qwen3, generated, 2, [f"drafter.init_from={out}", "target.num_captured=1"])
    assert train_cfg.layer_ids == cfg.layer_ids  # from the directory, not from num_captured
    trainer = Trainer(train_cfg, tmp_path / "run1")
    for name, value in drafter.state_dict().items():
        assert torch.equal(trainer.replicas[1].state_dict()[name], value), name
    assert trainer.run() == 0
    _, state = checkpoint.read_checkpoint(tmp_path / "run1")
    assert state["drafter_meta"]["target_layer_ids"] == cfg.layer_ids


def test_trainer_eval_and_the_reference_give_the_same_tau_for_a_trained_drafter(trained_run, generated, tiny_qwen3,
                                                                             tmp_path):
    """The trained drafter of a real run, exported, evaluated by `trainer.eval --init-from` (greedy, KV caches) and
    by the reference's own `dflash_generate`, tau averaged the reference's way: equal within 1 %."""
    from trainer.eval import main
    from trainer.eval_load import load_eval_prompts
    from trainer.hf import load_tokenizer

    run_dir, _, rc = trained_run
    assert rc == 0
    published = export(run_dir, tmp_path / "drafter", dtype="float32")
    rows = load_eval_prompts(generated, load_tokenizer(str(tiny_qwen3)), limit=4)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"ids": r}) + "\n" for r in rows))
    report = tmp_path / "eval.json"
    assert main(["--init-from", str(published), "--target", str(tiny_qwen3), "--prompts", str(prompts),
                 "--max-new-tokens", "48", "--out", str(report)]) == 0
    ours = json.loads(report.read_text())
    assert ours["lossless_count"] == len(rows) and ours["init_from"] == str(published)

    ref = dflash_model.DFlashDraftModel.from_pretrained(str(published), dtype=torch.float32).eval()
    target = build_target(config(tiny_qwen3))
    per_request = []
    orig = dflash_model._cuda_time
    dflash_model._cuda_time = __import__("time").perf_counter  # the reference times with cuda.synchronize: no GPU here
    try:
        for r in rows:
            stats = dflash_model.dflash_generate(ref, target.model, torch.tensor([r]), 48, None, return_stats=True)
            per_request.append(sum(stats.acceptance_lengths) / len(stats.acceptance_lengths))
    finally:
        dflash_model._cuda_time = orig
    ref_tau = sum(per_request) / len(per_request)
    assert ref_tau > 1.5  # the drafter has learned something: a comparison of two 1.0s would prove nothing
    assert abs(ours["tau"] - ref_tau) <= 0.01 * ref_tau, (ours["tau"], ref_tau)


def test_a_drafter_directory_with_broken_weights_is_one_line_for_training_and_eval(tiny_qwen3, tmp_path):
    """config.json fine, model.safetensors truncated: `python -m trainer --init-from` and `trainer.eval
    --init-from` each say which file and exit 2, no traceback."""
    cfg = config(tiny_qwen3)
    out = export(save_checkpoint(tmp_path / "run", cfg, randomized_drafter(cfg, build_target(cfg))),
                 tmp_path / "drafter", dtype="float32")
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    env_args = ["--set", f"target.path={tiny_qwen3}", "--set", "target.num_captured=3"]
    for argv in ([sys.executable, "-m", "trainer", "--run-dir", str(tmp_path / "r"), "--init-from", str(out),
                  *env_args],
                 [sys.executable, "-m", "trainer.eval", "--init-from", str(out), "--target", str(tiny_qwen3),
                  "--prompts", "trainer/prompts/eval.jsonl", "--max-new-tokens", "4"]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and "model.safetensors: cannot read" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_resuming_from_a_checkpoint_of_the_old_layout_is_one_line_not_a_wrong_shape(tmp_path):
    run = tmp_path / "run"
    base = [sys.executable, "-m", "trainer", "--config", "trainer/configs/tiny-cpu.toml", "--run-dir", str(run),
            "--set", "train.steps=2", "--set", "runtime.compile_strategy=off", "--set", "devices.drafters=['cpu']"]
    assert subprocess.run(base, capture_output=True, text=True, timeout=300).returncode == 0
    (ckpt,) = checkpoint.list_checkpoints(run)
    old = torch.load(ckpt, weights_only=True)
    del old["drafter_meta"]
    torch.save(old, ckpt)
    proc = subprocess.run([*base, "--resume", "--set", "train.steps=4"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [next(ln for ln in proc.stderr.splitlines() if "older trainer" in ln)]
