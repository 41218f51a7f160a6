"""The runs browser (crossview/gui/runs_browser.py) alone: it lists the run store's runs, opens, renames and
deletes through it, and says through its signals what its owner (the Train panel) acts on."""

from __future__ import annotations

from pathlib import Path

import pytest

import _engine_helpers as H
from crossview.core.events import Finished
from crossview.engine.run import train

pytestmark = pytest.mark.gui


@pytest.fixture()
def runs_root(tmp_path) -> Path:
    ds = H.make_toy_dataset()
    feats = H.toy_features(ds)
    for name in ("a", "b"):
        events = list(train("cca", ds, run_dir=tmp_path / name, features=feats, device="cpu",
                            params={"n_components": 4}))
        assert isinstance(events[-1], Finished)
    return tmp_path


def test_the_browser_alone_lists_opens_renames_and_deletes(qtbot, runs_root, tmp_path):
    from crossview.gui.runs_browser import RunsBrowser

    busy = {runs_root / "b"}
    browser = RunsBrowser(runs_root, is_busy=lambda p: p in busy)
    qtbot.addWidget(browser)
    browser.refresh()
    assert sorted(browser.runs_list.item(i).text().split()[0] for i in range(browser.runs_list.count())) == ["a", "b"]
    browser.select_run(runs_root / "a")
    assert "cca on " in browser.runs_list.currentItem().toolTip() and "rsum" in browser.runs_list.currentItem().toolTip()
    with qtbot.waitSignal(browser.open_run) as opened:
        browser.open_button.click()
    assert opened.args == [str(runs_root / "a")]
    with qtbot.waitSignal(browser.resume_requested) as asked:
        browser.resume_button.click()
    assert asked.args == [str(runs_root / "a")]
    # the owner's run in training is not renamed; the refusal is a signal the owner shows
    browser.select_run(runs_root / "b")
    with qtbot.waitSignal(browser.refused) as refused:
        assert browser.rename_selected("c") is None
    assert refused.args[0] == "Cannot rename run" and "training" in refused.args[1]
    busy.clear()
    with qtbot.waitSignal(browser.runs_changed):
        assert browser.rename_selected("c") == runs_root / "c"
    assert browser.selected() == runs_root / "c"
    with qtbot.waitSignal(browser.runs_changed):
        assert browser.delete_selected(confirm=False)
    assert not (runs_root / "c").exists() and browser.runs_list.count() == 1
    not_a_run = tmp_path / "photos"
    not_a_run.mkdir()
    with qtbot.waitSignal(browser.refused) as refused:
        assert browser.open_run_folder(not_a_run) is None
    assert "not a run folder" in refused.args[1]


def test_the_rename_and_delete_dialogs_show_the_whole_name_and_cancel_does_nothing(qtbot, runs_root, tmp_path):
    """Opened as a user opens them (no name given, confirmation asked) and dismissed: the rename box is wide
    enough for the run's whole name, and neither dialog renames or deletes anything when cancelled. The dialogs
    are caught and saved by the screenshot tool's own helper (``crossview screenshot --dialogs``)."""
    from PIL import Image
    from PySide6.QtWidgets import QApplication, QInputDialog

    from crossview.gui.runs_browser import RunsBrowser
    from crossview.gui.screenshots import _shoot_dialog

    long_name = "cca-flickr8k_sample-20261126-183518"
    (runs_root / "a").rename(runs_root / long_name)
    browser = RunsBrowser(runs_root, is_busy=lambda p: False)
    qtbot.addWidget(browser)
    browser.refresh()
    browser.select_run(runs_root / long_name)
    seen = {}

    def rename() -> None:
        seen["rename"] = browser.rename_selected()

    widths = []
    real_exec = QInputDialog.exec

    def exec_and_measure(dialog):
        widths.append((dialog.width(), dialog.fontMetrics().horizontalAdvance(dialog.textValue())))
        return real_exec(dialog)

    import unittest.mock as mock
    with mock.patch.object(QInputDialog, "exec", exec_and_measure):
        shot = _shoot_dialog(QApplication.instance(), rename, tmp_path / "rename.png")
    assert seen["rename"] is None and (runs_root / long_name).is_dir()
    assert widths and widths[0][0] > widths[0][1] + 40          # the name fits with room to edit
    assert Image.open(shot).size[0] >= widths[0][0] - 2
    _shoot_dialog(QApplication.instance(), lambda: seen.setdefault("delete", browser.delete_selected()),
                  tmp_path / "delete.png")
    assert seen["delete"] is False and (runs_root / long_name).is_dir()


def test_selecting_a_run_outside_the_runs_folder_leaves_the_trials_hidden(qtbot, runs_root, tmp_path):
    """Opening a run kept elsewhere (File > Open run folder) is not a reason to list every search trial; a
    trial inside the runs folder is shown (the box ticks itself)."""
    import shutil

    from crossview.gui.runs_browser import RunsBrowser

    search = runs_root / "tune-cca-x"
    search.mkdir()
    (search / "tune.json").write_text("{}")
    shutil.copytree(runs_root / "b", search / "trial-001")
    browser = RunsBrowser(runs_root, is_busy=lambda p: False)
    qtbot.addWidget(browser)
    browser.refresh()
    assert not browser.show_trials.isChecked()
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere" / "my-run"
    browser.select_run(elsewhere)
    assert not browser.show_trials.isChecked()
    assert "(1 hidden)" in browser.show_trials.text()
    browser.select_run(search / "trial-001")
    assert browser.show_trials.isChecked() and browser.selected() == search / "trial-001"
