"""Evaluation the paper's way: speculative decoding of a drafter against its target, measured as the reference
(dflash 0.1.0, `dflash.benchmark`) measures it.

`python -m trainer.eval --checkpoint RUN_DIR|FILE.pt (--prompts FILE.jsonl|DATA_DIR | --bench DIR|FILE)
[--draft dflash|ngram|none] [--temperature T --top-p P --top-k K --seed S] [--max-new-tokens 2048] [--json]`

Every request (a prompt, or one turn of a multi-turn conversation) is decoded twice with KV caches: target-only
(the baseline) and speculative. Reported per prompt set: τ (the mean over requests of each request's mean
acceptance length), time per output token of both and the speedup, tokens per target forward, and at
temperature 0 whether the speculative output equals the target-only greedy output (lossless). Exit 0 when
lossless on every request, 1 when one differs, 2 on bad arguments or input (one line on stderr). `evaluate()` is
the same measurement for the training pipeline's periodic `acc_len=` line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.eval_load import (
    Chat,
    EvalError,
    build_for_eval,
    check_devices,
    load_bench_sets,
    load_checkpoint,
    load_eval_prompts,
    stop_token_ids,
)
from trainer.eval_report import EvalReport, RequestResult, SetReport, render
from trainer.oneline import first_line
from trainer.sampling import GREEDY, Rng, Sampling
from trainer.speculative import DFlashSource, DraftSource, GenResult, NgramSource, generate, stop_set, target_device

WARMUP_TOKENS = 64  # the reference warms up both decoders with min(64, max_new_tokens) tokens


@dataclass(frozen=True)
class Settings:
    layer_ids: list[int]
    block_size: int
    max_new_tokens: int
    stop_ids: frozenset[int] = field(default_factory=frozenset)
    sampling: Sampling = GREEDY


def evaluate(target: Any, drafter: Any, prompts: list[list[int]], layer_ids: list[int], block_size: int,
             max_new_tokens: int, stop_ids: int | Iterable[int] | None, check_lossless: bool = True) -> EvalReport:
    """The DFlash drafter at temperature 0 on token-id prompts (one set): the periodic evaluation. Eager SDPA only:
    safe to call from a worker thread while other threads run compiled code (no eager flex_attention)."""
    was_training = drafter.training
    drafter.eval()
    try:
        return evaluate_sets(target, DFlashSource(drafter), {"prompts": prompts},
                             Settings(layer_ids, block_size, max_new_tokens, stop_set(stop_ids)),
                             baseline=check_lossless)
    finally:
        drafter.train(was_training)


def evaluate_sets(target: Any, source: DraftSource | None, sets: dict[str, list[Any]], settings: Settings,
                  chat: Chat | None = None, baseline: bool = True, warmup: bool = False,
                  draft: str = "dflash") -> EvalReport:
    """Every request of every set: target-only decoding (when `baseline`, or when `source` is None: then it is
    the only run) and speculative decoding. A set item is a token-id list or a prompt with text `turns` (needs
    `chat`). One seeded Rng for the whole evaluation, drawn in request order."""
    s = settings
    sampling = {"temperature": s.sampling.temperature, "top_p": s.sampling.top_p, "top_k": s.sampling.top_k,
                "seed": s.sampling.seed}
    report = EvalReport(s.block_size, draft, sampling, s.max_new_tokens)
    rng = Rng(s.sampling.seed)
    if warmup:
        first = next((item for items in sets.values() for item in items), None)
        if first is not None:
            prompt = first if isinstance(first, list) else _encode(chat, [{"role": "user", "content": first.turns[0]}])
            short = Settings(s.layer_ids, s.block_size, min(WARMUP_TOKENS, s.max_new_tokens), s.stop_ids, s.sampling)
            _request(target, source, prompt, 0, 0, short, rng, baseline=True)
            rng = Rng(s.sampling.seed)
    for name, items in sets.items():
        part = SetReport(name, s.block_size)
        report.sets.append(part)
        for index, item in enumerate(items):
            if isinstance(item, list):
                part.requests.append(_request(target, source, item, index, 0, s, rng, baseline)[0])
                continue
            messages: list[dict[str, str]] = []
            for turn, text in enumerate(item.turns):
                messages.append({"role": "user", "content": text})
                res, tokens = _request(target, source, _encode(chat, messages), index, turn, s, rng, baseline)
                part.requests.append(res)
                messages.append({"role": "assistant", "content": chat.decode(tokens)})
    return report


def _encode(chat: Chat | None, messages: list[dict[str, str]]) -> list[int]:
    if chat is None:
        raise EvalError("text prompts need a tokenizer (this target has none)")
    return chat.encode(messages)


def _request(target: Any, source: DraftSource | None, prompt: list[int], index: int, turn: int, s: Settings,
             rng: Rng, baseline: bool) -> tuple[RequestResult, list[int]]:
    """One request, baseline first (as the reference orders them); returns its record and the speculative output."""
    base: GenResult | None = None
    if baseline or source is None:
        base = generate(target, None, prompt, s.max_new_tokens, s.stop_ids, sampling=s.sampling, rng=rng)
    spec = base if source is None else generate(target, source, prompt, s.max_new_tokens, s.stop_ids, s.layer_ids,
                                                s.block_size, s.sampling, rng)
    assert spec is not None
    lossless, mismatch, gap, tie = None, None, None, False
    if base is not None and source is not None and s.sampling.greedy:
        lossless = base.tokens == spec.tokens
        if not lossless:
            mismatch, gap, tol = _first_difference(target, prompt, base.tokens, spec.tokens)
            tie = gap < tol
    res = RequestResult(index, turn, len(prompt), len(spec.tokens), len(spec.acceptance_lengths), spec.tau,
                        spec.target_forwards, lossless, spec.acceptance_lengths,
                        base.time_per_token_s if base is not None else None, spec.time_per_token_s, mismatch, gap,
                        tie)
    return res, spec.tokens


@torch.no_grad()
def _first_difference(target: Any, prompt: list[int], ref: list[int], out: list[int]) -> tuple[int, float, float]:
    """Where the outputs first differ, the target's greedy top-1 minus top-2 logit there, and the near-tie
    tolerance for the logits' dtype."""
    at = next((j for j, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b), min(len(ref), len(out)))
    ids = torch.tensor([prompt + ref[:at]], device=target_device(target))
    logits, _ = target.forward_cached(ids, target.new_cache(), [], logits_to_keep=1)
    top2 = logits[0, -1].float().topk(2).values
    return at, float(top2[0] - top2[1]), near_tie_tolerance(logits.dtype, float(top2[0]))


NEAR_TIE_ULPS = 2
"""A first difference whose top-1/top-2 gap is under 2 units in the last place of the logits' dtype, at the top
logit's magnitude, is a near-tie: bf16 keeps 8 significant bits (torch.finfo(bfloat16).eps = 2^-7), so at a top
logit of 20 the tolerance is 2 x 2^-7 x 16 = 0.25; the verify pass (16 positions) and the 1-token baseline round
the same logits through different kernels, each rounding once to bf16 at the end. fp32: 2 x 2^-23 x 16 = 3.8e-6."""


def near_tie_tolerance(dtype: torch.dtype, top_logit: float) -> float:
    """The near-tie gap for logits of `dtype` whose largest value is `top_logit` (NEAR_TIE_ULPS there)."""
    import math

    scale = 2.0 ** math.floor(math.log2(abs(top_logit))) if top_logit else 1.0
    return NEAR_TIE_ULPS * torch.finfo(dtype).eps * scale


class PeriodicEval:
    """The pipeline's periodic measurement: prompts tokenized once, `__call__` every `interval` steps (and at the
    last step) from the logging drafter thread; the caller logs `eval step=N acc_len=...` from `summary()`."""

    def __init__(self, target: Any, layer_ids: list[int], block_size: int, prompts: list[list[int]],
                 interval: int, max_new_tokens: int = 32, stop_ids: Iterable[int] = ()) -> None:
        self.target, self.layer_ids, self.block_size = target, layer_ids, block_size
        self.prompts, self.interval, self.max_new_tokens = prompts, interval, max_new_tokens
        self.stop_ids = list(stop_ids)
        self.last: EvalReport | None = None

    @classmethod
    def from_config(cls, cfg: Any, target: Any, layer_ids: list[int]) -> PeriodicEval | None:
        """From `[eval] interval / prompts / num_prompts / max_new_tokens`; None when disabled."""
        ev = cfg.eval
        if not ev.interval or not ev.prompts:
            return None
        tokenizer = None
        if cfg.target.path:
            from trainer.hf import load_tokenizer

            tokenizer = load_tokenizer(cfg.target.path)
        prompts = load_eval_prompts(ev.prompts, tokenizer, ev.num_prompts)
        return cls(target, layer_ids, cfg.drafter.block_size, prompts, ev.interval, ev.max_new_tokens,
                   stop_token_ids(target, tokenizer) if tokenizer is not None else ())

    def due(self, step: int, last_step: int) -> bool:
        return bool(self.interval) and (step % self.interval == 0 or step == last_step)

    def __call__(self, drafter: Any) -> EvalReport:
        self.last = evaluate(self.target, drafter, self.prompts, self.layer_ids, self.block_size,
                             self.max_new_tokens, self.stop_ids)
        return self.last


# ---- command line -------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer.eval", description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a step-*.pt file or a run directory (newest checkpoint)")
    src.add_argument("--config", help="a trainer TOML (with --untrained: the step-0 drafter)")
    src.add_argument("--init-from", metavar="DIR",
                     help="a drafter directory in the reference layout (python -m trainer.export, or a published "
                          "DFlash drafter); its target: --target")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config override")
    p.add_argument("--untrained", action="store_true", help="ignore the checkpoint's weights: the tau baseline")
    p.add_argument("--target", help="override target.path (a local HF checkpoint directory)")
    prompts = p.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompts", help="prompt JSONL or a generated data directory (one prompt set)")
    prompts.add_argument("--bench", help="prompt sets in the published formats: a directory of them, or one file")
    p.add_argument("--limit", type=int, default=0, help="N prompts per set (--bench: the reference's fixed shuffle)")
    p.add_argument("--max-new-tokens", type=int, default=2048, help="per request (the reference's default)")
    p.add_argument("--draft", choices=("dflash", "ngram", "none"), default="dflash",
                   help="draft source: the drafter, prompt lookup, or none (target-only decoding)")
    p.add_argument("--block-size", type=int, default=0, help="verification block (default: the drafter's)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (lossless check)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    p.add_argument("--device", default=None, help="drafter device (default: the config's first drafter device, as "
                                                 "the run trained it; timing on the CPU says nothing of a GPU host)")
    p.add_argument("--thinking", choices=("on", "off"), default=None,
                   help="the chat template's enable_thinking (Qwen3), as the data was generated; default: the "
                        "template's default")
    p.add_argument("--target-devices", help="comma list replacing the config's [devices] target (layer-wise split)")
    p.add_argument("--no-lossless-check", action="store_true",
                   help="skip the target-only decode (no lossless check, no baseline timing)")
    p.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (0 = torch default)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", help="also write the JSON report to this file (atomically)")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> tuple[EvalReport, dict[str, Any]]:
    from trainer.config import ConfigError, load_config
    from trainer.hf_config import HFConfigError

    thinking = None if args.thinking is None else args.thinking == "on"
    try:
        sampling = Sampling(args.temperature, args.top_p, args.top_k, args.seed)
    except ValueError as e:
        raise EvalError(str(e)) from None
    if args.max_new_tokens < 1 or args.limit < 0 or args.block_size < 0:
        raise EvalError("--max-new-tokens must be >= 1, --limit and --block-size >= 0")
    try:
        if args.checkpoint:
            cfg, weights = load_checkpoint(args.checkpoint)
        elif args.init_from:
            target_path = [f"target.path={args.target}"] if args.target else []
            cfg, weights = load_config(None, [*args.set, *target_path, f"drafter.init_from={args.init_from}"]), None
        else:
            cfg, weights = load_config(args.config, args.set), None
        if args.untrained:
            weights = None
        if args.target:
            cfg.target.path = args.target
        if args.target_devices:
            cfg.devices.target = [d.strip() for d in args.target_devices.split(",") if d.strip()]
        args.device = args.device or cfg.devices.drafters[0]
        check_devices([args.device, *cfg.devices.target])
        use_init = bool(args.init_from) and args.draft == "dflash" and not args.untrained
        from trainer.drafter_format import DrafterFormatError
        from trainer.export import load_exported, read_exported

        try:
            init_weights = read_exported(args.init_from) if use_init else None  # before the target loads
            target, drafter, layer_ids = build_for_eval(cfg, args.device, weights,
                                                        with_drafter=args.draft == "dflash")
            if init_weights is not None:
                load_exported(drafter, args.init_from, init_weights)
        except DrafterFormatError as e:
            raise EvalError(str(e)) from None
        tokenizer = None
        if cfg.target.path:
            from trainer.hf import load_tokenizer

            tokenizer = load_tokenizer(cfg.target.path)
        if args.bench:
            sets = load_bench_sets(args.bench, args.limit)
        else:
            sets = {Path(args.prompts).stem or "prompts": load_eval_prompts(args.prompts, tokenizer, args.limit,
                                                                            thinking)}
        source = _source(args.draft, drafter)
    except (ConfigError, HFConfigError) as e:
        raise EvalError(str(e)) from None
    except RuntimeError as e:  # load_state_dict: the checkpoint does not fit this config's drafter
        raise EvalError(f"drafter weights do not fit the config: {first_line(e)}") from None
    settings = Settings(layer_ids, args.block_size or cfg.drafter.block_size, args.max_new_tokens,
                        frozenset(stop_token_ids(target, tokenizer)), sampling)
    report = evaluate_sets(target, source, sets, settings,
                           Chat(tokenizer, thinking) if tokenizer is not None else None,
                           baseline=not args.no_lossless_check, warmup=True, draft=args.draft)
    info = {"checkpoint": args.checkpoint, "init_from": args.init_from,
            "untrained": args.untrained or not (args.checkpoint or args.init_from),
            "target": cfg.target.path or "tiny", "prompts": args.prompts or args.bench}
    return report, info


def _source(draft: str, drafter: Any) -> DraftSource | None:
    if draft == "dflash":
        drafter.eval()
        return DFlashSource(drafter)
    return NgramSource() if draft == "ngram" else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        report, info = run(args)
    except EvalError as e:
        print(f"eval: error: {e}", file=sys.stderr)
        return 2
    doc = {**info, **report.to_dict()}
    if args.out:
        from trainer.checkpoint import atomic_write_bytes

        atomic_write_bytes(Path(args.out), (json.dumps(doc, indent=1) + "\n").encode())
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(render(report))
    if report.near_ties:
        print(f"eval: {report.near_ties} request(s) differ first at a near-tie (top-1/top-2 gap under "
              f"{NEAR_TIE_ULPS} ulps of the logits' dtype): counted as ties, not failures", file=sys.stderr)
    if not report.lossless:
        print("eval: lossless check FAILED: speculative output differs from greedy decoding at a clear top-1 "
              "(not a near-tie)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
