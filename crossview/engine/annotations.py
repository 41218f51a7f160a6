"""Relevance marks that annotators put on retrieved results, kept in the run folder.

``annotations.jsonl`` is an append-only log: every mark (or un-mark) is one JSON line, written,
flushed and fsync'ed at once, so a crash loses at most the mark being made and never an earlier one.
Lines are ASCII (``ensure_ascii``: a crash cannot cut a multi-byte character). On reading, a line that
is not a valid mark (torn, not UTF-8, not JSON, a missing or mistyped field) is skipped and counted in
:attr:`AnnotationStore.skipped`: one bad line costs that line only. The current state is the last line per (direction, query,
item). Export writes the current state as CSV or JSONL (atomically), read again from the file first, so marks
other processes (another window, another annotator) added are in it.

A mark that cannot be written (a read-only run folder, a full disk) is not lost: it stays in memory as
pending (:attr:`AnnotationStore.pending`), counts among the marks, is written before the next mark and by
:meth:`AnnotationStore.retry`, and :meth:`AnnotationStore.mark` raises :class:`MarkNotSaved` saying why.

A line: ``{"time", "annotator", "direction": "i2t"|"t2i", "query": {"image": 3} | {"caption": 12} |
{"text": "..."} | {"file": "..."}, "item": int, "item_text": str, "relevant": true|false|null}``
(``null`` clears a mark).

A mark on a photo-folder gallery's result (issue 30) has ``"photos": "<folder>"`` in its query and the photo's
absolute path as ``item_text``; it is keyed by that path, not by ``item`` (the photo's index, which shifts when
photos are added), and it is never confused with a mark of the same sentence on a dataset's images.
"""

from __future__ import annotations

import csv
import getpass
import io
import json
import os
import time
from pathlib import Path
from typing import Any

from crossview.core.io import atomic_write_bytes
from crossview.core.errors import CrossViewError, StorageError, is_storage_error, storage_error

__all__ = ["AnnotationStore", "MarkNotSaved", "query_key"]

FILE_NAME = "annotations.jsonl"


class MarkNotSaved(CrossViewError):
    """A mark was kept in memory but could not be written to ``annotations.jsonl`` (the message says why and
    how many marks wait); :meth:`AnnotationStore.retry` writes them. :attr:`storage` is the
    :class:`~crossview.core.errors.StorageError` when the disk was full or the folder unwritable (the path and
    the bytes the pending marks needed), else None."""

    def __init__(self, message: str, storage: StorageError | None = None) -> None:
        super().__init__(message)
        self.storage = storage


def query_key(query: dict[str, Any]) -> str:
    """A stable string for a query dict (``{"image": 3}`` -> ``image:3``)."""
    for kind in ("image", "caption", "file", "text", "tags"):
        if kind in query:
            return f"{kind}:{query[kind]}"
    raise CrossViewError(f"not a query: {query!r}")


_QUERY_TYPES = {"image": int, "caption": int, "file": str, "text": str, "tags": str}   # in query_key's order


def _parse_line(raw: bytes) -> tuple[tuple[str, str, int | str], dict[str, Any]] | None:
    """``(key, record)`` of one line of the file, or None when it is not a valid mark."""
    try:
        rec = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):       # not UTF-8 (UnicodeDecodeError), not JSON, too deep
        return None
    if not isinstance(rec, dict):
        return None
    direction, query, item = rec.get("direction"), rec.get("query"), rec.get("item")
    if direction not in ("i2t", "t2i") or not isinstance(query, dict):
        return None
    kind = next((k for k in _QUERY_TYPES if k in query), None)   # query_key's order
    if kind is None:
        return None
    value = query[kind]
    if not isinstance(value, _QUERY_TYPES[kind]) or isinstance(value, bool):
        return None
    if not isinstance(item, int) or isinstance(item, bool):
        return None
    if not isinstance(rec.get("time"), str) or not isinstance(rec.get("annotator", ""), str) \
            or not isinstance(rec.get("item_text", ""), str) \
            or not (rec.get("relevant") is None or isinstance(rec.get("relevant"), bool)):
        return None
    rec.setdefault("annotator", "")
    rec.setdefault("item_text", "")
    rec.setdefault("relevant", None)
    if "photos" in query and (not isinstance(query["photos"], str) or not rec["item_text"]):
        return None
    return (direction, f"{kind}:{value}", _item_key(query, item, rec["item_text"])), rec


def _item_key(query: dict[str, Any], item: int, item_text: str) -> int | str:
    """What a mark is kept under besides its direction and query: a photo's path, else the item's index."""
    return f"{query['photos']}\0{item_text}" if "photos" in query else int(item)


class AnnotationStore:
    """The marks of one run folder (``<run>/annotations.jsonl``)."""

    def __init__(self, folder: str | Path, annotator: str | None = None) -> None:
        self.path = Path(folder) / FILE_NAME
        try:
            default = getpass.getuser()
        except Exception:  # noqa: BLE001 - no user name on some systems
            default = "annotator"
        self.annotator = annotator or default
        self._state: dict[tuple[str, str, int | str], dict[str, Any]] = {}
        self.skipped_lines = 0
        #: marks made but not yet written (the file could not be written), oldest first
        self.pending: list[dict[str, Any]] = []
        self._read()

    @property
    def skipped(self) -> int:
        """How many lines of the file were not valid marks and were skipped on reading."""
        return self.skipped_lines

    def _read(self) -> None:
        self._state.clear()
        self.skipped_lines = 0
        if self.path.exists() and not self.path.is_file():   # a FIFO or a folder would hang or fail the read
            raise CrossViewError(f"{self.path}: not a regular file; move it away so that marks can be saved")
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            f = None
        except OSError as e:
            raise CrossViewError(f"{self.path}: cannot read the annotations ({e.strerror or e}); check the "
                                 "file's permissions") from None
        if f is not None:
            with f:
                for raw in f:
                    if not raw.strip():
                        continue
                    parsed = _parse_line(raw)
                    if parsed is None:
                        self.skipped_lines += 1     # a torn line after a crash, a damaged byte, a hand edit
                        continue
                    self._apply(*parsed)
        for rec in self.pending:                    # marks made here that the file does not hold yet
            self._apply(self._key(rec), rec)

    def _apply(self, key: tuple[str, str, int | str], rec: dict[str, Any]) -> None:
        if rec["relevant"] is None:
            self._state.pop(key, None)
        else:
            self._state[key] = rec

    @staticmethod
    def _key(rec: dict[str, Any]) -> tuple[str, str, int | str]:
        return rec["direction"], query_key(rec["query"]), _item_key(rec["query"], rec["item"], rec["item_text"])

    def reload(self) -> "AnnotationStore":
        """Read the file again (the marks every process has written), keeping this store's pending marks on top.
        Returns ``self``."""
        self._read()
        return self

    def _write(self, recs: list[dict[str, Any]]) -> None:
        """Append ``recs`` as lines, flushed and fsync'ed (raises OSError)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = False
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"      # a crash cut the last line: start a fresh one
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(("\n" if torn else "") + "".join(json.dumps(r, ensure_ascii=True) + "\n" for r in recs))
            f.flush()
            os.fsync(f.fileno())

    def retry(self) -> int:
        """Write the pending marks (oldest first); returns how many were written (0: none waited). Raises
        :class:`MarkNotSaved` when the file still cannot be written (the marks stay pending)."""
        if not self.pending:
            return 0
        try:
            self._write(self.pending)
        except OSError as e:
            raise self._not_saved(e) from None
        n, self.pending = len(self.pending), []
        return n

    def _not_saved(self, e: OSError) -> MarkNotSaved:
        n = len(self.pending)
        need = len("".join(json.dumps(r, ensure_ascii=True) + "\n" for r in self.pending).encode())
        return MarkNotSaved(f"{self.path}: {n} mark{'s' if n != 1 else ''} not saved ({e.strerror or e}); kept until "
                            "the file can be written: make the run folder writable or free space, then retry",
                            storage_error(e, self.path, need) if is_storage_error(e) else None)

    def mark(self, direction: str, query: dict[str, Any], item: int, relevant: bool | None,
             item_text: str = "") -> dict[str, Any]:
        """Record a mark now (``None`` clears it); returns the line written. When the file cannot be written the
        mark is kept (pending, with any earlier pending ones) and :class:`MarkNotSaved` is raised."""
        if direction not in ("i2t", "t2i"):
            raise CrossViewError(f"direction must be i2t or t2i, got {direction!r}")
        rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "annotator": self.annotator, "direction": direction,
               "query": dict(query), "item": int(item), "item_text": item_text,
               "relevant": None if relevant is None else bool(relevant)}
        if "photos" in query and not item_text:
            raise CrossViewError("a mark on a photo folder's result needs the photo's path as its item_text")
        self._apply(self._key(rec), rec)
        self.pending.append(rec)
        try:
            self._write(self.pending)
        except OSError as e:
            raise self._not_saved(e) from None
        self.pending = []
        return rec

    def marks_for(self, direction: str, query: dict[str, Any]) -> dict[int, bool]:
        """``{item: relevant}`` for one query (a photo-folder query: :meth:`marks_by_path`)."""
        qk, photos = query_key(query), query.get("photos")
        return {rec["item"]: rec["relevant"] for (d, q, _), rec in self._state.items()
                if d == direction and q == qk and rec["query"].get("photos") == photos}

    def marks_by_path(self, direction: str, query: dict[str, Any]) -> dict[str, bool]:
        """``{photo path: relevant}`` for one query on a photo folder (``query["photos"]``: the folder)."""
        qk, photos = query_key(query), query.get("photos")
        return {rec["item_text"]: rec["relevant"] for (d, q, _), rec in self._state.items()
                if d == direction and q == qk and photos is not None and rec["query"].get("photos") == photos}

    def records(self) -> list[dict[str, Any]]:
        """The current marks, oldest first."""
        return sorted(self._state.values(), key=lambda r: r["time"])

    def __len__(self) -> int:
        return len(self._state)

    def export(self, path: str | Path) -> Path:
        """Write the current marks to ``path``: ``.csv`` or ``.jsonl`` (by its suffix), atomically, after reading
        the file again (every process's marks; :attr:`skipped` then says how many lines were unreadable)."""
        path = Path(path)
        rows = self.reload().records()
        if path.suffix.lower() == ".jsonl":
            data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
        elif path.suffix.lower() == ".csv":
            buf = io.StringIO()
            w = csv.writer(buf)
            w.writerow(["time", "annotator", "direction", "query_kind", "query", "item", "item_text", "relevant"])
            for r in rows:
                kind, _, value = query_key(r["query"]).partition(":")
                w.writerow([r["time"], r["annotator"], r["direction"], kind, value, r["item"], r["item_text"],
                            int(r["relevant"])])
            data = buf.getvalue().encode("utf-8")
        else:
            raise CrossViewError(f"{path}: export as .csv or .jsonl")
        return atomic_write_bytes(path, data)
