"""A scoring's parameter chosen by cross-validation of the training images (``--select cv``,
crossview.engine.scoring.iter_select_cv over crossview.engine.cv_runs): the evaluation split is never read for the
choice, the fold runs are ordinary runs reused on the next call, the choice is the one a hand computation gives, and
bad options are one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from _engine_helpers import make_toy_dataset, naive_ranks, write_toy_precomp
from crossview.cli import main
from crossview.eval.embeddings import load_embeddings, save_embeddings


def _train(data: Path, run_dir: Path, k: int) -> Path:
    assert main(["train", "cca", "--data", str(data), "--run-dir", str(run_dir), "--text-encoder", "bow",
                 "--device", "cpu", "--set", f"n_components={k}"]) == 0
    return run_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished cca run on a toy precomp folder (train 60 / val 20 / test 20 images, 2 captions each), its csls
    parameter chosen by ``--select cv`` once."""
    base = tmp_path_factory.mktemp("scoring_cv")
    data = base / "toy_precomp"
    write_toy_precomp(data, make_toy_dataset(100), (("train", "train"), ("dev", "val"), ("test", "test")))
    run_dir = _train(data, base / "run_cca", 6)
    assert main(["eval", str(run_dir), "--scoring", "csls", "--select", "cv", "--json"]) == 0
    return run_dir


def _record(run_dir: Path, scoring: str = "csls") -> dict:
    return json.loads((run_dir / "scoring.json").read_text())["test"][scoring]


def _spy_train(monkeypatch) -> list[dict]:
    import crossview.engine.run as run_mod

    trained: list[dict] = []
    real = run_mod.train

    def spy(method, data, **kw):
        trained.append(kw)
        return real(method, data, **kw)

    monkeypatch.setattr(run_mod, "train", spy)
    return trained


def test_cv_trains_on_training_folds_only_and_ignores_the_evaluation_split(run, tmp_path, monkeypatch) -> None:
    rec = _record(run)
    assert rec["selected_on"] == "train-cv3" and rec["reported_on"] == "test" and rec["in_sample"] is False
    assert rec["fold_images"] == [20, 20, 20] and len(rec["folds"]) == 3
    assert [row["bank_images"] for row in rec["folds"]] == [40, 40, 40]
    assert [c["param"] for c in rec["candidates"]] == [1, 3, 5, 10, 20]
    assert all(len(row["rsum"]) == 5 for row in rec["folds"])
    assert sorted(p.name for p in (run / "scoring-cv").iterdir()) == ["f1", "f2", "f3"]
    # the same run with its evaluation embeddings replaced by noise (and no fold runs yet): every fold run trains
    # and scores training images only, and the choice is the same to the last digit; only the report changes
    copy = tmp_path / "noisy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("writer.*", "scoring-cv", "scoring.json"))
    emb = load_embeddings(copy / "embeddings_test.npz")
    rng = np.random.default_rng(0)
    emb.image = rng.normal(size=emb.image.shape).astype(np.float32)
    emb.text = rng.normal(size=emb.text.shape).astype(np.float32)
    save_embeddings(copy / "embeddings_test.npz", emb)
    trained = _spy_train(monkeypatch)
    from crossview.engine.scoring import evaluate_run

    noisy = evaluate_run(copy, "csls", select="cv")
    assert noisy["scoring"]["candidates"] == rec["candidates"] and noisy["scoring"]["param"] == rec["param"]
    assert noisy["scoring"]["folds"] == rec["folds"]
    assert noisy["rsum"] != rec["rsum"]
    train_images = set(range(60))          # the toy precomp's train split: images 0-59; val 60-79, test 80-99
    assert len(trained) == 3
    tests = set()
    for kw in trained:
        assert kw["train_split"] == "cv-train" and kw["split"] == "cv-test"
        d = kw["derived_splits"]
        assert set(d["cv-train"]) | set(d["cv-test"]) == train_images and not set(d["cv-train"]) & set(d["cv-test"])
        tests |= set(d["cv-test"])
    assert tests == train_images


def test_the_fold_runs_are_reused_by_the_next_call_and_every_scoring(run, monkeypatch, capsys) -> None:
    stamps = {p.name: (p / "summary.json").stat().st_mtime_ns for p in (run / "scoring-cv").iterdir()}
    trained = _spy_train(monkeypatch)
    for scoring in ("csls", "isoftmax", "dsoftmax"):
        assert main(["eval", str(run), "--scoring", scoring, "--select", "cv", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["scoring"]["selected_on"] == "train-cv3"
    # auto: the fold runs exist, so it cross-validates (no training) rather than choosing in-sample
    assert main(["eval", str(run), "--scoring", "isoftmax", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scoring"]["selected_on"] == "train-cv3"
    assert trained == []
    assert {p.name: (p / "summary.json").stat().st_mtime_ns for p in (run / "scoring-cv").iterdir()} == stamps
    assert set(json.loads((run / "scoring.json").read_text())["test"]) >= {"csls", "isoftmax", "dsoftmax"}



def _rsum(i2t: np.ndarray, t2i: np.ndarray) -> float:
    return float(sum(100.0 * np.mean(r <= k) for r in (i2t, t2i) for k in (1, 5, 10)))


def _csls_by_hand(held, bank, k: int) -> float:
    """csls of one fold by loops (CCA has one model for both directions, so one matrix serves both): 2 s(i, j) minus
    the mean of image i's k best scores against the fold's training captions and the mean of caption j's k best
    against its training images; ranked naively."""
    img, txt = np.asarray(held.image, np.float64), np.asarray(held.text, np.float64)
    bi, bt = np.asarray(bank.image, np.float64), np.asarray(bank.text, np.float64)
    top = lambda v: float(np.mean(sorted(v, reverse=True)[:k]))  # noqa: E731
    r_img = [top(bt @ x) for x in img]
    r_txt = [top(bi @ y) for y in txt]
    s = np.array([[2 * float(x @ y) - r_img[i] - r_txt[j] for j, y in enumerate(txt)] for i, x in enumerate(img)])
    return _rsum(*naive_ranks(s, np.asarray(held.caption_image, np.int64)))


def test_the_choice_is_the_best_mean_rsum_over_the_folds_by_hand(run) -> None:
    from crossview.engine.cv_runs import load_run_dataset, run_folds
    from crossview.engine.run_folder import read_config

    rec = _record(run)
    cfg = read_config(run)
    parts = run_folds(load_run_dataset(cfg), cfg, 3, int(cfg.get("seed") or 0))
    means = {}
    for k in (1, 3, 5, 10, 20):
        per_fold = []
        for f, (tr, te) in enumerate(parts):
            fold = run / "scoring-cv" / f"f{f + 1}"
            held = load_embeddings(fold / "embeddings_cv-test.npz")
            bank = load_embeddings(fold / "bank_cv-train.npz")
            assert held.image.shape[0] == te.size and bank.image.shape[0] == tr.size     # the fold, the others
            per_fold.append(_csls_by_hand(held, bank, k))
        means[k] = float(np.mean(per_fold))
        cand = next(c for c in rec["candidates"] if c["param"] == k)
        assert cand["rsum"] == pytest.approx(means[k]) and cand["fold_rsum"] == pytest.approx(per_fold)
    best = max(means.values())
    assert rec["param"] == next(k for k in (1, 3, 5, 10, 20) if means[k] == pytest.approx(best))


def test_auto_chooses_in_sample_and_says_so_when_cross_validation_would_cost_too_much(run, tmp_path, monkeypatch,
                                                                                      capsys) -> None:
    import crossview.engine.scoring as scoring_mod

    copy = tmp_path / "dear"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("writer.*", "scoring-cv", "scoring.json"))
    monkeypatch.setattr(scoring_mod, "AUTO_CV_SECONDS", 0.0)
    trained = _spy_train(monkeypatch)
    assert main(["eval", str(copy), "--scoring", "csls", "--json"]) == 0
    out = capsys.readouterr()
    sel = json.loads(out.out)["scoring"]
    assert sel["selected_on"] == "train (hold-out)" and sel["in_sample"] is True and trained == []
    assert "chosen in-sample" in out.err and "--select cv" in out.err and not (copy / "scoring-cv").exists()
    # the same run, auto within the budget: cross-validated, with a progress line per stage on stderr
    monkeypatch.setattr(scoring_mod, "AUTO_CV_SECONDS", 1e9)
    assert main(["eval", str(copy), "--scoring", "csls"]) == 0
    out = capsys.readouterr()
    assert "cross-validation runs 1/3" in out.err and "cv fold 3/3: cca: done" in out.err and "choosing csls's k on the train folds" in out.err
    assert "chosen by rsum on train-cv3: 3-fold cross-validation of the training images" in out.out
    assert len(trained) == 3


def test_query_uses_the_recorded_choice_without_training(run, monkeypatch, capsys) -> None:
    trained = _spy_train(monkeypatch)
    assert main(["query", str(run), "--image", "0", "--k", "3", "--scoring", "csls", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scoring"]["selected_on"] == "train-cv3" and doc["scoring"]["param"] == _record(run)["param"]
    assert trained == []
    from crossview.engine.scoring import recorded_choice
    assert recorded_choice(run, "csls")["param"] == _record(run)["param"]
    assert recorded_choice(run, "csls", train_split="other") is None


@pytest.mark.parametrize("argv,message", [
    (["--scoring", "csls", "--select", "always"], "crossview: error: unknown --select 'always'; choose one of auto, "
                                                  "cv, bank"),
    # (--select alone chooses the run's own scoring's parameter: this run's default, csls)
    (["--scoring", "plain", "--select", "cv"], "crossview: error: --select cv: scoring 'plain' has no parameter to "
                                               "choose"),
    (["--scoring", "csls", "--select", "cv", "--param", "3"], "crossview: error: --select cv and --param 3: a given "
                                                              "parameter is not chosen"),
])
def test_bad_select_options_get_one_clear_line(run, capsys, argv, message) -> None:
    for cmd in (["eval", str(run)], ["query", str(run), "--image", "0"]):
        assert main([*cmd, *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_cv_of_a_run_that_cannot_be_trained_again_is_one_line(run, tmp_path, capsys) -> None:
    other = _train(run.parent / "toy_precomp", tmp_path / "b", 3)
    assert main(["fuse", str(run), str(other), "--weights", "bank", "--run-dir", str(tmp_path / "fused")]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "fused"), "--scoring", "csls", "--select", "cv"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("crossview: error: fused is a fused run, which cannot be trained again on training folds; "
                          "use --select bank") and err.count("\n") == 1
    # auto: in-sample, said in one line
    assert main(["eval", str(tmp_path / "fused"), "--scoring", "csls", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["scoring"]["in_sample"] is True and "chosen in-sample" in out.err
    assert main(["eval", str(run), "--compare", str(other), "--select", "cv"]) == 2
    assert "--select does not apply to --compare" in capsys.readouterr().err


def test_a_stopped_cross_validation_continues_its_fold_runs(run, tmp_path) -> None:
    from crossview.core.events import Progress
    from crossview.engine.scoring import iter_select_cv

    copy = tmp_path / "stopped"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("writer.*", "scoring-cv", "scoring.json"))
    gen = iter_select_cv(copy, "csls")
    for ev in gen:
        if isinstance(ev, Progress) and ev.stage == "cv" and ev.step == 1:
            break
    gen.close()                                               # as Ctrl-C does between two fold runs
    assert [p.name for p in (copy / "scoring-cv").iterdir()] == ["f1"]
    stamp = (copy / "scoring-cv" / "f1" / "summary.json").stat().st_mtime_ns
    events = list(_drain(iter_select_cv(copy, "csls")))
    record = events[-1]
    assert (copy / "scoring-cv" / "f1" / "summary.json").stat().st_mtime_ns == stamp      # read back, not retrained
    assert record["param"] == _record(run)["param"] and record["candidates"] == _record(run)["candidates"]


def _drain(gen):
    """The events of ``gen``, then its return value."""
    while True:
        try:
            yield next(gen)
        except StopIteration as stop:
            yield stop.value
            return
