"""Hubness-aware scoring (crossview.eval.scoring) against naive loops, the bank-from-train rule and the choice of
the parameter on a hold-out of train only."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from crossview.core.errors import CrossViewError
from crossview.eval import evaluate
from crossview.eval.embeddings import Embeddings
from crossview.eval.hubness import hubness
from crossview.eval.scoring import GRIDS, Scorer, check_scoring, evaluate_scoring, select_scoring


def _rand(rng, n, d=6):
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _dot(a, b):
    return sum(float(x) * float(y) for x, y in zip(a, b))


def _mean_top(values, k):
    v = sorted(values, reverse=True)[:k]
    return sum(v) / len(v)


def naive(scoring, param, Q, G, B, Bg):
    """The formulas of the module docstring, one pair at a time."""
    out = np.zeros((len(Q), len(G)))
    c = [math.log(sum(math.exp(param * _dot(b, g)) for b in B)) for g in G] if scoring != "csls" else None
    hubs = set()
    for b in B:
        row = [_dot(b, g) for g in G]
        hubs.add(row.index(max(row)))
    for i, q in enumerate(Q):
        raw = [_dot(q, g) for g in G]
        top1 = raw.index(max(raw))
        for j, g in enumerate(G):
            s = raw[j]
            if scoring == "csls":
                r_q = _mean_top([_dot(q, b) for b in Bg], param)
                r_g = _mean_top([_dot(b, g) for b in B], param)
                out[i, j] = 2 * s - r_q - r_g
            elif scoring == "isoftmax":
                out[i, j] = math.log(math.exp(param * s) / sum(math.exp(param * _dot(b, g)) for b in B))
            else:   # dsoftmax: the inverted softmax only for a query whose top-1 is a hub of the bank
                out[i, j] = param * s - c[j] if top1 in hubs else s
    return out


@pytest.mark.parametrize("scoring,param", [("csls", 1), ("csls", 3), ("csls", 50), ("isoftmax", 1.0),
                                           ("isoftmax", 20.0), ("dsoftmax", 5.0), ("dsoftmax", 30.0)])
@pytest.mark.parametrize("block", [1, 3, 7, 1024])
def test_each_scoring_matches_a_naive_loop_across_block_boundaries(scoring, param, block) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{scoring}{param}".encode()))
    Q, G, B, Bg = _rand(rng, 11), _rand(rng, 7), _rand(rng, 9), _rand(rng, 8)
    scorer = Scorer(scoring, param, bank_queries=B, bank_gallery=Bg, block_size=block)
    got = scorer.scores(Q, G)
    np.testing.assert_allclose(got, naive(scoring, param, Q, G, B, Bg), rtol=1e-10, atol=1e-10)
    # the blocks are the rows they say, never wider than block_size
    for a, b, s in scorer.blocks(Q, G):
        assert s.shape == (b - a, 7) and b - a <= block


def test_dsoftmax_leaves_a_query_that_meets_no_hub_alone() -> None:
    G = np.eye(3)
    B = np.array([[1.0, 0, 0], [0.9, 0.1, 0]])      # every bank query's top-1 is gallery item 0: the only hub
    Q = np.array([[0, 1.0, 0], [1.0, 0.2, 0]])      # query 0's top-1 is item 1 (not a hub), query 1's is item 0
    s = Scorer("dsoftmax", 10.0, bank_queries=B, bank_gallery=B).scores(Q, G)
    np.testing.assert_allclose(s[0], Q[0] @ G.T)
    assert not np.allclose(s[1], Q[1] @ G.T)


def test_plain_scoring_evaluates_as_the_standard_protocol_does() -> None:
    rng = np.random.default_rng(3)
    img = rng.standard_normal((30, 5))
    ci = np.repeat(np.arange(30), 3)
    txt = img[ci] + rng.standard_normal((90, 5))
    emb = Embeddings(image=img, text=txt, caption_image=ci)
    bank = Embeddings(image=img[:4], text=txt[:12], caption_image=ci[:12])
    res = evaluate_scoring(emb, bank, "plain", block_size=7)
    ref = evaluate(img @ txt.T, ci)
    assert res["i2t"] == ref["i2t"] and res["t2i"] == ref["t2i"] and res["rsum"] == ref["rsum"]
    assert res["hubness"]["i2t"] == hubness(img @ txt.T).as_dict()
    assert res["hubness"]["t2i"] == hubness((img @ txt.T).T).as_dict()


@pytest.mark.parametrize("scoring", ["csls", "isoftmax", "dsoftmax"])
def test_scored_evaluation_ranks_the_naive_matrix_both_ways(scoring) -> None:
    rng = np.random.default_rng(4)
    img, bimg = _rand(rng, 12), _rand(rng, 10)
    ci = np.repeat(np.arange(12), 2)
    txt = _rand(rng, 24) + img[ci]
    btxt = _rand(rng, 20)
    param = 3 if scoring == "csls" else 10.0
    res = evaluate_scoring(Embeddings(image=img, text=txt, caption_image=ci),
                           Embeddings(image=bimg, text=btxt, caption_image=np.repeat(np.arange(10), 2)),
                           scoring, param, block_size=5)
    s_i2t = naive(scoring, param, img, txt, bimg, btxt)              # images query the captions
    s_t2i = naive(scoring, param, txt, img, btxt, bimg)              # captions query the images
    assert res["i2t"] == evaluate(s_i2t, ci)["i2t"]
    assert res["t2i"] == evaluate(s_t2i.T, ci)["t2i"]
    assert res["hubness"]["i2t"] == hubness(s_i2t).as_dict()
    assert res["scoring"] == scoring and res["param"] == param


def test_the_evaluation_split_never_normalises_itself() -> None:
    """A pair's score depends on the bank and on the pair only: other evaluation items (present or not) never
    enter the normalisation, and changing the bank changes it."""
    rng = np.random.default_rng(5)
    Q, G, B = _rand(rng, 6), _rand(rng, 9), _rand(rng, 15)
    for scoring, p in (("csls", 4), ("isoftmax", 10.0)):
        full = Scorer(scoring, p, bank_queries=B, bank_gallery=B).scores(Q, G)
        part = Scorer(scoring, p, bank_queries=B, bank_gallery=B).scores(Q[:2], G[3:5])
        np.testing.assert_allclose(part, full[:2, 3:5], atol=1e-12)
        other = Scorer(scoring, p, bank_queries=B[::-1][:7], bank_gallery=B[:7]).scores(Q, G)
        assert not np.allclose(other, full)


def test_selection_uses_the_training_bank_only() -> None:
    """select_scoring sees the training bank and nothing else: the evaluation embeddings cannot change its
    choice, and a hold-out of train is recorded as where it was made."""
    rng = np.random.default_rng(6)
    bimg = _rand(rng, 40)
    bci = np.repeat(np.arange(40), 2)
    bank = Embeddings(image=bimg, text=bimg[bci] + 0.5 * _rand(rng, 80), caption_image=bci)
    rec = select_scoring(bank, "isoftmax", seed=1)
    assert rec["selected_on"] == "train (hold-out)" and rec["holdout_images"] == 8 and rec["bank_images"] == 32
    assert [c["param"] for c in rec["candidates"]] == list(GRIDS["isoftmax"])
    best = max(rec["candidates"], key=lambda c: c["rsum"])
    assert rec["param"] == best["param"]
    # the same call again (any evaluation split around it) chooses the same
    assert select_scoring(bank, "isoftmax", seed=1) == rec
    # the candidates' rsum is the hold-out's, scored against the rest of train as the bank
    from crossview.eval.scoring import subset_embeddings
    hold = np.sort(np.random.default_rng(1).permutation(40)[:8])
    rest = np.setdiff1d(np.arange(40), hold)
    ref = evaluate_scoring(subset_embeddings(bank, hold), subset_embeddings(bank, rest), "isoftmax",
                           rec["candidates"][2]["param"])
    assert rec["candidates"][2]["rsum"] == ref["rsum"]
    assert select_scoring(bank, "plain")["param"] is None


def test_bad_names_and_parameters_get_one_clear_line() -> None:
    with pytest.raises(CrossViewError, match=r"unknown scoring 'cosine'; choose one of plain, csls, isoftmax, "
                                             r"dsoftmax"):
        check_scoring("cosine")
    with pytest.raises(CrossViewError, match="k must be a whole number"):
        Scorer("csls", 2.5, bank_queries=np.ones((2, 2)), bank_gallery=np.ones((2, 2)))
    with pytest.raises(CrossViewError, match="beta must be a positive number"):
        Scorer("isoftmax", -1, bank_queries=np.ones((2, 2)), bank_gallery=np.ones((2, 2)))
    with pytest.raises(CrossViewError, match="bank .* is empty"):
        Scorer("csls", 3, bank_queries=np.ones((0, 2)), bank_gallery=np.ones((2, 2)))
    tiny = Embeddings(image=np.eye(3), text=np.eye(3), caption_image=np.arange(3))
    with pytest.raises(CrossViewError, match="needs at least 10 training images"):
        select_scoring(tiny, "csls")


def _wide_set(seed, n_img, d=8, caps=5):
    rng = np.random.default_rng(seed)
    img = _rand(rng, n_img, d)
    ci = np.repeat(np.arange(n_img), caps)
    return Embeddings(image=img, text=_rand(rng, n_img * caps, d) + img[ci], caption_image=ci)


@pytest.mark.parametrize("scoring,param", [("csls", 3), ("isoftmax", 10.0), ("dsoftmax", 10.0)])
def test_blocks_bounded_by_elements_score_as_one_block(monkeypatch, scoring, param) -> None:
    """A block has at most BLOCK_ELEMENTS scores (rows of the gallery's or the bank's width, the wider), and the
    narrow blocks give the very scores, ranks and hubness of one block of every query."""
    import crossview.eval.scoring as S

    emb, bank = _wide_set(5, 40), _wide_set(6, 30)               # 200 captions, 150 in the bank
    monkeypatch.setattr(S, "BLOCK_ELEMENTS", 1 << 40)
    whole = evaluate_scoring(emb, bank, scoring, param)
    one = Scorer(scoring, param, bank.image, bank.text).scores(emb.image, emb.text)
    monkeypatch.setattr(S, "BLOCK_ELEMENTS", 450)                 # 2 rows of 200 scores
    for queries, gallery, bq, bg in ((emb.image, emb.text, bank.image, bank.text),
                                     (emb.text, emb.image, bank.text, bank.image)):
        scorer = Scorer(scoring, param, bq, bg)
        rows = [(a, b) for a, b, _ in scorer.blocks(queries, gallery)]
        assert max(b - a for a, b in rows) == max(1, 450 // max(len(gallery), len(bg) if scoring == "csls" else 0))
        assert [r for ab in rows for r in range(*ab)] == list(range(len(queries)))
    np.testing.assert_allclose(Scorer(scoring, param, bank.image, bank.text).scores(emb.image, emb.text), one,
                               rtol=1e-12, atol=1e-12)
    part = evaluate_scoring(emb, bank, scoring, param)
    for d in ("i2t", "t2i"):
        np.testing.assert_array_equal(part["ranks"][d], whole["ranks"][d])
        assert part[d] == whole[d] and part["hubness"][d] == whole["hubness"][d]
    assert part["rsum"] == whole["rsum"]


@pytest.mark.parametrize("scoring", ["csls", "isoftmax", "dsoftmax"])
def test_scored_evaluation_never_holds_a_block_of_every_query(monkeypatch, scoring) -> None:
    """Issue 34: at COCO size 1,024 queries x 25,000 captions were 205 MB of float64 a block, three at once under
    csls. With the blocks bounded by BLOCK_ELEMENTS, the evaluation's traced peak stays far under one score matrix
    of all the queries (what one block of block_size rows held here)."""
    import tracemalloc

    import crossview.eval.scoring as S

    emb, bank = _wide_set(8, 200, d=4), _wide_set(9, 200, d=4)   # 1,000 captions each
    matrix = 200 * 1000 * 8                                       # i2t: every image against every caption
    monkeypatch.setattr(S, "BLOCK_ELEMENTS", 4000)                # 4 rows of 1,000 scores: 32 KB
    evaluate_scoring(emb, bank, scoring, 3 if scoring == "csls" else 10.0)    # warm (imports, caches)
    tracemalloc.start()
    try:
        evaluate_scoring(emb, bank, scoring, 3 if scoring == "csls" else 10.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < matrix / 2, f"traced peak {peak} B against a {matrix} B score matrix"


@pytest.mark.parametrize("scoring,param", [("plain", None), ("csls", 3), ("isoftmax", 10.0), ("dsoftmax", 10.0)])
def test_a_large_float32_bank_is_never_copied_to_float64_and_scores_the_same(monkeypatch, scoring, param) -> None:
    """Issue 34: a 4,096-d WSABIE bank and test split at COCO size were copied whole to float64 (1.8 GB). Over
    F64_COPY_BYTES a float32 bank or gallery is converted a chunk at a time inside each product: the very scores
    and ranks of the copied path, and a traced peak under one float64 copy of the bank."""
    import tracemalloc

    import crossview.eval.scoring as S

    f32 = lambda e: Embeddings(image=e.image.astype(np.float32), text=e.text.astype(np.float32),  # noqa: E731
                               caption_image=e.caption_image)
    emb, bank = f32(_wide_set(11, 60, d=64)), f32(_wide_set(12, 400, d=64))    # bank: 2,000 x 64 captions
    monkeypatch.setattr(S, "BLOCK_ELEMENTS", 30_000)              # blocks of 15 rows of 2,000 (the same both ways)
    copied = evaluate_scoring(emb, bank, scoring, param)
    one = Scorer(scoring, param, bank.image, bank.text).scores(emb.image, emb.text)
    monkeypatch.setattr(S, "F64_COPY_BYTES", 1000)                # every array here is larger: chunks of 468 rows
    scorer = Scorer(scoring, param, bank.image, bank.text)
    assert scorer.bank_queries.dtype == np.float32 and scorer.bank_gallery.dtype == np.float32
    np.testing.assert_array_equal(scorer.scores(emb.image, emb.text), one)

    def traced(limit: int):
        monkeypatch.setattr(S, "F64_COPY_BYTES", limit)
        evaluate_scoring(emb, bank, scoring, param)              # warm
        tracemalloc.start()
        try:
            return evaluate_scoring(emb, bank, scoring, param), tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    chunked, peak = traced(1000)
    _, copied_peak = traced(1 << 40)
    for d in ("i2t", "t2i"):
        np.testing.assert_array_equal(chunked["ranks"][d], copied["ranks"][d])
        assert chunked[d] == copied[d]
    bank_f64 = bank.text.size * 8                                  # 1 MB
    assert peak < bank_f64 < copied_peak, (peak, bank_f64, copied_peak)


def test_csls_with_one_model_computes_each_bank_statistic_once_and_reports_progress(monkeypatch) -> None:
    """With one model both ways, the test captions' r against the bank images is i2t's gallery statistic and t2i's
    query statistic (and the images' the other way round): two products with the bank, not four (a COCO-size csls
    evaluation of 4,096-d embeddings spent about 40 s of 99 on the repeats). The same ranks as the two-model path,
    which computes them per direction; progress rises to the end."""
    import crossview.eval.scoring as S

    emb, bank = _wide_set(21, 40, d=8), _wide_set(22, 50, d=8)
    calls = []
    real = S._dot64
    monkeypatch.setattr(S, "_dot64", lambda a, b: calls.append(b.shape[0]) or real(a, b))
    monkeypatch.setattr(S, "BLOCK_ELEMENTS", 2000)
    gen = S.iter_evaluate_scoring(emb, bank, "csls", 3)
    seen = []
    while True:
        try:
            seen.append(next(gen))
        except StopIteration as end:
            shared = end.value
            break
    bank_rows = {bank.image.shape[0], bank.text.shape[0]}
    bank_products = sum(1 for n in calls if n in bank_rows)
    calls.clear()
    two = Embeddings(image=emb.image, text=emb.text, caption_image=emb.caption_image,
                     image_t2i=emb.image.copy(), text_t2i=emb.text.copy())
    separate = evaluate_scoring(two, bank, "csls", 3)
    assert sum(1 for n in calls if n in bank_rows) > bank_products, "the two-model path computes them per direction"
    for d in ("i2t", "t2i"):
        np.testing.assert_array_equal(shared["ranks"][d], separate["ranks"][d])
    assert shared["rsum"] == separate["rsum"]
    done = [a for a, _ in seen]
    assert done == sorted(done) and done[-1] == S.PROGRESS_UNITS and len(done) > 3
    assert all(total == S.PROGRESS_UNITS for _, total in seen)
