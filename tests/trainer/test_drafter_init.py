"""The drafter starts as SpecForge's does: Linear weights ~ normal(0, 0.02), biases 0, norm weights 1."""

from __future__ import annotations

import torch

from trainer.config import Config
from trainer.model import build_drafter
from trainer.tiny_target import TinyTarget


def test_linear_weights_are_normal_0_02_biases_zero_norms_one():
    cfg = Config()
    cfg.drafter.attention_bias = True
    torch.manual_seed(0)
    drafter = build_drafter(TinyTarget(cfg.target), cfg.drafter, len(cfg.layer_ids), "cpu")
    weights = torch.cat([m.weight.detach().reshape(-1) for m in drafter.modules() if isinstance(m, torch.nn.Linear)])
    assert weights.numel() > 50_000
    assert cfg.drafter.init_std == 0.02  # the default
    assert abs(float(weights.std()) - 0.02) < 0.02 * 0.02 and abs(float(weights.mean())) < 1e-3
    biases = [m.bias for m in drafter.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None]
    assert biases and all(torch.equal(b, torch.zeros_like(b)) for b in biases)
    norms = [p for n, p in drafter.named_parameters() if "norm" in n]
    assert norms and all(torch.equal(p, torch.ones_like(p)) for p in norms)
