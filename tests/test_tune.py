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
from crossview.engine.scoring import DEFAULT_SCORINGS
from crossview.eval.scoring import PARAMS

#: how a line names CCA's default scoring (``csls k=5``, ``isoftmax beta=10``)
CCA_DEFAULT = "{} {}={:g}".format(DEFAULT_SCORINGS["cca"][0], PARAMS[DEFAULT_SCORINGS["cca"][0]],
                                  DEFAULT_SCORINGS["cca"][1])


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
    assert out[0] == "# chosen on val, reported once on test"
    assert out[1] == f"# every trial and the refit scored with {CCA_DEFAULT} (method default)"   # as crossview train's
    assert out[2].split()[:3] == ["#", "n_components", "rsum"]
    rows = [ln.split() for ln in out[3:5]]
    assert float(rows[0][2]) >= float(rows[1][2]) and {rows[0][1], rows[1][1]} == {"2", "8"}
    assert out[5].startswith("best: trial") and "split test" in out[5] and "chosen on val" in out[5]


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


# ---------------------------------------------------------------- selection never on the reported split (issue 28)
def _without(ds, *names):
    """``ds`` with the splits ``names`` dropped (a dataset with no test split, like the Flickr8k sample)."""
    import copy

    out = copy.copy(ds)
    out.splits = {k: v for k, v in ds.splits.items() if k not in names}
    return out


def test_without_a_test_split_the_trials_are_chosen_by_cross_validation_of_train_and_reported_on_val(tmp_path):
    import numpy as np

    ds = _without(make_toy_dataset(), "test")
    res = _run(tune("cca", ds, {"n_components": [2, 8]}, out=tmp_path / "s", text_encoder="bow", cache=False))
    record = json.loads((tmp_path / "s" / "tune.json").read_text())
    assert record["selected_on"] == "train-cv3" and record["reported_on"] == "val" and not record["optimistic"]
    train, val = set(ds.splits["train"].tolist()), set(ds.splits["val"].tolist())
    for t in res.trials:
        tested: list[int] = []
        rsums = []
        for f in (1, 2, 3):
            folder = tmp_path / "s" / f"trial-{t['trial']:03d}-f{f}"
            cfg = json.loads((folder / "config.json").read_text())
            summary = json.loads((folder / "summary.json").read_text())
            fold_train, fold_test = (set(cfg["derived_splits"][k]) for k in ("cv-train", "cv-test"))
            assert summary["split"] == "cv-test" and cfg["train_split"] == "cv-train"
            assert fold_test <= train and fold_train <= train and not fold_train & fold_test
            assert not fold_test & val                # never a val image in choosing
            tested += sorted(fold_test)
            rsums.append(summary["rsum"])
        assert sorted(tested) == sorted(train)        # the folds partition the training images
        assert t["score"] == pytest.approx(np.mean(rsums)) and t["sd"] == pytest.approx(np.std(rsums))
        assert t["selected_on"] == "train-cv3" and t["run_dir"].endswith(f"trial-{t['trial']:03d}-f1")
    best = json.loads((tmp_path / "s" / "best" / "summary.json").read_text())
    assert best["split"] == "val" and best["reported_on"] == "val" and best["selected_on"] == "train-cv3"
    assert not best["optimistic"] and best["choices"][0]["by"] == "search"
    assert set(json.loads((tmp_path / "s" / "best" / "config.json").read_text())["derived_splits"] or {}) == set()
    # every fold is a run the app lists, and the refit
    assert len([p for p in list_runs(tmp_path) if p.parent.name == "s"]) == 2 * 3 + 1


def test_choosing_on_the_reported_split_needs_the_flag_and_every_output_then_says_optimistic(tmp_path):
    from crossview.engine.tune import OPTIMISTIC, format_tune_table

    ds = _without(make_toy_dataset(), "test")
    with pytest.raises(CrossViewError, match="optimistic.*--optimistic"):
        list(tune("cca", ds, {"n_components": [2, 8]}, out=tmp_path / "s", select_on="val", text_encoder="bow",
                  cache=False))
    assert not (tmp_path / "s").exists()
    out = list(tune("cca", ds, {"n_components": [2, 8]}, out=tmp_path / "s", select_on="val", optimistic=True,
                    text_encoder="bow", cache=False))
    res = out[-1]
    warnings = [ev.message for ev in out if isinstance(ev, Log) and ev.level == "warning"]
    assert any(OPTIMISTIC in w for w in warnings)
    assert OPTIMISTIC in format_tune_table(res) and "OPTIMISTIC" in format_tune_table(res).splitlines()[0]
    record = json.loads((tmp_path / "s" / "tune.json").read_text())
    assert record["optimistic"] and record["selected_on"] == record["reported_on"] == "val"
    best = json.loads((tmp_path / "s" / "best" / "summary.json").read_text())
    assert best["optimistic"] and best["selected_on"] == "val" == best["reported_on"]


def test_a_test_split_means_choosing_on_val_and_reporting_on_test(tmp_path):
    res = _run(tune("cca", make_toy_dataset(), {"n_components": [2, 8]}, out=tmp_path / "s", text_encoder="bow",
                    cache=False))
    assert res.selection["selected_on"] == "val" and res.selection["reported_on"] == "test"
    assert not (tmp_path / "s" / "trial-001-f1").exists()


def test_an_inner_holdout_scores_each_trial_once_on_training_images_only(tmp_path):
    ds = _without(make_toy_dataset(), "test")
    res = _run(tune("cca", ds, {"n_components": [2, 8]}, out=tmp_path / "s", select_on="holdout",
                    text_encoder="bow", cache=False, refit=False))
    assert res.selection["selected_on"] == "train-holdout20"
    cfg = json.loads((tmp_path / "s" / "trial-001" / "config.json").read_text())
    inner_train, inner_val = (set(cfg["derived_splits"][k]) for k in ("inner-train", "inner-val"))
    assert inner_train | inner_val == set(ds.splits["train"].tolist()) and not inner_train & inner_val
    assert len(inner_val) == round(0.2 * len(ds.splits["train"]))


def test_with_only_a_train_split_the_folds_leave_the_reported_heldout_images_alone(tmp_path):
    from crossview.engine.tune import plan_selection

    ds = _without(make_toy_dataset(), "test", "val")
    sel = plan_selection(ds, "auto", folds=4, seed=3)
    assert sel.reported_on == "heldout" and sel.selected_on == "train-cv4"
    from crossview.engine.splits import plan_splits
    held = set(plan_splits(ds, None, "train", "val", 3).derived["heldout"])
    for part in sel.parts:
        assert not held & (set(part.derived["cv-train"]) | set(part.derived["cv-test"]))
    with pytest.raises(CrossViewError, match="train"):
        plan_selection(ds, "train")
    with pytest.raises(CrossViewError, match="no split 'tset'"):
        plan_selection(ds, "tset")
    with pytest.raises(CrossViewError, match="folds"):
        plan_selection(ds, "cv", folds=1)


@pytest.fixture(scope="module")
def cli_search(tmp_path_factory) -> dict:
    """``crossview tune cca --json`` over n_components 2, 8 on a toy dataset with train and val only: the toy
    dataset, the search folder and the printed document."""
    import contextlib
    import io

    base = tmp_path_factory.mktemp("cli_search")
    write_toy_precomp(base / "toy", make_toy_dataset(n_images=120, caps_per_image=5),
                      (("train", "train"), ("dev", "val")))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["tune", "cca", "--data", str(base / "toy"), "--text-encoder", "bow",
                     "--grid", "n_components=2,8", "--out", str(base / "s"), "--json"])
    assert code == 0
    return {"toy": base / "toy", "folder": base / "s", "out": json.loads(printed.getvalue())}


def test_cli_prints_where_it_chose_and_where_it_reports(cli_search, tmp_path, capsys):
    out = cli_search["out"]
    assert out["selected_on"] == "train-cv3" and out["reported_on"] == "val"
    code = main(["tune", "cca", "--data", str(cli_search["toy"]), "--text-encoder", "bow",
                 "--grid", "n_components=2,8", "--out", str(tmp_path / "s2"), "--select-on", "val"])
    assert code == 2 and "--optimistic" in capsys.readouterr().err and not (tmp_path / "s2").exists()


def test_several_seeds_train_each_trial_and_the_refit_per_seed_and_average_first(tmp_path):
    """seeds=(0, 1): each fold of each trial is trained at both seeds (trial-NNN-fK-sS), the trial is scored by the
    mean over the seeds first, the refit is trained at both (best-sS) and reported as their mean; the same folder
    continues only with the same seeds."""
    import numpy as np

    ds = _without(make_toy_dataset(), "test")
    kw = dict(params={"max_epochs": 2, "dim": 8, "batch_size": 32}, out=tmp_path / "s", text_encoder="bow",
              cache=False, seeds=(0, 1, 1))
    res = _run(tune("wsabie", ds, {"lr": [0.01, 0.05]}, **kw))
    assert res.seeds == [0, 1] and len(res.refits) == 2
    differs = False
    for t in res.trials:
        per_fold = []
        for f in (1, 2, 3):
            rs = [json.loads((tmp_path / "s" / f"trial-{t['trial']:03d}-f{f}-s{s}" / "summary.json").read_text())
                  ["rsum"] for s in (0, 1)]
            cfgs = [json.loads((tmp_path / "s" / f"trial-{t['trial']:03d}-f{f}-s{s}" / "config.json").read_text())
                    for s in (0, 1)]
            assert [c["seed"] for c in cfgs] == [0, 1]
            differs |= rs[0] != rs[1]
            per_fold.append(np.mean(rs))
        assert t["score"] == pytest.approx(np.mean(per_fold)) and t["sd"] == pytest.approx(np.std(per_fold))
        assert len(t["runs"]) == 6 and [f["score"] for f in t["folds"]] == pytest.approx(per_fold)
    assert differs                                     # the seeds reached the runs
    best = [json.loads((tmp_path / "s" / f"best-s{s}" / "summary.json").read_text()) for s in (0, 1)]
    assert [b["split"] for b in best] == ["val", "val"]
    assert res.refit_rsum == pytest.approx(np.mean([b["rsum"] for b in best]))
    record = json.loads((tmp_path / "s" / "tune.json").read_text())
    assert record["seeds"] == [0, 1] and record["refit"]["rsum"] == pytest.approx(res.refit_rsum)
    from crossview.engine.tune import format_tune_table
    table = format_tune_table(res)
    assert "at seeds 0, 1: rsum" in table and "mean over the seeds first" in table
    stamp = (tmp_path / "s" / "trial-001-f1-s1" / "summary.json").stat().st_mtime_ns
    again = _run(tune("wsabie", ds, {"lr": [0.01, 0.05]}, **kw))        # read back, nothing trained again
    assert (tmp_path / "s" / "trial-001-f1-s1" / "summary.json").stat().st_mtime_ns == stamp
    assert again.refit_rsum == pytest.approx(res.refit_rsum)
    with pytest.raises(CrossViewError, match=r"holds a search at seeds \[0, 1\], not \[0\]"):
        list(tune("wsabie", ds, {"lr": [0.01, 0.05]}, **{**kw, "seeds": None}))


@pytest.mark.parametrize("value, needle", [("0,x", "'x' is not a whole number"), ("-3", "out of range")])
def test_cli_bad_seeds_are_one_line(tmp_path, capsys, value, needle):
    rc = main(["tune", "cca", "--data", "demo", "--grid", "reg=0.1,1", "--seeds", value, "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_the_command_line_ranks_trials_by_what_crossview_train_reports_and_its_refit_equals_such_a_run(cli_search,
                                                                                                      tmp_path,
                                                                                                      capsys):
    """A search from the command line scores every trial and the refit under the method's default scoring (CCA:
    its DEFAULT_SCORINGS entry), as ``crossview train`` does: the refit's rsum is the one a train run of the chosen point reports,
    and each trial's score is its runs' scored rsum, not the plain one kept beside it."""
    import numpy as np

    out, folder = cli_search["out"], cli_search["folder"]
    assert (out["scoring"]["scoring"], out["scoring"]["param"]) == DEFAULT_SCORINGS["cca"]
    for t in out["trials"]:
        folds = [json.loads((folder / f"trial-{t['trial']:03d}-f{f}" / "summary.json").read_text())
                 for f in (1, 2, 3)]
        assert all(x["scoring"]["scoring"] == DEFAULT_SCORINGS["cca"][0] for x in folds)
        assert t["score"] == pytest.approx(np.mean([x["rsum"] for x in folds]))
        assert t["score"] != pytest.approx(np.mean([x["metrics_plain"]["rsum"] for x in folds]))
    best = out["best"]["point"]["n_components"]
    code = main(["train", "cca", "--data", str(cli_search["toy"]), "--text-encoder", "bow", "--set",
                 f"n_components={best}", "--run", str(tmp_path / "r")])
    assert code == 0
    capsys.readouterr()
    train_run = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert out["refit_rsum"] == pytest.approx(train_run["rsum"]) and train_run["split"] == out["refit"]["split"]


def test_a_search_continues_only_under_its_own_scoring_and_an_old_record_is_plain(tmp_path, capsys):
    """The library's default is plain (the papers' experiments); a folder searched plain continues plain from the
    command line without --scoring (a record from before searches had a scoring reads as plain), and another scoring
    for the same folder is refused in one line that says how to continue it."""
    write_toy_precomp(tmp_path / "toy", make_toy_dataset(n_images=120, caps_per_image=5),
                      (("train", "train"), ("dev", "val")))
    folder = tmp_path / "s"
    gen = tune("cca", str(tmp_path / "toy"), {"n_components": [2, 8]}, out=folder, text_encoder="bow", cache=False)
    for ev in gen:   # stop after the first trial
        if isinstance(ev, Log) and ev.message.startswith("trial 1/2"):
            break
    gen.close()
    record = json.loads((folder / "tune.json").read_text())
    assert record.pop("scoring")["scoring"] == "plain"
    (folder / "tune.json").write_text(json.dumps(record))            # as a search recorded before scorings
    stamp = (folder / "trial-001-f1" / "summary.json").stat().st_mtime_ns
    args = ["tune", "cca", "--data", str(tmp_path / "toy"), "--text-encoder", "bow", "--grid", "n_components=2,8",
            "--out", str(folder)]
    assert main([*args, "--scoring", "default"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"holds a search scored with plain (dot product), not {CCA_DEFAULT}" in err[0], err
    assert "--scoring plain" in err[0]
    assert main([*args, "--scoring", "nearest"]) == 2                       # a bad name: one line, nothing run
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nearest" in err[0], err
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "# every trial and the refit scored with plain (dot product)" in out
    assert (folder / "trial-001-f1" / "summary.json").stat().st_mtime_ns == stamp     # read back, not retrained
    assert json.loads((folder / "best" / "config.json").read_text())["scoring"]["scoring"] == "plain"


def test_a_search_never_writes_into_a_file_or_a_folder_that_holds_something_else(tmp_path):
    """--out naming a file crashed (FileExistsError); naming a run folder put trials and tune.json inside the run."""
    ds = make_toy_dataset()
    run = tmp_path / "a-run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    with pytest.raises(CrossViewError, match=r"a-run exists and is not a search folder"):
        list(tune("cca", ds, {"n_components": [2]}, out=run, text_encoder="bow", cache=False))
    with pytest.raises(CrossViewError, match=r"config.json is a file, not a folder"):
        list(tune("cca", ds, {"n_components": [2]}, out=run / "config.json", text_encoder="bow", cache=False))
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert len(_run(tune("cca", ds, {"n_components": [2]}, out=empty, text_encoder="bow", cache=False,
                         refit=False)).trials) == 1
