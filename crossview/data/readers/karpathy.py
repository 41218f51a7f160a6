"""Karpathy split JSON (Flickr8k, Flickr30K, MS-COCO).

``{"dataset": name, "images": [{"filename", "filepath"?, "imgid"?, "split", "sentences": [{"raw", "tokens"}]}]}``.
COCO entries carry a ``filepath`` (``train2014``/``val2014``) under the image root. CrossView's own
demo adds optional ``label`` (class), ``tags`` and ``labels`` (label set) keys per image, read when present.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.data.readers._common import brief, check_images_exist, check_unique_images, clean_caption, detector
from crossview.data.readers._common import guess_image_root, one_line, read_head, read_json, reader
from crossview.data.readers._common import LabelReader, normalize_name, safe_resolve, split_name, split_tags
from crossview.data.readers._common import unknown_splits_warning
from crossview.core.errors import DatasetError

#: Folders next to the JSON where the images usually are, tried in order.
ROOT_CANDIDATES = ("images", "Images", "Flicker8k_Dataset", "Flickr8k_Dataset", "flickr30k-images", "")


@detector
def detect(path: Path) -> bool:
    if path.is_dir():
        return len(list(path.glob("dataset_*.json"))) == 1
    if path.suffix.lower() != ".json":
        return False
    # Any JSON file that is not a top-level list (CUHK-PEDES) is read as Karpathy, so that a broken
    # or misshapen file gets the reader's precise error instead of "unknown format".
    head = read_head(path, 64).removeprefix(b"\xef\xbb\xbf").lstrip()
    return not head.startswith(b"[")


def _name(value: object, path: Path) -> str:
    """The dataset's name: its ``"dataset"`` string (cut to one short line), else from the file name."""
    if isinstance(value, str) and value.strip():
        return one_line(" ".join(value.split()), 80)
    return path.stem.removeprefix("dataset_")


def _check_optional_fields(e: dict, path: Path, name: str) -> None:
    """The optional keys, when present, have the types they are read as (else one error naming the entry)."""
    for key, types, what in (("filepath", (str,), "a string"), ("label", (str, int, float), "a string or a number"),
                             ("tags", (list, str), "a list or a string"),
                             ("labels", (list, str), "a list or a string")):
        value = e.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise DatasetError(f"{key!r} must be {what}, got {type(value).__name__} {brief(value)}", path, name)


def _json_path(path: Path) -> Path:
    if path.is_dir():
        found = sorted(path.glob("dataset_*.json"))
        if len(found) != 1:
            raise DatasetError(f"expected one dataset_*.json split file in the folder, found {len(found)}", path)
        return found[0]
    return path


@reader
def read(path: Path, image_root: Path | None = None) -> PairedDataset:
    """Reads a Karpathy split file (or a folder holding exactly one ``dataset_*.json``)."""
    path = _json_path(Path(path))
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise DatasetError("expected a JSON object with an 'images' list (Karpathy split format)", path)
    entries = doc["images"]
    if not entries:
        raise DatasetError("the 'images' list is empty", path)

    warnings: list[str] = []
    rel_names: list[str] = []
    entry_names: list[str] = []
    seen_ids: dict[object, int] = {}
    seen_files: dict[str, int] = {}
    split_of_entry: dict[int, str] = {}
    label_of_entry: dict[int, str | None] = {}
    labels_read = LabelReader(path)
    for k, e in enumerate(entries):
        if not isinstance(e, dict):
            raise DatasetError(f"expected an object, got {type(e).__name__}", path, f"images[{k}]")
        fname = e.get("filename")
        if not isinstance(fname, str) or not fname.strip():
            raise DatasetError("missing or empty 'filename'", path, f"images[{k}]")
        fpath = e.get("filepath")
        rel = normalize_name(posixpath.join(fpath.strip(), fname.strip()) if isinstance(fpath, str) and fpath.strip()
                             else fname)
        name = f"images[{k}] {brief(fname)}"
        if rel in seen_files:
            raise DatasetError(f"duplicate image: the same file as images[{seen_files[rel]}]", path, name,
                               hint="Each image must appear once; merge their sentences")
        seen_files[rel] = k
        imgid = e.get("imgid")
        if imgid is None:
            imgid = k
        elif isinstance(imgid, bool) or not isinstance(imgid, (int, str)):
            raise DatasetError(f"'imgid' must be an integer or a string, got {type(imgid).__name__} "
                               f"{brief(imgid)}", path, name, hint="Give each image a unique number")
        if imgid in seen_ids:
            raise DatasetError(f"duplicate imgid {brief(imgid)} (also images[{seen_ids[imgid]}])", path, name)
        seen_ids[imgid] = k
        if not isinstance(e.get("sentences"), list):
            raise DatasetError("missing 'sentences' list", path, name)
        split = e.get("split")
        if split is not None and not isinstance(split, str):
            raise DatasetError(f"'split' must be a string such as \"train\", \"val\" or \"test\", got "
                               f"{type(split).__name__} {brief(split)}", path, name)
        if split is not None and split.strip():
            split_of_entry[k] = split_name(split, path, name)
        label_of_entry[k] = labels_read.read(e.get("label"), name) if e.get("label") is not None else None
        _check_optional_fields(e, path, name)
        rel_names.append(rel)
        entry_names.append(name)

    if image_root is None:
        image_root = guess_image_root(path.parent, rel_names, ROOT_CANDIDATES)
    image_root = safe_resolve(image_root)
    if not image_root.is_dir():
        raise DatasetError("image root is not a folder", image_root, hint="Pass --image-root FOLDER")
    abs_paths = [str(image_root / r) for r in rel_names]
    check_unique_images(abs_paths, entry_names, path, "image", "Each image must appear once; merge their sentences")
    exists = check_images_exist(abs_paths, path, image_root, entry_names, warnings)

    paths: list[str] = []
    captions: list[str] = []
    cap_img: list[int] = []
    split_of: list[str] = []
    label_raw: list[object] = []
    tags: list[list[str]] = []
    label_sets: list[list[str]] = []
    has_tags = has_sets = has_label = False
    n_empty = n_nocap = n_nosplit = 0
    for k, e in enumerate(entries):
        if not exists[k]:
            continue
        caps = []
        for s in e["sentences"]:
            raw = s.get("raw") if isinstance(s, dict) else s
            if raw is None and isinstance(s, dict) and isinstance(s.get("tokens"), list):
                raw = " ".join(map(str, s["tokens"]))
            c = clean_caption(raw)
            if c is None:
                n_empty += 1
            else:
                caps.append(c)
        if not caps:
            n_nocap += 1
            continue
        i = len(paths)
        paths.append(abs_paths[k])
        captions.extend(caps)
        cap_img.extend([i] * len(caps))
        split = split_of_entry.get(k)
        n_nosplit += split is None
        split_of.append(split or "train")
        has_label |= "label" in e
        label_raw.append(label_of_entry[k])
        has_tags |= "tags" in e
        tags.append(split_tags(e.get("tags")))
        has_sets |= "labels" in e
        label_sets.append(split_tags(e.get("labels")))
    if n_empty:
        warnings.append(f"skipped {n_empty} empty caption(s)")
    if n_nocap:
        warnings.append(f"skipped {n_nocap} image(s) with no non-empty caption")
    if n_nosplit:
        warnings.append(f"{n_nosplit} image(s) have no split and were put in 'train'")
    if not paths:
        raise DatasetError("no image with both a file and a caption remains", path)

    splits: dict[str, np.ndarray] = {}
    for i, s in enumerate(split_of):
        splits.setdefault(s, []).append(i)  # type: ignore[arg-type]
    warnings.extend(unknown_splits_warning(splits, path))  # type: ignore[arg-type]
    labels = label_names = None
    if has_label:
        label_names = sorted({str(v) for v in label_raw if v is not None})
        if any(v is None for v in label_raw):
            raise DatasetError("some images have a 'label' and others do not", path)
        lookup = {n: j for j, n in enumerate(label_names)}
        labels = np.array([lookup[str(v)] for v in label_raw], dtype=np.int64)
        warnings.extend(labels_read.warnings())
    return PairedDataset(
        name=_name(doc.get("dataset"), path),
        captions=captions,
        caption_image=np.asarray(cap_img, dtype=np.int64),
        image_paths=paths,
        labels=labels,
        label_names=label_names,
        tags=tags if has_tags else None,
        label_sets=label_sets if has_sets else None,
        splits={k: np.asarray(v, dtype=np.int64) for k, v in splits.items()},
        source=str(path),
        format="karpathy",
        warnings=warnings,
        meta={"image_root": str(image_root)},
    )
