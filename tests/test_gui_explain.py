"""The Query panel's Explain toggle driven with pytest-qt: region maps over the query image (i2t) and over the
result images (t2i), the caption's words shaded, toggling off restores the plain view, a run without a region
map says why, a superseded query's explanation is dropped, presentation mode, and one real trained run."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import QSize, Qt  # noqa: E402
from PySide6.QtGui import QImage  # noqa: E402

from crossview.engine.retriever import Retriever  # noqa: E402
from crossview.explain import Explanation, caption_words  # noqa: E402
from crossview.gui.panels.query_panel import ItemRole, QueryPanel  # noqa: E402
from toy import Identity, hand_explanation, toy_images, toy_setup  # noqa: E402

pytestmark = pytest.mark.gui
PATH = Qt.ItemDataRole.UserRole + 3


class FakeExplainer:
    """Explanations drawn by hand (a map rising to the lower right, word values rising along the caption), so
    the panel's part is tested without a backbone; ``gates[image]`` holds that image's explanation back."""

    def __init__(self, retriever) -> None:
        self.dataset = retriever.dataset
        self.calls: list[tuple] = []
        self.gates: dict[int, threading.Event] = {}
        self.entered: dict[int, threading.Event] = {}

    def explain(self, image, text, direction) -> Explanation:
        self.calls.append((image, text, direction))
        if image in self.entered:
            self.entered[image].set()
        if image in self.gates:
            assert self.gates[image].wait(10), "the test never released the gate"
        path = str(self.dataset.image_paths[image]) if isinstance(image, int) else str(image)
        return hand_explanation(path, text, direction)


def _images(tmp_path: Path) -> list[str]:
    return toy_images(tmp_path, lambda i: (64, 48) if i % 2 else (40, 40))


def _panel(qtbot, tmp_path: Path, features_hook=None) -> QueryPanel:
    ds, feats, _ = toy_setup(_images(tmp_path))
    if features_hook is not None:
        features_hook(feats)
    w = QueryPanel()
    qtbot.addWidget(w)
    w.set_retriever(Retriever(Identity().fit(None), ds, feats, gallery="test"), tmp_path / "run",
                    title="identity on toy", eval_split="test", train_split="train")
    w.resize(1100, 760)
    w.show()
    return w


@pytest.fixture
def panel(qtbot, tmp_path: Path) -> QueryPanel:
    w = _panel(qtbot, tmp_path)
    w.fakes = []
    w.explainer_factory = lambda r: w.fakes.append(FakeExplainer(r)) or w.fakes[-1]
    return w


def _image(pm) -> QImage:
    return pm.toImage().convertToFormat(QImage.Format.Format_RGB32)


def _icons(view) -> list[QImage]:
    size = view.iconSize()
    return [_image(view.item(r).icon().pixmap(size)) for r in range(view.count())]


def _thumbnails_loaded(qtbot, panel: QueryPanel, view) -> None:
    paths = [view.item(r).data(PATH) for r in range(view.count())]
    qtbot.waitUntil(lambda: all(panel.cache.get(p) is not None for p in paths), timeout=10_000)
    panel.results.refresh_icons(view)


def test_i2t_overlays_the_query_image_and_shades_the_selected_caption(qtbot, panel: QueryPanel) -> None:
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(22)
    plain = _image(panel.query_view.pixmap())
    view = panel.caption_list
    assert panel.explain_button.toolTip() and not panel.explain_words.isVisible()
    with qtbot.waitSignal(panel.explained, timeout=10_000) as sig:
        qtbot.keyClick(view, Qt.Key.Key_E)            # the shortcut, with a result list focused
    e = sig.args[0]
    assert panel.explaining and e.region is not None
    top_caption = panel.retriever.gallery_caption_text(int(view.item(0).data(ItemRole)))
    assert e.text == top_caption
    assert _image(panel.query_view.pixmap()) != plain, "the query image must carry the region map"
    assert panel.explain_words.isVisible() and "background-color" in panel.explain_words.text()
    for word in caption_words(top_caption):
        assert word in panel.explain_words.text()
    assert "Heat map" in panel.explain_note.text()

    # another result: its caption is explained (the map depends on the caption too)
    with qtbot.waitSignal(panel.explained, timeout=10_000) as sig:
        view.setCurrentRow(2)
    assert sig.args[0].text == panel.retriever.gallery_caption_text(int(view.item(2).data(ItemRole)))
    assert "caption #3" in panel.explain_words.text()

    # off: the plain image, no words; on again: from the kept results, computing nothing
    qtbot.keyClick(view, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert not panel.explaining and not panel.explain_words.isVisible() and not panel.explain_note.isVisible()
    assert _image(panel.query_view.pixmap()) == plain
    n_calls = len(panel.fakes[0].calls)
    with qtbot.waitSignal(panel.explained, timeout=1_000):
        panel.set_explain(True)
    assert len(panel.fakes[0].calls) == n_calls and len(panel.fakes) == 1
    assert _image(panel.query_view.pixmap()) != plain


def test_t2i_overlays_the_result_images_and_shades_the_sentence(qtbot, panel: QueryPanel) -> None:
    qtbot.keyClicks(panel.sentence, "a blue thing here")     # an "e" typed in the query box is text, not the toggle
    assert panel.sentence.text() == "a blue thing here" and not panel.explaining
    panel.sentence.clear()
    qtbot.keyClicks(panel.sentence, "a blue thing")
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        qtbot.keyClick(panel.sentence, Qt.Key.Key_Return)
    assert sig.args[0].direction == "t2i"
    view = panel.image_grid
    _thumbnails_loaded(qtbot, panel, view)
    plain = _icons(view)
    with qtbot.waitSignal(panel.explained, timeout=10_000) as sig:
        panel.set_explain(True)
    e = sig.args[0]
    assert e.text == "a blue thing" and e.region is not None
    explained = _icons(view)
    assert all(a != b for a, b in zip(plain, explained)), "every result in view must show its region map"
    assert {c[2] for c in panel.fakes[0].calls} == {"t2i"}
    assert "image #1" in panel.explain_words.text() and "blue" in panel.explain_words.text()
    # the shaded words follow the selected result
    with qtbot.waitSignal(panel.explained, timeout=1_000):
        view.setCurrentRow(3)
    assert "image #4" in panel.explain_words.text()
    # a thumbnail decoded late does not wipe a region map
    panel.results.thumbnail_ready(view.item(0).data(PATH))
    assert _icons(view)[0] == explained[0]

    panel.set_explain(False)
    assert _icons(view) == plain and not panel.explain_words.isVisible()
    # going back to a query already explained computes nothing
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(int(view.item(0).data(ItemRole)))
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.go_back()
    n_calls = len(panel.fakes[0].calls)
    with qtbot.waitSignal(panel.explained, timeout=1_000):
        panel.set_explain(True)
    assert len(panel.fakes[0].calls) == n_calls and _icons(view) == explained


def test_a_run_without_a_region_map_says_why_and_still_shades_the_words(qtbot, tmp_path: Path) -> None:
    """The real explainer on a run over precomputed image features: no map, a line saying why, words shaded."""
    from crossview.features import PRECOMP

    def precomp(feats) -> None:
        feats.image_encoder = PRECOMP

    panel = _panel(qtbot, tmp_path, precomp)
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(22)
    plain = _image(panel.query_view.pixmap())
    with qtbot.waitSignal(panel.explained, timeout=10_000) as sig:
        panel.set_explain(True)
    e = sig.args[0]
    assert e.region is None and "precomputed image features" in e.region_error
    assert e.region_error in panel.explain_note.text() and panel.explain_note.isVisible()
    assert _image(panel.query_view.pixmap()) == plain
    assert panel.explain_words.isVisible() and "background-color" in panel.explain_words.text()

    # the same for a sentence: icons stay plain, the words are shaded, the line says why
    with qtbot.waitSignal(panel.explained, timeout=10_000) as sig:
        panel.query_text("a red thing")
    assert sig.args[0].region is None and "precomputed image features" in panel.explain_note.text()
    assert "red" in panel.explain_words.text()


def test_a_superseded_query_s_explanation_is_dropped(qtbot, panel: QueryPanel) -> None:
    panel.set_explain(True)
    panel.explainer = fake = panel.explainer_factory(panel.retriever)
    fake.gates[22], fake.entered[22] = threading.Event(), threading.Event()
    shown: list = []
    panel.explained.connect(shown.append)
    try:
        with qtbot.waitSignal(panel.answered, timeout=10_000):
            panel.query_image(22)
        assert fake.entered[22].wait(10), "the first explanation never started"
        with qtbot.waitSignal(panel.answered, timeout=10_000):
            panel.query_image(25)
    finally:
        fake.gates[22].set()                    # the first query's explanation now finishes, too late
    with qtbot.waitSignal(panel.explained, timeout=10_000) as sig:
        pass
    assert sig.args[0].image_path == str(panel.retriever.dataset.image_paths[25])
    assert all(e.image_path.endswith("im25.png") for e in shown), "image 22's explanation was shown"
    assert not any(key[0] == 22 for key in panel.explain_controller.cache), "a superseded task's results are dropped"
    assert panel.ranking.query == {"image": 25}


def test_presentation_mode_shows_large_shaded_words_that_fit(qtbot, panel: QueryPanel) -> None:
    panel.resize(1280, 800)
    panel.set_presentation(True)
    assert panel.explain_button.isVisible()
    with qtbot.waitSignal(panel.answered, timeout=10_000):
        panel.query_image(22)
    with qtbot.waitSignal(panel.explained, timeout=10_000):
        panel.set_explain(True)
    assert panel.explain_words.isVisible() and panel.explain_words.font().pointSizeF() >= 24
    # the shaded caption gets the panel's full width and all the height it needs (nothing clipped)
    words = panel.explain_words
    qtbot.waitUntil(lambda: words.height() >= words.heightForWidth(words.width()))
    assert words.width() > panel.width() * 0.8 and panel.explain_bar.geometry().bottom() < panel.height()
    # a sentence query: the words are large too, the result images carry their maps
    with qtbot.waitSignal(panel.explained, timeout=10_000) as sig:
        panel.query_text("a green thing")
    assert sig.args[0].region is not None and panel.explain_words.font().pointSizeF() >= 24
    panel.set_presentation(False)
    assert panel.explain_words.font().pointSizeF() < 24 and panel.explaining


# ---------------------------------------------------------------------- a real run, end to end
@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """CCA on a small demo over MobileNet-V2 features (a backbone with a conv map) and TF-IDF captions."""
    from crossview.data.demo import write_demo
    from crossview.engine.run import train

    root = tmp_path_factory.mktemp("explain")
    data = write_demo(root / "demo", n_scenes=40, n_web=0, seed=3)
    for _ in train("cca", str(data), run_dir=root / "run", params={"n_components": 8},
                   image_encoder="mobilenet_v2", text_encoder="tfidf", device="cpu"):
        pass
    return root / "run"


@pytest.mark.slow
def test_a_real_run_draws_its_region_map(qtbot, real_run: Path) -> None:
    from crossview.engine.session import open_run

    run = open_run(real_run)
    panel = QueryPanel()
    qtbot.addWidget(panel)
    panel.set_retriever(run.retriever(run.config["split"]), real_run, title=run.name, eval_split=run.config["split"])
    panel.resize(1000, 700)
    panel.show()
    image = int(panel.retriever.gallery_images[0])
    with qtbot.waitSignal(panel.answered, timeout=20_000):
        panel.query_image(image)
    plain = _image(panel.query_view.pixmap())
    with qtbot.waitSignal(panel.explained, timeout=60_000) as sig:
        panel.set_explain(True)
    e = sig.args[0]
    assert e.region is not None and e.region.mode in ("exact", "first-order") and not e.region_error
    assert abs(float(e.region.values.mean()) - e.region.score) < 1e-3
    assert _image(panel.query_view.pixmap()) != plain
    assert panel.explain_words.isVisible() and "Heat map" in panel.explain_note.text()
    assert panel.explainer.dataset is run.dataset and panel.query_view.pixmap().size() != QSize()
