"""The search view (crossview/gui/search_view.py) alone, with no Train panel around it, on a small demo: it runs a
validation search in its own EventTask, fills its trials table as trials finish (the best highlighted), and says
through its signals what an owner shows (the bar and line, log lines, the refit to load, the trials' runs);
a bad input is refused before anything runs; a stopped search continues; a busy owner blocks it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402

from crossview.core.events import Log  # noqa: E402
from crossview.gui.search_dialog import SearchSpec  # noqa: E402
from crossview.gui.search_view import SearchChoices, SearchView, card_fields  # noqa: E402

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def tiny_demo():
    """The built-in demo at 100 scenes (84 train / 8 val / 8 test): its features are extracted once per session."""
    from crossview.data.demo import load_demo
    return load_demo(n_scenes=100)


def _choices(method: str = "cca", **kw) -> SearchChoices:
    return SearchChoices(method, card_fields(method), text_encoder="bow", device="cpu", **kw)


@pytest.fixture
def view(qtbot, tmp_path: Path, tiny_demo):
    busy = {"owner": False}
    v = SearchView(tmp_path / "runs", _choices, is_busy=lambda: busy["owner"])
    v.owner_busy = busy                     # the test's switch for the owner's other work
    qtbot.addWidget(v)
    v.set_dataset(tiny_demo)
    v.show()
    return v


def test_a_search_alone_fills_its_table_and_says_everything_through_signals(qtbot, view: SearchView) -> None:
    started, statuses, lines, events, refits, trial_runs = [], [], [], [], [], []
    view.started.connect(lambda task, folder, title: started.append((task, folder, title)))
    view.status.connect(lambda value, text, tip: statuses.append((value, text, tip)))
    view.message.connect(lines.append)
    view.run_event.connect(events.append)
    view.run_finished.connect(refits.append)
    view.runs_changed.connect(lambda: trial_runs.append(view.trials_table.rowCount()))
    with qtbot.waitSignal(view.search_finished, timeout=180_000) as sig:
        task = view.start_search(SearchSpec(grid={"n_components": [2, 4]}, select_on="val", name="grid"))
        assert task is not None and view.is_running() and not view.continue_search_button.isEnabled()
    folder = Path(sig.args[0])
    assert folder == view.runs_root / "grid" == view.search_folder
    assert len(started) == 1 and started[0][0] is task and Path(started[0][1]) == folder
    assert started[0][2].startswith("Searching cca on demo (2 trials, ranked by rsum")
    assert trial_runs == [1, 2], "a signal as each trial's run folder appears, the row already in the table"
    assert any(isinstance(ev, Log) for ev in events), "the trials' own events go to the owner"
    # the bar over the whole search ends full, on the summary line with the full text as its tooltip
    assert statuses[-1][0] == 1000
    assert statuses[-1][1].startswith("Search done: trial ") and statuses[-1][2].startswith("Search finished in ")
    assert any(t.startswith("trial 1/2") for _, t, _ in statuses)
    assert lines and lines[-1].startswith("Search finished in ") and "n_components=" in lines[-1]
    assert refits == [str(folder / "best")] and view.last_error is None

    record = json.loads((folder / "tune.json").read_text())
    table = view.trials_table
    headers = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    assert headers == ["#", "n_components", "rsum", "i2t R@1", "t2i R@1", "run"]
    assert table.rowCount() == 2
    best = view.best_trial_row()
    assert best is not None and table.item(best, 0).text() == str(record["best"]["trial"]) == str(view.search_best)
    for row in range(2):
        assert table.item(row, 2).font().bold() == (row == best)
    assert table.item(best, 0).background().color().name() == "#dafbe1"
    assert view.search_result is not None and "refit" in view.search_info.text()
    assert view.search_to_continue() is None, "a finished search has nothing to continue"
    # double-click a trial: its run is asked for
    pos = table.visualRect(table.model().index(1, 1)).center()
    with qtbot.waitSignal(view.open_run, timeout=5000) as opened:
        qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=pos)
        qtbot.mouseDClick(table.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert opened.args == [table.item(1, 0).data(Qt.ItemDataRole.UserRole)]


def test_bad_input_is_refused_before_anything_runs(qtbot, view: SearchView) -> None:
    with qtbot.waitSignal(view.failed) as sig:
        assert view.start_search(SearchSpec(grid={"n_components": [2, 4]}, name="a/b")) is None
    assert sig.args[2] == "Search not started" and "use letters, digits" in sig.args[0]
    with qtbot.waitSignal(view.failed) as sig:      # the engine's own check: a split the dataset lacks
        assert view.start_search(SearchSpec(grid={"n_components": [2, 4]}, select_on="nope")) is None
    assert sig.args[2] == "Search not started" and view.last_error == sig.args[0]
    assert view.task is None and not any(view.runs_root.glob("*/trial-*"))


def test_the_dialog_is_prefilled_from_the_choices_and_a_busy_owner_blocks_it(qtbot, view: SearchView) -> None:
    view.owner_busy["owner"] = True
    assert view.open_search_dialog() is None and view.start_search(SearchSpec(grid={"n_components": [2, 4]})) is None
    view.owner_busy["owner"] = False
    dialog = view.open_search_dialog()
    assert dialog is not None and view.search_dialog is dialog
    qtbot.waitUntil(dialog.isVisible, timeout=5000)
    assert dialog.edits["n_components"].text() == card_fields("cca")["n_components"][1]
    assert dialog.edits["image_norm"].text() == "ssr", "the method's default normalisation, resolved"
    with qtbot.waitSignal(dialog.finished):
        dialog.reject()
    assert view.search_dialog is None


def test_stop_then_continue_alone(qtbot, view: SearchView) -> None:
    with qtbot.waitSignal(view.started) as sig:
        task = view.start_search(SearchSpec(grid={"n_components": [2, 4]}, select_on="val", name="stopped"))
        task.pause()                         # held at its next event; the view's ETA leaves the pause out
    assert sig.args[0] is task and view._eta.paused
    task.resume()
    assert not view._eta.paused
    task.pause()
    statuses: list[str] = []
    view.status.connect(lambda _v, text, _tip: statuses.append(text))
    with qtbot.waitSignal(view.ended, timeout=60_000):
        task.stop()
    assert statuses[-1].startswith("Search stopped") and view.search_result is None
    assert view.search_to_continue() == view.runs_root / "stopped" and view.continue_search_button.isEnabled()
    with qtbot.waitSignal(view.search_finished, timeout=180_000) as done:
        view.continue_search_button.click()
    assert Path(done.args[0]) == view.runs_root / "stopped" and view.trials_table.rowCount() == 2
    record = json.loads((view.runs_root / "stopped" / "tune.json").read_text())
    assert [r["trial"] for r in record["results"]] == [1, 2]


def test_the_view_runs_alone(tmp_path: Path) -> None:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", CROSSVIEW_EXIT_AFTER_MS="1500")
    proc = subprocess.run([sys.executable, "-m", "crossview.gui.search_view", "demo"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Fatal" not in proc.stderr
