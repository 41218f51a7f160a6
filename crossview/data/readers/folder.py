"""A generic folder of images with a captions file.

Reads a folder that holds ``captions.jsonl`` or ``captions.csv`` (or ``captions.tsv``), or that file
itself. Any other ``.jsonl`` / ``.csv`` / ``.tsv`` file whose first line names an ``image`` and a
``caption`` field is read the same way when given directly.

- JSONL, one object a line::

      {"image": "dogs/1.jpg", "caption": "a dog runs on grass", "label": "dog", "tags": ["dog", "grass"], "split": "train"}

  ``image`` and ``caption`` are required; ``label`` (string or int), ``tags`` (a list or ``"a,b"``) and
  ``split`` are optional.
- CSV (or TSV) with a header line: ``image,caption[,label][,tags][,split]``, columns in any order, every
  column on every row; parsed strictly (an unclosed quote is an error naming the line its row starts on,
  see :func:`~crossview.data.readers._common.iter_csv`).

Several lines for one image are several captions of that image: images are numbered in order of first
appearance, captions in file order. Image paths are relative to the file's folder unless ``image_root``
is given; absolute paths are kept; ``./x.jpg``, ``a/../x.jpg`` and ``x.jpg`` are one image. Splits: ``train``
/ ``val`` (also ``dev``, ``validation``) / ``test`` / ``restval``; another name is kept as its own split with
one warning naming it and its image count, a path-like one (``../x``) or one with control characters is an
error; an image without one goes to ``train``; with no split key or column at all, a reproducible 80/10/10
split is generated (``meta["generated_splits"] = True``). A label gives ``labels`` (indices into
``label_names``, the sorted unique label strings), and then every image needs one; a label is text or a
number (``1`` and ``"1"`` are one label, said in a warning; NaN, infinity, booleans and lists are errors, and so
is a CSV cell spelled ``nan`` / ``inf``, naming the line and the value). Tags give per-image
``tags``, the union over that image's lines.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.data.readers._common import LabelReader, brief, check_images_exist, clean_caption, detector
from crossview.data.readers._common import generated_splits, iter_csv, iter_jsonl, normalize_name, read_head, reader
from crossview.data.readers._common import relative_to_root, require_file, safe_resolve, split_name, split_tags
from crossview.data.readers._common import unknown_splits_warning
from crossview.core.errors import DatasetError

#: The file names looked for in a folder, in this order.
CAPTION_FILES = ("captions.jsonl", "captions.csv", "captions.tsv")
SUFFIXES = (".jsonl", ".csv", ".tsv")


@detector
def detect(path: Path) -> bool:
    if path.is_dir():
        return any((path / n).is_file() for n in CAPTION_FILES)
    if path.name.lower() in CAPTION_FILES:
        return True
    if path.suffix.lower() not in SUFFIXES:
        return False
    head = read_head(path).split(b"\n", 1)[0].lower()
    return b"image" in head and b"caption" in head


def _caption_file(path: Path) -> Path:
    if not path.is_dir():
        return require_file(path, "captions file")
    found = [path / n for n in CAPTION_FILES if (path / n).is_file()]
    if not found:
        raise DatasetError(f"no {' or '.join(CAPTION_FILES[:2])} in the folder", path,
                           hint="Add a captions file (image, caption per line) or name the format with --format")
    if len(found) > 1:
        raise DatasetError(f"both {found[0].name} and {found[1].name} are in the folder", path,
                           hint="Pass the captions file you mean instead of the folder")
    return found[0]


def _rows(path: Path) -> Iterator[tuple[int, dict]]:
    if path.suffix.lower() == ".jsonl":
        yield from iter_jsonl(path)
    else:
        yield from iter_csv(path, ("image", "caption"))


def _optional(value: object) -> str | None:
    """A label / split value as a string, or None when absent or blank (CSV gives '' for absent)."""
    if value is None:
        return None
    s = str(value).strip()
    return s or None


@reader
def read(path: Path, image_root: Path | None = None) -> PairedDataset:
    """Reads a captions file (or the folder holding it) into a :class:`PairedDataset`."""
    path = _caption_file(safe_resolve(path))
    root = safe_resolve(image_root if image_root is not None else path.parent)
    if not root.is_dir():
        raise DatasetError("image root is not a folder", root, hint="Pass --image-root FOLDER")

    index: dict[str, int] = {}          # absolute image path -> image number
    abs_paths: list[str] = []
    entry_names: list[str] = []
    img_label: list[tuple[str, int] | None] = []   # (label, line it came from)
    img_split: list[tuple[str, int] | None] = []
    img_tags: list[list[str]] = []
    raw_caps: list[tuple[int, str | None]] = []      # (image number, cleaned caption or None)
    has_label = has_tags = has_split = False
    labels_read = LabelReader(path, text_cells=path.suffix.lower() != ".jsonl")
    for lineno, row in _rows(path):
        image = row.get("image")
        if not isinstance(image, str) or not image.strip():
            raise DatasetError("missing or empty 'image'", path, f"line {lineno}",
                               hint="Each line needs an image path and a caption")
        image = image.strip()
        where = f"line {lineno} {brief(image)}"
        if "caption" not in row:
            raise DatasetError(f"no 'caption' key (found: {brief(', '.join(row), 120)})", path, where)
        caption = row["caption"]
        if caption is not None and not isinstance(caption, str):
            raise DatasetError(f"'caption' must be a string, got {type(caption).__name__}", path, where)
        abs_path = os.path.normpath(relative_to_root(root, normalize_name(image)))
        i = index.get(abs_path)
        if i is None:
            i = index[abs_path] = len(abs_paths)
            abs_paths.append(abs_path)
            entry_names.append(where)
            img_label.append(None)
            img_split.append(None)
            img_tags.append([])
        if not isinstance(row.get("split"), (str, type(None))):
            raise DatasetError(f"'split' must be a string such as \"train\", \"val\" or \"test\", got "
                               f"{type(row['split']).__name__} {brief(row['split'])}", path, where)
        if not isinstance(row.get("tags"), (list, str, type(None))):
            raise DatasetError(f"'tags' must be a list or a string, got {type(row['tags']).__name__} "
                               f"{brief(row['tags'])}", path, where)
        has_label |= "label" in row
        has_split |= "split" in row
        has_tags |= "tags" in row
        for key, store in (("label", img_label), ("split", img_split)):
            if key == "label":
                value = labels_read.read(row.get("label"), where)
            else:
                value = _optional(row.get(key))
                if value is not None:
                    value = split_name(value, path, where)
            if value is None:
                continue
            if store[i] is not None and store[i][0] != value:
                raise DatasetError(f"{key} {brief(value)} differs from {brief(store[i][0])} given for the same image "
                                   f"on line {store[i][1]}", path, where,
                                   hint=f"Give one {key} per image")
            store[i] = (value, lineno)
        try:
            row_tags = split_tags(row.get("tags"))
        except DatasetError as e:
            raise DatasetError(e.problem, path, where, e.hint) from None
        for t in row_tags:
            if t not in img_tags[i]:
                img_tags[i].append(t)
        raw_caps.append((i, clean_caption(caption)))
    if not abs_paths:
        raise DatasetError("no captions in the file", path, hint="Each line needs an image path and a caption")

    warnings: list[str] = []
    exists = check_images_exist(abs_paths, path, root, entry_names, warnings)
    n_caps_of = np.zeros(len(abs_paths), dtype=np.int64)
    n_empty = 0
    for i, c in raw_caps:
        if exists[i]:
            if c is None:
                n_empty += 1
            else:
                n_caps_of[i] += 1
    keep = exists & (n_caps_of > 0)
    n_nocap = int((exists & (n_caps_of == 0)).sum())
    if n_empty:
        warnings.append(f"skipped {n_empty} empty caption(s)")
    if n_nocap:
        warnings.append(f"skipped {n_nocap} image(s) with no non-empty caption")
    if not keep.any():
        raise DatasetError("no image with both a file and a caption remains", path)
    new_index = np.cumsum(keep) - 1
    kept = np.flatnonzero(keep)
    captions = [c for i, c in raw_caps if keep[i] and c is not None]
    cap_img = np.array([new_index[i] for i, c in raw_caps if keep[i] and c is not None], dtype=np.int64)

    meta: dict = {"image_root": str(root)}
    if has_split:
        splits: dict[str, list[int]] = {}
        n_nosplit = 0
        for j, i in enumerate(kept):
            s = img_split[i]
            n_nosplit += s is None
            splits.setdefault("train" if s is None else s[0], []).append(j)
        if n_nosplit:
            warnings.append(f"{n_nosplit} image(s) have no split and were put in 'train'")
        split_arrays = {k: np.asarray(v, dtype=np.int64) for k, v in splits.items()}
        warnings.extend(unknown_splits_warning(split_arrays, path))
    else:
        split_arrays = generated_splits(len(kept))
        meta["generated_splits"] = True

    labels = label_names = None
    if has_label:
        unlabelled = [i for i in kept if img_label[i] is None]
        if unlabelled:
            raise DatasetError(f"no label for this image, while other lines have one ({len(unlabelled)} "
                               f"image(s) without a label)", path, entry_names[unlabelled[0]],
                               hint="Give every image a label, or remove the label column")
        names = [img_label[i][0] for i in kept]  # type: ignore[index]
        label_names = sorted(set(names))
        lookup = {n: j for j, n in enumerate(label_names)}
        labels = np.array([lookup[n] for n in names], dtype=np.int64)
        warnings.extend(labels_read.warnings())

    return PairedDataset(
        name=path.parent.name or path.stem,
        captions=captions,
        caption_image=cap_img,
        image_paths=[abs_paths[i] for i in kept],
        labels=labels,
        label_names=label_names,
        tags=[img_tags[i] for i in kept] if has_tags else None,
        splits=split_arrays,
        source=str(path),
        format="folder",
        warnings=warnings,
        meta=meta,
    )
