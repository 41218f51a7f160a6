"""Cross-validation of a finished run's training images by ordinary runs: the run's method trained again, with the
run's own settings, on each fold's other training images, and evaluated on the fold's images it has not seen.

Two choices are made this way, never on the evaluation split and never on images the model was fitted on: a fused
run's weights (:mod:`crossview.engine.fuse`, ``--weights auto``) and a run's hubness-aware scoring parameter
(:mod:`crossview.engine.scoring`, ``--select cv``). Each fold run is a run folder like any other (resumable: a choice
that stopped continues its fold runs, a finished one is read back), under the folder of whatever made the choice.

A fold run trains on the derived split ``cv-train`` and is evaluated on ``cv-test`` (the fold); it writes
``embeddings_cv-test.npz`` (the held-out fold through the fold's model) and ``bank_cv-train.npz`` (its own
training images), which is all a choice needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.events import Event, Log, Progress

__all__ = ["FOLD_TRAIN", "FOLD_TEST", "check_retrainable", "load_run_dataset", "run_folds", "iter_fold_run",
           "FoldRun"]

#: the derived splits a fold run trains on and is evaluated on
FOLD_TRAIN, FOLD_TEST = "cv-train", "cv-test"


def check_retrainable(config: dict[str, Any], name: str, instead: str) -> None:
    """That the run of ``config`` (its config.json; ``name``: what to call it) can be trained again on folds of its
    training images; one clear line otherwise, ending with ``instead`` (what the user can do instead)."""
    if config.get("method") == "fused":
        raise CrossViewError(f"{name} is a fused run, which cannot be trained again on training folds; {instead}")
    if not config.get("data"):
        raise CrossViewError(f"{name} was trained on an in-memory dataset, so it cannot be trained again on training "
                             f"folds; {instead}")


def load_run_dataset(config: dict[str, Any]) -> Any:
    """The dataset a run was trained on, as it was (its text view and derived splits applied)."""
    from crossview.engine.run import _load
    from crossview.engine.splits import apply_derived_splits

    ds, _ = _load(config["data"], config.get("data_format"), config.get("image_root"))
    if config.get("text_view") is not None and ds.meta.get("text_view") is None:
        from crossview.data.views import apply_text_view
        ds = apply_text_view(ds, config["text_view"])
    return apply_derived_splits(ds, config.get("derived_splits"))


def run_folds(ds: Any, config: dict[str, Any], folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``(train, test)`` image folds of the run's training split (:func:`crossview.engine.splits.fold_splits`:
    by image, so an image's captions stay together; the same ``seed`` gives the same folds)."""
    from crossview.engine.splits import fold_splits

    train_split = str(config.get("train_split") or "train")
    if train_split not in ds.splits:
        raise CrossViewError(f"the dataset has no {train_split!r} split to cross-validate")
    return fold_splits(np.asarray(ds.splits[train_split], np.int64), folds, seed)


class FoldRun:
    """A finished fold run: its folder, the held-out fold's embeddings (``emb``) and its training bank (``bank``)."""

    def __init__(self, run_dir: Path) -> None:
        from crossview.eval.embeddings import load_embeddings

        self.run_dir = Path(run_dir)
        emb_path = self.run_dir / f"embeddings_{FOLD_TEST}.npz"
        bank_path = self.run_dir / f"bank_{FOLD_TRAIN}.npz"
        if not emb_path.is_file() or not bank_path.is_file():
            raise CrossViewError(f"{self.run_dir}: the fold run ended without its embeddings; delete that folder and "
                                 "choose again")
        self.emb = load_embeddings(emb_path)
        self.bank = load_embeddings(bank_path)


def iter_fold_run(config: dict[str, Any], ds: Any, run_dir: Path, train_images: np.ndarray,
                  test_images: np.ndarray, where: str) -> Iterator[Event]:
    """Get one fold run done (:func:`crossview.engine.runs.ensure_run`: started, resumed or read back): the method
    of ``config`` with its own parameters and settings, trained on ``train_images`` and evaluated on
    ``test_images`` (training images of ``ds`` both). Yields its progress as ``"cv run"`` :class:`Progress` and its
    :class:`Log` lines, each prefixed with ``where``; returns the :class:`FoldRun`."""
    from crossview.engine.runs import ensure_run

    cfg = config
    # the run's own parameters, every default resolved as it trained (not today's defaults)
    params = cfg.get("params") if isinstance(cfg.get("params"), dict) else cfg.get("user_params") or {}
    derived = {FOLD_TRAIN: np.asarray(train_images).tolist(), FOLD_TEST: np.asarray(test_images).tolist()}

    def start() -> Any:
        import crossview.engine.run as run_mod      # looked up at call time (tests spy on the engine's train)

        return run_mod.train(str(cfg["method"]), ds, run_dir=run_dir, params=dict(params), split=FOLD_TEST,
                             train_split=FOLD_TRAIN, val_split=cfg.get("val_split"),
                             image_encoder=cfg.get("image_encoder"), text_encoder=cfg.get("text_encoder"),
                             device=str(cfg.get("device") or "auto"), seed=int(cfg.get("seed") or 0),
                             derived_splits=derived, representation=cfg.get("representation"),
                             image_norm=cfg.get("image_norm"), text_norm=cfg.get("text_norm"))

    _, it = ensure_run(run_dir, start, data=ds)
    if it is not None:
        try:
            for ev in it:
                if isinstance(ev, Progress):
                    # "cv run": the fold run's own stages, inside the caller's "cv" stage
                    yield Progress(ev.step, ev.total, f"{where}: {ev.message}".rstrip(": "), stage="cv run")
                elif isinstance(ev, Log):
                    yield Log(f"{where}: {ev.message}", ev.level)
        finally:
            it.close()       # a fold run stopped here checkpoints and resumes with the choice
    return FoldRun(run_dir)
