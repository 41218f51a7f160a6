"""How much better is B than A on the same queries, and how sure can we be: the paired effect of two variants.

Two retrieval runs evaluated on the same split rank the same queries, so they can be compared query by query.
What is *not* independent must not be counted as if it were: the seeds of one variant rank the same images (three
seeds are not three times the data), and the captions of one image are not independent text queries. So:

- **seeds are averaged first**: per query, the hit indicator ``[rank <= K]`` and the rank are averaged over the
  seeds of that variant (A and B may have different seed counts), and each query is one observation;
- **the image is the resampling unit**: a cluster bootstrap (as :mod:`crossview.eval.bootstrap` does for one
  run) draws the images with replacement and every drawn image brings all its captions along, so the t2i
  queries of one image move together;
- the result is the **effect with its interval** (R@K both ways, the median rank change, rsum: B - A, 95%
  percentile intervals), not only a p-value, and the **minimal detectable effect**: the difference this design
  finds with 80% power at a two-sided 5% level, ``(z_0.975 + z_0.80) x`` the bootstrap standard error of the
  difference. A true difference smaller than that would usually go unseen, so "no significant difference"
  below it says little.

p-values: per direction, the two-sided exact sign test over *images* (t2i: an image's captions' rank changes are
averaged into one observation first; images whose change is 0 are dropped); for rsum, the bootstrap's (twice the
share of resamples on the far side of 0, with the usual +1 so it is never 0).

Without a caption -> image map (``caption_image=None``, e.g. an old ranks.npz) the t2i queries cannot be
clustered: each caption is then its own cluster, drawn independently of the images, and the result says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.eval.compare import sign_test

__all__ = ["paired_effect", "paired_mean_difference"]

DIRECTIONS = ("i2t", "t2i")
DEFAULT_RESAMPLES = 2000
RESAMPLED = "images (each with its captions); seeds averaged per query first"
RESAMPLED_NO_MAP = ("images for i2t, captions for t2i (no caption -> image map: each caption its own cluster); "
                    "seeds averaged per query first")
EFFECT = ("B - A (A: the baseline, B: the variant): a positive R@K / rsum difference favours B; a negative rank "
          "change means B ranks the ground truth higher")
P_METHOD = ("per direction: two-sided exact sign test over images (t2i: each image's captions averaged first; "
            "ties dropped); rsum: the bootstrap's (twice the share of resamples on the far side of 0)")
P_METHOD_NO_MAP = ("per direction: two-sided exact sign test over images (i2t) and captions (t2i, no caption -> "
                   "image map); ties dropped; rsum: the bootstrap's (twice the share of resamples on the far side "
                   "of 0)")
#: rows of the (resamples, queries) weight matrix handled at once: bounds the memory of the bootstrap medians
_CHUNK_CELLS = 2_000_000


def _z_power(alpha: float = 0.05, power: float = 0.80) -> float:
    from scipy.stats import norm

    return float(norm.ppf(1 - alpha / 2) + norm.ppf(power))


def _ranks(which: str, ranks: Any) -> dict[str, np.ndarray]:
    """``{"i2t": (n_seeds, n_images), "t2i": (n_seeds, n_captions)}`` int64, checked."""
    if not isinstance(ranks, Mapping) or any(d not in ranks for d in DIRECTIONS):
        got = sorted(ranks) if isinstance(ranks, Mapping) else type(ranks).__name__
        raise CrossViewError(f"paired comparison: {which}'s ranks need both 'i2t' and 't2i' (got {got})")
    out = {}
    for d in DIRECTIONS:
        try:
            r = np.asarray(ranks[d])
        except ValueError:                              # ragged lists: seeds of different lengths
            raise CrossViewError(f"paired comparison: {which}'s {d} seeds ranked different numbers of queries; "
                                 "give seeds evaluated on the same split") from None
        if r.ndim == 1:
            r = r[None, :]
        if r.ndim != 2 or r.shape[0] == 0 or r.shape[1] == 0:
            raise CrossViewError(f"paired comparison: {which}'s {d} ranks must be (n_queries,) or "
                                 f"(n_seeds, n_queries) and not empty, got shape {r.shape}")
        if not np.issubdtype(r.dtype, np.integer):
            if not np.issubdtype(r.dtype, np.number) or not np.all(np.isfinite(r)) or np.any(r != np.round(r)):
                raise CrossViewError(f"paired comparison: {which}'s {d} ranks must be whole numbers (1 = the "
                                     "ground truth first)")
        r = r.astype(np.int64)
        if r.min() < 1:
            raise CrossViewError(f"paired comparison: {which}'s {d} ranks hold {int(r.min())}; ranks are 1-based "
                                 "(1 = the ground truth first)")
        out[d] = r
    return out


def _mv(m: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``m (B, n) @ x (n,)``: einsum's own loop, because a threaded BLAS call for one matrix-vector product
    costs several times more on a busy machine."""
    return np.einsum("ij,j->i", m, x)


def _draws(n_images: int, n_captions: int, caption_image: np.ndarray | None, resamples: int,
           seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bootstrap's draws: ``(image_counts (B, n_images), t2i cluster of each caption (n_captions,),
    t2i cluster counts (B, n_clusters))``, int64. Resample ``b`` draws the images
    ``default_rng(seed).integers(0, n_images, (B, n_images))[b]``; without a caption map, the captions are
    drawn next from the same generator, ``integers(0, n_captions, (B, n_captions))``. (Index draws counted with
    one bincount are many times faster than ``multinomial`` rows, and the same distribution.)"""
    rng = np.random.default_rng(seed)

    def counts(n: int) -> np.ndarray:
        idx = rng.integers(0, n, size=(resamples, n))
        flat = (np.arange(resamples)[:, None] * n + idx).ravel()
        return np.bincount(flat, minlength=resamples * n).reshape(resamples, n)

    img = counts(n_images)
    if caption_image is not None:
        return img, caption_image, img
    return img, np.arange(n_captions), counts(n_captions)


def _medians_at(counts: np.ndarray, rows: np.ndarray, cl: np.ndarray, v: np.ndarray, offset: np.ndarray,
                t_lo: np.ndarray, t_hi: np.ndarray) -> np.ndarray:
    """For ``rows`` of ``counts``, ``(v[j_lo] + v[j_hi]) / 2`` where ``j`` is the first column whose running
    weight (``offset`` + the cumulative ``counts[row, cl]``) passes the target position ``t_lo`` / ``t_hi``."""
    out = np.empty(rows.size)
    step = max(1, _CHUNK_CELLS // max(cl.size, 1))
    for s in range(0, rows.size, step):
        c = np.cumsum(counts[rows[s:s + step, None], cl[None, :]], axis=1)
        c += offset[s:s + step, None]
        lo = np.argmax(c > t_lo[s:s + step, None], axis=1)
        hi = np.argmax(c > t_hi[s:s + step, None], axis=1)
        out[s:s + step] = (v[lo] + v[hi]) / 2
    return out


def _weighted_medians(values: np.ndarray, cluster: np.ndarray, counts: np.ndarray,
                      counts_f: np.ndarray) -> np.ndarray:
    """Per resample, ``np.median`` of the queries repeated as often as their cluster was drawn:
    ``values (n,)``, ``cluster (n,)`` into ``counts (B, n_clusters)`` (``counts_f``: the same as float64)
    -> ``(B,)`` (0 where nothing was drawn).

    A resample's median sits near the middle of the sorted values (its position moves by at most about
    ``0.5 / sqrt(n_clusters)`` of them per standard deviation), so the running weights are summed over a
    window of +-6 of those around the middle only; rows whose median falls outside the window (checked
    exactly from the weight before and through it) are done over all values."""
    n, n_cl = values.size, counts.shape[1]
    order = np.argsort(values, kind="stable")
    v, cl = values[order], cluster[order]

    def weight(of: np.ndarray) -> np.ndarray:          # per resample, how many copies of these queries
        return np.rint(_mv(counts_f, np.bincount(of, minlength=n_cl).astype(np.float64))).astype(np.int64)

    total = weight(cl)
    t_lo, t_hi = (total - 1) // 2, total // 2          # np.median of N values: mean of these two positions
    half = int(np.ceil(n * min(0.5, 3.0 / np.sqrt(n_cl))))
    s, e = max(0, n // 2 - half), min(n, n // 2 + half + 1)
    before, through = weight(cl[:s]), weight(cl[:e])
    inside = (before <= t_lo) & (through > t_hi)
    out = np.zeros(counts.shape[0])
    rows = np.flatnonzero(inside)
    if rows.size:
        out[rows] = _medians_at(counts, rows, cl[s:e], v[s:e], before[rows], t_lo[rows], t_hi[rows])
    rows = np.flatnonzero(~inside & (total > 0))
    if rows.size:
        out[rows] = _medians_at(counts, rows, cl, v, np.zeros(rows.size, np.int64), t_lo[rows], t_hi[rows])
    return out


def paired_effect(ranks_a: Mapping[str, Any], ranks_b: Mapping[str, Any], caption_image: Any | None, *,
                  ks: Sequence[int] = (1, 5, 10), level: float = 0.95, resamples: int = DEFAULT_RESAMPLES,
                  seed: int = 0) -> dict[str, Any]:
    """The paired effect of B against A on the same queries (see the module docstring); effect = B - A.

    ``ranks_a``, ``ranks_b``: ``{"i2t": ..., "t2i": ...}`` of 1-based ranks, each ``(n_queries,)`` for one run or
    ``(n_seeds, n_queries)`` for several seeds of one variant (the seed counts of A and B may differ; the
    queries must be the same, in the same order). i2t queries are the ``n_images`` images, t2i queries the
    captions; ``caption_image (n_captions,)`` maps each caption to its image (``None``: unknown, each caption
    its own cluster). R@K and rsum are percentages; rsum is the sum of R@K over ``ks`` both ways.

    Returns a JSON-ready dict: ``n_images``, ``n_captions``, ``seeds_a``, ``seeds_b``, ``resamples``, ``level``,
    ``ks``, ``resampled``, ``effect``, ``p_method``; per direction ``{"queries", "R@K": {"a", "b", "diff",
    "ci"}, "median_rank_change": {"value", "ci"}, "won", "lost", "tied" (queries, seed-averaged ranks),
    "images_better", "images_worse", "images_same", "p"}``; ``rsum: {"a", "b", "diff", "ci", "se", "p"}``;
    ``mde: {"rsum", "i2t R@1", "t2i R@1", "explanation"}`` (R@1 only when 1 is in ``ks``).
    """
    A, B = _ranks("A", ranks_a), _ranks("B", ranks_b)
    for d in DIRECTIONS:
        if A[d].shape[1] != B[d].shape[1]:
            raise CrossViewError(f"paired comparison: A ranked {A[d].shape[1]} {d} queries and B "
                                 f"{B[d].shape[1]}; compare runs evaluated on the same split (same queries, "
                                 "same order)")
    n_img, n_cap = A["i2t"].shape[1], A["t2i"].shape[1]
    if caption_image is not None:
        ci = np.asarray(caption_image).ravel()
        if ci.size != n_cap:
            raise CrossViewError(f"paired comparison: caption_image maps {ci.size} captions but the runs ranked "
                                 f"{n_cap} t2i queries; pass the caption_image of the evaluated split")
        if not np.issubdtype(ci.dtype, np.integer):
            raise CrossViewError(f"paired comparison: caption_image must hold image indices (integers), got "
                                 f"{ci.dtype}")
        bad = ci[(ci < 0) | (ci >= n_img)]
        if bad.size:
            raise CrossViewError(f"paired comparison: caption_image holds image {int(bad[0])}, outside "
                                 f"0..{n_img - 1} (the runs ranked {n_img} images); pass the evaluated split's map")
        ci = ci.astype(np.int64)
    else:
        ci = None
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise CrossViewError(f"paired comparison: K must be positive integers, got {ks}")
    if not 0 < level < 1:
        raise CrossViewError(f"paired comparison: level must be between 0 and 1, got {level}")
    if isinstance(resamples, bool) or int(resamples) != resamples or resamples < 10:
        raise CrossViewError(f"paired comparison: resamples must be a whole number >= 10, got {resamples}")
    resamples = int(resamples)

    sa, sb = A["i2t"].shape[0], B["i2t"].shape[0]
    if A["t2i"].shape[0] != sa or B["t2i"].shape[0] != sb:
        raise CrossViewError("paired comparison: each variant needs as many seeds of i2t ranks as of t2i ranks")

    counts_img, t_cluster, counts_t = _draws(n_img, n_cap, ci, resamples, seed)
    n_t = counts_t.shape[1]
    size_t = np.bincount(t_cluster, minlength=n_t).astype(np.float64)
    cl = {"i2t": (np.arange(n_img), counts_img, n_img), "t2i": (t_cluster, counts_t, n_t)}
    img_f = counts_img.astype(np.float64)              # float copies for the matrix-vector products
    counts_f = {"i2t": img_f, "t2i": img_f if counts_t is counts_img else counts_t.astype(np.float64)}
    # how many queries each resample holds: the R@K denominators (t2i: the captions its images bring)
    denom = {"i2t": np.full(resamples, float(n_img)), "t2i": np.maximum(_mv(counts_f["t2i"], size_t), 1.0)}
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]

    def ci_of(x: np.ndarray) -> list[float]:
        return [float(v) for v in np.percentile(x, q)]

    out: dict[str, Any] = {"effect": EFFECT, "n_images": int(n_img), "n_captions": int(n_cap), "seeds_a": sa,
                           "seeds_b": sb, "resamples": resamples, "level": float(level), "seed": int(seed),
                           "ks": ks, "resampled": RESAMPLED if ci is not None else RESAMPLED_NO_MAP,
                           "p_method": P_METHOD if ci is not None else P_METHOD_NO_MAP}
    boot_rsum = np.zeros(resamples)
    point = {"a": 0.0, "b": 0.0}
    boot_r1: dict[str, np.ndarray] = {}
    for d in DIRECTIONS:
        a, b = A[d], B[d]
        cluster, counts, n_cl = cl[d]
        # sa * sb * (mean rank of B - mean rank of A), an integer, so won / lost / tied are exact
        d_int = sa * b.sum(axis=0) - sb * a.sum(axis=0)
        delta = d_int / (sa * sb)                                       # (n_queries,) seed-averaged change
        res: dict[str, Any] = {"queries": int(a.shape[1])}
        for k in ks:
            ha, hb = (a <= k).mean(axis=0), (b <= k).mean(axis=0)
            per_cl = np.bincount(cluster, weights=hb - ha, minlength=n_cl)
            boot = 100 * _mv(counts_f[d], per_cl) / denom[d]
            ra, rb = 100 * float(ha.mean()), 100 * float(hb.mean())
            res[f"R@{k}"] = {"a": ra, "b": rb, "diff": rb - ra, "ci": ci_of(boot)}
            boot_rsum += boot
            point["a"] += ra
            point["b"] += rb
            if k == 1:
                boot_r1[d] = boot
        res["median_rank_change"] = {"value": float(np.median(delta)),
                                     "ci": ci_of(_weighted_medians(delta, cluster, counts, counts_f[d]))}
        res["won"], res["lost"] = int((d_int < 0).sum()), int((d_int > 0).sum())
        res["tied"] = int(d_int.size - res["won"] - res["lost"])
        per_img = np.bincount(cluster, weights=d_int, minlength=n_cl)[size_t > 0 if d == "t2i" else slice(None)]
        better, worse = int((per_img < 0).sum()), int((per_img > 0).sum())
        res.update(images_better=better, images_worse=worse, images_same=int(per_img.size - better - worse),
                   p=sign_test(better, worse))
        out[d] = res
    far = min(int((boot_rsum <= 0).sum()), int((boot_rsum >= 0).sum()))
    se = float(np.std(boot_rsum, ddof=1))
    out["rsum"] = {"a": point["a"], "b": point["b"], "diff": point["b"] - point["a"], "ci": ci_of(boot_rsum),
                   "se": se, "p": min(1.0, 2 * (far + 1) / (resamples + 1))}
    z = _z_power()
    out["mde"] = {"rsum": z * se, **{f"{d} R@1": z * float(np.std(boot_r1[d], ddof=1)) for d in boot_r1},
                  "explanation": f"the smallest true difference this design detects with 80% power at a two-sided "
                                 f"5% level: (z_0.975 + z_0.80) = {z:.2f} x the bootstrap standard error of the "
                                 "difference"}
    return out


def paired_mean_difference(a: Any, b: Any, *, level: float = 0.95, resamples: int = DEFAULT_RESAMPLES,
                           seed: int = 0) -> dict[str, Any]:
    """B - A of a per-query score on the same queries (e.g. each query's average precision), each query one
    observation: the mean difference with its percentile bootstrap interval (queries drawn with replacement), the
    bootstrap standard error, the minimal detectable difference (80% power, two-sided 5%: ``(z_0.975 + z_0.80) x``
    that error) and the two-sided exact sign test over the queries (ties dropped).

    ``a``, ``b``: ``(n_queries,)``, or ``(n_seeds, n_queries)`` for several seeds of a variant (averaged per query
    first). Returns ``{"a", "b", "diff", "ci", "se", "mde", "p", "queries", "better", "worse"}`` (means of A and B).
    """
    def per_query(which: str, x: Any) -> np.ndarray:
        arr = np.asarray(x, dtype=np.float64)
        if arr.ndim == 2:
            arr = arr.mean(axis=0)
        if arr.ndim != 1 or arr.size == 0:
            raise CrossViewError(f"paired comparison: {which} needs one score per query, (n_queries,) or "
                                 f"(n_seeds, n_queries), got shape {np.shape(x)}")
        if not np.isfinite(arr).all():
            raise CrossViewError(f"paired comparison: {which} holds NaN or infinite scores; leave out the queries "
                                 "without a score first")
        return arr

    x, y = per_query("A", a), per_query("B", b)
    if x.size != y.size:
        raise CrossViewError(f"paired comparison: A scored {x.size} queries and B {y.size}; compare the same queries")
    if not 0 < level < 1:
        raise CrossViewError(f"paired comparison: level must be between 0 and 1, got {level}")
    if isinstance(resamples, bool) or int(resamples) != resamples or resamples < 10:
        raise CrossViewError(f"paired comparison: resamples must be a whole number >= 10, got {resamples}")
    d = y - x
    n = d.size
    rng = np.random.default_rng(seed)
    boot = np.empty(int(resamples))
    step = max(1, _CHUNK_CELLS // n)
    for start in range(0, int(resamples), step):
        stop = min(int(resamples), start + step)
        boot[start:stop] = d[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    se = float(np.std(boot, ddof=1))
    better, worse = int((d > 0).sum()), int((d < 0).sum())
    return {"a": float(x.mean()), "b": float(y.mean()), "diff": float(d.mean()),
            "ci": [float(v) for v in np.percentile(boot, q)], "se": se, "mde": _z_power() * se,
            "p": sign_test(better, worse), "queries": int(n), "better": better, "worse": worse}
