"""Every panel runs alone (``python -m crossview.gui.panels.X``), off screen, and exits cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    from crossview.data.demo import write_demo
    from crossview.engine.run import train

    root = tmp_path_factory.mktemp("alone")
    data = write_demo(root / "demo", n_scenes=100, n_web=0, seed=2)
    it = train("cca", str(data), run_dir=root / "run", params={"n_components": 16},
               image_encoder="mobilenet_v2", text_encoder="tfidf", device="cpu")
    for _ in it:
        pass
    return root / "run"


@pytest.mark.parametrize("panel,needs", [("data_panel", "demo"), ("train_panel", "demo"),
                                         ("query_panel", "run"), ("inspect_panel", "run")])
def test_panel_runs_alone(panel: str, needs: str, trained_run: Path, demo_dataset) -> None:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", CROSSVIEW_EXIT_AFTER_MS="1500")
    args = [sys.executable, "-m", f"crossview.gui.panels.{panel}"] + ([str(trained_run)] if needs == "run" else [])
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Fatal" not in proc.stderr
