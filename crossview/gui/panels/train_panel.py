"""The Train panel: pick a method (from the registry, with its card), set its parameters (a form built
from the card: defaults, tooltips, ranges), the features and the device; start / pause / stop /
resume; progress with ETA, live curves of every loss term per step and of R@K / rsum per validation,
a log, and the runs list (open, rename, delete with confirmation).

The work is :func:`crossview.engine.train` / :func:`crossview.engine.run.resume`, a generator of events
driven by an :class:`~crossview.gui.workers.EventTask`; nothing here trains. Methods registered later
appear with no change to this file. Run alone: ``python -m crossview.gui.panels.train_panel``.
"""

from __future__ import annotations

import html
import shutil
import time
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QDoubleValidator
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QInputDialog, QLabel,
                               QLineEdit, QListWidget, QListWidgetItem, QMessageBox, QPlainTextEdit, QProgressBar,
                               QPushButton, QScrollArea, QSpinBox, QSplitter, QVBoxLayout, QWidget)

from crossview.engine.events import CheckpointSaved, Finished, Log, Loss, Progress, Validation
from crossview.errors import CrossViewError
from crossview.gui.workers import EventTask, preload_engine_modules

CURVE_COLOURS = ["#0969da", "#d1242f", "#1a7f37", "#8250df", "#bf8700", "#57606a", "#e16f24", "#116329"]
VALIDATION_KEYS = ("R@1", "R@5", "R@10")


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
    """``run_finished(str)`` carries the run folder of a run that finished; ``open_run(str)`` asks to open one."""

    run_finished = Signal(str)
    open_run = Signal(str)
    runs_changed = Signal()

    def __init__(self, parent: QWidget | None = None, runs_root: str | Path | None = None) -> None:
        super().__init__(parent)
        from crossview.settings import get_settings

        self.runs_root = Path(runs_root) if runs_root is not None else get_settings().runs_dir
        preload_engine_modules()
        self.dataset: Any = None
        self.task: EventTask | None = None
        self.run_dir: Path | None = None
        self.last_summary: dict[str, Any] | None = None
        self.last_error: str | None = None
        self._getters: dict[str, Any] = {}
        self._card: Any = None
        self._t0 = 0.0
        self._loss_data: dict[str, tuple[list[float], list[float]]] = {}
        self._val_data: dict[str, tuple[list[float], list[float]]] = {}
        self._curves: dict[str, Any] = {}
        self._val_curves: dict[str, Any] = {}
        # Loss events can come thousands a second: collect them and redraw the curves 10 times a second,
        # so the GUI thread never spends more than a few ms per frame on plotting.
        self._dirty = False
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
        self.params_box = QGroupBox("Parameters")
        self.params_form = QFormLayout(self.params_box)
        self.image_encoder = QComboBox()
        self.text_encoder = QComboBox()
        self.device_combo = QComboBox()
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(0, 2**31 - 1)
        self.run_name = QLineEdit()
        self.run_name.setPlaceholderText("run name (default: method-dataset-time)")
        self._fill_encoders()
        self._fill_devices()
        feats = QGroupBox("Features and device")
        ff = QFormLayout(feats)
        ff.addRow("Image encoder", self.image_encoder)
        ff.addRow("Text encoder", self.text_encoder)
        ff.addRow("Device", self.device_combo)
        ff.addRow("Seed", self.seed_spin)
        ff.addRow("Run name", self.run_name)

        self.start_button = QPushButton("Start")
        self.start_button.setObjectName("primary")
        self.pause_button = QPushButton("Pause")
        self.stop_button = QPushButton("Stop")
        self.resume_button = QPushButton("Resume run")
        self.resume_button.setToolTip("Continue the selected (stopped or interrupted) run from its last checkpoint")
        self.start_button.clicked.connect(self.start)
        self.pause_button.clicked.connect(self.toggle_pause)
        self.stop_button.clicked.connect(self.stop)
        self.resume_button.clicked.connect(self.resume_selected)
        buttons = QHBoxLayout()
        for b in (self.start_button, self.pause_button, self.stop_button):
            buttons.addWidget(b)

        left_inner = QWidget()
        ll = QVBoxLayout(left_inner)
        ll.addWidget(QLabel("<b>Method</b>"))
        ll.addWidget(self.method_combo)
        ll.addWidget(self.method_info)
        ll.addWidget(self.params_box)
        ll.addWidget(feats)
        ll.addLayout(buttons)
        ll.addStretch(1)
        left = QScrollArea()
        left.setWidgetResizable(True)
        left.setWidget(left_inner)
        left.setMinimumWidth(340)

        # ---- right: progress, curves, log, runs
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.eta_label = QLabel("Idle")
        self.loss_plot = pg.PlotWidget(background="w", title="Training loss terms per step")
        self.loss_plot.addLegend(offset=(-10, 10))
        self.loss_plot.setLabel("bottom", "step")
        self.val_plot = pg.PlotWidget(background="w", title="Validation R@1 / R@5 / R@10 (%)")
        self.val_plot.addLegend(offset=(-10, 10))
        self.val_plot.setLabel("bottom", "epoch / iteration")
        self.rsum_plot = pg.PlotWidget(background="w", title="Validation rsum")
        self.rsum_plot.setLabel("bottom", "epoch / iteration")
        self._rsum_curve = None
        for p in (self.loss_plot, self.val_plot, self.rsum_plot):
            p.setMinimumHeight(160)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(5000)
        self.runs_list = QListWidget()
        self.runs_list.itemActivated.connect(lambda it: self.open_run.emit(it.data(Qt.ItemDataRole.UserRole)))
        self.runs_list.itemClicked.connect(lambda it: self.show_history(it.data(Qt.ItemDataRole.UserRole)))
        self.open_button = QPushButton("Open")
        self.rename_button = QPushButton("Rename...")
        self.delete_button = QPushButton("Delete...")
        self.open_button.clicked.connect(self._open_selected)
        self.rename_button.clicked.connect(self.rename_selected)
        self.delete_button.clicked.connect(self.delete_selected)
        rb = QHBoxLayout()
        for b in (self.open_button, self.resume_button, self.rename_button, self.delete_button):
            rb.addWidget(b)
        runs_box = QGroupBox("Runs")
        rl = QVBoxLayout(runs_box)
        rl.addWidget(self.runs_list)
        rl.addLayout(rb)

        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        pr = QHBoxLayout()
        pr.addWidget(self.progress, 1)
        pr.addWidget(self.eta_label)
        tl.addLayout(pr)
        plots = QHBoxLayout()
        plots.addWidget(self.loss_plot, 3)
        plots.addWidget(self.val_plot, 3)
        plots.addWidget(self.rsum_plot, 2)
        tl.addLayout(plots, 1)
        bottom = QSplitter()
        bottom.addWidget(self.log)
        bottom.addWidget(runs_box)
        bottom.setSizes([500, 400])
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(top)
        right.addWidget(bottom)
        right.setSizes([420, 260])
        split = QSplitter()
        split.addWidget(left)
        split.addWidget(right)
        split.setSizes([380, 900])
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

    def _fill_encoders(self) -> None:
        from crossview.features import image as image_mod
        from crossview.features import text as text_mod

        self.image_encoder.addItem(f"{image_mod.DEFAULT_IMAGE_ENCODER} (default)", None)
        for n in image_mod.list_image_encoders():
            if n != image_mod.DEFAULT_IMAGE_ENCODER:
                self.image_encoder.addItem(n, n)
        self.text_encoder.addItem(f"{text_mod.DEFAULT_TEXT_ENCODER} (default)", None)
        for n in text_mod.list_text_encoders():
            if n != text_mod.DEFAULT_TEXT_ENCODER and not n.endswith(":PATH") and n != "vocab":
                self.text_encoder.addItem(n, n)
        self.image_encoder.setToolTip("Frozen image backbone (weights found offline); datasets with precomputed "
                                      "features use those")
        self.text_encoder.setToolTip("Caption features; fitted encoders (tfidf, bow, lda) learn on the train split")

    def _fill_devices(self) -> None:
        from crossview.engine.devices import list_devices

        self.device_combo.addItem("auto (a GPU when present)", "auto")
        for d in list_devices():
            self.device_combo.addItem(f"{d.name}: {d.description}", d.name)

    def _on_method(self) -> None:
        from crossview.methods import cards, method_class

        name = self.method_combo.currentData()
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
            self.method_info.setText(f"<b>{html.escape(c.title)}</b><br>{html.escape(' '.join(c.description.split()))}"
                                     f"<br><span style='color:#57606a'>{html.escape(c.citation)}</span>")
            specs = c.params
        else:
            cls = method_class(name)
            self.method_info.setText(html.escape((cls.__doc__ or name).strip().splitlines()[0]))
            from crossview.methods.cards import ParamSpec, _infer_type
            specs = {k: ParamSpec(k, v, _infer_type(v)) for k, v in cls.default_params().items()
                     if isinstance(v, (int, float, str, bool))}
        for pname, spec in specs.items():
            w, get = _param_widget(spec)
            tip = spec.help + (f" (default {spec.default})" if spec.help else f"default {spec.default}")
            w.setToolTip(tip)
            label = QLabel(pname)
            label.setToolTip(tip)
            self.params_form.addRow(label, w)
            self._getters[pname] = (spec, get)

    def params(self) -> dict[str, Any]:
        """The form's parameters, converted by the card (a CrossViewError names a bad one)."""
        out = {}
        for pname, (spec, get) in self._getters.items():
            out[pname] = spec.coerce(get(), self.method_combo.currentData() or "")
        return out

    def set_param(self, name: str, value: Any) -> None:
        """Set one form field (for tests and scripted demos)."""
        spec, _ = self._getters[name]
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
        self.dataset = ds
        self._update_buttons()

    # ------------------------------------------------------------------ running
    def _update_buttons(self) -> None:
        running = self.task is not None and self.task.is_running()
        self.start_button.setEnabled(not running and self.dataset is not None and self.method_combo.count() > 0)
        self.pause_button.setEnabled(running)
        self.stop_button.setEnabled(running)
        self.resume_button.setEnabled(not running and self.runs_list.currentItem() is not None)
        self.pause_button.setText("Continue" if running and self.task.paused else "Pause")
        for w in (self.method_combo, self.params_box, self.image_encoder, self.text_encoder, self.device_combo):
            w.setEnabled(not running)

    def _new_run_dir(self, method: str) -> Path:
        name = self.run_name.text().strip()
        if name:
            if any(ch in name for ch in "/\\") or name in (".", ".."):
                raise CrossViewError(f"run name {name!r}: use letters, digits, '-' and '_' only")
            return self.runs_root / name
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = self.runs_root / f"{method}-{self.dataset.name}-{stamp}"
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        return path

    def start(self) -> EventTask | None:
        """Start training the chosen method on the current dataset in a new run folder."""
        from crossview.engine import run as engine_run

        if self.dataset is None or (self.task is not None and self.task.is_running()):
            return None
        method = self.method_combo.currentData()
        try:
            params = self.params()
            run_dir = self._new_run_dir(method)
            it = engine_run.train(method, self.dataset, run_dir=run_dir, params=params,
                                  image_encoder=self.image_encoder.currentData(),
                                  text_encoder=self.text_encoder.currentData(),
                                  device=self.device_combo.currentData(), seed=self.seed_spin.value())
        except CrossViewError as e:
            self._fail(str(e), "")
            return None
        return self._drive(lambda: it, run_dir, f"Training {method} on {self.dataset.name}")

    def resume_selected(self) -> EventTask | None:
        it = self.runs_list.currentItem()
        if it is None:
            return None
        return self.resume(it.data(Qt.ItemDataRole.UserRole))

    def resume(self, run_dir: str | Path) -> EventTask | None:
        """Continue a stopped or interrupted run from its checkpoint."""
        from crossview.engine import run as engine_run

        run_dir = Path(run_dir)
        try:
            same = self.dataset is not None and self._run_dataset_matches(run_dir)
            gen = engine_run.resume(run_dir, data=self.dataset if same else None,
                                    device=self.device_combo.currentData())
        except CrossViewError as e:
            self._fail(str(e), "")
            return None
        return self._drive(lambda: gen, run_dir, f"Resuming {run_dir.name}")

    def _run_dataset_matches(self, run_dir: Path) -> bool:
        from crossview.engine.io import read_json
        try:
            return read_json(run_dir / "config.json").get("dataset_fingerprint") == self.dataset.fingerprint()
        except CrossViewError:
            return False

    def _drive(self, factory: Any, run_dir: Path, title: str) -> EventTask:
        self.run_dir = run_dir
        self.last_summary = None
        self.last_error = None
        self._reset_plots()
        self.log.appendPlainText(f"== {title} -> {run_dir}")
        self._t0 = time.monotonic()
        self.progress.setValue(0)
        self.eta_label.setText("Starting...")
        task = EventTask(factory, name="train", parent=self)
        self.task = task
        task.event.connect(self._on_event)
        task.failed.connect(self._fail)
        task.paused_changed.connect(lambda _p: self._update_buttons())
        task.finished.connect(self._on_finished)
        task.start()
        self._redraw.start()
        self._update_buttons()
        return task

    def toggle_pause(self) -> None:
        if self.task is None:
            return
        if self.task.paused:
            self.task.resume()
            self.eta_label.setText("Continuing...")
        else:
            self.task.pause()
            self.eta_label.setText("Paused")

    def stop(self) -> None:
        """Stop the run at the next batch / iteration; it keeps a checkpoint and can be resumed."""
        if self.task is not None and self.task.is_running():
            self.eta_label.setText("Stopping...")
            self.task.stop()

    # ------------------------------------------------------------------ events
    def _on_event(self, ev: Any) -> None:
        if isinstance(ev, Progress):
            frac = ev.fraction
            self.progress.setValue(int(1000 * frac))
            elapsed = time.monotonic() - self._t0
            if 0.02 < frac < 1:
                eta = elapsed * (1 - frac) / frac
                self.eta_label.setText(f"{ev.message}  {100 * frac:.0f}%  ETA {eta:.0f} s")
            else:
                self.eta_label.setText(f"{ev.message}  {100 * frac:.0f}%" if ev.total else ev.message)
        elif isinstance(ev, Loss):
            for term, value in ev.terms.items():
                if value is None:
                    continue
                xs, ys = self._loss_data.setdefault(term, ([], []))
                xs.append(float(ev.step))
                ys.append(float(value))
                self._dirty = True
        elif isinstance(ev, Validation):
            m = ev.metrics
            flat = {}
            for d in ("i2t", "t2i"):
                for k in ("R@1", "R@5", "R@10"):
                    if isinstance(m.get(d), dict) and k in m[d]:
                        flat[f"{d} {k}"] = m[d][k]
            for k in VALIDATION_KEYS + ("rsum",):
                if isinstance(m.get(k), (int, float)):
                    flat[k] = m[k]
            for key, value in flat.items():
                xs, ys = self._val_data.setdefault(key, ([], []))
                xs.append(float(ev.epoch))
                ys.append(float(value))
                self._dirty = True
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
        if not self._dirty:
            return
        self._dirty = False
        for term, (xs, ys) in self._loss_data.items():
            step = max(1, len(xs) // 5000)          # at most ~5,000 points per curve on screen
            self._curve(self.loss_plot, self._curves, term).setData(xs[::step], ys[::step])
        for key, (xs, ys) in self._val_data.items():
            if key == "rsum":
                if self._rsum_curve is None:
                    self._rsum_curve = self.rsum_plot.plot([], [], pen=pg.mkPen("#bf8700", width=2),
                                                           symbolBrush="#bf8700")
                self._rsum_curve.setData(xs, ys, symbol="o", symbolSize=6)
            else:
                self._curve(self.val_plot, self._val_curves, key).setData(xs, ys, symbol="o", symbolSize=5)
        for plot, data in ((self.val_plot, self._val_data), (self.rsum_plot, self._val_data),
                           (self.loss_plot, self._loss_data)):
            xs_all = [x for xs, _ in data.values() for x in xs]
            if xs_all and max(xs_all) == min(xs_all):        # one point: a sensible window around it
                plot.setXRange(min(xs_all) - 1, min(xs_all) + 1, padding=0)
            else:
                plot.enableAutoRange(axis="x")
        self.loss_plot.setTitle("Training loss terms per step" if self._loss_data or not self._val_data else
                                "No loss curve (closed-form method)")

    def _curve(self, plot: pg.PlotWidget, store: dict[str, Any], key: str) -> Any:
        if key not in store:
            colour = CURVE_COLOURS[len(store) % len(CURVE_COLOURS)]
            store[key] = plot.plot([], [], pen=pg.mkPen(colour, width=2), name=key, symbolBrush=colour)
        return store[key]

    def _reset_plots(self) -> None:
        self.rsum_plot.clear()
        self._rsum_curve = None
        self.loss_plot.setTitle("Training loss terms per step")
        for plot in (self.loss_plot, self.val_plot):
            plot.clear()
            if plot.plotItem.legend is not None:
                plot.plotItem.legend.clear()
        self._curves.clear()
        self._val_curves.clear()
        self._loss_data.clear()
        self._val_data.clear()

    def _fail(self, message: str, details: str) -> None:
        self.last_error = message
        self.log.appendPlainText(f"ERROR: {message}")
        self.eta_label.setText("Failed")
        box = QMessageBox(QMessageBox.Icon.Warning, "Training failed", message, parent=self)
        if details:
            box.setDetailedText(details)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()

    def _on_finished(self) -> None:
        self._redraw.stop()
        self._flush()
        task = self.task
        stopped = task is not None and task.stopped
        self._update_buttons()
        self.refresh_runs()
        if self.last_summary is not None and self.last_summary.get("status", "finished") == "finished":
            self.progress.setValue(1000)
            self.eta_label.setText(f"Finished in {time.monotonic() - self._t0:.1f} s")
            self.run_finished.emit(str(self.run_dir))
        elif stopped:
            self.eta_label.setText("Stopped: select the run and press Resume run to continue")
        self.runs_changed.emit()

    # ------------------------------------------------------------------ runs list
    def refresh_runs(self) -> None:
        from crossview.engine.run import read_status
        from crossview.engine.session import list_runs

        current = self.runs_list.currentItem().data(Qt.ItemDataRole.UserRole) if self.runs_list.currentItem() else None
        self.runs_list.clear()
        for path in list_runs(self.runs_root):
            try:
                status = read_status(path).get("status", "?")
            except CrossViewError:
                status = "?"
            it = QListWidgetItem(f"{path.name}   [{status}]")
            it.setData(Qt.ItemDataRole.UserRole, str(path))
            self.runs_list.addItem(it)
            if str(path) == current:
                self.runs_list.setCurrentItem(it)
        self.runs_list.currentItemChanged.connect(lambda *_: self._update_buttons())

    def select_run(self, run_dir: str | Path) -> None:
        for row in range(self.runs_list.count()):
            if self.runs_list.item(row).data(Qt.ItemDataRole.UserRole) == str(run_dir):
                self.runs_list.setCurrentRow(row)
                return

    def show_history(self, run_dir: str | Path) -> int:
        """Draw the curves and log of a past run from its ``metrics.jsonl``; returns the number of events."""
        from crossview.engine.events import event_from_dict
        from crossview.engine.io import read_events

        path = Path(run_dir) / "metrics.jsonl"
        if not path.is_file() or (self.task is not None and self.task.is_running()):
            return 0
        self._reset_plots()
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

    def _open_selected(self) -> None:
        it = self.runs_list.currentItem()
        if it is not None:
            self.open_run.emit(it.data(Qt.ItemDataRole.UserRole))

    def rename_selected(self, new_name: str | None = None) -> Path | None:
        it = self.runs_list.currentItem()
        if it is None:
            return None
        old = Path(it.data(Qt.ItemDataRole.UserRole))
        if self.task is not None and self.task.is_running() and self.run_dir == old:
            self._fail("this run is training; stop it before renaming", "")
            return None
        if new_name is None:
            new_name, ok = QInputDialog.getText(self, "Rename run", "New name:", text=old.name)
            if not ok:
                return None
        new_name = new_name.strip()
        target = old.with_name(new_name)
        if not new_name or any(ch in new_name for ch in "/\\") or target.exists():
            self._fail(f"cannot rename to {new_name!r}: " + ("that run exists" if target.exists() else "invalid name"), "")
            return None
        old.rename(target)
        self.refresh_runs()
        self.select_run(target)
        self.runs_changed.emit()
        return target

    def delete_selected(self, confirm: bool = True) -> bool:
        it = self.runs_list.currentItem()
        if it is None:
            return False
        path = Path(it.data(Qt.ItemDataRole.UserRole))
        if self.task is not None and self.task.is_running() and self.run_dir == path:
            self._fail("this run is training; stop it before deleting it", "")
            return False
        if confirm:
            answer = QMessageBox.question(self, "Delete run", f"Delete the run folder {path}?\n\nIts checkpoint, "
                                          "metrics and annotations are removed for good.")
            if answer != QMessageBox.StandardButton.Yes:
                return False
        shutil.rmtree(path)
        self.refresh_runs()
        self.runs_changed.emit()
        return True


if __name__ == "__main__":  # pragma: no cover - manual preview
    import sys

    from crossview.gui.launch import run_panel
    sys.exit(run_panel(TrainPanel, sys.argv[1] if len(sys.argv) > 1 else "demo"))
