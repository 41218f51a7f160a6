"""The Query panel driven with pytest-qt: both directions, ground truth, click-through, marks on disk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402

from crossview.engine.retriever import Retriever  # noqa: E402
from crossview.gui.panels.query_panel import GOLD, ItemRole, QueryPanel  # noqa: E402
from toy import Identity, toy_setup  # noqa: E402

pytestmark = pytest.mark.gui


@pytest.fixture
def panel(qtbot, tmp_path: Path):
    paths = []
    for i in range(30):
        p = tmp_path / f"im{i}.png"
        Image.new("RGB", (32, 32), (i * 8, 100, 200)).save(p)
        paths.append(str(p))
    ds, feats, colours = toy_setup(paths)
    retriever = Retriever(Identity().fit(None), ds, feats, gallery="test")
    w = QueryPanel()
    qtbot.addWidget(w)
    w.set_retriever(retriever, tmp_path / "run", title="identity on toy")
    w.show()
    w.colours = colours
    return w


def _wait_answer(qtbot, panel, task):
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        pass
    return sig.args[0]


def test_image_query_lists_captions_with_ground_truth(qtbot, panel: QueryPanel) -> None:
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        panel.query_image(22)
    ranking = sig.args[0]
    view = panel.caption_list
    assert panel.results.currentWidget() is view and view.count() == len(ranking.items) == 20
    gold_rows = [r for r in range(view.count()) if view.item(r).background().color() == GOLD]
    assert {int(view.item(r).data(ItemRole)) for r in gold_rows} == set(ranking.gold.tolist()) & set(ranking.items.tolist())
    assert "Ground truth captions at rank" in panel.gold_label.text()
    assert view.item(0).text().startswith("#1 ")


def test_sentence_query_and_click_through(qtbot, panel: QueryPanel) -> None:
    qtbot.keyClicks(panel.sentence, "a blue thing")
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        qtbot.keyClick(panel.sentence, Qt.Key.Key_Return)
    ranking = sig.args[0]
    assert ranking.direction == "t2i" and panel.results.currentWidget() is panel.image_grid
    top = int(ranking.items[0])
    assert panel.colours[top] == 2
    # clicking an image result queries from it: its captions are ranked
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        panel._activate(panel.image_grid.item(0))
    assert sig.args[0].direction == "i2t" and sig.args[0].query == {"image": top}
    # and back
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        panel.go_back()
    assert sig.args[0].direction == "t2i"


def test_marks_are_saved_at_once_and_move_down(qtbot, panel: QueryPanel, tmp_path: Path) -> None:
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(25)
    view = panel.caption_list
    first = int(view.item(0).data(ItemRole))
    second = int(view.item(1).data(ItemRole))
    qtbot.keyClick(view, Qt.Key.Key_R)
    assert view.currentRow() == 1
    qtbot.keyClick(view, Qt.Key.Key_N)
    lines = [json.loads(x) for x in (tmp_path / "run" / "annotations.jsonl").read_text().splitlines()]
    assert [(x["item"], x["relevant"]) for x in lines] == [(first, True), (second, False)]
    assert view.item(0).text().startswith("✓") and view.item(1).text().startswith("✗")
    assert "2 marks saved" in panel.marks_label.text()
    # the marks come back when the same query is asked again
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(25)
    assert panel.caption_list.item(0).text().startswith("✓")
    panel.annotations.export(tmp_path / "marks.csv")
    assert len((tmp_path / "marks.csv").read_text().splitlines()) == 3


def test_errors_show_in_the_panel(qtbot, panel: QueryPanel) -> None:
    with qtbot.waitSignal(panel.failed, timeout=10_000) as sig:
        panel.query_image(str(Path("/nonexistent/pic.png")))
    assert "no such image file" in sig.args[0] and "no such image file" in panel.gold_label.text()


def test_presentation_mode_enlarges_and_hides_the_annotation_bar(qtbot, panel: QueryPanel) -> None:
    panel.set_presentation(True)
    assert not panel.mark_bar.isVisible() and panel.sentence.font().pointSizeF() >= 18
    panel.set_presentation(False)
    assert panel.mark_bar.isVisible()
