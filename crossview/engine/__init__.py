"""Runs: the training loop, checkpoints and cancellation (events, io and devices live in crossview.core).

- :mod:`crossview.engine.run`: :func:`train` (a generator) and :func:`resume`.
- :mod:`crossview.engine.results`: a finished run folder's metrics, ranks and its card's paper numbers.

Submodules are imported lazily so that ``import crossview.engine`` never imports torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["train", "resume", "RunConfig"]


def __getattr__(name: str) -> Any:
    if name in ("train", "resume", "RunConfig"):
        from crossview.engine import run
        return getattr(run, name)
    raise AttributeError(f"module 'crossview.engine' has no attribute {name!r}")
