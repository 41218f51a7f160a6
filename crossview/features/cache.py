"""The on-disk feature cache: content-addressed, atomic, memory-mapped, self-checking.

A key is the SHA-256 of the canonical JSON of everything that determines an array (ARCHITECTURE.md:
dataset fingerprint, encoder name, weights hash, transform), so the same extraction twice is a hit and
any change of input is a miss; nothing is ever invalidated by hand.

Layout: ``<root>/<key[:2]>/<key>.npy`` holds the array, ``<key>.json`` beside it holds the parts of
the key, the array's shape and dtype, the ``.npy`` file's size and a SHA-256 checksum of *every*
:data:`CHUNK_BYTES` chunk of the file (computed once, at write). The ``.npy`` is written first, the
``.json`` last, both through a temporary file and ``os.replace``, so a crash leaves either a complete
entry or none.

Every load verifies the whole file against those checksums while reading it (an array read into
memory is hashed from the bytes just read; a memory-mapped one is streamed through the hash in
chunks first: 0.08 s for a 100 MiB array in the OS file cache on a 2-core machine, vs 0.01 s for an
unchecked ``np.load``). An entry whose ``.json`` is missing or
unreadable, or whose ``.npy`` disagrees with it (size, header, shape, dtype, any chunk's checksum),
or that was written by an older CrossView without whole-file checksums, is reported with a warning
naming the file, deleted and treated as a miss, so the caller extracts the features again.

A scipy sparse matrix (TF-IDF or bag-of-words caption features: ~10 non-zeros in a row of thousands) is stored
as CSR in the same one ``.npy`` file: a ``uint8`` array holding its values, column indices and row pointers one
after the other (each part 8-byte aligned), described by ``"sparse"`` in the ``.json``. It is checked like any
entry and comes back as a ``scipy.sparse.csr_matrix`` whose parts are views of the (memory-mapped, when large)
file: never the dense ``rows x vocabulary`` matrix (issue 34: 1.2 GB dense for COCO's 616K captions and 500
words, 53 MB as CSR).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import is_storage_error
from crossview.core.io import atomic_writer
from crossview.core.settings import get_settings

__all__ = ["FeatureCache", "MMAP_BYTES", "CHUNK_BYTES", "REBUILD_HINT", "canonical_json"]

log = logging.getLogger(__name__)

#: Arrays at least this large are returned memory-mapped (read-only) instead of read into memory.
MMAP_BYTES = 64 * 1024 * 1024
#: Bytes covered by one checksum (a corrupt range is located to within one chunk).
CHUNK_BYTES = 4 * 1024 * 1024
_PROBE = 1 << 20  # bytes hashed at each end of the file (the old check; still written for old readers)
_HASH = "sha256-128"
FORMAT_VERSION = 1

#: Cache folders a write failed in (full, read-only): said once per process, then the work goes on uncached.
_UNWRITABLE: set[str] = set()

#: What a user runs to rebuild cached features by hand.
REBUILD_HINT = ("to rebuild the cache by hand: 'crossview features cache --clear', then "
                "'crossview features extract --data DATASET'")


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


def _digest(data: Any) -> str:
    # SHA-256 runs in hardware (SHA-NI) on current x86 and ARM CPUs: ~1.7x BLAKE2b's speed here.
    return hashlib.sha256(data).hexdigest()[:32]


def _probe_hash(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_PROBE))
        if size > 2 * _PROBE:
            f.seek(size - _PROBE)
        h.update(f.read(_PROBE))
    return h.hexdigest()


def _file_chunk_digests(path: Path, chunk: int | None = None) -> list[str]:
    """SHA-256 digests (128 bits) of consecutive ``chunk``-byte pieces (default :data:`CHUNK_BYTES`)."""
    chunk = chunk or CHUNK_BYTES
    out = []
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            out.append(_digest(view[:n]))
    return out


class _Corrupt(Exception):
    """An entry failed its check; the message says how."""


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
        """True when both files of ``key`` exist (not verified: :meth:`load` does that)."""
        npy, meta = self._paths(key)
        return npy.exists() and meta.exists()

    def meta(self, key: str) -> dict[str, Any] | None:
        """The stored description of ``key`` (parts, shape, dtype, ...), or None."""
        try:
            meta = json.loads(self._paths(key)[1].read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    def load(self, key: str) -> Any:
        """The cached array (a ``scipy.sparse.csr_matrix`` for a sparse entry), verified against its checksums,
        or None on a miss.

        A corrupt, partial or unverifiable entry is deleted, a warning names its file, and None is
        returned so that the caller extracts the features again.
        """
        npy, meta_path = self._paths(key)
        if not npy.exists() and not meta_path.exists():
            return None
        try:
            arr = self._read_verified(npy, meta_path)
            meta = self.meta(key) or {}
            return _unpack_csr(arr, meta["sparse"]) if meta.get("sparse") else arr
        except _Corrupt as e:
            problem = str(e)
        except (OSError, ValueError) as e:
            problem = f"unreadable: {e}"
        log.warning("feature cache: %s is unusable (%s); deleted it, the features are extracted again (%s)",
                    npy, problem, REBUILD_HINT)
        self.delete(key)
        return None

    def verify(self, key: str) -> str | None:
        """None when the entry of ``key`` passes every check, else what is wrong (nothing is deleted)."""
        npy, meta_path = self._paths(key)
        try:
            self._read_verified(npy, meta_path, keep=False)
        except _Corrupt as e:
            return str(e)
        except (OSError, ValueError) as e:
            return f"unreadable: {e}"
        return None

    @staticmethod
    def _header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(f)
        raise ValueError(f"unsupported .npy version {version}")

    def _read_verified(self, npy: Path, meta_path: Path, keep: bool = True) -> np.ndarray | None:
        """Check ``npy`` against ``meta_path`` over the whole file; the array (or None if not ``keep``)."""
        if not meta_path.exists():
            raise _Corrupt("no description file (an interrupted write)")
        if not npy.exists():
            raise _Corrupt("array file missing")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise _Corrupt(f"description unreadable: {e}") from None
        if not isinstance(meta, dict):
            raise _Corrupt("description is not a JSON object")
        check = meta.get("checksum")
        if not isinstance(check, dict) or check.get("algo") != _HASH:
            raise _Corrupt("written by an older CrossView without whole-file checksums")
        chunk = check.get("chunk_bytes")
        digests = check.get("chunks")
        if not isinstance(chunk, int) or chunk <= 0 or not isinstance(digests, list):
            raise _Corrupt("checksum description malformed")
        size = npy.stat().st_size
        if size != meta.get("file_size"):
            raise _Corrupt(f"array file has {size:,} bytes, expected {meta.get('file_size')}")
        if len(digests) != max(1, math.ceil(size / chunk)) and not (size == 0 and not digests):
            raise _Corrupt("checksum description does not match the file size")
        with open(npy, "rb") as f:
            try:
                shape, fortran, dtype = self._header(f)
            except ValueError as e:
                raise _Corrupt(f"bad .npy header: {e}") from None
            offset = f.tell()
        if list(shape) != list(meta.get("shape", [])) or str(dtype) != meta.get("dtype"):
            raise _Corrupt(f"array is {dtype}{list(shape)}, expected {meta.get('dtype')}{meta.get('shape')}")
        if dtype.hasobject:
            raise _Corrupt("object arrays are never read from the cache")
        row_bytes = dtype.itemsize * (int(np.prod(shape[1:])) if len(shape) > 1 else 1)
        big = int(meta.get("nbytes", 0)) >= MMAP_BYTES
        if big or not keep:
            # Stream the whole file through the hash, then map it (pages stay in the OS cache).
            got = _file_chunk_digests(npy, chunk)
            self._compare(got, digests, chunk, offset, row_bytes, size)
            if not keep:
                return None
            return np.load(npy, mmap_mode="r", allow_pickle=False)
        buf = bytearray(size)
        with open(npy, "rb", buffering=0) as f:
            n = f.readinto(buf)
        if n != size:
            raise _Corrupt(f"read {n:,} of {size:,} bytes")
        view = memoryview(buf)
        got = [_digest(view[i:i + chunk]) for i in range(0, size, chunk)]
        self._compare(got, digests, chunk, offset, row_bytes, size)
        count = int(np.prod(shape)) if shape else 1
        arr = np.frombuffer(buf, dtype=dtype, count=count, offset=offset)
        return arr.reshape(shape, order="F" if fortran else "C")

    @staticmethod
    def _compare(got: list[str], want: list[str], chunk: int, offset: int, row_bytes: int, size: int) -> None:
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
        if len(got) != len(want) and not bad:
            bad = [min(len(got), len(want))]
        if not bad:
            return
        lo, hi = bad[0] * chunk, min(size, (bad[-1] + 1) * chunk)
        where = f"bytes {lo:,}-{hi:,}"
        if row_bytes > 0 and hi > offset:
            r0 = max(0, lo - offset) // row_bytes
            r1 = (hi - offset - 1) // row_bytes
            where += f", rows {r0:,}-{r1:,}"
        raise _Corrupt(f"checksum mismatch in {len(bad)} of {len(want)} chunk(s), {where}")

    # ------------------------------------------------------------------ write
    def save(self, key: str, array: np.ndarray, meta: Mapping[str, Any] | None = None) -> np.ndarray:
        """Store ``array`` under ``key`` atomically and return the stored copy (memory-mapped if large); a scipy
        sparse matrix is stored as CSR (module docstring) and returned as a ``csr_matrix`` over the stored bytes.

        The cache is an optimisation: when the write fails (a full disk, a read-only or foreign cache folder) a
        warning names the folder once per process and ``array`` is returned unstored, so the work goes on
        without the cache (no partial entry is left)."""
        sparse = None
        if _is_sparse(array):
            array, sparse = _pack_csr(array)
        array = np.ascontiguousarray(array)
        if array.dtype.hasobject:
            raise ValueError("the feature cache stores numeric arrays only")
        try:
            if sparse is None:
                return self._save(key, array, meta)
            stored = self._save(key, array, meta, sparse=sparse)
            return _unpack_csr(stored, sparse)
        except OSError as e:
            if not is_storage_error(e):
                raise
            npy, meta_path = self._paths(key)
            for p in (meta_path, npy):
                try:
                    p.unlink()
                except OSError:
                    pass
            root = str(self.root)
            if root not in _UNWRITABLE:
                _UNWRITABLE.add(root)
                need = f" ({array.nbytes / 2**20:.1f} MiB needed for this entry)" if array.nbytes else ""
                log.warning("feature cache: cannot write to %s (%s)%s; going on without caching features, so they "
                            "are extracted again next time; free space there or set another cache folder "
                            "(--cache-dir, CROSSVIEW_CACHE_DIR)", root, getattr(e, "strerror", None) or e, need)
            return array if sparse is None else _unpack_csr(array, sparse)

    def _save(self, key: str, array: np.ndarray, meta: Mapping[str, Any] | None,
              sparse: dict[str, Any] | None = None) -> np.ndarray:
        npy, meta_path = self._paths(key)
        npy.parent.mkdir(parents=True, exist_ok=True)
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
            "checksum": {"algo": _HASH, "chunk_bytes": CHUNK_BYTES, "chunks": _file_chunk_digests(npy)},
            "probe_sha256": _probe_hash(npy),  # what CrossView before the whole-file checksum checked
            "format_version": FORMAT_VERSION,
        }
        if sparse is not None:
            info["sparse"] = sparse
        payload = json.dumps(info, indent=1, default=str).encode("utf-8")
        atomic_writer(meta_path, lambda f: f.write(payload))
        if array.nbytes >= MMAP_BYTES:
            return np.load(npy, mmap_mode="r", allow_pickle=False)
        stored = array.copy()
        return stored

    def get_or_compute(self, key: str, compute: Callable[[], Any],
                       meta: Mapping[str, Any] | None = None) -> tuple[Any, bool]:
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
            except OSError as e:     # a read-only cache folder: the entry stays, and is checked (and missed) again
                log.warning("feature cache: cannot delete %s (%s)", p, e.strerror or e)

    def entries(self) -> list[dict[str, Any]]:
        """Descriptions of all complete entries (for ``crossview features list``)."""
        out = []
        if not self.root.exists():
            return out
        for meta_path in sorted(self.root.glob("??/*.json")):
            try:
                info = json.loads(meta_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(info, dict) and "key" in info:
                out.append(info)
        return out

    def size_bytes(self) -> int:
        """Total size of the cache folder's ``.npy`` files."""
        return sum(p.stat().st_size for p in self.root.glob("??/*.npy")) if self.root.exists() else 0


# ---------------------------------------------------------------------- sparse entries
def _is_sparse(x: Any) -> bool:
    return hasattr(x, "tocsr") and hasattr(x, "nnz")


def _aligned(n: int) -> int:
    return (n + 7) // 8 * 8


def _pack_csr(m: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """``(bytes (k,) uint8, description)``: a scipy sparse matrix as CSR (duplicates summed, indices sorted), its
    values, column indices and row pointers one after the other, each part starting on an 8-byte boundary."""
    m = m.tocsr()
    if not m.has_canonical_format:
        m = m.copy()
        m.sum_duplicates()
    parts = {"data": np.ascontiguousarray(m.data), "indices": np.ascontiguousarray(m.indices),
             "indptr": np.ascontiguousarray(m.indptr)}
    if any(a.dtype.hasobject for a in parts.values()):
        raise ValueError("the feature cache stores numeric arrays only")
    layout, offset = {}, 0
    for name, a in parts.items():
        layout[name] = {"offset": offset, "dtype": str(a.dtype), "count": int(a.size)}
        offset = _aligned(offset + a.nbytes)
    buf = np.zeros(offset, dtype=np.uint8)
    for name, a in parts.items():
        o = layout[name]["offset"]
        buf[o:o + a.nbytes] = a.view(np.uint8)
    return buf, {"format": "csr", "shape": [int(m.shape[0]), int(m.shape[1])], "nnz": int(m.nnz), "parts": layout}


def _unpack_csr(buf: np.ndarray, desc: Mapping[str, Any]) -> Any:
    """The ``scipy.sparse.csr_matrix`` :func:`_pack_csr` packed into ``buf``; its parts are views of ``buf`` (a
    memory-mapped file stays mapped). A description that does not fit the bytes is :class:`_Corrupt`."""
    import scipy.sparse as sp

    try:
        shape = tuple(int(v) for v in desc["shape"])
        views = {}
        for name in ("data", "indices", "indptr"):
            part = desc["parts"][name]
            dtype = np.dtype(str(part["dtype"]))
            o, count = int(part["offset"]), int(part["count"])
            if dtype.hasobject or o < 0 or count < 0 or o + count * dtype.itemsize > buf.size:
                raise _Corrupt(f"sparse part {name!r} lies outside the array file")
            views[name] = buf[o:o + count * dtype.itemsize].view(dtype)
        if len(shape) != 2 or len(views["indptr"]) != shape[0] + 1 or len(views["data"]) != len(views["indices"]):
            raise _Corrupt("sparse description does not match its parts")
        m = sp.csr_matrix((views["data"], views["indices"], views["indptr"]), shape=shape, copy=False)
    except (KeyError, TypeError, ValueError) as e:
        raise _Corrupt(f"sparse description unreadable: {e}") from None
    return m
