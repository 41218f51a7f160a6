"""The data model every reader produces and every method consumes.

A :class:`PairedDataset` holds images (file paths, or rows of a precomputed feature matrix), captions,
the caption -> image map (many captions per image), identity/category labels, optional tags and label
sets, and splits. Images and captions are addressed by integer ids: their position in the source file,
so they stay stable across reloads. A split view (:meth:`PairedDataset.split`) renumbers them from zero
and keeps the original ids in ``image_ids`` / ``caption_ids``.

A :class:`TextCorpus` is a caption collection with no images (the BITR "independent text corpus").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from crossview.core.errors import DatasetError
from crossview.core.io import drop_pages
from crossview.core.hashing import repair_text, utf8_bytes

#: Split names in their canonical order. Readers map other spellings ("dev", "restval") onto these
#: or keep them as extra splits.
SPLIT_ORDER = ("train", "restval", "val", "test")
#: Every split name a reader accepts without a warning: the canonical ones and VSE++'s ``testall`` (the
#: 5K COCO test set of ``*_precomp`` folders).
KNOWN_SPLITS = (*SPLIT_ORDER, "testall")
#: Other spellings readers map onto a canonical split name.
SPLIT_ALIASES = {"dev": "val", "validation": "val", "valid": "val"}


def _as_int_array(values: Iterable[int] | np.ndarray, n: int | None = None) -> np.ndarray:
    arr = np.asarray(values, dtype=np.int64)
    if arr.ndim != 1 or (n is not None and len(arr) != n):
        raise ValueError(f"expected a 1-d array of length {n}, got shape {arr.shape}")
    return arr


def take_rows(arr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``arr[rows]`` for an ``(n, ...)`` array and ``rows (k,) int64``; a read-only view (no copy) when ``rows`` is
    one ascending contiguous range, as a precomp split's rows are, so a split of a large feature matrix costs no
    memory. Writing into the view raises instead of changing the parent's rows. Other rows are copied; from a
    memory-mapped matrix (the feature cache's, a run's file-backed normalised features) the pages the gather mapped
    then leave the resident set (:func:`~crossview.core.io.drop_pages`: the kernel maps the neighbours of every row
    read, so 5K scattered rows of a 120K-row matrix mapped nearly all of it)."""
    rows = np.asarray(rows)
    if rows.ndim == 1 and len(rows) > 1 and rows[-1] - rows[0] == len(rows) - 1 and (np.diff(rows) == 1).all():
        view = arr[int(rows[0]):int(rows[-1]) + 1]
        if isinstance(view, np.ndarray):
            view = view.view()
            view.flags.writeable = False
        return view
    out = arr[rows]
    drop_pages(arr)
    return out


def _repaired_captions(captions: Iterable[str], warnings: list[str]) -> list[str]:
    """``captions`` as a list, each lone UTF-16 surrogate (half an emoji, as ``"\\ud83d"`` in a JSON file)
    replaced by U+FFFD, with one line added to ``warnings`` saying how many captions were repaired (a tokenizer, a
    cache key or a UTF-8 file would fail on them later, in the middle of a run)."""
    out = list(captions)
    bad, first = 0, -1
    for i, c in enumerate(out):
        if isinstance(c, str):
            fixed, n = repair_text(c)
            out[i] = fixed              # a surrogate pair (not an error) becomes the one character it encodes
            if n:
                bad += 1
                first = i if first < 0 else first
    if bad:
        warnings.append(f"{bad:,} caption(s) held invalid text (a lone UTF-16 surrogate, e.g. half an emoji); "
                        f"replaced it with U+FFFD (first: caption {first})")
    return out


@dataclass
class PairedDataset:
    """Images and captions with the caption -> image map.

    Attributes:
        name: short name shown to the user (``"flickr8k"``, ``"demo"``).
        captions: ``n_captions`` caption strings.
        caption_image: ``(n_captions,) int64``, the image index of each caption.
        image_paths: absolute image file paths (``n_images``), or ``None`` when images are feature rows.
        image_features: ``(n_images, d) float32`` precomputed features (possibly memory-mapped), or ``None``.
        labels: ``(n_images,) int64`` identity / category of each image; defaults to the image index.
        label_names: names of the label values, when the source has them.
        tags: per-image tag lists (web tags, nouns of the captions), or ``None``.
        label_sets: per-image sets of labels / phrases for P@K and mAP, or ``None``.
        splits: split name -> ``int64`` image indices (sorted).
        image_ids / caption_ids: the ids of these images / captions in the full source dataset.
        source: the file or folder it was read from; ``format``: the reader's name.
        warnings: what the reader skipped or repaired, for the user to see.
        meta: anything else a reader wants to keep (e.g. ``{"generated_splits": True}``).
    """

    name: str
    captions: list[str]
    caption_image: np.ndarray
    image_paths: list[str] | None = None
    image_features: np.ndarray | None = None
    labels: np.ndarray | None = None
    label_names: list[str] | None = None
    tags: list[list[str]] | None = None
    label_sets: list[list[str]] | None = None
    splits: dict[str, np.ndarray] = field(default_factory=dict)
    image_ids: np.ndarray | None = None
    caption_ids: np.ndarray | None = None
    source: str = ""
    format: str = ""
    warnings: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.image_paths is None and self.image_features is None:
            raise ValueError("a PairedDataset needs image_paths or image_features")
        n = self.n_images
        self.captions = _repaired_captions(self.captions, self.warnings)
        self.caption_image = _as_int_array(self.caption_image, len(self.captions))
        if len(self.caption_image) and (self.caption_image.min() < 0 or self.caption_image.max() >= n):
            raise ValueError("caption_image refers to an image index out of range")
        if self.labels is None:
            self.labels = np.arange(n, dtype=np.int64)
        self.labels = _as_int_array(self.labels, n)
        for name, per_image in (("tags", self.tags), ("label_sets", self.label_sets)):
            if per_image is not None and len(per_image) != n:
                raise ValueError(f"{name} has {len(per_image)} entries for {n} images")
        self.splits = {k: np.sort(_as_int_array(v)) for k, v in self.splits.items()}
        if self.image_ids is None:
            self.image_ids = np.arange(n, dtype=np.int64)
        if self.caption_ids is None:
            self.caption_ids = np.arange(len(self.captions), dtype=np.int64)

    # ------------------------------------------------------------------ sizes and lookups
    @property
    def n_images(self) -> int:
        if self.image_paths is not None:
            return len(self.image_paths)
        assert self.image_features is not None
        return int(self.image_features.shape[0])

    @property
    def n_captions(self) -> int:
        return len(self.captions)

    @property
    def has_image_files(self) -> bool:
        return self.image_paths is not None

    def captions_of(self, image: int) -> list[int]:
        """Caption indices of image ``image`` (in this dataset's numbering), in source order."""
        return np.flatnonzero(self.caption_image == image).tolist()

    def image_captions(self) -> list[list[int]]:
        """For every image, the list of its caption indices (computed in one pass)."""
        out: list[list[int]] = [[] for _ in range(self.n_images)]
        for c, i in enumerate(self.caption_image.tolist()):
            out[i].append(c)
        return out

    # ------------------------------------------------------------------ splits
    @property
    def split_names(self) -> list[str]:
        known = [s for s in SPLIT_ORDER if s in self.splits]
        return known + sorted(s for s in self.splits if s not in SPLIT_ORDER)

    def split(self, name: str | Sequence[str]) -> "PairedDataset":
        """The images of one split (or the union of several) with their captions, renumbered from 0.

        ``"train"`` on a dataset that has a ``"restval"`` split does not include it; ask for
        ``("train", "restval")`` to get both (the usual COCO training set).
        """
        names = [name] if isinstance(name, str) else list(name)
        missing = [n for n in names if n not in self.splits]
        if missing:
            have = ", ".join(repr(s)[1:-1] for s in self.split_names) or "none"
            if len(have) > 200:
                have = have[:197] + "..."
            raise DatasetError(f"no split named {missing[0][:60]!r} (this dataset has: {have})",
                               self.source or self.name)
        idx = np.unique(np.concatenate([self.splits[n] for n in names]))
        out = self.subset(idx)
        out.splits = {n: s for n, s in out.splits.items() if n in names}
        out.meta = {**self.meta, "split": "+".join(names)}
        return out

    def subset(self, images: Sequence[int] | np.ndarray) -> "PairedDataset":
        """A dataset of the given image indices (in the given order) and all their captions."""
        images = _as_int_array(images)
        remap = np.full(self.n_images, -1, dtype=np.int64)
        remap[images] = np.arange(len(images))
        keep = np.flatnonzero(remap[self.caption_image] >= 0)
        # Captions grouped by their new image order, source order within one image.
        order = keep[np.argsort(remap[self.caption_image[keep]], kind="stable")]
        splits = {}
        for name, members in self.splits.items():
            kept = remap[members]
            kept = kept[kept >= 0]
            if len(kept):
                splits[name] = np.sort(kept)
        assert self.image_ids is not None and self.caption_ids is not None and self.labels is not None
        return PairedDataset(
            name=self.name,
            captions=[self.captions[c] for c in order],
            caption_image=remap[self.caption_image[order]],
            image_paths=None if self.image_paths is None else [self.image_paths[i] for i in images],
            image_features=None if self.image_features is None else take_rows(self.image_features, images),
            labels=self.labels[images],
            label_names=self.label_names,
            tags=None if self.tags is None else [self.tags[i] for i in images],
            label_sets=None if self.label_sets is None else [self.label_sets[i] for i in images],
            splits=splits,
            image_ids=self.image_ids[images],
            caption_ids=self.caption_ids[order],
            source=self.source,
            format=self.format,
            warnings=list(self.warnings),
            meta=dict(self.meta),
        )

    # ------------------------------------------------------------------ identity
    def fingerprint(self) -> str:
        """A short content hash: image paths (or feature bytes), captions, the caption map and ids.

        Feature caches are keyed on it, so two loads of the same files give the same fingerprint and
        any change to the data gives another.
        """
        h = hashlib.sha256()
        h.update(self.format.encode())
        if self.image_paths is not None:
            for p in self.image_paths:
                h.update(utf8_bytes(p))
                h.update(b"\0")
        else:
            assert self.image_features is not None
            feats = np.ascontiguousarray(self.image_features)
            h.update(str(feats.shape).encode())
            h.update(memoryview(feats).cast("B"))
        for c in self.captions:
            h.update(utf8_bytes(c))
            h.update(b"\0")
        h.update(self.caption_image.tobytes())
        assert self.image_ids is not None
        h.update(self.image_ids.tobytes())
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        splits = ", ".join(f"{k}={len(v)}" for k, v in ((s, self.splits[s]) for s in self.split_names))
        return (f"PairedDataset({self.name!r}, images={self.n_images}, captions={self.n_captions}, "
                f"splits=[{splits}], format={self.format!r})")


@dataclass
class TextCorpus:
    """A caption collection with no images, one caption per entry."""

    name: str
    captions: list[str]
    source: str = ""
    format: str = "corpus"
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.captions = _repaired_captions(self.captions, self.warnings)

    @property
    def n_captions(self) -> int:
        return len(self.captions)

    def fingerprint(self) -> str:
        h = hashlib.sha256(b"corpus")
        for c in self.captions:
            h.update(utf8_bytes(c))
            h.update(b"\0")
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        return f"TextCorpus({self.name!r}, captions={self.n_captions})"


def resolve_image(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()
