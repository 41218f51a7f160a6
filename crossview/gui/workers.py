"""Run long work off the GUI thread and talk back only through queued signals (STYLE.md 2-3).

The work is a plain function that knows nothing of Qt: ``fn(progress, should_stop) -> result``, where
``progress(done, total)`` reports and ``should_stop()`` is polled between batches. Progress is throttled
(sent only when the rounded percentage changes). A superseded task's results are dropped by the owner
checking :attr:`Task.token`.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any, Callable

from PySide6.QtCore import QObject, QThread, Signal

from crossview.errors import CrossViewError

Work = Callable[[Callable[[int, int], None], Callable[[], bool]], Any]


class Task(QObject):
    """One piece of work in its own QThread. Connect to the signals, then call :meth:`start`."""

    progress = Signal(int, int)  # done, total
    succeeded = Signal(object)   # the function's return value
    failed = Signal(str, str)    # user-facing message, details (traceback for bugs, empty for input errors)
    finished = Signal()          # after succeeded/failed/cancel, always

    _counter = 0

    def __init__(self, fn: Work, name: str = "task", parent: QObject | None = None) -> None:
        super().__init__(parent)
        Task._counter += 1
        self.token = Task._counter
        self.name = name
        self._fn = fn
        self._stop = threading.Event()
        self._last_pct = -1
        self._thread = QThread()
        self._thread.setObjectName(f"crossview-{name}")
        self._runner = _Runner(self)
        self._runner.moveToThread(self._thread)
        self._thread.started.connect(self._runner.run)
        self._runner.done.connect(self._thread.quit)
        self._thread.finished.connect(self.finished)

    def start(self) -> "Task":
        self._thread.start()
        return self

    def cancel(self) -> None:
        self._stop.set()

    @property
    def cancelled(self) -> bool:
        return self._stop.is_set()

    def is_running(self) -> bool:
        return self._thread.isRunning()

    def wait(self, msecs: int = 30000) -> bool:
        return self._thread.wait(msecs)

    # called on the worker thread
    def _report(self, done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if pct != self._last_pct:
            self._last_pct = pct
            self.progress.emit(done, total)


class _Runner(QObject):
    done = Signal()

    def __init__(self, task: Task) -> None:
        super().__init__()
        self._task = task

    def run(self) -> None:
        t = self._task
        try:
            result = t._fn(t._report, t._stop.is_set)
        except CrossViewError as e:
            t.failed.emit(str(e), "")
        except Exception as e:  # a bug: keep the app alive and show the traceback
            t.failed.emit(f"{type(e).__name__}: {e}", traceback.format_exc())
        else:
            if not t.cancelled:
                t.succeeded.emit(result)
        finally:
            self.done.emit()
