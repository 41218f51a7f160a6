"""The main window: the Data, Train, Query and Inspect panels in tabs, menus with recent datasets and
runs, a status bar with the dataset, run and device, persistent settings, and a full-screen
presentation mode (F11) for live demos.

Datasets and runs load in background tasks (the demo renders on first use), so the window stays
responsive. The panels talk through the window: a finished run opens in Query and Inspect, a query
picked in Inspect opens in Query, an image picked in Data can be queried. A folder of one's own photos (File >
Open photo folder..., or dropped) becomes a gallery of the Query panel; an image file dropped anywhere queries
with it; a dropped folder that is a dataset opens as one.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np

from PySide6.QtCore import QRect, QSettings, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (QFileDialog, QInputDialog, QLabel, QMainWindow, QMenu, QMessageBox, QProgressBar,
                               QStyle, QTabWidget, QWidget)

from crossview.core.text import printable
from crossview.data.dataset import PairedDataset, TextCorpus
from crossview.gui.panels.data_panel import DataPanel
from crossview.gui.panels.inspect_panel import InspectPanel
from crossview.gui.panels.query_panel import QueryPanel
from crossview.gui.panels.train_panel import TrainPanel
from crossview.gui.workers import Task, engine_loader, import_quietly, stop_all
from crossview.core.settings import get_settings

MAX_RECENT = 8
#: The window's first size: this share of the screen's available area, at most MAX_START_SIZE.
START_FRACTION = 0.9
MAX_START_SIZE = (1920, 1200)
OPEN_AS_FORMAT = "File > Open dataset as format..."
FOLDER_FORMATS = ("reed", "precomp", "folder")     # readers that take a folder (the others take a file)


def gui_message(message: str) -> str:
    """A loader's message for the app: the CLI's ``--format`` hint becomes the menu entry that does it."""
    def menu_hint(m: re.Match) -> str:
        text = f"choose the format with {OPEN_AS_FORMAT}"
        return text[0].upper() + text[1:] if m.group(0)[0].isupper() else text
    message = re.sub(r"(?:pass|name it with|name the format with|with) --format", menu_hint, message,
                     flags=re.IGNORECASE)
    return message.replace("--format", OPEN_AS_FORMAT)


def gui_settings() -> QSettings:
    """The app's persistent GUI settings, an INI file in the user data folder (CROSSVIEW_HOME)."""
    home = get_settings().home
    home.mkdir(parents=True, exist_ok=True)
    return QSettings(str(home / "gui.ini"), QSettings.Format.IniFormat)


def _load(source: str, format: str | None = None):
    """The work of opening a dataset, off the GUI thread (the demo reports its rendering progress)."""
    def work(progress, should_stop):
        from crossview.data import load_dataset
        from crossview.gui.panels.data_panel import prepare_browsing
        if source == "demo":
            from crossview.data.demo import load_demo
            ds = load_demo(progress=progress)
        else:
            ds = load_dataset(source, format=format)
        return (ds, prepare_browsing(ds)) if isinstance(ds, PairedDataset) else (ds, None)
    return work


def start_size(available: QSize, minimum: QSize | None = None) -> QSize:
    """The window's first size on a screen whose available area is ``available``: START_FRACTION of it, at
    most MAX_START_SIZE, at least the window's ``minimum`` size as far as the screen allows."""
    w = min(int(available.width() * START_FRACTION), MAX_START_SIZE[0])
    h = min(int(available.height() * START_FRACTION), MAX_START_SIZE[1])
    if minimum is not None and minimum.isValid():
        w = min(max(w, minimum.width()), available.width())
        h = min(max(h, minimum.height()), available.height())
    return QSize(w, h)


def run_eval_split(run) -> str | None:
    """The split a run was evaluated on (``OpenRun.eval_split``, else config.json ``"split"``)."""
    split = getattr(run, "eval_split", None) or (run.config or {}).get("split")
    return str(split) if split else None


def open_run_cached(run_dir: str, gallery: object = None):
    """``(run, retriever)`` of the run in ``run_dir`` from its gallery cache alone
    (:func:`crossview.engine.gallery_cache.open_cached_retriever`: the summary's split, the gallery's embeddings
    memory-mapped, its ids and captions; no dataset, no feature rows), what the app shows first while it opens the
    run in full; None when the cache does not hold it all yet (the first opening fills it), the gallery is a
    corpus, or the run's own scoring needs a bank it has not stored (``bank_<train>.npz``)."""
    from crossview.engine.gallery_cache import open_cached_retriever
    from crossview.engine.run import read_config
    from crossview.engine.scoring import bank_path, run_scoring

    if gallery is not None and not isinstance(gallery, str) or str(gallery).startswith("corpus:"):
        return None
    try:
        config = read_config(run_dir)
    except Exception:  # noqa: BLE001 - the full path says what is wrong with the folder, in its words
        return None
    train_split = str(config.get("train_split") or "train")
    if run_scoring(config)["scoring"] != "plain" and not bank_path(run_dir, train_split).is_file():
        return None
    try:
        return open_cached_retriever(run_dir, gallery, with_splits=True)
    except Exception:  # noqa: BLE001 - a cache that cannot answer: the full path opens the run
        return None


class MainWindow(QMainWindow):
    #: (task, (run, retriever, annotations, results)): a run opening shown from its gallery cache before the task
    #: has opened it in full (text queries work; dataset-image queries wait for the full run)
    run_previewed = Signal(object, object)
    #: the engine's modules are imported (in the background, after the window is shown) and the devices listed
    engine_loaded = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("CrossView")
        self.settings = gui_settings()
        self.dataset: PairedDataset | None = None
        self.dataset_source: str | None = None
        self._task: Task | None = None
        self._run_task: Task | None = None
        self._drop_task: Task | None = None      # sorting a dropped folder: a dataset, or photos to search
        self._dropped = ""
        self.run = None            # the OpenRun shown in Query / Inspect
        self._run_show: str | None = None
        self.run_partial = False   # self.run is a CachedRun from the gallery cache while the run opens in full
        self.run_previewed.connect(self._on_run_previewed)
        self.presenting = False

        self.tabs = QTabWidget()
        self.data_panel = DataPanel()
        self.train_panel = TrainPanel(preload=False)     # the engine is imported once the window is up
        self.query_panel = QueryPanel()
        self.inspect_panel = InspectPanel()
        self.tabs.addTab(self.data_panel, "Data")
        self.tabs.addTab(self.train_panel, "Train")
        self.tabs.addTab(self.query_panel, "Query")
        self.tabs.addTab(self.inspect_panel, "Inspect")
        self.setCentralWidget(self.tabs)
        self.train_panel.run_finished.connect(lambda d: self.open_run(d, show=None))
        self.train_panel.open_run.connect(lambda d: self.open_run(d, show="query"))
        self.train_panel.inspect_run.connect(lambda d: self.open_run(d, show="inspect"))
        self.train_panel.runs_changed.connect(self._refresh_recent_runs)
        self.inspect_panel.open_query.connect(self._open_query_from_inspect)
        self.query_panel.show_image.connect(self.data_panel.select_image)
        self.query_panel.gallery_requested.connect(self._change_gallery)
        self.data_panel.query_requested.connect(self.query_image)

        self.status_dataset = QLabel("No dataset")
        self.status_run = QLabel("No run")
        # the device needs torch (and CUDA initialised): known once the engine is loaded (_load_engine)
        self.status_device = QLabel("Device: ...")
        self._engine = "idle"     # "wanted" once the window is shown, "started" once the import is asked for
        self.engine_ready = False   # engine_loaded was sent
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(220)
        self.progress.hide()
        self.statusBar().addWidget(self.status_dataset, 1)
        self.statusBar().addWidget(self.status_run, 1)
        self.statusBar().addPermanentWidget(self.status_device)
        self.statusBar().addPermanentWidget(self.progress)

        self.setAcceptDrops(True)
        self._build_menu()
        self._initial_geometry()

    def _initial_geometry(self) -> None:
        """The saved geometry when it fits the screen the window opens on; otherwise START_FRACTION of the
        screen's available area (at most MAX_START_SIZE), centred."""
        screen = self.screen() or QGuiApplication.primaryScreen()
        avail = screen.availableGeometry() if screen is not None else QRect(0, 0, 1280, 800)
        geometry = self.settings.value("window/geometry")
        if geometry is not None and self.restoreGeometry(geometry):
            frame = self.frameGeometry()
            if avail.contains(frame) or (frame.width() <= avail.width() and frame.height() <= avail.height()
                                         and avail.intersects(frame)):
                return                       # saved on this screen and still fits it
        size = start_size(avail.size(), self.minimumSizeHint())
        self.setGeometry(QStyle.alignedRect(Qt.LayoutDirection.LeftToRight, Qt.AlignmentFlag.AlignCenter,
                                            size, avail))

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
        act = QAction("Open dataset as &format...", self)
        act.setStatusTip("Open a file or folder whose format is not recognised by naming the format")
        act.triggered.connect(self.choose_dataset_as_format)
        file_menu.addAction(act)
        act = QAction("Open &photo folder...", self, shortcut=QKeySequence("Ctrl+Shift+P"))
        act.setStatusTip("Search a folder of your own photos (JPEG, PNG, WebP; subfolders too) by sentence with "
                         "the run in the Query panel")
        act.triggered.connect(self.choose_photo_folder)
        file_menu.addAction(act)
        act = QAction("Open the built-in &demo", self, shortcut=QKeySequence("Ctrl+D"))
        act.triggered.connect(lambda: self.open_dataset("demo"))
        file_menu.addAction(act)
        self.recent_menu = QMenu("&Recent datasets", self)
        file_menu.addMenu(self.recent_menu)
        self._refresh_recent()
        file_menu.addSeparator()
        act = QAction("Open &run folder...", self, shortcut=QKeySequence("Ctrl+R"))
        act.setStatusTip("Open a trained run (a folder with config.json and checkpoint.pt) in Query and Inspect")
        act.triggered.connect(self.choose_run_folder)
        file_menu.addAction(act)
        self.recent_runs_menu = QMenu("Recent r&uns", self)
        file_menu.addMenu(self.recent_runs_menu)
        self._refresh_recent_runs()
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
        view_menu.addSeparator()
        self.present_action = QAction("&Presentation mode", self, shortcut=QKeySequence("F11"), checkable=True)
        self.present_action.setStatusTip("Full screen, large type, only the query box and the results")
        self.present_action.toggled.connect(self.set_presentation)
        view_menu.addAction(self.present_action)
        self.addAction(self.present_action)   # F11 works with the menu bar hidden too
        leave = QAction("Leave presentation", self, shortcut=QKeySequence("Esc"))
        leave.triggered.connect(lambda: self.present_action.setChecked(False) if self.presenting else None)
        self.addAction(leave)

        query_menu = self.menuBar().addMenu("&Query")
        act = QAction("Query with the &selected image", self, shortcut=QKeySequence("Ctrl+I"))
        act.triggered.connect(lambda: self.query_image(self.data_panel.current_image()))
        query_menu.addAction(act)
        act = QAction("&Type a sentence", self, shortcut=QKeySequence("Ctrl+L"))
        act.triggered.connect(self._focus_sentence)
        query_menu.addAction(act)
        act = QAction("&Back to the previous query", self, shortcut=QKeySequence("Alt+Left"))
        # shown in the menu, handled by the Query panel's own shortcut (two active ones would be "ambiguous")
        act.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        act.triggered.connect(self.query_panel.go_back)
        query_menu.addAction(act)

        help_menu = self.menuBar().addMenu("&Help")
        act = QAction("&About CrossView", self)
        act.triggered.connect(self._about)
        help_menu.addAction(act)

    def _focus_filter(self) -> None:
        self.tabs.setCurrentWidget(self.data_panel)
        self.data_panel.filter_edit.setFocus()
        self.data_panel.filter_edit.selectAll()

    def _focus_sentence(self) -> None:
        self.tabs.setCurrentWidget(self.query_panel)
        self.query_panel.sentence.setFocus()
        self.query_panel.sentence.selectAll()

    def showEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().showEvent(event)
        if self._engine == "idle":
            self._engine = "wanted"
            QTimer.singleShot(0, self._load_engine)     # after the first paint, and after what show's caller opens

    def _load_engine(self) -> None:
        """Import the engine's heavy modules (torch, torchvision, scikit-learn) in the background
        (:class:`~crossview.gui.workers.EngineLoader`), once the window is shown and a run being opened is on
        screen (its preview, or the run itself): they take seconds and nothing needs them to show a run from
        its gallery cache. Training imports them first itself if it starts before they are in."""
        task = self._run_task
        if self._engine != "wanted" or (task is not None and task.is_running() and not getattr(task, "shown", False)):
            return                    # again from _on_run_previewed / _on_run_finished
        self._engine = "started"
        loader = engine_loader()
        loader.loaded.connect(self._on_engine_loaded)
        loader.start()
        if loader.result is not None:    # loaded before (another window): its signal may have gone
            self._on_engine_loaded(loader.result)

    def _on_engine_loaded(self, result) -> None:
        if self.engine_ready:
            return
        auto, devices = result
        self.status_device.setText(f"Device: {auto}")
        if devices:
            self.train_panel.set_devices(devices)
        self.engine_ready = True
        self.engine_loaded.emit()

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

    def choose_photo_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open a folder of photos", str(Path.home()))
        if path:
            self.open_photo_folder(path)

    def open_photo_folder(self, folder: str) -> Task | None:
        """Search ``folder``'s photos with the open run: it becomes a gallery of the Query panel ("Photos: name"),
        encoded there in the background with a bar and Cancel. Returns that task (None without a run)."""
        self.tabs.setCurrentWidget(self.query_panel)
        task = self.query_panel.open_photo_folder(folder)
        if task is None:
            self.statusBar().showMessage(f"{Path(folder).name}: train or open a run to search these photos "
                                         "(Train panel, or File > Open run folder)", 10000)
        return task

    def query_image_file(self, path: str) -> None:
        """Query the open run with an image file (dropped anywhere on the window)."""
        self.tabs.setCurrentWidget(self.query_panel)
        if self.query_panel.retriever is None:
            self.statusBar().showMessage("Train or open a run first (Train panel, or File > Open run folder), "
                                         f"then drop {Path(path).name} again to query with it", 10000)
            return
        self.query_panel.query_image(path)

    def choose_dataset_as_format(self) -> None:
        """Ask for a format, then a file or folder, and open it with that format's reader."""
        from crossview.data.readers import READERS
        items = [f"{name} - {info.description}" for name, info in READERS.items()]
        choice, ok = QInputDialog.getItem(self, "Open dataset as format", "Format:", items, 0, False)
        if not ok or not choice:
            return
        fmt = choice.split(" - ", 1)[0]
        if fmt in FOLDER_FORMATS:
            path = QFileDialog.getExistingDirectory(self, f"Open {fmt} dataset folder", str(Path.home()))
        else:
            path, _ = QFileDialog.getOpenFileName(self, f"Open {fmt} dataset", str(Path.home()),
                                                  "All files (*)")
        if path:
            self.open_dataset(path, format=fmt)

    # ------------------------------------------------------------------ loading
    def open_dataset(self, source: str, format: str | None = None) -> Task:
        """Loads ``source`` (a path or 'demo') in the background, with the reader of ``format`` when given
        (otherwise the format is detected); the panels update when it is ready."""
        if self._task is not None and self._task.is_running():
            self._task.cancel()  # superseded: its result is dropped
        source = str(source)
        task = Task(_load(source, format), name="open-dataset", parent=self)
        self._task = task
        self.status_dataset.setText(f"Opening {source} ...")
        self.progress.setRange(0, 0)
        self.progress.show()
        task.progress.connect(lambda done, total, t=task: self._on_progress(t, done, total))
        task.succeeded.connect(lambda res, t=task: self._on_loaded(t, source, *res))
        task.failed.connect(lambda msg, details, t=task: self._on_failed(t, source, msg, details))
        task.finished.connect(lambda t=task: self._on_finished(t))
        return task.start()

    def _on_progress(self, task: Task, done: int, total: int) -> None:
        if task is self._task:
            self.progress.setRange(0, total)
            self.progress.setValue(done)
            self.status_dataset.setText(f"Rendering the demo dataset (first use only): {done}/{total} images")

    def _on_loaded(self, task: Task, source: str, ds, prepared=None) -> None:
        if task is not self._task:
            return
        if isinstance(ds, TextCorpus):
            self._on_failed(task, source, f"{source} is a text-only caption corpus ({ds.n_captions:,} captions); "
                            "open an image dataset here and use the corpus as a gallery in the Query panel.", "")
            return
        self.dataset = ds
        self.dataset_source = source
        self.data_panel.set_dataset(ds, prepared)
        self.train_panel.set_dataset(ds)
        self.status_dataset.setText(f"Dataset: {printable(ds.name)}  ({ds.n_images:,} images, "
                                    f"{ds.n_captions:,} captions)")
        self.setWindowTitle(f"CrossView - {printable(ds.name)}")
        self._remember(source)
        if ds.warnings:
            self.statusBar().showMessage("; ".join(ds.warnings), 15000)

    def _on_failed(self, task: Task, source: str, message: str, details: str) -> None:
        if task is not self._task:
            return
        self.status_dataset.setText("No dataset" if self.dataset is None else
                                    f"Dataset: {self.dataset.name}")
        self._warn_cannot_open(source, message, details)

    def _warn_cannot_open(self, source: str, message: str, details: str) -> None:
        message = gui_message(message)
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
        """Dropped anywhere on the window: an image file queries with it, a folder opens as a dataset when it is
        one and as a photo gallery otherwise, any other file opens as a dataset."""
        path = self._dropped_path(event)
        if path:
            event.acceptProposedAction()
            self.open_dropped(path)

    def open_dropped(self, path: str) -> Task | None:
        """What a drop of ``path`` does (see :meth:`dropEvent`); returns the task it starts, if any."""
        from crossview.gui.photo_results import IMAGE_SUFFIXES

        if Path(path).is_file() and path.lower().endswith(IMAGE_SUFFIXES):
            self.query_image_file(path)
            return None
        if not Path(path).is_dir():
            return self.open_dataset(path)

        def work(progress, should_stop):        # off the GUI thread: detection reads the folder
            from crossview.core.errors import DatasetError
            from crossview.data.photos import load_photo_folder
            from crossview.data.readers import detect_format
            try:
                detect_format(Path(path))
                return "dataset"
            except DatasetError:
                load_photo_folder(path)          # no photos either: its message says so
                return "photos"

        task = Task(work, name="dropped-folder", parent=self)
        self._drop_task = task
        task.succeeded.connect(self._on_drop_sorted)
        task.failed.connect(self._on_drop_failed)
        self.status_dataset.setText(f"Looking at {path} ...")
        self._dropped = path
        return task.start()

    def _on_drop_sorted(self, kind: str) -> None:
        if self.sender() is not self._drop_task:
            return
        self.status_dataset.setText("No dataset" if self.dataset is None else f"Dataset: {self.dataset.name}")
        if kind == "dataset":
            self.open_dataset(self._dropped)
        else:
            self.open_photo_folder(self._dropped)

    def _on_drop_failed(self, message: str, details: str) -> None:
        if self.sender() is not self._drop_task:
            return
        self.status_dataset.setText("No dataset" if self.dataset is None else f"Dataset: {self.dataset.name}")
        self._warn_cannot_open(self._dropped, f"{message} (nor is it a dataset: drop a dataset file or folder, a "
                               "folder of photos or an image file)", details)

    # ------------------------------------------------------------------ runs
    def recent_runs(self) -> list[str]:
        value = self.settings.value("recent/runs", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or []) if Path(str(v)).is_dir()]

    def _refresh_recent_runs(self) -> None:
        self.recent_runs_menu.clear()
        for run_dir in self.recent_runs():
            act = QAction(run_dir, self)
            act.triggered.connect(lambda _=False, d=run_dir: self.open_run(d, show="query"))
            self.recent_runs_menu.addAction(act)
        self.recent_runs_menu.setEnabled(bool(self.recent_runs()))

    def choose_run_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open run folder", str(get_settings().runs_dir))
        if path:
            self.open_run(path, show="query")

    def open_run(self, run_dir: str, show: str | None = "query", gallery: object = None) -> Task:
        """Load a run in the background; it then answers queries (Query) and shows its metrics (Inspect).

        ``gallery`` None: the run's evaluation split (config.json ``"split"``), so ground-truth ranks in
        Query match Inspect's; otherwise a split name, ``"all"`` or ``"corpus:<file>"``. Everything the
        panels need (the run, its retriever, its marks file, its results) is prepared in the background
        and swapped in at once; when any of it fails, the panels stay on the previous run.
        """
        from crossview.data.readers import load_dataset
        from crossview.engine.annotations import AnnotationStore
        from crossview.engine.session import open_run
        from crossview.engine.results import load_run_results

        if self._run_task is not None and self._run_task.is_running():
            self._run_task.cancel()
        dataset = self.dataset
        run_dir = str(run_dir)

        holder: list[Task] = []
        drawn = threading.Event()      # set once the GUI has shown the preview (or will not)
        stage = {"name": ""}

        def work(progress, should_stop):
            def staged(name: str, done: int, total: int) -> None:
                stage["name"] = name
                progress(done, total)

            # first what the panels need to show the run (summary, metrics, the cached gallery; a CCA run's
            # without torch): shown at once; then the dataset and its feature rows (dataset-image queries,
            # Inspect's captions), in full
            preview = open_run_cached(run_dir, gallery)
            if preview is not None and not should_stop():
                annotations = AnnotationStore(run_dir)
                results = load_run_results(run_dir) if (Path(run_dir) / "summary.json").is_file() else None
                self.run_previewed.emit(holder[0], (*preview, annotations, results))
                drawn.wait(2.0)   # the GUI draws it first: the full opening's imports and reads contend for the GIL
            import_quietly(("torch",))     # the full opening reads the checkpoint with torch: without stalling the GUI
            try:
                run = open_run(run_dir, dataset=dataset, progress=staged, should_stop=should_stop)
            except Exception:
                if dataset is None:
                    raise
                run = open_run(run_dir, progress=staged, should_stop=should_stop)   # another dataset's run
            g = gallery if gallery is not None else run_eval_split(run)
            if isinstance(g, str) and g.startswith("corpus:"):
                g = load_dataset(g[len("corpus:"):], format="corpus")
            elif isinstance(g, str) and g not in run.dataset.splits and g != "all":
                g = "all"
            # A corpus's captions are encoded on first use only (then cached): that encoding moves the bar.
            retriever = run.retriever(gallery=g, progress=lambda _stage, done, total: staged("corpus", done, total),
                                      should_stop=should_stop)
            annotations = AnnotationStore(run_dir)       # read now: a file that cannot be read keeps run A
            results = load_run_results(run_dir) if (Path(run_dir) / "summary.json").is_file() else None
            return run, retriever, annotations, results

        task = Task(work, name="open-run", parent=self)
        task.preview_drawn = drawn
        holder.append(task)
        self._run_task, self._run_show = task, show
        self.status_run.setText(f"Opening run {Path(run_dir).name} ...")
        task.open_stage = stage          # what moves the bar: "corpus" (its encoding) or a stage of the full opening
        task.progress.connect(lambda done, total, t=task: self._on_run_progress(t, done, total))
        task.finished.connect(lambda t=task: self._on_run_finished(t))
        task.succeeded.connect(lambda res, t=task: self._on_run_loaded(t, run_dir, res, show))
        task.failed.connect(lambda msg, details, t=task: self._on_run_failed(t, run_dir, msg, details))
        return task.start()

    def _on_run_progress(self, task: Task, done: int, total: int) -> None:
        if task is self._run_task:
            stage = getattr(task, "open_stage", {}).get("name") or "corpus"
            self.progress.setRange(0, total)
            self.progress.setValue(done)
            self.progress.show()
            if stage == "corpus":
                self.status_run.setText(f"Encoding the caption corpus (first use only, then cached): "
                                        f"{done:,}/{total:,} captions")
            else:
                if self.run_partial and self.run is not None:
                    self.status_run.setText(f"Run: {self.run.name} - loading its {stage} ({done:,}/{total:,}) for "
                                            "queries by dataset image")
                else:
                    self.status_run.setText(f"Opening the run: loading its {stage} ({done:,}/{total:,})")

    def _on_run_previewed(self, task: Task, res) -> None:
        """The run from its gallery cache (:func:`open_run_cached`): Query answers sentences off the cached gallery
        and Inspect shows the metrics while the task goes on opening the run in full."""
        # a 1-ms timer, not a zero-time call (a posted event, sent before the panels' paint requests): timers fire
        # after the posted events, so the preview is drawn before the engine's import and the full opening go on
        QTimer.singleShot(1, task.preview_drawn.set)
        if task is not self._run_task:
            return
        run, retriever, annotations, results = res
        try:
            self.query_panel.set_retriever(retriever, str(run.run_dir), title=f"{run.name}  [{run.method.name}]",
                                           annotations=annotations, eval_split=run_eval_split(run),
                                           train_split=str(run.config.get("train_split") or "train"))
        except Exception:  # noqa: BLE001 - the full opening goes on and says what is wrong, if anything is
            return
        self.run, self.run_partial = run, True
        if results is not None:
            self.inspect_panel.set_run(results)
        self.status_run.setText(f"Run: {run.name} ({run.method.name}): sentences answered from the cached gallery; "
                                "loading its dataset for queries by dataset image ...")
        if self._run_show == "query":
            self.tabs.setCurrentWidget(self.query_panel)
        elif self._run_show == "inspect":
            self.tabs.setCurrentWidget(self.inspect_panel)
        task.shown = True
        QTimer.singleShot(1, self._load_engine)     # after the preview's first paint (see above)

    def _on_run_finished(self, task: Task) -> None:
        if task is self._run_task and not (self._task is not None and self._task.is_running()):
            self.progress.hide()
        if task is self._run_task:
            self._load_engine()

    def _on_run_loaded(self, task: Task, run_dir: str, res, show: str | None) -> None:
        if task is not self._run_task:
            return
        from crossview.engine.session import list_runs
        from crossview.engine.results import load_run_results

        run, retriever, annotations, results = res
        qp = self.query_panel
        # the run was shown from its gallery cache: the query on screen is asked again of the full run, and the
        # panel the user is on stays (the preview took them where `show` said)
        upgrade = self.run_partial and self.run is not None and str(self.run.run_dir) == str(Path(run_dir))
        shown = list(qp.history) if upgrade and qp.retriever is not None and \
            qp.retriever.gallery_name == retriever.gallery_name else []
        try:
            qp.set_retriever(retriever, run_dir, title=f"{run.name}  [{run.method.name}]",
                             annotations=annotations, eval_split=run_eval_split(run),
                             train_split=str(run.config.get("train_split") or "train"))
        except Exception as e:  # noqa: BLE001 - the panel kept the previous run; say why
            self._on_run_failed(task, run_dir, f"{run_dir}: {e}", "")
            return
        if shown:
            qp.history.extend(shown[:-1])
            qp._ask(shown[-1])
        if upgrade:
            show = None
        self.run, self.run_partial = run, False
        if results is not None:
            others = []
            for d in list_runs(Path(run_dir).parent)[:30]:
                try:
                    others.append(load_run_results(d))
                except Exception:  # noqa: BLE001 - unfinished runs have no results to compare
                    continue
            self.inspect_panel.set_runs(others)
            self.inspect_panel.set_run(results)
            self.inspect_panel.set_dataset(run.dataset)
        s = run.summary or {}
        rsum = f", rsum {s['rsum']:.1f}" if isinstance(s.get("rsum"), (int, float)) else ""
        split = run_eval_split(run)
        on = f", evaluated on {split}" if split else ""
        self.status_run.setText(f"Run: {run.name} ({run.method.name}{rsum}{on})")
        recent = [r for r in self.recent_runs() if r != run_dir]
        self.settings.setValue("recent/runs", [run_dir, *recent][:MAX_RECENT])
        self._refresh_recent_runs()
        if show == "query":
            self.tabs.setCurrentWidget(self.query_panel)
        elif show == "inspect":
            self.tabs.setCurrentWidget(self.inspect_panel)
        else:
            self.statusBar().showMessage("The run is ready: query it in the Query panel (Ctrl+3), "
                                         "see its metrics in Inspect (Ctrl+4)", 10000)

    def _on_run_failed(self, task: Task, run_dir: str, message: str, details: str) -> None:
        if task is not self._run_task:
            return
        self.status_run.setText("No run" if self.run is None else f"Run: {self.run.name}")
        if self.run is not None:
            message += f"\n\nStill showing the run {self.run.name}" + (
                " from its gallery cache (queries by sentence or image file only)." if self.run_partial else ".")
        box = QMessageBox(QMessageBox.Icon.Warning, "Cannot open run", message, parent=self)
        box.setInformativeText(f"Run: {run_dir}")
        if details:
            box.setDetailedText(details)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()
        self.last_error = message

    def _change_gallery(self, choice: object) -> None:
        if self.run is not None:
            self.open_run(str(self.run.run_dir), show="query", gallery=choice)

    def query_image(self, image: int | None) -> None:
        """Query the current run with dataset image ``image`` (from the Data panel)."""
        if image is None:
            return
        if self.run is None:
            self.statusBar().showMessage("Train or open a run first (Train panel, or File > Open run folder)", 8000)
            return
        if self.run_partial:
            self.statusBar().showMessage("The run's dataset is still loading (see the status bar); query by "
                                         "dataset image once it is open", 8000)
            return
        if self.dataset is not None and self.run.dataset.fingerprint() != self.dataset.fingerprint():
            self.statusBar().showMessage("The open run was trained on another dataset; open that dataset to "
                                         "query with its images", 8000)
            return
        self.tabs.setCurrentWidget(self.query_panel)
        self.query_panel.query_image(int(image))

    def _open_query_from_inspect(self, direction: str, query_id: int) -> None:
        if self.run is None:
            return
        if self.run_partial:
            self.statusBar().showMessage("The run's dataset is still loading (see the status bar); open the query "
                                         "once it is open", 8000)
            return
        ds = self.run.dataset
        ids = ds.image_ids if direction == "i2t" else ds.caption_ids
        hit = np.flatnonzero(ids == query_id)
        index = int(hit[0]) if len(hit) else int(query_id)
        self.tabs.setCurrentWidget(self.query_panel)
        if direction == "i2t":
            self.query_panel.query_image(index)
        else:
            self.query_panel.query_text(index)

    # ------------------------------------------------------------------ presentation
    def set_presentation(self, on: bool) -> None:
        """F11: full screen, large type, only the query box and the results."""
        if on == self.presenting:
            return
        self.presenting = on
        self.menuBar().setVisible(not on)
        self.statusBar().setVisible(not on)
        self.tabs.tabBar().setVisible(not on)
        if on:
            self._before_presenting = self.tabs.currentIndex()
            self._normal_geometry = self.geometry()
            self.tabs.setCurrentWidget(self.query_panel)
            self.showFullScreen()
            screen = self.screen()
            if screen is not None and self.geometry() != screen.geometry():
                self.setGeometry(screen.geometry())   # no window manager to honour full screen (e.g. Xvfb)
        else:
            self.showNormal()
            if getattr(self, "_normal_geometry", None) is not None:
                self.setGeometry(self._normal_geometry)
            self.tabs.setCurrentIndex(getattr(self, "_before_presenting", 0))
        self.query_panel.set_presentation(on)
        if self.present_action.isChecked() != on:
            self.present_action.setChecked(on)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        self.settings.setValue("window/geometry", self.saveGeometry())
        if self.train_panel.task is not None and self.train_panel.task.is_running():
            self.train_panel.task.stop()           # the run keeps a checkpoint and can be resumed
            self.train_panel.task.wait(10000)
        for t in (self._run_task, self._drop_task):
            if t is not None and t.is_running():
                t.cancel()
                t.wait(5000)
        self.query_panel.stop_tasks()      # its query and any explanation in flight
        if self._task is not None and self._task.is_running():
            self._task.cancel()
            self._task.wait(5000)
        self.data_panel.cache.clear_pending()
        self.data_panel.cache.wait_idle(5000)
        stop_all(10000)       # any other worker (Inspect's, a fusion's); one that cannot stop in time ends at exit
        super().closeEvent(event)
