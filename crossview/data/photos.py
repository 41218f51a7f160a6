"""A folder of one's own photos as a gallery: images with no captions, searched by sentence (issue 30).

:func:`load_photo_folder` scans a folder recursively for ``.jpg`` / ``.jpeg`` / ``.png`` / ``.webp`` files
(any case), skipping hidden files and folders (a name starting with ``.``), and gives a :class:`PhotoFolder`:
the folder and its photos' paths relative to it, sorted, so a photo's index is stable while the folder is
unchanged. Like :class:`~crossview.data.dataset.TextCorpus` it is a gallery of one modality only; a trained
run ranks its photos for a sentence (:class:`crossview.engine.retriever.Retriever`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from crossview.core.errors import DatasetError
from crossview.core.hashing import utf8_bytes

__all__ = ["PHOTO_SUFFIXES", "PhotoFolder", "load_photo_folder"]

#: The file endings (compared lower-cased) of the photos a folder gallery holds.
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
_WHAT = "a folder of photos (.jpg, .jpeg, .png or .webp, in it or in its subfolders)"


@dataclass(frozen=True)
class PhotoFolder:
    """The photos under ``root``: ``relative_paths`` (POSIX style, relative to ``root``, sorted)."""

    name: str
    root: Path
    relative_paths: tuple[str, ...]
    format: str = "photos"
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def n_images(self) -> int:
        return len(self.relative_paths)

    @property
    def image_paths(self) -> list[str]:
        """The photos' absolute paths, in index order."""
        return [str(self.root / rel) for rel in self.relative_paths]

    def path_of(self, i: int) -> Path:
        """The absolute path of photo ``i``."""
        if not 0 <= int(i) < self.n_images:
            raise IndexError(f"photo {i} is not in folder {self.root} ({self.n_images} photos)")
        return self.root / self.relative_paths[int(i)]

    def fingerprint(self) -> str:
        """A hash of the folder and its photo list (not of the files' contents)."""
        h = hashlib.sha256(b"photos\0" + utf8_bytes(str(self.root)))
        for rel in self.relative_paths:
            h.update(b"\0" + utf8_bytes(rel))
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        return f"PhotoFolder({self.name!r}, photos={self.n_images}, root={str(self.root)!r})"


def _is_photo(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(PHOTO_SUFFIXES)


def load_photo_folder(path: str | Path) -> PhotoFolder:
    """The photos under ``path`` (see the module docstring). Raises :class:`~crossview.core.errors.DatasetError`
    (one line naming the folder) when ``path`` is missing, is not a folder, or holds no photos."""
    given = Path(path).expanduser()
    if not given.exists():
        raise DatasetError("no such folder", given, hint=f"Give {_WHAT}")
    if not given.is_dir():
        raise DatasetError("not a folder", given, hint=f"Give {_WHAT}")
    root = given.resolve()
    found: list[str] = []
    # followlinks=False: a link to a folder above would loop; linked files are still taken
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel_folder = Path(folder).relative_to(root)
        for name in files:
            if _is_photo(name) and os.path.isfile(os.path.join(folder, name)):
                found.append((rel_folder / name).as_posix())
    if not found:
        raise DatasetError("no photos in this folder or its subfolders", given,
                           hint=f"Give {_WHAT}; hidden files and folders are skipped")
    return PhotoFolder(name=root.name or str(root), root=root, relative_paths=tuple(sorted(found)))
