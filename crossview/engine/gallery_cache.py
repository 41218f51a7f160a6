"""A run's gallery embeddings, cached: computed on first use, read memory-mapped on the next (issue 34).

A :class:`~crossview.engine.retriever.Retriever` over a run's split (or a caption corpus) puts every gallery
image and caption through the method's encoders. That is the same work each time for the same run and gallery,
and for a run whose text encoder is its own (a GRU, a fine-tuned transformer) it is the slow part of a query: a
35K-caption corpus takes a minute on two cores. So the embeddings are stored in the feature cache
(:class:`~crossview.features.cache.FeatureCache`: content-addressed ``.npy`` entries, checksummed, written
atomically, memory-mapped when large, a failed write warned about once and skipped), keyed by

- the run's **model key** (:func:`model_key`): the SHA-256 of ``checkpoint.pt``'s bytes (remembered per file
  state, :mod:`crossview.features.file_hashes`, so an unchanged checkpoint is not read again) and the parts of
  ``config.json`` that say which dataset the run reads (a retrained or resumed run has new bytes: a new key);
- the **gallery identity** (:func:`gallery_identity`): a split's name (the model key fixes the dataset), or a
  corpus's content hash (any changed line: a new key).

Beside the embeddings, a split gallery keeps a **snapshot** of what a query prints about it (the gallery's image
and caption ids, its captions' text) and the run keeps one of its dataset (name, sizes, splits, image files,
the caption -> image map and a hash of every caption, for a typed sentence's ground truth), so that
:func:`open_cached_retriever` answers a sentence (or an image file) with no dataset, no feature matrices and no
gallery encoding: the checkpoint, the query encoder and the memory-mapped arrays it needs. Strings are stored as
UTF-8 bytes and offsets (the feature cache holds numeric arrays only, never pickles).

A re-scored gallery (the run's own scoring, e.g. a method's default, :mod:`crossview.engine.scoring`) keeps its
bank statistics too (:func:`cache_scoring_stats`: each gallery item against the run's training bank, the costly
part of a re-scored query on a large gallery), keyed by the scoring and its parameter beside the embeddings.

Every part is an ordinary cache entry: ``crossview features cache --clear`` drops them, a damaged one is deleted
with a warning and computed again.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.hashing import utf8_bytes

__all__ = ["GALLERY_FORMAT", "GalleryCache", "PackedStrings", "model_key", "gallery_identity", "caption_hash",
           "open_cached_retriever", "write_snapshot", "SCORING_STATS", "cache_scoring_stats"]

log = logging.getLogger(__name__)

#: The layout of the cached parts; another value is another key (nothing is read across layouts).
GALLERY_FORMAT = 1
#: The config.json fields that, with the checkpoint, fix a run's dataset and splits.
_CONFIG_PARTS = ("data", "data_format", "image_root", "dataset_fingerprint", "text_view", "derived_splits",
                 "train_split")


def model_key(run_dir: str | Path, config: dict[str, Any] | None = None) -> str | None:
    """The run's model key (see the module docstring), or None when its checkpoint cannot be read."""
    from crossview.core.settings import get_settings
    from crossview.engine.run import CHECKPOINT, read_config
    from crossview.features.cache import canonical_json
    from crossview.features.file_hashes import FileHashes

    folder = Path(run_dir)
    digest = FileHashes(get_settings().features_dir).digests([str((folder / CHECKPOINT).resolve())])[0]
    if digest is None:
        return None
    cfg = config if config is not None else read_config(folder)
    parts = {k: cfg.get(k) for k in _CONFIG_PARTS}
    h = hashlib.sha256(digest)
    h.update(canonical_json(parts).encode())
    return h.hexdigest()[:32]


def gallery_identity(gallery: Any) -> dict[str, Any]:
    """What names a gallery within a run: ``{"split": name}`` for a split (or ``"all"``), the content hash of a
    caption corpus's lines (:class:`~crossview.data.dataset.TextCorpus`)."""
    if isinstance(gallery, str):
        return {"kind": "split", "split": gallery}
    h = hashlib.sha256(b"corpus-lines\0")
    for c in gallery.captions:
        h.update(utf8_bytes(c))
        h.update(b"\0")
    return {"kind": "corpus", "captions": h.hexdigest()[:32]}


def caption_hash(text: str) -> int:
    """A sentence's 63-bit hash as the ground-truth match compares it (stripped, lower case)."""
    d = hashlib.sha256(utf8_bytes(text.strip().lower())).digest()
    return int.from_bytes(d[:8], "little") >> 1


class PackedStrings(Sequence[str]):
    """Strings stored as ``blob (m,) uint8`` UTF-8 bytes and ``offsets (n + 1,) int64``; reading one decodes
    only its bytes (both arrays may be memory-mapped). ``ids``: the item numbers the strings belong to, sorted
    (``packed[ids[j]]`` is string ``j``); None: item ``i`` is string ``i``."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray, ids: np.ndarray | None = None) -> None:
        self.blob, self.offsets, self.ids = blob, offsets, ids

    @staticmethod
    def pack(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(blob, offsets)`` of ``strings``."""
        encoded = [utf8_bytes(s) for s in strings]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8) if encoded else np.zeros(0, np.uint8)
        return blob, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _position(self, i: int) -> int:
        if self.ids is None:
            if not -len(self) <= i < len(self):
                raise IndexError(i)
            return i % len(self)
        j = int(np.searchsorted(self.ids, i))
        if j >= len(self.ids) or int(self.ids[j]) != i:
            raise KeyError(i)
        return j

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        j = self._position(int(i))
        a, b = int(self.offsets[j]), int(self.offsets[j + 1])
        return bytes(self.blob[a:b]).decode("utf-8")


class GalleryCache:
    """The cached parts of one run (``model``) and gallery (``identity``) in a
    :class:`~crossview.features.cache.FeatureCache` (``None``: the default one)."""

    def __init__(self, model: str, identity: dict[str, Any] | None, store: Any = None) -> None:
        from crossview.features.cache import FeatureCache

        self.model = model
        self.identity = identity
        self.store = store if isinstance(store, FeatureCache) else FeatureCache(store)

    def key(self, part: str, *, run_level: bool = False) -> str:
        return self.store.make_key(kind="gallery", format=GALLERY_FORMAT, model=self.model,
                                   gallery=None if run_level else self.identity, part=part)

    def load(self, part: str, *, run_level: bool = False) -> np.ndarray | None:
        return self.store.load(self.key(part, run_level=run_level))

    def meta(self, part: str, *, run_level: bool = False) -> dict[str, Any] | None:
        m = self.store.meta(self.key(part, run_level=run_level))
        return m.get("parts") if isinstance(m, dict) and isinstance(m.get("parts"), dict) else None

    def contains(self, part: str, *, run_level: bool = False) -> bool:
        return self.store.contains(self.key(part, run_level=run_level))

    def save(self, part: str, array: np.ndarray, meta: dict[str, Any] | None = None, *,
             run_level: bool = False) -> np.ndarray:
        """Store ``array`` (a failed write is warned about once and skipped: the array comes back unstored)."""
        parts = {"kind": "gallery", "part": part, "model": self.model,
                 "gallery": None if run_level else self.identity, **(meta or {})}
        return self.store.save(self.key(part, run_level=run_level), array, parts)

    def embeddings(self, side: str, compute: Callable[[], np.ndarray]) -> tuple[np.ndarray, bool]:
        """``(embeddings (n, d) float32, hit)`` of the gallery's ``side`` (``"images"``: as the t2i gallery,
        ``"captions"``: as the i2t gallery): the cached ones, else ``compute()`` stored."""
        part = f"{side}-embeddings"
        got = self.load(part)
        if got is not None and got.dtype == np.float32 and got.ndim == 2:
            return got, True
        return self.save(part, np.ascontiguousarray(compute(), np.float32)), False


#: the statistics each scoring keeps of a gallery (crossview.eval.scoring.Scorer.prepare)
SCORING_STATS = {"csls": ("r",), "isoftmax": ("c",), "dsoftmax": ("c", "hub")}


def cache_scoring_stats(retriever: Any, run_dir: str | Path, gallery: Any,
                        directions: Sequence[str] = ("i2t", "t2i"), store: Any = None) -> bool:
    """Give ``retriever`` (re-scored: its ``set_scoring`` done) its gallery's bank statistics for ``directions``
    from the gallery cache, computing and storing those not there (the first query pays, the next read them).
    ``gallery``: a split name or a caption corpus (a photo folder is not cached: False). Returns whether every
    statistic asked for came from the cache. The statistics equal :meth:`Scorer.prepare`'s: the same scores."""
    scorers = getattr(retriever, "_scorers", None)
    if scorers is None or not (isinstance(gallery, str) or hasattr(gallery, "captions")):
        return False
    try:
        key = model_key(run_dir)
    except Exception:  # noqa: BLE001 - no cache for this run: the retriever computes them itself
        return False
    if key is None:
        return False
    cache = GalleryCache(key, gallery_identity(gallery), store)
    hit = True
    for direction in directions:
        emb = retriever._image_emb if direction == "t2i" else retriever._caption_emb
        if emb is None:
            continue
        scorer = scorers[direction]
        names = SCORING_STATS.get(scorer.scoring, ())
        tag = f"{'images' if direction == 't2i' else 'captions'}-scoring-{direction}-{scorer.scoring}-{scorer.param:g}"
        got = {n: cache.load(f"{tag}-{n}") for n in names}
        if any(v is None or v.shape != (emb.shape[0],) for v in got.values()):
            hit = False
            got = scorer.prepare(np.asarray(emb))
            for n in names:
                cache.save(f"{tag}-{n}", np.ascontiguousarray(got[n]))
        retriever._scoring_stats[direction] = {n: np.asarray(v) for n, v in got.items()}
    return hit


# ---------------------------------------------------------------------------- the snapshot
def write_snapshot(cache: GalleryCache, retriever: Any) -> None:
    """Store what :func:`open_cached_retriever` needs besides the embeddings: the run's dataset part (once per
    run) and, for a split gallery, the gallery's part (once per gallery). Failures are warned about and
    skipped (the cache is an optimisation)."""
    try:
        _write_snapshot(cache, retriever)
    except OSError as e:       # FeatureCache.save already swallows storage errors; anything else: say it
        log.warning("gallery cache: could not store the snapshot of %s (%s); queries load the run in full",
                    retriever.gallery_name, e)


def _write_snapshot(cache: GalleryCache, r: Any) -> None:
    ds = r.dataset
    if not cache.contains("dataset-caption-image", run_level=True):
        groups = r.photos is None and r.identity_word is not None
        hashes = np.array([caption_hash(c) for c in ds.captions], dtype=np.int64)
        order = np.lexsort((np.arange(len(hashes)), hashes))
        cache.save("dataset-caption-hashes", np.stack([hashes[order], order.astype(np.int64)], axis=1),
                   run_level=True)
        if getattr(ds, "image_paths", None) is not None:
            blob, offsets = PackedStrings.pack([str(p) for p in ds.image_paths])
            cache.save("dataset-image-path", blob, run_level=True)
            cache.save("dataset-image-path-offsets", offsets, run_level=True)
        cache.save("dataset-caption-image", np.asarray(ds.caption_image, np.int64),    # last: says it is whole
                   {"name": ds.name, "format": getattr(ds, "format", ""), "n_images": int(ds.n_images),
                    "n_captions": int(ds.n_captions), "splits": list(ds.splits), "groups": bool(groups),
                    "image_paths": getattr(ds, "image_paths", None) is not None},
                   run_level=True)
    if not cache.contains("dataset-splits", run_level=True):
        # each split's image rows (apart: a cache written before them still answers the CLI, which needs no rows)
        names = [str(name) for name in ds.splits]
        rows = [np.asarray(ds.splits[name], np.int64) for name in names]
        cache.save("dataset-splits", np.concatenate(rows) if rows else np.zeros(0, np.int64),
                   {"names": names, "sizes": [int(len(x)) for x in rows]}, run_level=True)
    if r.corpus is not None or r.photos is not None or cache.contains("caption-text-offsets"):
        return
    cache.save("image-ids", np.asarray(r.gallery_images, np.int64))
    cache.save("caption-ids", np.asarray(r.gallery_captions, np.int64))
    blob, offsets = PackedStrings.pack([ds.captions[int(c)] for c in r.gallery_captions])
    cache.save("caption-text", blob)
    cache.save("caption-text-offsets", offsets)      # last: its presence says the snapshot is whole


class _CachedDataset:
    """The part of a run's dataset that a query reads, from the snapshot: sizes, splits, the caption -> image
    map, the gallery's captions (by dataset index), the dataset's image files, and :meth:`find_caption`."""

    def __init__(self, meta: dict[str, Any], caption_image: np.ndarray, hashes: np.ndarray,
                 captions: PackedStrings, image_paths: PackedStrings | None,
                 splits: dict[str, np.ndarray] | None = None) -> None:
        self.name = str(meta.get("name", ""))
        self.format = str(meta.get("format", ""))
        self.n_images = int(meta["n_images"])
        self.n_captions = int(meta["n_captions"])
        # each split's image rows where the snapshot holds them (the app lists the splits' sizes), else names only
        self.splits: dict[str, Any] = dict(splits) if splits is not None else \
            {str(s): None for s in meta.get("splits", [])}
        self.split_names = list(self.splits)
        self.caption_image = caption_image
        self.captions = captions
        self.image_paths = image_paths
        self.labels = None
        self._hashes = hashes

    def captions_of(self, image: int) -> np.ndarray:
        """The dataset caption indices of ``image`` (those of a gallery image are in :attr:`captions`)."""
        return np.flatnonzero(self.caption_image == int(image))

    def find_caption(self, sentence: str) -> int | None:
        """The first dataset caption equal to ``sentence`` (stripped, any case), as the Retriever matches it."""
        h = caption_hash(sentence)
        keys = self._hashes[:, 0]
        j = int(np.searchsorted(keys, h))
        return int(self._hashes[j, 1]) if j < len(keys) and int(keys[j]) == h else None


def open_cached_retriever(run_dir: str | Path, gallery: Any = None, *, device: str = "cpu", store: Any = None,
                          sides: tuple[str, ...] = ("images", "captions"), with_splits: bool = False
                          ) -> tuple[Any, Any] | None:
    """``(run, retriever)`` answered from the gallery cache alone (see the module docstring), or None when the
    cache does not hold all of it yet (or the run needs what it cannot give: a representation's own encoders,
    a dataset whose labels group its images), so that the caller opens the run in full, which fills it.

    ``gallery``: None (the run's evaluation split), a split name or a caption corpus. ``sides``: the gallery
    embeddings to read: ``"images"`` (what a sentence ranks), ``"captions"`` (what an image ranks); a retriever
    without one refuses the queries that need it. ``with_splits``: None also when the snapshot lacks each split's
    image rows (written by a version before them; the full path adds them), so ``dataset.splits`` holds them, as
    the app's gallery list needs. The retriever holds no feature rows: a query by a dataset image or caption
    index is refused (one line); a sentence or an image file is answered. ``run`` is a
    :class:`CachedRun` (``name``, ``method``, ``dataset``, ``config``, ``eval_split``, ``run_dir``).
    """
    from crossview.core.io import load_checkpoint
    from crossview.engine.run import CHECKPOINT, CONFIG, read_config
    from crossview.engine.runs import load_fitted
    from crossview.engine.retriever import Retriever

    folder = Path(run_dir)
    if not (folder / CONFIG).is_file() or not (folder / CHECKPOINT).is_file():
        return None
    config = read_config(folder)
    if config.get("representation") is not None:
        return None      # TR / CTR: their own image and text sides, rebuilt with the dataset
    key = model_key(folder, config)
    if key is None:
        return None
    run_cache = GalleryCache(key, None, store)
    meta = run_cache.meta("dataset-caption-image", run_level=True)
    if meta is None or meta.get("groups") or "n_images" not in meta:
        return None
    split = config.get("split")
    splits = [str(s) for s in meta.get("splits", [])]
    eval_split = split if isinstance(split, str) and split in splits else \
        ("test" if "test" in splits else (splits[0] if splits else "all"))
    if gallery is None:
        gallery = eval_split
    if isinstance(gallery, str) and gallery != "all" and gallery not in splits:
        return None       # the full path says which splits there are
    cache = GalleryCache(key, gallery_identity(gallery), store)
    corpus = not isinstance(gallery, str)
    if not corpus and not cache.contains("caption-text-offsets"):
        return None
    parts = ["captions-embeddings"] if corpus else [f"{side}-embeddings" for side in sides]
    if not parts or not all(cache.contains(p) for p in parts):
        return None
    caption_image = run_cache.load("dataset-caption-image", run_level=True)
    hashes = run_cache.load("dataset-caption-hashes", run_level=True)
    if caption_image is None or hashes is None:
        return None
    paths = None
    if meta.get("image_paths"):
        pblob = run_cache.load("dataset-image-path", run_level=True)
        poffsets = run_cache.load("dataset-image-path-offsets", run_level=True)
        if pblob is None or poffsets is None:
            return None
        paths = PackedStrings(pblob, poffsets)
    if corpus:
        gi, gc = np.zeros(0, np.int64), np.arange(gallery.n_captions, dtype=np.int64)
        captions = PackedStrings(np.zeros(0, np.uint8), np.zeros(1, np.int64), np.zeros(0, np.int64))
    else:
        got = [cache.load(p) for p in ("image-ids", "caption-ids", "caption-text", "caption-text-offsets")]
        if any(g is None for g in got):
            return None
        gi, gc, blob, offsets = got
        captions = PackedStrings(blob, offsets, gc)
    splits = None
    split_meta = run_cache.meta("dataset-splits", run_level=True)
    split_rows = run_cache.load("dataset-splits", run_level=True) if split_meta is not None else None
    if split_rows is not None and isinstance(split_meta, dict) and \
            sum(int(n) for n in split_meta.get("sizes", [])) == len(split_rows):
        bounds = np.cumsum([0, *[int(n) for n in split_meta["sizes"]]])
        splits = {str(name): np.asarray(split_rows[a:b]) for name, a, b in
                  zip(split_meta.get("names", []), bounds[:-1], bounds[1:])}
    if with_splits and splits is None:
        return None
    dataset = _CachedDataset(meta, caption_image, hashes, captions, paths, splits)
    # what the fitted method and the query's encoders need; read without torch when they are numpy arrays (CCA)
    ckpt = load_checkpoint(folder / CHECKPOINT, keys=("method_state", "features", "text_model"))
    method = load_fitted(folder, ckpt)
    features = _query_features(folder, ckpt, config)
    if features is None:
        return None
    embeddings = {}
    for p in parts:
        arr = cache.load(p)
        if arr is None:
            return None
        embeddings[p.split("-")[0]] = arr
    retriever = Retriever.from_embeddings(method, dataset, features, gallery=gallery, gallery_images=gi,
                                          gallery_captions=gc, image_emb=embeddings.get("images"),
                                          caption_emb=embeddings.get("captions"), device=device, cache=store)
    run = CachedRun(run_dir=folder, config=config, method=method, dataset=dataset, eval_split=eval_split)
    return run, retriever


class CachedRun:
    """What a query reads of a run opened by :func:`open_cached_retriever` (the same names as
    :class:`~crossview.engine.session.OpenRun`)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], method: Any, dataset: Any, eval_split: str) -> None:
        self.run_dir, self.config, self.method, self.dataset, self.eval_split = \
            run_dir, config, method, dataset, eval_split

    @property
    def name(self) -> str:
        return self.run_dir.name


def _query_features(folder: Path, ckpt: dict[str, Any], config: dict[str, Any]) -> Any:
    """A :class:`~crossview.features.Features` with no rows: what encodes a new sentence or image file the
    run's way (its fitted text encoder, its image backbone's spec, its normalisations); None for a run whose
    features are a representation's."""
    from crossview.features import Features
    from crossview.features.normalize import FeatureNorm

    spec = ckpt.get("features")
    spec = spec if isinstance(spec, dict) else {}
    if spec.get("representation"):
        return None
    text_model = None
    tm = ckpt.get("text_model")
    if isinstance(tm, dict) and tm.get("state"):
        from crossview.features.text import TextEncoder
        try:
            text_model = TextEncoder.from_state_dict(tm["state"])
        except Exception:  # noqa: BLE001 - damaged: the full path says so in one line
            return None
    image_spec = spec.get("image") if isinstance(spec.get("image"), dict) else {}
    text_spec = spec.get("text") if isinstance(spec.get("text"), dict) else {}
    states = spec.get("norm_states")
    transforms: dict[str, Any] = {"image": None, "text": None}
    if isinstance(states, dict):
        for side in transforms:
            norm = FeatureNorm.from_state_dict(states.get(side) or {"kind": "none"})
            transforms[side] = None if norm.kind == "none" else norm.transform
    return Features(image=np.zeros((0, int(image_spec.get("dim") or 0)), np.float32), text=None,
                    image_encoder=str(image_spec.get("name") or config.get("image_encoder") or ""),
                    text_encoder=str(text_spec.get("name") or config.get("text_encoder") or ""),
                    text_model=text_model, spec=spec, image_transform=transforms["image"],
                    text_transform=transforms["text"])

