"""Prompt lookup (n-gram) decoding: the drafter-free baseline a DFlash drafter is compared against.

The rule is transformers' `PromptLookupCandidateGenerator.get_candidates` (what `generate(...,
prompt_lookup_num_tokens=N)` runs), on plain lists: take the trailing n-gram of the sequence, n from `max_ngram`
down to `min_ngram` (never longer than len(ids) - 1); find its occurrences in the sequence, scanning left to right,
so the *earliest* occurrence wins; propose up to `num_tokens` tokens that followed it, cut at the end of the
sequence (a continuation may run into the trailing n-gram itself). An occurrence with nothing after it (the
trailing n-gram matching itself) is skipped. The first n that has an occurrence decides: shorter n-grams are not
tried. Nothing found: no proposal, and decoding falls back to one target token per step.

transformers' defaults differ from ours: `max_matching_ngram_size=2` there, `max_ngram=3` here (the value of the
prompt-lookup-decoding reference implementation).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def propose_ngram(ids: Sequence[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1,
                  eos_ids: Collection[int] = ()) -> list[int]:
    """Up to `num_tokens` tokens to propose after `ids`, by prompt lookup; [] when no n-gram matches.

    With `eos_ids`, a proposal is cut before its first end token, as transformers does with `eos_token_id` (a
    match whose continuation starts with one proposes nothing; later matches are not tried)."""
    if num_tokens < 1 or max_ngram < 1 or min_ngram < 1:
        raise ValueError(f"num_tokens, max_ngram and min_ngram must be >= 1 (got {num_tokens}, {max_ngram}, "
                         f"{min_ngram})")
    ids = list(ids)
    n_ids = len(ids)
    for n in range(min(max_ngram, n_ids - 1), min_ngram - 1, -1):
        tail = ids[n_ids - n:]
        for start in range(n_ids - n):  # the last window (the tail itself) has no continuation
            if ids[start: start + n] == tail:
                chosen = ids[start + n: start + n + num_tokens]
                for i, tok in enumerate(chosen):
                    if tok in eos_ids:
                        return chosen[:i]
                return chosen
    return []

