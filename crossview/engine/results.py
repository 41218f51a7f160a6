"""A finished run folder's results: ``summary.json`` and ``ranks.npz`` (ARCHITECTURE.md, Runs).

:class:`RunResults` is what the Inspect panel and ``crossview compare`` show: the metrics, the
per-query ranks of both directions, which dataset items the queries are (when the run recorded them),
and the paper's numbers from the method's card.

It lives in the engine, not in ``eval``: it reads the run folders the engine writes and joins them with
the method's card (``crossview.methods.cards``), and ``eval`` sits below the methods.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.io import read_npz

__all__ = ["RunResults", "load_run_results"]

_RANK_KEYS = {"i2t": ("i2t", "ranks_i2t", "i2t_ranks"), "t2i": ("t2i", "ranks_t2i", "t2i_ranks")}
_QUERY_KEYS = {"i2t": ("i2t_queries", "image_index", "images", "image_ids"),
               "t2i": ("t2i_queries", "caption_index", "captions", "caption_ids")}


@dataclass
class RunResults:
    """A run's evaluation. ``ranks[d]`` is ``(n_queries,) int64`` 1-based; ``queries[d]`` the dataset index
    of each query (image indices for i2t, caption indices for t2i) when known; ``caption_image
    (n_captions,) int64`` the position among the i2t queries of each t2i query's image (``None`` in ranks.npz
    files written before it was recorded): what a paired comparison clusters the captions by."""

    name: str
    path: Path | None
    summary: dict[str, Any]
    ranks: dict[str, np.ndarray]
    queries: dict[str, np.ndarray] = field(default_factory=dict)
    paper: list[dict[str, Any]] = field(default_factory=list)
    caption_image: np.ndarray | None = None
    #: the run's re-scorings of its evaluation split (``scoring.json``, crossview.engine.scoring): name -> entry
    scorings: dict[str, Any] = field(default_factory=dict)

    def paper_settings(self) -> list[str]:
        """Distinct ``"<table>: <dataset> - <setting>"`` labels of the card's paper numbers."""
        seen: list[str] = []
        for e in self.paper:
            label = f"{e.get('table', '')}: {e.get('dataset', '')} - {e.get('setting', '')}"
            if label not in seen:
                seen.append(label)
        return seen

    def paper_metrics(self, label: str, direction: str) -> dict[str, float]:
        """The paper's metrics of one setting (a :meth:`paper_settings` label) and direction."""
        for e in self.paper:
            if f"{e.get('table', '')}: {e.get('dataset', '')} - {e.get('setting', '')}" == label and \
                    e.get("direction") == direction:
                return dict(e.get("metrics", {}))
        return {}

    @property
    def method(self) -> str:
        return str(self.summary.get("method", "?"))

    def metric_rows(self) -> list[str]:
        keys: list[str] = []
        for d in ("i2t", "t2i"):
            for k in self.summary.get(d, {}) or {}:
                if k not in keys:
                    keys.append(k)
        return keys


def load_run_results(run_dir: str | Path, *, plain: bool = False) -> RunResults:
    """Read ``summary.json`` and ``ranks.npz`` of a run folder; a clear error names what is missing. ``plain``: the
    plain ranks (``i2t_plain`` / ``t2i_plain``, kept beside a scored run's own) where the run has them."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise CrossViewError(f"{run_dir}: no summary.json - the run has not finished an evaluation yet "
                             "(resume it with 'crossview train --resume DIR')")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise CrossViewError(f"{summary_path}: not valid JSON ({e})") from e
    ranks: dict[str, np.ndarray] = {}
    queries: dict[str, np.ndarray] = {}
    caption_image = None
    ranks_path = run_dir / "ranks.npz"
    if ranks_path.is_file():
        z = read_npz(ranks_path, todo="train the run again (its evaluation writes ranks.npz)")
        try:
            for d in ("i2t", "t2i"):
                key = next((k for k in ((f"{d}_plain",) if plain else ()) + _RANK_KEYS[d] if k in z), None)
                if key is not None:
                    ranks[d] = np.asarray(z[key], dtype=np.int64)
                qk = next((k for k in _QUERY_KEYS[d] if k in z), None)
                if qk is not None:
                    queries[d] = np.asarray(z[qk], dtype=np.int64)
            if "caption_image" in z:
                caption_image = np.asarray(z["caption_image"], dtype=np.int64)
        except (ValueError, TypeError) as e:
            raise CrossViewError(f"{ranks_path}: holds ranks that are not integers ({type(e).__name__}); train the "
                                 "run again (its evaluation writes ranks.npz)") from None
    paper: list[dict[str, Any]] = []
    try:
        from crossview.methods import cards
        path = cards.card_path(str(summary.get("method", "")))
        if path.is_file():
            paper = list(cards.parse_card(path).paper_results)
    except CrossViewError:
        paper = []   # a broken card must not hide the run's own results
    name = str(summary.get("name") or run_dir.name)
    return RunResults(name=name, path=run_dir, summary=summary, ranks=ranks, queries=queries, paper=paper,
                      caption_image=caption_image, scorings=_scorings(run_dir, str(summary.get("split") or "")))


def _scorings(run_dir: Path, split: str) -> dict[str, Any]:
    """The entries of the run's ``scoring.json`` for ``split`` (``{}`` when there is none or it is unreadable:
    re-scorings are extras, never a reason not to show the run)."""
    try:
        data = json.loads((run_dir / "scoring.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    entries = data.get(split) if isinstance(data, dict) else None
    return {k: v for k, v in entries.items() if isinstance(v, dict)} if isinstance(entries, dict) else {}
