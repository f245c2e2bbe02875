"""Train a small Qwen3 causal LM on the Python standard library's own source: a target that has learned something.

trainer/hf_tiny.py's random checkpoint makes greedy text that is near-deterministic noise, so acceptance figures
measured on it say little about a drafter. This one is trained, in minutes on two CPU cores, on text every machine
has (a sorted, deterministic subset of the stdlib's top-level `*.py` files; every `heldout_every`-th file is held
out), so its greedy continuations are Python-like and a drafter's tau on it means something. Tokenizer: a
byte-level BPE built by `hf_tiny.build_tokenizer` on the training files, with a chat template that also takes
`enable_thinking` (accepted, no effect). The embedding has one row more than the tokenizer: the drafter's MASK row
(the trainer takes `vocab_size - 1`, trainer/hf.py), as on hf_tiny's checkpoints.

`python -m trainer.small_target --out DIR [--steps N] [--force]`; `ensure_small_target(cache_dir)` for callers
(`make demo`, benchmarks): reuses `cache_dir/small-qwen3` when its train_meta.json matches this code's version,
config and corpus, else builds it in a temporary directory and renames it into place.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.hf_tiny import build_tokenizer

VERSION = 2
"""Bump when the corpus selection, the tokenizer or the training changes: cached builds are then rebuilt."""
META = "train_meta.json"
CACHE_NAME = "small-qwen3"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    "{% if enable_thinking is defined %}{% endif %}"  # named so `--reasoning on/off` callers accept it; no effect
)


@dataclass(frozen=True)
class SmallTargetConfig:
    """Everything a build depends on (saved in train_meta.json; a cached build with another config is rebuilt)."""

    steps: int = 500
    """Optimizer steps (batch_size x seq_len tokens each)."""
    corpus_bytes: int = 3_000_000
    """Stdlib source taken, whole files in name order, until this many bytes."""
    heldout_every: int = 10
    """Every n-th selected file (the 5th, 15th, ...) is held out of training and of the tokenizer."""
    chat_max_chars: int = 1200
    """Functions with a docstring and at most this much source are also trained on as chat exchanges (0: none)."""
    vocab_size: int = 2048
    """BPE vocabulary (the model's embedding has one row more: the MASK row)."""
    hidden_size: int = 128
    num_layers: int = 6
    """6 so the drafter's default capture (3 layers spread over [1, L-3]) gets three distinct layers: 1, 2, 3."""
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    seq_len: int = 128
    batch_size: int = 16
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 30
    weight_decay: float = 0.1
    seed: int = 0
    threads: int = 2
    """torch threads while training (restored afterwards). Results are deterministic per seed *and* thread count.
    On a CPU shared with other jobs 1 can be faster: two OpenMP threads spin waiting for a busy core."""
    log_interval: int = 50
    eval_windows: int = 32
    """Held-out windows of seq_len tokens scored at each log step and at the end."""

    def __post_init__(self) -> None:
        for name in ("steps", "corpus_bytes", "heldout_every", "seq_len", "batch_size", "threads", "log_interval",
                     "eval_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"small target: {name} must be >= 1, got {getattr(self, name)}")
        if self.heldout_every < 2:
            raise ValueError("small target: heldout_every must be >= 2 (else nothing is left to train on)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("small target: num_heads must be a multiple of num_kv_heads")


def stdlib_files(max_bytes: int) -> list[Path]:
    """Public top-level stdlib modules (`*.py`, no leading underscore, valid UTF-8) in name order, up to max_bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    picked, total = [], 0
    for path in sorted(root.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            size = len(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        if picked and total + size > max_bytes:
            break
        picked.append(path)
        total += size
    if not picked:
        raise RuntimeError(f"no readable stdlib sources under {root}")
    return picked


def split_corpus(cfg: SmallTargetConfig) -> tuple[list[str], list[str], str]:
    """(training texts, held-out texts, sha256 of the selected files' names and contents)."""
    digest = hashlib.sha256()
    train, heldout = [], []
    for i, path in enumerate(stdlib_files(cfg.corpus_bytes)):
        text = path.read_text(encoding="utf-8")
        digest.update(path.name.encode() + b"\0" + text.encode() + b"\0")
        (heldout if i % cfg.heldout_every == cfg.heldout_every // 2 else train).append(text)
    if not heldout:
        raise RuntimeError("small target: corpus too small to hold a file out")
    return train, heldout, digest.hexdigest()


def token_stream(tok: Any, texts: list[str]) -> list[int]:
    """Every text's ids, each followed by the end token."""
    ids: list[int] = []
    for enc in tok(texts, add_special_tokens=False)["input_ids"]:
        ids += enc + [tok.eos_token_id]
    return ids


def chat_samples(texts: list[str], max_chars: int) -> list[list[dict[str, str]]]:
    """A user/assistant exchange for every function with a docstring (at most `max_chars` of source): asked for
    by name and docstring summary, answered with its source. Teaches answering after the chat template's
    `<|assistant|>` (prompts arrive through it) and stopping with `<|end|>`."""
    import ast
    import textwrap

    samples = []
    for text in texts:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not ast.get_docstring(node):
                continue
            source = ast.get_source_segment(text, node, padded=True)
            if not source or len(source) > max_chars:
                continue
            summary = ast.get_docstring(node).strip().splitlines()[0]
            samples.append([{"role": "user", "content": f"Write the Python function `{node.name}`: {summary}"},
                            {"role": "assistant", "content": textwrap.dedent(source)}])
    return samples


def chat_stream(tok: Any, samples: list[list[dict[str, str]]]) -> list[int]:
    """The samples rendered through the chat template (its special tokens as single ids), end to end."""
    texts = [tok.apply_chat_template(m, tokenize=False) for m in samples]
    return [i for enc in tok(texts, add_special_tokens=False)["input_ids"] for i in enc]


def new_model(cfg: SmallTargetConfig, tok: Any) -> Any:
    """The untrained Qwen3 for `tok` (vocab one row past the tokenizer), initialised from cfg.seed."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    mcfg = Qwen3Config(vocab_size=len(tok) + 1, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                       num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                       num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                       max_position_embeddings=1024, tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, bos_token_id=None)
    torch.manual_seed(cfg.seed)
    return Qwen3ForCausalLM(mcfg)


def lm_loss(model: Any, batch: Any) -> Any:
    """Mean next-token cross-entropy (nats) of a [B, T] batch."""
    import torch.nn.functional as F

    logits = model(input_ids=batch).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))


def heldout_loss(model: Any, ids: list[int], seq_len: int, max_windows: int, batch_size: int = 16) -> float:
    """Mean loss over the first `max_windows` non-overlapping windows of `ids` (deterministic)."""
    import torch

    n = min(max_windows, (len(ids) - 1) // seq_len)
    if n < 1:
        raise ValueError(f"held-out text too short for one window of {seq_len + 1} tokens")
    data = torch.tensor(ids[: n * seq_len + 1])
    windows = torch.stack([data[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])
    was_training = model.training
    model.eval()
    total = 0.0
    with torch.no_grad():
        for start in range(0, n, batch_size):
            chunk = windows[start: start + batch_size]
            total += float(lm_loss(model, chunk)) * len(chunk)
    model.train(was_training)
    return total / n


def train(model: Any, train_ids: list[int], heldout_ids: list[int], cfg: SmallTargetConfig,
          log: Any = print) -> list[dict[str, float]]:
    """Train in place on random windows of `train_ids`; returns the logged points (step, loss, heldout_loss)."""
    import torch

    data = torch.tensor(train_ids)
    if len(data) <= cfg.seq_len + 1:
        raise ValueError("small target: training text shorter than one window")
    from trainer.schedule import warmup_cosine

    def lr_at(step: int) -> float:
        return warmup_cosine(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps)

    gen = torch.Generator().manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    model.train()
    curve, window, t0 = [], [], time.perf_counter()
    for step in range(cfg.steps):
        starts = torch.randint(0, len(data) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
        batch = torch.stack([data[s: s + cfg.seq_len + 1] for s in starts.tolist()])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        window.append(float(loss.detach()))
        if (step + 1) % cfg.log_interval == 0 or step + 1 == cfg.steps:
            point = {"step": step + 1, "loss": sum(window) / len(window),
                     "heldout_loss": heldout_loss(model, heldout_ids, cfg.seq_len, cfg.eval_windows)}
            curve.append(point)
            window = []
            log(f"step {point['step']} loss {point['loss']:.4f} heldout {point['heldout_loss']:.4f} "
                f"lr {lr_at(step):.2e} elapsed_s {time.perf_counter() - t0:.1f}")
    model.eval()
    return curve


def read_meta(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def is_valid(path: Path, cfg: SmallTargetConfig, corpus_sha256: str) -> bool:
    """A complete build of this code's version, config and corpus (meta is written last, so it marks complete)."""
    meta = read_meta(path)
    if meta is None or meta.get("version") != VERSION or meta.get("config") != dataclasses.asdict(cfg):
        return False
    if meta.get("corpus_sha256") != corpus_sha256:
        return False
    return all((path / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))


def build(out: Path, cfg: SmallTargetConfig, log: Any = print) -> dict[str, Any]:
    """Tokenizer, training and save_pretrained into `out` (created); returns the meta written to train_meta.json."""
    import torch

    t0 = time.perf_counter()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        train_texts, heldout_texts, corpus_sha = split_corpus(cfg)
        tok = build_tokenizer(train_texts, cfg.vocab_size, CHAT_TEMPLATE)
        train_ids, heldout_ids = token_stream(tok, train_texts), token_stream(tok, heldout_texts)
        n_raw = len(train_ids)
        train_ids += chat_stream(tok, chat_samples(train_texts, cfg.chat_max_chars)) if cfg.chat_max_chars else []
        model = new_model(cfg, tok)
        params = sum(p.numel() for p in model.parameters())
        log(f"small target: {params} parameters, {len(train_ids)} training tokens ({len(train_ids) - n_raw} in chat "
            f"samples), {len(heldout_ids)} held out, vocab {len(tok)}+1")
        init = heldout_loss(model, heldout_ids, cfg.seq_len, cfg.eval_windows)
        log(f"step 0 heldout {init:.4f}")
        curve = train(model, train_ids, heldout_ids, cfg, log)
    finally:
        torch.set_num_threads(old_threads)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    meta = {"version": VERSION, "config": dataclasses.asdict(cfg), "corpus_sha256": corpus_sha,
            "corpus_files": len(train_texts) + len(heldout_texts), "parameters": params,
            "train_tokens": len(train_ids), "steps": cfg.steps, "final_loss": curve[-1]["loss"],
            "heldout_loss_init": init, "heldout_loss_final": curve[-1]["heldout_loss"],
            "mask_token_id": len(tok), "curve": curve, "seconds": round(time.perf_counter() - t0, 1)}
    (out / META).write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def ensure_at(out: str | Path, cfg: SmallTargetConfig | None = None, force: bool = False,
              log: Any = print) -> Path:
    """`out` when it already holds a valid build (and not `force`), else a fresh one built beside it and renamed in."""
    out, cfg = Path(out), cfg or SmallTargetConfig()
    if not force and out.exists() and is_valid(out, cfg, split_corpus(cfg)[2]):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        build(tmp, cfg, log)
        if out.exists():
            if any(out.iterdir()) and read_meta(out) is None:  # never delete a directory that is not a build
                raise FileExistsError(f"{out} exists and holds no {META}: not replacing it")
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def ensure_small_target(cache_dir: str | Path, cfg: SmallTargetConfig | None = None, log: Any = print) -> Path:
    """The trained checkpoint directory `cache_dir/small-qwen3`, built first when missing, stale or incomplete."""
    return ensure_at(Path(cache_dir) / CACHE_NAME, cfg, log=log)


def greedy_sample(path: str | Path, prompt: str, max_new_tokens: int = 48) -> str:
    """The saved model's greedy continuation of raw `prompt` text (no chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.small_target", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="checkpoint directory (reused when already valid)")
    p.add_argument("--steps", type=int, default=SmallTargetConfig.steps)
    p.add_argument("--seed", type=int, default=SmallTargetConfig.seed)
    p.add_argument("--threads", type=int, default=SmallTargetConfig.threads, help="torch threads while training")
    p.add_argument("--force", action="store_true", help="rebuild even when --out holds a valid build")
    args = p.parse_args(argv)
    cfg = SmallTargetConfig(steps=args.steps, seed=args.seed, threads=args.threads)
    path = ensure_at(args.out, cfg, force=args.force)
    meta = read_meta(path) or {}
    print(f"small target at {path}: {meta.get('steps')} steps, final loss {meta.get('final_loss', 0):.4f}, "
          f"held-out loss {meta.get('heldout_loss_init', 0):.4f} -> {meta.get('heldout_loss_final', 0):.4f}, "
          f"{meta.get('seconds')} s")
    prompt = 'def read_config(path):\n    """'
    print(f"greedy sample after {prompt!r}: {greedy_sample(path, prompt)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
