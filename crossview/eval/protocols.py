"""Evaluation protocols: COCO 5K / 1K, identity hits (CUHK-PEDES, CUB), P@K and mAP (labels, phrases).

All of them use the tie rule of :mod:`crossview.eval.metrics`: a query's gallery is ordered by
descending score, equal scores by ascending gallery index.

COCO 1K
-------
The 5,000 test images are cut into five folds of 1,000 consecutive images; each fold is evaluated
on its own images and their captions, and every metric (R@K, MedR, MeanR) is the mean over the
folds. rsum is the sum of the six *averaged* R@K. (The official VSE++ script prints
``mean(ar) * 6`` -- six times the averaged i2t recall -- as the 1K rsum, which is too large
whenever i2t beats t2i; we do not copy that.)

P@K and mAP
-----------
``relevance (n_queries, n_gallery) bool`` says which gallery items are relevant to each query
(build it from label sets with :func:`relevance_from_label_sets`). P@K = (number of relevant items
in the top K) / K, averaged over all queries. AP of one query = the mean, over its relevant items,
of the precision at that item's rank (the standard, uninterpolated definition over the whole
ranking); mAP averages AP over the queries that have at least one relevant item -- queries without
any are excluded (their AP is undefined) and their number is reported. P@K and mAP are percentages.

Labels / phrases both ways (:func:`label_retrieval_metrics`, the BITR paper's Experiments 3 and 4): one
``(n_images, n_labels)`` score matrix; i2t ranks the labels for each image (a row), t2i the images for each
label (a column). In each direction P@K and mAP are over the queries with at least one relevant item.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.eval.metrics import (
    as_numpy,
    evaluate,
    first_relevant_ranks,
    rsum_of,
)

__all__ = [
    "coco_5k",
    "coco_1k",
    "coco_1k_folds",
    "check_coco_size",
    "identity_hits",
    "precision_at_k",
    "mean_average_precision",
    "relevance_from_label_sets",
    "label_retrieval_metrics",
]

ScoresFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``fn(image_ids (a,) int64, caption_ids (b,) int64) -> scores (a, b)``."""

_CHUNK_ELEMENTS = 1 << 22


COCO_5K_IMAGES = 5000
COCO_1K_FOLD = 1000


def check_coco_size(protocol: str, n_images: int) -> int:
    """The folds of ``protocol`` for a split of ``n_images`` images: 1 for ``coco5k`` (exactly 5,000 images), ``n /
    1000`` for ``coco1k`` (a multiple of 1,000: COCO's 5K test split is five folds), 1 for any other protocol.
    A size that does not fit is one clear :class:`CrossViewError` naming the protocol, the size and what to do."""
    if protocol == "coco5k" and n_images != COCO_5K_IMAGES:
        raise CrossViewError(f"COCO 5K needs the 5,000-image test split, got {n_images:,} images; "
                             "use --protocol standard")
    if protocol == "coco1k":
        if n_images < COCO_1K_FOLD or n_images % COCO_1K_FOLD:
            raise CrossViewError(f"COCO 1K needs a multiple of 1,000 test images, got {n_images:,}; "
                                 "use --protocol standard")
        return n_images // COCO_1K_FOLD
    return 1


def coco_5k(scores: Any, caption_image: Any, ks: Sequence[int] = (1, 5, 10)) -> dict[str, Any]:
    """COCO 5K: :func:`~crossview.eval.metrics.evaluate` on the whole test matrix."""
    return evaluate(scores, caption_image, ks)


FoldFn = Callable[[np.ndarray, np.ndarray, np.ndarray], dict[str, Any]]
"""``fn(image_ids (a,) int64, caption_ids (b,) int64, fold_caption_image (b,) int64 in [0, a)) -> {"i2t": {...},
"t2i": {...}, ...}``: the metrics of one fold's images against its own captions."""


def coco_1k_folds(evaluate_fold: FoldFn, caption_image: Any, ks: Sequence[int] = (1, 5, 10),
                  n_folds: int = 5, fold_size: int = COCO_1K_FOLD) -> dict[str, Any]:
    """COCO 1K over any evaluation of one fold: ``evaluate_fold`` is called once a fold (``n_folds`` folds of
    ``fold_size`` consecutive images, each with the captions of its images, in caption order) and every metric is
    the mean over the folds; rsum is the sum of the six averaged R@K (module docstring). Only one fold's scores need
    exist at a time. Returns ``{"i2t", "t2i", "rsum", "folds": [what evaluate_fold returned, ...]}``."""
    ci = as_numpy(caption_image)
    n_images = n_folds * fold_size
    if ci.ndim != 1 or not np.issubdtype(ci.dtype, np.integer):
        raise CrossViewError(f"caption_image must be a 1-D integer array, got {ci.dtype} {ci.shape}")
    ci = ci.astype(np.int64, copy=False)
    if ci.size and (ci.min() < 0 or ci.max() >= n_images):
        raise CrossViewError(
            f"caption_image refers to image {int(ci.max())}, outside the {n_images} images of "
            f"{n_folds} folds of {fold_size}")
    folds = []
    for f in range(n_folds):
        lo, hi = f * fold_size, (f + 1) * fold_size
        caps = np.flatnonzero((ci >= lo) & (ci < hi))
        folds.append(evaluate_fold(np.arange(lo, hi, dtype=np.int64), caps, ci[caps] - lo))
    i2t = {key: float(np.mean([fr["i2t"][key] for fr in folds])) for key in folds[0]["i2t"]}
    t2i = {key: float(np.mean([fr["t2i"][key] for fr in folds])) for key in folds[0]["t2i"]}
    return {"i2t": i2t, "t2i": t2i, "rsum": rsum_of(i2t, t2i, ks), "folds": folds}


def coco_1k(scores: Any | ScoresFn, caption_image: Any, ks: Sequence[int] = (1, 5, 10),
            n_folds: int = 5, fold_size: int = COCO_1K_FOLD) -> dict[str, Any]:
    """COCO 1K: mean metrics over ``n_folds`` folds of ``fold_size`` consecutive images.

    ``scores`` is the full ``(n_images, n_captions)`` matrix with ``n_images == n_folds *
    fold_size``, or a function ``fn(image_ids, caption_ids) -> (a, b)`` that scores one fold
    (so the full matrix never has to exist). ``caption_image (n_captions,)``.

    Returns ``{"i2t": {...}, "t2i": {...}, "rsum": float, "folds": [{"i2t", "t2i", "rsum"}, ...]}``,
    the metrics being the fold means.
    """
    ci = as_numpy(caption_image)
    n_images = n_folds * fold_size
    full = None
    if not callable(scores):
        full = as_numpy(scores)
        if full.ndim != 2 or full.shape != (n_images, ci.shape[0] if ci.ndim == 1 else -1):
            raise CrossViewError(
                f"COCO 1K needs a ({n_images}, {ci.shape[0] if ci.ndim == 1 else '?'}) score matrix ({n_folds} "
                f"folds of {fold_size} images, one column per caption), got {full.shape}; pass n_folds/"
                "fold_size matching your test split")

    def one(images: np.ndarray, caps: np.ndarray, fold_ci: np.ndarray) -> dict[str, Any]:
        if full is not None:
            sub = full[images[0]:images[-1] + 1][:, caps]
        else:
            sub = as_numpy(scores(images, caps))
            if sub.shape != (images.size, caps.size):
                raise CrossViewError(
                    f"the scores function returned shape {sub.shape} for fold {images[0] // fold_size}, expected "
                    f"({images.size}, {caps.size})")
        res = evaluate(sub, fold_ci, ks)
        return {"i2t": res["i2t"], "t2i": res["t2i"], "rsum": res["rsum"]}

    return coco_1k_folds(one, ci, ks, n_folds, fold_size)


def _encode_labels(*arrays: Any) -> list[np.ndarray]:
    """Map any hashable labels to shared int64 codes (so ``==`` works for strings too)."""
    arrs = [as_numpy(a) for a in arrays]
    for a in arrs:
        if a.ndim != 1:
            raise CrossViewError(f"labels must be 1-D, got shape {a.shape}")
    if all(np.issubdtype(a.dtype, np.integer) for a in arrs):
        return [a.astype(np.int64, copy=False) for a in arrs]
    _, inv = np.unique(np.concatenate([a.astype(object) for a in arrs]).astype(str),
                       return_inverse=True)
    out, start = [], 0
    for a in arrs:
        out.append(inv[start:start + a.size].astype(np.int64))
        start += a.size
    return out


def identity_hits(scores: Any, image_labels: Any, caption_labels: Any,
                  ks: Sequence[int] = (1, 5, 10)) -> dict[str, Any]:
    """Identity / class retrieval hits (CUHK-PEDES person ids, CUB classes).

    ``scores (n_images, n_captions)``, ``image_labels (n_images,)``, ``caption_labels
    (n_captions,)``. t2i: a caption query hits at K when one of its top-K images has the caption's
    label; i2t: an image query hits at K when one of its top-K captions has the image's label.
    A query whose label has no match in the gallery always misses.

    Returns ``{"t2i": {"R@K": percent}, "i2t": {...}, "ranks": {"t2i", "i2t"}}`` where the ranks
    are those of the first matching item (0 when there is none).
    """
    s = as_numpy(scores)
    il, cl = _encode_labels(image_labels, caption_labels)
    if s.ndim != 2 or s.shape != (il.size, cl.size):
        raise CrossViewError(
            f"scores must be (n_images, n_captions) = ({il.size}, {cl.size}) to match the labels, "
            f"got {s.shape}")
    if np.isnan(s).any():
        raise CrossViewError("scores contain NaN; ranks are undefined")
    r_t2i = first_relevant_ranks(s.T, cl, il)
    r_i2t = first_relevant_ranks(s, il, cl)

    def hits(r: np.ndarray) -> dict[str, float]:
        if r.size == 0:
            raise CrossViewError("identity_hits got no queries")
        return {f"R@{k}": float(100.0 * np.count_nonzero((r > 0) & (r <= k)) / r.size) for k in ks}

    return {"t2i": hits(r_t2i), "i2t": hits(r_i2t), "ranks": {"t2i": r_t2i, "i2t": r_i2t}}


def relevance_from_label_sets(query_sets: Sequence[Iterable[Hashable]],
                              gallery_sets: Sequence[Iterable[Hashable]]) -> np.ndarray:
    """``(n_queries, n_gallery) bool``: True where the query's and the item's label sets intersect."""
    vocab: dict[Hashable, int] = {}
    q_sets = [[vocab.setdefault(x, len(vocab)) for x in set(labels)] for labels in query_sets]
    g_sets = [[vocab.setdefault(x, len(vocab)) for x in set(labels)] for labels in gallery_sets]
    qh = np.zeros((len(q_sets), max(1, len(vocab))), dtype=np.float32)
    gh = np.zeros((len(g_sets), max(1, len(vocab))), dtype=np.float32)
    for i, ids in enumerate(q_sets):
        qh[i, ids] = 1.0
    for j, ids in enumerate(g_sets):
        gh[j, ids] = 1.0
    return (qh @ gh.T) > 0.5


def _check_relevance(scores: Any, relevance: Any) -> tuple[np.ndarray, np.ndarray]:
    s = as_numpy(scores)
    rel = as_numpy(relevance)
    if s.ndim != 2:
        raise CrossViewError(f"scores must be (n_queries, n_gallery), got shape {s.shape}")
    if rel.shape != s.shape:
        raise CrossViewError(f"relevance has shape {rel.shape}, scores has {s.shape}; they must match")
    if np.isnan(s).any():
        raise CrossViewError("scores contain NaN; rankings are undefined")
    return s, rel.astype(bool, copy=False)


def precision_at_k(scores: Any, relevance: Any, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """P@K in percent, averaged over all queries.

    ``scores (n_queries, n_gallery)``, ``relevance (n_queries, n_gallery) bool``. Computed by
    counting (the K-th largest score from a partition, then the tie rule), not by sorting rows.
    """
    s, rel = _check_relevance(scores, relevance)
    n_q, n_g = s.shape
    if n_q == 0:
        raise CrossViewError("precision_at_k got no queries")
    for k in ks:
        if not 1 <= k <= n_g:
            raise CrossViewError(f"P@{k} needs 1 <= K <= n_gallery ({n_g})")
    totals = {k: 0.0 for k in ks}
    step = max(1, _CHUNK_ELEMENTS // max(1, n_g))
    for start in range(0, n_q, step):
        stop = min(n_q, start + step)
        block, r = s[start:stop], rel[start:stop]
        part = np.partition(-block, [k - 1 for k in ks], axis=1)
        for k in ks:
            kth = -part[:, k - 1]                                # K-th largest score per query
            above = block > kth[:, None]
            rel_above = (above & r).sum(axis=1)
            free = k - above.sum(axis=1)                         # slots left for items == kth
            tied = block == kth[:, None]
            # tied items fill the free slots in ascending index order
            take = tied & (np.cumsum(tied, axis=1) <= free[:, None])
            totals[k] += float(((rel_above + (take & r).sum(axis=1)) / k).sum())
    return {f"P@{k}": 100.0 * totals[k] / n_q for k in ks}


def average_precisions(scores: Any, relevance: Any) -> np.ndarray:
    """Each query's average precision in percent, ``(n_queries,) float64``; NaN for a query with no relevant item.

    ``scores (n_queries, n_gallery)``, ``relevance (n_queries, n_gallery) bool``; tie rule: equal scores rank by
    ascending index.
    """
    s, rel = _check_relevance(scores, relevance)
    n_q, n_g = s.shape
    out = np.full(n_q, np.nan)
    step = max(1, _CHUNK_ELEMENTS // max(1, n_g))
    pos = np.arange(1, n_g + 1, dtype=np.float64)
    for start in range(0, n_q, step):
        stop = min(n_q, start + step)
        order = np.argsort(-s[start:stop], axis=1, kind="stable")   # tie rule: smaller index first
        rs = np.take_along_axis(rel[start:stop], order, axis=1)
        n_rel = rs.sum(axis=1)
        prec = np.cumsum(rs, axis=1) / pos[None, :]
        ok = n_rel > 0
        out[start:stop][ok] = 100.0 * (prec * rs).sum(axis=1)[ok] / n_rel[ok]
    return out


def mean_average_precision(scores: Any, relevance: Any) -> dict[str, float]:
    """mAP in percent: ``{"mAP": float, "n_queries": int, "n_excluded": int}``.

    ``scores (n_queries, n_gallery)``, ``relevance (n_queries, n_gallery) bool``. Queries with no
    relevant item are excluded (``n_excluded``); raises when none is left. (:func:`average_precisions` averaged.)
    """
    ap = average_precisions(scores, relevance)
    used = ap[~np.isnan(ap)]
    if used.size == 0:
        raise CrossViewError("mean_average_precision: no query has a relevant gallery item")
    return {"mAP": float(used.mean()), "n_queries": int(used.size), "n_excluded": int(ap.size - used.size)}


def label_retrieval_metrics(scores: Any, relevance: Any, ks: Sequence[int] = (1, 5)) -> dict[str, dict[str, Any]]:
    """Image <-> label retrieval both ways, in percent.

    ``scores (n_images, n_labels)``: ``score(image, label)``; ``relevance (n_images, n_labels) bool``: the
    image has the label. ``"i2t"``: each image a query ranking the labels (a row); ``"t2i"``: each label a
    query ranking the images (a column). Per direction: ``{"P@K": %, ..., "mAP": %, "n_queries": int,
    "n_excluded": int}``, where queries with no relevant item (an unlabelled image, a label no image has) are
    excluded from P@K and mAP alike and counted in ``n_excluded``; a K larger than the direction's gallery is
    left out. Tie rule as everywhere: equal scores rank by ascending index. Raises when no image has a label.
    """
    s, rel = _check_relevance(scores, relevance)
    if not rel.any():
        raise CrossViewError("label_retrieval_metrics: no image has a relevant label")
    out: dict[str, dict[str, Any]] = {}
    for direction, (S, R) in (("i2t", (s, rel)), ("t2i", (s.T, rel.T))):
        has = R.any(axis=1)
        S_q, R_q = np.ascontiguousarray(S[has]), np.ascontiguousarray(R[has])
        kept = [k for k in ks if 1 <= k <= S.shape[1]]
        res: dict[str, Any] = dict(precision_at_k(S_q, R_q, kept)) if kept else {}
        res["mAP"] = mean_average_precision(S_q, R_q)["mAP"]
        res["n_queries"] = int(has.sum())
        res["n_excluded"] = int(has.size - has.sum())
        out[direction] = res
    return out
