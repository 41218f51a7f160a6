"""Stages of training on the curves (``Phase`` events, e.g. webly's Stage II): a labelled marker at the step
the stage begins on every loss plot and between the epochs on the validation plots, live and from a run's
metrics.jsonl alike."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from crossview.core.events import Loss, Phase, Validation, event_from_dict  # noqa: E402
from crossview.gui.panels.train_panel import TrainPanel  # noqa: E402

pytestmark = pytest.mark.gui


def test_a_stage_marker_on_loss_and_validation_plots(qtbot, tmp_path: Path) -> None:
    panel = TrainPanel(runs_root=tmp_path / "runs")
    qtbot.addWidget(panel)
    panel.curves.reset("webly")
    for step in range(1, 7):
        panel._on_event(Loss(step, (step - 1) // 2, {"L_IS": 1.0 / step, "L_IT": 2.0 / step}))
        if step % 2 == 0:
            panel._on_event(Validation(step // 2, {"i2t": {"R@1": 10.0 * step}, "t2i": {"R@1": 5.0}, "rsum": 20.0}))
    ev = event_from_dict(Phase(6, 3, "Stage II (web)").to_dict())     # as a run's metrics.jsonl gives it back
    panel._on_event(ev)
    for step in range(7, 10):
        panel._on_event(Loss(step, 3, {"L_IT": 0.1}))
    panel._flush()
    c = panel.curves
    assert c.phase_markers("loss") == [(6.5, "Stage II (web)")]
    assert c.phase_markers("recall") == [(3.5, "Stage II (web)")] and c.phase_markers("rsum") == [(3.5, "Stage II (web)")]
    panel._flush()
    assert len(c.phase_markers("loss")) == 1, "drawn once, not once a frame"
    assert "Stage II (web) begins at step 6" in panel.log.toPlainText()
    c.reset("webly")
    assert c.phases == [] and c.phase_markers("loss") == []


def test_timam_terms_split_into_losses_and_the_discriminators_accuracy(qtbot, tmp_path: Path) -> None:
    """TIMAM reports identification, CMPM, discriminator and generator losses and the discriminator's accuracy:
    the losses share the loss plot, the accuracy gets its own (a fraction, not a loss), and the language
    model's fine-tuning phase is marked on both."""
    from crossview.gui.curves import term_family

    assert [term_family(t) for t in ("L_I", "L_M", "L_D", "L_G", "D_acc", "epoch_D_acc")] == \
        ["loss", "loss", "loss", "loss", "accuracy", "accuracy"]
    panel = TrainPanel(runs_root=tmp_path / "runs")
    qtbot.addWidget(panel)
    panel.curves.reset("timam")
    for step in range(1, 5):
        panel._on_event(Loss(step, 0, {"loss": 3.0 / step, "L_I": 2.0 / step, "L_M": 1.0 / step, "L_D": 1.4,
                                       "L_G": 0.7, "D_acc": 0.5 + step / 20}))
    panel._on_event(Phase(4, 1, "language model fine-tuned"))
    panel._on_event(Loss(5, 1, {"loss": 0.5, "L_I": 0.3, "L_M": 0.2, "L_D": 1.4, "L_G": 0.7, "D_acc": 0.6}))
    panel._flush()
    c = panel.curves
    assert {"loss", "accuracy"} <= set(c.shown_plots())
    assert {"L_I", "L_M", "L_D", "L_G"} <= c.family_terms("loss") and c.family_terms("accuracy") == {"D_acc"}
    assert c.phase_markers("accuracy") == [(4.5, "language model fine-tuned")]


def test_series_colours_are_distinct_and_loss_terms_explained(qtbot):
    """TIMAM's terms get ten different colours (L_M and L_I were both red) and a tooltip saying what each is;
    i2t and t2i R@1 differ in colour as well as in line style."""
    from PySide6.QtCore import Qt

    from crossview.gui.curves import CURVE_COLOURS, CurveBoard

    assert len(set(CURVE_COLOURS)) == len(CURVE_COLOURS)
    board = CurveBoard()
    qtbot.addWidget(board)
    board.reset("timam")
    for step in range(1, 4):
        board.add_loss(step, 1, {"loss": 1.0 / step, "L_I": 0.5, "L_M": 0.3, "L_D": 0.7, "L_G": 0.69, "D_acc": 0.5})
    board.add_validation(1, {"i2t": {"R@1": 10.0, "R@5": 30.0, "R@10": 40.0},
                             "t2i": {"R@1": 8.0, "R@5": 25.0, "R@10": 35.0}, "rsum": 148.0})
    board.flush()
    terms = ["loss", "L_I", "L_M", "L_D", "L_G", "D_acc"]
    colours = [board._colour(t) for t in terms]
    assert len(set(colours)) == len(colours), colours
    assert board._colour("val:i2t R@1") != board._colour("val:t2i R@1")
    tips = {board.series_list.item(i).data(Qt.ItemDataRole.UserRole): board.series_list.item(i).toolTip()
            for i in range(board.series_list.count())}
    assert "cross-modal projection matching" in tips["L_M"] and "identification" in tips["L_I"]
