"""Hubness-aware scoring: re-scoring a retrieval so that a few gallery items ("hubs") stop filling every list.

Every method scores a pair by a dot product (ARCHITECTURE.md, the method contract). In a high-dimensional
space some gallery items are near almost every query (:mod:`crossview.eval.hubness`); the scorings below
penalise them with statistics drawn from a **bank**: the embeddings of the run's *training* images and
captions, never the evaluation split (QB-Norm's query bank; using the test queries themselves would let the
evaluation split normalise itself).

For one direction, queries ``Q (n_q, D)`` of one modality against a gallery ``G (n_g, D)`` of the other, with
``s_ij = Q_i . G_j``, a bank ``B (n_b, D)`` of training items of the queries' modality and ``B' (n_b', D)``
of the gallery's modality:

``plain``
    ``s_ij`` (the default of a method not in :data:`crossview.engine.scoring.DEFAULT_SCORINGS`).
``csls`` (Conneau et al. 2018, cross-domain similarity local scaling; parameter ``k``)
    ``2 s_ij - r_Q(i) - r_G(j)``, where ``r_Q(i)`` is the mean of the ``k`` largest ``Q_i . B'_b`` (the
    query's nearest training items of the other modality) and ``r_G(j)`` the mean of the ``k`` largest
    ``B_b . G_j`` (how near the gallery item is to the training queries: large for a hub).
``isoftmax`` (Smith et al. 2017, inverted softmax; parameter ``beta``)
    ``log( exp(beta s_ij) / sum_b exp(beta B_b . G_j) )``: each gallery item's exponentiated scores
    normalised over the bank of queries (a column normalisation), kept as its logarithm (the same order, no
    overflow at large ``beta``).
``dsoftmax`` (Bogolin et al. 2022, QB-Norm with its dynamic inverted softmax; parameter ``beta``)
    the ``isoftmax`` score for a query whose plain top-1 gallery item is in the bank's *activation set* (the
    gallery items that are the plain top-1 of at least one bank query), and the plain ``s_ij`` for the other
    queries, which QB-Norm leaves alone so that the normalisation cannot hurt a query that meets no hub.
    Within one query all scores are of one kind, so its ranking is well defined.

Scores are formed one block of queries at a time (at most ``block_size`` queries and :data:`BLOCK_ELEMENTS`
scores, so a block stays ~32 MB however large the gallery or the bank: 1,024 queries of a 25,000-caption COCO
gallery were 205 MB a block, and a csls block held three such arrays), and the bank statistics one block of
gallery items (or bank queries) at a time: nothing ever holds the whole ``n_q x n_g`` matrix. The products are float64 (ties stay ties), but a float32 bank or gallery larger than
:data:`F64_COPY_BYTES` as float64 is not copied whole: its rows are taken to float64 a chunk at a time inside each
product (a 4,096-d WSABIE bank and test split at COCO size were 1.8 GB of such copies); smaller ones are copied
once (the same numbers, less conversion). :func:`evaluate_scoring` ranks the blocks as they come (the tie rule of :mod:`crossview.eval.metrics`)
and keeps only each query's top 10 for the hubness figure.

The parameter is chosen under the rule "selection never on the reported split", by the largest rsum (R@1 + R@5 +
R@10 both ways; the first in :data:`GRIDS` among equals), in one of two ways:

- :func:`select_scoring_cv` (the honest one): folds of the training images, each scored by a model trained on the
  *other* folds with a bank of those other folds' embeddings (the fold runs are made by
  :mod:`crossview.engine.cv_runs`); the mean rsum over the folds decides (``selected_on: "train-cv3"``).
- :func:`select_scoring` (quick): a hold-out of the run's own training bank scored against the rest. The run's
  model was fitted on those images, so every candidate scores near the ceiling (rsum ~595 of 600 on the Flickr8k
  sample) and the choice carries little signal: it is labelled in-sample (``"in_sample": true``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.progress import drive
from crossview.eval.hubness import DEFAULT_K, TOP_SHARE_K, hubness_from_top
from crossview.eval.metrics import first_relevant_ranks, rank_metrics, rsum_of, top_k

__all__ = ["SCORINGS", "PARAMS", "GRIDS", "DEFAULT_BLOCK", "BLOCK_ELEMENTS", "F64_COPY_BYTES", "check_scoring", "Scorer",
           "scorers_for", "evaluate_scoring", "select_scoring", "iter_select_scoring_cv", "select_scoring_cv",
           "subset_embeddings", "describe_scoring", "describe_scored"]

#: the scorings and what each is, for --help and the app's combo box
SCORINGS = {
    "plain": "the dot product / cosine of the embeddings (the default of a method without a default scoring)",
    "csls": "CSLS (Conneau et al. 2018): 2 cos - the mean cosine of each side's k nearest training items",
    "isoftmax": "inverted softmax (Smith et al. 2017): each item's exp(beta s) normalised over the training "
                "queries, kept as its logarithm (so its scores are negative; higher is better)",
    "dsoftmax": "dual softmax in QB-Norm's dynamic form (Bogolin et al. 2022): the inverted softmax over the "
                "training queries, for the queries whose top item is a hub of that bank",
}
#: the name of each scoring's parameter (None: it has none)
PARAMS: dict[str, str | None] = {"plain": None, "csls": "k", "isoftmax": "beta", "dsoftmax": "beta"}
#: the candidates :func:`select_scoring` tries, in order (the first wins among equal rsum)
GRIDS: dict[str, tuple[float, ...]] = {
    "csls": (1, 3, 5, 10, 20),
    "isoftmax": (1, 3, 10, 20, 30, 50, 100),
    "dsoftmax": (1, 3, 10, 20, 30, 50, 100),
}
#: queries (rows) per score block, at most
DEFAULT_BLOCK = 1024
#: float64 scores per block, at most (32 MB): a block has ``min(block_size, BLOCK_ELEMENTS // width)`` rows (at
#: least 1), ``width`` the gallery's or the bank's size, whichever the block is scored against is larger
BLOCK_ELEMENTS = 1 << 22
#: a float32 bank or gallery is copied to float64 once when the copy takes at most this many bytes (64 MB: the
#: Flickr8k banks and galleries); a larger one is converted a chunk at a time inside each product (a COCO-size
#: 4,096-d test split was 820 MB as float64; the conversions cost ~10-15% of the products' time there)
F64_COPY_BYTES = 1 << 26


def check_scoring(name: Any) -> str:
    """``name`` if it is a scoring of :data:`SCORINGS`, else one clear :class:`CrossViewError`."""
    if not isinstance(name, str) or name not in SCORINGS:
        raise CrossViewError(f"unknown scoring {name!r}; choose one of {', '.join(SCORINGS)}")
    return name


#: the largest csls k taken: more neighbours than any bank a run keeps (a larger one is a typo, not a setting)
MAX_K = 1_000_000


def _check_param(scoring: str, param: Any) -> float | None:
    if PARAMS[scoring] is None:
        return None
    what = PARAMS[scoring]
    value = None
    if not isinstance(param, bool) and isinstance(param, (int, float, np.integer, np.floating)):
        try:
            value = float(param)         # a Python int of any size: numpy's isfinite does not take it
        except OverflowError:
            value = None
    if value is None or not np.isfinite(value) or value <= 0:
        raise CrossViewError(f"{scoring}: {what} must be a positive number, got {param!r}")
    if what == "k":
        if value != int(value) or value > MAX_K:
            raise CrossViewError(f"csls: k must be a whole number from 1 to {MAX_K:,}, got {param!r}")
        return int(value)
    return value


def _floats(x: Any) -> np.ndarray:
    """``x`` in float64, or as it is when it is float32 and its float64 copy would exceed :data:`F64_COPY_BYTES`
    (:func:`_dot64` then converts it a chunk of rows at a time)."""
    a = np.asarray(x)
    if a.dtype == np.float32 and a.size * 8 > F64_COPY_BYTES:
        return a
    return np.asarray(a, np.float64)


def _dot64(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x @ y.T`` in float64 (``x`` a block of rows; ``y`` float64, or float32 taken to float64 a chunk of at most
    :data:`BLOCK_ELEMENTS` entries at a time)."""
    x = np.asarray(x, np.float64)
    if y.dtype == np.float64:
        return x @ y.T
    out = np.empty((x.shape[0], y.shape[0]))
    step = max(1, BLOCK_ELEMENTS // max(1, y.shape[1]))
    for c in range(0, y.shape[0], step):
        np.matmul(x, np.asarray(y[c:c + step], np.float64).T, out=out[:, c:c + step])
    return out


def _lse(x: np.ndarray) -> np.ndarray:
    """``log(sum(exp(x), axis=1))`` of ``x (n, m)`` without overflow."""
    m = x.max(axis=1)
    return m + np.log(np.exp(x - m[:, None]).sum(axis=1))


def _mean_top(x: np.ndarray, k: int) -> np.ndarray:
    """Mean of the ``k`` largest entries of each row of ``x (n, m)`` (all of them when ``k >= m``)."""
    k = min(k, x.shape[1])
    return np.partition(x, x.shape[1] - k, axis=1)[:, x.shape[1] - k:].mean(axis=1)


@dataclass
class Scorer:
    """One direction's scoring (see the module docstring): ``bank_queries (n_b, D)`` are training items of the
    queries' modality, ``bank_gallery (n_b', D)`` training items of the gallery's modality (used by ``csls``).
    :meth:`prepare` computes a gallery's statistics; :meth:`blocks` yields the scores block by block."""

    scoring: str
    param: float | None
    bank_queries: np.ndarray
    bank_gallery: np.ndarray
    block_size: int = DEFAULT_BLOCK
    block_elements: int | None = None       # None: BLOCK_ELEMENTS

    def __post_init__(self) -> None:
        self.scoring = check_scoring(self.scoring)
        self.param = _check_param(self.scoring, self.param)
        if self.block_elements is None:
            self.block_elements = BLOCK_ELEMENTS
        for what, v in (("block size", self.block_size), ("block elements", self.block_elements)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise CrossViewError(f"{what} must be a whole number >= 1, got {v!r}")
        self.bank_queries = _floats(self.bank_queries)
        self.bank_gallery = _floats(self.bank_gallery)
        if self.scoring != "plain" and (self.bank_queries.shape[0] < 1 or self.bank_gallery.shape[0] < 1):
            raise CrossViewError(f"{self.scoring} needs a bank of training images and captions; the bank is empty")

    def _rows(self, width: int) -> int:
        """Rows of a block whose rows are ``width`` scores wide (``block_size`` and ``block_elements`` bound it)."""
        return int(min(self.block_size, max(1, self.block_elements // max(1, width))))

    def prepare(self, gallery: np.ndarray) -> dict[str, np.ndarray]:
        """The statistics of ``gallery (n_g, D)`` over the bank: ``r`` (csls), ``c`` = log-sum-exp over the
        bank (isoftmax / dsoftmax) and ``hub`` ``(n_g,) bool``, the activation set (dsoftmax)."""
        return drive(self.iter_prepare(gallery))

    def iter_prepare(self, gallery: np.ndarray) -> Generator[tuple[int, int], None, dict[str, np.ndarray]]:
        """:meth:`prepare` as a generator: yields ``(gallery rows done, n_g)`` after each block, returns the
        statistics."""
        out: dict[str, np.ndarray] = {}
        if self.scoring == "plain":
            return out
        g, b = _floats(gallery), self.bank_queries
        n_g = g.shape[0]
        stat = np.empty(n_g)
        step = self._rows(b.shape[0])
        for a in range(0, n_g, step):
            block = _dot64(g[a:a + step], b)                            # (blk, n_b): gallery items vs bank
            if self.scoring == "csls":
                stat[a:a + step] = _mean_top(block, int(self.param))
            else:
                block *= self.param
                stat[a:a + step] = _lse(block)
            yield min(n_g, a + step), n_g
        out["r" if self.scoring == "csls" else "c"] = stat
        if self.scoring == "dsoftmax":
            hub = np.zeros(n_g, dtype=bool)
            if n_g:
                step = self._rows(n_g)
                for a in range(0, b.shape[0], step):
                    hub[np.argmax(_dot64(b[a:a + step], g), axis=1)] = True      # argmax: smaller index on ties
            out["hub"] = hub
        return out

    def blocks(self, queries: np.ndarray, gallery: np.ndarray, stats: dict[str, np.ndarray] | None = None,
               query_r: np.ndarray | None = None) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(start, stop, scores (stop - start, n_g) float64)`` for each block of ``queries (n_q, D)`` (at most
        ``block_size`` rows and ``block_elements`` scores, :meth:`_rows`). The queries are taken to float64 a
        block at a time (a large float32 gallery a chunk at a time, :func:`_dot64`); the scores are combined in
        place (the same operations, in the same order, as ``2 s - r_q - r_g``), so a block costs one score array
        and, for csls, one against the bank. ``query_r`` (csls): the queries' ``r_Q`` already known (the other
        direction's gallery statistic, when one model scores both ways), so no product with the bank here."""
        q = queries if isinstance(queries, np.ndarray) else np.asarray(queries, np.float64)
        g = _floats(gallery)
        if q.ndim != 2 or g.ndim != 2 or q.shape[1] != g.shape[1]:
            raise CrossViewError(f"scoring: queries {q.shape} and gallery {g.shape} must be 2-D with the same "
                                 "number of columns")
        stats = self.prepare(g) if stats is None else stats
        inline_r = self.scoring == "csls" and query_r is None
        step = self._rows(max(g.shape[0], self.bank_gallery.shape[0] if inline_r else 0))
        for a in range(0, q.shape[0], step):
            qb = np.asarray(q[a:a + step], np.float64)
            s = _dot64(qb, g)
            if self.scoring == "csls":
                r_q = (_mean_top(_dot64(qb, self.bank_gallery), int(self.param)) if query_r is None
                       else query_r[a:a + qb.shape[0]])
                s *= 2
                s -= r_q[:, None]
                s -= stats["r"][None, :]
            elif self.scoring == "isoftmax":
                s *= self.param
                s -= stats["c"][None, :]
            elif self.scoring == "dsoftmax" and s.shape[1]:
                normalise = stats["hub"][np.argmax(s, axis=1)]
                s[normalise] *= self.param
                s[normalise] -= stats["c"][None, :]
            yield a, a + qb.shape[0], s

    def scores(self, queries: np.ndarray, gallery: np.ndarray,
               stats: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """All of ``queries`` against ``gallery`` at once (a few queries: the app's and the CLI's)."""
        q = _floats(queries)
        g = _floats(gallery)
        out = np.empty((q.shape[0], g.shape[0]))
        for a, b, s in self.blocks(q, g, stats):
            out[a:b] = s
        return out


def _sides(emb: Any, direction: str) -> tuple[np.ndarray, np.ndarray]:
    """``(image, text)`` embeddings of ``emb`` (:class:`~crossview.eval.embeddings.Embeddings`) in the model of
    ``direction`` (the t2i model when the file has one)."""
    if direction == "t2i" and emb.image_t2i is not None:
        return emb.image_t2i, emb.text_t2i
    return emb.image, emb.text


def scorers_for(scoring: str, param: float | None, bank: Any,
                block_size: int = DEFAULT_BLOCK) -> dict[str, Scorer]:
    """``{"i2t": Scorer, "t2i": Scorer}`` over the training ``bank`` (an
    :class:`~crossview.eval.embeddings.Embeddings` of training images and captions): i2t queries are images (its
    bank queries the training images), t2i queries are captions."""
    # float64 once (or float32 kept, when large): with one model both scorers share the same two arrays
    bi, bt = (_floats(x) for x in _sides(bank, "i2t"))
    ci, ct = (bi, bt) if bank.image_t2i is None else (_floats(x) for x in _sides(bank, "t2i"))
    return {"i2t": Scorer(scoring, param, bank_queries=bi, bank_gallery=bt, block_size=block_size),
            "t2i": Scorer(scoring, param, bank_queries=ct, bank_gallery=ci, block_size=block_size)}


def evaluate_scoring(emb: Any, bank: Any, scoring: str, param: float | None = None, ks: Sequence[int] = (1, 5, 10),
                     block_size: int = DEFAULT_BLOCK, hub_k: int | None = None,
                     protocol: str = "standard") -> dict[str, Any]:
    """The standard protocol (every image against every caption of ``emb``) under ``scoring``, normalised by
    ``bank`` (training embeddings; never ``emb`` itself). Returns what
    :func:`crossview.eval.embeddings.evaluate_embeddings` does for the standard protocol: ``"i2t"``, ``"t2i"``,
    ``"rsum"``, ``"ranks"`` and ``"hubness"`` (of the re-scored retrieval), plus ``"scoring"`` and ``"param"``.

    ``protocol``: ``"standard"``, ``"coco5k"`` (the same, on exactly 5,000 images) or ``"coco1k"``: each fold of
    1,000 images scored against its own captions (the bank statistics are the training bank's, as in the standard
    protocol), every metric the mean over the folds, plus ``"folds"`` (each fold's result, its hubness included);
    no ``"ranks"`` (a rank is within its fold) and ``"hubness"`` None (it is per fold).
    """
    return drive(iter_evaluate_scoring(emb, bank, scoring, param, ks, block_size, hub_k, protocol))


#: the units of :func:`iter_evaluate_scoring`'s progress
PROGRESS_UNITS = 1000


def iter_evaluate_scoring(emb: Any, bank: Any, scoring: str, param: float | None = None,
                          ks: Sequence[int] = (1, 5, 10), block_size: int = DEFAULT_BLOCK, hub_k: int | None = None,
                          protocol: str = "standard") -> Generator[tuple[int, int], None, dict[str, Any]]:
    """:func:`evaluate_scoring` as a generator: yields ``(done, PROGRESS_UNITS)`` as its products go (scores
    counted), returns the result. At COCO size a csls evaluation of 4,096-d embeddings is minutes of products.

    With one model both ways (no ``*_t2i`` embeddings), csls's two gallery statistics are also the other
    direction's query statistics (the test captions' ``r`` against the bank images serves i2t's gallery and t2i's
    queries): they are computed once, two products with the bank instead of four, besides the two score passes."""
    from crossview.eval.protocols import check_coco_size, coco_1k_folds

    if protocol not in ("standard", "coco5k", "coco1k"):
        raise CrossViewError(f"scoring {scoring!r} re-scores the standard, coco5k and coco1k protocols, not "
                             f"{protocol!r}; use --scoring plain")
    n_folds = check_coco_size(protocol, int(emb.image.shape[0]))
    ks = tuple(int(k) for k in ks)
    if protocol == "coco1k":
        def fold(images: np.ndarray, caps: np.ndarray, fold_ci: np.ndarray) -> dict[str, Any]:
            res = evaluate_scoring(subset_embeddings(emb, images), bank, scoring, param, ks, block_size, hub_k)
            return {k: res[k] for k in ("i2t", "t2i", "rsum", "hubness")}

        yield 0, PROGRESS_UNITS
        r = coco_1k_folds(fold, emb.caption_image, ks, n_folds=n_folds)
        first = scorers_for(scoring, param, bank, block_size)["i2t"]
        return {"protocol": protocol, "n_images": int(emb.image.shape[0]), "n_captions": int(emb.text.shape[0]),
                "scoring": first.scoring, "param": first.param, "i2t": r["i2t"], "t2i": r["t2i"],
                "rsum": rsum_of(r["i2t"], r["t2i"]) if all(
                    f"R@{x}" in r[d] for x in (1, 5, 10) for d in ("i2t", "t2i")) else None,
                "folds": r["folds"], "hubness": None}
    ci = np.asarray(emb.caption_image, np.int64)
    n_img, n_cap = emb.image.shape[0], emb.text.shape[0]
    if n_img < 1 or n_cap < 1:
        raise CrossViewError(f"nothing to evaluate: {n_img} images and {n_cap} captions")
    counts = np.bincount(ci, minlength=n_img)
    if (counts == 0).any():
        raise CrossViewError(f"{int((counts == 0).sum())} image(s) have no caption (first: image "
                             f"{int(np.flatnonzero(counts == 0)[0])}); i2t ranks need a caption per image")
    scorers = scorers_for(scoring, param, bank, block_size)
    k = DEFAULT_K if hub_k is None else int(hub_k)
    out: dict[str, Any] = {"protocol": protocol, "n_images": int(n_img), "n_captions": int(n_cap),
                           "scoring": scorers["i2t"].scoring, "param": scorers["i2t"].param}
    ranks: dict[str, np.ndarray] = {}
    hub: dict[str, Any] = {}
    name = scorers["i2t"].scoring
    shared = name == "csls" and emb.image_t2i is None and bank.image_t2i is None
    n_bank = {d: (sc.bank_queries.shape[0], sc.bank_gallery.shape[0]) for d, sc in scorers.items()}
    # the work in scores computed: each direction's gallery statistics (gallery x bank queries), its score passes
    # (queries x gallery) and, for csls without a shared model, its queries' statistics (queries x bank gallery)
    work = {d: ((n_cap if d == "i2t" else n_img) * n_bank[d][0] if name != "plain" else 0,
                (n_img if d == "i2t" else n_cap) * ((n_cap if d == "i2t" else n_img)
                                                    + (n_bank[d][1] if name == "csls" and not shared else 0)))
            for d in ("i2t", "t2i")}
    total = max(1, sum(a + b for a, b in work.values()))
    done, shown = 0, -1

    def tick(extra: int) -> Iterator[tuple[int, int]]:
        nonlocal done, shown
        done += extra
        now = min(PROGRESS_UNITS, PROGRESS_UNITS * done // total)
        if now != shown:
            shown = now
            yield now, PROGRESS_UNITS

    stats: dict[str, dict[str, np.ndarray]] = {}
    for d in ("i2t", "t2i"):
        img, txt = _sides(emb, d)
        gallery = txt if d == "i2t" else img
        before = 0
        gen = scorers[d].iter_prepare(gallery)
        while True:
            try:
                rows, _ = next(gen)
            except StopIteration as end:
                stats[d] = end.value
                break
            yield from tick((rows - before) * n_bank[d][0])
            before = rows
    for d in ("i2t", "t2i"):
        img, txt = _sides(emb, d)
        queries, gallery = (img, txt) if d == "i2t" else (txt, img)
        q_labels = np.arange(n_img, dtype=np.int64) if d == "i2t" else ci
        g_labels = ci if d == "i2t" else np.arange(n_img, dtype=np.int64)
        n_g = gallery.shape[0]
        width = min(max(k, TOP_SHARE_K), n_g)
        r = np.empty(queries.shape[0], np.int64)
        top = np.empty((queries.shape[0], width), np.int64)
        query_r = stats["t2i" if d == "i2t" else "i2t"]["r"] if shared else None
        per_row = work[d][1] // max(1, queries.shape[0])
        for a, b, s in scorers[d].blocks(queries, gallery, stats[d], query_r=query_r):
            if np.isnan(s).any():
                raise CrossViewError(f"{scoring}: the scores contain NaN (check the embeddings for NaN or inf)")
            r[a:b] = first_relevant_ranks(s, q_labels[a:b], g_labels)
            top[a:b] = top_k(s, width)
            yield from tick((b - a) * per_row)
        ranks[d] = r
        out[d] = rank_metrics(r, ks)
        hub[d] = hubness_from_top(top, n_g, k).as_dict() if n_g >= 2 else None
    out["rsum"] = rsum_of(out["i2t"], out["t2i"]) if all(
        f"R@{x}" in out[d] for x in (1, 5, 10) for d in ("i2t", "t2i")) else None
    out["ranks"] = ranks
    out["hubness"] = hub
    return out


def subset_embeddings(emb: Any, images: np.ndarray) -> Any:
    """The images ``images`` of ``emb`` with their captions (renumbered), both models kept."""
    from crossview.eval.embeddings import Embeddings

    images = np.asarray(images, np.int64)
    pos = np.full(emb.image.shape[0], -1, np.int64)
    pos[images] = np.arange(images.size)
    caps = np.flatnonzero(pos[emb.caption_image] >= 0)
    two = emb.image_t2i is not None
    return Embeddings(image=emb.image[images], text=emb.text[caps], caption_image=pos[emb.caption_image[caps]],
                      image_t2i=emb.image_t2i[images] if two else None, text_t2i=emb.text_t2i[caps] if two else None)


def select_scoring(bank: Any, scoring: str, grid: Sequence[float] | None = None, holdout: float = 0.2,
                   seed: int = 0, bank_name: str = "train", block_size: int = DEFAULT_BLOCK) -> dict[str, Any]:
    """Choose ``scoring``'s parameter on a hold-out of the training ``bank`` (see the module docstring).

    Returns the record a run keeps: ``{"scoring", "param_name", "param", "by": "rsum", "selected_on",
    "holdout_images", "bank_images", "candidates": [{"param", "rsum"}], "plain_rsum"}`` (``plain_rsum``: the
    hold-out's rsum without re-scoring, for comparison). ``plain`` has nothing to choose: ``param`` is None
    and ``selected_on`` ``"nothing"``.
    """
    scoring = check_scoring(scoring)
    grid = _candidates(scoring, grid)
    if grid is None:
        return {"scoring": scoring, "param_name": None, "param": None, "selected_on": "nothing", "candidates": []}
    n = int(bank.image.shape[0])
    has_caption = np.bincount(np.asarray(bank.caption_image, np.int64), minlength=n) > 0
    usable = np.flatnonzero(has_caption)
    if not 0 < holdout < 1:
        raise CrossViewError(f"hold-out fraction must be between 0 and 1, got {holdout!r}")
    n_hold = int(round(holdout * usable.size))
    if n_hold < 2 or usable.size - n_hold < 2:
        raise CrossViewError(f"{scoring}: choosing its {PARAMS[scoring]} needs at least 10 training images with "
                             f"captions, the {bank_name} split has {usable.size}; use --scoring plain")
    perm = np.random.default_rng(seed).permutation(usable)
    hold, rest = np.sort(perm[:n_hold]), np.sort(perm[n_hold:])
    held, others = subset_embeddings(bank, hold), subset_embeddings(bank, rest)
    plain = evaluate_scoring(held, others, "plain", block_size=block_size)["rsum"]
    cands = [{"param": _check_param(scoring, p),
              "rsum": evaluate_scoring(held, others, scoring, p, block_size=block_size)["rsum"]} for p in grid]
    best = max(range(len(cands)), key=lambda i: (cands[i]["rsum"], -i))
    return {"scoring": scoring, "param_name": PARAMS[scoring], "param": cands[best]["param"], "by": "rsum",
            "selected_on": f"{bank_name} (hold-out)", "in_sample": True, "holdout_images": int(n_hold),
            "bank_images": int(rest.size), "seed": int(seed), "candidates": cands, "plain_rsum": plain}


def _candidates(scoring: str, grid: Sequence[float] | None) -> tuple[float, ...] | None:
    """The values to choose ``scoring``'s parameter from (``grid``, else its default grid); None for ``plain``."""
    if PARAMS[scoring] is None:
        return None
    grid = tuple(GRIDS[scoring] if grid is None else grid)
    if not grid:
        raise CrossViewError(f"{scoring}: no candidate values to choose from")
    return grid


def iter_select_scoring_cv(fold_sets: Sequence[tuple[Any, Any]], scoring: str, grid: Sequence[float] | None = None,
                           train_name: str = "train",
                           block_size: int = DEFAULT_BLOCK) -> Iterator[tuple[int, int]]:
    """:func:`select_scoring_cv` as a generator: yields ``(done, total)`` after each candidate and returns the
    record."""
    scoring = check_scoring(scoring)
    grid = _candidates(scoring, grid)
    if grid is None:
        return {"scoring": scoring, "param_name": None, "param": None, "selected_on": "nothing", "candidates": []}
    if len(fold_sets) < 2:
        raise CrossViewError(f"cross-validation needs at least 2 folds, got {len(fold_sets)}")
    params = [_check_param(scoring, p) for p in grid]
    table = [{"fold": f + 1, "test_images": int(held.image.shape[0]), "bank_images": int(bank.image.shape[0]),
              "plain_rsum": evaluate_scoring(held, bank, "plain", block_size=block_size)["rsum"], "rsum": []}
             for f, (held, bank) in enumerate(fold_sets)]
    for k, p in enumerate(params):
        for row, (held, bank) in zip(table, fold_sets):
            row["rsum"].append(evaluate_scoring(held, bank, scoring, p, block_size=block_size)["rsum"])
        yield k + 1, len(params)
    means = [float(np.mean([row["rsum"][i] for row in table])) for i in range(len(params))]
    best = max(range(len(params)), key=lambda i: (means[i], -i))
    return {"scoring": scoring, "param_name": PARAMS[scoring], "param": params[best], "by": "rsum",
            "selected_on": f"{train_name}-cv{len(fold_sets)}", "in_sample": False,
            "fold_images": [row["test_images"] for row in table],
            "candidates": [{"param": p, "rsum": m, "fold_rsum": [row["rsum"][i] for row in table]}
                           for i, (p, m) in enumerate(zip(params, means))],
            "plain_rsum": float(np.mean([row["plain_rsum"] for row in table])), "folds": table}


def select_scoring_cv(fold_sets: Sequence[tuple[Any, Any]], scoring: str, grid: Sequence[float] | None = None,
                      train_name: str = "train", block_size: int = DEFAULT_BLOCK) -> dict[str, Any]:
    """Choose ``scoring``'s parameter by cross-validation of the training images. ``fold_sets``: one
    ``(held, bank)`` per fold, ``held`` the fold's images and captions (:class:`~crossview.eval.embeddings.Embeddings`)
    through a model trained on the *other* folds and ``bank`` those other folds' images and captions through the
    same model. Each candidate of the grid scores every fold's ``held`` against its ``bank`` (:func:`evaluate_scoring`);
    the largest mean rsum over the folds wins (the first in the grid among equals).

    Returns ``{"scoring", "param_name", "param", "by": "rsum", "selected_on": "<train_name>-cv<folds>",
    "in_sample": False, "fold_images", "candidates": [{"param", "rsum" (the mean), "fold_rsum"}], "plain_rsum" (the
    mean without re-scoring), "folds": [{"fold", "test_images", "bank_images", "plain_rsum", "rsum": [per
    candidate]}]}``."""
    from crossview.core.progress import drive

    return drive(iter_select_scoring_cv(fold_sets, scoring, grid, train_name, block_size))


def describe_scoring(record: dict[str, Any] | None) -> str:
    """One line a person reads: ``scoring csls (k = 10, chosen by rsum on a hold-out of train: 120 images
    against a bank of 480)``; ``""`` for plain or no record."""
    if not isinstance(record, dict) or record.get("scoring") in (None, "plain"):
        return ""
    name, what, value = record["scoring"], record.get("param_name"), record.get("param")
    if record.get("selected_on") == "given":
        how = "given"
    elif record.get("default"):      # a method's default scoring (crossview.engine.scoring.DEFAULT_SCORINGS)
        how = str(record.get("selected_on") or "method default")
    elif isinstance(record.get("folds"), list):
        how = (f"chosen by rsum on {record.get('selected_on')}: {len(record['folds'])}-fold cross-validation of the "
               f"training images, folds of {'/'.join(str(x) for x in record.get('fold_images') or [])} images, each "
               "scored by the method trained again on the other folds")
    else:
        how = (f"chosen by rsum on {record.get('selected_on')}: {record.get('holdout_images')} images against a "
               f"bank of {record.get('bank_images')}" + (
                   "; in-sample: the model was fitted on those images" if record.get("in_sample") else ""))
    return f"scoring {name} ({what} = {value:g}, {how})"


def describe_scored(entry: dict[str, Any]) -> str:
    """Lines a person reads for one recorded re-scoring (an entry of a run's ``scoring.json``): the choice, its
    rsum and R@1 both ways, then its hubness; ``""`` for anything malformed."""
    from crossview.eval.hubness import describe_hubness

    try:
        head = (f"{describe_scoring(entry)}: rsum {float(entry['rsum']):.1f} (i2t R@1 {float(entry['i2t']['R@1']):.1f}, "
                f"t2i R@1 {float(entry['t2i']['R@1']):.1f})")
    except (KeyError, TypeError, ValueError):
        return ""
    hub = describe_hubness(entry.get("hubness"))
    return head + ("\n" + "\n".join(f"  {line}" for line in hub.splitlines()) if hub else "")
