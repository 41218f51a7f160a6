"""The app's look: one stylesheet (resources/crossview.qss) and a readable default font."""

from __future__ import annotations

from crossview.core.resources import resources_dir


def apply_style(app) -> None:
    from PySide6.QtGui import QFont

    app.setStyle("Fusion")
    font = QFont(app.font())
    if font.pointSizeF() < 10:
        font.setPointSizeF(10)
    app.setFont(font)
    qss = resources_dir() / "crossview.qss"
    if qss.is_file():
        app.setStyleSheet(qss.read_text(encoding="utf-8"))
