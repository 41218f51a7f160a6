"""The Inspect panel: metrics beside the paper, histograms, worst queries first, comparing two runs, export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import QPoint, Qt  # noqa: E402

from crossview.engine.results import RunResults, load_run_results  # noqa: E402
from crossview.core.errors import CrossViewError  # noqa: E402
from crossview.gui.panels.inspect_panel import PEN_A, PEN_B, InspectPanel, rank_ticks  # noqa: E402

pytestmark = pytest.mark.gui


def _cell(panel: InspectPanel, row: int, col: int, role=Qt.ItemDataRole.DisplayRole):
    """What the per-query list shows at ``(row, col)`` (its model's data)."""
    m = panel.query_model
    return m.data(m.index(row, col), role)


def _header(panel: InspectPanel, col: int) -> str:
    return panel.query_model.headerData(col, Qt.Orientation.Horizontal)


def _run(tmp_path: Path, name: str, i2t, t2i, method="cca", split="test", **ranks_extra) -> Path:
    d = tmp_path / name
    d.mkdir()
    def metrics(r):
        r = np.asarray(r)
        return {"R@1": 100 * np.mean(r <= 1), "R@5": 100 * np.mean(r <= 5), "R@10": 100 * np.mean(r <= 10),
                "MedR": float(np.median(r)), "MeanR": float(r.mean())}
    s = {"method": method, "dataset": "toy", "split": split, "i2t": metrics(i2t), "t2i": metrics(t2i),
         "rsum": 0.0, "train_seconds": 1.5}
    (d / "summary.json").write_text(json.dumps(s))
    np.savez(d / "ranks.npz", i2t=np.asarray(i2t), t2i=np.asarray(t2i), **ranks_extra)
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
    assert panel.query_model.rowCount() == 4 and _cell(panel, 0, 1) == "30"          # worst first
    with qtbot.waitSignal(panel.open_query) as sig:
        panel.queries.activated.emit(panel.query_model.index(0, 0))
    assert sig.args == ["i2t", 2]
    panel.direction_combo.setCurrentIndex(1)
    assert panel.query_model.rowCount() == 8 and _cell(panel, 0, 1) == "9"


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
    label = panel.compare_label.text()       # i2t changes 0, +3, -27, -2, 0: won 2, lost 1, tied 2
    assert "B - A" in label and "won/lost/tied 2/1/2;" in label
    assert "captions unclustered: no caption map" in label                   # an older ranks.npz
    assert panel.query_model.columnCount() == 4 and panel.scatter_plot.isVisible()
    # sort by change: B's biggest gain first
    panel.queries.sortByColumn(3, Qt.SortOrder.AscendingOrder)
    assert _cell(panel, 0, 3) == "-27" and _cell(panel, 0, 3, Qt.ItemDataRole.ForegroundRole) is not None
    # clicking a scatter point opens that query
    pts = panel.scatter.points()
    with qtbot.waitSignal(panel.open_query) as sig:
        panel._on_point_clicked(panel.scatter, [pts[2]])
    assert sig.args == ["i2t", 2]
    metrics, per_query = panel.export_tables(tmp_path / "t.csv")
    assert (metrics.name, per_query.name) == ("t_metrics.csv", "t_queries.csv")
    assert "i2t,2,image 2,30,3,-27" in per_query.read_text()
    pngs = panel.export_plots(tmp_path / "plots.png")
    assert {p.name for p in pngs} == {"plots_hist_i2t.png", "plots_hist_t2i.png", "plots_scatter_i2t.png",
                                      "plots_scatter_t2i.png"} and all(p.stat().st_size > 500 for p in pngs)
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
    assert headers == ["i2t", "i2t  paper *", "t2i", "t2i  paper *"]
    rows = [panel.metrics.verticalHeaderItem(i).text() for i in range(panel.metrics.rowCount())]
    r50 = rows.index("R@50")
    assert panel.metrics.item(r50, 1).text() == "72.80" and panel.metrics.item(r50, 0).text() == "-"


def _two_runs(tmp_path: Path, n_images: int = 100, per: int = 5, image_ids=None):
    rng = np.random.default_rng(3)
    extra = {} if image_ids is None else {"image_ids": np.asarray(image_ids),
                                          "caption_ids": np.arange(n_images * per)}
    a = load_run_results(_run(tmp_path, "run_a", rng.integers(1, 60, n_images), rng.integers(1, 60, n_images * per),
                              method="cca", split="val", **extra))
    b = load_run_results(_run(tmp_path, "run_b", rng.integers(1, 60, n_images), rng.integers(1, 60, n_images * per),
                              method="bitr", split="val", **extra))
    return a, b


def test_the_comparison_label_shows_the_paired_effect_with_its_interval(qtbot, tmp_path: Path) -> None:
    from crossview.eval.paired import paired_effect

    rng = np.random.default_rng(8)
    ci = np.repeat(np.arange(100), 5)
    a = load_run_results(_run(tmp_path, "a", rng.integers(1, 40, 100), rng.integers(1, 40, 500), caption_image=ci))
    b = load_run_results(_run(tmp_path, "b", rng.integers(1, 25, 100), rng.integers(1, 25, 500), caption_image=ci))
    assert a.caption_image.tolist() == ci.tolist()
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.set_runs([a, b])
    panel.set_run(a)
    panel.set_compare(b)
    want = paired_effect(a.ranks, b.ranks, ci, resamples=2000)
    label = panel.compare_label.text()
    rs, r1 = want["rsum"], want["i2t"]["R@1"]
    assert f"rsum <b>{rs['diff']:+.1f} [{rs['ci'][0]:+.1f}, {rs['ci'][1]:+.1f}]</b> (95%, bootstrap over 100 images)" \
        in label
    assert f"i2t R@1 {r1['diff']:+.1f} [{r1['ci'][0]:+.1f}, {r1['ci'][1]:+.1f}]" in label
    assert f"p = {want['i2t']['p']:.2g} (sign test over images)" in label
    tip = panel.compare_label.toolTip()
    assert "seeds averaged per query first" in tip
    assert f"Minimal detectable difference: rsum {want['mde']['rsum']:.1f}" in tip
    effect = panel.effect
    panel.direction_combo.setCurrentIndex(1)                                  # t2i: the same effect, not redone
    assert panel.effect is effect
    m = want["t2i"]["median_rank_change"]
    label = panel.compare_label.text()
    assert f"median rank change {m['value']:+.1f} [{m['ci'][0]:+.1f}, {m['ci'][1]:+.1f}]" in label
    assert f"won/lost/tied {want['t2i']['won']}/{want['t2i']['lost']}/{want['t2i']['tied']};" in label


def _visible_rows(table) -> int:
    h = table.viewport().height()
    return sum(1 for r in range(table.model().rowCount())
               if table.rowViewportPosition(r) >= 0 and table.rowViewportPosition(r) + table.rowHeight(r) <= h)


@pytest.mark.parametrize("size", [(1280, 700), (1920, 980)])
def test_readable_at_1280x800_and_1920x1080(qtbot, tmp_path: Path, size) -> None:
    """Issue 9 item 6: at 1280x800 ~6 metric rows and 3 per-query rows were visible."""
    a, b = _two_runs(tmp_path)
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.resize(*size)                       # the panel's share of a 1280x800 / 1920x1080 window
    panel.set_runs([a, b])
    panel.set_run(a)
    panel.set_compare(b)
    label = next(s for s in a.paper_settings() if "Table 7" in s and "Pascal" in s)
    panel.paper_combo.setCurrentIndex(panel.paper_combo.findData(label))
    panel.show()
    qtbot.waitExposed(panel)
    m = panel.metrics
    assert m.rowCount() >= 9 and _visible_rows(m) == m.rowCount()            # every metric row
    assert _visible_rows(panel.queries) >= (8 if size[1] < 800 else 14), _visible_rows(panel.queries)
    for plot in (*panel.hist_plots.values(), panel.scatter_plot):
        assert plot.isVisible() and plot.height() >= 140
    from _layout_overlap import overlapping_widgets
    assert overlapping_widgets(panel) == []
    panel.close()


def test_plots_say_what_they_show(qtbot, tmp_path: Path) -> None:
    """Issue 9 item 6: no legend for the two runs' bars; the scatter labelled in log10 with no diagonal."""
    a, b = _two_runs(tmp_path)
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.set_runs([a, b])
    panel.set_run(a)
    panel.set_compare(b)
    legend = panel.hist_legend.text()
    assert "A: run_a (cca)" in legend and "B: run_b (bitr)" in legend and PEN_A in legend and PEN_B in legend
    axis = panel.scatter_plot.getPlotItem().getAxis("bottom")
    labels = [t[1] for t in axis._tickLevels[0]]
    assert labels[:4] == ["1", "2", "5", "10"] and "0.2" not in labels
    assert "rank in run A (log scale)" in axis.labelText and "run A: run_a (cca)" in axis.toolTip()
    # the metrics' columns say A / B (a run's full name is cut to nothing at 1280 px) and name the runs in tooltips
    heads = [panel.metrics.horizontalHeaderItem(j) for j in range(panel.metrics.columnCount())]
    assert [h.text() for h in heads][:2] == ["i2t  A", "i2t  B"]
    assert "run A: run_a (cca)" in heads[0].toolTip() and "run B: run_b (bitr)" in heads[1].toolTip()
    x, y = panel.diagonal.getData()
    assert list(x) == list(y) and x[0] == 0.0 and 10 ** x[-1] >= max(a.ranks["i2t"].max(), b.ranks["i2t"].max())
    assert "diagonal" in panel.scatter_plot.getPlotItem().titleLabel.text
    assert rank_ticks(1000)[-1] == (3.0, "1,000")


def test_the_sort_order_is_said_in_words_and_matches_the_rows(qtbot, tmp_path: Path) -> None:
    """Issue 9 item 6: the sort arrow said ascending while the rows were descending."""
    a, _ = _two_runs(tmp_path)
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.set_run(a)
    panel.show()
    t = panel.queries
    header = t.horizontalHeader()
    assert not header.isSortIndicatorShown()
    n = panel.query_model.rowCount()
    ranks = [int(_cell(panel, r, 1)) for r in range(n)]
    assert ranks == sorted(ranks, reverse=True) and _header(panel, 1) == "rank \u25bc largest first"
    # a click on the header flips the order, and the words with it
    x = header.sectionViewportPosition(1) + header.sectionSize(1) // 2
    qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(x, header.height() // 2))
    ranks = [int(_cell(panel, r, 1)) for r in range(n)]
    assert ranks == sorted(ranks) and _header(panel, 1) == "rank \u25b2 smallest first"
    assert _header(panel, 0) == "query"
    panel.close()


def test_worst_queries_have_thumbnails(qtbot, tmp_path: Path) -> None:
    """Issue 9 item 6: the worst-query list had no thumbnails."""
    from PIL import Image
    from crossview.data.dataset import PairedDataset
    n = 12
    paths = []
    for i in range(n):
        p = tmp_path / f"photo{i}.png"
        Image.new("RGB", (40, 30), (i * 20, 80, 160)).save(p)
        paths.append(str(p))
    caps = [f"caption {i} {j}" for i in range(n) for j in range(2)]
    ds = PairedDataset(name="toy", captions=caps, caption_image=np.repeat(np.arange(n), 2), image_paths=paths,
                       image_ids=np.arange(100, 100 + n), splits={"val": np.arange(n)})
    run = load_run_results(_run(tmp_path, "a", np.arange(1, n + 1), np.arange(1, 2 * n + 1), split="val",
                                image_ids=np.arange(100, 100 + n), caption_ids=np.arange(2 * n)))
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.set_run(run)
    panel.set_dataset(ds)
    t = panel.queries
    assert _cell(panel, 0, 0) == "photo11.png: caption 11 0"            # worst (rank 12) first, by its file name
    for r in range(n):
        _cell(panel, r, 0, Qt.ItemDataRole.DecorationRole)        # as a view asks: the decode starts
    qtbot.waitUntil(lambda: all(panel.thumbs.get(paths[i]) is not None for i in range(n)), timeout=10_000)
    icons = [_cell(panel, r, 0, Qt.ItemDataRole.DecorationRole) for r in range(n)]
    assert all(i is not None and not i.isNull() for i in icons)
    assert t.iconSize().width() >= 28 and t.rowHeight(0) >= 30
    panel.direction_combo.setCurrentIndex(1)
    icon = _cell(panel, 0, 0, Qt.ItemDataRole.DecorationRole)
    assert _cell(panel, 0, 0) == "caption 11 1" and icon is not None and not icon.isNull()


def test_paper_numbers_come_with_what_they_measured(qtbot, tmp_path: Path) -> None:
    """Issue 9 item 6: the paper's Pascal 10-fold MedR sat beside a 100-image val MedR with no caveat."""
    a, _ = _two_runs(tmp_path)
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.set_run(a)
    panel.show()
    label = next(s for s in a.paper_settings() if "Table 7" in s and "Pascal" in s)
    panel.paper_combo.setCurrentIndex(panel.paper_combo.findData(label))
    note = panel.paper_note
    assert note.isVisible()
    text = note.text()
    assert "Paper: Pascal sentences" in text and "Table 7" in text
    assert "this run: toy, val split, 100 images / 500 captions" in text
    assert "not comparable for MedR / MeanR" in text
    heads = [panel.metrics.horizontalHeaderItem(j).text() for j in range(panel.metrics.columnCount())]
    col = heads.index("i2t  paper *")
    assert "not comparable" in panel.metrics.horizontalHeaderItem(col).toolTip()
    rows = [panel.metrics.verticalHeaderItem(i).text() for i in range(panel.metrics.rowCount())]
    assert "not comparable" in panel.metrics.item(rows.index("MedR"), col).toolTip()
    panel.paper_combo.setCurrentIndex(0)                  # (none)
    assert not note.isVisible()
    panel.close()


def test_metrics_show_their_bootstrap_interval(qtbot, tmp_path: Path) -> None:
    from crossview.eval.bootstrap import bootstrap_ci

    i2t, t2i = np.array([1, 2, 30, 4, 1, 7]), np.array([4, 1, 1, 9, 2, 2, 7, 1, 3, 3, 12, 1])
    d = _run(tmp_path, "a", i2t, t2i)
    summary = json.loads((d / "summary.json").read_text())
    summary["rsum"] = 250.0
    summary["ci"] = bootstrap_ci(i2t, t2i, np.repeat(np.arange(6), 2))
    (d / "summary.json").write_text(json.dumps(summary))
    old = _run(tmp_path, "old", i2t, t2i)           # a run written before intervals existed
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.set_run(load_run_results(d))
    rows = [panel.metrics.verticalHeaderItem(i).text() for i in range(panel.metrics.rowCount())]
    r1, rs = panel.metrics.item(rows.index("R@1"), 0), panel.metrics.item(rows.index("rsum"), 0)
    lo, hi = summary["ci"]["i2t"]["R@1"]
    assert r1.text() == f"{summary['i2t']['R@1']:.2f} ± {(hi - lo) / 2:.1f}"
    assert "95% interval" in r1.toolTip() and "6 evaluated images" in r1.toolTip()
    assert rs.text().startswith("250.00 ± ") and "interval" in rs.toolTip()
    panel.set_run(load_run_results(old))
    assert "±" not in panel.metrics.item(rows.index("R@1"), 0).text()


def test_the_title_says_where_choices_were_made_and_marks_optimistic_runs(qtbot, tmp_path: Path) -> None:
    d = _run(tmp_path, "a", [1, 2, 30, 4], [4, 1, 1, 9, 2, 2, 7, 1], split="val")
    s = json.loads((d / "summary.json").read_text())
    s.update(selected_on="train-cv3", reported_on="val", optimistic=False,
             choices=[{"what": "parameters", "on": "train-cv3", "by": "search"}])
    (d / "summary.json").write_text(json.dumps(s))
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.set_run(load_run_results(d))
    assert "chosen on train-cv3" in panel.title.text() and "optimistic" not in panel.title.text()
    assert "parameters chosen on train-cv3" in panel.title.toolTip()
    s.update(selected_on="val", optimistic=True, train_seconds=20.5, features_seconds=3.0)
    (d / "summary.json").write_text(json.dumps(s))
    panel.set_run(load_run_results(d))
    assert "<b>optimistic</b>: chosen on val and reported on the same split" in panel.title.text()
    # a number and its unit do not wrap apart (the title wraps at 1280 px)
    assert "trained in 20.5&nbsp;s after 3&nbsp;s of feature extraction" in panel.title.text()
    old = _run(tmp_path, "old", [1, 2], [1, 1, 2, 2])          # a run from before selection was recorded
    panel.set_run(load_run_results(old))
    assert "chosen" not in panel.title.text()
