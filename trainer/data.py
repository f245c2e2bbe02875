"""Synthetic training data with learnable structure (no real dataset yet; docs/trainer.md says so).

Each sequence is a uniform-random prompt followed by a response drawn from a fixed sparse Markov chain: every
token has `branching` successors, the first taken with probability `top_prob`. A drafter can learn to predict
k tokens ahead (best possible top-1 accuracy at distance k is about top_prob**k), so the loss falls well below
the uniform log(V) within a tiny run. Batches are a pure function of (seed, step): resume sees the same data.
"""

from __future__ import annotations

import torch

from trainer.config import DataConfig
from trainer.dataset import Batch

EXACT_CHAIN_MAX_VOCAB = 8192


class MarkovData:
    def __init__(self, dcfg: DataConfig, vocab_size: int, seq_len: int, block_size: int, num_anchors: int,
                 seed: int) -> None:
        self.cfg, self.seq_len, self.block_size, self.num_anchors, self.seed = (
            dcfg, seq_len, block_size, num_anchors, seed)
        self.n_tokens = vocab_size - 1  # the last id is the drafter's MASK token and never appears in data
        gen = torch.Generator().manual_seed(dcfg.chain_seed)
        if self.n_tokens <= EXACT_CHAIN_MAX_VOCAB:  # distinct successors; O(V^2), fine for small vocabularies
            self.successors = torch.stack(
                [torch.randperm(self.n_tokens, generator=gen)[: dcfg.branching] for _ in range(self.n_tokens)])
        else:  # real-target vocabularies (150k): O(V); a repeated successor has probability ~branching^2 / V
            self.successors = torch.randint(0, self.n_tokens, (self.n_tokens, dcfg.branching), generator=gen)
        rest = (1.0 - dcfg.top_prob) / max(1, dcfg.branching - 1)
        probs = torch.full((dcfg.branching,), rest)
        probs[0] = dcfg.top_prob if dcfg.branching > 1 else 1.0
        self.probs = probs

    def batch(self, step: int, n_seqs: int) -> Batch:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        p, t = self.cfg.prompt_len, self.seq_len
        ids = torch.empty(n_seqs, t, dtype=torch.long)
        ids[:, :p] = torch.randint(0, self.n_tokens, (n_seqs, p), generator=gen)
        choice = torch.multinomial(self.probs.expand(n_seqs, -1), t - p, replacement=True, generator=gen)
        for i in range(p, t):
            ids[:, i] = self.successors[ids[:, i - 1], choice[:, i - p]]
        lo, hi = p, t - 2  # anchors anywhere in the response with a next token; a block's overflow is masked
        scores = torch.rand(n_seqs, hi - lo + 1, generator=gen)
        anchors = scores.topk(self.num_anchors, dim=1).indices.sort(dim=1).values + lo
        return Batch(step=step, ids=ids, anchors=anchors, ends=torch.full((n_seqs,), t, dtype=torch.long))


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer.data generate --target DIR --prompts FILE.jsonl --out DIR` (see trainer/datagen.py)."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["generate"]:
        print("usage: python -m trainer.data generate --target DIR --prompts FILE.jsonl --out DIR [...]",
              file=sys.stderr)
        return 2
    from trainer.datagen import main as generate_main

    return generate_main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
