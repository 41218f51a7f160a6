"""Helpers shared by the command modules: progress printing and the dataset arguments."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["ProgressPrinter", "format_seconds", "load_dataset_reporting", "render_demo_reporting"]


def format_seconds(s: float) -> str:
    """``7 s``, ``3 min 05 s``, ``1 h 02 min``: a duration for a person."""
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class ProgressPrinter:
    """Progress of one stage on ``stream`` (default stderr), fed with ``printer(done, total)``.

    On a terminal: a one-line bar with the count and an ETA, redrawn at most 5 times a second, ended by
    the elapsed time. Elsewhere (a log file, a pipe): a plain line such as ``features: images 1,234/3,500
    (35%) ETA 40 s`` at the first call, then at most every ``interval`` seconds, and a final ``... done in
    12 s`` line. ``total`` 0 means unknown (counts without percentage or ETA). ``label`` may be changed
    by a call (``printer(done, total, label="epoch 3/20")``). ``clock`` is for tests.
    """

    def __init__(self, label: str, stream: TextIO | None = None, *, interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else bool(tty)
        self.interval = float(interval)
        self.clock = clock
        self.start = clock()
        self._origin: tuple[float, int] | None = None   # (time, done) of the first call: the ETA's rate
        self._last_write: float | None = None
        self._done = -1
        self.finished = False
        self.line_open = False      # a bar is drawn on the terminal without its newline yet

    # ------------------------------------------------------------------ text
    def _eta(self, now: float, done: int, total: int) -> str:
        if self._origin is None or total <= 0 or done >= total:
            return ""
        t0, d0 = self._origin
        if done <= d0 or now <= t0:
            return ""
        return f" ETA {format_seconds((total - done) * (now - t0) / (done - d0))}"

    def _count(self, done: int, total: int) -> str:
        if total <= 0:
            return f"{done:,}"
        return f"{done:,}/{total:,} ({int(100 * done / total)}%)"

    # ------------------------------------------------------------------ calls
    def __call__(self, done: int, total: int, label: str | None = None) -> None:
        now = self.clock()
        if label:
            self.label = label
        done, total = int(done), int(total)
        if self.finished or done < self._done:
            if done >= self._done and done >= total > 0:
                return                      # the same stage reported done twice
            self._restart(now)               # a new pass of the stage
        if self._origin is None:
            self._origin = (now, done)
        self._done = done
        final = total > 0 and done >= total
        if self.tty:
            self._draw(now, done, total, final)
        elif final or self._last_write is None or now - self._last_write >= self.interval:
            if final:
                text = f"{self.label} {self._count(done, total)} done in {format_seconds(now - self.start)}"
            else:
                text = f"{self.label} {self._count(done, total)}{self._eta(now, done, total)}"
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last_write = now
        self.finished = final

    def _draw(self, now: float, done: int, total: int, final: bool) -> None:
        if not final and self._last_write is not None and now - self._last_write < 0.2:
            return
        if total > 0:
            bar = "#" * int(25 * min(done, total) / total)
            text = f"{self.label} [{bar:<25}] {self._count(done, total)}{self._eta(now, done, total)}"
        else:
            text = f"{self.label} {done:,}"
        self.stream.write(f"\r\033[K{text}")
        if final:
            self.stream.write(f"  {format_seconds(now - self.start)}\n")
        self.stream.flush()
        self._last_write = now
        self.line_open = not final

    def _restart(self, now: float) -> None:
        if self.line_open:
            self.stream.write("\n")
        self.start, self._origin, self._last_write = now, None, None
        self._done, self.finished, self.line_open = -1, False, False

    def note(self, text: str) -> None:
        """A message line of its own (ends an open bar first)."""
        if self.line_open:
            self.stream.write("\n")
            self.line_open = False
        self.stream.write(text + "\n")
        self.stream.flush()


def render_demo_reporting(stream: TextIO | None = None) -> None:
    """Render the built-in demo into the cache now if it is not there yet, saying so and showing progress."""
    from crossview.data.demo import demo_path

    stream = stream or sys.stderr
    said: dict[str, ProgressPrinter] = {}

    def progress(done: int, total: int) -> None:
        if "bar" not in said:
            said["bar"] = ProgressPrinter("rendering the demo", stream)
            said["bar"].note("crossview: rendering the built-in demo dataset (first use only; later runs read it "
                             "from the cache)")
        said["bar"](done, total)

    demo_path(progress=progress)


def load_dataset_reporting(source: str, format: str | None = None, image_root: str | None = None,
                           stream: TextIO | None = None) -> Any:
    """:func:`crossview.data.load_dataset`, with progress when the demo is rendered on first use."""
    from crossview.data import load_dataset

    if str(source) == "demo" or format == "demo":
        render_demo_reporting(stream)
    return load_dataset(source, format=format, image_root=image_root)


def _add_dataset_args(p: argparse.ArgumentParser) -> None:
    from crossview.data import known_formats
    p.add_argument("--format", choices=known_formats(), help="dataset format (default: detected from the path)")
    p.add_argument("--image-root", metavar="DIR", help="folder the dataset's image paths are relative to "
                   "(default: guessed next to the dataset file)")
