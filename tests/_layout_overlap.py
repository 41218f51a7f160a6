"""Widgets a layout placed on top of each other: the visible sibling widgets of one parent, managed by that parent's
layout (or a layout nested in it), whose rectangles intersect by more than a couple of pixels. Scroll areas'
contents are not walked (they scroll on purpose); free-floating overlays (not in a layout) are not compared."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractScrollArea, QLayout, QWidget


def _in_layout(layout: QLayout, widget: QWidget) -> bool:
    for i in range(layout.count()):
        item = layout.itemAt(i)
        if item.widget() is widget or (item.layout() is not None and _in_layout(item.layout(), widget)):
            return True
    return False


def overlapping_widgets(root: QWidget, slack: int = 2) -> list[str]:
    """One line per pair of overlapping laid-out siblings under ``root`` (empty: none)."""
    found: list[str] = []

    def walk(w: QWidget) -> None:
        kids = [c for c in w.findChildren(QWidget, options=Qt.FindChildOption.FindDirectChildrenOnly)
                if c.isVisible() and not c.isWindow()]
        layout = w.layout()
        managed = [c for c in kids if layout is not None and _in_layout(layout, c)]
        for i, a in enumerate(managed):
            for b in managed[i + 1:]:
                r = a.geometry().intersected(b.geometry())
                if r.width() > slack and r.height() > slack:
                    found.append(f"{type(w).__name__}: {type(a).__name__} {a.geometry().getRect()} overlaps "
                                 f"{type(b).__name__} {b.geometry().getRect()}")
        for c in kids:
            if not isinstance(c, QAbstractScrollArea):
                walk(c)

    walk(root)
    return found
