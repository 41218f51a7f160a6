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
