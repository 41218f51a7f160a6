"""Caption overlap of retrieved items (Im2Text / Text2Im style): BLEU-1..4, ROUGE-1, ROUGE-L.

- i2t: for each query image, each of its top-k captions is a hypothesis scored against the image's
  gold captions (multi-reference).
- t2i: for each query caption, each of its top-k images is judged by scoring the query caption as a
  hypothesis against that image's captions (multi-reference) -- the same pairing as i2t: one
  sentence against the caption set of one image.

Scores are averaged over the k retrieved items and then over the queries (every query has the same
k, so this is the plain mean over all (query, item) pairs). Retrieval uses the tie rule of
:mod:`crossview.eval.metrics`. :func:`gallery_overlap_i2t` / :func:`gallery_overlap_t2i` do the same when
the gallery is another set than the queries (the BITR paper's protocol: test queries, the training set or
an independent caption corpus as the gallery).

BLEU is sacrebleu's *sentence-level* BLEU (``BLEU(effective_order=True).sentence_score``, default
``13a`` tokenizer, lower-cased, default ``exp`` smoothing), on a 0-100 scale. BLEU-n is cumulative
BLEU with uniform weights over the 1..n-gram precisions and the brevity penalty, i.e. sacrebleu's
BLEU with ``max_ngram_order=n``; the four orders are computed from one set of n-gram statistics
with ``BLEU.compute_bleu`` (identical to four separate calls, see the tests). A hypothesis sharing
no word with its references gets 0. ROUGE-1 and ROUGE-L are ``rouge_score`` F-measures (0-1
scale), taking the best-matching reference (``RougeScorer.score_multi``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.eval.metrics import as_numpy, check_scores, top_k

__all__ = ["OVERLAP_KEYS", "SentenceOverlap", "caption_overlap", "caption_overlap_i2t",
           "caption_overlap_t2i", "gallery_overlap_i2t", "gallery_overlap_t2i"]

OVERLAP_KEYS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-1", "ROUGE-L")


class SentenceOverlap:
    """Scores one hypothesis against a list of references: ``{"BLEU-1".."BLEU-4", "ROUGE-1", "ROUGE-L"}``."""

    def __init__(self) -> None:
        from rouge_score import rouge_scorer
        from sacrebleu.metrics import BLEU

        self._bleu_cls = BLEU
        self._bleu = BLEU(max_ngram_order=4, effective_order=True, lowercase=True)
        self._rouge = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=False)

    def __call__(self, hypothesis: str, references: Sequence[str]) -> dict[str, float]:
        if not references:
            raise CrossViewError("caption overlap needs at least one reference caption")
        st = self._bleu.sentence_score(hypothesis, list(references))
        out: dict[str, float] = {}
        for n in range(1, 5):
            out[f"BLEU-{n}"] = float(self._bleu_cls.compute_bleu(
                list(st.counts[:n]), list(st.totals[:n]), st.sys_len, st.ref_len,
                smooth_method=self._bleu.smooth_method, smooth_value=self._bleu.smooth_value,
                effective_order=True, max_ngram_order=n).score)
        rg = self._rouge.score_multi(list(references), hypothesis)
        out["ROUGE-1"] = float(rg["rouge1"].fmeasure)
        out["ROUGE-L"] = float(rg["rougeL"].fmeasure)
        return out


def _prepare(scores: Any, caption_image: Any, captions: Sequence[str],
             k: int) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    s, ci = check_scores(scores, caption_image)
    if len(captions) != ci.size:
        raise CrossViewError(f"got {len(captions)} captions but caption_image has {ci.size} entries")
    if k < 1:
        raise CrossViewError(f"k must be >= 1, got {k}")
    by_image: list[list[int]] = [[] for _ in range(s.shape[0])]
    for c, i in enumerate(ci.tolist()):
        by_image[i].append(c)
    return s, ci, by_image


def _report(progress: Callable[[int, int], None] | None, done: int, total: int) -> None:
    if progress is not None and (done % 100 == 0 or done == total):
        progress(done, total)


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    if not rows:
        raise CrossViewError("caption overlap got no queries")
    return {key: float(np.mean([r[key] for r in rows])) for key in OVERLAP_KEYS}


def caption_overlap_i2t(scores: Any, caption_image: Any, captions: Sequence[str], k: int = 5,
                        query_ids: Any = None,
                        progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """Overlap of each image's top-``k`` captions with its gold captions.

    ``scores (n_images, n_captions)``, ``caption_image (n_captions,)``, ``captions`` (n_captions
    strings); ``query_ids`` optionally limits the image queries; ``progress(done, total)`` is called
    every 100 queries and at the end. Returns the mean of :data:`OVERLAP_KEYS`.
    """
    s, _, by_image = _prepare(scores, caption_image, captions, k)
    queries = np.arange(s.shape[0]) if query_ids is None else as_numpy(query_ids).astype(np.int64)
    ranked = top_k(s[queries], k)                                # (n_queries, k) caption ids
    scorer = SentenceOverlap()
    rows = []
    for qi, img in enumerate(queries.tolist()):
        refs = [captions[c] for c in by_image[img]]
        if not refs:
            raise CrossViewError(f"image {img} has no caption to compare the retrieved ones with")
        rows.extend(scorer(captions[c], refs) for c in ranked[qi].tolist())
        _report(progress, qi + 1, len(queries))
    return _mean(rows)


def caption_overlap_t2i(scores: Any, caption_image: Any, captions: Sequence[str], k: int = 5,
                        query_ids: Any = None,
                        progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """Overlap of each query caption with the captions of its top-``k`` images.

    Same inputs as :func:`caption_overlap_i2t`; ``query_ids`` optionally limits the caption
    queries. An image without captions cannot be judged and raises.
    """
    s, _, by_image = _prepare(scores, caption_image, captions, k)
    queries = np.arange(s.shape[1]) if query_ids is None else as_numpy(query_ids).astype(np.int64)
    ranked = top_k(s[:, queries].T, k)                           # (n_queries, k) image ids
    scorer = SentenceOverlap()
    rows = []
    for qi, cap in enumerate(queries.tolist()):
        for img in ranked[qi].tolist():
            refs = [captions[c] for c in by_image[img]]
            if not refs:
                raise CrossViewError(f"retrieved image {img} has no caption to compare with")
            rows.append(scorer(captions[cap], refs))
        _report(progress, qi + 1, len(queries))
    return _mean(rows)


def caption_overlap(scores: Any, caption_image: Any, captions: Sequence[str],
                    k: int = 5) -> dict[str, dict[str, float]]:
    """Both directions: ``{"i2t": {...}, "t2i": {...}}`` (see the module docstring)."""
    return {"i2t": caption_overlap_i2t(scores, caption_image, captions, k),
            "t2i": caption_overlap_t2i(scores, caption_image, captions, k)}


def _ranked(scores: Any, ranked: Any, n_queries: int, n_gallery: int, k: int) -> np.ndarray:
    """The top-``k`` gallery rows of every query: from ``scores (n_queries, n_gallery)``, or given as
    ``ranked (n_queries, >= k)`` (an index's search result, best first)."""
    if k < 1:
        raise CrossViewError(f"k must be >= 1, got {k}")
    if ranked is not None:
        r = np.asarray(ranked, dtype=np.int64)
        if r.ndim != 2 or r.shape[0] != n_queries or (r.size and (r.min() < 0 or r.max() >= n_gallery)):
            raise CrossViewError(f"ranked {r.shape} must be (n_queries={n_queries}, k) rows of a gallery of "
                                 f"{n_gallery}")
        return r[:, :k]
    s = as_numpy(scores)
    if s.ndim != 2 or s.shape[0] != n_queries or s.shape[1] != n_gallery:
        raise CrossViewError(f"scores {s.shape} must be (n_queries={n_queries}, n_gallery={n_gallery})")
    return top_k(s, k)


def gallery_overlap_i2t(scores: Any, gallery_captions: Sequence[str], query_references: Sequence[Sequence[str]],
                        k: int = 5, scorer: SentenceOverlap | None = None, *, ranked: Any = None) -> dict[str, float]:
    """Im2Text over a separate gallery: ``scores (n_query_images, n_gallery_captions)``; each query image's
    top-``k`` gallery captions scored against ``query_references[q]`` (its gold captions). Queries with no
    reference caption are skipped. Returns the mean of :data:`OVERLAP_KEYS` over all (query, item) pairs.
    ``ranked`` (the queries' top gallery rows, e.g. from :mod:`crossview.index` over a million captions)
    replaces ``scores``."""
    ranked = _ranked(scores, ranked, len(query_references), len(gallery_captions), k)
    scorer = scorer or SentenceOverlap()
    rows = []
    for q, refs in enumerate(query_references):
        if refs:
            rows.extend(scorer(gallery_captions[c], list(refs)) for c in ranked[q].tolist())
    return _mean(rows)


def gallery_overlap_t2i(scores: Any, query_captions: Sequence[str], gallery_references: Sequence[Sequence[str]],
                        k: int = 5, scorer: SentenceOverlap | None = None, *, ranked: Any = None) -> dict[str, float]:
    """Text2Im over a separate gallery: ``scores (n_gallery_images, n_query_captions)``; each query caption
    scored against the captions (``gallery_references[i]``) of each of its top-``k`` gallery images
    (images without captions are skipped). Returns the mean of :data:`OVERLAP_KEYS`. ``ranked
    (n_query_captions, k)`` (gallery image rows, best first) replaces ``scores``."""
    if ranked is None:
        s = as_numpy(scores)
        if s.ndim != 2 or s.shape[0] != len(gallery_references) or s.shape[1] != len(query_captions):
            raise CrossViewError(f"scores {s.shape} must be (n_gallery={len(gallery_references)}, "
                                 f"n_queries={len(query_captions)})")
        scores = np.ascontiguousarray(s.T)
    ranked = _ranked(scores, ranked, len(query_captions), len(gallery_references), k)
    scorer = scorer or SentenceOverlap()
    rows = []
    for q, cap in enumerate(query_captions):
        rows.extend(scorer(cap, list(gallery_references[i])) for i in ranked[q].tolist() if gallery_references[i])
    return _mean(rows)
