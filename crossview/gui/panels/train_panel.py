"""The Train panel: pick a method (from the registry, with its card), set its parameters (a form built
from the card: defaults, tooltips, ranges), a second dataset where the method trains on one besides the run's
(its ``auxiliary_format``: webly's web set, :class:`~crossview.gui.dataset_slot.DatasetSlot`), the split to
evaluate on, the features (encoders and their
normalisation) and the device; start / pause / stop / resume; progress with ETA, live curves
(:mod:`crossview.gui.curves`: one plot per quantity family, R@K / rsum per validation or a note saying why
there is none), a log, and the runs list (:mod:`crossview.gui.runs_browser`: open, open a run folder from
anywhere, rename, delete with confirmation). "Search..." (:mod:`crossview.gui.search_dialog`) starts a
validation search in the search view (:mod:`crossview.gui.search_view`, the "Search trials" tab), whose trials
fill a table as they finish (the best highlighted); a stopped search continues. The search view runs the search
and says what it shows through signals; this panel keeps its task (Pause / Stop act on it), draws its runs'
events and relays its signals, and keeps ``start_search``, ``continue_search``, ``best_trial_row`` and the
trials table under their old names.

The work is :func:`crossview.engine.train` / :func:`crossview.engine.run.resume` (and, in the search view,
:func:`crossview.engine.tune.tune`), generators of events driven by an
:class:`~crossview.gui.workers.EventTask`; nothing here trains. Methods registered later
appear with no change to this file. Run alone: ``python -m crossview.gui.panels.train_panel``.
"""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QDoubleValidator
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QGridLayout, QGroupBox, QHBoxLayout, QLabel,
                               QLineEdit, QMessageBox, QPlainTextEdit, QProgressBar, QPushButton, QScrollArea,
                               QSizePolicy, QSpinBox, QSplitter, QTabWidget, QVBoxLayout, QWidget)

from crossview.core.progress import RunEta, format_seconds, stage_key
from crossview.core.events import CheckpointSaved, Finished, Log, Loss, Phase, Plan, Progress, Validation
from crossview.core.errors import CrossViewError
from crossview.core.text import printable
from crossview.features.normalize import NORMS
from crossview.gui.curves import CurveBoard
from crossview.gui.dataset_slot import DatasetSlot
from crossview.gui.result_card import ResultCard
from crossview.gui.runs_browser import RunsBrowser
from crossview.gui.search_view import SearchChoices, SearchView, field_texts
from crossview.gui.storage_dialog import show_storage_error, storage_error_of, storage_text, storage_title
from crossview.gui.workers import EventTask, engine_preloaded, preload_engine_modules

AUTO_SPLIT_TEXT = "auto (test, else val, else a held-out part of train)"

#: what each feature normalisation does (the tooltips of the normalisation choices)
NORM_HELP = {
    "none": "the features as extracted",
    "l2": "each feature vector scaled to unit length",
    "ssr": "signed square root of every value, then unit length (damps the few channels that dominate "
           "pooled CNN features)",
    "center": "the training mean subtracted, then unit length (fitted on the train split)",
    "whiten": "PCA-whitening fitted on the train split (the components that explain 99% of the variance, "
              "each scaled to unit variance), then unit length",
}


AMP_HELP = ("Mixed precision: float16 autocast with gradient scaling on a GPU, bfloat16 on a CPU with bfloat16 "
            "units; weights stay float32 (a run setting, recorded in the run)")


def _images(n: int) -> str:
    return f"{n:,} image" + ("" if n == 1 else "s")


def describe_split(dataset: Any, choice: str | None, seed: int = 0) -> str:
    """One line saying what training on ``dataset`` evaluates on for ``choice`` (``None`` = auto) and
    whether a val split is left for early stopping / model selection (the engine's rule,
    :func:`crossview.engine.splits.plan_splits`; a choice it rejects gives its message)."""
    from crossview.engine.splits import HELDOUT, plan_splits

    try:
        plan = plan_splits(dataset, choice, seed=seed)
    except CrossViewError as e:
        return str(e)
    splits = dataset.splits
    if plan.eval == HELDOUT and plan.derived:
        n_out, n_rest = len(plan.derived[HELDOUT]), len(plan.derived[plan.train])
        return (f"this dataset has neither test nor val: evaluates on {_images(n_out)} held out of "
                f"{plan.train} (seed {seed}, recorded in the run) and trains on the other {n_rest:,}; "
                "no early stopping")
    n = len(splits[plan.eval])
    if choice is None:
        head = (f"auto: evaluates on test ({_images(n)})" if plan.eval == "test" else
                f"this dataset has no test split: evaluates on {plan.eval} ({_images(n)})")
    else:
        head = f"evaluates on {plan.eval} ({_images(n)})"
    if plan.val:
        return head + f"; early stopping / model selection on {plan.val} ({_images(len(splits[plan.val]))})"
    if "val" in splits and plan.eval == "val":
        return head + "; no early stopping on val"
    return head + "; no val split: no early stopping"


def _param_widget(spec: Any) -> tuple[QWidget, Any]:
    """A form widget for a card parameter and a getter returning the text/value to coerce."""
    kind = spec.type
    if spec.choices:
        w = QComboBox()
        for c in spec.choices:
            w.addItem(str(c), c)
        w.setCurrentIndex(max(0, w.findData(spec.default)))
        return w, lambda: w.currentData()
    if kind == "bool":
        w = QCheckBox()
        w.setChecked(bool(spec.default))
        return w, lambda: w.isChecked()
    if kind == "int" and not spec.optional:
        w = QSpinBox()
        w.setRange(int(spec.min) if spec.min is not None else -10**9, int(spec.max) if spec.max is not None else 10**9)
        w.setValue(int(spec.default))
        return w, lambda: w.value()
    w = QLineEdit()
    if isinstance(spec.default, list):
        w.setText(", ".join(str(x) for x in spec.default))
    else:
        w.setText("none" if spec.default is None else str(spec.default))
    if kind == "float" and not spec.optional:
        v = QDoubleValidator()
        v.setNotation(QDoubleValidator.Notation.ScientificNotation)
        w.setValidator(v)
    return w, lambda: w.text()


class TrainPanel(QWidget):
    """``run_finished(str)`` carries the run folder of a run that finished; ``open_run(str)`` asks to open one
    (in Query), ``inspect_run(str)`` to open one in Inspect (the result card's buttons);
    ``search_finished(str)`` carries the folder of a validation search that finished (trials and refit)."""

    run_finished = Signal(str)
    open_run = Signal(str)
    inspect_run = Signal(str)
    runs_changed = Signal()
    search_finished = Signal(str)

    def __init__(self, parent: QWidget | None = None, runs_root: str | Path | None = None,
                 preload: bool = True) -> None:
        """``preload`` False: the engine's modules are not imported here (the main window imports them in the
        background once it is shown, then calls :meth:`set_devices`); a training started before that imports
        them first, on this thread."""
        super().__init__(parent)
        from crossview.core.settings import get_settings

        self.runs_root = Path(runs_root) if runs_root is not None else get_settings().runs_dir
        if preload:
            preload_engine_modules()
        self.dataset: Any = None
        self.task: EventTask | None = None
        self.run_dir: Path | None = None
        self.last_summary: dict[str, Any] | None = None
        self.last_error: str | None = None
        self._getters: dict[str, Any] = {}
        self._card: Any = None
        #: the second dataset slots, per (method, parameter): kept while the panel lives, so a set being read
        #: in a worker is never destroyed under it; only the selected method's are shown
        self._slots: dict[tuple[str, str], DatasetSlot] = {}
        self._t0 = 0.0
        self._eta = RunEta()
        self._run_extra: dict[str, Any] = {}   # run settings with no field (workers, log_every), set by set_param
        self._searching = False     # the task is the search view's (its progress and end are the view's)
        # Loss events can come thousands a second: collect them and redraw the curves 10 times a second,
        # so the GUI thread never spends more than a few ms per frame on plotting.
        self._pending_log: list[str] = []
        from PySide6.QtCore import QTimer
        self._redraw = QTimer(self)
        self._redraw.setInterval(100)
        self._redraw.timeout.connect(self._flush)

        # ---- left: what to train
        self.method_combo = QComboBox()
        self.method_info = QLabel("")
        self.method_info.setWordWrap(True)
        self.method_info.setTextFormat(Qt.TextFormat.RichText)
        self.method_info.linkActivated.connect(self._toggle_card_text)
        self._card_full = False
        self.slots_box = QWidget()
        self.slots_layout = QVBoxLayout(self.slots_box)
        self.slots_layout.setContentsMargins(0, 0, 0, 0)
        self.params_box = QGroupBox("Parameters")
        self.params_form = QFormLayout(self.params_box)
        self.image_encoder = QComboBox()
        self.text_encoder = QComboBox()
        self.device_combo = QComboBox()
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(0, 2**31 - 1)
        self.amp_check = QCheckBox("Mixed precision (amp)")
        self.amp_check.setToolTip(AMP_HELP)
        self.image_norm = QComboBox()
        self.text_norm = QComboBox()
        for combo, side in ((self.image_norm, "image"), (self.text_norm, "text")):
            combo.addItem("method default", None)
            for n in NORMS:
                combo.addItem(n, n)
                combo.setItemData(combo.count() - 1, NORM_HELP[n], Qt.ItemDataRole.ToolTipRole)
            combo.setToolTip(f"How the {side} features are normalised before the method sees them (recorded in "
                             "the run; center / whiten are fitted on the train split)")
        self.run_name = QLineEdit()
        self.run_name.setPlaceholderText("default: method-dataset-time")
        self.split_combo = QComboBox()
        self.split_combo.setToolTip("The split the run is evaluated on (and that later views default to)")
        self.split_info = QLabel("")
        self.split_info.setWordWrap(True)
        self.split_info.setStyleSheet("color: #57606a")
        self.split_combo.currentIndexChanged.connect(self._update_split_info)
        self.seed_spin.valueChanged.connect(self._update_split_info)   # the held-out part depends on the seed
        self._fill_splits()
        self._fill_encoders()
        self._fill_devices()
        evaluation = QGroupBox("Evaluation")
        ev_layout = QVBoxLayout(evaluation)
        ev_layout.addWidget(QLabel("Evaluate on:"))
        ev_layout.addWidget(self.split_combo)
        ev_layout.addWidget(self.split_info)
        feats = QGroupBox("Features and device")
        ff = QFormLayout(feats)
        ff.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        ff.addRow("Image encoder", self.image_encoder)
        ff.addRow("Text encoder", self.text_encoder)
        ff.addRow("Image normalisation", self.image_norm)
        ff.addRow("Text normalisation", self.text_norm)
        ff.addRow("Device", self.device_combo)
        ff.addRow("Seed", self.seed_spin)
        ff.addRow("", self.amp_check)
        ff.addRow("Run name", self.run_name)

        self.start_button = QPushButton("Start")
        self.start_button.setObjectName("primary")
        self.pause_button = QPushButton("Pause")
        self.stop_button = QPushButton("Stop")
        self.start_button.clicked.connect(self.start)
        self.search_button = QPushButton("Search...")
        self.search_button.setToolTip("Try several values of the parameters (a validation search): every "
                                      "combination is a run scored on val, the best is refitted")
        self.search_button.clicked.connect(lambda: self.open_search_dialog())
        self.pause_button.clicked.connect(self.toggle_pause)
        self.stop_button.clicked.connect(self.stop)
        buttons = QGridLayout()       # two rows: four buttons in one row are cut in a 345-px form
        for i, b in enumerate((self.start_button, self.search_button, self.pause_button, self.stop_button)):
            buttons.addWidget(b, i // 2, i % 2)
        self.params_form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        for combo in (self.method_combo, self.split_combo, self.image_encoder, self.text_encoder, self.device_combo,
                      self.image_norm, self.text_norm):
            # long entries (device descriptions, encoder names) must not widen the form: elide instead
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(10)

        left_inner = QWidget()
        ll = QVBoxLayout(left_inner)
        ll.addWidget(QLabel("<b>Method</b>"))
        ll.addWidget(self.method_combo)
        ll.addWidget(self.method_info)
        ll.addWidget(self.slots_box)
        ll.addWidget(self.params_box)
        ll.addWidget(evaluation)
        ll.addWidget(feats)
        ll.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(left_inner)
        self.form_scroll = scroll
        self.form_inner = left_inner
        # Start / Search / Pause / Stop under the form, outside its scrolling: always in view (1280x800 included)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(scroll, 1)
        left_layout.addLayout(buttons)
        left.setMinimumWidth(300)
        self.button_row = buttons

        # ---- right: progress, curves, log, runs
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.eta_label = QLabel("Idle")
        self.eta_label.setMinimumWidth(0)
        self.eta_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.curves = CurveBoard()
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(5000)
        # the runs browser (crossview/gui/runs_browser.py, on the run store); its list and buttons are reachable
        # here under their old names for the scripted demos and tests
        self.runs = RunsBrowser(self.runs_root, is_busy=self._busy_with)
        self.runs.open_run.connect(self.open_run)
        self.runs.history.connect(self.show_history)
        self.runs.resume_requested.connect(self.resume)
        self.runs.runs_changed.connect(self.runs_changed)
        self.runs.selection_changed.connect(self._update_buttons)
        self.runs.refused.connect(lambda title, message: self._refuse(message, title))
        self.runs_list = self.runs.runs_list
        self.open_button, self.resume_button = self.runs.open_button, self.runs.resume_button
        self.rename_button, self.delete_button = self.runs.rename_button, self.runs.delete_button
        self.open_folder_button = self.runs.open_folder_button
        # the search view (crossview/gui/search_view.py): searches and their trials table; its widgets and
        # methods are reachable here under their old names too (start_search, continue_search, best_trial_row...)
        self.search_view = SearchView(self.runs_root, self._search_choices, selected_run=self.runs.selected,
                                      is_busy=lambda: self.task is not None and self.task.is_running())
        self.search_view.started.connect(lambda task, folder, title: self._watch(task, Path(folder), title, True))
        self.search_view.run_event.connect(self._on_event)
        self.search_view.status.connect(self._show_search_status)
        self.search_view.message.connect(self.log.appendPlainText)
        self.search_view.failed.connect(lambda message, details, title: self._fail(message, details, title=title))
        self.search_view.ended.connect(self._on_finished)
        self.search_view.run_finished.connect(self.run_finished)
        self.search_view.search_finished.connect(self.search_finished)
        self.search_view.runs_changed.connect(self._on_search_runs_changed)
        self.search_view.open_run.connect(self.open_run)
        self.search_info, self.trials_table = self.search_view.search_info, self.search_view.trials_table
        self.continue_search_button = self.search_view.continue_search_button
        self.open_search_dialog, self.start_search = self.search_view.open_search_dialog, self.search_view.start_search
        self.continue_search, self.best_trial_row = self.search_view.continue_search, self.search_view.best_trial_row

        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        pr = QHBoxLayout()
        pr.addWidget(self.progress, 2)
        pr.addWidget(self.eta_label, 3)
        tl.addLayout(pr)
        # a finished run's numbers and where to go next (crossview/gui/result_card.py)
        self.result_card = ResultCard()
        self.result_card.query_requested.connect(self.open_run)
        self.result_card.inspect_requested.connect(self.inspect_run)
        tl.addWidget(self.result_card)
        self.view_tabs = QTabWidget()
        self.view_tabs.addTab(self.curves, "Curves")
        self.view_tabs.addTab(self.search_view, "Search trials")
        tl.addWidget(self.view_tabs, 1)
        bottom = QSplitter()
        bottom.addWidget(self.log)
        bottom.addWidget(self.runs)
        bottom.setSizes([500, 400])
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(top)
        right.addWidget(bottom)
        right.setStretchFactor(0, 3)
        right.setStretchFactor(1, 1)
        right.setSizes([520, 220])
        split = QSplitter()
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setSizes([400, 1100])    # the form gets ~27%: 345 px at 1280 wide, 520 at 1920
        self.splitter = split
        layout = QVBoxLayout(self)
        layout.addWidget(split)

        self.method_combo.currentIndexChanged.connect(self._on_method)
        self._fill_methods()
        self.refresh_runs()
        self._update_buttons()

    # ------------------------------------------------------------------ choices
    def _fill_methods(self) -> None:
        from crossview.methods import list_methods

        self.method_combo.blockSignals(True)
        self.method_combo.clear()
        for name in list_methods():
            self.method_combo.addItem(name, name)
        self.method_combo.blockSignals(False)
        self._on_method()

    def _fill_splits(self) -> None:
        """The split choices: auto, then the current dataset's splits with their sizes."""
        keep = self.split_combo.currentData()
        self.split_combo.blockSignals(True)
        self.split_combo.clear()
        self.split_combo.addItem(AUTO_SPLIT_TEXT, None)
        ds = self.dataset
        for name in (ds.split_names if ds is not None else []):
            if name == "train":         # the training split: evaluating on it says nothing (the engine refuses)
                continue
            self.split_combo.addItem(f"{printable(name)} ({_images(len(ds.splits[name]))})", name)
        self.split_combo.setCurrentIndex(max(0, self.split_combo.findData(keep)) if keep else 0)
        self.split_combo.blockSignals(False)
        self._update_split_info()

    def _update_split_info(self) -> None:
        self.split_info.setText(describe_split(self.dataset, self.split_combo.currentData(), self.seed_spin.value())
                                if self.dataset is not None else "Load a dataset to see its splits.")

    def split(self) -> str | None:
        """The chosen evaluation split (``None`` = auto)."""
        return self.split_combo.currentData()

    def select_split(self, name: str | None) -> None:
        """Choose the evaluation split (``None`` = auto); a name the dataset lacks raises CrossViewError."""
        i = self.split_combo.findData(name) if name is not None else 0
        if i < 0:
            raise CrossViewError(f"the dataset has no split {name!r}; it has: "
                                 + ", ".join(self.dataset.split_names if self.dataset is not None else []))
        self.split_combo.setCurrentIndex(i)

    def _fill_encoders(self) -> None:
        from crossview.features import image as image_mod
        from crossview.features import text as text_mod

        self.image_encoder.addItem(f"{image_mod.DEFAULT_IMAGE_ENCODER} (default)", None)
        for n in [*image_mod.list_image_encoders(), *image_mod.IMAGE_ENCODER_EXAMPLES]:
            if n != image_mod.DEFAULT_IMAGE_ENCODER:
                self.image_encoder.addItem(n, n)
        self.text_encoder.addItem(f"{text_mod.DEFAULT_TEXT_ENCODER} (default)", None)
        for n in [*text_mod.list_text_encoders(), *text_mod.TEXT_ENCODER_EXAMPLES]:
            if n != text_mod.DEFAULT_TEXT_ENCODER and not n.endswith(":PATH") and n != "vocab":
                self.text_encoder.addItem(n, n)
        self.image_encoder.setToolTip("Frozen image backbone (weights found offline); NAME:flip averages each image's "
                                      "features with its mirror's, NAME+NAME concatenates backbones (each block "
                                      "L2-normalised); datasets with precomputed features use those")
        self.text_encoder.setToolTip("Caption features; fitted encoders (tfidf, bow, lda) learn on the train split; "
                                     "A+B combines two (each block L2-normalised)")

    def _fill_devices(self) -> None:
        """auto and the devices torch sees; only auto and the CPU while the engine is not imported yet
        (:func:`~crossview.core.devices.list_devices` imports torch and initialises CUDA)."""
        import os
        import sys

        from crossview.core.devices import DeviceInfo, list_devices

        if engine_preloaded() or "torch" in sys.modules:
            self.set_devices(list_devices())
        else:
            self.set_devices([DeviceInfo("cpu", f"CPU ({os.cpu_count() or 1} cores)")])

    def set_devices(self, devices: list[Any]) -> None:
        """The device choices: auto, then ``devices`` (:class:`~crossview.core.devices.DeviceInfo`); the chosen
        one stays chosen when it is among them (else auto)."""
        chosen = self.device_combo.currentData()
        self.device_combo.blockSignals(True)
        self.device_combo.clear()
        self.device_combo.addItem("auto (a GPU when present)", "auto")
        for d in devices:
            self.device_combo.addItem(f"{d.name}: {d.description}", d.name)
        self.device_combo.setCurrentIndex(max(0, self.device_combo.findData(chosen)))
        self.device_combo.blockSignals(False)

    def _on_method(self) -> None:
        from crossview.methods import cards, method_class

        name = self.method_combo.currentData()
        self._update_norm_defaults(name)
        self._update_encoder_defaults(name)
        while self.params_form.rowCount():
            self.params_form.removeRow(0)
        self._getters.clear()
        self._card = None
        if not name:
            self.method_info.setText("No methods are registered.")
            return
        try:
            self._card = cards.parse_card(cards.card_path(name)) if cards.card_path(name).is_file() else None
        except CrossViewError as e:
            self.method_info.setText(f"<span style='color:#cf222e'>{html.escape(str(e))}</span>")
        if self._card is not None:
            c = self._card
            self._show_card_text()
            specs = c.params
        else:
            cls = method_class(name)
            self.method_info.setText(html.escape((cls.__doc__ or name).strip().splitlines()[0]))
            from crossview.methods.cards import ParamSpec, _infer_type
            specs = {k: ParamSpec(k, v, _infer_type(v)) for k, v in cls.default_params().items()
                     if isinstance(v, (int, float, str, bool))}
        slots = self._show_slots(name, specs)
        # device, seed, amp are run settings, never among a method's parameters: the "Features and device" box
        # sets them, once; amp only for a method that trains in mixed precision
        has_amp = method_class(name).supports_amp
        self.amp_check.setEnabled(has_amp)
        self.amp_check.setToolTip(AMP_HELP if has_amp else f"{AMP_HELP}\n{name} does not train in mixed precision")
        for pname, spec in specs.items():
            if pname in slots:
                self._getters[pname] = (spec, slots[pname].value)
                continue
            w, get = _param_widget(spec)
            tip = spec.help + (f" (default {spec.default_text})" if spec.help else f"default {spec.default_text}")
            w.setToolTip(tip)
            label = QLabel(pname)
            label.setToolTip(tip)
            self.params_form.addRow(label, w)
            self._getters[pname] = (spec, get)

    def _show_slots(self, method: str, specs: dict[str, Any]) -> dict[str, DatasetSlot]:
        """Show the method's second dataset slots (its ``auxiliary_format``: parameter -> reader format) that
        its form has as parameters; hide the others. Returns them by parameter."""
        from crossview.methods import method_class

        try:
            formats = dict(getattr(method_class(method), "auxiliary_format", {}) or {})
        except CrossViewError:
            formats = {}
        shown: dict[str, DatasetSlot] = {}
        for pname, fmt in formats.items():
            if pname not in specs:
                continue
            key = (method, pname)
            slot = self._slots.get(key)
            if slot is None:
                spec = specs[pname]
                slot = DatasetSlot(pname, fmt, spec.help, parent=self.slots_box)
                slot.set_demo_available(self._dataset_is_demo())
                slot.set_value(spec.default)
                self._slots[key] = slot
                self.slots_layout.addWidget(slot)
            shown[pname] = slot
        for slot in self._slots.values():
            slot.setVisible(slot in shown.values())
        self.slots_box.setVisible(bool(shown))
        return shown

    def slots(self) -> dict[str, DatasetSlot]:
        """The current method's second dataset slots, by parameter (webly: ``{"web": ...}``)."""
        method = self.method_combo.currentData()
        return {p: s for (m, p), s in self._slots.items() if m == method}

    def _dataset_is_demo(self) -> bool:
        return self.dataset is not None and "demo" in (getattr(self.dataset, "meta", None) or {})

    def _update_encoder_defaults(self, method: str | None) -> None:
        """Name the method's own feature pipelines in the first entry of each encoder choice
        ("efficientnet_lite0+mobilenet_v2:flip (default)" for CCA, the package defaults otherwise)."""
        from crossview.features import image as image_mod
        from crossview.features import text as text_mod
        from crossview.methods import default_encoders_of

        own = default_encoders_of(method) if method else (None, None)
        self.image_encoder.setItemText(0, f"{own[0] or image_mod.DEFAULT_IMAGE_ENCODER} (default)")
        self.text_encoder.setItemText(0, f"{own[1] or text_mod.DEFAULT_TEXT_ENCODER} (default)")

    def _update_norm_defaults(self, method: str | None) -> None:
        """Name the method's own normalisations in the first entry of each choice ("method default (ssr)")."""
        from crossview.methods import default_norms_of

        defaults = default_norms_of(method) if method else ("none", "none")
        for combo, default in ((self.image_norm, defaults[0]), (self.text_norm, defaults[1])):
            combo.setItemText(0, f"method default ({default})")
            combo.setItemData(0, f"this method's default: {NORM_HELP[default]}", Qt.ItemDataRole.ToolTipRole)

    def norms(self) -> tuple[str | None, str | None]:
        """The chosen ``(image_norm, text_norm)``; ``None`` is the method's default."""
        return self.image_norm.currentData(), self.text_norm.currentData()

    def select_norms(self, image: str | None = None, text: str | None = None) -> None:
        """Choose the normalisations (``None`` = the method's default); an unknown name raises CrossViewError."""
        for combo, value, what in ((self.image_norm, image, "image"), (self.text_norm, text, "text")):
            i = combo.findData(value) if value is not None else 0
            if i < 0:
                raise CrossViewError(f"{what} normalisation {value!r} is not one of: {', '.join(NORMS)}")
            combo.setCurrentIndex(i)

    def _show_card_text(self) -> None:
        """The card's title and first sentence (so the parameters stay in view at 800 px high), or all of
        its description and citation; a link switches between the two."""
        c = self._card
        words = " ".join(c.description.split())
        first = words.split(". ", 1)[0].rstrip(".") + "."
        if self._card_full or first == words:
            body = (f"{html.escape(words)}<br><span style='color:#57606a'>{html.escape(c.citation)}</span>"
                    + (" <a href='less'>less</a>" if first != words else ""))
        else:
            body = f"{html.escape(first)} <a href='more'>more...</a>"
        self.method_info.setText(f"<b>{html.escape(c.title)}</b><br>{body}")

    def _toggle_card_text(self, link: str) -> None:
        self._card_full = link == "more"
        if self._card is not None:
            self._show_card_text()

    def params(self) -> dict[str, Any]:
        """The form's parameters, converted by the card (a CrossViewError names a bad one)."""
        out = {}
        for pname, (spec, get) in self._getters.items():
            out[pname] = spec.coerce(get(), self.method_combo.currentData() or "")
        return out

    def set_param(self, name: str, value: Any) -> None:
        """Set one form field (for tests and scripted demos); a second dataset slot takes "", "demo" or a path.
        A run setting (device, seed, amp: the "Features and device" box; workers, log_every: the next run only,
        having no field) goes to the run, not the method."""
        from crossview.core.run_settings import RUN_SETTING_PARAMS

        if name in RUN_SETTING_PARAMS:
            field = RUN_SETTING_PARAMS[name]
            if field == "seed":
                self.seed_spin.setValue(int(value))
            elif field == "amp":
                self.amp_check.setChecked(bool(value))
            elif field == "device":
                self.device_combo.setCurrentIndex(max(0, self.device_combo.findData(value)))
            else:
                self._run_extra[field] = value
            return
        spec, _ = self._getters[name]
        slot = self.slots().get(name)
        if slot is not None:
            slot.set_value(value)
            return
        for row in range(self.params_form.rowCount()):
            label = self.params_form.itemAt(row, QFormLayout.ItemRole.LabelRole).widget()
            if label.text() == name:
                w = self.params_form.itemAt(row, QFormLayout.ItemRole.FieldRole).widget()
                if isinstance(w, QSpinBox):
                    w.setValue(int(value))
                elif isinstance(w, QCheckBox):
                    w.setChecked(bool(value))
                elif isinstance(w, QComboBox):
                    w.setCurrentIndex(w.findData(value))
                else:
                    w.setText(", ".join(map(str, value)) if isinstance(value, list) else str(value))
                return

    def select_method(self, name: str) -> None:
        self.method_combo.setCurrentIndex(self.method_combo.findData(name))

    def set_dataset(self, ds: Any) -> None:
        """Train on ``ds`` from now on (the split choices follow its splits)."""
        self.dataset = ds
        self.search_view.set_dataset(ds)
        for slot in self._slots.values():
            slot.set_demo_available(self._dataset_is_demo())
        self._fill_splits()
        self._update_buttons()

    # ------------------------------------------------------------------ running
    def _update_buttons(self) -> None:
        running = self.task is not None and self.task.is_running()
        self.start_button.setEnabled(not running and self.dataset is not None and self.method_combo.count() > 0)
        self.search_button.setEnabled(self.start_button.isEnabled())
        self.search_view.update_buttons()
        self.pause_button.setEnabled(running)
        self.stop_button.setEnabled(running)
        self.resume_button.setEnabled(not running and self.runs_list.currentItem() is not None)
        self.pause_button.setText("Continue" if running and self.task.paused else "Pause")
        for w in (self.method_combo, self.slots_box, self.params_box, self.split_combo, self.image_encoder,
                  self.text_encoder, self.device_combo, self.image_norm, self.text_norm):
            w.setEnabled(not running)

    def _new_run_dir(self, method: str) -> Path:
        from crossview.engine.run_folder import check_folder_name, safe_name, unused_dir

        name = self.run_name.text().strip()
        if name:
            return self.runs_root / check_folder_name(name)
        return unused_dir(self.runs_root, method, safe_name(self.dataset.name))

    def start(self) -> EventTask | None:
        """Start training the chosen method on the current dataset in a new run folder."""
        preload_engine_modules()     # at once when done (the main window's background import, or this panel's)
        from crossview.engine import run as engine_run

        if self.dataset is None or (self.task is not None and self.task.is_running()):
            return None
        method = self.method_combo.currentData()
        try:
            self._check_slots()
            params = self.params()
            run_dir = self._new_run_dir(method)
            split = self.split()
            no_val = self._no_validation_reason(split)
            # auto (None) is the engine's own rule: test, else val, else a held-out part of train
            it = engine_run.train(method, self.dataset, run_dir=run_dir, params=params, split=split,
                                  image_encoder=self.image_encoder.currentData(),
                                  text_encoder=self.text_encoder.currentData(),
                                  device=self.device_combo.currentData(), seed=self.seed_spin.value(),
                                  amp=self.amp_check.isChecked() if self.amp_check.isEnabled() else None,
                                  **self._run_extra,
                                  image_norm=self.image_norm.currentData(), text_norm=self.text_norm.currentData(),
                                  # the method's default scoring (crossview.engine.scoring.DEFAULT_SCORINGS), as the
                                  # command line's: the run's metrics and the Query panel use it
                                  scoring="default")
        except CrossViewError as e:
            self._fail(str(e), "", error=e)
            return None
        self._drive(lambda: it, run_dir, f"Training {method} on {self.dataset.name}", method, no_val)
        return self.task

    def _check_slots(self) -> None:
        """Refuse a second dataset the slot already knows is wrong (a missing path, no tags) before anything runs."""
        for slot in self.slots().values():
            problem = slot.problem()
            if problem:
                raise CrossViewError(problem)

    def _no_validation_reason(self, split: str | None) -> str:
        """Why a run on the current dataset with evaluation split ``split`` has no validation curve ('' if it has)."""
        from crossview.engine.splits import plan_splits

        plan = plan_splits(self.dataset, split, seed=self.seed_spin.value())
        if plan.val:
            return ""
        if plan.eval == "val":
            return ("val is this run's evaluation split, so it is not used for per-epoch validation or early "
                    "stopping (choose test under 'Evaluate on' if the dataset has one).")
        return "the run has no val split, so there is no per-epoch validation or early stopping."

    def resume_selected(self) -> EventTask | None:
        path = self.runs.selected()
        return None if path is None else self.resume(path)

    def resume(self, run_dir: str | Path) -> EventTask | None:
        """Continue a stopped or interrupted run from its checkpoint."""
        preload_engine_modules()
        from crossview.engine import run as engine_run

        run_dir = Path(run_dir)
        try:
            same = self.dataset is not None and self._run_dataset_matches(run_dir)
            gen = engine_run.resume(run_dir, data=self.dataset if same else None,
                                    device=self.device_combo.currentData())
        except CrossViewError as e:
            self._fail(str(e), "", error=e)
            return None
        cfg = self._run_config(run_dir)
        task = self._drive(lambda: gen, run_dir, f"Resuming {run_dir.name}", cfg.get("method"),
                           self._config_no_validation_reason(cfg))
        # the curves from the run's start (its events arrive after this: queued to this thread)
        self.curves.load_history(run_dir)
        return task

    @staticmethod
    def _run_config(run_dir: Path) -> dict[str, Any]:
        from crossview.core.io import read_json
        try:
            cfg = read_json(Path(run_dir) / "config.json")
        except CrossViewError:
            return {}
        return cfg if isinstance(cfg, dict) else {}

    @staticmethod
    def _config_no_validation_reason(cfg: dict[str, Any]) -> str:
        """Why a recorded run had no validation split ('' when it had one or the config does not say)."""
        if not cfg:
            return ""
        vs, split = cfg.get("val_split"), cfg.get("split")
        if not vs and split == "val":
            return ("val was this run's evaluation split (the dataset has no test split), so it was not used for "
                    "per-epoch validation or early stopping.")
        if not vs:
            return "this run had no validation split, so no per-epoch validation or early stopping."
        if vs == split:
            return (f"{vs} was this run's evaluation split, so it was not used for per-epoch validation or early "
                    "stopping.")
        return ""

    def _run_dataset_matches(self, run_dir: Path) -> bool:
        from crossview.core.io import read_json
        try:
            return read_json(run_dir / "config.json").get("dataset_fingerprint") == self.dataset.fingerprint()
        except CrossViewError:
            return False

    def _drive(self, factory: Any, run_dir: Path, title: str, method: str | None = None,
               no_validation_reason: str = "") -> EventTask:
        self.curves.reset(method, no_validation_reason)
        self.view_tabs.setCurrentWidget(self.curves)
        task = EventTask(factory, name="train", parent=self)
        task.event.connect(self._on_event)
        task.failed.connect(lambda message, details, t=task: self._fail(
            message, details, error=t.error, then="press Resume run to continue it from its last checkpoint"))
        task.finished.connect(self._on_finished)
        task.start()
        self._watch(task, run_dir, title)
        return task

    def _watch(self, task: EventTask, run_dir: Path, title: str, search: bool = False) -> None:
        """Show the started ``task`` as the panel's work: the log's title line, the bar and ETA from zero, the
        buttons. A search's task (``search``) is the search view's: its events and end come through the view."""
        self.run_dir = run_dir
        self.last_summary = None
        self.last_error = None
        self._searching = search
        if search:
            self.view_tabs.setCurrentWidget(self.search_view)
        self.log.appendPlainText(f"== {title} -> {run_dir}")
        self.result_card.hide()
        self._t0 = time.monotonic()
        self._eta = RunEta()
        self.progress.setValue(0)
        self.eta_label.setText("Starting...")
        self.task = task
        task.paused_changed.connect(lambda _p: self._update_buttons())
        self._redraw.start()
        self._update_buttons()

    def toggle_pause(self) -> None:
        if self.task is None:
            return
        if self.task.paused:
            self.task.resume()
            self._eta.resume()
            self.eta_label.setText("Continuing...")
        else:
            self.task.pause()
            self._eta.pause()
            self.eta_label.setText("Paused")

    def stop(self) -> None:
        """Stop the run at the next batch / iteration; it keeps a checkpoint and can be resumed."""
        if self.task is not None and self.task.is_running():
            self.eta_label.setText("Stopping...")
            self.task.stop()

    # ------------------------------------------------------------------ search (crossview/gui/search_view.py)
    def _search_choices(self) -> SearchChoices:
        """What a search uses from the form: the method, its parameters as the dialog prefills them, the
        normalisations, encoders, device and seed."""
        method = self.method_combo.currentData()
        img, txt = self.norms()
        return SearchChoices(method, field_texts({p: (spec, get()) for p, (spec, get) in self._getters.items()},
                                                 method or ""),
                             image_norm=img, text_norm=txt, image_encoder=self.image_encoder.currentData(),
                             text_encoder=self.text_encoder.currentData(), device=self.device_combo.currentData(),
                             seed=self.seed_spin.value())

    def _on_search_runs_changed(self) -> None:
        self.refresh_runs()        # the new trial's run folder appears in the runs list
        self.runs_changed.emit()

    def _show_search_status(self, value: int, text: str, tooltip: str) -> None:
        if value >= 0:
            self.progress.setValue(value)
        self.eta_label.setText(text)
        if tooltip:
            self.eta_label.setToolTip(tooltip)

    # the search view's state, read here under its old names (the dialog, the last search's folder, TuneResult
    # and best trial number); its methods are aliased in __init__
    search_dialog = property(lambda self: self.search_view.search_dialog)
    search_folder = property(lambda self: self.search_view.search_folder)
    search_result = property(lambda self: self.search_view.search_result)
    search_best = property(lambda self: self.search_view.search_best)

    # ------------------------------------------------------------------ events
    def _on_event(self, ev: Any) -> None:
        if isinstance(ev, Plan):
            self._eta.plan(ev.stages)
        elif isinstance(ev, Progress):
            frac = ev.fraction
            # over the whole run when the run said its stage plan (pauses excluded); else this stage alone
            whole = self._eta.planned and self._eta.stage(ev.stage) is not None
            eta = self._eta.update(ev.stage, frac, stage_key(ev.message, ev.total)) if ev.total or whole else None
            run_frac = self._eta.fraction() if whole else frac
            self.progress.setValue(int(1000 * run_frac))
            stage = f"{ev.message}  {100 * frac:.0f}%" if ev.total else ev.message
            if self._eta.paused:
                self.eta_label.setText("Paused")    # events already on their way do not overwrite it
            elif whole:
                self.eta_label.setText(f"{stage}  \u00b7  run {100 * run_frac:.0f}%"
                                       + (f", ETA {format_seconds(eta)}" if eta is not None else ""))
            elif eta is not None:
                self.eta_label.setText(f"{stage}  ETA {format_seconds(eta)}")
            else:
                self.eta_label.setText(stage)
        elif isinstance(ev, Loss):
            self.curves.add_loss(ev.step, ev.epoch, ev.terms)
        elif isinstance(ev, Phase):
            self.curves.add_phase(ev.step, ev.epoch, ev.name)
            self._pending_log.append(f"{ev.name} begins at step {ev.step} (after epoch {ev.epoch})")
        elif isinstance(ev, Validation):
            flat = self.curves.add_validation(ev.epoch, ev.metrics)
            if flat:
                self._pending_log.append(f"validation {ev.epoch}: " + ", ".join(f"{k} {v:.2f}" for k, v in flat.items()))
        elif isinstance(ev, Log):
            self._pending_log.append(("" if ev.level == "info" else ev.level.upper() + ": ") + ev.message)
        elif isinstance(ev, CheckpointSaved):
            self._pending_log.append(f"checkpoint saved (step {ev.step})")
        elif isinstance(ev, Finished):
            self.last_summary = dict(ev.summary)
            s = ev.summary
            if s.get("i2t"):
                self._pending_log.append(
                    "finished: " + "  ".join(f"{d} " + " ".join(f"{k} {s[d][k]:.1f}" for k in ("R@1", "R@5", "R@10"))
                                             for d in ("i2t", "t2i")) + f"  rsum {s.get('rsum', 0):.1f}")

    def _flush(self) -> None:
        """Redraw the curves and append the log lines gathered since the last frame."""
        if self._pending_log:
            self.log.appendPlainText("\n".join(self._pending_log[-500:]))
            self._pending_log.clear()
        self.curves.flush()

    def _refuse(self, message: str, title: str) -> None:
        """A runs-list action that was refused (a run being written, a name taken): said in the log and a box;
        the training state and its ETA line are not touched."""
        self.last_error = message
        self.log.appendPlainText(f"{title}: {message}")
        box = QMessageBox(QMessageBox.Icon.Warning, title, message, parent=self)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()

    def _fail(self, message: str, details: str, title: str = "Training failed", error: BaseException | None = None,
              then: str = "start it again") -> None:
        self.last_error = message
        self.log.appendPlainText(f"ERROR: {message}")
        storage = storage_error_of(error)
        if storage is not None:      # a full disk or an unwritable folder: the person's to fix, said as such
            self.eta_label.setText(f"Failed: {storage_title(storage).lower()}")
            self.last_error = storage_text(storage, "the training run", then)
            show_storage_error(self, storage, "the training run", then)
            return
        self.eta_label.setText("Failed")
        box = QMessageBox(QMessageBox.Icon.Warning, title, message, parent=self)
        if details:
            box.setDetailedText(details)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()

    def _on_finished(self) -> None:
        self._redraw.stop()
        self._flush()
        task = self.task
        stopped = task is not None and task.stopped
        searching, self._searching = self._searching, False
        self.refresh_runs()
        self._update_buttons()
        if searching:
            pass        # the search view says how its search ended, right after this (SearchView.ended)
        elif self.last_summary is not None and self.last_summary.get("status", "finished") == "finished":
            self.progress.setValue(1000)
            self.eta_label.setText(f"Finished in {time.monotonic() - self._t0:.1f} s")
            self.result_card.show_summary(self.last_summary, str(self.run_dir))
            self.log.verticalScrollBar().setValue(self.log.verticalScrollBar().maximum())   # the run's last lines
            self.run_finished.emit(str(self.run_dir))
        elif stopped:
            self.eta_label.setText("Stopped: select the run and press Resume run to continue")
        self.runs_changed.emit()

    # ------------------------------------------------------------------ runs list
    def refresh_runs(self) -> None:
        self.runs.refresh()

    def select_run(self, run_dir: str | Path) -> None:
        self.runs.select_run(run_dir)

    def show_history(self, run_dir: str | Path) -> int:
        """Draw the curves and log of a past run from its ``metrics.jsonl``; returns the number of events."""
        from crossview.core.events import event_from_dict
        from crossview.core.io import read_events

        path = Path(run_dir) / "metrics.jsonl"
        if not path.is_file() or (self.task is not None and self.task.is_running()):
            return 0
        cfg = self._run_config(Path(run_dir))
        self.curves.reset(cfg.get("method"), self._config_no_validation_reason(cfg))
        if not (Path(run_dir).parent / "tune.json").is_file():     # a search's trial keeps its table in view
            self.view_tabs.setCurrentWidget(self.curves)
        self.log.clear()
        self.log.appendPlainText(f"== history of {Path(run_dir).name}")
        n = 0
        for d in read_events(path):
            try:
                ev = event_from_dict(d)
            except (ValueError, TypeError):
                continue
            if isinstance(ev, Progress):
                continue
            self._on_event(ev)
            n += 1
        self._flush()
        from crossview.engine.run import read_status
        try:
            status = read_status(run_dir).get("status", "?")
        except CrossViewError:
            status = "?"
        self.progress.setValue(1000 if status == "finished" else 0)
        self.eta_label.setText(f"{Path(run_dir).name}: {status}")
        return n

    def open_run_folder(self, folder: str | Path | None = None) -> Path | None:
        """Open a run folder from anywhere (see :meth:`RunsBrowser.open_run_folder`)."""
        return self.runs.open_run_folder(folder)

    def _busy_with(self, path: Path) -> bool:
        """Whether ``path`` is the run being trained or a trial of the search being run."""
        running = self.task is not None and self.task.is_running() and self.run_dir is not None
        return running and (self.run_dir == path or (self._searching and self.run_dir == path.parent))

    def rename_selected(self, new_name: str | None = None) -> Path | None:
        return self.runs.rename_selected(new_name)

    def delete_selected(self, confirm: bool = True) -> bool:
        return self.runs.delete_selected(confirm)


if __name__ == "__main__":  # pragma: no cover - manual preview
    import sys

    from crossview.gui.app import run_panel
    sys.exit(run_panel(TrainPanel, sys.argv[1] if len(sys.argv) > 1 else "demo"))
