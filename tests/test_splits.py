"""One rule for splits: a run records the split it was evaluated on and every later view defaults to it;
datasets without ``test`` evaluate on ``val``, without either on a held-out part of ``train``. And every
typed input of a run is checked before any heavy work."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from _engine_helpers import make_toy_dataset, write_toy_precomp
from crossview.cli import main
from crossview.core.events import Finished, Log
from crossview.engine.run import train
from crossview.engine.session import open_run
from crossview.engine.splits import HELDOUT, MIN_HELDOUT, apply_derived_splits, describe_auto_split, plan_splits
from crossview.core.errors import CrossViewError


def _without(ds, *names):
    ds.splits = {k: v for k, v in ds.splits.items() if k not in names}
    return ds


def _drain(it):
    events = list(it)
    assert isinstance(events[-1], Finished), events[-1]
    return events


# ---------------------------------------------------------------------------- the rule
def test_test_split_is_the_default_when_present():
    plan = plan_splits(make_toy_dataset())
    assert (plan.train, plan.val, plan.eval, plan.derived, plan.note) == ("train", "val", "test", {}, None)


def test_without_test_val_is_evaluated_and_not_used_for_early_stopping():
    plan = plan_splits(_without(make_toy_dataset(), "test"))
    assert (plan.eval, plan.val) == ("val", None)
    assert "no test split" in plan.note and "val" in plan.note


def test_without_test_or_val_a_seeded_heldout_part_of_train_is_derived():
    ds = _without(make_toy_dataset(n_images=200), "test", "val")
    train_images = set(ds.splits["train"].tolist())
    plan = plan_splits(ds, seed=3)
    assert plan.eval == HELDOUT and plan.val is None
    held, rest = set(plan.derived[HELDOUT]), set(plan.derived["train"])
    assert held and rest and not held & rest and held | rest == train_images
    assert len(held) == max(MIN_HELDOUT, round(0.1 * len(train_images)))
    assert plan_splits(ds, seed=3).derived == plan.derived            # deterministic
    assert plan_splits(ds, seed=4).derived != plan.derived            # and seeded
    applied = apply_derived_splits(ds, plan.derived)
    assert set(applied.splits[HELDOUT].tolist()) == held and set(applied.splits["train"].tolist()) == rest
    assert set(ds.splits) == {"train"}                                # the original is left alone


def test_too_small_a_train_split_to_hold_out_is_refused_clearly():
    ds = _without(make_toy_dataset(n_images=20), "test", "val")
    with pytest.raises(CrossViewError, match="too few to hold"):
        plan_splits(ds)


def test_a_named_split_that_is_missing_or_is_the_train_split_is_refused():
    ds = _without(make_toy_dataset(), "test")
    with pytest.raises(CrossViewError, match=r"no split 'test' for evaluation; it has: train, val"):
        plan_splits(ds, "test")
    with pytest.raises(CrossViewError, match="is the training split"):
        plan_splits(ds, "train")


def test_damaged_derived_splits_in_a_run_folder_give_one_clear_line():
    ds = make_toy_dataset()
    for bad in ([1, 2], {"heldout": "abc"}, {"heldout": [1, 10**6]}, {"heldout": [1.5]}):
        with pytest.raises(CrossViewError, match="config.json"):
            apply_derived_splits(ds, bad)


def test_describe_auto_split_says_what_auto_means_for_the_dataset():
    assert describe_auto_split(make_toy_dataset()).startswith("evaluates on test (32 images)")
    assert "no test split: evaluates on val (32 images)" in describe_auto_split(_without(make_toy_dataset(), "test"))
    assert "held-out" in describe_auto_split(_without(make_toy_dataset(), "test", "val"))


# ---------------------------------------------------------------------------- runs follow their split
def test_a_run_on_a_dataset_without_test_evaluates_on_val_and_every_view_follows(tmp_path, capsys):
    ds = _without(make_toy_dataset(), "test")
    events = _drain(train("cca", ds, run_dir=tmp_path / "run", text_encoder="bow", cache=False))
    assert any(isinstance(e, Log) and "no test split" in e.message for e in events)
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert cfg["split"] == summary["split"] == "val" and cfg["val_split"] is None
    assert (tmp_path / "run" / "embeddings_val.npz").is_file()

    assert main(["eval", str(tmp_path / "run"), "--json"]) == 0      # no --split: the run's split
    out = json.loads(capsys.readouterr().out)
    assert out["split"] == "val" and out["rsum"] == pytest.approx(summary["rsum"], abs=1e-6)

    run = open_run(tmp_path / "run", dataset=ds)
    assert run.eval_split == "val"
    r = run.retriever()
    assert r.gallery_name == "val" and len(r.gallery_images) == len(ds.splits["val"])


def test_a_run_on_train_only_holds_out_part_of_train_and_open_run_restores_it(tmp_path):
    ds = _without(make_toy_dataset(n_images=200), "test", "val")
    _drain(train("cca", ds, run_dir=tmp_path / "run", text_encoder="bow", cache=False, seed=7))
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["split"] == HELDOUT
    held = cfg["derived_splits"][HELDOUT]
    ranks = np.load(tmp_path / "run" / "ranks.npz")
    assert len(ranks["i2t"]) == len(held)
    run = open_run(tmp_path / "run", dataset=ds)
    assert run.dataset.splits[HELDOUT].tolist() == held
    assert not set(held) & set(run.dataset.splits["train"].tolist())
    retr = run.retriever()
    assert retr.gallery_name == HELDOUT
    # Ground-truth ranks in the default gallery are the run's own evaluation ranks.
    first = int(run.dataset.splits[HELDOUT][0])
    ranking = retr.query_image(first, k=5)
    assert int(ranking.gold_ranks.min()) == int(ranks["i2t"][0])


# ---------------------------------------------------------------------------- checked before heavy work
@pytest.fixture
def no_extraction(monkeypatch):
    import crossview.features as features

    def boom(*a, **k):
        raise AssertionError("feature extraction started before the input was checked")
    monkeypatch.setattr(features, "extract_features", boom)


@pytest.mark.parametrize("argv, needle", [
    (["bitr", "--c-grid", "1e-3:zz"], "c_grid"),
    (["cca", "--set", "reg=-1"], "reg"),
    (["cca", "--image-encoder", "resnet9000"], "unknown image encoder 'resnet9000'"),
    (["cca", "--text-encoder", "nope"], "unknown text encoder 'nope'"),
    (["cca", "--text-encoder", "bert:/no/such/folder"], "/no/such/folder"),
    (["cca", "--device", "cuda:7"], "cuda:7"),
    (["cca", "--device", "tpu"], "unknown device"),
    (["cca", "--split", "nosuch"], "no split 'nosuch'"),
    (["wsabie", "--set", "dim=0"], "dim"),
])
def test_bad_input_is_refused_before_any_extraction(tmp_path, capsys, no_extraction, argv, needle, request):
    """Bad values are refused in one line before any feature is extracted; those that need no data (method
    parameters, encoders, devices) before the demo is even rendered on its first use. A split is checked
    against the data, so that case renders the demo first (outside the captured output)."""
    if "--split" in argv:
        request.getfixturevalue("demo_dataset")
        capsys.readouterr()
    run_dir = tmp_path / "run"
    code = main(["train", *argv[:1], "--data", "demo", "--run-dir", str(run_dir), *argv[1:]])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("crossview: error:") and needle in lines[0], err
    assert not run_dir.exists()


def test_missing_image_weights_are_reported_before_extraction(tmp_path, monkeypatch, capsys, no_extraction):
    import crossview.features.image as image_mod
    monkeypatch.setattr(image_mod, "resolve_weights", lambda *a, **k: None)
    code = main(["train", "cca", "--data", "demo", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "efficientnet_lite0" in err and not (tmp_path / "run").exists()


def test_cli_trains_on_a_file_dataset_without_test_split_without_split_flag(tmp_path, capsys):
    # A VSE++ precomp folder with train and dev (= val) only, and a text encoder that needs no weights.
    folder = tmp_path / "toy_precomp"
    write_toy_precomp(folder, make_toy_dataset(n_images=120, caps_per_image=5))
    code = main(["train", "cca", "--data", str(folder), "--text-encoder", "bow", "--run-dir",
                 str(tmp_path / "run"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["split"] == "val"
    assert "no test split" in captured.err
    assert main(["eval", str(tmp_path / "run")]) == 0


@pytest.mark.slow
def test_flickr8k_sample_trains_and_evaluates_without_split_flags(flickr8k_sample: Path, tmp_path, capsys):
    data = str(flickr8k_sample / "dataset_flickr8k_sample.json")
    code = main(["train", "cca", "--data", data, "--text-encoder", "tfidf", "--image-encoder", "mobilenet_v2",
                 "--run-dir", str(tmp_path / "run"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["split"] == "val" and summary["n_images"] == 100
    assert summary["rsum"] > 3 * (1 + 5 + 10) * 2   # well above chance (rsum of chance ~ 2 * 16% of 100)
    assert main(["eval", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["split"] == "val"
