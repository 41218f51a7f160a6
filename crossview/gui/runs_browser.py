"""The runs browser: the run folders of the runs folder (and the trials of its searches and experiments) on the
run store (:mod:`crossview.engine.runs`), with Open, Resume run, Rename..., Delete... and Open run folder....

It knows runs, not training: what to do with a run (open it in Query / Inspect, resume it, draw its curves) is
the owner's, through signals; whether a run is the one the owner is training now is asked through ``is_busy``.
Rename and Delete go through the run store, so a run that another process writes is refused there too (one line
naming its PID, through :attr:`refused`). Runnable alone: ``python -m crossview.gui.runs_browser [RUNS_DIR]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QFileDialog, QGridLayout, QGroupBox, QInputDialog,
                               QListWidget, QListWidgetItem, QMessageBox, QPushButton, QVBoxLayout, QWidget)

from crossview.core.errors import CrossViewError

__all__ = ["RunsBrowser"]


class RunsBrowser(QGroupBox):
    """``open_run(str)``: open this run (double click, Open, Open run folder...); ``history(str)``: a run was
    clicked (its curves can be drawn); ``resume_requested(str)``; ``runs_changed()`` after a rename / delete / a
    fusion; ``selection_changed()``; ``refused(title, message)`` when an action was refused; ``fused(str)``: a fused
    run was made from the selected runs (Fuse..., :mod:`crossview.gui.fuse_dialog`); it is then listed and opened."""

    open_run = Signal(str)
    history = Signal(str)
    resume_requested = Signal(str)
    runs_changed = Signal()
    selection_changed = Signal()
    refused = Signal(str, str)
    fused = Signal(str)

    def __init__(self, runs_root: str | Path, is_busy: Callable[[Path], bool] = lambda p: False,
                 parent: QWidget | None = None) -> None:
        super().__init__("Runs", parent)
        self.runs_root = Path(runs_root)
        self._is_busy = is_busy
        self.last_error = ""
        self.runs_list = QListWidget()
        self.runs_list.itemActivated.connect(lambda it: self.open_run.emit(it.data(Qt.ItemDataRole.UserRole)))
        self.runs_list.itemClicked.connect(lambda it: self.history.emit(it.data(Qt.ItemDataRole.UserRole)))
        self.runs_list.currentItemChanged.connect(lambda *_: self.selection_changed.emit())
        # several runs can be selected (Ctrl / Shift + click): Fuse... combines them
        self.runs_list.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.runs_list.itemSelectionChanged.connect(self._update_fuse_button)
        self.open_button = QPushButton("Open")
        self.resume_button = QPushButton("Resume run")
        self.resume_button.setToolTip("Continue the selected (stopped or interrupted) run from its last checkpoint")
        self.rename_button = QPushButton("Rename...")
        self.delete_button = QPushButton("Delete...")
        self.open_folder_button = QPushButton("Open run folder...")
        self.open_folder_button.setToolTip("Open a run folder from anywhere (e.g. one trained with --run-dir)")
        self.fuse_button = QPushButton("Fuse...")
        self.fuse_button.setToolTip("Combine the selected finished runs (two or more, Ctrl+click) into a fused run: a "
                                    "weighted sum of their scores, weights chosen on the training split")
        self.fuse_button.setEnabled(False)
        self.fuse_button.clicked.connect(lambda: self.fuse_selected())
        self.fuse_dialog = None
        self.open_button.clicked.connect(self._open_selected)
        self.resume_button.clicked.connect(self._resume_selected)
        self.open_folder_button.clicked.connect(lambda: self.open_run_folder())
        self.rename_button.clicked.connect(lambda: self.rename_selected())
        self.delete_button.clicked.connect(lambda: self.delete_selected())
        rb = QGridLayout()          # two rows: five buttons in one row do not fit a 1280-px window
        for i, b in enumerate((self.open_button, self.resume_button, self.rename_button, self.delete_button)):
            rb.addWidget(b, 0, i)
        rb.addWidget(self.open_folder_button, 1, 0, 1, 3)
        rb.addWidget(self.fuse_button, 1, 3)
        # searches and experiments make many runs: their trials are listed only when asked (a search's refit,
        # "best", stands for it), so the list holds what a person trained
        self.show_trials = QCheckBox("Show the trials of searches and experiments")
        self.show_trials.toggled.connect(lambda _on: self.refresh())
        rl = QVBoxLayout(self)
        rl.addWidget(self.runs_list)
        rl.addWidget(self.show_trials)
        rl.addLayout(rb)

    # ------------------------------------------------------------------ the list
    def selected(self) -> Path | None:
        it = self.runs_list.currentItem()
        return Path(it.data(Qt.ItemDataRole.UserRole)) if it is not None else None

    def selected_runs(self) -> list[Path]:
        """The selected runs, in list order (several with Ctrl / Shift + click)."""
        rows = sorted(self.runs_list.row(it) for it in self.runs_list.selectedItems())
        return [Path(self.runs_list.item(r).data(Qt.ItemDataRole.UserRole)) for r in rows]

    def _update_fuse_button(self) -> None:
        self.fuse_button.setEnabled(len(self.runs_list.selectedItems()) >= 2)

    def fuse_selected(self) -> object:
        """Open the Fuse dialog on the selected runs (two or more, else refused in one line); when it has made the
        fused run, the list shows it selected and ``fused`` / ``open_run`` carry it. Returns the dialog."""
        from crossview.gui.fuse_dialog import FuseDialog

        runs = self.selected_runs()
        if len(runs) < 2:
            self._refuse("Select two or more finished runs to fuse (Ctrl+click)", "Cannot fuse")
            return None
        busy = [p for p in runs if self._is_busy(p)]
        if busy:
            self._refuse(f"{busy[0].name} is training now; fuse it once it has finished", "Cannot fuse")
            return None
        dlg = FuseDialog(runs, self.runs_root, parent=self)
        dlg.fused.connect(self._on_fused)
        dlg.finished.connect(dlg.deleteLater)
        self.fuse_dialog = dlg
        dlg.show()
        return dlg

    def _on_fused(self, run_dir: str) -> None:
        self.refresh()
        self.select_run(run_dir)
        self.runs_changed.emit()
        self.fused.emit(run_dir)
        self.open_run.emit(run_dir)

    def refresh(self) -> None:
        """List the runs again (keeping the selection): name, status, and which search a trial belongs to; the
        tooltip names the method, data, rsum and the process writing it, if any."""
        from crossview.engine.runs import describe_run, list_runs

        current = self.selected()
        self.runs_list.blockSignals(True)
        try:
            self.runs_list.clear()
            hidden = 0
            for path in list_runs(self.runs_root):
                nested = path.parent != self.runs_root
                if nested and not self.show_trials.isChecked() and path.name != "best":
                    hidden += 1
                    continue
                info = describe_run(path)
                score = f", rsum {info.rsum:.1f}" if info.rsum is not None and info.status == "finished" else ""
                if nested and not self.show_trials.isChecked():     # a search's refit stands for its search
                    it = QListWidgetItem(f"{path.parent.name} / {path.name}   [{info.status}{score}]   the search's "
                                         "refit")
                else:
                    # a search's trials say which search they belong to (after the status, which matters more)
                    where = "" if not nested else f"   in {path.parent.name}"
                    it = QListWidgetItem(f"{path.name}   [{info.status}{score}]{where}")
                rsum = f", rsum {info.rsum:.1f}" if info.rsum is not None else ""
                writer = f"\nbeing written by PID {info.writer_pid}" if info.writer_pid is not None else ""
                it.setToolTip(f"{path}\n{info.method} on {info.data}{rsum}{writer}")
                it.setData(Qt.ItemDataRole.UserRole, str(path))
                self.runs_list.addItem(it)
                if path == current:
                    self.runs_list.setCurrentItem(it)
        finally:
            self.runs_list.blockSignals(False)
        self.show_trials.setText(f"Show the trials of searches and experiments ({hidden} hidden)"
                                 if hidden else "Show the trials of searches and experiments")
        self.selection_changed.emit()

    def select_run(self, run_dir: str | Path) -> None:
        """Select the run in ``run_dir`` (a hidden trial: the trials are shown first)."""
        for attempt in range(2):
            for row in range(self.runs_list.count()):
                if self.runs_list.item(row).data(Qt.ItemDataRole.UserRole) == str(run_dir):
                    self.runs_list.setCurrentRow(row)
                    return
            # a run outside the runs folder is not a hidden trial: the list stays as it is
            if attempt or self.show_trials.isChecked() or Path(run_dir).parent == self.runs_root \
                    or Path(self.runs_root) not in Path(run_dir).parents:
                return
            self.show_trials.setChecked(True)        # refreshes the list

    # ------------------------------------------------------------------ actions
    def _refuse(self, message: str, title: str) -> None:
        self.last_error = message
        self.refused.emit(title, message)

    def _open_selected(self) -> None:
        path = self.selected()
        if path is not None:
            self.open_run.emit(str(path))

    def _resume_selected(self) -> None:
        path = self.selected()
        if path is not None:
            self.resume_requested.emit(str(path))

    def open_run_folder(self, folder: str | Path | None = None) -> Path | None:
        """Open a run folder from anywhere (a folder chooser when ``folder`` is None): a folder with a run's
        ``config.json`` is opened (``history`` and ``open_run``); anything else is refused, saying what to pick."""
        if folder is None:
            chosen = QFileDialog.getExistingDirectory(self, "Open run folder", str(self.runs_root))
            if not chosen:
                return None
            folder = chosen
        path = Path(folder)
        if not (path / "config.json").is_file():
            self._refuse(f"{path} is not a run folder (it has no config.json): choose the folder that "
                         "'crossview train' wrote (with config.json, metrics.jsonl and the checkpoint)",
                         "Not a run folder")
            return None
        self.history.emit(str(path))
        self.open_run.emit(str(path))
        return path

    def rename_selected(self, new_name: str | None = None) -> Path | None:
        old = self.selected()
        if old is None:
            return None
        if self._is_busy(old):
            self._refuse("this run is training (or is a trial of the running search); stop it before renaming",
                         "Cannot rename run")
            return None
        if new_name is None:
            dialog = QInputDialog(self)
            dialog.setWindowTitle("Rename run")
            from crossview.engine.runs import fused_runs_using

            users = fused_runs_using(old)
            dialog.setLabelText(f"New name for {old.name}:" + (
                "\n(fused run(s) " + ", ".join(f.name for f in users) + " use it as a member and would no longer "
                "answer queries)" if users else ""))
            dialog.setTextValue(old.name)
            # wide enough to show a whole run name (method-dataset-timestamp) and a few more characters
            dialog.resize(max(360, dialog.fontMetrics().horizontalAdvance(old.name + "W" * 12) + 60),
                          dialog.sizeHint().height())
            if not dialog.exec():
                return None
            new_name = dialog.textValue()
        from crossview.engine.runs import rename_run
        try:
            target = rename_run(old, new_name)      # refused while another process writes the run
        except CrossViewError as e:
            self._refuse(str(e), "Cannot rename run")
            return None
        self.refresh()
        self.select_run(target)
        self.runs_changed.emit()
        return target

    def delete_selected(self, confirm: bool = True) -> bool:
        path = self.selected()
        if path is None:
            return False
        if self._is_busy(path):
            self._refuse("this run is training (or is a trial of the running search); stop it before deleting it",
                         "Cannot delete run")
            return False
        if confirm:
            from crossview.engine.runs import fused_runs_using

            users = fused_runs_using(path)
            also = ("\n\nFused run(s) " + ", ".join(f.name for f in users) + " use it as a member and could no "
                    "longer answer queries." if users else "")
            answer = QMessageBox.question(self, "Delete run", f"Delete the run folder {path}?\n\nIts checkpoint, "
                                          f"metrics and annotations are removed for good.{also}")
            if answer != QMessageBox.StandardButton.Yes:
                return False
        from crossview.engine.runs import delete_run
        try:
            delete_run(path)                        # refused while another process writes the run
        except CrossViewError as e:
            self._refuse(str(e), "Cannot delete run")
            return False
        self.refresh()
        self.runs_changed.emit()
        return True


if __name__ == "__main__":  # pragma: no cover - manual preview
    import sys

    from PySide6.QtWidgets import QApplication

    from crossview.core.settings import get_settings

    app = QApplication(sys.argv)
    browser = RunsBrowser(sys.argv[1] if len(sys.argv) > 1 else get_settings().runs_dir)
    browser.refused.connect(lambda title, message: QMessageBox.warning(browser, title, message))
    browser.refresh()
    browser.resize(480, 600)
    browser.show()
    sys.exit(app.exec())
