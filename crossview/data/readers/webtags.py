"""A web image-tag collection: images with tags and no captions (Flickr-style user tags).

Reads a folder that holds one of these files, or the file itself when it is named ``tags.*``:

- ``tags.jsonl``: ``{"image": "img/001.jpg", "tags": ["dog", "beach"]}`` (or ``"tags": "dog,beach"``);
- ``tags.csv``: a header ``image,tags`` then ``img/001.jpg,"dog,beach"`` (tags separated by ``,;|``
  or spaces);
- ``tags.txt``: ``img/001.jpg<TAB>dog,beach`` or ``img/001.jpg dog beach`` (the first space-separated
  word is the path when there is no tab).

Image paths are relative to the file's folder unless ``image_root`` is given. Tags are lower-cased and
de-duplicated. The result has no captions (``captions=[]``), per-image ``tags`` and one split,
``train`` = all images. Images with an empty tag list are kept (web data is noisy) and counted in a
warning; an image listed twice is an error naming both lines.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.data.readers._common import brief, check_images_exist, detector, iter_csv, iter_jsonl
from crossview.data.readers._common import read_text, reader, relative_to_root, require_file, safe_resolve
from crossview.data.readers._common import split_tags
from crossview.core.errors import DatasetError

SUFFIXES = (".jsonl", ".csv", ".txt")


@detector
def detect(path: Path) -> bool:
    if path.is_dir():
        return any((path / f"tags{s}").is_file() for s in SUFFIXES)
    return path.name.lower() in {f"tags{s}" for s in SUFFIXES}


def find_list_file(path: Path, stem: str) -> Path:
    """``path`` itself when it is a file, else the one ``{stem}.jsonl|csv|txt`` in the folder ``path``."""
    if not path.is_dir():
        return require_file(path, f"{stem} file")
    found = [path / f"{stem}{s}" for s in SUFFIXES if (path / f"{stem}{s}").is_file()]
    if not found:
        raise DatasetError(f"no {stem}.jsonl, {stem}.csv or {stem}.txt in the folder", path,
                           hint="Pass the annotation file itself, or name the format with --format")
    if len(found) > 1:
        raise DatasetError(f"both {found[0].name} and {found[1].name} are in the folder", path,
                           hint="Pass the file you mean instead of the folder")
    return found[0]


def read_image_lists(path: Path, key: str, split_values: Callable[[Any], list[str]], root: Path,
                     spaces_in_txt: bool) -> list[tuple[str, str, list[str]]]:
    """Entries of an image -> list file (``.jsonl``, ``.csv`` or ``.txt``) as (entry name, absolute
    image path, values), in file order. An image listed twice is an error naming both lines.

    ``key`` is the JSON key / CSV column of the values (``"tags"``, ``"labels"``). In ``.txt`` files a
    tab separates the path from the values; without a tab, ``spaces_in_txt`` allows ``path v1 v2``.
    """
    rows: list[tuple[int, str | None, Any]] = []
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        for lineno, obj in iter_jsonl(path):
            if key not in obj:
                raise DatasetError(f"no {key!r} key (found: {brief(', '.join(obj), 120)})", path, f"line {lineno}",
                                   hint=f'Each line must look like {{"image": "a.jpg", "{key}": ["x", "y"]}}')
            value = obj[key]
            if value is not None and not isinstance(value, (list, str)):
                raise DatasetError(f"{key!r} must be a list or a string, got {type(value).__name__}", path,
                                   f"line {lineno}")
            rows.append((lineno, obj.get("image"), value))
    elif suffix in (".csv", ".tsv"):
        for lineno, row in iter_csv(path, ("image", key)):
            rows.append((lineno, row["image"], row[key]))
    else:
        for lineno, line in enumerate(read_text(path).splitlines(), start=1):
            if not line.strip():
                continue
            if "\t" in line:
                image, rest = line.split("\t", 1)
            elif spaces_in_txt or len(line.split()) == 1:
                image, _, rest = line.strip().partition(" ")
            else:
                raise DatasetError(f"expected 'image<TAB>{key}' (no tab on the line)", path, f"line {lineno}",
                                   hint=f"Separate the image path from the {key} with a tab")
            rows.append((lineno, image, rest))
    seen: dict[str, str] = {}
    out: list[tuple[str, str, list[str]]] = []
    for lineno, image, value in rows:
        if not isinstance(image, str) or not image.strip():
            raise DatasetError("missing or empty 'image'", path, f"line {lineno}")
        image = image.strip()
        where = f"line {lineno} {brief(image)}"
        abs_path = os.path.normpath(relative_to_root(root, image))
        if abs_path in seen:
            raise DatasetError(f"duplicate image: also listed on {seen[abs_path]}", path, where,
                               hint=f"List each image once, with all its {key}")
        seen[abs_path] = where
        out.append((where, abs_path, split_values(value)))
    return out


@reader
def read(path: Path, image_root: Path | None = None) -> PairedDataset:
    """Reads a tags file (or the folder holding it) into a :class:`PairedDataset` with no captions."""
    path = find_list_file(safe_resolve(path), "tags")
    root = safe_resolve(image_root if image_root is not None else path.parent)
    if not root.is_dir():
        raise DatasetError("image root is not a folder", root, hint="Pass --image-root FOLDER")
    entries = read_image_lists(path, "tags", split_tags, root, spaces_in_txt=True)
    if not entries:
        raise DatasetError("no images in the file", path, hint="Each line needs an image path and its tags")
    warnings: list[str] = []
    exists = check_images_exist([e[1] for e in entries], path, root, [e[0] for e in entries], warnings)
    kept = [e for e, ok in zip(entries, exists) if ok]
    n_untagged = sum(1 for e in kept if not e[2])
    if n_untagged:
        warnings.append(f"{n_untagged} of {len(kept)} image(s) have no tags (kept)")
    return PairedDataset(
        name=path.parent.name or path.stem,
        captions=[],
        caption_image=np.zeros(0, dtype=np.int64),
        image_paths=[e[1] for e in kept],
        tags=[e[2] for e in kept],
        splits={"train": np.arange(len(kept), dtype=np.int64)},
        source=str(path),
        format="webtags",
        warnings=warnings,
        meta={"image_root": str(root)},
    )
