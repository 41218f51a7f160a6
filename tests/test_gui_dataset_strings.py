"""Dataset strings in the app's labels (issue 31, item 5): a dataset name, split name, caption, label and tag
holding ANSI escapes, a lone surrogate and HTML are shown escaped (``\\x1b``, ``\\ud83d``, ``&lt;b&gt;``) in the
Data panel's rich-text labels and its split list, never as markup or raw control characters."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pytestqt")
from crossview.data.dataset import PairedDataset  # noqa: E402
from crossview.gui.panels.data_panel import DataPanel  # noqa: E402

pytestmark = pytest.mark.gui

EVIL = "\x1b[31m<b>x</b>\ud83d"
SHOWN = "\\x1b[31m&lt;b&gt;x&lt;/b&gt;\\ud83d"


def _dataset() -> PairedDataset:
    return PairedDataset(name="name" + EVIL, captions=["cap" + EVIL, "plain caption"],
                         caption_image=np.array([0, 1]),
                         image_features=np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32),
                         labels=np.array([0, 0]), label_names=["lab" + EVIL], tags=[["tag" + EVIL], []],
                         splits={"train": np.array([1]), "split" + EVIL: np.array([0])}, format="precomp")


def test_data_panel_escapes_dataset_strings(qtbot) -> None:
    panel = DataPanel()
    qtbot.addWidget(panel)
    panel.set_dataset(_dataset())
    summary = panel.summary.text()
    assert f"<b>name{SHOWN}</b>" in summary and f"split{SHOWN} 1" in summary
    assert "\x1b" not in summary and "\ud83d" not in summary
    items = [panel.split_combo.itemText(k) for k in range(panel.split_combo.count())]
    assert "split\\x1b[31m<b>x</b>\\ud83d (1)" in items   # a combo item is plain text: only controls escaped
    panel.split_combo.setCurrentIndex(items.index("split\\x1b[31m<b>x</b>\\ud83d (1)"))
    assert panel.model.rows.tolist() == [0] and panel.count_label.text() == "1 of 2"
    panel.select_image(0)
    shown = panel.details.toPlainText()
    for what in ("lab", "tag", "split"):
        assert f"{what}\\x1b[31m<b>x</b>\\ud83d" in shown, (what, shown)   # the markup shown as written
    # a caption's lone surrogate was repaired to U+FFFD when the dataset was built; its ESC is escaped
    assert "cap\\x1b[31m<b>x</b>\ufffd" in shown, shown
    assert "\x1b" not in shown
    tip = panel.model.data(panel.model.index(0), 3)   # ToolTipRole
    assert tip == "<p>cap" + SHOWN.replace("\\ud83d", "\ufffd") + "</p>"   # the repaired caption


def test_result_card_and_search_lines_escape_dataset_strings() -> None:
    """The result card's title (dataset and split names from a run's summary) shows control characters escaped
    and markup as written, like the Data and Query panels."""
    from crossview.gui.result_card import describe_summary

    title, _, _ = describe_summary({"method": "cca", "dataset": "evil\x1b[31m<b>x</b>\ud83d", "split": "val\x07"})
    assert "\x1b" not in title and "\ud83d" not in title and "\x07" not in title
    assert "evil\\x1b[31m&lt;b&gt;x&lt;/b&gt;\\ud83d" in title and "val\\x07" in title
