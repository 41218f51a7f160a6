"""The Inspect panel: a run's metrics beside the paper's, rank histograms, the worst queries, and
two runs compared query by query (rank change, scatter of rank A vs rank B with clickable points) and by their
paired effect (B - A with its bootstrap interval over the images: :mod:`crossview.eval.paired`).

Laid out for a 1280x800 screen: the metric table (every row visible) and the per-query list (with
thumbnails) on the left, the plots on the right. The paper's numbers come with what the paper measured
on (its dataset and protocol) beside this run's split and gallery size: MedR and MeanR grow with the
gallery, so they are not comparable across galleries of different sizes.

``open_query(direction, dataset_index)`` asks the main window to show that query in the Query panel.
Tables export to CSV (one file per table, both directions, intervals in their own columns), plots to PNG at
300 dpi or SVG with a title, axis labels and a legend (:mod:`crossview.gui.figure_export`). Run alone: ``python -m crossview.gui.panels.inspect_panel RUN [RUN_B]``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QFileDialog, QHBoxLayout, QHeaderView, QLabel,
                               QLineEdit, QMessageBox, QPushButton, QSizePolicy, QSplitter, QTableView, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from crossview.core.errors import CrossViewError
from crossview.core.text import html_text
from crossview.eval.compare import RankComparison, compare_ranks
from crossview.eval.paired import paired_effect
from crossview.eval.hubness import describe_hubness
from crossview.eval.scoring import describe_scored
from crossview.engine.results import RunResults
from crossview.gui.figure_export import (Figure, FigureSeries, ask_plot_path, busy, figure_paths, save_figure,
                                        short_name)
from crossview.gui.storage_dialog import show_storage_error, storage_error_of, storage_title
from crossview.gui.rank_table import QueryRanksModel
from crossview.gui.thumbnails import ThumbnailCache, placeholder

DIRECTION_NAMES = {"i2t": "Image -> Text (i2t)", "t2i": "Text -> Image (t2i)"}
PEN_A = "#0969da"
PEN_B = "#d1242f"
#: Metrics that grow with the gallery size (not comparable between galleries of different sizes).
GALLERY_BOUND = ("MedR", "MeanR")
SORT_TEXT = {Qt.SortOrder.DescendingOrder: " \u25bc largest first",
             Qt.SortOrder.AscendingOrder: " \u25b2 smallest first"}
THUMB = 30


def rank_ticks(max_rank: int) -> list[tuple[float, str]]:
    """Ticks of a log10 rank axis labelled in ranks: 1, 2, 5, 10, 20, 50, ... up to ``max_rank``."""
    ticks = []
    base = 1
    while base <= max(max_rank, 1) * 10:
        for m in (1, 2, 5):
            v = m * base
            if v <= max(max_rank, 1) * 1.5 or v == 1:
                ticks.append((float(np.log10(v)), f"{v:,}"))
        base *= 10
    return ticks


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, np.integer)):
        return f"{int(v)}"
    return f"{float(v):.2f}"


def _interval(summary: dict, direction: str | None, key: str) -> tuple[float, float] | None:
    """The bootstrap interval a run's summary.json holds for ``direction``/``key`` (``rsum`` when
    ``direction`` is None), or None (older runs, other metrics, damaged values)."""
    ci = summary.get("ci")
    if not isinstance(ci, dict):
        return None
    band = ci.get(key) if direction is None else (ci.get(direction) or {}).get(key) \
        if isinstance(ci.get(direction), dict) else None
    if isinstance(band, list) and len(band) == 2 and all(isinstance(x, (int, float)) for x in band):
        return float(band[0]), float(band[1])
    return None


def _interval_tip(summary: dict, band: tuple[float, float]) -> str:
    ci = summary.get("ci") or {}
    level = ci.get("level", 0.95)
    n = ci.get("n", "?")
    return (f"{100 * float(level):.0f}% interval {band[0]:.1f} - {band[1]:.1f} (bootstrap over the {n} evaluated "
            "images): two runs whose values differ by less than this may differ by noise")


def effect_resamples(n_images: int) -> int:
    """Bootstrap resamples of the comparison's paired effect, computed on the GUI thread: 2000 up to 1,000
    images (tens of milliseconds), fewer beyond so that resamples x images stays about 2 million (the label
    says how many)."""
    return 2000 if n_images <= 1000 else max(400, 2_000_000 // max(n_images, 1))


def paired_effect_of(a: RunResults, b: RunResults) -> dict:
    """The paired effect of run ``b`` against run ``a`` (:func:`crossview.eval.paired.paired_effect`, each run
    one seed); the captions are clustered by their image when both runs recorded the map."""
    maps = (a.caption_image, b.caption_image)
    if all(m is not None for m in maps) and not np.array_equal(*maps):
        raise CrossViewError("the two runs map their captions to different images; compare runs evaluated on "
                             "the same split")
    ci = maps[0] if all(m is not None for m in maps) else None
    n = len(a.ranks.get("i2t", ()))
    return paired_effect(a.ranks, b.ranks, ci, resamples=effect_resamples(n))


def effect_label(effect: dict, direction: str) -> str:
    """Two lines at most (HTML) of the paired effect for the Inspect panel: rsum and the direction's R@1 B - A
    with their intervals, the median rank change, queries won / lost / tied, the sign test over images; the rest
    (what was resampled, the minimal detectable differences) is in :func:`effect_tooltip`."""
    def ci(v: float, band: list) -> str:
        return f"{v:+.1f} [{band[0]:+.1f}, {band[1]:+.1f}]"

    r, rs, d = effect[direction], effect["rsum"], direction
    mapped = effect["resampled"].startswith("images (each")
    over = "images" if mapped or d == "i2t" else "captions"
    med = r["median_rank_change"]
    r1 = f"{d} R@1 {ci(r['R@1']['diff'], r['R@1']['ci'])}, " if "R@1" in r else ""
    resamples = "" if effect["resamples"] == 2000 else f", {effect['resamples']} resamples"
    no_map = "" if mapped else ", captions unclustered: no caption map"
    return (f"<b>B - A</b>: rsum <b>{ci(rs['diff'], rs['ci'])}</b> ({100 * effect['level']:.0f}%, bootstrap over "
            f"{effect['n_images']} images{resamples}{no_map}); {r1}median rank change "
            f"{ci(med['value'], med['ci'])}; won/lost/tied {r['won']}/{r['lost']}/{r['tied']}; "
            f"p = {r['p']:.2g} (sign test over {over})")


def effect_tooltip(effect: dict) -> str:
    """What the comparison label's numbers are: the effect's sign, what was resampled, the p-values, the minimal
    detectable differences."""
    mde = effect["mde"]
    return (f"{effect['effect']}. Resampled: {effect['resampled']}. p: {effect['p_method']}. Minimal detectable "
            "difference: " + ", ".join(f"{k} {v:.1f}" for k, v in mde.items() if k != "explanation")
            + f" ({mde['explanation']}).")


class InspectPanel(QWidget):
    open_query = Signal(str, int)     # direction, dataset index of the query (or split position)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run_a: RunResults | None = None
        self.run_b: RunResults | None = None
        self.comparison: RankComparison | None = None
        self.effect: dict | None = None    # the paired effect of run B against run A (both directions)
        self._effect_of: tuple = ()        # (run A, run B) the effect was computed for
        self.runs: dict[str, RunResults] = {}

        self.title = QLabel("No run: train one in the Train panel, or open a run folder.")
        self.title.setObjectName("summary")
        self.title.setWordWrap(True)
        self.compare_combo = QComboBox()
        self.compare_combo.setToolTip("Compare with another run evaluated on the same split")
        self.compare_combo.currentIndexChanged.connect(self._on_compare_choice)
        self.paper_combo = QComboBox()
        self.paper_combo.setToolTip("The paper's reported numbers shown beside this run (from the method's card)")
        self.paper_combo.currentIndexChanged.connect(self._on_paper_choice)
        for combo in (self.compare_combo, self.paper_combo):
            # long run names and paper settings must not widen the panel past a 1280-pixel screen
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(18)
        self.direction_combo = QComboBox()
        for d, label in DIRECTION_NAMES.items():
            self.direction_combo.addItem(label, d)
        self.direction_combo.currentIndexChanged.connect(self._refresh_queries)
        self.export_table_button = QPushButton("Export tables (CSV)...")
        self.export_table_button.setToolTip("The metric table and the per-query table, one CSV file each, both "
                                            "directions; intervals in their own columns")
        self.export_table_button.clicked.connect(self._export_tables_dialog)
        self.export_plot_button = QPushButton("Export plots...")
        self.export_plot_button.setToolTip("The rank histograms (and the rank scatter of a comparison), both "
                                           "directions, with titles and legends: PNG at 300 dpi or SVG, 6.4 x 4 in")
        self.export_plot_button.clicked.connect(self._export_plots_dialog)
        self.export_note = QLabel("")         # what the last export wrote, and where
        self.storage_box: QMessageBox | None = None    # the last storage dialog (a full disk), for tests
        self.export_note.setObjectName("exportNote")
        self.export_note.setWordWrap(True)
        self.export_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.export_note.hide()

        self.metrics = QTableWidget()
        self.metrics.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.metrics.verticalHeader().setDefaultSectionSize(22)
        self.metrics.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.metrics.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.paper_note = QLabel("")
        self.paper_note.setObjectName("paperNote")
        self.paper_note.setWordWrap(True)
        self.paper_note.setStyleSheet("color: #57606a;")
        self.paper_note.hide()
        self.hubness_label = QLabel("")       # do a few items fill every top-k list (crossview.eval.hubness)
        self.hubness_label.setObjectName("hubness")
        self.hubness_label.setWordWrap(True)
        self.hubness_label.hide()
        self.compare_label = QLabel("")
        self.compare_label.setWordWrap(True)

        self.hist_legend = QLabel("")
        self.hist_legend.setObjectName("histLegend")
        self.hist_legend.setTextFormat(Qt.TextFormat.RichText)
        self.hist_plots: dict[str, pg.PlotWidget] = {}
        for d in ("i2t", "t2i"):
            p = pg.PlotWidget(background="w")
            p.setTitle(f"{d}: rank of the ground truth", color="#1f2328", size="10pt")
            p.setLabel("bottom", "rank (bins grow with the rank)")
            p.setLabel("left", "queries")
            p.setMouseEnabled(x=False, y=False)
            p.setMinimumHeight(150)
            self.hist_plots[d] = p

        self.scatter_plot = pg.PlotWidget(background="w")
        self.scatter_plot.setLabel("bottom", "rank in run A (log scale)")
        self.scatter_plot.setLabel("left", "rank in run B (log scale)")
        self.scatter_plot.setMinimumHeight(150)
        self.scatter = pg.ScatterPlotItem(size=7, pen=pg.mkPen(None), brush=pg.mkBrush(9, 105, 218, 120))
        self.scatter.sigClicked.connect(self._on_point_clicked)
        self.diagonal = pg.PlotCurveItem(pen=pg.mkPen("#6e7781", width=1, style=Qt.PenStyle.DashLine))
        self.scatter_plot.addItem(self.diagonal)
        self.scatter_plot.addItem(self.scatter)
        self.scatter_plot.hide()

        self.thumbs = ThumbnailCache(size=THUMB, parent=self)
        self.thumbs.ready.connect(self._thumbnail_ready)
        # a model over numpy columns, not an item per cell: a COCO 5K split has 25,000 caption queries
        self.query_model = QueryRanksModel(self)
        self.queries = QTableView()
        self.queries.setModel(self.query_model)
        self.queries.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.queries.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.queries.verticalHeader().hide()
        self.queries.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.queries.verticalHeader().setDefaultSectionSize(THUMB + 4)
        self.queries.setIconSize(QSize(THUMB, THUMB))
        self.queries.setWordWrap(False)
        self.queries.setSortingEnabled(True)
        self.queries.activated.connect(self._on_query_activated)
        self.query_filter = QLineEdit()
        self.query_filter.setPlaceholderText("Filter queries (text contains)")
        self.query_filter.setClearButtonEnabled(True)
        self.query_filter.setMaximumWidth(220)
        self.query_filter.textChanged.connect(self._on_filter)
        self.queries.setToolTip("Double-click (or Enter) to open the query in the Query panel")
        # Qt's own arrow reads as the opposite of the order in some styles: the header says it in words
        self.queries.horizontalHeader().setSortIndicatorShown(False)
        self.queries.horizontalHeader().sortIndicatorChanged.connect(self._label_sort)
        self._headers: list[str] = []

        bar = QHBoxLayout()
        bar.addWidget(QLabel("Compare with:"))
        bar.addWidget(self.compare_combo, 1)
        bar.addWidget(QLabel("Paper:"))
        bar.addWidget(self.paper_combo, 1)
        bar.addWidget(QLabel("Queries:"))
        bar.addWidget(self.direction_combo)
        bar.addWidget(self.export_table_button)
        bar.addWidget(self.export_plot_button)

        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.metrics)
        ll.addWidget(self.paper_note)
        ll.addWidget(self.compare_label)
        self.queries_label = QLabel("Queries, worst first (double-click one to open it in Query):")
        over = QHBoxLayout()                  # the filter beside the label: the list keeps its rows at 1280x800
        over.addWidget(self.queries_label, 1)
        over.addWidget(self.query_filter)
        ll.addLayout(over)
        ll.addWidget(self.queries, 1)
        plots = QWidget()
        pl = QVBoxLayout(plots)
        pl.setContentsMargins(0, 0, 0, 0)
        pl.addWidget(self.hubness_label)        # beside the metric table: the left column keeps its query rows
        pl.addWidget(self.hist_legend)
        for p in self.hist_plots.values():
            pl.addWidget(p, 1)
        pl.addWidget(self.scatter_plot, 1)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(left)
        self.splitter.addWidget(plots)
        self.splitter.setStretchFactor(0, 3)
        self.splitter.setStretchFactor(1, 2)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addLayout(bar)
        layout.addWidget(self.export_note)
        layout.addWidget(self.splitter, 1)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().resizeEvent(event)
        if not getattr(self, "_split_set", False) and self.width() > 0:
            self._split_set = True              # the first size; the user's dragging wins afterwards
            w = self.width()
            self.splitter.setSizes([int(w * 0.58), w - int(w * 0.58)])

    # ------------------------------------------------------------------ runs
    def set_runs(self, runs: list[RunResults]) -> None:
        """The runs offered for comparison (the current one is skipped in the list)."""
        self.runs = {self._key(r): r for r in runs}
        self._refill_compare()

    @staticmethod
    def _key(r: RunResults) -> str:
        return str(r.path) if r.path is not None else r.name

    def _refill_compare(self) -> None:
        current = self.compare_combo.currentData()
        self.compare_combo.blockSignals(True)
        self.compare_combo.clear()
        self.compare_combo.addItem("(no comparison)", None)
        for key, r in self.runs.items():
            if self.run_a is not None and key == self._key(self.run_a):
                continue
            self.compare_combo.addItem(f"{r.name}  [{r.method}]", key)
        idx = self.compare_combo.findData(current)
        self.compare_combo.setCurrentIndex(max(0, idx))
        self.compare_combo.blockSignals(False)

    def set_run(self, run: RunResults | None) -> None:
        """Show ``run`` (run A)."""
        self.run_a = run
        if run is not None:
            self.runs.setdefault(self._key(run), run)
        self._refill_compare()
        self.set_compare(None if self.run_b is None or run is None else self.run_b)

    def _on_compare_choice(self) -> None:
        key = self.compare_combo.currentData()
        self.set_compare(self.runs.get(key) if key else None)

    def set_compare(self, run_b: RunResults | None) -> None:
        """Compare run A with ``run_b`` (None: no comparison)."""
        self.run_b = run_b
        if run_b is not None:
            idx = self.compare_combo.findData(self._key(run_b))
            if idx >= 0 and idx != self.compare_combo.currentIndex():
                self.compare_combo.blockSignals(True)
                self.compare_combo.setCurrentIndex(idx)
                self.compare_combo.blockSignals(False)
        self._refresh()

    # ------------------------------------------------------------------ drawing
    def _refresh(self) -> None:
        a, b = self.run_a, self.run_b
        if a is None:
            self.title.setText("No run: train one in the Train panel, or open a run folder.")
            self.metrics.clear()
            self.hubness_label.hide()
            self.query_model.clear()
            return
        s = a.summary
        bits = [f"<b>{html_text(a.name)}</b>", f"method {html_text(a.method)}",
                f"dataset {html_text(str(s.get('dataset', '?')))}", f"split {html_text(str(s.get('split', '?')))}"]
        if s.get("selected_on") is not None:     # where choices were made, beside where the numbers are reported
            where = str(s["selected_on"])
            chosen = ("nothing chosen on data" if where == "nothing" else f"chosen on {html_text(where)}")
            bits.append(f"<span style='color:#9a6700'><b>optimistic</b>: {chosen} and reported on the same "
                        "split</span>" if s.get("optimistic") else chosen)
        if isinstance(s.get("scoring"), dict) and s["scoring"].get("scoring", "plain") != "plain":
            # the metrics, ranks and hubness shown are under the run's own scoring; its plain rsum beside
            from crossview.engine.scoring import describe_run_scoring
            plain = s.get("metrics_plain") if isinstance(s.get("metrics_plain"), dict) else {}
            bits.append(html_text(describe_run_scoring(s["scoring"], s["scoring"].get("bank"))
                                  + (f"; plain rsum {float(plain['rsum']):.1f}" if plain.get("rsum") is not None
                                     else "")))
        if s.get("train_seconds") is not None:
            feats = float(s.get("features_seconds") or 0.0)
            # the wait a person had: features first (extraction on first use), then the fit
            # a number and its unit never wrap apart (the title wraps at 1280 px)
            bits.append(f"trained in {float(s['train_seconds']):.1f}&nbsp;s"
                        + (f" after {feats:.0f}&nbsp;s of feature extraction" if feats >= 1.0 else ""))
        self.title.setText(" &nbsp; ".join(bits))
        self.title.setToolTip("; ".join(f"{c.get('what')} chosen on {c.get('on')}" for c in s.get("choices") or [])
                              or "nothing was chosen on data (all settings given)")
        # the run's figure (under its own scoring), then each re-scoring of this split it recorded (crossview eval
        # RUN --scoring)
        scored = [describe_scored(e) for e in (a.scorings or {}).values()]
        self.hubness_label.setText("\n".join(t for t in (describe_hubness(s.get("hubness")), *scored) if t))
        self.hubness_label.setVisible(bool(self.hubness_label.text()))     # older runs have no figure
        self.paper_combo.blockSignals(True)
        self.paper_combo.clear()
        self.paper_combo.addItem("(none)", None)
        for label in a.paper_settings():
            self.paper_combo.addItem(label, label)
        # the paper's headline setting: its modern-feature table on its first dataset, when the card has it
        labels = a.paper_settings()
        pick = next((lab for lab in labels if "CNN" in lab or "Table 7" in lab), labels[0] if labels else None)
        if pick is not None:
            self.paper_combo.setCurrentIndex(self.paper_combo.findData(pick))
        self.paper_combo.blockSignals(False)
        self._fill_metrics()
        self._draw_histograms()
        self._refresh_queries()

    def _on_paper_choice(self) -> None:
        if self.run_a is not None:
            self._fill_metrics()

    def _fill_metrics(self) -> None:
        a, b = self.run_a, self.run_b
        assert a is not None
        rows = a.metric_rows()
        label = self.paper_combo.currentData()
        papers = {d: a.paper_metrics(label, d) for d in ("i2t", "t2i")} if label else {}
        for d in papers:
            rows += [k for k in papers[d] if k not in rows]
        extra = [k for k in ("rsum",) if k in a.summary]
        cols: list[tuple[str, RunResults | dict, str]] = []
        # compared runs are A and B in the headers (a run's name is cut to nothing at 1280 px); the tooltips and
        # the legend above name them in full
        for d in ("i2t", "t2i"):
            cols.append((f"{d}  A" if b else d, a, d))
            if b is not None:
                cols.append((f"{d}  B", b, d))
            if papers.get(d):
                cols.append((f"{d}  paper", papers[d], d))
        self.metrics.clear()
        self.metrics.setColumnCount(len(cols))
        self.metrics.setRowCount(len(rows) + len(extra))
        self.metrics.setHorizontalHeaderLabels([c[0] for c in cols])
        for j, (_, src, d) in enumerate(cols):
            if isinstance(src, RunResults):
                who = ("run A: " if src is a else "run B: ") if b is not None else "run: "
                self.metrics.horizontalHeaderItem(j).setToolTip(f"{who}{src.name} ({src.method}), {d}")
        self.metrics.setVerticalHeaderLabels(rows + extra)
        for j, (_, src, d) in enumerate(cols):
            for i, key in enumerate(rows):
                band = None
                if isinstance(src, RunResults):
                    v = (src.summary.get(d) or {}).get(key)
                    band = _interval(src.summary, d, key)
                else:
                    v = src.get(key)
                item = QTableWidgetItem(_fmt(v) + (f" ± {(band[1] - band[0]) / 2:.1f}" if band else ""))
                if band:
                    item.setToolTip(_interval_tip(src.summary, band))
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.metrics.setItem(i, j, item)
            for i, key in enumerate(extra, start=len(rows)):
                v = src.summary.get(key) if isinstance(src, RunResults) else None
                band = _interval(src.summary, None, key) if isinstance(src, RunResults) else None
                text = _fmt(v) if v is not None else ""
                item = QTableWidgetItem(text + (f" ± {(band[1] - band[0]) / 2:.1f}" if band and text else ""))
                if band:
                    item.setToolTip(_interval_tip(src.summary, band))
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.metrics.setItem(i, j, item)
        self.metrics.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self._fit_metrics_height()
        self._describe_paper(label, cols, rows)

    def _fit_metrics_height(self) -> None:
        """The table is as tall as its rows: every metric visible, no scrolling."""
        t = self.metrics
        h = t.horizontalHeader().height() + 2 * t.frameWidth()
        h += sum(t.rowHeight(i) for i in range(t.rowCount()))
        if t.horizontalScrollBar().isVisible():
            h += t.horizontalScrollBar().height()
        t.setFixedHeight(h)

    def paper_caveat(self, label: str) -> str:
        """What the paper measured on beside what this run measured on (its split and gallery size)."""
        a = self.run_a
        assert a is not None
        entry = next((e for e in a.paper if f"{e.get('table', '')}: {e.get('dataset', '')} - {e.get('setting', '')}"
                      == label), {})
        n_img = int(a.ranks["i2t"].size) if "i2t" in a.ranks else None
        n_cap = int(a.ranks["t2i"].size) if "t2i" in a.ranks else None
        split = str(a.summary.get("split", "?"))
        ours = f"this run: {a.summary.get('dataset', '?')}, {split} split"
        if n_img is not None:
            ours += f", {n_img:,} images"
        if n_cap is not None:
            ours += f" / {n_cap:,} captions"
        paper = f"paper: {entry.get('dataset', '?')}, {entry.get('setting', '')} ({entry.get('table', '')})"
        return (f"{paper}; {ours} - not comparable for {' / '.join(GALLERY_BOUND)} (they grow with the gallery "
                "size), and R@K only roughly (other data, features and protocol)")

    def _describe_paper(self, label: str | None, cols: list, rows: list[str]) -> None:
        if not label:
            self.paper_note.hide()
            self.metrics.setToolTip("")
            return
        caveat = self.paper_caveat(label)
        self.paper_note.setText(caveat[0].upper() + caveat[1:] + ".")
        self.paper_note.show()
        self.metrics.setToolTip(caveat)
        for j, (name, src, _) in enumerate(cols):
            if isinstance(src, RunResults):
                continue
            head = self.metrics.horizontalHeaderItem(j)
            head.setText(name + " *")
            head.setToolTip(caveat)
            for i, key in enumerate(rows):
                cell = self.metrics.item(i, j)
                if cell is not None:
                    cell.setToolTip(caveat)
                    if key in GALLERY_BOUND and cell.text() != "-":
                        cell.setForeground(pg.mkColor("#8c959f"))

    def _compared(self) -> list[tuple[RunResults, str, str]]:
        """``(run, colour, tag)`` of run A and run B (when compared)."""
        return [(r, c, tag) for r, c, tag in ((self.run_a, PEN_A, "A"), (self.run_b, PEN_B, "B")) if r is not None]

    def _hist_bars(self, d: str) -> tuple[list[tuple[RunResults, str, str, np.ndarray, np.ndarray, float]],
                                          list[tuple[float, str]]]:
        """The bars of the ``d`` rank histogram: ``(run, colour, tag, x, counts, width)`` per run, and the bins'
        tick labels (``"1"``, ``"3-5"``...)."""
        bars, labels = [], []
        runs = self._compared()
        for run, colour, tag in runs:
            if d not in run.ranks or not run.ranks[d].size:
                continue
            ranks = run.ranks[d]
            edges = np.unique(np.concatenate([[1, 2, 3, 6, 11, 21, 51, 101, 201, 501, 1001], [ranks.max() + 1]]))
            edges = edges[edges <= max(ranks.max() + 1, 2)]
            counts, _ = np.histogram(ranks, bins=edges)
            offset = (-0.2 if tag == "A" else 0.2) if len(runs) > 1 else 0.0
            bars.append((run, colour, tag, np.arange(len(counts)) + offset, counts, 0.38 if len(runs) > 1 else 0.8))
            this = [(float(i), f"{edges[i]}" if edges[i + 1] - edges[i] == 1 else f"{edges[i]}-{edges[i + 1] - 1}")
                    for i in range(len(counts))]
            labels = this if len(this) > len(labels) else labels
        return bars, labels

    def _draw_histograms(self) -> None:
        entries = self._compared()
        self.hist_legend.setText("Bars: " + " &nbsp; ".join(
            f"<span style='color:{c}'>&#9632;</span> {tag}: {html_text(r.name)} ({html_text(r.method)})"
            for r, c, tag in entries) if entries else "")
        for d, plot in self.hist_plots.items():
            plot.clear()
            bars, labels = self._hist_bars(d)
            for _, colour, _, xs, counts, width in bars:
                plot.addItem(pg.BarGraphItem(x=xs, height=counts, width=width, brush=pg.mkBrush(colour),
                                             pen=pg.mkPen(None)))
            if labels:
                plot.getPlotItem().getAxis("bottom").setTicks([labels])

    def _refresh_queries(self) -> None:
        a, b = self.run_a, self.run_b
        d = self.direction_combo.currentData()
        self.comparison = None
        self.query_filter.blockSignals(True)
        self.query_filter.clear()
        self.query_filter.blockSignals(False)
        self.queries_label.setText("Queries, worst first (double-click one to open it in Query):")
        if a is None or d not in a.ranks:
            self.query_model.clear()
            self.scatter_plot.hide()
            self.compare_label.setText("" if a is None else f"This run has no per-query {d} ranks.")
            return
        ra = a.ranks[d]
        q = a.queries.get(d, np.arange(len(ra)))
        comp = None
        if b is not None and d in b.ranks:
            try:
                comp = compare_ranks(ra, b.ranks[d])
            except Exception as e:  # noqa: BLE001 - shown to the user instead
                self.compare_label.setText(f"<span style='color:#cf222e'>Cannot compare: {html_text(str(e))}</span>")
        self.comparison = comp
        self.compare_label.setToolTip("")
        if comp is None:
            self.effect, self._effect_of = None, ()
        elif not (self._effect_of and self._effect_of[0] is a and self._effect_of[1] is b):
            # both directions at once, so switching the direction does not compute it again
            try:
                self.effect, error = paired_effect_of(a, b), None
            except CrossViewError as e:
                self.effect, error = None, str(e)
            self._effect_of = (a, b, error)
        headers = ["query", "rank A" if comp else "rank"] + (["rank B", "change (B - A)"] if comp else [])
        self._headers = headers
        self.query_model.set_rows(q, ra, comp.rank_b if comp else None, comp.delta if comp else None,
                                  headers=headers, text_of=self._query_text_fn(d), image_of=self._query_image_fn(d),
                                  thumb=self.thumbs.get, placeholder=placeholder(THUMB))
        header = self.queries.horizontalHeader()
        header.setSortIndicatorShown(False)
        header.blockSignals(True)                   # the model is sorted worst first already
        header.setSortIndicator(1, Qt.SortOrder.DescendingOrder)
        header.blockSignals(False)
        self._label_sort(1, Qt.SortOrder.DescendingOrder)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        # widths from the widest header and number, not ResizeToContents (which measures rows)
        fm = self.queries.fontMetrics()
        widest = max(int(np.abs(x).max(initial=0)) for x in ((ra, comp.rank_b, comp.delta) if comp else (ra,)))
        for col in range(1, len(headers)):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.Interactive)
            text = max(headers[col] + max(SORT_TEXT.values(), key=len), f"+{widest:,}", key=len)
            header.resizeSection(col, fm.horizontalAdvance(text) + 16)
        header.setToolTip(f"run A: {a.name}" + (f"; run B: {b.name}" if comp is not None else ""))
        if comp is not None:
            if self.effect is not None:
                e = self.effect
                self.compare_label.setText(effect_label(e, d))
                self.compare_label.setToolTip(effect_tooltip(e))
            else:
                self.compare_label.setText(f"<span style='color:#cf222e'>No paired effect: "
                                           f"{html_text(str(self._effect_of[2]))}</span>")
            self.scatter.setData(x=np.log10(comp.rank_a), y=np.log10(comp.rank_b), data=np.arange(len(ra)))
            top = int(max(comp.rank_a.max(), comp.rank_b.max()))
            self.diagonal.setData(x=[0.0, float(np.log10(top * 1.2))], y=[0.0, float(np.log10(top * 1.2))])
            ticks = rank_ticks(top)
            for axis in ("bottom", "left"):
                self.scatter_plot.getPlotItem().getAxis(axis).setTicks([ticks])
            self.scatter_plot.setLabel("bottom", "rank in run A (log scale)")
            self.scatter_plot.setLabel("left", "rank in run B (log scale)")
            self.scatter_plot.getPlotItem().getAxis("bottom").setToolTip(f"run A: {a.name} ({a.method})")
            self.scatter_plot.getPlotItem().getAxis("left").setToolTip(f"run B: {b.name} ({b.method})")
            self.scatter_plot.setTitle(f"{d}: rank A vs B - dashed diagonal: same rank, below it B is better",
                                       color="#1f2328", size="10pt")
            self.scatter_plot.setToolTip("Each point is a query; click one to open it in the Query panel")
            self.scatter_plot.show()
        else:
            if b is None:
                self.compare_label.setText("")
            self.scatter_plot.hide()

    def _label_sort(self, column: int, order: Qt.SortOrder) -> None:
        """The sorted column's header says the order in words (Qt's arrow is hidden)."""
        self.query_model.set_header_labels([name + (SORT_TEXT[Qt.SortOrder(order)] if j == column else "")
                                            for j, name in enumerate(self._headers)])

    def _on_filter(self, text: str) -> None:
        shown = self.query_model.set_filter(text)
        total = len(self.run_a.ranks.get(self.direction_combo.currentData(), [])) if self.run_a else 0
        self.queries_label.setText("Queries, worst first (double-click one to open it in Query):" if not text.strip()
                                   else f"{shown:,} of {total:,} queries contain {text.strip()!r}:")

    def _dataset_index(self, d: str, q: int) -> int | None:
        """The dataset index of query ``q`` (an image / caption id as ranks.npz records it)."""
        ds = getattr(self, "dataset", None)
        if ds is None:
            return None
        ids = ds.image_ids if d == "i2t" else ds.caption_ids
        n = ds.n_images if d == "i2t" else ds.n_captions
        cache = getattr(self, "_id_maps", {})
        key = (id(ds), d)
        if key not in cache:
            cache[key] = {int(v): i for i, v in enumerate(np.asarray(ids).tolist())}
            self._id_maps = cache
        hit = cache[key].get(int(q))
        return hit if hit is not None else (int(q) if 0 <= int(q) < n else None)

    def _query_image_fn(self, d: str):
        ds = getattr(self, "dataset", None)
        if ds is None or ds.image_paths is None:
            return lambda q: None

        def image_of(q: int) -> str | None:
            i = self._dataset_index(d, q)
            if i is None:
                return None
            img = i if d == "i2t" else int(ds.caption_image[i])
            return str(ds.image_paths[img])
        return image_of

    def _thumbnail_ready(self, path: str) -> None:
        self.query_model.thumbnail_ready(path)

    def _query_text_fn(self, d: str):
        ds = getattr(self, "dataset", None)
        if ds is None:
            return lambda q: f"{'image' if d == 'i2t' else 'caption'} {q}"

        def text_of(q: int) -> str:
            i = self._dataset_index(d, q)
            if i is None:
                return f"{'image' if d == 'i2t' else 'caption'} {q}"
            if d == "t2i":
                return ds.captions[i]
            name = Path(str(ds.image_paths[i])).name if ds.image_paths is not None else f"image {q}"
            caps = ds.captions_of(i)
            return f"{name}: {ds.captions[caps[0]]}" if len(caps) else name
        return text_of

    def set_dataset(self, ds) -> None:
        """Lets the query list show captions instead of bare indices (the run's dataset)."""
        self.dataset = ds
        self._refresh_queries()

    # ------------------------------------------------------------------ interaction
    def _row_query(self, row_position: int) -> tuple[str, int]:
        d = self.direction_combo.currentData()
        a = self.run_a
        assert a is not None
        q = a.queries.get(d)
        return d, int(q[row_position]) if q is not None else int(row_position)

    def _on_query_activated(self, index) -> None:
        self.open_query.emit(*self._row_query(self.query_model.source_row(index.row())))

    def _on_point_clicked(self, _item, points, *_) -> None:
        if not len(points):
            return
        pos = int(points[0].data())
        row = self.query_model.view_row(pos)
        if row is not None:
            self.queries.selectRow(row)
            self.queries.scrollTo(self.query_model.index(row, 0))
        self.open_query.emit(*self._row_query(pos))

    # ------------------------------------------------------------------ export
    def _sources(self) -> list[tuple[str, str, str, str, object]]:
        """The metric table's columns as rows of an export: ``(role, name, method, split, source)``, source a
        :class:`RunResults` or the paper's ``{direction: metrics}``."""
        out: list[tuple[str, str, str, str, object]] = []
        for run, _, tag in self._compared():
            role = tag if self.run_b is not None else "run"
            out.append((role, run.name, run.method, str(run.summary.get("split", "")), run))
        label = self.paper_combo.currentData()
        if label and self.run_a is not None:
            papers = {d: self.run_a.paper_metrics(label, d) for d in ("i2t", "t2i")}
            if any(papers.values()):
                out.append(("paper", label, self.run_a.method, "", papers))
        return out

    def metric_rows(self) -> tuple[list[str], list[list]]:
        """The metric table as a spreadsheet reads it: a header and one row per run (A, B, the paper's numbers)
        and direction (i2t and t2i, whichever is on screen), each metric's value beside its interval's ends in
        columns of their own (``R@1``, ``R@1_low``, ``R@1_high``; empty where there is no interval)."""
        keys: list[str] = []
        for _, _, _, _, src in self._sources():
            for d in ("i2t", "t2i"):
                vals = (src.summary.get(d) or {}) if isinstance(src, RunResults) else src.get(d, {})
                keys += [k for k in vals if k not in keys]
        header = ["run", "role", "method", "split", "direction"]
        for k in keys + ["rsum"]:
            header += [k, f"{k}_low", f"{k}_high"]
        rows: list[list] = []

        def num(v) -> object:
            return "" if not isinstance(v, (int, float, np.integer, np.floating)) else round(float(v), 4)

        for role, name, method, split, src in self._sources():
            for d in ("i2t", "t2i"):
                row: list = [name, role, method, split, d]
                for k in keys + ["rsum"]:
                    if isinstance(src, RunResults):
                        v = src.summary.get("rsum") if k == "rsum" else (src.summary.get(d) or {}).get(k)
                        band = _interval(src.summary, None if k == "rsum" else d, k)
                    else:
                        v, band = (None if k == "rsum" else src.get(d, {}).get(k)), None
                    row += [num(v), *(num(x) for x in (band or ("", "")))]
                rows.append(row)
        return header, rows

    def query_rows(self) -> tuple[list[str], list[list]]:
        """The per-query table of both directions: ``direction, query_id, query, rank_A`` (``rank`` without a
        comparison) and, comparing, ``rank_B, change_B_minus_A``; in the runs' query order."""
        a, b = self.run_a, self.run_b
        comparing = b is not None
        header = ["direction", "query_id", "query"] + (["rank_A", "rank_B", "change_B_minus_A"] if comparing
                                                       else ["rank"])
        rows: list[list] = []
        if a is None:
            return header, rows
        for d in ("i2t", "t2i"):
            if d not in a.ranks:
                continue
            ra = a.ranks[d]
            q = a.queries.get(d, np.arange(len(ra)))
            rb = b.ranks.get(d) if comparing else None
            if rb is not None and len(rb) != len(ra):
                rb = None                      # a different query set: the comparison line says so
            text_of = self._query_text_fn(d)
            for i in range(len(ra)):
                row = [d, int(q[i]), text_of(int(q[i])), int(ra[i])]
                if comparing:
                    row += ["", ""] if rb is None else [int(rb[i]), int(rb[i]) - int(ra[i])]
                rows.append(row)
        return header, rows

    def export_tables(self, chosen: str | Path) -> list[Path]:
        """The metric table and the per-query table, one CSV file each, named after ``chosen`` (``inspect.csv``
        -> ``inspect_metrics.csv``, ``inspect_queries.csv``); both directions, a header row in each."""
        paths = figure_paths(chosen, ["metrics", "queries"], suffixes=(".csv",))
        for path, (header, rows) in zip(paths, (self.metric_rows(), self.query_rows())):
            with open(path, "w", newline="", encoding="utf-8") as f:
                w = csv.writer(f)
                w.writerow(header)
                w.writerows(rows)
        return paths

    def hist_figure(self, d: str) -> Figure:
        """The ``d`` rank histogram as an exportable figure: a legend naming run A and run B."""
        bars, labels = self._hist_bars(d)
        series = [FigureSeries(f"{tag}: {short_name(run.name)} ({run.method})" if self.run_b is not None
                               else f"{short_name(run.name)} ({run.method})", "bars", xs, counts, colour, width=width)
                  for run, colour, tag, xs, counts, width in bars]
        split = str(self.run_a.summary.get("split", "")) if self.run_a is not None else ""
        return Figure(f"{DIRECTION_NAMES[d]}: rank of the ground truth" + (f" ({split} split)" if split else ""),
                      "rank of the ground truth (bins grow with the rank)", "queries", series, x_ticks=labels)

    def scatter_figure(self, d: str) -> Figure | None:
        """The ``d`` rank scatter of a comparison (None without one, or when the query sets differ)."""
        a, b = self.run_a, self.run_b
        if a is None or b is None or d not in a.ranks or d not in b.ranks:
            return None
        try:
            comp = compare_ranks(a.ranks[d], b.ranks[d])
        except Exception:  # noqa: BLE001 - different query sets: the panel says so; nothing to plot
            return None
        top = int(max(comp.rank_a.max(), comp.rank_b.max()))
        edge = float(np.log10(top * 1.2))
        ticks = rank_ticks(top)
        series = [FigureSeries(f"queries ({len(comp.rank_a):,}); below the diagonal B ranks better", "points",
                               np.log10(comp.rank_a), np.log10(comp.rank_b), PEN_A, alpha=110),
                  FigureSeries("same rank in A and B", "line", np.array([0.0, edge]), np.array([0.0, edge]),
                               "#6e7781", dash=Qt.PenStyle.DashLine)]
        return Figure(f"{DIRECTION_NAMES[d]}: rank in B vs rank in A",
                      f"rank in A: {short_name(a.name)} (log scale)", f"rank in B: {short_name(b.name)} (log)",
                      series, x_ticks=ticks, y_ticks=ticks)

    def plot_figures(self) -> dict[str, Figure]:
        """Every plot the panel can export, both directions: ``hist_i2t``, ``hist_t2i`` and, comparing,
        ``scatter_i2t``, ``scatter_t2i``."""
        figs: dict[str, Figure] = {}
        if self.run_a is None:
            return figs
        for d in ("i2t", "t2i"):
            if self._hist_bars(d)[0]:
                figs[f"hist_{d}"] = self.hist_figure(d)
        for d in ("i2t", "t2i"):
            fig = self.scatter_figure(d)
            if fig is not None:
                figs[f"scatter_{d}"] = fig
        return figs

    def export_plots(self, chosen: str | Path) -> list[Path]:
        """Each plot of :meth:`plot_figures` to its own file named after ``chosen`` (``inspect.svg`` ->
        ``inspect_hist_i2t.svg``...; PNG at 300 dpi unless ``chosen`` ends in ``.svg``); returns the paths."""
        figs = self.plot_figures()
        paths = figure_paths(chosen, list(figs))
        for path, fig in zip(paths, figs.values()):
            save_figure(fig, path)
        return paths

    def _say_written(self, what: str, paths: list[Path]) -> None:
        if paths:
            self.export_note.setText(f"Exported {what}: " + ", ".join(p.name for p in paths)
                                     + f" in {paths[0].parent}")
        else:
            self.export_note.setText(f"Nothing to export: no {what} (open a run first)")
        self.export_note.show()

    def _export_tables_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export tables (one CSV file per table; the name is a prefix)",
                                              "inspect.csv", "CSV (*.csv)")
        if path:
            try:
                with busy():
                    paths = self.export_tables(path)
                self._say_written("tables", paths)
            except OSError as e:
                self._export_failed(path, e, "the tables")

    def _export_plots_dialog(self) -> None:
        path = ask_plot_path(self, "Export plots", "inspect.png")
        if path is None:
            return
        try:
            with busy():
                paths = self.export_plots(path)
            self._say_written("plots", paths)
        except (OSError, CrossViewError) as e:
            self._export_failed(path, e, "the plots")

    def _export_failed(self, path: str | Path, e: BaseException, what: str) -> None:
        """Say under the export buttons that ``path`` could not be written; a full disk or an unwritable folder
        (:class:`~crossview.core.errors.StorageError`) also in the storage dialog (the path, the bytes needed,
        what to do)."""
        storage = storage_error_of(e)
        if storage is not None:
            self.export_note.setText(f"{storage_title(storage)}: {what} not exported ({storage.filename})")
            self.storage_box = show_storage_error(self, storage, what, "export again")
        else:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else e
            self.export_note.setText(f"Could not write {path}: {reason}; choose another folder")
        self.export_note.show()


if __name__ == "__main__":  # pragma: no cover - manual preview
    import sys

    from crossview.engine.results import load_run_results
    from crossview.gui.app import NO_DISPLAY, demo_run, ensure_app, exec_app, has_display
    if not has_display():
        print(NO_DISPLAY, file=sys.stderr)
        sys.exit(1)
    dirs = sys.argv[1:] or [demo_run()]
    app = ensure_app()
    panel = InspectPanel()
    runs = [load_run_results(p) for p in dirs]
    panel.set_runs(runs)
    panel.set_run(runs[0])
    if len(runs) > 1:
        panel.set_compare(runs[1])
    panel.resize(1200, 850)
    panel.show()
    sys.exit(exec_app(app))
