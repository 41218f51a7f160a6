"""Helpers shared by the command modules: progress printing and the dataset arguments."""

from __future__ import annotations

import argparse
import sys
import time

class ProgressPrinter:
    """A one-line progress bar on stderr (only on a terminal; silent otherwise but for the final line)."""

    def __init__(self, label: str, stream=None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.start = time.monotonic()
        self._last = -1

    def __call__(self, done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if pct == self._last:
            return
        self._last = pct
        if self.tty:
            bar = "#" * (pct // 4)
            self.stream.write(f"\r{self.label} [{bar:<25}] {pct:3d}% ({done}/{total})")
            if done >= total:
                self.stream.write(f"  {time.monotonic() - self.start:.1f}s\n")
            self.stream.flush()


def _add_dataset_args(p: argparse.ArgumentParser) -> None:
    from crossview.data import known_formats
    p.add_argument("--format", choices=known_formats(), help="dataset format (default: detected from the path)")
    p.add_argument("--image-root", metavar="DIR", help="folder the dataset's image paths are relative to "
                   "(default: guessed next to the dataset file)")
