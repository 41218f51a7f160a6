"""The Inspect panel's per-query list as a Qt item model over numpy columns (issue 34: 25,000 queries at once).

A COCO 5K evaluation has 25,000 caption queries; one ``QTableWidgetItem`` per cell (and a thumbnail icon per row)
cost seconds and hundreds of MB before the first paint. :class:`QueryRanksModel` keeps the columns as arrays
(query id, rank A, and comparing, rank B and the change B - A) and answers ``data()`` for the rows a view asks for:
a query's text and thumbnail are made when its row is first shown (and kept), sorting is one stable
``np.argsort`` of a column (ties keep the runs' query order), and filtering a boolean mask over the query texts
(made once, on the first filter). ``source_row(view_row)`` / ``view_row(source_row)`` map between the order on
screen and the runs' order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor, QIcon, QPixmap

__all__ = ["QueryRanksModel"]

_Index = QModelIndex | QPersistentModelIndex


class QueryRanksModel(QAbstractTableModel):
    """Columns: ``query`` (text, with a thumbnail where the query has an image; sorts by query id), ``rank`` (run
    A) and, comparing, ``rank B`` and ``change (B - A)`` (green: B ranks the ground truth higher). ``UserRole`` of
    any cell: its row in the runs' order (the position in ``ranks.npz``)."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._headers: list[str] = []
        self._labels: list[str] = []                  # the headers as shown (the sorted one says its order)
        self._cols: list[np.ndarray] = []             # one int64 array a column (column 0: query ids)
        self._order = np.zeros(0, np.int64)           # view row -> source row
        self._text_of: Callable[[int], str] = str
        self._image_of: Callable[[int], str | None] = lambda q: None
        self._thumb: Callable[[str], QPixmap | None] = lambda p: None
        self._placeholder: QPixmap | None = None
        self._texts: dict[int, str] = {}              # source row -> text, made on first display
        self._paths: dict[int, str | None] = {}       # source row -> image path, made on first display
        self._waiting: dict[str, set[int]] = {}       # image path -> source rows shown with a placeholder
        self._icons: dict[str, QIcon] = {}
        self._all_texts: np.ndarray | None = None     # every query's text, lowercased (made by the first filter)
        self._sort: tuple[int, Qt.SortOrder] = (1, Qt.SortOrder.DescendingOrder)
        self._filter = ""
        self.made_texts = 0                           # how many query texts were made (tests: only those shown)

    # ------------------------------------------------------------------ contents
    def set_rows(self, queries: np.ndarray, rank_a: np.ndarray, rank_b: np.ndarray | None = None,
                 delta: np.ndarray | None = None, *, headers: list[str],
                 text_of: Callable[[int], str] = str, image_of: Callable[[int], str | None] = lambda q: None,
                 thumb: Callable[[str], QPixmap | None] = lambda p: None, placeholder: QPixmap | None = None) -> None:
        """New contents: ``queries (n,)`` ids, ``rank_a (n,)`` and optionally ``rank_b``, ``delta`` (n,), one
        header per column; ``text_of(query id)``, ``image_of(query id) -> path | None`` and ``thumb(path) ->
        pixmap | None`` (None: not decoded yet; :meth:`thumbnail_ready` tells when it is) are called only for the
        rows a view shows. Sorted by rank A, worst first, and unfiltered."""
        self.beginResetModel()
        cols = [np.asarray(queries, np.int64), np.asarray(rank_a, np.int64)]
        if rank_b is not None:
            cols += [np.asarray(rank_b, np.int64), np.asarray(delta, np.int64)]
        self._cols, self._headers = cols, list(headers)
        self._text_of, self._image_of, self._thumb, self._placeholder = text_of, image_of, thumb, placeholder
        self._texts, self._paths, self._waiting, self._icons = {}, {}, {}, {}
        self._all_texts, self._filter = None, ""
        self.made_texts = 0
        self._sort = (1, Qt.SortOrder.DescendingOrder)
        self._order = self._sorted(np.arange(cols[0].size, dtype=np.int64))
        self._labels = list(self._headers)
        self.endResetModel()

    def clear(self) -> None:
        self.set_rows(np.zeros(0, np.int64), np.zeros(0, np.int64), headers=self._headers or ["query", "rank"])

    def source_row(self, view_row: int) -> int:
        """The runs' row (position in ranks.npz) shown at ``view_row``."""
        return int(self._order[view_row])

    def view_row(self, source_row: int) -> int | None:
        """Where the runs' row ``source_row`` is shown (None: filtered out)."""
        hit = np.flatnonzero(self._order == source_row)
        return int(hit[0]) if hit.size else None

    def column_values(self, column: int) -> np.ndarray:
        """The values of ``column`` in the order shown (ranks and changes as numbers; query ids for column 0)."""
        return self._cols[column][self._order]

    # ------------------------------------------------------------------ Qt model
    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else int(self._order.size)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else len(self._headers)

    def _text(self, src: int) -> str:
        t = self._texts.get(src)
        if t is None:
            t = self._texts[src] = self._text_of(int(self._cols[0][src]))
            self.made_texts += 1
        return t

    def _icon(self, src: int) -> QIcon | None:
        if src not in self._paths:
            self._paths[src] = self._image_of(int(self._cols[0][src]))
        path = self._paths[src]
        if not path:
            return None
        icon = self._icons.get(path)
        if icon is not None:
            return icon
        pm = self._thumb(path)            # asks the cache to decode it when it is not there yet
        if pm is None:
            self._waiting.setdefault(path, set()).add(src)
            return QIcon(self._placeholder) if self._placeholder is not None else None
        icon = self._icons[path] = QIcon(pm)
        return icon

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole):  # noqa: D401 (Qt API)
        if not index.isValid():
            return None
        src, col = int(self._order[index.row()]), index.column()
        if role == Qt.ItemDataRole.UserRole:
            return src
        if col == 0:
            if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
                return self._text(src)
            if role == Qt.ItemDataRole.DecorationRole:
                return self._icon(src)
            if role == Qt.ItemDataRole.TextAlignmentRole:
                return int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
            return None
        v = int(self._cols[col][src])
        if role == Qt.ItemDataRole.DisplayRole:
            return (f"{v:+d}" if v else "0") if col == 3 else str(v)
        if role == Qt.ItemDataRole.ForegroundRole and col == 3 and v:
            return QColor("#1a7f37" if v < 0 else "#cf222e")
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802 (Qt API)
                   role: int = Qt.ItemDataRole.DisplayRole):
        if orientation != Qt.Orientation.Horizontal or not 0 <= section < len(self._labels):
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return self._labels[section]
        return None

    def set_header_labels(self, labels: list[str]) -> None:
        """The headers as shown (the panel adds the sort order in words to the sorted one)."""
        self._labels = list(labels)
        if labels:
            self.headerDataChanged.emit(Qt.Orientation.Horizontal, 0, len(labels) - 1)

    # ------------------------------------------------------------------ sorting and filtering
    def _sorted(self, rows: np.ndarray) -> np.ndarray:
        column, order = self._sort
        key = self._cols[column][rows]
        if order == Qt.SortOrder.DescendingOrder:
            key = -key
        return rows[np.argsort(key, kind="stable")]

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:  # noqa: D401 (Qt API)
        """Sort the shown rows by ``column`` (one stable numpy argsort; equal values keep the runs' order)."""
        if not 0 <= column < len(self._cols):
            return
        self.layoutAboutToBeChanged.emit()
        self._sort = (column, Qt.SortOrder(order))
        self._order = self._sorted(np.sort(self._order))
        self.layoutChanged.emit()

    def set_filter(self, text: str) -> int:
        """Show only the queries whose text contains ``text`` (case-insensitive; ``""``: all); returns the rows
        shown. Every query's text is made once, on the first filter."""
        text = text.strip().lower()
        if text == self._filter:
            return self.rowCount()
        self.beginResetModel()
        self._filter = text
        n = self._cols[0].size if self._cols else 0
        if not text:
            rows = np.arange(n, dtype=np.int64)
        else:
            if self._all_texts is None:
                self._all_texts = np.array([self._text(i).lower() for i in range(n)], dtype=object)
            rows = np.flatnonzero(np.fromiter((text in t for t in self._all_texts), bool, n)).astype(np.int64)
        self._order = self._sorted(rows)
        self.endResetModel()
        return self.rowCount()

    # ------------------------------------------------------------------ thumbnails
    def thumbnail_ready(self, path: str) -> None:
        """A thumbnail was decoded: repaint the rows that showed its placeholder."""
        rows = self._waiting.pop(path, None)
        if not rows:
            return
        self._icons.pop(path, None)
        pos = np.flatnonzero(np.isin(self._order, np.fromiter(rows, np.int64, len(rows))))
        for r in pos:
            ix = self.index(int(r), 0)
            self.dataChanged.emit(ix, ix, [Qt.ItemDataRole.DecorationRole])
