"""The Data panel: a dataset's summary, a virtualised thumbnail grid, and the selected image with its
captions, label and tags. Filter by caption text and by split.

Run alone on the demo: ``python -m crossview.gui.panels.data_panel [PATH]``.
"""

from __future__ import annotations


import numpy as np
from PySide6.QtCore import QAbstractListModel, QModelIndex, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QLineEdit, QListView, QPushButton, QSplitter,
                               QTextBrowser, QVBoxLayout, QWidget)

import pyqtgraph as pg

from crossview.core.text import html_text, printable
from crossview.data.dataset import PairedDataset
from crossview.data.stats import caption_lengths
from crossview.data.text import tokenize
from crossview.gui.thumbnails import ThumbnailCache


class ImageGridModel(QAbstractListModel):
    """Rows = the images that pass the current filter; thumbnails come from the cache when decoded."""

    PathRole = Qt.ItemDataRole.UserRole + 1
    ImageRole = Qt.ItemDataRole.UserRole + 2

    def __init__(self, cache: ThumbnailCache, parent=None) -> None:
        super().__init__(parent)
        self.cache = cache
        self.ds: PairedDataset | None = None
        self.rows = np.zeros(0, dtype=np.int64)
        self._row_of_path: dict[str, int] = {}
        cache.ready.connect(self._on_ready)

    def set_dataset(self, ds: PairedDataset | None) -> None:
        self.beginResetModel()
        self.ds = ds
        self.rows = np.arange(ds.n_images if ds is not None else 0, dtype=np.int64)
        self._reindex()
        self.endResetModel()

    def set_rows(self, rows: np.ndarray) -> None:
        self.beginResetModel()
        self.rows = rows
        self._reindex()
        self.endResetModel()

    def _reindex(self) -> None:
        paths = self.ds.image_paths if self.ds is not None else None
        self._row_of_path = {} if paths is None else {paths[i]: r for r, i in enumerate(self.rows.tolist())}

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else len(self.rows)

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or self.ds is None:
            return None
        i = int(self.rows[index.row()])
        if role == Qt.ItemDataRole.DecorationRole:
            if self.ds.image_paths is None:
                return None
            return self.cache.get(self.ds.image_paths[i]) or self.cache.loading
        if role == Qt.ItemDataRole.ToolTipRole:
            caps = self.ds.captions_of(i)
            # rich text made explicit, so that a caption starting with "<b>" shows as written
            return f"<p>{html_text(self.ds.captions[caps[0]])}</p>" if caps else None
        if role == self.ImageRole:
            return i
        if role == self.PathRole and self.ds.image_paths is not None:
            return self.ds.image_paths[i]
        return None

    def _on_ready(self, path: str) -> None:
        r = self._row_of_path.get(path)
        if r is not None:
            idx = self.index(r)
            self.dataChanged.emit(idx, idx, [Qt.ItemDataRole.DecorationRole])


def prepare_browsing(ds: PairedDataset) -> dict:
    """What the panel needs to filter and summarise ``ds``: the word set of each image and the caption
    lengths. Plain Python (no Qt), so the loading worker computes it off the GUI thread (150K captions
    take about a second)."""
    words: list[set[str]] = [set() for _ in range(ds.n_images)]
    lengths = np.zeros(ds.n_captions, dtype=np.int64)
    for n, (c, i) in enumerate(zip(ds.captions, ds.caption_image.tolist())):
        toks = tokenize(c)
        words[i].update(toks)
        lengths[n] = len(toks)
    return {"dataset": id(ds), "words": words, "lengths": lengths}


class DataPanel(QWidget):
    """Browse a dataset. ``image_selected(int)`` carries the image index of the dataset."""

    image_selected = Signal(int)
    query_requested = Signal(int)   # "find captions for this image" with the open run

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ds: PairedDataset | None = None
        self._image_words: list[set[str]] = []
        self.cache = ThumbnailCache(size=112, parent=self)
        self.model = ImageGridModel(self.cache, self)

        self.summary = QLabel("No dataset loaded.")
        self.summary.setObjectName("summary")
        self.summary.setWordWrap(True)

        # caption-length histogram (words per caption), small, beside the summary
        self.length_plot = pg.PlotWidget(background=None)
        self.length_plot.setObjectName("lengthHistogram")
        self.length_plot.setFixedHeight(96)
        self.length_plot.setMinimumWidth(200)
        self.length_plot.setMaximumWidth(340)
        self.length_plot.setMouseEnabled(x=False, y=False)
        self.length_plot.hideButtons()
        self.length_plot.setMenuEnabled(False)
        self.length_plot.getPlotItem().setLabel("bottom", "words per caption")
        self.length_plot.getPlotItem().getAxis("left").setWidth(36)
        self.length_plot.setToolTip("Caption lengths in words")
        self.length_bars: pg.BarGraphItem | None = None
        self.length_counts = np.zeros(0, dtype=np.int64)

        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter by caption words, e.g. red circle")
        self.filter_edit.setClearButtonEnabled(True)
        self.split_combo = QComboBox()
        self.split_combo.setToolTip("Show one split")
        self.count_label = QLabel("")
        self._filter_timer = QTimer(self, singleShot=True, interval=150)
        self._filter_timer.timeout.connect(self.apply_filter)
        self.filter_edit.textChanged.connect(self._filter_timer.start)
        self.split_combo.currentIndexChanged.connect(self.apply_filter)

        self.grid = QListView()
        self.grid.setViewMode(QListView.ViewMode.IconMode)
        self.grid.setResizeMode(QListView.ResizeMode.Adjust)
        self.grid.setMovement(QListView.Movement.Static)
        self.grid.setUniformItemSizes(True)
        self.grid.setLayoutMode(QListView.LayoutMode.Batched)
        self.grid.setBatchSize(200)
        self.grid.setIconSize(QSize(112, 112))
        self.grid.setGridSize(QSize(124, 124))
        self.grid.setSpacing(4)
        self.grid.setModel(self.model)
        self.grid.selectionModel().currentChanged.connect(self._on_current)

        self.image_view = QLabel()
        self.image_view.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.image_view.setMinimumSize(256, 256)
        self.image_view.setObjectName("preview")
        self.details = QTextBrowser()
        self.details.setOpenLinks(False)
        self.query_button = QPushButton("Find captions for this image (Ctrl+I)")
        self.query_button.setToolTip("Rank the captions for this image with the open run, in the Query panel")
        self.query_button.clicked.connect(lambda: self.current_image() is not None and
                                          self.query_requested.emit(self.current_image()))

        bar = QHBoxLayout()
        bar.addWidget(self.filter_edit, 1)
        bar.addWidget(self.split_combo)
        bar.addWidget(self.count_label)
        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(self.summary, 1)
        top.addWidget(self.length_plot)
        lv.addLayout(top)
        lv.addLayout(bar)
        lv.addWidget(self.grid, 1)
        right = QWidget()
        rv = QVBoxLayout(right)
        rv.setContentsMargins(0, 0, 0, 0)
        rv.addWidget(self.image_view, 3)
        rv.addWidget(self.query_button)
        rv.addWidget(self.details, 2)
        split = QSplitter()
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setSizes([760, 480])
        self.splitter = split
        layout = QVBoxLayout(self)
        layout.addWidget(split)

    # ------------------------------------------------------------------ dataset
    def set_dataset(self, ds: PairedDataset | None, prepared: dict | None = None) -> None:
        """Show ``ds``; ``prepared`` is :func:`prepare_browsing`'s result when a worker computed it."""
        self.cache.clear_pending()
        self.ds = ds
        self.split_combo.blockSignals(True)
        self.split_combo.clear()
        self.split_combo.addItem("All splits", None)
        if ds is not None:
            for s in ds.split_names:
                self.split_combo.addItem(f"{printable(s)} ({len(ds.splits[s]):,})", s)
        self.split_combo.blockSignals(False)
        self._image_words = []
        self._lengths = np.zeros(0, dtype=np.int64)
        if ds is not None:
            if prepared is None or prepared.get("dataset") != id(ds):
                prepared = prepare_browsing(ds)
            self._image_words = prepared["words"]
            self._lengths = prepared["lengths"]
        self.model.set_dataset(ds)
        self.summary.setText(self._summary_text())
        self._plot_lengths()
        self.apply_filter()
        if ds is not None and ds.n_images:
            self.grid.setCurrentIndex(self.model.index(0))

    def _plot_lengths(self) -> None:
        plot = self.length_plot.getPlotItem()
        if self.length_bars is not None:
            plot.removeItem(self.length_bars)
            self.length_bars = None
        if self.ds is None or not self.ds.n_captions:
            self.length_counts = np.zeros(0, dtype=np.int64)
            return
        lengths = self._lengths if len(self._lengths) == self.ds.n_captions else caption_lengths(self.ds.captions)
        self.length_counts = np.bincount(lengths)
        xs = np.arange(len(self.length_counts))
        self.length_bars = pg.BarGraphItem(x=xs, height=self.length_counts, width=0.85,
                                           brush=pg.mkBrush("#4a7fb5"), pen=pg.mkPen(None))
        plot.addItem(self.length_bars)
        plot.setXRange(max(0, lengths.min() - 1), lengths.max() + 1, padding=0)
        self.length_plot.setToolTip(f"Caption lengths in words: mean {lengths.mean():.1f}, median "
                                    f"{np.median(lengths):.0f}, range {lengths.min()}-{lengths.max()}")

    def _summary_text(self) -> str:
        ds = self.ds
        if ds is None:
            return "No dataset loaded."
        # dataset strings are escaped twice over: control characters shown as \x1b etc., then HTML
        splits = ", ".join(f"{html_text(s)} {len(ds.splits[s]):,}" for s in ds.split_names)
        return (f"<b>{html_text(ds.name)}</b> &nbsp; {ds.n_images:,} images, {ds.n_captions:,} captions"
                f" &nbsp; <span style='color:#666'>splits: {splits or 'none'} &nbsp; format: {ds.format}</span>")

    def apply_filter(self) -> None:
        ds = self.ds
        if ds is None:
            self.count_label.setText("")
            return
        keep = np.ones(ds.n_images, dtype=bool)
        # the split by its position, not the item's data: Qt drops a lone surrogate from a string it stores
        k = self.split_combo.currentIndex()
        split = None if k <= 0 else ds.split_names[k - 1]
        if split is not None:
            mask = np.zeros(ds.n_images, dtype=bool)
            mask[ds.splits[split]] = True
            keep &= mask
        wanted = tokenize(self.filter_edit.text())
        if wanted:
            keep &= np.fromiter((all(w in ws for w in wanted) for ws in self._image_words), dtype=bool,
                                count=ds.n_images)
        rows = np.flatnonzero(keep)
        self.cache.clear_pending()
        self.model.set_rows(rows)
        self.count_label.setText(f"{len(rows):,} of {ds.n_images:,}")
        if len(rows):
            self.grid.setCurrentIndex(self.model.index(0))
        else:
            self._show_image(None)

    def current_image(self) -> int | None:
        """The dataset index of the selected image, or None."""
        idx = self.grid.currentIndex()
        return None if not idx.isValid() else int(idx.data(ImageGridModel.ImageRole))

    def select_image(self, image: int) -> None:
        """Selects dataset image ``image`` in the grid (clearing a filter that hides it)."""
        rows = self.model.rows
        hit = np.flatnonzero(rows == image)
        if not len(hit):
            self.filter_edit.clear()
            self.split_combo.setCurrentIndex(0)
            self.apply_filter()
            hit = np.flatnonzero(self.model.rows == image)
        if len(hit):
            idx = self.model.index(int(hit[0]))
            self.grid.setCurrentIndex(idx)
            self.grid.scrollTo(idx)

    # ------------------------------------------------------------------ selection
    def _on_current(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if not current.isValid():
            self._show_image(None)
            return
        i = current.data(ImageGridModel.ImageRole)
        self._show_image(i)
        self.image_selected.emit(i)

    def _show_image(self, i: int | None) -> None:
        ds = self.ds
        if ds is None or i is None:
            self.image_view.clear()
            self.details.clear()
            return
        if ds.image_paths is not None:
            pm = QPixmap(ds.image_paths[i])
            if pm.isNull():
                self.image_view.setText("This image cannot be read:\n" + printable(ds.image_paths[i]))
            else:
                side = max(256, min(self.image_view.width(), self.image_view.height()))
                self.image_view.setPixmap(pm.scaled(side, side, Qt.AspectRatioMode.KeepAspectRatio,
                                                    Qt.TransformationMode.SmoothTransformation))
        else:
            self.image_view.setText("Precomputed features: no image file")
        split = next((s for s in ds.split_names if np.isin(i, ds.splits[s])), "-")
        parts = [f"<p><b>Image {int(ds.image_ids[i])}</b> &nbsp; split <b>{html_text(split)}</b>"]
        assert ds.labels is not None
        if ds.label_names is not None:
            parts.append(f" &nbsp; label <b>{html_text(ds.label_names[int(ds.labels[i])])}</b>")
        parts.append("</p>")
        if ds.image_paths is not None:
            parts.append(f"<p style='color:#666'>{html_text(ds.image_paths[i])}</p>")
        caps = ds.captions_of(i)
        parts.append(f"<p><b>Captions ({len(caps)})</b></p><ol>")
        parts.extend(f"<li>{html_text(ds.captions[c])}</li>" for c in caps)
        parts.append("</ol>")
        if ds.tags is not None and ds.tags[i]:
            parts.append("<p><b>Tags</b> " + ", ".join(html_text(t) for t in ds.tags[i]) + "</p>")
        if ds.label_sets is not None and ds.label_sets[i]:
            parts.append("<p><b>Labels</b> " + ", ".join(html_text(t) for t in ds.label_sets[i]) + "</p>")
        self.details.setHtml("".join(parts))


if __name__ == "__main__":  # pragma: no cover - manual preview
    import sys

    from crossview.gui.app import run_panel
    sys.exit(run_panel(DataPanel, sys.argv[1] if len(sys.argv) > 1 else "demo"))
