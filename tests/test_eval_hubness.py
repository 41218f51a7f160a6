"""crossview.eval.hubness: N_k, its skewness, the top-5 share and anti-hubs against naive loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from crossview.core.errors import CrossViewError
from crossview.eval import hubness as H
from crossview.eval.metrics import top_k


def _naive(scores: np.ndarray, k: int) -> dict:
    """The figures by plain Python: sort each row by (-score, index), count, and take the moments."""
    n_q, n_g = scores.shape
    occ = [0] * n_g
    occ5 = [0] * n_g
    for q in range(n_q):
        order = sorted(range(n_g), key=lambda j: (-float(scores[q, j]), j))
        for j in order[:k]:
            occ[j] += 1
        for j in order[:min(5, n_g)]:
            occ5[j] += 1
    mean = sum(occ) / n_g
    m2 = sum((o - mean) ** 2 for o in occ) / n_g
    m3 = sum((o - mean) ** 3 for o in occ) / n_g
    best = max(range(n_g), key=lambda j: (occ5[j], -j))
    return {"occ": occ, "skew": 0.0 if m2 == 0 else m3 / m2 ** 1.5, "item": best, "share": occ5[best] / n_q,
            "anti": sum(o == 0 for o in occ) / n_g}


def _check(h: H.Hubness, ref: dict) -> None:
    assert h.occurrences.tolist() == ref["occ"]
    assert h.skewness == pytest.approx(ref["skew"], abs=1e-9)
    assert h.top5_item == ref["item"] and h.top5_share == pytest.approx(ref["share"])
    assert h.antihub_share == pytest.approx(ref["anti"])


def test_a_hand_made_hub_is_found() -> None:
    rng = np.random.default_rng(0)
    s = rng.standard_normal((40, 30))
    s[:31, 7] += 10.0                    # gallery item 7 tops 31 of the 40 queries
    h = H.hubness(s, k=10)
    _check(h, _naive(s, 10))
    assert h.top5_item == 7 and h.top5_count >= 31 and h.k == 10
    assert h.occurrences.sum() == 40 * 10
    assert h.skewness > 1.0


def test_hand_worked_values() -> None:
    # 4 queries, 3 items, k = 1: item 0 tops three queries, item 2 one, item 1 none
    s = np.array([[3, 1, 2], [3, 2, 1], [2, 1, 3], [5, 0, 0]], dtype=np.float32)
    h = H.hubness(s, k=1)
    assert h.occurrences.tolist() == [3, 0, 1]
    # N = (3, 0, 1): mean 4/3, centred (5/3, -4/3, -1/3): m2 = 42/27, m3 = (125 - 64 - 1)/81 = 60/81
    assert h.skewness == pytest.approx((60 / 81) / (42 / 27) ** 1.5)
    assert h.antihub_share == pytest.approx(1 / 3)
    # top-5 of a 3-item gallery holds everything: the most frequent item (smallest index on ties) is in all
    assert (h.top5_item, h.top5_share) == (0, 1.0)


def test_uniform_random_scores_have_low_skew() -> None:
    rng = np.random.default_rng(1)
    s = rng.random((2000, 200))
    h = H.hubness(s)
    _check(h, _naive(s, 10))
    # N_10 ~ Binomial(2000, 10/200): skewness (1 - 2p)/sqrt(np(1-p)) = 0.09, sampling noise about 0.17
    assert abs(h.skewness) < 0.6
    assert h.antihub_share == 0.0 and h.top5_share < 0.1


def test_ties_break_towards_the_smaller_index() -> None:
    s = np.zeros((6, 12))
    s[:, 11] = 1.0                       # one clear winner, then eleven tied items
    h = H.hubness(s, k=3)
    assert h.occurrences.tolist() == [6, 6] + [0] * 9 + [6]
    _check(h, _naive(s, 3))
    np.testing.assert_array_equal(top_k(s, 3)[0], [11, 0, 1])
    # the top-5 count ties between 0, 1, 2, 3 and 11 (all in every list): the smallest index is named
    assert h.top5_item == 0 and h.top5_share == 1.0


def test_embeddings_path_matches_the_matrix_and_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    q = rng.standard_normal((57, 6)).astype(np.float32) + 2.0
    g = rng.standard_normal((23, 6)).astype(np.float32) + 2.0
    whole = H.hubness(q @ g.T)
    monkeypatch.setattr(H, "_CHUNK_ELEMENTS", 23 * 4)   # blocks of 4 queries
    blocked = H.hubness_of_embeddings(q, g)
    assert blocked.as_dict() == whole.as_dict()
    np.testing.assert_array_equal(blocked.occurrences, whole.occurrences)
    _check(blocked, _naive(q @ g.T, 10))


def test_k_is_capped_below_the_gallery_size() -> None:
    s = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5]])
    h = H.hubness(s)                     # default k = 10 -> 2 (= n_gallery - 1)
    assert h.k == 2 and h.occurrences.tolist() == [1, 1, 2]
    assert H.hubness(s, k=1).occurrences.tolist() == [1, 1, 0]


def test_tiny_and_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(CrossViewError, match="at least 2 items"):
        H.hubness(np.ones((5, 1)))
    with pytest.raises(CrossViewError, match="at least 2 items"):
        H.hubness(np.ones((5, 0)))
    with pytest.raises(CrossViewError, match="at least one query"):
        H.hubness(np.ones((0, 4)))
    with pytest.raises(CrossViewError, match="k must be"):
        H.hubness(np.ones((3, 4)), k=0)
    with pytest.raises(CrossViewError, match="NaN"):
        H.hubness(np.array([[0.0, np.nan]]))
    with pytest.raises(CrossViewError, match="same"):
        H.hubness_of_embeddings(np.ones((3, 2)), np.ones((4, 3)))


def test_skewness_of_constants_and_a_known_sample() -> None:
    assert H.skewness([4, 4, 4, 4]) == 0.0
    v = np.array([0.0, 0.0, 0.0, 0.0, 10.0])
    m = v.mean()
    assert H.skewness(v) == pytest.approx(np.mean((v - m) ** 3) / np.mean((v - m) ** 2) ** 1.5)
    assert H.skewness(v) == pytest.approx(1.5)
    assert math.isclose(H.skewness(-v), -1.5)


def test_format_hubness_line() -> None:
    h = {"k": 10, "skewness": 3.214, "top5_share": 0.31, "antihub_share": 0.12}
    assert H.format_hubness(h) == ("N_10 skewness 3.21; the most frequent item is in 31% of top-5 lists; "
                                   "12% of items in no top-10")
