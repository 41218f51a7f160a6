"""CUHK-PEDES person descriptions (Li et al., CVPR 2017): ``reid_raw.json``.

A JSON list, one object per image::

    [{"split": "train", "captions": ["A woman in a red coat ...", "..."], "file_path": "CUHK01/0107002.png",
      "id": 13, "processed_tokens": [[...], [...]]}, ...]

``split`` is ``train``, ``val`` (or ``dev``) or ``test``; ``processed_tokens`` is ignored. Usually 2
captions per image. Images are under ``imgs/`` beside the JSON (``imgs/CUHK01/0107002.png``) unless
``image_root`` is given. ``labels`` are the identity ids mapped to ``0..n_ids-1`` in increasing id order,
``label_names`` the original ids as strings. The path may also be the folder holding ``reid_raw.json``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.data.readers._common import brief, check_images_exist, check_unique_images, clean_caption, detector
from crossview.data.readers._common import guess_image_root, normalize_name, read_head, read_json, reader, safe_resolve
from crossview.core.errors import DatasetError

JSON_NAME = "reid_raw.json"
ROOT_CANDIDATES = ("imgs", "")
SPLIT_NAMES = {"train": "train", "val": "val", "dev": "val", "test": "test"}


@detector
def detect(path: Path) -> bool:
    if path.is_dir():
        return (path / JSON_NAME).is_file()
    if path.suffix.lower() != ".json":
        return False
    if path.name.lower() == JSON_NAME:
        return True
    head = read_head(path).removeprefix(b"\xef\xbb\xbf").lstrip()
    return head.startswith(b"[") and b'"file_path"' in head


#: Identity ids are stored as int64 (labels); larger ones cannot be.
_ID_RANGE = (-(1 << 63), (1 << 63) - 1)


def _identity(value: object, path: Path, where: str) -> int:
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,19}\s*", value):  # ASCII digits only
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not _ID_RANGE[0] <= value <= _ID_RANGE[1]:
            raise DatasetError(f"'id' {brief(value, 30)} is out of range (ids must fit in 64 bits)", path, where,
                               hint="Number the identities 0, 1, 2, ...")
        return value
    raise DatasetError(f"'id' must be an integer, got {brief(value)}", path, where)


@reader
def read(path: Path, image_root: Path | None = None) -> PairedDataset:
    """Reads ``reid_raw.json`` (or the folder holding it)."""
    path = safe_resolve(path)
    if path.is_dir():
        path = path / JSON_NAME
    doc = read_json(path)
    if not isinstance(doc, list):
        raise DatasetError(f"expected a JSON list of images, got {type(doc).__name__}", path,
                           hint="CUHK-PEDES reid_raw.json is a list of {split, captions, file_path, id} objects")
    if not doc:
        raise DatasetError("the list is empty", path)

    rel_names: list[str] = []
    entry_names: list[str] = []
    ids: list[int] = []
    split_of: list[str] = []
    seen: dict[str, int] = {}
    for k, e in enumerate(doc):
        if not isinstance(e, dict):
            raise DatasetError(f"expected an object, got {type(e).__name__}", path, f"entry {k}")
        fp = e.get("file_path")
        if not isinstance(fp, str) or not fp.strip():
            raise DatasetError("missing or empty 'file_path'", path, f"entry {k}",
                               hint="Each entry needs file_path, id, captions and split")
        where = f"entry {k} {brief(fp.strip())}"
        fp = normalize_name(fp)
        if fp in seen:
            raise DatasetError(f"duplicate file_path: the same image as entry {seen[fp]}", path, where,
                               hint="Each image must appear once; merge their captions")
        seen[fp] = k
        if "id" not in e:
            raise DatasetError("missing 'id'", path, where)
        if not isinstance(e.get("captions"), list):
            raise DatasetError("missing 'captions' list", path, where)
        split = e.get("split")
        if not isinstance(split, str) or split.strip().lower() not in SPLIT_NAMES:
            raise DatasetError(f"'split' must be train, val or test, got {brief(split)}", path, where)
        rel_names.append(fp)
        entry_names.append(where)
        ids.append(_identity(e["id"], path, where))
        split_of.append(SPLIT_NAMES[split.strip().lower()])

    if image_root is None:
        image_root = guess_image_root(path.parent, rel_names, ROOT_CANDIDATES)
    image_root = safe_resolve(image_root)
    if not image_root.is_dir():
        raise DatasetError("image root is not a folder", image_root, hint="Pass --image-root FOLDER")
    abs_paths = [str(image_root / r) for r in rel_names]
    check_unique_images(abs_paths, entry_names, path, "file_path", "Each image must appear once; merge their captions")
    warnings: list[str] = []
    exists = check_images_exist(abs_paths, path, image_root, entry_names, warnings)

    paths: list[str] = []
    captions: list[str] = []
    cap_img: list[int] = []
    kept_ids: list[int] = []
    splits: dict[str, list[int]] = {}
    n_empty = n_nocap = 0
    for k, e in enumerate(doc):
        if not exists[k]:
            continue
        caps = []
        for raw in e["captions"]:
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
        kept_ids.append(ids[k])
        splits.setdefault(split_of[k], []).append(i)
    if n_empty:
        warnings.append(f"skipped {n_empty} empty caption(s)")
    if n_nocap:
        warnings.append(f"skipped {n_nocap} image(s) with no non-empty caption")
    if not paths:
        raise DatasetError("no image with both a file and a caption remains", path)

    unique_ids, labels = np.unique(np.asarray(kept_ids, dtype=np.int64), return_inverse=True)
    return PairedDataset(
        name="cuhk-pedes",
        captions=captions,
        caption_image=np.asarray(cap_img, dtype=np.int64),
        image_paths=paths,
        labels=labels.astype(np.int64),
        label_names=[str(i) for i in unique_ids.tolist()],
        splits={k: np.asarray(v, dtype=np.int64) for k, v in splits.items()},
        source=str(path),
        format="cuhk-pedes",
        warnings=warnings,
        meta={"image_root": str(image_root)},
    )
