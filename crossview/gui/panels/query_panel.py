"""The Query panel: image -> ranked captions, sentence -> ranked images, with ground truth and marks.

It is a view onto a :class:`crossview.engine.retriever.Retriever` (set with :meth:`QueryPanel.set_retriever`);
every query runs in a worker and a superseded answer is dropped. Results show rank, score, the
caption's own image, ground truth highlighted, and the ground truth's rank however far down it is.
Click a result (or press Enter) to query from it; arrow keys move through results; ``R`` / ``N`` mark
the current result relevant / not relevant (``0`` clears), saved at once to the run's
``annotations.jsonl``.

Run alone: ``python -m crossview.gui.panels.query_panel [RUN_DIR]`` (default: trains a quick CCA on
the demo first).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import (QComboBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit, QListView, QListWidget,
                               QListWidgetItem, QPushButton, QSpinBox, QStackedWidget, QVBoxLayout, QWidget)

from crossview.engine.annotations import AnnotationStore
from crossview.engine.retriever import Ranking, Retriever
from crossview.gui.thumbnails import ThumbnailCache, placeholder
from crossview.gui.workers import Task

GOLD = QColor("#d8f5d0")
MARK_YES = QColor("#1a7f37")
MARK_NO = QColor("#cf222e")
ItemRole = Qt.ItemDataRole.UserRole + 1


class QueryPanel(QWidget):
    """Ask a :class:`Retriever`; ``show_image(int)`` asks the Data panel to show a dataset image."""

    answered = Signal(object)      # the Ranking shown
    failed = Signal(str)
    show_image = Signal(int)
    gallery_requested = Signal(object)   # a split name, "all", or a corpus file path (str starting with "corpus:")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.retriever: Retriever | None = None
        self.annotations: AnnotationStore | None = None
        self.ranking: Ranking | None = None
        self._task: Task | None = None
        self.history: list[dict[str, Any]] = []
        self.small_cache = ThumbnailCache(size=96, parent=self)
        self.big_cache = ThumbnailCache(size=224, parent=self, upscale=True)     # presentation mode: large thumbnails
        self.cache = self.small_cache
        for c in (self.small_cache, self.big_cache):
            c.ready.connect(self._thumbnail_ready)
        self.setAcceptDrops(True)

        self.header = QLabel("No run loaded: train one in the Train panel or open a run.")
        self.header.setObjectName("summary")
        self.header.setWordWrap(True)

        self.gallery_combo = QComboBox()
        self.gallery_combo.setToolTip("What to rank: the images and captions of a split, all of them, or an "
                                      "independent caption corpus (image -> text only)")
        self.gallery_combo.activated.connect(self._on_gallery_choice)

        self.sentence = QLineEdit()
        self.sentence.setPlaceholderText("Type a sentence and press Enter to find images, e.g. a red circle left of a "
                                         "blue square")
        self.sentence.returnPressed.connect(self._ask_sentence)
        self.image_button = QPushButton("Query by image file...")
        self.image_button.setToolTip("Pick an image file (or drop one on this panel) to rank the captions")
        self.image_button.clicked.connect(self._choose_image_file)
        self.k_spin = QSpinBox()
        self.k_spin.setRange(5, 500)
        self.k_spin.setValue(50)
        self.k_spin.setPrefix("top ")
        self.k_spin.setToolTip("How many results to list")

        self.query_view = QLabel()
        self.query_view.setObjectName("preview")
        self.query_view.setFixedSize(180, 180)
        self.query_view.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.query_title = QLabel("")
        self.query_title.setWordWrap(True)
        self.query_title.setTextFormat(Qt.TextFormat.RichText)
        self.gold_label = QLabel("")
        self.gold_label.setWordWrap(True)
        self.gold_label.setObjectName("gold")

        # results: captions (i2t) in a list, images (t2i) in a grid
        self.caption_list = QListWidget()
        self.caption_list.setIconSize(QSize(64, 64))
        self.caption_list.setWordWrap(True)
        self.caption_list.setSpacing(2)
        self.image_grid = QListWidget()
        self.image_grid.setViewMode(QListView.ViewMode.IconMode)
        self.image_grid.setResizeMode(QListView.ResizeMode.Adjust)
        self.image_grid.setMovement(QListView.Movement.Static)
        self.image_grid.setIconSize(QSize(96, 96))
        self.image_grid.setGridSize(QSize(118, 132))
        self.image_grid.setWordWrap(True)
        for view in (self.caption_list, self.image_grid):
            view.itemClicked.connect(self._activate)
            view.itemActivated.connect(self._activate)
        self.results = QStackedWidget()
        self.results.addWidget(self.caption_list)
        self.results.addWidget(self.image_grid)

        self.mark_yes = QPushButton("Relevant (R)")
        self.mark_no = QPushButton("Not relevant (N)")
        self.mark_clear = QPushButton("Clear mark (0)")
        self.export_button = QPushButton("Export marks...")
        self.back_button = QPushButton("Back")
        self.back_button.setToolTip("Return to the previous query (Alt+Left)")
        self.back_button.clicked.connect(self.go_back)
        self.mark_yes.clicked.connect(lambda: self.mark_current(True))
        self.mark_no.clicked.connect(lambda: self.mark_current(False))
        self.mark_clear.clicked.connect(lambda: self.mark_current(None))
        self.export_button.clicked.connect(self._export_marks)
        self.marks_label = QLabel("")
        for key, value in (("R", True), ("N", False), ("0", None)):
            sc = QShortcut(QKeySequence(key), self)
            sc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            sc.activated.connect(lambda v=value: self._mark_shortcut(v))
        back = QShortcut(QKeySequence("Alt+Left"), self)
        back.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        back.activated.connect(self.go_back)

        ask = QHBoxLayout()
        ask.addWidget(self.sentence, 1)
        ask.addWidget(self.image_button)
        ask.addWidget(self.k_spin)
        qbox = QVBoxLayout()
        qbox.addWidget(self.query_view)
        qbox.addWidget(self.query_title)
        qbox.addWidget(self.gold_label)
        qbox.addStretch(1)
        self.query_side = QWidget()
        self.query_side.setLayout(qbox)
        self.query_side.setFixedWidth(200)
        body = QHBoxLayout()
        body.addWidget(self.query_side)
        body.addWidget(self.results, 1)
        self.mark_bar = QWidget()
        marks = QHBoxLayout(self.mark_bar)
        marks.setContentsMargins(0, 0, 0, 0)
        marks.addWidget(self.back_button)
        marks.addStretch(1)
        marks.addWidget(self.marks_label)
        for b in (self.mark_yes, self.mark_no, self.mark_clear, self.export_button):
            marks.addWidget(b)
        layout = QVBoxLayout(self)
        head = QHBoxLayout()
        head.addWidget(self.header, 1)
        self.gallery_label = QLabel("Gallery:")
        head.addWidget(self.gallery_label)
        head.addWidget(self.gallery_combo)
        self.head_bar = head
        layout.addLayout(head)
        layout.addLayout(ask)
        layout.addLayout(body, 1)
        layout.addWidget(self.mark_bar)
        self._set_enabled(False)

    # ------------------------------------------------------------------ set-up
    def _set_enabled(self, on: bool) -> None:
        for w in (self.sentence, self.image_button, self.mark_yes, self.mark_no, self.mark_clear,
                  self.export_button, self.k_spin):
            w.setEnabled(on)
        self.back_button.setEnabled(on and len(self.history) > 1)

    def set_retriever(self, retriever: Retriever | None, run_dir: str | Path | None = None,
                      title: str = "") -> None:
        """Query ``retriever`` from now on; marks go to ``run_dir`` (none when it is None)."""
        self.retriever = retriever
        self.annotations = AnnotationStore(run_dir) if run_dir is not None else None
        self.history.clear()
        self.ranking = None
        self.caption_list.clear()
        self.image_grid.clear()
        self.query_view.clear()
        self.query_title.clear()
        self.gold_label.clear()
        if retriever is None:
            self.header.setText("No run loaded: train one in the Train panel or open a run.")
            self._set_enabled(False)
            return
        self._fill_galleries(retriever)
        self.header.setText(
            f"<b>{html.escape(title or retriever.method.name)}</b> &nbsp; gallery: {html.escape(retriever.gallery_name)}"
            f" ({retriever.n_gallery_images:,} images, {retriever.n_gallery_captions:,} captions)")
        self._set_enabled(True)
        self.image_button.setEnabled(retriever.n_gallery_captions > 0)
        self.sentence.setEnabled(retriever.n_gallery_images > 0)
        self._update_marks_label()

    def _fill_galleries(self, retriever: Retriever) -> None:
        combo = self.gallery_combo
        combo.blockSignals(True)
        combo.clear()
        for split in retriever.dataset.split_names:
            combo.addItem(f"{split} split ({len(retriever.dataset.splits[split]):,} images)", split)
        combo.addItem(f"all images ({retriever.dataset.n_images:,})", "all")
        if retriever.corpus is not None:
            combo.addItem(retriever.gallery_name, "corpus:current")
        combo.addItem("caption corpus file...", "corpus:?")
        current = "corpus:current" if retriever.corpus is not None else retriever.gallery_name
        combo.setCurrentIndex(max(0, combo.findData(current)))
        combo.blockSignals(False)

    def _on_gallery_choice(self, index: int) -> None:
        choice = self.gallery_combo.itemData(index)
        if choice == "corpus:current":
            return
        if choice == "corpus:?":
            path, _ = QFileDialog.getOpenFileName(self, "Caption corpus (one caption a line)", "",
                                                  "Text (*.txt);;All files (*)")
            if not path:
                if self.retriever is not None:
                    self._fill_galleries(self.retriever)
                return
            choice = f"corpus:{path}"
        self.gallery_requested.emit(choice)

    # ------------------------------------------------------------------ asking
    def query_image(self, image: int | str) -> Task | None:
        """Rank the gallery's captions for dataset image ``image`` (int) or an image file (str)."""
        return self._ask({"image": image} if isinstance(image, int) else {"file": str(image)})

    def query_text(self, text: str | int) -> Task | None:
        """Rank the gallery's images for a sentence, or for dataset caption ``text`` (int)."""
        return self._ask({"caption": text} if isinstance(text, int) else {"text": text})

    def _ask_sentence(self) -> None:
        if self.sentence.text().strip():
            self.query_text(self.sentence.text())

    def _choose_image_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Query by image", "", "Images (*.jpg *.jpeg *.png *.bmp *.webp)")
        if path:
            self.query_image(path)

    def _ask(self, query: dict[str, Any], remember: bool = True) -> Task | None:
        r = self.retriever
        if r is None:
            return None
        k = self.k_spin.value()
        if self._task is not None and self._task.is_running():
            self._task.cancel()               # superseded: its answer is dropped
        if "image" in query or "file" in query:
            target = query.get("image", query.get("file"))
            work = lambda progress, should_stop: r.query_image(target, k)  # noqa: E731
        else:
            target = query.get("caption", query.get("text"))
            work = lambda progress, should_stop: r.query_text(target, k)  # noqa: E731
        task = Task(work, name="query", parent=self)
        self._task = task
        task.succeeded.connect(lambda ranking, t=task: self._show(t, ranking, query, remember))
        task.failed.connect(lambda msg, details, t=task: self._on_failed(t, msg))
        return task.start()

    def _on_failed(self, task: Task, message: str) -> None:
        if task is self._task:
            self.gold_label.setText(f"<span style='color:#cf222e'>{html.escape(message)}</span>")
            self.failed.emit(message)

    def go_back(self) -> None:
        """Show the previous query again."""
        if len(self.history) > 1:
            self.history.pop()
            self._ask(self.history[-1], remember=False)

    # ------------------------------------------------------------------ showing
    def _show(self, task: Task, ranking: Ranking, query: dict[str, Any], remember: bool) -> None:
        if task is not self._task or self.retriever is None:
            return
        if remember:
            self.history.append(query)
        self.back_button.setEnabled(len(self.history) > 1)
        self.ranking = ranking
        r = self.retriever
        ds = r.dataset
        self._show_query(ranking)
        marks = self.annotations.marks_for(ranking.direction, ranking.query) if self.annotations else {}
        if ranking.direction == "i2t":
            view = self.caption_list
            self.results.setCurrentWidget(view)
            view.clear()
            for rank, (item, score) in enumerate(zip(ranking.items.tolist(), ranking.scores.tolist()), 1):
                it = QListWidgetItem()
                it.setData(ItemRole, item)
                text = r.gallery_caption_text(item)
                it.setToolTip(text)
                it.setData(Qt.ItemDataRole.UserRole + 2, f"#{rank}  {score:.3f}   {text}")
                if r.corpus is None and ds.image_paths is not None:
                    it.setData(Qt.ItemDataRole.UserRole + 3, ds.image_paths[int(ds.caption_image[item])])
                self._style_item(it, ranking, item, marks.get(item))
                view.addItem(it)
        else:
            view = self.image_grid
            self.results.setCurrentWidget(view)
            view.clear()
            for rank, (item, score) in enumerate(zip(ranking.items.tolist(), ranking.scores.tolist()), 1):
                it = QListWidgetItem()
                it.setData(ItemRole, item)
                it.setData(Qt.ItemDataRole.UserRole + 2, f"#{rank}  {score:.3f}")
                if ds.image_paths is not None:
                    it.setData(Qt.ItemDataRole.UserRole + 3, ds.image_paths[item])
                caps = ds.captions_of(item)
                it.setToolTip("\n".join(ds.captions[c] for c in caps[:5]))
                self._style_item(it, ranking, item, marks.get(item))
                view.addItem(it)
        self._refresh_icons(view)
        if view.count():
            view.setCurrentRow(0)
        view.setFocus()
        self._update_marks_label()
        self.answered.emit(ranking)

    def _show_query(self, ranking: Ranking) -> None:
        r = self.retriever
        assert r is not None
        ds = r.dataset
        q = ranking.query
        path = None
        if "image" in q and ds.image_paths is not None:
            path = ds.image_paths[q["image"]]
            title = f"Image {int(ds.image_ids[q['image']])}"
        elif "file" in q:
            path, title = q["file"], Path(q["file"]).name
        elif "caption" in q and "text" not in q:
            title = f"Caption {int(ds.caption_ids[q['caption']])}: “{html.escape(ds.captions[q['caption']])}”"
        else:
            title = f"“{html.escape(q.get('text', ''))}”"
        if path:
            side = self.query_view.width() - 10
            pm = placeholder(side)
            from PySide6.QtGui import QPixmap
            loaded = QPixmap(path)
            if not loaded.isNull():
                pm = loaded.scaled(side, side, Qt.AspectRatioMode.KeepAspectRatio,
                                   Qt.TransformationMode.SmoothTransformation)
            self.query_view.setPixmap(pm)
            self.query_view.show()
        else:
            self.query_view.clear()
            self.query_view.hide()
        self.query_title.setText(f"<b>{title}</b>")
        what = "caption" if ranking.direction == "i2t" else "image"
        n = ranking.gallery_size
        if len(ranking.gold_ranks):
            ranks = sorted(int(x) for x in ranking.gold_ranks)
            shown = ", ".join(f"<b>{x}</b>" if x <= len(ranking.items) else str(x) for x in ranks)
            self.gold_label.setText(f"Ground truth {what}{'s' if len(ranks) > 1 else ''} at rank {shown} "
                                    f"of {n:,}")
        else:
            self.gold_label.setText(f"No ground truth for this query ({n:,} {what}s ranked)")

    def _style_item(self, it: QListWidgetItem, ranking: Ranking, item: int, mark: bool | None) -> None:
        label = it.data(Qt.ItemDataRole.UserRole + 2)
        prefix = {True: "✓ ", False: "✗ ", None: ""}[mark]
        it.setText(prefix + label)
        gold = ranking.is_gold(item)
        it.setBackground(QBrush(GOLD) if gold else QBrush())
        if mark is not None:
            it.setForeground(QBrush(MARK_YES if mark else MARK_NO))
        else:
            it.setForeground(QBrush())
        f = QFont(it.font())
        f.setBold(gold)
        it.setFont(f)

    def _refresh_icons(self, view: QListWidget) -> None:
        size = view.iconSize().width()
        for row in range(view.count()):
            it = view.item(row)
            path = it.data(Qt.ItemDataRole.UserRole + 3)
            if not path:
                continue
            pm = self.cache.get(path)
            it.setIcon(QIcon(pm if pm is not None else placeholder(size)))

    def _thumbnail_ready(self, path: str) -> None:
        view = self.results.currentWidget()
        pm = self.cache.get(path)
        if pm is None:
            return
        for row in range(view.count()):
            it = view.item(row)
            if it.data(Qt.ItemDataRole.UserRole + 3) == path:
                it.setIcon(QIcon(pm))

    # ------------------------------------------------------------------ results
    def current_view(self) -> QListWidget:
        return self.results.currentWidget()

    def _activate(self, it: QListWidgetItem) -> None:
        """Query from a result: a caption ranks images, an image ranks captions."""
        if self.ranking is None or self.retriever is None:
            return
        item = int(it.data(ItemRole))
        if self.ranking.direction == "i2t":
            if self.retriever.corpus is None and self.retriever.n_gallery_images:
                self.query_text(item)
        else:
            self.show_image.emit(item)
            self.query_image(item)

    def _mark_shortcut(self, value: bool | None) -> None:
        if not self.sentence.hasFocus():
            self.mark_current(value)

    def mark_current(self, relevant: bool | None) -> None:
        """Mark the current result; saved at once to the run's annotations file."""
        view = self.current_view()
        it = view.currentItem()
        if it is None or self.ranking is None:
            return
        if self.annotations is None:
            self.marks_label.setText("Marks need a run folder")
            return
        item = int(it.data(ItemRole))
        text = self.retriever.gallery_caption_text(item) if self.ranking.direction == "i2t" else ""
        self.annotations.mark(self.ranking.direction, self.ranking.query, item, relevant, text)
        self._style_item(it, self.ranking, item, relevant)
        row = view.currentRow()
        if relevant is not None and row + 1 < view.count():
            view.setCurrentRow(row + 1)        # annotators go down the list
        self._update_marks_label()

    def _update_marks_label(self) -> None:
        n = len(self.annotations) if self.annotations is not None else 0
        self.marks_label.setText(f"{n} mark{'s' if n != 1 else ''} saved" if self.annotations else "")

    def _export_marks(self) -> None:
        if self.annotations is None:
            return
        path, _ = QFileDialog.getSaveFileName(self, "Export marks", str(self.annotations.path.with_suffix(".csv")),
                                              "CSV (*.csv);;JSON lines (*.jsonl)")
        if path:
            self.annotations.export(path)
            self.marks_label.setText(f"exported {len(self.annotations)} marks to {path}")

    # ------------------------------------------------------------------ drop an image
    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt API)
        if event.mimeData().hasUrls() and self.retriever is not None:
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 (Qt API)
        urls = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if urls:
            event.acceptProposedAction()
            self.query_image(urls[0])

    # ------------------------------------------------------------------ presentation
    def set_presentation(self, on: bool) -> None:
        """Large type, only the query box and the results (for live demos)."""
        for w in (self.mark_bar, self.k_spin, self.gallery_combo, self.gallery_label, self.image_button):
            w.setVisible(not on)
        self.cache = self.big_cache if on else self.small_cache
        self.query_side.setFixedWidth(340 if on else 200)
        self.query_view.setFixedSize(*((320, 320) if on else (180, 180)))
        f = QFont(self.font())
        f.setPointSizeF(18 if on else max(10.0, QFont().pointSizeF()))
        for w in (self.sentence, self.caption_list, self.image_grid, self.query_title, self.gold_label, self.header):
            w.setFont(f)
        self.caption_list.setIconSize(QSize(120, 120) if on else QSize(64, 64))
        self.image_grid.setIconSize(QSize(200, 200) if on else QSize(96, 96))
        self.image_grid.setGridSize(QSize(240, 275) if on else QSize(118, 132))
        self._refresh_icons(self.current_view())
        if self.ranking is not None:
            self._show_query(self.ranking)


if __name__ == "__main__":  # pragma: no cover - manual preview
    import sys

    from crossview.engine.session import open_run
    from crossview.gui.launch import NO_DISPLAY, _exec, demo_run, ensure_app, has_display
    if not has_display():
        print(NO_DISPLAY, file=sys.stderr)
        sys.exit(1)
    run_dir = sys.argv[1] if len(sys.argv) > 1 else demo_run()
    app = ensure_app()
    panel = QueryPanel()
    run = open_run(run_dir)
    panel.set_retriever(run.retriever("test" if "test" in run.dataset.splits else "all"), run_dir, title=run.name)
    panel.resize(1200, 800)
    panel.show()
    sys.exit(_exec(app))
