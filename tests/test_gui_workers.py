"""Workers: event generators driven off the GUI thread, with throttling, pause, stop and failures."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("pytestqt")

from crossview.core.events import Log, Loss, Progress  # noqa: E402
from crossview.core.errors import CrossViewError  # noqa: E402
from _latency import LatencyProbe  # noqa: E402
from crossview.gui.workers import EventTask, Task  # noqa: E402

# each worker a test starts is stopped and joined before the test's objects go: tests/conftest.py
pytestmark = pytest.mark.gui


def test_events_arrive_in_order_and_progress_is_throttled(qtbot) -> None:
    def work():
        for i in range(2000):
            yield Progress(i + 1, 2000)
        yield Loss(step=1, epoch=0, terms={"loss": 0.5})
        yield Log("done")

    got = []
    task = EventTask(work, min_interval=0.05)
    task.event.connect(got.append)
    with qtbot.waitSignal(task.finished, timeout=10_000):
        task.start()
    progress = [e for e in got if isinstance(e, Progress)]
    assert 1 <= len(progress) < 200, "2,000 progress events must be thinned out"
    assert progress[-1].step == 2000, "the last progress event is always delivered"
    assert [type(e).__name__ for e in got[-2:]] == ["Loss", "Log"]


def test_pause_holds_the_generator_and_stop_closes_it(qtbot) -> None:
    produced = []
    closed = threading.Event()
    credit = threading.Semaphore(0)   # the generator makes one item per event the GUI has received

    def work():
        try:
            for i in range(10_000):
                produced.append(i)
                yield Loss(step=i, epoch=0, terms={"loss": 1.0 / (i + 1)})
                credit.acquire()
        finally:
            closed.set()

    task = EventTask(work)
    seen = []
    task.event.connect(lambda ev: (seen.append(ev), credit.release()))
    task.start()
    qtbot.waitUntil(lambda: len(seen) > 5, timeout=5000)
    with qtbot.waitSignal(task.paused_changed):
        task.pause()
    qtbot.waitUntil(lambda: len(seen) == len(produced), timeout=5000)   # what was made has arrived
    n = len(produced)
    for _ in range(50):            # all the credit it could want: only the pause holds it now
        credit.release()
    qtbot.wait(100)                # a negative check: nothing may arrive while paused
    assert len(produced) <= n + 1, "a paused task must not ask for more work"
    task.resume()
    qtbot.waitUntil(lambda: len(produced) > n + 5, timeout=5000)
    with qtbot.waitSignal(task.finished, timeout=5000):
        task.stop()
        credit.release()           # the generator may be waiting for credit: let it reach the stop check
    assert closed.is_set(), "stop must close the generator so its clean-up runs"
    assert len(produced) < 10_000


def test_stop_while_paused_ends_the_task(qtbot) -> None:
    def work():
        while True:
            yield Progress(1, 0)

    task = EventTask(work)
    task.start()
    task.pause()
    with qtbot.waitSignal(task.finished, timeout=5000):
        task.stop()


def test_failures_are_reported_not_raised(qtbot) -> None:
    def user_error():
        yield Progress(1, 2)
        raise CrossViewError("features.npz: missing 'image'")

    def bug():
        yield Progress(1, 2)
        raise ZeroDivisionError("oops")

    for fn, expect_trace in ((user_error, False), (bug, True)):
        task = EventTask(fn)
        with qtbot.waitSignal(task.failed, timeout=5000) as sig:
            task.start()
        message, details = sig.args
        assert ("missing 'image'" in message) if not expect_trace else ("ZeroDivisionError" in message)
        assert bool(details) == expect_trace
        task.wait()


@pytest.mark.parametrize("outcome", ["failed", "succeeded"])
def test_a_task_outcome_reaches_a_slot_connected_after_start(qtbot, outcome) -> None:
    """open_run returns a started Task; a damaged run fails at once, often before the caller connects
    (CI lost such a failure: a 60 s timeout with the message box already open). The outcome must wait
    for the GUI thread's event loop, so connecting right after start() always sees it."""
    def work(progress, should_stop):
        if outcome == "failed":
            raise CrossViewError("config.json: not a JSON object")
        return 42

    task = Task(work)
    task.start()
    assert task.wait(10_000)    # the worker has finished before anyone connects: the race, made certain
    with qtbot.waitSignal(getattr(task, outcome), timeout=5000) as sig:
        pass
    assert sig.args == (["config.json: not a JSON object", ""] if outcome == "failed" else [42])


def test_latency_probe_sees_a_blocked_gui_thread(qtbot) -> None:
    probe = LatencyProbe().start()
    qtbot.wait(60)
    time.sleep(0.6)             # the stimulus, not a wait: block the GUI thread on purpose for the probe to see
    qtbot.wait(40)
    blocked = probe.stop()
    assert blocked >= 550 and max(probe.gaps_ms) == blocked
    probe.start()
    qtbot.wait(100)
    assert probe.stop() < blocked - 100 and probe.ticks > 1


# ---------------------------------------------------------------- the shared base, on both kinds (issue 29)

def _failing(kind: str, exc: BaseException):
    """A worker of ``kind`` whose work raises ``exc`` at once."""
    if kind == "task":
        def fn(progress, should_stop):
            raise exc
        return Task(fn)

    def gen():
        raise exc
        yield  # unreachable: makes this a generator

    return EventTask(gen)


def _connect_outcome(task) -> list:
    """Record each signal of ``task`` as ``(name, args, on the GUI thread?)``."""
    seen = []

    def record(name):
        return lambda *args: seen.append((name, args, threading.current_thread() is threading.main_thread()))

    task.failed.connect(record("failed"))
    task.finished.connect(record("finished"))
    if isinstance(task, Task):
        task.succeeded.connect(record("succeeded"))
    else:
        task.event.connect(record("event"))
    return seen


@pytest.mark.parametrize("kind", ["task", "events"])
@pytest.mark.parametrize("error", ["input", "bug"])
def test_a_failure_reaches_a_slot_connected_after_start_on_both_kinds(qtbot, kind, error) -> None:
    """The race made certain: the worker has failed and its thread ended before anyone connects. The
    failure still arrives, on the GUI thread, once, before finished; an input error has no details, a bug
    its traceback."""
    exc = CrossViewError("config.json: not a JSON object") if error == "input" else ZeroDivisionError("oops")
    task = _failing(kind, exc)
    task.start()
    assert task.wait(10_000)
    seen = _connect_outcome(task)
    with qtbot.waitSignal(task.finished, timeout=5000):
        pass
    assert [name for name, _, _ in seen] == ["failed", "finished"]
    assert all(on_gui for _, _, on_gui in seen), "signals must reach the GUI thread, not run on the worker"
    message, details = seen[0][1]
    if error == "input":
        assert (message, details) == ("config.json: not a JSON object", "")
    else:
        assert message == "ZeroDivisionError: oops"
        assert details.startswith("Traceback") and "ZeroDivisionError" in details


def test_a_factory_that_fails_is_a_failure_not_a_crash(qtbot) -> None:
    task = EventTask(lambda: 1 / 0)
    with qtbot.waitSignal(task.failed, timeout=5000) as sig:
        task.start()
    assert sig.args[0].startswith("ZeroDivisionError") and "Traceback" in sig.args[1]
    task.wait()


def test_events_reach_a_slot_connected_after_start_and_the_return_value_is_kept(qtbot) -> None:
    def work():
        yield Log("a")
        yield Log("b")
        return 7

    task = EventTask(work)
    task.start()
    assert task.wait(10_000)
    seen = _connect_outcome(task)
    with qtbot.waitSignal(task.finished, timeout=5000):
        pass
    assert [(name, args[0].message if args else None) for name, args, _ in seen] == [
        ("event", "a"), ("event", "b"), ("finished", None)]
    assert task.result == 7


def test_pause_holds_an_event_task_between_events_and_resume_continues(qtbot) -> None:
    produced = []

    def work():
        for i in range(5):
            produced.append(i)
            yield Log(str(i))

    task = EventTask(work)
    seen = _connect_outcome(task)
    with qtbot.waitSignal(task.paused_changed) as sig:
        task.pause()               # before start: held right after the first event
    assert sig.args == [True] and task.paused
    task.start()
    qtbot.waitUntil(lambda: len(seen) == 1, timeout=5000)
    qtbot.wait(50)                 # a negative check: nothing more may be asked for while paused
    assert produced == [0] and task.is_running()
    with qtbot.waitSignal(task.finished, timeout=5000):
        task.resume()
    assert produced == [0, 1, 2, 3, 4] and not task.paused
    assert [args[0].message for name, args, _ in seen if name == "event"] == ["0", "1", "2", "3", "4"]


def test_pause_holds_a_task_at_should_stop_and_resume_continues(qtbot) -> None:
    reached = []

    def work(progress, should_stop):
        for i in range(3):
            reached.append(i)
            if should_stop():
                return -1
        return len(reached)

    task = Task(work)
    task.pause()
    task.start()
    qtbot.waitUntil(lambda: reached == [0], timeout=5000)
    qtbot.wait(50)                 # a negative check: should_stop() holds while paused
    assert reached == [0]
    with qtbot.waitSignal(task.succeeded, timeout=5000) as sig:
        task.resume()
    assert sig.args == [3]
    task.wait()


def test_stop_ends_a_paused_generator_and_closes_it(qtbot) -> None:
    produced = []
    closed = threading.Event()

    def work():
        try:
            for i in range(1000):
                produced.append(i)
                yield Loss(step=i, epoch=0, terms={"loss": 1.0})
        finally:
            closed.set()           # the engine writes its checkpoint here

    task = EventTask(work)
    seen = _connect_outcome(task)
    task.pause()
    task.start()
    qtbot.waitUntil(lambda: len(seen) == 1, timeout=5000)
    with qtbot.waitSignal(task.finished, timeout=5000):
        task.stop()
    assert closed.is_set() and produced == [0] and task.stopped
    assert [name for name, _, _ in seen] == ["event", "finished"], "a stop is not a failure"
    assert task.result is None


def test_cancel_ends_a_paused_task_without_a_result(qtbot) -> None:
    entered = threading.Event()
    saw_stop = []

    def work(progress, should_stop):
        entered.set()
        saw_stop.append(should_stop())   # held here: the task was paused before it started
        return "done"

    task = Task(work)
    seen = _connect_outcome(task)
    task.pause()
    task.start()
    qtbot.waitUntil(entered.is_set, timeout=5000)
    with qtbot.waitSignal(task.finished, timeout=5000):
        task.cancel()
    assert saw_stop == [True] and task.cancelled
    assert [name for name, _, _ in seen] == ["finished"], "a cancelled task sends no result"


def test_a_generator_that_fails_while_closing_is_reported(qtbot) -> None:
    def work():
        try:
            while True:
                yield Log("tick")
        finally:
            raise CrossViewError("checkpoint.pt: disk full")

    task = EventTask(work)
    task.pause()
    task.start()
    with qtbot.waitSignal(task.failed, timeout=5000) as sig:
        task.stop()
    assert sig.args == ["while stopping: checkpoint.pt: disk full", ""]
    task.wait()


def test_task_progress_is_throttled_to_percent_changes_and_keeps_the_last(qtbot) -> None:
    def work(progress, should_stop):
        for i in range(5000):
            progress(i + 1, 5000)
        return "ok"

    task = Task(work)
    got = []
    task.progress.connect(lambda done, total: got.append((done, total)))
    with qtbot.waitSignal(task.finished, timeout=10_000):
        task.start()
    assert 1 <= len(got) <= 101
    assert got[-1] == (5000, 5000), "the last progress (100 %) is always delivered"


def test_event_task_progress_throttling_keeps_the_last_even_when_stopped(qtbot) -> None:
    closed = threading.Event()

    def work():
        try:
            for i in (1, 2, 3):
                if i == 3:
                    task.stop()    # thread-safe; checked right after this event, as a Stop button would be
                yield Progress(i, 3)
            yield Log("never reached")
        finally:
            closed.set()

    task = EventTask(work, min_interval=3600)   # the first progress event goes out, the rest are held back
    got = []
    task.event.connect(got.append)
    with qtbot.waitSignal(task.finished, timeout=5000):
        task.start()
    assert [(type(e).__name__, e.step) for e in got] == [("Progress", 1), ("Progress", 3)], \
        "a held progress event is delivered when the task stops, and only the newest one"
    assert closed.is_set()


def test_tokens_increase_across_both_kinds() -> None:
    a = Task(lambda p, s: None)
    b = EventTask(lambda: iter(()))
    c = Task(lambda p, s: None)
    assert a.token < b.token < c.token


@pytest.fixture
def collection_released(request):
    """The collection tests watch collection taken and handed back: the hold every GUI test has (tests/conftest.py)
    is let go for their body and taken again after it."""
    from crossview.gui import workers as W

    W.release_collection(request.node)
    assert not W._HELD, "nothing else holds collection on the GUI thread"
    yield
    W.hold_collection(request.node)


def test_a_dropped_worker_is_freed_on_the_gui_thread_without_the_cyclic_collector(qtbot, collection_released) -> None:
    """worker <-> runner was a reference cycle: a worker its owner dropped was freed by the cyclic garbage collector,
    whenever and on whichever thread it ran, QThread and runner included (full test runs under load crashed in it).
    Now a never-started worker goes at once, and a running one stays alive until its thread has ended, then goes on
    the GUI thread by reference counting, with the collector off."""
    import gc
    import weakref

    from crossview.gui import workers as W

    gc.collect()
    gc.disable()
    try:
        idle = weakref.ref(Task(lambda p, s: None))
        assert idle() is None, "a worker that never started is freed when dropped"
        gate = threading.Event()
        task = Task(lambda p, s: gate.wait(30))
        done = []
        task.finished.connect(lambda: done.append(True))
        task.start()
        ref = weakref.ref(task)
        del task
        assert ref() is not None and ref() in W._LIVE, "a running worker its owner dropped stays alive"
        gate.set()
        qtbot.waitUntil(lambda: bool(done) and ref() is None, timeout=30000)
    finally:
        gc.enable()


def test_while_workers_run_garbage_is_collected_on_the_gui_thread_only(qtbot, collection_released) -> None:
    """A collection started on a worker thread freed GUI garbage there (a plot's QGraphicsScene cleared on the worker
    thread: full test runs crashed). While a worker runs, automatic collection is off and the GUI thread collects on
    a timer; cyclic garbage made meanwhile is collected there; after the last worker, collection is Python's again."""
    import gc
    import weakref

    from crossview.gui import workers as W

    assert gc.isenabled()
    gate = threading.Event()
    seen = {}

    def work(p, s):
        seen["enabled_in_worker"] = gc.isenabled()
        gate.wait(30)

    task = Task(work)
    task.start()
    qtbot.waitUntil(lambda: "enabled_in_worker" in seen, timeout=30000)
    assert not gc.isenabled() and seen["enabled_in_worker"] is False

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a                     # a cycle: only the collector frees it
    ref = weakref.ref(a)
    del a, b
    for _ in range(gc.get_threshold()[0] + 10):  # past generation 0's threshold
        Node()
    junk = [[] for _ in range(gc.get_threshold()[0] + 10)]
    qtbot.waitUntil(lambda: ref() is None, timeout=10 * W.GC_INTERVAL_MS)
    del junk
    with qtbot.waitSignal(task.finished, timeout=30000):
        gate.set()
    qtbot.waitUntil(lambda: task not in W._LIVE, timeout=10000)
    # handed back once no worker is live (a worker whose parent widget deleted it before its end stays listed, and
    # collection then stays on the GUI thread's timer)
    assert gc.isenabled() == (not W._LIVE)


def test_a_worker_deleted_by_its_parent_before_its_end_is_let_go_and_collection_handed_back(qtbot, collection_released) -> None:
    """A worker whose Qt object its parent deleted while it ran never sends ``finished``: it was left in ``_LIVE``
    for good, and automatic collection stayed off. The collection timer now lets go of it once its thread ends."""
    import gc

    import shiboken6
    from PySide6.QtCore import QObject

    from crossview.gui import workers as W

    parent = QObject()
    gate = threading.Event()
    task = Task(lambda p, s: gate.wait(30), parent=parent)
    task.start()
    assert task in W._LIVE and not gc.isenabled()
    shiboken6.delete(parent)                     # the worker's Qt object goes with it, its thread still running
    assert not shiboken6.isValid(task) and task.is_running()
    qtbot.wait(3 * W.GC_INTERVAL_MS)
    assert task in W._LIVE, "a running orphan is kept (its thread must not be destroyed while it runs)"
    gate.set()
    qtbot.waitUntil(lambda: task not in W._LIVE, timeout=30000)
    assert not task.is_running()
    qtbot.waitUntil(lambda: gc.isenabled() == (not W._LIVE and not W._LOADING), timeout=10 * W.GC_INTERVAL_MS)


def test_the_engine_import_thread_collects_on_the_gui_thread_too(qtbot, collection_released) -> None:
    """The engine loader's import thread allocates enough to set a collection off there: while it runs, collection
    is the GUI thread's, as for a worker, and handed back when it ends."""
    import gc

    from crossview.gui import workers as W

    assert gc.isenabled() and not W._LIVE
    loader = W.EngineLoader()                   # a fresh one (the process's own has long finished)
    with qtbot.waitSignal(loader.loaded, timeout=120000):
        loader.start()
        assert not gc.isenabled() and loader in W._LOADING
    qtbot.waitUntil(lambda: loader not in W._LOADING, timeout=10000)
    assert gc.isenabled()
    assert loader.result is not None and isinstance(loader.result[0], str)


def test_a_holder_keeps_collection_on_the_gui_thread_whatever_the_workers_do(qtbot, collection_released) -> None:
    """The application holds collection on the GUI thread for its whole life (threads that are no worker here
    allocate too: a tqdm monitor, a pool's feeder): a worker ending meanwhile does not hand it back, the holder's
    release does, once no worker runs; and cyclic garbage is still collected meanwhile, by the GUI thread's timer."""
    import gc
    import weakref

    from crossview.gui import workers as W

    assert gc.isenabled()
    holder = object()
    W.hold_collection(holder)
    try:
        assert not gc.isenabled()
        with qtbot.waitSignal(Task(lambda p, s: None).start().finished, timeout=30000):
            pass
        qtbot.waitUntil(lambda: not W._LIVE, timeout=10000)
        assert not gc.isenabled(), "a worker's end must not hand back what the holder holds"

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        del a, b
        junk = [[] for _ in range(gc.get_threshold()[0] + 10)]      # past generation 0's threshold
        qtbot.waitUntil(lambda: ref() is None, timeout=10 * W.GC_INTERVAL_MS)
        del junk

        threads = []                                # the thread each collection starts on
        gc.callbacks.append(on_gc := lambda phase, info: phase == "start" and threads.append(threading.get_ident()))
        try:
            kept: list = []
            other = threading.Thread(target=lambda: kept.extend([[] for _ in range(50)] for _ in range(2000)))
            other.start()                           # a plain thread, no worker: 100K new lists, far past thresholds
            other.join()
            qtbot.waitUntil(lambda: bool(threads), timeout=10 * W.GC_INTERVAL_MS)
        finally:
            gc.callbacks.remove(on_gc)
        assert threads and set(threads) == {threading.get_ident()}, "collected on the GUI thread only"
    finally:
        W.release_collection(holder)
    assert gc.isenabled() and holder not in W._HELD


def test_the_application_holds_collection_for_its_life() -> None:
    """crossview.gui.app.ensure_app, which makes the app's QApplication, holds collection on the GUI thread (in a
    fresh interpreter: the test session's QApplication is pytest-qt's)."""
    import subprocess
    import sys

    code = ("import gc, os; os.environ['QT_QPA_PLATFORM'] = 'offscreen'\n"
            "from crossview.gui.app import ensure_app\n"
            "from crossview.gui import workers as W\n"
            "app = ensure_app()\n"
            "print(gc.isenabled(), app in W._HELD, W._GC.timer.isActive())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]


_EXIT_SCRIPT = r"""
import os, sys, time
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from PySide6.QtWidgets import QApplication
app = QApplication([])
from crossview.gui.workers import Task

def work(progress, should_stop):
    time.sleep(1.5)                  # work that cannot stop halfway (a scoring bank's statistics, a checkpoint)
    print("work ended", flush=True)
    return 1

Task(work, name="slow").start()
time.sleep(0.2)
print("leaving", flush=True)         # the script ends with the worker's thread running
"""


def test_a_process_that_exits_while_a_worker_runs_waits_for_it_instead_of_aborting(tmp_path) -> None:
    """A QThread destroyed while it runs aborts the process (SIGABRT: 'QThread: Destroyed while thread is still
    running'; seen when the app closed while Query prepared a scoring bank at COCO size): at exit every running worker
    is asked to stop and waited for, so the work ends and the process exits normally."""
    import subprocess
    import sys

    script = tmp_path / "exit_early.py"
    script.write_text(_EXIT_SCRIPT, encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["leaving", "work", "ended"]
    assert "Destroyed while thread" not in r.stderr


def test_stop_all_stops_the_running_workers_and_names_those_it_could_not_wait_for(qtbot) -> None:
    from crossview.gui.workers import stop_all

    release = threading.Event()
    stoppable = Task(lambda progress, should_stop: [time.sleep(0.02) for _ in range(500) if not should_stop()],
                     name="stoppable").start()
    stuck = Task(lambda progress, should_stop: release.wait(30), name="stuck").start()
    try:
        assert stop_all(300) == ["stuck"]
        assert not stoppable.is_running() and stoppable.stopped and stuck.stopped
    finally:
        release.set()
        stuck.wait()
    assert stop_all(1000) == []
    # an orphan (its Qt object deleted with its parent while it runs) is stopped and waited for as well
    import shiboken6
    from PySide6.QtCore import QObject

    parent = QObject()
    orphan = Task(lambda progress, should_stop: [time.sleep(0.02) for _ in range(500) if not should_stop()],
                  name="orphan", parent=parent).start()
    shiboken6.delete(parent)
    assert not shiboken6.isValid(orphan) and orphan._thread.isRunning()
    assert stop_all(5000) == [] and not orphan._thread.isRunning()


def test_the_gui_thread_collects_often_while_work_runs_and_seldom_when_idle(qtbot) -> None:
    """With automatic collection off, new objects wait for the GUI thread's next tick, which walks them all holding
    the GIL: while a worker runs (it allocates) the tick comes every GC_BUSY_INTERVAL_MS, so each walk is short; once
    only holders keep collection on the GUI thread (the application's idle life, a test), every GC_INTERVAL_MS."""
    from crossview.gui import workers as W

    assert W.GC_BUSY_INTERVAL_MS < W.GC_INTERVAL_MS
    gate = threading.Event()
    task = Task(lambda p, s: gate.wait(30), name="allocating").start()
    assert W._GC.timer.isActive() and W._GC.timer.interval() == W.GC_BUSY_INTERVAL_MS
    gate.set()
    qtbot.waitUntil(lambda: task not in W._LIVE, timeout=30000)
    assert W._HELD                     # the test's own hold (conftest): still collecting there, at the idle pace
    assert W._GC.timer.isActive() and W._GC.timer.interval() == W.GC_INTERVAL_MS
