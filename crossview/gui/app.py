"""The QApplication and the display check, and single panels opened alone (their ``__main__`` previews).

It imports no window and no panel, so the main window, the panels, :mod:`crossview.gui.launch` and
:mod:`crossview.gui.screenshots` can all import it without an import cycle
(``tests/test_layers.py`` checks that ``crossview.gui`` has none).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

NO_DISPLAY = """crossview: no display found (DISPLAY and WAYLAND_DISPLAY are not set), so the window cannot open.
  - On a desktop, start it from a graphical session (or with ssh -X).
  - Without a screen, set QT_QPA_PLATFORM=offscreen: the app then runs and renders off screen
    (what the tests and `crossview screenshot` use), but shows nothing.
  - Everything the app does is also on the command line: try `crossview --help` or
    `crossview data info demo`."""


def has_display() -> bool:
    """True when Qt can open a window here (or a platform plugin was chosen explicitly)."""
    if os.environ.get("QT_QPA_PLATFORM"):
        return True
    if sys.platform in ("win32", "darwin"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def ensure_app() -> Any:
    """The QApplication (created once), with CrossView's name and look."""
    from PySide6.QtWidgets import QApplication

    from crossview.gui.style import apply_style
    from crossview.gui.workers import hold_collection

    app = QApplication.instance()
    if app is None:
        app = QApplication(sys.argv[:1])
        app.setApplicationName("CrossView")
        app.setOrganizationName("CrossView")
        apply_style(app)
        hold_collection(app)      # cyclic garbage collected on the GUI thread only, for the application's life
    return app


def exec_app(app: Any) -> int:
    """Run the event loop; ``CROSSVIEW_EXIT_AFTER_MS`` quits after that long (smoke tests of the panels)."""
    ms = os.environ.get("CROSSVIEW_EXIT_AFTER_MS")
    if ms:
        from PySide6.QtCore import QTimer
        QTimer.singleShot(int(ms), app.quit)
    return app.exec()


def demo_run(method: str = "cca") -> str:
    """The newest finished run on the demo in the user's runs folder, or a new one trained now."""
    from crossview.core.errors import CrossViewError
    from crossview.engine.run_folder import read_summary
    from crossview.engine.session import list_runs
    for run in list_runs():
        try:     # unfinished, or a damaged summary (a list, a pipe in its place): not a run to open
            s = read_summary(run)
        except CrossViewError:
            continue
        if s.get("dataset") == "demo" and s.get("status", "finished") == "finished":
            return str(run)
    print(f"training {method} on the demo first ...", file=sys.stderr)
    return str(train_quick_run("demo", method, None, lambda m: print(m, file=sys.stderr)))


def run_panel(panel_cls: type, dataset: str | None = "demo") -> int:
    """Opens one panel alone in a window, on ``dataset`` (``python -m crossview.gui.panels.X``)."""
    if not has_display():
        print(NO_DISPLAY, file=sys.stderr)
        return 1
    app = ensure_app()
    from crossview.data import load_dataset

    panel = panel_cls()
    panel.setWindowTitle(f"CrossView - {panel_cls.__name__}")
    panel.resize(1200, 800)
    if dataset and hasattr(panel, "set_dataset"):
        panel.set_dataset(load_dataset(dataset))
    panel.show()
    return exec_app(app)


def train_quick_run(data: str, method: str, run_dir: Path | None,
                    log: Callable[[str], None] = print) -> Path:
    """Train ``method`` on ``data`` with the engine (default parameters) and return the run folder."""
    from crossview.core.events import Finished, Progress
    from crossview.engine.run import train

    it = train(method, data, run_dir=run_dir, scoring="default")     # the method's default scoring, as the CLI's
    last = -1
    for ev in it:
        if isinstance(ev, Progress) and ev.total:
            pct = int(100 * ev.fraction)
            if pct // 10 != last:
                last = pct // 10
                log(f"  {ev.message} {pct}%")
        elif isinstance(ev, Finished):
            s = ev.summary
            log(f"  trained {method}: i2t R@1 {s['i2t']['R@1']:.1f}, t2i R@1 {s['t2i']['R@1']:.1f}, "
                f"rsum {s['rsum']:.1f}")
    return Path(it.run_dir)
