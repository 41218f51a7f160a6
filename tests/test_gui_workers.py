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
