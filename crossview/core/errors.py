"""Errors a user can act on.

Every error the product raises on bad input is a :class:`CrossViewError` whose message names the file
or value, the entry, what was wrong and what to do. The command line prints it as one line; the GUI
shows it in a dialog. Anything else escaping is a bug.
"""

from __future__ import annotations

from pathlib import Path


class CrossViewError(Exception):
    """Base class for errors caused by the user's input or environment (not by a bug)."""


class DatasetError(CrossViewError):
    """A dataset file or folder is missing, malformed or inconsistent."""

    def __init__(self, problem: str, path: str | Path | None = None, entry: str | None = None,
                 hint: str | None = None) -> None:
        self.problem = problem
        self.path = None if path is None else str(path)
        self.entry = entry
        self.hint = hint
        where = ""
        if self.path is not None:
            where = self.path
            if entry:
                where += f" ({entry})"
            where += ": "
        elif entry:
            where = f"{entry}: "
        msg = where + problem
        if hint:
            msg += f". {hint}"
        super().__init__(msg)


class WeightsNotFoundError(CrossViewError):
    """Pretrained weights could not be resolved offline."""


class Cancelled(CrossViewError):
    """Long work stopped because the caller asked it to (``should_stop()`` returned True)."""


class StorageError(CrossViewError, OSError):
    """A file could not be written where it was asked: the disk (or quota) is full, or the place is read-only
    or not the user's. It is an :class:`OSError` too (``errno`` and ``filename`` kept), so code that tolerates a
    failing optional write (the feature cache) catches it as one. ``need``: the bytes the write needed, when
    known; :attr:`disk_full` tells a full disk (free space, or another disk) from a place that cannot be written
    (another folder), for a front end that says which (the app's storage dialog)."""

    def __init__(self, errno_: int, message: str, filename: str | None = None, *, need: int | None = None) -> None:
        super().__init__(errno_, message, filename)
        self.message = message
        self.need = need

    @property
    def disk_full(self) -> bool:
        """The disk or the quota is full (or the file too large for it), rather than the place unwritable."""
        import errno

        return self.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1), errno.EFBIG)

    def __str__(self) -> str:
        return self.message


#: errno values that say the environment refused a write (not a bug): full disk or quota, no permission,
#: read-only file system, file too large, a file where a folder should be (or the reverse), a name too long
_STORAGE_ERRNOS = {"ENOSPC", "EDQUOT", "EACCES", "EPERM", "EROFS", "EFBIG", "ENOTDIR", "EISDIR", "ENAMETOOLONG"}


def is_storage_error(e: BaseException) -> bool:
    """True for an :class:`OSError` the environment caused while writing (see :data:`_STORAGE_ERRNOS`)."""
    import errno

    return isinstance(e, OSError) and e.errno in {getattr(errno, n) for n in _STORAGE_ERRNOS if hasattr(errno, n)}


def storage_error(e: OSError, path: str | Path | None = None, need: int | None = None) -> StorageError:
    """One line for a write that failed with ``e``: the path, what the system said, how many bytes the write
    needed when known, and what to do."""
    import errno

    where = str(path if path is not None else (e.filename or "a file"))
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1), errno.EFBIG):
        size = f"; {format_bytes(need)} were needed" if need else ""
        what = "the disk is full" if e.errno == errno.ENOSPC else (e.strerror or "file too large").lower()
        hint = "free some space there, or choose a folder on another disk"
    else:
        size = ""
        what = "it cannot be written here: " + (e.strerror or str(e)).lower()
        hint = "choose a folder you can write to"
    return StorageError(e.errno or 0, f"{where}: {what}{size}; {hint}", where, need=need)


def format_bytes(n: int) -> str:
    """``812 bytes``, ``2.9 KiB``, ``1.2 GiB``: a size for a person."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"
