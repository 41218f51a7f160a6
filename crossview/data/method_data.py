"""The inputs of a method for one split: :class:`MethodData` (features, captions, caption -> image map).

It lives in ``data/`` because every layer above builds or reads it: the engine builds it from a dataset
and its features, the feature layer's CTR topics refit on it, and every method trains on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.data.dataset import take_rows

__all__ = ["MethodData"]


def _as_float32_2d(x: Any, what: str) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    if hasattr(x, "tocsr"):   # scipy sparse (TF-IDF, bag of words): kept sparse, rows sliceable
        if x.ndim != 2:
            raise CrossViewError(f"{what} must be a 2-D (rows, dims) matrix, got shape {x.shape}")
        x = x.tocsr()
        return x if x.dtype == np.float32 else x.astype(np.float32)
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise CrossViewError(f"{what} must be a 2-D (rows, dims) matrix, got shape {arr.shape}")
    if arr.dtype != np.float32:
        arr = arr.astype(np.float32)
    return arr


@dataclass
class MethodData:
    """The inputs of a method for one split: features and / or image files, captions and the caption ->
    image map.

    A method trains on cached feature rows (``image_features``) or end to end on the image files
    (``image_paths`` decoded with ``image_transform``, e.g. by :func:`crossview.nn.images.image_loader`);
    a split may carry both. Data with neither (a typed query sentence, a text-only corpus) has no images:
    its ``caption_image`` entries are -1.

    Attributes:
        image_features: ``(n_images, p) float32``, or ``None`` when the images come as files only.
        text_features: ``(n_captions, q) float32`` (a scipy CSR matrix for TF-IDF / bag-of-words captions, kept
            sparse: :meth:`require_text_features`), or ``None`` for methods that read the captions themselves
            (the deep methods tokenise ``captions``).
        captions: ``n_captions`` caption strings.
        caption_image: ``(n_captions,) int64``, the image of each caption (index into the images).
        labels: ``(n_images,) int64`` identity / class labels, or ``None``.
        label_sets: per-image lists of label ids (the WSABIE label variant), or ``None``.
        label_set_names: the names of the label ids in ``label_sets`` (shared by all splits built from
            one dataset, so ids mean the same thing in train and test).
        dataset: the source :class:`~crossview.data.dataset.PairedDataset` of this split (or ``None``).
        name: the split's name (``"train"``), for messages.
        image_paths: the image files, one per image (``None`` when only feature rows are given).
        image_transform: what turns a decoded ``PIL.Image`` into a model input (a torchvision transform),
            or ``None``.
    """

    image_features: np.ndarray | None
    text_features: np.ndarray | None
    captions: list[str]
    caption_image: np.ndarray
    labels: np.ndarray | None = None
    label_sets: list[list[int]] | None = None
    label_set_names: list[str] | None = None
    dataset: Any = None
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    image_paths: list[str] | None = None
    image_transform: Any = None

    def __post_init__(self) -> None:
        n_img = 0
        if self.image_features is not None:
            self.image_features = _as_float32_2d(self.image_features, "image_features")
            n_img = self.image_features.shape[0]
        if self.image_paths is not None:
            self.image_paths = [str(p) for p in self.image_paths]
            if self.image_features is not None and len(self.image_paths) != n_img:
                raise CrossViewError(f"image_paths has {len(self.image_paths)} files for {n_img} image feature "
                                     "rows; they must match one to one")
            n_img = len(self.image_paths)
        self._n_images = n_img
        self.captions = list(self.captions)
        ci = np.asarray(self.caption_image)
        if ci.ndim != 1 or len(ci) != len(self.captions):
            raise CrossViewError(f"caption_image must have one entry per caption ({len(self.captions)}), "
                                 f"got shape {ci.shape}")
        self.caption_image = ci.astype(np.int64, copy=False)
        if self.has_images:
            if len(ci) and (ci.min() < 0 or ci.max() >= n_img):
                bad = int(ci.min()) if ci.min() < 0 else int(ci.max())
                raise CrossViewError(f"caption_image refers to image {bad} but there are only {n_img} images")
        elif len(ci) and np.any(ci != -1):
            raise CrossViewError("caption_image must be -1 (no image) for data without images (neither "
                                 "image_features nor image_paths)")
        if self.text_features is not None:
            self.text_features = _as_float32_2d(self.text_features, "text_features")
            if self.text_features.shape[0] != len(self.captions):
                raise CrossViewError(f"text_features has {self.text_features.shape[0]} rows for "
                                     f"{len(self.captions)} captions; they must match one to one")
        if self.labels is not None:
            lab = np.asarray(self.labels).astype(np.int64, copy=False)
            if lab.shape != (n_img,):
                raise CrossViewError(f"labels must have one entry per image ({n_img}), got shape {lab.shape}")
            self.labels = lab
        if self.label_sets is not None and len(self.label_sets) != n_img:
            raise CrossViewError(f"label_sets has {len(self.label_sets)} entries for {n_img} images")

    # ------------------------------------------------------------------ sizes
    @property
    def n_images(self) -> int:
        return int(self._n_images)

    @property
    def has_images(self) -> bool:
        """Whether the data has images at all (feature rows or files)."""
        return self.image_features is not None or self.image_paths is not None

    @property
    def n_captions(self) -> int:
        return len(self.captions)

    @property
    def image_dim(self) -> int:
        return int(self.require_image_features("this").shape[1])

    def require_image_features(self, method: str) -> np.ndarray:
        """``image_features``, or a :class:`CrossViewError` saying that ``method`` needs feature rows."""
        if self.image_features is None:
            what = "image files only" if self.image_paths is not None else "no images"
            raise CrossViewError(f"method {method!r} needs image feature rows but the {self.name or 'given'} data "
                                 f"has {what}; extract features with an image encoder (e.g. --image-encoder "
                                 "efficientnet_lite0)")
        return self.image_features

    @property
    def text_dim(self) -> int | None:
        return None if self.text_features is None else int(self.text_features.shape[1])

    def require_text_features(self, method: str, *, sparse: bool = False) -> Any:
        """``text_features``, or a :class:`CrossViewError` saying that ``method`` needs them.

        Sparse caption features (TF-IDF, bag of words: a scipy CSR matrix) are handed as they are to a method that
        says ``sparse=True`` (CCA, BITR, WSABIE work on them without a dense copy); any other method gets them
        densified, ``(n_captions, q) float32``."""
        if self.text_features is None:
            raise CrossViewError(f"method {method!r} needs caption features but the {self.name or 'given'} "
                                 "data has none; extract them with a text encoder (e.g. --text-encoder minilm)")
        if not sparse and hasattr(self.text_features, "tocsr"):
            return np.asarray(self.text_features.toarray(), dtype=np.float32)
        return self.text_features

    def caption_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(image_rows, text_rows)``: the paired feature rows of every caption,
        ``(n_captions, p)`` and ``(n_captions, q)``."""
        return self.require_image_features("this")[self.caption_image], self.require_text_features("this")

    def subset(self, images: Sequence[int] | np.ndarray, name: str | None = None) -> "MethodData":
        """The data of the given image rows (in that order) and all their captions (in their order here),
        renumbered from 0; feature rows, files, labels and label sets follow. ``dataset`` is not carried."""
        if not self.has_images:
            raise CrossViewError("data without images cannot be subset by image")
        images = np.asarray(images, dtype=np.int64)
        remap = np.full(self.n_images, -1, dtype=np.int64)
        remap[images] = np.arange(len(images))
        keep = np.flatnonzero(remap[self.caption_image] >= 0)
        keep = keep[np.argsort(remap[self.caption_image[keep]], kind="stable")]
        return MethodData(
            image_features=None if self.image_features is None else _gather(self.image_features, images),
            text_features=None if self.text_features is None else self.text_features[keep],
            captions=[self.captions[i] for i in keep], caption_image=remap[self.caption_image[keep]],
            labels=None if self.labels is None else self.labels[images],
            label_sets=None if self.label_sets is None else [self.label_sets[i] for i in images],
            label_set_names=self.label_set_names, dataset=None, name=self.name if name is None else name,
            meta=dict(self.meta), image_paths=None if self.image_paths is None else [self.image_paths[i] for i in images],
            image_transform=self.image_transform)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_features(cls, dataset: Any, image: np.ndarray | None, text: np.ndarray | None,
                      split: str | Sequence[str] | None = None,
                      label_set_names: list[str] | None = None, *, with_paths: bool = False,
                      image_transform: Any = None) -> "MethodData":
        """The data of one split (or the whole dataset when ``split`` is None).

        ``dataset`` is a :class:`~crossview.data.dataset.PairedDataset`; ``image (n_images, p)`` and
        ``text (n_captions, q)`` are the feature matrices of the *whole* dataset in its numbering (what
        :func:`crossview.features.extract_features` returns); ``image=None`` gives the split's image files
        only (end-to-end training). ``with_paths`` adds the image files next to the feature rows, and
        ``image_transform`` is what decodes them into model inputs. Label sets are mapped to ids through
        ``label_set_names`` (built from the whole dataset when not given).
        """
        if image is None and not with_paths:
            with_paths = True
        if with_paths and getattr(dataset, "image_paths", None) is None:
            raise CrossViewError(f"dataset {dataset.name!r} has no image files (precomputed features only); "
                                 "train on its feature rows")
        if image is not None:
            image = np.asarray(image)
        if image is not None and image.shape[0] != dataset.n_images:
            raise CrossViewError(f"image features have {image.shape[0]} rows for the {dataset.n_images} "
                                 f"images of dataset {dataset.name!r}; extract features of this dataset")
        if text is not None and text.shape[0] != dataset.n_captions:
            raise CrossViewError(f"text features have {text.shape[0]} rows for the "
                                 f"{dataset.n_captions} captions of dataset {dataset.name!r}")
        if label_set_names is None and dataset.label_sets is not None:
            label_set_names = sorted({str(x) for s in dataset.label_sets for x in s})
        if split is None:
            sub, img_rows, cap_rows = dataset, np.arange(dataset.n_images), np.arange(dataset.n_captions)
            split_name = "all"
        else:
            sub = dataset.split(split)
            # Split views keep the parent's ids; map them back to the parent's row positions.
            img_rows = _positions(dataset.image_ids, sub.image_ids)
            cap_rows = _positions(dataset.caption_ids, sub.caption_ids)
            split_name = split if isinstance(split, str) else "+".join(split)
        label_sets = None
        if sub.label_sets is not None and label_set_names is not None:
            lookup = {n: i for i, n in enumerate(label_set_names)}
            label_sets = [[lookup[str(x)] for x in s if str(x) in lookup] for s in sub.label_sets]
        # a split whose rows are one contiguous range (precomp folders) is a read-only view, not a copy
        return cls(image_features=None if image is None else np.asarray(take_rows(image, img_rows), dtype=np.float32),
                   text_features=None if text is None else _text_rows(text, cap_rows),
                   captions=list(sub.captions), caption_image=sub.caption_image, labels=sub.labels,
                   label_sets=label_sets, label_set_names=label_set_names, dataset=sub, name=split_name,
                   image_paths=[str(p) for p in sub.image_paths] if with_paths else None,
                   image_transform=image_transform)


def _text_rows(text: Any, rows: np.ndarray) -> Any:
    """Rows ``rows`` of caption features, float32: dense (a view where :func:`take_rows` gives one) or scipy sparse
    (kept sparse)."""
    if hasattr(text, "tocsr"):
        return _as_float32_2d(text.tocsr()[rows], "text_features")
    return np.asarray(take_rows(np.asarray(text), rows), dtype=np.float32)


def _positions(parent_ids: np.ndarray, child_ids: np.ndarray) -> np.ndarray:
    """Row positions in the parent of the child's ids (both ``int64`` arrays of unique ids)."""
    parent_ids = np.asarray(parent_ids, dtype=np.int64)
    order = np.argsort(parent_ids, kind="stable")
    pos = np.searchsorted(parent_ids[order], child_ids)
    return order[pos]


def _gather(arr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``arr[rows]`` (a copy), the pages of a memory-mapped ``arr`` the gather mapped given back (a scoring bank's 5K
    scattered rows of a COCO-size training split mapped nearly all of its 0.9 GB: issue 34)."""
    from crossview.core.io import drop_pages

    out = arr[rows]
    drop_pages(arr)
    return out
