"""Plots a person can reuse: a figure with a title, axis labels and a legend naming every series, written at a
print size as PNG or SVG.

A :class:`Figure` is plain data (series of bars, lines or points with their colour and dash style); :func:`save_figure`
lays it out in an off-screen pyqtgraph plot of :data:`FIGURE_INCHES` at :data:`LAYOUT_DPI` logical pixels an inch,
the legend in its own row under the plot (so it never hides a bar or a curve), and renders it:

- PNG: :data:`PNG_DPI` dots an inch, i.e. 1920 x 1200 pixels for 6.4 x 4 in, the resolution recorded in the file;
- SVG: Qt's ``QSvgGenerator``, ``width="6.4in" height="4in"`` over a 640 x 400 ``viewBox``, text as text.

The panels build a :class:`Figure` from the data they draw on screen (not a screenshot of the widget, whose size,
clipped labels and legend-less look are the screen's), so the export reads the same whatever the window size.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QImage, QPainter, QPicture
from PySide6.QtWidgets import QApplication, QFileDialog, QGraphicsItem, QWidget

from crossview.core.errors import CrossViewError

#: the figure's size in inches (width, height): a column of a paper or half a slide
FIGURE_INCHES = (6.4, 4.0)
#: logical pixels an inch the figure is laid out at (fonts in points read as on paper)
LAYOUT_DPI = 100
#: dots an inch of an exported PNG
PNG_DPI = 300
#: the file-dialog filter of a plot export
PLOT_FILTER = "PNG (*.png);;SVG (*.svg)"
TEXT = "#1f2328"
AXIS = "#57606a"
#: the longest run name a legend shows whole; longer ones lose their middle ("cca-flick…-183012")
SHORT_NAME = 30


@dataclass
class FigureSeries:
    """One series of a figure. ``kind``: ``"bars"`` (``xs`` the bar centres, ``ys`` the heights, ``width``),
    ``"line"`` (``dash`` a Qt pen style, ``symbol`` a pyqtgraph symbol or None) or ``"points"`` (a scatter)."""

    name: str
    kind: str
    xs: np.ndarray
    ys: np.ndarray
    colour: str
    dash: Qt.PenStyle = Qt.PenStyle.SolidLine
    width: float = 0.8
    symbol: str | None = None
    alpha: int = 255


@dataclass
class Figure:
    """A plot to export: what it shows (``title``), its axes and its series. ``x_ticks`` / ``y_ticks``: fixed
    ``(value, label)`` ticks (the rank bins of a histogram, the ranks of a log axis), else automatic."""

    title: str
    x_label: str
    y_label: str
    series: list[FigureSeries] = field(default_factory=list)
    x_ticks: list[tuple[float, str]] | None = None
    y_ticks: list[tuple[float, str]] | None = None
    log_y: bool = False
    note: str = ""


def short_name(name: str, limit: int = SHORT_NAME) -> str:
    """``name`` when it has at most ``limit`` characters, else its start and end around an ellipsis (a run's
    folder name: the method and the time stamp that tell two runs apart stay)."""
    if len(name) <= limit:
        return name
    head = (limit - 1) // 2
    return name[:head] + "\u2026" + name[-(limit - 1 - head):]


def _pen(s: FigureSeries, scale: float) -> pg.QtGui.QPen:
    # pyqtgraph's pens are cosmetic (their width in device pixels): scaled here, so a line is as thick on paper
    # in a 300-dpi PNG as in the SVG
    return pg.mkPen(s.colour, width=1.5 * scale, style=s.dash)


def build_figure(fig: Figure, scale: float = 1.0) -> pg.GraphicsLayoutWidget:
    """The figure laid out in an off-screen widget of ``FIGURE_INCHES * LAYOUT_DPI`` logical pixels, its lines
    ``scale`` device pixels a logical one (the caller closes it; :func:`save_figure` does)."""
    w_px, h_px = (round(v * LAYOUT_DPI) for v in FIGURE_INCHES)
    view = pg.GraphicsLayoutWidget()
    view.setBackground("w")
    view.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen)
    view.setFixedSize(w_px, h_px)
    view.ci.setContentsMargins(6, 6, 12, 6)
    plot = view.addPlot(row=0, col=0)
    plot.setTitle(fig.title, color=TEXT, size="11pt")
    plot.setMenuEnabled(False)
    label_style = {"color": TEXT, "font-size": "10pt"}
    plot.setLabel("bottom", fig.x_label, **label_style)
    plot.setLabel("left", fig.y_label, **label_style)
    for side in ("left", "bottom"):
        axis = plot.getAxis(side)
        axis.setPen(pg.mkPen(AXIS))
        axis.setTextPen(pg.mkPen(TEXT))
        axis.enableAutoSIPrefix(False)
    if fig.log_y:
        plot.setLogMode(x=False, y=True)
    legend = pg.LegendItem(colCount=2 if len(fig.series) > 3 else 1, labelTextColor=TEXT, labelTextSize="9pt",
                           horSpacing=18, verSpacing=0)
    # a legend in a plot keeps its size when the view zooms; here it is a row of the figure, scaled with it
    legend.setFlag(QGraphicsItem.GraphicsItemFlag.ItemIgnoresTransformations, False)
    for s in fig.series:
        xs = np.asarray(s.xs, dtype=float)
        ys = np.asarray(s.ys, dtype=float)
        colour = QColor(s.colour)
        colour.setAlpha(s.alpha)
        if s.kind == "bars":
            item = pg.BarGraphItem(x=xs, height=ys, width=s.width, brush=pg.mkBrush(colour), pen=pg.mkPen(None))
        elif s.kind == "points":
            item = pg.ScatterPlotItem(x=xs, y=ys, size=6, pen=pg.mkPen(None), brush=pg.mkBrush(colour))
        elif s.kind == "line":
            if fig.log_y:          # a log axis cannot draw zeros or negatives: leave gaps
                ys = np.where(ys > 0, ys, np.nan)
            item = pg.PlotDataItem(xs, ys, pen=_pen(s, scale), connect="finite")
            if s.symbol:
                item.setSymbol(s.symbol)
                item.setSymbolSize(6)
                item.setSymbolBrush(colour)
                item.setSymbolPen(colour)
        else:
            raise ValueError(f"unknown series kind {s.kind!r}: bars, line or points")
        plot.addItem(item)
        legend.addItem(item, s.name)
    if fig.x_ticks is not None:
        plot.getAxis("bottom").setTicks([fig.x_ticks])
    if fig.y_ticks is not None:
        plot.getAxis("left").setTicks([fig.y_ticks])
    if fig.series:
        view.addItem(legend, row=1, col=0)
    if fig.note:
        view.addLabel(fig.note, row=2, col=0, color=AXIS, size="8pt")
    view.show()                       # WA_DontShowOnScreen: lays it out and ranges the axes, nothing on screen
    for _ in range(3):                # layout, then the auto-range it allows, then the axes' ticks for that range
        QApplication.processEvents()
    for side in ("left", "bottom"):
        plot.getAxis(side).picture = None     # drawn afresh at the final range (not a cached first guess)
    return view


def _render(view: pg.GraphicsLayoutWidget, painter: QPainter, target: QRectF, scale: float) -> None:
    """Paint the figure's scene into ``target``: items drawn for export (pyqtgraph's export mode: axes and text
    without their screen caches, so they scale cleanly)."""
    items = [it for it in view.scene().items() if hasattr(it, "setExportMode")]
    opts = {"antialias": True, "background": QColor("white"), "painter": painter, "resolutionScale": scale}
    for it in items:
        it.setExportMode(True, opts)
    try:
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        painter.setRenderHint(QPainter.RenderHint.TextAntialiasing, True)
        source = QRectF(0, 0, view.width(), view.height())
        view.scene().render(painter, target, source)
    finally:
        for it in items:
            it.setExportMode(False, opts)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (``.png``: :data:`PNG_DPI` dpi; ``.svg``: vector) at :data:`FIGURE_INCHES`;
    returns ``path``. Any other suffix is refused with a sentence that says which ones work."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise CrossViewError(f"{path}: a plot is written as .png or .svg; give the file one of those endings")
    scale = PNG_DPI / LAYOUT_DPI if suffix == ".png" else 1.0
    view = build_figure(fig, scale)
    try:
        w_px, h_px = view.width(), view.height()
        if suffix == ".png":
            img = QImage(round(w_px * scale), round(h_px * scale), QImage.Format.Format_ARGB32)
            img.fill(QColor("white"))
            painter = QPainter(img)
            try:
                _render(view, painter, QRectF(0, 0, img.width(), img.height()), scale)
            finally:
                painter.end()
            # the resolution is recorded after painting: pyqtgraph replays cached text pictures at the device's
            # resolution, so a 300-dpi image would get its text scaled twice
            dpm = round(PNG_DPI / 0.0254)
            img.setDotsPerMeterX(dpm)
            img.setDotsPerMeterY(dpm)
            if not img.save(str(path)):
                raise CrossViewError(f"{path}: could not write the image; check the folder exists and is writable")
        else:
            from PySide6.QtSvg import QSvgGenerator

            gen = QSvgGenerator()
            gen.setFileName(str(path))
            gen.setSize(QSize(w_px, h_px))
            gen.setViewBox(QRect(0, 0, w_px, h_px))
            # pyqtgraph's axes replay cached pictures scaled by the device's resolution over theirs: the same
            # resolution here, or the axes drift from the data; the file's size in inches is set after
            gen.setResolution(QPicture().logicalDpiX())
            gen.setTitle(fig.title)
            gen.setDescription(f"CrossView: {fig.title}")
            painter = QPainter()
            if not painter.begin(gen):
                raise CrossViewError(f"{path}: could not write the SVG; check the folder exists and is writable")
            try:
                painter.fillRect(QRectF(0, 0, w_px, h_px), QColor("white"))
                _render(view, painter, QRectF(0, 0, w_px, h_px), 1.0)
            finally:
                painter.end()
            text = path.read_text(encoding="utf-8")
            text = re.sub(r'<svg width="[^"]*" height="[^"]*"',
                          f'<svg width="{FIGURE_INCHES[0]:g}in" height="{FIGURE_INCHES[1]:g}in"', text, count=1)
            path.write_text(text, encoding="utf-8")
    finally:
        view.close()
        view.deleteLater()
    return path


@contextmanager
def busy() -> Iterator[None]:
    """A wait cursor while an export writes its files (a second or two for four plots)."""
    QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
    try:
        yield
    finally:
        QApplication.restoreOverrideCursor()


def ask_plot_path(parent: QWidget, title: str, default: str) -> str | None:
    """Ask where to export plots (one file per plot; the name is a prefix): the chosen path with ``.png`` or
    ``.svg`` added from the chosen filter when it has neither, or None when the dialog was cancelled."""
    path, chosen_filter = QFileDialog.getSaveFileName(parent, f"{title} (one file per plot; the name is a prefix)",
                                                      default, PLOT_FILTER)
    if not path:
        return None
    if Path(path).suffix.lower() not in (".png", ".svg"):
        path += ".svg" if chosen_filter.startswith("SVG") else ".png"
    return path


def figure_paths(chosen: str | Path, names: list[str], suffixes: tuple[str, ...] = (".png", ".svg")) -> list[Path]:
    """The files an export of several plots (or tables) writes when a person chose ``chosen`` (``run.png``):
    ``run_<name>.png`` for each name, in the chosen folder, with the chosen ending when it is one of ``suffixes``
    (else the first of them)."""
    chosen = Path(chosen)
    known = chosen.suffix.lower() in suffixes
    suffix = chosen.suffix.lower() if known else suffixes[0]
    stem = chosen.stem if known else chosen.name
    return [chosen.with_name(f"{stem}_{n}{suffix}") for n in names]
