"""Fused runs (crossview.engine.fuse, `crossview fuse`): the fused score against a naive numpy computation, the
weights chosen on training folds only, the fused run opened by the code paths of every run, and the CLI's
one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from _engine_helpers import make_toy_dataset, naive_ranks, write_toy_precomp
from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.eval.embeddings import load_embeddings, save_embeddings


def _train(data: Path, run_dir: Path, k: int) -> Path:
    assert main(["train", "cca", "--data", str(data), "--run-dir", str(run_dir), "--text-encoder", "bow",
                 "--device", "cpu", "--set", f"n_components={k}"]) == 0
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two cca runs (6 and 3 components) on one toy precomp folder (train 60 / val 20 / test 20 images), a third
    on another toy dataset, and their fusion."""
    base = tmp_path_factory.mktemp("fuse")
    data = base / "toy_precomp"
    write_toy_precomp(data, make_toy_dataset(100), (("train", "train"), ("dev", "val"), ("test", "test")))
    other = base / "other_precomp"
    write_toy_precomp(other, make_toy_dataset(100, seed=1), (("train", "train"), ("dev", "val"), ("test", "test")))
    out = {"data": data, "a": _train(data, base / "a", 6), "b": _train(data, base / "b", 3),
           "other": _train(other, base / "other", 3)}
    assert main(["fuse", str(out["a"]), str(out["b"]), "--run-dir", str(base / "fused")]) == 0
    out["fused"] = base / "fused"
    out["base"] = base
    return out



def test_the_fused_score_is_the_weighted_sum_of_train_standardised_scores(runs) -> None:
    summary = json.loads((runs["fused"] / "summary.json").read_text())
    rows = summary["fusion"]["members"]
    assert [r["name"] for r in rows] == ["a", "b"]
    w = np.array([r["weight"] for r in rows])
    assert w.min() >= 0 and abs(w.sum() - 1) < 1e-9
    fused = np.zeros((20, 40))
    for row, name in zip(rows, ("a", "b")):
        bank = load_embeddings(runs[name] / "bank_train.npz")
        s_bank = np.asarray(bank.image, np.float64) @ np.asarray(bank.text, np.float64).T     # naive, all at once
        mu, sd = s_bank.mean(), s_bank.std()
        assert row["mean"]["i2t"] == pytest.approx(mu, rel=1e-6, abs=1e-9)
        assert row["sd"]["i2t"] == pytest.approx(sd, rel=1e-6)
        test = load_embeddings(runs[name] / "embeddings_test.npz")
        fused += row["weight"] * (np.asarray(test.image, np.float64) @ np.asarray(test.text, np.float64).T - mu) / sd
    ci = load_embeddings(runs["a"] / "embeddings_test.npz").caption_image
    i2t, t2i = naive_ranks(fused, ci)
    # the fused run is then scored by its own default scoring (DEFAULT_SCORINGS["fused"]); its plain ranks are kept
    with np.load(runs["fused"] / "ranks.npz") as z:
        np.testing.assert_array_equal(z["i2t_plain"], i2t)
        np.testing.assert_array_equal(z["t2i_plain"], t2i)
    # the fused run's embeddings are the same score as one dot product (the method contract)
    emb = load_embeddings(runs["fused"] / "embeddings_test.npz")
    s = np.asarray(emb.image, np.float64) @ np.asarray(emb.text, np.float64).T
    np.testing.assert_array_equal(np.argsort(-s, axis=1, kind="stable")[:, :5],
                                  np.argsort(-fused, axis=1, kind="stable")[:, :5])
    from crossview.eval.metrics import rank_metrics, rsum_of
    assert summary["metrics_plain"]["rsum"] == pytest.approx(rsum_of(rank_metrics(i2t), rank_metrics(t2i)))


def test_fused_ranks_block_by_block_equal_one_block() -> None:
    from crossview.engine.fuse import fused_ranks
    from crossview.eval.embeddings import Embeddings

    rng = np.random.default_rng(0)
    ci = np.repeat(np.arange(30), 3)
    embs = [Embeddings(image=rng.normal(size=(30, d)), text=rng.normal(size=(90, d)), caption_image=ci)
            for d in (4, 7)]
    scales = {"i2t": [0.3, 1.2], "t2i": [0.3, 1.2]}
    whole = fused_ranks(embs, scales, block_size=1000)
    for block in (1, 7, 29):
        part = fused_ranks(embs, scales, block_size=block)
        np.testing.assert_array_equal(part["i2t"], whole["i2t"])
        np.testing.assert_array_equal(part["t2i"], whole["t2i"])
    import crossview.engine.fuse as fuse_mod

    for elements in (50, 200):                # a wide gallery: blocks of fewer rows than block_size, same ranks
        fuse_mod.BLOCK_ELEMENTS, saved = elements, fuse_mod.BLOCK_ELEMENTS
        try:
            part = fused_ranks(embs, scales, block_size=1000)
        finally:
            fuse_mod.BLOCK_ELEMENTS = saved
        np.testing.assert_array_equal(part["i2t"], whole["i2t"])
        np.testing.assert_array_equal(part["t2i"], whole["t2i"])
    s = 0.3 * embs[0].image @ embs[0].text.T + 1.2 * embs[1].image @ embs[1].text.T
    i2t, t2i = naive_ranks(s, ci)
    np.testing.assert_array_equal(whole["i2t"], i2t)
    np.testing.assert_array_equal(whole["t2i"], t2i)


def test_the_weights_are_chosen_by_cross_validation_of_train_never_on_the_evaluation_split(runs, tmp_path,
                                                                                         monkeypatch) -> None:
    import crossview.engine.fuse as fuse_mod
    import crossview.engine.run as run_mod

    summary = json.loads((runs["fused"] / "summary.json").read_text())
    choice = summary["fusion"]["choice"]
    assert summary["selected_on"] == "train-cv3" and summary["reported_on"] == "test"
    assert summary["optimistic"] is False and choice["by"] == "rsum" and choice["fold_images"] == [20, 20, 20]
    assert len(choice["candidates"]) == 11 and choice["weights"] == summary["fusion"]["weights"]
    best = max(c["rsum"] for c in choice["candidates"])
    assert [c["rsum"] for c in choice["candidates"] if c["weights"] == choice["weights"]] == [best]
    assert len(list((runs["fused"] / "cv").iterdir())) == 6        # 2 runs x 3 folds, ordinary run folders
    # spy: every run the choice trains sees training images only, and scores training images only
    trained = []
    real = run_mod.train

    def spy(method, data, **kw):
        trained.append(kw)
        return real(method, data, **kw)

    monkeypatch.setattr(run_mod, "train", spy)
    # the same members with their evaluation embeddings replaced by noise: the same choice, other metrics
    copies = []
    for name in ("a", "b"):
        dst = tmp_path / name
        shutil.copytree(runs[name], dst, ignore=shutil.ignore_patterns("writer.*"))
        emb = load_embeddings(dst / "embeddings_test.npz")
        rng = np.random.default_rng(len(copies))
        emb.image = rng.normal(size=emb.image.shape).astype(np.float32)
        emb.text = rng.normal(size=emb.text.shape).astype(np.float32)
        save_embeddings(dst / "embeddings_test.npz", emb)
        copies.append(dst)
    noisy = fuse_mod.fuse(copies, "auto", run_dir=tmp_path / "fused")
    assert noisy["fusion"]["choice"]["candidates"] == choice["candidates"]
    assert noisy["fusion"]["weights"] == summary["fusion"]["weights"]
    assert noisy["rsum"] != summary["rsum"]
    train_images = set(range(60))          # the toy precomp's train split: images 0-59; val 60-79, test 80-99
    assert len(trained) == 6
    for kw in trained:
        assert kw["train_split"] == "cv-train" and kw["split"] == "cv-test"
        d = kw["derived_splits"]
        assert set(d["cv-train"]) | set(d["cv-test"]) == train_images and not set(d["cv-train"]) & set(d["cv-test"])


def test_bank_weights_are_chosen_on_folds_of_the_training_banks(runs, tmp_path, monkeypatch) -> None:
    import crossview.engine.fuse as fuse_mod

    seen = []
    real = fuse_mod.iter_choose_weights

    def spy(fold_sets, *a, **k):
        seen.append(fold_sets)
        return (yield from real(fold_sets, *a, **k))

    monkeypatch.setattr(fuse_mod, "iter_choose_weights", spy)
    s = fuse_mod.fuse([runs["a"], runs["b"]], "bank", run_dir=tmp_path / "bank")
    assert s["selected_on"] == "train (3 folds of its bank)" and "in-sample" in s["fusion"]["choice"]["how"]
    assert not (tmp_path / "bank" / "cv").exists()
    (sets,) = seen
    for name, k in (("a", 0), ("b", 1)):
        bank = load_embeddings(runs[name] / "bank_train.npz")
        rows = {r.tobytes() for r in np.asarray(bank.image)}
        got = np.vstack([embs[k].image for embs, _ in sets])
        assert got.shape[0] == bank.image.shape[0] and all(r.tobytes() in rows for r in got)


def test_given_weights_are_recorded_as_given(runs, tmp_path) -> None:
    from crossview.engine.fuse import fuse

    s = fuse([runs["a"], runs["b"]], "3,1", run_dir=tmp_path / "given")
    assert s["fusion"]["weights"] == [0.75, 0.25]
    assert s["selected_on"] == "nothing" and s["fusion"]["choice"]["by"] == "given"
    only_a = fuse([runs["a"], runs["b"]], "1,0", run_dir=tmp_path / "only_a")
    a = json.loads((runs["a"] / "summary.json").read_text())
    # what is fused is each member's plain embedding (its own default scoring is not part of it), and the fused run
    # then has its own scoring: one member alone is that member's plain numbers before it
    from crossview.engine.scoring import DEFAULT_SCORINGS

    assert a["scoring"]["scoring"] == DEFAULT_SCORINGS["cca"][0]
    assert (only_a["scoring"]["scoring"], only_a["scoring"]["param"]) == DEFAULT_SCORINGS["fused"]
    assert only_a["metrics_plain"]["rsum"] == pytest.approx(a["metrics_plain"]["rsum"])


def test_a_fused_run_opens_like_any_run(runs) -> None:
    from crossview.engine.results import load_run_results
    from crossview.engine.runs import describe_run
    from crossview.engine.scoring import evaluate_run
    from crossview.engine.session import open_run

    from crossview.engine.scoring import use_run_scoring

    run = open_run(runs["fused"])
    assert run.eval_split == "test" and run.summary["method"] == "fused"
    r = run.retriever()
    assert use_run_scoring(r, runs["fused"])["scoring"] == "csls"      # ranked as its summary is (the app, query)
    with np.load(runs["fused"] / "ranks.npz") as z:
        i2t, t2i = z["i2t"], z["t2i"]
    for pos in (0, 7, 19):
        ranking = r.query_image(int(r.gallery_images[pos]), k=5)
        assert ranking.best_gold_rank == i2t[pos]
    for pos in (0, 13, 39):
        ranking = r.query_text(int(r.gallery_captions[pos]), k=5)
        assert ranking.best_gold_rank == t2i[pos]
    assert len(r.query_text("class1 shape1 filler2", k=3).items) == 3
    res = load_run_results(runs["fused"])
    assert res.method == "fused" and res.ranks["i2t"].shape == (20,) and res.ranks["t2i"].shape == (40,)
    assert describe_run(runs["fused"]).status == "finished"
    plain = evaluate_run(runs["fused"], "plain", record=False)
    assert plain["rsum"] == pytest.approx(res.summary["metrics_plain"]["rsum"])
    scored = evaluate_run(runs["fused"], "csls", record=False)   # the fused run's own training bank
    assert scored["scoring"]["selected_on"] == "train (hold-out)"
    # hubness-aware scoring in the retriever too
    r2 = run.retriever(scoring="csls")
    assert r2.scoring == "csls"


def test_an_interrupted_fusion_resumes(runs, tmp_path) -> None:
    from crossview.engine.run import resume
    from crossview.engine.runs import drain

    folder = tmp_path / "f"
    shutil.copytree(runs["fused"], folder, ignore=shutil.ignore_patterns("writer.*"))
    (folder / "summary.json").unlink()
    (folder / "status.json").write_text(json.dumps({"status": "running", "phase": "fuse"}))
    summary = drain(resume(folder), "fusion")
    assert summary["rsum"] == pytest.approx(json.loads((runs["fused"] / "summary.json").read_text())["rsum"])
    assert json.loads((folder / "status.json").read_text())["status"] == "finished"


@pytest.mark.parametrize("how", ["missing", "other_dataset", "count", "negative", "one", "zeros", "words",
                                 "not_finished", "same_twice", "existing", "fused_member", "no_checkpoint"])
def test_fuse_bad_input_is_one_line(runs, how, capsys, tmp_path) -> None:
    a, b = str(runs["a"]), str(runs["b"])
    no_model = tmp_path / "no-model"                # finished, its checkpoint gone: fused, it could answer nothing
    shutil.copytree(runs["b"], no_model, ignore=shutil.ignore_patterns("writer.*"))
    (no_model / "checkpoint.pt").unlink()
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.json").write_text(json.dumps({"method": "cca"}))
    argv = {"missing": [a, str(tmp_path / "nope")], "other_dataset": [a, str(runs["other"])],
            "count": [a, b, "--weights", "0.5,0.3,0.2"], "negative": [a, b, "--weights", "1,-0.5"],
            "one": [a], "zeros": [a, b, "--weights", "0,0"], "words": [a, b, "--weights", "cca"],
            "not_finished": [a, str(unfinished)], "same_twice": [a, a],
            "existing": [a, b, "--run-dir", str(runs["fused"])], "fused_member": [str(runs["fused"]), b],
            "no_checkpoint": [a, str(no_model)]}[how]
    assert main(["fuse", "--run-dir", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("crossview: error: ") and "\n" not in err and "Traceback" not in err
    word = {"missing": "no such run folder", "other_dataset": "not on the same dataset", "count": "3 weight(s) for 2",
            "negative": "negative", "one": "at least two", "zeros": "all weights are 0", "words": "one number per run",
            "not_finished": "has not finished", "same_twice": "given twice",
            "existing": "holds a run already", "fused_member": "is a fused run, which cannot be trained again",
            "no_checkpoint": "has no checkpoint.pt (its model)"}[how]
    assert word in err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_fuse_help_and_output(runs, capsys, tmp_path) -> None:
    with pytest.raises(SystemExit):
        main(["fuse", "--help"])
    assert "--weights" in capsys.readouterr().out
    assert main(["fuse", str(runs["a"]), str(runs["b"]), "--weights", "auto", "--run-dir", str(tmp_path / "f")]) == 0
    out = capsys.readouterr().out
    assert "chosen by rsum on train-cv3 (3-fold cross-validation" in out and "reported on test" in out


def test_a_fused_run_has_no_model_of_its_own(runs) -> None:
    from crossview.engine.runs import load_fitted

    with pytest.raises(CrossViewError, match="fused run has no model"):
        load_fitted(runs["fused"])


def test_explaining_a_fused_run_says_in_one_line_to_explain_a_member(runs, capsys) -> None:
    from crossview.engine.session import open_run
    from crossview.explain.maps import Explainer

    with pytest.raises(CrossViewError, match=r"explain one of its members \(a, b\)"):
        Explainer(open_run(runs["fused"]))
    assert main(["explain", str(runs["fused"]), "--image", "80", "--caption", "160"]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]       # (above it: the members' features being loaded)
    assert last.startswith("crossview: error: ") and "explain one of its members" in last


def test_a_stopped_fusion_continues_its_cross_validation_runs(runs, tmp_path) -> None:
    from crossview.core.events import Progress
    from crossview.engine.fuse import iter_fuse

    folder = tmp_path / "stopped"
    gen = iter_fuse([runs["a"], runs["b"]], "auto", run_dir=folder)
    for ev in gen:
        if isinstance(ev, Progress) and ev.stage == "cv" and ev.step == 2:
            break
    gen.close()                                              # as the app's Cancel or Ctrl-C does
    assert json.loads((folder / "status.json").read_text())["status"] == "cancelled"
    assert not (folder / "summary.json").exists()
    done = sorted(p.name for p in (folder / "cv").iterdir() if (p / "summary.json").is_file())
    assert done == ["1-a-f1", "1-a-f2"]
    mtimes = {p: (folder / "cv" / p / "summary.json").stat().st_mtime_ns for p in done}
    assert main(["fuse", "--resume", str(folder)]) == 0
    summary = json.loads((folder / "summary.json").read_text())
    want = json.loads((runs["fused"] / "summary.json").read_text())
    assert summary["fusion"]["weights"] == want["fusion"]["weights"] and summary["rsum"] == want["rsum"]
    assert {p: (folder / "cv" / p / "summary.json").stat().st_mtime_ns for p in done} == mtimes   # read back


def test_a_stop_asked_while_the_weights_are_chosen_cancels_the_fusion(runs, tmp_path) -> None:
    """The weights' search reports each candidate as a ``weights`` stage's progress and asks ``should_stop`` after
    each: a stop there ends the fusion as cancelled, with no summary."""
    from crossview.core.errors import Cancelled
    from crossview.core.events import Progress
    from crossview.engine.fuse import iter_fuse

    folder = tmp_path / "stopped_weights"
    seen: list[Progress] = []
    gen = iter_fuse([runs["a"], runs["b"]], "bank", run_dir=folder,
                    should_stop=lambda: any(p.stage == "weights" and p.step >= 1 for p in seen))
    with pytest.raises(Cancelled, match="fusion cancelled"):
        for ev in gen:
            if isinstance(ev, Progress):
                seen.append(ev)
    weights = [p for p in seen if p.stage == "weights"]
    assert weights and weights[-1].step == 1 and weights[-1].total > 1, "stopped after the first candidate's report"
    assert weights[-1].message == "choosing weights on train folds"
    assert json.loads((folder / "status.json").read_text())["status"] == "cancelled"
    assert not (folder / "summary.json").exists()


def test_a_fused_run_can_be_fused_again_with_bank_weights_and_opened(runs, tmp_path) -> None:
    from crossview.engine.fuse import fuse
    from crossview.engine.session import open_run

    s = fuse([runs["fused"], runs["b"]], "bank", run_dir=tmp_path / "nested")
    r = open_run(tmp_path / "nested").retriever()
    with np.load(tmp_path / "nested" / "ranks.npz") as z:
        assert r.query_image(int(r.gallery_images[3]), k=3).best_gold_rank == z["i2t"][3]
    assert s["fusion"]["members"][0]["method"] == "fused"


def test_renaming_or_deleting_a_member_says_which_fused_runs_it_breaks(runs, tmp_path, capsys) -> None:
    """A fused run encodes queries through its members' models: renamed or deleted, a member broke it silently."""
    from crossview.engine.runs import fused_runs_using

    for name in ("a", "b"):
        shutil.copytree(runs[name], tmp_path / name, ignore=shutil.ignore_patterns("writer.*"))
    assert main(["fuse", str(tmp_path / "a"), str(tmp_path / "b"), "--run-dir", str(tmp_path / "fused")]) == 0
    assert fused_runs_using(tmp_path / "a") == [tmp_path / "fused"] and fused_runs_using(tmp_path / "fused") == []
    assert fused_runs_using(runs["other"]) == []
    capsys.readouterr()
    assert main(["runs", "rename", str(tmp_path / "a"), "a2"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: fused run {tmp_path / 'fused'} lists it as a member"), err
    assert main(["runs", "delete", str(tmp_path / "b")]) == 2          # no terminal, no --yes: refused, says why
    err = capsys.readouterr().err
    assert "use it as a member and could no longer answer queries" in err and (tmp_path / "b").is_dir()
    assert main(["runs", "delete", str(tmp_path / "b"), "--yes"]) == 0
    assert "used it as a member; it cannot answer queries any more" in capsys.readouterr().err
