"""A bf16 target (the GPU path's precision) trains a drafter with fp32 master weights under autocast — exercised
here with CPU autocast, which has bf16 too, so the dtype path is tested without a GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from trainer.compile import drafter_forward  # noqa: E402
from trainer.config import DrafterConfig, load_config  # noqa: E402
from trainer.eval import evaluate  # noqa: E402
from trainer.hf import build_target  # noqa: E402
from trainer.layers import sdpa_attend  # noqa: E402
from trainer.loss import block_inputs, position_weights  # noqa: E402
from trainer.masks import dense_mask  # noqa: E402
from trainer.model import build_drafter  # noqa: E402


def _target(tiny_qwen3, dtype: str):
    cfg = load_config(None, [f"target.path={tiny_qwen3}", f"target.dtype={dtype}", "drafter.block_size=8",
                             "data.prompt_len=8", "train.seq_len=64"])
    return cfg, build_target(cfg)


def _step(target, cfg, ids, anchors):
    torch.manual_seed(0)
    drafter = build_drafter(target, cfg.drafter, len(cfg.layer_ids), "cpu")
    hidden = target.hidden_states(ids, cfg.layer_ids)
    block_ids, block_pos, labels = block_inputs(ids, anchors, 8, target.mask_token_id)
    loss, _, _ = drafter_forward(drafter, block_ids, block_pos, hidden, dense_mask(anchors, 64, 8), labels,
                                 position_weights(8, cfg.gamma), False)
    loss.backward()
    return drafter, hidden, loss


def test_bf16_target_drafter_keeps_fp32_weights_and_matches_the_fp32_loss(tiny_qwen3):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 380, (2, 64), generator=gen)
    anchors = torch.tensor([[10, 30], [12, 40]])
    cfg32, t32 = _target(tiny_qwen3, "float32")
    cfg16, t16 = _target(tiny_qwen3, "bfloat16")
    d32, h32, loss32 = _step(t32, cfg32, ids, anchors)
    d16, h16, loss16 = _step(t16, cfg16, ids, anchors)
    assert h32.dtype == torch.float32 and h16.dtype == torch.bfloat16
    assert d16.embed_weight.dtype == d16.lm_head_weight.dtype == torch.bfloat16  # the target's, not upcast
    assert d16.compute_dtype == torch.bfloat16 and d32.compute_dtype == torch.float32
    params = [p for p in d16.parameters() if p.requires_grad]
    assert params and all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in params)
    assert all(p.grad.isfinite().all() for p in params)
    assert torch.isfinite(loss16) and loss16.dtype == torch.float32
    assert abs(loss16.item() - loss32.item()) < 0.02 * abs(loss32.item())  # bf16 rounding, not a different model
    # the logits are computed in bf16 (autocast is really on), the fp32 drafter's in fp32
    block_ids, block_pos, _ = block_inputs(ids, anchors, 8, t16.mask_token_id)
    with torch.no_grad():
        logits16 = d16(block_ids, block_pos, h16, sdpa_attend, dense_mask(anchors, 64, 8))
        logits32 = d32(block_ids, block_pos, h32, sdpa_attend, dense_mask(anchors, 64, 8))
    assert logits16.dtype == torch.bfloat16 and logits32.dtype == torch.float32


def test_speculative_eval_with_a_bf16_target_is_lossless(tiny_qwen3):
    cfg, target = _target(tiny_qwen3, "bfloat16")
    torch.manual_seed(0)
    drafter = build_drafter(target, DrafterConfig(block_size=8), len(cfg.layer_ids), "cpu")
    report = evaluate(target, drafter, [[5, 6, 7, 8], [100, 200, 300]], cfg.layer_ids, 8, 16, None)
    assert report.lossless and report.lossless_count == 2
    assert report.tau >= 1.0


@pytest.mark.slow
def test_bf16_target_trains_compiled_on_two_drafter_threads(tiny_qwen3, generated, tmp_path, capfd):
    """The warm-up strategy compiles the autocast region (dynamo traces torch.autocast), 0 recompiles after."""
    from conftest import tiny_train_config

    from trainer.pipeline import Trainer

    cfg = tiny_train_config(tiny_qwen3, generated, 30, ["target.dtype=bfloat16", "runtime.compile_strategy=warmup"])
    trainer = Trainer(cfg, tmp_path / "run")
    assert trainer.run() == 0
    out = capfd.readouterr().out
    assert "drafter_compute=bfloat16" in out and "training finished steps=30 recompiles=0" in out
    losses = [float(line.split("loss=")[1].split()[0]) for line in out.splitlines() if line.startswith("step=")]
    assert len(losses) == 3 and losses[-1] < 0.6 * losses[0], losses
    assert trainer.target.embed_tokens.weight.dtype == torch.bfloat16
    a, b = trainer.replicas
    assert all(p.dtype == torch.float32 for p in a.parameters())
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
