"""Relevance marks in the Query panel: the mark buttons with their "n marks saved" line (:class:`MarkButtons`),
and the export that names each mark's query and item by file and caption (:func:`export_marks`).

The marks themselves live in the run's ``annotations.jsonl`` (:class:`crossview.engine.annotations.AnnotationStore`,
written at once on every mark). Which result a mark is for (the current one), its look in the result list and
the R / N / 0 shortcuts are the Query panel's (:mod:`crossview.gui.panels.query_panel`). The functions here
need no widget (a script can export a run's marks with them); :class:`MarkButtons` needs no panel.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QMessageBox, QPushButton, QWidget

from crossview.core.errors import CrossViewError, StorageError
from crossview.core.io import atomic_write_bytes
from crossview.core.text import html_text
from crossview.engine.annotations import AnnotationStore, MarkNotSaved, query_key
from crossview.gui.storage_dialog import show_storage_error, storage_error_of, storage_text, storage_title

__all__ = ["describe_query", "export_marks", "marks_summary", "CSV_COLUMNS", "MarkButtons"]

#: what a full disk under the run's marks file asks the person to do once there is space
MARKS_THEN = "press Retry saving (the marks are kept until then)"
#: the columns of an exported marks CSV, in order
CSV_COLUMNS = ("time", "annotator", "direction", "query_kind", "query", "query_image_file", "query_caption",
               "item", "item_image_file", "item_text", "relevant")


def marks_summary(n: int, pending: int = 0, skipped: int = 0) -> str:
    """``"3 marks saved"`` (``"1 mark saved"``): the line beside the mark buttons; ``pending`` marks not yet
    written and ``skipped`` unreadable lines of the file are said too."""
    saved = n - pending
    text = f"{saved} mark{'s' if saved != 1 else ''} saved"
    if pending:
        text += f", {pending} NOT saved (kept: Retry)"
    if skipped:
        text += f"; {skipped} unreadable line{'s' if skipped != 1 else ''} in the file skipped"
    return text


def describe_query(dataset: Any, query: dict[str, Any]) -> tuple[str, str]:
    """``(image file name, caption text)`` of a marked ``query``, as far as ``dataset`` (may be None) knows them."""
    ds = dataset
    image, caption = "", ""
    try:
        if "image" in query and ds is not None:
            i = int(query["image"])
            if ds.image_paths is not None and 0 <= i < ds.n_images:
                image = Path(str(ds.image_paths[i])).name
        elif "file" in query:
            image = Path(str(query["file"])).name
        elif "caption" in query and ds is not None:
            c = int(query["caption"])
            if 0 <= c < ds.n_captions:
                caption = ds.captions[c]
        elif "text" in query:
            caption = str(query["text"])
        elif "tags" in query:
            caption = f"tags: {query['tags']}"
    except (TypeError, ValueError):
        pass            # a hand-edited mark: its index columns still say what it is
    return image, caption


def export_marks(annotations: AnnotationStore, dataset: Any, path: str | Path) -> Path:
    """The marks of ``annotations`` to ``path`` (.csv or .jsonl, atomically); returns ``path``. The CSV
    (:data:`CSV_COLUMNS`) names each query by its image file name or caption text beside the index, and each
    item by its caption / image file, looked up in ``dataset`` (None: the index columns only)."""
    path = Path(path)
    if path.suffix.lower() != ".csv":
        return annotations.export(path)
    annotations.reload()        # every process's marks, not only this window's
    ds = dataset
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for r in annotations.records():
        kind, _, value = query_key(r["query"]).partition(":")
        image, caption = describe_query(ds, r["query"])
        item_file = ""
        if r["direction"] == "t2i" and ds is not None and ds.image_paths is not None and \
                0 <= int(r["item"]) < ds.n_images:
            item_file = Path(str(ds.image_paths[int(r["item"])])).name
        if "photos" in r["query"]:          # a photo folder's result: its path is the mark's item_text
            item_file = Path(str(r.get("item_text", ""))).name
        w.writerow([r.get("time", ""), r.get("annotator", ""), r["direction"], kind, value, image, caption,
                    r["item"], item_file, r.get("item_text", ""), int(bool(r["relevant"]))])
    return atomic_write_bytes(path, buf.getvalue().encode("utf-8"))


class MarkButtons(QWidget):
    """Relevant (R) / Not relevant (N) / Clear mark (0) / Export marks..., after the line that says how many
    marks :attr:`store` holds (None: the run has no folder, so no marks).

    A mark button only asks (:attr:`mark_requested`: True, False or None): the owner knows which result is
    current, marks it in :attr:`store` and calls :meth:`refresh`. Export asks for a file and writes it with
    :func:`export_marks` against :attr:`dataset` (the dataset the run ranks, for file names and captions).
    """

    mark_requested = Signal(object)     # True (relevant), False (not relevant), None (clear the mark)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store: AnnotationStore | None = None
        self.dataset: Any = None
        self.label = QLabel("")
        self.yes = QPushButton("Relevant (R)")
        self.no = QPushButton("Not relevant (N)")
        self.clear = QPushButton("Clear mark (0)")
        self.export_button = QPushButton("Export marks...")
        self.retry_button = QPushButton("Retry saving")
        self.retry_button.setToolTip("Write the marks the run's annotations file could not take")
        self.retry_button.hide()
        self._storage_said = False      # the storage dialog was shown for the current run of unsaved marks
        #: the last storage dialog opened (a full disk), for tests and screenshots
        self.storage_box: QMessageBox | None = None
        self.retry_button.clicked.connect(self.retry)
        self.yes.clicked.connect(lambda: self.mark_requested.emit(True))
        self.no.clicked.connect(lambda: self.mark_requested.emit(False))
        self.clear.clicked.connect(lambda: self.mark_requested.emit(None))
        self.export_button.clicked.connect(self._export_dialog)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        for w in (self.label, self.retry_button, *self.buttons):
            row.addWidget(w)

    @property
    def buttons(self) -> tuple[QPushButton, ...]:
        """The mark buttons and the export button, in their order."""
        return (self.yes, self.no, self.clear, self.export_button)

    def refresh(self, error: str | BaseException = "") -> None:
        """Say how many marks the store holds ("" without a store), how many wait to be written and how many lines
        of its file were unreadable; ``error`` (a failed write: its message, or the :class:`MarkNotSaved`) turns
        the line red with the reason in its tooltip. A full disk or an unwritable run folder is also said in the
        storage dialog (:func:`~crossview.gui.storage_dialog.show_storage_error`: the path, the bytes needed,
        what to do), once for each time the marks stop being saved."""
        store = self.store
        storage = storage_error_of(error) if isinstance(error, BaseException) else None
        if storage is not None:
            error = f"{storage_text(storage, 'the marks', MARKS_THEN, elsewhere=False)}\n{error}"
            if not self._storage_said:
                self._storage_said = True
                self.storage_box = show_storage_error(self, storage, "the marks", MARKS_THEN, elsewhere=False)
        error = str(error)
        if store is None or not store.pending:
            self._storage_said = False
        self.retry_button.setVisible(bool(store is not None and store.pending))
        if store is None or not (len(store) or store.skipped or error):     # nothing to count: say nothing
            self.label.setText("")
            self.label.setToolTip("")
            return
        text = html_text(marks_summary(len(store), len(store.pending), store.skipped))
        if storage is not None:
            text = f"{html_text(storage_title(storage))}: {text}"
        if store.pending or error:
            text = f"<span style='color:#cf222e'>{text}</span>"
        self.label.setText(text)
        self.label.setToolTip(error or (f"{store.path}" if not store.pending else ""))

    def retry(self) -> int:
        """Write the store's pending marks; says the outcome in the label. Returns how many were written."""
        if self.store is None:
            return 0
        try:
            n = self.store.retry()
        except MarkNotSaved as e:
            self._storage_said = False      # asked again by the person: said again
            self.refresh(e)
            return 0
        self.refresh()
        return n

    def export(self, path: str | Path) -> Path:
        """:func:`export_marks` of :attr:`store` (which must be set) to ``path``."""
        assert self.store is not None
        return export_marks(self.store, self.dataset, path)

    def _export_dialog(self) -> None:
        if self.store is None:
            return
        path, _ = QFileDialog.getSaveFileName(self, "Export marks", str(self.store.path.with_suffix(".csv")),
                                              "CSV (*.csv);;JSON lines (*.jsonl)")
        if path:
            try:
                self.export(path)
            except StorageError as e:       # a full disk or an unwritable folder: say so, offer another folder
                self.label.setText(f"<span style='color:#cf222e'>{html_text(storage_title(e))}: marks not "
                                   f"exported</span>")
                self.storage_box = show_storage_error(self, e, "the marks export", "export again")
                return
            except CrossViewError as e:
                self.label.setText(f"<span style='color:#cf222e'>{html_text(str(e))}</span>")
                return
            skipped = self.store.skipped
            note = f" ({skipped} unreadable line{'s' if skipped != 1 else ''} of the file skipped)" if skipped else ""
            self.label.setText(html_text(f"exported {len(self.store)} marks to {path}{note}"))
