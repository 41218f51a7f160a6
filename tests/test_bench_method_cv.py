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


def test_the_config_table_pairs_every_config_with_the_first(capsys, tmp_path) -> None:
    """config_table: a row per config (its rsum per fold and seed, the mean, the sd when asked, the paired
    difference from the first and the minimal detectable effect), the note under it, a JSON line per config."""
    import json

    rng = np.random.default_rng(1)
    folds = {(q, seed, f): _fold(rng, 20, q) for q in (1.0, 3.0) for seed in (0, 1) for f in (0, 1)}

    def trial(cfg, seed, a, b):
        ranks, ci = folds[(cfg.get("q", 1.0), seed, a)]
        i2t, t2i = M.rank_metrics(ranks["i2t"]), M.rank_metrics(ranks["t2i"])

        class Held:
            caption_image = ci
        return {"rsum": M.rsum_of(i2t, t2i), "ranks": ranks}, Held, 1.0

    out = tmp_path / "rows.jsonl"
    MC.config_table([{}, {"q": 3.0}], 2, [(0, None), (1, None)], trial, head="toy config", protocol="cv",
                    json_path=str(out), json_extra={"method": "toy"})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| toy config | cv rsum per fold / seed | mean | sd | minus the first")
    assert lines[2].startswith("| defaults | ") and lines[2].endswith("| - | - | 1 |")
    cells = lines[3].split(" | ")
    assert cells[0] == "| q=3.0" and len(cells[1].split()) == 4 and cells[4].startswith("+")
    assert "Paired: each config minus the first" in lines[-1] and "2 seeds" in lines[-1]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["config"] for r in rows] == [{}, {"q": 3.0}] and rows[0]["method"] == "toy" and len(rows[1]["rsum"]) == 4
    MC.config_table([{}], 1, [(0, None)], trial, head="config", protocol="cv", sd=False)
    lines = capsys.readouterr().out.splitlines()
    assert "| sd |" not in lines[0] and lines[1] == "|---|---|---|---|---|---|" and len(lines) == 3
