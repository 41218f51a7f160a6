"""The Query panel's pieces without the panel: ResultsView (fill, styles, icons, activation), ExplainBar (when
the band shows) and pairs_in_view (which pairs a view of a ranking explains)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QColor, QFont, QPixmap  # noqa: E402

from crossview.engine.retriever import Retriever  # noqa: E402
from crossview.explain import Explanation, WordImportance, caption_words  # noqa: E402
from crossview.gui.explain_view import ERROR_STYLE, ExplainBar, Pair, pairs_in_view, query_sentence  # noqa: E402
from crossview.gui.results_view import GOLD, MARK_YES, PathRole, ItemRole, ResultsView  # noqa: E402
from toy import toy_retriever  # noqa: E402

pytestmark = pytest.mark.gui


@pytest.fixture
def retriever(tmp_path: Path) -> Retriever:
    return toy_retriever(tmp_path, (40, 24))


@pytest.fixture
def view(qtbot) -> ResultsView:
    w = ResultsView()
    qtbot.addWidget(w)
    w.resize(700, 500)
    w.show()
    return w


def test_an_image_query_fills_the_caption_list(qtbot, view: ResultsView, retriever: Retriever) -> None:
    ranking = retriever.query_image(22, 20)
    first = int(ranking.items[0])
    shown = view.fill(ranking, retriever, {first: True})
    assert shown is view.caption_list is view.current_view() and shown.count() == 20 and shown.currentRow() == 0
    top = shown.item(0)
    assert top.text().startswith("✓ ") and "#1" in top.text() and retriever.gallery_caption_text(first) in top.text()
    assert top.foreground().color() == MARK_YES
    gold = [r for r in range(shown.count()) if shown.item(r).background().color() == GOLD]
    assert {int(shown.item(r).data(ItemRole)) for r in gold} == set(ranking.gold.tolist()) & set(ranking.items.tolist())
    # a mark changes only the row's look
    view.style_item(top, ranking, first, None)
    assert not top.text().startswith("✓") and top.foreground().color() != MARK_YES
    # a double-click activates the row under the pointer (a single click only selects)
    rect = shown.visualItemRect(shown.item(2))
    with qtbot.waitSignal(view.activated, timeout=1_000) as sig:
        qtbot.mouseDClick(shown.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert sig.args[0] is shown.item(2) and shown.currentRow() == 2


def test_a_sentence_query_fills_the_grid_and_draws_thumbnails_and_overrides(qtbot, view: ResultsView,
                                                                            retriever: Retriever) -> None:
    ranking = retriever.query_text("a blue thing", 10)
    changed: list[int] = []
    view.current_changed.connect(lambda: changed.append(1))
    grid = view.fill(ranking, retriever, {})
    assert grid is view.image_grid is view.currentWidget() and grid.count() == 10 and changed
    paths = [grid.item(r).data(PathRole) for r in range(grid.count())]
    qtbot.waitUntil(lambda: all(view.cache.get(p) is not None for p in paths), timeout=10_000)
    view.refresh_icons(grid)
    plain = grid.item(0).icon().pixmap(grid.iconSize()).toImage()
    red = QPixmap(8, 8)
    red.fill(QColor("red"))
    view.icon_override = lambda v, it: red if int(it.data(ItemRole)) == int(ranking.items[0]) else None
    view.refresh_icons(grid)
    assert grid.item(0).icon().pixmap(grid.iconSize()).toImage() != plain
    view.thumbnail_ready(paths[0])            # a late thumbnail leaves an override alone
    assert grid.item(0).icon().pixmap(grid.iconSize()).toImage() != plain
    assert 1 <= len(view.rows_in_view(grid, 4)) <= 4 and view.rows_in_view(grid, 4)[0] == 0
    # presentation mode: large thumbnails, wider cells
    cell = grid.gridSize().width()
    view.set_presenting(True)
    view.fit_grid()
    assert view.cache is view.big_cache and grid.gridSize().width() >= cell
    view.clear()
    assert not grid.count() and not view.caption_list.count()


def test_the_explain_bar_shows_only_when_explain_is_on_and_it_has_something_to_say(qtbot) -> None:
    bar = ExplainBar()
    qtbot.addWidget(bar)
    bar.show()
    bar.set_note("Explaining...")
    assert not bar.isVisible(), "Explain is off"
    bar.active = True
    bar.set_note("Explaining...")
    assert bar.isVisible() and bar.note.isVisible() and bar.note.text() == "Explaining..."
    words = caption_words("a red thing")
    e = Explanation(region=None, words=WordImportance(words, np.array([0.1, 1.0, -0.2], np.float32), 0.5, "exact",
                                                       0.0), image_path="x.png", text="a red thing")
    bar.show_words(e, "Why caption #1 matches:")
    assert bar.words.isVisible() and "background-color" in bar.words.text() and "red" in bar.words.toolTip()
    bar.set_note("Could not explain", error=True)
    assert bar.note.styleSheet() == ERROR_STYLE
    bar.set_note("")
    assert bar.isVisible() and not bar.note.isVisible()          # the words are still there
    bar.words.hide()
    bar.sync()
    assert not bar.isVisible()
    bar.set_presenting(True, QFont())
    assert bar.words.font().pointSizeF() >= 24
    bar.clear()
    assert not bar.isVisible() and not bar.words.isVisible() and bar.isHidden()


def test_pairs_in_view(retriever: Retriever) -> None:
    asked: list[int] = []

    def in_view() -> list[int]:
        asked.append(1)
        return [3, 5, 7]

    i2t = retriever.query_image(22, 5)
    cap = int(i2t.items[1])
    assert pairs_in_view(retriever, i2t, cap, in_view) == ([Pair(22, retriever.gallery_caption_text(cap), "i2t")], "")
    assert not asked, "an image query explains one pair: the results in view are not asked for"
    assert pairs_in_view(retriever, i2t, None, in_view) == ([], "No results to explain.")
    assert pairs_in_view(None, i2t, cap, in_view) == ([], "")
    t2i = retriever.query_text(45, 5)                          # dataset caption 45
    pairs, why = pairs_in_view(retriever, t2i, 5, in_view)
    text = retriever.dataset.captions[45]
    assert query_sentence(retriever, t2i) == text and not why
    assert pairs == [Pair(5, text, "t2i"), Pair(3, text, "t2i"), Pair(7, text, "t2i")]
    tags = dataclasses.replace(t2i, query={"tags": "dog, grass"})      # a tag list has no sentence to explain
    pairs, why = pairs_in_view(retriever, tags, 5, in_view)
    assert pairs == [] and "tag branch" in why
