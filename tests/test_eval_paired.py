"""The paired effect of two variants (crossview.eval.paired): against a naive resampling loop with the same draws,
hand-worked cases, seeds averaged first (duplicated seeds give exactly the one-seed answer), bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest, norm

from crossview.core.errors import CrossViewError
from crossview.eval.paired import _weighted_medians, paired_effect

KS = (1, 5, 10)


def _naive(ranks_a, ranks_b, caption_image, resamples, seed, level=0.95, ks=KS):
    """The same bootstrap written plainly: loops over resamples, the drawn images and their captions."""
    a = {d: np.atleast_2d(np.asarray(r, dtype=float)) for d, r in ranks_a.items()}
    b = {d: np.atleast_2d(np.asarray(r, dtype=float)) for d, r in ranks_b.items()}
    n_img, n_cap = a["i2t"].shape[1], a["t2i"].shape[1]
    rng = np.random.default_rng(seed)
    drawn_images = rng.integers(0, n_img, size=(resamples, n_img))
    if caption_image is None:
        drawn_captions = rng.integers(0, n_cap, size=(resamples, n_cap))
    captions_of = {i: [c for c in range(n_cap) if caption_image is not None and caption_image[c] == i]
                   for i in range(n_img)}

    def seed_mean(r, q, k=None):              # one query's rank (or hit at K) averaged over the seeds
        col = r[:, q]
        return float(np.mean(col <= k)) if k is not None else float(np.mean(col))

    stats = {"rsum": [], "i2t": {k: [] for k in ks}, "t2i": {k: [] for k in ks}, "med_i2t": [], "med_t2i": []}
    for r in range(resamples):
        queries = {"i2t": list(drawn_images[r])}
        if caption_image is None:
            queries["t2i"] = list(drawn_captions[r])
        else:
            queries["t2i"] = []
            for i in drawn_images[r]:          # each drawn image brings all its captions
                for c in captions_of[i]:
                    queries["t2i"].append(c)
        total = 0.0
        for d in ("i2t", "t2i"):
            for k in ks:
                hits_a = [seed_mean(a[d], q, k) for q in queries[d]]
                hits_b = [seed_mean(b[d], q, k) for q in queries[d]]
                diff = 100 * np.mean(hits_b) - 100 * np.mean(hits_a)
                stats[d][k].append(diff)
                total += diff
            stats[f"med_{d}"].append(np.median([seed_mean(b[d], q) - seed_mean(a[d], q) for q in queries[d]]))
        stats["rsum"].append(total)
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    return stats, q


def _check_against_naive(got, stats, q, ks=KS):
    tol = dict(rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got["rsum"]["ci"], np.percentile(stats["rsum"], q), **tol)
    np.testing.assert_allclose(got["rsum"]["se"], np.std(stats["rsum"], ddof=1), **tol)
    z = norm.ppf(0.975) + norm.ppf(0.8)
    np.testing.assert_allclose(got["mde"]["rsum"], z * np.std(stats["rsum"], ddof=1), **tol)
    far = min(sum(x <= 1e-9 for x in stats["rsum"]), sum(x >= -1e-9 for x in stats["rsum"]))
    assert got["rsum"]["p"] == pytest.approx(min(1.0, 2 * (far + 1) / (len(stats["rsum"]) + 1)))
    for d in ("i2t", "t2i"):
        for k in ks:
            np.testing.assert_allclose(got[d][f"R@{k}"]["ci"], np.percentile(stats[d][k], q), **tol)
        np.testing.assert_allclose(got["mde"][f"{d} R@1"], z * np.std(stats[d][1], ddof=1), **tol)
        np.testing.assert_allclose(got[d]["median_rank_change"]["ci"], np.percentile(stats[f"med_{d}"], q), **tol)


def _toy(rng, n_img=30, seeds_a=3, seeds_b=2, empty_image=True):
    per = rng.integers(1, 6, size=n_img)
    if empty_image:
        per[3] = 0                             # an image without captions: no t2i query, still an i2t one
    ci = np.repeat(np.arange(n_img), per)
    a = {"i2t": rng.integers(1, 15, size=(seeds_a, n_img)), "t2i": rng.integers(1, 15, size=(seeds_a, ci.size))}
    b = {"i2t": rng.integers(1, 12, size=(seeds_b, n_img)), "t2i": rng.integers(1, 12, size=(seeds_b, ci.size))}
    return a, b, ci


def test_matches_a_naive_resampling_loop_with_the_same_draws():
    a, b, ci = _toy(np.random.default_rng(0))
    got = paired_effect(a, b, ci, resamples=300, seed=7)
    stats, q = _naive(a, b, ci, 300, 7)
    _check_against_naive(got, stats, q)
    assert got["resampled"] == "images (each with its captions); seeds averaged per query first"
    assert (got["n_images"], got["n_captions"], got["seeds_a"], got["seeds_b"]) == (30, ci.size, 3, 2)
    assert (got["resamples"], got["level"]) == (300, 0.95)
    # point values: per query, seeds averaged, then over the queries
    for d in ("i2t", "t2i"):
        ra, rb = a[d].mean(axis=0), b[d].mean(axis=0)
        assert got[d]["R@5"]["a"] == pytest.approx(100 * np.mean((a[d] <= 5).mean(axis=0)))
        assert got[d]["R@5"]["diff"] == pytest.approx(got[d]["R@5"]["b"] - got[d]["R@5"]["a"])
        assert got[d]["median_rank_change"]["value"] == pytest.approx(np.median(rb - ra))
        assert (got[d]["won"], got[d]["lost"]) == (int(np.sum(rb < ra - 1e-9)), int(np.sum(rb > ra + 1e-9)))
    # the t2i sign test is over images: each image's captions' changes averaged into one observation
    change = b["t2i"].mean(axis=0) - a["t2i"].mean(axis=0)
    per_image = [np.mean(change[ci == i]) for i in range(30) if np.any(ci == i)]
    better, worse = sum(x < -1e-9 for x in per_image), sum(x > 1e-9 for x in per_image)
    assert (got["t2i"]["images_better"], got["t2i"]["images_worse"]) == (better, worse)
    assert got["t2i"]["p"] == pytest.approx(binomtest(better, better + worse).pvalue)


def test_without_a_caption_map_each_caption_is_its_own_cluster():
    a, b, ci = _toy(np.random.default_rng(1), empty_image=False)
    got = paired_effect(a, b, None, resamples=200, seed=3, level=0.9)
    stats, q = _naive(a, b, None, 200, 3, level=0.9)
    _check_against_naive(got, stats, q)
    assert "each caption its own cluster" in got["resampled"] and "captions (t2i" in got["p_method"]
    assert got["t2i"]["images_better"] + got["t2i"]["images_worse"] + got["t2i"]["images_same"] == ci.size


def test_hand_worked_small_case():
    ci = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    a = {"i2t": [1, 3, 2, 8], "t2i": [1, 1, 5, 5, 2, 2, 9, 9]}
    b = {"i2t": [1, 1, 4, 2], "t2i": [1, 2, 1, 1, 2, 3, 1, 1]}
    r = paired_effect(a, b, ci, resamples=100)
    # i2t changes 0, -2, +2, -6: won 2, lost 1, tied 1; R@1 25 -> 50; median (-2 + 0) / 2
    assert (r["i2t"]["won"], r["i2t"]["lost"], r["i2t"]["tied"]) == (2, 1, 1)
    assert (r["i2t"]["R@1"]["a"], r["i2t"]["R@1"]["b"], r["i2t"]["R@1"]["diff"]) == (25.0, 50.0, 25.0)
    assert r["i2t"]["median_rank_change"]["value"] == -1.0
    assert r["i2t"]["p"] == pytest.approx(binomtest(2, 3).pvalue)
    # t2i changes 0, +1, -4, -4, 0, +1, -8, -8: won 4, lost 2, tied 2; per image +1, -8, +1, -16: 2 better, 2 worse
    assert (r["t2i"]["won"], r["t2i"]["lost"], r["t2i"]["tied"]) == (4, 2, 2)
    assert (r["t2i"]["images_better"], r["t2i"]["images_worse"], r["t2i"]["p"]) == (2, 2, 1.0)
    assert (r["t2i"]["R@1"]["a"], r["t2i"]["R@1"]["b"]) == (25.0, 62.5)
    assert r["t2i"]["median_rank_change"]["value"] == -2.0
    # rsum: A 25 + 75 + 100 + 25 + 75 + 100, B 50 + 100 + 100 + 62.5 + 100 + 100
    assert (r["rsum"]["a"], r["rsum"]["b"], r["rsum"]["diff"]) == (400.0, 512.5, 112.5)


def test_identical_runs_have_zero_effect_and_a_zero_interval():
    a, _, ci = _toy(np.random.default_rng(2))
    r = paired_effect(a, {d: v.copy() for d, v in a.items()}, ci, resamples=200)
    assert r["rsum"]["diff"] == 0 and r["rsum"]["ci"] == [0.0, 0.0] and r["rsum"]["p"] == 1.0
    assert r["mde"]["rsum"] == 0.0 and "80% power" in r["mde"]["explanation"]
    for d in ("i2t", "t2i"):
        assert all(r[d][f"R@{k}"]["ci"] == [0.0, 0.0] for k in KS)
        assert r[d]["median_rank_change"] == {"value": 0.0, "ci": [0.0, 0.0]}
        assert r[d]["won"] == r[d]["lost"] == 0 and r[d]["p"] == 1.0


def test_b_better_on_every_query_has_a_positive_effect_and_an_interval_above_zero():
    rng = np.random.default_rng(3)
    ci = np.repeat(np.arange(40), 5)
    a = {"i2t": rng.integers(2, 12, size=40), "t2i": rng.integers(2, 12, size=200)}
    b = {d: np.maximum(1, r - 3) for d, r in a.items()}          # every query up by 1 to 3 ranks
    r = paired_effect(a, b, ci, resamples=500)
    assert r["rsum"]["diff"] > 0 and r["rsum"]["ci"][0] > 0 and r["rsum"]["p"] < 0.01
    for d in ("i2t", "t2i"):
        assert r[d]["R@1"]["diff"] > 0 and r[d]["R@1"]["ci"][0] > 0
        assert r[d]["median_rank_change"]["value"] < 0 and r[d]["median_rank_change"]["ci"][1] < 0
        assert r[d]["won"] == r[d]["queries"] and r[d]["lost"] == 0
        assert r[d]["images_better"] == 40 and r[d]["p"] == pytest.approx(2 / 2 ** 40)


def test_duplicated_seeds_give_exactly_the_one_seed_result():
    """Three identical copies of a seed are one seed's information: the interval must not narrow (the
    pseudo-replication of pooling seeds x queries)."""
    a, b, ci = _toy(np.random.default_rng(4), seeds_a=1, seeds_b=1)
    one = paired_effect(a, b, ci, resamples=300, seed=5)
    three = paired_effect({d: np.repeat(v, 3, axis=0) for d, v in a.items()},
                          {d: np.repeat(v, 3, axis=0) for d, v in b.items()}, ci, resamples=300, seed=5)
    assert (three["seeds_a"], three["seeds_b"]) == (3, 3)
    for key in ("i2t", "t2i", "rsum", "mde"):
        assert three[key] == one[key], key


def test_seeds_are_averaged_per_query_before_anything_else():
    # query 0 is at rank 1 in one seed of A and 3 in the other: hit@1 0.5, mean rank 2
    ci = np.array([0, 1])
    a = {"i2t": [[1, 3], [3, 1]], "t2i": [[1, 1], [1, 1]]}
    b = {"i2t": [2, 2], "t2i": [1, 1]}
    r = paired_effect(a, b, ci, resamples=50)
    assert r["i2t"]["R@1"]["a"] == 50.0 and r["i2t"]["R@1"]["b"] == 0.0
    assert (r["i2t"]["won"], r["i2t"]["lost"], r["i2t"]["tied"]) == (0, 0, 2)   # mean rank 2 against 2
    assert r["i2t"]["median_rank_change"]["value"] == 0.0


def test_weighted_medians_match_np_median_in_and_outside_the_window():
    rng = np.random.default_rng(6)
    n_cl = 400
    cluster = np.repeat(np.arange(n_cl), rng.integers(1, 4, size=n_cl))
    values = np.round(rng.normal(size=cluster.size), 1)               # ties, as rank changes have
    counts = rng.multinomial(n_cl, np.full(n_cl, 1 / n_cl), size=40)
    low = np.argsort([values[cluster == c].mean() for c in range(n_cl)])
    counts[0] = 0
    counts[0, low[:5]] = 3                                             # only the lowest clusters drawn
    counts[1] = 0
    counts[1, low[-7:]] = 1                                            # only the highest
    counts[2] = 0                                                      # nothing drawn
    got = _weighted_medians(values, cluster, counts, counts.astype(float))
    for row in range(counts.shape[0]):
        reps = np.concatenate([np.repeat(values[cluster == c], counts[row, c]) for c in range(n_cl)])
        assert got[row] == (np.median(reps) if reps.size else 0.0), row


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10 ** 6), st.integers(1, 4), st.integers(2, 12))
def test_swapping_a_and_b_mirrors_the_effect_and_seeds_copies_change_nothing(seed, copies, n_img):
    rng = np.random.default_rng(seed)
    a, b, ci = _toy(rng, n_img=n_img, seeds_a=1, seeds_b=2, empty_image=False)
    ab = paired_effect(a, b, ci, resamples=60, seed=seed)
    ba = paired_effect(b, a, ci, resamples=60, seed=seed)
    assert ba["rsum"]["diff"] == pytest.approx(-ab["rsum"]["diff"], abs=1e-9)
    assert ba["rsum"]["ci"] == pytest.approx([-ab["rsum"]["ci"][1], -ab["rsum"]["ci"][0]], abs=1e-9)
    for d in ("i2t", "t2i"):
        assert (ba[d]["won"], ba[d]["lost"], ba[d]["p"]) == (ab[d]["lost"], ab[d]["won"], ab[d]["p"])
    copied = paired_effect({d: np.repeat(v, copies, axis=0) for d, v in a.items()}, b, ci, resamples=60, seed=seed)
    assert copied["rsum"] == ab["rsum"] and copied["i2t"] == ab["i2t"] and copied["t2i"] == ab["t2i"]


@pytest.mark.parametrize("kwargs, needle", [
    (dict(b={"i2t": [1, 2, 3], "t2i": [1, 1, 1, 1]}), "A ranked 4 i2t queries and B 3"),
    (dict(a={"i2t": [1, 0, 3, 4], "t2i": [1, 1, 1, 1]}), "ranks hold 0; ranks are 1-based"),
    (dict(ci=[0, 1, 2, 4]), "caption_image holds image 4, outside 0..3"),
    (dict(ci=[0, 1, 2]), "caption_image maps 3 captions but the runs ranked 4"),
    (dict(ci=[0.0, 1.0, 2.0, 3.0]), "image indices"),
    (dict(a={"i2t": [1, 2, 3, 4]}), "need both 'i2t' and 't2i'"),
    (dict(a={"i2t": [1.5, 2, 3, 4], "t2i": [1, 1, 1, 1]}), "whole numbers"),
    (dict(a={"i2t": [[1, 2, 3, 4], [1, 2, 3]], "t2i": [1, 1, 1, 1]}), "different numbers of queries"),
    (dict(level=1.0), "level"), (dict(resamples=0), "resamples"), (dict(ks=(0,)), "K must be"),
])
def test_bad_input_gets_one_clear_line(kwargs, needle):
    a = kwargs.pop("a", {"i2t": [1, 2, 3, 4], "t2i": [1, 2, 1, 1]})
    b = kwargs.pop("b", {"i2t": [1, 2, 3, 4], "t2i": [2, 2, 1, 1]})
    ci = kwargs.pop("ci", [0, 1, 2, 3])
    with pytest.raises(CrossViewError, match="paired comparison") as e:
        paired_effect(a, b, ci, **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------ a per-query score (e.g. average precision)
def test_paired_mean_difference_matches_a_naive_resampling_loop():
    from crossview.eval.paired import paired_mean_difference

    rng = np.random.default_rng(3)
    a, b = rng.random(40) * 100, rng.random(40) * 100
    res = paired_mean_difference(a, b, resamples=300, seed=5)
    draws = np.random.default_rng(5).integers(0, 40, size=(300, 40))     # the same draws, one resample at a time
    boot = np.array([np.mean([b[i] - a[i] for i in row]) for row in draws])
    assert res["diff"] == pytest.approx(b.mean() - a.mean())
    assert (res["a"], res["b"]) == pytest.approx((a.mean(), b.mean()))
    assert res["ci"] == pytest.approx(list(np.percentile(boot, [2.5, 97.5])))
    assert res["se"] == pytest.approx(np.std(boot, ddof=1))
    assert res["mde"] == pytest.approx((norm.ppf(0.975) + norm.ppf(0.8)) * res["se"])
    assert (res["better"], res["worse"], res["queries"]) == (int((b > a).sum()), int((b < a).sum()), 40)
    same = paired_mean_difference(a, a)
    assert same["diff"] == 0 and same["ci"] == [0, 0] and same["p"] == 1.0
    seeds = paired_mean_difference(a, np.stack([b - 1, b + 1]))           # seeds averaged per query first
    assert seeds["diff"] == pytest.approx(res["diff"]) and seeds["ci"] == pytest.approx(
        paired_mean_difference(a, b)["ci"])


@pytest.mark.parametrize("a, b, needle", [
    (np.ones(3), np.ones(4), "A scored 3 queries and B 4"),
    (np.ones(3), np.array([1.0, np.nan, 2.0]), "NaN or infinite"),
    (np.ones((2, 2, 2)), np.ones(2), "one score per query"),
])
def test_paired_mean_difference_bad_input_is_one_line(a, b, needle):
    from crossview.eval.paired import paired_mean_difference

    with pytest.raises(CrossViewError, match=needle):
        paired_mean_difference(a, b)
