"""The Train panel offers the richer feature pipelines (flip averaging, two backbones, combined captions)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")
from crossview.gui.panels.train_panel import TrainPanel  # noqa: E402

pytestmark = pytest.mark.gui


def test_train_panel_offers_flip_concat_and_combined_captions(qtbot, tmp_path: Path) -> None:
    w = TrainPanel(runs_root=tmp_path / "runs")
    qtbot.addWidget(w)
    images = [w.image_encoder.itemData(i) for i in range(w.image_encoder.count())]
    texts = [w.text_encoder.itemData(i) for i in range(w.text_encoder.count())]
    assert {"efficientnet_lite0:flip", "efficientnet_lite0+mobilenet_v2", "mobilenet_v2"} <= set(images)
    assert {"minilm+tfidf", "minilm+glove", "tfidf"} <= set(texts)
    assert len(images) == len(set(images)) and len(texts) == len(set(texts))


def test_the_first_encoder_entry_names_the_methods_own_default(qtbot, tmp_path: Path, monkeypatch) -> None:
    from crossview.methods.wsabie import Wsabie

    # a method without pipelines of its own (whichever that is today): the package defaults
    monkeypatch.setattr(Wsabie, "default_image_encoder", None)
    monkeypatch.setattr(Wsabie, "default_text_encoder", None)
    w = TrainPanel(runs_root=tmp_path / "runs")
    qtbot.addWidget(w)
    w.select_method("cca")
    assert w.image_encoder.itemText(0) == "efficientnet_lite0+mobilenet_v2:flip (default)"
    assert w.text_encoder.itemText(0) == "minilm+glove (default)"
    assert w.image_encoder.itemData(0) is None       # None: the run resolves the method's own default
    w.select_method("wsabie")
    assert w.image_encoder.itemText(0) == "efficientnet_lite0 (default)"
    assert w.text_encoder.itemText(0) == "minilm (default)"
    w.select_method("vsepp")
    assert w.image_encoder.itemText(0) == "efficientnet_lite0+mobilenet_v2:flip (default)"
    assert w.text_encoder.itemText(0) == "minilm+glove (default)"
