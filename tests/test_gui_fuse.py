"""Fuse... in the app's runs list (crossview/gui/runs_browser.py, crossview/gui/fuse_dialog.py): two runs selected,
the dialog fuses them in a background worker with progress, the fused run appears in the list and opens in Query
and Inspect; bad input is one line in the dialog. Real widgets, waits on signals."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QItemSelectionModel, Qt  # noqa: E402

from _engine_helpers import make_toy_dataset, write_toy_precomp  # noqa: E402
from crossview.cli import main  # noqa: E402

pytestmark = pytest.mark.gui


def _train_two(runs_root: Path, tmp_path: Path, other: bool = False) -> list[Path]:
    data = tmp_path / "toy_precomp"
    write_toy_precomp(data, make_toy_dataset(100), (("train", "train"), ("dev", "val"), ("test", "test")))
    out = []
    for name, k, d in (("cca6", 6, data), ("cca3", 3, data)):
        if other and name == "cca3":
            d = tmp_path / "other_precomp"
            write_toy_precomp(d, make_toy_dataset(100, seed=1), (("train", "train"), ("dev", "val"), ("test", "test")))
        assert main(["train", "cca", "--data", str(d), "--run-dir", str(runs_root / name), "--text-encoder", "bow",
                     "--device", "cpu", "--set", f"n_components={k}"]) == 0
        out.append(runs_root / name)
    return out


def _select(browser, runs: list[Path]) -> None:
    lst = browser.runs_list
    lst.clearSelection()
    for row in range(lst.count()):
        if Path(lst.item(row).data(Qt.ItemDataRole.UserRole)) in runs:
            lst.selectionModel().select(lst.model().index(row, 0), QItemSelectionModel.SelectionFlag.Select)


def test_fuse_selected_runs_in_the_app_and_open_the_fused_run(qtbot, window, tmp_path) -> None:
    panel = window.train_panel
    runs = _train_two(panel.runs_root, tmp_path)
    browser = panel.runs
    browser.refresh()
    _select(browser, runs[:1])
    assert not browser.fuse_button.isEnabled()          # one run is not a fusion
    _select(browser, runs)
    assert browser.fuse_button.isEnabled()
    browser.fuse_button.click()
    dlg = browser.fuse_dialog
    assert dlg is not None and dlg.isVisible() and dlg.auto_button.isChecked()
    dlg.name_edit.setText("fused-two")
    progress = []
    dlg.progress.valueChanged.connect(progress.append)
    with qtbot.waitSignal(browser.fused, timeout=60_000) as fused:
        dlg.fuse_button.click()
    fused_dir = panel.runs_root / "fused-two"
    assert fused.args == [str(fused_dir)]
    assert progress and progress[-1] == 100
    assert not dlg.isVisible()
    # listed and selected
    assert browser.selected() == fused_dir
    assert any(browser.runs_list.item(r).text().startswith("fused-two") for r in range(browser.runs_list.count()))
    # opened in Query and Inspect by the app's own open_run
    task = window._run_task
    assert task is not None
    with qtbot.waitSignal(task.finished, timeout=60_000):
        pass
    assert window.run is not None and window.run.run_dir == fused_dir
    assert window.run.method.name == "fused"
    assert window.inspect_panel.run_a is not None and window.inspect_panel.run_a.method == "fused"
    assert window.inspect_panel.run_a.ranks["i2t"].shape == (20,)
    qp = window.query_panel
    assert qp.run_dir == fused_dir and qp.retriever.method.name == "fused"
    assert qp.retriever.query_image(int(qp.retriever.gallery_images[0]), k=3).best_gold_rank is not None
    assert "fused" in window.status_run.text()


def test_the_fuse_dialog_says_bad_input_in_one_line(qtbot, window, tmp_path) -> None:
    panel = window.train_panel
    runs = _train_two(panel.runs_root, tmp_path, other=True)
    browser = panel.runs
    browser.refresh()
    _select(browser, runs)
    dlg = browser.fuse_selected()
    dlg.given_button.setChecked(True)
    dlg.weights_edit.setText("1,-1")
    with qtbot.waitSignal(dlg.failed, timeout=10_000) as failed:
        dlg.fuse_button.click()
    assert "negative" in failed.args[0] and "\n" not in failed.args[0]
    assert dlg.status.text() == failed.args[0]
    dlg.auto_button.setChecked(True)
    with qtbot.waitSignal(dlg.failed, timeout=60_000) as failed:      # the worker's check: other datasets
        dlg.fuse_button.click()
    assert "not on the same dataset" in failed.args[0] and "\n" not in failed.args[0]
    assert dlg.fuse_button.isEnabled()
    dlg.cancel_button.click()
    assert not dlg.isVisible()


@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_the_fuse_button_is_not_cut(qtbot, window, size) -> None:
    from PySide6.QtWidgets import QApplication

    window.resize(*size)
    QApplication.processEvents()
    browser = window.train_panel.runs
    for b in (browser.fuse_button, browser.open_folder_button):
        assert b.width() >= b.fontMetrics().horizontalAdvance(b.text()), f"{b.text()} is cut"
    from _layout_overlap import overlapping_widgets
    for panel in (window.data_panel, window.train_panel, window.query_panel, window.inspect_panel):
        window.tabs.setCurrentWidget(panel)
        QApplication.processEvents()
        assert overlapping_widgets(window) == [], type(panel).__name__
