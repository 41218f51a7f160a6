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
  (``crossview.methods.cca.fit_cca`` / ``cca_transform``), rows L2-normalised.
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
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from crossview.errors import Cancelled, CrossViewError
from crossview.features.cache import FeatureCache

__all__ = ["REPRESENTATIONS", "Representation", "RepresentationSplits", "build_representation", "check_representation",
           "representation_splits", "method_data_for_images", "kmeans_codebook", "assign_visual_words",
           "bovw_histograms", "fit_topic_model", "topic_distributions", "prepare_descriptors",
           "local_descriptors", "DescriptorReducer"]

#: Representation names, as ``crossview experiment bitr-table --representation`` spells them.
REPRESENTATIONS: dict[str, str] = {
    "default": "the default image and text encoders (CNN pooled features, sentence encoder)",
    "modern": "CNN features + PCA to 128-d, averaged GloVe word vectors (the paper's section 7.7)",
    "tr": "LDA topics of visual words (k-means of CNN local descriptors) and of caption words",
    "ctr": "TR projected by CCA (fit on train), L2-normalised",
}

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``, as :func:`crossview.features.extract_features` calls it."""

# Bump when the way TR image features are computed changes, so old cache entries stop matching.
_TR_VERSION = 1


# ====================================================================== visual words: plain functions
class DescriptorReducer:
    """L2-normalise local descriptors, then PCA them to ``dim`` (fitted on training descriptors).

    ``fit(descriptors (n, c))`` / ``transform(descriptors (n, c)) -> (n, dim) float32``. With
    ``dim >= c`` only the normalisation is applied.
    """

    def __init__(self, dim: int = 128) -> None:
        self.dim = dim

    @staticmethod
    def _l2(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        n = np.linalg.norm(x, axis=1, keepdims=True)
        return x / np.maximum(n, np.float32(1e-12))

    def fit(self, descriptors: np.ndarray) -> "DescriptorReducer":
        from crossview.features.image import PCAReducer

        x = self._l2(descriptors)
        self.pca_ = None
        if self.dim < x.shape[1]:
            self.pca_ = PCAReducer(n_components=min(int(self.dim), x.shape[0])).fit(x)
        return self

    def transform(self, descriptors: np.ndarray) -> np.ndarray:
        x = self._l2(descriptors)
        return x if self.pca_ is None else self.pca_.transform(x)


def kmeans_codebook(descriptors: np.ndarray, n_words: int, *, seed: int = 0, n_iter: int = 20) -> np.ndarray:
    """Visual-word centres ``(n_words, c) float32``: seeded k-means of ``descriptors (n, c)``.

    k-means++ seeding (scikit-learn), then FAISS Lloyd iterations (scikit-learn ``KMeans`` when FAISS
    is not installed). Needs at least ``2 * n_words`` descriptors.
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
    from sklearn.cluster import kmeans_plusplus

    # k-means++ seeding (on a sample of at most 64 points per word: it costs O(k^2 log k) distance rows),
    # then Lloyd iterations. A plain random start can leave a cluster without a centre.
    rng = np.random.default_rng(seed)
    sample = x if len(x) <= 64 * n_words else x[rng.choice(len(x), 64 * n_words, replace=False)]
    init, _ = kmeans_plusplus(sample, n_words, random_state=int(seed))
    init = np.ascontiguousarray(init, dtype=np.float32)
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
    """

    name: str
    image: np.ndarray
    text: np.ndarray
    encode_captions: Callable[[Sequence[str]], np.ndarray]
    fit_images: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)


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


def _get(store: FeatureCache | None, parts: dict[str, Any], compute: Callable[[], np.ndarray],
         meta: dict[str, Any]) -> tuple[np.ndarray, bool]:
    if store is None:
        return compute(), False
    return store.get_or_compute(FeatureCache.make_key(**parts), compute, meta={**parts, **meta})


def _stage(progress: Progress | None, stage: str) -> Callable[[int, int], None] | None:
    return None if progress is None else (lambda d, t: progress(stage, d, t))


def local_descriptors(dataset: Any, encoder: Any, *, cache: FeatureCache | None = None, device: str = "cpu",
                      batch_size: int | None = None, num_workers: int | None = None,
                      progress: Callable[[int, int], None] | None = None,
                      should_stop: Callable[[], bool] | None = None) -> tuple[np.ndarray, dict[str, Any], bool]:
    """``(local (n_images, h*w, c) float32, cache parts, hit)``: the backbone's local descriptors of every
    image of ``dataset``, through the feature cache."""
    from crossview.features import image_set_fingerprint

    if dataset.image_paths is None:
        raise CrossViewError(f"the TR/CTR representations need image files to compute visual words, but dataset "
                             f"{dataset.name!r} only ships precomputed image features; use --representation "
                             f"modern or default")
    parts = {"kind": "image-local", "images": image_set_fingerprint(dataset.image_paths),
             "encoder": encoder.cache_parts(local=True)}

    def compute() -> np.ndarray:
        kw: dict[str, Any] = {"device": device, "local": True, "progress": progress, "should_stop": should_stop}
        if batch_size:
            kw["batch_size"] = batch_size
        if num_workers is not None:
            kw["num_workers"] = num_workers
        return np.asarray(encoder.encode_paths(dataset.image_paths, **kw), dtype=np.float32)

    arr, hit = _get(cache, parts, compute, {"dataset": dataset.name})
    return arr, parts, hit


def _visual_topics(local: np.ndarray, fit_images: np.ndarray, *, n_words: int, n_topics: int,
                   descriptor_dim: int, seed: int, progress: Progress | None,
                   should_stop: Callable[[], bool]) -> np.ndarray:
    """``(n_images, n_topics) float32`` visual topic distributions (see the module docstring)."""
    n, m, _ = local.shape
    _, reduce_block = prepare_descriptors(local, fit_images, dim=descriptor_dim, seed=seed)
    if progress:
        progress("visual words", 0, 3)
    train_desc = reduce_block(local[np.sort(fit_images)])
    codebook = kmeans_codebook(train_desc, n_words, seed=seed)
    if should_stop():
        raise Cancelled("TR features cancelled after the k-means codebook")
    if progress:
        progress("visual words", 1, 3)
    words = np.empty((n, m), dtype=np.int64)
    step = max(1, 65536 // max(m, 1))
    for s in range(0, n, step):
        words[s:s + step] = assign_visual_words(reduce_block(local[s:s + step]), codebook).reshape(-1, m)
    hist = bovw_histograms(words, n_words)
    if progress:
        progress("visual words", 2, 3)
    lda = fit_topic_model(hist[fit_images], n_topics, seed=seed)
    topics = topic_distributions(lda, hist)
    if progress:
        progress("visual words", 3, 3)
    return topics


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
    """Features of every image and caption of ``dataset`` in representation ``name``.

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
            (:class:`~crossview.errors.Cancelled`).

    Returns:
        A :class:`Representation`; ``image (n_images, p)``, ``text (n_captions, q)`` float32.
    """
    from crossview import features as F
    from crossview.features import image as image_mod

    check_representation(dataset, name, image_encoder=image_encoder, text_encoder=text_encoder)
    store = _store(cache)
    stop = should_stop or (lambda: False)
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
            return np.asarray(out, dtype=np.float32)
        return enc

    if name in ("default", "modern"):
        from crossview.features import text as text_mod

        text_name = "glove" if name == "modern" else (text_encoder or text_mod.DEFAULT_TEXT_ENCODER)
        if progress:
            progress("fit text", 0, 1)
        text_model = _fitted_text_encoder(text_name, {}, fit_caps)
        if progress:
            progress("fit text", 1, 1)
        feats = F.extract_features(dataset, image_encoder, text_encoder=None, text_model=text_model,
                                   cache=store if store is not None else False, device=device,
                                   batch_size=batch_size, num_workers=num_workers, image_weights=image_weights,
                                   allow_random=allow_random, progress=progress, should_stop=should_stop)
        image = np.asarray(feats.image, dtype=np.float32)
        text = np.asarray(feats.text, dtype=np.float32)
        info.update(image_encoder=feats.image_encoder, text_encoder=feats.text_encoder,
                    image_cache_hit=feats.image_cache_hit, text_cache_hit=feats.text_cache_hit)
        if name == "modern":
            k = min(int(pca_dim), image.shape[1], len(fit))
            pca = image_mod.PCAReducer(n_components=k).fit(image[fit])
            image = pca.transform(image)
            info.update(pca_dim=k, pca_explained=float(pca.explained_variance_ratio_.sum()))
        info.update(image_dim=int(image.shape[1]), text_dim=int(text.shape[1]))
        return Representation(name, image, text, encode_with(text_model, "corpus"), fit, info)

    # ---------------------------------------------------------------- TR / CTR
    enc_name = image_encoder or image_mod.DEFAULT_IMAGE_ENCODER
    encoder = image_mod.create_image_encoder(enc_name, weights=image_weights, allow_random=allow_random)
    local, local_parts, local_hit = local_descriptors(dataset, encoder, cache=store, device=device,
                                                      batch_size=batch_size, num_workers=num_workers,
                                                      progress=_stage(progress, "local descriptors"),
                                                      should_stop=stop)
    tr_parts = {"kind": "tr-image", "version": _TR_VERSION, "local": FeatureCache.make_key(**local_parts),
                "fit": _ids_hash(fit), "n_words": int(n_words), "n_topics": int(n_topics),
                "descriptor_dim": int(descriptor_dim), "seed": int(seed)}
    image, image_hit = _get(store, tr_parts, lambda: _visual_topics(
        local, fit, n_words=n_words, n_topics=n_topics, descriptor_dim=descriptor_dim, seed=seed,
        progress=progress, should_stop=stop), {"dataset": dataset.name})
    image = np.asarray(image, dtype=np.float32)
    if progress:
        progress("fit text", 0, 1)
    lda_text = _fitted_text_encoder("lda", {"n_topics": int(n_topics), "random_state": int(seed)}, fit_caps)
    if progress:
        progress("fit text", 1, 1)
    encode_tr = encode_with(lda_text, "captions")
    text = encode_tr(dataset.captions)
    info.update(image_encoder=enc_name, text_encoder="lda", n_words=int(n_words), n_topics=int(n_topics),
                descriptors_per_image=int(local.shape[1]), descriptor_dim=int(descriptor_dim),
                local_cache_hit=local_hit, image_cache_hit=image_hit,
                text_vocabulary=len(lda_text.vocabulary_))
    if name == "tr":
        info.update(image_dim=int(image.shape[1]), text_dim=int(text.shape[1]))
        return Representation(name, image, text, encode_tr, fit, info)

    from crossview.methods.cca import cca_transform, fit_cca

    if progress:
        progress("cca", 0, 1)
    # One training pair per caption (images repeated), as the CCA method does.
    res = fit_cca(image[dataset.caption_image[fit_caps_idx]], text[fit_caps_idx], n_components=n_topics,
                  reg=cca_reg)
    if progress:
        progress("cca", 1, 1)
    img_ctr = cca_transform(image, res.x_mean, res.x_proj)
    txt_ctr = cca_transform(text, res.y_mean, res.y_proj)

    def encode_ctr(captions: Sequence[str]) -> np.ndarray:
        return cca_transform(encode_tr(captions), res.y_mean, res.y_proj)

    info.update(image_dim=int(img_ctr.shape[1]), text_dim=int(txt_ctr.shape[1]), cca_reg=float(cca_reg),
                correlations=[float(c) for c in res.correlations])
    rep = Representation(name, img_ctr, txt_ctr, encode_ctr, fit, info)
    rep.info["cca"] = res  # the fitted projections, for inspection and tests
    return rep


# ====================================================================== MethodData for splits / folds
def method_data_for_images(dataset: Any, rep: Representation, images: Sequence[int] | np.ndarray,
                           name: str = "") -> Any:
    """The :class:`~crossview.methods.base.MethodData` of the given images (in that order) and all their
    captions, with ``rep``'s features."""
    from crossview.methods.base import MethodData

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
