"""Files of a run, written so that nothing the user made is ever half-written.

- :func:`atomic_write_bytes` / :func:`atomic_write_json`: a temp file in the same folder, flushed and
  fsync'ed, then ``os.replace``'d over the target (atomic on POSIX and Windows). A crash or SIGKILL at
  any point leaves either the old file or the new one, never a mixture.
- :func:`save_checkpoint` / :func:`load_checkpoint`: ``torch.save`` into such a temp file.
- :class:`EventLog`: ``metrics.jsonl``, one event per line, appended and flushed as it happens;
  :func:`read_events` reads it back and skips a torn last line (a crash mid-append).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from crossview.errors import CrossViewError

__all__ = ["atomic_write_bytes", "atomic_write_json", "atomic_writer", "read_json", "save_checkpoint",
           "load_checkpoint", "EventLog", "read_events"]


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows cannot open folders; the rename is durable enough there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_writer(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Call ``write(f)`` on a temp file beside ``path`` and rename it over ``path`` once complete.

    If ``write`` raises (or the process dies) the temp file is removed (or left as ``.*.tmp``, which
    is never read) and ``path`` keeps its previous content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_writer(path, lambda f: f.write(data))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically (numpy values converted)."""
    from crossview.engine.events import _jsonable
    text = json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n"
    return atomic_write_bytes(path, text.encode("utf-8"))


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; a missing or malformed file raises :class:`CrossViewError` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CrossViewError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CrossViewError(f"{path}: not valid JSON ({e}); the file is damaged, delete it or the run") from None


def _write_payload(f: BinaryIO, data: memoryview) -> None:
    """Write a serialised checkpoint into the open temp file (a seam the SIGKILL test slows down)."""
    f.write(data)


def save_checkpoint(path: str | Path, obj: dict[str, Any]) -> Path:
    """``torch.save(obj)`` to ``path`` atomically (temp file in the same folder, then ``os.replace``)."""
    import torch

    def write(f: BinaryIO) -> None:
        buf = io.BytesIO()
        torch.save(obj, buf)
        _write_payload(f, buf.getbuffer())

    return atomic_writer(path, write)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (on the CPU).

    Raises :class:`CrossViewError` naming the file when it is missing or unreadable.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise CrossViewError(f"{path}: checkpoint not found; give a checkpoint.pt written by "
                             "'crossview train' or Method.save()")
    try:
        # Our checkpoints hold numpy arrays and plain Python objects besides tensors, which the
        # weights-only unpickler refuses; they are files this program wrote for this user.
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same thing to the user
        raise CrossViewError(f"{path}: cannot read the checkpoint ({type(e).__name__}: {e}); it is damaged "
                             "or from another program; retrain or resume from another run") from None
    if not isinstance(obj, dict):
        raise CrossViewError(f"{path}: not a CrossView checkpoint (expected a dict, got {type(obj).__name__})")
    return obj


class EventLog:
    """``metrics.jsonl``: one JSON object per line, appended, flushed and fsync'ed per event.

    Each line is ``event.to_dict()`` plus ``"time"`` (seconds since the epoch) and ``"t"`` (seconds
    since the log was opened).
    """

    def __init__(self, path: str | Path, fsync: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._start = time.monotonic()
        # A torn last line (crash mid-append) must not glue itself to the next event.
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            if torn:
                with open(self.path, "ab") as f:
                    f.write(b"\n")
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, event: Any) -> None:
        """Append one event (an :class:`~crossview.engine.events.Event` or a plain dict)."""
        d = event.to_dict() if hasattr(event, "to_dict") else dict(event)
        d = {**d, "time": round(time.time(), 3), "t": round(time.monotonic() - self._start, 3)}
        self._f.write(json.dumps(d) + "\n")
        self._f.flush()
        if self._fsync:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_events(path: str | Path) -> Iterator[dict[str, Any]]:
    """The events of a ``metrics.jsonl`` as dicts, skipping lines that do not parse (a torn write)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
