"""Frozen encoders and the feature cache: turn a dataset into ``(image, text)`` feature matrices.

- :mod:`crossview.features.image`: image backbones (torchvision, EfficientNet-Lite0), weights offline only.
- :mod:`crossview.features.text`: bag of words / TF-IDF, LDA topics, GloVe averages, MiniLM / local BERT.
- :mod:`crossview.features.tags`: nouns and verbs of a caption (the webly method's tags).
- :mod:`crossview.features.cache`: the content-addressed on-disk cache.

:func:`extract_features` is the one entry point the engine, the CLI and the GUI use. Encoders are
imported lazily so that ``import crossview.features`` stays cheap.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.progress import drive, drive_stages
from crossview.core.hashing import utf8_bytes
from crossview.core.io import drop_pages
from crossview.features.cache import REBUILD_HINT, FeatureCache

__all__ = ["Features", "FeatureCache", "extract_features", "iter_extract_features", "encode_captions",
           "iter_encode_captions", "encode_texts", "image_set_fingerprint", "iter_image_set_fingerprint",
           "PRECOMP"]

log = logging.getLogger(__name__)

#: The "encoder" name of features that come with the dataset (VSE++ ``*_precomp`` folders).
PRECOMP = "precomp"
#: the text encoder name of runs whose method reads the captions itself (no caption features are made)
NO_TEXT = "none"

#: the stage of reading and hashing image files whose content hash is not known yet (the cache's key)
HASH_STAGE = "image hashes"

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)`` with stage ``"image hashes"`` (only when files must be read), ``"images"``,
``"fit text"`` or ``"captions"``."""


@dataclass
class Features:
    """Feature matrices of a whole dataset (all splits), and where they came from.

    ``image (n_images, d) float32`` and ``text (n_captions, e) float32`` follow the dataset's image
    and caption numbering; either may be memory-mapped (read-only) when large. ``text`` is a float32
    ``scipy.sparse.csr_matrix`` for the sparse encoders (TF-IDF, bag of words): never densified whole
    (:meth:`crossview.data.method_data.MethodData.require_text_features`).
    """

    image: np.ndarray
    text: Any   #: (n, e) array or CSR matrix; None when the method reads the captions itself (text encoder 'none')
    image_encoder: str
    text_encoder: str
    text_model: Any = None  #: the fitted TextEncoder, needed to encode new captions (queries, corpora)
    image_cache_hit: bool = False
    text_cache_hit: bool = False
    spec: dict = field(default_factory=dict)  #: what a checkpoint records to rebuild the features
    #: the fitted normalisations (crossview.features.normalize) that new queries go through, if any
    image_transform: Any = None
    text_transform: Any = None


def encode_texts(features: Any, captions: Sequence[str], device: str = "cpu") -> np.ndarray:
    """``(n, e) float32``: new captions (queries, tag strings) encoded as a run's caption features are: through
    ``features``' fitted text encoder (or a representation's own text side, ``encode_new_captions``), then the
    run's text normalisation (``text_transform``)."""
    model = getattr(features, "text_model", None)
    encode = getattr(features, "encode_new_captions", None)   # a representation's own text side (TR/CTR)
    if model is None and encode is None:
        raise CrossViewError("this run has no text encoder to encode new sentences with")
    x = np.asarray(encode(list(captions), device=device) if encode is not None else
                   model.encode(list(captions), device=device), dtype=np.float32)
    transform = getattr(features, "text_transform", None)
    return x if transform is None else np.asarray(transform(x), dtype=np.float32)

def run_image_encoder(features: Any) -> Any:
    """The frozen image encoder that made ``features``' image rows (the run's backbone, its recorded weights),
    to encode new image files the same way; a :class:`CrossViewError` for precomputed features."""
    from crossview.features.image import create_image_encoder

    spec = (features.spec or {}).get("image", {})
    name = spec.get("name") or features.image_encoder
    if name == PRECOMP or str(name).endswith(PRECOMP):
        raise CrossViewError("this run uses precomputed image features, so a new image file cannot be encoded; "
                             "query with an image of the dataset instead")
    name = str(name)
    head, _, tail = name.rpartition("+")
    if head and tail in ("modern", "tr", "ctr"):     # a representation's features: its backbone makes the rows
        name = head
    return create_image_encoder(name, weights=spec.get("weights_path"),
                                allow_random="random" in (spec.get("weights_hash"), spec.get("weights"),
                                                          *(b.get("weights") for b in spec.get("blocks", ())
                                                            if isinstance(b, dict))))


def image_set_fingerprint(paths: Sequence[str], memo_root: str | os.PathLike[str] | None = None) -> str:
    """A hash of the image files' contents, in order (:mod:`crossview.features.file_hashes`): a file replaced by
    another gives a new key whatever its name, size and times; the same files moved elsewhere give the same key.
    Each file's hash is remembered in ``memo_root`` (default: the feature cache folder) per file state, so an
    unchanged file is not read again (:func:`iter_image_set_fingerprint` driven to its end)."""
    return drive(iter_image_set_fingerprint(paths, memo_root))


def iter_image_set_fingerprint(paths: Sequence[str],
                               memo_root: str | os.PathLike[str] | None = None) -> Iterator[tuple[int, int]]:
    """:func:`image_set_fingerprint` as a generator: yields ``(done, total)`` over the files it must read (none
    when every file is unchanged since it was hashed; a first hash of thousands of photos reports every half
    second) and returns the fingerprint."""
    from crossview.core.settings import get_settings
    from crossview.features.file_hashes import FileHashes

    hashes = FileHashes(memo_root if memo_root is not None else get_settings().features_dir)
    digests = yield from hashes.iter_digests(paths)
    h = hashlib.sha256(b"image-contents-v1\0")
    for d in digests:
        h.update(d if d is not None else b"missing")
        h.update(b"\0")
    return h.hexdigest()[:24]


def _captions_fingerprint(captions: Sequence[str]) -> str:
    h = hashlib.sha256()
    for c in captions:
        h.update(utf8_bytes(c))
        h.update(b"\0")
    return h.hexdigest()[:24]


def _nonfinite_rows(x: np.ndarray, block_bytes: int = 16 << 20) -> np.ndarray:
    """Indices of the rows of ``x`` holding NaN or infinity, read in blocks (``x`` may be memory-mapped, or a scipy
    CSR matrix: its stored values are checked)."""
    if hasattr(x, "tocsr") and hasattr(x, "nnz"):
        x = x.tocsr()
        bad = np.flatnonzero(~np.isfinite(x.data))
        return np.unique(np.searchsorted(x.indptr, bad, side="right") - 1).astype(np.int64)
    x = np.asarray(x) if not isinstance(x, np.ndarray) else x
    if x.ndim == 0 or x.shape[0] == 0 or not np.issubdtype(x.dtype, np.floating):
        return np.zeros(0, dtype=np.int64)
    row_bytes = max(1, x[:1].nbytes)
    step = max(1, block_bytes // row_bytes)
    bad = []
    for start in range(0, x.shape[0], step):
        block = np.asarray(x[start:start + step]).reshape(min(step, x.shape[0] - start), -1)
        ok = np.isfinite(block).all(axis=1)
        if not ok.all():
            bad.append(np.flatnonzero(~ok) + start)
    return np.concatenate(bad).astype(np.int64) if bad else np.zeros(0, dtype=np.int64)


def _iter_cached_finite(store: FeatureCache | None, parts: dict[str, Any],
                        compute: Callable[[], Iterator[tuple[int, int]]], meta: dict[str, Any], what: str,
                        row_name: Callable[[int], str]) -> Iterator[tuple[int, int]]:
    """``(array, hit)`` through the cache, never with NaN / infinite rows, for work written as a generator
    (``compute()`` yields ``(done, total)`` and returns the array; its reports pass through).

    A cached array with such rows is dropped and computed again; an encoder that produces them raises
    :class:`CrossViewError` naming the first bad row (nothing is kept in the cache)."""
    result: dict[str, np.ndarray] = {}

    def run() -> Iterator[tuple[int, int]]:
        result["value"] = yield from compute()

    key = FeatureCache.make_key(**parts) if store is not None else None
    cached = store.load(key) if store is not None and key is not None else None
    if cached is not None and not len(_nonfinite_rows(cached)):
        if isinstance(cached, np.ndarray):
            drop_pages(cached)  # the check read every page of the mapping: they need not stay resident
        return cached, True
    if cached is not None and store is not None and key is not None:
        bad = _nonfinite_rows(cached)
        log.warning("feature cache: %s holds NaN or infinite values in %d row(s) of the %s (first: %s); "
                    "deleted it, extracting them again (%s)", store.path_of(key), len(bad), what,
                    row_name(int(bad[0])), REBUILD_HINT)
        store.delete(key)
    yield from run()
    arr = result["value"]
    bad = _nonfinite_rows(arr)
    if len(bad):
        raise CrossViewError(
            f"the {what} contain NaN or infinite values in {len(bad):,} of {arr.shape[0]:,} rows (first: "
            f"{row_name(int(bad[0]))}) straight from the encoder, so extracting them again gives the same; "
            f"check that input (e.g. 'crossview data info DATASET --check-images') or choose another encoder")
    if store is not None and key is not None:
        arr = store.save(key, arr, meta)
    return arr, False


def _stage(progress: Progress | None, stage: str) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(stage, done, total)


def _fit_captions(dataset: Any, fit_on: str | None) -> list[str]:
    """Captions a fitted text encoder learns from: those of the ``fit_on`` split (all if it is absent)."""
    if fit_on and fit_on in getattr(dataset, "splits", {}):
        images = set(int(i) for i in dataset.splits[fit_on])
        return [c for c, im in zip(dataset.captions, dataset.caption_image) if int(im) in images]
    return list(dataset.captions)


def extract_features(dataset: Any, image_encoder: str | None = None, text_encoder: str | None = None, *,
                     fit_on: str | None = "train", cache: FeatureCache | None | bool = None,
                     device: str = "cpu", batch_size: int | None = None, num_workers: int | None = None,
                     image_weights: str | None = None, allow_random: bool = False,
                     text_params: dict | None = None, text_model: Any = None,
                     progress: Progress | None = None,
                     should_stop: Callable[[], bool] | None = None) -> Features:
    """Image and caption features of every image and caption of ``dataset`` (:func:`iter_extract_features`
    driven to its end): ``progress(stage, done, total)`` gets each report, ``should_stop()`` is asked between two
    batches and cancels (:class:`~crossview.core.errors.Cancelled`)."""
    work = iter_extract_features(dataset, image_encoder, text_encoder, fit_on=fit_on, cache=cache, device=device,
                                 batch_size=batch_size, num_workers=num_workers, image_weights=image_weights,
                                 allow_random=allow_random, text_params=text_params, text_model=text_model)
    return drive_stages(work, progress, should_stop, lambda stage, done, total:
                        f"feature extraction cancelled ({stage}: {done:,} of {total:,} done)")


def iter_extract_features(dataset: Any, image_encoder: str | None = None, text_encoder: str | None = None, *,
                          fit_on: str | None = "train", cache: FeatureCache | None | bool = None,
                          device: str = "cpu", batch_size: int | None = None, num_workers: int | None = None,
                          image_weights: str | None = None, allow_random: bool = False,
                          text_params: dict | None = None,
                          text_model: Any = None) -> Iterator[tuple[str, int, int]]:
    """Image and caption features of every image and caption of ``dataset``, as a generator: it yields
    ``(stage, done, total)`` reports (stage ``"image hashes"`` while image files not seen before are read for the
    cache's key, none when every file is known; ``"images"``, ``"fit text"`` or ``"captions"``; a stage that does
    work reports 0 first, a cached one only its end) and *returns* the :class:`Features`
    (``feats = yield from iter_extract_features(...)``). Closing it between two batches stops the work.

    ``image_encoder`` / ``text_encoder`` are registry names (defaults: the packages' defaults);
    a dataset with precomputed image features uses them (``"precomp"``). Fitted text encoders (TF-IDF,
    LDA, ...) learn on the captions of split ``fit_on`` only, so test captions never leak into them;
    pass ``text_model`` (an already fitted encoder, e.g. from a checkpoint) to reuse one instead.
    ``cache=False`` disables the cache; ``None`` uses the default folder.
    """
    from crossview.features import image as image_mod
    from crossview.features import text as text_mod

    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or not 1 <= batch_size <= 65_536):
        raise CrossViewError(f"batch size {batch_size!r}: give an integer from 1 to 65,536 (images per batch)")
    if num_workers is not None and (not isinstance(num_workers, int) or not 0 <= num_workers <= 256):
        raise CrossViewError(f"workers {num_workers!r}: give an integer from 0 to 256 (image decoding processes; "
                             "0: none)")
    store = None if cache is False else (cache if isinstance(cache, FeatureCache) else FeatureCache())

    # ---------------------------------------------------------------- images
    if dataset.image_features is not None and dataset.image_paths is None:
        if image_encoder not in (None, PRECOMP):
            raise CrossViewError(
                f"dataset {dataset.name!r} ships precomputed image features and no image files, so image "
                f"encoder {image_encoder!r} cannot run on it; leave the image encoder unset (or 'precomp')")
        image = np.asarray(dataset.image_features, dtype=np.float32)
        bad = _nonfinite_rows(image)
        if len(bad):
            raise CrossViewError(f"dataset {dataset.name!r}: its precomputed image features contain NaN or "
                                 f"infinite values in {len(bad):,} of {len(image):,} rows (first: row {bad[0]}); "
                                 f"fix or re-export the dataset's feature file")
        # a dataset built in code skips the reader's check: all-zero, constant or overflowing features refused
        from crossview.data.readers.precomp import check_degenerate
        notes: list[str] = []
        check_degenerate(image, Path(f"dataset {dataset.name!r} (precomputed image features)"), notes)
        for note in notes:
            log.warning("%s", note)
        drop_pages(image)       # the checks read every page: a memory-mapped set need not keep them resident
        image_name, image_hit, image_spec = PRECOMP, True, {"name": PRECOMP, "dim": int(image.shape[1])}
    else:
        image_name = image_encoder or image_mod.DEFAULT_IMAGE_ENCODER
        if image_name == PRECOMP:
            raise CrossViewError(f"dataset {dataset.name!r} has no precomputed image features; "
                                 f"choose an image encoder ({', '.join(image_mod.list_image_encoders())})")
        enc = image_mod.create_image_encoder(image_name, weights=image_weights, allow_random=allow_random)
        # keyed on the files' contents (a first hash of many files is a stage of its own, with progress);
        # nothing to key when there is no cache to look in
        fingerprint = None if store is None else (yield from _staged(
            HASH_STAGE, iter_image_set_fingerprint(dataset.image_paths, store.root)))
        parts = {"kind": "image", "images": fingerprint, "encoder": enc.cache_parts()}

        def compute_images() -> Iterator[tuple[int, int]]:
            kw: dict[str, Any] = {"device": device}
            if batch_size:
                kw["batch_size"] = batch_size
            if num_workers is not None:
                kw["num_workers"] = num_workers
            if not hasattr(enc, "iter_encode_paths"):     # a plug-in encoder with the callback interface only
                n = len(dataset.image_paths)
                yield 0, n
                out = enc.encode_paths(dataset.image_paths, **kw)
                yield n, n
                return out
            return (yield from enc.iter_encode_paths(dataset.image_paths, **kw))

        paths = dataset.image_paths
        if isinstance(enc, image_mod.ConcatImageEncoder):
            # each backbone's block through the cache under its own key (shared with plain runs), then combined
            image, image_hit = yield from _staged("images", _iter_concat_blocks(
                store, enc, fingerprint, paths, dataset.name, batch_size, num_workers, device))
        else:
            image, image_hit = yield from _staged("images", _iter_cached_finite(
                store, parts, compute_images, {**parts, "dataset": dataset.name}, f"image features ({image_name})",
                lambda i: f"image {i}, {paths[i]}"))
        image = np.asarray(image, dtype=np.float32) if not isinstance(image, np.ndarray) else image
        image_spec = {**enc.cache_parts(), "name": image_name, "dim": int(image.shape[1])}  # the name with options

    # ---------------------------------------------------------------- captions
    if text_encoder == NO_TEXT and text_model is None:      # the method reads the captions itself
        return Features(image=image, text=None, image_encoder=image_name, text_encoder=NO_TEXT,
                        image_cache_hit=image_hit, spec={"image": image_spec, "text": {"name": NO_TEXT},
                                                         "fit_on": fit_on,
                                                         "dataset_fingerprint": dataset.fingerprint()})
    if text_model is None:
        text_name = text_encoder or text_mod.DEFAULT_TEXT_ENCODER
        text_model = text_mod.create_text_encoder(text_name, **(text_params or {}))
        if text_model.needs_fit:
            fit_caps = _fit_captions(dataset, fit_on)
            yield "fit text", 0, 1
            text_model.fit(fit_caps)
            yield "fit text", 1, 1
    text, text_hit = yield from _staged("captions", iter_encode_captions(
        dataset.captions, text_model, cache=store, device=device, dataset_name=dataset.name))
    return Features(image=image, text=text, image_encoder=image_name, text_encoder=text_model.name,
                    text_model=text_model, image_cache_hit=image_hit, text_cache_hit=text_hit,
                    spec={"image": image_spec, "text": {"name": text_model.name, **text_model.cache_parts()},
                          "fit_on": fit_on, "dataset_fingerprint": dataset.fingerprint()})


def _iter_concat_blocks(store: FeatureCache | None, enc: Any, fingerprint: str | None, paths: Sequence[str],
                        dataset_name: str, batch_size: int | None, num_workers: int | None,
                        device: str) -> Iterator[tuple[int, int]]:
    """``(combined features, all blocks were cache hits)`` of a :class:`~crossview.features.image.ConcatImageEncoder`:
    each block cached under its own backbone's key, reports ``(done, total)`` over all blocks' images."""
    n, k = len(paths), len(enc.blocks)
    blocks, hits = [], []
    for j, block in enumerate(enc.blocks):
        parts = {"kind": "image", "images": fingerprint, "encoder": block.cache_parts()}

        def compute(block: Any = block) -> Iterator[tuple[int, int]]:
            kw: dict[str, Any] = {"device": device}
            if batch_size:
                kw["batch_size"] = batch_size
            if num_workers is not None:
                kw["num_workers"] = num_workers
            return (yield from block.iter_encode_paths(paths, **kw))

        work = _iter_cached_finite(store, parts, compute, {**parts, "dataset": dataset_name},
                                   f"image features ({block.full_name})", lambda i: f"image {i}, {paths[i]}")
        while True:
            try:
                done, _ = next(work)
            except StopIteration as end:
                arr, hit = end.value
                break
            yield j * n + done, k * n
        blocks.append(np.asarray(arr, dtype=np.float32))
        hits.append(hit)
    yield k * n, k * n
    return enc.combine(blocks), all(hits)


def _staged(stage: str, work: Iterator[tuple[int, int]]) -> Iterator[tuple[str, int, int]]:
    """``work``'s ``(done, total)`` reports as ``(stage, done, total)``; returns its result (closing this closes
    ``work``: its ``finally`` frees decoding workers)."""
    while True:
        try:
            done, total = next(work)
        except StopIteration as end:
            return end.value
        try:
            yield stage, done, total
        except GeneratorExit:
            work.close()
            raise


def encode_captions(captions: Sequence[str], text_model: Any, *, cache: FeatureCache | None = None,
                    device: str = "cpu", progress: Callable[[int, int], None] | None = None,
                    should_stop: Callable[[], bool] | None = None,
                    dataset_name: str = "") -> tuple[np.ndarray, bool]:
    """``(features (n, e) float32, cache_hit)`` of ``captions`` with a (fitted) text encoder
    (:func:`iter_encode_captions` driven to its end; a CSR matrix for TF-IDF / bag of words).

    Used for a dataset's captions and for independent caption corpora (the BITR setting).
    """
    from crossview.core.progress import drive

    return drive(iter_encode_captions(captions, text_model, cache=cache, device=device, dataset_name=dataset_name),
                 progress, should_stop,
                 lambda done, n: f"text encoding ({text_model.name}) cancelled after {done} of {n} captions")


def iter_encode_captions(captions: Sequence[str], text_model: Any, *, cache: FeatureCache | None = None,
                         device: str = "cpu", dataset_name: str = "") -> Iterator[tuple[int, int]]:
    """:func:`encode_captions` as a generator: yields ``(done, total)`` (0 first when it encodes; only
    ``(n, n)`` for a cache hit: the whole stage done at once) and returns ``(features, cache_hit)``.

    An encoder with ``sparse_output`` (TF-IDF, bag of words) gives a ``scipy.sparse.csr_matrix`` float32, stored
    sparse in the cache: its dense ``n x vocabulary`` form is never made (issue 34)."""
    def compute() -> Iterator[tuple[int, int]]:
        if getattr(text_model, "sparse_output", False) and hasattr(text_model, "iter_encode_sparse"):
            return (yield from text_model.iter_encode_sparse(list(captions), device=device))
        if not hasattr(text_model, "iter_encode"):      # a plug-in encoder with the callback interface only
            yield 0, len(captions)
            out = np.asarray(text_model.encode(list(captions), device=device), dtype=np.float32)
            yield len(captions), len(captions)
            return out
        x = yield from text_model.iter_encode(list(captions), device=device)
        return np.asarray(x, dtype=np.float32)

    parts = {"kind": "text", "captions": _captions_fingerprint(captions), "encoder": text_model.cache_parts()}
    if getattr(text_model, "sparse_output", False):
        parts["layout"] = "csr"       # a dense entry written before the sparse rows is not this one
    text, hit = yield from _iter_cached_finite(cache, parts, compute, {**parts, "dataset": dataset_name},
                                               f"caption features ({text_model.name})",
                                               lambda i: f"caption {i}, {str(captions[i])[:60]!r}")
    if hit:
        yield len(captions), len(captions)
    return text, hit
