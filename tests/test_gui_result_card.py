"""The result card: a finished run's numbers with intervals, the whole wait, and where to go next."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("PySide6")

from crossview.gui.result_card import ResultCard, describe_summary  # noqa: E402

SUMMARY = {"method": "cca", "dataset": "flickr8k", "split": "val", "n_images": 100, "n_captions": 500,
           "i2t": {"R@1": 38.0, "R@5": 74.0, "R@10": 86.0, "MedR": 2.0, "MeanR": 6.4},
           "t2i": {"R@1": 35.4, "R@5": 72.0, "R@10": 86.6, "MedR": 3.0, "MeanR": 5.3}, "rsum": 392.0,
           "ci": {"i2t": {"R@1": [29.0, 48.0]}, "t2i": {"R@1": [28.4, 42.4]}, "rsum": [358.4, 426.8]},
           "features_seconds": 73.7, "train_seconds": 0.4, "eval_seconds": 0.1}


def test_the_card_says_the_numbers_their_intervals_and_the_whole_wait():
    title, metrics, timing = describe_summary(SUMMARY)
    assert "cca" in title and "flickr8k" in title and "val" in title and "100 images" in title
    assert "R@1 38.0" in metrics and "[29.0-48.0]" in metrics and "R@10 86.6" in metrics
    assert "rsum 392.0" in metrics and "[358.4-426.8]" in metrics
    assert timing == "took 1 min 14 s in all: features 1 min 14 s, training 0.4 s, evaluation 0.1 s"
    # an older summary without intervals or timings still reads
    _t, old, none = describe_summary({k: v for k, v in SUMMARY.items() if k not in ("ci", "features_seconds",
                                                                                    "train_seconds", "eval_seconds")})
    assert "rsum 392.0" in old and "[" not in old and none == ""


def test_its_buttons_ask_for_the_run(qtbot):
    card = ResultCard()
    qtbot.addWidget(card)
    assert card.isHidden()
    card.show_summary(SUMMARY, "/runs/cca-1")
    assert not card.isHidden()
    with qtbot.waitSignal(card.query_requested) as q:
        card.query_button.click()
    assert q.args == ["/runs/cca-1"]
    with qtbot.waitSignal(card.inspect_requested) as i:
        card.inspect_button.click()
    assert i.args == ["/runs/cca-1"]
    card.close_button.click()
    assert card.isHidden()


def test_the_train_panel_shows_it_when_a_run_finishes_and_hides_it_for_the_next(qtbot, tmp_path: Path):
    import _engine_helpers  # noqa: F401  (registers toy_iterative)
    from _engine_helpers import make_toy_dataset
    from crossview.gui.panels.train_panel import TrainPanel

    panel = TrainPanel(runs_root=tmp_path / "runs")
    qtbot.addWidget(panel)
    panel.set_dataset(make_toy_dataset(n_images=120))
    panel.text_encoder.setCurrentIndex(panel.text_encoder.findData("tfidf"))
    panel.select_method("cca")
    panel.show()
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as done:
        panel.start()
    card = panel.result_card
    assert card.isVisible() and card.run_dir == done.args[0]
    summary = json.loads((Path(done.args[0]) / "summary.json").read_text())
    assert f"rsum {summary['rsum']:.1f}" in card.metrics.text()
    with qtbot.waitSignal(panel.inspect_run) as i:
        card.inspect_button.click()
    assert i.args == [done.args[0]]
    with qtbot.waitSignal(panel.run_finished, timeout=120_000):
        panel.start()
        assert card.isHidden(), "a new run hides the last one's card"
