"""``crossview gui``: open the main window on a dataset and run the event loop."""

from __future__ import annotations

import sys

from crossview.gui.app import NO_DISPLAY, ensure_app, has_display


def launch(dataset: str | None = "demo") -> int:
    """Opens the main window on ``dataset`` (a path or 'demo') and runs the event loop."""
    if not has_display():
        print(NO_DISPLAY, file=sys.stderr)
        return 1
    app = ensure_app()
    from crossview.gui.main_window import MainWindow   # after the QApplication exists

    win = MainWindow()
    win.show()
    if dataset:
        win.open_dataset(dataset)
    return app.exec()
