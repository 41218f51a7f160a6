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

__all__ = ["MethodData"]


def _as_float32_2d(x: Any, what: str) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise CrossViewError(f"{what} must be a 2-D (rows, dims) matrix, got shape {arr.shape}")
    if arr.dtype != np.float32:
        arr = arr.astype(np.float32)
    return arr


@dataclass
class MethodData:
    """The inputs of a method for one split: features, captions and the caption -> image map.

    Attributes:
        image_features: ``(n_images, p) float32``.
        text_features: ``(n_captions, q) float32``, or ``None`` for methods that read the captions
            themselves (the deep methods tokenise ``captions``).
        captions: ``n_captions`` caption strings.
        caption_image: ``(n_captions,) int64``, the image of each caption (index into the images).
        labels: ``(n_images,) int64`` identity / class labels, or ``None``.
        label_sets: per-image lists of label ids (the WSABIE label variant), or ``None``.
        label_set_names: the names of the label ids in ``label_sets`` (shared by all splits built from
            one dataset, so ids mean the same thing in train and test).
        dataset: the source :class:`~crossview.data.dataset.PairedDataset` of this split (or ``None``).
        name: the split's name (``"train"``), for messages.
    """

    image_features: np.ndarray
    text_features: np.ndarray | None
    captions: list[str]
    caption_image: np.ndarray
    labels: np.ndarray | None = None
    label_sets: list[list[int]] | None = None
    label_set_names: list[str] | None = None
    dataset: Any = None
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.image_features = _as_float32_2d(self.image_features, "image_features")
        n_img = self.image_features.shape[0]
        self.captions = list(self.captions)
        ci = np.asarray(self.caption_image)
        if ci.ndim != 1 or len(ci) != len(self.captions):
            raise CrossViewError(f"caption_image must have one entry per caption ({len(self.captions)}), "
                                 f"got shape {ci.shape}")
        self.caption_image = ci.astype(np.int64, copy=False)
        if len(ci) and (ci.min() < 0 or ci.max() >= n_img):
            raise CrossViewError(f"caption_image refers to image {int(ci.max())} but there are only "
                                 f"{n_img} image feature rows")
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
        return int(self.image_features.shape[0])

    @property
    def n_captions(self) -> int:
        return len(self.captions)

    @property
    def image_dim(self) -> int:
        return int(self.image_features.shape[1])

    @property
    def text_dim(self) -> int | None:
        return None if self.text_features is None else int(self.text_features.shape[1])

    def require_text_features(self, method: str) -> np.ndarray:
        """``text_features``, or a :class:`CrossViewError` saying that ``method`` needs them."""
        if self.text_features is None:
            raise CrossViewError(f"method {method!r} needs caption features but the {self.name or 'given'} "
                                 "data has none; extract them with a text encoder (e.g. --text-encoder minilm)")
        return self.text_features

    def caption_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(image_rows, text_rows)``: the paired feature rows of every caption,
        ``(n_captions, p)`` and ``(n_captions, q)``."""
        return self.image_features[self.caption_image], self.require_text_features("this")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_features(cls, dataset: Any, image: np.ndarray, text: np.ndarray | None,
                      split: str | Sequence[str] | None = None,
                      label_set_names: list[str] | None = None) -> "MethodData":
        """The data of one split (or the whole dataset when ``split`` is None).

        ``dataset`` is a :class:`~crossview.data.dataset.PairedDataset`; ``image (n_images, p)`` and
        ``text (n_captions, q)`` are the feature matrices of the *whole* dataset in its numbering (what
        :func:`crossview.features.extract_features` returns). Label sets are mapped to ids through
        ``label_set_names`` (built from the whole dataset when not given).
        """
        image = np.asarray(image)
        if image.shape[0] != dataset.n_images:
            raise CrossViewError(f"image features have {image.shape[0]} rows for the {dataset.n_images} "
                                 f"images of dataset {dataset.name!r}; extract features of this dataset")
        if text is not None and np.asarray(text).shape[0] != dataset.n_captions:
            raise CrossViewError(f"text features have {np.asarray(text).shape[0]} rows for the "
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
        return cls(image_features=np.asarray(image[img_rows], dtype=np.float32),
                   text_features=None if text is None else np.asarray(np.asarray(text)[cap_rows],
                                                                      dtype=np.float32),
                   captions=list(sub.captions), caption_image=sub.caption_image, labels=sub.labels,
                   label_sets=label_sets, label_set_names=label_set_names, dataset=sub, name=split_name)


def _positions(parent_ids: np.ndarray, child_ids: np.ndarray) -> np.ndarray:
    """Row positions in the parent of the child's ids (both ``int64`` arrays of unique ids)."""
    parent_ids = np.asarray(parent_ids, dtype=np.int64)
    order = np.argsort(parent_ids, kind="stable")
    pos = np.searchsorted(parent_ids[order], child_ids)
    return order[pos]
