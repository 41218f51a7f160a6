"""The one rule of ARCHITECTURE.md: nothing outside crossview/gui imports Qt."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import crossview

PACKAGE_DIR = Path(crossview.__file__).resolve().parent

BLOCK_QT_AND_IMPORT_CORE = textwrap.dedent("""
    import importlib, importlib.abc, pkgutil, sys

    BLOCKED = ("PySide6", "PySide2", "PyQt5", "PyQt6", "shiboken6", "pyqtgraph", "qtpy")

    class BlockQt(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"core module imported Qt: {name}")
            return None

    sys.meta_path.insert(0, BlockQt())
    import crossview
    names = sorted(m.name for m in pkgutil.walk_packages(crossview.__path__, "crossview.")
                   if not m.name.startswith("crossview.gui"))
    for name in names:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print(len(names))
""")


def test_core_modules_import_without_qt() -> None:
    out = subprocess.run([sys.executable, "-c", BLOCK_QT_AND_IMPORT_CORE], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    expected = [p for p in PACKAGE_DIR.rglob("*.py") if "gui" not in p.relative_to(PACKAGE_DIR).parts]
    assert int(out.stdout.strip().splitlines()[-1]) >= len(expected) - 1  # every core module was imported


def test_no_qt_import_statements_outside_gui() -> None:
    offenders = []
    for p in PACKAGE_DIR.rglob("*.py"):
        if "gui" in p.relative_to(PACKAGE_DIR).parts:
            continue
        for line in p.read_text(encoding="utf-8").splitlines():
            s = line.strip()
            if s.startswith(("import ", "from ")) and any(q in s for q in ("PySide6", "PyQt", "pyqtgraph")):
                offenders.append(f"{p.relative_to(PACKAGE_DIR)}: {s}")
    assert not offenders, offenders
