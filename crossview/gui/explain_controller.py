"""The Query panel's *Explain* work, apart from any widget: which pairs are explained, by what, and when.

:class:`ExplainController` owns one :class:`~crossview.explain.Explainer` per opened run (made on first use,
kept while only the gallery changes), the background :class:`~crossview.gui.workers.Task` that explains a
batch of pairs, and the explained pairs kept for reuse (the newest :data:`EXPLAIN_KEEP`). Asking for a set of
pairs (:meth:`ExplainController.request`) starts one task for those not known yet: the pairs in view as one
batch (a sentence query's results in one batched call of the explainer), then, quietly, the ``ahead`` pairs
(the next screenful) in batches of the same size; a newer request supersedes it (it stops after the pair or
backbone pass it is on and its results are dropped), unless the running task already covers the newer pairs.
It reports through signals only (:attr:`~ExplainController.started`, ``progress``, ``pair_explained``,
``done``, ``failed``); what the panel draws from them (overlaid images, shaded words, the note under the
query box) stays in :mod:`crossview.gui.panels.query_panel`, the work itself in
:func:`crossview.gui.explain_view.explain_pairs`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QPixmap

from crossview.core.errors import CrossViewError
from crossview.explain import Explainer
from crossview.gui.explain_view import Explained, Pair, explain_pairs
from crossview.gui.workers import Task

__all__ = ["ExplainController", "EXPLAIN_KEEP", "AHEAD_BATCH", "default_explainer"]

#: explained pairs kept with their overlaid pictures (the oldest go first; the explainer still has their numbers)
EXPLAIN_KEEP = 400
#: the pairs ahead of the view are explained in batches of at most this many (a screenful of results)
AHEAD_BATCH = 24


def default_explainer(retriever: Any) -> Explainer:
    """A :class:`crossview.explain.Explainer` for ``retriever``'s run, on the retriever's device."""
    return Explainer(retriever, device=str(getattr(retriever, "device", "cpu") or "cpu"))


def _same_run(a: Any, b: Any) -> bool:
    """Whether two retrievers rank with the same run (another gallery of it keeps the loaded backbone)."""
    return a is not None and b is not None and a.method is b.method and a.features is b.features and \
        a.dataset is b.dataset


class ExplainController(QObject):
    """Explain pairs (:class:`~crossview.gui.explain_view.Pair`) of one retriever's run off the GUI thread.

    Signals, all on the GUI thread and only for the current (not superseded) task:

    - ``started(int)``: a task started for this many pairs in view (not sent for a task that explains only
      pairs ahead of the view);
    - ``progress(int, int)``: done, total of the pairs in view (during a batched call: the images read, the
      last one when the batch's results are in); the pairs done so far are in :meth:`get` already;
    - ``pair_explained(object)``: one :class:`~crossview.gui.explain_view.Explained` as it is kept;
    - ``done()``: the task explained all its pairs (ask again: more may have come into view meanwhile);
    - ``failed(str)``: the explainer could not be made, or the task failed (a bug in the explainer).

    ``explainer_factory(retriever) -> explainer`` makes the explainer (tests swap it for a fake); anything
    with ``explain(image, text, direction) -> Explanation`` will do.
    """

    started = Signal(int)
    progress = Signal(int, int)
    pair_explained = Signal(object)
    done = Signal()
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None,
                 explainer_factory: Callable[[Any], Any] = default_explainer) -> None:
        super().__init__(parent)
        self.explainer_factory = explainer_factory
        self.explainer: Any = None
        self.retriever: Any = None
        #: explained pairs by :attr:`Pair.key`, oldest first (at most :data:`EXPLAIN_KEEP`)
        self.cache: dict[tuple[Any, ...], Explained] = {}
        self._task: Task | None = None
        self._tasks: set[Task] = set()     # running, superseded ones too: waited for on close
        self._out: list[Explained] = []
        self._used = 0
        self._todo: set[tuple[Any, ...]] = set()
        self._n_view = 0                   # pairs in view of the running task (its first group)
        self._lock = threading.Lock()      # one explanation at a time, across tasks (see explain_pairs)

    # ------------------------------------------------------------------ state
    def set_retriever(self, retriever: Any) -> None:
        """Explain ``retriever``'s pairs from now on. What runs is superseded; the explainer and the kept pairs
        stay when ``retriever`` ranks with the same run (another gallery), else they go."""
        self.cancel()
        if not _same_run(retriever, self.retriever):
            self.explainer = None
            self.cache.clear()
        self.retriever = retriever

    @property
    def busy(self) -> bool:
        """Whether a task (not superseded) is explaining pairs now."""
        return self._task is not None

    def get(self, pair: Pair) -> Explained | None:
        """What is known of ``pair`` (its explanation, or its error), or None when it is not explained yet."""
        return self.cache.get(pair.key)

    def count_known(self, pairs: Iterable[Pair]) -> int:
        """How many of ``pairs`` are explained already."""
        return sum(p.key in self.cache for p in pairs)

    def pixmap(self, pair: Pair) -> QPixmap | None:
        """``pair``'s image with its region map blended over it (made once, on the GUI thread), or None when
        the pair is not explained yet or has no map."""
        got = self.cache.get(pair.key)
        if got is None or got.image is None:
            return None
        if got.pixmap is None:
            got.pixmap = QPixmap.fromImage(got.image)
        return got.pixmap

    # ------------------------------------------------------------------ work
    def request(self, pairs: Sequence[Pair], ahead: Sequence[Pair] = ()) -> bool:
        """Explain the ``pairs`` not known yet (those in view), in order, as one batch in one background task,
        then the ``ahead`` pairs not known yet (the next screenful, explained before the user scrolls to them)
        in batches of at most :data:`AHEAD_BATCH`; True when all ``pairs`` are known.

        When all are known, whatever still runs for pairs no longer wanted is superseded. When the running task
        will get to every missing pair, it goes on. Otherwise a new task replaces it (``started`` when it has
        pairs in view), or, when no explainer can be made for the run, ``failed`` says why."""
        todo = [p for p in pairs if p.key not in self.cache]
        keys = {p.key for p in todo}
        rest = [p for p in ahead if p.key not in self.cache and p.key not in keys]
        rest = list({p.key: p for p in rest}.values())
        if not todo and not rest:
            self.cancel()
            return True
        if self._task is not None and keys <= self._todo and {p.key for p in rest} <= self._todo:
            return not todo
        self._start(todo, rest)
        return not todo

    def _start(self, todo: list[Pair], rest: list[Pair] | None = None) -> None:
        self.cancel()
        if self.explainer is None:
            try:
                self.explainer = self.explainer_factory(self.retriever)
            except (CrossViewError, AttributeError) as e:     # a run object without method / features / dataset
                self.failed.emit(str(e))
                return
        rest = list(rest or [])
        groups = ([len(todo)] if todo else []) + [min(AHEAD_BATCH, len(rest) - a)
                                                  for a in range(0, len(rest), AHEAD_BATCH)]
        every = todo + rest
        explainer, lock, out = self.explainer, self._lock, []
        task = Task(lambda progress, should_stop: explain_pairs(explainer, every, lock, out, progress, should_stop,
                                                                groups),
                    name="explain", parent=self)
        self._task, self._out, self._used = task, out, 0
        self._todo = {p.key for p in every}
        self._n_view = len(todo)
        self._tasks.add(task)
        # bound slots that ask sender() which task spoke, not lambdas holding the task: those made a reference
        # cycle, and collecting it while the task's queued ``finished`` was pending crashed PySide
        task.progress.connect(self._on_progress)
        task.succeeded.connect(self._on_done)
        task.failed.connect(self._on_failed)
        task.finished.connect(self._on_finished)
        if todo:
            self.started.emit(len(todo))
        task.start()

    def cancel(self) -> None:
        """Supersede the running task: it stops after its current pair (or backbone pass) and its results are
        dropped."""
        if self._task is not None:
            self._task.cancel()
        self._task = None
        self._todo = set()
        self._n_view = 0

    def stop(self, msecs: int = 5000) -> None:
        """Cancel every task in flight, superseded ones too, and wait for their threads (closing)."""
        self.cancel()
        for t in list(self._tasks):
            if t.is_running():
                t.cancel()
                t.wait(msecs)

    def _take_results(self) -> None:
        out = self._out
        while self._used < len(out):        # the worker appends; the GUI thread reads
            got = out[self._used]
            self._used += 1
            self.cache[got.pair.key] = got
            self._todo.discard(got.pair.key)
            self.pair_explained.emit(got)
        while len(self.cache) > EXPLAIN_KEEP:
            del self.cache[next(iter(self.cache))]

    def _on_progress(self, done: int, total: int) -> None:
        if self.sender() is not self._task:
            return                                   # superseded: dropped
        self._take_results()
        if done <= self._n_view and self._n_view:    # the pairs in view; those ahead go quietly
            self.progress.emit(done, self._n_view)

    def _on_done(self, _result: object) -> None:
        if self.sender() is not self._task:
            return
        self._take_results()
        self._task = None
        self._todo = set()
        self.done.emit()

    def _on_failed(self, message: str, _details: str) -> None:
        if self.sender() is not self._task:
            return
        self._task = None
        self._todo = set()
        self.failed.emit(message)

    def _on_finished(self) -> None:
        task = self.sender()
        self._tasks.discard(task)
        task.deleteLater()
