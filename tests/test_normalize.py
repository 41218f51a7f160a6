"""Feature normalisation: each kind against a hand computation, fitted on train only, saved in the run,
and applied to new queries exactly as to the dataset's rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from _engine_helpers import make_toy_dataset
from crossview.cli import main
from crossview.core.events import Finished
from crossview.engine.run import train
from crossview.engine.session import open_run
from crossview.core.errors import CrossViewError
from crossview.features.normalize import NORMS, FeatureNorm, check_norm


def _rows(seed=0, n=50, d=6):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, d)) * np.array([10, 1, 1, 0.1, 3, 1]) + 2).astype(np.float32)


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_each_kind_matches_a_hand_computation():
    x = _rows()
    assert np.array_equal(FeatureNorm("none").transform(x), x)
    np.testing.assert_allclose(FeatureNorm("l2").transform(x), _unit(x), rtol=1e-6)
    np.testing.assert_allclose(FeatureNorm("ssr").transform(x), _unit(np.sign(x) * np.sqrt(np.abs(x))), rtol=1e-6)
    np.testing.assert_allclose(FeatureNorm("center").fit(x).transform(x), _unit(x - x.mean(0)), rtol=1e-5,
                               atol=1e-6)


def test_whitening_gives_unit_variance_uncorrelated_components_on_train():
    x = _rows(n=400)
    w = FeatureNorm("whiten").fit(x)
    z = (x - w.mean_) @ w.proj_
    cov = np.cov(z, rowvar=False)
    np.testing.assert_allclose(cov, np.eye(cov.shape[0]), atol=1e-3)
    out = w.transform(x)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1, rtol=1e-5)


def test_fitted_norms_learn_from_the_rows_given_only():
    train_rows, other = _rows(0), _rows(1) + 50
    c = FeatureNorm("center").fit(train_rows)
    np.testing.assert_allclose(c.mean_, train_rows.mean(0), rtol=1e-6)
    np.testing.assert_allclose(c.transform(other), _unit(other - train_rows.mean(0)), rtol=1e-5)


def test_state_round_trips_and_damaged_state_is_refused():
    x = _rows(n=100)
    for kind in NORMS:
        n = FeatureNorm(kind).fit(x)
        back = FeatureNorm.from_state_dict(n.state_dict())
        np.testing.assert_allclose(back.transform(x), n.transform(x), rtol=1e-6)
    for bad in ([], {"kind": "whiten"}, {"kind": "center", "mean": np.zeros((2, 2))}, {"kind": "cube"}):
        with pytest.raises(CrossViewError):
            FeatureNorm.from_state_dict(bad)
    with pytest.raises(CrossViewError, match="fitted on 6-d"):
        FeatureNorm("center").fit(x).transform(np.zeros((1, 3)))
    with pytest.raises(CrossViewError, match="one of: none, l2"):
        check_norm("cube")


@pytest.mark.parametrize("image_norm, text_norm", [("whiten", "l2"), ("ssr", "center")])
def test_a_run_records_its_norms_and_queries_get_the_same_transform(tmp_path, image_norm, text_norm):
    ds = make_toy_dataset()
    events = list(train("cca", ds, run_dir=tmp_path / "run", text_encoder="bow", cache=False,
                        image_norm=image_norm, text_norm=text_norm))
    assert isinstance(events[-1], Finished)
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (cfg["image_norm"], cfg["text_norm"]) == (image_norm, text_norm)
    run = open_run(tmp_path / "run", dataset=ds)
    retr = run.retriever()
    c = int(np.flatnonzero(np.isin(ds.caption_image, ds.splits["test"]))[0])
    by_index = retr.query_text(c, k=5)
    typed = retr.query_text(ds.captions[c] + " ", k=5)     # a new sentence through the encoder + norm
    np.testing.assert_allclose(typed.scores, by_index.scores, rtol=1e-5, atol=1e-6)
    assert list(typed.items) == list(by_index.items)
    # The evaluation in the run used the same normalised features as the reopened run.
    ranks = np.load(tmp_path / "run" / "ranks.npz")
    i = int(ds.splits["test"][0])
    assert int(retr.query_image(i, k=3).gold_ranks.min()) == int(ranks["i2t"][0])


def test_cli_offers_the_norms_and_refuses_them_on_resume(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "cca", "--image-norm", "cube"])
    assert "invalid choice" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path), "--image-norm", "l2"]) == 2
    assert "--resume continues a run" in capsys.readouterr().err
