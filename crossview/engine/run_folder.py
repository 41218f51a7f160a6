"""A run's folder: its files, their readers, and the one-writer lock (see :mod:`crossview.engine.run`).

What lives in ``RUN_DIR`` and how each file is written (atomically) is described in :mod:`crossview.engine.run`;
this module holds the names of those files, the checked readers of ``config.json`` / ``summary.json`` /
``status.json``, the writer lock (``writer.lock`` + ``writer.json``), the checkpoint's checks, and the trimming of
``metrics.jsonl`` on resume. :mod:`crossview.engine.runs` (the run store) and the run itself build on it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from crossview.core.errors import CrossViewError
from crossview.core.io import _type_ok, atomic_write_bytes, atomic_write_json, load_checkpoint, read_json_object

__all__ = ["CONFIG", "METRICS", "CHECKPOINT", "RANKS", "SUMMARY", "STATUS", "LOCK", "LOCK_INFO", "SUMMARY_KEYS",
           "default_run_dir", "read_config", "read_summary", "read_status", "run_is_locked"]

CONFIG = "config.json"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.pt"
RANKS = "ranks.npz"
SUMMARY = "summary.json"
STATUS = "status.json"
LOCK = "writer.lock"
LOCK_INFO = "writer.json"

#: The keys of summary.json that ARCHITECTURE.md fixes (scripts read them); more follow them.
SUMMARY_KEYS = ("method", "dataset", "split", "i2t", "t2i", "rsum", "train_seconds")
_METRIC_KEYS = ("R@1", "R@5", "R@10", "MedR", "MeanR")
_FORMAT = 1
def safe_name(text: str) -> str:
    """``text`` with every character but letters, digits, ``-``, ``_`` and ``.`` replaced by ``_`` (``data`` if
    empty): a folder-name part made from a dataset's name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) or "data"


def check_folder_name(name: str, what: str = "run name") -> str:
    """``name`` when it can be one folder under the runs folder; else one clear :class:`CrossViewError` line."""
    if any(ch in name for ch in "/\\") or name in (".", ".."):
        raise CrossViewError(f"{what} {name!r}: use letters, digits, '-' and '_' only")
    return name


def unused_dir(root: Path, *parts: str) -> Path:
    """``root / "<parts>-<timestamp>"``, or with ``-2``, ``-3``, ... appended: a new, unused folder name (the
    parts joined by ``-``; the dataset part should go through :func:`safe_name`)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / "-".join([*parts, stamp])
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path


def default_run_dir(method: str, dataset_name: str) -> Path:
    """``get_settings().runs_dir / "<method>-<dataset>-<timestamp>"`` (a new, unused name)."""
    from crossview.core.settings import get_settings

    return unused_dir(get_settings().runs_dir, method, safe_name(dataset_name))


_NUM = (int, float)
_OPT_STR = (str, type(None))
#: config.json keys a resume reads, with their JSON types (ints are accepted where floats are).
_CONFIG_TYPES: dict[str, Any] = {
    "data": _OPT_STR, "params": dict, "user_params": dict, "split": str, "train_split": str, "val_split": _OPT_STR,
    "data_format": _OPT_STR, "image_root": _OPT_STR, "image_encoder": _OPT_STR, "text_encoder": _OPT_STR,
    "device": str, "seed": int, "checkpoint_seconds": _NUM, "dataset_fingerprint": _OPT_STR,
    "selection": (dict, type(None)), "amp": bool, "workers": (int, type(None)), "log_every": (int, type(None)),
    "run_settings": dict}
_STATUS_TYPES: dict[str, Any] = {"phase": str, "events": int, "train_seconds": _NUM, "updated": str,
                                 "error": _OPT_STR, "checkpoint": _OPT_STR, "checkpoint_events": int,
                                 "checkpoint_step": (int, type(None))}
_SUMMARY_TYPES: dict[str, Any] = {"method": str, "dataset": str, "split": str, "i2t": dict, "t2i": dict,
                                  "rsum": _NUM, "train_seconds": _NUM}
_DAMAGED = "the run folder is damaged; restore the file from a copy, or delete the run and train again"


def read_config(run_dir: str | Path) -> dict[str, Any]:
    """``config.json`` of a run, with its keys' types checked (one clear :class:`CrossViewError` otherwise)."""
    return read_json_object(Path(run_dir) / CONFIG, required={"method": str}, optional=_CONFIG_TYPES,
                            hint=_DAMAGED)


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """``summary.json`` of a finished run (a :class:`CrossViewError` naming the folder otherwise)."""
    path = Path(run_dir) / SUMMARY
    again = f"resume the run to evaluate it again ('crossview train --resume {run_dir}')"
    if not path.is_file():
        if path.exists() or path.is_symlink():
            kind = "a folder" if path.is_dir() else "a broken link" if not path.exists() else "a pipe or device"
            raise CrossViewError(f"{path}: not a regular file ({kind} is in its place); the summary is damaged: "
                                 f"remove it, then {again}")
        try:
            finished = read_status(run_dir).get("status") == "finished"
        except CrossViewError:
            finished = False
        if finished:
            raise CrossViewError(f"{run_dir}: no {SUMMARY} although {STATUS} says the run finished; the summary is "
                                 f"missing (deleted or lost): {again}")
        raise CrossViewError(f"{run_dir}: no {SUMMARY}; the run has not finished (see {STATUS})")
    summary = read_json_object(path, optional=_SUMMARY_TYPES,
                               hint="the summary is damaged; resume the run to evaluate it again")
    for d in ("i2t", "t2i"):
        bad = [k for k, v in summary.get(d, {}).items() if not _type_ok(v, _NUM)]
        if bad:
            raise CrossViewError(f"{path}: {d}[{bad[0]!r}] should be a number; the summary is damaged; resume "
                                 "the run to evaluate it again")
    return summary


def read_status(run_dir: str | Path) -> dict[str, Any]:
    """``status.json`` of a run: ``{"status": "running"|"finished"|"cancelled"|"failed", "phase",
    "events", "checkpoint", "checkpoint_events", "checkpoint_step", "updated", ...}`` (types checked)."""
    return read_json_object(Path(run_dir) / STATUS, required={"status": str}, optional=_STATUS_TYPES,
                            hint=_DAMAGED)


# ---------------------------------------------------------------------------------- one writer per run
def _lock_info(run_dir: Path) -> dict[str, Any]:
    try:
        info = json.loads((run_dir / LOCK_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return info if isinstance(info, dict) else {}


def _holder_info(run_dir: Path, wait: float = 1.0) -> dict[str, Any]:
    """``writer.json`` of the process holding the lock; it writes it just after locking, so a reader
    that lands in between waits (up to ``wait`` s) for it."""
    deadline = time.monotonic() + wait
    while True:
        info = _lock_info(run_dir)
        if isinstance(info.get("pid"), int) or time.monotonic() >= deadline:
            return info
        time.sleep(0.02)


def _pid_alive(pid: Any) -> bool | None:
    """Whether process ``pid`` exists on this machine (None: cannot tell without harming it)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if os.name == "nt":     # os.kill(pid, 0) would terminate the process on Windows
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True    # exists, owned by someone else (or cannot tell: assume alive)
    return True


def _new_lock(run_dir: Path) -> Any:
    from filelock import FileLock

    # thread_local=False: the GUI may start a run on one thread and cancel it from another.
    # preserve_lock_file: deleting a lock file on release lets two processes lock two different inodes
    # (filelock < 4 has no such option and never deletes it on POSIX).
    try:
        return FileLock(str(run_dir / LOCK), thread_local=False, preserve_lock_file=True)
    except TypeError:
        return FileLock(str(run_dir / LOCK), thread_local=False)


def _locked_message(run_dir: Path, info: dict[str, Any]) -> str:
    pid, host, since = info.get("pid", "?"), info.get("host", "?"), info.get("started", "?")
    return (f"{run_dir} is being written by another CrossView process (PID {pid} on {host}, since {since}); "
            f"wait for it to finish or stop it (kill {pid}), then 'crossview train --resume {run_dir}'. "
            "Two writers would corrupt the run")


def run_is_locked(run_dir: str | Path) -> int | None:
    """The PID of the process writing the run in ``run_dir`` now (``0`` if it has not said yet), or
    ``None`` when no process holds its lock (a lock left by a dead process does not count)."""
    from filelock import Timeout

    folder = Path(run_dir)
    if not (folder / LOCK).is_file():
        return None
    lock = _new_lock(folder)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        pid = _holder_info(folder).get("pid")
        return pid if isinstance(pid, int) and not isinstance(pid, bool) else 0
    except (OSError, ValueError):   # a read-only folder: nobody can be writing the run there
        return None
    lock.release()
    return None


class _WriterLock:
    """The OS lock (``flock`` / ``LockFileEx`` through ``filelock``) of one run folder, with
    ``writer.json`` (PID, host, start time) beside it. The OS drops the lock when its process dies,
    so a SIGKILLed run's lock is simply free: the next writer takes it and says so."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._lock = _new_lock(run_dir)
        self.held = False

    def acquire(self, wait: float = 2.0) -> str | None:
        """Take the lock (waiting up to ``wait`` s: a :func:`run_is_locked` probe holds it for an
        instant) or raise :class:`CrossViewError` naming the holder. Returns a note when a lock left by
        a process that died was taken over."""
        from filelock import Timeout

        try:
            self._lock.acquire(timeout=wait)
        except Timeout:
            raise CrossViewError(_locked_message(self.run_dir, _holder_info(self.run_dir))) from None
        except (OSError, ValueError) as e:
            raise CrossViewError(f"{self.run_dir}: cannot lock the run folder ({getattr(e, 'strerror', None) or e}); "
                                 "is it writable, on a file system with locks?") from None
        self.held = True
        previous = _lock_info(self.run_dir)
        note = None
        if previous.get("pid") not in (None, os.getpid()):
            same_host = previous.get("host") == socket.gethostname()
            alive = ", no longer running" if same_host and _pid_alive(previous.get("pid")) is False else ""
            note = (f"took over the run folder's lock left by PID {previous.get('pid')} on "
                    f"{previous.get('host', '?')}{alive} (it stopped without releasing it, e.g. killed)")
        try:
            atomic_write_json(self.run_dir / LOCK_INFO, {"pid": os.getpid(), "host": socket.gethostname(),
                                                         "started": _now()})
        except BaseException:
            self.release()
            raise
        return note

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            (self.run_dir / LOCK_INFO).unlink(missing_ok=True)
        except OSError:
            pass
        self._lock.release(force=True)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _stat_key(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


@dataclass
class _Loaded:
    """A run's checkpoint as read (safely, and checked) before resuming, and the file's stat then."""

    ckpt: dict[str, Any] | None
    stat: tuple[int, int] | None

    @classmethod
    def read(cls, path: Path) -> "_Loaded":
        stat = _stat_key(path)
        if stat is None:
            return cls(None, None)
        ckpt = load_checkpoint(path)
        _check_checkpoint(ckpt, path)
        return cls(ckpt, stat)


def _check_checkpoint(ckpt: dict[str, Any], path: Path) -> None:
    """The fields a resume reads, with their types (a checkpoint is data: it may have been edited)."""
    want = {"method_state": dict, "events": int, "phase": str, "train_seconds": (int, float)}
    for key, typ in want.items():
        if key not in ckpt or not _type_ok(ckpt[key], typ):
            raise CrossViewError(f"{path}: the checkpoint has no valid {key!r}; it is damaged or from another "
                                 "program: retrain, or resume from a copy of the run")


def _checkpoint_info(ckpt: dict[str, Any]) -> dict[str, Any]:
    """What status.json says about a checkpoint (its payload): where it is and how far it got."""
    step = ckpt.get("step")
    return {"checkpoint": CHECKPOINT, "checkpoint_events": ckpt["events"],
            "checkpoint_step": step if isinstance(step, int) and not isinstance(step, bool) else None,
            "checkpoint_phase": ckpt["phase"], "checkpoint_saved": str(ckpt.get("saved", ""))}


def _trim_metrics(path: Path, keep_bytes: int | None, keep_checkpoint: int | None = None) -> int:
    """Drop what ``metrics.jsonl`` holds after byte ``keep_bytes`` except ``log`` lines (the messages
    of the stopped execution) and the ``checkpoint`` line of the checkpoint at event ``keep_checkpoint``
    (written just after it), rewriting the file atomically; returns the number of lines dropped."""
    if keep_bytes is None or keep_bytes < 0:
        return 0
    try:
        data = path.read_bytes()
    except OSError:
        return 0
    if len(data) <= keep_bytes:
        return 0
    head, tail = data[:keep_bytes], data[keep_bytes:]
    if head and not head.endswith(b"\n"):   # not a line boundary: the file is not the one the checkpoint saw
        return 0
    kept: list[bytes] = []
    dropped = 0
    for line in tail.splitlines():
        if not line.strip():
            continue
        try:
            d = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):
            d = None
        is_log = isinstance(d, dict) and d.get("event") == "log"
        its_checkpoint = isinstance(d, dict) and d.get("event") == "checkpoint" and keep_checkpoint is not None \
            and d.get("step") == keep_checkpoint
        if is_log or its_checkpoint:
            kept.append(line + b"\n")
        else:
            dropped += 1
    if dropped:
        atomic_write_bytes(path, head + b"".join(kept))
    return dropped
