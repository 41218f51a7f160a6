"""A second dataset slot of the Train form: a dataset a method trains on besides the run's (its
``auxiliary_format`` names the slot and its reader; webly: ``{"web": "webtags"}``, the web image-tag set of
Stage II).

The slot offers *none*, *the demo's web set* (when the run's dataset is the demo) or *a file or folder*
(a path field with Browse... for either), and says under it what is loaded ("web set: 800 images, 1,611
distinct tags"). A path that does not exist is said at once, inline; the set itself is read in a worker
(:class:`~crossview.gui.workers.Task`), so a large collection never blocks the GUI thread, and an answer for a
value that has since changed is dropped. :meth:`DatasetSlot.problem` is what the Train panel refuses Start
with. The value (``""``, ``"demo"`` or a path) is the method's parameter of the same name.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QComboBox, QFileDialog, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QMenu,
                               QToolButton, QVBoxLayout, QWidget)

from crossview.core.errors import CrossViewError
from crossview.gui.workers import Task

NONE, DEMO, PATH = "none", "demo", "path"
MUTED = "color: #57606a"
ERROR = "color: #cf222e"

#: what a file or folder of each reader format holds (the path field's hint)
FORMAT_HINT = {"webtags": "a tags.jsonl / .csv / .txt, or a folder of images with .tags files"}


def describe_dataset(source: str, fmt: str | None, label: str) -> str:
    """One line saying what ``source`` (``"demo"`` = the demo's web set, or a path read as ``fmt``) holds:
    ``"web set: 800 images, 1,611 distinct tags"``. Raises CrossViewError (one line) when it cannot be read
    or holds nothing a method could train on. Runs in a worker: reading a collection may take seconds."""
    if source == "demo":
        from crossview.data.demo import load_demo_web
        ds = load_demo_web()
    else:
        from crossview.data import load_dataset
        ds = load_dataset(source, format=fmt)
    n = int(getattr(ds, "n_images", 0))
    tags = getattr(ds, "tags", None)
    if tags is not None:
        distinct = len({t for ts in tags for t in ts})
        untagged = sum(1 for ts in tags if not ts)
        if not distinct:
            raise CrossViewError(f"{label} set {source}: {n:,} images but no tags; give an image-tag collection "
                                 "(tags.jsonl, or images with .tags files beside them)")
        text = f"{label} set: {n:,} images, {distinct:,} distinct tags"
        if untagged:
            text += f" ({untagged:,} images without tags)"
    else:
        text = f"{label} set: {n:,} images, {len(getattr(ds, 'captions', [])):,} captions"
    if not getattr(ds, "image_paths", None):
        raise CrossViewError(f"{label} set {source}: no image files (a dataset of feature rows); its images must "
                             "be encoded as the run's are: give a folder or list of images")
    return text


class DatasetSlot(QGroupBox):
    """The slot for one auxiliary dataset; ``described(str)`` carries the line shown under it (a description
    or an error) each time it changes."""

    described = Signal(str)
    changed = Signal()

    def __init__(self, name: str, fmt: str | None, help_text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(f"Second dataset: {name}", parent)
        self.name = name
        self.fmt = fmt
        self._error: str | None = None          # why the current value cannot be trained on (None: fine/unknown)
        self._loading = False
        self._task: Task | None = None
        self._tasks: set[Task] = set()          # running readers (kept alive until their thread ends)
        self.setToolTip(help_text)
        self.source = QComboBox()
        self.source.addItem("none (train without it)", NONE)
        self.source.addItem("the demo's web set", DEMO)
        self.source.addItem("a file or folder", PATH)
        self.source.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.source.setMinimumContentsLength(10)
        self.source.setToolTip(help_text)
        self.path = QLineEdit()
        self.path.setPlaceholderText(FORMAT_HINT.get(fmt or "", "a file or folder"))
        self.path.setToolTip(FORMAT_HINT.get(fmt or "", "a file or folder") + f" (read as {fmt or 'detected'})")
        self.browse = QToolButton()
        self.browse.setText("Browse...")
        self.browse.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.browse.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.browse)
        self.browse_file_action = menu.addAction("File...", self.browse_file)
        self.browse_folder_action = menu.addAction("Folder...", self.browse_folder)
        self.browse.setMenu(menu)
        self.browse.setStyleSheet("QToolButton::menu-indicator { image: none; width: 0px; }")   # "Browse..." whole
        # what the slot is for, from the card's help ("The web image-tag set of Stage II: ..." -> its first clause)
        self.lead = QLabel(help_text.split(":", 1)[0].strip().rstrip(".") if help_text else "")
        self.lead.setWordWrap(True)
        self.lead.setStyleSheet(MUTED)
        self.lead.setVisible(bool(self.lead.text()))
        self.info = QLabel("")
        self.info.setWordWrap(True)
        self.info.setTextFormat(Qt.TextFormat.RichText)
        self.path_row = QWidget()
        pr = QHBoxLayout(self.path_row)
        pr.setContentsMargins(0, 0, 0, 0)
        pr.addWidget(self.path, 1)
        pr.addWidget(self.browse)
        lay = QVBoxLayout(self)
        lay.addWidget(self.lead)
        lay.addWidget(self.source)
        lay.addWidget(self.path_row)
        lay.addWidget(self.info)
        self._timer = QTimer(self)               # typing: read the set once the user pauses
        self._timer.setSingleShot(True)
        self._timer.setInterval(300)
        self._timer.timeout.connect(self._describe)
        self.source.currentIndexChanged.connect(self._on_source)
        self.path.textChanged.connect(lambda _t: self._timer.start())
        self.set_demo_available(False)
        self._on_source()

    # ------------------------------------------------------------------ value
    def value(self) -> str:
        """The method parameter: ``""`` (none), ``"demo"`` or the path as typed (stripped)."""
        kind = self.source.currentData()
        return "" if kind == NONE else "demo" if kind == DEMO else self.path.text().strip()

    def set_value(self, value: Any) -> None:
        """Show ``value`` (``""``/None, ``"demo"`` or a path); the demo choice appears if it was hidden."""
        v = "" if value is None else str(value).strip()
        if v == "demo":
            self._demo_item_visible(True)
        if v and v != "demo":
            self.path.setText(v)
        self.source.setCurrentIndex(self.source.findData(NONE if not v else DEMO if v == "demo" else PATH))
        self._describe()

    def set_demo_available(self, on: bool) -> None:
        """Offer "the demo's web set" (when the run's dataset is the demo); choosing another dataset drops it."""
        if not on and self.source.currentData() == DEMO:
            self.source.setCurrentIndex(self.source.findData(NONE))
        self._demo_item_visible(on)

    def _demo_item_visible(self, on: bool) -> None:
        view = self.source.view()
        row = self.source.findData(DEMO)
        if hasattr(view, "setRowHidden"):
            view.setRowHidden(row, not on)
        item = self.source.model().item(row) if hasattr(self.source.model(), "item") else None
        if item is not None:
            item.setEnabled(on)

    def demo_available(self) -> bool:
        item = self.source.model().item(self.source.findData(DEMO))
        return bool(item is not None and item.isEnabled())

    def problem(self) -> str | None:
        """Why a run cannot start with this slot's value (one line), or None. A set still being read is no
        problem here: the engine reads it again and says what is wrong."""
        if self.source.currentData() == PATH and not self.value():
            return (f"{self.name} set: choose a file or folder ({FORMAT_HINT.get(self.fmt or '', 'a dataset')}) "
                    "with Browse..., or choose none")
        return self._error

    def is_loading(self) -> bool:
        return self._loading

    # ------------------------------------------------------------------ browsing
    def browse_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, f"{self.name} set: a file", self._start_dir(),
                                              "Tag lists (tags.jsonl tags.csv tags.txt *.jsonl *.csv *.txt);;"
                                              "All files (*)")
        if path:
            self.set_value(path)

    def browse_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, f"{self.name} set: a folder", self._start_dir())
        if path:
            self.set_value(path)

    def _start_dir(self) -> str:
        p = Path(self.path.text().strip()).expanduser()
        return str(p if p.is_dir() else p.parent if p.parent.is_dir() else Path.home())

    # ------------------------------------------------------------------ describing
    def _on_source(self, *_: object) -> None:
        self.path_row.setVisible(self.source.currentData() == PATH)
        self._describe()

    def _show(self, text: str, error: bool) -> None:
        self.info.setStyleSheet(ERROR if error else MUTED)
        self.info.setText(html.escape(text))
        self.described.emit(text)

    def _describe(self) -> None:
        """Say what the current value holds: at once for none, an empty or a missing path; by a worker otherwise."""
        self._timer.stop()
        self._task = None                        # an answer still coming is for an older value: dropped
        self._loading = False
        self.changed.emit()
        value, kind = self.value(), self.source.currentData()
        self._error = None
        if kind == NONE:
            self._show(f"none: the run trains without a {self.name} set", False)
            return
        if kind == PATH and not value:
            self._show(f"choose a file or folder: {FORMAT_HINT.get(self.fmt or '', 'a dataset')}", True)
            return
        if kind == PATH and not Path(value).expanduser().exists():
            self._error = (f"{self.name} set {value}: no such file or folder; give "
                           f"{FORMAT_HINT.get(self.fmt or '', 'a dataset')} (Browse...)")
            self._show(self._error, True)
            return
        source = "demo" if kind == DEMO else str(Path(value).expanduser())
        self._loading = True
        self._show(f"reading the {self.name} set...", False)
        task = Task(lambda progress, should_stop: describe_dataset(source, self.fmt, self.name),
                    name=f"{self.name}-set", parent=self)
        self._task = task
        self._tasks.add(task)
        task.succeeded.connect(lambda text, t=task: self._done(t, text, None))
        task.failed.connect(lambda msg, _details, t=task: self._done(t, "", msg))
        task.finished.connect(lambda t=task: self._tasks.discard(t))
        task.start()

    def _done(self, task: Task, text: str, error: str | None) -> None:
        if task is not self._task:
            return
        self._loading = False
        self._error = error
        self._show(error or text, error is not None)

    def wait(self, msecs: int = 30000) -> None:
        """Block until the readers end (closing the panel, tests)."""
        for t in list(self._tasks):
            t.wait(msecs)
