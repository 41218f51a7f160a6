"""bench/_quality.py, the helper bench/quality.py and bench/scoring_quality.py share: runs in a work folder are read
back (no training on the second call), the CV folds' pooled ranks agree with the engine's own choice, a fused
run reuses its members' fold runs and its pooled fold ranks score what the weights' choice scored, and a method's
default scoring is read from the code. Toy CCA and BITR runs on a precomp folder (seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from _engine_helpers import make_toy_dataset, write_toy_precomp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import _quality as Q  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> tuple[Path, Path]:
    """``(work folder, data)``: a toy precomp folder (train 60 / val 20 / test 20 images, 2 captions each)."""
    base = tmp_path_factory.mktemp("bench_quality")
    data = base / "toy_precomp"
    write_toy_precomp(data, make_toy_dataset(100), (("train", "train"), ("dev", "val"), ("test", "test")))
    return base / "work", data


def _train(work, method: str) -> dict:
    w, data = work
    return Q.ensure_trained(method, str(data), w / method, text_encoder="bow", device="cpu")


def test_a_finished_run_and_its_fold_runs_are_read_back_not_trained_again(work, monkeypatch) -> None:
    first = _train(work, "cca")
    assert first["_state"] == "started"
    res = Q.scoring_results(work[0] / "cca", ("csls",))
    assert len(Q.fold_dirs(work[0] / "cca")) == 3

    import crossview.engine.run as run_mod

    def no_training(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(run_mod, "train", no_training)
    again = _train(work, "cca")
    assert again["_state"] == "finished" and again["rsum"] == first["rsum"]
    res2 = Q.scoring_results(work[0] / "cca", ("csls",))      # the fold runs are read back too
    assert res2["csls"]["choice"]["param"] == res["csls"]["choice"]["param"]
    assert res2["csls"]["val"]["rsum"] == res["csls"]["val"]["rsum"]


def test_pooled_fold_ranks_match_the_engines_choice(work) -> None:
    _train(work, "cca")
    res = Q.scoring_results(work[0] / "cca", ("csls",))
    x = res["csls"]
    cv_plain, caps = res["plain"]["cv_ranks"]
    assert cv_plain["i2t"].shape == (60,) and caps.shape == (120,) and caps.max() == 59
    # equal folds (20 images, 40 captions each): the pooled rsum is the engine's mean over the folds
    assert Q.rsum(cv_plain) == pytest.approx(x["choice"]["plain_rsum"], abs=1e-6)
    cv_b, _ = Q.cv_ranks(work[0] / "cca", "csls", x["choice"]["param"])
    assert Q.rsum(cv_b) == pytest.approx(x["cv_rsum"], abs=1e-6)
    assert x["cv_eff"]["rsum"]["diff"] == pytest.approx(Q.rsum(cv_b) - Q.rsum(cv_plain), abs=1e-6)
    lo, hi = x["cv_eff"]["rsum"]["ci"]
    assert lo <= x["cv_eff"]["rsum"]["diff"] <= hi
    two = Q.seed_val([work[0] / "cca"] * 2, "csls", x["choice"]["param"])     # the same run twice: its own numbers
    assert two["ranks"]["i2t"].shape == (2, 20) and two["seeds"] == 2 and two["rsum_sd"] == 0
    assert two["rsum"] == pytest.approx(x["val"]["rsum"])
    assert all(two["t2i"][k] == pytest.approx(x["val"]["t2i"][k]) for k in ("R@1", "R@5", "R@10"))


def test_the_fused_run_reuses_the_members_fold_runs_and_pools_what_its_choice_scored(work, monkeypatch) -> None:
    w, _ = work
    for m in ("cca", "bitr"):
        _train(work, m)
        Q.scoring_results(w / m, ("csls",))
    import crossview.engine.run as run_mod

    def no_training(*a, **k):
        raise AssertionError("the fusion trained a fold run its member had already")

    monkeypatch.setattr(run_mod, "train", no_training)
    fdir = w / "fused-cca+bitr"
    f = Q.ensure_fused([w / "cca", w / "bitr"], fdir)
    links = sorted((fdir / "cv").iterdir())
    assert len(links) == 6 and all(p.is_symlink() for p in links)
    ranks, caps = Q.fused_cv_ranks(fdir)
    assert ranks["i2t"].shape == (60,) and caps.shape == (120,)
    chosen = next(c for c in f["fusion"]["choice"]["candidates"]
                  if np.allclose(c["weights"], f["fusion"]["weights"]))
    assert Q.rsum(ranks) == pytest.approx(chosen["rsum"], abs=1e-6)
    assert Q.ensure_fused([w / "cca", w / "bitr"], fdir)["rsum"] == f["rsum"]       # read back
    from crossview.eval.scoring import evaluate_scoring

    sets = Q.fused_fold_sets(fdir)                  # the fused embeddings score as the fused ranks do
    plain = [evaluate_scoring(h, b, "plain")["rsum"] for h, b in sets]
    assert np.mean(plain) == pytest.approx(chosen["rsum"], abs=1e-6)
    rec, cv_s, caps_s = Q.fused_scoring_cv(fdir, "csls")
    assert rec["selected_on"] == "train-cv3" and np.array_equal(caps_s, caps)
    assert Q.rsum(cv_s) == pytest.approx(next(c["rsum"] for c in rec["candidates"] if c["param"] == rec["param"]))


def test_default_scoring_is_read_from_the_code(monkeypatch) -> None:
    import importlib

    import crossview.engine.scoring as sc

    for mod in map(importlib.import_module, Q.DEFAULT_SCORING_MODULES):
        for name in [n for n in dir(mod) if "default" in n.lower() and "scoring" in n.lower()]:
            monkeypatch.delattr(mod, name)
    assert Q.method_default_scoring("cca")[:2] == ("plain", None)
    monkeypatch.setattr(sc, "DEFAULT_SCORINGS", {"cca": ("csls", 10)}, raising=False)
    assert Q.method_default_scoring("cca")[:2] == ("csls", 10.0)
    assert Q.method_default_scoring("vsepp")[:2] == ("plain", None)
    monkeypatch.setattr(sc, "DEFAULT_SCORINGS", {"cca": {"name": "isoftmax", "param": 3}}, raising=False)
    assert Q.method_default_scoring("cca")[:2] == ("isoftmax", 3.0)
    monkeypatch.delattr(sc, "DEFAULT_SCORINGS")
    monkeypatch.setattr(sc, "default_scoring_of", lambda m: "dsoftmax" if m == "bitr" else "plain", raising=False)
    assert Q.method_default_scoring("bitr")[:2] == ("dsoftmax", None)


def test_seed_averaged_interval_matches_one_run_and_averages_hits_per_query() -> None:
    from crossview.eval.bootstrap import bootstrap_ci

    rng = np.random.default_rng(3)
    caps = np.repeat(np.arange(30), 2)
    r = {"i2t": rng.integers(1, 40, 30), "t2i": rng.integers(1, 30, 60)}
    lo, hi = bootstrap_ci(r["i2t"], r["t2i"], caps)["rsum"]
    assert Q.ci_cell(r, caps) == f"{lo:.1f}-{hi:.1f}"
    same = {d: np.stack([r[d], r[d]]) for d in r}              # two identical seeds: the one run's interval
    assert Q.ci_cell(same, caps) == f"{lo:.1f}-{hi:.1f}"
    other = {d: np.stack([r[d], np.ones_like(r[d])]) for d in r}   # a perfect second seed: half-hits count
    lo2, hi2 = map(float, Q.ci_cell(other, caps).split("-"))
    assert lo2 > lo and hi2 <= 600.0


def test_a_run_trained_before_a_default_moved_is_refused_not_reported_as_the_defaults(work) -> None:
    """A kept work folder whose run was trained at other parameters than today's defaults (e.g. before a default
    moved) is refused in one line naming the parameter, both values and what to do; the folder is left alone."""
    import json

    from crossview.methods import method_class

    _train(work, "cca")
    run_dir = work[0] / "cca"
    cfg = json.loads((run_dir / "config.json").read_text())
    today = method_class("cca").default_params()["reg"]
    cfg["params"]["reg"] = today + 1.5
    (run_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SystemExit) as e:
        _train(work, "cca")
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and str(run_dir) in msg
    assert f"reg={today + 1.5} (today's default {today})" in msg and "delete that folder" in msg
    assert (run_dir / "summary.json").is_file()
    cfg["params"]["reg"] = today
    (run_dir / "config.json").write_text(json.dumps(cfg))
    assert _train(work, "cca")["_state"] == "finished"        # as it was: read back


def test_a_difference_cell_can_say_what_the_comparison_could_detect() -> None:
    """quality_flickr8k.md's differences name their minimal detectable effect (a non-significant difference below it
    says little); the other benches' cells are unchanged."""
    from crossview.eval.paired import paired_effect

    rng = np.random.default_rng(0)
    n = 60
    caps = np.repeat(np.arange(n), 5)
    a = {"i2t": rng.integers(1, 20, n), "t2i": rng.integers(1, 20, 5 * n)}
    b = {"i2t": np.maximum(a["i2t"] - rng.integers(0, 3, n), 1), "t2i": a["t2i"]}
    eff = paired_effect(a, b, caps, seed=0)
    plain, with_mde = Q.diff_cell(eff), Q.diff_cell(eff, mde=True)
    assert plain.endswith(")") and "detectable" not in plain
    assert with_mde == plain[:-1] + f"; detectable {eff['mde']['rsum']:.1f})"
    assert eff["mde"]["rsum"] > 0


def test_caption_features_are_compared_on_the_same_folds_under_plain_and_the_default_scoring(work, tmp_path) -> None:
    """bench/text_encoder_cv.py: each encoder's run and CV fold runs, the second minus the first paired on the same
    held-out photos, under plain scores and the method's default scoring (its fixed parameter)."""
    import text_encoder_cv as T

    _, data = work
    rows = T.compare("cca", ["bow", "tfidf"], str(data), tmp_path / "w")
    default, param, _ = Q.method_default_scoring("cca")
    assert [(r["scoring"], r["param"], r["default"]) for r in rows] == [("plain", None, False), (default, param, True)]
    for r in rows:
        a, caps = Q.cv_ranks(tmp_path / "w" / "cca-bow", r["scoring"], r["param"])
        b, _ = Q.cv_ranks(tmp_path / "w" / "cca-tfidf", r["scoring"], r["param"])
        assert r["cv"] == (Q.rsum(a), Q.rsum(b)) and caps.shape == (120,)
        assert r["cv_eff"]["rsum"]["diff"] == pytest.approx(r["cv"][1] - r["cv"][0], abs=1e-6)
        assert r["val_eff"]["rsum"]["diff"] == pytest.approx(r["val"][1] - r["val"][0], abs=1e-6)
        assert r["cv_eff"]["mde"]["rsum"] > 0
    with pytest.raises(SystemExit, match="cca-bow: trained with text encoder tfidf, not bow; give another --work"):
        (tmp_path / "w" / "cca-bow").rename(tmp_path / "w" / "cca-tfidf2")
        (tmp_path / "w" / "cca-tfidf").rename(tmp_path / "w" / "cca-bow")
        (tmp_path / "w" / "cca-tfidf2").rename(tmp_path / "w" / "cca-tfidf")
        T.compare("cca", ["bow", "tfidf"], str(data), tmp_path / "w")
    assert T.main(["--data", str(data), "--text-encoders", "bow,bow", "--out", str(tmp_path / "x.md")]) == 2
    assert not (tmp_path / "x.md").exists()
