"""Shared test set-up: Qt off screen, user folders in a temporary place, the shared Flickr8k sample."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Before anything imports Qt: render off screen, and keep the user's real folders untouched.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="crossview-tests-"))
os.environ["CROSSVIEW_HOME"] = str(_SESSION_DIR / "home")
os.environ.setdefault("CROSSVIEW_CACHE_DIR", str(_SESSION_DIR / "cache"))

REPO = Path(__file__).resolve().parent.parent


@pytest.hookimpl(trylast=True)
def pytest_configure(config) -> None:
    """A crash (a segfault in Qt, torch or numpy) dumps the faulting thread's Python stack only, not every thread's:
    with every thread, the faulting one came somewhere in the middle of a long dump (newest threads first), and the
    CI report, which keeps a long output's head and its last line, showed two tqdm monitors and a pool's feeder but
    not the thread that crashed. (After pytest's own faulthandler plugin, which enables the all-threads dump, on the
    same standard error.)"""
    import faulthandler
    import sys

    faulthandler.enable(file=os.dup(sys.stderr.fileno()), all_threads=False)


def pytest_sessionfinish(session, exitstatus) -> None:
    """The session's user folders and feature cache go with it (about 300 MB a whole run; sessions left them in
    the temp folder, 700 of them on one machine); ``CROSSVIEW_KEEP_TEST_DIR=1`` keeps them for a look."""
    if not os.environ.get("CROSSVIEW_KEEP_TEST_DIR"):
        shutil.rmtree(_SESSION_DIR, ignore_errors=True)
FLICKR8K_SAMPLE = REPO.parent / "shared" / "data" / "flickr8k-sample"


@pytest.fixture(scope="session")
def flickr8k_sample() -> Path:
    """The shared Flickr8k sample folder (700 images, 3,500 captions); skips when it is absent."""
    if not (FLICKR8K_SAMPLE / "dataset_flickr8k_sample.json").is_file():
        pytest.skip("../shared/data/flickr8k-sample is not present")
    return FLICKR8K_SAMPLE


@pytest.fixture(autouse=True)
def _no_windows_left_open(request):
    """GUI tests must close what they open (windows left behind leak into the next test), and every worker a GUI
    test started has ended before the test's objects go: a worker's ``finished`` is queued from its thread as it
    ends, and processing events while a thread still winds down behind a test whose widgets are gone crashed full
    CI runs under load twice (after test_gui_workers' and test_gui_train's tests)."""
    if "qtbot" not in request.fixturenames:
        yield
        return
    from crossview.gui.workers import _LIVE, hold_collection, release_collection

    hold_collection(request.node)
    try:
        yield
        for w in list(_LIVE):          # every worker started and not yet joined (its owner may have dropped it)
            if w.is_running():
                w.stop()
                assert w.wait(30000), f"worker {getattr(w, 'name', w)!r} did not end within 30 s of the test"
        from PySide6.QtWidgets import QApplication
        app = QApplication.instance()
        if app is None:
            return
        app.processEvents()
        if _LIVE:                       # the joined workers are let go a turn after their finished signal
            app.processEvents()
            app.processEvents()
        left = [w for w in app.topLevelWidgets() if w.isVisible()]
        for w in left:
            w.close()
        assert not left, f"windows left open: {[type(w).__name__ for w in left]}"
    finally:
        _free_gui_garbage()
        release_collection(request.node)


def _free_gui_garbage() -> None:
    """The test's widgets (closed and given to ``deleteLater`` by pytest-qt) deleted now, and its cyclic garbage
    collected now, on the GUI thread: left for later, a collection set off by another thread (a tqdm monitor, a pool's
    feeder, a later test's worker) freed a closed plot's scene there, and a full CI run segfaulted in the next GUI
    test."""
    import gc

    from PySide6.QtCore import QCoreApplication, QEvent

    if QCoreApplication.instance() is not None:
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        QCoreApplication.processEvents()
    gc.collect()


@pytest.fixture(scope="session")
def small_demo():
    """The built-in demo at 720 scenes (600 train / 60 val / 60 test): what the "learns on the demo" tests of the
    deep methods train on, so that the session extracts its image and caption features in about a third of the
    full demo's time (chance rsum is about 53 for 60 test images)."""
    from crossview.data.demo import load_demo
    return load_demo(n_scenes=720)


@pytest.fixture(scope="session")
def demo_dataset():
    """The built-in demo at its default size (rendered once per test session into the session cache)."""
    from crossview.data.demo import load_demo
    return load_demo()


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    """The app's main window, shown, with its user folder in ``tmp_path`` (closed after the test)."""
    from crossview.gui.main_window import MainWindow

    monkeypatch.setenv("CROSSVIEW_HOME", str(tmp_path / "home"))
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    yield win
    win.close()
