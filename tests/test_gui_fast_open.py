"""Issue 34: the app shows a run from its gallery cache first (summary, metrics, the gallery's embeddings
memory-mapped), answers sentences at once, and opens the run in full (dataset, feature rows) in the background."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from crossview.core.errors import CrossViewError  # noqa: E402
from crossview.gui.main_window import MainWindow  # noqa: E402


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    """A CCA run (its default scoring, with the bank it stores) evaluated on val of a small precomp folder."""
    from _engine_helpers import make_toy_dataset
    from crossview.engine.run import train

    root = tmp_path_factory.mktemp("fastopen")
    ds = make_toy_dataset(n_images=100, caps_per_image=2)
    data = root / "toy_precomp"
    data.mkdir()
    for prefix, split in (("train", "train"), ("dev", "val")):
        rows = np.asarray(ds.splits[split])
        np.save(data / f"{prefix}_ims.npy", np.asarray(ds.image_features)[rows])
        caps = [ds.captions[c] for i in rows for c in ds.captions_of(int(i))]
        (data / f"{prefix}_caps.txt").write_text("\n".join(caps) + "\n")
    for _ in train("cca", str(data), run_dir=root / "runs" / "toy", params={"n_components": 8}, split="val",
                   text_encoder="bow", device="cpu"):
        pass
    return root / "runs" / "toy"


def _open(qtbot, win: MainWindow, run_dir: Path):
    task = win.open_run(str(run_dir))
    with qtbot.waitSignal(task.finished, timeout=60_000):
        pass
    return task


def test_a_run_shows_from_its_gallery_cache_then_opens_in_full(qtbot, window: MainWindow, toy_run: Path) -> None:
    from crossview.engine.scoring import retriever_scoring

    seen: list[tuple[object, bool, object]] = []
    # queued after the window's own handler: sees the panel as the preview left it
    window.run_previewed.connect(lambda task, res: seen.append((window.query_panel.retriever, window.run_partial,
                                                                res)), Qt.ConnectionType.QueuedConnection)
    _open(qtbot, window, toy_run)            # first opening: in full (the gallery cache is empty), which fills it
    assert window.run is not None, getattr(window, "last_error", None)
    assert seen == [] and not window.run_partial
    full = window.query_panel.retriever
    full_run = window.run

    _open(qtbot, window, toy_run)            # now shown from the cache first, then in full
    assert len(seen) == 1
    shown, partial, (run, cached, _annotations, results) = seen[0]
    assert shown is cached and partial and cached.gallery_name == "val" == full.gallery_name
    assert cached.features.image.shape[0] == 0          # no feature rows: nothing of the dataset was read
    assert results is not None and window.inspect_panel.run_a is not None
    assert sorted(cached.dataset.splits) == sorted(full_run.dataset.splits)
    assert [len(cached.dataset.splits[s]) for s in cached.dataset.splits] == \
        [len(full_run.dataset.splits[s]) for s in cached.dataset.splits]
    # the same rankings as the full path, plain and under the run's own scoring (its stored bank)
    ds = full_run.dataset
    sentences = [ds.captions[int(c)] for c in full.gallery_captions[:6]] + ["a red circle left of a blue square"]
    for s in sentences:
        a, b = cached.query_text(s, k=10), full.query_text(s, k=10)
        assert a.items.tolist() == b.items.tolist() and np.allclose(a.scores, b.scores, atol=1e-5)
        assert a.gold_ranks.tolist() == b.gold_ranks.tolist()
    scorers, record = retriever_scoring(full, "csls", run_dir=toy_run)
    cached.set_scoring(scorers, record)
    full.set_scoring(scorers, record)
    for s in sentences:
        assert cached.query_text(s, k=10).items.tolist() == full.query_text(s, k=10).items.tolist()
    # a dataset image needs the feature rows: refused in one line while only the cache is open
    with pytest.raises(CrossViewError, match="gallery cache"):
        cached.query_image(int(full.gallery_images[0]))
    # the full run replaced the preview: dataset-image queries work
    assert not window.run_partial and window.run is not run
    qp = window.query_panel
    assert qp.retriever is not cached and qp.retriever.features.image.shape[0] == ds.n_images
    with qtbot.waitSignal(qp.answered, timeout=30_000) as sig:
        qp.query_image(int(full.gallery_images[0]))
    assert sig.args[0].best_gold_rank is not None
