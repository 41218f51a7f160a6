"""The Query panel's scoring box, driven with pytest-qt: choosing a hubness-aware scoring re-ranks the query shown
by the scorer over the run's training bank; plain gives the index's ranking back; another run starts plain."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402

from crossview.core.errors import CrossViewError  # noqa: E402
from crossview.data.method_data import MethodData  # noqa: E402
from crossview.engine.retriever import Retriever  # noqa: E402
from crossview.eval.scoring import Scorer  # noqa: E402
from crossview.gui.panels.query_panel import QueryPanel  # noqa: E402
from toy import Identity, toy_setup  # noqa: E402

pytestmark = pytest.mark.gui


@pytest.fixture
def panel(qtbot, tmp_path: Path):
    ds, feats, _ = toy_setup()
    w = QueryPanel()
    qtbot.addWidget(w)
    w.set_retriever(Retriever(Identity().fit(None), ds, feats, gallery="test"), tmp_path / "run",
                    title="identity on toy", eval_split="test", train_split="train")
    w.show()
    return w


def _choose_with_keys(qtbot, panel: QueryPanel, key) -> None:
    panel.scoring_combo.setFocus()
    qtbot.keyClick(panel.scoring_combo, key)


def test_the_scoring_box_reranks_by_the_training_bank(qtbot, panel: QueryPanel) -> None:
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        panel.query_image(22)
    plain = sig.args[0]
    assert panel.scoring == "plain" and panel.scoring_combo.isEnabled()
    assert [panel.scoring_combo.itemData(i) for i in range(panel.scoring_combo.count())] == \
        ["plain", "csls", "isoftmax", "dsoftmax"]
    # Down: CSLS; the choice is made in a worker, then the query shown is asked again
    got: list = []
    panel.scoring_applied.connect(lambda rec: got.append(("scoring", rec)))
    panel.answered.connect(lambda ranking: got.append(("answer", ranking)))
    with qtbot.waitSignals([panel.scoring_applied, panel.answered], timeout=10_000, order="strict"):
        _choose_with_keys(qtbot, panel, Qt.Key.Key_Down)
    assert [what for what, _ in got] == ["scoring", "answer"]
    record, ranking = got[0][1], got[1][1]
    got.clear()
    assert panel.scoring == "csls" and panel.retriever.scoring == "csls"
    assert record["selected_on"] == "train (hold-out)" and record["holdout_images"] == 4
    assert "scoring csls (k = " in panel.scoring_note.text()
    # the bank is the training split (images 0-19 and their captions), never the gallery (test: 20-29)
    r = panel.retriever
    ds, feats = r.dataset, r.features
    train = MethodData.from_features(ds, feats.image, feats.text, "train")
    scorer = Scorer("csls", record["param"], bank_queries=train.image_features, bank_gallery=train.text_features)
    s = scorer.scores(feats.image[[22]], feats.text[r.gallery_captions])[0]
    want = r.gallery_captions[np.lexsort((np.arange(s.size), -s))[:len(ranking.items)]]
    assert ranking.items.tolist() == want.tolist()
    np.testing.assert_allclose(ranking.scores, np.sort(s)[::-1][:len(ranking.items)], rtol=1e-5)
    assert ranking.query == plain.query
    # Up again: plain, with the index's scores back (prepared scorings are kept, no worker this time)
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        _choose_with_keys(qtbot, panel, Qt.Key.Key_Up)
    assert panel.scoring == "plain" and panel.scoring_note.text() == ""
    assert [what for what, _ in got] == ["scoring", "answer"]
    assert sig.args[0].items.tolist() == plain.items.tolist()
    np.testing.assert_allclose(sig.args[0].scores, plain.scores)


def test_a_query_asked_while_the_scoring_is_prepared_is_answered_once_under_it(qtbot, panel: QueryPanel) -> None:
    """Opening a run starts its own scoring's preparation; a query asked meanwhile waits for it (saying so) and is
    answered once, under that scoring, not first under plain and then replaced."""
    got: list = []
    panel.answered.connect(lambda ranking: got.append(("answer", ranking.items.tolist(), panel.retriever.scoring)))
    panel.scoring_applied.connect(lambda rec: got.append(("scoring", rec["scoring"])))
    assert panel.set_scoring("csls") is not None               # a worker prepares the bank
    assert panel.query_image(22) is None                       # deferred
    assert "Waiting for" in panel.gold_label.text() and "CSLS" in panel.gold_label.text()
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        pass
    qtbot.wait(50)                                             # nothing else queued after it
    assert [g[0] for g in got] == ["scoring", "answer"]
    assert got[1][2] == "csls"
    assert got[1][1] == panel.retriever.query_image(22, panel.k_spin.value()).items.tolist()
    assert panel.history == [{"image": 22}]


def test_a_query_asked_while_a_scoring_fails_is_answered_under_the_scoring_kept(qtbot, panel: QueryPanel,
                                                                                  monkeypatch) -> None:
    import crossview.engine.scoring as engine_scoring

    def broken(*args, **kwargs):
        raise CrossViewError("the bank cannot be read")

    monkeypatch.setattr(engine_scoring, "retriever_scoring", broken)
    panel.set_scoring("isoftmax")
    panel.query_image(22)
    with qtbot.waitSignals([panel.failed, panel.answered], timeout=10_000, order="strict"):
        pass
    assert panel.scoring == "plain" and panel.retriever.scoring == "plain"
    assert "cannot be read" in panel.scoring_note.text() and panel.history == [{"image": 22}]


def test_another_gallery_keeps_the_scoring_and_another_run_starts_plain(qtbot, panel: QueryPanel,
                                                                         tmp_path: Path) -> None:
    with qtbot.waitSignal(panel.scoring_applied, timeout=10_000):
        panel.set_scoring("isoftmax")
    r = panel.retriever
    same_run = Retriever(r.method, r.dataset, r.features, gallery="all")
    with qtbot.waitSignal(panel.scoring_applied, timeout=10_000):
        panel.set_retriever(same_run, tmp_path / "run", eval_split="test", train_split="train")
    assert same_run.scoring == "isoftmax" and panel.scoring == "isoftmax"
    ds, feats, _ = toy_setup()
    other = Retriever(Identity().fit(None), ds, feats, gallery="test")
    panel.set_retriever(other, tmp_path / "run2", eval_split="test", train_split="train")
    assert panel.scoring == "plain" and other.scoring == "plain" and panel.scoring_note.text() == ""
    # the training split as the gallery: refused in the panel, one line, back to plain
    train_gallery = Retriever(other.method, ds, feats, gallery="train")
    panel.set_retriever(train_gallery, tmp_path / "run2", eval_split="test", train_split="train")
    with qtbot.waitSignal(panel.failed, timeout=10_000) as sig:
        panel.set_scoring("csls")
    assert "training split" in sig.args[0] and panel.scoring == "plain"
    with pytest.raises(CrossViewError, match="unknown scoring 'cosine'"):
        panel.set_scoring("cosine")


def test_inspect_shows_each_recorded_scoring_beside_the_plain_hubness(qtbot, tmp_path: Path) -> None:
    import json

    from crossview.engine.results import load_run_results
    from crossview.gui.panels.inspect_panel import InspectPanel

    d = tmp_path / "run"
    d.mkdir()
    m = {"R@1": 50.0, "R@5": 100.0, "R@10": 100.0, "MedR": 1.5, "MeanR": 1.5}
    hub = {"k": 2, "skewness": 1.234, "top5_share": 0.31, "antihub_share": 0.25, "top5_item": 3}
    (d / "summary.json").write_text(json.dumps({"method": "cca", "dataset": "toy", "split": "test", "i2t": m,
                                                "t2i": m, "rsum": 500.0, "hubness": {"i2t": hub, "t2i": None}}))
    np.savez(d / "ranks.npz", i2t=np.array([1, 2]), t2i=np.array([1, 2, 1, 2]))
    entry = {"scoring": "csls", "param_name": "k", "param": 10, "selected_on": "train (hold-out)",
             "holdout_images": 12, "bank_images": 48, "reported_on": "test", "rsum": 512.5,
             "i2t": {**m, "R@1": 60.0}, "t2i": m, "hubness": {"i2t": {**hub, "skewness": 0.5}, "t2i": None}}
    (d / "scoring.json").write_text(json.dumps({"test": {"csls": entry}, "val": {"isoftmax": entry}}))
    panel = InspectPanel()
    qtbot.addWidget(panel)
    run = load_run_results(d)
    assert list(run.scorings) == ["csls"]           # the run's own split only
    panel.set_run(run)
    assert panel.hubness_label.text().splitlines() == [
        "i2t hubness: N_2 skewness 1.23; the most frequent item is in 31% of top-5 lists; 25% of items in no top-2",
        "scoring csls (k = 10, chosen by rsum on train (hold-out): 12 images against a bank of 48): rsum 512.5 "
        "(i2t R@1 60.0, t2i R@1 50.0)",
        "  i2t hubness: N_2 skewness 0.50; the most frequent item is in 31% of top-5 lists; 25% of items in no top-2"]
    (d / "scoring.json").write_text("not json")
    panel.set_run(load_run_results(d))
    assert panel.hubness_label.text().count("\n") == 0


def test_the_scoring_box_uses_the_runs_recorded_cross_validated_choice(qtbot, panel: QueryPanel, tmp_path: Path,
                                                                        monkeypatch) -> None:
    """A run whose csls k was chosen by cross-validation (crossview eval RUN --scoring csls --select cv) ranks
    with that k in the app; with no choice recorded the quick in-sample one is used and said to be in-sample, with
    the command for the honest one. The panel never trains."""
    import json

    import crossview.engine.run as run_mod

    trained: list = []
    real = run_mod.train
    monkeypatch.setattr(run_mod, "train", lambda *a, **k: trained.append(k) or real(*a, **k))
    with qtbot.waitSignal(panel.scoring_applied, timeout=10_000) as sig:
        panel.set_scoring("isoftmax")
    record = sig.args[0]
    assert record["selected_on"] == "train (hold-out)" and record["in_sample"] is True
    assert "in-sample" in panel.scoring_note.text() and "--select cv" in panel.scoring_note.text()
    run_dir = tmp_path / "run2"
    run_dir.mkdir()
    entry = {"scoring": "csls", "param_name": "k", "param": 7, "by": "rsum", "selected_on": "train-cv3",
             "in_sample": False, "fold_images": [7, 7, 6], "folds": [{"fold": 1}, {"fold": 2}, {"fold": 3}],
             "candidates": [], "reported_on": "test", "rsum": 300.0, "i2t": {}, "t2i": {}, "hubness": {}}
    (run_dir / "scoring.json").write_text(json.dumps({"test": {"csls": entry}}))
    ds, feats, _ = toy_setup()
    panel.set_retriever(Retriever(Identity().fit(None), ds, feats, gallery="test"), run_dir,
                        eval_split="test", train_split="train")
    with qtbot.waitSignal(panel.scoring_applied, timeout=10_000) as sig:
        panel.set_scoring("csls")
    record = sig.args[0]
    assert record["param"] == 7 and record["selected_on"] == "train-cv3" and "rsum" not in record
    assert panel.retriever.scoring_record["param"] == 7
    assert "3-fold cross-validation" in panel.scoring_note.text() and "--select cv" not in panel.scoring_note.text()
    assert trained == []


def test_the_scoring_box_starts_at_the_runs_own_scoring(qtbot, tmp_path: Path) -> None:
    """A run that recorded a scoring at training (a method default: csls with its k fixed) opens in the Query panel
    ranked by it, with that k, not a new choice; a run without the field (written before) starts plain."""
    import json

    ds, feats, _ = toy_setup()
    run = tmp_path / "own"
    run.mkdir()
    own = {"scoring": "csls", "param_name": "k", "param": 3, "default": True,
           "selected_on": "method default (3-fold CV on the Flickr8k sample's train photos: x.md)"}
    (run / "config.json").write_text(json.dumps({"method": "identity", "train_split": "train", "scoring": own}))
    w = QueryPanel()
    qtbot.addWidget(w)
    r = Retriever(Identity().fit(None), ds, feats, gallery="test")
    with qtbot.waitSignal(w.scoring_applied, timeout=10_000) as sig:
        w.set_retriever(r, run, title="identity on toy", eval_split="test", train_split="train")
    assert w.scoring == "csls" and r.scoring == "csls"
    assert sig.args[0]["param"] == 3 and sig.args[0]["default"] is True
    assert w.scoring_note.text() == ("scoring csls (k = 3, method default (3-fold CV on the Flickr8k sample&#x27;s "
                                     "train photos: x.md))")
    # shown as HTML, so the reader sees the apostrophe, not the entity (an auto-detected label showed "&#x27;")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QTextDocument

    assert w.scoring_note.textFormat() == Qt.TextFormat.RichText
    doc = QTextDocument()
    doc.setHtml(w.scoring_note.text())
    assert "Flickr8k sample's train photos" in doc.toPlainText()
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"method": "identity", "train_split": "train"}))
    r2 = Retriever(Identity().fit(None), ds, feats, gallery="test")
    w.set_retriever(r2, old, title="old", eval_split="test", train_split="train")
    assert w.scoring == "plain" and r2.scoring == "plain" and w._scoring_task is None
