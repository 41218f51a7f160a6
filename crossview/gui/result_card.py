"""The card a finished run leaves in the Train panel: its numbers at a glance and where to go next.

What the run's ``summary.json`` says, for a person who just waited for it: the method, data and the split the
numbers are reported on; R@1 / R@5 / R@10 both ways with their 95% bootstrap intervals; rsum with its interval;
the time it took *including* feature extraction (the wait a person had), split into its parts; and two buttons,
*Query it* and *Inspect it*, that open the run in those panels. Runnable alone: give it a summary.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from crossview.core.progress import format_seconds
from crossview.core.text import html_text

__all__ = ["ResultCard", "describe_summary"]

_KS = ("R@1", "R@5", "R@10")


def _with_interval(value: float, ci: Any) -> str:
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci):
        return f"{value:.1f} <span style='color:#57606a'>[{ci[0]:.1f}-{ci[1]:.1f}]</span>"
    return f"{value:.1f}"


def _seconds(v: float) -> str:
    """``0.4 s`` under ten seconds (a rounded ``0 s`` says nothing), else :func:`format_seconds`."""
    return f"{v:.1f} s" if v < 10 else format_seconds(v)


def describe_summary(s: dict[str, Any]) -> tuple[str, str, str]:
    """``(title, metrics, timing)``: the card's three lines (HTML) for a run's summary."""
    title = (f"<b>{html_text(str(s.get('method', '?')))}</b> on {html_text(str(s.get('dataset', '?')))}, "
             f"reported on <b>{html_text(str(s.get('split', '?')))}</b>")
    if s.get("n_images"):
        title += f" ({int(s['n_images']):,} images, {int(s.get('n_captions', 0)):,} captions)"
    if s.get("optimistic"):
        title += " <span style='color:#9a6700'><b>optimistic</b>: chosen on the same split</span>"
    ci = s.get("ci") if isinstance(s.get("ci"), dict) else {}
    rows = []
    for d, name in (("i2t", "image \u2192 text"), ("t2i", "text \u2192 image")):
        m = s.get(d) or {}
        cells = "  ".join(f"{k} {_with_interval(float(m[k]), (ci.get(d) or {}).get(k))}" for k in _KS if k in m)
        rows.append(f"{name}: {cells}")
    rsum = s.get("rsum")
    if isinstance(rsum, (int, float)):
        rows.append(f"<b>rsum {_with_interval(float(rsum), ci.get('rsum'))}</b>"
                    + (" <span style='color:#57606a'>(95% intervals, bootstrap over the images)</span>"
                       if ci.get("rsum") else ""))
    metrics = "<br>".join(rows)
    parts = [(k, float(s[k])) for k in ("features_seconds", "train_seconds", "eval_seconds")
             if isinstance(s.get(k), (int, float))]
    total = sum(v for _k, v in parts)
    names = {"features_seconds": "features", "train_seconds": "training", "eval_seconds": "evaluation"}
    timing = (f"took {_seconds(total)} in all: " + ", ".join(f"{names[k]} {_seconds(v)}" for k, v in parts)
              if parts else "")
    return title, metrics, timing


class ResultCard(QFrame):
    """A finished run's numbers, with *Query it* / *Inspect it* (signals carry the run folder) and a close
    button. Hidden until :meth:`show_summary`."""

    query_requested = Signal(str)
    inspect_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("resultCard")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet("#resultCard { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px; }")
        self.run_dir = ""
        self.title = QLabel()
        self.metrics = QLabel()
        self.timing = QLabel()
        for label in (self.title, self.metrics, self.timing):
            label.setTextFormat(Qt.TextFormat.RichText)
            label.setWordWrap(True)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.timing.setStyleSheet("color: #57606a")
        self.query_button = QPushButton("Query it")
        self.query_button.setToolTip("Open the run in the Query panel")
        self.inspect_button = QPushButton("Inspect it")
        self.inspect_button.setToolTip("Open the run in the Inspect panel: ranks, per-query results, comparisons")
        self.close_button = QPushButton("\u00d7")
        self.close_button.setFlat(True)
        self.close_button.setFixedWidth(28)
        self.close_button.setToolTip("Hide this card")
        self.query_button.clicked.connect(lambda: self.query_requested.emit(self.run_dir))
        self.inspect_button.clicked.connect(lambda: self.inspect_requested.emit(self.run_dir))
        self.close_button.clicked.connect(self.hide)
        text = QVBoxLayout()
        text.setSpacing(2)
        text.addWidget(self.title)
        text.addWidget(self.metrics)
        text.addWidget(self.timing)
        buttons = QVBoxLayout()
        buttons.addWidget(self.query_button)
        buttons.addWidget(self.inspect_button)
        buttons.addStretch(1)
        top = QHBoxLayout(self)
        top.setContentsMargins(8, 6, 4, 6)
        top.addLayout(text, 1)
        top.addLayout(buttons)
        top.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_summary(self, summary: dict[str, Any], run_dir: str) -> None:
        """Fill the card from a run's summary and show it."""
        self.run_dir = str(run_dir)
        title, metrics, timing = describe_summary(summary)
        self.title.setText(title)
        self.metrics.setText(metrics)
        self.timing.setText(timing)
        self.timing.setVisible(bool(timing))
        self.show()
