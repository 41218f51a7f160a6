"""Each method's default scoring (crossview.engine.scoring.DEFAULT_SCORINGS) through the product: a CCA run trained
with no flags is evaluated under CCA's default scoring and parameter (its summary, ranks.npz, the printed report) with the plain numbers kept;
``crossview eval`` / ``crossview query`` default to the run's scoring and ``--scoring plain`` overrides; an old run
without the field is plain; the gallery cache's fast path scores as the full path does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from _engine_helpers import make_toy_dataset, write_toy_precomp
from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.engine.scoring import DEFAULT_SCORINGS
from crossview.eval.scoring import PARAMS

#: CCA's default scoring and its parameter, which the toy runs below are trained with
CCA_SCORING, CCA_PARAM = DEFAULT_SCORINGS["cca"]
#: how the lines name it (``isoftmax beta=10``)
CCA_DESC = f"{CCA_SCORING} {PARAMS[CCA_SCORING]}={CCA_PARAM:g}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A CCA run with no scoring flag (its default scoring) and one with --scoring plain, same data."""
    base = tmp_path_factory.mktemp("default_scoring")
    data = base / "toy_precomp"
    write_toy_precomp(data, make_toy_dataset(80), (("train", "train"), ("dev", "val"), ("test", "test")))
    out = {"data": data}
    for name, extra in (("cca", []), ("plain", ["--scoring", "plain"])):
        out[name] = base / f"run_{name}"
        argv = ["train", "cca", "--data", str(data), "--run-dir", str(out[name]), "--text-encoder", "bow",
                "--device", "cpu", "--set", "n_components=6", *extra]
        assert main(argv) == 0
    return out


def _json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_table_entries_resolve_to_records() -> None:
    from crossview.engine.scoring import DEFAULT_EVIDENCE, DEFAULT_SCORINGS, default_scoring, resolve_run_scoring

    from crossview.eval.scoring import PARAMS
    assert CCA_SCORING != "plain" and PARAMS[CCA_SCORING] is not None
    seven = {"cca", "bitr", "wsabie", "vsepp", "smoothap", "webly", "timam"}
    assert seven <= set(DEFAULT_SCORINGS)           # each of the seven methods has measured its own
    root = Path(__file__).parents[1]
    for m, (name, k) in DEFAULT_SCORINGS.items():
        assert root.joinpath(DEFAULT_EVIDENCE[m]).is_file()
        if m != "fused":      # the method's card says the same
            assert f"Default scoring: {name} with {PARAMS[name]} = {k:g}" in (root / "models" / f"{m}.toml").read_text()
    rec = default_scoring("bitr")
    assert (rec["scoring"], rec["param"], rec["default"]) == (*DEFAULT_SCORINGS["bitr"], True)
    assert "bench/results/quality_flickr8k.md" in rec["selected_on"]
    assert default_scoring("wknn")["scoring"] == "plain" and default_scoring("fused")["scoring"] == "csls"
    assert resolve_run_scoring("cca", None)["scoring"] == "plain"
    assert resolve_run_scoring("cca", "default", 5)["param"] == 5
    assert resolve_run_scoring("cca", "isoftmax")["param"] is None          # chosen after training
    with pytest.raises(CrossViewError, match="default scoring is plain"):
        resolve_run_scoring("wknn", "default", 3)
    with pytest.raises(CrossViewError, match="whole number"):
        resolve_run_scoring("cca", "csls", 2.5)


def test_default_run_is_scored_by_its_default_and_equals_eval_with_param(runs, tmp_path, capsys) -> None:
    s = json.loads((runs["cca"] / "summary.json").read_text())
    cfg = json.loads((runs["cca"] / "config.json").read_text())
    assert (s["scoring"]["scoring"], s["scoring"]["param"], s["scoring"]["bank"]) == (CCA_SCORING, CCA_PARAM, "train")
    assert s["scoring"]["selected_on"].startswith("method default")
    assert (cfg["scoring"]["scoring"], cfg["scoring"]["param"]) == (CCA_SCORING, CCA_PARAM)
    # the plain numbers are kept, and equal a plain run's
    plain = json.loads((runs["plain"] / "summary.json").read_text())
    assert plain.get("scoring", {}).get("scoring", "plain") == "plain" and "metrics_plain" not in plain
    assert s["metrics_plain"]["rsum"] == pytest.approx(plain["rsum"])
    given = _json(capsys, ["eval", str(runs["cca"]), "--scoring", CCA_SCORING, "--param", f"{CCA_PARAM:g}", "--json",
                           "--ranks-out", str(tmp_path / "ranks.npz")])
    assert given["rsum"] == pytest.approx(s["rsum"])
    assert given["i2t"]["R@1"] == pytest.approx(s["i2t"]["R@1"])
    # ranks.npz (what Inspect reads) under the run's scoring, the plain ranks beside
    with np.load(runs["cca"] / "ranks.npz") as z, np.load(tmp_path / "ranks.npz") as want, \
            np.load(runs["plain"] / "ranks.npz") as flat:
        for d in ("i2t", "t2i"):
            np.testing.assert_array_equal(z[d], want[d])
            np.testing.assert_array_equal(z[f"{d}_plain"], flat[d])


def test_eval_defaults_to_the_runs_scoring_and_plain_overrides(runs, capsys) -> None:
    s = json.loads((runs["cca"] / "summary.json").read_text())
    own = _json(capsys, ["eval", str(runs["cca"]), "--json"])
    assert own["rsum"] == pytest.approx(s["rsum"]) and own["scoring"]["default"] is True
    assert own["scoring"]["param"] == CCA_PARAM
    flat = _json(capsys, ["eval", str(runs["cca"]), "--scoring", "plain", "--json"])
    assert flat["rsum"] == pytest.approx(s["metrics_plain"]["rsum"])
    capsys.readouterr()
    assert main(["eval", str(runs["cca"])]) == 0
    assert (f"scored with {CCA_DESC} (method default (3-fold CV on the Flickr8k sample's train photos"
            in capsys.readouterr().out)
    # the plain run stays plain
    res = _json(capsys, ["eval", str(runs["plain"]), "--json"])
    assert res.get("scoring", {"scoring": "plain"})["scoring"] == "plain"
    assert res["rsum"] == pytest.approx(s["metrics_plain"]["rsum"])


def test_old_run_without_the_field_is_plain(runs, tmp_path, capsys) -> None:
    from crossview.engine.scoring import run_scoring

    old = tmp_path / "old"
    shutil.copytree(runs["cca"], old)
    cfg = json.loads((old / "config.json").read_text())
    del cfg["scoring"]
    (old / "config.json").write_text(json.dumps(cfg))
    assert run_scoring(cfg)["scoring"] == "plain" and run_scoring(None)["scoring"] == "plain"
    res = _json(capsys, ["eval", str(old), "--json"])
    assert res.get("scoring", {"scoring": "plain"})["scoring"] == "plain"
    assert res["rsum"] == pytest.approx(json.loads((runs["cca"] / "summary.json").read_text())["metrics_plain"]["rsum"])
    q = _json(capsys, ["query", str(old), "--text", "class3 shape3", "--k", "3", "--json"])
    assert q["scoring"]["scoring"] == "plain"


def test_query_defaults_to_the_runs_scoring_and_the_fast_path_agrees(runs, tmp_path, monkeypatch, capsys) -> None:
    from crossview.engine import run as run_mod
    from crossview.engine.gallery_cache import open_cached_retriever
    from crossview.engine.scoring import retriever_scoring, run_scoring
    from crossview.engine.session import open_run

    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["query", str(runs["cca"]), "--text", "class3 shape3 filler1", "--k", "16", "--json"]
    slow = _json(capsys, argv)            # the full path, which fills the gallery cache
    assert (slow["scoring"]["scoring"], slow["scoring"]["param"]) == (CCA_SCORING, CCA_PARAM)
    plain = _json(capsys, argv + ["--scoring", "plain"])
    assert plain["scoring"]["scoring"] == "plain"
    assert [r["score"] for r in plain["results"]] != [r["score"] for r in slow["results"]]

    def refuse(*a, **k):
        raise AssertionError("the cached query must not load the dataset")

    monkeypatch.setattr(run_mod, "_load", refuse)
    import crossview.eval.scoring as scoring_mod

    monkeypatch.setattr(scoring_mod.Scorer, "prepare", refuse)   # the gallery's bank statistics come cached too
    fast = _json(capsys, argv)             # from the gallery cache and the run's bank file alone
    assert fast == slow
    # every gallery score equal, not only the top 16
    monkeypatch.undo()
    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    record = run_scoring(json.loads((runs["cca"] / "config.json").read_text()))
    from crossview.engine.gallery_cache import cache_scoring_stats

    _, cached = open_cached_retriever(runs["cca"], sides=("images",))
    cached.set_scoring(*retriever_scoring(cached, CCA_SCORING, run_dir=runs["cca"], choice=record))
    assert cache_scoring_stats(cached, runs["cca"], "test", ("t2i",)) is True
    full = open_run(runs["cca"]).retriever(scoring=CCA_SCORING, choice=record)
    a = cached.query_text("class5 shape5", cached.n_gallery_images)
    b = full.query_text("class5 shape5", full.n_gallery_images)
    assert a.items.tolist() == b.items.tolist()
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)


def test_train_prints_the_scoring_line(runs, tmp_path, capsys) -> None:
    capsys.readouterr()
    assert main(["train", "cca", "--data", str(runs["data"]), "--run-dir", str(tmp_path / "r"), "--text-encoder",
                 "bow", "--device", "cpu", "--set", "n_components=6", "--scoring", "csls", "--param", "3"]) == 0
    out = capsys.readouterr().out
    assert "scored with csls k=3 (given), bank: train; plain: rsum" in out
    assert main(["train", "cca", "--data", str(runs["data"]), "--scoring", "plain", "--select", "cv"]) != 0
    assert "--select cv: scoring 'plain' has no parameter to choose" in capsys.readouterr().err


def test_fused_run_has_a_scoring_field_and_one_table_entry_switches_it(runs, tmp_path, monkeypatch, capsys) -> None:
    """Fused from the members' plain embeddings; the fused run's own scoring is DEFAULT_SCORINGS["fused"] over
    the fused bank (plain without an entry), and its summary equals ``crossview eval FUSED --scoring csls --param K``."""
    from crossview.engine import scoring as scoring_mod
    from crossview.engine.fuse import fuse

    monkeypatch.delitem(scoring_mod.DEFAULT_SCORINGS, "fused")
    plain = fuse([runs["cca"], runs["plain"]], [0.5, 0.5], run_dir=tmp_path / "fused_plain")
    assert plain["scoring"]["scoring"] == "plain" and "metrics_plain" not in plain
    cfg = json.loads((tmp_path / "fused_plain" / "config.json").read_text())
    assert cfg["scoring"]["scoring"] == "plain"
    monkeypatch.setitem(scoring_mod.DEFAULT_SCORINGS, "fused", ("csls", 5))
    scored = fuse([runs["cca"], runs["plain"]], [0.5, 0.5], run_dir=tmp_path / "fused_csls")
    assert scored["scoring"]["scoring"] == "csls" and scored["scoring"]["param"] == 5
    assert scored["metrics_plain"]["rsum"] == pytest.approx(plain["rsum"])
    given = _json(capsys, ["eval", str(tmp_path / "fused_csls"), "--scoring", "csls", "--param", "5", "--json"])
    assert given["rsum"] == pytest.approx(scored["rsum"])
    assert _json(capsys, ["eval", str(tmp_path / "fused_csls"), "--json"])["rsum"] == pytest.approx(scored["rsum"])


def test_serve_ranks_by_the_runs_scoring_as_query_does(runs, tmp_path, monkeypatch, capsys) -> None:
    from crossview.commands.serve import QueryService

    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    service = QueryService(runs["cca"], k=5)
    health = service.health()["scoring"]
    assert (health["scoring"], health["param"]) == (CCA_SCORING, CCA_PARAM)
    doc = service.answer({"text": "class2 shape2 filler3", "k": 6})
    cli = _json(capsys, ["query", str(runs["cca"]), "--text", "class2 shape2 filler3", "--k", "6", "--json"])
    assert doc["results"] == cli["results"] and doc["scoring"] == cli["scoring"]


def test_compare_uses_each_runs_own_scoring_or_the_plain_ranks(runs, capsys) -> None:
    """The default run against the same CCA scored plain: B - A is plain - default under each run's own
    scoring, and exactly 0 on the plain ranks the default run keeps."""
    s = json.loads((runs["cca"] / "summary.json").read_text())
    own = _json(capsys, ["eval", str(runs["cca"]), "--compare", str(runs["plain"]), "--json"])
    assert own["rsum"]["a"] == pytest.approx(s["rsum"])
    assert own["rsum"]["b"] == pytest.approx(s["metrics_plain"]["rsum"])
    assert own["scoring"] == f"each run's own: {CCA_DESC}, plain"
    flat = _json(capsys, ["eval", str(runs["cca"]), "--compare", str(runs["plain"]), "--json", "--scoring", "plain"])
    assert flat["rsum"]["diff"] == 0 and flat["scoring"] == "plain"
    assert main(["eval", str(runs["cca"]), "--compare", str(runs["plain"]), "--scoring", "csls"]) == 2
    assert "does not apply to --compare" in capsys.readouterr().err

