"""HFTarget.hidden_states in micro-batches (target.micro_batches) gives the features of the unsplit forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

from trainer.config import TargetConfig  # noqa: E402
from trainer.hf import load_hf_target  # noqa: E402


@pytest.mark.parametrize("devices", [["cpu"], ["cpu", "cpu:0"]])  # two names: the layer-split hooks are installed
def test_micro_batches_give_the_unsplit_features(tiny_qwen3, devices):
    target = load_hf_target(TargetConfig(path=str(tiny_qwen3)), devices)
    ids = torch.randint(0, 300, (5, 16))
    whole = target.hidden_states(ids, [0, 2])
    for m in (2, 3, 5, 8):  # uneven splits, one sequence each, more micro-batches than sequences
        target.cfg = dataclasses.replace(target.cfg, micro_batches=m)
        got = target.hidden_states(ids, [0, 2])
        assert got.shape == whole.shape
        torch.testing.assert_close(got, whole, rtol=1e-6, atol=1e-6)  # bitwise here; BLAS may block by batch
