"""What the Query panel's *Explain* toggle shows, as Qt pieces: which pairs a view of a ranking explains
(:func:`pairs_in_view`), the work that explains a batch of pairs off the GUI thread (:func:`explain_pairs`), its
overlaid pictures as ``QImage`` (allowed off the GUI thread, unlike ``QPixmap``), a caption's words shaded by
importance as rich text, and the band under the query box that shows them (:class:`ExplainBar`).

The explanations themselves come from :mod:`crossview.explain` (no Qt); who runs :func:`explain_pairs`, when,
and which results are kept is :class:`crossview.gui.explain_controller.ExplainController`'s business.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QImage
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from crossview.core.errors import Cancelled, CrossViewError
from crossview.explain import Explanation, overlay, word_colours

__all__ = ["Pair", "Explained", "explain_pairs", "pil_to_qimage", "words_html", "words_tooltip", "region_line",
           "pairs_in_view", "query_sentence", "ExplainBar", "QUERY_SIDE", "THUMB_SIDE", "NOTE_STYLE", "ERROR_STYLE"]

#: longest side of the overlaid query image (i2t) and of an overlaid result thumbnail (t2i), in pixels:
#: the query view is at most 540 px, a presentation-mode thumbnail about 230 px
QUERY_SIDE = 720
THUMB_SIDE = 256
NOTE_STYLE = "color: #57606a;"
ERROR_STYLE = "color: #9a6700;"


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


def query_sentence(retriever: Any, ranking: Any) -> str:
    """The sentence a ranking was asked with: its text, or the dataset caption it names ("" for none)."""
    q = ranking.query if ranking is not None else {}
    if "caption" in q and "text" not in q and retriever is not None:
        return str(retriever.dataset.captions[int(q["caption"])])
    return str(q.get("text", ""))


def pairs_in_view(retriever: Any, ranking: Any, focus_item: int | None,
                  items_in_view: Callable[[], Sequence[int]]) -> tuple[list[Pair], str]:
    """The pairs a view of ``ranking`` explains, the focus pair first, or, when it explains none, why.

    ``focus_item``: the gallery item of the result whose words are shown (None: no results);
    ``items_in_view()``: the gallery items of the results in view, asked only for a sentence query (t2i),
    whose result images each get a map. An image query (i2t) explains the query image with the focus caption."""
    if retriever is None or ranking is None:
        return [], ""
    if focus_item is None:
        return [], "No results to explain."
    q = ranking.query
    if ranking.direction == "i2t":
        image = q.get("image", q.get("file"))
        if image is None:
            return [], "Nothing to explain for this query."
        image = int(image) if isinstance(image, (int, np.integer)) else str(image)
        return [Pair(image, retriever.gallery_caption_text(int(focus_item)), "i2t")], ""
    if "tags" in q:
        return [], ("Explain works on sentences: a tag list goes through the run's tag branch, which it "
                    "does not explain.")
    text = query_sentence(retriever, ranking)
    items = [int(focus_item)] + [int(x) for x in items_in_view() if int(x) != int(focus_item)]
    return [Pair(x, text, "t2i") for x in items], ""


def pil_to_qimage(img: Any) -> QImage:
    """An RGB ``PIL.Image`` as a ``QImage`` that owns its pixels (safe to hand to another thread)."""
    rgb = img.convert("RGB")
    data = rgb.tobytes("raw", "RGB")
    q = QImage(data, rgb.width, rgb.height, 3 * rgb.width, QImage.Format.Format_RGB888)
    return q.copy()     # the QImage above borrows ``data``; the copy owns its buffer


def explain_pairs(explainer: Any, pairs: Sequence[Pair], lock: threading.Lock, out: list[Explained],
                  progress: Callable[[int, int], None], should_stop: Callable[[], bool],
                  groups: Sequence[int] | None = None) -> list[Explained]:
    """Explain ``pairs`` in order (a :class:`crossview.gui.workers.Task` body), appending each result to
    ``out`` as it is done so that the GUI can show it on the next ``progress`` signal; returns ``out``.

    ``groups``: the sizes of the consecutive runs of ``pairs`` explained together (a screenful each; default:
    all of them at once). The pairs of a group that share one sentence of a sentence query (t2i) go to the
    explainer's ``explain_many`` in **one** call, where it has one (:meth:`crossview.explain.Explainer.explain_many`:
    the sentence encoded once, the images read by batched backbone passes); the others one at a time.
    ``progress(done, total)`` counts pairs: during a batched call, the images whose maps are read (its last
    one counts when its results are in ``out``), then the whole group.

    ``lock`` serialises the explainer between tasks: a superseded task finishes the pair (or the backbone pass)
    it is on and stops; the next one waits for it instead of racing it for the explainer's backbone and caches.
    A pair that cannot be explained (a :class:`CrossViewError`) is kept with its error; anything else is a bug
    and fails the task."""
    total = len(pairs)
    sizes = list(groups) if groups else [total]
    if sum(sizes) != total or any(n < 1 for n in sizes):
        raise ValueError(f"groups {sizes} do not split {total} pairs")
    batched = callable(getattr(explainer, "explain_many", None))
    done, start = 0, 0
    for size in sizes:
        group = list(pairs[start:start + size])
        start += size
        # a sentence query's pairs, one sentence: one batched call; the rest one by one, in order
        many = [p for p in group if p.direction == "t2i" and p.text == group[0].text] if batched else []
        if len(many) < 2:
            many = []
        if many:
            if should_stop():
                break
            base, n_many = done, len(many)
            with lock:
                if should_stop():
                    break
                try:
                    got = explainer.explain_many([p.image for p in many], many[0].text, "t2i",
                                                 progress=lambda k, _n: progress(base + min(k, n_many - 1), total),
                                                 should_stop=should_stop)
                except Cancelled:
                    break
                except CrossViewError as err:       # the sentence itself (every pair fails alike)
                    got = [err] * n_many
            for pair, e in zip(many, got):
                out.append(_explained(pair, e))
            done += n_many
            progress(done, total)
        for pair in group:
            if pair in many:
                continue
            if should_stop():
                return out
            with lock:
                if should_stop():
                    return out
                try:
                    e = explainer.explain(pair.image, pair.text, pair.direction)
                except CrossViewError as err:
                    e = err
            out.append(_explained(pair, e))
            done += 1
            progress(done, total)
    return out


def _explained(pair: Pair, e: Explanation | CrossViewError) -> Explained:
    """What the panel keeps of one explained pair: the overlaid picture made here, off the GUI thread."""
    if isinstance(e, CrossViewError):
        return Explained(pair, None, None, str(e))
    image, error = None, ""
    if e.region is not None:
        try:
            pic = overlay(e.image_path, e.region)
            pic.thumbnail((pair.side, pair.side))
            image = pil_to_qimage(pic)
        except CrossViewError as err:
            error = str(err)
    return Explained(pair, e, image, error)


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


class ExplainBar(QWidget):
    """The full-width band under the query box while Explain is on: the caption with each word shaded by its
    importance (:attr:`words`), and a note (:attr:`note`: what the map is, why there is none, progress, or an
    error). It shows only while :attr:`active` (Explain is on) and it has something to say."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("explainBar")
        self.active = False
        self.words = QLabel("")           # the caption, each word shaded by its importance
        self.words.setObjectName("explainWords")
        self.words.setWordWrap(True)
        self.words.setTextFormat(Qt.TextFormat.RichText)
        self.words.hide()
        self.note = QLabel("")            # what the map is, why there is none, or progress
        self.note.setObjectName("explainNote")
        self.note.setWordWrap(True)
        self.note.setStyleSheet(NOTE_STYLE)
        self.note.hide()
        # full width: a caption shaded word by word needs it (and must stay legible in presentation mode,
        # where the query column is narrow and its image large)
        bar = QVBoxLayout(self)
        bar.setContentsMargins(4, 2, 4, 2)
        bar.setSpacing(2)
        bar.addWidget(self.words)
        bar.addWidget(self.note)
        self.hide()

    def set_note(self, text: str, error: bool = False) -> None:
        """The note under the words ("" hides it); ``error`` draws it in the warning colour."""
        self.note.setStyleSheet(ERROR_STYLE if error else NOTE_STYLE)
        self.note.setText(text)
        self.note.setVisible(bool(text))
        self.sync()

    def show_words(self, e: Explanation, heading: str) -> None:
        """``e``'s caption shaded word by word after ``heading`` (in the note's size), its values as tooltip."""
        self.words.setText(words_html(e, heading, self.note.font().pointSizeF()))
        self.words.setToolTip(words_tooltip(e))
        self.words.show()

    def clear(self) -> None:
        """Hide the words, the note and the band (Explain off, another run)."""
        self.words.hide()
        self.note.hide()
        self.hide()

    def sync(self) -> None:
        """Show the band only while Explain is on and the words or the note are there."""
        self.setVisible(self.active and not (self.words.isHidden() and self.note.isHidden()))

    def set_presenting(self, on: bool, base: QFont) -> None:
        """Fonts for presentation mode (large enough for the back of the room) or back to normal."""
        words = QFont(base)
        words.setPointSizeF(26 if on else 13)
        self.words.setFont(words)
        note = QFont(base)
        note.setPointSizeF(15 if on else max(9.0, QFont().pointSizeF() - 1))
        self.note.setFont(note)
