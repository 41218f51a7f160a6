"""crossview tune: every trial an ordinary run scored on val, sorted, the best refitted; inputs checked
first; an interrupted search continues."""

from __future__ import annotations

import json

import pytest

from _engine_helpers import make_toy_dataset, write_toy_precomp
from crossview.cli import main
from crossview.core.events import Log
from crossview.engine.session import list_runs
from crossview.engine.tune import TuneResult, metric_value, tune
from crossview.core.errors import CrossViewError


def _run(gen):
    out = list(gen)
    assert isinstance(out[-1], TuneResult)
    return out[-1]


def test_every_point_is_a_run_scored_on_val_and_the_best_is_refit(tmp_path):
    ds = make_toy_dataset()
    grid = {"n_components": [2, 8], "image_norm": ["none", "l2"]}
    res = _run(tune("cca", ds, grid, out=tmp_path / "search", text_encoder="bow", cache=False))
    assert len(res.trials) == 4
    scores = [t["score"] for t in res.trials]
    assert scores == sorted(scores, reverse=True)
    for t in res.trials:
        summary = json.loads((tmp_path / "search" / f"trial-{t['trial']:03d}" / "summary.json").read_text())
        cfg = json.loads((tmp_path / "search" / f"trial-{t['trial']:03d}" / "config.json").read_text())
        assert summary["split"] == "val" and summary["rsum"] == pytest.approx(t["score"])
        assert cfg["params"]["n_components"] == t["point"]["n_components"]
        assert cfg["image_norm"] == t["point"]["image_norm"]
    # The refit follows the dataset's own rule: the toy data has a test split.
    assert res.refit["split"] == "test"
    best_cfg = json.loads((tmp_path / "search" / "best" / "config.json").read_text())
    assert best_cfg["params"]["n_components"] == res.best["point"]["n_components"]
    # The app's runs list sees the trials.
    assert len([p for p in list_runs(tmp_path) if p.parent.name == "search"]) == 5
    record = json.loads((tmp_path / "search" / "tune.json").read_text())
    assert record["best"]["trial"] == res.best["trial"] and len(record["results"]) == 4


def test_an_interrupted_search_continues_without_retraining_finished_trials(tmp_path, monkeypatch):
    ds = make_toy_dataset()
    grid = {"n_components": [2, 4, 8]}
    gen = tune("cca", ds, grid, out=tmp_path / "s", text_encoder="bow", cache=False, refit=False)
    for ev in gen:   # stop after the first trial is logged
        if isinstance(ev, Log) and ev.message.startswith("trial 1/3"):
            break
    gen.close()
    first = (tmp_path / "s" / "trial-001" / "summary.json").stat().st_mtime_ns
    res = _run(tune("cca", ds, grid, out=tmp_path / "s", text_encoder="bow", cache=False, refit=False))
    assert len(res.trials) == 3 and res.refit is None
    assert (tmp_path / "s" / "trial-001" / "summary.json").stat().st_mtime_ns == first


@pytest.mark.parametrize("grid, needle", [
    ({"regg": [1.0]}, "has no parameter 'regg'"),
    ({"reg": [-1.0]}, "reg"),
    ({"image_norm": ["cube"]}, "image_norm 'cube'"),
    ({}, "at least one --grid"),
])
def test_bad_grids_are_refused_before_any_work(tmp_path, grid, needle):
    with pytest.raises(CrossViewError, match=needle):
        list(tune("cca", make_toy_dataset(), grid, out=tmp_path / "s", text_encoder="bow", cache=False))
    assert not (tmp_path / "s").exists()


def test_metric_names():
    s = {"rsum": 300.0, "i2t": {"R@1": 20.0, "MedR": 4.0}, "t2i": {"R@1": 10.0}}
    assert metric_value(s, "rsum") == 300 and metric_value(s, "i2t.R@1") == 20 and metric_value(s, "i2t.MedR") == -4
    for bad in ("R@1", "x2y.R@1", "t2i.R@50"):
        with pytest.raises(CrossViewError):
            metric_value(s, bad)


def test_cli_refuses_a_bad_value_and_prints_the_sorted_table(tmp_path, capsys):
    code = main(["tune", "cca", "--data", "demo", "--grid", "reg=zz", "--out", str(tmp_path / "s")])
    assert code == 2 and "reg" in capsys.readouterr().err and not (tmp_path / "s").exists()

    write_toy_precomp(tmp_path / "toy_precomp", make_toy_dataset(n_images=120, caps_per_image=5),
                      (("train", "train"), ("dev", "val"), ("test", "test")))
    code = main(["tune", "cca", "--data", str(tmp_path / "toy_precomp"), "--text-encoder", "bow",
                 "--grid", "n_components=2,8", "--out", str(tmp_path / "s")])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0].split()[:3] == ["#", "n_components", "rsum"]
    rows = [ln.split() for ln in out[1:3]]
    assert float(rows[0][2]) >= float(rows[1][2]) and {rows[0][1], rows[1][1]} == {"2", "8"}
    assert out[3].startswith("best: trial") and "split test" in out[3]


def test_each_scored_trial_is_a_structured_event(tmp_path):
    """The app's trials table fills in from these (issue 11): one TrialFinished per trial, in order, with the
    point, the scores, the run folder and the best trial so far; it survives a metrics.jsonl round trip."""
    from crossview.core.events import TrialFinished, event_from_dict

    out = list(tune("cca", make_toy_dataset(), {"n_components": [2, 8]}, out=tmp_path / "s", text_encoder="bow",
                    cache=False, refit=False))
    trials = [ev for ev in out if isinstance(ev, TrialFinished)]
    res = out[-1]
    assert [t.trial for t in trials] == [1, 2] and all(t.total == 2 for t in trials)
    assert [t.point for t in trials] == [{"n_components": 2}, {"n_components": 8}]
    by_trial = {r["trial"]: r for r in res.trials}
    for t in trials:
        assert t.score == by_trial[t.trial]["score"] and t.rsum == by_trial[t.trial]["rsum"]
        assert t.i2t["R@1"] == by_trial[t.trial]["i2t"]["R@1"] and t.run_dir == by_trial[t.trial]["run_dir"]
    assert trials[-1].best_trial == res.best["trial"]
    assert event_from_dict(json.loads(json.dumps(trials[0].to_dict()))) == trials[0]


def test_parse_grid_types_values_by_the_card_and_splits_on_semicolons(tmp_path):
    from crossview.engine.tune import parse_grid

    assert parse_grid("cca", ["reg=0.3, 1", "image_norm=none,ssr"]) == {"reg": [0.3, 1.0],
                                                                        "image_norm": ["none", "ssr"]}
    assert parse_grid("bitr", ["c_grid=1,10;1e2,1e4"]) == {"c_grid": ["1,10", "1e2,1e4"]}
    for bad, needle in (("reg=1,-1", "minimum"), ("image_norm=cube", "'cube' is not one of"),
                        ("regg=1", "no parameter 'regg'"), ("reg", "NAME=V1,V2")):
        with pytest.raises(CrossViewError, match=needle):
            parse_grid("cca", [bad])


def test_a_search_stopped_in_its_first_trial_is_already_a_listed_search(tmp_path):
    """tune.json is written when the search starts, so a search stopped before any trial finished is listed
    (its trial folders in the runs list) and can be continued from the app."""
    from crossview.core.events import Progress

    gen = tune("cca", make_toy_dataset(), {"n_components": [2, 4]}, out=tmp_path / "s", text_encoder="bow",
               cache=False)
    for ev in gen:
        if isinstance(ev, Progress) and ev.message.startswith("trial 1/2"):
            break
    gen.close()
    record = json.loads((tmp_path / "s" / "tune.json").read_text())
    assert record["results"] == [] and record["grid"] == {"n_components": [2, 4]}
    assert tmp_path / "s" / "trial-001" in list_runs(tmp_path)
