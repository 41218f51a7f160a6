"""Progress events: what a method's ``fit_iter`` and the engine's ``train`` yield.

Plain dataclasses (no Qt): the GUI's worker turns them into queued signals, the CLI into a progress
bar, and the engine appends each one as a JSON line to the run's ``metrics.jsonl``.

Every event has ``to_dict()`` (``{"event": "<kind>", ...fields}``, JSON-serialisable) and
:func:`event_from_dict` turns such a dict back into the event.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from collections.abc import Callable, Generator
from typing import Any, ClassVar, TypeVar

__all__ = ["relay", "Event", "Progress", "Plan", "Loss", "Validation", "Phase", "CheckpointSaved", "Log", "Finished",
           "TrialFinished", "event_from_dict", "EVENT_TYPES"]


def _jsonable(x: Any) -> Any:
    """numpy scalars / arrays and non-finite floats made JSON-safe (NaN/inf become None)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # numpy scalar / array, 0-d tensor
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


@dataclass
class Event:
    """Base of all events. ``kind`` is the ``"event"`` value in ``metrics.jsonl``."""

    kind: ClassVar[str] = "event"

    def to_dict(self) -> dict[str, Any]:
        """``{"event": kind, **fields}``, with numpy values converted for JSON."""
        return {"event": self.kind, **_jsonable(asdict(self))}


@dataclass
class Progress(Event):
    """``step`` of ``total`` units of work done (batches, cutting-plane iterations, epochs ...).

    ``total`` may be 0 when unknown. ``message`` says what is being done (``"epoch 3/20"``).
    """

    step: int
    total: int
    message: str = ""
    #: the :class:`Plan` stage this work belongs to (``"images"``, ``"fit"`` ...); empty: none named
    stage: str = ""
    kind: ClassVar[str] = "progress"

    @property
    def fraction(self) -> float:
        """``step / total`` clipped to [0, 1] (0 when the total is unknown)."""
        return min(1.0, max(0.0, self.step / self.total)) if self.total else 0.0


@dataclass
class Plan(Event):
    """The stages a run will go through, in order, said before the first one starts: ``[{"name": "images",
    "label": "image features (mobilenet_v2)", "seconds": 21.0}, ...]``, each with the seconds it is expected to
    take on this machine (:mod:`crossview.engine.timings`). :class:`Progress` events name their stage, so a
    front end shows progress and an ETA over the whole run (:class:`crossview.core.progress.RunEta`)."""

    stages: list[dict[str, Any]] = field(default_factory=list)
    kind: ClassVar[str] = "plan"


@dataclass
class Loss(Event):
    """Training loss terms at a step, e.g. ``{"loss": 0.31}`` or ``{"primal": 2.1, "gap": 0.03}``."""

    step: int
    epoch: int
    terms: dict[str, float] = field(default_factory=dict)
    kind: ClassVar[str] = "loss"


@dataclass
class Validation(Event):
    """Validation metrics after an epoch / iteration (the keys of :func:`crossview.eval.metrics.evaluate`
    or method-specific ones such as ``{"error": 0.12}``)."""

    epoch: int
    metrics: dict[str, Any] = field(default_factory=dict)
    kind: ClassVar[str] = "validation"


@dataclass
class Phase(Event):
    """A stage of training begins (webly's Stage II on the web set, a language model unfrozen ...): the curves
    draw a marker at ``step`` (loss plots) and after epoch ``epoch`` (validation plots), labelled ``name``."""

    step: int
    epoch: int
    name: str
    kind: ClassVar[str] = "phase"


@dataclass
class CheckpointSaved(Event):
    """A checkpoint was written (atomically) to ``path`` at ``step``."""

    path: str
    step: int
    kind: ClassVar[str] = "checkpoint"


@dataclass
class Log(Event):
    """A message for the user; ``level`` is ``"debug"``, ``"info"``, ``"warning"`` or ``"error"``."""

    message: str
    level: str = "info"
    kind: ClassVar[str] = "log"


@dataclass
class Finished(Event):
    """The run ended; ``summary`` is the content of ``summary.json`` (with ``"status"``)."""

    summary: dict[str, Any] = field(default_factory=dict)
    kind: ClassVar[str] = "finished"


@dataclass
class TrialFinished(Event):
    """One trial of a validation search (:func:`crossview.engine.tune.tune`) is scored: trial ``trial`` of
    ``total`` at ``point`` (``{param: value}``), its ``score`` by ``metric`` (higher is better: MedR / MeanR
    negated), the run's ``rsum`` and ``i2t`` / ``t2i`` metrics, its ``run_dir``, and ``best_trial``, the
    number of the best trial so far. Under cross-validation the numbers are means over the folds, ``sd`` their
    spread and ``run_dir`` the first fold's run; ``selected_on`` names the images the trials are scored on
    (``train-cv3``, ``train-holdout20``, ``val``)."""

    trial: int
    total: int
    point: dict[str, Any] = field(default_factory=dict)
    metric: str = "rsum"
    score: float = 0.0
    rsum: float | None = None
    i2t: dict[str, Any] = field(default_factory=dict)
    t2i: dict[str, Any] = field(default_factory=dict)
    run_dir: str = ""
    best_trial: int = 0
    sd: float | None = None
    selected_on: str = ""
    kind: ClassVar[str] = "trial"


EVENT_TYPES: dict[str, type[Event]] = {cls.kind: cls for cls in
                                       (Progress, Plan, Loss, Validation, Phase, CheckpointSaved, Log, Finished,
                                        TrialFinished)}


def event_from_dict(d: dict[str, Any]) -> Event:
    """The event a ``to_dict()`` (one line of ``metrics.jsonl``) describes; extra keys such as
    ``"time"`` are ignored. Raises ``ValueError`` for an unknown ``"event"`` kind."""
    kind = d.get("event")
    if kind not in EVENT_TYPES:
        raise ValueError(f"unknown event kind {kind!r} (known: {', '.join(EVENT_TYPES)})")
    cls = EVENT_TYPES[kind]
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


_T = TypeVar("_T")
_E = TypeVar("_E")


def relay(work: Generator[tuple[int, int], Any, _T], event: Callable[[int, int], _E]) -> Generator[_E, None, _T]:
    """Yield ``event(done, total)`` for each report of ``work`` (a generator of ``(done, total)`` that *returns*
    its result, as the encoders' and the scorings' ``iter_*``) and return that result: ``x = yield from relay(work,
    lambda d, t: Progress(d, t, label))``. (:func:`crossview.core.progress.drive` is its callback twin.)"""
    while True:
        try:
            done, total = next(work)
        except StopIteration as end:
            return end.value
        yield event(done, total)
