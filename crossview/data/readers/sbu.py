"""The SBU Captioned Photo Dataset (Ordonez et al., NIPS 2011, "Im2Text"): 1M Flickr photos with their
owners' captions. Read from the folder that holds (as unpacked from ``SBUCaptionedPhotoDataset.tar.gz``,
also when given its parent, which holds ``dataset/``)::

    SBU_captioned_photo_dataset_urls.txt       one photo URL a line
    SBU_captioned_photo_dataset_captions.txt   one caption a line: line i describes the photo of URL line i

or ``sbu-captions-all.json`` (``sbu-captions-all.tar.gz``: ``{"image_urls": [...], "captions": [...],
"user_ids": [...]}``, lists in the same order). Either text file, or the JSON, may also be given itself.

Only the photos already on disk are read; nothing is downloaded. They are looked for, by the URL's file name
(``http://static.flickr.com/2723/4385058960_b0f291553e.jpg`` -> ``4385058960_b0f291553e.jpg``, or
``2723_4385058960_b0f291553e.jpg`` as some download scripts save them), anywhere under ``image_root``, else
under the first of ``images/``, ``sbu_images/`` or the folder itself. The folder is listed once (no file is
looked up per line), so a million lines take seconds. Photos not on disk are left out and counted in one
warning line; none at all is an error. A URL listed twice gives one image with both captions.

Splits follow Ordonez et al.: 500 test photos, the rest ``train`` (the BITR paper then learns from a random
100K of the training photos; that subset is the experiment's to draw). A ``test.txt`` beside the text files
names the test photos, one a line, as a line number of the URL file (1-based), a file name or a URL. Without
it, ``min(500, n // 10)`` of the ``n`` photos on disk are drawn with ``numpy.random.default_rng(0)``, and the
warnings and ``meta["generated_test_split"]`` say so.

The text files are UTF-8, else read as Latin-1 (with a warning). Lines end at ``\\n`` only, so a line
separator inside a caption cannot shift the pairing; files of different lengths are an error.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.data.readers._common import IMAGE_SUFFIXES, brief, clean_caption, detector, one_line, read_json
from crossview.data.readers._common import read_text, read_text_or_latin1, reader, safe_resolve
from crossview.core.errors import DatasetError

URLS_NAME = "SBU_captioned_photo_dataset_urls.txt"
CAPTIONS_NAME = "SBU_captioned_photo_dataset_captions.txt"
JSON_NAME = "sbu-captions-all.json"
TEST_LIST_NAME = "test.txt"
#: Image folders under the dataset folder, tried in order ("" is the folder itself).
IMAGE_DIRS = ("images", "sbu_images", "")
N_TEST = 500
TEST_SEED = 0


def _holds_sbu(folder: Path) -> bool:
    # lexists, not is_file: a file of that name that is not readable gets the reader's precise error.
    return any(os.path.lexists(folder / n) for n in (URLS_NAME, CAPTIONS_NAME, JSON_NAME))


@detector
def detect(path: Path) -> bool:
    if path.is_dir():
        return _holds_sbu(path) or (path / "dataset").is_dir() and _holds_sbu(path / "dataset")
    return path.name in (URLS_NAME, CAPTIONS_NAME, JSON_NAME)


def _folder(path: Path) -> Path:
    """The folder holding the dataset files."""
    if not path.is_dir():
        return path.parent
    if not _holds_sbu(path) and _holds_sbu(path / "dataset"):
        return path / "dataset"
    return path


def _lines(path: Path, warnings: list[str]) -> list[str]:
    """The lines of a text file, split at ``\\n`` only (a final empty line dropped)."""
    text, latin1 = read_text_or_latin1(path)
    if latin1:
        warnings.append(f"{path.name} is not UTF-8: read as Latin-1 (ISO-8859-1)")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _read_pairs(folder: Path, path: Path, warnings: list[str]) -> tuple[list[str], list[str], Path]:
    """(URLs, captions, the file errors about the pairing name)."""
    json_path = path if path.name == JSON_NAME else folder / JSON_NAME
    if path.name == JSON_NAME or (not os.path.lexists(folder / URLS_NAME) and os.path.lexists(json_path)):
        doc = read_json(json_path)
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), list) for k in ("image_urls", "captions")):
            raise DatasetError("expected a JSON object with 'image_urls' and 'captions' lists", json_path,
                               hint="sbu-captions-all.json holds {\"image_urls\": [...], \"captions\": [...]}")
        urls, caps = doc["image_urls"], doc["captions"]
        if len(urls) != len(caps):
            raise DatasetError(f"{len(urls):,} image_urls but {len(caps):,} captions", json_path,
                               hint="Entry i of one pairs with entry i of the other")
        return [u if isinstance(u, str) else "" for u in urls], caps, json_path
    urls_path, caps_path = folder / URLS_NAME, folder / CAPTIONS_NAME
    for f, other in ((urls_path, caps_path), (caps_path, urls_path)):
        if not os.path.lexists(f):
            raise DatasetError(f"not found, but {other.name} is in its folder", f,
                               hint="Both files of SBUCaptionedPhotoDataset.tar.gz are needed")
    urls, caps = _lines(urls_path, warnings), _lines(caps_path, warnings)
    if len(urls) != len(caps):
        raise DatasetError(f"{len(caps):,} lines, but {URLS_NAME} has {len(urls):,}", caps_path,
                           hint="Line i of one file pairs with line i of the other; use the two files as unpacked")
    return urls, caps, caps_path


def _file_index(folder: Path) -> tuple[dict[str, int], list[str]]:
    """Image file name -> index into the list of folders under ``folder`` (hidden folders skipped); the
    first found wins. One listing of the tree: no file is looked up one by one."""
    index: dict[str, int] = {}
    dirs: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        k = len(dirs)
        dirs.append(dirpath)
        for name in filenames:
            if os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES:
                index.setdefault(name, k)
    return index, dirs


def _url_name(url: str) -> str:
    return url.strip().rpartition("/")[2].partition("?")[0]


def _test_lines(path: Path, urls: list[str]) -> list[int]:
    """0-based line indices named by a test list: line numbers, file names or URLs."""
    by_name: dict[str, int] | None = None
    out: list[int] = []
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        entry = line.strip()
        if not entry:
            continue
        if entry.isdigit() and entry.isascii():
            i = int(entry) - 1
            if not 0 <= i < len(urls):
                raise DatasetError(f"line number {brief(entry)} is not in 1..{len(urls):,}", path, f"line {lineno}",
                                   hint="Name each test photo by its line in the URL file, its file name or its URL")
        else:
            if by_name is None:
                by_name = {}
                for j, url in enumerate(urls):
                    by_name.setdefault(_url_name(url), j)
            i = by_name.get(_url_name(entry), -1)
            if i < 0:
                raise DatasetError(f"unknown photo {brief(entry)} (no URL of that file name)", path, f"line {lineno}",
                                   hint="Name each test photo by its line in the URL file, its file name or its URL")
        out.append(i)
    return out


@reader
def read(path: Path, image_root: Path | None = None) -> PairedDataset:
    """Reads the SBU captions with the photos on disk (the folder, either text file, or the JSON)."""
    path = safe_resolve(path)
    folder = _folder(path)
    warnings: list[str] = []
    urls, caps, source = _read_pairs(folder, path, warnings)
    if not urls:
        raise DatasetError("no photos listed (the file is empty)", source)
    if image_root is not None:
        base = safe_resolve(image_root)
        if not base.is_dir():
            raise DatasetError("image root is not a folder", base, hint="Pass --image-root FOLDER")
    else:
        base = next(folder / d for d in IMAGE_DIRS if (folder / d).is_dir())
    index, dirs = _file_index(base)

    paths: list[str] = []
    captions: list[str] = []
    cap_img: list[int] = []
    image_of_line = np.full(len(urls), -1, dtype=np.int64)
    position: dict[str, int] = {}
    n_missing = n_empty = n_repeat = 0
    for i, (url, cap) in enumerate(zip(urls, caps)):
        name = _url_name(url)
        where = index.get(name)
        if where is None:  # saved as <server>_<name> by some download scripts
            server = url.strip().rpartition("/")[0].rpartition("/")[2]
            name = f"{server}_{name}"
            where = index.get(name)
        if where is None:
            n_missing += 1
            continue
        caption = clean_caption(cap)
        if caption is None:
            n_empty += 1
            continue
        j = position.get(name)
        if j is None:
            j = position[name] = len(paths)
            paths.append(os.path.join(dirs[where], name))
        else:
            n_repeat += 1
        captions.append(caption)
        cap_img.append(j)
        image_of_line[i] = j
    if n_missing == len(urls):
        raise DatasetError(f"none of the {len(urls):,} photos it lists are on disk under {one_line(str(base))} "
                           f"(first: {brief(_url_name(urls[0]))})", source,
                           hint="Point --image-root at the folder of the downloaded photos, named as in the URLs")
    if n_missing:
        warnings.append(f"{n_missing:,} of {len(urls):,} images are not on disk; they are left out")
    if n_empty:
        warnings.append(f"skipped {n_empty:,} photo(s) on disk with an empty caption")
    if n_repeat:
        warnings.append(f"{n_repeat:,} line(s) name a photo already listed; their captions were added to it")
    if not paths:
        raise DatasetError("no photo with both a file and a caption remains", source)

    meta: dict = {"image_root": str(base), "lines": len(urls)}
    n = len(paths)
    test_list = folder / TEST_LIST_NAME
    if os.path.lexists(test_list):
        named = _test_lines(test_list, urls)
        on_disk = image_of_line[named]
        n_absent = int((on_disk < 0).sum())
        if n_absent:
            warnings.append(f"{n_absent:,} of the {len(named):,} test photos of {TEST_LIST_NAME} are not on disk "
                            "(or have an empty caption)")
        test = np.unique(on_disk[on_disk >= 0])
        meta["test_list"] = str(test_list)
    else:
        n_test = min(N_TEST, n // 10)
        test = np.sort(np.random.default_rng(TEST_SEED).choice(n, size=n_test, replace=False))
        if n_test:
            warnings.append(f"no {TEST_LIST_NAME}: drew {n_test:,} of the {n:,} photos on disk as 'test' "
                            f"(numpy default_rng({TEST_SEED})); the rest are 'train'")
            meta.update(generated_test_split=True, test_seed=TEST_SEED)
        else:
            warnings.append(f"no {TEST_LIST_NAME}, and {n} photo(s) on disk are too few to hold out a test "
                            "split: all are in 'train'")
    train = np.setdiff1d(np.arange(n, dtype=np.int64), test)
    splits = {name: idx for name, idx in (("train", train), ("test", test)) if len(idx)}
    return PairedDataset(
        name="sbu",
        captions=captions,
        caption_image=np.asarray(cap_img, dtype=np.int64),
        image_paths=paths,
        splits=splits,
        source=str(source),
        format="sbu",
        warnings=warnings,
        meta=meta,
    )
