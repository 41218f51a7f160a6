"""Per-query comparison of two runs evaluated on the same queries.

``compare_ranks(a, b)`` takes two ``(n_queries,)`` 1-based rank arrays of the same queries (same split,
same order) and returns the per-query change and a summary: how many queries improved, got worse or
stayed, the median change, a two-sided sign test (exact binomial over the queries whose rank
changed) and a Wilcoxon signed-rank test (which also weighs how far each rank moved; ties dropped), saying
whether the difference is more than chance.

Those tests count every query as an independent observation: right for one run's i2t queries, optimistic for
t2i (the captions of one image move together) and wrong for several seeds pooled. To judge whether a variant is
better, use :func:`crossview.eval.paired.paired_effect` (seeds averaged per query, bootstrap over images, the
effect with its interval); :func:`compare_ranks` stays for the per-query table and scatter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError

__all__ = ["RankComparison", "compare_ranks", "sign_test", "wilcoxon_test"]


def sign_test(n_better: int, n_worse: int) -> float:
    """Two-sided exact sign test p-value for ``n_better`` vs ``n_worse`` (ties excluded)."""
    n = n_better + n_worse
    if n == 0:
        return 1.0
    from scipy.stats import binomtest
    return float(binomtest(n_better, n, 0.5, alternative="two-sided").pvalue)


def wilcoxon_test(delta: Any) -> float:
    """Two-sided Wilcoxon signed-rank p-value of rank differences ``delta`` (zeros dropped; 1.0 when none is
    left)."""
    d = np.asarray(delta, dtype=np.float64).ravel()
    d = d[d != 0]
    if d.size == 0:
        return 1.0
    from scipy.stats import wilcoxon
    return float(wilcoxon(d, zero_method="wilcox").pvalue)


@dataclass
class RankComparison:
    """``rank_a``, ``rank_b`` and ``delta = rank_b - rank_a`` (negative: B ranks the truth higher)."""

    rank_a: np.ndarray
    rank_b: np.ndarray
    delta: np.ndarray
    summary: dict[str, Any]

    def order(self, by: str = "delta") -> np.ndarray:
        """Query indices sorted: ``"delta"`` (B's biggest losses first), ``"-delta"`` (B's biggest gains first),
        ``"a"`` / ``"b"`` (worst rank first in that run)."""
        key = {"delta": -self.delta, "-delta": self.delta, "a": -self.rank_a, "b": -self.rank_b}.get(by)
        if key is None:
            raise CrossViewError(f"unknown order {by!r}; use delta, -delta, a or b")
        return np.argsort(key, kind="stable")


def compare_ranks(rank_a: Any, rank_b: Any, ks: tuple[int, ...] = (1, 5, 10)) -> RankComparison:
    """Compare two runs' ranks of the same queries (see the module docstring)."""
    a = np.asarray(rank_a, dtype=np.int64)
    b = np.asarray(rank_b, dtype=np.int64)
    if a.ndim != 1 or a.shape != b.shape:
        raise CrossViewError(f"the two runs ranked different query sets ({a.shape} vs {b.shape}); compare runs "
                             "evaluated on the same dataset split")
    if a.size and (a.min() < 1 or b.min() < 1):
        raise CrossViewError("ranks are 1-based; got a rank below 1")
    delta = b - a
    better = int(np.count_nonzero(delta < 0))
    worse = int(np.count_nonzero(delta > 0))
    summary: dict[str, Any] = {
        "n_queries": int(a.size), "b_better": better, "b_worse": worse, "same": int(a.size - better - worse),
        "median_delta": float(np.median(delta)) if a.size else 0.0,
        "sign_test_p": sign_test(better, worse),
        "wilcoxon_p": wilcoxon_test(delta),
    }
    for k in ks:
        summary[f"R@{k}_a"] = float(100.0 * np.mean(a <= k)) if a.size else 0.0
        summary[f"R@{k}_b"] = float(100.0 * np.mean(b <= k)) if a.size else 0.0
    return RankComparison(rank_a=a, rank_b=b, delta=delta, summary=summary)
