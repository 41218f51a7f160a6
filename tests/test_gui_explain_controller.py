"""The explain controller alone, without a Query panel: one task per request, pairs kept and reused, a newer
request supersedes the running one (its results dropped) unless that one covers it, the explainer kept per run,
failures reported, every thread waited for on stop; driven with pytest-qt signals, never sleeps."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytestqt")
from PySide6.QtGui import QPixmap  # noqa: E402

from crossview.core.errors import CrossViewError  # noqa: E402
from crossview.engine.retriever import Retriever  # noqa: E402
from crossview.explain import Explanation, RegionMap, WordImportance, caption_words  # noqa: E402
from crossview.gui.explain_controller import EXPLAIN_KEEP, ExplainController  # noqa: E402
from crossview.gui.explain_view import Explained, Pair  # noqa: E402
from crossview.gui.workers import Task  # noqa: E402
from toy import toy_retriever  # noqa: E402

pytestmark = pytest.mark.gui


class Fake:
    """An explainer with hand-made maps; ``gates[image]`` holds that image back until the test sets it,
    ``entered[image]`` says it has started; ``bad`` images fail as a user error, ``bug`` ones as a bug."""

    def __init__(self, retriever) -> None:
        self.dataset = retriever.dataset
        self.calls: list[tuple] = []
        self.gates: dict[int, threading.Event] = {}
        self.entered: dict[int, threading.Event] = {}
        self.bad: set[int] = set()
        self.bug: set[int] = set()

    def explain(self, image, text, direction) -> Explanation:
        self.calls.append((image, text, direction))
        if image in self.entered:
            self.entered[image].set()
        if image in self.gates:
            assert self.gates[image].wait(10), "the test never released the gate"
        if image in self.bad:
            raise CrossViewError(f"image {image} cannot be explained")
        if image in self.bug:
            raise RuntimeError("a bug in the explainer")
        path = str(self.dataset.image_paths[image])
        values = np.add.outer(np.arange(4), np.arange(4)).astype(np.float32)
        region = RegionMap(values=values, score=float(values.mean()), mode="exact", crop_box=(0, 0, 40, 40),
                           image_size=(40, 40), residual=0.0, direction=direction)
        words = caption_words(text)
        wi = WordImportance(words, np.linspace(0.0, 1.0, len(words)).astype(np.float32), 0.5, "exact", 0.0)
        return Explanation(region=region, words=wi, image_path=path, text=text)


@pytest.fixture
def ctl(qtbot, tmp_path: Path):
    c = ExplainController()
    c.fakes = []
    c.explainer_factory = lambda r: c.fakes.append(Fake(r)) or c.fakes[-1]
    c.set_retriever(toy_retriever(tmp_path))
    yield c
    for fake in c.fakes:                       # nothing may stay blocked on a gate
        for gate in fake.gates.values():
            gate.set()
    c.stop()
    assert not any(t.is_running() for t in c.findChildren(Task)), "a task outlived stop()"


def t2i(images, text: str = "a blue thing") -> list[Pair]:
    return [Pair(i, text, "t2i") for i in images]


def test_a_request_explains_the_missing_pairs_in_one_task_and_keeps_them(qtbot, ctl: ExplainController) -> None:
    pairs = t2i([21, 22, 23])
    got: list[Explained] = []
    ctl.pair_explained.connect(got.append)
    with qtbot.waitSignal(ctl.done, timeout=10_000), qtbot.waitSignal(ctl.started, timeout=1_000) as started:
        assert ctl.request(pairs) is False and ctl.busy
    assert started.args == [3] and not ctl.busy
    assert [g.pair for g in got] == pairs and ctl.count_known(pairs) == 3
    assert ctl.get(pairs[1]).explanation.text == "a blue thing" and ctl.get(Pair(24, "x", "t2i")) is None
    pm = ctl.pixmap(pairs[0])
    assert isinstance(pm, QPixmap) and not pm.isNull() and ctl.pixmap(pairs[0]) is pm   # made once
    assert len(ctl.fakes) == 1 and len(ctl.fakes[0].calls) == 3

    # asked again: all known, nothing runs; one more pair: only that one is explained
    assert ctl.request(pairs) is True and not ctl.busy
    with qtbot.waitSignal(ctl.done, timeout=10_000), qtbot.waitSignal(ctl.started, timeout=1_000) as started:
        ctl.request(pairs + t2i([24]))
    assert started.args == [1] and ctl.fakes[0].calls[-1][0] == 24 and len(ctl.fakes[0].calls) == 4


def test_progress_follows_each_pair_and_the_results_are_there_when_it_arrives(qtbot, ctl) -> None:
    seen: list[tuple[int, int, int]] = []
    pairs = t2i(range(20, 26))
    ctl.progress.connect(lambda done, total: seen.append((done, total, ctl.count_known(pairs))))
    with qtbot.waitSignal(ctl.done, timeout=10_000):
        ctl.request(pairs)
    assert seen and seen[-1][:2] == (6, 6)
    assert all(known >= done for done, _, known in seen), "a progress signal came before its pair was kept"


def test_a_newer_request_supersedes_the_running_task_and_drops_its_results(qtbot, ctl) -> None:
    first, second = t2i([22]), t2i([25])
    ctl.request([])                                  # nothing wanted: nothing made yet
    assert ctl.explainer is None
    fake = ctl.explainer = ctl.explainer_factory(ctl.retriever)
    fake.gates[22], fake.entered[22] = threading.Event(), threading.Event()
    got: list[Explained] = []
    ctl.pair_explained.connect(got.append)
    ctl.request(first)
    assert fake.entered[22].wait(10), "the first explanation never started"
    with qtbot.waitSignal(ctl.done, timeout=10_000):
        ctl.request(second)
        fake.gates[22].set()             # the first task now finishes its pair, too late
    assert [g.pair for g in got] == second and ctl.get(first[0]) is None and ctl.get(second[0]) is not None
    assert [c[0] for c in fake.calls] == [22, 25], "the superseded task went on to another pair"


def test_a_request_the_running_task_covers_does_not_restart_it(qtbot, ctl) -> None:
    fake = ctl.explainer = ctl.explainer_factory(ctl.retriever)
    fake.gates[21], fake.entered[21] = threading.Event(), threading.Event()
    starts: list[int] = []
    ctl.started.connect(starts.append)
    ctl.request(t2i([21, 22, 23]))
    assert fake.entered[21].wait(10)
    assert ctl.request(t2i([23, 22])) is False and starts == [3]     # the running task will get to them
    with qtbot.waitSignal(ctl.done, timeout=10_000):
        fake.gates[21].set()
    assert ctl.count_known(t2i([21, 22, 23])) == 3 and len(fake.calls) == 3
    # all known: a request cancels nothing and says so
    assert ctl.request(t2i([22])) is True


def test_the_explainer_and_kept_pairs_belong_to_one_run(qtbot, ctl, tmp_path: Path) -> None:
    with qtbot.waitSignal(ctl.done, timeout=10_000):
        ctl.request(t2i([22]))
    explainer, r = ctl.explainer, ctl.retriever
    # another gallery of the same run keeps the loaded explainer and what it explained
    ctl.set_retriever(Retriever(r.method, r.dataset, r.features, gallery="all"))
    assert ctl.explainer is explainer and ctl.get(t2i([22])[0]) is not None
    # another run: a fresh explainer, made on first use, and nothing kept
    (tmp_path / "other").mkdir()
    ctl.set_retriever(toy_retriever(tmp_path / "other"))
    assert ctl.explainer is None and not ctl.cache
    ctl.set_retriever(None)
    assert ctl.explainer is None


def test_only_the_newest_pairs_are_kept(qtbot, ctl, monkeypatch) -> None:
    import crossview.gui.explain_controller as ec

    assert EXPLAIN_KEEP == 400
    monkeypatch.setattr(ec, "EXPLAIN_KEEP", 3)
    with qtbot.waitSignal(ctl.done, timeout=10_000):
        ctl.request(t2i(range(20, 25)))
    assert list(ctl.cache) == [p.key for p in t2i(range(22, 25))]


def test_failures_are_reported(qtbot, ctl) -> None:
    # a pair that cannot be explained is kept with its error; the task goes on
    fake = ctl.explainer = ctl.explainer_factory(ctl.retriever)
    fake.bad.add(21)
    with qtbot.waitSignal(ctl.done, timeout=10_000):
        ctl.request(t2i([21, 22]))
    bad = ctl.get(t2i([21])[0])
    assert bad.explanation is None and "cannot be explained" in bad.error and ctl.pixmap(bad.pair) is None
    assert ctl.get(t2i([22])[0]).explanation is not None
    # a bug in the explainer fails the task
    fake.bug.add(23)
    with qtbot.waitSignal(ctl.failed, timeout=10_000) as sig:
        ctl.request(t2i([23]))
    assert "RuntimeError: a bug in the explainer" in sig.args[0] and not ctl.busy
    # a run the factory cannot explain: said at once, nothing started
    ctl.explainer = None

    def no(_r):
        raise CrossViewError("this run cannot be explained")

    ctl.explainer_factory = no
    with qtbot.waitSignal(ctl.failed, timeout=1_000) as sig:
        assert ctl.request(t2i([24])) is False
    assert sig.args == ["this run cannot be explained"] and not ctl.busy


def test_stop_waits_for_superseded_tasks_too(qtbot, ctl) -> None:
    fake = ctl.explainer = ctl.explainer_factory(ctl.retriever)
    fake.gates[21], fake.entered[21] = threading.Event(), threading.Event()
    ctl.request(t2i([21]))
    assert fake.entered[21].wait(10)
    ctl.request(t2i([22]))                    # supersedes; the first still runs, held at its gate
    running = [t for t in ctl.findChildren(Task) if t.is_running()]
    assert len(running) == 2
    fake.gates[21].set()
    ctl.stop()
    assert not any(t.is_running() for t in running) and not ctl.busy


def test_the_real_explainer_on_a_run_without_images_shades_the_words(qtbot, tmp_path: Path) -> None:
    """The default factory (a real :class:`crossview.explain.Explainer`) over precomputed image features."""
    from crossview.features import PRECOMP

    def precomp(feats) -> None:
        feats.image_encoder = PRECOMP

    ctl = ExplainController()
    ctl.set_retriever(toy_retriever(tmp_path, hook=precomp))
    pair = Pair(22, "a red thing", "i2t")
    try:
        with qtbot.waitSignal(ctl.pair_explained, timeout=30_000) as sig:
            ctl.request([pair])
        got = sig.args[0]
        assert got.pair == pair and got.image is None and ctl.pixmap(pair) is None
        e = got.explanation
        assert e.region is None and "precomputed image features" in e.region_error
        assert "red" in e.words.words and ctl.explainer.dataset is ctl.retriever.dataset
        qtbot.waitUntil(lambda: not ctl.busy, timeout=10_000)
    finally:
        ctl.stop()
