"""Target-generated training data: the target answers every prompt; the drafter learns to predict those answers.

`python -m trainer.data generate --target DIR --prompts FILE.jsonl --out DIR` (also `python -m trainer.datagen`).
The prompt file's format is trainer/prompt_file.py's, the output directory's trainer/dataset.py's. Rerunning the
same command resumes at the first missing shard; sampling is seeded per shard, so resumed output is the same.
This is the Hugging Face `generate` path (the default); with `--server URL` an OpenAI-compatible server (SGLang,
vLLM) answers instead: trainer/datagen_server.py. Both record their settings in meta.json `sampling` (same keys).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from trainer.checkpoint import atomic_write_bytes
from trainer.datagen_common import ProgressBar, check_resume
from trainer.dataset import FORMAT, DataError, shard_path, summarize, write_shard
from trainer.devices import device_problem, parse_devices
from trainer.prompt_file import encode_prompt, load_prompts


# ---- generation ---------------------------------------------------------------------------------------------
@dataclass
class GenSettings:
    max_new_tokens: int = 256
    sample: bool = False
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int = 0
    shard_size: int = 64
    batch_size: int = 8
    thinking: bool | None = None  # the chat template's enable_thinking; None: its default

    def key(self) -> dict[str, Any]:
        """What must match for a resumed run to continue the same data (batch size does not change it)."""
        k = {"max_new_tokens": self.max_new_tokens, "sample": self.sample, "seed": self.seed,
             "shard_size": self.shard_size}
        if self.sample:
            k |= {"temperature": self.temperature, "top_p": self.top_p}
        if self.thinking is not None:
            k["thinking"] = self.thinking
        return k

    def sampling(self, target_path: str) -> dict[str, Any]:
        """meta.json `sampling`: the same keys as the server path's (trainer/datagen_server.py)."""
        return {"backend": "hf", "server": None, "model": str(Path(target_path).resolve()),
                "temperature": self.temperature if self.sample else 0.0, "top_p": self.top_p if self.sample else None,
                "max_new_tokens": self.max_new_tokens,
                "thinking": "default" if self.thinking is None else self.thinking, "seed": self.seed,
                "concurrency": self.batch_size}


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    return [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])


def cut_response(tokens: list[int], eos_ids: list[int], pad_id: int | None) -> tuple[list[int], bool]:
    """Response up to and including its first end-of-sequence token; (tokens, ended_with_eos)."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1], True
    if pad_id is not None:
        while tokens and tokens[-1] == pad_id and pad_id not in eos_ids:
            tokens = tokens[:-1]
    return tokens, False


@torch.no_grad()
def generate_batch(model: Any, prompts: list[list[int]], settings: GenSettings, eos_ids: list[int],
                   pad_id: int) -> list[tuple[list[int], bool]]:
    """Left-padded batch through `model.generate`; one (response, ended_with_eos) per prompt."""
    width = max(len(p) for p in prompts)
    dev = model.get_input_embeddings().weight.device
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        att[row, width - len(p):] = 1
    kwargs: dict[str, Any] = {"max_new_tokens": settings.max_new_tokens, "do_sample": settings.sample,
                              "pad_token_id": pad_id, "eos_token_id": eos_ids or None}
    if settings.sample:
        kwargs |= {"temperature": settings.temperature, "top_p": settings.top_p, "top_k": 0}
    else:
        kwargs |= {"temperature": None, "top_p": None, "top_k": None}
    out = model.generate(input_ids=ids.to(dev), attention_mask=att.to(dev), **kwargs)
    return [cut_response(out[row, width:].tolist(), eos_ids, pad_id) for row in range(len(prompts))]


def generate_dataset(target_path: str, prompts_path: str | Path, out: str | Path, settings: GenSettings,
                     devices: list[str], limit: int = 0, stream: TextIO | None = None) -> dict[str, Any]:
    """Generate (or resume) a data directory; returns its meta. Raises DataError on bad input."""
    from trainer.config import TargetConfig
    from trainer.hf import load_hf_target, load_tokenizer
    from trainer.hf_config import HFConfigError

    out = Path(out)
    records = load_prompts(prompts_path)[: limit or None]
    try:
        target = load_hf_target(TargetConfig(path=target_path), devices)
    except HFConfigError as e:
        raise DataError(str(e)) from None
    tokenizer = load_tokenizer(target_path)
    model = target.model
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids or [0])[0]
    meta = {"format": FORMAT, "target": str(Path(target_path).resolve()), "prompts": str(Path(prompts_path).resolve()),
            "num_prompts": len(records), "generation": settings.key(), "sampling": settings.sampling(target_path),
            "sample_unit": "one sample per prompt (its final turn)", "eos_token_ids": eos_ids, "pad_token_id": pad_id,
            "mask_token_id": target.mask_token_id, "vocab_size": target.vocab_size,
            "chat_template": bool(getattr(tokenizer, "chat_template", None))}
    check_resume(out, meta)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "meta.json", json.dumps(meta, indent=1).encode())
    n_shards = math.ceil(len(records) / settings.shard_size)
    todo = [k for k in range(n_shards) if not shard_path(out, k).exists()]
    done = sum(min(settings.shard_size, len(records) - k * settings.shard_size) for k in range(n_shards)
               if k not in todo)
    bar = ProgressBar(len(records), done, stream)
    if done:
        print(f"resume: {n_shards - len(todo)}/{n_shards} shards already in {out}", file=bar.stream, flush=True)
    for k in todo:
        lo, hi = k * settings.shard_size, min(len(records), (k + 1) * settings.shard_size)
        torch.manual_seed(settings.seed * 1_000_003 + k)  # sampling depends on the shard only: resumable
        prompts = [encode_prompt(tokenizer, r, settings.thinking) for r in records[lo:hi]]
        samples: list[tuple[list[int], list[int], bool]] = []
        for b in range(0, len(prompts), settings.batch_size):
            chunk = prompts[b:b + settings.batch_size]
            for p, (resp, eos) in zip(chunk, generate_batch(model, chunk, settings, eos_ids, pad_id), strict=True):
                samples.append((p, resp, eos))
            bar.update(len(chunk))
        write_shard(shard_path(out, k), list(range(lo, hi)), samples)
    bar.close()
    meta["summary"] = summarize(out)
    atomic_write_bytes(out / "meta.json", json.dumps(meta, indent=1).encode())
    return meta


# ---- command line -----------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    from trainer.datagen_server import add_server_args

    p = argparse.ArgumentParser(prog="python -m trainer.data generate",
                                description="Generate training data: the target answers each prompt.")
    p.add_argument("--target", required=True, help="local Hugging Face checkpoint directory (Qwen3 / Llama); "
                                                   "with --server only its tokenizer and config.json are read")
    p.add_argument("--prompts", required=True, help="JSONL: one {prompt|messages|ids} per line")
    p.add_argument("--out", required=True, help="output directory (rerun the same command to resume)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 256 (4096 with --server)")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding (with --server: "
                                                         "--temperature 0 is greedy)")
    p.add_argument("--temperature", type=float, default=None, help="default 0.7")
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=None, help="default 0 (with --server: none, the server's own)")
    p.add_argument("--thinking", choices=("on", "off"), default=None,
                   help="the chat template's enable_thinking (Qwen3); default: the template's default")
    p.add_argument("--shard-size", type=int, default=64, help="prompts per shard (the unit of resume)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per generate call")
    p.add_argument("--devices", default="auto", help="comma list, layer-wise split (auto = all GPUs, else cpu)")
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts (0 = all)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU intra-op threads (0 = torch default; 1 avoids oversubscription on shared hosts)")
    add_server_args(p)
    return p.parse_args(argv)


def _hf_settings(args: argparse.Namespace) -> tuple[GenSettings, list[str]]:
    """Settings and devices of the Hugging Face path; DataError names the bad option."""
    from trainer.chat_client import THINKING
    from trainer.datagen_server import SERVER_ONLY

    for name in SERVER_ONLY:
        if getattr(args, name) is not None:
            raise DataError(f"--{name.replace('_', '-')} needs --server URL")
    settings = GenSettings(args.max_new_tokens or 256, args.sample, 0.7 if args.temperature is None else
                           args.temperature, args.top_p, args.seed or 0, args.shard_size, args.batch_size,
                           None if args.thinking is None else THINKING[args.thinking])
    for name in ("max_new_tokens", "shard_size", "batch_size"):
        if getattr(settings, name) < 1:
            raise DataError(f"--{name.replace('_', '-')} must be >= 1")
    devices = parse_devices(args.devices)
    problem = device_problem(devices) if devices else "--devices names no device"
    if problem:  # before the checkpoint loads: not a CUDA traceback from deep inside it
        raise DataError(problem)
    return settings, devices


def main(argv: list[str] | None = None) -> int:
    """Exit 0 done, 2 bad arguments/input or a server request that failed for good (one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["generate"]:
        argv = argv[1:]
    args = parse_args(argv)
    try:
        if args.server is not None:
            from trainer.datagen_server import generate_via_server, server_settings

            meta = generate_via_server(args.target, args.prompts, args.out, server_settings(args), args.limit)
        else:
            settings, devices = _hf_settings(args)
            if args.threads:
                torch.set_num_threads(args.threads)
            meta = generate_dataset(args.target, args.prompts, args.out, settings, devices, args.limit)
    except DataError as e:
        print(f"generate: error: {e}", file=sys.stderr)
        return 2
    s = meta["summary"]
    print(f"generated {s['samples']} samples in {args.out}: {s['response_tokens']} response tokens "
          f"(mean {s['mean_response_tokens']}), {s['ended_with_eos']} ended with EOS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
