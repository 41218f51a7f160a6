"""How far a metric on a small split can be trusted: bootstrap confidence intervals over the images.

A val split of 100 images moves rsum by tens of points from one draw of images to another, so two runs that
differ by less than that differ by noise. :func:`bootstrap_ci` resamples the *images* of the evaluated split
with replacement (each resampled image brings all its captions along: a cluster bootstrap, since the
captions of one image are not independent queries), recomputes R@K both ways and rsum from the per-query
ranks for every resample, and reports percentile intervals. The ranks are not recomputed against the
resampled gallery: the interval is for the reported ranks' mean over the population of queries, which is
what comparing two runs on the same gallery needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError

__all__ = ["bootstrap_ci", "DEFAULT_RESAMPLES"]

DEFAULT_RESAMPLES = 1000


def bootstrap_ci(i2t_ranks: Any, t2i_ranks: Any, caption_image: Any, ks: Sequence[int] = (1, 5, 10),
                 level: float = 0.95, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """Percentile intervals of R@K (both ways) and rsum under a bootstrap over images.

    ``i2t_ranks (n_images,)``, ``t2i_ranks (n_captions,)`` are 1-based ranks; ``caption_image (n_captions,)``
    maps captions to images. Returns ``{"level", "resamples", "unit": "images", "n": n_images,
    "i2t": {"R@K": [lo, hi]}, "t2i": {...}, "rsum": [lo, hi]}`` (percentages).
    """
    r_i = np.asarray(i2t_ranks, dtype=np.int64).ravel()
    r_t = np.asarray(t2i_ranks, dtype=np.int64).ravel()
    ci = np.asarray(caption_image, dtype=np.int64).ravel()
    n = r_i.size
    if n == 0 or r_t.size != ci.size or (ci.size and (ci.min() < 0 or ci.max() >= n)):
        raise CrossViewError(f"bootstrap: {n} image ranks, {r_t.size} caption ranks and {ci.size} caption -> image "
                             "entries do not fit together")
    if not 0 < level < 1:
        raise CrossViewError(f"bootstrap: level must be between 0 and 1, got {level}")
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)   # (B, n)
    caps_per_image = np.bincount(ci, minlength=n).astype(np.float64)
    denom_t = counts @ caps_per_image
    lo_q, hi_q = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    out: dict[str, Any] = {"level": level, "resamples": int(resamples), "unit": "images", "n": int(n),
                           "i2t": {}, "t2i": {}}
    total = np.zeros(resamples)
    for k in ks:
        hit_i = (r_i <= k).astype(np.float64)
        hit_t = np.bincount(ci, weights=(r_t <= k).astype(np.float64), minlength=n)
        b_i = 100 * (counts @ hit_i) / n
        b_t = 100 * (counts @ hit_t) / np.maximum(denom_t, 1)
        out["i2t"][f"R@{k}"] = [float(np.percentile(b_i, lo_q)), float(np.percentile(b_i, hi_q))]
        out["t2i"][f"R@{k}"] = [float(np.percentile(b_t, lo_q)), float(np.percentile(b_t, hi_q))]
        total += b_i + b_t
    out["rsum"] = [float(np.percentile(total, lo_q)), float(np.percentile(total, hi_q))]
    return out
