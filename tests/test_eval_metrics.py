"""Ranks, rank metrics and protocols against naive per-query loops and hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest

from crossview.core.errors import CrossViewError
from crossview.eval import (
    coco_1k,
    coco_5k,
    evaluate,
    i2t_ranks,
    identity_hits,
    mean_average_precision,
    precision_at_k,
    rank_metrics,
    recall_at_k,
    relevance_from_label_sets,
    t2i_ranks,
    top_k,
)
from crossview.eval import metrics as metrics_mod

# ---------------------------------------------------------------- naive references (plain Python)


def naive_order(row) -> list[int]:
    """Gallery indices best first: descending score, ascending index on ties."""
    vals = [float(v) for v in row]
    return sorted(range(len(vals)), key=lambda j: (-vals[j], j))


def naive_i2t(s, ci) -> list[int]:
    out = []
    for i in range(s.shape[0]):
        order = naive_order(s[i])
        out.append(1 + min(order.index(c) for c in range(len(ci)) if ci[c] == i))
    return out


def naive_t2i(s, ci) -> list[int]:
    return [1 + naive_order(s[:, c]).index(int(ci[c])) for c in range(len(ci))]


def naive_metrics(ranks, ks=(1, 5, 10)) -> dict:
    ranks = sorted(ranks)
    n = len(ranks)
    out = {f"R@{k}": 100.0 * sum(r <= k for r in ranks) / n for k in ks}
    out["MedR"] = ranks[n // 2] if n % 2 else (ranks[n // 2 - 1] + ranks[n // 2]) / 2
    out["MeanR"] = sum(ranks) / n
    return out


def random_case(rng, n_images, per_image, ties=False, dtype=np.float64):
    ci = np.repeat(np.arange(n_images), per_image)
    ci = ci[rng.permutation(ci.size)]           # captions not grouped by image
    s = rng.standard_normal((n_images, ci.size))
    if ties:
        s = np.round(s, 0)                       # few distinct values: ties everywhere
    return s.astype(dtype), ci.astype(np.int64)


CASES = [
    dict(n_images=30, per_image=5, ties=False, dtype=np.float64),
    dict(n_images=30, per_image=5, ties=True, dtype=np.float64),
    dict(n_images=25, per_image=3, ties=True, dtype=np.float32),
    dict(n_images=17, per_image=1, ties=False, dtype=np.float32),
]

# ---------------------------------------------------------------- ranks


@pytest.mark.parametrize("case", CASES)
def test_ranks_match_naive_loop(case):
    rng = np.random.default_rng(0)
    s, ci = random_case(rng, **case)
    assert i2t_ranks(s, ci).tolist() == naive_i2t(s, ci)
    assert t2i_ranks(s, ci).tolist() == naive_t2i(s, ci)
    assert i2t_ranks(s, ci).dtype == np.int64 and t2i_ranks(s, ci).dtype == np.int64


def test_ranks_with_tiny_chunks_match(monkeypatch):
    # Force many chunks (one or two queries each) so the chunk boundaries are exercised.
    rng = np.random.default_rng(1)
    s, ci = random_case(rng, 20, 4, ties=True)
    expect_i2t, expect_t2i = naive_i2t(s, ci), naive_t2i(s, ci)
    monkeypatch.setattr(metrics_mod, "_CHUNK_ELEMENTS", 150)
    assert i2t_ranks(s, ci).tolist() == expect_i2t
    assert t2i_ranks(s, ci).tolist() == expect_t2i


@pytest.mark.parametrize("case", CASES)
def test_metrics_match_naive(case):
    rng = np.random.default_rng(2)
    s, ci = random_case(rng, **case)
    res = evaluate(s, ci)
    for direction, naive in (("i2t", naive_i2t(s, ci)), ("t2i", naive_t2i(s, ci))):
        expect = naive_metrics(naive)
        assert set(res[direction]) == {"R@1", "R@5", "R@10", "MedR", "MeanR"}
        for key, value in expect.items():
            assert res[direction][key] == pytest.approx(value, abs=1e-9)
    expect_rsum = sum(res[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    assert res["rsum"] == pytest.approx(expect_rsum, abs=1e-9)
    assert res["ranks"]["i2t"].shape == (s.shape[0],)
    assert res["ranks"]["t2i"].shape == (s.shape[1],)


def test_hand_case_no_ties():
    # 2 images, 2 captions each: captions 0,1 -> image 0; captions 2,3 -> image 1.
    s = np.array([[0.9, 0.1, 0.5, 0.3],
                  [0.2, 0.8, 0.7, 0.4]])
    ci = np.array([0, 0, 1, 1])
    # i2t image 0: order c0 .9, c2 .5, c3 .3, c1 .1 -> gold c0 at rank 1
    # i2t image 1: order c1 .8, c2 .7, c3 .4, c0 .2 -> gold c2 at rank 2
    assert i2t_ranks(s, ci).tolist() == [1, 2]
    # t2i c0 [.9,.2] -> 1; c1 [.1,.8] -> image 0 second; c2 [.5,.7] -> 1; c3 [.3,.4] -> 1
    assert t2i_ranks(s, ci).tolist() == [1, 2, 1, 1]
    res = evaluate(s, ci, ks=(1, 2))
    assert res["i2t"] == {"R@1": 50.0, "R@2": 100.0, "MedR": 1.5, "MeanR": 1.5}
    assert res["t2i"] == {"R@1": 75.0, "R@2": 100.0, "MedR": 1.0, "MeanR": 1.25}
    assert res["rsum"] == 50.0 + 100.0 + 75.0 + 100.0


def test_hand_case_ties():
    # 3 images, 2 captions each: c0,c1 -> 0; c2,c3 -> 1; c4,c5 -> 2.
    s = np.array([[0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
                  [0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
                  [0.7, 0.2, 0.7, 0.7, 0.7, 0.1]])
    ci = np.array([0, 0, 1, 1, 2, 2])
    # i2t image 0: all tie, gold c0 comes first -> 1
    # i2t image 1: all tie, gold c2 is preceded by c0, c1 -> 3
    # i2t image 2: best gold c4 (0.7) preceded by the tied c0, c2, c3 -> 4
    assert i2t_ranks(s, ci).tolist() == [1, 3, 4]
    # t2i c0 col [.5,.5,.7]: image 2 higher -> 2;  c1 [.5,.5,.2]: first -> 1
    #     c2 [.5,.5,.7]: image 2 higher, image 0 tied and earlier -> 3;  c3 same -> 3
    #     c4 [.5,.5,.7]: -> 1;  c5 [.5,.5,.1]: two higher -> 3
    assert t2i_ranks(s, ci).tolist() == [2, 1, 3, 3, 1, 3]


def test_float32_ties_are_compared_in_float32():
    # 0.1 + 0.2 rounds differently in float32 and float64; the ranks follow the given dtype.
    s = np.array([[np.float32(0.3), np.float32(0.1) + np.float32(0.2)]], dtype=np.float32)
    ci = np.array([0, 0])
    assert t2i_ranks(s, ci).tolist() == [1, 1]
    assert i2t_ranks(s, ci).tolist() == [1]


def test_recall_and_rank_metrics_simple():
    ranks = np.array([1, 2, 3, 10, 11])
    assert recall_at_k(ranks, 1) == 20.0
    assert recall_at_k(ranks, 10) == 80.0
    m = rank_metrics(ranks)
    assert m == {"R@1": 20.0, "R@5": 60.0, "R@10": 80.0, "MedR": 3.0, "MeanR": 5.4}
    with pytest.raises(CrossViewError):
        recall_at_k(np.array([], dtype=np.int64), 1)


def test_bad_inputs_raise_clear_errors():
    s = np.zeros((2, 3))
    with pytest.raises(CrossViewError, match="one entry per caption"):
        evaluate(s, np.array([0, 1]))
    with pytest.raises(CrossViewError, match="image 5"):
        evaluate(s, np.array([0, 1, 5]))
    with pytest.raises(CrossViewError, match="NaN"):
        evaluate(np.array([[np.nan, 0.0, 0.0], [0.0, 0.0, 0.0]]), np.array([0, 1, 1]))
    with pytest.raises(CrossViewError, match="no caption"):
        i2t_ranks(s, np.array([0, 0, 0]))


def test_top_k_matches_naive_order():
    rng = np.random.default_rng(3)
    for ties in (False, True):
        s = rng.standard_normal((13, 40))
        if ties:
            s = np.round(s)
        for k in (1, 5, 40, 100):
            got = top_k(s, k)
            assert got.shape == (13, min(k, 40))
            for q in range(13):
                assert got[q].tolist() == naive_order(s[q])[:k]

# ---------------------------------------------------------------- COCO protocols


def test_coco_1k_matches_naive_fold_loop():
    rng = np.random.default_rng(4)
    n_folds, fold_size = 5, 6
    s, ci = random_case(rng, n_folds * fold_size, 5, ties=True)
    res = coco_1k(s, ci, n_folds=n_folds, fold_size=fold_size)
    fold_metrics = []
    for f in range(n_folds):
        imgs = list(range(f * fold_size, (f + 1) * fold_size))
        caps = [c for c in range(ci.size) if ci[c] in imgs]
        sub = s[np.ix_(imgs, caps)]
        sub_ci = np.array([ci[c] - f * fold_size for c in caps])
        fold_metrics.append((naive_metrics(naive_i2t(sub, sub_ci)),
                             naive_metrics(naive_t2i(sub, sub_ci))))
    for d, direction in enumerate(("i2t", "t2i")):
        for key in ("R@1", "R@5", "R@10", "MedR", "MeanR"):
            expect = sum(fm[d][key] for fm in fold_metrics) / n_folds
            assert res[direction][key] == pytest.approx(expect, abs=1e-9)
    expect_rsum = sum(sum(fm[d][f"R@{k}"] for fm in fold_metrics) / n_folds
                      for d in (0, 1) for k in (1, 5, 10))
    assert res["rsum"] == pytest.approx(expect_rsum, abs=1e-9)
    # not the VSE++ print (6 x averaged i2t recall), which differs here
    vsepp = 6 * sum(res["i2t"][f"R@{k}"] for k in (1, 5, 10)) / 3
    assert res["rsum"] != pytest.approx(vsepp)
    assert len(res["folds"]) == n_folds

    # the scores-function form gives the same result and sees only one fold at a time
    seen = []

    def fn(image_ids, caption_ids):
        seen.append((image_ids.size, caption_ids.size))
        return s[np.ix_(image_ids, caption_ids)]

    res_fn = coco_1k(fn, ci, n_folds=n_folds, fold_size=fold_size)
    assert res_fn["i2t"] == res["i2t"] and res_fn["t2i"] == res["t2i"]
    assert seen == [(fold_size, fold_size * 5)] * n_folds


def test_coco_1k_rejects_wrong_size_and_5k_is_evaluate():
    rng = np.random.default_rng(5)
    s, ci = random_case(rng, 12, 2)
    with pytest.raises(CrossViewError, match="COCO 1K"):
        coco_1k(s, ci)                      # 12 images, not 5 x 1000
    a, b = coco_5k(s, ci), evaluate(s, ci)
    assert a["i2t"] == b["i2t"] and a["t2i"] == b["t2i"] and a["rsum"] == b["rsum"]

# ---------------------------------------------------------------- identity hits


def test_identity_hits_match_naive():
    rng = np.random.default_rng(6)
    n_images = 24
    image_labels = rng.integers(0, 6, n_images)
    ci = np.repeat(np.arange(n_images), 2)
    caption_labels = image_labels[ci].copy()
    caption_labels[0] = 99                      # an identity with no image: always a miss
    s = np.round(rng.standard_normal((n_images, ci.size)), 1)
    ks = (1, 3, 10)
    res = identity_hits(s, image_labels, caption_labels, ks)
    for k in ks:
        t2i_hits = [any(image_labels[i] == caption_labels[c] for i in naive_order(s[:, c])[:k])
                    for c in range(ci.size)]
        i2t_hits = [any(caption_labels[c] == image_labels[i] for c in naive_order(s[i])[:k])
                    for i in range(n_images)]
        assert res["t2i"][f"R@{k}"] == pytest.approx(100.0 * np.mean(t2i_hits), abs=1e-9)
        assert res["i2t"][f"R@{k}"] == pytest.approx(100.0 * np.mean(i2t_hits), abs=1e-9)
    assert res["ranks"]["t2i"][0] == 0


def test_identity_hits_hand_case_and_string_labels():
    # images: A, B, A ; captions: A, B ; scores (images x captions)
    s = np.array([[0.1, 0.9],
                  [0.8, 0.2],
                  [0.3, 0.4]])
    res = identity_hits(s, ["A", "B", "A"], ["A", "B"], ks=(1, 2))
    # caption A: images by score B(.8), A(.3), A(.1) -> miss at 1, hit at 2
    # caption B: A(.9), A(.4), B(.2) -> miss at 1 and 2
    assert res["t2i"] == {"R@1": 0.0, "R@2": 0.0 + 50.0}
    # image 0 (A): captions B(.9), A(.1) -> hit at 2;  image 1 (B): A(.8), B(.2) -> hit at 2
    # image 2 (A): B(.4), A(.3) -> hit at 2
    assert res["i2t"] == {"R@1": 0.0, "R@2": 100.0}

# ---------------------------------------------------------------- P@K and mAP


def naive_p_at_k(s, rel, k):
    return 100.0 * np.mean([sum(rel[q][j] for j in naive_order(s[q])[:k]) / k
                            for q in range(s.shape[0])])


def naive_map(s, rel):
    aps = []
    for q in range(s.shape[0]):
        order = naive_order(s[q])
        hits, precs = 0, []
        for pos, j in enumerate(order, start=1):
            if rel[q][j]:
                hits += 1
                precs.append(hits / pos)
        if precs:
            aps.append(sum(precs) / len(precs))
    return 100.0 * sum(aps) / len(aps), len(aps)


@pytest.mark.parametrize("ties", [False, True])
def test_precision_and_map_match_naive(ties):
    rng = np.random.default_rng(7 + ties)
    s = rng.standard_normal((23, 37))
    if ties:
        s = np.round(s)
    rel = rng.random((23, 37)) < 0.2
    rel[3] = False                              # a query with nothing relevant
    p = precision_at_k(s, rel, ks=(1, 5, 10, 37))
    for k in (1, 5, 10, 37):
        assert p[f"P@{k}"] == pytest.approx(naive_p_at_k(s, rel, k), abs=1e-9)
    m = mean_average_precision(s, rel)
    expect, n_used = naive_map(s, rel)
    assert m["mAP"] == pytest.approx(expect, abs=1e-9)
    assert m["n_queries"] == n_used and m["n_excluded"] == 23 - n_used


def test_precision_and_map_hand_case():
    s = np.array([[0.9, 0.8, 0.7, 0.6],
                  [0.5, 0.5, 0.5, 0.5],
                  [0.1, 0.2, 0.3, 0.4]])
    rel = np.array([[1, 0, 1, 0],
                    [0, 0, 1, 0],
                    [0, 0, 0, 0]], dtype=bool)
    # q0: relevant at ranks 1 and 3 -> AP = (1/1 + 2/3) / 2 = 5/6
    # q1: all tied, order 0,1,2,3 -> relevant at rank 3 -> AP = 1/3
    # q2: nothing relevant -> excluded from mAP, counts as 0 in P@K
    m = mean_average_precision(s, rel)
    assert m["mAP"] == pytest.approx(100.0 * (5 / 6 + 1 / 3) / 2)
    assert m["n_excluded"] == 1
    from crossview.eval.protocols import average_precisions
    ap = average_precisions(s, rel)                 # each query's, the one with nothing relevant NaN
    assert ap[:2] == pytest.approx([100 * 5 / 6, 100 / 3]) and np.isnan(ap[2])
    p = precision_at_k(s, rel, ks=(1, 3))
    assert p["P@1"] == pytest.approx(100.0 * (1 + 0 + 0) / 3)
    assert p["P@3"] == pytest.approx(100.0 * (2 / 3 + 1 / 3 + 0) / 3)


def test_relevance_from_label_sets():
    rel = relevance_from_label_sets([{"dog", "grass"}, {"cat"}, set()],
                                    [["grass"], ["cat", "sofa"], ["car"]])
    assert rel.tolist() == [[True, False, False], [False, True, False], [False, False, False]]
