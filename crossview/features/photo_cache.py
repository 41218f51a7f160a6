"""A run's image features of a photo folder (:class:`~crossview.data.photos.PhotoFolder`), cached photo by photo.

:func:`encode_photos` puts image files through the run's own image side, the way
:class:`~crossview.engine.retriever.Retriever` encodes a new image file: the run's frozen backbone
(:func:`crossview.features.run_image_encoder`), or a TR / CTR representation's ``encode_new_images``; the run's
normalisation (``image_transform``) is applied after the cache, since it belongs to the run, not to the encoder.

The cache is incremental: one store per image-encoder identity (the backbone's cache parts: name, weights hash,
transform, output kind, version; for a representation also a hash of its fitted state) in
``<features_dir>/photos/<identity>.npz``, one row per photo keyed by (absolute path, content hash): the hash of
the file's bytes (:mod:`crossview.features.file_hashes`, remembered per file state in the same folder, so an
unchanged photo is not read again). Adding ten photos to a folder encodes those ten; a changed file is encoded
again, even one replaced by another of the same size with its mtime put back; a photo that is moved or copied
keeps its row (its bytes are the same); rows of files that are gone or changed are dropped when the store is
written. The store is data only (string, integer and float arrays,
read with ``allow_pickle=False``), written atomically; a damaged one is discarded with a warning and rebuilt.

A photo that cannot be decoded is skipped with a warning naming it (a personal folder with one broken file
should still be searchable); :attr:`PhotoFeatures.kept` says which photos have rows.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import Cancelled, CrossViewError, DatasetError
from crossview.core.hashing import hash_into
from crossview.core.io import NpzFileError, atomic_write_bytes, read_npz
from crossview.core.settings import get_settings

__all__ = ["PhotoFeatures", "PhotoStore", "encode_photos", "encoder_identity", "photo_store_dir", "STORE_FORMAT"]

log = logging.getLogger(__name__)

#: The version of the ``.npz`` layout; a store with another is discarded and rebuilt (1: rows keyed on path,
#: size and mtime; 2: on path and content hash).
STORE_FORMAT = 2
#: The progress stage of photo encoding.
STAGE = "photos"


def photo_store_dir() -> Path:
    """Where the photo stores live by default: ``<features_dir>/photos``."""
    return get_settings().features_dir / "photos"


def encoder_identity(features: Any) -> dict[str, Any]:
    """What determines a run's image rows before its normalisation: the backbone's cache parts, and for a
    TR / CTR representation a hash of its fitted state. Raises :class:`CrossViewError` for a run of
    precomputed image features (it has no image encoder to run on new files)."""
    from crossview.features import run_image_encoder

    if getattr(features, "encode_new_images", None) is not None:
        h = hashlib.sha256()
        rep = getattr(features, "representation", None)
        state = rep.state_dict() if callable(getattr(rep, "state_dict", None)) else \
            (features.spec or {}).get("representation")
        hash_into(h, state)
        return {"kind": "representation", "image": (features.spec or {}).get("image"), "state": h.hexdigest()[:24]}
    try:
        encoder = run_image_encoder(features)
    except CrossViewError as e:
        if "precomputed" in str(e):
            raise CrossViewError("this run uses precomputed image features, so it cannot encode photos; search a "
                                 "photo folder with a run trained with an image encoder") from None
        raise
    return {"kind": "encoder", **encoder.cache_parts()}


def _identity_key(identity: dict[str, Any]) -> str:
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class PhotoStore:
    """The cached rows of one image-encoder identity: ``{(path, content hash (hex)): (d,) float32}``.

    :meth:`load` reads the store (a missing one is empty; one of an older layout or a damaged one is discarded,
    the latter with a warning), :meth:`save` writes it atomically, keeping only rows whose file still holds the
    bytes it was encoded from. :attr:`hashes` gives the files' content hashes (memo beside the stores).
    """

    def __init__(self, identity: dict[str, Any], root: str | Path | None = None, *, memo: bool = True) -> None:
        from crossview.features.file_hashes import FileHashes

        self.identity = identity
        self.key = _identity_key(identity)
        self.root = Path(root) if root is not None else photo_store_dir()
        self.path = self.root / f"{self.key}.npz"
        self.rows: dict[tuple[str, str], np.ndarray] = {}
        self.hashes = FileHashes(self.root if memo else None)
        self._index: tuple[int, dict[str, np.ndarray]] = (-1, {})

    def row_of(self, path: str, digest: str) -> np.ndarray | None:
        """The row of a file with content hash ``digest``: its own, else one of another file with the same bytes."""
        row = self.rows.get((path, digest))
        if row is None:
            if self._index[0] != len(self.rows):
                self._index = (len(self.rows), {d: v for (_, d), v in self.rows.items()})
            row = self._index[1].get(digest)
        return row

    def load(self) -> "PhotoStore":
        self.rows = {}
        if not self.path.is_file():
            return self
        try:
            z = read_npz(self.path, todo="")
            fmt = int(z["format"])
            if fmt < STORE_FORMAT:       # an older layout (rows keyed on size and mtime): rebuilt, quietly
                log.info("photo feature store %s has the older layout %d; the photos are encoded again",
                         self.path, fmt)
                return self
            ident = str(z["identity"])
            paths, digests = z["paths"], z["digests"]
            feats = z["features"]
            n = len(paths)
            if fmt != STORE_FORMAT or ident != json.dumps(self.identity, sort_keys=True, default=str):
                raise ValueError(f"format {fmt} / identity do not match this encoder")
            if paths.dtype.kind != "U" or digests.dtype.kind != "U" or digests.shape != (n,) or feats.ndim != 2 \
                    or feats.shape[0] != n or feats.dtype != np.float32 or not np.isfinite(feats).all():
                raise ValueError("arrays of the wrong shape, type or values")
        except Exception as e:  # noqa: BLE001 - any damage (truncated zip, bad arrays) means: rebuild
            why = e.reason if isinstance(e, NpzFileError) else f"{type(e).__name__}: {str(e)[:120]}"
            log.warning("photo feature store %s is damaged (%s); discarded it, the photos are encoded again",
                        self.path, why)
            try:
                self.path.unlink()
            except OSError:
                pass
            return self
        self.rows = {(str(p), str(d)): feats[i] for i, (p, d) in enumerate(zip(paths, digests))}
        return self

    def save(self) -> None:
        # a row stays while its file is unchanged since it was hashed (checked on the file's state, not re-read)
        keep = [(k, v) for k, v in self.rows.items() if (d := self.hashes.peek(k[0])) is not None and d.hex() == k[1]]
        self.rows = dict(keep)
        dim = next((len(v) for _, v in keep), 0)
        buf = io.BytesIO()
        np.savez(buf, format=np.array(STORE_FORMAT, dtype=np.int64),
                 identity=np.array(json.dumps(self.identity, sort_keys=True, default=str)),
                 paths=np.array([k[0] for k, _ in keep], dtype=str).reshape(-1),
                 digests=np.array([k[1] for k, _ in keep], dtype=str).reshape(-1),
                 features=(np.stack([v for _, v in keep]).astype(np.float32) if keep
                           else np.zeros((0, dim), np.float32)))
        atomic_write_bytes(self.path, buf.getvalue())


@dataclass
class PhotoFeatures:
    """What :func:`encode_photos` returns.

    Attributes:
        features: ``(len(kept), d) float32`` the kept photos' rows, after the run's normalisation.
        kept: ``(len(kept),) int64`` positions in the given paths of the photos that have rows (all but the
            undecodable ones, which are in ``skipped``).
        encoded: how many photos were encoded now (the rest came from the cache).
        skipped: ``(path, problem)`` of each photo that could not be decoded.
    """

    features: np.ndarray
    kept: np.ndarray
    encoded: int
    skipped: list[tuple[str, str]]


def encode_photos(features: Any, paths: Sequence[str | Path], *, device: str = "cpu", batch_size: int = 32,
                  cache: Any = None, progress: Callable[[str, int, int], None] | None = None,
                  should_stop: Callable[[], bool] | None = None) -> PhotoFeatures:
    """The run's image rows of the image files ``paths`` (see the module docstring).

    ``features`` is the run's :class:`~crossview.features.Features`. ``cache``: ``None`` the default folder,
    ``False`` none, a folder, or a :class:`~crossview.features.cache.FeatureCache` (its ``root/photos``).
    ``progress("photos", done, total)`` counts the photos to encode: ``(0, m)`` first, then after each batch;
    only ``(n, n)`` when every photo came from the cache. ``should_stop()`` is checked before each batch and
    raises :class:`~crossview.core.errors.Cancelled` (the photos encoded so far are kept in the cache).
    """
    if batch_size < 1:
        raise CrossViewError(f"batch size must be at least 1, got {batch_size}")
    files = [os.path.abspath(str(p)) for p in paths]
    n = len(files)
    identity = encoder_identity(features)
    if cache is False:
        store = PhotoStore(identity, root=photo_store_dir(), memo=False)
    else:
        from crossview.features.cache import FeatureCache

        root = Path(cache.root) / "photos" if isinstance(cache, FeatureCache) else \
            (Path(cache) if cache is not None else None)
        store = PhotoStore(identity, root=root).load()
    keys: list[tuple[str, str] | None] = [None if d is None else (f, d.hex())
                                          for f, d in zip(files, store.hashes.digests(files))]
    rows: list[np.ndarray | None] = [store.row_of(*k) if k is not None else None for k in keys]
    linked = 0          # files whose bytes another file's row already holds (a copy, a moved photo)
    for k, row in zip(keys, rows):
        if k is not None and row is not None and k not in store.rows:
            store.rows[k] = row
            linked += 1
    skipped = [(files[i], "image file not found") for i, k in enumerate(keys) if k is None]
    todo = [i for i, k in enumerate(keys) if k is not None and rows[i] is None]
    m = len(todo)
    if progress is not None:
        progress(STAGE, *((0, m) if m else (n, n)))

    encode = _encoder(features, device) if m else None
    added = 0
    try:
        for start in range(0, m, batch_size):
            if should_stop is not None and should_stop():
                raise Cancelled(f"photo encoding cancelled after {start} of {m} photos")
            chunk = todo[start:start + batch_size]
            assert encode is not None
            for i, row in zip(chunk, _encode_chunk(encode, [files[i] for i in chunk], skipped)):
                if row is not None:
                    rows[i] = row
                    store.rows[keys[i]] = row   # type: ignore[index]
                    added += 1
            if progress is not None:
                progress(STAGE, start + len(chunk), m)
    finally:
        if (added or linked) and cache is not False:
            try:
                store.save()
            except OSError as e:      # a read-only cache folder: the search still works, uncached
                log.warning("photo feature store %s could not be written (%s); the photos will be encoded "
                            "again next time", store.path, e)
    for path, problem in skipped:
        log.warning("photos: skipped %s: %s", path, problem)
    kept = np.array([i for i, r in enumerate(rows) if r is not None], dtype=np.int64)
    if len(kept):
        x = np.stack([rows[i] for i in kept]).astype(np.float32)   # type: ignore[misc]
        transform = getattr(features, "image_transform", None)
        if transform is not None:
            x = np.asarray(transform(x), dtype=np.float32)
    else:
        x = np.zeros((0, 0), np.float32)
    return PhotoFeatures(features=x, kept=kept, encoded=m, skipped=skipped)


def _encoder(features: Any, device: str) -> Callable[[list[str]], np.ndarray]:
    """``encode(paths) -> (k, d) float32`` before the run's normalisation."""
    rep_encode = getattr(features, "encode_new_images", None)    # a representation's own image side (TR / CTR)
    if rep_encode is not None:
        return lambda ps: np.asarray(rep_encode(ps, device=device), np.float32)
    from crossview.features import run_image_encoder

    enc = run_image_encoder(features)
    # one batch a call, decoded in this process (workers would start again for every batch)
    return lambda ps: np.asarray(enc.encode_paths(ps, batch_size=len(ps), num_workers=0, device=device),
                                 np.float32)


def _encode_chunk(encode: Callable[[list[str]], np.ndarray], chunk: list[str],
                  skipped: list[tuple[str, str]]) -> list[np.ndarray | None]:
    """Rows of ``chunk``; when a file in it cannot be decoded, the files one by one, skipping the bad ones."""
    if len(chunk) > 1:
        try:
            x = encode(chunk)
            return [x[j] for j in range(len(chunk))]
        except DatasetError:
            pass
    out: list[np.ndarray | None] = []
    for p in chunk:
        try:
            out.append(encode([p])[0])
        except DatasetError as e:
            skipped.append((p, _problem(e, p)))
            out.append(None)
    return out


def _problem(e: DatasetError, path: str) -> str:
    """The encoder's message about ``path`` without the path itself (the warning names it)."""
    text = str(e)
    at = text.find(path + ": ")
    return text[at + len(path) + 2:] if at >= 0 else text
