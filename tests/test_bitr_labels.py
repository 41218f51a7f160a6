"""Experiments 3 and 4 of the BITR paper: text views (labels, caption phrases), the label table through the engine,
its metrics and its command (crossview.data.views, crossview.experiments.bitr_labels)."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

import _engine_helpers as H
from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.core.events import Finished
from crossview.data.views import apply_text_view, check_text_view, label_text, text_view
from crossview.experiments import bitr_labels as L

FAST = {"bitr": {"C": 10.0, "max_iter": 30}, "wsabie": {"max_epochs": 20, "dim": 16}, "wknn": {"k": 10}}


@pytest.fixture(scope="module")
def labelled():
    """The engine tests' toy (16-d features of 8 latent classes): each image labelled with its class and shape
    word, and one image with no label."""
    ds = H.make_toy_dataset()
    sets = [[f"class{k}", f"shape{k}"] for k in ds.labels.tolist()]
    sets[5] = []
    return dataclasses.replace(ds, label_sets=sets)


def test_the_label_view_turns_each_label_into_a_caption_of_its_image(labelled):
    v = text_view(labelled, "labels")
    assert v.n_images == labelled.n_images and v.name == "toy-labels"
    assert v.captions[:2] == ["class0", "shape0"] and v.caption_image[:2].tolist() == [0, 0]
    assert 5 not in set(v.caption_image.tolist()) and v.label_sets[5] == []
    assert 5 not in v.splits["train"] and 5 in labelled.splits["train"]        # no label: in no split
    assert v.n_captions == 2 * (labelled.n_images - 1)
    np.testing.assert_array_equal(v.image_features, labelled.image_features)
    assert {k: s.tolist() for k, s in v.splits.items()} == {k: [i for i in s.tolist() if i != 5]
                                                             for k, s in labelled.splits.items()}
    assert v.fingerprint() != labelled.fingerprint() and v.meta["text_view"] == {"kind": "labels"}
    assert apply_text_view(labelled, None) is labelled
    assert apply_text_view(labelled, {"kind": "labels"}).fingerprint() == v.fingerprint()   # reproducible
    assert label_text("sit-in_front_of-building") == "sit in front of building"


def test_the_phrase_view_keeps_phrases_of_enough_images(labelled, monkeypatch):
    """Each image gets the union of its captions' phrases; a phrase of fewer than min_images images goes."""
    import crossview.data.phrases as P

    def fake(captions, parser="auto", **kw):
        return [[c.split()[0] + "-run"] + (["rare-one"] if i == 0 else []) for i, c in enumerate(captions)]
    monkeypatch.setattr(P, "extract_phrases", fake)
    v = text_view(labelled, {"kind": "phrases", "min_images": 2})
    firsts = {c.split()[0] for c in labelled.captions[:2]}
    assert set(v.label_sets[0]) == {f"{w}-run" for w in firsts} and "rare-one" not in v.label_sets[0]
    assert all(label_text(x) in v.captions for x in v.label_sets[0])
    v1 = text_view(labelled, {"kind": "phrases", "min_images": 1})
    assert "rare-one" in v1.label_sets[0]


@pytest.mark.parametrize("view, match", [("tags", "kind must be"), ({"kind": "phrases", "min_images": 0}, "min_images"),
                                         ({"kind": "labels", "min_images": 2}, "unknown setting"),
                                         ({"kind": "phrases", "top": 3}, "unknown setting")])
def test_bad_views_get_one_line(view, match):
    with pytest.raises(CrossViewError, match=match):
        check_text_view(view)


def test_a_dataset_without_labels_has_no_label_view():
    with pytest.raises(CrossViewError, match="no label sets"):
        text_view(H.make_toy_dataset(), "labels")


def test_label_metrics_take_im2text_from_one_matrix_and_text2im_from_the_other():
    rel = np.array([[1, 0, 0], [0, 1, 1]], dtype=bool)
    good = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]], dtype=np.float32)
    bad = -good
    res = L.label_metrics(good, bad, rel, (1,))
    assert res["i2t"]["P@1"] == pytest.approx(100.0) and res["i2t"]["mAP"] == pytest.approx(100.0)
    assert res["t2i"]["mAP"] < 100.0
    same = L.label_metrics(good, good, rel, (1,))
    assert same["t2i"]["mAP"] == pytest.approx(100.0)
    # a label method's columns reordered into the experiment's vocabulary; unknown labels rank last
    out = L._reindexed(np.array([[0.5, 0.9]], np.float32), ["b", "a"], ["a", "b", "c"])
    assert out[0, :2].tolist() == pytest.approx([0.9, 0.5]) and out[0, 2] < 0.5


def test_paper_rows_come_from_the_cards():
    rows = L.paper_rows("labels", ["cca", "wknn", "svm", "bitr-c"])
    assert rows["wknn"]["i2t"]["P@5"] == pytest.approx(19.31) and rows["cca"]["t2i"]["mAP"] == pytest.approx(2.97)
    assert rows["bitr-c"]["i2t"]["P@5"] == pytest.approx(19.48)             # the CTR row, the paper's best
    assert L.paper_rows("phrases", ["bitr-e"])["bitr-e"]["t2i"]["mAP"] == pytest.approx(3.49)


def test_label_table_through_the_engine(labelled, tmp_path):
    """Every method's trial is an engine run on the label view (recorded in config.json, reopened by open_run),
    each far above a random ranking; a second call reads the finished trials back."""
    from crossview.engine.session import open_run

    kw = dict(kind="labels", representation="default", methods=["cca", "wknn", "svm", "wsabie", "bitr-c", "random"],
              ks=(1, 5), method_params=FAST, representation_params={"text_encoder": "tfidf", "cache": False},
              out=tmp_path / "exp")
    events = list(L.run_bitr_labels(labelled, **kw))
    res = events[-1].summary
    assert isinstance(events[-1], Finished) and res["n_labels"] == 16 and res["protocol"].startswith("train on")
    rnd = res["results"]["random"]
    for m in ("cca", "wknn", "svm", "wsabie", "bitr-c"):
        for d in ("i2t", "t2i"):
            assert res["results"][m][d]["mAP"] > rnd[d]["mAP"] + 30, (m, d, res["results"][m], rnd)
    run_dir = tmp_path / "exp" / "test-svm"
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["text_view"] == {"kind": "labels"}
    run = open_run(run_dir, dataset=labelled)
    assert run.dataset.name == "toy-labels" and run.dataset.captions[0] == "class0"
    again = list(L.run_bitr_labels(labelled, **kw))
    assert any("finished earlier" in getattr(e, "message", "") for e in again)
    assert again[-1].summary["results"]["svm"]["i2t"]["mAP"] == pytest.approx(res["results"]["svm"]["i2t"]["mAP"])
    # paired against the first row on the same queries: the mAP differences are the table's, with intervals; a
    # trial read back from a folder that kept no per-query APs (an older one) gets them from its run again
    pr = res["paired"]
    assert pr["baseline"] == "cca" and list(pr["rows"]) == ["wknn", "svm", "wsabie", "bitr-c"]
    for m, r in pr["rows"].items():
        for d in ("i2t", "t2i"):
            want = res["results"][m][d]["mAP"] - res["results"]["cca"][d]["mAP"]
            assert r[d]["diff"] == pytest.approx(want, abs=1e-9), (m, d)
            assert r[d]["ci"][0] <= r[d]["diff"] <= r[d]["ci"][1]
            assert r[d]["queries"] == res["results"][m][d]["n_queries"]
    exp = json.loads((tmp_path / "exp" / "experiment.json").read_text())
    for t in exp["trials"].values():
        del t["ap"]
    (tmp_path / "exp" / "experiment.json").write_text(json.dumps(exp))
    events3 = list(L.run_bitr_labels(labelled, **kw))
    third = events3[-1].summary
    assert sum("finished earlier" in getattr(e, "message", "") for e in events3) == 5     # nothing trained again
    assert third["paired"]["rows"]["svm"]["i2t"]["diff"] == pytest.approx(pr["rows"]["svm"]["i2t"]["diff"])
    assert "Paired against CCA on the same queries" in L.format_table(res)
    text = L.format_table(res)
    assert text.startswith("Experiment 4") and "Table 6" in text and "wKNN" in text
    assert "| SVM |" in L.format_markdown(res, "crossview experiment bitr-labels --data x")


def test_bad_label_table_arguments(labelled, tmp_path):
    with pytest.raises(CrossViewError, match="unknown method"):
        L.parse_methods("cca,knn")
    with pytest.raises(CrossViewError, match=r"^wsabie fixes target='label_sets' in this table; the table needs it; "
                                             r"drop that --param$"):
        list(L.run_bitr_labels(labelled, methods=["wsabie"], method_params={"wsabie": {"target": "captions"}},
                               out=tmp_path / "e"))
    with pytest.raises(CrossViewError, match="not among the methods"):
        list(L.run_bitr_labels(labelled, methods=["cca"], method_params={"svm": {"C": 1}}, out=tmp_path / "e2"))


def test_cli_label_table(labelled, tmp_path, monkeypatch, capsys):
    import crossview.data as D

    monkeypatch.setattr(D, "load_dataset", lambda *a, **k: labelled)
    out = tmp_path / "t.md"
    rc = main(["experiment", "bitr-labels", "--data", "toy", "--representation", "default", "--methods",
               "wknn,random", "--k", "5", "--no-cache", "--exp-dir", str(tmp_path / "e"), "--out", str(out),
               "--param", "wknn.k=10"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "Experiment 4" in printed and "wKNN" in printed
    assert "--param wknn.k=10" in out.read_text()


def test_a_label_table_over_seeds_is_the_mean_of_its_builds_and_pairs_seed_averaged_aps(labelled, tmp_path,
                                                                                          monkeypatch, capsys):
    """--seeds: one ordinary experiment per seed (EXP_DIR/seed-S), the mean and sd over the builds, and each
    method's mAP paired against the first with each query's AP averaged over the builds first."""
    import crossview.data as D

    monkeypatch.setattr(D, "load_dataset", lambda *a, **k: labelled)
    out, exp = tmp_path / "t.md", tmp_path / "e"
    args = ["experiment", "bitr-labels", "--data", "toy", "--representation", "default", "--methods",
            "cca,wsabie,random", "--k", "5", "--no-cache", "--exp-dir", str(exp), "--seeds", "0,1",
            "--param", "wsabie.max_epochs=3", "--param", "wsabie.dim=8"]
    assert main([*args, "--json", "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["seeds"] == [0, 1] and sorted(p.name for p in exp.iterdir()) == ["seed-0", "seed-1"]
    builds = [json.loads((exp / f"seed-{s}" / "experiment.json").read_text()) for s in (0, 1)]
    for d in ("i2t", "t2i"):
        per = [b["trials"]["test-wsabie"]["metrics"][d]["mAP"] for b in builds]
        assert res["results"]["wsabie"][d]["mAP"] == pytest.approx(np.mean(per))
        assert res["seed_std"]["wsabie"][d]["mAP"] == pytest.approx(np.std(per))
        # paired: the seeds' APs averaged per query, then against CCA's (the same queries in every build)
        ap_w = np.mean([b["trials"]["test-wsabie"]["ap"][d] for b in builds], axis=0)
        ap_c = np.mean([b["trials"]["test-cca"]["ap"][d] for b in builds], axis=0)
        assert res["paired"]["rows"]["wsabie"][d]["diff"] == pytest.approx(float(np.mean(ap_w - ap_c)))
    md = out.read_text()
    assert "--seeds 0,1" in md and "the mean of 2 builds" in md and "| sd WSABIE |" in md
    assert "averaged over the 2 builds first" in md
    assert main(args) == 0                                 # again: every build read back
    assert "trained" not in capsys.readouterr().err
    assert main([*args[:-6], "--seed", "2", "--seeds", "0,1"]) == 2
    assert "give --seed or --seeds, not both" in capsys.readouterr().err


def test_bitr_rows_cross_validate_c_as_the_paper_unless_c_is_given(labelled, tmp_path):
    """A BITR row whose parameters name neither C nor c_grid chooses C by cross-validation of the training images
    over the paper's grid (BITR-M over 1e-2..1e1); a given C or c_grid is kept as given."""
    from crossview.experiments.bitr_table import PAPER_C_GRIDS, method_params_for, with_paper_c_grid

    assert method_params_for("bitr-c", None) == {"c_grid": "paper"}
    assert method_params_for("bitr-m", {"bitr": {"max_iter": 5}}) == {"max_iter": 5, "c_grid": "1e-2:1e1"}
    assert method_params_for("bitr-e", {"bitr": {"C": 100}}) == {"C": 100.0}
    from crossview.methods._cgrid import c_grid_values

    kept = method_params_for("bitr-c", {"bitr-c": {"c_grid": "none"}})       # the card's fixed C, asked for
    assert "c_grid" in kept and c_grid_values(kept["c_grid"], "BITR") == ()
    assert method_params_for("cca", None) == {} and with_paper_c_grid("svm", "svm", {}) == {}
    assert set(PAPER_C_GRIDS) == {"bitr-m", "bitr-e", "bitr-c"}
    kw = dict(kind="labels", representation="default", methods=["bitr-c"], ks=(5,),
              method_params={"bitr": {"max_iter": 5, "cv_folds": 2}},
              representation_params={"text_encoder": "tfidf", "cache": False}, out=tmp_path / "exp")
    events = list(L.run_bitr_labels(labelled, **kw))
    assert events[-1].summary["method_params"]["bitr-c"]["c_grid"] == "paper"
    trial = next((tmp_path / "exp").glob("*bitr-c*"))
    assert json.loads((trial / "config.json").read_text())["params"]["c_grid"] == "paper"   # what the run trained
    log = (trial / "metrics.jsonl").read_text()
    assert log.count("cross-validation picks C") == 2, log[-2000:]    # one C per direction, chosen on the folds
    picked = {d: float(c) for d, c in re.findall(r"bitr (i2t|t2i): cross-validation picks C = ([0-9.e+-]+)", log)}
    result = events[-1].summary
    assert result["results"]["bitr-c"]["C"] == {d: [c] for d, c in picked.items()}     # the table says the C used
    md = L.format_markdown(result)
    assert f"- BITR-C: max_iter = 5, cv_folds = 2, c_grid = paper; C used: i2t {picked['i2t']:g}, t2i " \
           f"{picked['t2i']:g}" in md
    assert "C used" in L.format_table(result)
    record = json.loads((tmp_path / "exp" / "experiment.json").read_text())
    for trial_record in record["trials"].values():       # a folder from before C was kept: read back from the run
        trial_record["metrics"].pop("C")
    (tmp_path / "exp" / "experiment.json").write_text(json.dumps(record))
    again = list(L.run_bitr_labels(labelled, **kw))
    assert any("finished earlier" in getattr(e, "message", "") for e in again)
    assert again[-1].summary["results"]["bitr-c"]["C"] == result["results"]["bitr-c"]["C"]
