"""Results from a photo-folder gallery (issue 30): what a mark on them is keyed by, the line that says there is no
ground truth, and opening a photo with the system's viewer.

A photo's index in its folder shifts when photos are added, so a mark on a photo result is kept under the
folder and the photo's path (:meth:`crossview.engine.annotations.AnnotationStore.marks_by_path`), and read
back onto whatever index the photo has now. The Query panel (:mod:`crossview.gui.panels.query_panel`) calls
these; the results grid itself is :class:`~crossview.gui.results_view.ResultsView`'s image grid, which shows each
photo's rank, score and file name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices

__all__ = ["is_photo_gallery", "mark_query", "result_marks", "no_ground_truth_line", "open_photo", "IMAGE_SUFFIXES"]

#: what a dropped file must end with to be queried as an image (the photo folder's kinds, and BMP)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


def is_photo_gallery(retriever: Any) -> bool:
    """Whether ``retriever`` ranks a photo folder (no captions, no ground truth)."""
    return retriever is not None and getattr(retriever, "photos", None) is not None


def mark_query(retriever: Any, query: dict[str, Any]) -> dict[str, Any]:
    """The query a mark is saved under: ``query`` plus ``"photos": <folder>`` on a photo gallery."""
    if is_photo_gallery(retriever):
        return {**query, "photos": str(retriever.photos.root)}
    return dict(query)


def result_marks(store: Any, retriever: Any, ranking: Any) -> dict[int, bool]:
    """``{item: relevant}`` of ``ranking``'s query in ``store`` (None: no marks), a photo gallery's marks found by
    path and given the photos' current indices."""
    if store is None or ranking is None:
        return {}
    query = mark_query(retriever, ranking.query)
    if not is_photo_gallery(retriever):
        return store.marks_for(ranking.direction, query)
    by_path = store.marks_by_path(ranking.direction, query)
    if not by_path:
        return {}
    folder = retriever.photos
    index = {str(folder.root / rel): i for i, rel in enumerate(folder.relative_paths)}
    return {index[p]: v for p, v in by_path.items() if p in index}


def no_ground_truth_line(n_photos: int) -> str:
    """The one line a photo-gallery query shows where others show ground-truth ranks."""
    return (f"No ground truth: {n_photos:,} of your own photos ranked (no captions, so no R@K); "
            "double-click a photo to open it")


def open_photo(path: str | Path) -> bool:
    """Open ``path`` with the system's image viewer; False when the system has none for it."""
    return bool(QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))))
