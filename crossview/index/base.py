"""The common index interface, the tie rule for top-k, and helpers shared by the backends.

Tie rule (the same as :mod:`crossview.eval.metrics`): results are ordered by descending score,
equal scores by ascending gallery index, so the exact backends return exactly the first ``k``
items of a stable descending sort. ``k`` larger than the gallery is clipped: a search returns
``min(k, size)`` columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError

__all__ = ["TopKResult", "Index", "merge_topk", "as_queries", "order_keys"]


@dataclass(frozen=True)
class TopKResult:
    """Top-k search result.

    ``indices (n_queries, k) int64`` gallery rows best first, ``scores (n_queries, k) float32``
    their inner products, ``exact`` whether the result equals exhaustive float32 search (with the
    tie rule), ``backend`` the name of the backend that produced it.
    """

    indices: np.ndarray
    scores: np.ndarray
    exact: bool
    backend: str

    @property
    def k(self) -> int:
        return int(self.indices.shape[1])


class Index:
    """A gallery of ``(n, d)`` vectors searchable by inner product.

    Subclasses implement :meth:`add` and :meth:`search`. ``size`` is the number of gallery rows,
    ``dim`` their dimension (``None`` until the first :meth:`add`).
    """

    backend: str = "index"

    def __init__(self) -> None:
        self._size = 0
        self._dim: int | None = None

    @property
    def size(self) -> int:
        return self._size

    @property
    def dim(self) -> int | None:
        return self._dim

    def __len__(self) -> int:
        return self._size

    def add(self, gallery: Any) -> None:  # pragma: no cover - interface
        """Append ``gallery (n, d)`` rows; their ids continue after the rows already present."""
        raise NotImplementedError

    def search(self, queries: Any, k: int) -> TopKResult:  # pragma: no cover - interface
        """The ``k`` best gallery rows for each of ``queries (m, d)`` (or one ``(d,)`` query)."""
        raise NotImplementedError

    def _check_gallery(self, gallery: Any) -> Any:
        """Validate a gallery block; keeps memmaps as they are (no load)."""
        if hasattr(gallery, "detach") and hasattr(gallery, "cpu"):
            gallery = gallery.detach().cpu().numpy()
        if not isinstance(gallery, np.ndarray):
            gallery = np.asarray(gallery)
        if gallery.ndim != 2:
            raise CrossViewError(f"a gallery must be a 2-D (n, d) array, got shape {gallery.shape}")
        if not np.issubdtype(gallery.dtype, np.floating):
            raise CrossViewError(f"a gallery must hold floats, got dtype {gallery.dtype}")
        if self._dim is not None and gallery.shape[1] != self._dim:
            raise CrossViewError(
                f"gallery rows have dimension {gallery.shape[1]}, but this index holds "
                f"dimension {self._dim}")
        return gallery

    def _check_search(self, queries: Any, k: int) -> tuple[np.ndarray, int]:
        q = as_queries(queries, self._dim)
        if self._size == 0:
            raise CrossViewError("the index is empty: add a gallery before searching")
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise CrossViewError(f"k must be a positive integer, got {k!r}")
        return q, int(min(k, self._size))


def as_queries(queries: Any, dim: int | None) -> np.ndarray:
    """``(m, d)`` float32 C-contiguous queries from ``(m, d)`` or ``(d,)`` input; checks ``d``."""
    if hasattr(queries, "detach") and hasattr(queries, "cpu"):
        queries = queries.detach().cpu().numpy()
    q = np.asarray(queries)
    if q.ndim == 1:
        q = q[None, :]
    if q.ndim != 2:
        raise CrossViewError(f"queries must be (m, d) or (d,), got shape {q.shape}")
    if dim is not None and q.shape[1] != dim:
        raise CrossViewError(f"queries have dimension {q.shape[1]}, but the gallery has {dim}")
    q = np.ascontiguousarray(q, dtype=np.float32)
    if not np.isfinite(q).all():
        raise CrossViewError("queries contain NaN or infinite values")
    return q


def order_keys(scores: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """int64 keys whose descending order is the tie rule's order (score desc, id asc).

    ``scores`` float32, ``ids`` int64 in ``[0, 2**32)`` (same shape). The high 32 bits are an
    order-preserving integer image of the float (``-0.0`` folded onto ``+0.0``), the low 32 bits
    ``2**32 - 1 - id``; all keys are distinct, so any top-k on them is deterministic.
    """
    s = np.ascontiguousarray(scores, dtype=np.float32) + np.float32(0.0)   # -0.0 -> +0.0
    b = s.view(np.int32).astype(np.int64)
    b ^= (b >> 31) & 0x7FFFFFFF               # negative floats: flip magnitude bits
    return (b << 32) | (0xFFFFFFFF - ids.astype(np.int64))


def merge_topk(scores: np.ndarray, ids: np.ndarray, rows: np.ndarray, n_rows: int,
               k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row top-``k`` of flat candidate lists, under the tie rule.

    ``scores`` float32, ``ids`` int64 and ``rows`` int64 are flat ``(n_candidates,)`` arrays (the
    query row of each candidate; a (row, id) pair must not repeat). Returns ``scores (n_rows, k)``
    and ``ids (n_rows, k)``, best first, padded with ``-inf`` / ``-1`` where a row has fewer than
    ``k`` candidates.
    """
    out_s = np.full((n_rows, k), -np.inf, dtype=np.float32)
    out_i = np.full((n_rows, k), -1, dtype=np.int64)
    if scores.size == 0:
        return out_s, out_i
    keys = order_keys(scores, ids)
    order = np.lexsort((~keys, rows))          # by row, then key descending (~ never overflows)
    r = rows[order]
    first = np.searchsorted(r, np.arange(n_rows))
    pos = np.arange(r.size) - first[r]
    keep = pos < k
    sel = order[keep]
    out_s[r[keep], pos[keep]] = scores[sel]
    out_i[r[keep], pos[keep]] = ids[sel]
    return out_s, out_i
