"""Text views of a dataset: its labels or its captions' relation phrases as the text side (the BITR paper's
Experiments 3 and 4, image <-> phrase and image <-> label retrieval).

A view keeps the images (files, features, splits, labels, numbering) and replaces the captions: every label of
an image becomes one "caption" of it, and ``label_sets`` holds the labels themselves, so that every method
trains and ranks on labels (CCA and BITR on the label's text, WSABIE / wKNN / SVM on the label ids):

- ``{"kind": "labels"}``: the dataset's own label sets (IAPR TC-12's 291 annotation words, the demo's
  objects, a ``labels`` file);
- ``{"kind": "phrases", "min_images": N}``: relation phrases of the captions (:mod:`crossview.data.phrases`:
  noun-verb, noun-prep-noun, verb-prep-noun from a dependency parse), each image's the union over its
  captions, kept when at least ``N`` images have the phrase (the vocabulary is chosen on all images, from the
  captions alone: nothing about retrieval results decides it).

A label's caption is its words with ``-`` and ``_`` read as spaces (``"sit-in_front_of-building"`` -> ``"sit in
front of building"``), which the text encoders read; its name in ``label_sets`` is the label itself. Images
without any label keep their place (the numbering stays) but have no caption and leave every split: a ranking
needs a relevant item per query.

A run records its view in ``config.json`` (``text_view``), and resume and ``open_run`` apply it again to the
dataset they load (:func:`apply_text_view`), as they apply derived splits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError

__all__ = ["TEXT_VIEWS", "text_view", "apply_text_view", "check_text_view", "label_text"]

TEXT_VIEWS = ("labels", "phrases")


def label_text(label: str) -> str:
    """What a text encoder reads of a label: its words, ``-`` and ``_`` read as spaces."""
    return " ".join(label.replace("-", " ").replace("_", " ").split())


def check_text_view(view: Any) -> dict[str, Any] | None:
    """``view`` as a checked record (``None`` for none); one line naming what is wrong otherwise."""
    if view is None:
        return None
    if isinstance(view, str):
        view = {"kind": view}
    if not isinstance(view, dict) or view.get("kind") not in TEXT_VIEWS:
        raise CrossViewError(f"text view {view!r}: its kind must be one of {', '.join(TEXT_VIEWS)}")
    out: dict[str, Any] = {"kind": view["kind"]}
    if view["kind"] == "phrases":
        n = view.get("min_images", 2)
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise CrossViewError(f"text view phrases: min_images must be a whole number >= 1, got {n!r}")
        out["min_images"] = int(n)
    extra = sorted(set(view) - {"kind", "min_images"})
    if extra or (view["kind"] == "labels" and "min_images" in view):
        raise CrossViewError(f"text view {view['kind']}: unknown setting {(extra or ['min_images'])[0]!r}")
    return out


def _phrase_sets(dataset: Any, min_images: int, progress: Any = None) -> list[list[str]]:
    from crossview.data.phrases import extract_phrases

    per_caption = extract_phrases(list(dataset.captions), progress=progress)
    sets: list[set[str]] = [set() for _ in range(dataset.n_images)]
    for c, phrases in enumerate(per_caption):
        sets[int(dataset.caption_image[c])].update(phrases)
    counts = Counter(p for s in sets for p in s)
    return [sorted(p for p in s if counts[p] >= min_images) for s in sets]


def text_view(dataset: Any, view: Any, *, progress: Any = None) -> Any:
    """The dataset seen through ``view`` (see the module docstring): a new
    :class:`~crossview.data.dataset.PairedDataset`, the original untouched."""
    view = check_text_view(view)
    assert view is not None
    if view["kind"] == "labels":
        if not dataset.label_sets:
            raise CrossViewError(f"dataset {dataset.name!r} has no label sets for a label view; use a dataset with "
                                 "labels (IAPR TC-12 with its label files, the demo, a labels file) or the phrases "
                                 "view")
        sets = [sorted({str(x) for x in s}) for s in dataset.label_sets]
    else:
        sets = _phrase_sets(dataset, view["min_images"], progress)
    if not any(sets):
        raise CrossViewError(f"dataset {dataset.name!r}: the {view['kind']} view leaves no image with a label"
                             + ("; lower min_images" if view["kind"] == "phrases" else ""))
    has = np.asarray([bool(s) for s in sets])
    splits = {k: np.asarray(v, dtype=np.int64)[has[np.asarray(v, dtype=np.int64)]] for k, v in dataset.splits.items()}
    captions = [label_text(label) for s in sets for label in s]
    caption_image = np.asarray([i for i, s in enumerate(sets) for _ in s], dtype=np.int64)
    suffix = view["kind"] if view["kind"] == "labels" else f"phrases{view['min_images']}"
    return replace(dataset, name=f"{dataset.name}-{suffix}", captions=captions, caption_image=caption_image,
                   label_sets=sets, splits=splits, caption_ids=np.arange(len(captions), dtype=np.int64), image_features=
                   dataset.image_features, meta={**dataset.meta, "text_view": view,
                                                 "text_view_of": dataset.fingerprint()},
                   warnings=list(dataset.warnings))


def apply_text_view(dataset: Any, view: Any) -> Any:
    """``dataset`` through the run's recorded ``view`` (unchanged for ``None``)."""
    return dataset if view is None else text_view(dataset, view)
