"""The search view: validation searches (:func:`crossview.engine.tune.tune`) started from the "Search..." dialog
(:mod:`crossview.gui.search_dialog`) or continued from a search folder, and their trials table (one row per
finished trial, the best highlighted, double-click to open a trial's run) under a line saying where the search
stands, with "Continue search".

It knows searches, not the form: what to search (the method, the form's parameter values, encoders, norms,
device, seed) is asked of the owner each time through ``choices`` (a :class:`SearchChoices`), which search
folder Continue search runs follows the owner's runs list through ``selected_run``, and whether the owner is
busy with other work through ``is_busy``. The search runs in an :class:`~crossview.gui.workers.EventTask` that
the view makes; the view says what the owner shows through signals (the bar and the line beside it, log lines,
a refused input, the refit to load, the events of the trials' runs to draw). The Train panel
(:mod:`crossview.gui.panels.train_panel`) composes it under its "Search trials" tab.
Runnable alone: ``python -m crossview.gui.search_view [DATASET] [METHOD]``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QPushButton, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from crossview.core.errors import CrossViewError
from crossview.core.events import Progress, TrialFinished
from crossview.core.progress import StageEta, format_seconds
from crossview.core.text import html_text
from crossview.engine.tune import TuneResult
from crossview.gui.search_dialog import SearchDialog, SearchSpec
from crossview.gui.workers import EventTask, preload_engine_modules

__all__ = ["SearchChoices", "SearchView", "card_fields", "field_texts"]


@dataclass(frozen=True)
class SearchChoices:
    """What the owner's form says a search uses: the ``method``, its parameters as ``fields`` (parameter ->
    ``(card spec, current value as text)``: what the dialog prefills, :func:`field_texts`), the chosen
    normalisations (``None`` = the method's default), the encoders (``None`` = the default), ``device``
    and ``seed``."""

    method: str | None
    fields: dict[str, tuple[Any, str]] = field(default_factory=dict)
    image_norm: str | None = None
    text_norm: str | None = None
    image_encoder: str | None = None
    text_encoder: str | None = None
    device: str = "auto"
    seed: int = 0


def field_texts(values: dict[str, tuple[Any, Any]], method: str) -> dict[str, tuple[Any, str]]:
    """``{parameter: (card spec, value)}`` -> ``{parameter: (card spec, value as text)}``: the value converted by
    the card and written as the dialog reads it (lists comma-separated, ``None`` as ``none``)."""
    out = {}
    for pname, (spec, value) in values.items():
        try:
            value = spec.coerce(value, method)
        except CrossViewError:
            pass                     # a bad value is shown as typed: the dialog refuses it with its reason
        if isinstance(value, list):
            text = ", ".join(map(str, value))
        else:
            text = "none" if value is None else str(value)
        out[pname] = (spec, text)
    return out


def card_fields(method: str) -> dict[str, tuple[Any, str]]:
    """The fields of ``method`` at its card's defaults (its ``default_params`` when it has no card; run settings
    are never among them): what a search with no form around it prefills."""
    from crossview.methods import cards, method_class

    if cards.card_path(method).is_file():
        specs = cards.parse_card(cards.card_path(method)).params
    else:
        from crossview.methods.cards import ParamSpec, _infer_type
        specs = {k: ParamSpec(k, v, _infer_type(v)) for k, v in method_class(method).default_params().items()
                 if isinstance(v, (int, float, str, bool))}
    return field_texts({p: (s, s.default) for p, s in specs.items()}, method)


class SearchView(QWidget):
    """The trials of a validation search and the search's task.

    Signals: ``started(task, folder, title)`` once the search's :class:`EventTask` runs (the owner keeps it to
    pause / stop it); ``run_event(object)``: an event of the trials' runs that is not the search's own (logs,
    losses, a run's Finished), for the owner to draw; ``status(value, line, tooltip)``: the bar over the whole
    search (0..1000, -1 leaves it) and the line beside it (with its tooltip, '' leaves it); ``message(str)``: a
    log line; ``failed(message, details, title)``: a refused input or a failed search; ``ended()``: the task
    ended, emitted before the view says how (the owner flushes its log first); ``run_finished(str)``: the refit of
    the best point, to load as after training; ``search_finished(str)``: the search folder, when it finished;
    ``runs_changed()``: a trial's run folder appeared; ``open_run(str)``: a trial's run was double-clicked."""

    started = Signal(object, str, str)
    run_event = Signal(object)
    status = Signal(int, str, str)
    message = Signal(str)
    failed = Signal(str, str, str)
    ended = Signal()
    run_finished = Signal(str)
    search_finished = Signal(str)
    runs_changed = Signal()
    open_run = Signal(str)

    def __init__(self, runs_root: str | Path, choices: Callable[[], SearchChoices],
                 selected_run: Callable[[], Path | None] = lambda: None, is_busy: Callable[[], bool] = lambda: False,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runs_root = Path(runs_root)
        self.dataset: Any = None
        self._choices = choices
        self._selected_run = selected_run
        self._is_busy = is_busy
        self.task: EventTask | None = None
        self.last_error: str | None = None
        self.search_dialog: SearchDialog | None = None
        self.search_folder: Path | None = None
        self.search_result: Any = None       #: the last search's TuneResult (None until one finishes)
        self.search_best: int | None = None  #: the number of the shown search's best trial so far
        self._last_search: dict[str, Any] | None = None  # tune()'s arguments of this view's last search
        self._search: dict[str, Any] | None = None   # the running search: keys, metric, total, done, rows
        self._t0 = 0.0
        self._eta = StageEta()

        self.search_info = QLabel("No search yet: press Search... to try several parameter values.")
        self.search_info.setWordWrap(True)
        self.search_info.setTextFormat(Qt.TextFormat.RichText)
        self.trials_table = QTableWidget(0, 0)
        self.trials_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.trials_table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.trials_table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.trials_table.verticalHeader().hide()
        self.trials_table.setSortingEnabled(False)
        self.trials_table.setToolTip("Double-click a trial to open its run")
        self.trials_table.doubleClicked.connect(lambda index: self._open_trial(index.row()))
        self.continue_search_button = QPushButton("Continue search")
        self.continue_search_button.setToolTip("Run the search of the selected trial (in the runs list) or of "
                                               "the stopped search again: finished trials are kept, the rest run")
        self.continue_search_button.clicked.connect(lambda: self.continue_search())
        head = QHBoxLayout()
        head.addWidget(self.search_info, 1)
        head.addWidget(self.continue_search_button, 0, Qt.AlignmentFlag.AlignTop)
        v = QVBoxLayout(self)
        v.setContentsMargins(4, 4, 4, 4)
        v.addLayout(head)
        v.addWidget(self.trials_table, 1)
        self.update_buttons()

    # ------------------------------------------------------------------ state
    def set_dataset(self, ds: Any) -> None:
        """Search on ``ds`` from now on."""
        self.dataset = ds
        self.update_buttons()

    def is_running(self) -> bool:
        """Whether this view's search task runs."""
        return self.task is not None and self.task.is_running()

    def _busy(self) -> bool:
        return self.is_running() or self._is_busy()

    def update_buttons(self) -> None:
        self.continue_search_button.setEnabled(not self._busy() and self.search_to_continue() is not None)

    def _fail(self, message: str, details: str = "", title: str = "Training failed") -> None:
        self.last_error = message
        self.failed.emit(message, details, title)

    # ------------------------------------------------------------------ starting
    def _resolved_norms(self, choices: SearchChoices) -> tuple[str, str]:
        from crossview.methods import default_norms_of

        defaults = default_norms_of(choices.method)
        return choices.image_norm or defaults[0], choices.text_norm or defaults[1]

    def open_search_dialog(self) -> SearchDialog | None:
        """Open the search dialog for the owner's method (prefilled from its form); its Start search begins
        :meth:`start_search`. Returns the dialog (shown window-modal, not blocking)."""
        choices = self._choices()
        method = choices.method
        if self.dataset is None or not method or self._busy():
            return None
        splits = [n for n in self.dataset.split_names if n != "train"]
        dialog = SearchDialog(method, choices.fields, self._resolved_norms(choices), splits, parent=self,
                              describe=self._describe_selection)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda d=dialog: self.start_search(d.spec))
        dialog.finished.connect(lambda _r, d=dialog: self._forget_dialog(d))
        self.search_dialog = dialog
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.open()
        return dialog

    def _describe_selection(self, select_on: str, optimistic: bool) -> str:
        """Where a search on the view's dataset chooses and reports (raises when the choice is refused)."""
        from crossview.engine.tune import plan_selection

        if self.dataset is None:
            return ""
        return plan_selection(self.dataset, select_on, seed=self._choices().seed, optimistic=optimistic).description

    def _forget_dialog(self, dialog: SearchDialog) -> None:
        if self.search_dialog is dialog:
            self.search_dialog = None

    def _new_search_dir(self, method: str, name: str) -> Path:
        from crossview.engine.run_folder import check_folder_name, safe_name, unused_dir

        if name:
            path = self.runs_root / check_folder_name(name, "search folder name")
            if path.exists() and not (path / "tune.json").is_file() and any(path.iterdir()):
                raise CrossViewError(f"{path} exists and is not a search folder: choose another search folder name")
            return path
        return unused_dir(self.runs_root, "tune", method, safe_name(self.dataset.name))

    def start_search(self, spec: SearchSpec | None) -> EventTask | None:
        """Start a validation search (:func:`crossview.engine.tune.tune`) of the owner's method on the view's
        dataset with the owner's encoders, device and seed. Every input is checked before anything runs: a bad
        one gets one message (``failed``) and nothing starts."""
        if spec is None or self.dataset is None or self._busy():
            return None
        choices = self._choices()
        method = choices.method
        try:
            folder = self._new_search_dir(method, spec.name)
        except CrossViewError as e:
            self._fail(str(e), "", title="Search not started")
            return None
        return self._start_tune(dict(method=method, data=self.dataset, grid=spec.grid, params=spec.params,
                                     metric=spec.metric, trials=spec.trials, out=folder, select_on=spec.select_on,
                                     optimistic=spec.optimistic,
                                     image_encoder=choices.image_encoder,
                                     text_encoder=choices.text_encoder,
                                     image_norm=spec.image_norm, text_norm=spec.text_norm,
                                     device=choices.device, seed=choices.seed, seeds=spec.seeds,
                                     # ranked by the method's default scoring, as the form's runs are (and the
                                     # runs list compares the refit with them)
                                     scoring="default"))

    def _start_tune(self, kw: dict[str, Any]) -> EventTask | None:
        preload_engine_modules()     # at once when done; else the worker would import torch holding the GIL
        from crossview.engine.tune import tune

        gen = tune(**kw)
        try:
            # the engine checks every input (grid, parameters, split, metric, an existing folder) before its
            # first event, without extracting or training: doing that step here refuses bad input at once
            first = next(gen)
        except CrossViewError as e:
            gen.close()
            self._fail(str(e), "", title="Search not started")
            return None
        except StopIteration:      # pragma: no cover - tune always yields
            return None
        self._last_search = dict(kw)
        n = math.prod(len(v) for v in kw["grid"].values())
        total = min(n, kw["trials"]) if kw.get("trials") else n
        folder = Path(kw["out"])
        self.search_folder = folder
        self.search_best = None
        where, folds = "", 1
        if not isinstance(kw["data"], (str, Path)):
            from crossview.engine.tune import plan_selection
            try:
                sel = plan_selection(kw["data"], kw.get("select_on", "auto"), folds=kw.get("folds"),
                                     seed=kw.get("seed", 0), optimistic=kw.get("optimistic", False))
                where, folds = sel.description, sel.folds
            except CrossViewError:      # pragma: no cover - tune checked it already
                pass
        from crossview.engine.scoring import describe_run_scoring, resolve_run_scoring
        scored = describe_run_scoring(resolve_run_scoring(kw["method"], kw.get("scoring"), kw.get("scoring_param")),
                                      None)      # checked by tune's first step already
        search = {"folder": folder, "method": kw["method"], "metric": kw["metric"], "keys": list(kw["grid"]),
                  "total": total, "done": 0, "inner": 0.0, "rows": {}, "best": None, "where": where, "folds": folds,
                  "scored": scored}
        self._setup_trials_table(search)
        self._update_search_info(search)

        def events():
            try:
                yield first
                yield from gen
            finally:
                gen.close()

        title = (f"Searching {kw['method']} on {getattr(kw['data'], 'name', kw['data'])} "
                 f"({total} trials, ranked by {kw['metric']}" + (f"; {where}" if where else "") + ")")
        self.last_error = None
        self.search_result = None
        self._search = search
        self._t0 = time.monotonic()
        self._eta = StageEta()
        task = EventTask(events, name="train", parent=self)
        self.task = task
        # connected before the task starts, so no event is lost; the owner gets what it draws through the
        # view's signals, in this order
        task.event.connect(self._on_event)
        task.failed.connect(lambda message, details: self._fail(message, details))
        task.paused_changed.connect(lambda p: self._eta.pause() if p else self._eta.resume())
        task.finished.connect(self._on_task_finished)
        task.start()
        self.started.emit(task, str(folder), title)
        self.update_buttons()
        return task

    # ------------------------------------------------------------------ continuing
    def search_to_continue(self) -> Path | None:
        """The search folder that Continue search would run: that of the trial selected in the owner's runs
        list, or this view's last search when it did not finish."""
        selected = self._selected_run()
        if selected is not None:
            parent = selected.parent
            if (parent / "tune.json").is_file():
                return parent
        if self._last_search is not None and self.search_result is None:
            return Path(self._last_search["out"])
        return None

    def continue_search(self, folder: str | Path | None = None) -> EventTask | None:
        """Run the search in ``folder`` (default: :meth:`search_to_continue`) again, as recorded in its
        ``tune.json`` (or as this view started it, when it stopped before its first trial finished): finished
        trials are read back, an interrupted one resumes, the rest run, then the best is refitted."""
        from crossview.core.io import read_json
        from crossview.engine.tune import recorded_scoring

        folder = Path(folder) if folder is not None else self.search_to_continue()
        if folder is None or self._busy():
            return None
        device = self._choices().device
        last = self._last_search
        if last is not None and Path(last["out"]) == folder and not (folder / "tune.json").is_file():
            return self._start_tune({**last, "device": device})
        try:
            rec = read_json(folder / "tune.json")
            if not isinstance(rec, dict) or not isinstance(rec.get("grid"), dict) or not rec.get("method"):
                raise CrossViewError(f"{folder / 'tune.json'} is not a search record; the folder is damaged")
            data = self._search_data(folder, rec)
        except CrossViewError as e:
            self._fail(str(e), "", title="Search not continued")
            return None
        # a search recorded before selection was kept apart from reporting scored its trials on val_split
        old = "select_on" not in rec
        return self._start_tune(dict(method=rec["method"], data=data, grid=rec["grid"], params=rec.get("params") or {},
                                     metric=rec.get("metric", "rsum"), trials=rec.get("trials"), out=folder,
                                     select_on=rec.get("val_split", "val") if old else rec["select_on"],
                                     folds=rec.get("folds"), optimistic=bool(rec.get("optimistic", old)),
                                     train_split=rec.get("train_split", "train"),
                                     image_encoder=rec.get("image_encoder"), text_encoder=rec.get("text_encoder"),
                                     image_norm=rec.get("image_norm"), text_norm=rec.get("text_norm"),
                                     device=device, seed=int(rec.get("seed", 0)), seeds=rec.get("seeds"),
                                     scoring=recorded_scoring(rec)))

    def _search_data(self, folder: Path, rec: dict[str, Any]) -> Any:
        """The dataset a recorded search ran on: the view's own when a trial's fingerprint matches, else the
        path the record names."""
        from crossview.core.io import read_json

        if self.dataset is not None:
            for cfg_path in sorted(folder.glob("trial-*/config.json")):
                try:
                    cfg = read_json(cfg_path)
                except CrossViewError:
                    continue
                if isinstance(cfg, dict) and cfg.get("dataset_fingerprint") == self.dataset.fingerprint():
                    return self.dataset
                break
            if not any(folder.glob("trial-*/config.json")):
                return self.dataset
        if isinstance(rec.get("data"), str) and rec["data"]:
            return rec["data"]
        raise CrossViewError(f"the search in {folder} ran on another dataset that was not loaded from a file: "
                             "load that dataset in the Data panel, then press Continue search")

    # ------------------------------------------------------------------ the trials table
    def _setup_trials_table(self, search: dict[str, Any]) -> None:
        metric = search["metric"]
        k = int(search.get("folds") or 1)
        # under cross-validation every number is the mean over the folds, and its spread follows the metric
        mean = f" ({k}-fold mean)" if k > 1 else ""
        cols = (["#", *search["keys"]] + ([] if metric == "rsum" else [metric + mean])
                + ["rsum" + mean] + (["± sd"] if k > 1 else []) + ["i2t R@1", "t2i R@1", "run"])
        t = self.trials_table
        t.clearContents()
        t.setRowCount(0)
        t.setColumnCount(len(cols))
        t.setHorizontalHeaderLabels(cols)
        t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        t.horizontalHeader().setStretchLastSection(True)

    def _update_search_info(self, search: dict[str, Any]) -> None:
        best = search["rows"].get(search["best"]) if search["best"] is not None else None
        text = (f"<b>Search</b> {html_text(search['folder'].name)}: {search['done']} of {search['total']} trials "
                f"done, ranked by {html_text(search['metric'])}"
                + (f", {html_text(search['scored'])}" if search.get("scored") else "")
                + (f"; {html_text(search['where'])}" if search.get("where") else ""))
        if best is not None:
            text += (f"; best: trial {best.trial} ({html_text(self._point_label(best.point))}), "
                     f"{html_text(search['metric'])} {abs(best.score):.1f}")
        self.search_info.setText(text)

    @staticmethod
    def _point_label(point: dict[str, Any]) -> str:
        return " ".join(f"{k}={v}" for k, v in point.items())

    def _on_trial(self, ev: TrialFinished) -> None:
        search = self._search
        if search is None:
            return
        search["rows"][ev.trial] = ev
        search["done"] = max(search["done"], ev.trial)
        search["inner"] = 0.0
        search["best"] = self.search_best = ev.best_trial
        t = self.trials_table
        row = t.rowCount()
        t.insertRow(row)
        r1 = (lambda d: f"{d['R@1']:.1f}" if isinstance(d, dict) and d.get("R@1") is not None else "-")
        values = [str(ev.trial)] + [str(ev.point.get(k, "")) for k in search["keys"]]
        if search["metric"] != "rsum":
            values.append(f"{abs(ev.score):.1f}")
        values += [f"{ev.rsum:.1f}" if ev.rsum is not None else "-"]
        if int(search.get("folds") or 1) > 1:
            values.append(f"{ev.sd:.1f}" if ev.sd is not None else "-")
        values += [r1(ev.i2t), r1(ev.t2i), Path(ev.run_dir).name]
        for col, text in enumerate(values):
            item = QTableWidgetItem(text)
            item.setData(Qt.ItemDataRole.UserRole, ev.run_dir)
            if 0 < col < len(values) - 1:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            t.setItem(row, col, item)
        self._highlight_best()
        self._update_search_info(search)
        self.runs_changed.emit()        # the new trial's run folder appears in the owner's runs list

    def _highlight_best(self) -> None:
        """Bold text on a green background for the best trial's row, plain for the others."""
        best = self.search_best
        t = self.trials_table
        for row in range(t.rowCount()):
            is_best = t.item(row, 0) is not None and t.item(row, 0).text() == str(best)
            for col in range(t.columnCount()):
                item = t.item(row, col)
                if item is None:
                    continue
                font = item.font()
                font.setBold(is_best)
                item.setFont(font)
                item.setBackground(QBrush(QColor("#dafbe1")) if is_best else QBrush())
                item.setToolTip("the best trial so far" if is_best else "")

    def best_trial_row(self) -> int | None:
        """The table row of the best trial (``None`` before the first trial finishes)."""
        if self.search_best is None:
            return None
        for row in range(self.trials_table.rowCount()):
            if self.trials_table.item(row, 0).text() == str(self.search_best):
                return row
        return None

    def _open_trial(self, row: int) -> None:
        item = self.trials_table.item(row, 0)
        if item is not None and item.data(Qt.ItemDataRole.UserRole):
            self.open_run.emit(item.data(Qt.ItemDataRole.UserRole))

    # ------------------------------------------------------------------ events
    def _on_event(self, ev: Any) -> None:
        if self._search is not None and isinstance(ev, Progress):
            self._on_search_progress(ev)
        elif isinstance(ev, TrialFinished):
            self._on_trial(ev)
        elif isinstance(ev, TuneResult):
            self.search_result = ev
        else:
            self.run_event.emit(ev)

    def _on_search_progress(self, ev: Progress) -> None:
        """The bar and ETA over the whole search: finished trials plus the running trial's own progress."""
        search = self._search
        total = max(1, search["total"])
        if ev.message != "trials":
            search["inner"] = ev.fraction
        if search["done"] >= search["total"]:
            self.status.emit(1000, f"refitting the best point: {ev.message}" if ev.message != "trials" else
                             "refitting the best point", "")
            return
        frac = min(1.0, (search["done"] + search["inner"]) / total)
        head = f"trial {min(search['done'] + 1, search['total'])}/{search['total']}"
        eta = self._eta.update("search", frac)      # the whole search is one stage (pauses excluded)
        if self._eta.paused:
            text = "Paused"
        elif eta is not None:
            text = f"{head}  {100 * frac:.0f}%  ETA {format_seconds(eta)}"
        else:
            text = f"{head}  {100 * frac:.0f}%"
        self.status.emit(int(1000 * frac), text, "")

    def _on_task_finished(self) -> None:
        task = self.task
        stopped = task is not None and task.stopped
        search, self._search = self._search, None
        self.ended.emit()
        self.update_buttons()
        if search is not None:
            self._on_search_finished(search, stopped)

    def _on_search_finished(self, search: dict[str, Any], stopped: bool) -> None:
        res = self.search_result
        if res is not None:
            best = res.best or {}
            refit = res.refit or {}
            seeds = res.seeds if len(res.seeds) > 1 else []
            where = f"best-s* (mean of seeds {', '.join(map(str, seeds))})" if seeds else "best/"
            rsum = res.refit_rsum if res.refit_rsum is not None else float("nan")
            head = (f"Search finished in {time.monotonic() - self._t0:.1f} s: best trial {best.get('trial')}, "
                    f"{res.metric} {abs(best.get('score', 0)):.1f}")
            sel = res.selection or {}
            chosen = f"chosen on {sel.get('selected_on')}" + (" - OPTIMISTIC: chosen and reported on the same split"
                                                               if sel.get("optimistic") else "")
            tail = f"; refit in {where}: rsum {rsum:.1f} on {refit.get('split')} ({chosen})" if refit else ""
            # the status line stays short enough for a 1280-pixel window; the log and search line have it all
            short = (f"Search done: trial {best.get('trial')} best ({chosen})"
                     + (f"; refit rsum {rsum:.1f} on {refit.get('split')}" if refit else ""))
            self.status.emit(1000, short, head + tail)
            self.message.emit(f"{head} ({self._point_label(best.get('point', {}))}){tail}")
            self.search_info.setText(self.search_info.text() + (
                f"; refit in <b>{html_text(where)}</b>: rsum {rsum:.1f} on {html_text(str(refit.get('split')))} "
                f"({html_text(chosen)})" if refit else ""))
            first = search["folder"] / (f"best-s{seeds[0]}" if seeds else "best")
            if refit and (first / "summary.json").is_file():
                self.run_finished.emit(str(first))    # the app loads the refit (the first seed's), as after Start
            self.search_finished.emit(str(search["folder"]))
        elif stopped:
            self.status.emit(-1, "Search stopped: press Continue search to run the remaining trials", "")
            self.message.emit(f"search stopped after {search['done']} of {search['total']} trials; "
                              "Continue search runs the rest")


if __name__ == "__main__":  # pragma: no cover - manual preview
    import sys

    from PySide6.QtWidgets import QMessageBox, QPlainTextEdit, QProgressBar

    from crossview.core.settings import get_settings
    from crossview.data import load_dataset
    from crossview.gui.app import NO_DISPLAY, ensure_app, exec_app, has_display

    if not has_display():
        print(NO_DISPLAY, file=sys.stderr)
        sys.exit(1)
    app = ensure_app()
    method = sys.argv[2] if len(sys.argv) > 2 else "cca"
    window = QWidget()
    window.setWindowTitle(f"CrossView - SearchView ({method})")
    bar = QProgressBar()
    bar.setRange(0, 1000)
    line = QLabel("Idle")
    log = QPlainTextEdit()
    log.setReadOnly(True)
    view = SearchView(get_settings().runs_dir, lambda: SearchChoices(method, card_fields(method)))
    view.set_dataset(load_dataset(sys.argv[1] if len(sys.argv) > 1 else "demo"))
    view.status.connect(lambda v, text, _tip: (bar.setValue(v) if v >= 0 else None, line.setText(text)))
    view.message.connect(log.appendPlainText)
    view.started.connect(lambda _task, folder, title: log.appendPlainText(f"== {title} -> {folder}"))
    view.failed.connect(lambda message, _details, title: QMessageBox.warning(window, title, message))
    search = QPushButton("Search...")
    search.clicked.connect(lambda: view.open_search_dialog())
    top = QHBoxLayout()
    top.addWidget(search)
    top.addWidget(bar)
    top.addWidget(line, 1)
    layout = QVBoxLayout(window)
    layout.addLayout(top)
    layout.addWidget(view, 3)
    layout.addWidget(log, 1)
    window.resize(900, 600)
    window.show()
    sys.exit(exec_app(app))
