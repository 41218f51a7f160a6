"""Run long work off the GUI thread and talk back only through queued signals (STYLE.md 2-3).

The work is a plain function that knows nothing of Qt: ``fn(progress, should_stop) -> result``, where
``progress(done, total)`` reports and ``should_stop()`` is polled between batches. Progress is throttled
(sent only when the rounded percentage changes). A superseded task's results are dropped by the owner
checking :attr:`Task.token`.

Why not ``concurrent.futures`` (issue 12 asked): a ``Future`` reports once, at the end, and its
``cancel()`` only stops work that has not started; these workers must stream progress and events to
the GUI thread as *queued Qt signals* while running (STYLE.md 3), hold a generator between two events
(:meth:`EventTask.pause`), and close it on stop so the engine's ``finally`` checkpoints the run. A
futures-based version would still need this module's signals, stop flag and pause gate around the
executor, plus a thread pool the GUI never shares: it would add a layer, not remove code. The thread
itself is Qt's ``QThread`` (what superqt's ``thread_worker``, the model STYLE.md cites, uses too).
"""

from __future__ import annotations

import threading
import traceback
from typing import Any, Callable

from PySide6.QtCore import QObject, Qt, QThread, Signal

from crossview.core.errors import CrossViewError

Work = Callable[[Callable[[int, int], None], Callable[[], bool]], Any]


class Task(QObject):
    """One piece of work in its own QThread. Connect to the signals, then call :meth:`start`.

    :attr:`succeeded`, :attr:`failed` and :attr:`finished` are emitted on the thread that owns the task
    (the GUI thread), relayed from the worker through queued connections made here, before the thread
    starts. So a caller that connects right after :meth:`start` returns never misses the outcome, however
    fast the work fails: the relay waits for the GUI thread's next event-loop turn. (Emitting them on the
    worker thread, as before, lost the signal for such a connection when a damaged run failed at once.)
    """

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
        self._runner.done.connect(self._thread.quit, Qt.ConnectionType.DirectConnection)  # quit is thread-safe; wait() must not deadlock
        self._runner.succeeded.connect(self.succeeded, Qt.ConnectionType.QueuedConnection)
        self._runner.failed.connect(self.failed, Qt.ConnectionType.QueuedConnection)
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
    succeeded = Signal(object)   # relayed to Task.succeeded on the GUI thread
    failed = Signal(str, str)    # relayed to Task.failed on the GUI thread

    def __init__(self, task: Task) -> None:
        super().__init__()
        self._task = task

    def run(self) -> None:
        t = self._task
        try:
            result = t._fn(t._report, t._stop.is_set)
        except CrossViewError as e:
            self.failed.emit(str(e), "")
        except Exception as e:  # a bug: keep the app alive and show the traceback
            self.failed.emit(f"{type(e).__name__}: {e}", traceback.format_exc())
        else:
            if not t.cancelled:
                self.succeeded.emit(result)
        finally:
            self.done.emit()


class EventTask(QObject):
    """Drive an event generator (the engine's ``train(...)``, a method's ``fit_iter``) in a QThread.

    ``factory()`` is called on the worker thread and returns the generator; each item it yields is
    sent through :attr:`event` (a queued signal), except that consecutive progress-like events are
    throttled to at most one per ``min_interval`` seconds (the last one is always delivered).
    :meth:`pause` holds the generator between two events (nothing is lost; the method simply is not
    asked for its next batch), :meth:`resume` continues, :meth:`stop` ends the iteration at the next
    event, which is how cancelling works (ARCHITECTURE.md: the method checks between batches).
    """

    event = Signal(object)
    failed = Signal(str, str)
    finished = Signal()
    paused_changed = Signal(bool)

    def __init__(self, factory: Callable[[], Any], name: str = "events", min_interval: float = 0.05,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self._factory = factory
        self._min_interval = min_interval
        self._stop = threading.Event()
        self._run = threading.Event()
        self._run.set()
        self.result: Any = None
        self._thread = QThread()
        self._thread.setObjectName(f"crossview-{name}")
        self._runner = _EventRunner(self)
        self._runner.moveToThread(self._thread)
        self._thread.started.connect(self._runner.run)
        self._runner.done.connect(self._thread.quit, Qt.ConnectionType.DirectConnection)  # quit is thread-safe; wait() must not deadlock
        self._thread.finished.connect(self.finished)

    def start(self) -> "EventTask":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._run.set()   # a paused task must wake up to stop

    def pause(self) -> None:
        if self._run.is_set() and not self._stop.is_set():
            self._run.clear()
            self.paused_changed.emit(True)

    def resume(self) -> None:
        if not self._run.is_set():
            self._run.set()
            self.paused_changed.emit(False)

    @property
    def paused(self) -> bool:
        return not self._run.is_set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def is_running(self) -> bool:
        return self._thread.isRunning()

    def wait(self, msecs: int = 30000) -> bool:
        return self._thread.wait(msecs)


def _is_progress(ev: Any) -> bool:
    return type(ev).__name__ == "Progress"


class _EventRunner(QObject):
    done = Signal()

    def __init__(self, task: EventTask) -> None:
        super().__init__()
        self._task = task

    def run(self) -> None:
        import time

        t = self._task
        gen = None
        last_sent = 0.0
        held = None
        try:
            gen = t._factory()
            for ev in gen:
                if _is_progress(ev):
                    now = time.monotonic()
                    if now - last_sent < t._min_interval:
                        held = ev
                    else:
                        held = None
                        last_sent = now
                        t.event.emit(ev)
                else:
                    if held is not None:
                        t.event.emit(held)
                        held = None
                    t.event.emit(ev)
                t._run.wait()
                if t._stop.is_set():
                    break
            if held is not None:
                t.event.emit(held)
        except CrossViewError as e:
            t.failed.emit(str(e), "")
        except Exception as e:  # a bug: keep the app alive and show the traceback
            t.failed.emit(f"{type(e).__name__}: {e}", traceback.format_exc())
        finally:
            if gen is not None and hasattr(gen, "close"):
                try:
                    gen.close()   # runs the generator's finally blocks: the engine's cancel path
                except Exception as e:  # noqa: BLE001 - report, never crash the thread
                    t.failed.emit(f"while stopping: {type(e).__name__}: {e}", traceback.format_exc())
            self.done.emit()


#: Heavy modules the engine imports lazily. Importing one in a worker thread holds the GIL for up to
#: a few hundred ms (measured: scikit-learn's text features, 0.35 s), which would freeze the GUI
#: thread; the panels that start such work import them first, on the GUI thread, before any run.
PRELOAD_MODULES = ("torch", "torchvision", "sklearn.feature_extraction.text", "sklearn.decomposition",
                   "scipy.linalg", "crossview.features.image", "crossview.features.text", "crossview.engine.run")


def preload_engine_modules() -> None:
    """Import :data:`PRELOAD_MODULES` now (cheap when already imported), then :func:`freeze_heap`."""
    import importlib

    for name in PRELOAD_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional part is missing: the run itself will say so clearly
            pass
    freeze_heap()


def freeze_heap() -> None:
    """Take every object alive now out of the cyclic garbage collector's full passes (``gc.freeze``).

    With torch, transformers and scikit-learn imported the heap holds about half a million tracked
    objects, and a full (generation 2) collection - which Python starts by itself whenever enough new
    objects have survived - walks all of them: 0.1-0.35 s on the GUI thread, measured on the 2-core
    CI machine (it failed the 50 ms test as a 56 ms stall). Frozen objects are never walked again; they
    are still freed by reference counting, so the cost is only that reference cycles among them are
    kept. Called once, after the heavy imports (modules live as long as the process). It is no longer
    called after each dataset load: that was added to pass a 50 ms test (issue 12) and kept every
    replaced dataset's reference cycles for good, to save ~20 ms per full pass at 30,000 images.
    """
    import gc

    gc.freeze()
