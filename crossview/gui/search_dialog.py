"""The Train panel's "Search..." dialog: the values to try for each parameter of a search.

Each parameter of the method (and the image / text normalisation) gets a line of comma-separated values,
prefilled with the panel's current value; a line with two or more values becomes a key of the grid, a line
with one value is fixed for every trial. The metric the trials are ranked by, where they are chosen ("Choose
on": auto, k-fold cross-validation or a hold-out of the training images, or a split; a line under it says where
the refit is then reported, and choosing on that same split needs the "optimistic" box ticked), an optional
number of random trials and the search folder's name complete it. Every value is typed and
range-checked by the method's card (:func:`crossview.engine.tune.parse_grid_values`) when the user presses
"Start search": a bad one gets one clear line in the dialog, which stays open, and nothing starts.

The search itself is :func:`crossview.engine.tune.tune`, started by the search view
(:meth:`crossview.gui.search_view.SearchView.start_search`, under the Train panel's "Search trials" tab).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit,
                               QScrollArea, QSpinBox, QVBoxLayout, QWidget)

from crossview.engine.tune import RUN_KEYS, parse_grid_values, split_values
from crossview.core.errors import CrossViewError
from crossview.features.normalize import NORMS

#: what the trials can be ranked by (``crossview tune --metric``); MedR is lower-is-better, the engine negates it
METRICS = ("rsum", "i2t.R@1", "i2t.R@5", "i2t.R@10", "t2i.R@1", "t2i.R@5", "t2i.R@10", "i2t.MedR", "t2i.MedR")


@dataclass
class SearchSpec:
    """What the dialog asks for: the ``grid`` (keys with two or more values), the ``params`` fixed for every
    trial, the fixed ``image_norm`` / ``text_norm`` (``None`` when searched or not given), the ``metric``,
    ``trials`` (``None`` = every point), where the trials are chosen (``select_on``: ``auto``, ``cv3``, ``cv5``,
    ``holdout`` or a split; ``optimistic`` allows the reported split) and the search folder ``name``
    ('' = default)."""

    grid: dict[str, list[Any]]
    params: dict[str, Any] = field(default_factory=dict)
    image_norm: str | None = None
    text_norm: str | None = None
    metric: str = "rsum"
    trials: int | None = None
    select_on: str = "auto"
    optimistic: bool = False
    name: str = ""
    #: the runs' seeds (each trial and the refit trained once per seed, averaged first); None: the run's seed
    seeds: list[int] | None = None

    @property
    def n_points(self) -> int:
        """How many trials the search runs."""
        n = math.prod(len(v) for v in self.grid.values()) if self.grid else 0
        return min(n, self.trials) if self.trials else n


def _dedupe(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


class SearchDialog(QDialog):
    """``fields`` maps each parameter to ``(spec, current text)`` (``spec`` a card
    :class:`~crossview.methods.cards.ParamSpec`); ``norms`` are the current ``(image, text)`` normalisation
    names; ``splits`` the splits trials can be scored on; ``describe(select_on, optimistic)`` says in one line
    where the trials are then chosen and the refit reported, or raises :class:`CrossViewError` when that choice is
    refused (:func:`crossview.engine.tune.plan_selection` on the panel's dataset). After ``accepted``,
    :attr:`spec` holds the search."""

    def __init__(self, method: str, fields: dict[str, tuple[Any, str]], norms: tuple[str, str],
                 splits: list[str], parent: QWidget | None = None,
                 describe: Callable[[str, bool], str] | None = None) -> None:
        super().__init__(parent)
        self.method = method
        self.setWindowTitle(f"Search {method}")
        self.spec: SearchSpec | None = None
        self.last_error: str | None = None
        self._specs: dict[str, Any] = {}
        self.edits: dict[str, QLineEdit] = {}

        intro = QLabel(f"Values to try for each parameter of <b>{html.escape(method)}</b>, separated by commas "
                       "(by ';' when a value holds commas). Every combination is one trial, chosen as set below; "
                       "the best is then refitted on all training images and reported once. A single value is kept "
                       "fixed.")
        intro.setWordWrap(True)
        form_widget = QWidget()
        form = QFormLayout(form_widget)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        for name, (spec, text) in fields.items():
            self._add_row(form, name, text, (spec.help if spec is not None else "") or "")
            self._specs[name] = spec
        norm_help = "choices: " + ", ".join(NORMS)
        self._add_row(form, "image_norm", norms[0], "image feature normalisation; " + norm_help)
        self._add_row(form, "text_norm", norms[1], "text feature normalisation; " + norm_help)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(form_widget)
        # a modest minimum: the list scrolls, and the rows below it always keep their room (a taller minimum
        # than the dialog could give made the options below overlap the list's bottom rows)
        scroll.setMinimumHeight(min(180, 34 * (len(self.edits) + 1)))

        self.metric_combo = QComboBox()
        for m in METRICS:
            self.metric_combo.addItem(m, m)
        self.metric_combo.setToolTip("What the trials are ranked by (higher is better; MedR: lower is better)")
        self._describe = describe
        self.select_combo = QComboBox()
        for label, value in (("auto (val if there is a test split, else 3-fold cross-validation)", "auto"),
                             ("3-fold cross-validation of train", "cv3"), ("5-fold cross-validation of train", "cv5"),
                             ("a seeded 20% hold-out of train", "holdout"), *((f"split {s}", s) for s in splits)):
            self.select_combo.addItem(label, value)
        self.select_combo.setToolTip("Where every trial is scored. The best trial is then refitted on all the "
                                     "training images and reported once on the dataset's evaluation split (test, "
                                     "else val); choosing there too would make that number optimistic.")
        self.optimistic_check = QCheckBox("allow choosing on the split the result is reported on (optimistic)")
        self.optimistic_check.setToolTip("The refit's number is then biased upwards: every output of the search "
                                         "says 'optimistic: chosen and reported on the same split'")
        self.selection_label = QLabel("")
        self.selection_label.setWordWrap(True)
        self.select_combo.currentIndexChanged.connect(self._update_selection)
        self.optimistic_check.toggled.connect(self._update_selection)
        self.trials_spin = QSpinBox()
        self.trials_spin.setRange(0, 10_000)
        self.trials_spin.setSpecialValueText("all points")
        self.trials_spin.setToolTip("Try only this many points of the grid, drawn at random (seeded)")
        self.seeds_edit = QLineEdit()
        self.seeds_edit.setPlaceholderText("the run's seed (one)")
        self.seeds_edit.setToolTip("Seeds to train every trial and the refit at, e.g. 0,1,2: each trial is scored "
                                   "by the mean over its seeds first, so a stochastic method is not chosen on one "
                                   "seed's luck (the search takes that many times longer)")
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText(f"default: tune-{method}-dataset-time")
        self.name_edit.setToolTip("The search folder in the runs folder; the same name continues a stopped search")
        opts = QFormLayout()
        opts.addRow("Rank by", self.metric_combo)
        opts.addRow("Choose on", self.select_combo)
        opts.addRow("", self.optimistic_check)
        opts.addRow("", self.selection_label)
        opts.addRow("Random trials", self.trials_spin)
        opts.addRow("Seeds", self.seeds_edit)
        opts.addRow("Search folder", self.name_edit)

        self.count_label = QLabel("")
        self.error_label = QLabel("")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #cf222e")
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error_label.hide()
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.start_button = self.buttons.addButton("Start search", QDialogButtonBox.ButtonRole.AcceptRole)
        self.start_button.setDefault(True)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(scroll, 1)
        layout.addLayout(opts)
        layout.addWidget(self.count_label)
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)
        for e in self.edits.values():
            e.textChanged.connect(self._update_count)
            e.textChanged.connect(self._recheck)
        self.trials_spin.valueChanged.connect(self._update_count)
        self.seeds_edit.textChanged.connect(self._update_count)
        self.seeds_edit.textChanged.connect(self._recheck)
        self.select_combo.currentIndexChanged.connect(self._recheck)
        self.optimistic_check.toggled.connect(self._recheck)
        self._update_count()
        self._update_selection()
        screen = self.screen().availableGeometry() if self.screen() is not None else None
        self.resize(560, min(760, screen.height() - 80) if screen is not None else 700)

    def _add_row(self, form: QFormLayout, name: str, text: str, help_text: str) -> None:
        edit = QLineEdit(text)
        tip = (help_text + "\n" if help_text else "") + "Values to try, separated by commas (';' when a value " \
                                                        "holds commas)"
        edit.setToolTip(tip)
        label = QLabel(name)
        label.setToolTip(tip)
        form.addRow(label, edit)
        self.edits[name] = edit

    def set_values(self, name: str, text: str) -> None:
        """Set the values line of ``name`` (for tests and scripted demos)."""
        self.edits[name].setText(text)

    def _raw(self, name: str) -> list[str]:
        spec = self._specs.get(name)
        text = self.edits[name].text()
        if spec is not None and str(spec.type).startswith("list"):     # a list value holds commas itself
            return [v.strip() for v in text.split(";") if v.strip()]
        return split_values(text)

    def _update_selection(self) -> None:
        """The line under "Choose on": where the trials are chosen and the refit reported, or why not."""
        if self._describe is None:
            self.selection_label.setText("")
            return
        try:
            text = html.escape(self._describe(self.select_combo.currentData() or "auto",
                                              self.optimistic_check.isChecked()))
            if "optimistic" in text:
                text = f"<span style='color:#9a6700'>{text}</span>"
        except CrossViewError as e:
            text = f"<span style='color:#cf222e'>{html.escape(str(e))}</span>"
        self.selection_label.setText(text)

    def _seeds(self) -> list[int] | None:
        """The seeds field: None when empty (the run's seed), else the distinct seeds (CrossViewError if bad)."""
        text = self.seeds_edit.text().strip()
        if not text:
            return None
        from crossview.core.run_settings import parse_seeds
        return list(parse_seeds(text))

    def _update_count(self) -> None:
        n = math.prod(max(1, len(self._raw(name))) for name in self.edits)
        k = self.trials_spin.value()
        try:
            seeds = self._seeds()
        except CrossViewError:
            seeds = None
        self.count_label.setText(f"{min(n, k) if k else n} trial(s)" + (f" drawn at random from {n}" if k and k < n
                                                                         else "")
                                 + (f", each at {len(seeds)} seeds" if seeds and len(seeds) > 1 else ""))

    def build(self) -> SearchSpec:
        """The search the fields describe; a :class:`CrossViewError` names the first bad value."""
        grid: dict[str, list[Any]] = {}
        fixed: dict[str, Any] = {}
        for name in self.edits:
            raw = self._raw(name)
            if not raw:
                raise CrossViewError(f"{name}: give at least one value to try (the current value keeps it fixed)")
            values = _dedupe(parse_grid_values(self.method, name, raw))
            if len(values) > 1:
                grid[name] = values
            else:
                fixed[name] = values[0]
        if not grid:
            raise CrossViewError("nothing to search: give two or more comma-separated values for at least one "
                                 "parameter (e.g. reg: 0.3, 1, 3)")
        return SearchSpec(grid=grid, params={k: v for k, v in fixed.items() if k not in RUN_KEYS},
                          image_norm=fixed.get("image_norm"), text_norm=fixed.get("text_norm"),
                          metric=self.metric_combo.currentData(), trials=self.trials_spin.value() or None,
                          select_on=self.select_combo.currentData() or "auto",
                          optimistic=self.optimistic_check.isChecked(), name=self.name_edit.text().strip(),
                          seeds=self._seeds())

    def _check(self) -> str | None:
        """The first problem with the fields (None: they describe a search that can start)."""
        try:
            self.spec = self.build()
            if self._describe is not None:    # where it chooses: refused here, the dialog stays open
                self._describe(self.spec.select_on, self.spec.optimistic)
        except CrossViewError as e:
            self.spec = None
            return str(e)
        return None

    def _recheck(self, *_: object) -> None:
        """While an error is shown, every edit checks again: a fixed value clears it, another problem replaces it."""
        if self.error_label.isHidden():
            return
        problem = self._check()
        self.last_error = problem
        self.error_label.setText(problem or "")
        self.error_label.setVisible(problem is not None)

    def accept(self) -> None:
        """Check every value first: a bad one is shown here and nothing starts."""
        problem = self._check()
        self.last_error = problem
        if problem is not None:
            self.error_label.setText(problem)
            self.error_label.show()
            return
        self.error_label.hide()
        super().accept()
