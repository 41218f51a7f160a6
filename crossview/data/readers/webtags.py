"""A web image-tag collection: images with tags and no captions (Flickr-style user tags).

Reads a folder that holds one of these files, or the file itself when it is named ``tags.*``:

- ``tags.jsonl``: ``{"image": "img/001.jpg", "tags": ["dog", "beach"]}`` (or ``"tags": "dog,beach"``);
- ``tags.csv``: a header ``image,tags`` then ``img/001.jpg,"dog,beach"`` (tags separated by ``,;|``
  or spaces);
- ``tags.txt``: ``img/001.jpg<TAB>dog,beach`` or ``img/001.jpg dog beach`` (the first space-separated
  word is the path when there is no tab);
- no list file: a folder (and its subfolders) of images, each with its tags in a file beside it of the same
  name, ``001.jpg`` + ``001.tags`` (or ``001.txt``): tags separated by commas, semicolons, ``|``, spaces or
  lines -- how web crawls and Flickr downloads are often stored. An image without such a file is kept with no
  tags (counted in a warning); a tag file without its image is ignored.

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
from crossview.data.readers._common import IMAGE_SUFFIXES, split_tags
from crossview.core.errors import DatasetError

SUFFIXES = (".jsonl", ".csv", ".txt")
#: the tag files beside the images of the sidecar layout, in the order they are looked for
SIDECAR_SUFFIXES = (".tags", ".txt")
#: the most images a sidecar folder is scanned for (a larger crawl wants a tags.jsonl)
MAX_SIDECAR_IMAGES = 2_000_000


@detector
def detect(path: Path) -> bool:
    if path.is_dir():
        if any((path / f"tags{s}").is_file() for s in SUFFIXES):
            return True
        if any((path / n).is_file() for n in ("captions.jsonl", "captions.csv", "captions.tsv")):
            return False            # a caption folder (the folder reader)
        return _first_sidecar(path) is not None
    return path.name.lower() in {f"tags{s}" for s in SUFFIXES}


def _sidecar(image: Path) -> Path | None:
    for suffix in SIDECAR_SUFFIXES:
        side = image.with_suffix(suffix)
        if side.is_file():
            return side
    return None


def _images_under(folder: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if Path(name).suffix.lower() in IMAGE_SUFFIXES and not name.startswith("."):
                out.append(Path(dirpath) / name)
                if len(out) > MAX_SIDECAR_IMAGES:
                    raise DatasetError(f"more than {MAX_SIDECAR_IMAGES:,} images under the folder", folder,
                                       hint="List a collection this large in one tags.jsonl (image, tags)")
    return out


def _first_sidecar(folder: Path, limit: int = 200) -> Path | None:
    """An image among the first ``limit`` under ``folder`` with a tag file beside it (a quick detection)."""
    seen = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if Path(name).suffix.lower() in IMAGE_SUFFIXES:
                seen += 1
                if _sidecar(Path(dirpath) / name) is not None:
                    return Path(dirpath) / name
                if seen >= limit:
                    return None
    return None


def _read_sidecar(side: Path) -> list[str]:
    text = read_text(side)
    if "\x00" in text:
        raise DatasetError("not a text file of tags (it holds binary data)", side,
                           hint="A tag file holds the image's tags, separated by commas, spaces or lines")
    return split_tags(",".join(line for line in text.splitlines() if line.strip()))


def read_sidecar_folder(folder: Path) -> PairedDataset:
    """The sidecar layout (see the module docstring): images under ``folder`` with a tag file each."""
    images = _images_under(folder)
    if not images:
        raise DatasetError("no images in the folder (and no tags.jsonl, tags.csv or tags.txt)", folder,
                           hint="Give a folder of images with a .tags file beside each, or a tags.jsonl")
    tags: list[list[str]] = []
    n_no_file = 0
    for image in images:
        side = _sidecar(image)
        if side is None:
            n_no_file += 1
            tags.append([])
        else:
            tags.append(_read_sidecar(side))
    if n_no_file == len(images):
        raise DatasetError(f"none of the {len(images)} images has a tag file beside it (name.tags or name.txt)",
                           folder, hint="Write each image's tags into a file of its name with .tags")
    warnings: list[str] = []
    if n_no_file:
        warnings.append(f"{n_no_file} of {len(images)} image(s) have no tag file beside them (kept without tags)")
    n_empty = sum(1 for t in tags if not t) - n_no_file
    if n_empty:
        warnings.append(f"{n_empty} of {len(images)} image(s) have an empty tag file (kept)")
    return PairedDataset(
        name=folder.name or "web", captions=[], caption_image=np.zeros(0, dtype=np.int64),
        image_paths=[str(p) for p in images], tags=tags, splits={"train": np.arange(len(images), dtype=np.int64)},
        source=str(folder), format="webtags", warnings=warnings, meta={"image_root": str(folder), "layout": "sidecar"})


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
    """Reads a tags file (or the folder holding it, or a folder of images with a tag file each) into a
    :class:`PairedDataset` with no captions."""
    path = safe_resolve(path)
    if path.is_dir() and not any((path / f"tags{s}").is_file() for s in SUFFIXES):
        return read_sidecar_folder(path)
    path = find_list_file(path, "tags")
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
