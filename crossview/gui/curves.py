"""Training curves a person reads at a glance: one plot per quantity family (loss / objective values,
gap and violation, counts, fractions, norms, seconds), each with its own axis and unit and a log y-axis
where its values span more than two decades; the two directions of a method whose i2t and t2i models
differ (BITR) as separate series, each counted from its own first iteration; a checkable series list
beside the plots that is both the legend and the toggles; and a sentence in place of a plot a method
cannot have (no loss curve for a closed-form method, no per-epoch validation for one that selects its
parameters another way).

:class:`CurveBoard` only stores and draws; :class:`~crossview.gui.panels.train_panel.TrainPanel` feeds it
``Loss`` / ``Validation`` / ``Phase`` events and calls :meth:`CurveBoard.flush` from its 100 ms timer, so thousands
of events a second cost a list append each and one redraw per frame.
"""

from __future__ import annotations

import html
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import (QGridLayout, QLabel, QListWidget, QListWidgetItem, QPushButton,
                               QSizePolicy, QVBoxLayout, QWidget)

from crossview.core.errors import CrossViewError
from crossview.gui.figure_export import Figure, FigureSeries, ask_plot_path, busy, figure_paths, save_figure

# ten hues far apart (no two reds or greens: TIMAM's L_M and L_I were both red)
CURVE_COLOURS = ["#0969da", "#d1242f", "#1a7f37", "#8250df", "#bf8700", "#1b7c83", "#e16f24", "#bf3989",
                 "#57606a", "#6e4b12"]
#: A term's colour is fixed by its name, never by the order series appear in (a resumed run's first events are
#: not the original run's): the method's own ``loss_terms`` in their order, else these common terms (the terms
#: that share a plot apart), else a hash of the name.
TERM_COLOUR_INDEX = {name: i for names in (
    ("loss", "i2t", "t2i", "primal", "dual", "hinge", "xi", "objective", "mse"),
    ("gap", "violation"),
    ("draws", "constraints", "qp_steps", "iterations"),
    ("violated",), ("norm_w",), ("seconds",),
) for i, name in enumerate(names)}
#: the line style of each kind of series, the same in the plots, the series list and an exported legend
STYLE_OF_KIND = {
    "term": Qt.PenStyle.SolidLine,            # a training term per logged step
    "pass mean": Qt.PenStyle.DashDotLine,     # its mean over a pass through the data
    "t2i solve": Qt.PenStyle.DashLine,        # the t2i model of a method whose directions differ (BITR)
    "val i2t": Qt.PenStyle.DashLine,          # validation, per epoch (with markers)
    "val t2i": Qt.PenStyle.DotLine,
    "val": Qt.PenStyle.DashLine,              # rsum
}
VALIDATION_KEYS = ("R@1", "R@5", "R@10", "mAP")        # mAP: the ranking losses' validation (smoothap)
VAL_COLOURS = {"R@1": "#0969da", "R@5": "#e16f24", "R@10": "#1a7f37", "mAP": "#8250df", "val:rsum": "#bf8700"}
#: text -> image validation: its own colours (and dashed lines), so i2t and t2i R@1 are told apart at a glance
VAL_COLOURS_T2I = {"R@1": "#8250df", "R@5": "#bf3989", "R@10": "#1b7c83", "mAP": "#6e4b12"}
DIRECTIONS = ("i2t", "t2i")
#: values spanning more than this ratio (max / smallest positive) get a log y-axis
LOG_SPAN = 100.0
#: a log axis shows at most this many decades below the largest value (1e-15 round-off would squash the rest)
LOG_DECADES = 6.0
#: at most this many points per curve are handed to pyqtgraph (every k-th point beyond it)
MAX_POINTS = 5000


@dataclass(frozen=True)
class Family:
    """A quantity family: one plot with its own axis and unit."""

    key: str
    title: str
    unit: str


FAMILIES = {f.key: f for f in (
    Family("loss", "Loss / objective", "value"),
    Family("gap", "Gap and violation", "objective units"),
    Family("count", "Counts", "count"),
    Family("fraction", "Fractions", "fraction of rows"),
    Family("accuracy", "Accuracy (0.5: chance)", "fraction right"),
    Family("norm", "Weight norm", "||W||"),
    Family("time", "Time per iteration", "seconds"),
)}
_FAMILY_OF = {
    "loss": "loss", "mse": "loss", "primal": "loss", "dual": "loss", "hinge": "loss", "xi": "loss",
    "objective": "loss",
    "gap": "gap", "violation": "gap",
    "draws": "count", "constraints": "count", "qp_steps": "count", "iterations": "count",
    "violated": "fraction",
    "norm_w": "norm",
    "seconds": "time",
}
#: terms that identify rather than measure (BITR's cross-validation fold number): never plotted
NOT_PLOTTED = {"cv_fold"}


def term_family(term: str) -> str:
    """The family key of a loss term: known names first, then by the name's form (``*_seconds`` -> time,
    ``n_*`` / ``*_steps`` / ``*_count`` -> count, ``*_acc`` / ``*accuracy`` -> accuracy (TIMAM's ``D_acc``),
    ``*frac*`` / ``*rate`` -> fraction, ``*norm*`` -> norm),
    else ``loss``."""
    base = term.lower().strip()
    if base.endswith(" (pass mean)"):
        base = base[: -len(" (pass mean)")]
    base = base.removeprefix("epoch_")
    if base in _FAMILY_OF:
        return _FAMILY_OF[base]
    if base.endswith(("seconds", "_s", "_time", "time")):
        return "time"
    if base.startswith("n_") or base.endswith(("_steps", "_count", "count", "draws")):
        return "count"
    if base.endswith(("_acc", "accuracy")):
        return "accuracy"
    if "frac" in base or base.endswith("rate"):
        return "fraction"
    if "norm" in base:
        return "norm"
    if "gap" in base or "violation" in base:
        return "gap"
    return "loss"


def wants_log(min_positive: float, maximum: float) -> bool:
    """True when positive values from ``min_positive`` to ``maximum`` span more than two decades."""
    return (math.isfinite(min_positive) and math.isfinite(maximum) and min_positive > 0
            and maximum / min_positive > LOG_SPAN)


@dataclass
class Series:
    """One curve's points, with its running extremes (so choosing the y-scale never rescans them)."""

    label: str                    # the toggle it belongs to (a term, e.g. "primal" or "draws (pass mean)")
    direction: str | None         # "i2t" / "t2i" for methods whose directions differ, else None
    family: str
    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)
    min_pos: float = math.inf
    max: float = -math.inf
    item: Any = None

    #: set when a run resumes: the next point may go back over points the resumed run supersedes
    rewind: bool = False

    def add(self, x: float, y: float) -> None:
        if self.rewind:
            self.rewind = False
            if self.xs and self.xs[-1] >= x:          # logged after the checkpoint, then trimmed by the resume
                keep = next((i for i, v in enumerate(self.xs) if v >= x), len(self.xs))
                del self.xs[keep:], self.ys[keep:]
                self.min_pos = min((v for v in self.ys if v > 0), default=math.inf)
                self.max = max(self.ys, default=-math.inf)
        self.xs.append(x)
        self.ys.append(y)
        if y > 0 and y < self.min_pos:
            self.min_pos = y
        if y > self.max:
            self.max = y


def term_colour(label: str, declared: list[str] | tuple[str, ...] = ()) -> str:
    """The colour of a training term (``"L_M"``, ``"loss (pass mean)"``): fixed by its name (a pass mean shares its
    term's colour and differs in line style), so a series keeps its colour across a resume and between runs."""
    base = label.removesuffix(" (pass mean)").removeprefix("epoch_")
    if base in declared:
        return CURVE_COLOURS[list(declared).index(base) % len(CURVE_COLOURS)]
    if base in TERM_COLOUR_INDEX:
        return CURVE_COLOURS[TERM_COLOUR_INDEX[base]]
    return CURVE_COLOURS[zlib.crc32(base.encode("utf-8")) % len(CURVE_COLOURS)]


def series_kind(key: str) -> str:
    """The kind of a series key (a term label, ``"primal [t2i]"``, ``"val:t2i R@1"``): a key of
    :data:`STYLE_OF_KIND`."""
    if key.startswith("val:"):
        rest = key[4:]
        return "val t2i" if rest.startswith("t2i ") else "val i2t" if rest.startswith("i2t ") else "val"
    if key.endswith(" [t2i]") or key == "dir:t2i":
        return "t2i solve"
    if key.removesuffix(" [i2t]").endswith(" (pass mean)"):
        return "pass mean"
    return "term"


def _swatch(colour: str, style: Qt.PenStyle = Qt.PenStyle.SolidLine, marker: bool = False) -> QIcon:
    """A legend sample: a line in the series' colour and style (28 px: room for two dashes), a dot for markers."""
    from PySide6.QtGui import QPainter, QPen
    pm = QPixmap(28, 10)
    pm.fill(QColor(0, 0, 0, 0))
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    pen = QPen(QColor(colour), 2)
    pen.setStyle(style)
    p.setPen(pen)
    p.drawLine(1, 5, 27, 5)
    if marker:
        p.setBrush(QColor(colour))
        p.drawEllipse(11, 2, 6, 6)
    p.end()
    return QIcon(pm)


class CurveBoard(QWidget):
    """The plots of one run: per-family training plots, R@K and rsum validation plots (or a note), and
    the series list (legend + toggles) beside them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.method_name = ""
        self.method_title = ""
        self.directions_differ = False
        self.iterative = True
        self.has_epoch_validation = True
        self.term_help: dict[str, str] = {}     # loss term -> what it is (the method's loss_terms), for tooltips
        self.validation_note_text = ""
        self.no_validation_reason = ""
        self.series: dict[str, Series] = {}
        self.val_series: dict[str, Series] = {}
        self.plots: dict[str, pg.PlotWidget] = {}
        self.final_validation: dict[str, float] = {}
        self.cv_events = 0
        self._first_step: dict[str, int] = {}
        #: (term, direction, pass summary) -> its Series: one dict lookup per value on the hot path
        self._route: dict[tuple[str, str | None, bool], Series] = {}
        self._colours: dict[str, str] = {}
        self._log: dict[str, bool] = {}
        self._labels: dict[tuple[str, str], str] = {}
        self._in_use: list[str] = []
        #: stages of training (``Phase`` events: webly's Stage II ...): (step, epoch, name), drawn as markers
        self.phases: list[tuple[int, int, str]] = []
        self._phase_items: dict[tuple[str, int], Any] = {}
        self._dirty = False
        self._layout_dirty = False

        self.grid_host = QWidget()
        self.grid = QGridLayout(self.grid_host)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setSpacing(4)
        self.loss_note = QLabel()
        self.validation_note = QLabel()
        for note in (self.loss_note, self.validation_note):
            note.setWordWrap(True)
            note.setTextFormat(Qt.TextFormat.RichText)
            note.setAlignment(Qt.AlignmentFlag.AlignCenter)
            note.setStyleSheet("QLabel { color: #57606a; border: 1px dashed #d0d7de; padding: 8px; "
                               "background: #f6f8fa; }")
            note.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            note.setMinimumHeight(60)
        self.series_list = QListWidget()
        self.series_list.setToolTip("The curves drawn: untick one to hide it. Solid: a term per step; dash-dot: "
                                    "its mean over a pass; dashed / dotted with dots: validation i2t / t2i (and "
                                    "dashed: the t2i solve of a method whose directions differ)")
        self.series_list.itemChanged.connect(self._on_toggle)
        self.series_list.setMinimumWidth(130)
        self.series_list.setMaximumWidth(190)
        self.series_list.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        self.series_box = QWidget()
        side = QVBoxLayout(self.series_box)
        side.setContentsMargins(0, 0, 0, 0)
        head = QLabel("<b>Curves</b> (tick to show)")
        side.addWidget(head)
        side.addWidget(self.series_list, 1)
        self.export_button = QPushButton("Export curves...")
        self.export_button.setToolTip("Each plot with a title and a legend: PNG at 300 dpi or SVG, 6.4 x 4 in")
        self.export_button.clicked.connect(self._export_dialog)
        side.addWidget(self.export_button)
        self.export_note = QLabel("")
        self.export_note.setWordWrap(True)
        self.export_note.hide()
        side.addWidget(self.export_note)
        outer = QGridLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.grid_host, 0, 0)
        outer.addWidget(self.series_box, 0, 1)
        outer.setColumnStretch(0, 1)
        # Every plot is made here, once: making a pyqtgraph plot costs 40-120 ms on a busy 2-core machine,
        # too long for the GUI thread while a run streams events. reset() clears and reuses them.
        for f in FAMILIES.values():
            self._make_plot(f.key, f.title, f.unit, "step")
        self._make_plot("recall", "Validation R@K", "%", "epoch")
        self._make_plot("rsum", "Validation rsum", "rsum (sum of six R@K)", "epoch")
        for plot in self.plots.values():
            plot.hide()
        self.reset()

    # ------------------------------------------------------------------ set-up
    def reset(self, method: str | None = None, no_validation_reason: str = "") -> None:
        """Forget every curve; ``method`` (a registry name) says how to read its events and which notes
        to show; ``no_validation_reason`` explains a run that has no validation split."""
        from crossview.methods import method_class

        for key, plot in self.plots.items():
            plot.clear()
            if self._log.get(key):
                plot.setLogMode(x=False, y=False)
        self.series.clear()
        self.val_series.clear()
        self.final_validation = {}
        self.cv_events = 0
        self.phases.clear()
        self._phase_items.clear()      # plot.clear() above removed the markers themselves
        self._first_step.clear()
        self._route.clear()
        self._colours.clear()
        self._log.clear()
        self.series_list.blockSignals(True)
        self.series_list.clear()
        self.series_list.blockSignals(False)
        self.method_name = method or ""
        self.no_validation_reason = no_validation_reason
        cls = None
        if method:
            try:
                cls = method_class(method)
            except Exception:  # noqa: BLE001 - a run of a method no longer registered still draws
                cls = None
        self.method_title = (method or "").upper()
        self.directions_differ = bool(getattr(cls, "directions_differ", False))
        self.iterative = bool(getattr(cls, "iterative", True)) if cls is not None else True
        self.has_epoch_validation = bool(getattr(cls, "has_epoch_validation", True)) if cls is not None else True
        self.term_help = dict(getattr(cls, "loss_terms", {}) or {}) if cls is not None else {}
        self.validation_note_text = str(getattr(cls, "validation_note", "") or "") if cls is not None else ""
        self._dirty = True
        self._layout_dirty = True
        self.flush()

    # ------------------------------------------------------------------ events
    def add_loss(self, step: int, epoch: int, terms: dict[str, Any]) -> None:
        """Store one ``Loss`` event's terms (cheap: appends; the drawing waits for :meth:`flush`)."""
        direction: str | None = None
        x = float(step)
        if self.directions_differ:
            if epoch < 0 or "cv_fold" in terms:          # a cross-validation solve of C (no direction)
                self.cv_events += 1
                self._dirty = True
                return
            direction = DIRECTIONS[epoch] if epoch < len(DIRECTIONS) else f"solve {epoch}"
            first = self._first_step.setdefault(direction, int(step))
            x = float(step - first + 1)
        # A pass summary (WSABIE's "epoch_loss" event) repeats per-step names with pass means: keep
        # them apart from the per-step series of the same name.
        summary = any(k.startswith("epoch_") for k in terms)
        route = self._route
        for term, value in terms.items():
            try:
                y = float(value)
            except (TypeError, ValueError):      # None: the term has no value at this step
                continue
            if y != y or y in (math.inf, -math.inf):           # NaN (not equal to itself) or infinite
                continue
            s = route.get((term, direction, summary))
            if s is None:
                if term in NOT_PLOTTED:
                    continue
                s = route[(term, direction, summary)] = self._new_series(term, direction, summary)
            s.add(x, y)
        self._dirty = True

    def add_phase(self, step: int, epoch: int, name: str) -> None:
        """A stage of training begins (a ``Phase`` event): a labelled vertical marker at ``step`` on the loss
        plots and between epochs ``epoch`` and ``epoch + 1`` on the validation plots."""
        phase = (int(step), int(epoch), str(name))
        if phase not in self.phases:            # a resumed run says again the stage it resumes in
            self.phases.append(phase)
        self._dirty = True

    def phase_markers(self, plot_key: str) -> list[tuple[float, str]]:
        """``(x, label)`` of the markers drawn on a plot (a family key, ``"recall"`` or ``"rsum"``)."""
        return [(float(item.value()), item.label.toPlainText().strip() if item.label is not None else "")
                for (key, _), item in self._phase_items.items() if key == plot_key]

    def _draw_phases(self) -> None:
        if self.directions_differ:                    # iterations of each solve: a step is not one axis
            return
        for plot_key in self._in_use:
            plot = self.plots[plot_key]
            is_val = plot_key in ("recall", "rsum")
            for i, (step, epoch, name) in enumerate(self.phases):
                if (plot_key, i) in self._phase_items:
                    continue
                x = epoch + 0.5 if is_val else step + 0.5
                # the label on the side with room: left of the line when curves lie before it (a stage that
                # begins late, at the right edge), right of it when the plot starts there (Stage II from init_from)
                series = self.val_series.values() if is_val else (v for v in self.series.values()
                                                                  if v.family == plot_key)
                before = any(v.xs and v.xs[0] < x for v in series)
                anchor = (1, 0.5) if before else (0, 0.5)
                line = pg.InfiniteLine(pos=x, angle=90, movable=False,
                                       pen=pg.mkPen("#57606a", width=1, style=Qt.PenStyle.DashLine),
                                       label=name + " " if before else " " + name,
                                       labelOpts={"position": 0.92, "color": "#57606a", "anchors": [anchor, anchor]})
                plot.addItem(line, ignoreBounds=True)
                self._phase_items[(plot_key, i)] = line

    def _new_series(self, term: str, direction: str | None, summary: bool) -> Series:
        label = f"{term.removeprefix('epoch_')} (pass mean)" if summary else term
        key = label if direction is None else f"{label} [{direction}]"
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series(label, direction, term_family(label))
            self._layout_dirty = True
        return s

    def add_validation(self, epoch: int, metrics: dict[str, Any]) -> dict[str, float]:
        """Store one ``Validation`` event; returns its flattened numbers (``{"i2t R@1": ..., "rsum": ...}``)."""
        flat: dict[str, float] = {}
        for d in DIRECTIONS:
            for k in VALIDATION_KEYS:
                if isinstance(metrics.get(d), dict) and isinstance(metrics[d].get(k), (int, float)):
                    flat[f"{d} {k}"] = float(metrics[d][k])
        for k in VALIDATION_KEYS + ("rsum",):
            if isinstance(metrics.get(k), (int, float)):
                flat[k] = float(metrics[k])
        if not flat:
            return flat
        if not self.has_epoch_validation:       # one result after fitting: a sentence, not a lone point
            self.final_validation = flat
            self._dirty = True
            return flat
        for key, value in flat.items():
            s = self.val_series.get(key)
            if s is None:
                s = self.val_series[key] = Series(key, None, "rsum" if key == "rsum" else "recall")
                self._layout_dirty = True
            s.add(float(epoch), value)
            self._dirty = True
        return flat

    # ------------------------------------------------------------------ queries (tests, notes)
    def points(self, key: str) -> tuple[list[float], list[float]]:
        """``(xs, ys)`` of a training series (``"mse"``, ``"primal [t2i]"``) or a validation one."""
        s = self.series.get(key) or self.val_series.get(key)
        return (s.xs, s.ys) if s is not None else ([], [])

    def families(self) -> list[str]:
        """The family keys that have a training plot on show, in display order."""
        return [k for k in FAMILIES if k in self._in_use]

    def shown_plots(self) -> list[str]:
        """Every plot on show: family keys, then ``"recall"`` / ``"rsum"``."""
        return list(self._in_use)

    def is_log(self, plot_key: str) -> bool:
        """Whether the plot (a family key, ``"recall"`` or ``"rsum"``) draws a log y-axis."""
        return plot_key in self._in_use and self._log.get(plot_key, False)

    def family_terms(self, family: str) -> set[str]:
        """The term labels drawn in a family's plot."""
        return {s.label for s in self.series.values() if s.family == family}

    # ------------------------------------------------------------------ drawing
    @staticmethod
    def _key(s: Series, is_val: bool) -> str:
        return f"val:{s.label}" if is_val else (f"{s.label} [{s.direction}]" if s.direction else s.label)

    def _style(self, s: Series, is_val: bool) -> Qt.PenStyle:
        return STYLE_OF_KIND[series_kind(self._key(s, is_val))]

    def colour_of(self, key: str) -> str:
        """The colour a series is drawn in (a training series key, ``"primal [t2i]"``, or ``"val:<key>"``)."""
        s = self.val_series.get(key[4:]) if key.startswith("val:") else self.series.get(key)
        if s is None:
            raise KeyError(key)
        return self._colour(key if key.startswith("val:") else s.label)

    # ------------------------------------------------------------------ export
    def figures(self) -> dict[str, Figure]:
        """The plots on show as exportable figures (their visible series, each named in a legend with its line
        style), keyed by plot (a family key, ``"recall"``, ``"rsum"``)."""
        toggles = self._toggles()
        out: dict[str, Figure] = {}
        who = f"{self.method_title}: " if self.method_title else ""
        for key in self._in_use:
            is_val = key in ("recall", "rsum")
            group = [s for s in (self.val_series.values() if is_val else self.series.values())
                     if (("rsum" if s.label == "rsum" else "recall") if is_val else s.family) == key]
            series = []
            for s in group:
                tkey = f"val:{s.label}" if is_val else s.label
                if not (toggles.get(tkey, True) and (s.direction is None or toggles.get(f"dir:{s.direction}", True))):
                    continue
                name = (f"val {s.label}" if is_val else s.label) + (f" [{s.direction}]" if s.direction else "")
                series.append(FigureSeries(name, "line", np.asarray(s.xs), np.asarray(s.ys), self._colour(tkey),
                                           dash=self._style(s, is_val), symbol="o" if is_val else None))
            if not series:
                continue
            plot = self.plots[key]
            title = plot.getPlotItem().titleLabel.text
            unit = FAMILIES[key].unit if key in FAMILIES else ("%" if key == "recall" else "rsum")
            log = self._log.get(key, False)
            out[key] = Figure(who + html.unescape(title), "epoch" if is_val else self._x_label(),
                              unit + (" (log scale)" if log else ""), series, log_y=log)
        return out

    def export_plots(self, chosen: str | Path) -> list[Path]:
        """Each plot on show to its own file named after ``chosen`` (``curves.png`` -> ``curves_loss.png``...;
        PNG at 300 dpi, or SVG when ``chosen`` ends in ``.svg``); returns the paths written."""
        figs = self.figures()
        paths = figure_paths(chosen, list(figs))
        for path, fig in zip(paths, figs.values()):
            save_figure(fig, path)
        return paths

    def _export_dialog(self) -> None:
        path = ask_plot_path(self, "Export curves", "curves.png")
        if path is None:
            return
        try:
            with busy():
                paths = self.export_plots(path)
        except (OSError, CrossViewError) as e:
            self.export_note.setText(f"Could not write {path}: {e}")
        else:
            self.export_note.setText(("Exported " + ", ".join(p.name for p in paths) + f" in {paths[0].parent}")
                                     if paths else "No curves to export yet")
        self.export_note.setToolTip(self.export_note.text())
        self.export_note.show()

    def _x_label(self) -> str:
        return "iteration of each solve" if self.directions_differ else "step"

    def _set_label(self, key: str, side: str, text: str) -> None:
        """Set an axis label only when it changes (setLabel re-lays the plot out: ~20 ms)."""
        if self._labels.get((key, side)) != text:
            self._labels[(key, side)] = text
            self.plots[key].setLabel(side, text)

    def _make_plot(self, key: str, title: str, unit: str, x_label: str) -> pg.PlotWidget:
        plot = pg.PlotWidget(background="w")
        plot.setTitle(title, color="#24292f", size="10pt")
        self.plots[key] = plot
        self._set_label(key, "left", unit)
        self._set_label(key, "bottom", x_label)
        for side in ("left", "bottom"):       # "seconds (x0.001)" reads worse than 0.05 s
            plot.getAxis(side).enableAutoSIPrefix(False)
        plot.setMinimumSize(150, 130)
        plot.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        # No grid lines: on a software-rendered 2-core machine they were the largest cost of a frame.
        plot.setClipToView(True)
        plot.setDownsampling(auto=True, mode="peak")
        plot.setMenuEnabled(False)
        return plot

    def _colour(self, label: str) -> str:
        if label.startswith("val:"):             # validation: colour by direction and K (t2i dotted too)
            table = VAL_COLOURS_T2I if label.startswith("val:t2i") else VAL_COLOURS
            return table.get(label.split()[-1], "#57606a")
        if label not in self._colours:
            self._colours[label] = term_colour(label, tuple(self.term_help))
        return self._colours[label]

    def load_history(self, run_dir: str | Path) -> int:
        """Draw the ``Loss`` / ``Validation`` / ``Phase`` events of a run folder's ``metrics.jsonl`` (a run about to
        resume: its curves from the start, not from the checkpoint on), then :meth:`mark_resume`; returns how
        many events were drawn (0 when the file is missing or unreadable)."""
        from crossview.core.events import Loss, Phase, Validation, event_from_dict
        from crossview.core.io import read_events

        n = 0
        try:
            for d in read_events(Path(run_dir) / "metrics.jsonl"):
                if d.get("event") not in ("loss", "validation", "phase"):
                    continue
                try:
                    ev = event_from_dict(d)
                except (ValueError, TypeError):
                    continue
                if isinstance(ev, Loss):
                    self.add_loss(ev.step, ev.epoch, ev.terms)
                elif isinstance(ev, Validation):
                    self.add_validation(ev.epoch, ev.metrics)
                elif isinstance(ev, Phase):
                    self.add_phase(ev.step, ev.epoch, ev.name)
                n += 1
        except (CrossViewError, OSError):
            return 0
        self.mark_resume()
        self.flush()
        return n

    def mark_resume(self) -> None:
        """The run resumes from its checkpoint: the curves drawn so far stay (its history), and each series'
        next point replaces the points from its step on (what was logged after the checkpoint is superseded)."""
        for s in (*self.series.values(), *self.val_series.values()):
            s.rewind = True
        self._dirty = True

    def _relayout(self) -> None:
        """Show the plots the data needs and place plots and notes in the grid, and list the series (only
        when the set of series changed, not per frame; the grid only when the set of plots changed: a new
        grid repaints every plot, ~40-100 ms on a busy 2-core machine)."""
        self._layout_dirty = False
        use = [fam for fam in FAMILIES if any(s.family == fam for s in self.series.values())]
        use += [k for k in ("recall", "rsum") if any(s.family == k for s in self.val_series.values())]
        if use != self._in_use or self.grid.count() == 0:
            self._place(use)
        title = "Validation R@K and mAP" if any(k.endswith(" mAP") for k in self.val_series) else "Validation R@K"
        if title != getattr(self, "_recall_title", "Validation R@K"):
            self.plots["recall"].setTitle(title, color="#24292f", size="10pt")
            self._recall_title = title
        self._rebuild_series_list()

    def _place(self, use: list[str]) -> None:
        while self.grid.count():
            self.grid.takeAt(0)
        self._in_use = use
        for key, plot in self.plots.items():
            plot.setVisible(key in use)
            if key in FAMILIES:
                self._set_label(key, "bottom", self._x_label())
        widgets: list[QWidget] = [self.plots[k] for k in use if k in FAMILIES]
        self.loss_note.setVisible(not widgets)
        if not widgets:
            widgets.append(self.loss_note)
        widgets += [self.plots[k] for k in use if k not in FAMILIES]
        show_val_note = not self.val_series
        self.validation_note.setVisible(show_val_note)
        if show_val_note:
            widgets.append(self.validation_note)
        cols = 3 if len(widgets) > 4 else 2 if len(widgets) > 1 else 1
        for i, w in enumerate(widgets):
            self.grid.addWidget(w, i // cols, i % cols)
        for c in range(3):
            self.grid.setColumnStretch(c, 1 if c < cols else 0)

    def _rebuild_series_list(self) -> None:
        checked = {}
        for i in range(self.series_list.count()):
            it = self.series_list.item(i)
            checked[it.data(Qt.ItemDataRole.UserRole)] = it.checkState() == Qt.CheckState.Checked
        self.series_list.blockSignals(True)
        self.series_list.clear()
        entries: list[tuple[str, str, QIcon]] = []
        for fam in FAMILIES:
            for label in dict.fromkeys(s.label for s in self.series.values() if s.family == fam):
                entries.append((label, f"{label}", _swatch(self._colour(label),
                                                           STYLE_OF_KIND[series_kind(label)])))
        directions = sorted({s.direction for s in self.series.values() if s.direction})
        for d in directions:
            entries.append((f"dir:{d}", f"{d} solve ({'solid' if d == 'i2t' else 'dashed'})",
                            _swatch("#24292f", STYLE_OF_KIND[series_kind(f"dir:{d}")])))
        for key in self.val_series:
            icon = _swatch(self._colour(f"val:{key}"), STYLE_OF_KIND[series_kind(f"val:{key}")], marker=True)
            entries.append((f"val:{key}", f"val {key}", icon))
        for key, text, icon in entries:
            it = QListWidgetItem(icon, text)
            base = key.removesuffix(" (pass mean)")
            if base in self.term_help:       # what a loss term is (the method's loss_terms)
                it.setToolTip(f"{base}: {self.term_help[base]}" + (" (the mean over a pass through the data)"
                                                                    if key != base else ""))
            it.setData(Qt.ItemDataRole.UserRole, key)
            it.setFlags(it.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            it.setCheckState(Qt.CheckState.Checked if checked.get(key, True) else Qt.CheckState.Unchecked)
            self.series_list.addItem(it)
        self.series_list.blockSignals(False)
        self.series_box.setVisible(bool(entries))      # no curves (CCA): the notes get the width

    def _toggles(self) -> dict[str, bool]:
        out = {}
        for i in range(self.series_list.count()):
            it = self.series_list.item(i)
            out[it.data(Qt.ItemDataRole.UserRole)] = it.checkState() == Qt.CheckState.Checked
        return out

    def set_visible(self, key: str, visible: bool) -> None:
        """Tick / untick a series toggle (a term label, ``"dir:t2i"`` or ``"val:rsum"``)."""
        for i in range(self.series_list.count()):
            it = self.series_list.item(i)
            if it.data(Qt.ItemDataRole.UserRole) == key:
                it.setCheckState(Qt.CheckState.Checked if visible else Qt.CheckState.Unchecked)
                return
        raise KeyError(key)

    def is_shown(self, key: str) -> bool:
        """Whether the curve of a training series key (``"primal [i2t]"``) or ``"val:<key>"`` is visible."""
        s = self.val_series.get(key[4:]) if key.startswith("val:") else self.series.get(key)
        return bool(s is not None and s.item is not None and s.item.isVisible())

    def _on_toggle(self, _item: QListWidgetItem) -> None:
        self._dirty = True
        self.flush()

    def _set_note(self, label: QLabel, text: str) -> None:
        if label.text() != text:
            label.setText(text)

    def _notes(self) -> None:
        name = self.method_title or "This method"
        if not self.iterative and self.method_name:
            self._set_note(self.loss_note, f"<b>{html.escape(name)} is closed-form: no loss curve.</b><br>"
                           "It fits in one pass; the progress bar follows its steps.")
        elif self.cv_events:
            self._set_note(self.loss_note, f"<b>Cross-validation of C</b> ({self.cv_events} solver iterations so "
                           "far): its solves are not plotted; the progress bar and the log follow them. The "
                           "curves of the final i2t and t2i solves appear here.")
        elif self.method_name:
            self._set_note(self.loss_note, "Waiting for the first loss values...")
        else:
            self._set_note(self.loss_note, "Start a run, or click a run in the Runs list to see its curves.")
        parts = []
        if not self.has_epoch_validation:
            parts.append(f"<b>{html.escape(name)} has no per-epoch validation.</b> "
                         + html.escape(self.validation_note_text or "See the log."))
            if self.final_validation:
                f = self.final_validation
                parts.append("After fitting, on val: " + html.escape(", ".join(
                    f"{k} {v:.1f}" for k, v in f.items())))
        elif self.no_validation_reason:
            reason = self.no_validation_reason[:1].upper() + self.no_validation_reason[1:]
            parts.append(f"<b>No validation curve.</b> {html.escape(reason, quote=False)}")
        elif self.method_name:
            parts.append("Validation R@K and rsum appear here after the first validation pass.")
        else:
            parts.append("Validation curves appear here.")
        self._set_note(self.validation_note, "<br>".join(parts))

    def flush(self) -> None:
        """Redraw what changed since the last call (the panel's 100 ms timer calls this)."""
        if self._layout_dirty:
            self._relayout()
        if not self._dirty:
            return
        self._dirty = False
        self._notes()
        self._draw_phases()
        toggles = self._toggles()
        by_plot: dict[str, list[Series]] = {}
        for key, s in self.series.items():
            by_plot.setdefault(s.family, []).append(s)
        for key, s in self.val_series.items():
            by_plot.setdefault("recall" if key != "rsum" else "rsum", []).append(s)
        for plot_key, group in by_plot.items():
            plot = self.plots.get(plot_key)
            if plot is None or plot_key not in self._in_use:
                continue
            is_val = plot_key in ("recall", "rsum")
            shown = []
            for s in group:
                tkey = f"val:{s.label}" if is_val else s.label
                vis = toggles.get(tkey, True) and (s.direction is None or toggles.get(f"dir:{s.direction}", True))
                if s.item is None:
                    colour = self._colour(tkey)
                    pen = pg.mkPen(colour, width=2, style=self._style(s, is_val))
                    s.item = plot.plot([], [], pen=pen, name=None)
                    if is_val:
                        s.item.setSymbol("o")
                        s.item.setSymbolSize(6)
                        s.item.setSymbolBrush(colour)
                        s.item.setSymbolPen(colour)
                s.item.setVisible(vis)
                if vis:
                    shown.append(s)
            log = wants_log(min((s.min_pos for s in shown), default=math.inf),
                            max((s.max for s in shown), default=-math.inf))
            if log != self._log.get(plot_key, False):
                plot.setLogMode(x=False, y=log)
                self._log[plot_key] = log
            unit = FAMILIES[plot_key].unit if plot_key in FAMILIES else ("%" if plot_key == "recall" else "rsum")
            self._set_label(plot_key, "left", unit + (" (log scale)" if log else ""))
            if log:
                top = max(s.max for s in shown)
                low = max(min(s.min_pos for s in shown), top * 10 ** -LOG_DECADES)
                plot.setYRange(math.log10(low), math.log10(top), padding=0.05)
            else:
                plot.enableAutoRange(axis="y")
            for s in group:
                step = max(1, len(s.xs) // MAX_POINTS)
                xs = np.asarray(s.xs[::step], dtype=float)
                ys = np.asarray(s.ys[::step], dtype=float)
                if log:                          # a log axis cannot draw zeros or negatives: leave gaps
                    ys = np.where(ys > 0, ys, np.nan)
                s.item.setData(xs, ys, connect="finite")
            xs_all = [x for s in shown for x in (s.xs[0], s.xs[-1]) if s.xs]
            if xs_all and max(xs_all) == min(xs_all):      # one point: a sensible window around it
                plot.setXRange(min(xs_all) - 1, min(xs_all) + 1, padding=0)
            else:
                plot.enableAutoRange(axis="x")
