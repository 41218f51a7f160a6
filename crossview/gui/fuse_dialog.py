"""The Fuse dialog: fuse the runs selected in the runs list into a fused run (:mod:`crossview.engine.fuse`).

It names the runs, asks for the weights (chosen on the training folds, or given) and the new run's name, and runs
:func:`crossview.engine.fuse.iter_fuse` in a background :class:`~crossview.gui.workers.EventTask` with a progress
bar; ``fused(str)`` carries the new run folder once it has finished (the runs list then shows and opens it). Bad
input (runs on different datasets, weights that do not fit) is one line in the dialog. Runnable alone:
``python -m crossview.gui.fuse_dialog RUN RUN ...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QButtonGroup, QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QProgressBar,
                               QPushButton, QRadioButton, QVBoxLayout, QWidget)

__all__ = ["FuseDialog"]


def _default_name(run_dirs: Sequence[Path]) -> str:
    from datetime import datetime

    from crossview.engine.run_folder import read_summary

    methods = []
    for d in run_dirs:
        try:
            methods.append(str(read_summary(d).get("method", "run")))
        except Exception:  # noqa: BLE001 - a damaged summary: the fusion itself says so in one line
            methods.append("run")
    return "fused-" + "+".join(methods) + "-" + datetime.now().strftime("%Y%m%d-%H%M%S")


class FuseDialog(QDialog):
    """``fused(str)``: the new fused run's folder, once it finished; ``failed(str)``: the one-line reason."""

    fused = Signal(str)
    failed = Signal(str)

    def __init__(self, run_dirs: Sequence[str | Path], runs_root: str | Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Fuse runs")
        self.run_dirs = [Path(d) for d in run_dirs]
        self.runs_root = Path(runs_root)
        self.task: Any = None
        self.summary: dict[str, Any] | None = None
        self.last_error = ""
        names = QLabel("Fuse " + ", ".join(d.name for d in self.run_dirs) + ": a weighted sum of their scores, "
                       "each standardised on its training split.")
        names.setWordWrap(True)
        self.auto_button = QRadioButton("Choose the weights by 3-fold cross-validation of the training images "
                                        "(each run trained again on each fold; val/test not used)")
        self.auto_button.setToolTip("About twice the runs' own training time; the fold runs are kept in the fused "
                                    "run's cv folder, so a stopped fusion continues them")
        self.bank_button = QRadioButton("Quick: choose on folds of the runs' training banks (no training; "
                                        "in-sample)")
        self.given_button = QRadioButton("Given weights:")
        self.auto_button.setChecked(True)
        group = QButtonGroup(self)
        for b in (self.auto_button, self.bank_button, self.given_button):
            group.addButton(b)
        self.weights_edit = QLineEdit(",".join(["1"] * len(self.run_dirs)))
        self.weights_edit.setToolTip("one weight >= 0 per run, in the order above, separated by commas")
        self.weights_edit.setEnabled(False)
        self.given_button.toggled.connect(self.weights_edit.setEnabled)
        self.name_edit = QLineEdit(_default_name(self.run_dirs))
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setValue(0)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.fuse_button = QPushButton("Fuse")
        self.fuse_button.setDefault(True)
        self.fuse_button.clicked.connect(self.start)
        buttons = QDialogButtonBox()
        buttons.addButton(self.fuse_button, QDialogButtonBox.ButtonRole.AcceptRole)
        self.cancel_button = buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        self.cancel_button.clicked.connect(self._cancel)
        form = QFormLayout()
        form.addRow(self.auto_button)
        form.addRow(self.bank_button)
        form.addRow(self.given_button, self.weights_edit)
        form.addRow("New run:", self.name_edit)
        lay = QVBoxLayout(self)
        lay.addWidget(names)
        lay.addLayout(form)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addWidget(buttons)

    @property
    def run_dir(self) -> Path:
        return self.runs_root / self.name_edit.text().strip()

    def _fail(self, message: str) -> None:
        self.last_error = message
        self.status.setText(message)
        self.fuse_button.setEnabled(True)
        self.failed.emit(message)

    def start(self) -> None:
        """Check the input (one line in the dialog when it is wrong) and fuse in the background."""
        from crossview.core.errors import CrossViewError
        from crossview.engine.fuse import iter_fuse, parse_weights
        from crossview.engine.run_folder import check_folder_name
        from crossview.gui.workers import EventTask

        if self.task is not None and self.task.is_running():
            return
        try:
            name = check_folder_name(self.name_edit.text().strip() or "", "run name")
            if not name:
                raise CrossViewError("give the new run a name")
            if (self.runs_root / name).exists():
                raise CrossViewError(f"{self.runs_root / name} exists; give the new run another name")
            weights = ("auto" if self.auto_button.isChecked() else "bank" if self.bank_button.isChecked()
                       else self.weights_edit.text())
            parse_weights(weights, len(self.run_dirs))
        except CrossViewError as e:
            self._fail(str(e))
            return
        runs, folder = list(self.run_dirs), self.runs_root / name
        self.summary = None
        self.last_error = ""
        self.fuse_button.setEnabled(False)
        self.status.setText("Fusing ...")
        task = EventTask(lambda: iter_fuse(runs, weights, run_dir=folder), name="fuse", parent=self)
        self.task = task
        task.event.connect(self._on_event)
        task.failed.connect(lambda message, _details: self._fail(message))
        task.finished.connect(lambda t=task, f=folder: self._on_finished(t, f))
        task.start()

    def _on_event(self, ev: Any) -> None:
        from crossview.core.events import Finished, Progress

        if isinstance(ev, Progress) and ev.total:
            if ev.stage != "cv run":       # a cross-validation run's own steps: said, not drawn on the bar
                self.progress.setFormat(f"{ev.message}: %p%")
                self.progress.setValue(int(100 * ev.step / ev.total))
            self.status.setText(f"{ev.message} ({ev.step}/{ev.total})")
        elif isinstance(ev, Finished):
            self.summary = ev.summary

    def _on_finished(self, task: Any, folder: Path) -> None:
        if task is not self.task or self.summary is None:
            return
        self.progress.setValue(100)
        self.status.setText(f"Fused: rsum {self.summary['rsum']:.1f} on {self.summary.get('reported_on')}")
        self.fused.emit(str(folder))
        self.accept()

    def _cancel(self) -> None:
        if self.task is not None and self.task.is_running():
            self.task.stop()
            self.task.wait()
        self.reject()

    def closeEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        if self.task is not None and self.task.is_running():
            self.task.stop()
            self.task.wait()
        super().closeEvent(event)


if __name__ == "__main__":  # pragma: no cover
    import sys

    from PySide6.QtWidgets import QApplication

    from crossview.core.settings import get_settings

    app = QApplication.instance() or QApplication(sys.argv)
    dlg = FuseDialog(sys.argv[1:], get_settings().runs_dir)
    dlg.show()
    sys.exit(app.exec())
