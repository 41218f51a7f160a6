"""bench/method_cv.py's paired columns (also bench/webly_quality.py's): the folds' held-out ranks pooled per seed and
stacked, and each config minus the first paired on them, which with folds of one size is the difference of the
mean fold rsums (seeds averaged), inside its interval. Hand-made ranks (no training)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import method_cv as MC  # noqa: E402

from crossview.eval import metrics as M  # noqa: E402


def test_folds_are_pooled_per_seed_with_their_images_renumbered() -> None:
    per_seed = [[({"i2t": [1, 2], "t2i": [1, 3, 2]}, [0, 0, 1]), ({"i2t": [4], "t2i": [1]}, [0])],
                [({"i2t": [2, 2], "t2i": [2, 3, 1]}, [0, 0, 1]), ({"i2t": [1], "t2i": [5]}, [0])]]
    ranks, caps = MC.pool_folds(per_seed)
    assert ranks["i2t"].tolist() == [[1, 2, 4], [2, 2, 1]]
    assert ranks["t2i"].tolist() == [[1, 3, 2, 1], [2, 3, 1, 5]]
    assert caps.tolist() == [0, 0, 1, 2]


def _fold(rng, n_img: int, quality: float) -> tuple[dict, np.ndarray]:
    ci = np.repeat(np.arange(n_img), 2)
    s = rng.normal(size=(n_img, 2 * n_img)) + quality * (np.arange(n_img)[:, None] == ci[None, :])
    return {"i2t": M.i2t_ranks(s, ci), "t2i": M.t2i_ranks(s, ci)}, ci


def test_the_paired_difference_is_the_difference_of_the_mean_fold_rsums() -> None:
    rng = np.random.default_rng(0)
    a = [[_fold(rng, 30, 1.0) for _ in range(3)] for _ in range(2)]      # 2 seeds x 3 folds of 30 images
    b = [[_fold(rng, 30, 2.0) for _ in range(3)] for _ in range(2)]

    def mean_rsum(runs):
        return np.mean([M.rsum_of(M.rank_metrics(r["i2t"]), M.rank_metrics(r["t2i"])) for seed in runs
                        for r, _ in seed])

    diff, mde = MC.paired_cells(MC.pool_folds(a), MC.pool_folds(b))
    value, low, high = float(diff.split()[0]), float(diff.split("(")[1].split()[0]), float(diff.split()[-1][:-1])
    assert value == pytest.approx(mean_rsum(b) - mean_rsum(a), abs=0.05)
    assert low <= value <= high and low > 0             # a clearly better config
    assert float(mde) > 0
    assert "3 folds' held-out photos pooled" in MC.paired_note(2, 3) and "2 seeds" in MC.paired_note(2, 3)
    assert "seeds" not in MC.paired_note(1, 3)
