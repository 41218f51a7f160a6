"""The whole app, as a person uses it: open a demo, train two methods from the Train panel, query both
ways, mark a result and find the mark on disk, compare the two runs in Inspect, present full screen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402

from crossview.data.demo import write_demo  # noqa: E402
from crossview.gui.main_window import MainWindow  # noqa: E402
from crossview.gui.panels.query_panel import GOLD, ItemRole  # noqa: E402

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    return write_demo(out / "demo", n_scenes=400, n_web=0, seed=5)


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSVIEW_HOME", str(tmp_path / "home"))
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    yield win
    win.close()


def _train(qtbot, win: MainWindow, method: str, **params) -> Path:
    tp = win.train_panel
    tp.select_method(method)
    for k, v in params.items():
        tp.set_param(k, v)
    tp.image_encoder.setCurrentIndex(tp.image_encoder.findData("mobilenet_v2"))
    tp.text_encoder.setCurrentIndex(tp.text_encoder.findData("tfidf"))
    tp.device_combo.setCurrentIndex(tp.device_combo.findData("cpu"))
    with qtbot.waitSignal(win.train_panel.run_finished, timeout=300_000) as sig:
        tp.start()
    run_dir = Path(sig.args[0])
    qtbot.waitUntil(lambda: win.run is not None and str(win.run.run_dir) == str(run_dir), timeout=120_000)
    return run_dir


def test_train_query_mark_compare_present(qtbot, window: MainWindow, small_demo: Path) -> None:
    with qtbot.waitSignal(window.open_dataset(str(small_demo)).finished, timeout=60_000):
        pass
    assert window.dataset.n_images == 400

    run_a = _train(qtbot, window, "cca", n_components=32)
    summary = json.loads((run_a / "summary.json").read_text())
    n_test = len(window.dataset.splits["test"])
    assert summary["t2i"]["R@5"] > 2 * 100 * 5 / n_test, summary        # well above chance (5 / n_test)
    assert "cca" in window.status_run.text()

    # query by image from the Data panel: captions ranked, ground truth highlighted
    qp = window.query_panel
    test_image = int(window.dataset.splits["test"][0])
    window.data_panel.select_image(test_image)
    with qtbot.waitSignal(qp.answered, timeout=30_000) as sig:
        window.data_panel.query_button.click()
    ranking = sig.args[0]
    assert window.tabs.currentWidget() is qp and ranking.direction == "i2t"
    assert ranking.best_gold_rank is not None
    # query by sentence
    qp.sentence.clear()
    qtbot.keyClicks(qp.sentence, "a red circle")
    with qtbot.waitSignal(qp.answered, timeout=30_000) as sig:
        qtbot.keyClick(qp.sentence, Qt.Key.Key_Return)
    assert sig.args[0].direction == "t2i" and qp.image_grid.count() > 0
    # click through to an image, mark its first caption relevant, find the mark on disk
    with qtbot.waitSignal(qp.answered, timeout=30_000):
        qp._activate(qp.image_grid.item(0))
    qp.caption_list.setCurrentRow(0)
    qtbot.keyClick(qp.caption_list, Qt.Key.Key_R)
    marks = [json.loads(x) for x in (run_a / "annotations.jsonl").read_text().splitlines()]
    assert marks[-1]["relevant"] is True and marks[-1]["item"] == int(qp.caption_list.item(0).data(ItemRole))

    # a second run - a short BITR - then compare the two in Inspect
    run_b = _train(qtbot, window, "bitr", loss="C", C=100.0, max_iter=60, pca_dim=64, device="cpu")
    assert json.loads((run_b / "summary.json").read_text())["method"] == "bitr"
    ip = window.inspect_panel
    assert ip.run_a is not None and str(ip.run_a.path) == str(run_b)
    ip.compare_combo.setCurrentIndex(ip.compare_combo.findData(str(run_a)))
    assert ip.comparison is not None and ip.queries.columnCount() == 4
    # open the worst query of run B in the Query panel
    with qtbot.waitSignal(qp.answered, timeout=30_000) as sig:
        ip.queries.itemActivated.emit(ip.queries.item(0, 0))
    assert sig.args[0].direction == "i2t"
    worst = max(ip.run_a.ranks["i2t"])
    assert sig.args[0].best_gold_rank == worst

    # presentation mode: only the query box and the results
    window.set_presentation(True)
    assert not window.menuBar().isVisible() and not window.tabs.tabBar().isVisible()
    assert window.tabs.currentWidget() is qp and not qp.mark_bar.isVisible()
    window.set_presentation(False)
    assert window.menuBar().isVisible() and qp.mark_bar.isVisible()


def test_cancel_a_run_from_the_train_panel(qtbot, window: MainWindow, small_demo: Path) -> None:
    with qtbot.waitSignal(window.open_dataset(str(small_demo)).finished, timeout=60_000):
        pass
    tp = window.train_panel
    tp.select_method("wsabie")
    tp.set_param("max_epochs", 500)
    tp.set_param("patience", 500)
    tp.image_encoder.setCurrentIndex(tp.image_encoder.findData("mobilenet_v2"))
    tp.text_encoder.setCurrentIndex(tp.text_encoder.findData("tfidf"))
    tp.start()
    qtbot.waitUntil(lambda: bool(tp.curves.series), timeout=300_000)
    with qtbot.waitSignal(tp.task.finished, timeout=60_000):
        tp.stop()
    status = json.loads((tp.run_dir / "status.json").read_text())
    assert status["status"] == "cancelled"
    assert (tp.run_dir / "checkpoint.pt").is_file()
