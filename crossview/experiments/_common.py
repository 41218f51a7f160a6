"""What the experiments share: JSON-safe copies of results, mean and spread over folds or seeds, whether a
trial's run finished, and a new experiment folder in the runs folder."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from crossview.engine.runs import run_finished  # noqa: F401  (the run store's; re-exported)

__all__ = ["plain", "mean_std", "run_finished", "new_experiment_dir", "relay_run"]


def plain(value: Any) -> Any:
    """A JSON-safe copy (numbers, strings, lists, dicts; anything else as its text)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    return str(value)


def mean_std(values: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Element-wise mean and (population) standard deviation of nested metric dicts, one per fold or seed."""
    mean: dict[str, Any] = {}
    std: dict[str, Any] = {}
    for key in values[0]:
        if isinstance(values[0][key], dict):
            mean[key], std[key] = mean_std([v[key] for v in values])
        else:
            a = np.asarray([float(v[key]) for v in values], dtype=np.float64)
            mean[key] = float(a.mean())
            std[key] = float(a.std()) if len(a) > 1 else 0.0
    return mean, std


def new_experiment_dir(kind: str, name: str) -> Path:
    """``<runs folder>/<kind>-<name>-<timestamp>``, a new, unused name (as the engine names runs)."""
    from crossview.engine.run import default_run_dir

    return default_run_dir(kind, name)


def relay_run(events: Iterable[Any], label: str, folder: Path, stop: Callable[[], bool]) -> Generator[Any, None, bool]:
    """Re-yield a trial run's warnings, errors and progress under ``label`` (``yield from``); returns True when
    ``stop()`` asked to stop (after saying how to continue). The run is closed either way: a stopped run stays
    resumable at its last checkpoint."""
    from crossview.core.events import Log, Progress

    try:
        for ev in events:
            if isinstance(ev, Log) and ev.level in ("warning", "error"):
                yield Log(f"{label}: {ev.message}", ev.level)
            elif isinstance(ev, Progress):
                yield Progress(ev.step, ev.total, f"{label}: {ev.message}")
            if stop():
                yield Log(f"{label}: stopped; run the experiment again with --exp-dir {folder} to continue", "warning")
                return True
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
    return False
