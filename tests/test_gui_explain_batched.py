"""Explain on a sentence query asks the explainer once per screenful (issue 30): the results in view in one
batched call, then the next screenful in another, every card filled, progress honest, scrolling to the
prefetched results computing nothing; driven with pytest-qt on the Query panel."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QImage  # noqa: E402

from crossview.engine.retriever import Retriever  # noqa: E402
from crossview.explain import Explanation  # noqa: E402
from crossview.gui.explain_controller import AHEAD_BATCH  # noqa: E402
from crossview.gui.panels.query_panel import ItemRole, QueryPanel  # noqa: E402
from toy import Identity, hand_explanation, toy_setup  # noqa: E402

pytestmark = pytest.mark.gui
PATH = Qt.ItemDataRole.UserRole + 3


class BatchingFake:
    """An explainer with ``explain_many`` (what the real one has): hand-made maps, every call recorded."""

    def __init__(self, retriever) -> None:
        self.dataset = retriever.dataset
        self.calls: list[tuple] = []          # explain(image, text, direction), one pair at a time
        self.many: list[list] = []            # explain_many(images, ...), the images of each call

    def _one(self, image, text, direction) -> Explanation:
        return hand_explanation(str(self.dataset.image_paths[image]), text, direction)

    def explain(self, image, text, direction) -> Explanation:
        self.calls.append((image, text, direction))
        return self._one(image, text, direction)

    def explain_many(self, images, text, direction="t2i", progress=None, should_stop=None) -> list:
        self.many.append(list(images))
        out = []
        for k, image in enumerate(images):
            out.append(self._one(image, text, direction))
            if progress is not None:
                progress(k + 1, len(images))
        return out


def _icons(view) -> list[QImage]:
    size = view.iconSize()
    return [view.item(r).icon().pixmap(size).toImage().convertToFormat(QImage.Format.Format_RGB32)
            for r in range(view.count())]


@pytest.fixture
def panel(qtbot, tmp_path: Path) -> QueryPanel:
    paths = []
    for i in range(30):
        p = tmp_path / f"im{i}.png"
        Image.new("RGB", (64, 48) if i % 2 else (40, 40), (i * 8, 100, 200)).save(p)
        paths.append(str(p))
    ds, feats, _ = toy_setup(paths)
    w = QueryPanel()
    qtbot.addWidget(w)
    w.set_retriever(Retriever(Identity().fit(None), ds, feats, gallery="all"), tmp_path / "run",
                    title="identity on toy", eval_split="test", train_split="train")
    w.resize(900, 520)                 # a few rows of results in view, the rest below
    w.show()
    w.fakes = []
    w.explainer_factory = lambda r: w.fakes.append(BatchingFake(r)) or w.fakes[-1]
    return w


def test_a_sentence_query_is_explained_one_batched_call_per_screenful(qtbot, panel: QueryPanel) -> None:
    panel.sentence.setText("a blue thing")
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        qtbot.keyClick(panel.sentence, Qt.Key.Key_Return)
    view = panel.image_grid
    assert view.count() == 30
    qtbot.waitUntil(lambda: all(panel.cache.get(view.item(r).data(PATH)) is not None for r in range(30)),
                    timeout=10_000)
    panel.results.refresh_icons(view)
    plain = _icons(view)
    in_view = panel.results.rows_in_view(view, 24)
    assert 0 < len(in_view) < 30 and in_view == list(range(len(in_view))), "the test needs results below the view"

    ctl = panel.explain_controller
    progress: list[tuple[int, int]] = []
    ctl.progress.connect(lambda done, total: progress.append((done, total)))
    with qtbot.waitSignal(ctl.started, timeout=5_000) as started, \
            qtbot.waitSignal(panel.explained, timeout=10_000):
        panel.set_explain(True)
    qtbot.waitUntil(lambda: not ctl.busy, timeout=10_000)           # the screenful ahead, quietly after
    fake = panel.fakes[0]
    items = [int(view.item(r).data(ItemRole)) for r in range(30)]
    n = len(in_view)
    # one call for the results in view (the focus, the first, leads), one for the next screenful; none per pair
    assert started.args == [n] and fake.calls == []
    assert fake.many == [items[:n], items[n:n + AHEAD_BATCH]]
    # progress counts the results in view only, rising to all of them
    assert progress and progress[-1] == (n, n) and all(t == n and d <= n for d, t in progress)
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)
    icons = _icons(view)
    assert all(icons[r] != plain[r] for r in range(30)), "every card must show its region map"
    assert f"{n} of the {n} results in view explained" in panel.explain_note.text()

    # scrolling to the end: those results were explained ahead, nothing is asked again
    view.scrollToBottom()
    qtbot.waitUntil(lambda: 29 in panel.results.rows_in_view(view, 24), timeout=5_000)
    panel._refresh_explain()
    assert not ctl.busy and len(fake.many) == 2

    # another sentence: again one call for the screenful in view first
    panel.set_explain(False)
    view.scrollToTop()
    panel.sentence.setText("a red thing")
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        qtbot.keyClick(panel.sentence, Qt.Key.Key_Return)
    with qtbot.waitSignal(panel.explained, timeout=10_000) as sig:
        panel.set_explain(True)
    qtbot.waitUntil(lambda: not ctl.busy, timeout=10_000)
    assert sig.args[0].text == "a red thing"
    items = [int(view.item(r).data(ItemRole)) for r in range(30)]
    assert fake.many[2:] == [items[:n], items[n:n + AHEAD_BATCH]] and fake.calls == []
