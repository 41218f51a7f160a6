"""The IAPR TC-12 benchmark (Grubinger et al., 2006): 20,000 photos, each with a description of up to 5
sentences, as unpacked from ``iaprtc12.tgz``::

    ROOT/
      images/<NN>/<id>.jpg
      annotations_complete_eng/<NN>/<id>.eng     (or annotations/<NN>/<id>.eng; the first one found wins)

Each ``.eng`` file is an SGML record, ISO-8859-1 (Latin-1) in the original distribution (UTF-8 is read
too)::

    <DOC>
    <DOCNO>annotations/02/2808.eng</DOCNO>
    <TITLE>...</TITLE>
    <DESCRIPTION>a man on a dry slope with a few dry tussocks; a lake and a brown, bald mountain landscape in the background;</DESCRIPTION>
    <NOTES>...</NOTES> <LOCATION>...</LOCATION> <DATE>...</DATE>
    <IMAGE>images/02/2808.jpg</IMAGE>
    <THUMBNAIL>thumbnails/02/2808.jpg</THUMBNAIL>
    </DOC>

The elements are found by pattern, not by an XML parser (some records are not well-formed XML). Each image
has one caption, its DESCRIPTION (as in the BITR paper): the sentences, split at ``;``, joined with ``"; "``
(the last ``;`` dropped), so ``caption.split("; ")`` gives them back. The image is the ``<IMAGE>`` path
relative to ROOT (else ``images/<NN>/<id>.jpg``); with ``image_root``, that path less its ``images/`` is
looked for under ``image_root``. Images are ordered by folder, then id.

Labels of the image-annotation work (Makadia et al. 2008; Guillaumin et al. 2009, TagProp), from
``iaprtc12.20091111.tar.bz2``, read when in ROOT, in ``ROOT/iaprtc12.20091111/`` or in a folder of that
name beside ROOT: ``iaprtc12_dictionary.txt`` (291 words, one a line), ``iaprtc12_train_list.txt`` /
``iaprtc12_test_list.txt`` (17,665 / 1,962 images as ``<NN>/<id>``, one a line) and
``iaprtc12_{train,test}_annot.hvecs`` (LEAR's binary rows: a uint16 width, then that many uint16 0/1
values) or the same rows as text (``_annot.txt`` / ``_annot.csv``: 0/1 separated by spaces or commas).
The lists give the ``train`` / ``test`` splits (other annotated images are left out, with a warning:
19,627 in all); the rows give ``label_sets`` and ``tags`` (the words of each image). Without these files
every image is in ``train``, nothing random is drawn, and ``meta["splits"]`` says so.

Errors name the file (and line): a record without ``<DESCRIPTION>``, a list naming an image that has no
``.eng`` file, a label row of the wrong width, a row count that does not match its list. An empty
description or a missing image file is skipped and counted in the warnings.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.data.readers._common import brief, check_images_exist, clean_caption, detector, read_bytes
from crossview.data.readers._common import one_line, read_text, read_text_or_latin1, reader, relative_to_root
from crossview.data.readers._common import safe_resolve
from crossview.core.errors import DatasetError

#: Annotation folders, in order of preference.
ANNOTATION_DIRS = ("annotations_complete_eng", "annotations")
#: The folder the LEAR label files unpack into (looked for inside ROOT and beside it).
LABEL_DIR = "iaprtc12.20091111"
DICTIONARY = "iaprtc12_dictionary.txt"
LIST = "iaprtc12_{}_list.txt"
ANNOT = "iaprtc12_{}_annot"
ANNOT_SUFFIXES = (".hvecs", ".txt", ".csv")
SPLITS = ("train", "test")
NO_SPLIT = ("none in the dataset: all images are in 'train' (the paper's ten folds: engine.splits.fold_splits); "
            f"the {LIST.format('train')} / {LIST.format('test')} of TagProp give train / test")

_ELEMENT = {tag: re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL | re.IGNORECASE) for tag in ("DESCRIPTION", "IMAGE")}


def _has_eng(folder: Path, limit: int = 50) -> bool:
    """Whether one of the first few ``<NN>/`` folders of ``folder`` holds a ``.eng`` file (cheap)."""
    with os.scandir(folder) as entries:
        subdirs = [e.path for _, e in zip(range(limit), entries) if e.is_dir()]
    for sub in subdirs[:3]:
        with os.scandir(sub) as entries:
            if any(e.name.lower().endswith(".eng") for _, e in zip(range(limit), entries)):
                return True
    return False


@detector
def detect(path: Path) -> bool:
    if not path.is_dir():
        return False
    if path.name in ANNOTATION_DIRS:
        path = path.parent
    if (path / ANNOTATION_DIRS[0]).is_dir():
        return True
    return (path / "images").is_dir() and (path / ANNOTATION_DIRS[1]).is_dir() and _has_eng(path / ANNOTATION_DIRS[1])


def _natural(key: str) -> tuple:
    folder, _, stem = key.rpartition("/")
    return (folder, int(stem) if stem.isascii() and stem.isdigit() else float("inf"), stem)


def _annotation_files(root: Path) -> tuple[dict[str, Path], Path]:
    """``<NN>/<id>`` -> its ``.eng`` file, in natural order, and the first annotation folder."""
    folders = [root / d for d in ANNOTATION_DIRS if (root / d).is_dir()]
    if not folders:
        raise DatasetError(f"no {ANNOTATION_DIRS[0]}/ (or {ANNOTATION_DIRS[1]}/) folder", root,
                           hint="Give the iaprtc12 folder that holds images/ and annotations_complete_eng/")
    found: dict[str, Path] = {}
    for folder in folders:
        for sub in sorted(d for d in folder.iterdir() if d.is_dir()):
            for f in sub.iterdir():
                if f.suffix.lower() == ".eng":
                    found.setdefault(f"{sub.name}/{f.stem}", f)
    if not found:
        raise DatasetError("no .eng annotation files", folders[0], hint="Expected annotations_complete_eng/<NN>/<id>.eng")
    return {k: found[k] for k in sorted(found, key=_natural)}, folders[0]


def _label_dir(root: Path) -> Path | None:
    """The first folder holding the TagProp list files (or the dictionary), None when there is none."""
    for folder in (root, root / LABEL_DIR, root.parent / LABEL_DIR):
        if any(os.path.lexists(folder / name) for name in (LIST.format("train"), LIST.format("test"), DICTIONARY)):
            return folder
    return None


def _list_key(entry: str) -> str:
    """``00/25``, ``images/00/25.jpg`` or ``00/25.jpg`` -> ``00/25``."""
    entry = entry.strip().replace("\\", "/").removeprefix("./").removeprefix("images/")
    return entry[:-4] if entry.lower().endswith((".jpg", ".eng")) else entry


def _read_list(path: Path, known: dict[str, Path], ann_dir: Path) -> list[tuple[int, str]]:
    """(line number, image key) of each non-blank line of a TagProp list."""
    keys: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        key = _list_key(line)
        if key not in known:
            raise DatasetError(f"unknown image {brief(line.strip())} (no {ann_dir.name}/{one_line(key, 80)}.eng)", path,
                               f"line {lineno}", hint="Each line names an annotated image as <NN>/<id>, e.g. 00/25")
        if key in seen:
            raise DatasetError(f"image {brief(key)} is also on line {seen[key]}", path, f"line {lineno}",
                               hint="List each image once")
        seen[key] = lineno
        keys.append((lineno, key))
    if not keys:
        raise DatasetError("the list is empty", path, hint="One image a line, as <NN>/<id>")
    return keys


def _read_dictionary(path: Path) -> list[str]:
    words: list[str] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        word = " ".join(line.split())
        if not word:
            continue
        if word in seen:
            raise DatasetError(f"the word {brief(word)} is also on line {seen[word]}", path, f"line {lineno}")
        seen[word] = lineno
        words.append(word)
    if not words:
        raise DatasetError("the dictionary is empty", path, hint="One label word a line (291 in TagProp's)")
    return words


def _read_hvecs(path: Path, width: int) -> np.ndarray:
    """LEAR's ``.hvecs``: rows of a little-endian uint16 width followed by that many uint16 values."""
    data = read_bytes(path)
    if len(data) < 2:
        raise DatasetError("the file is empty" if not data else "the file is truncated", path)
    d = int.from_bytes(data[:2], "little")
    row_bytes = 2 * (d + 1)
    if len(data) % row_bytes:
        raise DatasetError(f"{len(data):,} bytes are not a whole number of rows of {d} values (truncated, or "
                           "not an .hvecs file)", path)
    rows = np.frombuffer(data, dtype="<u2").reshape(-1, d + 1)
    bad = np.flatnonzero(rows[:, 0] != d)
    if len(bad):
        raise DatasetError(f"row {bad[0] + 1} has {rows[bad[0], 0]} values, row 1 has {d}", path)
    if d != width:
        raise DatasetError(f"rows of {d} values, but the dictionary has {width} words", path, "row 1",
                           hint=f"Use the {DICTIONARY} that comes with these label files")
    values = rows[:, 1:]
    bad = np.argwhere(values > 1)
    if len(bad):
        r, c = bad[0]
        raise DatasetError(f"value {values[r, c]} in column {c + 1} (labels are 0 or 1)", path, f"row {r + 1}")
    return values.astype(bool)


def _binary(token: str, path: Path, lineno: int, col: int) -> str:
    try:
        value = float(token)
    except ValueError:
        value = None
    if value not in (0.0, 1.0):
        raise DatasetError(f"{brief(token)} in column {col} (labels are 0 or 1)", path, f"line {lineno}")
    return "1" if value else "0"


def _read_annot_text(path: Path, width: int) -> np.ndarray:
    """Rows of 0/1 separated by spaces, tabs or commas, one image a line."""
    rows: list[list[str]] = []
    for lineno, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        tokens = line.replace(",", " ").split()
        if len(tokens) != width:
            raise DatasetError(f"{len(tokens)} values, but the dictionary has {width} words", path, f"line {lineno}",
                               hint="Each line holds one 0/1 value per dictionary word")
        if not {"0", "1"}.issuperset(tokens):
            tokens = [_binary(t, path, lineno, col) for col, t in enumerate(tokens, start=1)]
        rows.append(tokens)
    if not rows:
        raise DatasetError("the file is empty", path, hint="One line of 0/1 values per image of the list")
    return np.array(rows, dtype="U1") == "1"


def _read_labels(folder: Path, known: dict[str, Path], ann_dir: Path) -> tuple[dict[str, str], dict[str, list[str]] | None]:
    """The TagProp files: image key -> split, and image key -> its words (None without the dictionary)."""
    lists = {s: folder / LIST.format(s) for s in SPLITS}
    for s, f in lists.items():
        if not os.path.lexists(f):
            other = lists["test" if s == "train" else "train"]
            raise DatasetError(f"not found, but {other.name if os.path.lexists(other) else DICTIONARY} is in its "
                               "folder", f, hint="Unpack all of iaprtc12.20091111.tar.bz2 there")
    split_of: dict[str, str] = {}
    keys_of: dict[str, list[str]] = {}
    for s, f in lists.items():
        entries = _read_list(f, known, ann_dir)
        for lineno, key in entries:
            if key in split_of:
                raise DatasetError(f"image {brief(key)} is also in {lists['train'].name}", f, f"line {lineno}",
                                   hint="An image is in the train list or in the test list, not both")
            split_of[key] = s
        keys_of[s] = [key for _, key in entries]
    annots = {s: next((folder / (ANNOT.format(s) + x) for x in ANNOT_SUFFIXES
                       if os.path.lexists(folder / (ANNOT.format(s) + x))), None) for s in SPLITS}
    dictionary = folder / DICTIONARY
    if not os.path.lexists(dictionary):
        if any(annots.values()):
            raise DatasetError("not found: the label rows cannot be read without it", dictionary,
                               hint="Unpack all of iaprtc12.20091111.tar.bz2 there")
        return split_of, None
    words = np.array(_read_dictionary(dictionary), dtype=object)
    label_sets: dict[str, list[str]] = {}
    for s in SPLITS:
        f = annots[s]
        if f is None:
            raise DatasetError(f"not found (nor {ANNOT.format(s)}.txt / .csv), but {DICTIONARY} is in its folder",
                               folder / (ANNOT.format(s) + ".hvecs"), hint="Unpack all of iaprtc12.20091111.tar.bz2 there")
        rows = _read_hvecs(f, len(words)) if f.suffix == ".hvecs" else _read_annot_text(f, len(words))
        if len(rows) != len(keys_of[s]):
            raise DatasetError(f"{len(rows):,} label rows for the {len(keys_of[s]):,} images of {lists[s].name}", f,
                               hint="Row i holds the labels of line i of the list")
        for key, row in zip(keys_of[s], rows):
            label_sets[key] = words[row].tolist()
    return split_of, label_sets


def _read_record(path: Path) -> tuple[str | None, str | None, bool]:
    """(caption or None when the description is empty, the <IMAGE> path or None, read as Latin-1)."""
    text, latin1 = read_text_or_latin1(path)
    m = _ELEMENT["DESCRIPTION"].search(text)
    if m is None:
        raise DatasetError("no <DESCRIPTION> element", path,
                           hint="An IAPR TC-12 record holds <DESCRIPTION>...</DESCRIPTION>")
    sentences = [s for s in (clean_caption(p) for p in m.group(1).split(";")) if s]
    image = _ELEMENT["IMAGE"].search(text)
    image_rel = image.group(1).strip() if image and image.group(1).strip() else None
    return ("; ".join(sentences) or None), image_rel, latin1


@reader
def read(path: Path, image_root: Path | None = None) -> PairedDataset:
    """Reads an IAPR TC-12 root (the folder holding ``images/`` and ``annotations_complete_eng/``)."""
    root = safe_resolve(path)
    if root.name in ANNOTATION_DIRS:
        root = root.parent
    records, ann_dir = _annotation_files(root)
    warnings: list[str] = []
    meta: dict = {}
    label_dir = _label_dir(root)
    label_sets_of: dict[str, list[str]] | None = None
    if label_dir is None:
        split_of = dict.fromkeys(records, "train")
        meta["splits"] = NO_SPLIT
    else:
        split_of, label_sets_of = _read_labels(label_dir, records, ann_dir)
        n_out = len(records) - len(split_of)
        if n_out:
            warnings.append(f"{n_out:,} of {len(records):,} annotated images are in neither {LIST.format('train')} "
                            f"nor {LIST.format('test')} and were left out")
        meta.update(splits=f"{LIST.format('train')} / {LIST.format('test')}", labels_dir=str(label_dir))
    keys = [k for k in records if k in split_of]

    if image_root is not None:
        base = safe_resolve(image_root)
        if not base.is_dir():
            raise DatasetError("image root is not a folder", base, hint="Pass --image-root FOLDER")
    else:
        base = root
    parsed = [_read_record(records[k]) for k in keys]
    image_paths = []
    for key, (_, image_rel, _) in zip(keys, parsed):
        rel = image_rel or f"images/{key}.jpg"
        image_paths.append(relative_to_root(base, rel.removeprefix("images/") if image_root is not None else rel))
    names = [str(records[k].relative_to(root)) for k in keys]
    exists = check_images_exist(image_paths, ann_dir, base, names, warnings)

    paths: list[str] = []
    captions: list[str] = []
    label_sets: list[list[str]] = []
    splits: dict[str, list[int]] = {}
    n_empty = 0
    for key, (caption, _, _), image, ok in zip(keys, parsed, image_paths, exists):
        if not ok:
            continue
        if caption is None:
            n_empty += 1
            continue
        splits.setdefault(split_of[key], []).append(len(paths))
        paths.append(image)
        captions.append(caption)
        if label_sets_of is not None:
            label_sets.append(label_sets_of[key])
    if n_empty:
        warnings.append(f"skipped {n_empty} image(s) whose <DESCRIPTION> is empty")
    if not paths:
        raise DatasetError("no image with both a file and a description remains", root)
    n_latin1 = sum(p[2] for p in parsed)
    meta.update(image_root=str(base), annotations=str(ann_dir), latin1_files=n_latin1, sentence_separator="; ")
    return PairedDataset(
        name="iapr-tc12",
        captions=captions,
        caption_image=np.arange(len(paths), dtype=np.int64),
        image_paths=paths,
        label_sets=label_sets if label_sets_of is not None else None,
        tags=[list(s) for s in label_sets] if label_sets_of is not None else None,
        splits={k: np.asarray(v, dtype=np.int64) for k, v in splits.items()},
        source=str(root),
        format="iapr-tc12",
        warnings=warnings,
        meta=meta,
    )
