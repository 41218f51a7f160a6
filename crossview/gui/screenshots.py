"""Render every panel of the app, on a dataset with a trained run, to PNG files (``crossview screenshot``).

Works without a screen (Qt's offscreen platform). The run is trained first with the engine when none is
given (CCA on the demo takes seconds once the demo's features are cached).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _wait(signal: Any, timeout_ms: int, what: str, trigger: Callable[[], Any] | None = None) -> list[Any]:
    """Run the event loop until ``signal`` fires (its arguments) or raise after ``timeout_ms``; ``trigger``
    is called once the signal is connected (for a signal that may fire at once, inside the call)."""
    from PySide6.QtCore import QEventLoop, QTimer

    from crossview.core.errors import CrossViewError

    loop = QEventLoop()
    got: list[Any] = []

    def done(*args: Any) -> None:
        got.append(args)
        loop.quit()

    signal.connect(done)
    if trigger is not None:
        trigger()
    if not got:
        timer = QTimer(singleShot=True, interval=timeout_ms)
        timer.timeout.connect(loop.quit)
        timer.start()
        loop.exec()
    signal.disconnect(done)
    if not got:
        raise CrossViewError(f"timed out waiting for {what}")
    return list(got[0])


def _settle(app: Any, ms: int = 300) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()
    app.processEvents()


def _shoot_dialog(app: Any, trigger: Callable[[], Any], path: Path, timeout_ms: int = 60_000) -> Path:
    """Call ``trigger`` (which opens a dialog, blocking as ``exec()`` does or not as ``open()`` does), save the
    dialog that appears as ``path`` and close it (rejected: nothing it offers is done)."""
    from PySide6.QtCore import QElapsedTimer, QTimer
    from PySide6.QtWidgets import QApplication, QDialog

    from crossview.core.errors import CrossViewError

    before = {id(w) for w in QApplication.topLevelWidgets() if isinstance(w, QDialog) and w.isVisible()}
    state: dict[str, Any] = {"saved": False}
    clock = QElapsedTimer()
    clock.start()

    def poll() -> None:
        shown = [w for w in QApplication.topLevelWidgets()
                 if isinstance(w, QDialog) and w.isVisible() and id(w) not in before]
        if shown and not state.get("seen"):
            state["seen"] = clock.elapsed()          # let it lay out and paint before grabbing
        if shown and clock.elapsed() - state["seen"] >= 300:
            dialog = shown[-1]
            state["saved"] = dialog.grab().save(str(path))
            dialog.reject()
            return
        if clock.elapsed() < timeout_ms:
            QTimer.singleShot(50, poll)
        else:
            state["timeout"] = True

    QTimer.singleShot(50, poll)
    trigger()                                    # returns once the dialog closes (exec) or at once (open)
    returned = clock.elapsed()
    while not state["saved"] and not state.get("timeout"):
        if not state.get("seen") and clock.elapsed() - returned > 2000:
            raise CrossViewError(f"{path.name}: nothing opened a dialog")   # the trigger had nothing to ask
        app.processEvents()
        QApplication.instance().thread().msleep(20)
    if not state["saved"]:
        raise CrossViewError(f"{path}: the dialog did not appear or could not be saved")
    return path


def _show_run_settings(panel: Any, run: Path) -> None:
    """The Train form shows the method and parameters that trained ``run`` (not the panel's first method)."""
    import json

    try:
        cfg = json.loads((run / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if panel.method_combo.findData(cfg.get("method")) < 0:
        return
    panel.select_method(cfg["method"])
    for name, value in (cfg.get("params") or {}).items():
        if name in panel._getters:
            panel.set_param(name, value)


def render_screenshots(out: str | Path, data: str = "demo", run: str | None = None, compare: str | None = None,
                       method: str = "cca", sentence: str | None = None,
                       size: tuple[int, int] = (1440, 900), log: Callable[[str], None] = print,
                       explain: bool = False, dialogs: bool = False) -> list[Path]:
    """Write ``data.png``, ``train.png``, ``query_i2t.png``, ``query_t2i.png``, ``inspect.png`` and
    ``presentation.png`` into ``out``; returns their paths. ``sentence``: the text query (default: a demo
    sentence on the demo, else a caption of an image of the run's evaluation split, the one after the image
    queried by image). ``explain``: also ``query_i2t_explain.png``, ``query_t2i_explain.png``,
    ``presentation_explain.png`` (t2i) and ``presentation_i2t_explain.png``: the Query panel with Explain on
    (region maps over the images, the caption's words shaded). ``dialogs``: also the app's own dialogs
    (``dialog_search.png``, ``dialog_rename.png``, ``dialog_delete.png``, ``dialog_error.png``,
    ``dialog_about.png``), each opened the way a user opens it and closed without acting."""
    from crossview.core.errors import CrossViewError
    from crossview.gui.app import ensure_app, has_display, train_quick_run

    if not has_display():
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if run is None:
        log(f"training {method} on {data} for the screenshots ...")
        run = str(train_quick_run(data, method, None, log))
    app = ensure_app()
    from crossview.gui.main_window import MainWindow

    win = MainWindow()
    win.resize(*size)
    win.show()
    written: list[Path] = []
    if not win.engine_ready:     # the window imports the engine in the background: the devices are known after it
        _wait(win.engine_loaded, 600_000, "the engine's modules")

    def explained(qp: Any, name: str) -> None:
        """Explain on, wait until the query's explanation is shown, shoot, Explain off."""
        _wait(qp.explained, 600_000, f"the explanation for {name}", lambda: qp.set_explain(True))
        shot(name)
        qp.set_explain(False)

    def shot(name: str) -> None:
        _settle(app)
        path = out / f"{name}.png"
        if not win.grab().save(str(path)):
            raise CrossViewError(f"{path}: could not write the screenshot")
        written.append(path)
        log(f"  wrote {path}")

    try:
        task = win.open_dataset(data)
        _wait(task.finished, 600_000, f"dataset {data}")
        if win.dataset is None:
            raise CrossViewError(f"could not open {data}: {getattr(win, 'last_error', '')}")
        ds = win.dataset
        first = int(ds.splits["test"][0]) if "test" in ds.splits else 0
        win.data_panel.select_image(first)
        win.tabs.setCurrentWidget(win.data_panel)
        shot("data")

        task = win.open_run(run, show="query")
        _wait(task.finished, 600_000, f"run {run}")
        if win.run is None:
            raise CrossViewError(f"could not open run {run}: {getattr(win, 'last_error', '')}")
        win.tabs.setCurrentWidget(win.train_panel)
        win.train_panel.refresh_runs()
        win.train_panel.select_run(run)
        win.train_panel.show_history(run)
        _show_run_settings(win.train_panel, Path(run))
        shot("train")
        if dialogs:
            def dialog_shot(name: str, trigger: Callable[[], Any]) -> None:
                written.append(_shoot_dialog(app, trigger, out / f"dialog_{name}.png"))
                log(f"  wrote {written[-1]}")

            tp = win.train_panel
            dialog_shot("search", tp.search_view.open_search_dialog)
            if tp.runs.selected() is not None:
                dialog_shot("rename", tp.runs.rename_selected)
                dialog_shot("delete", tp.runs.delete_selected)
            else:
                log(f"  (no rename / delete dialogs: {run} is not in the runs folder {tp.runs_root})")
            missing = out / "no-such-dataset.json"
            dialog_shot("error", lambda: win.open_dataset(str(missing)))
            dialog_shot("about", win._about)

        qp = win.query_panel
        win.tabs.setCurrentWidget(qp)
        # a query from the run's evaluation split (the gallery the Query panel opened on)
        gallery = qp.retriever.gallery_images if qp.retriever is not None else []
        qp.query_image(int(gallery[0]) if len(gallery) else first)
        _wait(qp.answered, 60_000, "the image query")
        shot("query_i2t")
        if explain:
            explained(qp, "query_i2t_explain")
        if sentence is None:
            if data == "demo" or len(gallery) < 2:
                sentence = "a red circle above a blue square"
            else:
                rows = np.flatnonzero(np.asarray(ds.caption_image) == int(gallery[1]))
                sentence = str(ds.captions[int(rows[0])]) if len(rows) else "a dog runs on the grass"
        qp.sentence.setText(sentence)
        qp.query_text(sentence)
        _wait(qp.answered, 60_000, "the sentence query")
        shot("query_t2i")
        if explain:
            explained(qp, "query_t2i_explain")

        if compare:
            from crossview.engine.results import load_run_results
            win.inspect_panel.set_runs([*win.inspect_panel.runs.values(), load_run_results(compare)])
            win.inspect_panel.set_compare(load_run_results(compare))
        win.tabs.setCurrentWidget(win.inspect_panel)
        shot("inspect")

        win.set_presentation(True)
        if os.environ.get("QT_QPA_PLATFORM") == "offscreen":   # the offscreen "screen" is only 800 x 800
            from PySide6.QtWidgets import QApplication
            win.showNormal()
            QApplication.processEvents()       # let the full-screen geometry land first, then override it
            win.setGeometry(0, 0, *size)
            QApplication.processEvents()
        qp.query_text(sentence)
        _wait(qp.answered, 60_000, "the presentation query")
        shot("presentation")
        if explain:
            explained(qp, "presentation_explain")
            qp.set_explain(True)
            _wait(qp.explained, 600_000, "the explanation of the presentation image query",
                  lambda: qp.query_image(int(gallery[0]) if len(gallery) else first))
            shot("presentation_i2t_explain")
            qp.set_explain(False)
        win.set_presentation(False)
    finally:
        win.close()
    return written


if __name__ == "__main__":  # pragma: no cover
    render_screenshots(sys.argv[1] if len(sys.argv) > 1 else "screenshots")
