"""Time left in a stage of work: one estimator for every front end (the app's progress line, the CLI's)."""

from __future__ import annotations

import re
import time
from typing import Callable

__all__ = ["StageEta", "format_seconds", "stage_key"]


def format_seconds(s: float) -> str:
    """``7 s``, ``3 min 05 s``, ``1 h 02 min``: a duration for a person."""
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def stage_key(message: str, total: int) -> str:
    """What identifies a stage across its progress events: the message with its numbers blanked ("epoch 3/20"
    and "epoch 4/20" are one stage) and the total."""
    return f"{re.sub(r'[0-9]+', '#', message)}|{total}"


class StageEta:
    """Seconds left in the running stage, from its own rate since it began, pauses excluded.

    A new stage (another :func:`stage_key`, or a fraction that goes back) restarts the clock, so the time spent in
    earlier stages (feature extraction before training) never inflates the estimate of this one; while paused the
    clock stands still. No estimate (None) until the stage has done ``min_fraction`` of its work."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, min_fraction: float = 0.01) -> None:
        self._clock = clock
        self.min_fraction = min_fraction
        self._key: str | None = None
        self._t0 = self._f0 = self._last = 0.0
        self._paused_at: float | None = None
        self._paused_total = 0.0

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = self._clock()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._paused_total += self._clock() - self._paused_at
            self._paused_at = None

    def active_seconds(self) -> float:
        """The clock less every pause (the current one included)."""
        now = self._clock()
        return now - self._paused_total - (now - self._paused_at if self._paused_at is not None else 0.0)

    def update(self, key: str, fraction: float) -> float | None:
        """Record that stage ``key`` is at ``fraction`` (0-1) now; returns the seconds it has left, or None."""
        t = self.active_seconds()
        if key != self._key or fraction < self._last:
            self._key, self._t0, self._f0 = key, t, fraction
        self._last = fraction
        done = fraction - self._f0
        if fraction >= 1.0 or done < self.min_fraction or t <= self._t0:
            return None
        return (t - self._t0) * (1.0 - fraction) / done
