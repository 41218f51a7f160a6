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
    except UnidentifiedImageError:
        raise DatasetError("not an image file Pillow can read", path,
                           hint="Remove it from the dataset or replace it") from None
    except Image.DecompressionBombError as e:
        raise DatasetError(f"image too large to decode ({one_line(str(e), 120)})", path,
                           hint="Resize it, or remove it from the dataset") from None
    except MemoryError:
        raise DatasetError("image too large to decode in memory", path,
                           hint="Resize it, or remove it from the dataset") from None
    except Exception as e:  # noqa: BLE001 - Pillow's decoders raise many types on damaged files
        raise DatasetError(f"unreadable image ({type(e).__name__}: {one_line(str(e), 120)})", path,
                           hint="The file may be truncated or corrupt; re-copy it") from None


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
