"""The app's Query gallery switched to a caption corpus: the encoding moves the status-bar progress, off the
GUI thread, and the next open of the same corpus is served from the feature cache."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from crossview.engine import session  # noqa: E402
from crossview.gui.main_window import MainWindow  # noqa: E402
from test_retriever import _CountingColours  # noqa: E402
from toy import Identity, toy_setup  # noqa: E402

pytestmark = pytest.mark.gui


def test_corpus_gallery_reports_progress_then_comes_from_the_cache(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSVIEW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    ds, feats, _ = toy_setup()
    spy = _CountingColours()
    feats.text_model = spy
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def fake_open_run(folder, dataset=None, **_):
        return session.OpenRun(run_dir=Path(folder), config={}, summary={}, method=Identity().fit(None),
                               dataset=ds, features=feats)

    monkeypatch.setattr(session, "open_run", fake_open_run)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"a {w} thing number {i}" for i in range(2000) for w in ("red", "blue")) + "\n")

    win = MainWindow()
    qtbot.addWidget(win)
    seen: list[tuple[int, int]] = []
    real = win._on_run_progress
    monkeypatch.setattr(win, "_on_run_progress", lambda t, d, n: (seen.append((d, n)), real(t, d, n)))

    task = win.open_run(str(run_dir), show="query", gallery=f"corpus:{corpus}")
    qtbot.waitUntil(lambda: win.query_panel.retriever is not None
                    and win.query_panel.retriever.corpus is not None, timeout=60_000)
    qtbot.waitUntil(lambda: not task.is_running(), timeout=10_000)
    assert spy.encoded == 4000
    assert seen and seen[-1] == (4000, 4000)
    qtbot.waitUntil(lambda: not win.progress.isVisible(), timeout=10_000)
    assert win.query_panel.retriever.corpus_cache_hit is False

    seen.clear()
    first = win.query_panel.retriever
    task = win.open_run(str(run_dir), show="query", gallery=f"corpus:{corpus}")
    qtbot.waitUntil(lambda: win.query_panel.retriever is not first, timeout=60_000)
    assert spy.encoded == 4000, "the second open must come from the feature cache"
    assert win.query_panel.retriever.corpus_cache_hit is True
    qtbot.waitUntil(lambda: not task.is_running(), timeout=10_000)
    win.close()

