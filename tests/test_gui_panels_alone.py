"""Every panel runs alone (``python -m crossview.gui.panels.X``), off screen, and exits cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def test_screenshot_command_writes_every_panel(qtbot, trained_run: Path, tmp_path: Path) -> None:
    from crossview.cli import main

    import json
    data = json.loads((trained_run / "config.json").read_text())["data"]
    assert main(["screenshot", "--out", str(tmp_path / "shots"), "--data", data, "--run", str(trained_run),
                 "--width", "1200", "--height", "800"]) == 0
    names = sorted(p.name for p in (tmp_path / "shots").glob("*.png"))
    assert names == ["data.png", "inspect.png", "presentation.png", "query_i2t.png", "query_t2i.png", "train.png"]
    from PIL import Image
    for p in (tmp_path / "shots").glob("*.png"):
        im = Image.open(p)
        assert im.size == (1200, 800)
        assert len(np.unique(np.asarray(im.convert("L").resize((64, 40))))) > 20, f"{p.name} looks blank"


@pytest.mark.parametrize("panel,needs", [("data_panel", "demo"), ("train_panel", "demo"),
                                         ("query_panel", "run"), ("inspect_panel", "run")])
def test_panel_runs_alone(panel: str, needs: str, trained_run: Path, demo_dataset) -> None:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", CROSSVIEW_EXIT_AFTER_MS="1500")
    args = [sys.executable, "-m", f"crossview.gui.panels.{panel}"] + ([str(trained_run)] if needs == "run" else [])
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Fatal" not in proc.stderr
