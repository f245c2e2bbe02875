"""What an evaluation loads: checkpoint and config, target and drafter, prompt sets, the chat rendering of
multi-turn prompts, stop tokens. Problems become one-line `EvalError`s (exit 2 in `python -m trainer.eval`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch


class EvalError(Exception):
    """Bad checkpoint, config or prompts; one line for the user."""


def load_checkpoint(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """(config, drafter state) of a step-*.pt file or a run directory's newest checkpoint."""
    from trainer.checkpoint import CheckpointError, checkpoint_config, read_checkpoint

    try:
        _, state = read_checkpoint(path)
    except CheckpointError as e:
        raise EvalError(str(e)) from None
    return checkpoint_config(state), state["drafter"]


def check_devices(devices: list[str]) -> None:
    """A bad or missing device is one line before any model loads (otherwise: a CUDA assertion traceback, or an
    'invalid device ordinal' RuntimeError reported as weights that do not fit)."""
    from trainer.devices import device_problem

    problem = device_problem(devices)
    if problem:
        raise EvalError(problem)


def build_for_eval(cfg: Any, device: str, drafter_state: dict[str, Any] | None,
                   with_drafter: bool = True) -> tuple[Any, Any, list[int]]:
    """(target, drafter or None, layer_ids). Without a state the drafter is the trainer's step-0 initialisation."""
    from trainer.hf import build_target, sync_target_config
    from trainer.model import build_drafter

    if cfg.target.path:
        cfg.target = sync_target_config(cfg.target)
    target = build_target(cfg)
    layer_ids = cfg.layer_ids
    if not with_drafter:
        return target, None, layer_ids
    torch.manual_seed(cfg.train.seed)  # the same draw as Trainer.__init__
    drafter = build_drafter(target, cfg.drafter, len(layer_ids), "cpu").to(device)
    if drafter_state is not None:
        drafter.load_state_dict(drafter_state)
    return target, drafter, layer_ids


def load_eval_prompts(source: str | Path, tokenizer: Any, limit: int = 0,
                      thinking: bool | None = None) -> list[list[int]]:
    """Token ids from a prompt JSONL (through the chat template) or the prompts of a generated data dir."""
    from trainer.dataset import DataError, read_samples
    from trainer.prompt_file import encode_prompt, load_prompts

    source = Path(source)
    try:
        if source.is_dir():
            prompts = [s.ids[: s.prompt_len].tolist() for s in read_samples(source)]
        else:
            prompts = [encode_prompt(tokenizer, r, thinking) for r in load_prompts(source)]
    except DataError as e:
        raise EvalError(str(e)) from None
    return prompts[: limit or None]


def select(items: list[Any], count: int) -> list[Any]:
    """The reference's `_select_dataset`: `count` items of a fixed shuffle (random.Random(42)); 0 = all, in order."""
    if not count:
        return list(items)
    order = list(range(len(items)))
    random.Random(42).shuffle(order)
    return [items[i] for i in order[:count]]


def load_bench_sets(path: str | Path, limit: int = 0) -> dict[str, list[Any]]:
    """Prompt sets in the published formats (trainer/benchsets.py): every set of a directory, or one file (its stem
    names the set: gsm8k.jsonl, mt-bench.jsonl, ...). Each prompt has `turns`; each turn is a request."""
    from trainer.benchsets import BenchError, load_bench, load_bench_dir

    path = Path(path)
    if not path.exists():
        raise EvalError(f"{path}: no such file or directory")
    try:
        sets = load_bench_dir(path) if path.is_dir() else {path.stem: load_bench(path.stem, path)}
    except BenchError as e:
        raise EvalError(str(e)) from None
    return {name: select(prompts, limit) for name, prompts in sets.items()}


class Chat:
    """Multi-turn prompts the reference's way: the conversation so far through the chat template (generation
    prompt added), and the speculative output decoded back into text as the assistant's turn."""

    def __init__(self, tokenizer: Any, thinking: bool | None = None) -> None:
        self.tokenizer, self.thinking = tokenizer, thinking

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        from trainer.prompt_file import encode_prompt

        return encode_prompt(self.tokenizer, {"messages": messages}, self.thinking)

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


def stop_token_ids(target: Any, tokenizer: Any) -> list[int]:
    """The reference's stop tokens: the model's generation_config eos_token_id(s), else the tokenizer's EOS."""
    gen = getattr(getattr(target, "model", None), "generation_config", None)
    ids = getattr(gen, "eos_token_id", None)
    if ids is None:
        ids = getattr(tokenizer, "eos_token_id", None)
    if ids is None:
        return []
    return [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]
