"""Ranks and rank metrics for image <-> text retrieval.

Inputs
------
``scores`` is a similarity matrix ``(n_images, n_captions)`` (float32 or float64, larger = more
similar) and ``caption_image`` is ``(n_captions,) int64``, the image each caption describes.
Ranks are 1-based.

- i2t: for each image, the rank of its best-ranked ground-truth caption among all captions.
- t2i: for each caption, the rank of its image among all images.

Tie rule (one rule everywhere, also in :mod:`crossview.index`)
---------------------------------------------------------------
The items of one query are ordered by descending score, and equal scores by ascending index
(a stable sort of ``-score``). The rank of item ``j`` is therefore::

    rank(j) = 1 + #{i : s_i > s_j} + #{i < j : s_i == s_j}

For i2t the "best-ranked ground-truth caption" is the first gold caption in that order (highest
score; among equal scores, the smallest caption index). Ranks are computed by counting, never by
sorting a whole row, in chunks of queries so that a 5,000 x 25,000 matrix needs only a few tens of
MB of temporaries. NaN scores have no order and are refused.

Metrics
-------
R@K is the percentage of queries with rank <= K; MedR is the plain median rank (``np.median``, so
it may end in .5 for an even number of queries; VSE++ prints the floor); MeanR is the mean rank;
rsum is the sum of R@1, R@5 and R@10 in both directions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError

__all__ = [
    "as_numpy",
    "check_scores",
    "first_relevant_ranks",
    "i2t_ranks",
    "t2i_ranks",
    "recall_at_k",
    "rank_metrics",
    "rsum_of",
    "evaluate",
    "embedding_ranks",
    "evaluate_embeddings_blocked",
    "embedding_average_precision",
    "top_k",
]

# Elements of temporary (chunk x gallery) arrays per chunk; bounds the extra memory to ~tens of MB.
_CHUNK_ELEMENTS = 1 << 22


def as_numpy(x: Any) -> np.ndarray:
    """``x`` as a numpy array (torch tensors are detached and copied to the CPU)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def check_scores(scores: Any, caption_image: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate and convert the evaluation inputs.

    Returns ``scores (n_images, n_captions)`` as a float array and ``caption_image (n_captions,)
    int64``; raises :class:`CrossViewError` when shapes disagree, an index is out of range or a
    score is NaN.
    """
    s = as_numpy(scores)
    ci = as_numpy(caption_image)
    if s.ndim != 2:
        raise CrossViewError(f"scores must be a 2-D (n_images, n_captions) matrix, got shape {s.shape}")
    if not np.issubdtype(s.dtype, np.floating):
        s = s.astype(np.float64)
    if ci.ndim != 1 or ci.shape[0] != s.shape[1]:
        raise CrossViewError(
            f"caption_image must have one entry per caption (scores has {s.shape[1]} columns), "
            f"got shape {ci.shape}")
    if not np.issubdtype(ci.dtype, np.integer):
        raise CrossViewError(f"caption_image must hold integer image indices, got dtype {ci.dtype}")
    ci = ci.astype(np.int64, copy=False)
    if ci.size and (ci.min() < 0 or ci.max() >= s.shape[0]):
        bad = int(ci[(ci < 0) | (ci >= s.shape[0])][0])
        raise CrossViewError(
            f"caption_image refers to image {bad}, but scores has only {s.shape[0]} rows (images)")
    if np.isnan(s).any():
        raise CrossViewError("scores contain NaN; ranks are undefined (check the embeddings for NaN)")
    return s, ci


def first_relevant_ranks(scores: np.ndarray, query_labels: np.ndarray,
                         gallery_labels: np.ndarray) -> np.ndarray:
    """Rank of the best-ranked relevant gallery item for every query (tie rule of this module).

    ``scores (n_queries, n_gallery)`` (may be a transposed view), ``query_labels (n_queries,)`` and
    ``gallery_labels (n_gallery,)``: gallery item ``j`` is relevant to query ``q`` when
    ``gallery_labels[j] == query_labels[q]``. Returns ``(n_queries,) int64`` 1-based ranks, and 0
    for a query with no relevant gallery item.
    """
    n_q, n_g = scores.shape
    ranks = np.zeros(n_q, dtype=np.int64)
    if n_q == 0 or n_g == 0:
        return ranks
    cols = np.arange(n_g, dtype=np.int64)
    step = max(1, _CHUNK_ELEMENTS // n_g)
    for start in range(0, n_q, step):
        stop = min(n_q, start + step)
        s = np.ascontiguousarray(scores[start:stop])             # (b, n_g); copies a transposed view
        rel = gallery_labels[None, :] == query_labels[start:stop, None]
        has = rel.any(axis=1)
        best = np.where(rel, s, -np.inf).max(axis=1)             # best relevant score per query
        # first relevant column holding that score = smallest index among tied relevant items
        best_col = np.argmax(rel & (s == best[:, None]), axis=1)
        higher = (s > best[:, None]).sum(axis=1)
        tied_before = ((s == best[:, None]) & (cols[None, :] < best_col[:, None])).sum(axis=1)
        ranks[start:stop] = np.where(has, 1 + higher + tied_before, 0)
    return ranks


def i2t_ranks(scores: Any, caption_image: Any) -> np.ndarray:
    """Image -> text ranks: ``scores (n_images, n_captions)``, ``caption_image (n_captions,)``.

    Returns ``(n_images,) int64``: for each image, the 1-based rank of its best-ranked gold caption
    among all captions. Every image must have at least one caption.
    """
    return _i2t_ranks(*check_scores(scores, caption_image))


def t2i_ranks(scores: Any, caption_image: Any) -> np.ndarray:
    """Text -> image ranks: ``scores (n_images, n_captions)``, ``caption_image (n_captions,)``.

    Returns ``(n_captions,) int64``: for each caption, the 1-based rank of its image among all
    images.
    """
    return _t2i_ranks(*check_scores(scores, caption_image))


def _check_every_image_has_a_caption(ci: np.ndarray, n_images: int) -> None:
    counts = np.bincount(ci, minlength=n_images)
    if (counts == 0).any():
        missing = np.flatnonzero(counts == 0)
        raise CrossViewError(
            f"{missing.size} image(s) have no caption (first: image {int(missing[0])}); i2t ranks "
            "need at least one ground-truth caption per image: drop those images from the scores")


def _i2t_ranks(s: np.ndarray, ci: np.ndarray) -> np.ndarray:
    n_images = s.shape[0]
    _check_every_image_has_a_caption(ci, n_images)
    return first_relevant_ranks(s, np.arange(n_images, dtype=np.int64), ci)


def _t2i_ranks(s: np.ndarray, ci: np.ndarray) -> np.ndarray:
    n_images, n_captions = s.shape
    if n_captions == 0:
        return np.empty(0, dtype=np.int64)
    gold = s[ci, np.arange(n_captions)]                          # (n_captions,) score of own image
    higher = np.zeros(n_captions, dtype=np.int64)
    tied_before = np.zeros(n_captions, dtype=np.int64)
    # Row chunks are contiguous in memory; the counts accumulate over them.
    step = max(1, _CHUNK_ELEMENTS // n_captions)
    for start in range(0, n_images, step):
        stop = min(n_images, start + step)
        block = s[start:stop]                                    # (b, n_captions)
        higher += (block > gold[None, :]).sum(axis=0)
        rows = np.arange(start, stop, dtype=np.int64)[:, None]
        tied_before += ((block == gold[None, :]) & (rows < ci[None, :])).sum(axis=0)
    return 1 + higher + tied_before


def recall_at_k(ranks: Any, k: int) -> float:
    """R@K: percentage (0-100) of queries whose 1-based rank is <= ``k``. ``ranks (n_queries,)``."""
    r = as_numpy(ranks)
    if r.size == 0:
        raise CrossViewError("recall_at_k got no ranks (no queries)")
    if k < 1:
        raise CrossViewError(f"k must be >= 1, got {k}")
    return float(100.0 * np.count_nonzero(r <= k) / r.size)


def rank_metrics(ranks: Any, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """``{"R@1", "R@5", "R@10", "MedR", "MeanR"}`` for ``ranks (n_queries,)`` (R@K in percent)."""
    r = as_numpy(ranks)
    if r.size == 0:
        raise CrossViewError("rank_metrics got no ranks (no queries)")
    out = {f"R@{k}": recall_at_k(r, k) for k in ks}
    out["MedR"] = float(np.median(r))
    out["MeanR"] = float(np.mean(r))
    return out


def rsum_of(i2t: dict[str, float], t2i: dict[str, float], ks: Sequence[int] = (1, 5, 10)) -> float:
    """Sum of R@K over ``ks`` in both directions."""
    return float(sum(i2t[f"R@{k}"] for k in ks) + sum(t2i[f"R@{k}"] for k in ks))


def evaluate(scores: Any, caption_image: Any, ks: Sequence[int] = (1, 5, 10)) -> dict[str, Any]:
    """Full retrieval evaluation of ``scores (n_images, n_captions)``.

    Returns ``{"i2t": {...}, "t2i": {...}, "rsum": float, "ranks": {"i2t": (n_images,) int64,
    "t2i": (n_captions,) int64}}`` with the metrics of :func:`rank_metrics`.
    """
    s, ci = check_scores(scores, caption_image)
    r_i2t = _i2t_ranks(s, ci)
    r_t2i = _t2i_ranks(s, ci)
    i2t = rank_metrics(r_i2t, ks)
    t2i = rank_metrics(r_t2i, ks)
    return {"i2t": i2t, "t2i": t2i, "rsum": rsum_of(i2t, t2i, ks),
            "ranks": {"i2t": r_i2t, "t2i": r_t2i}}


#: Elements of one block of scores formed by :func:`embedding_ranks` (32 MB of float32; with its temporaries a block
#: peaks at twice that: 5K x 25K ranked in 64 MB, where 64 MB blocks took 128 MB in the same time, issue 34).
_SCORE_BLOCK_ELEMENTS = 1 << 23


def _score_blocks(image: np.ndarray, text: np.ndarray, block_rows: int):
    """``(start, stop, image[start:stop] @ text.T)`` for consecutive blocks of image rows, float32."""
    for start in range(0, image.shape[0], block_rows):
        stop = min(image.shape[0], start + block_rows)
        yield start, stop, np.asarray(image[start:stop], dtype=np.float32) @ text.T


def _checked_embeddings(image: Any, text: Any, caption_image: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(image, text, caption_image)`` as float32 / float32 / int64 arrays, or one clear error: the embeddings
    ``(n_images, D)`` and ``(n_captions, D)`` with one ``D``, one image index per caption, each a valid image."""
    ci = np.asarray(caption_image, dtype=np.int64)
    img = np.asarray(image, dtype=np.float32)
    txt = np.asarray(text, dtype=np.float32)
    if img.ndim != 2 or txt.ndim != 2 or img.shape[1] != txt.shape[1]:
        raise CrossViewError(f"embeddings must be (n_images, D) and (n_captions, D) with the same D, got "
                             f"{img.shape} and {txt.shape}")
    n_images, n_captions = img.shape[0], txt.shape[0]
    if ci.shape != (n_captions,):
        raise CrossViewError(f"caption_image must have one entry per caption ({n_captions}), got shape {ci.shape}")
    if n_captions and (ci.min() < 0 or ci.max() >= n_images):
        raise CrossViewError(f"caption_image refers to image {int(ci.max())}, but there are {n_images} images")
    return img, txt, ci


def embedding_ranks(image: Any, text: Any, caption_image: Any, *, image_t2i: Any = None, text_t2i: Any = None,
                    block_rows: int | None = None, top: int = 0) -> dict[str, Any]:
    """``{"i2t": (n_images,) int64, "t2i": (n_captions,) int64}``: the ranks :func:`evaluate` gives for the scores
    ``image @ text.T``, formed block by block of ``block_rows`` images (default: ~32 MB of scores a block), never
    the whole ``(n_images, n_captions)`` matrix.

    ``image (n_images, D)`` and ``text (n_captions, D)`` are embeddings whose dot product is the score (the i2t
    model's); ``image_t2i`` / ``text_t2i``, when given, score the t2i direction. Same tie rule as :func:`evaluate`:
    each block is the very rows of the full product, and t2i's gold scores are read from the blocks themselves,
    so the ranks equal the full matrix's. The score blocks are formed twice with one model (the first pass ranks
    i2t and reads t2i's gold scores, the second counts the images above each gold score), three times with two.

    ``top > 0`` also returns ``"top": {"i2t": (n_images, min(top, n_captions)), "t2i": (n_captions, min(top,
    n_images))} int64``, each query's first gallery indices as :func:`top_k` orders them (hubness), from the same
    passes: no further product.
    """
    img, txt, ci = _checked_embeddings(image, text, caption_image)
    n_images, n_captions = img.shape[0], txt.shape[0]
    if block_rows is None:
        block_rows = max(1, _SCORE_BLOCK_ELEMENTS // max(1, n_captions))
    _check_every_image_has_a_caption(ci, n_images)
    two = image_t2i is not None
    # the captions of each block's images: each caption's gold (own image's) score lies in its image's block
    order = np.argsort(ci, kind="stable")
    bounds = np.searchsorted(ci[order], np.arange(0, n_images + block_rows, block_rows))
    gold = np.empty(n_captions, dtype=np.float32)
    r_i2t = np.empty(n_images, dtype=np.int64)
    top_i2t = np.empty((n_images, min(top, n_captions)), dtype=np.int64) if top > 0 else None
    for k, (start, stop, s) in enumerate(_score_blocks(img, txt, block_rows)):
        if np.isnan(s).any():
            raise CrossViewError("scores contain NaN; ranks are undefined (check the embeddings for NaN)")
        r_i2t[start:stop] = first_relevant_ranks(s, np.arange(start, stop, dtype=np.int64), ci)
        if top_i2t is not None and top_i2t.shape[1]:
            top_i2t[start:stop] = top_k(s, top_i2t.shape[1])
        if not two:
            mine = order[bounds[k]:bounds[k + 1]]
            gold[mine] = s[ci[mine] - start, mine]
    if two:
        n_t2i = np.shape(image_t2i)[0] if np.ndim(image_t2i) else 0
        if n_t2i != n_images:
            raise CrossViewError(f"the t2i model's image embeddings have {n_t2i} rows, the i2t model's {n_images}")
        try:
            img, txt, _ = _checked_embeddings(image_t2i, text_t2i, ci)
        except CrossViewError as e:
            raise CrossViewError(f"the t2i model: {e}") from None
        for k, (start, stop, s) in enumerate(_score_blocks(img, txt, block_rows)):
            if np.isnan(s).any():
                raise CrossViewError("scores contain NaN; ranks are undefined (check the embeddings for NaN)")
            mine = order[bounds[k]:bounds[k + 1]]
            gold[mine] = s[ci[mine] - start, mine]
    higher = np.zeros(n_captions, dtype=np.int64)
    tied_before = np.zeros(n_captions, dtype=np.int64)
    width = min(top, n_images)
    best_vals = np.empty((n_captions, 0), dtype=np.float32)
    best_idx = np.empty((n_captions, 0), dtype=np.int64)
    for start, stop, s in _score_blocks(img, txt, block_rows):
        higher += (s > gold[None, :]).sum(axis=0)
        rows = np.arange(start, stop, dtype=np.int64)[:, None]
        tied_before += ((s == gold[None, :]) & (rows < ci[None, :])).sum(axis=0)
        if width > 0:
            # each caption's best images so far, then this block's (higher indices): top_k's order (descending
            # score, the earlier position among equal ones) is then the full column's (the smaller image index)
            vals = np.concatenate([best_vals, s.T], axis=1)
            idx = np.concatenate([best_idx, np.broadcast_to(rows.T, (n_captions, stop - start))], axis=1)
            pos = top_k(vals, width)
            best_vals = np.take_along_axis(vals, pos, axis=1)
            best_idx = np.take_along_axis(idx, pos, axis=1)
            del vals, idx
    out: dict[str, Any] = {"i2t": r_i2t, "t2i": 1 + higher + tied_before}
    if top > 0:
        out["top"] = {"i2t": top_i2t, "t2i": best_idx}
    return out


def evaluate_embeddings_blocked(image: Any, text: Any, caption_image: Any, ks: Sequence[int] = (1, 5, 10), *,
                                image_t2i: Any = None, text_t2i: Any = None,
                                block_rows: int | None = None, hubness: bool = False) -> dict[str, Any]:
    """:func:`evaluate` of the scores ``image @ text.T`` (t2i: ``image_t2i @ text_t2i.T`` when given), computed by
    :func:`embedding_ranks` block by block; the same dict. ``hubness``: also ``"hubness"``, what
    :func:`crossview.eval.embeddings.embeddings_hubness` gives for these embeddings (each direction's
    :meth:`~crossview.eval.hubness.Hubness.as_dict`, None for a gallery of fewer than 2 items), from the ranking's
    own score blocks."""
    from crossview.eval.hubness import DEFAULT_K, TOP_SHARE_K, hubness_from_top

    ranks = embedding_ranks(image, text, caption_image, image_t2i=image_t2i, text_t2i=text_t2i,
                            block_rows=block_rows, top=max(DEFAULT_K, TOP_SHARE_K) if hubness else 0)
    tops = ranks.pop("top", None)
    i2t = rank_metrics(ranks["i2t"], ks)
    t2i = rank_metrics(ranks["t2i"], ks)
    out = {"i2t": i2t, "t2i": t2i, "rsum": rsum_of(i2t, t2i, ks), "ranks": ranks}
    if tops is not None:
        n = {"i2t": ranks["t2i"].shape[0], "t2i": ranks["i2t"].shape[0]}     # each direction's gallery
        out["hubness"] = {d: hubness_from_top(tops[d], n[d], DEFAULT_K).as_dict() if n[d] >= 2 and tops[d].shape[0]
                          else None for d in ("i2t", "t2i")}
    return out


def embedding_average_precision(image: Any, text: Any, caption_image: Any, t2i_ranks: Any = None,
                                block_rows: int | None = None) -> dict[str, float]:
    """Mean average precision (percent) both ways of the scores ``image @ text.T``, formed block by block as in
    :func:`embedding_ranks` (never the whole ``(n_images, n_captions)`` matrix): ``{"i2t": mAP, "t2i": mAP}``.

    i2t: each image ranks every caption, its own captions relevant; t2i: each caption has one relevant image, so
    its AP is ``1 / rank`` (the mean reciprocal rank; ``t2i_ranks``, when the caller has them from
    :func:`embedding_ranks`, are used instead of scoring again). The tie rule of this module, so the numbers equal
    :func:`crossview.eval.protocols.mean_average_precision` of the full matrix: the rank of a relevant caption is
    counted (``1 + #higher + #tied before it``), and its precision is its place among the image's relevant
    captions over that rank.
    """
    img, txt, ci = _checked_embeddings(image, text, caption_image)
    n_images, n_captions = img.shape[0], txt.shape[0]
    if n_captions == 0:
        raise CrossViewError(f"caption_image must have one entry per caption ({n_captions}), got shape {ci.shape}")
    _check_every_image_has_a_caption(ci, n_images)
    if block_rows is None:
        block_rows = max(1, _SCORE_BLOCK_ELEMENTS // max(1, n_captions))
    order = np.argsort(ci, kind="stable")
    bounds = np.searchsorted(ci[order], np.arange(0, n_images + block_rows, block_rows))
    cols = np.arange(n_captions, dtype=np.int64)
    per_chunk = max(1, _CHUNK_ELEMENTS // n_captions)           # relevant captions compared at a time
    ap_sum = 0.0
    for k, (start, _stop, s) in enumerate(_score_blocks(img, txt, block_rows)):
        if np.isnan(s).any():
            raise CrossViewError("scores contain NaN; rankings are undefined (check the embeddings for NaN)")
        mine = order[bounds[k]:bounds[k + 1]]                   # relevant captions of the block's images, by image
        rows = ci[mine] - start
        rank = np.empty(mine.size, dtype=np.int64)
        for a in range(0, mine.size, per_chunk):
            r, c = rows[a:a + per_chunk], mine[a:a + per_chunk]
            block = s[r]                                          # (m, n_captions): each relevant caption's row
            v = block[np.arange(r.size), c][:, None]
            rank[a:a + per_chunk] = 1 + (block > v).sum(axis=1) + ((block == v) & (cols[None, :] < c[:, None])).sum(
                axis=1)
        by = np.lexsort((rank, rows))                           # by image, then by rank
        r_sorted = rows[by]
        first = np.searchsorted(r_sorted, r_sorted, side="left")
        place = np.arange(by.size) - first + 1                  # 1-based place among the image's relevant captions
        prec = place / rank[by]
        n_rel = np.bincount(r_sorted, minlength=s.shape[0])
        ap_sum += float((np.bincount(r_sorted, weights=prec, minlength=s.shape[0]) / n_rel).sum())
    if t2i_ranks is None:
        t2i_ranks = embedding_ranks(img, txt, ci, block_rows=block_rows)["t2i"]
    t2i = np.asarray(t2i_ranks, dtype=np.float64)
    return {"i2t": 100.0 * ap_sum / n_images, "t2i": 100.0 * float(np.mean(1.0 / t2i))}


def top_k(scores: Any, k: int) -> np.ndarray:
    """The first ``k`` gallery indices of every query under the tie rule.

    ``scores (n_queries, n_gallery)`` -> ``(n_queries, min(k, n_gallery)) int64``, best first
    (descending score, ascending index among equal scores). Uses a partition and sorts only the
    candidates, so it is O(n_gallery) per query.
    """
    s = as_numpy(scores)
    if s.ndim != 2:
        raise CrossViewError(f"scores must be (n_queries, n_gallery), got shape {s.shape}")
    if k < 1:
        raise CrossViewError(f"k must be >= 1, got {k}")
    n_q, n_g = s.shape
    k = min(k, n_g)
    out = np.empty((n_q, k), dtype=np.int64)
    if n_q == 0 or k == 0:
        return out
    step = max(1, _CHUNK_ELEMENTS // n_g)
    for start in range(0, n_q, step):
        stop = min(n_q, start + step)
        block = s[start:stop]
        kth = -np.partition(-block, k - 1, axis=1)[:, k - 1]    # k-th largest score per query
        rows, cols = np.nonzero(block >= kth[:, None])           # >= k candidates per row
        vals = block[rows, cols]
        order = np.lexsort((cols, -vals, rows))                  # by row, score desc, index asc
        rows, cols = rows[order], cols[order]
        first = np.searchsorted(rows, np.arange(stop - start))   # where each row's run starts
        pos = np.arange(rows.size) - first[rows]
        keep = pos < k
        out[start + rows[keep], pos[keep]] = cols[keep]
    return out
