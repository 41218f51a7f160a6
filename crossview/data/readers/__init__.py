"""One reader per dataset format, behind one entry point: :func:`load_dataset`.

Each reader is a small module with ``detect(path) -> bool`` (cheap: looks at names and the first bytes)
and ``read(path, image_root=None) -> PairedDataset | TextCorpus``. A format is detected from the path
where that is unambiguous, or named explicitly (``format=`` / ``--format``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from crossview.data.dataset import PairedDataset, TextCorpus
from crossview.data.readers._common import check_source, guarded, safe_resolve
from crossview.core.errors import DatasetError


@dataclass(frozen=True)
class ReaderInfo:
    name: str
    module: str
    description: str


#: In detection order: the more specific layouts first.
READERS: dict[str, ReaderInfo] = {r.name: r for r in (
    # Before karpathy, which takes any JSON object file: sbu-captions-all.json given by itself.
    ReaderInfo("sbu", "sbu", "SBU Captioned Photo Dataset: the URL and caption files (or sbu-captions-all.json) "
               "with the photos on disk"),
    ReaderInfo("karpathy", "karpathy", "Karpathy split JSON (Flickr8k, Flickr30K, MS-COCO) with an image root"),
    ReaderInfo("cuhk-pedes", "cuhk_pedes", "CUHK-PEDES reid_raw.json (identity ids, 2 captions per image)"),
    ReaderInfo("reed", "reed", "CUB-200 / Oxford-102 Flowers in the Reed et al. layout (images/, text_c10/, class splits)"),
    ReaderInfo("iapr-tc12", "iapr_tc12", "IAPR TC-12: images/ and annotations_complete_eng/ .eng records "
               "(TagProp label lists and rows when present)"),
    ReaderInfo("precomp", "precomp", "VSE++ *_precomp folder ({split}_ims.npy + {split}_caps.txt)"),
    ReaderInfo("folder", "folder", "a folder (or file) with captions.jsonl or captions.csv: image, caption[, label, tags, split]"),
    ReaderInfo("webtags", "webtags", "a web image-tag collection: tags.jsonl / tags.csv / tags.txt (image + tags)"),
    ReaderInfo("labels", "labels", "label / phrase annotations: labels.jsonl / labels.csv / labels.txt (image -> labels)"),
    # After the readers named by a file: a folder of theirs may also hold images/ and sentences/ folders.
    ReaderInfo("pascal-sentences", "pascal_sentences", "UIUC Pascal Sentences: dataset/<class>/ images, "
               "sentence/<class>/ files of 5 sentences"),
    ReaderInfo("corpus", "corpus", "a text-only caption corpus, one caption a line (.txt)"),
)}


def _module(info: ReaderInfo):
    return importlib.import_module(f"crossview.data.readers.{info.module}")


def known_formats() -> list[str]:
    return ["demo", *READERS]


def detect_format(path: Path) -> str:
    """The reader name for ``path``; an error listing the formats when none (or several) match.

    Never blocks and never raises anything but :class:`DatasetError`, whatever ``path`` is.
    """
    with guarded(path):
        check_source(path)
        path = safe_resolve(path)
        for name, info in READERS.items():
            if _module(info).detect(path):
                return name
        raise DatasetError("cannot tell the dataset format from this path", path,
                           hint=f"Name it with --format ({', '.join(READERS)})")


def load_dataset(source: str | Path, format: str | None = None,
                 image_root: str | Path | None = None) -> PairedDataset | TextCorpus:
    """Reads a dataset: ``"demo"`` for the built-in demo, or a file/folder in any supported format.

    Raises :class:`~crossview.core.errors.DatasetError` (one clear line naming the file) on missing or malformed
    input, whatever the input; recoverable problems (a missing image, an empty caption) are skipped and
    counted in ``.warnings``.
    """
    if str(source) == "demo" or format == "demo":
        from crossview.data.demo import load_demo
        return load_demo()
    if format is not None and format not in READERS:
        raise DatasetError(f"unknown dataset format {format!r}", hint=f"Known formats: {', '.join(known_formats())}")
    with guarded(source):
        check_source(source)
        path = safe_resolve(source)
        if format is None:
            format = detect_format(path)
        reader = _module(READERS[format])
        root = None if image_root is None else safe_resolve(image_root)
        return reader.read(path, image_root=root)
