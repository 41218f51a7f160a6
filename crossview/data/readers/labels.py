"""Label / phrase annotations: each image has a set of labels (for P@K and mAP).

Reads a folder that holds one of these files, or the file itself when it is named ``labels.*``:

- ``labels.jsonl``: ``{"image": "img/001.jpg", "labels": ["dog", "red ball"]}`` (or ``"dog,red ball"``);
- ``labels.csv``: a header ``image,labels`` then ``img/001.jpg,"dog,red ball"``;
- ``labels.txt``: ``img/001.jpg<TAB>dog,red ball``.

Labels may be phrases, so a string is split on ``,``, ``;`` and ``|`` only, never on spaces; each label
is whitespace-normalised and lower-cased, duplicates dropped. Image paths are relative to the file's
folder unless ``image_root`` is given.

:func:`read` gives a :class:`PairedDataset` with no captions, ``label_sets`` and one split ``train``;
when every image has exactly one label, ``labels`` is its class index into ``label_names`` (the sorted
labels), else the image index. :func:`attach_label_sets` merges such a file into a caption dataset.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.data.readers._common import check_images_exist, check_source, detector, guarded, one_line
from crossview.data.readers._common import reader, safe_resolve
from crossview.data.readers.webtags import SUFFIXES, find_list_file, read_image_lists
from crossview.core.errors import DatasetError


@detector
def detect(path: Path) -> bool:
    if path.is_dir():
        return any((path / f"labels{s}").is_file() for s in SUFFIXES)
    return path.name.lower() in {f"labels{s}" for s in SUFFIXES}


def split_labels(value: Any) -> list[str]:
    """Labels from a JSON list or a string separated by ``,;|`` (not spaces: labels may be phrases)."""
    if value is None:
        return []
    items = [str(v) for v in value] if isinstance(value, (list, tuple)) else re.split(r"[,;|]", str(value))
    out: list[str] = []
    for item in items:
        label = " ".join(item.split()).lower()
        if label and label not in out:
            out.append(label)
    return out


def _image_root(path: Path, image_root: Path | None) -> Path:
    root = safe_resolve(image_root if image_root is not None else path.parent)
    if not root.is_dir():
        raise DatasetError("image root is not a folder", root, hint="Pass --image-root FOLDER")
    return root


@reader
def read(path: Path, image_root: Path | None = None) -> PairedDataset:
    """Reads a labels file (or the folder holding it) into a :class:`PairedDataset` with no captions."""
    path = find_list_file(safe_resolve(path), "labels")
    root = _image_root(path, image_root)
    entries = read_image_lists(path, "labels", split_labels, root, spaces_in_txt=False)
    if not entries:
        raise DatasetError("no images in the file", path, hint="Each line needs an image path and its labels")
    warnings: list[str] = []
    exists = check_images_exist([e[1] for e in entries], path, root, [e[0] for e in entries], warnings)
    kept = [e for e, ok in zip(entries, exists) if ok]
    label_sets = [e[2] for e in kept]
    n_unlabelled = sum(1 for s in label_sets if not s)
    if n_unlabelled:
        warnings.append(f"{n_unlabelled} of {len(kept)} image(s) have no labels (kept)")
    labels = label_names = None
    if all(len(s) == 1 for s in label_sets):
        label_names = sorted({s[0] for s in label_sets})
        lookup = {n: j for j, n in enumerate(label_names)}
        labels = np.array([lookup[s[0]] for s in label_sets], dtype=np.int64)
    return PairedDataset(
        name=path.parent.name or path.stem,
        captions=[],
        caption_image=np.zeros(0, dtype=np.int64),
        image_paths=[e[1] for e in kept],
        labels=labels,
        label_names=label_names,
        label_sets=label_sets,
        splits={"train": np.arange(len(kept), dtype=np.int64)},
        source=str(path),
        format="labels",
        warnings=warnings,
        meta={"image_root": str(root)},
    )


def attach_label_sets(ds: PairedDataset, path: Path, image_root: Path | None = None) -> PairedDataset:
    """A copy of ``ds`` whose ``label_sets`` come from a labels file, matched on resolved image paths.

    Image paths in the file are relative to its folder unless ``image_root`` is given. Images of ``ds``
    that the file does not list get an empty set; entries that match no image of ``ds`` are ignored;
    both are counted in the warnings. No match at all is an error.
    """
    with guarded(path):
        check_source(path)
        return _attach_label_sets(ds, safe_resolve(path), image_root)


def _attach_label_sets(ds: PairedDataset, path: Path, image_root: Path | None) -> PairedDataset:
    path = find_list_file(path, "labels")
    if ds.image_paths is None:
        raise DatasetError(f"cannot match labels to {ds.name!r}: its images are feature rows, not files", path,
                           hint="Label sets can be attached only to a dataset with image files")
    root = _image_root(path, image_root)
    entries = read_image_lists(path, "labels", split_labels, root, spaces_in_txt=False)
    position = {os.path.normpath(p): i for i, p in enumerate(ds.image_paths)}
    label_sets: list[list[str]] = [[] for _ in range(ds.n_images)]
    matched = np.zeros(ds.n_images, dtype=bool)
    unmatched: list[str] = []
    for where, abs_path, labels in entries:
        i = position.get(abs_path)
        if i is None:
            unmatched.append(f"{where} -> {abs_path}")
        else:
            label_sets[i] = labels
            matched[i] = True
    if not matched.any():
        first = f" (first: {one_line(unmatched[0], 200)})" if unmatched else ""
        raise DatasetError(f"none of its {len(entries)} entries match an image of {ds.name!r}{first}", path,
                           hint="Image paths are resolved against the labels file's folder; pass the image root")
    warnings = list(ds.warnings)
    if unmatched:
        warnings.append(f"ignored {len(unmatched)} of {len(entries)} entries of {path.name} that match no image "
                        f"(first: {one_line(unmatched[0], 200)})")
    n_missing = int((~matched).sum())
    if n_missing:
        warnings.append(f"{n_missing} of {ds.n_images} image(s) are not in {path.name} (empty label set)")
    return dataclasses.replace(ds, label_sets=label_sets, warnings=warnings,
                               meta={**ds.meta, "label_sets_source": str(path)})
