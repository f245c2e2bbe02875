"""A tiny local Qwen3 / Llama checkpoint loads as the trainer's target and gives the drafter its pieces."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from trainer.config import DrafterConfig, TargetConfig  # noqa: E402
from trainer.hf import HFTarget, load_hf_target, split_layers  # noqa: E402
from trainer.model import build_drafter  # noqa: E402


def test_layers_split_in_contiguous_even_chunks():
    assert split_layers(36, [f"cuda:{i}" for i in range(5)]).count("cuda:0") == 8
    plan = split_layers(6, ["a", "b", "c"])
    assert plan == ["a", "a", "b", "b", "c", "c"]
    assert split_layers(3, ["cpu"]) == ["cpu"] * 3


@pytest.mark.parametrize("fixture", ["tiny_qwen3", "tiny_llama"])
def test_checkpoint_loads_with_dims_from_config_json(request, fixture):
    path = request.getfixturevalue(fixture)
    target = load_hf_target(TargetConfig(path=str(path)), ["cpu"])
    assert isinstance(target, HFTarget)
    hf = transformers.AutoConfig.from_pretrained(path)
    assert (target.cfg.num_layers, target.cfg.hidden_size, target.vocab_size) == (
        hf.num_hidden_layers, hf.hidden_size, hf.vocab_size)
    assert target.model.dtype == torch.float32  # CPU: fp32 (bf16 only when a target device is CUDA)
    assert not any(p.requires_grad for p in target.model.parameters())
    assert target.mask_token_id == hf.vocab_size - 1


def test_captured_features_are_the_outputs_of_those_decoder_layers(tiny_qwen3):
    target = load_hf_target(TargetConfig(path=str(tiny_qwen3)), ["cpu"])
    seen = {}
    for i in (1, 3):
        target.decoder_layers[i].register_forward_hook(
            lambda m, a, out, i=i: seen.__setitem__(i, out[0] if isinstance(out, tuple) else out))
    ids = torch.randint(0, 300, (2, 12))
    feats = target.hidden_states(ids, [1, 3])
    assert feats.shape == (2, 12, 2 * target.hidden_size)
    torch.testing.assert_close(feats, torch.cat([seen[1], seen[3]], dim=-1))
    logits, feats2 = target.forward_all(ids, [1, 3])
    torch.testing.assert_close(feats2, feats)
    torch.testing.assert_close(logits, target.model(ids).logits)


def test_split_over_two_devices_gives_the_same_features_and_generation(tiny_llama):
    one = load_hf_target(TargetConfig(path=str(tiny_llama)), ["cpu"])
    two = load_hf_target(TargetConfig(path=str(tiny_llama)), ["cpu", "cpu:0"])  # two names, hooks installed
    assert two.layer_devices == ["cpu"] * 3 + ["cpu:0"] * 3
    ids = torch.randint(0, 300, (1, 10))
    torch.testing.assert_close(two.hidden_states(ids, [1, 2]), one.hidden_states(ids, [1, 2]))
    gen = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(two.model.generate(ids, **gen), one.model.generate(ids, **gen))


def test_drafter_takes_hidden_size_and_frozen_embedding_and_head_from_the_target(tiny_qwen3):
    target = load_hf_target(TargetConfig(path=str(tiny_qwen3)), ["cpu"])
    drafter = build_drafter(target, DrafterConfig(block_size=8), 3, "cpu")
    torch.testing.assert_close(drafter.embed_weight, target.model.get_input_embeddings().weight)
    torch.testing.assert_close(drafter.lm_head_weight, target.model.get_output_embeddings().weight)
    assert drafter.fc.in_features == 3 * target.hidden_size and drafter.fc.out_features == target.hidden_size
    trainable = {n for n, p in drafter.named_parameters() if p.requires_grad}
    assert trainable and not any("embed" in n or "lm_head" in n for n in trainable)
    assert "embed_weight" not in drafter.state_dict()  # the target's weights are never checkpointed with it


def test_bf16_on_cuda_fp32_on_cpu():
    from trainer.hf import default_dtype

    assert default_dtype(["cpu"]) == torch.float32
    assert default_dtype(["cuda:0", "cuda:1"]) == torch.bfloat16


def test_speculative_decoding_of_a_llama_target_equals_its_greedy_decoding(tiny_llama):
    from trainer.eval import evaluate

    target = load_hf_target(TargetConfig(path=str(tiny_llama)), ["cpu", "cpu:0"])
    torch.manual_seed(0)
    drafter = build_drafter(target, DrafterConfig(block_size=8), 2, "cpu")
    report = evaluate(target, drafter, [[3, 40, 41, 42], [4, 100, 7]], [1, 2], 8, 16, None)
    assert report.lossless and report.lossless_count == 2
    assert report.tau < 1.3 and report.prompts[0].new_tokens == 16
