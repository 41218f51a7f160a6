"""Content hashes of image files, remembered per file state, so that caches key on what a file holds.

The feature cache and the photo store key image features on the bytes of each file (SHA-256, 128 bits; SHA-256
runs in hardware on current CPUs), not on its path, size and modification time: a photo replaced by another of
the same size whose mtime was put back gets a new key and is encoded again, and a dataset moved to another
folder keeps its cached features.

Reading every file for every extraction would cost seconds on a large set, so each hash is remembered with the
state of the file it was read from: (path, size, mtime_ns, ctime_ns, inode). A file whose state is unchanged is
not read again; any change is read and hashed again. The change time (``ctime``) is the part nobody can set: it
moves on every write and on every ``os.utime``, so restoring a file's mtime after replacing it does not hide the
change (copying over a file keeps its inode; renaming another over it does not).

The memo is ``file_hashes.memo`` (an ``.npz`` archive) in a cache folder (data only, read with
``allow_pickle=False``): the paths as one UTF-8 blob, the states as integer columns and the digests as 16-byte
rows; written atomically, merged with what another process wrote meanwhile. A memo that cannot be written (a full
disk, a read-only folder) is warned about once and the hashes are kept for this process only; a damaged one is
discarded and rebuilt.

The memo is bounded: its entries are kept in the order they were last used (hashed, or found unchanged by a
process that then wrote the memo), and when a write would take it past ``max_entries`` (default
:data:`MAX_ENTRIES`), the entries of files that no longer exist go first, then the least recently used, down to
nine tenths of the cap (so that the next writes do not prune again), never those the writing process used.
A pruned file is only hashed again.

Hashing many files the first time takes a while (a few thousand photos: seconds to minutes on a slow disk), so
:meth:`FileHashes.iter_digests` is a generator of ``(done, total)`` reports over the files it must read, like the
encoders' ``iter_*``: nothing at all when every file is known (instant), else ``(0, m)`` first and then a report at
most every :data:`REPORT_SECONDS`; closing it stops the work (what was hashed is kept in the memo).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

__all__ = ["FileHashes", "MAX_ENTRIES", "MEMO_NAME", "REPORT_SECONDS", "file_digest"]

log = logging.getLogger(__name__)

#: The memo's file name inside a cache folder.
MEMO_NAME = "file_hashes.memo"     # an .npz archive; not named *.npz, which are the photo stores
_FORMAT = 1
_DIGEST_BYTES = 16
#: the most entries a memo keeps (about 130 bytes each on disk: some 26 MB at the cap)
MAX_ENTRIES = 200_000
#: the longest time between two progress reports while files are hashed
REPORT_SECONDS = 0.5
#: memo folders a write failed in (said once per process)
_UNWRITABLE: set[str] = set()

State = tuple[int, int, int, int]      # size, mtime_ns, ctime_ns, inode


def _state(st: os.stat_result) -> State:
    # an inode number may use all 64 bits; the memo stores int64
    return int(st.st_size), int(st.st_mtime_ns), int(st.st_ctime_ns), int(st.st_ino) & 0x7FFF_FFFF_FFFF_FFFF


def file_digest(path: str | os.PathLike[str]) -> bytes:
    """The first 16 bytes of the SHA-256 of the file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").digest()[:_DIGEST_BYTES]


class FileHashes:
    """Content digests of files, remembered in ``<root>/file_hashes.memo`` (``root`` None: in memory only)."""

    def __init__(self, root: str | Path | None = None, *, max_entries: int = MAX_ENTRIES) -> None:
        self.path = Path(root) / MEMO_NAME if root is not None else None
        self.max_entries = max(1, int(max_entries))
        self.memo: dict[str, tuple[State, bytes]] = {}
        self._loaded = False
        self._new: dict[str, tuple[State, bytes]] = {}
        #: files looked up or hashed in this process, in that order: they become the most recent when written
        self._used: dict[str, None] = {}
        #: files read and hashed by the last :meth:`digests` call (the rest came from the memo)
        self.read = 0

    # ------------------------------------------------------------------ lookups
    def digests(self, paths: Sequence[str | os.PathLike[str]]) -> list[bytes | None]:
        """The digest of each file (``None`` for a missing or unreadable one), reading only the files whose state
        changed since they were last hashed (:meth:`iter_digests` driven to its end, no progress)."""
        from crossview.core.progress import drive

        return drive(self.iter_digests(paths))

    def iter_digests(self, paths: Sequence[str | os.PathLike[str]], *, report_seconds: float = REPORT_SECONDS,
                     clock: Callable[[], float] = time.monotonic) -> Iterator[tuple[int, int]]:
        """:meth:`digests` as a generator: yields ``(done, total)`` over the ``total`` files that must be read
        (nothing when none must: every file unchanged since it was hashed), ``(0, total)`` first, then at most
        every ``report_seconds`` and ``(total, total)`` at the end; *returns* the list of digests. The memo is
        written afterwards when anything was read, also when the generator is closed early."""
        self._load()
        keys = [os.path.abspath(os.fspath(p)) for p in paths]
        out: list[bytes | None] = [None] * len(keys)
        todo: list[int] = []
        self.read = 0
        for i, key in enumerate(keys):
            try:
                state = _state(os.stat(key))
            except OSError:
                continue
            known = self.memo.get(key)
            if known is not None and known[0] == state:
                out[i] = known[1]
                self._used[key] = None
            else:
                todo.append(i)
        if not todo:
            return out
        total = len(todo)
        try:
            yield 0, total
            last = clock()
            for done, i in enumerate(todo, 1):
                key = keys[i]
                try:
                    digest = file_digest(key)
                    state = _state(os.stat(key))    # the state the bytes were read in (a write meanwhile: read again)
                except OSError:
                    digest = None
                if digest is not None:
                    self.memo[key] = self._new[key] = (state, digest)
                    self._used[key] = None
                    self.read += 1
                    out[i] = digest
                now = clock()
                if done == total or now - last >= report_seconds:
                    last = now
                    yield done, total
        finally:
            if self._new:
                self.save()
        return out

    def digest(self, path: str | os.PathLike[str]) -> bytes | None:
        """The digest of one file (see :meth:`digests`)."""
        return self.digests([path])[0]

    def peek(self, path: str | os.PathLike[str]) -> bytes | None:
        """The remembered digest of ``path`` when the file is still in the state it was hashed in, else ``None``;
        never reads the file."""
        self._load()
        key = os.path.abspath(os.fspath(path))
        known = self.memo.get(key)
        if known is None:
            return None
        try:
            return known[1] if _state(os.stat(key)) == known[0] else None
        except OSError:
            return None

    # ------------------------------------------------------------------ the memo file
    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if self.path is not None:
            self.memo.update(self._read())

    def _read(self) -> dict[str, tuple[State, bytes]]:
        assert self.path is not None
        if not self.path.is_file():
            return {}
        from crossview.core.io import NpzFileError, read_npz

        try:
            z = read_npz(self.path, todo="")
            if int(z["format"]) != _FORMAT:
                raise ValueError(f"format {int(z['format'])}")
            names = bytes(z["paths"].astype(np.uint8)).decode("utf-8", "surrogateescape").split("\0")
            states = np.asarray(z["states"], dtype=np.int64)
            digests = np.asarray(z["digests"], dtype=np.uint8)
            n = len(states)
            if states.shape != (n, 4) or digests.shape != (n, _DIGEST_BYTES) or (n and len(names) != n):
                raise ValueError("arrays of the wrong shape")
        except Exception as e:  # noqa: BLE001 - any damage means: hash the files again
            why = e.reason if isinstance(e, NpzFileError) else f"{type(e).__name__}: {str(e)[:120]}"
            log.warning("file hash memo %s is damaged (%s); the files are hashed again", self.path, why)
            return {}
        if not n:
            return {}
        return {name: (tuple(int(v) for v in states[i]), bytes(digests[i]))    # type: ignore[misc]
                for i, name in enumerate(names)}

    def save(self) -> None:
        """Write what was hashed in this process into the memo file, merged with its current content."""
        if self.path is None or not self._new:
            return
        from crossview.core.io import atomic_write_bytes

        merged = self._read()            # another process may have added its files meanwhile
        merged.update(self._new)
        for key in self._used:           # the order of the file is the order of use: these are the newest
            entry = merged.pop(key, None) or self.memo.get(key)
            if entry is not None:
                merged[key] = entry
        if len(merged) > self.max_entries:
            merged = self._pruned(merged)
        names = list(merged)
        buf = io.BytesIO()
        np.savez(buf, format=np.array(_FORMAT, dtype=np.int64),
                 paths=np.frombuffer("\0".join(names).encode("utf-8", "surrogateescape"), dtype=np.uint8),
                 states=np.array([merged[k][0] for k in names], dtype=np.int64).reshape(-1, 4),
                 digests=np.frombuffer(b"".join(merged[k][1] for k in names), dtype=np.uint8
                                       ).reshape(-1, _DIGEST_BYTES))
        try:
            atomic_write_bytes(self.path, buf.getvalue())
        except OSError as e:
            folder = str(self.path.parent)
            if folder not in _UNWRITABLE:
                _UNWRITABLE.add(folder)
                log.warning("file hash memo: cannot write %s (%s); image files are hashed again next time",
                            self.path, getattr(e, "strerror", None) or e)
            return
        self._new = {}
        self._used = {}
        self.memo = merged

    def _pruned(self, merged: dict[str, tuple[State, bytes]]) -> dict[str, tuple[State, bytes]]:
        """``merged`` (oldest use first) cut to nine tenths of :attr:`max_entries`: the entries of files that are
        gone first, then the least recently used; never those used in this process (a dataset larger than the cap
        is not hashed again every time)."""
        keep_n = max(1, self.max_entries * 9 // 10, len(self._used))
        gone = {k for k in merged if k not in self._used and not os.path.exists(k)}
        kept = {k: v for k, v in merged.items() if k not in gone}
        if len(kept) > keep_n:
            kept = dict(list(kept.items())[len(kept) - keep_n:])
        log.info("file hash memo %s: dropped %d entries of files that are gone and %d least recently used "
                 "(%d kept)", self.path, len(gone), len(merged) - len(gone) - len(kept), len(kept))
        return kept
