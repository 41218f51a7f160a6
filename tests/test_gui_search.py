"""The Train panel's validation search driven with pytest-qt: the Search... dialog (prefilled from the form,
every value checked by the card before anything starts), the trials table filling in as each trial
finishes, the best row highlighted, the trials in the runs list, double-click to open one, Stop and
Continue search."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

import _engine_helpers  # noqa: E402,F401  (registers the "toy_iterative" method)
from _engine_helpers import make_toy_dataset  # noqa: E402
from crossview.engine.scoring import DEFAULT_SCORINGS  # noqa: E402
from crossview.eval.scoring import PARAMS  # noqa: E402
from crossview.gui.panels.train_panel import TrainPanel  # noqa: E402
from _latency import LatencyProbe  # noqa: E402

pytestmark = pytest.mark.gui


@pytest.fixture
def panel(qtbot, tmp_path: Path):
    w = TrainPanel(runs_root=tmp_path / "runs")
    qtbot.addWidget(w)
    w.set_dataset(make_toy_dataset(n_images=120))   # precomputed 16-d image features
    w.text_encoder.setCurrentIndex(w.text_encoder.findData("bow"))
    w.device_combo.setCurrentIndex(w.device_combo.findData("cpu"))
    w.show()
    return w


def _open_dialog(qtbot, panel: TrainPanel):
    panel.search_button.click()
    dialog = panel.search_dialog
    assert dialog is not None
    qtbot.waitUntil(dialog.isVisible, timeout=5000)
    return dialog


def _close_boxes(panel: TrainPanel) -> None:
    for box in panel.findChildren(QMessageBox):
        box.close()


def test_a_search_from_the_panel_fills_the_trials_table_and_the_runs_list(qtbot, panel: TrainPanel) -> None:
    panel.select_method("cca")
    panel.set_param("n_components", 4)
    dialog = _open_dialog(qtbot, panel)
    # prefilled with the form's values and the method's default normalisations (CCA: ssr for images)
    assert dialog.edits["n_components"].text() == "4"
    assert dialog.edits["reg"].text() == str(panel.params()["reg"])
    assert dialog.edits["image_norm"].text() == "ssr" and dialog.edits["text_norm"].text() == "none"
    assert dialog.metric_combo.currentData() == "rsum" and dialog.select_combo.currentData() == "auto"
    dialog.set_values("n_components", "2, 8")
    dialog.set_values("image_norm", "none,l2")
    assert dialog.count_label.text().startswith("4 trial")
    rows_seen: list[int] = []          # the table's size each time a trial's run is announced
    panel.runs_changed.connect(lambda: rows_seen.append(panel.trials_table.rowCount()))
    finished_runs: list[str] = []
    panel.run_finished.connect(finished_runs.append)
    probe = LatencyProbe().start()
    with qtbot.waitSignal(panel.search_finished, timeout=120_000) as sig:
        dialog.start_button.click()
        assert panel.task is not None and panel.search_dialog is None, "the dialog closed and the search runs"
    gap = probe.stop()
    assert gap < 1000, f"the GUI froze for {gap:.0f} ms during the search"
    folder = Path(sig.args[0])
    assert panel.last_error is None
    assert rows_seen[:4] == [1, 2, 3, 4], "the table fills in as each trial finishes"

    table = panel.trials_table
    headers = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    assert headers == ["#", "n_components", "image_norm", "rsum", "i2t R@1", "t2i R@1", "run"]
    assert table.rowCount() == 4
    record = json.loads((folder / "tune.json").read_text())
    # ranked by the method's default scoring, as the form's own runs are, so the refit compares with them
    name, param = DEFAULT_SCORINGS["cca"]
    assert (record["scoring"]["scoring"], record["scoring"]["param"]) == (name, param) and record["scoring"]["default"]
    assert f"ranked by rsum, scored with {name} {PARAMS[name]}={param:g} (method default)" in panel.search_info.text()
    by_trial = {r["trial"]: r for r in record["results"]}
    for row in range(4):
        r = by_trial[int(table.item(row, 0).text())]
        assert table.item(row, 1).text() == str(r["point"]["n_components"])
        assert table.item(row, 2).text() == r["point"]["image_norm"]
        assert float(table.item(row, 3).text()) == pytest.approx(r["rsum"], abs=0.051)
        assert float(table.item(row, 4).text()) == pytest.approx(r["i2t"]["R@1"], abs=0.051)
        assert table.item(row, 6).text() == Path(r["run_dir"]).name
        cfg = json.loads((Path(r["run_dir"]) / "config.json").read_text())
        assert (cfg["scoring"]["scoring"], cfg["scoring"]["param"]) == (name, param)
        assert cfg["image_norm"] == r["point"]["image_norm"]
        assert cfg["params"]["n_components"] == r["point"]["n_components"]
    # the best row (highest rsum on val) is highlighted, and only it
    best = panel.best_trial_row()
    assert best is not None and table.item(best, 0).text() == str(record["best"]["trial"])
    rsums = [float(table.item(r, 3).text()) for r in range(4)]
    assert rsums[best] == max(rsums)
    for row in range(4):
        assert table.item(row, 3).font().bold() == (row == best)
    assert table.item(best, 0).background().color().name() == "#dafbe1"
    assert panel.progress.value() == 1000 and "Search done" in panel.eta_label.text()
    assert "Search finished" in panel.eta_label.toolTip()
    assert (folder / "best" / "summary.json").is_file() and "refit" in panel.search_info.text()
    assert finished_runs == [str(folder / "best")], "the app loads the refit of the best point"
    # the runs list shows the search by its refit; its trials when asked
    texts = [panel.runs_list.item(i).text() for i in range(panel.runs_list.count())]
    assert not any(t.startswith("trial-") for t in texts), texts
    assert any(t.startswith(f"{folder.name} / best   [finished, rsum ") for t in texts), texts
    assert "(4 hidden)" in panel.runs.show_trials.text()
    panel.runs.show_trials.setChecked(True)
    # the trials (and the refit) are in the runs list
    listed = [Path(panel.runs_list.item(i).data(Qt.ItemDataRole.UserRole)) for i in range(panel.runs_list.count())]
    assert {p.name for p in listed if p.parent == folder} == {"trial-001", "trial-002", "trial-003", "trial-004",
                                                              "best"}
    texts = [panel.runs_list.item(i).text() for i in range(panel.runs_list.count())]
    trial = [t for t in texts if t.startswith("trial-001   [finished, rsum ")]
    assert len(trial) == 1 and trial[0].endswith(f"]   in {folder.name}"), ("a finished trial shows its score and "
                                                                               "the search it belongs to", texts)
    # double-click a trial row: its run opens
    index = table.model().index(2, 1)
    pos = table.visualRect(index).center()
    with qtbot.waitSignal(panel.open_run, timeout=5000) as opened:
        qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=pos)    # a real double-click's press
        qtbot.mouseDClick(table.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert opened.args == [by_trial[int(table.item(2, 0).text())]["run_dir"]]


@pytest.mark.parametrize("name, values, needle", [
    ("reg", "1, -1", "below the minimum"),
    ("n_components", "4, many", "n_components"),
    ("image_norm", "none, cube", "'cube' is not one of"),
    ("n_components", "", "give at least one value"),
])
def test_a_bad_value_is_refused_in_the_dialog_before_anything_starts(qtbot, panel: TrainPanel, name, values,
                                                                      needle) -> None:
    panel.select_method("cca")
    dialog = _open_dialog(qtbot, panel)
    dialog.set_values("reg", "0.1, 1")
    dialog.set_values(name, values)
    dialog.start_button.click()
    assert dialog.isVisible(), "the dialog stays open with the reason"
    assert needle in dialog.last_error and dialog.error_label.isVisible()
    assert dialog.error_label.text() == dialog.last_error and "\n" not in dialog.last_error
    assert panel.task is None and not (panel.runs_root).exists()
    dialog.reject()


def test_nothing_to_search_is_refused(qtbot, panel: TrainPanel) -> None:
    panel.select_method("cca")
    dialog = _open_dialog(qtbot, panel)
    dialog.start_button.click()          # every line holds its single current value
    assert dialog.isVisible() and "nothing to search" in dialog.last_error
    dialog.set_values("reg", "0.1, x")    # another problem replaces the shown one at once
    assert "reg" in dialog.error_label.text() and dialog.error_label.isVisible()
    dialog.set_values("reg", "0.1, 1")    # fixed: the red line goes, before Start is pressed again
    assert not dialog.error_label.isVisible() and dialog.last_error is None
    dialog.reject()
    assert panel.task is None


def test_an_existing_run_folder_is_never_taken_over_by_a_search(qtbot, panel: TrainPanel) -> None:
    panel.select_method("cca")
    panel.set_param("n_components", 4)
    panel.run_name.setText("mine")
    with qtbot.waitSignal(panel.run_finished, timeout=120_000):
        panel.start()
    before = sorted(p.name for p in (panel.runs_root / "mine").iterdir())
    training = panel.task
    dialog = _open_dialog(qtbot, panel)
    dialog.set_values("n_components", "2,4")
    dialog.name_edit.setText("mine")
    dialog.start_button.click()
    assert panel.task is training and panel.search_folder is None, "no search started"
    assert "is not a search folder" in panel.last_error
    assert sorted(p.name for p in (panel.runs_root / "mine").iterdir()) == before
    _close_boxes(panel)


def test_a_split_the_engine_refuses_is_reported_before_any_trial(qtbot, panel: TrainPanel) -> None:
    """The engine's own checks (here: scoring the trials on a split the dataset lacks) run, and refuse, before
    a task starts or a trial folder is made."""
    ds = make_toy_dataset(n_images=120)
    ds.splits.pop("val")
    panel.set_dataset(ds)
    panel.select_method("cca")
    dialog = _open_dialog(qtbot, panel)
    combo = dialog.select_combo
    assert [combo.itemData(i) for i in range(combo.count())] == ["auto", "cv3", "cv5", "holdout", "test"]
    dialog.set_values("n_components", "2,4")
    combo.addItem("val", "val")       # a split the dataset lacks (as from a stale form)
    combo.setCurrentIndex(combo.count() - 1)
    dialog.start_button.click()
    assert panel.task is None and "has no split 'val'" in dialog.last_error and dialog.isVisible()
    assert not any(panel.runs_root.glob("tune-*/trial-*"))
    # past the dialog, the engine refuses it too, before any task starts
    from crossview.gui.search_dialog import SearchSpec
    panel.start_search(SearchSpec(grid={"n_components": [2, 4]}, select_on="val"))
    assert panel.task is None and "has no split 'val'" in panel.last_error
    assert not any(panel.runs_root.glob("tune-*/trial-*"))
    dialog.reject()
    _close_boxes(panel)


@pytest.mark.slow
def test_stop_then_continue_search(qtbot, panel: TrainPanel) -> None:
    panel.select_method("toy_iterative")
    dialog = _open_dialog(qtbot, panel)
    dialog.set_values("epochs", "100, 3")
    dialog.start_button.click()
    task = panel.task
    assert task is not None
    qtbot.waitUntil(lambda: 0 < panel.progress.value() < 1000 and "trial 1/2" in panel.eta_label.text(),
                    timeout=60_000)
    assert "ETA" in panel.eta_label.text() or panel.progress.value() <= 20
    assert not panel.continue_search_button.isEnabled() and not panel.search_button.isEnabled()
    panel.toggle_pause()          # hold the search in its first trial while the runs list is used
    panel.refresh_runs()          # tune.json is written at the start: the running trial is listed
    panel.select_run(panel.search_folder / "trial-001")
    assert not panel.delete_selected(confirm=False) and "running search" in panel.last_error
    assert (panel.search_folder / "trial-001" / "config.json").is_file()
    _close_boxes(panel)
    with qtbot.waitSignal(task.finished, timeout=30_000):
        panel.stop()
    panel.runs_list.setCurrentRow(-1)
    assert "Search stopped" in panel.eta_label.text()
    assert panel.trials_table.rowCount() == 0 and panel.continue_search_button.isEnabled()
    folder = panel.search_folder
    with qtbot.waitSignal(panel.search_finished, timeout=120_000) as sig:
        assert panel.continue_search_button.isEnabled()
        panel.continue_search_button.click()
    assert Path(sig.args[0]) == folder and panel.trials_table.rowCount() == 2
    record = json.loads((folder / "tune.json").read_text())
    assert [r["trial"] for r in record["results"]] == [1, 2]
    status = json.loads((folder / "trial-001" / "status.json").read_text())
    assert status["status"] == "finished"


def test_continue_a_search_selected_in_the_runs_list(qtbot, panel: TrainPanel) -> None:
    """A search interrupted elsewhere (here: the engine's generator closed after its first trial) is continued
    from the panel by selecting one of its trials: the finished trial is read back, not retrained."""
    from crossview.core.events import Log
    from crossview.engine.tune import tune

    folder = panel.runs_root / "tune-elsewhere"
    gen = tune("cca", panel.dataset, {"n_components": [2, 4]}, out=folder, text_encoder="bow")
    for ev in gen:
        if isinstance(ev, Log) and ev.message.startswith("trial 1/2"):
            break
    gen.close()
    first = (folder / "trial-001" / "summary.json").stat().st_mtime_ns
    panel.refresh_runs()
    assert not panel.continue_search_button.isEnabled()
    panel.select_run(folder / "trial-001")
    assert panel.continue_search_button.isEnabled()
    with qtbot.waitSignal(panel.search_finished, timeout=120_000) as sig:
        panel.continue_search_button.click()
    assert Path(sig.args[0]) == folder and panel.trials_table.rowCount() == 2
    assert (folder / "trial-001" / "summary.json").stat().st_mtime_ns == first
    assert (folder / "best" / "summary.json").is_file() and panel.best_trial_row() is not None
    # continued under its own (plain) scoring, not the method default a new search from the panel would take
    assert json.loads((folder / "best" / "config.json").read_text())["scoring"]["scoring"] == "plain"
    assert "scored with plain" in panel.search_info.text()


def test_the_dialog_says_where_it_chooses_and_refuses_the_reported_split_without_the_box(qtbot,
                                                                                         panel: TrainPanel) -> None:
    """On a dataset without a test split (val is where results are reported) the search chooses by
    cross-validation of train and says so; choosing on val needs the optimistic box, and is then marked."""
    ds = make_toy_dataset(n_images=120)
    ds.splits.pop("test")
    panel.set_dataset(ds)
    panel.select_method("cca")
    dialog = _open_dialog(qtbot, panel)
    assert "3-fold cross-validation of the 72 train images" in dialog.selection_label.text()
    assert "reported once on val" in dialog.selection_label.text()
    dialog.set_values("n_components", "2,8")
    dialog.select_combo.setCurrentIndex(dialog.select_combo.findData("val"))
    assert "--optimistic" in dialog.selection_label.text() and "cf222e" in dialog.selection_label.text()
    dialog.start_button.click()
    assert panel.task is None and dialog.isVisible() and "--optimistic" in dialog.last_error
    dialog.optimistic_check.setChecked(True)
    assert "optimistic: chosen and reported on the same split" in dialog.selection_label.text()
    dialog.select_combo.setCurrentIndex(dialog.select_combo.findData("auto"))
    with qtbot.waitSignal(panel.search_finished, timeout=120_000) as sig:
        dialog.start_button.click()
    folder = Path(sig.args[0])
    record = json.loads((folder / "tune.json").read_text())
    assert record["selected_on"] == "train-cv3" and record["reported_on"] == "val"
    assert "chosen on train-cv3" in panel.eta_label.text() and "on val" in panel.eta_label.text()
    assert "reported once on val" in panel.search_info.text()
    assert panel.trials_table.rowCount() == 2 and (folder / "trial-002-f3" / "summary.json").is_file()
    t = panel.trials_table
    headers = [t.horizontalHeaderItem(c).text() for c in range(t.columnCount())]
    assert headers == ["#", "n_components", "rsum (3-fold mean)", "± sd", "i2t R@1", "t2i R@1", "run"]
    by_trial = {r["trial"]: r for r in record["results"]}
    for row in range(2):
        trial = by_trial[int(t.item(row, 0).text())]
        assert t.item(row, 3).text() == f"{trial['sd']:.1f}" and t.item(row, 6).text().endswith("-f1")
    _close_boxes(panel)


def test_seeds_in_the_dialog_train_each_trial_and_the_refit_per_seed_and_continue_with_them(qtbot,
                                                                                           panel: TrainPanel) -> None:
    """The dialog's Seeds field: a bad list is refused there; 0,1 trains every trial and the refit at both seeds
    (trial-NNN-sS, best-sS), the app loads the first seed's refit, and a search continued from the runs list keeps
    its seeds."""
    panel.select_method("cca")
    dialog = _open_dialog(qtbot, panel)
    dialog.set_values("n_components", "2, 8")
    dialog.seeds_edit.setText("0, x")
    dialog.start_button.click()
    assert dialog.isVisible() and "'x' is not a whole number" in dialog.last_error
    dialog.seeds_edit.setText("0,1")
    assert not dialog.error_label.isVisible() and dialog.count_label.text() == "2 trial(s), each at 2 seeds"
    finished_runs: list[str] = []
    panel.run_finished.connect(finished_runs.append)
    with qtbot.waitSignal(panel.search_finished, timeout=120_000) as sig:
        dialog.start_button.click()
    folder = Path(sig.args[0])
    names = {p.name for p in folder.iterdir() if p.is_dir()}
    assert names == {"trial-001-s0", "trial-001-s1", "trial-002-s0", "trial-002-s1", "best-s0", "best-s1"}
    assert json.loads((folder / "tune.json").read_text())["seeds"] == [0, 1]
    assert finished_runs == [str(folder / "best-s0")] and "mean of seeds 0, 1" in panel.search_info.text()
    # continued from the runs list (everything finished: read back), with the recorded seeds
    stamp = (folder / "trial-002-s1" / "summary.json").stat().st_mtime_ns
    panel.refresh_runs()
    panel.select_run(folder / "trial-001-s0")
    with qtbot.waitSignal(panel.search_finished, timeout=120_000):
        panel.continue_search_button.click()
    assert panel.last_error is None
    assert (folder / "trial-002-s1" / "summary.json").stat().st_mtime_ns == stamp


def test_no_method_s_form_or_search_dialog_draws_widgets_over_each_other(qtbot, panel: TrainPanel) -> None:
    """At 1280 x 800, every method's Train form and its Search dialog: no two laid-out widgets overlap (a too-tall
    minimum for the dialog's parameter list once drew 'Rank by' and 'Choose on' over its last rows, for the
    methods with many parameters)."""
    from PySide6.QtWidgets import QScrollArea

    from _layout_overlap import overlapping_widgets
    from crossview.methods import list_methods

    panel.resize(1280, 770)
    for method in list_methods():
        panel.select_method(method)
        qtbot.wait(50)                      # the form's rows laid out
        assert overlapping_widgets(panel) == [], method
        dialog = _open_dialog(qtbot, panel)
        scroll = dialog.findChild(QScrollArea)
        qtbot.waitUntil(lambda: scroll.geometry().height() > 0, timeout=5000)
        assert overlapping_widgets(dialog) == [], method
        assert dialog.start_button.mapTo(dialog, dialog.start_button.rect().bottomLeft()).y() <= dialog.height()
        dialog.reject()
