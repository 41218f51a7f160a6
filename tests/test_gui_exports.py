"""Exports a person can reuse: plots with a title, axis labels and a legend at a print size (PNG at 300 dpi and
SVG), CSV files with intervals in columns of their own, one file per table and both directions; and training
curves that keep their history and colours across a resume."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QImage  # noqa: E402

from crossview.engine.results import load_run_results  # noqa: E402
from crossview.eval.bootstrap import bootstrap_ci  # noqa: E402
from crossview.gui.panels.inspect_panel import InspectPanel  # noqa: E402

pytestmark = pytest.mark.gui
SVG = "{http://www.w3.org/2000/svg}"


def _run(tmp_path: Path, name: str, i2t, t2i) -> Path:
    """A run folder with its summary (R@K worked out from the ranks, bootstrap intervals) and ranks."""
    i2t, t2i = np.asarray(i2t), np.asarray(t2i)
    d = tmp_path / name
    d.mkdir()

    def metrics(r):
        return {"R@1": 100 * np.mean(r <= 1), "R@5": 100 * np.mean(r <= 5), "R@10": 100 * np.mean(r <= 10),
                "MedR": float(np.median(r)), "MeanR": float(r.mean())}
    s = {"method": "cca", "dataset": "toy", "split": "test", "i2t": metrics(i2t), "t2i": metrics(t2i),
         "train_seconds": 1.0}
    s["rsum"] = sum(s[dd][k] for dd in ("i2t", "t2i") for k in ("R@1", "R@5", "R@10"))
    s["ci"] = bootstrap_ci(i2t, t2i, np.repeat(np.arange(len(i2t)), 2))
    (d / "summary.json").write_text(json.dumps(s))
    np.savez(d / "ranks.npz", i2t=i2t, t2i=t2i)
    return d


@pytest.fixture
def compared(qtbot, tmp_path: Path):
    rng = np.random.default_rng(0)
    a = load_run_results(_run(tmp_path, "cca-reg5", rng.integers(1, 30, 20), rng.integers(1, 30, 40)))
    b = load_run_results(_run(tmp_path, "cca-reg0.1", rng.integers(1, 15, 20), rng.integers(1, 15, 40)))
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.set_runs([a, b])
    panel.set_run(a)
    panel.set_compare(b)
    panel.direction_combo.setCurrentIndex(1)           # t2i on screen: the exports still hold both
    return panel, a, b


def _svg_text(path: Path) -> str:
    root = ET.parse(path).getroot()                    # parses as XML
    assert root.tag == f"{SVG}svg"
    return " ".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))


def test_plots_export_to_png_and_svg_with_title_axes_and_legend(compared, tmp_path: Path) -> None:
    panel, a, b = compared
    (tmp_path / "out").mkdir()
    pngs = panel.export_plots(tmp_path / "out" / "fig.png")
    assert [p.name for p in pngs] == ["fig_hist_i2t.png", "fig_hist_t2i.png", "fig_scatter_i2t.png",
                                      "fig_scatter_t2i.png"]
    for p in pngs:
        img = QImage(str(p))
        # 6.4 x 4 in at 300 dpi, the resolution recorded in the file
        assert (img.width(), img.height()) == (1920, 1200)
        assert round(img.dotsPerMeterX() * 0.0254) == 300
        # the legend row under the plot is drawn: some of run B's red in the histograms' lower part
        if "hist" in p.name:
            rgb = np.frombuffer(img.convertToFormat(QImage.Format.Format_RGB888).constBits(), np.uint8)
            rgb = rgb.reshape(1200, -1)[:, :1920 * 3].reshape(1200, 1920, 3)
            red = (rgb[..., 0] > 180) & (rgb[..., 1] < 80) & (rgb[..., 2] < 80)
            assert red[950:].any() and red[:900].any()
    svgs = panel.export_plots(tmp_path / "out" / "fig.svg")
    assert [p.suffix for p in svgs] == [".svg"] * 4
    root = ET.parse(svgs[0]).getroot()
    assert (root.get("width"), root.get("height"), root.get("viewBox")) == ("6.4in", "4in", "0 0 640 400")
    text = _svg_text(svgs[0])
    assert "i2t" in text and "rank of the ground truth" in text            # the title
    assert "queries" in text and "bins grow with the rank" in text          # the axis labels
    assert "A: cca-reg5 (cca)" in text and "B: cca-reg0.1 (cca)" in text    # the legend names each run
    scatter = _svg_text(svgs[3])
    assert "t2i" in scatter and "same rank in A and B" in scatter and "rank in A: cca-reg5" in scatter


def test_csv_export_one_file_per_table_both_directions_intervals_in_columns(compared, tmp_path: Path) -> None:
    panel, a, b = compared
    metrics, queries = panel.export_tables(tmp_path / "inspect.csv")
    assert (metrics.name, queries.name) == ("inspect_metrics.csv", "inspect_queries.csv")
    with open(metrics, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["role"], r["direction"]) for r in rows] == [("A", "i2t"), ("A", "t2i"), ("B", "i2t"), ("B", "t2i"),
                                                           ("paper", "i2t"), ("paper", "t2i")]
    label = panel.paper_combo.currentData()              # the paper's numbers shown beside the runs (the card's)
    for r in rows[4:]:
        assert r["run"] == label
        for k, v in a.paper_metrics(label, r["direction"]).items():
            assert float(r[k]) == pytest.approx(v)
    for r in rows[:4]:
        run = a if r["role"] == "A" else b
        assert r["run"] == run.name
        d = r["direction"]
        for k in ("R@1", "R@5", "R@10", "MedR", "MeanR"):
            assert float(r[k]) == pytest.approx(run.summary[d][k], abs=1e-4)
        lo, hi = run.summary["ci"][d]["R@1"]
        assert (float(r["R@1_low"]), float(r["R@1_high"])) == pytest.approx((lo, hi), abs=1e-4)
        assert float(r["rsum"]) == pytest.approx(run.summary["rsum"], abs=1e-4)
        assert r["MedR_low"] == "" and r["MedR_high"] == ""                 # no interval: empty, not "-"
        for cell in r.values():
            assert "±" not in cell and "+-" not in cell
    with open(queries, newline="", encoding="utf-8") as f:
        qrows = list(csv.DictReader(f))
    assert list(qrows[0]) == ["direction", "query_id", "query", "rank_A", "rank_B", "change_B_minus_A"]
    for d in ("i2t", "t2i"):
        got = [r for r in qrows if r["direction"] == d]
        assert [int(r["rank_A"]) for r in got] == a.ranks[d].tolist()
        assert [int(r["rank_B"]) for r in got] == b.ranks[d].tolist()
        assert [int(r["change_B_minus_A"]) for r in got] == (b.ranks[d] - a.ranks[d]).tolist()


def _loss(step: int, epoch: int, **terms) -> dict:
    return {"event": "loss", "step": step, "epoch": epoch, "terms": terms}


def test_curves_after_a_resume_show_the_whole_history_in_the_same_colours(qtbot, tmp_path: Path) -> None:
    """The run logged steps 1-10 and checkpointed at step 8; the resumed run logs 9-14 again from there (with its
    terms in another order). The curves hold steps 1-14 once each and every series keeps its colour."""
    from crossview.gui.curves import STYLE_OF_KIND, CurveBoard, series_kind

    run = tmp_path / "run"
    run.mkdir()
    history = [_loss(s, 1 + (s - 1) // 5, loss=10.0 / s, i2t=5.0 / s, t2i=4.0 / s) for s in range(1, 11)]
    history += [{"event": "validation", "epoch": 1, "metrics": {"i2t": {"R@1": 10.0}, "t2i": {"R@1": 8.0},
                                                                 "rsum": 50.0}},
                {"event": "log", "level": "info", "message": "checkpoint"}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(e) for e in history) + "\n")
    board = CurveBoard()
    qtbot.addWidget(board)
    board.reset("vsepp")
    assert board.load_history(run) == 11
    before = {k: board.colour_of(k) for k in ("loss", "i2t", "t2i", "val:i2t R@1", "val:t2i R@1")}
    for s in range(9, 15):                                # the resumed run: another order of terms
        board.add_loss(s, 2 + (s - 1) // 5, {"t2i": 4.0 / s, "i2t": 5.0 / s, "loss": 10.0 / s})
    board.add_validation(2, {"i2t": {"R@1": 12.0}, "t2i": {"R@1": 9.0}, "rsum": 55.0})
    board.flush()
    for term in ("loss", "i2t", "t2i"):
        xs, ys = board.points(term)
        assert xs == [float(s) for s in range(1, 15)]     # nothing lost before, nothing twice after
    assert board.points("loss")[1] == pytest.approx([10.0 / s for s in range(1, 15)])
    assert board.points("val:rsum") == ([], []) and board.points("rsum") == ([1.0, 2.0], [50.0, 55.0])
    assert {k: board.colour_of(k) for k in before} == before
    # colours come from the series' names: a board that sees the terms in another order agrees
    other = CurveBoard()
    qtbot.addWidget(other)
    other.reset("vsepp")
    other.add_loss(1, 1, {"t2i": 1.0, "loss": 2.0, "i2t": 3.0})
    other.flush()
    assert {k: other.colour_of(k) for k in ("loss", "i2t", "t2i")} == {k: before[k] for k in ("loss", "i2t", "t2i")}
    assert len({before["loss"], before["i2t"], before["t2i"]}) == 3
    # the styles: terms solid, validation dashed (i2t) / dotted (t2i), the same in the legend's samples
    assert STYLE_OF_KIND[series_kind("loss")] == Qt.PenStyle.SolidLine
    assert STYLE_OF_KIND[series_kind("val:i2t R@1")] == Qt.PenStyle.DashLine
    assert STYLE_OF_KIND[series_kind("val:t2i R@1")] == Qt.PenStyle.DotLine
    assert board.series["loss"].item.opts["pen"].style() == Qt.PenStyle.SolidLine
    assert board.val_series["t2i R@1"].item.opts["pen"].style() == Qt.PenStyle.DotLine


def test_curves_export_with_a_legend_of_their_series(qtbot, tmp_path: Path) -> None:
    from crossview.gui.curves import CurveBoard

    board = CurveBoard()
    qtbot.addWidget(board)
    board.reset("vsepp")
    for s in range(1, 6):
        board.add_loss(s, 1, {"loss": 1.0 / s, "i2t": 0.5 / s})
    board.add_validation(1, {"i2t": {"R@1": 10.0}, "t2i": {"R@1": 8.0}, "rsum": 50.0})
    board.add_validation(2, {"i2t": {"R@1": 12.0}, "t2i": {"R@1": 9.0}, "rsum": 55.0})
    board.flush()
    board.set_visible("i2t", False)                       # a hidden series stays out of the export
    paths = board.export_plots(tmp_path / "curves.svg")
    assert [p.name for p in paths] == ["curves_loss.svg", "curves_recall.svg", "curves_rsum.svg"]
    loss = _svg_text(paths[0])
    assert "Loss / objective" in loss and "loss" in loss and "i2t" not in loss
    recall = _svg_text(paths[1])
    assert "val i2t R@1" in recall and "val t2i R@1" in recall and "epoch" in recall
    png = board.export_plots(tmp_path / "curves.png")[0]
    assert QImage(str(png)).size().toTuple() == (1920, 1200)


def test_the_export_buttons_write_every_file_and_say_which(compared, qtbot, tmp_path: Path, monkeypatch) -> None:
    """The buttons ask for one name (the dialog's filter picks PNG or SVG when the name has no ending) and the
    panel says which files it wrote, and where."""
    from PySide6.QtWidgets import QFileDialog

    panel, a, b = compared
    answers = iter([(str(tmp_path / "talk"), "SVG (*.svg)"), (str(tmp_path / "tables.csv"), "CSV (*.csv)")])
    asked: list[str] = []

    def fake_dialog(parent, title, name, filters):
        asked.append(filters)
        return next(answers)

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(fake_dialog))
    qtbot.mouseClick(panel.export_plot_button, Qt.MouseButton.LeftButton)
    assert asked[0] == "PNG (*.png);;SVG (*.svg)"
    written = sorted(p.name for p in tmp_path.glob("talk_*"))
    assert written == ["talk_hist_i2t.svg", "talk_hist_t2i.svg", "talk_scatter_i2t.svg", "talk_scatter_t2i.svg"]
    note = panel.export_note.text()
    assert not panel.export_note.isHidden() and all(n in note for n in written) and str(tmp_path) in note
    qtbot.mouseClick(panel.export_table_button, Qt.MouseButton.LeftButton)
    assert (tmp_path / "tables_metrics.csv").is_file() and (tmp_path / "tables_queries.csv").is_file()
    assert "tables_metrics.csv" in panel.export_note.text()


def test_an_export_on_a_full_disk_opens_the_storage_dialog(compared, qtbot, tmp_path: Path, monkeypatch) -> None:
    """A full disk under the chosen file: the storage dialog names the file, the bytes needed and another disk
    (not the plain "could not write" line alone); other write errors stay on the line."""
    import errno

    from PySide6.QtWidgets import QFileDialog

    from crossview.core.errors import storage_error

    panel, a, b = compared
    target = tmp_path / "tables.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *args: (str(target), "CSV (*.csv)")))

    def full(path):
        raise storage_error(OSError(errno.ENOSPC, "No space left on device"), Path(path), 5000)

    monkeypatch.setattr(panel, "export_tables", full)
    qtbot.mouseClick(panel.export_table_button, Qt.MouseButton.LeftButton)
    box = panel.storage_box
    assert box is not None and box.isVisible() and box.windowTitle() == "Disk full"
    assert str(target) in box.text() and "4.9 KiB more" in box.text() and "another disk" in box.text()
    assert panel.export_note.text() == f"Disk full: the tables not exported ({target})"
    box.close()
