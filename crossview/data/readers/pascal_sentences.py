"""UIUC Pascal Sentences (Rashtchian et al., 2010): 1,000 PASCAL VOC 2008 images, 50 in each of 20 classes,
5 sentences each, in the class-folder layout the common download scripts write::

    ROOT/
      dataset/<class>/<image>.jpg          rupy/PascalSentenceDataset (the most used script), or
      images/<class>/<image>.jpg           its forks
      sentence/<class>/<image stem>txt     rupy's script: the name is the stem + "txt", with no dot
      sentence/<class>/<image stem>.txt    (or sentences/ or texts/): one sentence a line

Also read: the flat variant, ``Images/<image>.jpg`` + ``Sentences/<image stem>.txt`` with no class folders
(then ``labels`` are the image indices and ``label_names`` is None). Class folders are named as on the
dataset's page (``aeroplane``, ``bicycle``, ..., ``tvmonitor``); rupy's ``correspondence.csv`` is not needed.
With ``image_root``, images are looked for in ``image_root/<class>/`` and then directly in ``image_root``.

Images and captions are ordered by class folder name, then image stem. ``labels`` are class indices into
``label_names`` (the sorted class folder names of the sentence folder). The dataset has no split: every
image is in ``train`` and nothing random is drawn (``meta["splits"]`` says so); the BITR protocol's ten
partitions come from :func:`crossview.engine.splits.fold_splits`. A sentence file without an image, an image
without a sentence file and an empty line are skipped and counted in the warnings.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.data.readers._common import check_images_exist, detector, reader
from crossview.data.readers._common import image_index, read_caption_files, safe_resolve
from crossview.core.errors import DatasetError

#: Sentence folders, tried in order (rupy's script, its forks, another downloader, the flat variant).
SENTENCE_DIRS = ("sentence", "sentences", "texts", "Sentences")
#: Image folders, tried in order.
IMAGE_DIRS = ("dataset", "images", "Images")
NO_SPLIT = "none in the dataset: all images are in 'train' (the paper's ten folds: engine.splits.fold_splits)"


def _caption_stem(name: str) -> str | None:
    """The image stem of a sentence file name (``a.txt`` or rupy's ``atxt``), None for other files."""
    if name.lower().endswith(".txt"):
        return name[:-4] or None
    if name.endswith("txt") and not name.startswith("."):
        return name[:-3] or None
    return None


def _has_sentence_files(folder: Path, limit: int = 50) -> bool:
    """Whether a sentence file is among the first ``limit`` entries of ``folder`` or of its first few
    class folders (a cheap look for detection)."""
    subdirs = []
    with os.scandir(folder) as entries:
        for _, entry in zip(range(limit), entries):
            if entry.is_dir():
                subdirs.append(entry.path)
            elif _caption_stem(entry.name) is not None:
                return True
    for sub in subdirs[:3]:
        with os.scandir(sub) as entries:
            if any(_caption_stem(e.name) is not None for _, e in zip(range(limit), entries)):
                return True
    return False


def _sentence_dir(root: Path) -> Path | None:
    return next((root / d for d in SENTENCE_DIRS if (root / d).is_dir()), None)


@detector
def detect(path: Path) -> bool:
    if not path.is_dir() or not any((path / d).is_dir() for d in IMAGE_DIRS):
        return False
    text_dir = _sentence_dir(path)
    return text_dir is not None and _has_sentence_files(text_dir)


def _caption_files(folder: Path) -> list[tuple[str, Path]]:
    """(image stem, sentence file) of the entries of ``folder`` named like sentence files, by stem (one that
    is not a regular file is an error when it is read)."""
    found: dict[str, Path] = {}
    for f in sorted(folder.iterdir()):  # "a.txt" sorts before "atxt": the first kept if both are there
        stem = _caption_stem(f.name)
        if stem is not None:
            found.setdefault(stem, f)
    return sorted(found.items())


@reader
def read(path: Path, image_root: Path | None = None) -> PairedDataset:
    """Reads a Pascal Sentences root (the folder holding ``sentence/`` and ``dataset/``)."""
    root = safe_resolve(path)
    text_dir = _sentence_dir(root)
    if text_dir is None:
        raise DatasetError(f"no {', '.join(d + '/' for d in SENTENCE_DIRS)} folder", root,
                           hint="Give the folder that holds sentence/<class>/ and dataset/<class>/")
    class_dirs = sorted(d for d in text_dir.iterdir() if d.is_dir() and not d.name.startswith("."))
    classes = {d.name: j for j, d in enumerate(class_dirs)}
    if image_root is not None:
        base = safe_resolve(image_root)
        if not base.is_dir():
            raise DatasetError("image root is not a folder", base, hint="Pass --image-root FOLDER")
    else:
        base = next((root / d for d in IMAGE_DIRS if (root / d).is_dir()), None)
        if base is None:
            raise DatasetError(f"no {', '.join(d + '/' for d in IMAGE_DIRS)} image folder", root,
                               hint="Put the images in dataset/<class>/, or pass --image-root FOLDER")
    nested, flat = image_index(base)

    # One entry per sentence file: (file, class or None, image path found or expected).
    entries: list[tuple[Path, str | None, str]] = []
    if class_dirs:
        for d in class_dirs:
            for stem, f in _caption_files(d):
                found = nested.get((d.name, stem)) or flat.get(stem)
                entries.append((f, d.name, str(found or base / d.name / f"{stem}.jpg")))
    else:
        by_stem = {**{stem: p for (_, stem), p in nested.items()}, **flat}
        for stem, f in _caption_files(text_dir):
            entries.append((f, None, str(by_stem.get(stem) or base / f"{stem}.jpg")))
    if not entries:
        raise DatasetError("no sentence files", text_dir, hint="Expected sentence/<class>/<image>.txt")
    warnings: list[str] = []
    names = [str(f.relative_to(root)) for f, _, _ in entries]
    exists = check_images_exist([e[2] for e in entries], text_dir, base, names, warnings)

    kept, captions, cap_img = read_caption_files(entries, exists, warnings, "sentence")
    paths = [image for _, _, image in kept]
    labels = [classes[cls] if cls is not None else i for i, (_, cls, _) in enumerate(kept)]
    if not paths:
        raise DatasetError("no image with both a file and a sentence remains", root)
    used = {e[2] for e in entries}
    n_orphans = sum(1 for p in (*nested.values(), *flat.values()) if str(p) not in used)
    if n_orphans:
        warnings.append(f"skipped {n_orphans} image(s) in {base} with no sentence file in {text_dir.name}/")
    return PairedDataset(
        name="pascal-sentences",
        captions=captions,
        caption_image=np.asarray(cap_img, dtype=np.int64),
        image_paths=paths,
        labels=np.asarray(labels, dtype=np.int64),
        label_names=list(classes) if classes else None,
        splits={"train": np.arange(len(paths), dtype=np.int64)},
        source=str(root),
        format="pascal-sentences",
        warnings=warnings,
        meta={"image_root": str(base), "layout": "class folders" if classes else "flat", "splits": NO_SPLIT},
    )
