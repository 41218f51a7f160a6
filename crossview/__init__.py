"""CrossView: cross-modal image <-> text retrieval (desktop app, command line and library).

The core packages (``data``, ``features``, ``nn``, ``methods``, ``engine``, ``eval``, ``index``)
never import Qt; only ``crossview.gui`` does.
"""

__version__ = "0.1.0"

from crossview.core.errors import CrossViewError  # noqa: E402

__all__ = ["CrossViewError", "__version__"]
