"""The Query panel's ranked results, as a widget: captions (an image query, i2t) in a list, images (a sentence
query, t2i) in a grid whose columns fill its width. Each row shows its rank and score (aligned column under
column), the identity or class where the dataset has them, the caption or the image, ground truth highlighted
and the row's relevance mark.

:class:`ResultsView` only shows a :class:`~crossview.engine.retriever.Ranking` and says what the user does with
it (:attr:`~ResultsView.activated`: a double-click or Enter on a row; a single click only selects, so
annotators can click, then mark). Asking, marking and explaining are the Query panel's
(:mod:`crossview.gui.panels.query_panel`); Explain's overlaid result images come in through
:attr:`ResultsView.icon_override`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QListView, QListWidget, QListWidgetItem, QStackedWidget, QWidget

from crossview.engine.retriever import Ranking
from crossview.gui.thumbnails import ThumbnailCache, placeholder

__all__ = ["ResultsView", "ItemRole", "LabelRole", "PathRole", "GOLD", "MARK_YES", "MARK_NO", "FIGURE_SPACE",
           "square_icon"]

ItemRole = Qt.ItemDataRole.UserRole + 1     #: a row's gallery item (caption index for i2t, image index for t2i)
LabelRole = Qt.ItemDataRole.UserRole + 2    #: a row's text without its mark
PathRole = Qt.ItemDataRole.UserRole + 3     #: the image file drawn as a row's icon
GOLD = QColor("#d8f5d0")
MARK_YES = QColor("#1a7f37")
MARK_NO = QColor("#cf222e")
FIGURE_SPACE = "\u2007"     # as wide as a digit: keeps the rank and score columns aligned


class ResultsView(QStackedWidget):
    """:attr:`caption_list` (i2t) or :attr:`image_grid` (t2i), whichever the last :meth:`fill` needed.

    Thumbnails are decoded in the background by :attr:`cache` (:attr:`small_cache`, or :attr:`big_cache` in
    presentation mode) and drawn as they arrive.
    """

    activated = Signal(QListWidgetItem)   # the row double-clicked or entered: query from it
    current_changed = Signal()            # the selected row changed (in either view)
    grid_scrolled = Signal()              # the image grid scrolled: other results are in view

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.presenting = False
        #: ``(view, row item) -> QPixmap | None``: a picture drawn instead of the row's thumbnail (Explain's maps)
        self.icon_override: Callable[[QListWidget, QListWidgetItem], QPixmap | None] = lambda view, it: None
        self.small_cache = ThumbnailCache(size=96, parent=self)
        self.big_cache = ThumbnailCache(size=224, parent=self, upscale=True)     # presentation mode: large thumbnails
        self.cache = self.small_cache
        for c in (self.small_cache, self.big_cache):
            c.ready.connect(self.thumbnail_ready)
        self.caption_list = QListWidget()
        self.caption_list.setIconSize(QSize(64, 64))
        self.caption_list.setWordWrap(True)
        self.caption_list.setSpacing(2)
        self.image_grid = QListWidget()
        self.image_grid.setViewMode(QListView.ViewMode.IconMode)
        self.image_grid.setResizeMode(QListView.ResizeMode.Adjust)
        self.image_grid.setMovement(QListView.Movement.Static)
        self.image_grid.setIconSize(QSize(96, 96))
        self.image_grid.setGridSize(QSize(118, 132))
        self.image_grid.setWordWrap(True)
        for view in (self.caption_list, self.image_grid):
            # a single click only selects (annotators click, then mark); a double-click (eventFilter) or
            # Enter (itemActivated) queries from the result
            view.itemActivated.connect(self.activated)
            view.viewport().installEventFilter(self)
            view.currentItemChanged.connect(self.current_changed)
        self.image_grid.verticalScrollBar().valueChanged.connect(self.grid_scrolled)
        self.image_grid.installEventFilter(self)
        self.addWidget(self.caption_list)
        self.addWidget(self.image_grid)

    def current_view(self) -> QListWidget:
        return self.currentWidget()

    # ------------------------------------------------------------------ filling
    def fill(self, ranking: Ranking, retriever: Any, marks: dict[int, bool]) -> QListWidget:
        """Show ``ranking`` (asked of ``retriever``) with the query's ``marks`` (item -> relevant), select its first
        row and focus its view; returns the view."""
        r, ds = retriever, retriever.dataset
        width = len(str(len(ranking.items)))
        # identity datasets (CUHK-PEDES) and labelled classes: each result's identity / class beside its score
        ids = r.result_identities(ranking)
        short = "id" if r.identity_word == "identity" else "class"
        tag = [f"   {short} {x}" if x is not None else "" for x in ids]
        signed = bool(len(ranking.scores) and float(ranking.scores.min()) < 0)
        if ranking.direction == "i2t":
            view = self.caption_list
            self.setCurrentWidget(view)
            view.clear()
            for rank, (item, score) in enumerate(zip(ranking.items.tolist(), ranking.scores.tolist()), 1):
                it = QListWidgetItem()
                it.setData(ItemRole, item)
                text = r.gallery_caption_text(item)
                it.setToolTip(text)
                it.setData(LabelRole, f"{rank_score(rank, score, width, signed)}{tag[rank - 1]}   {text}")
                if r.corpus is None and ds.image_paths is not None:
                    it.setData(PathRole, ds.image_paths[int(ds.caption_image[item])])
                self.style_item(it, ranking, item, marks.get(item))
                view.addItem(it)
        else:
            view = self.image_grid
            self.setCurrentWidget(view)
            self.fit_grid()
            view.clear()
            photos = getattr(r, "photos", None)    # a photo folder: each photo's file name under its score
            # a long file name keeps its start and its end (the camera's number, the extension) in view
            view.setTextElideMode(Qt.TextElideMode.ElideMiddle if photos is not None else Qt.TextElideMode.ElideRight)
            for rank, (item, score) in enumerate(zip(ranking.items.tolist(), ranking.scores.tolist()), 1):
                it = QListWidgetItem()
                it.setData(ItemRole, item)
                if photos is not None:
                    path = str(r.gallery_image_path(item))
                    it.setData(LabelRole, f"{rank_score(rank, score, width, signed)}\n{Path(path).name}")
                    it.setData(PathRole, path)
                    it.setToolTip(f"{path}\n(double-click to open it)")
                    self.style_item(it, ranking, item, marks.get(item))
                    view.addItem(it)
                    continue
                it.setData(LabelRole, rank_score(rank, score, width, signed) + tag[rank - 1])
                if ds.image_paths is not None:
                    it.setData(PathRole, ds.image_paths[item])
                caps = ds.captions_of(item)
                it.setToolTip("\n".join(ds.captions[c] for c in caps[:5]))
                self.style_item(it, ranking, item, marks.get(item))
                view.addItem(it)
        self.refresh_icons(view)
        if view.count():
            view.setCurrentRow(0)
        view.setFocus()
        return view

    def clear(self) -> None:
        """Empty both views."""
        self.caption_list.clear()
        self.image_grid.clear()

    def style_item(self, it: QListWidgetItem, ranking: Ranking, item: int, mark: bool | None) -> None:
        """A row's look: ✓ / ✗ and green / red for a mark (not while presenting: the audience sees the ranking,
        not the annotator's judgements), a green background and bold type for ground truth."""
        if self.presenting:
            mark = None
        label = it.data(LabelRole)
        prefix = {True: "✓ ", False: "✗ ", None: ""}[mark]
        it.setText(prefix + label)
        gold = ranking.is_gold(item)
        it.setBackground(QBrush(GOLD) if gold else QBrush())
        if mark is not None:
            it.setForeground(QBrush(MARK_YES if mark else MARK_NO))
        else:
            it.setForeground(QBrush())
        f = QFont(it.font())
        f.setBold(gold)
        it.setFont(f)

    # ------------------------------------------------------------------ pictures
    def refresh_icons(self, view: QListWidget) -> None:
        """Draw every row's icon again: its override, its thumbnail when decoded, else a placeholder."""
        size = view.iconSize()
        for row in range(view.count()):
            it = view.item(row)
            path = it.data(PathRole)
            if not path:
                continue
            pm = self.icon_override(view, it)
            if pm is None:
                pm = self.cache.get(path)
            it.setIcon(QIcon(square_icon(pm if pm is not None else placeholder(size.width()), size)))

    def thumbnail_ready(self, path: str) -> None:
        """The thumbnail of ``path`` was decoded: draw it on the rows that show it (an override stays)."""
        view = self.currentWidget()
        pm = self.cache.get(path)
        if pm is None:
            return
        size = view.iconSize()
        for row in range(view.count()):
            it = view.item(row)
            if it.data(PathRole) == path and self.icon_override(view, it) is None:
                it.setIcon(QIcon(square_icon(pm, size)))

    def restyle(self, ranking: Ranking, marks: dict[int, bool]) -> None:
        """Draw every row of the current view again (after presentation mode turned on or off)."""
        view = self.currentWidget()
        for row in range(view.count()):
            it = view.item(row)
            item = int(it.data(ItemRole))
            self.style_item(it, ranking, item, marks.get(item))

    def set_presenting(self, on: bool) -> None:
        """Large thumbnails and caption icons, wider grid cells (presentation mode), or back."""
        self.presenting = on
        self.cache = self.big_cache if on else self.small_cache
        self.caption_list.setIconSize(QSize(120, 120) if on else QSize(64, 64))

    # ------------------------------------------------------------------ sizes
    def fit_grid(self) -> None:
        """The image grid's columns fill its width; icons follow the cell size."""
        grid = self.image_grid
        scroll = grid.verticalScrollBar().sizeHint().width()
        avail = max(grid.width() - 2 * grid.frameWidth() - scroll - 4, 100)
        target = 250 if self.presenting else 124
        cols = max(1, avail // target)
        cell = avail // cols
        text_h = grid.fontMetrics().lineSpacing() * 2 + 8
        grid.setGridSize(QSize(cell, cell - 16 + text_h))
        icon = cell - 20
        if grid.iconSize().width() != icon:
            grid.setIconSize(QSize(icon, icon))
            # thumbnails are decoded at the cache's size; the icon is scaled to the cell
            if self.currentWidget() is grid:
                self.refresh_icons(grid)

    def rows_in_view(self, view: QListWidget, limit: int) -> list[int]:
        """Rows of ``view`` at least partly in view, at most ``limit`` (the first few when it is not laid out yet)."""
        if not view.count():
            return []
        view.doItemsLayout()
        area = view.viewport().rect()
        rows = [r for r in range(view.count()) if view.visualItemRect(view.item(r)).intersects(area)]
        if not rows:
            rows = list(range(min(view.count(), 12)))
        return rows[:limit]

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt API)
        """A double-click on a result activates it. Handled here, not by the view: the view only acts
        on a double-click that follows its own press on the same item, which a re-query between the
        two clicks (or a synthetic event) does not give; consuming it also keeps it to one query."""
        if obj is self.image_grid and event.type() == QEvent.Type.Resize:
            self.fit_grid()                    # the columns follow the grid's own width
            return False
        if event.type() == QEvent.Type.MouseButtonDblClick and event.button() == Qt.MouseButton.LeftButton:
            for view in (self.caption_list, self.image_grid):
                if obj is view.viewport():
                    it = view.itemAt(event.position().toPoint())
                    if it is not None:
                        view.setCurrentItem(it)
                        self.activated.emit(it)
                    return True
        return super().eventFilter(obj, event)


def rank_score(rank: int, score: float, width: int, signed: bool = False) -> str:
    """``#  7   0.412``: rank and score padded with figure spaces (as wide as a digit) so the columns line
    up row after row; ``signed`` (some score is negative) writes every score with + or - (equally wide)."""
    r = f"#{rank}".rjust(width + 1, FIGURE_SPACE)
    sc = f"{score:+.3f}".replace("-", "\u2212") if signed else f"{score:.3f}"
    sc = sc.rjust(7 if signed else 6, FIGURE_SPACE)
    return f"{r}  {sc}"


def square_icon(pm: QPixmap, size: QSize) -> QPixmap:
    """``pm`` scaled into and centred on a transparent ``size`` canvas, so every row's text starts at the same x."""
    out = QPixmap(size)
    out.fill(Qt.GlobalColor.transparent)
    scaled = pm.scaled(size, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)
    p = QPainter(out)
    p.drawPixmap((size.width() - scaled.width()) // 2, (size.height() - scaled.height()) // 2, scaled)
    p.end()
    return out
