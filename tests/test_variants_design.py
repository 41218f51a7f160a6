"""The study machinery's design options (issue 28, item 4): variants trained on different parts of the data, a
comparison restricted to a subset of the queries, positive controls, and whether a paper's effect can be
resolved by the design."""

from __future__ import annotations

import json

import numpy as np
import pytest

import _engine_helpers as H
from crossview.core.events import Finished
from crossview.experiments import variants as V

STUDY = V.Study(kind="toy-study", title="Toy study", baseline="small",
                variants={"small": ("vsepp", {}), "all": ("vsepp", {})},
                labels={"small": "trained on half the training images", "all": "trained on all of them"},
                controls=("all",),
                expected={"all": {"metric": "i2t R@1", "value": 50.0, "source": "a made-up paper"}})


def test_variants_on_other_training_splits_a_subset_table_and_a_positive_control(tmp_path):
    ds = H.make_toy_dataset()
    train = ds.splits["train"]
    small = train[: len(train) // 4]
    test = ds.splits["test"]
    subset = test[:10]
    events = list(V.run_study(STUDY, ds, seeds=1, out=tmp_path / "exp", device="cpu", text_encoder="tfidf",
                              params={"*": {"embed_dim": "16", "batch_size": "16", "max_epochs": "4"}},
                              train_splits={"small": "train-small"}, derived_splits={"train-small": small},
                              subsets={"the first ten": subset}, notes=["a note of the experiment"]))
    result = events[-1].summary
    assert isinstance(events[-1], Finished)
    assert result["train_images"] == {"small": len(small), "all": len(train)}
    cfg = json.loads((tmp_path / "exp" / "small-seed0" / "config.json").read_text())
    assert cfg["train_split"] == "train-small" and sorted(cfg["derived_splits"]["train-small"]) == sorted(small)
    assert json.loads((tmp_path / "exp" / "all-seed0" / "config.json").read_text())["train_split"] == "train"
    sub = result["paired_subsets"]["the first ten"]
    assert (sub["n_images"], sub["n_captions"]) == (10, 20)
    pr = sub["paired"]["all"]
    assert pr["n_images"] == 10 and pr["i2t"]["won"] + pr["i2t"]["lost"] + pr["i2t"]["tied"] == 10
    # the subset's effect is the effect computed by hand on those queries' ranks
    with np.load(tmp_path / "exp" / "all-seed0" / "ranks.npz") as a, \
            np.load(tmp_path / "exp" / "small-seed0" / "ranks.npz") as b:
        keep = np.isin(a["image_ids"], subset)
        r1 = 100 * (np.mean(a["i2t"][keep] <= 1) - np.mean(b["i2t"][keep] <= 1))
    assert pr["i2t"]["R@1"]["diff"] == pytest.approx(r1)
    res = result["resolution"]["all"]
    assert res["paper"] == 50.0 and res["half_width"] == pytest.approx((res["ci"][1] - res["ci"][0]) / 2)
    assert res["resolves"] == (res["mde"] < 50.0)
    text = " ".join(V.format_table(STUDY, result).split())
    assert "Restricted to the first ten (10 images as i2t queries, their 20 captions as t2i queries)" in text
    assert "all is a positive control" in text and "a made-up paper reports +50.0 i2t R@1" in text
    assert "a note of the experiment" in text
    md = V.format_markdown(STUDY, result, "cmd")
    assert "| all (trained on all of them) - positive control |" in md


@pytest.mark.parametrize("half, paper, resolves", [(1.0, -1.8, True), (6.0, -1.8, False), (2.0, 2.0, False),
                                                   (1.7, -1.8, False)])
def test_resolution_compares_the_minimal_detectable_difference_with_the_papers_effect(half, paper, resolves):
    """The paper's effect is resolved when the design's minimal detectable difference (80% power) is below it:
    an interval half-width just under it (1.7 against 1.8, minimal detectable 2.4) is not enough."""
    pr = {"i2t": {"R@1": {"ci": [-3.0 - half, -3.0 + half], "diff": -3.0}}, "mde": {"i2t R@1": 2.8 * half / 1.96}}
    r = V._resolution({"metric": "i2t R@1", "value": paper, "source": "p"}, pr)
    assert r["resolves"] is resolves and r["half_width"] == pytest.approx(half)
    assert r["excludes_paper"] == (not -3.0 - half <= paper <= -3.0 + half)


def test_subset_queries_remap_the_captions_to_the_kept_images():
    ids = {"i2t": np.array([10, 11, 12, 13]), "t2i": np.arange(8)}
    keep_i, keep_t, ci = V._subset_queries(ids, np.array([0, 0, 1, 1, 2, 2, 3, 3]), [11, 13])
    assert keep_i.tolist() == [False, True, False, True]
    assert keep_t.tolist() == [False, False, True, True, False, False, True, True]
    assert ci.tolist() == [0, 0, 1, 1]
