"""A full disk or an unwritable folder is said as such in the app (issue 31): its own dialog naming the path, the
space the write needed and what to do (free space, or choose another folder), for a training run, for the marks
and for the exports; not the plain error box."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from _engine_helpers import make_toy_dataset  # noqa: E402
from crossview.core.errors import StorageError, storage_error  # noqa: E402
from crossview.gui.storage_dialog import DIALOG_NAME, storage_text  # noqa: E402

pytestmark = pytest.mark.gui


def _full(path: Path, need: int) -> StorageError:
    return storage_error(OSError(errno.ENOSPC, "No space left on device"), path, need)


def _dialogs(widget) -> list[QMessageBox]:
    return [b for b in widget.findChildren(QMessageBox) if b.isVisible()]


def test_storage_text_names_the_path_the_space_and_what_to_do() -> None:
    e = _full(Path("/data/runs/r1/checkpoint.pt"), 3 * 2**20)
    text = storage_text(e, "the training run", "resume it")
    assert text == ("Could not save the training run: the disk holding /data/runs/r1/checkpoint.pt is full. It "
                    "needed 3.0 MiB more. Free some space on that disk, then resume it; or choose a folder on "
                    "another disk.")
    ro = storage_error(OSError(errno.EROFS, "Read-only file system"), "/mnt/cd/marks.csv")
    assert storage_text(ro, "the marks export") == ("Could not save the marks export: /mnt/cd/marks.csv cannot be "
                                                    "written (read-only file system). Choose a folder you can "
                                                    "write to, then try again.")
    unknown = StorageError(errno.ENOSPC, "x: the disk is full", "/x")
    assert "How much space it needed is not known" in storage_text(unknown, "it")


def test_a_training_run_on_a_full_disk_opens_the_storage_dialog(qtbot, tmp_path: Path, monkeypatch) -> None:
    """The run's checkpoint writer raises StorageError (the disk filled up mid-run): the Train panel shows the
    storage dialog (the checkpoint's path, 120.6 KiB needed, free space or another disk, Resume run), not the
    plain "Training failed" box."""
    from crossview.engine import run as engine_run
    from crossview.gui.panels.train_panel import TrainPanel

    def full_disk(path, payload):
        raise _full(Path(path), 123_456)

    monkeypatch.setattr(engine_run, "save_checkpoint", full_disk)
    panel = TrainPanel(runs_root=tmp_path / "runs")
    qtbot.addWidget(panel)
    panel.set_dataset(make_toy_dataset(n_images=120))
    panel.text_encoder.setCurrentIndex(panel.text_encoder.findData("tfidf"))
    panel.device_combo.setCurrentIndex(panel.device_combo.findData("cpu"))
    panel.show()
    panel.select_method("cca")
    panel.set_param("n_components", 4)
    task = panel.start()
    assert task is not None, panel.last_error
    with qtbot.waitSignal(task.finished, timeout=120_000):
        pass
    assert isinstance(task.error, StorageError)
    [box] = _dialogs(panel)
    assert box.objectName() == DIALOG_NAME and box.windowTitle() == "Disk full"
    assert box.icon() == QMessageBox.Icon.Critical
    text = box.text()
    assert str(panel.run_dir / "checkpoint.pt") in text and "120.6 KiB" in text
    assert "Free some space" in text and "another disk" in text and "Resume run" in text
    assert panel.eta_label.text() == "Failed: disk full" and panel.last_error == text
    box.close()


def test_marks_on_a_full_disk_say_so_once_and_an_export_there_offers_another_folder(qtbot, tmp_path: Path,
                                                                                      monkeypatch) -> None:
    from PySide6.QtWidgets import QFileDialog

    from crossview.engine.annotations import AnnotationStore, MarkNotSaved
    from crossview.gui.marks import MarkButtons

    w = MarkButtons()
    qtbot.addWidget(w)
    w.show()
    w.store = AnnotationStore(tmp_path / "run")

    def full(self, recs):
        raise _full(self.path, 0)

    monkeypatch.setattr(AnnotationStore, "_write", full)
    for item in (3, 4):                               # two marks while the disk is full: one dialog
        with pytest.raises(MarkNotSaved) as failed:
            w.store.mark("i2t", {"image": 1}, item, True, "x")
        w.refresh(failed.value)
    [box] = _dialogs(w)
    assert box is w.storage_box and box.windowTitle() == "Disk full"
    need = failed.value.storage.need
    assert need and need > 100                       # two JSON lines
    assert str(w.store.path) in box.text() and "bytes more" in box.text() and "Retry saving" in box.text()
    assert "another disk" not in box.text()         # the marks file is the run's: no other folder to choose
    assert "Disk full: 0 marks saved, 2 NOT saved (kept: Retry)" in w.label.text()
    box.close()

    target = tmp_path / "full" / "marks.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), ""))
    import crossview.gui.marks as marks_mod

    def full_export(path, data):
        raise _full(Path(path), len(data))

    monkeypatch.setattr(marks_mod, "atomic_write_bytes", full_export)
    qtbot.mouseClick(w.export_button, Qt.MouseButton.LeftButton)
    [box] = _dialogs(w)
    assert box.windowTitle() == "Disk full" and str(target) in box.text() and "bytes more" in box.text()
    assert "choose a folder on another disk" in box.text() and "export again" in box.text()
    assert "not exported" in w.label.text()
    box.close()
