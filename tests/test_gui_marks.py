"""crossview.gui.marks without a Query panel: the export (queries named by file and caption, the CSV columns,
JSON lines passed through, a store read without a dataset), the summary line, and the MarkButtons widget."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from crossview.engine.annotations import AnnotationStore
from crossview.gui.marks import CSV_COLUMNS, describe_query, export_marks, marks_summary
from toy import toy_setup


def _dataset():
    ds, _, _ = toy_setup([f"/pics/im{i}.png" for i in range(30)])
    return ds


def test_describe_query_names_each_kind_of_query() -> None:
    ds = _dataset()
    assert describe_query(ds, {"image": 22}) == ("im22.png", "")
    assert describe_query(ds, {"file": "/tmp/holiday/beach.jpg"}) == ("beach.jpg", "")
    assert describe_query(ds, {"caption": 45}) == ("", ds.captions[45])
    assert describe_query(ds, {"text": "a red thing"}) == ("", "a red thing")
    assert describe_query(ds, {"tags": "dog, grass"}) == ("", "tags: dog, grass")
    # out of range, hand-edited or without a dataset: nothing named, no error
    assert describe_query(ds, {"image": 999}) == ("", "")
    assert describe_query(ds, {"caption": "x"}) == ("", "")
    assert describe_query(None, {"image": 3}) == ("", "")


def test_export_names_queries_and_items_in_the_csv(tmp_path: Path) -> None:
    ds = _dataset()
    store = AnnotationStore(tmp_path / "run", annotator="ann")
    store.mark("i2t", {"image": 22}, 44, True, ds.captions[44])
    store.mark("t2i", {"caption": 45}, 7, False)
    store.mark("t2i", {"text": "a blue thing"}, 3, True)
    out = export_marks(store, ds, tmp_path / "marks.csv")
    assert out == tmp_path / "marks.csv"
    with out.open(encoding="utf-8") as f:
        assert tuple(next(csv.reader(f))) == CSV_COLUMNS
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert len(rows) == 3
    by_kind = {r["query_kind"]: r for r in rows}
    assert by_kind["image"]["query"] == "22" and by_kind["image"]["query_image_file"] == "im22.png"
    assert by_kind["image"]["item_text"] == ds.captions[44] and by_kind["image"]["relevant"] == "1"
    assert by_kind["caption"]["query_caption"] == ds.captions[45] and by_kind["caption"]["item_image_file"] == "im7.png"
    assert by_kind["caption"]["relevant"] == "0" and by_kind["caption"]["annotator"] == "ann"
    assert by_kind["text"]["query_caption"] == "a blue thing"

    # no dataset: the index columns still say what each mark is
    rows = list(csv.DictReader(export_marks(store, None, tmp_path / "bare.csv").open(encoding="utf-8")))
    assert [r["item"] for r in rows] == ["44", "7", "3"] and not any(r["item_image_file"] for r in rows)


def test_export_to_json_lines_is_the_store_s_own(tmp_path: Path) -> None:
    store = AnnotationStore(tmp_path / "run")
    store.mark("i2t", {"image": 1}, 2, True, "x")
    out = export_marks(store, _dataset(), tmp_path / "marks.jsonl")
    lines = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [(x["item"], x["relevant"]) for x in lines] == [(2, True)]


def test_marks_summary() -> None:
    assert [marks_summary(n) for n in (0, 1, 2)] == ["0 marks saved", "1 mark saved", "2 marks saved"]


def test_mark_buttons_ask_and_say_how_many(qtbot, tmp_path: Path, monkeypatch) -> None:
    """The buttons alone: each asks for its mark, the line counts the store, Export writes the CSV it is given."""
    pytest.importorskip("pytestqt")
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QFileDialog

    from crossview.gui.marks import MarkButtons

    w = MarkButtons()
    qtbot.addWidget(w)
    asked = []
    w.mark_requested.connect(asked.append)
    for b in (w.yes, w.no, w.clear):
        qtbot.mouseClick(b, Qt.MouseButton.LeftButton)
    assert asked == [True, False, None]
    assert [b.text() for b in w.buttons] == ["Relevant (R)", "Not relevant (N)", "Clear mark (0)", "Export marks..."]
    w.refresh()
    assert w.label.text() == ""                         # no store: nothing to count
    w.store, w.dataset = AnnotationStore(tmp_path / "run"), _dataset()
    w.refresh()
    assert w.label.text() == ""                         # an empty store says nothing either (as before)
    w.store.mark("i2t", {"image": 22}, 44, True, "x")
    w.refresh()
    assert w.label.text() == "1 mark saved"
    target = tmp_path / "out.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), ""))
    qtbot.mouseClick(w.export_button, Qt.MouseButton.LeftButton)
    assert w.label.text() == f"exported 1 marks to {target}"
    assert list(csv.DictReader(target.open(encoding="utf-8")))[0]["query_image_file"] == "im22.png"


@pytest.mark.gui
def test_an_unsaved_mark_is_shown_kept_and_retried_and_export_reads_the_file(qtbot, tmp_path: Path,
                                                                             monkeypatch) -> None:
    """A failed write turns the line red ("NOT saved", the reason in its tooltip) with a Retry button; Retry
    writes it once the folder is writable again. The CSV export holds marks another window wrote, and the line
    says how many unreadable lines the file had."""
    import errno

    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QFileDialog

    from crossview.engine.annotations import MarkNotSaved
    from crossview.gui.marks import MarkButtons

    w = MarkButtons()
    qtbot.addWidget(w)
    w.show()
    w.store, w.dataset = AnnotationStore(tmp_path / "run"), _dataset()
    real = AnnotationStore._write
    monkeypatch.setattr(AnnotationStore, "_write",
                        lambda self, recs: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(MarkNotSaved) as failed:
        w.store.mark("i2t", {"image": 22}, 44, True, "x")
    w.refresh(str(failed.value))
    assert "0 marks saved, 1 NOT saved" in w.label.text() and "No space left" in w.label.toolTip()
    assert w.retry_button.isVisible()
    qtbot.mouseClick(w.retry_button, Qt.MouseButton.LeftButton)      # still full: still kept, still said
    assert "1 NOT saved" in w.label.text() and len(w.store.pending) == 1
    assert w.storage_box is not None and w.storage_box.windowTitle() == "Disk full"   # and in its dialog
    w.storage_box.close()
    monkeypatch.setattr(AnnotationStore, "_write", real)
    qtbot.mouseClick(w.retry_button, Qt.MouseButton.LeftButton)
    assert w.label.text() == "1 mark saved" and not w.retry_button.isVisible()
    other = AnnotationStore(tmp_path / "run", annotator="other window")
    other.mark("t2i", {"caption": 45}, 7, False)
    with open(w.store.path, "ab") as f:
        f.write(b"\xff\xfe torn\n")
    target = tmp_path / "out.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), ""))
    qtbot.mouseClick(w.export_button, Qt.MouseButton.LeftButton)
    assert w.label.text() == f"exported 2 marks to {target} (1 unreadable line of the file skipped)"
    rows = list(csv.DictReader(target.open(encoding="utf-8")))
    assert sorted(r["annotator"] for r in rows) == sorted([w.store.annotator, "other window"])
