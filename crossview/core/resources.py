"""Where the repository's data files are: ``resources/`` (stylesheet, icons) and ``models/`` (method cards).

CrossView is installed in editable mode from its repository (the README's set-up command), so these
folders sit beside the package. ``CROSSVIEW_RESOURCES`` / ``CROSSVIEW_MODELS`` point elsewhere if needed.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]   # crossview/core/resources.py -> the repository


def resources_dir() -> Path:
    """The folder of the stylesheet, icons and fonts (``CROSSVIEW_RESOURCES`` overrides it)."""
    return Path(os.environ.get("CROSSVIEW_RESOURCES", REPO_ROOT / "resources"))


def models_dir() -> Path:
    """The folder of the method cards (``CROSSVIEW_MODELS`` overrides it)."""
    return Path(os.environ.get("CROSSVIEW_MODELS", REPO_ROOT / "models"))
