"""What a query ranks against, in words: the galleries the Query panel offers (each split, all images, a
caption corpus, the photo folders opened: File > Open photo folder...) and the line that names the gallery in use, warning when it holds images the run was trained
on (its ranks are then optimistic and differ from Inspect's, which counts them on the evaluation split).

No Qt: :mod:`crossview.gui.panels.query_panel` puts :func:`gallery_choices` in its gallery combo box and
:func:`gallery_note` in the line under its header.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.text import html_text

__all__ = ["training_images_in", "gallery_note", "gallery_choices", "photos_label", "PHOTOS", "CORPUS"]

PHOTOS = "photos:"      #: a photo folder's gallery choice: ``photos:<folder>`` (``photos:?``: pick a folder)
CORPUS = "corpus:"      #: a caption corpus's gallery choice: ``corpus:<file>`` (``corpus:?``: pick a file)


def photos_label(folder: str | Path, n_photos: int | None = None) -> str:
    """``"Photos: my_photos (312)"``: a photo folder in the gallery box (without the count while unknown)."""
    name = Path(folder).name or str(folder)
    return f"Photos: {name}" + (f" ({n_photos:,})" if n_photos is not None else "")


def training_images_in(retriever: Any, train_split: str | None) -> int:
    """How many of ``retriever``'s gallery images are in ``train_split`` (0 when unknown or a caption corpus)."""
    r = retriever
    if r is None or r.corpus is not None or getattr(r, "photos", None) is not None or not train_split or train_split not in r.dataset.splits:
        return 0
    return int(np.isin(r.gallery_images, np.asarray(r.dataset.splits[train_split])).sum())


def gallery_note(r: Any, eval_split: str | None, train_split: str | None) -> str:
    """Rich text: what ``r`` ranks against, whether that is the run's evaluation split, and a visible warning
    when the gallery holds training images (``eval_split`` / ``train_split``: the run's, None when unknown)."""
    photos = getattr(r, "photos", None)
    if photos is not None:
        text = (f"Ranking against: <b>{html_text(photos_label(photos.root))}</b> ({r.n_gallery_images:,} photos in "
                f"{html_text(str(photos.root))}, text -> image only, no ground truth)")
        if r.photos_skipped:
            text += f"; {len(r.photos_skipped):,} unreadable file{'s' if len(r.photos_skipped) != 1 else ''} skipped"
        return text
    what = f"{r.n_gallery_images:,} images, {r.n_gallery_captions:,} captions" if r.corpus is None else \
        f"{r.n_gallery_captions:,} captions, image -> text only"
    name = "all images" if r.gallery_name == "all" else r.gallery_name
    text = f"Ranking against: <b>{html_text(name)}</b> ({what})"
    if eval_split and r.gallery_name == eval_split:
        text += " - the run's evaluation split (ranks match Inspect)"
    n_train = training_images_in(r, train_split)
    if n_train:
        text += (f"<br><span style='color:#cf222e'><b>Warning:</b> this gallery includes {n_train:,} training "
                 f"images (the run was trained on the {html_text(str(train_split))} split): ranks are "
                 "optimistic and differ from Inspect's")
        if eval_split:
            text += f"; choose the {html_text(eval_split)} split for the run's evaluation gallery"
        text += ".</span>"
    elif eval_split and r.corpus is None and r.gallery_name != eval_split:
        text += (f" - not the run's evaluation split ({html_text(eval_split)}): ranks differ "
                 "from Inspect's")
    return text


def gallery_choices(retriever: Any, eval_split: str | None, train_split: str | None,
                    photo_folders: Sequence[tuple[str, int | None]] = (),
                    loading: tuple[str, str] | None = None) -> tuple[list[tuple[str, str]], str]:
    """``([(label, choice), ...], current choice)``: each split, ``"all"``, the caption corpus in use
    (``"corpus:current"``), ``"corpus:?"`` (pick a file), each of ``photo_folders`` (``(folder, photos or None)``,
    choice ``"photos:<folder>"``) and ``"photos:?"`` (pick a folder); labels say which split is the run's
    evaluation split and which hold training images. ``loading``: ``(label, choice)`` of a gallery being
    prepared, listed first and current (the box says what is loading)."""
    ds = retriever.dataset
    out = []
    for split in ds.split_names:
        label = f"{split} split ({len(ds.splits[split]):,} images)"
        if split == eval_split:
            label += " - the run's evaluation split"
        elif split == train_split:
            label += " - training images"
        out.append((label, split))
    all_label = f"all images ({ds.n_images:,})"
    if train_split and train_split in ds.splits:
        all_label += " - includes training images"
    out.append((all_label, "all"))
    if retriever.corpus is not None:
        out.append((retriever.gallery_name, "corpus:current"))
    out.append(("caption corpus file...", "corpus:?"))
    for folder, n in photo_folders:
        out.append((photos_label(folder, n), PHOTOS + str(folder)))
    out.append(("photo folder...", PHOTOS + "?"))
    photos = getattr(retriever, "photos", None)
    current = "corpus:current" if retriever.corpus is not None else \
        PHOTOS + str(photos.root) if photos is not None else retriever.gallery_name
    if loading is not None:
        out = [loading, *[c for c in out if c[1] != loading[1]]]
        current = loading[1]
    return out, current
