"""The Inspect panel: metrics beside the paper, histograms, worst queries first, comparing two runs, export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402

from crossview.eval.runs import RunResults, load_run_results  # noqa: E402
from crossview.errors import CrossViewError  # noqa: E402
from crossview.gui.panels.inspect_panel import InspectPanel  # noqa: E402

pytestmark = pytest.mark.gui


def _run(tmp_path: Path, name: str, i2t, t2i, method="cca") -> Path:
    d = tmp_path / name
    d.mkdir()
    def metrics(r):
        r = np.asarray(r)
        return {"R@1": 100 * np.mean(r <= 1), "R@5": 100 * np.mean(r <= 5), "R@10": 100 * np.mean(r <= 10),
                "MedR": float(np.median(r)), "MeanR": float(r.mean())}
    s = {"method": method, "dataset": "toy", "split": "test", "i2t": metrics(i2t), "t2i": metrics(t2i),
         "rsum": 0.0, "train_seconds": 1.5}
    (d / "summary.json").write_text(json.dumps(s))
    np.savez(d / "ranks.npz", i2t=np.asarray(i2t), t2i=np.asarray(t2i))
    return d


def test_load_run_results_and_errors(tmp_path: Path) -> None:
    d = _run(tmp_path, "a", [1, 2, 30], [4, 1, 1, 9, 2, 2])
    r = load_run_results(d)
    assert r.method == "cca" and r.ranks["i2t"].tolist() == [1, 2, 30] and r.name == "a"
    with pytest.raises(CrossViewError, match="no summary.json"):
        load_run_results(tmp_path / "missing")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text("{oops")
    with pytest.raises(CrossViewError, match="not valid JSON"):
        load_run_results(tmp_path / "b")


def test_single_run_worst_queries_first_and_open_query(qtbot, tmp_path: Path) -> None:
    a = load_run_results(_run(tmp_path, "a", [1, 2, 30, 4], [4, 1, 1, 9, 2, 2, 7, 1]))
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.set_run(a)
    assert panel.metrics.columnCount() == 4 and panel.metrics.item(0, 0).text() == "25.00"  # i2t R@1 | paper
    assert panel.queries.rowCount() == 4 and panel.queries.item(0, 1).text() == "30"          # worst first
    with qtbot.waitSignal(panel.open_query) as sig:
        panel.queries.itemActivated.emit(panel.queries.item(0, 0))
    assert sig.args == ["i2t", 2]
    panel.direction_combo.setCurrentIndex(1)
    assert panel.queries.rowCount() == 8 and panel.queries.item(0, 1).text() == "9"


def test_compare_two_runs(qtbot, tmp_path: Path) -> None:
    a = load_run_results(_run(tmp_path, "a", [1, 2, 30, 4, 8], [1, 1]))
    b = load_run_results(_run(tmp_path, "b", [1, 5, 3, 2, 8], [2, 1], method="bitr"))
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.set_runs([a, b])
    panel.set_run(a)
    panel.compare_combo.setCurrentIndex(panel.compare_combo.findData(str(b.path)))
    assert panel.run_b is b and panel.comparison is not None
    assert panel.comparison.delta.tolist() == [0, 3, -27, -2, 0]
    assert "higher for <b>2</b>" in panel.compare_label.text()
    assert panel.queries.columnCount() == 4 and panel.scatter_plot.isVisible()
    # sort by change: B's biggest gain first
    panel.queries.sortItems(3, Qt.SortOrder.AscendingOrder)
    assert panel.queries.item(0, 3).text() == "-27"
    # clicking a scatter point opens that query
    pts = panel.scatter.points()
    with qtbot.waitSignal(panel.open_query) as sig:
        panel._on_point_clicked(panel.scatter, [pts[2]])
    assert sig.args == ["i2t", 2]
    out = panel.export_tables(tmp_path / "t.csv")
    text = out.read_text()
    assert "change (B - A)" in text and "-27" in text
    pngs = panel.export_plots(tmp_path / "plots")
    assert {p.name for p in pngs} == {"i2t.png", "t2i.png", "scatter.png"} and all(p.stat().st_size > 500 for p in pngs)
    panel.close()


def test_runs_on_different_splits_say_so(qtbot, tmp_path: Path) -> None:
    a = load_run_results(_run(tmp_path, "a", [1, 2, 3], [1]))
    b = load_run_results(_run(tmp_path, "b", [1, 2], [1]))
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.set_runs([a, b])
    panel.set_run(a)
    panel.set_compare(b)
    assert "Cannot compare" in panel.compare_label.text() and "different query sets" in panel.compare_label.text()


def test_paper_numbers_from_the_card_sit_beside_the_run(qtbot, tmp_path: Path) -> None:
    a = load_run_results(_run(tmp_path, "a", [1, 2, 30, 4], [4, 1, 1, 9], method="cca"))
    assert a.paper and any("Table 7" in s for s in a.paper_settings())
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.set_run(a)
    label = next(s for s in a.paper_settings() if "Table 7" in s and "Pascal" in s)
    panel.paper_combo.setCurrentIndex(panel.paper_combo.findData(label))
    headers = [panel.metrics.horizontalHeaderItem(j).text() for j in range(panel.metrics.columnCount())]
    assert headers == ["i2t", "i2t  paper", "t2i", "t2i  paper"]
    rows = [panel.metrics.verticalHeaderItem(i).text() for i in range(panel.metrics.rowCount())]
    r50 = rows.index("R@50")
    assert panel.metrics.item(r50, 1).text() == "72.80" and panel.metrics.item(r50, 0).text() == "-"
