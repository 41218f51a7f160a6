"""The Query panel: image -> ranked captions, sentence -> ranked images, with ground truth and marks.

When the run's method has a tag branch (webly), a "Sentence | Tags" switch beside the query box turns it into
a tag-list box: ``dog, grass, run`` is embedded through the tag branch and ranks the same images a sentence
does (no ground truth: a free tag list has none).

It is a view onto a :class:`crossview.engine.retriever.Retriever` (set with :meth:`QueryPanel.set_retriever`);
every query runs in a worker and a superseded answer is dropped. Results show rank, score, the
caption's own image, ground truth highlighted, and the ground truth's rank however far down it is.
Double-click a result, press Enter on it or use "Query with this" to query from it; arrow keys move
through results; ``R`` / ``N`` mark
the current result relevant / not relevant (``0`` clears), saved at once to the run's
``annotations.jsonl``. The panel always says which gallery ranks are against, and warns when that gallery
holds the run's training images (ranks are then optimistic and differ from Inspect's).

*Explain* (``E`` / ``Ctrl+E``, :meth:`QueryPanel.set_explain`) overlays region maps (:mod:`crossview.explain`)
on the query image (i2t, for the selected caption) or on the result images in view (t2i), and shades the
caption's words by importance in a band under the query box. The panel says which pairs are in view and
draws what is known of them; :attr:`QueryPanel.explain_controller` does the work: one
:class:`~crossview.explain.Explainer` per run, made on first use, the pairs in view explained in one background
task (a newer view supersedes it, and its results are dropped) and kept per pair, so toggling and going back
cost nothing.

Where the pieces live: this module asks the retriever, keeps the history, shows the query (image, title,
ground-truth ranks, the gallery line and choice, whose words come from :mod:`crossview.gui.galleries`), handles
presentation mode and wires the rest together;
:class:`~crossview.gui.gallery_loader.GalleryLoader` encodes a photo folder or a caption corpus chosen in the
gallery box (bar, ETA, Cancel); :mod:`crossview.gui.photo_results` keys marks on photos by path and opens a photo;
:class:`~crossview.gui.results_view.ResultsView` shows the ranked results (list or grid, thumbnails, ground
truth and marks drawn, double-click / Enter); :class:`~crossview.gui.explain_controller.ExplainController` runs
and keeps the explanations; :mod:`crossview.gui.explain_view` holds which pairs a view explains, the task body
and the band of shaded words (:class:`~crossview.gui.explain_view.ExplainBar`); :mod:`crossview.gui.marks` the
mark buttons and the marks export (the marks themselves are
:class:`crossview.engine.annotations.AnnotationStore`'s ``annotations.jsonl``). Each runs without this panel.

Run alone: ``python -m crossview.gui.panels.query_panel [RUN_DIR]`` (default: trains a quick CCA on
the demo first).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFont, QKeySequence, QPixmap, QShortcut
from PySide6.QtWidgets import (QButtonGroup, QComboBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit, QListWidget,
                               QListWidgetItem, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from crossview.engine.annotations import AnnotationStore, MarkNotSaved
from crossview.core.errors import CrossViewError
from crossview.core.text import html_text
from crossview.engine.retriever import Ranking, Retriever
from crossview.engine.scoring import DEFAULT_SCORINGS
from crossview.eval.scoring import SCORINGS, check_scoring, describe_scoring
from crossview.gui.explain_controller import ExplainController
from crossview.gui.explain_view import ExplainBar, Pair, pairs_in_view, query_sentence, region_line
from crossview.gui.galleries import CORPUS, PHOTOS, gallery_choices, gallery_note, photos_label, training_images_in
from crossview.gui.gallery_loader import GalleryLoader
from crossview.gui.photo_results import (IMAGE_SUFFIXES, is_photo_gallery, mark_query, no_ground_truth_line,
                                         open_photo, result_marks)
from crossview.gui.marks import MarkButtons, describe_query
# GOLD and FIGURE_SPACE: re-exported (tests import the results' look from the panel)
from crossview.gui.results_view import FIGURE_SPACE, GOLD, ItemRole, ResultsView  # noqa: F401
from crossview.gui.thumbnails import ThumbnailCache, placeholder
from crossview.gui.workers import Task

PRESENT_HINT = "Presentation mode: F11 or Esc to leave"
SENTENCE_HINT = "Type a sentence and press Enter to find images, e.g. a red circle left of a blue square"
TAGS_HINT = "Type tags separated by commas and press Enter to find images, e.g. dog, grass, run"
EXPLAIN_TIP = ("Explain (E or Ctrl+E): why results match. A heat map over the image shows the regions that add "
               "most to the score (on the query image for an image query, on each result image for a sentence "
               "query), and the caption's words are shaded by how much each adds. Computed in the background "
               "and kept, so turning it off and on again is instant.")
#: the scoring box's labels (crossview.eval.scoring.SCORINGS says what each is)
SCORING_LABELS = {"plain": "Plain (dot product)", "csls": "CSLS", "isoftmax": "Inverted softmax",
                  "dsoftmax": "Dual softmax (QB-Norm)"}
#: at most this many result images are explained at once (the ones in view); scrolling explains more
EXPLAIN_MAX_RESULTS = 24


class QueryPanel(QWidget):
    """Ask a :class:`Retriever`; ``show_image(int)`` asks the Data panel to show a dataset image."""

    answered = Signal(object)      # the Ranking shown
    explained = Signal(object)     # the Explanation now shown in the words line (None when that pair failed)
    failed = Signal(str)
    show_image = Signal(int)
    gallery_requested = Signal(object)   # a split name or "all" (photo folders and corpora load here: gallery_loader)
    scoring_applied = Signal(object)     # the scoring's choice record (crossview.engine.scoring), once queries use it

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.retriever: Retriever | None = None
        self.run_dir: Path | None = None
        self.eval_split: str | None = None      # the run's evaluation split (config.json "split")
        self.train_split: str | None = None     # the split the run was trained on
        self.presenting = False
        self._query_pixmap: QPixmap | None = None
        self.ranking: Ranking | None = None
        self._task: Task | None = None
        #: a query asked while the scoring is prepared: (query, remember), asked once the scoring is ready (or has
        #: failed), so that no answer is shown under one scoring and then replaced by another's
        self._deferred: tuple[dict[str, Any], bool] | None = None
        self.history: list[dict[str, Any]] = []
        # Explain: the explainer, its tasks and the explained pairs; this panel asks and draws
        self.explain_controller = ExplainController(self)
        self.explain_controller.started.connect(self._on_explain_started)
        self.explain_controller.progress.connect(self._on_explain_progress)
        self.explain_controller.done.connect(self._refresh_explain)   # shows it all; explains what came into view
        self.explain_controller.failed.connect(self._on_explain_failed)
        self._query_overlay: QPixmap | None = None
        self._filling = False
        self._title = ""
        #: the photo folders offered in the gallery box: resolved folder -> photos (None until scanned)
        self.photo_folders: dict[str, int | None] = {}
        self._pending_gallery: str | None = None     # a photo folder opened before any run: searched once one is
        self.gallery_loader = GalleryLoader()
        self.gallery_loader.loaded.connect(self._on_gallery_loaded)
        self.gallery_loader.cancelled.connect(self._on_gallery_stopped)
        self.gallery_loader.failed.connect(self._on_gallery_failed)
        self.gallery_loader.busy_changed.connect(self._on_loader_busy)
        self.setAcceptDrops(True)

        self.header = QLabel("No run loaded: train one in the Train panel or open a run.")
        self.header.setObjectName("summary")
        self.header.setWordWrap(True)
        self.gallery_note = QLabel("")
        self.gallery_note.setObjectName("galleryNote")
        self.gallery_note.setWordWrap(True)
        self.gallery_note.setTextFormat(Qt.TextFormat.RichText)
        self.present_hint = QLabel(PRESENT_HINT)
        self.present_hint.setObjectName("presentHint")
        self.present_hint.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.present_hint.setStyleSheet("color: #57606a;")
        self.present_hint.hide()

        self.gallery_combo = QComboBox()
        self.gallery_combo.setToolTip("What to rank: the images and captions of a split, all of them, an "
                                      "independent caption corpus (image -> text only) or a folder of your own "
                                      "photos (text -> image only)")
        self.gallery_combo.activated.connect(self._on_gallery_choice)
        # hubness-aware scoring (crossview.eval.scoring): normalised by the run's training images and captions
        self.scoring_combo = QComboBox()
        for name in SCORINGS:
            self.scoring_combo.addItem(SCORING_LABELS.get(name, name), name)
        defaults = ", ".join(f"{SCORING_LABELS.get(s, s)} for {m}" for m, (s, _) in DEFAULT_SCORINGS.items()
                             if m != "fused")
        self.scoring_combo.setToolTip("How results are scored; a run opens at the scoring it was trained and "
                                      f"evaluated with (its method's default: {defaults}). The re-scorings "
                                      "normalise with a bank of the run's training images and captions (never the "
                                      "gallery), their k / beta the run's own, or chosen by rsum on a hold-out of "
                                      "train.\n" + "\n".join(
                                          f"{SCORING_LABELS.get(k, k)}: {v}" for k, v in SCORINGS.items()))
        self.scoring_combo.activated.connect(lambda i: self.set_scoring(self.scoring_combo.itemData(i)))
        self.scoring_note = QLabel("")
        self.scoring_note.setObjectName("scoringNote")
        self.scoring_note.setWordWrap(True)
        self.scoring_note.setTextFormat(Qt.TextFormat.RichText)     # its texts are escaped HTML (an apostrophe too)
        self._scorings: dict[str, tuple[Any, dict[str, Any]]] = {}   # this run's prepared scorings, by name
        self._scoring_method: Any = None                            # whose method they were prepared for
        self._scoring_task: Task | None = None
        #: the scoring the run recorded at training (crossview.engine.scoring.run_scoring), where the box starts
        self._run_scoring: dict[str, Any] = {"scoring": "plain"}

        self.sentence = QLineEdit()
        self.sentence.setPlaceholderText(SENTENCE_HINT)
        self.sentence.returnPressed.connect(self._ask_sentence)
        # "Sentence | Tags": shown only for a run whose method has a tag branch (webly)
        self.mode_sentence = QPushButton("Sentence")
        self.mode_tags = QPushButton("Tags")
        self.mode_sentence.setToolTip("The query box is a sentence, embedded by the sentence branch")
        self.mode_tags.setToolTip("The query box is a tag list (dog, grass, run), embedded by the run's tag branch "
                                  "(the mean GloVe vector of the tags' words); there is no ground truth")
        self.mode_group = QButtonGroup(self)
        self.mode_group.setExclusive(True)
        for b in (self.mode_sentence, self.mode_tags):
            b.setCheckable(True)
            b.setObjectName("modeSwitch")
            self.mode_group.addButton(b)
        self.mode_sentence.setChecked(True)
        self.mode_group.buttonToggled.connect(self._on_mode)
        self.mode_bar = QWidget()
        mb = QHBoxLayout(self.mode_bar)
        mb.setContentsMargins(0, 0, 0, 0)
        mb.setSpacing(0)
        mb.addWidget(self.mode_sentence)
        mb.addWidget(self.mode_tags)
        self.mode_bar.hide()
        self.image_button = QPushButton("Query by image file...")
        self.image_button.setToolTip("Pick an image file (or drop one on this panel) to rank the captions")
        self.image_button.clicked.connect(self._choose_image_file)
        self.k_spin = QSpinBox()
        self.k_spin.setRange(5, 500)
        self.k_spin.setValue(50)
        self.k_spin.setPrefix("top ")
        self.k_spin.setToolTip("How many results to list")
        self.explain_button = QPushButton("Explain")
        self.explain_button.setObjectName("explainToggle")
        self.explain_button.setCheckable(True)
        self.explain_button.setToolTip(EXPLAIN_TIP)
        self.explain_button.toggled.connect(self._on_explain_toggled)
        self.explain_button.setStyleSheet("QPushButton:checked { background: #bc4c00; color: #ffffff; "
                                          "border: 1px solid #bc4c00; }")

        self.query_view = QLabel()
        self.query_view.setObjectName("preview")
        self.query_view.setFixedSize(180, 180)      # resized with the panel (resizeEvent)
        self.query_view.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.query_title = QLabel("")
        self.query_title.setWordWrap(True)
        self.query_title.setTextFormat(Qt.TextFormat.RichText)
        self.gold_label = QLabel("")
        self.gold_label.setWordWrap(True)
        self.gold_label.setObjectName("gold")
        # a full-width band under the query box: the caption shaded word by word, and a note
        self.explain_bar = ExplainBar()
        self.explain_words, self.explain_note = self.explain_bar.words, self.explain_bar.note
        # scrolling the image grid explains the results that come into view (after the scroll settles)
        self._scroll_timer = QTimer(self)
        self._scroll_timer.setSingleShot(True)
        self._scroll_timer.setInterval(150)
        self._scroll_timer.timeout.connect(self._refresh_explain)

        # results: captions (i2t) in a list, images (t2i) in a grid
        self.results = ResultsView()
        self.caption_list, self.image_grid = self.results.caption_list, self.results.image_grid
        self.results.icon_override = self._explained_icon
        self.results.activated.connect(self._activate)
        self.results.current_changed.connect(self._update_query_with)
        self.results.current_changed.connect(self._on_current_changed)
        self.results.grid_scrolled.connect(self._on_grid_scrolled)

        self.marks = MarkButtons()      # the run's marks store, the mark buttons and "n marks saved"
        self.marks.mark_requested.connect(self.mark_current)
        self.mark_yes, self.mark_no, self.mark_clear, self.export_button = self.marks.buttons
        self.marks_label = self.marks.label
        self.back_button = QPushButton("Back")
        self.back_button.setToolTip("Return to the previous query (Alt+Left)")
        self.back_button.clicked.connect(self.go_back)
        self.query_with_button = QPushButton("Query with this")
        self.query_with_button.setToolTip("Query from the selected result: a caption ranks images, an image ranks "
                                          "captions (or double-click the result, or press Enter)")
        self.query_with_button.clicked.connect(self._query_with_current)
        for key, value in (("R", True), ("N", False), ("0", None)):
            sc = QShortcut(QKeySequence(key), self)
            sc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            sc.activated.connect(lambda v=value: self._mark_shortcut(v))
        back = QShortcut(QKeySequence("Alt+Left"), self)
        # the whole window while the panel is shown (a hidden panel's shortcut does not fire); the main window's
        # Query menu shows the key but leaves it to this one, so the two never make it ambiguous
        back.setContext(Qt.ShortcutContext.WindowShortcut)
        back.activated.connect(self.go_back)
        explain_e = QShortcut(QKeySequence("E"), self)
        explain_e.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        explain_e.activated.connect(lambda: None if self.sentence.hasFocus() else self._toggle_explain())
        explain_ctrl = QShortcut(QKeySequence("Ctrl+E"), self)
        explain_ctrl.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        explain_ctrl.activated.connect(self._toggle_explain)

        ask = QHBoxLayout()
        ask.addWidget(self.mode_bar)
        ask.addWidget(self.sentence, 1)
        ask.addWidget(self.image_button)
        ask.addWidget(self.k_spin)
        ask.addWidget(self.explain_button)
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
        marks.addWidget(self.query_with_button)
        marks.addStretch(1)
        marks.addWidget(self.marks)
        layout = QVBoxLayout(self)
        head = QHBoxLayout()
        head.addWidget(self.header, 1)
        self.gallery_label = QLabel("Gallery:")
        head.addWidget(self.gallery_label)
        head.addWidget(self.gallery_combo)
        self.scoring_label = QLabel("Scoring:")
        head.addWidget(self.scoring_label)
        head.addWidget(self.scoring_combo)
        head.addWidget(self.present_hint)
        self.head_bar = head
        layout.addLayout(head)
        layout.addWidget(self.gallery_note)
        layout.addWidget(self.scoring_note)
        layout.addWidget(self.gallery_loader)
        layout.addLayout(ask)
        layout.addWidget(self.explain_bar)
        layout.addLayout(body, 1)
        layout.addWidget(self.mark_bar)
        self._set_enabled(False)

    # ------------------------------------------------------------------ set-up
    def _set_enabled(self, on: bool) -> None:
        for w in (self.sentence, self.image_button, *self.marks.buttons, self.k_spin, self.mode_bar,
                  self.explain_button, self.scoring_combo):
            w.setEnabled(on)
        self.back_button.setEnabled(on and len(self.history) > 1)
        self._update_query_with()

    def set_retriever(self, retriever: Retriever | None, run_dir: str | Path | None = None,
                      title: str = "", *, annotations: AnnotationStore | None = None,
                      eval_split: str | None = None, train_split: str | None = None) -> None:
        """Query ``retriever`` from now on; marks go to ``run_dir`` (none when it is None).

        ``annotations`` is the run's store when the caller prepared it already (off the GUI thread); it
        must belong to ``run_dir``. The store is opened before anything changes, so when it cannot be
        read the panel keeps the previous run's retriever and marks file together (never one without
        the other). ``eval_split`` / ``train_split``: the run's evaluation and training splits, for
        saying which gallery ranks are against and warning when it holds training images.
        """
        if annotations is None and run_dir is not None:
            annotations = AnnotationStore(run_dir)           # may raise: nothing has changed yet
        if annotations is not None and run_dir is not None and \
                Path(annotations.path).parent.resolve() != Path(run_dir).resolve():
            raise ValueError(f"the annotations {annotations.path} do not belong to the run {run_dir}")
        self.retriever = retriever
        self._title = title
        self._deferred = None
        # another run: its own explainer (a new gallery of the same run keeps the loaded backbone)
        self.explain_controller.set_retriever(retriever)
        self._query_overlay = None
        self.explain_bar.clear()
        self.annotations = annotations if run_dir is not None else None
        self.marks.dataset = retriever.dataset if retriever is not None else None
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.eval_split, self.train_split = eval_split, train_split
        self.history.clear()
        self.ranking = None
        self.results.clear()
        self.query_view.clear()
        self._query_pixmap = None
        self.query_title.clear()
        self.gold_label.clear()
        tags = retriever is not None and bool(getattr(retriever, "has_tag_branch", False))
        self.mode_bar.setVisible(tags)
        if not tags:
            self.mode_sentence.setChecked(True)      # a run without a tag branch takes sentences only
        if retriever is None:
            self.header.setText("No run loaded: train one in the Train panel or open a run.")
            self.gallery_note.clear()
            self._set_enabled(False)
            return
        self._keep_scoring(retriever)
        self._fill_galleries(retriever)
        self.header.setText(f"<b>{html.escape(title or retriever.method.name)}</b>")
        self._describe_gallery(retriever)
        self._set_enabled(True)
        if self._pending_gallery is not None:
            pending, self._pending_gallery = self._pending_gallery, None
            self.load_gallery(pending)
        self.image_button.setEnabled(retriever.n_gallery_captions > 0)
        self.explain_button.setEnabled(not is_photo_gallery(retriever))   # maps of a dataset's images only
        self.sentence.setEnabled(retriever.n_gallery_images > 0)
        self.mode_bar.setEnabled(retriever.n_gallery_images > 0)
        self.marks.refresh()

    # ------------------------------------------------------------------ scoring
    @property
    def scoring(self) -> str:
        """The scoring chosen in the box (``"plain"``, ``"csls"``, ``"isoftmax"``, ``"dsoftmax"``)."""
        return str(self.scoring_combo.currentData())

    def set_scoring(self, scoring: str) -> Task | None:
        """Rank by ``scoring`` (:mod:`crossview.eval.scoring`) from now on. The bank (the run's training split)
        and k / beta are prepared in a worker, once per run and scoring; then the query shown is asked again and
        :attr:`scoring_applied` is sent. Returns that task (None when the scoring was prepared already, or there is
        no run). k / beta is the run's recorded cross-validated choice (``crossview eval RUN --scoring X``, or
        ``train --scoring X``: :func:`crossview.engine.scoring.recorded_choice`) when it has one, else the quick
        choice on a hold-out of the training bank, shown as in-sample: the panel never trains (a cross-validation
        trains the run's method three times, which is the CLI's or a run's work, not a query's)."""
        check_scoring(scoring)
        self.scoring_combo.setCurrentIndex(self.scoring_combo.findData(scoring))
        r = self.retriever
        if r is None:
            return None
        if self._scoring_task is not None and self._scoring_task.is_running():
            self._scoring_task.cancel()           # superseded: its answer is dropped
        self._scoring_task = None
        train_split = self.train_split or "train"
        if scoring != "plain" and getattr(r, "gallery_name", None) == train_split:
            self._scoring_failed(f"the gallery is the run's training split ({train_split}), where the scoring bank "
                                 f"comes from; choose another gallery for {SCORING_LABELS[scoring]}")
            return None
        if scoring in self._scorings:
            self._apply_scoring(r, *self._scorings[scoring])
            return None
        from crossview.engine.scoring import retriever_scoring

        run_dir = self.run_dir
        # the run's own scoring keeps the parameter it was trained and evaluated with (a method default: k = 10)
        own = self._run_scoring if self._run_scoring.get("scoring") == scoring and \
            self._run_scoring.get("param") is not None else None
        task = Task(lambda progress, should_stop: retriever_scoring(r, scoring, run_dir=run_dir,
                                                                    train_split=train_split, choice=own),
                    name="scoring", parent=self)
        self._scoring_task = task
        self.scoring_note.setText(f"{SCORING_LABELS[scoring]}: encoding the {html.escape(train_split)} split and "
                                  "reading or choosing its parameter...")
        task.succeeded.connect(lambda res, t=task: self._on_scoring_ready(t, r, scoring, res))
        task.failed.connect(lambda msg, details, t=task: self._on_scoring_task_failed(t, msg))
        return task.start()

    def _on_scoring_ready(self, task: Task, r: Retriever, scoring: str, res: tuple[Any, dict[str, Any]]) -> None:
        if task is not self._scoring_task or r is not self.retriever:
            return                               # superseded, or another run / gallery meanwhile
        self._scoring_task = None                # prepared: queries are answered at once again
        self._scorings[scoring] = res
        self._apply_scoring(r, *res)

    def _apply_scoring(self, r: Retriever, scorers: Any, record: dict[str, Any]) -> None:
        r.set_scoring(scorers, record)
        note = describe_scoring(record)
        if record.get("in_sample") and self.run_dir is not None:
            note += (f". For a cross-validated choice: crossview eval {self.run_dir} --scoring {record['scoring']} "
                     "--select cv")
        self.scoring_note.setText(html.escape(note))
        self.scoring_applied.emit(record)
        self._ask_after_scoring()

    def _ask_after_scoring(self) -> None:
        """The query asked while the scoring was prepared, else the query shown ranked again."""
        if self._deferred is not None:
            (query, remember), self._deferred = self._deferred, None
            self._ask(query, remember)
        elif self.history:
            self._ask(self.history[-1], remember=False)

    def _on_scoring_task_failed(self, task: Task, message: str) -> None:
        if task is self._scoring_task:
            self._scoring_task = None
            self._scoring_failed(message)

    def _scoring_failed(self, message: str) -> None:
        current = self.retriever.scoring if self.retriever is not None else "plain"
        self.scoring_combo.setCurrentIndex(self.scoring_combo.findData(current))
        self.scoring_note.setText(f"<span style='color:#cf222e'>{html.escape(message)}</span>")
        self.failed.emit(message)
        if self._deferred is not None:         # asked meanwhile: answered under the scoring the run keeps
            (query, remember), self._deferred = self._deferred, None
            self._ask(query, remember)

    def _keep_scoring(self, retriever: Retriever) -> None:
        """Another run starts at its own scoring (the one it recorded at training, its summary's; plain for an old
        run, or where the gallery is its training split), its scorings prepared afresh; another gallery of the same
        run keeps the scoring chosen."""
        if retriever.method is not self._scoring_method:
            from crossview.engine.scoring import run_scoring

            if self._scoring_task is not None:    # the previous run's: its answer is dropped
                self._scoring_task.cancel()
                self._scoring_task = None

            self._scoring_method = retriever.method
            self._scorings.clear()
            self.scoring_note.clear()
            config = None
            if self.run_dir is not None and (self.run_dir / "config.json").is_file():
                from crossview.engine.run_folder import read_config
                try:
                    config = read_config(self.run_dir)
                except CrossViewError:
                    config = None
            self._run_scoring = run_scoring(config)
            self.scoring_combo.setCurrentIndex(self.scoring_combo.findData(retriever.scoring))
            own = self._run_scoring["scoring"]
            if own != retriever.scoring and \
                    getattr(retriever, "gallery_name", None) != (self.train_split or "train"):
                self.set_scoring(own)
        elif self.scoring != retriever.scoring:
            self.set_scoring(self.scoring)

    def training_images_in_gallery(self, retriever: Retriever | None = None) -> int:
        """How many of the gallery's images the run was trained on (0 when unknown or a corpus)."""
        return training_images_in(retriever or self.retriever, self.train_split)

    def _describe_gallery(self, r: Retriever) -> None:
        """The line that says what ranks are against, with a visible warning when it holds training images."""
        self.gallery_note.setText(gallery_note(r, self.eval_split, self.train_split))
        self.gallery_note.setToolTip("Ground-truth ranks are counted in this gallery")

    def _fill_galleries(self, retriever: Retriever) -> None:
        combo = self.gallery_combo
        combo.blockSignals(True)
        combo.clear()
        loader = self.gallery_loader
        loading = (f"Loading {loader.what}...", loader.choice) if loader.busy and loader.choice else None
        choices, current = gallery_choices(retriever, self.eval_split, self.train_split,
                                           list(self.photo_folders.items()), loading)
        for label, choice in choices:
            combo.addItem(label, choice)
        combo.setCurrentIndex(max(0, combo.findData(current)))
        combo.blockSignals(False)

    def _on_gallery_choice(self, index: int) -> None:
        choice = self.gallery_combo.itemData(index)
        if choice == "corpus:current" or choice == self.gallery_loader.choice:
            return
        if choice in ("corpus:?", PHOTOS + "?"):
            if choice == PHOTOS + "?":
                path = QFileDialog.getExistingDirectory(self, "Open a folder of photos")
            else:
                path, _ = QFileDialog.getOpenFileName(self, "Caption corpus (one caption a line)", "",
                                                      "Text (*.txt);;All files (*)")
            if not path:
                if self.retriever is not None:
                    self._fill_galleries(self.retriever)
                return
            if choice == PHOTOS + "?":
                self.open_photo_folder(path)
                return
            choice = f"corpus:{path}"
        if isinstance(choice, str) and choice.startswith((PHOTOS, CORPUS)):
            self.load_gallery(choice)
            return
        self.gallery_loader.cancel()        # a split: the window opens it; a photo folder loading is superseded
        self.gallery_requested.emit(choice)

    # ------------------------------------------------------------------ photo folders and corpora
    def open_photo_folder(self, folder: str | Path) -> Task | None:
        """Offer ``folder`` in the gallery box ("Photos: name") and, with a run loaded, search it: its photos are
        encoded in the background (bar, ETA, Cancel), then sentences rank them. Returns the loading task."""
        path = str(Path(folder).expanduser().resolve())
        self.photo_folders.setdefault(path, None)
        if self.retriever is None:
            self._pending_gallery = PHOTOS + path
            self.gallery_note.setText(f"{html.escape(photos_label(path))}: open or train a run, and its photos "
                                      "are searched with it.")
            return None
        return self.load_gallery(PHOTOS + path)

    def load_gallery(self, choice: str) -> Task | None:
        """Rank against ``photos:<folder>`` or ``corpus:<file>`` from now on, once its features are ready
        (:class:`~crossview.gui.gallery_loader.GalleryLoader`: first use encodes, with progress and Cancel)."""
        if self.retriever is None:
            return None
        task = self.gallery_loader.load(self.retriever, choice)
        self._fill_galleries(self.retriever)            # the box says what is loading
        return task

    def _on_loader_busy(self, busy: bool) -> None:
        if self.retriever is not None:
            self._fill_galleries(self.retriever)

    def _on_gallery_loaded(self, retriever: Retriever, choice: str) -> None:
        if self.retriever is None or retriever.method is not self.retriever.method:
            return                               # another run was opened meanwhile
        if retriever.photos is not None:
            self.photo_folders[str(retriever.photos.root)] = retriever.photos.n_images
        sentence = self.sentence.text().strip()
        self.set_retriever(retriever, self.run_dir, self._title, annotations=self.annotations,
                           eval_split=self.eval_split, train_split=self.train_split)
        if sentence and not self.tag_mode and retriever.n_gallery_images:
            self.sentence.setText(sentence)
            self.query_text(sentence)            # the sentence asked before, on the new gallery

    def _on_gallery_stopped(self, choice: str, message: str) -> None:
        if self.retriever is not None:
            self._describe_gallery(self.retriever)
            self.gallery_note.setText(f"{self.gallery_note.text()}<br>{html.escape(message)}")

    def _on_gallery_failed(self, choice: str, message: str) -> None:
        if self.retriever is not None:
            self._describe_gallery(self.retriever)
            self.gallery_note.setText(f"{self.gallery_note.text()}<br><span style='color:#cf222e'>Could not load "
                                      f"{html.escape(choice.partition(':')[2])}: {html.escape(message)}</span>")

    # ------------------------------------------------------------------ asking
    def query_image(self, image: int | str) -> Task | None:
        """Rank the gallery's captions for dataset image ``image`` (int) or an image file (str)."""
        self.sentence.clear()          # the box would otherwise still show the last sentence asked
        return self._ask({"image": image} if isinstance(image, int) else {"file": str(image)})

    def query_text(self, text: str | int) -> Task | None:
        """Rank the gallery's images for a sentence, or for dataset caption ``text`` (int)."""
        return self._ask({"caption": text} if isinstance(text, int) else {"text": text})

    def query_tags(self, tags: str) -> Task | None:
        """Rank the gallery's images for a tag list (``"dog, grass, run"``) through the run's tag branch."""
        return self._ask({"tags": str(tags)})

    @property
    def tag_mode(self) -> bool:
        """Whether the query box takes a tag list (the "Tags" switch, for a run with a tag branch)."""
        return self.mode_bar.isVisibleTo(self) and self.mode_tags.isChecked()

    def set_query_mode(self, mode: str) -> None:
        """``"sentence"`` or ``"tags"`` (the latter only when the run has a tag branch: else a CrossViewError)."""
        if mode == "tags" and not (self.retriever is not None and getattr(self.retriever, "has_tag_branch", False)):
            raise CrossViewError("this run's method has no tag branch: tag queries need a webly run")
        if mode not in ("sentence", "tags"):
            raise CrossViewError(f"query mode {mode!r}: use 'sentence' or 'tags'")
        (self.mode_tags if mode == "tags" else self.mode_sentence).setChecked(True)

    def _on_mode(self, *_: object) -> None:
        self.sentence.setPlaceholderText(TAGS_HINT if self.mode_tags.isChecked() else SENTENCE_HINT)
        self.sentence.setFocus()

    def _ask_sentence(self) -> None:
        if self.sentence.text().strip():
            if self.tag_mode:
                self.query_tags(self.sentence.text())
            else:
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
        if self._scoring_task is not None:
            # the scoring is being prepared (its task runs, or its answer waits in the event queue): answer once it is ready, never first under the previous scoring
            self._deferred = (query, remember)
            self.gold_label.setText(f"Waiting for {html.escape(SCORING_LABELS.get(self.scoring, self.scoring))} "
                                    "to be ready; the query is answered then.")
            return None
        if "image" in query or "file" in query:
            target = query.get("image", query.get("file"))
            work = lambda progress, should_stop: r.query_image(target, k)  # noqa: E731
        elif "tags" in query:
            work = lambda progress, should_stop: r.query_tags(query["tags"], k)  # noqa: E731
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
        self._filling = True          # selection changes while the views fill ask for no explanation
        try:
            self._fill(ranking, query, remember)
        finally:
            self._filling = False
        self._refresh_explain()
        self.answered.emit(ranking)

    def _fill(self, ranking: Ranking, query: dict[str, Any], remember: bool) -> None:
        if remember:
            self.history.append(query)
        self.back_button.setEnabled(len(self.history) > 1)
        self.ranking = ranking
        self._show_query(ranking)
        self.results.fill(ranking, self.retriever, result_marks(self.annotations, self.retriever, ranking))
        self.marks.refresh()
        self._update_query_with()

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
        elif "tags" in q:
            title = f"Tags: {html.escape(q['tags'])}"
        elif "caption" in q and "text" not in q:
            title = f"Caption {int(ds.caption_ids[q['caption']])}: “{html_text(ds.captions[q['caption']])}”"
        else:
            title = f"“{html_text(q.get('text', ''))}”"
        self._query_overlay = None
        if path:
            loaded = QPixmap(path)
            self._query_pixmap = None if loaded.isNull() else loaded
            self._paint_query_image()
            self.query_view.show()
        else:
            self._query_pixmap = None
            self.query_view.clear()
            self.query_view.hide()
        self._fit_layout()
        mine = r.query_identity(ranking)
        if mine is not None:
            title += f" &nbsp;·&nbsp; {r.identity_word} {html.escape(mine)}"
        self.query_title.setText(f"<b>{title}</b>")
        what = "caption" if ranking.direction == "i2t" else "image"
        n = ranking.gallery_size
        if len(ranking.gold_ranks):
            ranks = sorted(int(x) for x in ranking.gold_ranks)
            shown = ", ".join(f"<b>{x}</b>" if x <= len(ranking.items) else str(x) for x in ranks)
            self.gold_label.setText(f"Ground truth {what}{'s' if len(ranks) > 1 else ''} at rank {shown} "
                                    f"of {n:,}" + self._same_identity(ranking, mine))
        elif is_photo_gallery(r):
            self.gold_label.setText(no_ground_truth_line(n))
        elif "tags" in q:
            self.gold_label.setText(f"No ground truth for a tag list ({n:,} images ranked through the tag branch)")
        else:
            self.gold_label.setText(f"No ground truth for this query ({n:,} {what}s ranked)"
                                    + self._same_identity(ranking, mine))

    def _same_identity(self, ranking: Ranking, mine: str | None) -> str:
        """"; 7 of the top 10 show identity 12": what the identity protocol counts, for a query with one."""
        r = self.retriever
        if mine is None or r is None or not len(ranking.items):
            return ""
        same = sum(x == mine for x in r.result_identities(ranking))
        return f"; {same} of the top {len(ranking.items)} show {r.identity_word} {html.escape(mine)}"

    def _paint_query_image(self) -> None:
        side = min(self.query_view.width(), self.query_view.height()) - 10
        pm = self._query_overlay if self.explaining and self._query_overlay is not None else self._query_pixmap
        self.query_view.setPixmap(placeholder(side) if pm is None else
                                  pm.scaled(side, side, Qt.AspectRatioMode.KeepAspectRatio,
                                            Qt.TransformationMode.SmoothTransformation))

    # ------------------------------------------------------------------ explain
    @property
    def explaining(self) -> bool:
        """Whether the Explain toggle is on."""
        return self.explain_button.isChecked()

    @property
    def explainer(self) -> Any:
        """The run's explainer, None until Explain first needs one (kept by :attr:`explain_controller`)."""
        return self.explain_controller.explainer

    @explainer.setter
    def explainer(self, value: Any) -> None:
        self.explain_controller.explainer = value

    @property
    def explainer_factory(self) -> Any:
        """``retriever -> explainer``, called when Explain first needs one for a run (tests swap it)."""
        return self.explain_controller.explainer_factory

    @explainer_factory.setter
    def explainer_factory(self, factory: Any) -> None:
        self.explain_controller.explainer_factory = factory

    def set_explain(self, on: bool) -> None:
        """Turn Explain on or off (the toggle button, E or Ctrl+E): region maps over the query image (image
        queries) or the result images in view (sentence queries), and the caption's words shaded by
        importance. Computed off the GUI thread; each pair is kept, so turning it on again is instant."""
        self.explain_button.setChecked(on)

    def _toggle_explain(self) -> None:
        if self.explain_button.isEnabled():
            self.explain_button.toggle()

    def _on_explain_toggled(self, on: bool) -> None:
        self.explain_bar.active = on
        if on:
            self._refresh_explain()
            return
        self.explain_controller.cancel()
        self.explain_bar.clear()
        if self._query_pixmap is not None:
            self._paint_query_image()
        self.results.refresh_icons(self.current_view())
        self._fit_layout()

    def _on_current_changed(self, *_: object) -> None:
        if self.explaining and not self._filling:
            self._refresh_explain()

    def _on_grid_scrolled(self, *_: object) -> None:
        if self.explaining and self.ranking is not None and self.ranking.direction == "t2i":
            self._scroll_timer.start()

    def _focus_row(self) -> int:
        """The result whose caption words are shown: the selected one, else the first."""
        view = self.current_view()
        row = view.currentRow()
        return row if row >= 0 else (0 if view.count() else -1)

    def _wanted_pairs(self) -> tuple[list[Pair], str]:
        """The pairs the current view explains (the focus pair first) or, when it explains none, why."""
        view, focus = self.current_view(), self._focus_row()
        return pairs_in_view(self.retriever, self.ranking, int(view.item(focus).data(ItemRole)) if focus >= 0 else None,
                             lambda: [int(view.item(x).data(ItemRole))
                                      for x in self.results.rows_in_view(view, EXPLAIN_MAX_RESULTS)])

    def _refresh_explain(self) -> None:
        """Show what is known for the current view and explain, in one background task, what is not."""
        if not self.explaining or self._filling:
            return
        pairs, why = self._wanted_pairs()
        self._show_explained(pairs, why)
        if self.explain_controller.request(pairs, self._ahead_pairs(pairs)) and pairs:      # all known already
            self._emit_explained(pairs[0])

    def _ahead_pairs(self, pairs: list[Pair]) -> list[Pair]:
        """A sentence query's next screenful of results after those in view: explained after them, in the
        background, so that scrolling finds them ready."""
        if not pairs or pairs[0].direction != "t2i":
            return []
        view = self.current_view()
        rows = self.results.rows_in_view(view, EXPLAIN_MAX_RESULTS)
        first = max(rows) + 1 if rows else 0
        return [Pair(int(view.item(r).data(ItemRole)), pairs[0].text, "t2i")
                for r in range(first, min(view.count(), first + EXPLAIN_MAX_RESULTS))]

    def _on_explain_started(self, n_pairs: int) -> None:
        if self.ranking is not None and self.ranking.direction == "t2i" and n_pairs > 1:
            self.explain_bar.set_note(f"Explaining the results in view: 0 of {n_pairs}...")
        else:
            self.explain_bar.set_note("Explaining...")

    def _on_explain_failed(self, message: str) -> None:
        self.explain_bar.set_note(f"Could not explain: {message}", error=True)

    def _on_explain_progress(self, done: int, total: int) -> None:
        pairs, why = self._wanted_pairs()
        self._show_explained(pairs, why)
        if done < total and total > 1:
            self.explain_bar.set_note(f"Explaining the results in view: {done} of {total} images read...")

    def _explained_icon(self, view: QListWidget, it: QListWidgetItem) -> QPixmap | None:
        """The result image with its region map, when Explain is on and it has been explained."""
        if not self.explaining or view is not self.image_grid or self.ranking is None or \
                self.ranking.direction != "t2i":
            return None
        item = it.data(ItemRole)
        if item is None:
            return None
        return self.explain_controller.pixmap(Pair(int(item), query_sentence(self.retriever, self.ranking), "t2i"))

    def _show_explained(self, pairs: list[Pair], why: str = "") -> None:
        """Paint what is known: the overlaid query image or result icons, the shaded words, the note."""
        if not self.explaining or self.ranking is None:
            return
        bar = self.explain_bar
        if why or not pairs:
            bar.words.hide()
            bar.set_note(why)
            return
        focus = self.explain_controller.get(pairs[0])
        rank = self._focus_row() + 1
        if self.ranking.direction == "i2t":
            self._query_overlay = self.explain_controller.pixmap(pairs[0])
            if self._query_pixmap is not None:
                self._paint_query_image()
            heading = f"Why caption #{rank} matches:"
        else:
            self.results.refresh_icons(self.image_grid)
            heading = f"Words that match image #{rank}:"
        if focus is None:
            bar.words.hide()
            if not self.explain_controller.busy:
                bar.set_note("Explaining...")
            bar.sync()
            return
        if focus.explanation is None:
            bar.words.hide()
            bar.set_note(f"Could not explain this pair: {focus.error}", error=True)
            return
        e = focus.explanation
        bar.show_words(e, heading)
        note = region_line(e) if not focus.error else focus.error
        if self.ranking.direction == "t2i" and e.region is not None:
            done = self.explain_controller.count_known(pairs)
            note += f"  ·  {done} of the {len(pairs)} results in view explained"
        bar.set_note(note, error=e.region is None or bool(focus.error))

    def _emit_explained(self, pair: Pair) -> None:
        got = self.explain_controller.get(pair)
        self.explained.emit(got.explanation if got is not None else None)

    # ------------------------------------------------------------------ results
    def current_view(self) -> QListWidget:
        return self.results.currentWidget()

    @property
    def cache(self) -> ThumbnailCache:
        """The thumbnail cache the results draw from now (large ones in presentation mode)."""
        return self.results.cache

    def _query_with_current(self) -> None:
        it = self.current_view().currentItem()
        if it is not None:
            self._activate(it)

    def _can_query_from(self) -> bool:
        r, ranking = self.retriever, self.ranking
        if r is None or ranking is None or is_photo_gallery(r):
            return False                 # a photo opens in the system's viewer instead (double-click)
        return ranking.direction == "t2i" or (r.corpus is None and r.n_gallery_images > 0)

    def _update_query_with(self, *_: object) -> None:
        ok = self._can_query_from() and self.current_view().currentItem() is not None
        self.query_with_button.setEnabled(ok)

    def _activate(self, it: QListWidgetItem) -> None:
        """Query from a result: a caption ranks images, an image ranks captions."""
        if self.ranking is None or self.retriever is None or it is None or it.listWidget() is not self.current_view():
            return
        item = int(it.data(ItemRole))
        if is_photo_gallery(self.retriever):
            open_photo(self.retriever.gallery_image_path(item))
            return
        if self.ranking.direction == "i2t":
            if self.retriever.corpus is None and self.retriever.n_gallery_images:
                self.query_text(item)
        else:
            self.show_image.emit(item)
            self.query_image(item)

    def _mark_shortcut(self, value: bool | None) -> None:
        if not self.sentence.hasFocus():
            self.mark_current(value)

    @property
    def annotations(self) -> AnnotationStore | None:
        """The run's marks (``annotations.jsonl``), None for a run without a folder: :attr:`MarkButtons.store`."""
        return self.marks.store

    @annotations.setter
    def annotations(self, store: AnnotationStore | None) -> None:
        self.marks.store = store

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
        if is_photo_gallery(self.retriever):
            text = str(self.retriever.gallery_image_path(item))     # photo marks are kept by path
        error: str | MarkNotSaved = ""
        try:
            self.annotations.mark(self.ranking.direction, mark_query(self.retriever, self.ranking.query), item,
                                  relevant, text)
        except MarkNotSaved as e:          # kept in memory (pending): the line says so and offers Retry
            error = e
        self.results.style_item(it, self.ranking, item, relevant)
        row = view.currentRow()
        if relevant is not None and row + 1 < view.count():
            view.setCurrentRow(row + 1)        # annotators go down the list
        self.marks.refresh(error)

    def describe_query(self, query: dict[str, Any]) -> tuple[str, str]:
        """``(image file name, caption text)`` of a marked query, as far as the open dataset knows them."""
        return describe_query(self.retriever.dataset if self.retriever is not None else None, query)

    def export_marks(self, path: str | Path) -> Path:
        """The run's marks to ``path`` (.csv or .jsonl, atomically): :func:`crossview.gui.marks.export_marks`
        against the open dataset."""
        return self.marks.export(path)

    # ------------------------------------------------------------------ drop an image
    @staticmethod
    def _dropped_image(event) -> str | None:
        """The image file dropped (anything else, a folder included, is left to the window)."""
        urls = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()] if event.mimeData().hasUrls() \
            else []
        return urls[0] if urls and urls[0].lower().endswith(IMAGE_SUFFIXES) and Path(urls[0]).is_file() else None

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt API)
        if self.retriever is not None and self._dropped_image(event):
            event.acceptProposedAction()
        else:
            event.ignore()            # a folder goes on to the window: a dataset, or photos to search

    def dropEvent(self, event) -> None:  # noqa: N802 (Qt API)
        path = self._dropped_image(event)
        if path:
            event.acceptProposedAction()
            self.query_image(path)
        else:
            event.ignore()

    # ------------------------------------------------------------------ presentation
    def set_presentation(self, on: bool) -> None:
        """Large type, only the query box and the results (for live demos), and a hint how to leave."""
        self.presenting = on
        for w in (self.mark_bar, self.k_spin, self.gallery_combo, self.gallery_label, self.image_button):
            w.setVisible(not on)
        self.present_hint.setVisible(on)
        self.results.set_presenting(on)
        f = QFont(self.font())
        f.setPointSizeF(18 if on else max(10.0, QFont().pointSizeF()))
        for w in (self.sentence, self.caption_list, self.image_grid, self.query_title, self.gold_label, self.header,
                  self.explain_button):
            w.setFont(f)
        self.explain_bar.set_presenting(on, self.font())      # the shaded words, legible from the back of the room
        self._fit_layout()
        self.results.refresh_icons(self.current_view())
        if self.ranking is not None:
            self._show_query(self.ranking)
            self.results.restyle(self.ranking, result_marks(self.annotations, self.retriever, self.ranking))        # marks hidden from the audience, back after
        self._refresh_explain()       # larger cells: another set of results is in view

    # ------------------------------------------------------------------ sizes
    def _fit_layout(self) -> None:
        """The query image takes a share of the width; the image grid's columns fill the results' width."""
        width = max(self.width(), 400)
        if self.query_view.isHidden() and self.ranking is not None:
            # a sentence query shows no image: its words need a narrow column, the results the rest
            side = int(min(max(width * 0.18, 200), 320))
        else:
            side = int(min(max(width * (0.3 if self.presenting else 0.24), 200), 560 if self.presenting else 420))
        self.query_side.setFixedWidth(side)
        self.query_view.setFixedSize(side - 20, side - 20)
        if self._query_pixmap is not None:
            self._paint_query_image()
        self.results.fit_grid()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().resizeEvent(event)
        self._fit_layout()
        if self.explaining and self.ranking is not None and self.ranking.direction == "t2i":
            self._scroll_timer.start()      # more or fewer results in view

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        self.stop_tasks()
        super().closeEvent(event)

    def stop_tasks(self, msecs: int = 5000) -> None:
        """Cancel the query, the scoring being prepared and every explanation in flight and wait for their threads
        (closing)."""
        self._scroll_timer.stop()
        self.gallery_loader.stop(msecs)
        for t in (self._task, self._scoring_task):     # the query; a scoring bank being prepared
            if t is not None and t.is_running():
                t.cancel()
                t.wait(msecs)
        self.explain_controller.stop(msecs)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().showEvent(event)
        self._fit_layout()


if __name__ == "__main__":  # pragma: no cover - manual preview
    import sys

    from crossview.engine.session import open_run
    from crossview.gui.app import NO_DISPLAY, demo_run, ensure_app, exec_app, has_display
    if not has_display():
        print(NO_DISPLAY, file=sys.stderr)
        sys.exit(1)
    run_dir = sys.argv[1] if len(sys.argv) > 1 else demo_run()
    app = ensure_app()
    panel = QueryPanel()
    run = open_run(run_dir)
    split = run.config.get("split")
    split = split if split in run.dataset.splits else "all"
    panel.set_retriever(run.retriever(split), run_dir, title=run.name, eval_split=run.config.get("split"),
                        train_split=run.config.get("train_split", "train"))
    panel.resize(1200, 800)
    panel.show()
    sys.exit(exec_app(app))
