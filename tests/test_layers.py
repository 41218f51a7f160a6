"""The layer contract of ARCHITECTURE.md, as import-linter contracts in pyproject.toml.

``test_contracts_hold`` lints the package; the planted tests copy the package, add one forbidden import
(lazy, inside a function, where it is easiest to miss) and check that the right contract breaks, so the
contracts cannot pass by checking nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import crossview

REPO = Path(crossview.__file__).resolve().parent.parent

LAYERS = "Imports go only downward (ARCHITECTURE.md, Layers)"
NO_QT = "Nothing outside crossview.gui imports Qt (ARCHITECTURE.md, the one rule)"
GUI_ACYCLIC = "No import cycles among the modules of crossview.gui (main window, panels, app)"

# import-linter's documented Python entry point (what the `lint-imports` command calls); 0 = all kept.
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """Run import-linter on the package under ``root`` with ``root/pyproject.toml`` (a fresh process, so the
    ``crossview`` it analyses is the one under ``root``)."""
    env = dict(os.environ, PYTHONPATH=str(root), COLUMNS="200")
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def _status(out: str, contract: str) -> str:
    """``KEPT`` or ``BROKEN``: the status import-linter printed for ``contract``."""
    for line in out.splitlines():
        if line.startswith(contract + " "):
            return line.rsplit(" ", 1)[-1]
    raise AssertionError(f"contract {contract!r} not in the report:\n{out}")


def test_contracts_hold() -> None:
    out = _lint(REPO)
    report = out.stdout + out.stderr
    assert out.returncode == 0, report
    for contract in (LAYERS, NO_QT, GUI_ACYCLIC):
        assert _status(report, contract) == "KEPT", report


def _copy_package(dst: Path) -> Path:
    shutil.copytree(REPO / "crossview", dst / "crossview", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", dst / "pyproject.toml")
    return dst


def _plant(root: Path, module: str, import_line: str) -> None:
    """Append a function holding ``import_line`` to ``module`` (a file under ``root``; created if new)."""
    path = root / (module.replace(".", "/") + ".py")
    text = path.read_text(encoding="utf-8") if path.exists() else '"""Planted by tests/test_layers.py."""\n'
    path.write_text(text + f"\n\ndef _planted_by_test_layers():\n    {import_line}\n", encoding="utf-8")


@pytest.mark.parametrize(("module", "import_line", "broken", "named"), [
    # methods -> engine: what methods did with engine.events / engine.io before crossview.core
    ("crossview.methods.cca", "from crossview.engine.run import train", LAYERS,
     "crossview.methods.cca -> crossview.engine.run"),
    # features -> methods: what CTR topics did with fit_cca before crossview.core.linalg
    ("crossview.features.topics", "from crossview.methods.cca import CCA", LAYERS,
     "crossview.features.topics -> crossview.methods.cca"),
    # eval -> methods: what eval/runs.py did with the method cards
    ("crossview.eval.metrics", "from crossview.methods import cards", LAYERS,
     "crossview.eval.metrics -> crossview.methods"),
    # core -> data
    ("crossview.core.io", "from crossview.data.dataset import PairedDataset", LAYERS,
     "crossview.core.io -> crossview.data.dataset"),
    # siblings of one level stay independent
    ("crossview.features.cache", "from crossview.eval.metrics import evaluate", LAYERS,
     "crossview.features.cache -> crossview.eval.metrics"),
    # gui never runs a sub-command
    ("crossview.gui.main_window", "from crossview.commands import train", LAYERS,
     "crossview.gui.main_window -> crossview.commands"),
    # a new top-level module must be given a layer (the contract is exhaustive)
    ("crossview.helpers", "import json", LAYERS, "crossview.helpers"),
    # Qt outside crossview.gui
    ("crossview.core.events", "from PySide6.QtCore import QObject", NO_QT, "crossview.core.events -> PySide6"),
    ("crossview.engine.run", "import pyqtgraph", NO_QT, "crossview.engine.run -> pyqtgraph"),
    # the GUI cycle this contract was written for: app (was launch.py) -> main_window -> panels -> app
    ("crossview.gui.app", "from crossview.gui.main_window import MainWindow", GUI_ACYCLIC, ".app -> .main_window"),
])
def test_a_planted_forbidden_import_breaks_its_contract(tmp_path: Path, module: str, import_line: str,
                                                        broken: str, named: str) -> None:
    root = _copy_package(tmp_path)
    _plant(root, module, import_line)
    out = _lint(root)
    report = out.stdout + out.stderr
    assert out.returncode == 1, report
    assert _status(report, broken) == "BROKEN", report
    assert named in report, report
    for other in {LAYERS, NO_QT, GUI_ACYCLIC} - {broken}:
        assert _status(report, other) == "KEPT", report
