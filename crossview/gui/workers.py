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

Two rules keep Qt objects on the GUI thread (breaking them crashed full test runs): a started worker is held by
``_LIVE`` until its thread is joined, then dropped on the GUI thread (no worker <-> runner reference cycle, so the
cyclic garbage collector never frees one on some other thread); and while any worker runs, automatic garbage
collection is off and a timer on the GUI thread collects instead (:class:`_GuiThreadGC`), so a collection set off
by a worker's allocations cannot free GUI garbage (a closed plot's scene) on the worker thread. Threads that are no
worker here (a tqdm monitor, a DataLoader's, a library's pool) allocate too: the application keeps collection on the
GUI thread for its whole life (:func:`hold_collection`), and each GUI test while it runs (tests/conftest.py).

Why not ``concurrent.futures`` (issue 12 asked): a ``Future`` reports once, at the end, and its
``cancel()`` only stops work that has not started; these workers must stream progress and events to
the GUI thread as *queued Qt signals* while running (STYLE.md 3), hold a generator between two events
(:meth:`WorkerBase.pause`), and close it on stop so the engine's ``finally`` checkpoints the run. A
futures-based version would still need this module's signals, stop flag and pause gate around the
executor, plus a thread pool the GUI never shares: it would add a layer, not remove code. The thread
itself is Qt's ``QThread`` (what superqt's ``thread_worker``, the model STYLE.md cites, uses too).
"""

from __future__ import annotations

import atexit
import functools
import gc
import itertools
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Self

import shiboken6
from PySide6.QtCore import QObject, Qt, QThread, QTimer, Signal

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
        # weak: a strong one made worker <-> runner a reference cycle, so a dropped worker was freed by the cyclic
        # garbage collector, on whatever thread and at whatever moment it ran, QThread and runner included (full
        # test runs under load crashed in it); while it runs the worker is held by _LIVE
        self._worker = weakref.ref(worker)

    def run(self) -> None:
        w = self._worker()
        if w is None:
            self.done.emit()
            return
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


#: the workers whose thread has started and not yet been joined: a worker its owner drops while it runs stays alive
#: until then, and is freed on the GUI thread, by reference counting, once its thread has ended (WorkerBase._release)
_LIVE: set["WorkerBase"] = set()
#: the engine loaders whose import thread runs (collection stays on the GUI thread meanwhile too)
_LOADING: set["EngineLoader"] = set()
#: whatever else keeps collection on the GUI thread (:func:`hold_collection`): the application for its whole life,
#: a GUI test while it runs
_HELD: set[object] = set()

#: how often the GUI thread collects cyclic garbage while collection is held there and nothing else runs (the
#: application's idle life; ms)
GC_INTERVAL_MS = 500
#: ... and while a worker or the engine loader runs (ms): they allocate fast, and with automatic collection off every
#: new object waits in the youngest generation for the next tick, which then walks them all holding the GIL. At 500
#: ms that tick stalled the GUI 125-155 ms while the engine's modules loaded (bench/query_cache.py --app-child -
#: engine, 2-core CPU); at 50 ms 40-43, at 20 ms 31-36 (the import's own holds of the GIL)
GC_BUSY_INTERVAL_MS = 20


class _GuiThreadGC:
    """While any worker runs, Python's cyclic garbage collector runs on the GUI thread only (pyqtgraph's
    ``GarbageCollector`` does the same for the same reason). Left automatic, a collection starts on whichever thread
    allocates when the thresholds are crossed; a worker building a model allocates a lot, so the collection ran on
    the worker thread and freed garbage of the GUI's (a closed plot's ``QGraphicsScene``, cleared there while the GUI
    thread processed events): full test runs crashed so, three times in a row at one GUI test. Automatic collection
    is off from the first worker's start to the last one's end; meanwhile a timer on the GUI thread collects every
    ``GC_BUSY_INTERVAL_MS`` (``GC_INTERVAL_MS`` when only holders keep it) whatever generations are over their
    thresholds, as the automatic collector would."""

    def __init__(self) -> None:
        self.timer: QTimer | None = None
        self.disabled_here = False

    def start(self) -> None:
        if self.timer is None:
            self.timer = QTimer()
            self.timer.timeout.connect(self.tick)
        if gc.isenabled():          # off at every start: something may have turned it back on meanwhile
            self.disabled_here = True
            gc.disable()
        self.retime()
        if not self.timer.isActive():
            self.timer.start()

    def retime(self) -> None:
        """The timer's interval for what runs now: :data:`GC_BUSY_INTERVAL_MS` while a worker or loader does,
        :data:`GC_INTERVAL_MS` otherwise."""
        if self.timer is not None:
            ms = GC_BUSY_INTERVAL_MS if (_LIVE or _LOADING) else GC_INTERVAL_MS
            if self.timer.interval() != ms:
                self.timer.setInterval(ms)

    def stop(self) -> None:
        if self.timer is not None and self.timer.isActive():
            self.timer.stop()
            self.collect()
            if self.disabled_here:
                gc.enable()
            self.disabled_here = False

    def tick(self) -> None:
        """The timer: let go of orphaned workers (the last one hands collection back), else collect."""
        if _prune_orphans():
            return
        self.collect()

    @staticmethod
    def collect() -> None:
        counts, limits = gc.get_count(), gc.get_threshold()
        over = [g for g in range(3) if counts[g] > limits[g]]
        if over:
            gc.collect(max(over))


_GC = _GuiThreadGC()


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
        self.finished.connect(self._release)

    def start(self) -> Self:
        _prune_orphans()
        _LIVE.add(self)
        _GC.start()
        self._thread.start()
        return self

    def _release(self) -> None:
        """On the owner's thread, once the work has ended: join the thread (it emitted ``finished`` on its way out),
        then let go of the worker after this emission (its owner may hold the last reference, or none)."""
        self._thread.wait()
        QTimer.singleShot(0, functools.partial(_let_go, self))

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


def stop_all(msecs: int | None = 10000) -> list[str]:
    """Ask every running worker to stop and wait for their threads, at most ``msecs`` in all (None: as long as they
    take); the names of those still running after it. Closing the window calls it with a limit; the process's exit
    (:func:`_join_at_exit`) without one: a ``QThread`` destroyed while it runs aborts the process (SIGABRT, "QThread:
    Destroyed while thread is still running"), and work that cannot stop halfway (a scoring bank being read and its
    statistics formed, a checkpoint being written) must end rather than die."""
    # orphans too (their Qt object deleted with a closed parent): their QThread is Python's and may still run
    running = [w for w in list(_LIVE) if shiboken6.isValid(w._thread) and w._thread.isRunning()]
    for w in running:
        w.stop()                  # Python events only: safe on an orphan
    end = None if msecs is None else time.monotonic() + msecs / 1000
    left = []
    for w in running:
        if end is None:
            w._thread.wait()
        elif not w._thread.wait(max(0, int((end - time.monotonic()) * 1000))):
            left.append(w.name)
    return left


def _join_at_exit() -> None:
    """At interpreter exit (``atexit``, before Python tears the modules down and with them the workers' QThreads):
    stop every worker still running and wait for it to end."""
    stop_all(None)


atexit.register(_join_at_exit)


def _let_go(worker: WorkerBase) -> None:
    """The end of a worker's life (on the GUI thread): forgotten; the last one hands collection back to Python."""
    _LIVE.discard(worker)
    _hand_back()


def _hand_back() -> bool:
    """Hand collection back to Python once nothing holds it on the GUI thread (no worker, loader or holder); True
    when it did."""
    if _LIVE or _LOADING or _HELD:
        _GC.retime()          # the last worker or loader may have ended: the idle interval
        return False
    _GC.stop()
    return True


def hold_collection(holder: object) -> None:
    """Collect cyclic garbage on the GUI thread only, from now until :func:`release_collection` (``holder``), whatever
    runs meanwhile. Called on the GUI thread. The application holds it for its whole life (:func:`crossview.gui.app.
    ensure_app`): threads that are no worker of this module (a tqdm monitor, a DataLoader's, a library's pool) allocate
    too, and a collection they set off would free the GUI's garbage (a closed plot's scene) on their thread."""
    _HELD.add(holder)
    _GC.start()


def release_collection(holder: object) -> None:
    """The end of :func:`hold_collection` (``holder``); collection goes back to Python when nothing else holds it."""
    _HELD.discard(holder)
    _hand_back()


def _prune_orphans() -> bool:
    """Let go of the workers whose Qt object was deleted (by a parent widget closed while they ran) and whose thread
    has ended: their ``finished`` never arrives, so :meth:`WorkerBase._release` never runs for them. Called on the GUI
    thread at every start and every collection tick. True when that emptied ``_LIVE`` (collection handed back)."""
    orphans = [w for w in _LIVE if not shiboken6.isValid(w) and not w._thread.isRunning()]
    for w in orphans:
        w._thread.wait()
        _LIVE.discard(w)
    return bool(orphans) and _hand_back()


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


#: Heavy modules the engine imports lazily (seconds on the 2-core machine). Imported plainly on a worker thread
#: they hold the GIL for up to 0.35 s at a time, freezing the GUI thread; so the main window imports them once it
#: is shown, on a background thread and quietly (:class:`EngineLoader`, :func:`import_quietly`), and a training,
#: a search or a panel run alone imports them before it starts (:func:`preload_engine_modules`: at once when done).
PRELOAD_MODULES = ("torch", "torchvision", "sklearn.feature_extraction.text", "sklearn.decomposition",
                   "scipy.linalg", "crossview.features.image", "crossview.features.text", "crossview.engine.run")

_import_lock = threading.Lock()
_preload_lock = threading.Lock()
_preloaded = threading.Event()


def import_quietly(names: tuple[str, ...], freeze: bool = False) -> None:
    """Import the modules ``names`` (an ImportError is ignored: an optional part is missing, and the work that
    needs it will say so clearly) without the long holds of the GIL that stall the GUI thread when this runs on
    another thread, then with ``freeze`` :func:`freeze_heap`. At once when all are imported (and no freeze).

    Two causes of those holds are taken away: torch's shared libraries are mapped with the GIL released first
    (:func:`_load_torch_libraries`), and the garbage collector makes no full collection meanwhile (each one,
    and the imports' half a million new objects start several, walks the whole heap holding the GIL: 0.2-0.35
    s). The young generations are still collected as usual: switching the collector off instead piles every
    new object into the youngest, and the first collection after it walks them all at once (0.5 s). Measured
    with bench/query_cache.py --app (engine rows): the longest GUI stall while torch, torchvision and
    scikit-learn load on a worker thread falls from 0.3-0.4 s to ~0.05 s. One import at a time: a second
    caller waits for the first.
    """
    import gc
    import importlib
    import sys

    if not freeze and all(name in sys.modules for name in names):
        return
    with _import_lock:
        thresholds = gc.get_threshold()
        gc.set_threshold(thresholds[0], thresholds[1], 1 << 30)    # no full collection until they are restored
        try:
            if any(name.split(".")[0] == "torch" for name in names):
                _load_torch_libraries()
            for name in names:
                try:
                    importlib.import_module(name)
                except ImportError:
                    pass
            if freeze:
                freeze_heap()     # before the thresholds are back: the full collection due then has little to walk
        finally:
            gc.set_threshold(*thresholds)


def preload_engine_modules() -> None:
    """Import :data:`PRELOAD_MODULES` and :func:`freeze_heap` (:func:`import_quietly`); once: later calls
    return at once, and a call made while another thread is at it waits for it."""
    with _preload_lock:
        if _preloaded.is_set():
            return
        import_quietly(PRELOAD_MODULES, freeze=True)
        _preloaded.set()


def engine_preloaded() -> bool:
    """True once :func:`preload_engine_modules` has run to its end in this process."""
    return _preloaded.is_set()


def _load_torch_libraries() -> None:
    """Map torch's shared libraries with the GIL released, before ``import torch`` maps them holding it.

    Python's import of an extension module calls ``dlopen`` holding the GIL; for ``torch._C`` that maps and
    relocates libtorch_cpu, libtorch_cuda and the CUDA libraries (0.4-0.5 s measured here), a stall of the GUI
    thread when the import runs on another thread. A ``ctypes`` call of libc's ``dlopen`` releases the GIL;
    the same files opened with the same flags first (``libtorch_global_deps`` global, as torch's
    ``_load_global_deps``; ``torch/_C`` with Python's import flags), torch's own import finds them mapped.
    Linux only, and not when ``LD_LIBRARY_PATH`` is set: torch preloads CUDA libraries from its wheels before
    ``torch._C`` so that they win over other copies found there, an order this must not change.
    """
    import ctypes
    import os
    import sys
    from importlib.util import find_spec

    if not sys.platform.startswith("linux") or "torch" in sys.modules or os.environ.get("LD_LIBRARY_PATH"):
        return
    try:
        spec = find_spec("torch")
        if spec is None or not spec.origin:
            return
        here = os.path.dirname(spec.origin)
        ext = [f for f in os.listdir(here) if f.startswith("_C.") and f.endswith(".so")]
        dlopen = ctypes.CDLL(None).dlopen     # a foreign call: ctypes releases the GIL during it
        dlopen.restype = ctypes.c_void_p
        dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
        deps = os.path.join(here, "lib", "libtorch_global_deps.so")
        if ext and os.path.isfile(deps) and dlopen(deps.encode(), os.RTLD_NOW | os.RTLD_GLOBAL):
            dlopen(os.path.join(here, ext[0]).encode(), sys.getdlopenflags())
    except (OSError, AttributeError, ValueError):  # no dlopen here, or a layout torch may change: import plainly
        pass


class EngineLoader(QObject):
    """Imports the engine's heavy modules (:func:`preload_engine_modules`) on a daemon thread, then lists the
    devices (:func:`crossview.core.devices.list_devices`, which initialises CUDA) there too; :attr:`loaded`
    carries ``(auto device name, [DeviceInfo])`` to the GUI thread (``("cpu", [])`` when torch cannot say).

    One per process (:func:`engine_loader`), never deleted: the import cannot be stopped halfway, and a plain
    daemon thread, unlike a running ``QThread``, may outlive the window and the application at exit.
    """

    loaded = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self._thread: threading.Thread | None = None
        self.result: tuple[str, list[Any]] | None = None
        self.loaded.connect(self._ended)        # queued: sent from the import thread

    def start(self) -> None:
        """Start the import, once per process (later calls do nothing: connect to :attr:`loaded` first, then
        look at :attr:`result`, which is set before :attr:`loaded` is sent). Garbage is collected on the GUI
        thread meanwhile, as while a worker runs (the imports allocate enough to set a collection off)."""
        if self._thread is None:
            _LOADING.add(self)
            _GC.start()
            self._thread = threading.Thread(target=self._run, name="crossview-engine-preload", daemon=True)
            self._thread.start()

    def _ended(self) -> None:
        if self._thread is not None:
            self._thread.join()
        _LOADING.discard(self)
        _hand_back()

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        preload_engine_modules()
        try:
            from crossview.core.devices import list_devices, select_device
            result: tuple[str, list[Any]] = (select_device("auto"), list_devices())
        except Exception:  # noqa: BLE001 - no torch, a broken driver: the CPU, as the status bar says then
            result = ("cpu", [])
        self.result = result
        self.loaded.emit(result)     # from this thread to the loader's (the GUI thread): queued


_engine_loader: EngineLoader | None = None


def engine_loader() -> EngineLoader:
    """The process's :class:`EngineLoader` (made on first use, on the GUI thread)."""
    global _engine_loader
    if _engine_loader is None:
        _engine_loader = EngineLoader()
    return _engine_loader


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
