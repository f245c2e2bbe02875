"""Acceptance-length evaluation: real block speculative decoding of a trained drafter against its target.

`python -m trainer.eval --checkpoint RUN_DIR|FILE.pt --prompts FILE.jsonl|DATA_DIR [--untrained] [--json]`

Reports the mean acceptance length tau (tokens kept per verification step, accepted drafts + the target's own
token; 1.0 = the drafter never helps, block_size = every draft accepted), tokens per target forward (the prefill
counted), and whether every prompt's output equals plain greedy decoding of the target (lossless). Exit 0 when
lossless on every prompt, 1 when any prompt differs, 2 on bad arguments or input (one line on stderr).
`evaluate()` is the same measurement for the training pipeline's periodic `acc_len=` line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.speculative import drafter_fn, forward_fn, greedy_decode, speculative_decode, target_device


@dataclass
class PromptResult:
    index: int
    prompt_tokens: int
    new_tokens: int
    steps: int
    """Verification steps (target forwards after the prefill)."""
    tau: float
    target_forwards: int
    lossless: bool | None
    """None when the check was not run."""
    first_mismatch: int | None = None
    mismatch_gap: float | None = None
    """Greedy top-1 minus top-2 logit where they first differ: near 0 = a numerical near-tie (bf16)."""


@dataclass
class EvalReport:
    block_size: int
    prompts: list[PromptResult] = field(default_factory=list)

    @property
    def tau(self) -> float:
        """Token-weighted over all verification steps of all prompts."""
        steps = sum(p.steps for p in self.prompts)
        return sum(p.tau * p.steps for p in self.prompts) / steps if steps else float("nan")

    @property
    def tokens_per_forward(self) -> float:
        fwd = sum(p.target_forwards for p in self.prompts)
        return sum(p.new_tokens for p in self.prompts) / fwd if fwd else float("nan")

    @property
    def lossless_count(self) -> int:
        return sum(bool(p.lossless) for p in self.prompts)

    @property
    def lossless(self) -> bool:
        return all(p.lossless is not False for p in self.prompts)

    def to_dict(self) -> dict[str, Any]:
        return {"tau": self.tau, "tokens_per_forward": self.tokens_per_forward, "block_size": self.block_size,
                "lossless": self.lossless, "lossless_count": self.lossless_count, "num_prompts": len(self.prompts),
                "prompts": [dataclasses.asdict(p) for p in self.prompts]}

    def summary(self) -> str:
        checked = sum(p.lossless is not None for p in self.prompts)
        return (f"acc_len={self.tau:.3f} tokens_per_forward={self.tokens_per_forward:.3f} "
                f"block_size={self.block_size} lossless={self.lossless_count}/{checked}")


def evaluate(target: Any, drafter: Any, prompts: list[list[int]], layer_ids: list[int], block_size: int,
             max_new_tokens: int, eos_id: int | None, check_lossless: bool = True) -> EvalReport:
    """Speculative decoding of every prompt (+ greedy reference when `check_lossless`). Eager SDPA only: safe to
    call from a worker thread while other threads run compiled code (no eager flex_attention)."""
    forward = forward_fn(target, layer_ids)
    draft = drafter_fn(drafter, block_size, target.mask_token_id)
    dev = target_device(target)
    report = EvalReport(block_size)
    was_training = drafter.training
    drafter.eval()
    try:
        for i, prompt in enumerate(prompts):
            res = speculative_decode(forward, draft, prompt, max_new_tokens, eos_id, dev)
            lossless, mismatch, gap = None, None, None
            if check_lossless:
                ref = greedy_decode(forward, prompt, max_new_tokens, eos_id, dev)
                lossless = ref == res.tokens
                if not lossless:
                    mismatch = next((j for j, (a, b) in enumerate(zip(ref, res.tokens, strict=False)) if a != b),
                                    min(len(ref), len(res.tokens)))
                    logits, _ = forward(torch.tensor([prompt + ref[:mismatch]], device=dev))
                    top2 = logits[0, -1].float().topk(2).values
                    gap = float(top2[0] - top2[1])
            steps = len(res.accepted)
            report.prompts.append(PromptResult(i, len(prompt), len(res.tokens), steps,
                                               sum(res.accepted) / steps if steps else float("nan"),
                                               res.target_forwards, lossless, mismatch, gap))
    finally:
        drafter.train(was_training)
    return report


class PeriodicEval:
    """The pipeline's periodic measurement: prompts tokenized once, `__call__` every `interval` steps (and at the
    last step) from the logging drafter thread; the caller logs `eval step=N acc_len=...` from `summary()`."""

    def __init__(self, target: Any, layer_ids: list[int], block_size: int, prompts: list[list[int]],
                 interval: int, max_new_tokens: int = 32, eos_id: int | None = None) -> None:
        self.target, self.layer_ids, self.block_size = target, layer_ids, block_size
        self.prompts, self.interval, self.max_new_tokens, self.eos_id = prompts, interval, max_new_tokens, eos_id
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
                   getattr(tokenizer, "eos_token_id", None))

    def due(self, step: int, last_step: int) -> bool:
        return bool(self.interval) and (step % self.interval == 0 or step == last_step)

    def __call__(self, drafter: Any) -> EvalReport:
        self.last = evaluate(self.target, drafter, self.prompts, self.layer_ids, self.block_size,
                             self.max_new_tokens, self.eos_id)
        return self.last


# ---- loading ------------------------------------------------------------------------------------------------
class EvalError(Exception):
    """Bad checkpoint, config or prompts; one line for the user."""


def config_from_dict(data: dict[str, Any]):
    """Rebuild the trainer Config saved in a checkpoint (unknown keys from other versions are ignored)."""
    from trainer.config import Config

    cfg = Config()
    for section, body in data.items():
        sub = getattr(cfg, section, None)
        if not dataclasses.is_dataclass(sub) or not isinstance(body, dict):
            continue
        names = {f.name for f in dataclasses.fields(sub)}
        for key, value in body.items():
            if key in names:
                setattr(sub, key, value)
    return cfg


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    from trainer.checkpoint import list_checkpoints

    path = Path(path)
    if path.is_dir():
        found = list_checkpoints(path)
        if not found:
            raise EvalError(f"{path}: no checkpoints/step-*.pt in this run directory")
        path = found[-1]
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise EvalError(f"{path}: no such checkpoint") from None
    except Exception as e:
        raise EvalError(f"{path}: cannot load checkpoint ({first_line(e)})") from None
    if not isinstance(state, dict) or "drafter" not in state or "config" not in state:
        raise EvalError(f"{path}: not a trainer checkpoint (needs 'drafter' and 'config')")
    return state


def check_devices(devices: list[str]) -> None:
    """A bad or missing device is one line before any model loads (otherwise: a CUDA assertion traceback, or an
    'invalid device ordinal' RuntimeError reported as weights that do not fit)."""
    from trainer.devices import device_problem

    problem = device_problem(devices)
    if problem:
        raise EvalError(problem)


def build_for_eval(cfg: Any, device: str, drafter_state: dict[str, Any] | None) -> tuple[Any, Any, list[int]]:
    """(target, drafter, layer_ids). Without a state the drafter is the trainer's step-0 initialisation."""
    from trainer.hf import build_target, sync_target_config
    from trainer.model import build_drafter

    if cfg.target.path:
        cfg.target = sync_target_config(cfg.target)
    target = build_target(cfg)
    layer_ids = cfg.layer_ids
    torch.manual_seed(cfg.train.seed)  # the same draw as Trainer.__init__
    drafter = build_drafter(target, cfg.drafter, len(layer_ids), "cpu").to(device)
    if drafter_state is not None:
        drafter.load_state_dict(drafter_state)
    return target, drafter, layer_ids


def load_eval_prompts(source: str | Path, tokenizer: Any, limit: int = 0) -> list[list[int]]:
    """Token ids from a prompt JSONL (through the chat template) or the prompts of a generated data dir."""
    from trainer.dataset import DataError, read_samples
    from trainer.prompt_file import encode_prompt, load_prompts

    source = Path(source)
    try:
        if source.is_dir():
            prompts = [s.ids[: s.prompt_len].tolist() for s in read_samples(source)]
        else:
            prompts = [encode_prompt(tokenizer, r) for r in load_prompts(source)]
    except DataError as e:
        raise EvalError(str(e)) from None
    return prompts[: limit or None]


def render(report: EvalReport) -> str:
    rows = [f"{'prompt':>6} {'tokens':>6} {'new':>5} {'steps':>5} {'tau':>6} {'fwd':>5}  lossless"]
    for p in report.prompts:
        ok = "yes" if p.lossless else "-" if p.lossless is None else (
            f"NO (first diff at token {p.first_mismatch}, greedy top-2 gap {p.mismatch_gap:.3g})")
        rows.append(f"{p.index:>6} {p.prompt_tokens:>6} {p.new_tokens:>5} {p.steps:>5} {p.tau:>6.2f} "
                    f"{p.target_forwards:>5}  {ok}")
    rows.append(f"mean acceptance length tau = {report.tau:.3f} (block {report.block_size}); "
                f"tokens per target forward = {report.tokens_per_forward:.3f}; "
                f"lossless on {report.lossless_count}/{len(report.prompts)} prompts")
    return "\n".join(rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer.eval", description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a step-*.pt file or a run directory (newest checkpoint)")
    src.add_argument("--config", help="a trainer TOML (with --untrained: the step-0 drafter)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config override")
    p.add_argument("--untrained", action="store_true", help="ignore the checkpoint's weights: the tau baseline")
    p.add_argument("--target", help="override target.path (a local HF checkpoint directory)")
    p.add_argument("--prompts", required=True, help="prompt JSONL or a generated data directory")
    p.add_argument("--limit", type=int, default=0, help="first N prompts only")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--device", default="cpu", help="drafter device")
    p.add_argument("--target-devices", help="comma list replacing the config's [devices] target (layer-wise split)")
    p.add_argument("--no-lossless-check", action="store_true", help="skip the greedy reference decode")
    p.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (0 = torch default)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", help="also write the JSON report to this file (atomically)")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> tuple[EvalReport, dict[str, Any]]:
    from trainer.config import ConfigError, load_config
    from trainer.hf_config import HFConfigError

    try:
        if args.checkpoint:
            state = load_checkpoint(args.checkpoint)
            cfg, weights = config_from_dict(state["config"]), state["drafter"]
        else:
            cfg, weights = load_config(args.config, args.set), None
        if args.untrained:
            weights = None
        if args.target:
            cfg.target.path = args.target
        if args.target_devices:
            cfg.devices.target = [d.strip() for d in args.target_devices.split(",") if d.strip()]
        check_devices([args.device, *cfg.devices.target])
        target, drafter, layer_ids = build_for_eval(cfg, args.device, weights)
        tokenizer = None
        if cfg.target.path:
            from trainer.hf import load_tokenizer

            tokenizer = load_tokenizer(cfg.target.path)
        prompts = load_eval_prompts(args.prompts, tokenizer, args.limit)
    except (ConfigError, HFConfigError) as e:
        raise EvalError(str(e)) from None
    except RuntimeError as e:  # load_state_dict: the checkpoint does not fit this config's drafter
        raise EvalError(f"drafter weights do not fit the config: {first_line(e)}") from None
    eos = getattr(tokenizer, "eos_token_id", None)
    report = evaluate(target, drafter, prompts, layer_ids, cfg.drafter.block_size, args.max_new_tokens, eos,
                      check_lossless=not args.no_lossless_check)
    info = {"checkpoint": args.checkpoint, "untrained": args.untrained or not args.checkpoint,
            "target": cfg.target.path or "tiny", "prompts": args.prompts, "max_new_tokens": args.max_new_tokens}
    return report, info


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
    if not report.lossless:
        print("eval: lossless check FAILED: speculative output differs from greedy decoding", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
