"""Photo galleries in the app (issue 30): File > Open photo folder / a dropped folder becomes a gallery of the Query
panel, encoded in the background with a bar, an ETA and Cancel (a cancelled folder encodes only the rest next
time); a sentence ranks the photos in the grid with their file names and no ground truth; marks are kept by photo
path; double-click opens the photo; an image file dropped anywhere queries with it; a caption corpus's first use
has the same bar and Cancel."""

from __future__ import annotations

import csv
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("pytestqt")
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDropEvent  # noqa: E402

from crossview.engine.retriever import Retriever  # noqa: E402
from crossview.features.cache import FeatureCache  # noqa: E402
from crossview.gui.panels.query_panel import ItemRole, QueryPanel  # noqa: E402
from toy import Identity, toy_setup  # noqa: E402

pytestmark = pytest.mark.gui

RGB = {"red": (210, 40, 30), "green": (30, 190, 50), "blue": (40, 50, 220)}


def _photo_folder(root: Path) -> Path:
    """12 small JPEGs, 4 of each colour, some in a subfolder (names sort red, green, blue mixed)."""
    (root / "trip").mkdir(parents=True)
    for i in range(12):
        colour = list(RGB)[i % 3]
        rng = np.random.default_rng(i)
        px = np.clip(np.array(RGB[colour]) + rng.integers(-20, 20, (24, 24, 3)), 0, 255).astype(np.uint8)
        where = root / "trip" if i % 2 else root
        Image.fromarray(px).save(where / f"p{i:02d}_{colour}.jpg", quality=95)
    return root


def _colour_row(path: str) -> np.ndarray:
    """The toy run's image side for a file: its mean colour, scaled to 0-1 (what the naive check recomputes)."""
    return np.asarray(Image.open(path).convert("RGB"), np.float32).reshape(-1, 3).mean(0) / 255.0


class ColourEncoder:
    """The toy run's image encoder (``encode_new_images``): counts the files it encodes; ``gate`` (an Event) holds
    each call until it is set, so a test can act while encoding is under way."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.entered = threading.Event()
        self.gate: threading.Event | None = None

    def __call__(self, paths, *, device="cpu"):
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(20)
        self.paths += list(paths)
        return np.stack([_colour_row(p) for p in paths]).astype(np.float32)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSVIEW_HOME", str(tmp_path / "home"))
    ds, feats, _ = toy_setup()
    enc = ColourEncoder()
    feats.encode_new_images = enc
    base = Retriever(Identity().fit(None), ds, feats, gallery="test", cache=FeatureCache(tmp_path / "cache"))
    return base, enc, _photo_folder(tmp_path / "my photos")


@pytest.fixture
def panel(qtbot, setup, tmp_path):
    base, _, _ = setup
    w = QueryPanel()
    qtbot.addWidget(w)
    w.set_retriever(base, tmp_path / "run", title="identity on toy", eval_split="test", train_split="train")
    w.gallery_loader.photo_batch_size = 4
    w.resize(1100, 700)
    w.show()
    yield w
    w.stop_tasks()


def _open(qtbot, panel, folder):
    with qtbot.waitSignal(panel.gallery_loader.loaded, timeout=20_000):
        panel.open_photo_folder(folder)
    qtbot.waitUntil(panel.gallery_loader.isHidden, timeout=5_000)      # its thread ended and said so


def _ask(qtbot, panel, sentence):
    with qtbot.waitSignal(panel.answered, timeout=10_000) as sig:
        panel.query_text(sentence)
    return sig.args[0]


def test_a_photo_folder_is_a_gallery_a_sentence_ranks_in_the_grid(qtbot, panel, setup):
    _, enc, folder = setup
    _open(qtbot, panel, folder)
    r = panel.retriever
    assert r.photos is not None and r.photos.root == folder.resolve() and r.n_gallery_images == 12
    assert panel.gallery_combo.currentText() == "Photos: my photos (12)"
    assert "Photos: my photos" in panel.gallery_note.text() and "no ground truth" in panel.gallery_note.text().lower()
    assert len(enc.paths) == 12 and panel.gallery_loader.isHidden()

    ranking = _ask(qtbot, panel, "a red thing")
    grid = panel.image_grid
    assert panel.results.currentWidget() is grid and grid.count() == 12
    # naive check: the score of a photo for "a red thing" (bag of colours [1, 0, 0]) is its mean red, best first
    files = [str(p) for p in r.photos.image_paths]
    naive = sorted(((float(_colour_row(f)[0]), f) for f in files), key=lambda t: -t[0])
    shown = [files[int(grid.item(row).data(ItemRole))] for row in range(grid.count())]
    assert shown == [f for _, f in naive]
    np.testing.assert_allclose(ranking.scores, [s for s, _ in naive], atol=1e-5)
    first = grid.item(0).text()
    assert Path(naive[0][1]).name in first and f"{naive[0][0]:.3f}" in first and "red" in first
    assert all("red" in Path(f).name for f in shown[:4])
    # no ground truth, said in one line; no ranks of a right answer
    assert panel.gold_label.text().startswith("No ground truth") and "R@K" in panel.gold_label.text()
    assert len(ranking.gold) == 0
    assert not panel.query_with_button.isEnabled() and not panel.explain_button.isEnabled()


def test_cancel_keeps_what_was_encoded_and_choosing_again_encodes_the_rest(qtbot, panel, setup):
    _, enc, folder = setup
    enc.gate = threading.Event()
    loader = panel.gallery_loader
    task = panel.open_photo_folder(folder)
    assert task is not None
    qtbot.waitUntil(enc.entered.is_set, timeout=10_000)
    # the gallery box says what is loading; the bar and Cancel are in the panel
    assert panel.gallery_combo.currentText() == "Loading Photos: my photos..."
    assert loader.isVisible() and loader.cancel_button.isEnabled()
    with qtbot.waitSignal(loader.cancelled, timeout=20_000) as sig:
        qtbot.mouseClick(loader.cancel_button, Qt.MouseButton.LeftButton)
        enc.gate.set()                      # the batch under way ends; the next one is not started
    assert len(enc.paths) == 4
    assert "4 of 12 photos encoded and kept" in sig.args[1] and "only the rest" in sig.args[1]
    qtbot.waitUntil(lambda: loader.isHidden(), timeout=5_000)
    assert panel.retriever.photos is None                     # still on the split it was on
    assert panel.gallery_combo.currentData() == "test"
    assert "4 of 12 photos encoded and kept" in panel.gallery_note.text()

    first = list(enc.paths)
    enc.gate = None
    combo = panel.gallery_combo
    i = combo.findData(f"photos:{folder.resolve()}")
    assert i >= 0 and combo.itemText(i) == "Photos: my photos"      # count unknown until it has been read
    with qtbot.waitSignal(loader.loaded, timeout=20_000):
        combo.setCurrentIndex(i)
        combo.activated.emit(i)
    assert len(enc.paths) == 12 and not set(first) & set(enc.paths[4:])      # only the 8 others were encoded
    assert panel.retriever.photos_encoded == 8 and panel.retriever.n_gallery_images == 12
    # the progress seen on the way: the bar counted the 8 left to encode
    assert loader.bar.maximum() == 8 and loader.bar.value() == 8


def test_marks_are_kept_by_photo_path_and_exported(qtbot, panel, setup, tmp_path):
    _, enc, folder = setup
    _open(qtbot, panel, folder)
    ranking = _ask(qtbot, panel, "a red thing")
    top = str(panel.retriever.gallery_image_path(int(ranking.items[0])))
    panel.mark_current(True)
    line = json.loads((tmp_path / "run" / "annotations.jsonl").read_text().splitlines()[-1])
    assert line["item_text"] == top and line["query"] == {"text": "a red thing", "photos": str(folder.resolve())}
    assert panel.image_grid.item(0).text().startswith("✓ ")

    # a new photo that sorts first shifts every index: the mark stays on the same photo
    Image.new("RGB", (24, 24), (120, 120, 120)).save(folder / "a_new.jpg")
    _open(qtbot, panel, folder)
    assert len(enc.paths) == 13                   # only the new photo was encoded
    _ask(qtbot, panel, "a red thing")
    grid = panel.image_grid
    marked = [row for row in range(grid.count()) if grid.item(row).text().startswith("✓ ")]
    assert [str(panel.retriever.gallery_image_path(int(grid.item(r).data(ItemRole)))) for r in marked] == [top]
    # the same sentence on the dataset's images has no marks of the photos
    assert panel.annotations.marks_for("t2i", {"text": "a red thing"}) == {}

    out = panel.export_marks(tmp_path / "marks.csv")
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 1 and rows[0]["item_image_file"] == Path(top).name and rows[0]["item_text"] == top
    assert rows[0]["query"] == "a red thing" and rows[0]["relevant"] == "1"


def test_double_click_opens_the_photo_with_the_system_viewer(qtbot, panel, setup, monkeypatch):
    from crossview.gui import photo_results

    _, _, folder = setup
    opened: list[QUrl] = []
    monkeypatch.setattr(photo_results.QDesktopServices, "openUrl", lambda url: opened.append(url) or True)
    _open(qtbot, panel, folder)
    ranking = _ask(qtbot, panel, "a blue thing")
    grid = panel.image_grid
    grid.doItemsLayout()
    centre = grid.visualItemRect(grid.item(1)).center()
    qtbot.mouseDClick(grid.viewport(), Qt.MouseButton.LeftButton, pos=centre)
    want = panel.retriever.gallery_image_path(int(ranking.items[1]))
    assert opened == [QUrl.fromLocalFile(str(want))]
    assert panel.ranking is ranking                      # no query from it: a photo has no captions to rank


def test_a_caption_corpus_first_use_shows_the_bar_and_can_be_cancelled(qtbot, panel, setup, tmp_path):
    base, _, _ = setup
    gate = threading.Event()
    started = threading.Event()

    class SlowColours:
        """A text encoder that encodes 100 captions a step (and can be held at its second step)."""
        name = "slow-colours"
        words = ("red", "green", "blue")
        hold = True

        def cache_parts(self):
            return {"name": self.name}

        def iter_encode(self, captions, device="cpu"):
            out = []
            for start in range(0, len(captions), 100):
                if start == 100 and self.hold:
                    started.set()
                    assert gate.wait(20)
                out += [[c.split().count(w) for w in self.words] for c in captions[start:start + 100]]
                yield min(start + 100, len(captions)), len(captions)
            return np.array(out, np.float32)

    base.features.text_model = SlowColours()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"a {w} thing {i}" for i in range(200) for w in ("red", "blue", "green")) + "\n")
    loader = panel.gallery_loader
    panel.load_gallery(f"corpus:{corpus}")
    qtbot.waitUntil(started.is_set, timeout=10_000)
    qtbot.waitUntil(lambda: loader.bar.value() == 100, timeout=10_000)
    assert panel.gallery_combo.currentText() == "Loading caption corpus corpus.txt..."
    assert "100 of 600 captions" in loader.label.text() and loader.bar.maximum() == 600
    with qtbot.waitSignal(loader.cancelled, timeout=20_000) as sig:
        qtbot.mouseClick(loader.cancel_button, Qt.MouseButton.LeftButton)
        gate.set()
    assert "starts over" in sig.args[1] and panel.retriever.corpus is None

    SlowColours.hold = False
    with qtbot.waitSignal(loader.loaded, timeout=20_000):
        panel.load_gallery(f"corpus:{corpus}")
    assert panel.retriever.corpus is not None and panel.retriever.n_gallery_captions == 600
    assert panel.gallery_combo.currentData() == "corpus:current"


def test_a_folder_opened_before_any_run_is_searched_once_a_run_is_open(qtbot, setup, tmp_path):
    base, enc, folder = setup
    w = QueryPanel()
    qtbot.addWidget(w)
    assert w.open_photo_folder(folder) is None and "open or train a run" in w.gallery_note.text()
    assert enc.paths == []
    with qtbot.waitSignal(w.gallery_loader.loaded, timeout=20_000):
        w.set_retriever(base, tmp_path / "run", title="toy", eval_split="test", train_split="train")
    qtbot.waitUntil(w.gallery_loader.isHidden, timeout=5_000)
    assert w.retriever.photos.root == folder.resolve() and len(enc.paths) == 12
    assert w.gallery_combo.currentText() == "Photos: my photos (12)"


# ------------------------------------------------------------------------------------------ the window
def _drop(window, path: Path) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    window.dropEvent(QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                                Qt.KeyboardModifier.NoModifier))


def test_drops_on_the_window_query_an_image_search_a_photo_folder_and_open_a_dataset(qtbot, window, setup,
                                                                                      tmp_path):
    base, enc, folder = setup
    qp = window.query_panel
    qp.set_retriever(base, tmp_path / "run", title="toy", eval_split="test", train_split="train")
    window.tabs.setCurrentWidget(window.data_panel)

    image = next(folder.glob("*.jpg"))                     # an image file: an image query, in the Query panel
    with qtbot.waitSignal(qp.answered, timeout=10_000) as sig:
        _drop(window, image)
    assert window.tabs.currentWidget() is qp
    assert sig.args[0].direction == "i2t" and sig.args[0].query == {"file": str(image)}
    assert window.dataset is None                          # not opened as a dataset

    window.tabs.setCurrentWidget(window.data_panel)        # a folder of photos: a gallery, not a dataset
    with qtbot.waitSignal(qp.gallery_loader.loaded, timeout=20_000):
        _drop(window, folder)
    assert qp.retriever.photos.root == folder.resolve() and window.tabs.currentWidget() is qp
    assert window.dataset is None

    data = tmp_path / "captioned"                           # a folder that is a dataset (images + captions)
    data.mkdir()
    lines = []
    for i in range(4):
        Image.new("RGB", (16, 16), (60 * i, 20, 20)).save(data / f"{i}.jpg")
        lines.append(json.dumps({"image": f"{i}.jpg", "caption": f"picture {i}"}))
    (data / "captions.jsonl").write_text("\n".join(lines) + "\n")
    _drop(window, data)
    qtbot.waitUntil(lambda: window.dataset is not None, timeout=20_000)
    assert window.dataset.n_images == 4 and qp.retriever.photos.root == folder.resolve()
