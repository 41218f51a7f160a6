"""Hubness-aware scoring of runs: the bank a run writes (its training split), ``crossview eval RUN --scoring``,
``crossview query ... --scoring`` and their option checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from _engine_helpers import make_toy_dataset, write_toy_precomp
from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.eval.embeddings import load_embeddings
from crossview.eval.scoring import evaluate_scoring


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished cca run on a toy precomp folder (train 60 / val 20 / test 20 images, 2 captions each), scored plain
    (its default, csls with a fixed k, is tested in test_default_scoring.py): these tests re-score a plain run."""
    base = tmp_path_factory.mktemp("scoring")
    data = base / "toy_precomp"
    write_toy_precomp(data, make_toy_dataset(100), (("train", "train"), ("dev", "val"), ("test", "test")))
    run_dir = base / "run_cca"
    assert main(["train", "cca", "--data", str(data), "--run-dir", str(run_dir), "--text-encoder", "bow",
                 "--device", "cpu", "--set", "n_components=6", "--scoring", "plain"]) == 0
    return run_dir


@pytest.fixture(scope="module")
def opened(run):
    from crossview.engine.session import open_run
    return open_run(run)


def test_a_run_writes_its_training_split_as_the_bank(run, opened) -> None:
    from crossview.data.method_data import MethodData

    bank = load_embeddings(run / "bank_train.npz")
    ds, f, m = opened.dataset, opened.features, opened.method
    train = MethodData.from_features(ds, f.image, f.text, "train")
    assert bank.image.shape[0] == len(ds.splits["train"]) and bank.text.shape[0] == train.n_captions
    np.testing.assert_allclose(bank.image, m.encode_images(train, direction="i2t"), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bank.text, m.encode_texts(train, direction="i2t"), rtol=1e-5, atol=1e-6)
    # the engine's bank for an open run (older run folders) is the same
    from crossview.engine.scoring import open_bank
    np.testing.assert_allclose(open_bank(opened).image, bank.image, rtol=1e-5, atol=1e-6)


def test_eval_scoring_normalises_with_train_and_reports_on_the_evaluation_split(run, capsys, monkeypatch) -> None:
    """The evaluation split never normalises itself: every Scorer is built from the training bank, and the
    metrics are those of the test embeddings scored against that bank."""
    import crossview.eval.scoring as scoring_mod

    banks = []
    real = scoring_mod.Scorer.__post_init__

    def spy(self):
        real(self)
        banks.append((self.bank_queries.copy(), self.bank_gallery.copy()))

    monkeypatch.setattr(scoring_mod.Scorer, "__post_init__", spy)
    assert main(["eval", str(run), "--scoring", "isoftmax", "--select", "bank", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    bank = load_embeddings(run / "bank_train.npz")
    test = load_embeddings(run / "embeddings_test.npz")
    train_rows = {r.tobytes() for r in np.asarray(bank.image, np.float64)} | \
        {r.tobytes() for r in np.asarray(bank.text, np.float64)}
    # (image rows only: two toy captions with the same words have the same bag of words, in any split)
    held_out = {r.tobytes() for r in np.asarray(test.image, np.float64)}
    assert banks
    for bq, bg in banks:
        rows = {r.tobytes() for r in bq} | {r.tobytes() for r in bg}
        assert rows <= train_rows and not rows & held_out
    sel = res["scoring"]
    assert sel["scoring"] == "isoftmax" and sel["selected_on"] == "train (hold-out)" and sel["reported_on"] == "test"
    assert sel["in_sample"] is True
    assert sel["holdout_images"] == 12 and sel["bank_images"] == 48
    ref = evaluate_scoring(test, bank, "isoftmax", sel["param"])
    assert res["rsum"] == pytest.approx(ref["rsum"]) and res["i2t"] == pytest.approx(ref["i2t"])
    assert res["hubness"]["i2t"]["k"] == 10
    recorded = json.loads((run / "scoring.json").read_text())["test"]["isoftmax"]
    assert recorded["param"] == sel["param"] and recorded["reported_on"] == "test"
    assert recorded["rsum"] == pytest.approx(res["rsum"])


def test_eval_scoring_table_names_the_choice_and_the_hubness(run, capsys) -> None:
    assert main(["eval", str(run), "--scoring", "csls", "--param", "3"]) == 0
    out = capsys.readouterr().out
    assert "scoring csls (k = 3, given); reported on test" in out
    assert "i2t hubness: N_10 skewness" in out
    assert main(["eval", str(run), "--scoring", "dsoftmax", "--select", "bank"]) == 0
    assert ("chosen by rsum on train (hold-out): 12 images against a bank of 48; in-sample: the model was fitted on "
            "those images)") in capsys.readouterr().out


def test_plain_scoring_is_the_evaluation_as_before(run, capsys) -> None:
    assert main(["eval", str(run), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["eval", str(run), "--scoring", "plain", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert a == b
    summary = json.loads((run / "summary.json").read_text())
    assert a["rsum"] == pytest.approx(summary["rsum"])


@pytest.mark.parametrize("argv,message", [
    (["--scoring", "cosine"], "crossview: error: unknown scoring 'cosine'; choose one of plain, csls, isoftmax, "
                              "dsoftmax"),
    (["--param", "3"], "crossview: error: --param 3: scoring 'plain' has no parameter"),
    (["--scoring", "csls", "--param", "2.5"], "crossview: error: csls: k must be a whole number from 1 to 1,000,000, got 2.5"),
    (["--scoring", "csls", "--protocol", "coco1k"], "crossview: error: COCO 1K needs a multiple of 1,000 test images"),
    (["--scoring", "csls", "--protocol", "identity"], "crossview: error: --protocol does not apply to --scoring csls"),
    (["--scoring", "csls", "--split", "train"], "crossview: error: "),
])
def test_bad_scoring_options_get_one_clear_line(run, capsys, argv, message) -> None:
    assert main(["eval", str(run), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_scoring_an_embeddings_file_or_the_training_split_is_refused(run, tmp_path, capsys) -> None:
    assert main(["eval", str(run / "embeddings_test.npz"), "--scoring", "csls"]) == 2
    assert "needs a run folder" in capsys.readouterr().err
    from crossview.engine.scoring import evaluate_run
    import shutil
    shutil.copy(run / "embeddings_test.npz", run / "embeddings_train.npz")
    try:
        with pytest.raises(CrossViewError, match="is the run's training split"):
            evaluate_run(run, "csls", split="train", record=False)
    finally:
        (run / "embeddings_train.npz").unlink()


def test_query_scoring_reranks_by_the_scorer(run, opened, capsys) -> None:
    from crossview.data.method_data import MethodData
    from crossview.engine.scoring import apply_scoring, open_bank, run_scorers

    assert main(["query", str(run), "--image", "0", "--k", "5", "--scoring", "csls", "--param", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scoring"]["scoring"] == "csls" and doc["scoring"]["param"] == 4
    r = opened.retriever()
    image = 0
    rec = apply_scoring(opened, r, "csls", 4)
    scorer = run_scorers(open_bank(opened), rec)["i2t"]
    q = r.method.encode_images(MethodData(image_features=opened.features.image[[image]], text_features=None,
                                          captions=[], caption_image=np.zeros(0, np.int64), name="q"),
                               direction="i2t")
    s = scorer.scores(q, r._caption_emb)[0]
    want = r.gallery_captions[np.argsort(-s, kind="stable")[:5]]
    assert [row["item"] for row in doc["results"]] == want.tolist()
    assert [row["score"] for row in doc["results"]] == pytest.approx(np.sort(s)[::-1][:5].tolist(), rel=1e-5)
    ranking = r.query_image(0, 5)
    assert ranking.items.tolist() == want.tolist()
    # plain again: the index's answer
    apply_scoring(opened, r, "plain")
    assert r.scoring == "plain"
    assert main(["query", str(run), "--image", "0", "--scoring", "softmax"]) == 2
    err = capsys.readouterr().err
    assert err == "crossview: error: unknown scoring 'softmax'; choose one of plain, csls, isoftmax, dsoftmax\n"


def test_train_with_scoring_prints_the_rescored_table_and_records_it(run, tmp_path, capsys) -> None:
    data = run.parent / "toy_precomp"
    out = tmp_path / "run_scored"
    assert main(["train", "cca", "--data", str(data), "--run-dir", str(out), "--text-encoder", "bow",
                 "--device", "cpu", "--set", "n_components=6", "--scoring", "csls"]) == 0
    text = capsys.readouterr().out
    # the chosen scoring is the run's own: its table, one line saying so, the plain rsum beside
    assert "scored with csls k=" in text and "(chosen on train-cv3), bank: train; plain: rsum" in text
    assert "reported on test" in text
    assert "csls" in json.loads((out / "scoring.json").read_text())["test"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scoring"]["scoring"] == "csls" and summary["scoring"]["selected_on"] == "train-cv3"
    assert summary["rsum"] == pytest.approx(json.loads((out / "scoring.json").read_text())["test"]["csls"]["rsum"])
    assert json.loads((out / "config.json").read_text())["scoring"]["param"] == summary["scoring"]["param"]
    # an unknown scoring is refused before any training: one line, no run folder
    assert main(["train", "cca", "--data", str(data), "--run-dir", str(tmp_path / "never"), "--scoring", "x"]) == 2
    assert capsys.readouterr().err == ("crossview: error: unknown scoring 'x'; choose one of plain, csls, isoftmax, "
                                       "dsoftmax\n")
    assert not (tmp_path / "never").exists()


def test_a_run_without_a_bank_gets_one_on_first_use_and_keeps_it(run, tmp_path) -> None:
    """A run whose model reads image files writes no bank while it trains (minutes for an option few use); the
    first scoring encodes its training split and keeps it, the second reads it."""
    import shutil

    from crossview.engine.scoring import run_bank

    copy = tmp_path / "run_copy"
    shutil.copytree(run, copy)
    want = load_embeddings(run / "bank_train.npz")
    (copy / "bank_train.npz").unlink()
    first = run_bank(copy)
    assert (copy / "bank_train.npz").is_file()
    np.testing.assert_allclose(first.image, want.image, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(load_embeddings(copy / "bank_train.npz").text, want.text, rtol=1e-5, atol=1e-6)
