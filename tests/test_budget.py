"""One budget for every loss of a comparison (issue 28, item 3): the same epochs, the same captions a step (so the
same optimiser steps) and the same schedule shape; each loss's own setting chosen apart from the reported split."""

from __future__ import annotations

import json

import pytest

from _engine_helpers import make_toy_dataset
from crossview.core.errors import CrossViewError
from crossview.experiments.budget import Budget, choose_params, parse_budget


@pytest.mark.parametrize("text, want", [
    ("20x128", Budget(20, 128, 0.7)), ("20 x 128 @ 0.5", Budget(20, 128, 0.5)),
    ("epochs=30,batch=64,decay=0.5", Budget(30, 64, 0.5)), ("epochs=3, batch=10", Budget(3, 10, 0.7)),
    ("", None), ("defaults", None), (None, None),
])
def test_parse_budget(text, want):
    assert parse_budget(text) == want


@pytest.mark.parametrize("bad", ["20", "x128", "0x128", "20x1", "20x128@0", "20x128@1.5", "epochs=20",
                                 "epochs=a,batch=2", "steps=100,batch=2"])
def test_bad_budgets_are_one_line(bad):
    with pytest.raises(CrossViewError, match="--budget"):
        parse_budget(bad)


def test_every_loss_gets_the_same_captions_per_step_epochs_steps_and_schedule():
    b = Budget(20, 128)
    triplet = b.params_for("vsepp", captions_per_image=5.0)
    ranking = b.params_for("smoothap", captions_per_image=5.0)
    assert triplet == {"max_epochs": 20, "batch_size": 128, "lr_decay_epoch": 14}
    assert ranking == {"max_epochs": 20, "batch_size": 26, "lr_decay_epoch": 14}   # 26 images x 5 = 130 captions
    # the Flickr8k sample's training split: 600 images, 3,000 captions
    assert b.steps("vsepp", 600, 3000) == 20 * 24 and b.steps("smoothap", 600, 3000) == 20 * 24
    assert b.describe() == "20 epochs of 128-caption batches, the learning rate / 10 after epoch 14"
    with pytest.raises(CrossViewError, match="budget is for methods trained in epochs"):
        b.params_for("cca", 5.0)


def test_choose_params_scores_the_grid_by_cross_validation_of_train_never_on_the_reported_split(tmp_path):
    import copy

    ds = make_toy_dataset(n_images=100, caps_per_image=2)
    ds = copy.copy(ds)
    ds.splits = {k: v for k, v in ds.splits.items() if k != "test"}     # reported on val: choose on train folds
    events = list(choose_params("vsepp", ds, {"margin": [0.05, 0.4]},
                                {"max_epochs": 2, "batch_size": 16, "embed_dim": 8, "lr_decay_epoch": 1},
                                reported_on="val", out=tmp_path / "choose", label="vsepp", text_encoder="bow",
                                device="cpu"))
    chosen = events[-1]
    assert chosen["selected_on"] == "train-cv3" and chosen["point"]["margin"] in (0.05, 0.4)
    assert chosen["score"] == max(t["score"] for t in chosen["trials"])
    record = json.loads((tmp_path / "choose" / "tune.json").read_text())
    val = set(ds.splits["val"].tolist())
    for f in (1, 2, 3):
        cfg = json.loads((tmp_path / "choose" / f"trial-001-f{f}" / "config.json").read_text())
        assert not val & set(cfg["derived_splits"]["cv-test"]) and not val & set(cfg["derived_splits"]["cv-train"])
    assert record["reported_on"] == "val" and not (tmp_path / "choose" / "best").exists()
    # reported on test, the grid is scored on val instead
    events = list(choose_params("vsepp", make_toy_dataset(n_images=100, caps_per_image=2), {"margin": [0.05, 0.4]},
                                {"max_epochs": 1, "batch_size": 16, "embed_dim": 8, "lr_decay_epoch": 1},
                                reported_on="test", out=tmp_path / "choose2", label="vsepp", text_encoder="bow",
                                device="cpu"))
    assert events[-1]["selected_on"] == "val"
