"""A write the disk refused, said as such: which folder, how much space it needed, and what to do.

A :class:`~crossview.core.errors.StorageError` (a full disk or quota, a read-only or foreign folder) is not a bug
nor a wrong input: the person fixes it outside the app, by freeing space or choosing another folder. The app
says so in its own dialog (:func:`show_storage_error`: the title says "Disk full" or "Cannot write there", the
text names the path, the bytes needed when known and the two ways out) instead of the plain error box, for
training runs (the Train panel) and for saving marks and exports (the Query and Inspect panels).
:func:`storage_text` is the same message for a label.
"""

from __future__ import annotations

import os

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

from crossview.core.errors import StorageError, format_bytes

__all__ = ["DIALOG_NAME", "storage_error_of", "storage_text", "storage_title", "show_storage_error"]

#: the object name of the dialog (tests and screenshots find it by it)
DIALOG_NAME = "storage_error"


def storage_error_of(error: BaseException | None) -> StorageError | None:
    """The :class:`StorageError` behind ``error`` (itself, or a refused mark's ``storage``), else None."""
    if isinstance(error, StorageError):
        return error
    storage = getattr(error, "storage", None)
    return storage if isinstance(storage, StorageError) else None


def storage_title(error: StorageError) -> str:
    return "Disk full" if error.disk_full else "Cannot write there"


def storage_text(error: StorageError, what: str, then: str = "try again", elsewhere: bool = True) -> str:
    """``Could not save <what>: the disk holding <path> is full. It needed 2.9 KiB more. Free some space on that
    disk, then <then>; or choose a folder on another disk.`` (or, for an unwritable place, what the system said and
    "choose a folder you can write to"). ``elsewhere`` False: the place is fixed (a run's marks file), so only
    freeing space or making the folder writable is offered."""
    path = error.filename or "the folder"
    if error.disk_full:
        need = (f" It needed {format_bytes(error.need)} more." if error.need else
                " How much space it needed is not known (the write stopped part way).")
        other = "; or choose a folder on another disk" if elsewhere else ""
        return (f"Could not save {what}: the disk holding {path} is full.{need} Free some space on that disk, "
                f"then {then}{other}.")
    reason = os.strerror(error.errno).lower() if error.errno else "it is read-only or not yours"
    fix = "Choose a folder you can write to" if elsewhere else "Make that folder writable"
    return f"Could not save {what}: {path} cannot be written ({reason}). {fix}, then {then}."


def show_storage_error(parent: QWidget | None, error: StorageError, what: str, then: str = "try again",
                       elsewhere: bool = True) -> QMessageBox:
    """Open (window-modal, not blocking) the storage dialog over ``parent``; returns it (already shown)."""
    box = QMessageBox(QMessageBox.Icon.Critical, storage_title(error), storage_text(error, what, then, elsewhere),
                      parent=parent)
    box.setObjectName(DIALOG_NAME)
    box.setDetailedText(str(error))
    box.setWindowModality(Qt.WindowModality.WindowModal)
    box.open()
    return box
