"""Fair comparisons: one training budget for every variant, and each variant's own loss setting chosen apart from
where the comparison is reported.

A :class:`Budget` is what every loss of a comparison gets: the same number of epochs, batches of the same number of
captions (so the same number of optimiser steps an epoch) and the same learning-rate schedule shape (divided by 10
at the same fraction of the epochs). Methods that batch captions (``vsepp``) take ``batch`` captions; methods that
batch images with all their captions (``smoothap``: ``group_by_image``) take ``batch / captions per image`` images,
the same captions a step. ``--budget 20x128`` is 20 epochs of 128-caption batches; ``--budget 20x128@0.5`` moves the
decay to half-way.

:func:`choose_params` picks each variant's own temperature or margin (its ``grid``) by the rule of
:mod:`crossview.engine.tune`: scored by cross-validation of the training images (or val, when the comparison is
reported on test), never on the split the comparison reports; every trial is an ordinary run in the experiment
folder, so a second call reads them back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossview.core.errors import CrossViewError
from crossview.core.events import Event, Log, Progress

__all__ = ["Budget", "parse_budget", "choose_params", "DEFAULT_DECAY_AT"]

#: the fraction of the epochs after which the learning rate is divided by 10 (vsepp's 7 of 10, smoothap's 70 of 100)
DEFAULT_DECAY_AT = 0.7


@dataclass(frozen=True)
class Budget:
    """``epochs`` passes over the training captions in batches of ``batch`` captions, the learning rate / 10
    after ``decay_at`` of them."""

    epochs: int
    batch: int
    decay_at: float = DEFAULT_DECAY_AT

    def __str__(self) -> str:
        return f"{self.epochs}x{self.batch}@{self.decay_at:g}"

    def describe(self) -> str:
        return (f"{self.epochs} epochs of {self.batch}-caption batches, the learning rate / 10 after epoch "
                f"{self.decay_epoch}")

    @property
    def decay_epoch(self) -> int:
        return max(1, int(round(self.decay_at * self.epochs)))

    def params_for(self, method: str, captions_per_image: float) -> dict[str, Any]:
        """The parameters that give ``method`` this budget (``max_epochs``, ``batch_size``, ``lr_decay_epoch``):
        images per batch for a method that batches images with all their captions."""
        from crossview.methods import method_class

        cls = method_class(method)
        names = cls.param_names()
        missing = [k for k in ("max_epochs", "batch_size", "lr_decay_epoch") if k not in names]
        if missing:
            raise CrossViewError(f"--budget: method {method} has no {', '.join(missing)}; a budget is for methods "
                                 "trained in epochs of batches")
        per_step = self.batch
        if getattr(cls, "group_by_image", False):
            per_step = max(2, int(round(self.batch / max(captions_per_image, 1.0))))
        return {"max_epochs": int(self.epochs), "batch_size": int(per_step), "lr_decay_epoch": self.decay_epoch}

    def steps(self, method: str, n_images: int, n_captions: int) -> int:
        """Optimiser steps of ``method`` under this budget on a training split of that size (one process)."""
        params = self.params_for(method, n_captions / max(n_images, 1))
        from crossview.methods import method_class

        units = n_images if getattr(method_class(method), "group_by_image", False) else n_captions
        return int(self.epochs) * math.ceil(units / params["batch_size"])

    def record(self) -> dict[str, Any]:
        return {"epochs": int(self.epochs), "batch": int(self.batch), "decay_at": float(self.decay_at),
                "text": str(self)}


#: the most epochs and captions a step a budget may give: the deep methods' cards cap max_epochs and batch_size so
MAX_EPOCHS = 10_000
MAX_BATCH = 65_536


def parse_budget(text: str | Budget | None) -> Budget | None:
    """``"20x128"`` / ``"20x128@0.5"`` / ``"epochs=20,batch=128,decay=0.5"`` -> :class:`Budget`; ``None`` or
    ``""`` -> ``None`` (each method's own defaults)."""
    if text is None or isinstance(text, Budget):
        return text
    s = str(text).strip().lower()
    if not s or s == "defaults":
        return None
    m = re.fullmatch(r"(\d+)\s*x\s*(\d+)(?:\s*@\s*([0-9.]+))?", s)
    if m:
        epochs, batch, decay = int(m.group(1)), int(m.group(2)), float(m.group(3) or DEFAULT_DECAY_AT)
    else:
        fields: dict[str, str] = {}
        for item in s.split(","):
            key, eq, value = item.partition("=")
            if not eq or key.strip() not in ("epochs", "batch", "decay"):
                raise CrossViewError(f"--budget {text!r}: write EPOCHSxBATCH[@DECAY] (e.g. 20x128, 20x128@0.5) or "
                                     "epochs=E,batch=B[,decay=F]; 'defaults' keeps each method's own")
            fields[key.strip()] = value.strip()
        try:
            epochs, batch = int(fields["epochs"]), int(fields["batch"])
            decay = float(fields.get("decay", DEFAULT_DECAY_AT))
        except (KeyError, ValueError):
            raise CrossViewError(f"--budget {text!r}: give whole numbers for epochs and batch (e.g. "
                                 "epochs=20,batch=128)") from None
    if not 1 <= epochs <= MAX_EPOCHS or not 2 <= batch <= MAX_BATCH or not 0 < decay <= 1:
        raise CrossViewError(f"--budget {text!r}: epochs must be from 1 to {MAX_EPOCHS:,}, batch from 2 to "
                             f"{MAX_BATCH:,} captions and the decay point in (0, 1]")
    return Budget(epochs, batch, decay)


def choose_params(method: str, dataset: Any, grid: dict[str, list[Any]], params: dict[str, Any], *,
                  reported_on: str, out: Path, label: str, device: str = "auto", seed: int = 0,
                  image_encoder: str | None = None, text_encoder: str | None = None,
                  folds: int | None = None) -> Iterator[Event | dict[str, Any]]:
    """Choose ``grid``'s values for ``method`` with ``params`` fixed, never on ``reported_on``
    (:func:`crossview.engine.tune.tune` with ``refit=False``: val when the comparison reports on another split,
    else ``folds``-fold cross-validation of the training images). Yields the search's progress under ``label``
    and, last, ``{"point", "score", "sd", "selected_on", "folder", "trials"}``."""
    from crossview.engine.tune import TuneResult, tune

    result = None
    for ev in tune(method, dataset, grid, params=params, out=out, select_on="auto", folds=folds,
                   reported_on=reported_on, refit=False, device=device, seed=seed, image_encoder=image_encoder,
                   text_encoder=text_encoder):
        if isinstance(ev, TuneResult):
            result = ev
        elif isinstance(ev, Progress):
            yield Progress(ev.step, ev.total, f"{label}: {ev.message}")
        elif isinstance(ev, Log) and (ev.level in ("warning", "error") or ev.message.startswith("trial")):
            yield Log(f"{label}: {ev.message}", ev.level)
    if result is None or result.best is None:
        raise CrossViewError(f"{label}: the search in {out} ended without a result; run the experiment again")
    best = result.best
    yield {"point": dict(best["point"]), "score": float(best["score"]), "sd": best.get("sd"),
           "selected_on": result.selection.get("selected_on"), "folder": str(out),
           "trials": [{"point": r["point"], "score": r["score"], "sd": r.get("sd")} for r in result.trials]}
