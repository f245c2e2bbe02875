"""q, k and v reach attention in one dtype (the compute dtype), and GQA runs without repeated k/v: under bf16
autocast on the CPU, the dtype path a bf16 target takes on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer.config import Config
from trainer.layers import RMSNorm, check_attention_inputs, sdpa_attend
from trainer.loss import block_inputs
from trainer.masks import dense_mask
from trainer.model import build_drafter
from trainer.tiny_target import TinyTarget


def _bf16_drafter():
    cfg = Config()
    cfg.drafter.num_kv_heads = 2  # GQA: 2 query heads per key/value head
    target = TinyTarget(cfg.target)
    target.embed_tokens.weight.data = target.embed_tokens.weight.data.bfloat16()  # what an HF bf16 target hands over
    target.lm_head_proj.weight.data = target.lm_head_proj.weight.data.bfloat16()
    torch.manual_seed(0)
    drafter = build_drafter(target, cfg.drafter, len(cfg.layer_ids), "cpu")
    ids = torch.randint(0, 255, (2, 64), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[16, 30], [20, 48]])
    hidden = target.hidden_states(ids, cfg.layer_ids).bfloat16()
    block_ids, block_pos, _ = block_inputs(ids, anchors, 16, target.mask_token_id)
    return drafter, (block_ids, block_pos, hidden), dense_mask(anchors, 64, 16)


def test_rms_norm_with_fp32_weight_returns_fp32_under_bf16_autocast():
    """Why the cast is needed: the per-head q_norm/k_norm promote bf16 activations to fp32 (v is not normed)."""
    x = torch.randn(2, 4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.Linear(8, 8)(x)
        assert y.dtype == torch.bfloat16 and RMSNorm(8)(y).dtype == torch.float32


def test_drafter_attention_gets_q_k_v_in_the_compute_dtype_under_bf16_autocast():
    drafter, args, mask = _bf16_drafter()
    assert drafter.compute_dtype == torch.bfloat16
    seen: list[tuple[torch.dtype, ...]] = []

    def attend(q, k, v, m):
        seen.append((q.dtype, k.dtype, v.dtype, q.shape[1], k.shape[1]))
        return sdpa_attend(q, k, v, m)

    states = drafter.hidden(*args, attend, mask)
    states.float().sum().backward()
    assert len(seen) == len(drafter.layers)
    # bf16 all three, and 4 query heads over 2 key/value heads reach the kernel unrepeated
    assert all(s == (torch.bfloat16, torch.bfloat16, torch.bfloat16, 4, 2) for s in seen), seen
    assert all(p.grad is not None and p.dtype == torch.float32 for p in drafter.parameters() if p.requires_grad)


def test_mixed_dtypes_are_refused_where_attention_is_called():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4).bfloat16()
    with pytest.raises(TypeError, match="q torch.float32, k torch.float32, v torch.bfloat16"):
        check_attention_inputs(q, k, v)
    with pytest.raises(TypeError, match="differ in dtype"):
        sdpa_attend(q, k, v, None)


def test_gqa_without_repeat_matches_repeated_key_values():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 6, 16, generator=g), torch.randn(2, 2, 6, 16, generator=g),
               torch.randn(2, 2, 6, 16, generator=g))
    mask = torch.rand(2, 1, 6, 6, generator=g) > 0.4
    mask[..., 0] = True
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=mask)
    torch.testing.assert_close(sdpa_attend(q, k, v, mask), ref)
