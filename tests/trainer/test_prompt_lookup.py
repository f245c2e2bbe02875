"""Prompt lookup decoding: hand-made sequences, and the same proposals as transformers' generator."""

from __future__ import annotations

import random

import pytest

from trainer.prompt_lookup import propose_ngram
from trainer.sampling import GREEDY
from trainer.speculative import NgramSource


def test_longest_trailing_ngram_wins():
    # trailing 3-gram (1, 2, 3) occurs at 0 and is followed by 9 9; the 1-gram (3) occurs later, followed by 7
    ids = [1, 2, 3, 9, 9, 5, 3, 7, 4, 1, 2, 3]
    assert propose_ngram(ids, 2) == [9, 9]
    assert propose_ngram(ids, 2, max_ngram=1) == [9, 9]  # the 1-gram (3): earliest occurrence is index 2 too
    assert propose_ngram([5, 3, 7, 1, 2, 3, 9, 2, 3], 2) == [9, 2]  # 3-gram absent, 2-gram (2, 3) at index 4


def test_earliest_occurrence_wins_as_in_transformers():
    ids = [4, 8, 1, 4, 6, 6, 4]  # the 1-gram (4) occurs at 0 and at 3
    assert propose_ngram(ids, 3) == [8, 1, 4]


def test_continuation_is_cut_at_the_end_of_the_sequence():
    assert propose_ngram([7, 7, 7], 5) == [7]  # the 2-gram (7, 7) at 0: only the last token follows it
    assert propose_ngram([1, 2, 5, 1, 2], 10) == [5, 1, 2]


def test_no_match_proposes_nothing():
    assert propose_ngram([1, 2, 3, 4], 4) == []
    assert propose_ngram([5], 4) == []
    assert propose_ngram([], 4) == []


def test_min_ngram_stops_the_search():
    ids = [3, 8, 8, 1, 3]  # only the 1-gram (3) recurs
    assert propose_ngram(ids, 2) == [8, 8]
    assert propose_ngram(ids, 2, min_ngram=2) == []


def test_longest_match_found_is_not_extended_by_shorter_ones():
    # the 2-gram (1, 2) matches at index 0; its continuation is taken even though only 1 token long is possible
    ids = [1, 2, 1, 2]
    assert propose_ngram(ids, 4) == [1, 2]


def test_eos_cuts_the_proposal():
    ids = [1, 2, 0, 6, 1, 2]
    assert propose_ngram(ids, 4, eos_ids={6}) == [0]
    assert propose_ngram(ids, 4, eos_ids={0}) == []


def test_bad_arguments():
    with pytest.raises(ValueError):
        propose_ngram([1, 1], 0)
    with pytest.raises(ValueError):
        propose_ngram([1, 1], 2, max_ngram=0)


def test_the_speculative_source_proposes_by_lookup_and_ignores_the_features():
    source = NgramSource()
    assert not source.needs_features
    assert source.propose([4, 8, 1, 4], object(), 0, 2, GREEDY, None).tokens == [8, 1]


def test_same_proposals_as_transformers():
    torch = pytest.importorskip("torch")
    generation = pytest.importorskip("transformers.generation.candidate_generator")
    rng = random.Random(0)
    for trial in range(300):
        ids = [rng.randrange(4) for _ in range(rng.randrange(1, 25))]
        num, max_ngram = rng.randrange(1, 6), rng.randrange(1, 5)
        gen = generation.PromptLookupCandidateGenerator(num_output_tokens=num, max_matching_ngram_size=max_ngram,
                                                        max_length=10_000)
        out, _ = gen.get_candidates(torch.tensor([ids]))
        expected = out[0, len(ids):].tolist()
        assert propose_ngram(ids, num, max_ngram) == expected, (trial, ids, num, max_ngram)
