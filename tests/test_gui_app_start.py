"""Issue 34, item 2: the main window shows before torch, torchvision and scikit-learn are imported (seconds on the
2-core machine); they are imported in the background once it is up, without freezing it, and then the status bar
and the Train panel list the devices. A training started while they load waits for them and runs.

Each check runs the app in its own process: in this one, other tests have imported torch long ago."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

pytestmark = pytest.mark.gui

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "sklearn")

CHILD = r"""
import json, os, sys
from PySide6.QtCore import QEvent, QEventLoop, QObject, QTimer
from crossview.gui.app import ensure_app

HEAVY = ("torch", "torchvision", "sklearn")
app = ensure_app()
from crossview.gui.main_window import MainWindow
from crossview.gui.workers import engine_loader
from _latency import LatencyProbe

out = {}


class OnShow(QObject):
    def eventFilter(self, obj, ev):
        if ev.type() == QEvent.Type.Show and "at_show" not in out:
            out["at_show"] = [m for m in HEAVY if m in sys.modules]
        return False


def wait(signal, ms=240_000):
    loop = QEventLoop()
    signal.connect(loop.quit)
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


win = MainWindow()
out["loader_started_before_show"] = engine_loader().is_running() or engine_loader().result is not None
on_show = OnShow()
win.installEventFilter(on_show)
probe = LatencyProbe().start()
win.show()
if sys.argv[1] == "train":     # Start pressed at once, while the engine is still being imported
    from _engine_helpers import make_toy_dataset
    tp = win.train_panel
    tp.set_dataset(make_toy_dataset(n_images=60, caps_per_image=2))
    tp.select_method("cca")
    tp.set_param("n_components", 4)
    tp.device_combo.setCurrentIndex(tp.device_combo.findData("cpu"))
    finished = []
    tp.run_finished.connect(finished.append)
    QTimer.singleShot(0, tp.start)
    wait(tp.run_finished)
    out["run_finished"] = bool(finished)
    out["error"] = tp.last_error
else:
    if not win.engine_ready:
        wait(win.engine_loaded)
    app.processEvents()
    out["gap_ms"] = probe.stop()
    out["after"] = [m for m in HEAVY if m in sys.modules]
    out["device_text"] = win.status_device.text()
    out["devices"] = [win.train_panel.device_combo.itemData(i) for i in range(win.train_panel.device_combo.count())]
    from crossview.core.devices import list_devices
    out["expected_devices"] = ["auto"] + [d.name for d in list_devices()]
win.close()
print("RESULT " + json.dumps(out))
"""


def _run_child(mode: str, tmp_path: Path) -> dict:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "CROSSVIEW_HOME": str(tmp_path / "home"),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_the_window_shows_before_the_engine_is_imported_then_loads_it_in_the_background(tmp_path: Path) -> None:
    got = _run_child("show", tmp_path)
    assert got["at_show"] == [], f"imported before the window was shown: {got['at_show']}"
    assert not got["loader_started_before_show"]
    assert got["after"] == list(HEAVY)                      # imported once the window was up
    assert got["device_text"].startswith("Device: ") and got["device_text"] != "Device: ..."
    assert got["devices"] == got["expected_devices"]        # the Train panel lists every device torch sees
    # a freeze would be seconds (the import on the GUI thread: 4-7 s); the goal (< 0.2 s) is measured by
    # bench/query_cache.py --app on a quiet machine, not asserted on a loaded one
    assert got["gap_ms"] < 1500, f"the GUI froze for {got['gap_ms']:.0f} ms while the engine was imported"


def test_a_training_started_while_the_engine_loads_waits_for_it_and_runs(tmp_path: Path) -> None:
    got = _run_child("train", tmp_path)
    assert got["error"] is None and got["run_finished"], got
