"""Numeric options are checked before any work (issue 31, item 2): one line naming the option and the range the
program accepts, never a traceback and never a run that fails after its training."""

from __future__ import annotations

import numpy as np
import pytest

from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.core.run_settings import SEED_MAX, RunSettings, check_checkpoint_seconds, check_seed

BAD = [
    (["train", "cca", "--seed", "-5"], "--seed", "from 0 to 4294967295"),
    (["train", "cca", "--seed", "12345678901234567890"], "--seed", "from 0 to 4294967295"),
    (["train", "cca", "--checkpoint-seconds", "-1"], "--checkpoint-seconds", "> 0"),
    (["train", "cca", "--checkpoint-seconds", "0"], "--checkpoint-seconds", "> 0"),
    (["train", "cca", "--checkpoint-seconds", "nan"], "--checkpoint-seconds", "finite"),
    (["train", "cca", "--checkpoint-seconds", "inf"], "--checkpoint-seconds", "finite"),
    (["features", "extract", "--batch-size", "0"], "--batch-size", "from 1 to 65536"),
    (["features", "extract", "--batch-size", "99999999999999999999"], "--batch-size", "from 1 to 65536"),
    (["features", "extract", "--workers", "-1"], "--workers", "from 0 to 256"),
    (["data", "demo", "--out", "OUT", "--n-scenes", "0"], "--n-scenes", "from 1 to 200000"),
    (["data", "demo", "--out", "OUT", "--n-scenes", "99999999999999999999"], "--n-scenes", "from 1 to 200000"),
    (["data", "demo", "--out", "OUT", "--n-web", "-1"], "--n-web", "from 0 to 200000"),
    (["data", "demo", "--out", "OUT", "--seed", "-1"], "--seed", "from 0"),
    (["data", "make-web", "D", "--out", "OUT", "--drop", "1.5"], "--drop", "from 0 to 1"),
    (["data", "make-web", "D", "--out", "OUT", "--add", "nan"], "--add", "from 0 to 1"),
    (["eval", "E", "--resamples", "0"], "--resamples", "from 10 to 100000"),
    (["eval", "E", "--resamples", "99999999999"], "--resamples", "from 10 to 100000"),
    (["tune", "cca", "--grid", "reg=0.1", "--trials", "0"], "--trials", "from 1 to 100000"),
    (["tune", "cca", "--grid", "reg=0.1", "--folds", "1"], "--folds", "from 2 to 100"),
    (["tune", "cca", "--grid", "reg=0.1", "--seed", "-2"], "--seed", "from 0"),
    (["experiment", "loss-compare", "--data", "demo", "--folds", "1"], "--folds", "from 2 to 100"),
    (["experiment", "bitr-labels", "--data", "demo", "--min-images", "0"], "--min-images", ">= 1"),
    (["experiment", "bitr-table", "--data", "demo", "--test-parts", "0"], "--test-parts", "from 1 to 1000"),
    (["experiment", "bitr-table", "--data", "demo", "--seed", "-1"], "--seed", "from 0"),
    (["screenshot", "--out", "OUT", "--width", "0"], "--width", "from 320"),
]
# query --k / --caption, explain --caption and experiment --n-topics / --n-words / --budget are checked by
# their commands before any work (one "crossview: error:" line; tests/test_cli_query.py, test_loss_compare.py ...)


@pytest.mark.parametrize("argv,option,allowed", BAD, ids=[" ".join(a[:2] + a[-2:]) for a, _, _ in BAD])
def test_out_of_range_option_is_refused_while_parsing(argv, option, allowed, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert f"argument {option}" in last and allowed in last, err
    assert "Traceback" not in err


def test_in_range_values_parse():
    from crossview.cli import build_parser

    args = build_parser().parse_args(["train", "cca", "--seed", str(SEED_MAX), "--checkpoint-seconds", "0.5"])
    assert args.seed == SEED_MAX and args.checkpoint_seconds == 0.5


def test_library_checks_seed_and_checkpoint_interval_before_loading(tmp_path):
    from crossview.engine import run as engine

    missing = tmp_path / "no-such-dataset"
    # the dataset does not exist: the seed's error coming first shows nothing was loaded before the check
    with pytest.raises(CrossViewError, match=r"seed -5: give an integer from 0 to 4294967295"):
        engine.train("cca", str(missing), seed=-5)
    with pytest.raises(CrossViewError, match=r"seed 18446744073709551616"):
        engine.train("cca", str(missing), params={"seed": 2**64})
    with pytest.raises(CrossViewError, match=r"checkpoint_seconds nan"):
        engine.train("cca", str(missing), checkpoint_seconds=float("nan"))
    with pytest.raises(CrossViewError, match=r"checkpoint_seconds -1"):
        RunSettings(checkpoint_seconds=-1)
    with pytest.raises(CrossViewError, match=r"seed True"):
        check_seed(True)
    assert check_seed(np.int64(7)) == 7 and check_checkpoint_seconds("2.5") == 2.5


def _embeddings(path):
    from crossview.eval.embeddings import Embeddings, save_embeddings

    rng = np.random.default_rng(0)
    return save_embeddings(path, Embeddings(image=rng.normal(size=(4, 3)).astype(np.float32),
                                            text=rng.normal(size=(8, 3)).astype(np.float32),
                                            caption_image=np.repeat(np.arange(4), 2)))


def test_eval_ranks_out_folder_is_refused_and_a_file_is_written_atomically(tmp_path, capsys):
    emb = _embeddings(tmp_path / "e.npz")
    folder = tmp_path / "out"
    folder.mkdir()
    assert main(["eval", str(emb), "--ranks-out", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "--ranks-out" in err and "that is a folder" in err
    assert not (tmp_path / "out.npz").exists() and not any(folder.iterdir())

    assert main(["eval", str(emb), "--ranks-out", str(tmp_path / "ranks")]) == 0
    with np.load(tmp_path / "ranks.npz") as z:
        assert z["i2t"].shape == (4,) and z["t2i"].shape == (8,)
    assert main(["eval", str(emb), "--ranks-out", str(tmp_path / "nowhere" / "r.npz")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_library_extraction_checks_batch_size_and_workers():
    from crossview.data.dataset import PairedDataset
    from crossview.features import extract_features

    ds = PairedDataset(name="t", captions=["a", "b"], caption_image=[0, 1],
                       image_features=np.zeros((2, 3), np.float32))
    with pytest.raises(CrossViewError, match=r"batch size 0: give an integer from 1 to 65,536"):
        extract_features(ds, batch_size=0, cache=False)
    with pytest.raises(CrossViewError, match=r"batch size 10\*\*20|batch size 100000000000000000000"):
        extract_features(ds, batch_size=10**20, cache=False)
    with pytest.raises(CrossViewError, match=r"workers -1: give an integer from 0 to 256"):
        extract_features(ds, num_workers=-1, cache=False)


def test_a_huge_scoring_parameter_is_one_line_not_a_numpy_error():
    """1e300 read as csls's k became a Python int numpy's isfinite does not take (a TypeError traceback)."""
    from crossview.eval.scoring import MAX_K, _check_param

    for value in (10**300, 1e300, float(MAX_K + 1)):
        with pytest.raises(CrossViewError, match=r"csls: k must be a whole number from 1 to 1,000,000"):
            _check_param("csls", value)
    with pytest.raises(CrossViewError, match=r"isoftmax: beta must be a positive number"):
        _check_param("isoftmax", 10**400)
    assert _check_param("csls", 5.0) == 5 and _check_param("dsoftmax", 10**3) == 1000.0


@pytest.mark.parametrize("argv, needle", [
    (["features", "extract", "--data", "demo", "--out", "{tmp}/nowhere/x.npz"], "the folder {tmp}/nowhere does not exist"),
    (["experiment", "bitr-table", "--data", "demo", "--methods", "cca", "--out", "{tmp}/nowhere/x.md"],
     "the folder {tmp}/nowhere does not exist"),
    (["experiment", "bitr-table", "--data", "demo", "--methods", "cca", "--out", "{tmp}"], "that is a folder"),
    (["experiment", "loss-compare", "--data", "demo", "--out", "{tmp}/nowhere/x.md"], "does not exist"),
    (["experiment", "loss-compare", "--data", "demo", "--budget", "99999999999999999999x2"],
     "epochs must be from 1 to 10,000"),
    (["experiment", "loss-compare", "--data", "demo", "--epochs", "20000"], "--epochs must be >= 1 and at most 10,000"),
    (["experiment", "timam-ablation", "--data", "demo", "--seeds", "5000"], "--seeds must be >= 1 and at most 1,000"),
])
def test_an_out_file_in_a_missing_folder_is_refused_before_any_work(tmp_path, capsys, argv, needle):
    """--out never creates folders the user did not ask for (it made /nonexist at the root), and is checked first."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle.replace("{tmp}", str(tmp_path)) in err[0], err
    assert not (tmp_path / "nowhere").exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_features_fit_on_a_split_the_dataset_lacks_is_one_line(tmp_path, capsys):
    """--fit-on nosuch was silently ignored (TF-IDF fitted on every caption, exit 0)."""
    from _engine_helpers import make_toy_dataset, write_toy_precomp

    write_toy_precomp(tmp_path / "toy", make_toy_dataset(40), (("train", "train"), ("dev", "val")))
    argv = ["features", "extract", "--data", str(tmp_path / "toy"), "--text-encoder", "tfidf", "--no-cache"]
    assert main([*argv, "--fit-on", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fit-on nosuch: dataset" in err[0] and "has no split 'nosuch'" in err[0], err
    assert main([*argv, "--fit-on", "val"]) == 0
