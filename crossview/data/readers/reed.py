"""CUB-200-2011 and Oxford-102 Flowers in the layout of Reed et al. (CVPR 2016, "Learning deep
representations of fine-grained visual descriptions")::

    ROOT/
      text_c10/<class folder>/<image stem>.txt   one caption a line (usually 10)
      images/<class folder>/<image stem>.jpg     CUB: images in class folders, or
      jpg/<image stem>.jpg                       Flowers: all images in one folder
      trainclasses.txt valclasses.txt testclasses.txt   class folder names, one a line, or
      trainvalclasses.txt testclasses.txt               (then trainval is read as "train")

The path may be ROOT or ROOT/text_c10 (both are detected). With ``image_root``, images are looked for in
``image_root/<class folder>/`` and then directly in ``image_root``. Images and captions are ordered by
class folder name, then image stem. ``labels`` are class indices, ``label_names`` the class folder names
(sorted). With no split files everything is in ``train`` (with a warning). A caption file without an
image, or an image without a caption file, is skipped and counted in the warnings; a split file naming
an unknown class is an error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.data.readers._common import brief, check_images_exist, detector
from crossview.data.readers._common import image_index, read_caption_files, read_text, reader, safe_resolve
from crossview.core.errors import DatasetError

TEXT_DIR = "text_c10"
#: Image folders beside text_c10, tried in order: CUB's class folders, Flowers' flat folder.
IMAGE_DIRS = ("images", "jpg")


@detector
def detect(path: Path) -> bool:
    return path.is_dir() and ((path / TEXT_DIR).is_dir() or path.name == TEXT_DIR)


def _read_class_file(path: Path, classes: dict[str, int]) -> list[str]:
    names: list[str] = []
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        name = line.strip()
        if not name:
            continue
        if name not in classes:
            raise DatasetError(f"unknown class {brief(name)} (no such folder in {TEXT_DIR}/)", path, f"line {lineno}",
                               hint=f"Each line must name a class folder of {TEXT_DIR}/")
        names.append(name)
    return names


def _class_splits(root: Path, classes: dict[str, int], warnings: list[str]) -> dict[str, str] | None:
    """Class folder -> split name, from the split files; None when there are none."""
    files = {s: root / f"{s}classes.txt" for s in ("train", "val", "test", "trainval")}
    if files["train"].is_file() or files["val"].is_file():
        use = {"train": files["train"], "val": files["val"], "test": files["test"]}
    elif files["trainval"].is_file():
        use = {"train": files["trainval"], "test": files["test"]}
    elif files["test"].is_file():
        use = {"test": files["test"]}
    else:
        return None
    split_of: dict[str, str] = {}
    file_of: dict[str, Path] = {}
    for split, f in use.items():
        if not f.is_file():
            continue
        for name in _read_class_file(f, classes):
            if name in split_of and file_of[name] != f:
                raise DatasetError(f"class {brief(name)} is also listed in {file_of[name].name}", f,
                                   hint="Splits must not share classes")
            split_of[name] = split
            file_of[name] = f
    unlisted = [c for c in classes if c not in split_of]
    if unlisted:
        warnings.append(f"{len(unlisted)} class(es) are in no split file and were left out "
                        f"(first: {brief(unlisted[0])})")
    return split_of


@reader
def read(path: Path, image_root: Path | None = None) -> PairedDataset:
    """Reads a Reed et al. ``text_c10`` dataset root (CUB-200 or Oxford-102 Flowers)."""
    root = safe_resolve(path)
    if root.name == TEXT_DIR:
        root = root.parent
    text_dir = root / TEXT_DIR
    if not text_dir.is_dir():
        raise DatasetError(f"no {TEXT_DIR}/ folder", root, hint=f"Give the folder that holds {TEXT_DIR}/")
    class_dirs = sorted(d for d in text_dir.iterdir() if d.is_dir())
    if not class_dirs:
        raise DatasetError("no class folders", text_dir, hint="Expected text_c10/<class>/<image>.txt")
    classes = {d.name: j for j, d in enumerate(class_dirs)}

    if image_root is not None:
        base = safe_resolve(image_root)
        if not base.is_dir():
            raise DatasetError("image root is not a folder", base, hint="Pass --image-root FOLDER")
    else:
        base = next((root / d for d in IMAGE_DIRS if (root / d).is_dir()), root)
    nested, flat = image_index(base)

    # One entry per caption file; the image path is the one found, else where it was expected.
    flat_layout = bool(flat) and not nested if (flat or nested) else base.name == "jpg"
    entries: list[tuple[Path, str, str]] = []  # (caption file, class, image path)
    for d in class_dirs:
        for txt in sorted(d.glob("*.txt")):
            found = nested.get((d.name, txt.stem)) or flat.get(txt.stem)
            expected = base / f"{txt.stem}.jpg" if flat_layout else base / d.name / f"{txt.stem}.jpg"
            entries.append((txt, d.name, str(found or expected)))
    if not entries:
        raise DatasetError("no caption files", text_dir, hint="Expected text_c10/<class>/<image>.txt")
    warnings: list[str] = []
    names = [f"{TEXT_DIR}/{c}/{t.name}" for t, c, _ in entries]
    exists = check_images_exist([e[2] for e in entries], text_dir, base, names, warnings)

    kept, captions, cap_img = read_caption_files(entries, exists, warnings)
    paths = [image for _, _, image in kept]
    labels = [classes[cls] for _, cls, _ in kept]
    class_of = [cls for _, cls, _ in kept]
    if not paths:
        raise DatasetError("no image with both a file and a caption remains", root)
    used = {e[2] for e in entries}
    n_orphans = sum(1 for p in (*nested.values(), *flat.values()) if str(p) not in used)
    if n_orphans:
        warnings.append(f"skipped {n_orphans} image(s) in {base} with no caption file in {TEXT_DIR}/")

    split_of = _class_splits(root, classes, warnings)
    if split_of is None:
        warnings.append("no trainclasses.txt / valclasses.txt / testclasses.txt: all images are in 'train'")
        splits = {"train": np.arange(len(paths), dtype=np.int64)}
    else:
        grouped: dict[str, list[int]] = {}
        for i, cls in enumerate(class_of):
            if cls in split_of:
                grouped.setdefault(split_of[cls], []).append(i)
        splits = {k: np.asarray(v, dtype=np.int64) for k, v in grouped.items()}
    return PairedDataset(
        name=root.name,
        captions=captions,
        caption_image=np.asarray(cap_img, dtype=np.int64),
        image_paths=paths,
        labels=np.asarray(labels, dtype=np.int64),
        label_names=list(classes),
        splits=splits,
        source=str(root),
        format="reed",
        warnings=warnings,
        meta={"image_root": str(base)},
    )
