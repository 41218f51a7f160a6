"""The on-disk feature cache: content-addressed, atomic, memory-mapped, self-checking.

A key is the SHA-256 of the canonical JSON of everything that determines an array (ARCHITECTURE.md:
dataset fingerprint, encoder name, weights hash, transform), so the same extraction twice is a hit and
any change of input is a miss; nothing is ever invalidated by hand.

Layout: ``<root>/<key[:2]>/<key>.npy`` holds the array, ``<key>.json`` beside it holds the parts of
the key, the array's shape and dtype, the ``.npy`` file's size and a SHA-256 of its first and last
MiB (cheap even for multi-GB arrays). The ``.npy`` is written first, the ``.json`` last, both through
a temporary file and ``os.replace``, so a crash leaves either a complete entry or none. On load, an
entry whose ``.json`` is missing or unreadable, or whose ``.npy`` disagrees with it (size, header,
shape, dtype, checksum), is deleted and reported as a miss, so the caller rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from crossview.engine.io import atomic_writer
from crossview.settings import get_settings

__all__ = ["FeatureCache", "MMAP_BYTES", "canonical_json"]

log = logging.getLogger(__name__)

#: Arrays at least this large are returned memory-mapped (read-only) instead of read into memory.
MMAP_BYTES = 64 * 1024 * 1024
_PROBE = 1 << 20  # bytes hashed at each end of the file
FORMAT_VERSION = 1


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace; paths and numpy scalars become plain values."""
    def default(o: Any) -> Any:
        if isinstance(o, Path):
            return str(o)
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, (set, frozenset)):
            return sorted(o)
        raise TypeError(f"cannot put {type(o).__name__} into a cache key")
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=default)


def _probe_hash(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_PROBE))
        if size > 2 * _PROBE:
            f.seek(size - _PROBE)
        h.update(f.read(_PROBE))
    return h.hexdigest()


class FeatureCache:
    """Arrays on disk under ``root`` (default: ``get_settings().features_dir``), addressed by content."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else get_settings().features_dir

    # ------------------------------------------------------------------ keys
    @staticmethod
    def make_key(**parts: Any) -> str:
        """The key of an array determined by ``parts`` (any JSON-able values): 64 hex digits."""
        blob = canonical_json({"v": FORMAT_VERSION, **parts})
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _paths(self, key: str) -> tuple[Path, Path]:
        if len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"not a cache key: {key!r}")
        folder = self.root / key[:2]
        return folder / f"{key}.npy", folder / f"{key}.json"

    def path_of(self, key: str) -> Path:
        """Where the array of ``key`` is (or would be) stored."""
        return self._paths(key)[0]

    # ------------------------------------------------------------------ read
    def contains(self, key: str) -> bool:
        npy, meta = self._paths(key)
        return npy.exists() and meta.exists()

    def meta(self, key: str) -> dict[str, Any] | None:
        """The stored description of ``key`` (parts, shape, dtype, ...), or None."""
        try:
            return json.loads(self._paths(key)[1].read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def load(self, key: str) -> np.ndarray | None:
        """The cached array, or None on a miss. A corrupt or partial entry is deleted (and logged)."""
        npy, meta_path = self._paths(key)
        if not npy.exists() and not meta_path.exists():
            return None
        problem = self._check(npy, meta_path)
        if problem is not None:
            log.warning("feature cache entry %s is unusable (%s); rebuilding it", npy, problem)
            self.delete(key)
            return None
        meta = self.meta(key) or {}
        mmap = "r" if int(meta.get("nbytes", 0)) >= MMAP_BYTES else None
        try:
            arr = np.load(npy, mmap_mode=mmap, allow_pickle=False)
        except (OSError, ValueError) as e:
            log.warning("feature cache entry %s is unreadable (%s); rebuilding it", npy, e)
            self.delete(key)
            return None
        return arr

    def _check(self, npy: Path, meta_path: Path) -> str | None:
        if not meta_path.exists():
            return "no description file (an interrupted write)"
        if not npy.exists():
            return "array file missing"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return f"description unreadable: {e}"
        size = npy.stat().st_size
        if size != meta.get("file_size"):
            return f"array file has {size} bytes, expected {meta.get('file_size')}"
        try:
            with open(npy, "rb") as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        except (OSError, ValueError) as e:
            return f"bad .npy header: {e}"
        if list(shape) != list(meta.get("shape", [])) or str(dtype) != meta.get("dtype"):
            return f"array is {dtype}{list(shape)}, expected {meta.get('dtype')}{meta.get('shape')}"
        if _probe_hash(npy) != meta.get("probe_sha256"):
            return "checksum mismatch"
        return None

    # ------------------------------------------------------------------ write
    def save(self, key: str, array: np.ndarray, meta: Mapping[str, Any] | None = None) -> np.ndarray:
        """Store ``array`` under ``key`` atomically and return the stored copy (memory-mapped if large)."""
        npy, meta_path = self._paths(key)
        npy.parent.mkdir(parents=True, exist_ok=True)
        array = np.ascontiguousarray(array)
        if array.dtype == object:
            raise ValueError("the feature cache stores numeric arrays only")
        # The description goes first out of the way: a stale one must never vouch for a new array.
        try:
            meta_path.unlink()
        except FileNotFoundError:
            pass
        atomic_writer(npy, lambda f: np.save(f, array, allow_pickle=False))
        info = {
            "key": key,
            "parts": dict(meta or {}),
            "shape": list(array.shape),
            "dtype": str(array.dtype),
            "nbytes": int(array.nbytes),
            "file_size": npy.stat().st_size,
            "probe_sha256": _probe_hash(npy),
            "format_version": FORMAT_VERSION,
        }
        payload = json.dumps(info, indent=1, default=str).encode("utf-8")
        atomic_writer(meta_path, lambda f: f.write(payload))
        stored = self.load(key)
        assert stored is not None
        return stored

    def get_or_compute(self, key: str, compute: Callable[[], np.ndarray],
                       meta: Mapping[str, Any] | None = None) -> tuple[np.ndarray, bool]:
        """``(array, hit)``: the cached array, or ``compute()`` stored under ``key``."""
        arr = self.load(key)
        if arr is not None:
            return arr, True
        return self.save(key, compute(), meta), False

    def delete(self, key: str) -> None:
        """Remove an entry (both files); missing files are fine."""
        for p in self._paths(key)[::-1]:
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def entries(self) -> list[dict[str, Any]]:
        """Descriptions of all complete entries (for ``crossview features list``)."""
        out = []
        if not self.root.exists():
            return out
        for meta_path in sorted(self.root.glob("??/*.json")):
            try:
                out.append(json.loads(meta_path.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue
        return out

    def size_bytes(self) -> int:
        """Total size of the cache folder's ``.npy`` files."""
        return sum(p.stat().st_size for p in self.root.glob("??/*.npy")) if self.root.exists() else 0
