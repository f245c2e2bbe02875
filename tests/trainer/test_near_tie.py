"""The lossless verdict at temperature 0 counts a first difference at a near-tie (top-1/top-2 logit gap under
2 ulps of the logits' dtype) as a tie and reports how many, failing only on real mismatches."""

from __future__ import annotations

import torch

from trainer.config import Config
from trainer.eval import _first_difference, near_tie_tolerance
from trainer.eval_report import RequestResult, SetReport, render
from trainer.tiny_target import TinyTarget


def _req(i: int, lossless: bool, gap: float | None = None, tie: bool = False) -> RequestResult:
    return RequestResult(i, 0, 8, 4, 2, 2.0, 3, lossless, [2, 2], 0.01, 0.005, None if lossless else 1, gap, tie)


def test_tolerance_is_two_ulps_of_the_dtype_at_the_top_logit():
    assert near_tie_tolerance(torch.bfloat16, 20.0) == 2 * 2**-7 * 16 == 0.25
    assert near_tie_tolerance(torch.bfloat16, -3.0) == 2 * 2**-7 * 2
    assert near_tie_tolerance(torch.float32, 20.0) == 2 * 2**-23 * 16


def test_a_constructed_near_tie_in_a_bf16_target_is_a_tie_and_a_clear_top1_is_not():
    cfg = Config()
    torch.manual_seed(0)
    target = TinyTarget(cfg.target).to(torch.bfloat16)
    prompt = [5, 17, 42, 8]
    with torch.no_grad():
        logits, _ = target.forward_cached(torch.tensor([prompt]), target.new_cache(), [], logits_to_keep=1)
        top = int(logits[0, -1].float().argmax())
        rival = (top + 1) % cfg.target.vocab_size
        w = target.lm_head_proj.weight
        w[rival] = w[top]  # the rival's logit equals the greedy token's: a tie the kernels may break either way
    ref, out = [top], [rival]
    at, gap, tol = _first_difference(target, prompt, ref, out)
    assert at == 0 and gap < tol and tol > 0
    with torch.no_grad():
        w[rival] = -w[top]  # now the greedy token is a clear top-1 over the next best: a real mismatch
    _, gap, tol = _first_difference(target, prompt, ref, out)
    assert gap >= tol


def test_verdict_fails_only_on_real_mismatches_and_counts_near_ties():
    ties = SetReport("s", 16, [_req(0, True), _req(1, False, 0.1, tie=True)])
    assert ties.lossless and ties.near_ties == 1 and ties.lossless_count == 1
    assert ties.figures()["near_ties"] == 1
    text = render_set(ties)
    assert "near-tie (first diff at token 1, greedy top-2 gap 0.100)" in text
    real = SetReport("s", 16, [_req(0, False, 0.1, tie=True), _req(1, False, 3.5)])
    assert not real.lossless and real.near_ties == 1


def render_set(s: SetReport) -> str:
    from trainer.eval_report import EvalReport

    return render(EvalReport(16, sets=[s]))
