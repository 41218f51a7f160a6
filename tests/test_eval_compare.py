"""Comparing two runs' per-query ranks: deltas, counts, orders, the sign and Wilcoxon tests."""

from __future__ import annotations

import numpy as np
import pytest

from crossview.core.errors import CrossViewError
from crossview.eval.compare import compare_ranks, sign_test, wilcoxon_test


def test_hand_worked_comparison():
    a = np.array([1, 3, 10, 2, 7])
    b = np.array([2, 1, 10, 1, 20])
    c = compare_ranks(a, b, ks=(1, 5))
    assert c.delta.tolist() == [1, -2, 0, -1, 13]
    s = c.summary
    assert (s["b_better"], s["b_worse"], s["same"]) == (2, 2, 1)
    assert s["R@1_a"] == 20.0 and s["R@1_b"] == 40.0 and s["R@5_a"] == 60.0 and s["R@5_b"] == 60.0
    assert s["median_delta"] == 0.0
    assert c.order("delta").tolist() == [4, 0, 2, 3, 1]       # B's biggest losses first
    assert c.order("-delta").tolist() == [1, 3, 2, 0, 4]
    assert c.order("a")[0] == 2 and c.order("b")[0] == 4


def test_sign_test_against_the_binomial_by_hand():
    from math import comb
    # 9 better, 1 worse: p = 2 * P(X <= 1), X ~ Bin(10, 1/2)
    assert sign_test(9, 1) == pytest.approx(2 * (comb(10, 0) + comb(10, 1)) / 2 ** 10)
    assert sign_test(0, 0) == 1.0 and sign_test(5, 5) == pytest.approx(1.0)


def test_wilcoxon_by_hand():
    # five rank changes, all one way, all different sizes: the exact two-sided p is 2 / 2^5
    assert wilcoxon_test([1, 2, 3, 4, 5]) == pytest.approx(2 / 32)
    assert wilcoxon_test([0, 1, -2, 3, 0, 4, 5]) == pytest.approx(wilcoxon_test([1, -2, 3, 4, 5]))  # zeros dropped
    assert wilcoxon_test([0, 0]) == 1.0 and wilcoxon_test([]) == 1.0
    c = compare_ranks([3, 4, 5, 6, 7], [2, 2, 2, 2, 2])            # B better on every query, by 1 to 5
    assert c.summary["wilcoxon_p"] == pytest.approx(2 / 32)


def test_mismatched_runs_are_refused():
    with pytest.raises(CrossViewError, match="different query sets"):
        compare_ranks([1, 2], [1, 2, 3])
    with pytest.raises(CrossViewError, match="1-based"):
        compare_ranks([0, 2], [1, 2])
    with pytest.raises(CrossViewError, match="unknown order"):
        compare_ranks([1], [1]).order("x")
