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
