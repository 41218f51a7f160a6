"""Test and benchmark helper: how long the GUI thread is blocked.

Lives in tests/ (it is no part of the app); ``bench/gui_latency.py`` puts this folder on ``sys.path`` to
use the same probe, so the tests' "never frozen" check and the benchmark's 50 ms goal measure alike.
"""

from __future__ import annotations

from PySide6.QtCore import QElapsedTimer, QObject, QTimer


class LatencyProbe(QObject):
    """Measures how long the GUI thread is blocked: a 10 ms timer records the largest gap between ticks."""

    def __init__(self, interval_ms: int = 10, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.interval_ms = interval_ms
        self.max_gap_ms = 0.0
        self.ticks = 0
        self.gaps_ms: list[float] = []      #: every gap beyond the interval (for percentiles in bench/)
        self._clock = QElapsedTimer()
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._tick)

    def start(self) -> "LatencyProbe":
        self.max_gap_ms = 0.0
        self.ticks = 0
        self.gaps_ms = []
        self._clock.start()
        self._timer.start()
        return self

    def stop(self) -> float:
        self._timer.stop()
        return self.max_gap_ms

    def _tick(self) -> None:
        gap = self._clock.restart()
        self.ticks += 1
        if self.ticks > 1:  # the first gap includes the start-up
            late = float(gap) - self.interval_ms
            self.gaps_ms.append(late)
            self.max_gap_ms = max(self.max_gap_ms, late)
