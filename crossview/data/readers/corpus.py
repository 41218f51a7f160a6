"""A text-only caption corpus: a UTF-8 ``.txt`` file, one caption a line (the BITR "independent text
corpus", or any extra sentences for a text encoder).

Captions are whitespace-normalised; blank lines are skipped and counted in the warnings. ``tags.txt``
and ``labels.txt`` are not corpora (the webtags and labels readers read them). The result is a
:class:`TextCorpus`, captions in file order.
"""

from __future__ import annotations

from pathlib import Path

from crossview.data.dataset import TextCorpus
from crossview.data.readers._common import clean_caption, detector, read_text, reader, safe_resolve
from crossview.core.errors import DatasetError

#: ``.txt`` files that belong to other readers.
NOT_CORPORA = ("tags.txt", "labels.txt")


@detector
def detect(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".txt" and path.name.lower() not in NOT_CORPORA


@reader
def read(path: Path, image_root: Path | None = None) -> TextCorpus:
    """Reads the corpus; ``image_root`` is ignored (there are no images)."""
    path = safe_resolve(path)
    text = read_text(path)
    if not text:
        raise DatasetError("the file is empty", path, hint="A corpus has one caption a line")
    captions: list[str] = []
    n_blank = 0
    for line in text.splitlines():
        caption = clean_caption(line)
        if caption is None:
            n_blank += 1
        else:
            captions.append(caption)
    if not captions:
        raise DatasetError(f"no caption in the file ({n_blank} blank line(s))", path,
                           hint="A corpus has one caption a line")
    warnings = [f"skipped {n_blank} blank line(s)"] if n_blank else []
    return TextCorpus(name=path.stem, captions=captions, source=str(path), warnings=warnings)
