"""Write a tiny, randomly initialised Hugging Face checkpoint (Qwen3 or Llama) with its own tokenizer.

Tests, the demo and the acceptance benchmark need a real `transformers` checkpoint directory but must never
download one. This builds everything locally: a byte-level BPE tokenizer trained on a prompt file (with a chat
template, so the chat path is exercised), and a small model saved with `save_pretrained`. The model's vocab has
one row more than the tokenizer: that unused last row is the drafter's MASK token, as on real checkpoints whose
embedding is padded past the tokenizer.

`python -m trainer.hf_tiny --out DIR [--family qwen3|llama] [--prompts FILE.jsonl]`
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
PROMPTS_DIR = Path(__file__).parent / "prompts"


def corpus_from_jsonl(path: Path) -> list[str]:
    """Every prompt and message text in a prompt file, or in every *.jsonl of a directory (tokenizer text)."""
    if path.is_dir():
        return [t for f in sorted(path.glob("*.jsonl")) for t in corpus_from_jsonl(f)]
    texts = []
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            texts += [rec["prompt"]] if "prompt" in rec else [m["content"] for m in rec.get("messages", [])]
    return texts


def build_tokenizer(texts: Iterable[str], vocab_size: int = 384, chat_template: str = CHAT_TEMPLATE):
    """A byte-level BPE (any text encodes) trained locally, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|pad|>")
    fast.chat_template = chat_template
    return fast


def make_tiny_checkpoint(out: str | Path, family: str = "qwen3", prompts: Path = PROMPTS_DIR,
                         hidden_size: int = 64, num_layers: int = 6, num_heads: int = 4, num_kv_heads: int = 2,
                         intermediate_size: int = 128, init_range: float = 0.02, io_std: float = 1.0,
                         seed: int = 0) -> Path:
    """Save tokenizer + random model to `out`; returns the directory. Deterministic for a given seed.

    Layers get HF's small init (`init_range`), embedding and LM head a large one (`io_std`): the logits are then
    peaked (top-2 gaps far above float noise, so greedy decoding is well defined) and the model behaves like a
    context-modulated bigram chain, which a drafter can learn in a short CPU run."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    out = Path(out)
    tok = build_tokenizer(corpus_from_jsonl(prompts))
    common = dict(vocab_size=len(tok) + 1, hidden_size=hidden_size, intermediate_size=intermediate_size,
                  num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                  max_position_embeddings=1024, initializer_range=init_range, tie_word_embeddings=False,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    if family == "qwen3":
        cfg, cls = Qwen3Config(head_dim=hidden_size // num_heads, **common), Qwen3ForCausalLM
    elif family == "llama":
        cfg, cls = LlamaConfig(**common), LlamaForCausalLM
    else:
        raise ValueError(f"family must be qwen3 or llama, got {family!r}")
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, io_std)
        model.get_output_embeddings().weight.normal_(0.0, io_std)
        # a zero EOS row gives EOS logit 0 among logits of std ~8: answers run to the token limit instead of
        # stopping at random after a few tokens (real targets end where the answer ends)
        model.get_output_embeddings().weight[tok.eos_token_id].zero_()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.hf_tiny", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--family", default="qwen3", choices=("qwen3", "llama"))
    p.add_argument("--prompts", default=str(PROMPTS_DIR), help="JSONL (or dir of them) whose texts train the tokenizer")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    path = make_tiny_checkpoint(args.out, args.family, Path(args.prompts), seed=args.seed)
    print(f"wrote tiny {args.family} checkpoint to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
