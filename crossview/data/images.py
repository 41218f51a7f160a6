"""Opening images with errors a user can act on, and checking a whole dataset's image files."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Callable, Sequence

from PIL import Image, UnidentifiedImageError

from crossview.data.readers._common import one_line, read_bytes
from crossview.core.errors import DatasetError


def open_image(path: str | Path, mode: str = "RGB") -> Image.Image:
    """Decodes an image fully (so truncation is caught here, not later) and converts it to ``mode``.

    Raises DatasetError naming the file when it is missing, not a regular file (a FIFO would block),
    not an image, too large to decode (Pillow's decompression-bomb limit), truncated or corrupt.
    """
    path = Path(path)
    try:
        data = read_bytes(path)  # refuses a FIFO or device before opening it
    except DatasetError as e:
        if "not found" in e.problem:
            raise DatasetError("image file not found", path) from None
        raise
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return im.convert(mode) if im.mode != mode else im.copy()
    except Exception as e:  # noqa: BLE001 - Pillow's decoders raise many types on damaged files
        raise DatasetError(image_problem(e), path, hint=_HINTS[problem_kind(e)]) from None


_HINTS = {"unknown": "Remove it from the dataset or replace it", "large": "Resize it, or remove it from the dataset",
          "damaged": "The file may be truncated or corrupt; re-copy it"}


def problem_kind(e: BaseException) -> str:
    """``"unknown"`` (not an image format Pillow knows), ``"large"`` (over the decompression-bomb limit, or out of
    memory) or ``"damaged"`` (anything else: truncated, corrupt) for what Pillow raised."""
    if isinstance(e, UnidentifiedImageError):
        return "unknown"
    if isinstance(e, (Image.DecompressionBombError, MemoryError)):
        return "large"
    return "damaged"


def image_problem(e: BaseException) -> str:
    """A few words on why Pillow could not open or decode an image, for a one-line error that names the file.

    Every place that opens an image catches ``Exception`` and says this: Pillow raises ``OSError`` (and its
    ``UnidentifiedImageError``), but also ``ValueError``, ``SyntaxError``, ``struct.error`` and others on damaged
    files, and ``DecompressionBombError`` (an ``Exception`` of its own, not an ``OSError``) on an image whose header
    declares more than twice ``Image.MAX_IMAGE_PIXELS`` pixels.
    """
    if isinstance(e, Image.DecompressionBombError):
        return f"image too large to decode ({one_line(str(e), 120)})"
    if isinstance(e, MemoryError):
        return "image too large to decode in memory"
    if isinstance(e, UnidentifiedImageError):
        return "not an image file Pillow can read"
    return f"unreadable image ({type(e).__name__}: {one_line(str(e), 120)})"


def too_many_pixels(height: int, width: int) -> bool:
    """Whether Pillow would refuse an image of ``height x width`` as a decompression bomb (more than twice
    ``Image.MAX_IMAGE_PIXELS``): a decoder without that limit (libjpeg-turbo, nvJPEG) must not be handed it."""
    limit = Image.MAX_IMAGE_PIXELS
    return limit is not None and int(height) * int(width) > 2 * int(limit)


def verify_images(paths: Sequence[str], progress: Callable[[int, int], None] | None = None,
                  should_stop: Callable[[], bool] | None = None) -> list[tuple[int, str]]:
    """Decodes every image; returns ``(index, problem)`` for each one that fails (empty when all are fine)."""
    bad: list[tuple[int, str]] = []
    n = len(paths)
    for i, p in enumerate(paths):
        if should_stop is not None and should_stop():
            break
        try:
            open_image(p).close()
        except DatasetError as e:
            bad.append((i, str(e)))
        if progress is not None and (i + 1 == n or (i + 1) % 100 == 0):
            progress(i + 1, n)
    return bad
