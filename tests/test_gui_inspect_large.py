"""Inspect at COCO 5K size (issue 34): 25,000 caption queries in the per-query list without an item per row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QTableView, QTableWidget  # noqa: E402

from crossview.data.dataset import PairedDataset  # noqa: E402
from crossview.engine.results import load_run_results  # noqa: E402
from crossview.gui.panels.inspect_panel import InspectPanel  # noqa: E402

pytestmark = pytest.mark.gui

N_IMAGES, PER = 5000, 5


def _run(folder: Path, seed: int):
    rng = np.random.default_rng(seed)
    folder.mkdir()
    i2t = rng.integers(1, 200, N_IMAGES)
    t2i = rng.integers(1, N_IMAGES + 1, N_IMAGES * PER)
    m = {"R@1": 1.0, "R@5": 2.0, "R@10": 3.0, "MedR": 50.0, "MeanR": 60.0}
    (folder / "summary.json").write_text(json.dumps({"method": "cca", "dataset": "coco-like", "split": "test",
                                                     "i2t": m, "t2i": m, "rsum": 12.0}))
    np.savez(folder / "ranks.npz", i2t=i2t, t2i=t2i, image_ids=np.arange(N_IMAGES),
             caption_ids=np.arange(N_IMAGES * PER))
    return load_run_results(folder)


def test_25k_queries_build_a_model_not_25k_rows_of_items(qtbot, tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 1)
    caps = [f"caption {j} of image {j // PER}" for j in range(N_IMAGES * PER)]
    ds = PairedDataset(name="coco-like", captions=caps, caption_image=np.repeat(np.arange(N_IMAGES), PER),
                       image_features=np.zeros((N_IMAGES, 2), np.float32), splits={"test": np.arange(N_IMAGES)})
    panel = InspectPanel()
    qtbot.addWidget(panel)
    panel.resize(1280, 700)
    panel.set_run(a)
    panel.set_dataset(ds)
    panel.direction_combo.setCurrentIndex(panel.direction_combo.findData("t2i"))
    panel.show()
    qtbot.waitExposed(panel)
    model = panel.query_model
    assert isinstance(panel.queries, QTableView) and not isinstance(panel.queries, QTableWidget)
    assert model.rowCount() == N_IMAGES * PER and model.columnCount() == 2
    # only the rows on screen made their text (a view asks for what it paints), not 25,000
    qtbot.waitUntil(lambda: model.made_texts > 0, timeout=10_000)                    # the first paint
    assert model.made_texts <= 200, model.made_texts
    shown = model.column_values(1)
    assert np.array_equal(shown, np.sort(a.ranks["t2i"])[::-1])                 # worst first, as numbers
    worst = int(np.argmax(a.ranks["t2i"]))                                          # first of the largest rank
    assert model.data(model.index(0, 0)) == caps[worst]
    with qtbot.waitSignal(panel.open_query) as sig:
        panel.queries.activated.emit(model.index(0, 0))
    assert sig.args == ["t2i", worst]

    panel.queries.sortByColumn(1, Qt.SortOrder.AscendingOrder)                     # sorting is a numpy argsort
    assert np.array_equal(model.column_values(1), np.sort(a.ranks["t2i"]))
    order = [model.data(model.index(r, 0), Qt.ItemDataRole.UserRole) for r in range(50)]
    assert order == np.argsort(a.ranks["t2i"], kind="stable")[:50].tolist()         # ties keep the runs' order

    panel.query_filter.setText("of image 4321")                                     # text filter over 25,000
    assert model.rowCount() == PER and "5 of 25,000 queries" in panel.queries_label.text()
    assert sorted(model.data(model.index(r, 0)) for r in range(PER)) == caps[4321 * PER:4322 * PER]
    panel.query_filter.clear()
    assert model.rowCount() == N_IMAGES * PER

    panel.close()
