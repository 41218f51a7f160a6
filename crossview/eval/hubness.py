"""Hubness of a retrieval: how unevenly the gallery items share the queries' top-k lists.

In a high-dimensional space some items ("hubs") are near almost every query, and others ("anti-hubs") are
near none (Radovanovic, Nanopoulos & Ivanovic, JMLR 2010). For retrieval this means that one caption comes
back for most images: R@K over a small test gallery can still look good while retrieval from a large
gallery returns the same few captions for everything. Cosines between uncentred features (all rows sharing
a large common direction: non-negative CNN activations, averaged word vectors) are the usual cause.

For one direction (queries against a gallery; i2t: queries are images, the gallery is the captions):

- ``N_k(j)``, the k-occurrence of gallery item ``j``: how many queries have ``j`` in their top ``k``
  (ordered by :func:`crossview.eval.metrics.top_k`, i.e. descending score and, among equal scores, the
  smaller index first). It sums to ``n_queries * k``;
- its skewness ``E[(N_k - mean)^3] / std^3`` (population moments; 0 when every item occurs equally often).
  A uniform random retrieval gives a value near 0; Radovanovic et al. report 1-10 for hub-prone data;
- ``top5_share``: the share of queries whose top 5 holds the single most frequent item (the item with the
  largest ``N_5``; among equal counts the smaller index), and that item's index;
- ``antihub_share``: the share of gallery items in no top-``k`` list (``N_k = 0``).

``k`` is 10 by default and at most ``n_gallery - 1`` (with ``k = n_gallery`` every item is in every list).
Scores are computed a block of queries at a time from the embeddings (:func:`hubness_of_embeddings`), so
only the top-k indices of each query are ever kept, never the whole queries x gallery matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.eval.metrics import as_numpy, top_k

__all__ = ["Hubness", "DEFAULT_K", "TOP_SHARE_K", "hubness", "hubness_of_embeddings", "k_occurrence", "skewness",
           "hubness_from_top", "format_hubness", "describe_hubness"]

#: the k of N_k unless told otherwise (Radovanovic et al.'s N_10)
DEFAULT_K = 10
#: the list length of ``top5_share`` ("one caption appears in 31 of 100 top-5 lists")
TOP_SHARE_K = 5
# Elements of one (queries x gallery) score block; the same bound as crossview.eval.metrics.
_CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Hubness:
    """The hubness of one direction (see the module docstring).

    ``occurrences`` is ``N_k``, ``(n_gallery,) int64``; the others are plain numbers.
    """

    k: int
    n_queries: int
    n_gallery: int
    occurrences: np.ndarray
    skewness: float
    top5_item: int
    top5_count: int
    top5_share: float
    antihub_share: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: everything but the per-item ``occurrences``."""
        return {"k": self.k, "skewness": self.skewness, "top5_share": self.top5_share, "top5_item": self.top5_item,
                "top5_count": self.top5_count, "antihub_share": self.antihub_share,
                "n_queries": self.n_queries, "n_gallery": self.n_gallery}


def _check_sizes(n_queries: int, n_gallery: int, k: int | None) -> int:
    """The k to use: ``min(k, n_gallery - 1)`` (default :data:`DEFAULT_K`); refuses what has no hubness."""
    if n_gallery < 2:
        raise CrossViewError(f"hubness needs a gallery of at least 2 items, got {n_gallery}; with one item "
                             "every query returns it and there is nothing to compare")
    if n_queries < 1:
        raise CrossViewError("hubness needs at least one query, got none")
    if k is None:
        k = DEFAULT_K
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise CrossViewError(f"hubness: k must be a whole number >= 1, got {k!r}")
    return int(min(int(k), n_gallery - 1))


def skewness(values: Any) -> float:
    """Population skewness ``E[(v - mean)^3] / std^3`` of ``values (n,)``; 0.0 when they are all equal."""
    v = as_numpy(values).astype(np.float64).ravel()
    if v.size == 0:
        raise CrossViewError("skewness of no values is undefined")
    c = v - v.mean()
    m2 = float(np.mean(c * c))
    # a constant distribution has no tail on either side: 0, not 0/0
    if m2 <= 1e-24 * max(1.0, float(np.max(np.abs(v))) ** 2):
        return 0.0
    return float(np.mean(c * c * c) / m2 ** 1.5)


def hubness_from_top(top: Any, n_gallery: int, k: int) -> Hubness:
    """The figures from each query's ranked list ``top (n_queries, >= max(k, 5) or n_gallery) int64`` (best
    first, as :func:`crossview.eval.metrics.top_k` gives it) over a gallery of ``n_gallery`` items."""
    t = as_numpy(top)
    n_q = int(t.shape[0])
    k = _check_sizes(n_q, int(n_gallery), k)
    k5 = min(TOP_SHARE_K, n_gallery)
    if t.ndim != 2 or t.shape[1] < max(k, k5):
        raise CrossViewError(f"hubness: the ranked lists must hold at least {max(k, k5)} items, got shape {t.shape}")
    occ = np.bincount(t[:, :k].ravel(), minlength=n_gallery).astype(np.int64)
    occ5 = np.bincount(t[:, :k5].ravel(), minlength=n_gallery)
    item = int(np.argmax(occ5))                  # argmax: the smaller index among equal counts
    return Hubness(k=k, n_queries=n_q, n_gallery=int(n_gallery), occurrences=occ, skewness=skewness(occ),
                   top5_item=item, top5_count=int(occ5[item]), top5_share=float(occ5[item]) / n_q,
                   antihub_share=float(np.count_nonzero(occ == 0)) / n_gallery)


def hubness(scores: Any, k: int | None = None) -> Hubness:
    """Hubness of ``scores (n_queries, n_gallery)`` (larger = more similar; a transposed view is fine:
    the t2i direction of an images x captions matrix is ``scores.T``). ``k`` defaults to 10."""
    s = as_numpy(scores)
    if s.ndim != 2:
        raise CrossViewError(f"hubness: scores must be (n_queries, n_gallery), got shape {s.shape}")
    n_q, n_g = s.shape
    k = _check_sizes(n_q, n_g, k)
    if np.issubdtype(s.dtype, np.floating) and np.isnan(s).any():
        raise CrossViewError("hubness: scores contain NaN; there is no ranking (check the embeddings for NaN)")
    return hubness_from_top(top_k(s, max(k, TOP_SHARE_K)), n_g, k)


def hubness_of_embeddings(queries: Any, gallery: Any, k: int | None = None) -> Hubness:
    """Hubness of the dot-product retrieval of ``queries (n_queries, D)`` against ``gallery (n_gallery, D)``.

    The scores are formed one block of queries at a time (a few tens of MB whatever the sizes); only the
    top ``max(k, 5)`` indices of each query are kept.
    """
    q = np.asarray(as_numpy(queries), dtype=np.float32)
    g = np.asarray(as_numpy(gallery), dtype=np.float32)
    if q.ndim != 2 or g.ndim != 2 or q.shape[1] != g.shape[1]:
        raise CrossViewError(f"hubness: queries {q.shape} and gallery {g.shape} must be 2-D with the same "
                             "number of columns")
    n_q, n_g = q.shape[0], g.shape[0]
    k = _check_sizes(n_q, n_g, k)
    if not (np.isfinite(q).all() and np.isfinite(g).all()):
        raise CrossViewError("hubness: the embeddings contain NaN or inf values; there is no ranking")
    width = min(max(k, TOP_SHARE_K), n_g)
    top = np.empty((n_q, width), dtype=np.int64)
    gt = np.ascontiguousarray(g.T)
    step = max(1, _CHUNK_ELEMENTS // n_g)
    for start in range(0, n_q, step):
        stop = min(n_q, start + step)
        top[start:stop] = top_k(q[start:stop] @ gt, width)
    return hubness_from_top(top, n_g, k)


def k_occurrence(scores: Any, k: int) -> np.ndarray:
    """``N_k``: ``(n_gallery,) int64``, how many rows of ``scores (n_queries, n_gallery)`` have each gallery
    item in their top ``k`` (``k`` is used as given, up to ``n_gallery``)."""
    s = as_numpy(scores)
    if s.ndim != 2:
        raise CrossViewError(f"k_occurrence: scores must be (n_queries, n_gallery), got shape {s.shape}")
    return np.bincount(top_k(s, k).ravel(), minlength=s.shape[1]).astype(np.int64)


def format_hubness(h: dict[str, Any] | Hubness) -> str:
    """One line a person reads: ``N_10 skewness 3.21; the most frequent item is in 31% of top-5 lists; 12% of
    items in no top-10``."""
    d = h.as_dict() if isinstance(h, Hubness) else h
    return (f"N_{d['k']} skewness {d['skewness']:.2f}; the most frequent item is in {100 * d['top5_share']:.0f}% "
            f"of top-5 lists; {100 * d['antihub_share']:.0f}% of items in no top-{d['k']}")


def describe_hubness(per_direction: Any) -> str:
    """One ``"<direction> hubness: ..."`` line per direction of a ``{"i2t": as_dict(), "t2i": ...}`` mapping (a run's
    summary.json ``"hubness"``); a direction that is ``None``, missing or malformed (an older or damaged
    summary) is left out, so the result may be ``""``."""
    if not isinstance(per_direction, dict):
        return ""
    lines = []
    for d in ("i2t", "t2i"):
        h = per_direction.get(d)
        keys = ("k", "skewness", "top5_share", "antihub_share")
        if isinstance(h, dict) and all(isinstance(h.get(key), (int, float)) and not isinstance(h.get(key), bool)
                                       for key in keys):
            lines.append(f"{d} hubness: {format_hubness(h)}")
    return "\n".join(lines)
