"""What the experiments share: JSON-safe copies of results, mean and spread over folds or seeds, whether a
trial's run finished, and a new experiment folder in the runs folder."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crossview.engine.runs import run_finished  # noqa: F401  (the run store's; re-exported)

__all__ = ["plain", "mean_std", "run_finished", "new_experiment_dir", "relay_run", "relay_seed_build",
           "seed_folder", "run_seed_builds", "several_seeds", "text_table", "markdown_table"]


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


def relay_seed_build(events: Iterable[Any], index: int, n_seeds: int, seed: int) -> Generator[Any, None, Any]:
    """Re-yield one build of an experiment over several seeds (``yield from``): its progress scaled into the whole
    (build ``index`` of ``n_seeds``), its messages prefixed with the seed; returns the build's summary, or None
    when it stopped (what it finished stays, and the same command continues it)."""
    from crossview.core.events import Finished, Log, Progress

    summary = None
    for ev in events:
        if isinstance(ev, Finished):
            summary = ev.summary
        elif isinstance(ev, Progress):
            total = max(int(ev.total), 1)
            yield Progress(index * total + min(int(ev.step), total), n_seeds * total,
                           f"seed {seed} ({index + 1} of {n_seeds}): {ev.message}", stage=ev.stage)
        elif isinstance(ev, Log):
            yield Log(f"seed {seed}: {ev.message}", level=ev.level)
        else:
            yield ev
    return summary


def seed_folder(out: Path, seed: int) -> Path:
    """The experiment folder of one build of an experiment over several seeds: ``OUT/seed-<seed>``."""
    return Path(out) / f"seed-{int(seed)}"


def run_seed_builds(folder: Path, seeds: Sequence[int], what: str, experiment_file: str,
                    start: Callable[[int, Path], Iterable[Any]]) -> Generator[Any, None, list[dict[str, Any]] | None]:
    """Run one build per seed (``start(seed, seed_folder(folder, seed))``, an experiment's event generator) with
    :func:`relay_seed_build` (``yield from``); returns the builds' summaries, or None when one stopped. A folder
    that holds a one-seed experiment (its ``experiment_file``) is refused: ``what`` names it in the message."""
    from crossview.core.errors import CrossViewError
    from crossview.core.events import Log

    if folder.exists() and not folder.is_dir():
        raise CrossViewError(f"--out {folder} is a file; give a folder for the experiment's runs")
    if (folder / experiment_file).is_file():
        raise CrossViewError(f"{folder} holds a one-seed {what}; give a new folder for a table over seeds "
                             f"{', '.join(map(str, seeds))}")
    yield Log(f"the table over {len(seeds)} builds (seeds {', '.join(map(str, seeds))}), one experiment folder each "
              f"under {folder}")
    results = []
    for i, s in enumerate(seeds):
        summary = yield from relay_seed_build(start(s, seed_folder(folder, s)), i, len(seeds), s)
        if summary is None:      # stopped: the builds done so far and the one in progress stay resumable
            return None
        results.append(summary)
    return results


def several_seeds(result: dict[str, Any]) -> bool:
    """Whether an experiment's result averages several builds (``result["seeds"]`` of two or more)."""
    return len(result.get("seeds") or []) > 1


def text_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned plain-text lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)] if rows else [len(h) for h in head]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
            for cells in [head, *rows]]


def markdown_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table: the first column left-aligned, the others right-aligned."""
    return ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1),
            *("| " + " | ".join(r) + " |" for r in rows)]
