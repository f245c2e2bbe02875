"""Train a drafter for a Hugging Face target on generated data, with periodic acceptance-length evaluation.

`python -m trainer.hf_train --target CKPT --data DATA_DIR --run-dir DIR [--config FILE] [--set k=v ...]
 [--eval-prompts FILE.jsonl --eval-interval N]`

Transitional: `Trainer` (trainer/pipeline.py) still builds the tiny target and the Markov data itself. This
subclass swaps in `HFTarget` and `GeneratedData` after construction and adds the periodic `eval step=N
acc_len=...` line. Once the pipeline calls `build_target` / `build_data` and the config has `[data] dir` and
`[eval]` (see docs/trainer-data-eval.md), `python -m trainer --config ...` does the same and this module goes.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

from trainer.config import Config, ConfigError, load_config
from trainer.pipeline import Trainer
from trainer.telemetry import emit


def build_data(cfg: Config, data_dir: str | Path):
    from trainer.datagen import GeneratedData

    tr = cfg.train
    return GeneratedData(data_dir, tr.seq_len, cfg.drafter.block_size, tr.num_anchors, tr.seed)


class HFTrainer(Trainer):
    def __init__(self, cfg: Config, run_dir: Path, target_path: str, data_dir: str | Path,
                 evals: dict | None = None, resume: bool = False) -> None:
        """`evals`: PeriodicEval keyword arguments (prompts, interval, max_new_tokens, eos_id) or None."""
        super().__init__(cfg, run_dir, resume=resume)
        from trainer.hf import load_hf_target
        from trainer.model import build_drafter

        tr = cfg.train
        cfg.target.path = target_path  # saved in every checkpoint: trainer.eval reloads the same target
        self.target = load_hf_target(cfg.target, list(cfg.devices.target))
        self.data = build_data(cfg, data_dir)
        torch.manual_seed(tr.seed)  # the same draw as Trainer.__init__, now with the HF target's weights
        base = build_drafter(self.target, cfg.drafter, len(self.layer_ids), "cpu")
        self.replicas = [copy.deepcopy(base).to(d) for d in self.devices]
        self.opts = [torch.optim.AdamW(r.parameters(), lr=tr.lr, betas=(0.9, 0.95), weight_decay=tr.weight_decay)
                     for r in self.replicas]
        from trainer.eval import PeriodicEval

        self.evals = PeriodicEval(self.target, self.layer_ids, cfg.drafter.block_size, **evals) if evals else None

    def _report(self, rank: int, n_ranks: int, step: int, loss: float, acc: float, acc_len: float, lr: float) -> None:
        super()._report(rank, n_ranks, step, loss, acc, acc_len, lr)
        if self.evals and self.evals.due(step + 1, self.cfg.train.steps):
            emit(f"eval step={step + 1} {self.evals(self.replicas[rank]).summary()}")


def target_config(target_path: str, path: str | None, overrides: list[str]) -> Config:
    """The config with the target's dimensions from its config.json (the tiny-model defaults do not apply)."""
    from trainer.hf_config import target_dims

    dims = [f"target.{k}={v}" for k, v in target_dims(target_path).items()]
    return load_config(path, dims + list(overrides))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.hf_train", description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True, help="directory written by `python -m trainer.data generate`")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--config")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--eval-prompts", help="prompt JSONL for the periodic acc_len evaluation")
    p.add_argument("--eval-interval", type=int, default=0)
    p.add_argument("--eval-limit", type=int, default=4)
    p.add_argument("--eval-max-new-tokens", type=int, default=32)
    args = p.parse_args(argv)
    from trainer.datagen import DataError
    from trainer.hf_config import HFConfigError

    try:
        cfg = target_config(args.target, args.config, args.set)
        evals = None
        if args.eval_prompts and args.eval_interval:
            from trainer.eval import load_eval_prompts
            from trainer.hf import load_tokenizer

            tok = load_tokenizer(args.target)
            evals = {"prompts": load_eval_prompts(args.eval_prompts, tok, args.eval_limit),
                     "interval": args.eval_interval, "max_new_tokens": args.eval_max_new_tokens,
                     "eos_id": tok.eos_token_id}
        trainer = HFTrainer(cfg, Path(args.run_dir), args.target, args.data, evals, resume=args.resume)
    except (ConfigError, HFConfigError, DataError) as e:
        print(f"trainer: error: {e}", file=sys.stderr)
        return 2
    return trainer.run()


if __name__ == "__main__":
    sys.exit(main())
