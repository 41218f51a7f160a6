"""Bootstrap intervals of R@K and rsum: against a naive resampling loop, and sane on edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from crossview.core.errors import CrossViewError
from crossview.eval.bootstrap import bootstrap_ci


def _naive(r_i, r_t, ci, ks, resamples, seed, level=0.95):
    rng = np.random.default_rng(seed)
    n = len(r_i)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples)
    rs, per = [], {k: ([], []) for k in ks}
    for c in counts:
        images = np.repeat(np.arange(n), c)                       # the resampled images, with repeats
        caps = np.concatenate([np.flatnonzero(ci == i) for i in images])
        total = 0.0
        for k in ks:
            a = 100 * np.mean(r_i[images] <= k)
            b = 100 * np.mean(r_t[caps] <= k)
            per[k][0].append(a)
            per[k][1].append(b)
            total += a + b
        rs.append(total)
    q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
    return per, [np.percentile(rs, q[0]), np.percentile(rs, q[1])], q


def test_matches_a_naive_resampling_loop():
    rng = np.random.default_rng(1)
    n = 40
    ci = np.repeat(np.arange(n), rng.integers(1, 6, size=n))
    r_i, r_t = rng.integers(1, 30, size=n), rng.integers(1, 30, size=ci.size)
    got = bootstrap_ci(r_i, r_t, ci, ks=(1, 5, 10), resamples=200, seed=3)
    per, rsum, q = _naive(r_i, r_t, ci, (1, 5, 10), 200, 3)
    np.testing.assert_allclose(got["rsum"], rsum, rtol=1e-9)
    for k in (1, 5, 10):
        np.testing.assert_allclose(got["i2t"][f"R@{k}"], np.percentile(per[k][0], q), rtol=1e-9)
        np.testing.assert_allclose(got["t2i"][f"R@{k}"], np.percentile(per[k][1], q), rtol=1e-9)


def test_intervals_hold_the_estimate_and_shrink_with_more_images():
    rng = np.random.default_rng(0)

    def width(n):
        ci = np.repeat(np.arange(n), 5)
        r_i, r_t = rng.integers(1, 20, size=n), rng.integers(1, 20, size=5 * n)
        out = bootstrap_ci(r_i, r_t, ci)
        point = sum(100 * np.mean(r <= k) for r in (r_i, r_t) for k in (1, 5, 10))
        assert out["rsum"][0] <= point <= out["rsum"][1]
        return out["rsum"][1] - out["rsum"][0]
    assert width(1000) < width(100) / 2


def test_perfect_ranks_have_a_zero_width_interval_and_bad_input_is_refused():
    ci = np.repeat(np.arange(10), 5)
    out = bootstrap_ci(np.ones(10), np.ones(50), ci)
    assert out["rsum"] == [600.0, 600.0] and out["n"] == 10 and out["unit"] == "images"
    with pytest.raises(CrossViewError):
        bootstrap_ci(np.ones(10), np.ones(49), ci)
    with pytest.raises(CrossViewError):
        bootstrap_ci(np.ones(10), np.ones(50), ci, level=1.5)


def test_a_run_reports_its_interval_in_summary_and_table(tmp_path):
    from _engine_helpers import make_toy_dataset, toy_features
    from crossview.commands.train import format_metric_table
    from crossview.engine.run import train

    ds = make_toy_dataset()
    summary = list(train("cca", ds, run_dir=tmp_path / "run", features=toy_features(ds)))[-1].summary
    ci = summary["ci"]
    assert ci["n"] == len(ds.splits["test"]) and ci["unit"] == "images"
    assert ci["rsum"][0] <= summary["rsum"] <= ci["rsum"][1]
    for d in ("i2t", "t2i"):
        for k in ("R@1", "R@5", "R@10"):
            assert ci[d][k][0] <= summary[d][k] <= ci[d][k][1]
    table = format_metric_table(summary)
    assert table.count("±") == 6 and "95% interval" in table
    assert table.splitlines()[-1] == "chosen: nothing (no choice made on data); reported on test"
    # a run whose method chose on data says where, and an optimistic one says so
    s = {**summary, "selected_on": "val", "reported_on": "test", "choices": [{"what": "epoch", "on": "val"}]}
    assert format_metric_table(s).splitlines()[-1] == "chosen: epoch on val; reported on test"
    s.update(reported_on="val", optimistic=True)
    assert format_metric_table(s).splitlines()[-1].startswith("OPTIMISTIC: chosen and reported on the same split")
