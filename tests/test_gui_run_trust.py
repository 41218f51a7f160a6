"""The app opening a run folder someone sent: a planted checkpoint never runs, a damaged config.json is
one clear message (issue 10). Drives MainWindow.open_run and waits on its task's signals."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")
import torch  # noqa: E402

import _engine_helpers as H  # noqa: E402
from crossview.core.events import Finished  # noqa: E402
from crossview.engine.run import train  # noqa: E402
from crossview.gui.main_window import MainWindow  # noqa: E402

pytestmark = pytest.mark.gui


_Payload = H.PicklePayload


@pytest.fixture
def run_dir(tmp_path) -> Path:
    ds = H.make_toy_dataset()
    run = tmp_path / "run"
    events = list(train("cca", ds, run_dir=run, features=H.toy_features(ds), device="cpu",
                        params={"n_components": 4}))
    assert isinstance(events[-1], Finished)
    return run



def _open_and_fail(qtbot, win: MainWindow, run: Path) -> str:
    task = win.open_run(str(run), show="query")
    with qtbot.waitSignal(task.failed, timeout=60_000) as sig:
        pass
    qtbot.waitUntil(lambda: win.last_error is not None, timeout=10_000)
    message, details = sig.args
    from PySide6.QtWidgets import QMessageBox
    boxes = [b for b in win.findChildren(QMessageBox) if b.isVisible()]
    assert [b.text() for b in boxes] == [message]          # the user sees that one line
    for b in boxes:
        b.close()
    assert details == ""            # an input error, not a bug with a traceback
    assert win.run is None
    return message


def test_the_app_does_not_run_a_planted_checkpoint(qtbot, window, run_dir, tmp_path):
    marker = tmp_path / "PWNED"
    buf = io.BytesIO()
    torch.save({"format": 2, "method_state": _Payload(marker)}, buf)
    (run_dir / "checkpoint.pt").write_bytes(buf.getvalue())
    message = _open_and_fail(qtbot, window, run_dir)
    assert "checkpoint.pt" in message and "older CrossView" in message and "\n" not in message
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"[]", json.dumps({"method": ["cca"]}).encode(), b"\xff\xfe"])
def test_the_app_says_one_line_for_a_damaged_config(qtbot, window, run_dir, content):
    (run_dir / "config.json").write_bytes(content)
    message = _open_and_fail(qtbot, window, run_dir)
    assert "config.json" in message and "\n" not in message
