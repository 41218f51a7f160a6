"""What the Query panel's *Explain* toggle shows, as Qt pieces: the work that explains a batch of pairs off
the GUI thread, its overlaid pictures as ``QImage`` (allowed off the GUI thread, unlike ``QPixmap``), and a
caption's words shaded by importance as rich text.

The explanations themselves come from :mod:`crossview.explain` (no Qt); this module only schedules and draws.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtGui import QImage

from crossview.core.errors import CrossViewError
from crossview.explain import Explanation, overlay, word_colours

__all__ = ["Pair", "Explained", "explain_pairs", "pil_to_qimage", "words_html", "region_line",
           "QUERY_SIDE", "THUMB_SIDE"]

#: longest side of the overlaid query image (i2t) and of an overlaid result thumbnail (t2i), in pixels:
#: the query view is at most 540 px, a presentation-mode thumbnail about 230 px
QUERY_SIDE = 720
THUMB_SIDE = 256


@dataclass(frozen=True)
class Pair:
    """One pair to explain: ``image`` is a dataset image index or an image file path, ``text`` the sentence."""

    image: int | str
    text: str
    direction: str

    @property
    def key(self) -> tuple[int | str, str, str]:
        return (self.image, self.text, self.direction)

    @property
    def side(self) -> int:
        return QUERY_SIDE if self.direction == "i2t" else THUMB_SIDE


@dataclass
class Explained:
    """What the panel keeps per pair: the explanation (None when it failed: ``error`` says why) and the
    image with its region map blended over it, no larger than the pair's ``side`` (None without a map)."""

    pair: Pair
    explanation: Explanation | None
    image: QImage | None = None
    error: str = ""
    pixmap: Any = field(default=None, repr=False)    # the QPixmap made from ``image`` on the GUI thread, once


def pil_to_qimage(img: Any) -> QImage:
    """An RGB ``PIL.Image`` as a ``QImage`` that owns its pixels (safe to hand to another thread)."""
    rgb = img.convert("RGB")
    data = rgb.tobytes("raw", "RGB")
    q = QImage(data, rgb.width, rgb.height, 3 * rgb.width, QImage.Format.Format_RGB888)
    return q.copy()     # the QImage above borrows ``data``; the copy owns its buffer


def explain_pairs(explainer: Any, pairs: Sequence[Pair], lock: threading.Lock, out: list[Explained],
                  progress: Callable[[int, int], None], should_stop: Callable[[], bool]) -> list[Explained]:
    """Explain ``pairs`` in order (a :class:`crossview.gui.workers.Task` body), appending each result to
    ``out`` as it is done so that the GUI can show it on the next ``progress`` signal; returns ``out``.

    ``lock`` serialises the explainer between tasks: a superseded task finishes the pair it is on (an
    explanation cannot be interrupted) and stops; the next one waits for it instead of racing it for the
    explainer's backbone and caches. A pair that cannot be explained (a :class:`CrossViewError`) is kept
    with its error; anything else is a bug and fails the task."""
    total = len(pairs)
    for n, pair in enumerate(pairs):
        if should_stop():
            break
        with lock:
            if should_stop():
                break
            try:
                e: Explanation | None = explainer.explain(pair.image, pair.text, pair.direction)
                error = ""
            except CrossViewError as err:
                e, error = None, str(err)
        image = None
        if e is not None and e.region is not None:
            try:
                pic = overlay(e.image_path, e.region)
                pic.thumbnail((pair.side, pair.side))
                image = pil_to_qimage(pic)
            except CrossViewError as err:
                error = str(err)
        out.append(Explained(pair, e, image, error))
        progress(n + 1, total)
    return out


def _mix(rgb: tuple[int, int, int], strength: float) -> tuple[int, int, int]:
    """The heat colour laid over white with opacity ``strength`` (Qt's rich text has no alpha colours)."""
    a = 0.9 * strength
    return tuple(int(round(255 * (1 - a) + c * a)) for c in rgb)  # type: ignore[return-value]


def words_html(e: Explanation, heading: str = "", heading_pt: float | None = None) -> str:
    """The explanation's caption as rich text: each word on a background of its heat colour, as strong as
    its share of the score (words that lower the score are grey), after ``heading`` in grey (at ``heading_pt``
    points; the words follow the label's font)."""
    w = e.words
    parts = []
    for word, (r, g, b, s), value in zip(w.words, word_colours(w.values), w.values.tolist()):
        text = html.escape(word)
        if value < 0:
            parts.append(f"<span style='color:#8c959f'>{text}</span>")
        elif s <= 0.02:
            parts.append(text)
        else:
            br, bg, bb = _mix((r, g, b), s)
            dark = 0.299 * br + 0.587 * bg + 0.114 * bb < 140
            weight = "font-weight:600;" if s >= 0.5 else ""
            parts.append(f"<span style='background-color:#{br:02x}{bg:02x}{bb:02x};"
                         f"color:{'#ffffff' if dark else '#1f2328'};{weight}'>&nbsp;{text}&nbsp;</span>")
    body = " ".join(parts)
    size = f" font-size:{heading_pt:g}pt;" if heading_pt else ""
    head = f"<span style='color:#57606a;{size}'>{html.escape(heading)}</span>&nbsp; " if heading else ""
    return head + body


def words_tooltip(e: Explanation) -> str:
    """The words, most important first, with their values (and what the values are)."""
    w = e.words
    what = ("each word's share of the score (they sum to the score minus the empty caption's)" if w.mode == "exact"
            else "how much the score drops when the word is removed")
    rows = ", ".join(f"{word} {value:+.3f}" for word, value in w.ranked())
    return f"Words by importance ({what}): {rows}"


def region_line(e: Explanation) -> str:
    """One line for the panel's hint text: what the map is, or why there is none."""
    if e.region is None:
        return f"No region map: {e.region_error}" if e.region_error else "No region map for this run"
    how = "exact split" if e.region.mode == "exact" else "first-order view"
    return f"Heat map: brighter regions add more to the score ({how}; score {e.region.score:.3f})"
