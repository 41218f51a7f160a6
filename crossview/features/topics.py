"""The BITR paper's feature representations: TR, CTR, "modern", and the default encoders.

Paper 001 (section 6) represents both modalities by 100-d vectors:

- **TR** (topic-based representation): LDA topic distributions of *visual words* for images and of
  caption words for captions. The paper's visual words are k-means clusters of dense multi-scale SIFT.
  Here the local descriptors are the image backbone's last convolutional feature map
  (:meth:`ImageEncoder.encode_paths(..., local=True) <crossview.features.image.ImageEncoder.encode_paths>`,
  ``h*w`` descriptors per image): **k-means over CNN local descriptors is a modern stand-in for the
  paper's dense SIFT**. Each descriptor is L2-normalised and reduced by PCA to 128-d (SIFT's size; it
  also makes k-means ten times cheaper), quantised to the nearest of ``n_words`` centres (seeded
  k-means, FAISS), counted into a bag-of-visual-words histogram per image, and LDA turns the histogram
  into a topic distribution. Captions use the ``"lda"`` text encoder (:mod:`crossview.features.text`).
- **CTR** (correlated TR): the TR of each modality projected by CCA into a maximally correlated space
  (``crossview.core.linalg.fit_cca`` / ``cca_transform``), rows L2-normalised.
- **modern** (section 7.7): pooled CNN features reduced by PCA to 128-d
  (:class:`~crossview.features.image.PCAReducer`) and averaged word vectors (GloVe 6B 50-d here; the
  paper used 300-d word2vec).
- **default**: the default image and text encoders (:func:`crossview.features.extract_features`).

Everything that learns (the codebook, both LDA models, PCA, CCA) is fitted on the training images
and their captions only (the ``train`` split, or the images of a cross-validation fold); test data
never leaks into a representation. The expensive parts (CNN descriptors, the image topic features,
caption encodings) go through :class:`~crossview.features.cache.FeatureCache`.

:func:`build_representation` returns a :class:`Representation` (features of every image and caption
of the dataset, plus a function that encodes new captions, e.g. an independent corpus);
:func:`representation_splits` returns the train / val / test :class:`~crossview.methods.base.MethodData`
that methods train and are evaluated on.

**In ordinary runs** (``crossview train bitr --set representation=tr|ctr``), the engine calls
:func:`representation_features` instead of :func:`crossview.features.extract_features`: everything is
fitted on the run's training split and kept in a :class:`TopicRepresentation` (descriptor PCA, codebook,
both LDA models, CCA; :meth:`TopicRepresentation.state_dict` is numpy arrays and plain values only, no
scikit-learn object), which the checkpoint saves in its feature spec. ``open_run`` rebuilds the features
from it with :func:`restore_representation_features` (nothing refitted), and the
:class:`RepresentationFeatures` it returns encode new image files and sentences for the Retriever.

**Long work is a generator**, as :func:`crossview.features.iter_extract_features`: each builder has an ``iter_*``
form (:func:`iter_build_representation`, :func:`iter_representation_features`,
:func:`iter_restore_representation_features`, :func:`iter_rebuild_representation_features`) that yields
``(stage, done, total)`` between two steps and *returns* its result, so the engine drives it as the run's own
events in the run's own thread (closing it stops the work). The plain functions drive those generators with
``progress(stage, done, total)`` / ``should_stop()`` callbacks (:func:`crossview.core.progress.drive_stages`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.linalg import to_dense
from crossview.features import Features, _staged
from crossview.features.cache import FeatureCache

__all__ = ["REPRESENTATIONS", "Representation", "RepresentationSplits", "build_representation", "check_representation",
           "representation_splits", "method_data_for_images", "kmeans_codebook", "assign_visual_words",
           "bovw_histograms", "fit_topic_model", "topic_distributions", "prepare_descriptors",
           "local_descriptors", "DescriptorReducer", "VisualTopics", "lda_state", "lda_from_state",
           "RUN_REPRESENTATIONS", "TopicRepresentation", "RepresentationFeatures", "representation_request",
           "check_run_representation", "representation_features", "restore_representation_features",
           "BUILT_REPRESENTATIONS", "representation_record", "check_representation_record", "BuiltRepresentation",
           "built_representation_features", "rebuild_representation_features", "iter_build_representation",
           "iter_local_descriptors", "iter_representation_features", "iter_restore_representation_features",
           "iter_rebuild_representation_features"]

#: Representation names, as ``crossview experiment bitr-table --representation`` spells them.
REPRESENTATIONS: dict[str, str] = {
    "default": "the default image and text encoders (CNN pooled features, sentence encoder)",
    "modern": "CNN features + PCA to 128-d, averaged GloVe word vectors (the paper's section 7.7)",
    "tr": "LDA topics of visual words (k-means of CNN local descriptors) and of caption words",
    "ctr": "TR projected by CCA (fit on train), L2-normalised",
}

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``, as :func:`crossview.features.extract_features` calls it."""
Report = tuple[str, int, int]
"""``(stage, done, total)``: what the ``iter_*`` generators yield (:func:`crossview.features.iter_extract_features`)."""

# Bump when the way TR image features are computed changes, so old cache entries stop matching.
_TR_VERSION = 3  # 3: scikit-learn's k-means++ seeding again; 2 (05892a3): CrossView's own


# ====================================================================== visual words: plain functions
class DescriptorReducer:
    """L2-normalise local descriptors, then PCA them to ``dim`` (fitted on training descriptors).

    ``fit(descriptors (n, c))`` / ``transform(descriptors (n, c)) -> (n, dim) float32``. With
    ``dim >= c`` only the normalisation is applied.
    """

    def __init__(self, dim: int = 128) -> None:
        self.dim = dim
        self.in_dim_: int | None = None

    @staticmethod
    def _l2(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        n = np.linalg.norm(x, axis=1, keepdims=True)
        return x / np.maximum(n, np.float32(1e-12))

    def fit(self, descriptors: np.ndarray) -> "DescriptorReducer":
        from crossview.features.image import PCAReducer

        x = self._l2(descriptors)
        self.in_dim_ = int(x.shape[1])
        self.pca_ = None
        if self.dim < x.shape[1]:
            self.pca_ = PCAReducer(n_components=min(int(self.dim), x.shape[0])).fit(x)
        return self

    def transform(self, descriptors: np.ndarray) -> np.ndarray:
        x = self._l2(descriptors)
        return x if self.pca_ is None else self.pca_.transform(x)

    def state_dict(self) -> dict[str, Any]:
        """``{"dim", "in_dim", "pca"}``: the PCA as numpy arrays (``None`` when only L2 is applied)."""
        return {"dim": int(self.dim), "in_dim": self.in_dim_,
                "pca": None if self.pca_ is None else self.pca_.state_dict()}

    @classmethod
    def from_state_dict(cls, state: Any) -> "DescriptorReducer":
        """The fitted reducer :meth:`state_dict` described (checked: a checkpoint is data)."""
        from crossview.features.image import PCAReducer

        what = "descriptor PCA"
        red = cls(_plain(state, "dim", int, what))
        red.in_dim_ = None if state.get("in_dim") is None else _plain(state, "in_dim", int, what)
        pca = state.get("pca")
        red.pca_ = None
        if pca is not None:
            if not isinstance(pca, dict):
                raise CrossViewError("checkpoint: the representation's descriptor PCA is not a mapping; the run "
                                     "is damaged: retrain it")
            red.pca_ = PCAReducer.from_state_dict({
                "n_components": _plain(pca, "n_components", int, what), "whiten": _plain(pca, "whiten", bool, what),
                **{k: _as_array(pca.get(k), what, 1 if k != "components_" else 2)
                   for k in ("mean_", "components_", "explained_variance_", "explained_variance_ratio_")}})
        return red


def kmeans_codebook(descriptors: np.ndarray, n_words: int, *, seed: int = 0, n_iter: int = 20) -> np.ndarray:
    """Visual-word centres ``(n_words, c) float32``: seeded k-means of ``descriptors (n, c)``.

    k-means++ seeding (scikit-learn's, :func:`_seed_centres`), then FAISS Lloyd iterations (scikit-learn
    ``KMeans`` when FAISS is not installed). Needs at least ``2 * n_words`` descriptors.
    """
    x = np.ascontiguousarray(descriptors, dtype=np.float32)
    if x.ndim != 2:
        raise CrossViewError(f"local descriptors must be a (n, c) matrix to cluster, got shape {x.shape}")
    n_words = int(n_words)
    if n_words < 2:
        raise CrossViewError(f"the visual vocabulary needs at least 2 words, got n_words={n_words}")
    if x.shape[0] < 2 * n_words:
        raise CrossViewError(f"only {x.shape[0]} local descriptors to learn {n_words} visual words from; "
                             f"lower n_words to at most {x.shape[0] // 2} or train on more images")
    if not np.isfinite(x).all():
        raise CrossViewError("local descriptors contain NaN or infinite values; re-extract them")
    # k-means++ seeding (on a sample of at most 64 points per word: it costs O(k^2 log k) distance rows),
    # then Lloyd iterations. A plain random start can leave a cluster without a centre.
    rng = np.random.default_rng(seed)
    sample = x if len(x) <= 64 * n_words else x[rng.choice(len(x), 64 * n_words, replace=False)]
    init = _seed_centres(sample, n_words, rng)
    try:
        import faiss
    except ImportError:  # pragma: no cover - faiss-cpu is a dependency
        from sklearn.cluster import KMeans

        km = KMeans(n_clusters=n_words, init=init, n_init=1, max_iter=n_iter, random_state=seed).fit(x)
        return km.cluster_centers_.astype(np.float32)
    # min_points_per_centroid=1: small training sets are fine here (FAISS would only warn).
    km = faiss.Kmeans(x.shape[1], n_words, niter=n_iter, seed=int(seed) + 1, verbose=False,
                      min_points_per_centroid=1, max_points_per_centroid=256)
    km.train(x, init_centroids=init)
    return np.asarray(km.centroids, dtype=np.float32).reshape(n_words, x.shape[1])


def _seed_centres(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """scikit-learn's greedy k-means++ start (``kmeans_plusplus``, ``2 + log k`` local trials a centre), drawn from
    ``rng``: ``(k, c) float32`` rows of ``x``. A hand-written copy was the default from 05892a3 (scikit-learn's was
    measured at 206 s for 1,000 centres of 29,400 descriptors then, likely beside other jobs; on an idle 2-core
    machine both take a few seconds); it learnt codebooks of the same k-means objective
    (``bench/results/tr_seed_spread_flickr8k.md``), and the library is kept rather than a copy."""
    from sklearn.cluster import kmeans_plusplus

    init, _ = kmeans_plusplus(x, int(k), random_state=int(rng.integers(2**31 - 1)))
    return np.ascontiguousarray(init, dtype=np.float32)


def assign_visual_words(descriptors: np.ndarray, codebook: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """Index of the nearest centre (squared Euclidean) of each descriptor: ``(n,) int64``.

    ``descriptors (n, c)``, ``codebook (k, c)``.
    """
    x = np.asarray(descriptors, dtype=np.float32)
    cb = np.asarray(codebook, dtype=np.float32)
    if x.ndim != 2 or cb.ndim != 2 or x.shape[1] != cb.shape[1]:
        raise CrossViewError(f"descriptors {x.shape} and codebook {cb.shape} must be 2-D with the same width")
    out = np.empty(x.shape[0], dtype=np.int64)
    c2 = (cb * cb).sum(1)
    for s in range(0, x.shape[0], chunk):
        b = x[s:s + chunk]
        # ||x - c||^2 = ||x||^2 - 2 x.c + ||c||^2; ||x||^2 does not change the argmin.
        out[s:s + chunk] = np.argmin(c2[None, :] - 2.0 * (b @ cb.T), axis=1)
    return out


def bovw_histograms(words: np.ndarray, n_words: int) -> np.ndarray:
    """Bag-of-visual-words counts ``(n_images, n_words) float32`` from word ids ``(n_images, m)``.

    Each row sums to ``m``, the number of local descriptors of the image.
    """
    w = np.asarray(words, dtype=np.int64)
    if w.ndim != 2:
        raise CrossViewError(f"visual word ids must be (n_images, descriptors per image), got shape {w.shape}")
    if w.size and (w.min() < 0 or w.max() >= n_words):
        raise CrossViewError(f"visual word ids must lie in [0, {n_words}), got {w.min()}..{w.max()}")
    n, m = w.shape
    rows = np.repeat(np.arange(n), m)
    hist = np.zeros((n, n_words), dtype=np.float32)
    np.add.at(hist, (rows, w.ravel()), 1.0)
    return hist


def fit_topic_model(counts: np.ndarray, n_topics: int = 100, *, seed: int = 0, max_iter: int = 20) -> Any:
    """scikit-learn ``LatentDirichletAllocation`` fitted on word counts ``(n_docs, n_words)``."""
    from sklearn.decomposition import LatentDirichletAllocation

    if not isinstance(n_topics, (int, np.integer)) or n_topics < 1:
        raise CrossViewError(f"n_topics must be a positive integer, got {n_topics!r}")
    c = np.asarray(counts)
    if c.ndim != 2 or c.shape[0] < 2:
        raise CrossViewError(f"LDA needs a (documents, words) count matrix with 2+ rows, got shape {c.shape}")
    if (c < 0).any():
        raise CrossViewError("LDA word counts must be non-negative")
    return LatentDirichletAllocation(n_components=int(n_topics), max_iter=max_iter, learning_method="batch",
                                     random_state=seed, n_jobs=1).fit(c)


def topic_distributions(lda: Any, counts: np.ndarray) -> np.ndarray:
    """Topic distributions ``(n_docs, n_topics) float32`` of ``counts (n_docs, n_words)``; rows sum to 1."""
    t = np.asarray(lda.transform(np.asarray(counts)), dtype=np.float64)
    t /= np.maximum(t.sum(1, keepdims=True), 1e-300)
    return t.astype(np.float32)


def prepare_descriptors(local: np.ndarray, fit_images: np.ndarray, *, dim: int = 128, seed: int = 0,
                        max_fit: int = 200_000) -> tuple[DescriptorReducer, Callable[[np.ndarray], np.ndarray]]:
    """A :class:`DescriptorReducer` fitted on (up to ``max_fit`` sampled) descriptors of ``fit_images``
    from ``local (n_images, m, c)``, and a function mapping ``(k, m, c)`` -> ``(k * m, dim)``."""
    m, c = local.shape[1], local.shape[2]
    train = np.asarray(local[np.sort(fit_images)], dtype=np.float32).reshape(-1, c)
    if len(train) > max_fit:
        train = train[np.random.default_rng(seed).choice(len(train), max_fit, replace=False)]
    red = DescriptorReducer(dim).fit(train)
    return red, lambda block: red.transform(np.asarray(block, dtype=np.float32).reshape(-1, c))


def _as_array(value: Any, what: str, ndim: int, kind: str = "f") -> np.ndarray:
    """A saved array (numpy or torch) checked for shape rank and kind: a run folder is data."""
    arr = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    ok = np.issubdtype(arr.dtype, np.floating) if kind == "f" else np.issubdtype(arr.dtype, np.number)
    if arr.ndim != ndim or not ok or not np.isfinite(arr).all():
        raise CrossViewError(f"checkpoint: the representation's {what} has shape {arr.shape} / dtype {arr.dtype}; "
                             "the run is damaged: retrain it")
    return arr


def _plain(state: Any, key: str, cast: Callable[[Any], Any], what: str) -> Any:
    if not isinstance(state, dict) or key not in state:
        raise CrossViewError(f"checkpoint: the representation's {what} has no {key!r}; the run is damaged: retrain it")
    value = state[key]
    try:
        return cast(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        raise CrossViewError(f"checkpoint: the representation's {what} has a bad {key!r} ({value!r}); the run is "
                             "damaged: retrain it") from None


def lda_state(lda: Any) -> dict[str, Any]:
    """A fitted scikit-learn ``LatentDirichletAllocation`` as numpy arrays and plain values (what
    :func:`lda_from_state` rebuilds it from; no scikit-learn object is stored)."""
    return {"n_components": int(lda.n_components), "max_iter": int(lda.max_iter),
            "learning_method": str(lda.learning_method),
            "random_state": None if lda.random_state is None else int(lda.random_state),
            "components": np.asarray(lda.components_, dtype=np.float64),
            "exp_dirichlet_component": np.asarray(lda.exp_dirichlet_component_, dtype=np.float64),
            "doc_topic_prior": float(lda.doc_topic_prior_), "topic_word_prior": float(lda.topic_word_prior_),
            "n_iter": int(lda.n_iter_), "n_batch_iter": int(lda.n_batch_iter_), "bound": float(lda.bound_)}


def lda_from_state(state: Any, what: str = "LDA") -> Any:
    """The ``LatentDirichletAllocation`` :func:`lda_state` described; its ``transform`` gives the same
    topic distributions as the fitted one (it reads only these attributes, and is deterministic)."""
    from sklearn.decomposition import LatentDirichletAllocation

    k = _plain(state, "n_components", int, what)
    comp = _as_array(state.get("components"), f"{what} topics", 2)
    expd = _as_array(state.get("exp_dirichlet_component"), f"{what} topics", 2)
    if comp.shape[0] != k or expd.shape != comp.shape:
        raise CrossViewError(f"checkpoint: the representation's {what} has topics of shape {comp.shape} / "
                             f"{expd.shape} for {k} topics; the run is damaged: retrain it")
    rs = state.get("random_state")
    lda = LatentDirichletAllocation(n_components=k, max_iter=_plain(state, "max_iter", int, what),
                                    learning_method=_plain(state, "learning_method", str, what),
                                    random_state=None if rs is None else _plain(state, "random_state", int, what),
                                    n_jobs=1)
    lda.components_ = comp.astype(np.float64)
    lda.exp_dirichlet_component_ = expd.astype(np.float64)
    lda.doc_topic_prior_ = _plain(state, "doc_topic_prior", float, what)
    lda.topic_word_prior_ = _plain(state, "topic_word_prior", float, what)
    lda.n_iter_ = _plain(state, "n_iter", int, what)
    lda.n_batch_iter_ = _plain(state, "n_batch_iter", int, what)
    lda.bound_ = _plain(state, "bound", float, what)
    lda.n_features_in_ = comp.shape[1]
    return lda


class VisualTopics:
    """The image side of TR, fitted on training images: local descriptor -> :class:`DescriptorReducer`
    (L2 + PCA) -> nearest of ``n_words`` k-means centres -> bag of visual words -> LDA topics.

    ``fit(local (n, m, c), fit_images)`` learns the reducer, the codebook and the LDA from the rows
    ``fit_images`` only; ``transform(local (k, m, c)) -> (k, n_topics) float32`` (rows sum to 1) works
    for any images, new ones included. :meth:`state_dict` holds numpy arrays and plain values only.
    """

    def __init__(self, n_words: int = 1000, n_topics: int = 100, descriptor_dim: int = 128, seed: int = 0) -> None:
        self.n_words = n_words
        self.n_topics = n_topics
        self.descriptor_dim = descriptor_dim
        self.seed = seed

    def fit(self, local: np.ndarray, fit_images: np.ndarray, *, progress: Progress | None = None,
            should_stop: Callable[[], bool] | None = None) -> "VisualTopics":
        """Learn the reducer, the codebook and the topics from the descriptors of images ``fit_images``
        (:meth:`iter_fit` driven to its end; ``should_stop()`` cancels between two steps)."""
        from crossview.core.progress import drive_stages

        return drive_stages(self.iter_fit(local, fit_images), progress, should_stop,
                            lambda *_: "TR features cancelled while learning the visual words")

    def iter_fit(self, local: np.ndarray, fit_images: np.ndarray) -> Iterator[Report]:
        """:meth:`fit` as a generator: yields ``("visual words", step, 3)`` before the k-means codebook and after
        each step (codebook, histograms, LDA), and returns ``self``. Closing it between two steps stops it."""
        fit = np.asarray(fit_images, dtype=np.int64)
        self.reducer_, reduce_block = prepare_descriptors(local, fit, dim=self.descriptor_dim, seed=self.seed)
        yield "visual words", 0, 3
        rows = np.sort(fit)
        step = max(1, 65536 // max(int(local.shape[1]), 1))     # a block at a time: no copy of all training rows
        train_desc = np.concatenate([reduce_block(local[rows[s:s + step]]) for s in range(0, len(rows), step)])
        self.codebook_ = kmeans_codebook(train_desc, int(self.n_words), seed=self.seed)
        del train_desc
        yield "visual words", 1, 3
        hist = self.histograms(local, fit)
        yield "visual words", 2, 3
        self.lda_ = fit_topic_model(hist, int(self.n_topics), seed=self.seed)
        yield "visual words", 3, 3
        return self

    def histograms(self, local: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Bag-of-visual-words counts ``(k, n_words)`` of ``local (n, m, c)`` (of its ``rows``, in that
        order, when given; read a block at a time, so a memory-mapped array is never copied whole)."""
        local = np.asarray(local, dtype=np.float32) if not isinstance(local, np.ndarray) else local
        if local.ndim != 3:
            raise CrossViewError(f"local descriptors must be (images, descriptors, channels), got shape {local.shape}")
        _, m, c = local.shape
        want = self.reducer_.in_dim_
        if want is not None and c != want:
            raise CrossViewError(f"the visual words were learned from {want}-d local descriptors, these are {c}-d; "
                                 "use the image encoder the run was trained with")
        idx = np.arange(local.shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
        words = np.empty((len(idx), m), dtype=np.int64)
        step = max(1, 65536 // max(m, 1))
        for s in range(0, len(idx), step):
            block = np.asarray(local[idx[s:s + step]], dtype=np.float32).reshape(-1, c)
            words[s:s + step] = assign_visual_words(self.reducer_.transform(block), self.codebook_).reshape(-1, m)
        return bovw_histograms(words, int(self.n_words))

    def transform(self, local: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Topic distributions ``(k, n_topics) float32`` of the images whose descriptors are ``local``
        (its ``rows`` when given)."""
        if not hasattr(self, "lda_"):
            raise CrossViewError("VisualTopics.transform called before fit: fit it on the training images first")
        return topic_distributions(self.lda_, self.histograms(local, rows))

    def state_dict(self) -> dict[str, Any]:
        """Parameters and the fitted reducer, codebook and LDA, as numpy arrays and plain values."""
        return {"n_words": int(self.n_words), "n_topics": int(self.n_topics),
                "descriptor_dim": int(self.descriptor_dim), "seed": int(self.seed),
                "reducer": self.reducer_.state_dict(), "codebook": np.asarray(self.codebook_, dtype=np.float32),
                "lda": lda_state(self.lda_)}

    @classmethod
    def from_state_dict(cls, state: Any) -> "VisualTopics":
        """The fitted model :meth:`state_dict` described (checked: a checkpoint is data)."""
        what = "visual words"
        obj = cls(n_words=_plain(state, "n_words", int, what), n_topics=_plain(state, "n_topics", int, what),
                  descriptor_dim=_plain(state, "descriptor_dim", int, what), seed=_plain(state, "seed", int, what))
        obj.reducer_ = DescriptorReducer.from_state_dict(state.get("reducer"))
        obj.codebook_ = _as_array(state.get("codebook"), "visual-word codebook", 2).astype(np.float32)
        if obj.codebook_.shape[0] != obj.n_words:
            raise CrossViewError(f"checkpoint: the visual-word codebook has {obj.codebook_.shape[0]} words, not "
                                 f"{obj.n_words}; the run is damaged: retrain it")
        obj.lda_ = lda_from_state(state.get("lda"), "image LDA")
        if obj.lda_.components_.shape != (obj.n_topics, obj.n_words):
            raise CrossViewError(f"checkpoint: the image LDA has topics of shape {obj.lda_.components_.shape}, "
                                 f"expected ({obj.n_topics}, {obj.n_words}); the run is damaged: retrain it")
        return obj


# ====================================================================== the representation object
@dataclass
class Representation:
    """Features of every image and caption of one dataset in one representation.

    Attributes:
        name: ``"default"``, ``"modern"``, ``"tr"`` or ``"ctr"``.
        image: ``(n_images, p) float32`` in the dataset's image numbering.
        text: ``(n_captions, q) float32`` in the dataset's caption numbering.
        encode_captions: new captions (e.g. an independent corpus) -> ``(n, q) float32``, with the same
            fitted text side.
        fit_images: ``(n_fit,) int64``, the images (and their captions) everything was fitted on.
        info: what was used (encoders, dimensions, vocabulary sizes, cache hits), for reports.
        encode_images: new image files -> ``(k, p) float32`` through the same fitted image side
            (``encode_images(paths, device=...)``), or ``None`` where images come as precomputed features.
        text_model: the fitted text encoder whose output *is* the text side (``modern``: GloVe, ``tr``: LDA;
            ``None`` for ``ctr``, whose text side is further projected by CCA).
    """

    name: str
    image: np.ndarray
    text: np.ndarray
    encode_captions: Callable[[Sequence[str]], np.ndarray]
    fit_images: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)
    encode_images: Callable[..., np.ndarray] | None = None
    text_model: Any = None
    #: every image of another dataset through the same fitted image side, reading and filling the feature
    #: cache (``default`` / ``modern``; a cross-dataset test), or ``None``
    encode_dataset_images: Callable[[Any], np.ndarray] | None = None
    #: the backbone's pooled feature rows -> this representation's image rows (``default``: unchanged;
    #: ``modern``: the fitted PCA), or ``None`` where the image side is not a function of the pooled feature
    #: (TR / CTR: visual words of local descriptors). :mod:`crossview.explain` reads it.
    image_from_pooled: Callable[[np.ndarray], np.ndarray] | None = None


class RepresentationSplits(NamedTuple):
    """The :class:`MethodData` of each split (``None`` where the dataset has no such split)."""

    train: Any
    val: Any
    test: Any
    representation: Representation


def _resolve_fit_images(dataset: Any, fit_images: Sequence[int] | np.ndarray | str | None) -> np.ndarray:
    if fit_images is None:
        return np.arange(dataset.n_images, dtype=np.int64)
    if isinstance(fit_images, str):
        if fit_images not in dataset.splits:
            have = ", ".join(dataset.split_names) or "none"
            raise CrossViewError(f"dataset {dataset.name!r} has no split {fit_images!r} to fit the representation "
                                 f"on (it has: {have}); give one of those")
        return np.asarray(dataset.splits[fit_images], dtype=np.int64)
    idx = np.unique(np.asarray(fit_images, dtype=np.int64))
    if idx.size and (idx[0] < 0 or idx[-1] >= dataset.n_images):
        raise CrossViewError(f"fit images must be indices in [0, {dataset.n_images}), got {idx[0]}..{idx[-1]}")
    if idx.size < 2:
        raise CrossViewError(f"a representation needs at least 2 training images to fit on, got {idx.size}")
    return idx


def _captions_of_images(dataset: Any, images: np.ndarray) -> np.ndarray:
    keep = np.zeros(dataset.n_images, dtype=bool)
    keep[images] = True
    return np.flatnonzero(keep[dataset.caption_image])


def _ids_hash(ids: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(ids, dtype=np.int64).tobytes()).hexdigest()[:24]


def _store(cache: FeatureCache | None | bool) -> FeatureCache | None:
    if cache is False:
        return None
    return cache if isinstance(cache, FeatureCache) else FeatureCache()


def _iter_get(store: FeatureCache | None, parts: dict[str, Any], compute: Callable[[], Iterator[Any]],
              meta: dict[str, Any]) -> Iterator[Any]:
    """``(array, hit)`` through the cache (:meth:`FeatureCache.get_or_compute`) for work written as a generator:
    ``compute()``'s reports pass through (none on a hit) and its returned array is stored."""
    if store is None:
        return (yield from compute()), False
    key = FeatureCache.make_key(**parts)
    arr = store.load(key)
    if arr is not None:
        return arr, True
    value = yield from compute()
    return store.save(key, value, {**parts, **meta}), False


def _drained(work: Iterator[Any]) -> Any:
    """``work``'s result with its reports dropped (a step that reports nothing of its own)."""
    while True:
        try:
            next(work)
        except StopIteration as end:
            return end.value


def _stage(progress: Progress | None, stage: str) -> Callable[[int, int], None] | None:
    return None if progress is None else (lambda d, t: progress(stage, d, t))


def _stopped(what: str) -> Callable[[str, int, int], str]:
    return lambda stage, done, total: f"{what} cancelled ({stage}: {done:,} of {total:,} done)"


def local_descriptors(dataset: Any, encoder: Any, *, cache: FeatureCache | None = None, device: str = "cpu",
                      batch_size: int | None = None, num_workers: int | None = None,
                      progress: Callable[[int, int], None] | None = None,
                      should_stop: Callable[[], bool] | None = None) -> tuple[np.ndarray, dict[str, Any], bool]:
    """``(local (n_images, h*w, c) float32, cache parts, hit)``: the backbone's local descriptors of every
    image of ``dataset``, through the feature cache (:func:`iter_local_descriptors` driven to its end)."""
    from crossview.core.progress import drive

    return drive(iter_local_descriptors(dataset, encoder, cache=cache, device=device, batch_size=batch_size,
                                        num_workers=num_workers), progress, should_stop,
                 lambda done, n: f"local descriptors cancelled after {done:,} of {n:,} images")


def iter_local_descriptors(dataset: Any, encoder: Any, *, cache: FeatureCache | None = None, device: str = "cpu",
                           batch_size: int | None = None,
                           num_workers: int | None = None) -> Iterator[tuple[int, int]]:
    """:func:`local_descriptors` as a generator: yields ``(done, total)`` images at the start and after each
    batch (nothing on a cache hit) and returns ``(local, cache parts, hit)``."""
    from crossview.features import image_set_fingerprint

    if dataset.image_paths is None:
        raise CrossViewError(f"the TR/CTR representations need image files to compute visual words, but dataset "
                             f"{dataset.name!r} only ships precomputed image features; use --representation "
                             f"modern or default")
    parts = {"kind": "image-local",
             "images": image_set_fingerprint(dataset.image_paths, getattr(cache, "root", None)),
             "encoder": encoder.cache_parts(local=True)}

    def compute() -> Iterator[tuple[int, int]]:
        kw: dict[str, Any] = {"device": device, "local": True}
        if batch_size:
            kw["batch_size"] = batch_size
        if num_workers is not None:
            kw["num_workers"] = num_workers
        if not hasattr(encoder, "iter_encode_paths"):   # a plug-in encoder with the callback interface only
            n = len(dataset.image_paths)
            yield 0, n
            out = encoder.encode_paths(dataset.image_paths, **kw)
            yield n, n
            return np.asarray(out, dtype=np.float32)
        out = yield from encoder.iter_encode_paths(dataset.image_paths, **kw)
        return np.asarray(out, dtype=np.float32)

    arr, hit = yield from _iter_get(cache, parts, compute, {"dataset": dataset.name})
    return arr, parts, hit


def _iter_visual_topics(local: np.ndarray, fit_images: np.ndarray, *, n_words: int, n_topics: int,
                        descriptor_dim: int, seed: int) -> Iterator[Report]:
    """Returns the ``(n_images, n_topics) float32`` visual topic distributions (see the module docstring)."""
    model = VisualTopics(n_words=n_words, n_topics=n_topics, descriptor_dim=descriptor_dim, seed=seed)
    yield from model.iter_fit(local, fit_images)
    return model.transform(local)


def _fitted_text_encoder(name: str, params: dict[str, Any], captions: list[str]) -> Any:
    from crossview.features import text as text_mod

    enc = text_mod.create_text_encoder(name, **params)
    if enc.needs_fit:
        enc.fit(captions)
    return enc


def check_representation(dataset: Any, name: str, *, image_encoder: str | None = None,
                         text_encoder: str | None = None) -> None:
    """Raise :class:`CrossViewError` (saying what to do) if representation ``name`` cannot be built for
    ``dataset`` with these encoders; cheap, so callers check before any long work."""
    from crossview.features import PRECOMP

    if name not in REPRESENTATIONS:
        raise CrossViewError(f"unknown representation {name!r}; choose one of {', '.join(REPRESENTATIONS)}")
    if name != "default" and text_encoder is not None:
        raise CrossViewError(f"representation {name!r} fixes its text side; --text-encoder only applies to "
                             f"--representation default")
    if name in ("tr", "ctr") and (image_encoder == PRECOMP or dataset.image_paths is None):
        raise CrossViewError(f"the {name.upper()} representation needs image files to compute visual words, but "
                             f"dataset {dataset.name!r} has none (precomputed features only); use "
                             f"--representation modern or default")


def build_representation(dataset: Any, name: str = "default", *,
                         fit_images: Sequence[int] | np.ndarray | str | None = "train",
                         image_encoder: str | None = None, text_encoder: str | None = None,
                         n_topics: int = 100, n_words: int = 1000, descriptor_dim: int = 128,
                         pca_dim: int = 128, cca_reg: float = 0.1, seed: int = 0,
                         cache: FeatureCache | None | bool = None, device: str = "cpu",
                         batch_size: int | None = None, num_workers: int | None = None,
                         image_weights: str | None = None, allow_random: bool = False,
                         progress: Progress | None = None,
                         should_stop: Callable[[], bool] | None = None) -> Representation:
    """Features of every image and caption of ``dataset`` in representation ``name``
    (:func:`iter_build_representation` driven to its end).

    Args:
        dataset: a :class:`~crossview.data.dataset.PairedDataset`.
        name: ``"default"``, ``"modern"``, ``"tr"`` or ``"ctr"`` (:data:`REPRESENTATIONS`).
        fit_images: what the learned parts (LDA, k-means, PCA, CCA, fitted text encoders) learn from:
            a split name (default ``"train"``), image indices (a cross-validation fold), or ``None``
            for all images.
        image_encoder / text_encoder: override the encoders (``default``: the package defaults;
            ``modern`` / ``tr`` / ``ctr``: the default backbone; the text side of those is fixed).
        n_topics: LDA topics per modality (TR/CTR; 100 as in the paper).
        n_words: visual vocabulary size (the paper's 1000).
        descriptor_dim: local descriptors are PCA-reduced to this before k-means (SIFT's 128).
        pca_dim: the "modern" image features' PCA size (the paper's 128).
        cca_reg: CTR's CCA ridge, as a fraction of the average variance (TR rows sum to 1, so
            their covariance is singular and plain CCA would be ill-posed).
        seed: k-means and LDA seed.
        cache: a :class:`FeatureCache`, ``None`` for the default one, ``False`` for none.
        progress: ``progress(stage, done, total)``; ``should_stop()`` cancels
            (:class:`~crossview.core.errors.Cancelled`) between two steps. Both also serve the returned
            representation's encoders when they run later (``encode_captions`` of a corpus,
            ``encode_dataset_images``).

    Returns:
        A :class:`Representation`; ``image (n_images, p)``, ``text (n_captions, q)`` float32.
    """
    from crossview.core.progress import drive_stages

    work = iter_build_representation(
        dataset, name, fit_images=fit_images, image_encoder=image_encoder, text_encoder=text_encoder,
        n_topics=n_topics, n_words=n_words, descriptor_dim=descriptor_dim, pca_dim=pca_dim, cca_reg=cca_reg,
        seed=seed, cache=cache, device=device, batch_size=batch_size, num_workers=num_workers,
        image_weights=image_weights, allow_random=allow_random, encoders_progress=progress,
        encoders_should_stop=should_stop)
    return drive_stages(work, progress, should_stop, _stopped(f"the {name} representation"))


def iter_build_representation(dataset: Any, name: str = "default", *,
                              fit_images: Sequence[int] | np.ndarray | str | None = "train",
                              image_encoder: str | None = None, text_encoder: str | None = None,
                              n_topics: int = 100, n_words: int = 1000, descriptor_dim: int = 128,
                              pca_dim: int = 128, cca_reg: float = 0.1, seed: int = 0,
                              cache: FeatureCache | None | bool = None, device: str = "cpu",
                              batch_size: int | None = None, num_workers: int | None = None,
                              image_weights: str | None = None, allow_random: bool = False,
                              encoders_progress: Progress | None = None,
                              encoders_should_stop: Callable[[], bool] | None = None) -> Iterator[Report]:
    """:func:`build_representation` as a generator: yields ``(stage, done, total)`` (``images``, ``local
    descriptors``, ``visual words``, ``fit text``, ``captions``, ``cca``) and returns the :class:`Representation`.
    Closing it between two steps stops the work. ``encoders_progress`` / ``encoders_should_stop`` are for the
    returned representation's encoders when they run later (a corpus's captions, another dataset's images)."""
    from crossview import features as F
    from crossview.features import image as image_mod

    check_representation(dataset, name, image_encoder=image_encoder, text_encoder=text_encoder)
    store = _store(cache)
    progress = encoders_progress          # the returned encoders' later work only: the build yields its reports
    stop = encoders_should_stop or (lambda: False)
    fit = _resolve_fit_images(dataset, fit_images)
    fit_caps_idx = _captions_of_images(dataset, fit)
    fit_caps = [dataset.captions[i] for i in fit_caps_idx]
    if not fit_caps:
        raise CrossViewError(f"the {len(fit)} training images of dataset {dataset.name!r} have no captions "
                             "to fit the text side on")
    info: dict[str, Any] = {"representation": name, "fit_images": int(len(fit))}

    def encode_with(model: Any, stage: str) -> Callable[[Sequence[str]], np.ndarray]:
        def enc(captions: Sequence[str]) -> np.ndarray:
            out, _ = F.encode_captions(list(captions), model, cache=store, device=device,
                                       progress=_stage(progress, stage), should_stop=stop,
                                       dataset_name=dataset.name)
            return to_dense(out)        # a TF-IDF / bag-of-words encoder gives CSR rows; topics need dense
        return enc

    if name in ("default", "modern"):
        from crossview.features import text as text_mod

        text_name = "glove" if name == "modern" else (text_encoder or text_mod.DEFAULT_TEXT_ENCODER)
        yield "fit text", 0, 1
        text_model = _fitted_text_encoder(text_name, {}, fit_caps)
        yield "fit text", 1, 1
        feats = yield from F.iter_extract_features(
            dataset, image_encoder, text_encoder=None, text_model=text_model,
            cache=store if store is not None else False, device=device, batch_size=batch_size,
            num_workers=num_workers, image_weights=image_weights, allow_random=allow_random)
        image = np.asarray(feats.image, dtype=np.float32)
        text = to_dense(feats.text)     # topics and the modern PCA need dense rows (TF-IDF comes sparse)
        info.update(image_encoder=feats.image_encoder, text_encoder=feats.text_encoder,
                    image_cache_hit=feats.image_cache_hit, text_cache_hit=feats.text_cache_hit)
        pca = None
        if name == "modern":
            k = min(int(pca_dim), image.shape[1], len(fit))
            pca = image_mod.PCAReducer(n_components=k).fit(image[fit])
            image = pca.transform(image)
            info.update(pca_dim=k, pca_explained=float(pca.explained_variance_ratio_.sum()))
        info.update(image_dim=int(image.shape[1]), text_dim=int(text.shape[1]))
        encode_images = None
        if dataset.image_paths is not None and feats.image_encoder != F.PRECOMP:
            backbone: dict[str, Any] = {}

            def encode_images(paths: Sequence[str], *, device: str = device) -> np.ndarray:
                """New image files through the backbone (and the PCA fitted on the training images)."""
                if "encoder" not in backbone:
                    backbone["encoder"] = image_mod.create_image_encoder(
                        feats.image_encoder, weights=image_weights, allow_random=allow_random)
                x = np.asarray(backbone["encoder"].encode_paths([str(p) for p in paths], num_workers=0,
                                                                device=device), dtype=np.float32)
                return x if pca is None else np.asarray(pca.transform(x), dtype=np.float32)
        def encode_dataset_images(other: Any) -> np.ndarray:
            """Every image of ``other`` with the same encoder, through the feature cache (and the PCA fitted
            on this dataset's training images)."""
            got = F.extract_features(other, feats.image_encoder, text_encoder=None, text_model=text_model,
                                     cache=store if store is not None else False, device=device,
                                     batch_size=batch_size, num_workers=num_workers, image_weights=image_weights,
                                     allow_random=allow_random, progress=progress, should_stop=stop)
            x = np.asarray(got.image, dtype=np.float32)
            return x if pca is None else np.asarray(pca.transform(x), dtype=np.float32)

        def image_from_pooled(x: np.ndarray) -> np.ndarray:
            x = np.asarray(x, dtype=np.float32)
            return x if pca is None else np.asarray(pca.transform(x), dtype=np.float32)

        return Representation(name, image, text, encode_with(text_model, "corpus"), fit, info,
                              encode_images=encode_images, text_model=text_model,
                              encode_dataset_images=encode_dataset_images,
                              image_from_pooled=None if feats.image_encoder == F.PRECOMP else image_from_pooled)

    # ---------------------------------------------------------------- TR / CTR
    enc_name = image_encoder or image_mod.DEFAULT_IMAGE_ENCODER
    encoder = image_mod.create_image_encoder(enc_name, weights=image_weights, allow_random=allow_random)
    local, local_parts, local_hit = yield from _staged("local descriptors", iter_local_descriptors(
        dataset, encoder, cache=store, device=device, batch_size=batch_size, num_workers=num_workers))
    tr_parts = {"kind": "tr-image", "version": _TR_VERSION, "local": FeatureCache.make_key(**local_parts),
                "fit": _ids_hash(fit), "n_words": int(n_words), "n_topics": int(n_topics),
                "descriptor_dim": int(descriptor_dim), "seed": int(seed)}
    image, image_hit = yield from _iter_get(store, tr_parts, lambda: _iter_visual_topics(
        local, fit, n_words=n_words, n_topics=n_topics, descriptor_dim=descriptor_dim, seed=seed),
        {"dataset": dataset.name})
    image = np.asarray(image, dtype=np.float32)
    yield "fit text", 0, 1
    lda_text = _fitted_text_encoder("lda", {"n_topics": int(n_topics), "random_state": int(seed)}, fit_caps)
    yield "fit text", 1, 1
    encode_tr = encode_with(lda_text, "captions")
    text, _ = yield from _staged("captions", F.iter_encode_captions(dataset.captions, lda_text, cache=store,
                                                                    device=device, dataset_name=dataset.name))
    text = to_dense(text)
    info.update(image_encoder=enc_name, text_encoder="lda", n_words=int(n_words), n_topics=int(n_topics),
                descriptors_per_image=int(local.shape[1]), descriptor_dim=int(descriptor_dim),
                local_cache_hit=local_hit, image_cache_hit=image_hit,
                text_vocabulary=len(lda_text.vocabulary_))
    visual: dict[str, VisualTopics] = {}

    def encode_tr_images(paths: Sequence[str], *, device: str = device) -> np.ndarray:
        """Topics of new image files. The visual words are refitted once, exactly as the features above
        were made (same descriptors, training images and seed), since those may have come from the cache;
        the descriptors are read again then (a cache hit) rather than kept in memory all along."""
        if "model" not in visual:
            again, _, _ = local_descriptors(dataset, encoder, cache=store, device=device, batch_size=batch_size,
                                            num_workers=num_workers, should_stop=stop)
            visual["model"] = VisualTopics(n_words=n_words, n_topics=n_topics, descriptor_dim=descriptor_dim,
                                           seed=seed).fit(again, fit)
        new = encoder.encode_paths([str(p) for p in paths], local=True, num_workers=0, device=device)
        return visual["model"].transform(np.asarray(new, dtype=np.float32))

    if name == "tr":
        info.update(image_dim=int(image.shape[1]), text_dim=int(text.shape[1]))
        return Representation(name, image, text, encode_tr, fit, info, encode_images=encode_tr_images,
                              text_model=lda_text)

    from crossview.core.linalg import cca_transform, fit_cca

    yield "cca", 0, 1
    # One training pair per caption (images repeated), as the CCA method does.
    res = fit_cca(image[dataset.caption_image[fit_caps_idx]], text[fit_caps_idx], n_components=n_topics,
                  reg=cca_reg)
    yield "cca", 1, 1
    img_ctr = cca_transform(image, res.x_mean, res.x_proj)
    txt_ctr = cca_transform(text, res.y_mean, res.y_proj)

    def encode_ctr(captions: Sequence[str]) -> np.ndarray:
        return cca_transform(encode_tr(captions), res.y_mean, res.y_proj)

    def encode_ctr_images(paths: Sequence[str], *, device: str = device) -> np.ndarray:
        return cca_transform(encode_tr_images(paths, device=device), res.x_mean, res.x_proj)

    info.update(image_dim=int(img_ctr.shape[1]), text_dim=int(txt_ctr.shape[1]), cca_reg=float(cca_reg),
                correlations=[float(c) for c in res.correlations])
    rep = Representation(name, img_ctr, txt_ctr, encode_ctr, fit, info, encode_images=encode_ctr_images)
    rep.info["cca"] = res  # the fitted projections, for inspection and tests
    return rep


# ====================================================================== MethodData for splits / folds
def method_data_for_images(dataset: Any, rep: Representation, images: Sequence[int] | np.ndarray,
                           name: str = "") -> Any:
    """The :class:`~crossview.methods.base.MethodData` of the given images (in that order) and all their
    captions, with ``rep``'s features."""
    from crossview.data.method_data import MethodData

    images = np.asarray(images, dtype=np.int64)
    sub = dataset.subset(images)
    # subset keeps the parent's caption ids; map them back to the parent's caption rows.
    parent_ids = np.asarray(dataset.caption_ids, dtype=np.int64)
    order = np.argsort(parent_ids, kind="stable")
    cap_rows = order[np.searchsorted(parent_ids[order], np.asarray(sub.caption_ids, dtype=np.int64))]
    label_set_names = None
    label_sets = None
    if dataset.label_sets is not None:
        label_set_names = sorted({str(x) for s in dataset.label_sets for x in s})
        lookup = {n: i for i, n in enumerate(label_set_names)}
        label_sets = [[lookup[str(x)] for x in s] for s in sub.label_sets]
    return MethodData(image_features=rep.image[images], text_features=rep.text[cap_rows],
                      captions=list(sub.captions), caption_image=sub.caption_image, labels=sub.labels,
                      label_sets=label_sets, label_set_names=label_set_names, dataset=sub, name=name,
                      meta={"representation": rep.name})


def representation_splits(dataset: Any, name: str = "default", *, fit_on: str = "train",
                          **kwargs: Any) -> RepresentationSplits:
    """Train / val / test :class:`~crossview.methods.base.MethodData` of ``dataset`` in representation
    ``name`` (see :func:`build_representation` for ``kwargs``), everything fitted on split ``fit_on``.

    A split the dataset does not have is ``None``.
    """
    rep = build_representation(dataset, name, fit_images=fit_on, **kwargs)
    out = {}
    for split in ("train", "val", "test"):
        out[split] = (method_data_for_images(dataset, rep, dataset.splits[split], split)
                      if split in dataset.splits else None)
    return RepresentationSplits(out["train"], out["val"], out["test"], rep)


# ====================================================================== TR / CTR in ordinary runs
#: The representations a run can be trained on besides its encoders' features
#: (``crossview train bitr --set representation=tr|ctr``).
RUN_REPRESENTATIONS = ("tr", "ctr")


class TopicRepresentation:
    """A fitted TR or CTR that encodes *new* inputs: image files -> local descriptors -> visual words ->
    topics [-> CCA], sentences -> the ``lda`` encoder's topics [-> CCA].

    Attributes:
        name: ``"tr"`` or ``"ctr"``.
        image_encoder: the backbone whose local descriptors are quantised: ``{"name", "weights",
            "weights_path"}`` (weights = the weights file's SHA-256, or ``"random"``).
        visual: the fitted :class:`VisualTopics`.
        text: the fitted ``lda`` :class:`~crossview.features.text.TextEncoder`.
        cca: CTR's projections ``{"x_mean", "x_proj", "y_mean", "y_proj", "correlations"}`` (numpy
            arrays), or ``None`` for TR.

    :meth:`state_dict` holds numpy arrays and plain values only (checkpoints are loaded weights-only).
    """

    def __init__(self, name: str, image_encoder: dict[str, Any], visual: VisualTopics, text: Any,
                 cca: dict[str, np.ndarray] | None = None) -> None:
        self.name = name
        self.image_encoder = image_encoder
        self.visual = visual
        self.text = text
        self.cca = cca
        self._encoder: Any = None

    @property
    def dim(self) -> int:
        """Width of the features (both modalities)."""
        return int(self.cca["x_proj"].shape[1]) if self.cca is not None else int(self.visual.n_topics)

    def encode_local(self, local: np.ndarray) -> np.ndarray:
        """Image features ``(k, dim) float32`` from local descriptors ``(k, m, c)``."""
        from crossview.core.linalg import cca_transform

        x = self.visual.transform(local)
        return x if self.cca is None else cca_transform(x, self.cca["x_mean"], self.cca["x_proj"])

    def encode_captions(self, captions: Sequence[str], *, device: str = "cpu", cache: FeatureCache | None = None,
                        progress: Callable[[int, int], None] | None = None,
                        should_stop: Callable[[], bool] | None = None, dataset_name: str = "") -> np.ndarray:
        """Caption features ``(n, dim) float32`` (the fitted ``lda`` topics, CCA-projected for CTR;
        :meth:`iter_encode_captions` driven to its end)."""
        from crossview.core.progress import drive

        return drive(self.iter_encode_captions(captions, device=device, cache=cache, dataset_name=dataset_name),
                     progress, should_stop, lambda done, n: f"caption topics cancelled after {done:,} of {n:,}")

    def iter_encode_captions(self, captions: Sequence[str], *, device: str = "cpu",
                             cache: FeatureCache | None = None, dataset_name: str = "") -> Iterator[tuple[int, int]]:
        """:meth:`encode_captions` as a generator of ``(done, total)`` reports that returns the features."""
        from crossview import features as F
        from crossview.core.linalg import cca_transform

        t, _ = yield from F.iter_encode_captions(list(captions), self.text, cache=cache, device=device,
                                                 dataset_name=dataset_name)
        t = to_dense(t)
        return t if self.cca is None else cca_transform(t, self.cca["y_mean"], self.cca["y_proj"])

    def image_encoder_instance(self) -> Any:
        """The backbone the run used (built once; its weights must be the run's, checked by hash)."""
        if self._encoder is None:
            from crossview.features import image as image_mod

            rec = self.image_encoder
            enc = image_mod.create_image_encoder(rec["name"], weights=rec.get("weights_path"),
                                                 allow_random=rec.get("weights") == "random")
            have = getattr(enc, "weights_hash", None)
            if rec.get("weights") is not None and have != rec.get("weights"):
                raise CrossViewError(f"the run's visual words were learned on {rec['name']} local descriptors with "
                                     f"weights {str(rec.get('weights'))[:12]}..., but this machine's {rec['name']} "
                                     f"weights are {str(have)[:12]}...; put the run's weights file in place or "
                                     "retrain the run here")
            self._encoder = enc
        return self._encoder

    def encode_image_files(self, paths: Sequence[str], *, device: str = "cpu") -> np.ndarray:
        """Image features ``(k, dim) float32`` of new image files, through the run's backbone."""
        local = self.image_encoder_instance().encode_paths([str(p) for p in paths], local=True, num_workers=0,
                                                             device=device)
        return self.encode_local(np.asarray(local, dtype=np.float32))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything fitted, as numpy arrays and plain values: the descriptor PCA, the codebook, both
        LDA models (arrays, no scikit-learn object), the CCA (CTR)."""
        return {"format": 1, "name": self.name, "image_encoder": dict(self.image_encoder),
                "visual": self.visual.state_dict(), "text": self.text.state_dict(),
                "cca": None if self.cca is None else {k: np.asarray(v) for k, v in self.cca.items()}}

    @classmethod
    def from_state_dict(cls, state: Any) -> "TopicRepresentation":
        """The fitted representation :meth:`state_dict` described (checked: a run folder is data)."""
        from crossview.features.text import TextEncoder

        if not isinstance(state, dict) or state.get("name") not in RUN_REPRESENTATIONS:
            raise CrossViewError("checkpoint: the saved TR/CTR representation is not readable (no valid name); "
                                 "the run is damaged: retrain it")
        if state.get("format") != 1:
            raise CrossViewError(f"checkpoint: the saved representation has format {state.get('format')!r}, this "
                                 "version reads 1; retrain the run with this version")
        rec = state.get("image_encoder")
        if not isinstance(rec, dict) or not isinstance(rec.get("name"), str):
            raise CrossViewError("checkpoint: the saved representation names no image encoder; the run is damaged")
        visual = VisualTopics.from_state_dict(state.get("visual"))
        text = TextEncoder.from_state_dict(state.get("text"))
        if text.name != "lda" or text.dim != visual.n_topics:
            raise CrossViewError(f"checkpoint: the saved representation's text side is {text.name!r} with {text.dim} "
                                 f"topics, expected 'lda' with {visual.n_topics}; the run is damaged")
        cca = None
        if state["name"] == "ctr":
            raw = state.get("cca")
            if not isinstance(raw, dict):
                raise CrossViewError("checkpoint: a CTR representation without its CCA; the run is damaged")
            cca = {k: _as_array(raw.get(k), f"CCA {k}", 2 if k.endswith("proj") else 1)
                   for k in ("x_mean", "x_proj", "y_mean", "y_proj", "correlations")}
            if cca["x_proj"].shape[0] != visual.n_topics or cca["y_proj"].shape[0] != text.dim or \
                    cca["x_proj"].shape[1] != cca["y_proj"].shape[1]:
                raise CrossViewError(f"checkpoint: the CCA projections {cca['x_proj'].shape} / {cca['y_proj'].shape} "
                                     "do not fit the topics; the run is damaged")
        return cls(state["name"], {"name": rec["name"], "weights": rec.get("weights"),
                                   "weights_path": rec.get("weights_path")}, visual, text, cca)


@dataclass
class RepresentationFeatures(Features):
    """:class:`~crossview.features.Features` of a TR / CTR run, with the fitted representation that
    encodes new queries (:class:`~crossview.engine.retriever.Retriever` calls :meth:`encode_new_images`
    / :meth:`encode_new_captions`, then the run's normalisation ``image_transform`` / ``text_transform``)."""

    representation: Any = None

    def encode_new_images(self, paths: Sequence[str], *, device: str = "cpu") -> np.ndarray:
        """Features ``(k, dim)`` of new image files (before the run's normalisation)."""
        return self.representation.encode_image_files(paths, device=device)

    def encode_new_captions(self, captions: Sequence[str], *, device: str = "cpu") -> np.ndarray:
        """Features ``(n, dim)`` of new sentences (before the run's normalisation)."""
        return self.representation.encode_captions(captions, device=device)

    def image_from_pooled(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """The representation's map from the backbone's pooled feature rows to its image rows (before the
        run's normalisation), or ``None`` when its image side is not such a function (TR / CTR)."""
        rep = getattr(self.representation, "rep", None)
        return getattr(rep, "image_from_pooled", None)


def representation_request(method: Any) -> dict[str, Any] | None:
    """What a method asks the run's features to be (its ``feature_representation()``: ``{"name", ...}``
    keyword arguments of :func:`representation_features`), or ``None`` for the encoders' features."""
    ask = getattr(method, "feature_representation", None)
    req = ask() if callable(ask) else None
    return dict(req) if req else None


def check_run_representation(dataset: Any, request: dict[str, Any], *, image_encoder: str | None = None,
                             text_encoder: str | None = None) -> None:
    """Raise :class:`CrossViewError` (saying what to do) when a run cannot build the representation
    ``request`` on ``dataset``: cheap, so the engine calls it before any folder or extraction."""
    from crossview.features import PRECOMP
    from crossview.features import image as image_mod

    name = request.get("name")
    if name not in RUN_REPRESENTATIONS:
        raise CrossViewError(f"unknown representation {name!r}; choose one of: features, "
                             f"{', '.join(RUN_REPRESENTATIONS)}")
    if text_encoder is not None:
        raise CrossViewError(f"representation={name} fixes the text side (LDA topics of the caption words); "
                             f"drop --text-encoder {text_encoder}, or use representation=features")
    if image_encoder == PRECOMP or getattr(dataset, "image_paths", None) is None:
        raise CrossViewError(f"representation={name} needs image files to learn visual words from, but dataset "
                             f"{dataset.name!r} has precomputed image features only; use representation=features")
    image_mod.create_image_encoder(image_encoder or image_mod.DEFAULT_IMAGE_ENCODER)  # weights present?


def _encoder_record(encoder: Any) -> dict[str, Any]:
    source = getattr(encoder, "weights_source", None)
    path = getattr(encoder, "weights_path", None)
    name = getattr(encoder, "full_name", encoder.name)      # with its option (":flip"), which the rows depend on
    return {"name": str(name), "weights": getattr(encoder, "weights_hash", None),
            "weights_path": str(path) if source == "user" and path is not None else None}


def _iter_representation_result(dataset: Any, model: TopicRepresentation, local: np.ndarray, *, encoder: Any,
                                fit_on: str | None, cache: FeatureCache | None, device: str,
                                hits: dict[str, bool]) -> Iterator[Report]:
    """Returns the whole dataset's features through ``model`` (the same code path for a run and for open_run)."""
    yield "topics", 0, 1
    image = model.encode_local(local)
    yield "topics", 1, 1
    text = yield from _staged("captions", model.iter_encode_captions(dataset.captions, device=device, cache=cache,
                                                                     dataset_name=dataset.name))
    enc_name = model.image_encoder["name"]
    spec = {"image": {"name": enc_name, "dim": int(image.shape[1]), **encoder.cache_parts(local=True)},
            "text": {"name": "lda", **model.text.cache_parts()}, "fit_on": fit_on,
            "dataset_fingerprint": dataset.fingerprint(), "representation": model.state_dict()}
    return RepresentationFeatures(image=image, text=text, image_encoder=f"{enc_name}+{model.name}",
                                  text_encoder=f"lda+{model.name}", text_model=None,
                                  image_cache_hit=hits.get("image", False), text_cache_hit=hits.get("text", False),
                                  spec=spec, representation=model)


def representation_features(dataset: Any, name: str, *, fit_on: str = "train", image_encoder: str | None = None,
                            n_topics: int = 100, n_words: int = 1000, descriptor_dim: int = 128,
                            cca_reg: float = 0.1, seed: int = 0, cache: FeatureCache | None | bool = None,
                            device: str = "cpu", batch_size: int | None = None, num_workers: int | None = None,
                            progress: Progress | None = None,
                            should_stop: Callable[[], bool] | None = None) -> RepresentationFeatures:
    """TR / CTR features of every image and caption of ``dataset`` for a run (:func:`iter_representation_features`
    driven to its end): ``progress(stage, done, total)`` gets every report; ``should_stop()`` is asked after each
    and cancels (:class:`~crossview.core.errors.Cancelled`)."""
    from crossview.core.progress import drive_stages

    return drive_stages(iter_representation_features(
        dataset, name, fit_on=fit_on, image_encoder=image_encoder, n_topics=n_topics, n_words=n_words,
        descriptor_dim=descriptor_dim, cca_reg=cca_reg, seed=seed, cache=cache, device=device,
        batch_size=batch_size, num_workers=num_workers), progress, should_stop,
        _stopped(f"{name.upper()} features"))


def iter_representation_features(dataset: Any, name: str, *, fit_on: str = "train", image_encoder: str | None = None,
                                 n_topics: int = 100, n_words: int = 1000, descriptor_dim: int = 128,
                                 cca_reg: float = 0.1, seed: int = 0, cache: FeatureCache | None | bool = None,
                                 device: str = "cpu", batch_size: int | None = None,
                                 num_workers: int | None = None) -> Iterator[Report]:
    """TR / CTR features of every image and caption of ``dataset`` for a run, everything fitted on the
    images of split ``fit_on`` and their captions only (the descriptor PCA, the k-means codebook, the
    image LDA, the ``lda`` text encoder, CTR's CCA), with the fitted :class:`TopicRepresentation`
    attached (``spec["representation"]`` is its state, which the run's checkpoint keeps).

    A generator, as :func:`crossview.features.iter_extract_features`: it yields ``(stage, done, total)``
    (``local descriptors``, ``visual words``, ``fit text``, ``cca``, ``topics``, ``captions``) and *returns* the
    :class:`RepresentationFeatures`; closing it between two steps stops the work (the engine drives it as the
    run's own events). The local descriptors go through the feature cache.
    """
    from crossview.features import image as image_mod

    check_run_representation(dataset, {"name": name}, image_encoder=image_encoder)
    store = _store(cache)
    fit = _resolve_fit_images(dataset, fit_on)
    if len(fit) < 2:
        raise CrossViewError(f"split {fit_on!r} of dataset {dataset.name!r} has {len(fit)} image(s); the "
                             f"{name.upper()} representation needs at least 2 training images")
    fit_caps = [dataset.captions[i] for i in _captions_of_images(dataset, fit)]
    if not fit_caps:
        raise CrossViewError(f"the {len(fit)} training images of dataset {dataset.name!r} have no captions to "
                             "fit the text topics on")
    encoder = image_mod.create_image_encoder(image_encoder or image_mod.DEFAULT_IMAGE_ENCODER)
    local, _, local_hit = yield from _staged("local descriptors", iter_local_descriptors(
        dataset, encoder, cache=store, device=device, batch_size=batch_size, num_workers=num_workers))
    visual = VisualTopics(n_words=n_words, n_topics=n_topics, descriptor_dim=descriptor_dim, seed=seed)
    yield from visual.iter_fit(local, fit)
    yield "fit text", 0, 1
    text_model = _fitted_text_encoder("lda", {"n_topics": int(n_topics), "random_state": int(seed)}, fit_caps)
    yield "fit text", 1, 1
    model = TopicRepresentation(name, _encoder_record(encoder), visual, text_model)
    if name == "ctr":
        from crossview.core.linalg import fit_cca

        yield "cca", 0, 1
        fit_caps_idx = _captions_of_images(dataset, fit)
        # One training pair per caption (images repeated), as the CCA method does.
        img_tr = visual.transform(local, fit)
        row = {int(i): r for r, i in enumerate(fit)}
        pairs = np.array([row[int(dataset.caption_image[c])] for c in fit_caps_idx], dtype=np.int64)
        # the training captions' topics: a part of the "cca" step, which reports no progress of its own
        txt_tr = _drained(model.iter_encode_captions([dataset.captions[c] for c in fit_caps_idx], cache=store,
                                                     device=device, dataset_name=dataset.name))
        res = fit_cca(img_tr[pairs], txt_tr, n_components=int(n_topics), reg=float(cca_reg))
        model.cca = {"x_mean": res.x_mean, "x_proj": res.x_proj, "y_mean": res.y_mean, "y_proj": res.y_proj,
                     "correlations": np.asarray(res.correlations, dtype=np.float64)}
        yield "cca", 1, 1
    return (yield from _iter_representation_result(dataset, model, local, encoder=encoder, fit_on=fit_on,
                                                   cache=store, device=device, hits={"image": local_hit}))


def restore_representation_features(dataset: Any, state: Any, *, fit_on: str | None = "train",
                                    cache: FeatureCache | None | bool = None, device: str = "cpu",
                                    progress: Progress | None = None,
                                    should_stop: Callable[[], bool] | None = None) -> RepresentationFeatures:
    """The features a TR / CTR run was trained on, rebuilt from its checkpoint's saved representation
    (:func:`iter_restore_representation_features` driven to its end)."""
    from crossview.core.progress import drive_stages

    return drive_stages(iter_restore_representation_features(dataset, state, fit_on=fit_on, cache=cache,
                                                              device=device), progress, should_stop,
                        _stopped("TR/CTR features"))


def iter_restore_representation_features(dataset: Any, state: Any, *, fit_on: str | None = "train",
                                         cache: FeatureCache | None | bool = None,
                                         device: str = "cpu") -> Iterator[Report]:
    """The features a TR / CTR run was trained on, rebuilt from its checkpoint's saved representation
    (``state``, :meth:`TopicRepresentation.state_dict`): nothing is refitted; the local descriptors
    come from the feature cache (a hit on the machine that trained the run). A generator of ``(stage, done,
    total)`` that returns the :class:`RepresentationFeatures`."""
    model = TopicRepresentation.from_state_dict(state)
    store = _store(cache)
    encoder = model.image_encoder_instance()
    local, _, local_hit = yield from _staged("local descriptors", iter_local_descriptors(
        dataset, encoder, cache=store, device=device))
    return (yield from _iter_representation_result(dataset, model, local, encoder=encoder, fit_on=fit_on,
                                                   cache=store, device=device, hits={"image": local_hit}))


# ====================================================================== modern / TR / CTR as a run's recorded representation
#: The representations a run can record in ``config.json`` and the engine builds (and ``open_run``
#: rebuilds) with :func:`build_representation`: the trials of ``crossview experiment bitr-table``.
BUILT_REPRESENTATIONS = ("modern", "tr", "ctr")
#: The keyword arguments of :func:`build_representation` such a record may hold, with their types.
_RECORD_PARAMS: dict[str, tuple[type, ...]] = {
    "image_encoder": (str,), "image_weights": (str,), "allow_random": (bool,), "n_topics": (int,),
    "n_words": (int,), "descriptor_dim": (int,), "pca_dim": (int,), "cca_reg": (int, float), "seed": (int,)}


def representation_record(name: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"name": name, **params}``: what a run records in ``config.json`` (``representation``) to be built
    on representation ``name`` with :func:`build_representation`'s ``params`` (checked)."""
    record = {"name": name, **(params or {})}
    check_representation_record(record)
    return record


def check_representation_record(record: Any, where: str = "representation") -> tuple[str, dict[str, Any]]:
    """``(name, build_representation keyword arguments)`` of a recorded representation, checked (a run
    folder is data): one :class:`CrossViewError` naming ``where`` when it is not one."""
    if not isinstance(record, dict) or record.get("name") not in BUILT_REPRESENTATIONS:
        name = record.get("name") if isinstance(record, dict) else record
        raise CrossViewError(f"{where}: unknown representation {name!r}; a run can be built on "
                             f"{', '.join(BUILT_REPRESENTATIONS)} (or its encoders' features)")
    params = {k: v for k, v in record.items() if k != "name"}
    for k, v in params.items():
        kinds = _RECORD_PARAMS.get(k)
        if kinds is None:
            raise CrossViewError(f"{where}: the representation has an unknown setting {k!r}; known: "
                                 f"{', '.join(_RECORD_PARAMS)}")
        if v is not None and (not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds)):
            want = {str: "text", bool: "true / false", int: "whole number"}.get(kinds[0], "number")
            raise CrossViewError(f"{where}: the representation's {k} is {v!r}, not a {want}")
    return str(record["name"]), params


class BuiltRepresentation:
    """A :class:`Representation` built for a run from its recorded settings: encodes new queries (image
    files through the same backbone and fitted image side, sentences through the fitted text side)."""

    def __init__(self, rep: Representation, record: dict[str, Any]) -> None:
        self.rep = rep
        self.record = dict(record)
        self.name = rep.name

    def encode_captions(self, captions: Sequence[str], *, device: str = "cpu") -> np.ndarray:
        return to_dense(self.rep.encode_captions(list(captions)))

    def encode_image_files(self, paths: Sequence[str], *, device: str = "cpu") -> np.ndarray:
        if self.rep.encode_images is None:
            raise CrossViewError(f"this run's {self.name} features come from precomputed image features, so a new "
                                 "image file cannot be encoded; query with an image of the dataset instead")
        return np.asarray(self.rep.encode_images([str(p) for p in paths], device=device), dtype=np.float32)


def built_representation_features(rep: Representation, record: dict[str, Any]) -> RepresentationFeatures:
    """``rep`` as a run's :class:`RepresentationFeatures` (``spec["built_representation"]`` = ``record``)."""
    info = rep.info
    return RepresentationFeatures(image=np.asarray(rep.image, dtype=np.float32),
                                  text=np.asarray(rep.text, dtype=np.float32),
                                  image_encoder=str(info.get("image_encoder", "?")),
                                  text_encoder=str(info.get("text_encoder", "?")), text_model=rep.text_model,
                                  image_cache_hit=bool(info.get("image_cache_hit", False)),
                                  text_cache_hit=bool(info.get("text_cache_hit", False)),
                                  spec={"built_representation": dict(record)},
                                  representation=BuiltRepresentation(rep, record))


def rebuild_representation_features(dataset: Any, record: Any, *, fit_on: str = "train",
                                    cache: FeatureCache | None | bool = None, device: str = "cpu",
                                    progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
                                    where: str = "representation") -> RepresentationFeatures:
    """The features of a run recorded on representation ``record`` (:func:`iter_rebuild_representation_features`
    driven to its end; ``progress`` and ``should_stop`` also serve the representation's encoders later)."""
    from crossview.core.progress import drive_stages

    return drive_stages(iter_rebuild_representation_features(
        dataset, record, fit_on=fit_on, cache=cache, device=device, where=where, encoders_progress=progress,
        encoders_should_stop=should_stop), progress, should_stop, _stopped(f"{where}: the representation"))


def iter_rebuild_representation_features(dataset: Any, record: Any, *, fit_on: str = "train",
                                         cache: FeatureCache | None | bool = None, device: str = "cpu",
                                         where: str = "representation", encoders_progress: Progress | None = None,
                                         encoders_should_stop: Callable[[], bool] | None = None
                                         ) -> Iterator[Report]:
    """The features of a run recorded on representation ``record`` (:func:`representation_record`): built
    by :func:`iter_build_representation` fitted on the images of split ``fit_on``, so a run, its resume and
    ``open_run`` get the very features the run was trained on (deterministic, seeded; the expensive parts
    come from the feature cache). A generator of ``(stage, done, total)`` that returns the
    :class:`RepresentationFeatures`; the record is checked before the first report."""
    name, params = check_representation_record(record, where)
    if fit_on not in dataset.splits:
        raise CrossViewError(f"{where}: dataset {dataset.name!r} has no split {fit_on!r} to fit the {name} "
                             "representation on")
    rep = yield from iter_build_representation(
        dataset, name, fit_images=np.asarray(dataset.splits[fit_on], dtype=np.int64), cache=cache, device=device,
        encoders_progress=encoders_progress, encoders_should_stop=encoders_should_stop, **params)
    return built_representation_features(rep, record)
