"""Run long work off the GUI thread and talk back only through queued signals (STYLE.md 2, 3 and 17).

One base, two kinds, as superqt's ``WorkerBase`` with its function and generator workers:

* :class:`WorkerBase` holds what every worker needs: the ``QThread``, the runner object that lives on it,
  the stop flag and the pause gate, the error handling (a :class:`CrossViewError` is the user's to fix and
  fails with ``(message, "")``; anything else is a bug and fails with ``("Type: message", traceback)``),
  and the queued relays that carry :attr:`~WorkerBase.failed` and :attr:`~WorkerBase.finished` to the
  owner's thread. The relays are connected before the thread starts, so a caller that connects right
  after :meth:`~WorkerBase.start` never misses the outcome, however fast the work fails.
* :class:`Task` runs a plain function that knows nothing of Qt: ``fn(progress, should_stop) -> result``,
  where ``progress(done, total)`` reports (sent only when the rounded percentage changes) and
  ``should_stop()`` is polled between batches (it also holds there while the task is paused).
  A superseded task's results are dropped by the owner checking :attr:`WorkerBase.token`.
* :class:`EventTask` drives an event generator (the engine's ``train(...)``, a method's ``fit_iter``),
  thinning out runs of progress events, holding between two events while paused, and closing the
  generator on stop so the engine's ``finally`` checkpoints the run.

Why not ``concurrent.futures`` (issue 12 asked): a ``Future`` reports once, at the end, and its
``cancel()`` only stops work that has not started; these workers must stream progress and events to
the GUI thread as *queued Qt signals* while running (STYLE.md 3), hold a generator between two events
(:meth:`WorkerBase.pause`), and close it on stop so the engine's ``finally`` checkpoints the run. A
futures-based version would still need this module's signals, stop flag and pause gate around the
executor, plus a thread pool the GUI never shares: it would add a layer, not remove code. The thread
itself is Qt's ``QThread`` (what superqt's ``thread_worker``, the model STYLE.md cites, uses too).
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from typing import Any, Callable, Self

from PySide6.QtCore import QObject, Qt, QThread, Signal

from crossview.core.errors import CrossViewError

Work = Callable[[Callable[[int, int], None], Callable[[], bool]], Any]

_QUEUED = Qt.ConnectionType.QueuedConnection


def _describe(e: BaseException, prefix: str = "") -> tuple[str, str]:
    """``(message, details)`` for :attr:`WorkerBase.failed`: an input error gives no details, a bug its traceback."""
    if isinstance(e, CrossViewError):
        return prefix + str(e), ""
    return f"{prefix}{type(e).__name__}: {e}", traceback.format_exc()


class _Runner(QObject):
    """Lives on the worker thread. Its signals are the worker thread's only way out: each is relayed to the
    worker's signal of the same meaning by a queued connection made before the thread starts."""

    done = Signal()              # quits the thread (direct); QThread.finished then relays WorkerBase.finished
    failed = Signal(str, str)    # -> WorkerBase.failed
    progress = Signal(int, int)  # -> Task.progress
    succeeded = Signal(object)   # -> Task.succeeded
    event = Signal(object)       # -> EventTask.event

    def __init__(self, worker: "WorkerBase") -> None:
        super().__init__()
        self._worker = worker

    def run(self) -> None:
        w = self._worker
        try:
            w._work(self)
        except Exception as e:  # noqa: BLE001 - a bug too: keep the app alive and show the traceback
            w.error = e          # set before the (queued) failed signal: its slots may look at it
            self.failed.emit(*_describe(e))
        finally:
            try:
                w._cleanup()
            except Exception as e:  # noqa: BLE001 - report, never crash the thread
                self.failed.emit(*_describe(e, "while stopping: "))
            self.done.emit()


class WorkerBase(QObject):
    """What both kinds of worker share: one QThread, a stop flag, a pause gate, failures and the end.

    Connect to the signals, then call :meth:`start`. :attr:`failed` and :attr:`finished` (and each kind's
    own outcome signals) are emitted on the thread that owns the worker (the GUI thread), relayed from the
    worker thread through queued connections made here, before the thread starts: a caller that connects
    right after :meth:`start` returns never misses the outcome, since the relay waits for the GUI thread's
    next event-loop turn. (Emitting on the worker thread, as ``Task`` once did and ``EventTask`` did until
    issue 29, lost the signal for such a connection when a damaged run failed at once.)

    Subclasses implement :meth:`_work` (runs on the worker thread and emits through the runner's signals)
    and may implement :meth:`_cleanup` (runs there after it, whatever happened).
    """

    failed = Signal(str, str)     # user-facing message, details (traceback for bugs, empty for input errors)
    finished = Signal()           # after every other signal, always (success, failure or stop)
    paused_changed = Signal(bool)  # True on pause, False on resume (emitted by the caller of pause/resume)

    _tokens = itertools.count(1)

    def __init__(self, name: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.token = next(WorkerBase._tokens)   # increases with each worker made: the newest one wins
        self.name = name
        #: the exception the work failed with (None until :attr:`failed`): a slot of :attr:`failed` tells a
        #: :class:`~crossview.core.errors.StorageError` (a full disk) from other errors with it
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._gate = threading.Event()          # set: running; clear: paused (the worker waits on it)
        self._gate.set()
        self._thread = QThread()
        self._thread.setObjectName(f"crossview-{name}")
        self._runner = _Runner(self)
        self._runner.moveToThread(self._thread)
        self._thread.started.connect(self._runner.run)
        self._runner.done.connect(self._thread.quit, Qt.ConnectionType.DirectConnection)  # quit is thread-safe; wait() must not deadlock
        self._runner.failed.connect(self.failed, _QUEUED)
        self._thread.finished.connect(self.finished, _QUEUED)   # emitted on the worker thread: queued after failed

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the work to end at its next check (between two batches or events); a paused worker wakes up to stop."""
        self._stop.set()
        self._gate.set()

    cancel = stop

    def pause(self) -> None:
        """Hold the work at its next check until :meth:`resume` (nothing is lost: the next batch is simply not asked for)."""
        if self._gate.is_set() and not self._stop.is_set():
            self._gate.clear()
            self.paused_changed.emit(True)

    def resume(self) -> None:
        if not self._gate.is_set():
            self._gate.set()
            self.paused_changed.emit(False)

    @property
    def paused(self) -> bool:
        return not self._gate.is_set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    cancelled = stopped

    def is_running(self) -> bool:
        return self._thread.isRunning()

    def wait(self, msecs: int = 30000) -> bool:
        return self._thread.wait(msecs)

    # called on the worker thread
    def _checkpoint(self) -> bool:
        """Between two batches or events: hold while paused, then say whether to stop."""
        self._gate.wait()
        return self._stop.is_set()

    def _work(self, out: _Runner) -> None:
        raise NotImplementedError

    def _cleanup(self) -> None:
        pass


class Task(WorkerBase):
    """A function worker: ``fn(progress, should_stop) -> result`` in its own QThread.

    :attr:`succeeded` carries the return value (not sent when the task was cancelled); :attr:`progress`
    is sent when the rounded percentage changes. ``should_stop()`` holds while the task is paused.
    """

    progress = Signal(int, int)  # done, total
    succeeded = Signal(object)   # the function's return value

    def __init__(self, fn: Work, name: str = "task", parent: QObject | None = None) -> None:
        super().__init__(name, parent)
        self._fn = fn
        self._last_pct = -1
        self._runner.progress.connect(self.progress, _QUEUED)
        self._runner.succeeded.connect(self.succeeded, _QUEUED)

    def _work(self, out: _Runner) -> None:
        result = self._fn(lambda done, total: self._report(out, done, total), self._checkpoint)
        if not self.cancelled:
            out.succeeded.emit(result)

    def _report(self, out: _Runner, done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if pct != self._last_pct:
            self._last_pct = pct
            out.progress.emit(done, total)


def _is_progress(ev: Any) -> bool:
    return type(ev).__name__ == "Progress"


class EventTask(WorkerBase):
    """A generator worker: drive the event generator ``factory()`` returns (called on the worker thread).

    Each item it yields is sent through :attr:`event`, except that consecutive progress events are
    throttled to at most one per ``min_interval`` seconds (the last one is always delivered).
    :meth:`pause` holds the generator between two events, :meth:`resume` continues, :meth:`stop` ends the
    iteration at the next event and closes the generator, which is how cancelling works (ARCHITECTURE.md:
    the method checks between batches; the engine's ``finally`` writes the checkpoint). :attr:`result` is
    the generator's return value once it has run to its end (``None`` if stopped or failed).
    """

    event = Signal(object)

    def __init__(self, factory: Callable[[], Any], name: str = "events", min_interval: float = 0.05,
                 parent: QObject | None = None) -> None:
        super().__init__(name, parent)
        self._factory = factory
        self._min_interval = min_interval
        self._gen: Any = None
        self.result: Any = None
        self._runner.event.connect(self.event, _QUEUED)

    def _work(self, out: _Runner) -> None:
        self._gen = self._factory()
        events = iter(self._gen)
        last_sent = float("-inf")   # (0.0 held back the first progress event on a machine up for less than min_interval)
        held = None   # the newest progress event not sent yet
        while True:
            try:
                ev = next(events)
            except StopIteration as end:
                self.result = end.value
                break
            if _is_progress(ev):
                now = time.monotonic()
                if now - last_sent < self._min_interval:
                    held = ev
                else:
                    held = None
                    last_sent = now
                    out.event.emit(ev)
            else:
                if held is not None:
                    out.event.emit(held)
                    held = None
                out.event.emit(ev)
            if self._checkpoint():
                break
        if held is not None:
            out.event.emit(held)

    def _cleanup(self) -> None:
        gen, self._gen = self._gen, None
        if gen is not None and hasattr(gen, "close"):
            gen.close()   # runs the generator's finally blocks: the engine's cancel path


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
