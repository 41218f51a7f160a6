"""The main window: panels in tabs, a menu with recent datasets, a status bar, persistent settings.

Datasets load in a background task (the demo renders on first use), so the window stays responsive.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QFileDialog, QLabel, QMainWindow, QMenu, QMessageBox, QProgressBar, QTabWidget,
                               QWidget)

from crossview.data.dataset import PairedDataset, TextCorpus
from crossview.gui.panels.data_panel import DataPanel
from crossview.gui.workers import Task
from crossview.settings import get_settings

MAX_RECENT = 8


def gui_settings() -> QSettings:
    """The app's persistent GUI settings, an INI file in the user data folder (CROSSVIEW_HOME)."""
    home = get_settings().home
    home.mkdir(parents=True, exist_ok=True)
    return QSettings(str(home / "gui.ini"), QSettings.Format.IniFormat)


def _load(source: str):
    """The work of opening a dataset, off the GUI thread (the demo reports its rendering progress)."""
    def work(progress, should_stop):
        from crossview.data import load_dataset
        if source == "demo":
            from crossview.data.demo import load_demo
            return load_demo(progress=progress)
        return load_dataset(source)
    return work


class MainWindow(QMainWindow):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("CrossView")
        self.settings = gui_settings()
        self.dataset: PairedDataset | None = None
        self.dataset_source: str | None = None
        self._task: Task | None = None

        self.tabs = QTabWidget()
        self.data_panel = DataPanel()
        self.tabs.addTab(self.data_panel, "Data")
        self.setCentralWidget(self.tabs)

        self.status_dataset = QLabel("No dataset")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(220)
        self.progress.hide()
        self.statusBar().addWidget(self.status_dataset, 1)
        self.statusBar().addPermanentWidget(self.progress)

        self.setAcceptDrops(True)
        self._build_menu()
        geometry = self.settings.value("window/geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        else:
            self.resize(1280, 820)

    # ------------------------------------------------------------------ menu
    def _build_menu(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        act = QAction("Open dataset &file...", self, shortcut=QKeySequence.StandardKey.Open)
        act.setStatusTip("Open a Karpathy JSON, CUHK-PEDES JSON, captions.jsonl/csv, tags or corpus file")
        act.triggered.connect(self.choose_dataset_file)
        file_menu.addAction(act)
        act = QAction("Open dataset f&older...", self, shortcut=QKeySequence("Ctrl+Shift+O"))
        act.setStatusTip("Open a dataset folder (precomp, CUB/Flowers, captions folder)")
        act.triggered.connect(self.choose_dataset_folder)
        file_menu.addAction(act)
        act = QAction("Open the built-in &demo", self, shortcut=QKeySequence("Ctrl+D"))
        act.triggered.connect(lambda: self.open_dataset("demo"))
        file_menu.addAction(act)
        self.recent_menu = QMenu("&Recent datasets", self)
        file_menu.addMenu(self.recent_menu)
        self._refresh_recent()
        file_menu.addSeparator()
        act = QAction("&Quit", self, shortcut=QKeySequence.StandardKey.Quit)
        act.triggered.connect(self.close)
        file_menu.addAction(act)

        view_menu = self.menuBar().addMenu("&View")
        for i in range(self.tabs.count()):
            act = QAction(self.tabs.tabText(i), self, shortcut=QKeySequence(f"Ctrl+{i + 1}"))
            act.triggered.connect(lambda _=False, i=i: self.tabs.setCurrentIndex(i))
            view_menu.addAction(act)
        find = QAction("&Filter captions", self, shortcut=QKeySequence.StandardKey.Find)
        find.triggered.connect(self._focus_filter)
        view_menu.addAction(find)

        help_menu = self.menuBar().addMenu("&Help")
        act = QAction("&About CrossView", self)
        act.triggered.connect(self._about)
        help_menu.addAction(act)

    def _focus_filter(self) -> None:
        self.tabs.setCurrentWidget(self.data_panel)
        self.data_panel.filter_edit.setFocus()
        self.data_panel.filter_edit.selectAll()

    def _about(self) -> None:
        from crossview import __version__
        QMessageBox.about(self, "About CrossView",
                          f"<b>CrossView {__version__}</b><p>Cross-modal image &harr; text retrieval: "
                          "browse datasets, train, query and inspect.</p>")

    def _refresh_recent(self) -> None:
        self.recent_menu.clear()
        recent = self.recent_datasets()
        for src in recent:
            act = QAction(src, self)
            act.triggered.connect(lambda _=False, s=src: self.open_dataset(s))
            self.recent_menu.addAction(act)
        self.recent_menu.setEnabled(bool(recent))

    def recent_datasets(self) -> list[str]:
        value = self.settings.value("recent/datasets", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or [])]

    def _remember(self, source: str) -> None:
        recent = [s for s in self.recent_datasets() if s != source]
        self.settings.setValue("recent/datasets", [source, *recent][:MAX_RECENT])
        self._refresh_recent()

    def choose_dataset_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open dataset", str(Path.home()),
            "Datasets (*.json *.jsonl *.csv *.txt);;All files (*)")
        if path:
            self.open_dataset(path)

    def choose_dataset_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open dataset folder", str(Path.home()))
        if path:
            self.open_dataset(path)

    # ------------------------------------------------------------------ loading
    def open_dataset(self, source: str) -> Task:
        """Loads ``source`` (a path or 'demo') in the background; the panels update when it is ready."""
        if self._task is not None and self._task.is_running():
            self._task.cancel()  # superseded: its result is dropped
        source = str(source)
        task = Task(_load(source), name="open-dataset", parent=self)
        self._task = task
        self.status_dataset.setText(f"Opening {source} ...")
        self.progress.setRange(0, 0)
        self.progress.show()
        task.progress.connect(lambda done, total, t=task: self._on_progress(t, done, total))
        task.succeeded.connect(lambda ds, t=task: self._on_loaded(t, source, ds))
        task.failed.connect(lambda msg, details, t=task: self._on_failed(t, source, msg, details))
        task.finished.connect(lambda t=task: self._on_finished(t))
        return task.start()

    def _on_progress(self, task: Task, done: int, total: int) -> None:
        if task is self._task:
            self.progress.setRange(0, total)
            self.progress.setValue(done)
            self.status_dataset.setText(f"Rendering the demo dataset (first use only): {done}/{total} images")

    def _on_loaded(self, task: Task, source: str, ds) -> None:
        if task is not self._task:
            return
        if isinstance(ds, TextCorpus):
            self._on_failed(task, source, f"{source} is a text-only caption corpus ({ds.n_captions:,} captions); "
                            "open an image dataset here and use the corpus as a gallery in the Query panel.", "")
            return
        self.dataset = ds
        self.dataset_source = source
        self.data_panel.set_dataset(ds)
        self.status_dataset.setText(f"Dataset: {ds.name}  ({ds.n_images:,} images, {ds.n_captions:,} captions)")
        self.setWindowTitle(f"CrossView - {ds.name}")
        self._remember(source)
        if ds.warnings:
            self.statusBar().showMessage("; ".join(ds.warnings), 15000)

    def _on_failed(self, task: Task, source: str, message: str, details: str) -> None:
        if task is not self._task:
            return
        self.status_dataset.setText("No dataset" if self.dataset is None else
                                    f"Dataset: {self.dataset.name}")
        box = QMessageBox(QMessageBox.Icon.Warning, "Cannot open dataset", message, parent=self)
        box.setInformativeText(f"Source: {source}")
        if details:
            box.setDetailedText(details)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()
        self.last_error = message

    def _on_finished(self, task: Task) -> None:
        if task is self._task:
            self.progress.hide()

    # ------------------------------------------------------------------ drag and drop
    @staticmethod
    def _dropped_path(event) -> str | None:
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        local = [u.toLocalFile() for u in urls if u.isLocalFile()]
        return local[0] if len(local) == 1 else None

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt API)
        if self._dropped_path(event):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 (Qt API)
        """A dataset file or folder dropped anywhere on the window opens it."""
        path = self._dropped_path(event)
        if path:
            event.acceptProposedAction()
            self.open_dataset(path)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        self.settings.setValue("window/geometry", self.saveGeometry())
        if self._task is not None and self._task.is_running():
            self._task.cancel()
            self._task.wait(5000)
        self.data_panel.cache.clear_pending()
        self.data_panel.cache.wait_idle(5000)
        super().closeEvent(event)
