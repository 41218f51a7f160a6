"""Caption overlap (BLEU-1..4, ROUGE-1/L) of retrieved items: hand cases and a naive loop."""

from __future__ import annotations

import numpy as np
import pytest
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from crossview.core.errors import CrossViewError
from crossview.eval import caption_overlap, caption_overlap_i2t, caption_overlap_t2i
from crossview.eval.overlap import OVERLAP_KEYS, SentenceOverlap

# Two images with one caption each; image 1's caption is a copy of image 0's.
SAME = ["a red circle above a blue square", "a red circle above a blue square"]
# Two images whose captions share no word.
DISJOINT = ["a red circle above a blue square", "two green triangles"]


def test_identical_retrieved_caption_is_perfect():
    ci = np.array([0, 1])
    # each image prefers the *other* image's caption, whose text equals its own gold caption
    s = np.array([[0.1, 0.9],
                  [0.9, 0.1]])
    res = caption_overlap(s, ci, SAME, k=1)
    for direction in ("i2t", "t2i"):
        for n in range(1, 5):
            assert res[direction][f"BLEU-{n}"] == pytest.approx(100.0)
        assert res[direction]["ROUGE-1"] == pytest.approx(1.0)
        assert res[direction]["ROUGE-L"] == pytest.approx(1.0)


def test_disjoint_retrieved_caption_scores_zero():
    ci = np.array([0, 1])
    s = np.array([[0.1, 0.9],
                  [0.9, 0.1]])
    res = caption_overlap(s, ci, DISJOINT, k=1)
    for direction in ("i2t", "t2i"):
        assert res[direction] == {key: 0.0 for key in OVERLAP_KEYS}


def test_average_over_retrieved_items_and_queries():
    ci = np.array([0, 1])
    # k=2: every image retrieves both captions: one is its own (perfect), one disjoint (zero)
    s = np.array([[0.9, 0.1],
                  [0.1, 0.9]])
    res = caption_overlap_i2t(s, ci, DISJOINT, k=2)
    assert res["BLEU-4"] == pytest.approx(50.0)
    assert res["ROUGE-L"] == pytest.approx(0.5)
    # only image 1 as query: top-1 is its own caption -> perfect
    assert caption_overlap_i2t(s, ci, DISJOINT, k=1, query_ids=[1])["BLEU-1"] == pytest.approx(100.0)


def test_bleu_orders_equal_separate_sacrebleu_calls():
    rng = np.random.default_rng(0)
    words = "a the red blue green circle square triangle above below left of two small big".split()
    scorer = SentenceOverlap()
    rouge = rouge_scorer.RougeScorer(["rouge1", "rougeL"])
    for _ in range(40):
        hyp = " ".join(rng.choice(words, rng.integers(1, 9)))
        refs = [" ".join(rng.choice(words, rng.integers(1, 9))) for _ in range(rng.integers(1, 4))]
        got = scorer(hyp, refs)
        for n in range(1, 5):
            direct = BLEU(max_ngram_order=n, effective_order=True, lowercase=True).sentence_score(hyp, refs)
            assert got[f"BLEU-{n}"] == pytest.approx(direct.score, abs=1e-9)
        best = rouge.score_multi(refs, hyp)
        assert got["ROUGE-1"] == pytest.approx(best["rouge1"].fmeasure, abs=1e-12)
        assert got["ROUGE-L"] == pytest.approx(best["rougeL"].fmeasure, abs=1e-12)


def _naive(s, ci, captions, k, direction):
    def order(row):
        return sorted(range(len(row)), key=lambda j: (-float(row[j]), j))[:k]

    rouge = rouge_scorer.RougeScorer(["rouge1", "rougeL"])
    rows = []
    queries = range(s.shape[0]) if direction == "i2t" else range(s.shape[1])
    for q in queries:
        if direction == "i2t":
            pairs = [(captions[c], [captions[g] for g in range(len(ci)) if ci[g] == q]) for c in order(s[q])]
        else:
            pairs = [(captions[q], [captions[g] for g in range(len(ci)) if ci[g] == i]) for i in order(s[:, q])]
        for hyp, refs in pairs:
            row = {f"BLEU-{n}": BLEU(max_ngram_order=n, effective_order=True, lowercase=True)
                   .sentence_score(hyp, refs).score for n in range(1, 5)}
            r = rouge.score_multi(refs, hyp)
            row["ROUGE-1"], row["ROUGE-L"] = r["rouge1"].fmeasure, r["rougeL"].fmeasure
            rows.append(row)
    return {key: sum(r[key] for r in rows) / len(rows) for key in OVERLAP_KEYS}


@pytest.mark.parametrize("direction", ["i2t", "t2i"])
def test_overlap_matches_naive_loop(direction):
    rng = np.random.default_rng(1)
    words = "a the red blue green circle square triangle above below next to two small big".split()
    n_images, per = 6, 3
    ci = np.repeat(np.arange(n_images), per)
    captions = [" ".join(rng.choice(words, rng.integers(3, 9))) for _ in range(ci.size)]
    s = np.round(rng.standard_normal((n_images, ci.size)), 1)     # with ties
    fn = caption_overlap_i2t if direction == "i2t" else caption_overlap_t2i
    got = fn(s, ci, captions, k=5)
    expect = _naive(s, ci, captions, 5, direction)
    for key in OVERLAP_KEYS:
        assert got[key] == pytest.approx(expect[key], abs=1e-9)


def test_overlap_input_errors():
    with pytest.raises(CrossViewError, match="captions"):
        caption_overlap_i2t(np.zeros((2, 2)), np.array([0, 1]), ["only one"])
    with pytest.raises(CrossViewError, match="k must be"):
        caption_overlap_t2i(np.zeros((2, 2)), np.array([0, 1]), ["a", "b"], k=0)
