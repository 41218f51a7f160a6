"""Where CrossView keeps its files: one typed settings object, defaults in one place.

Environment variables override the defaults (napari's settings model, STYLE.md 6):

- ``CROSSVIEW_HOME``: the user data folder (runs, annotations, recent lists); default
  ``$XDG_DATA_HOME/crossview`` or ``~/.local/share/crossview``.
- ``CROSSVIEW_CACHE_DIR``: caches that can be rebuilt (the rendered demo, features); default
  ``$XDG_CACHE_HOME/crossview`` or ``~/.cache/crossview``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1


def _xdg(var: str, fallback: str) -> Path:
    base = os.environ.get(var)
    return Path(base).expanduser() if base else Path.home() / fallback


@dataclass(frozen=True)
class Settings:
    """Resolved paths and defaults. Build with :func:`get_settings` to apply the environment."""

    home: Path = field(default_factory=lambda: _xdg("XDG_DATA_HOME", ".local/share") / "crossview")
    cache_dir: Path = field(default_factory=lambda: _xdg("XDG_CACHE_HOME", ".cache") / "crossview")
    demo_seed: int = 0
    schema_version: int = SCHEMA_VERSION

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def demo_dir(self) -> Path:
        return self.cache_dir / "demo"

    @property
    def features_dir(self) -> Path:
        return self.cache_dir / "features"


def get_settings() -> Settings:
    """The settings with environment overrides applied (read fresh each call, so tests can patch env)."""
    kwargs = {}
    if os.environ.get("CROSSVIEW_HOME"):
        kwargs["home"] = Path(os.environ["CROSSVIEW_HOME"]).expanduser()
    if os.environ.get("CROSSVIEW_CACHE_DIR"):
        kwargs["cache_dir"] = Path(os.environ["CROSSVIEW_CACHE_DIR"]).expanduser()
    if os.environ.get("CROSSVIEW_DEMO_SEED"):
        kwargs["demo_seed"] = int(os.environ["CROSSVIEW_DEMO_SEED"])
    return Settings(**kwargs)
