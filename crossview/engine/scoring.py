"""A run's hubness-aware scoring (:mod:`crossview.eval.scoring`): its bank of training embeddings, the choice of
the scoring's parameter on a hold-out of train, and the evaluation of the run under a scoring.

The bank is the run's *training* split, encoded by the run's own model: at most :data:`BANK_MAX_IMAGES` training
images (a sample seeded by the run's seed) and all their captions. A run writes it at its evaluation as
``bank_<train split>.npz`` (an embeddings file, :mod:`crossview.eval.embeddings`), so that ``crossview eval RUN
--scoring csls`` needs neither the model nor the dataset; for a run written before that, :func:`run_bank` opens
the run and encodes its training split. A run evaluated on its own training split has no bank apart from the
evaluation split and is refused.

:func:`evaluate_run` scores the run's evaluation embeddings under a scoring and records the choice in the run
folder's ``scoring.json`` (``{"<split>": {"<scoring>": {...the selection record, "rsum", "hubness"}}}``): the
parameter is chosen on a hold-out of train (``selected_on``), the metrics reported on the evaluation split
(``reported_on``).

**How the parameter is chosen** (``select``, :data:`SELECTIONS`). The run's model was fitted on its training
images, so a hold-out of its own bank scores every candidate near the ceiling (rsum ~595 of 600 on the Flickr8k
sample): that quick choice (``"bank"``) is labelled in-sample. ``"cv"`` chooses honestly, the way a fused run
chooses its weights (:mod:`crossview.engine.cv_runs`): :data:`CV_FOLDS`-fold cross-validation of the training
images, the run's method trained again with its own settings on each fold's other images (ordinary resumable runs
under ``RUN/scoring-cv/``, shared by every scoring and reused on the next call), each fold scored against a bank of
those other images' embeddings, the mean rsum over the folds deciding (``selected_on: "train-cv3"``, the per-fold
table in the record). ``"auto"`` (the default) is ``cv`` where it is cheap, ``bank`` (with one line saying so)
where it is not: it costs about ``CV_FOLDS x 2/3`` of the run's own training time, seconds for CCA, BITR and
WSABIE but hours for a deep run, which ``crossview eval`` should not start unasked; and a fused run or a run
trained on an in-memory dataset cannot be trained again.

**A run's own scoring.** Each run ranks and is evaluated under one scoring, recorded in its config.json (``"scoring":
{"scoring", "param_name", "param", "selected_on"}``, :func:`resolve_run_scoring`; a run written before is plain,
:func:`run_scoring`). ``crossview train`` and the app's Train panel ask for the method's default
(:data:`DEFAULT_SCORINGS`, its parameter fixed by cross-validation on the Flickr8k sample's train photos, like any
default hyperparameter); :class:`~crossview.engine.fit_stage.FitStage` then scores the evaluation embeddings against
the bank it has just written (:func:`score_run_evaluation`), and the summary's metrics, intervals, hubness and
ranks.npz are under that scoring, the plain ones kept (:func:`scored_summary`: ``metrics_plain``; ranks.npz's
``i2t_plain`` / ``t2i_plain``). A scoring named without its parameter is chosen after training (a hold-out of the
bank in the run; ``crossview train --select cv`` then makes the cross-validated choice the run's own,
:func:`adopt_run_scoring`). ``crossview eval`` / ``query`` / ``serve`` and the Query panel default to it.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.events import Event, Log, Progress, relay
from crossview.core.progress import drive
from crossview.eval.scoring import (DEFAULT_BLOCK, PARAMS, check_scoring, iter_evaluate_scoring, scorers_for,
                                    select_scoring)

__all__ = ["BANK_MAX_IMAGES", "SCORING_FILE", "SELECTIONS", "CV_FOLDS", "CV_DIR", "AUTO_CV_SECONDS", "bank_path",
           "encode_bank", "write_bank", "run_bank", "open_bank", "choose_scoring", "check_select", "resolve_select",
           "iter_select_cv", "recorded_choice", "iter_run_choice", "iter_evaluate_run", "evaluate_run", "run_scorers",
           "retriever_scoring", "apply_scoring", "DEFAULT_SCORINGS", "DEFAULT_EVIDENCE", "PLAIN_RECORD",
           "default_scoring", "resolve_run_scoring", "run_scoring", "describe_run_scoring", "pending_scoring",
           "score_run_evaluation", "scored_summary", "adopt_run_scoring", "write_scored_ranks", "use_run_scoring"]

#: Each method's default scoring, the one a run trains with when it is not told (``crossview train METHOD`` with no
#: --scoring, the app's Train panel): ``(scoring, its parameter)``, chosen like any other default hyperparameter by
#: 3-fold cross-validation on the Flickr8k sample's train photos, never on its val split; a method not here is
#: plain. The parameter is fixed, so a default run costs one re-scoring against its bank and no choice. Each entry
#: cites its evidence file (``DEFAULT_EVIDENCE``). ``"fused"`` is the fused runs' (crossview.engine.fuse), applied to
#: the fused embeddings with the fused bank.
DEFAULT_SCORINGS: dict[str, tuple[str, float]] = {
    # rule: csls with its CV-chosen k, unless another scoring beats csls on the folds with an interval above 0;
    # CV gains over plain (pooled folds, 95% interval) from bench/results/quality_flickr8k.md
    "cca": ("isoftmax", 10),      # +26.6 (+20.3 to +33.1); over csls 5 (+22.5): +4.2 (+0.7 to +7.9), better
    "bitr": ("csls", 10),         # +28.7 (+22.6 to +34.6); isoftmax +1.3 over csls (-2.0 to +4.6): not better
    "vsepp": ("csls", 20),        # +13.0 (+8.3 to +17.7)
    "wsabie": ("csls", 5),        # +26.1 (+19.3 to +32.2); isoftmax +2.0 over csls (-2.6 to +6.4): not better
    "webly": ("csls", 20),        # +16.1 (+11.1 to +21.3)
    "smoothap": ("csls", 20),     # +14.2 (+9.4 to +19.0); isoftmax +2.0 over csls (-1.6 to +5.7): not better
    "timam": ("csls", 5),         # +11.4 (+6.6 to +15.9); isoftmax +2.2 over csls (-1.6 to +5.8): not better (with
                                  # the former Bi-LSTM text side isoftmax 10 was, +4.0, +0.3 to +7.8)
    "fused": ("csls", 10),        # +23.2 (+17.6 to +28.5) over the fused run's plain scores (cca + bitr + smoothap)
}
#: the file that measured each default of :data:`DEFAULT_SCORINGS`
DEFAULT_EVIDENCE: dict[str, str] = {name: "bench/results/quality_flickr8k.md" for name in DEFAULT_SCORINGS}
#: the record of plain scoring (a run written before runs recorded a scoring is plain)
PLAIN_RECORD: dict[str, Any] = {"scoring": "plain", "param_name": None, "param": None, "selected_on": "nothing"}
#: ``selected_on`` of a scoring whose parameter a run chooses after training (``--scoring csls`` with no --param)
PENDING = "after training"

#: the most training images a bank holds (QB-Norm's banks are a few thousand queries; the statistics settle)
BANK_MAX_IMAGES = 5000
#: where a run records its scorings' choices and results
SCORING_FILE = "scoring.json"
#: how a scoring's parameter is chosen when it is not given (module docstring)
SELECTIONS = {
    "auto": "cv where the run can be trained again cheaply (its fold runs done already, or estimated at most "
            "AUTO_CV_SECONDS from its own training time), else bank",
    "cv": "3-fold cross-validation of the training images: the run's method trained again on each fold's other "
          "images, the fold scored against their bank",
    "bank": "a hold-out of the run's own training bank, no training: quick, but in-sample (the model was fitted on "
            "those images)",
}
#: folds of the training images ``cv`` uses
CV_FOLDS = 3
#: where a run keeps its cross-validation fold runs
CV_DIR = "scoring-cv"
#: ``auto`` cross-validates when the fold runs are estimated to take at most this many seconds
AUTO_CV_SECONDS = 300.0


def bank_path(run_dir: str | Path, train_split: str) -> Path:
    return Path(run_dir) / f"bank_{train_split}.npz"


def encode_bank(method: Any, train: Any, seed: int = 0, max_images: int = BANK_MAX_IMAGES) -> Any:
    """The bank: :class:`~crossview.eval.embeddings.Embeddings` of ``train`` (the training split's
    :class:`~crossview.data.method_data.MethodData`) through the fitted ``method``, both directions' models when
    they differ; at most ``max_images`` images (a sample seeded by ``seed``) with all their captions."""
    from crossview.eval.embeddings import Embeddings

    if train.n_images > max_images:
        keep = np.sort(np.random.default_rng(seed).choice(train.n_images, max_images, replace=False))
        train = train.subset(keep, name=train.name)
    two = getattr(method, "directions_differ", False)
    return Embeddings(
        image=np.asarray(method.encode_images(train, direction="i2t"), np.float32),
        text=np.asarray(method.encode_texts(train, direction="i2t"), np.float32),
        caption_image=np.asarray(train.caption_image, np.int64),
        image_t2i=np.asarray(method.encode_images(train, direction="t2i"), np.float32) if two else None,
        text_t2i=np.asarray(method.encode_texts(train, direction="t2i"), np.float32) if two else None)


def write_bank(run_dir: str | Path, train_split: str, method: Any, train: Any, seed: int = 0) -> Path:
    """Encode the bank (:func:`encode_bank`) and write it into the run folder (atomically)."""
    from crossview.eval.embeddings import save_embeddings

    emb = encode_bank(method, train, seed)
    emb.info = {"split": train_split, "what": "bank"}
    return save_embeddings(bank_path(run_dir, train_split), emb)


def _train_split(run_dir: Path) -> tuple[str, str, int]:
    """``(train split, evaluation split, seed)`` of a run folder (config.json)."""
    from crossview.engine.run_folder import read_config

    cfg = read_config(run_dir)
    return str(cfg.get("train_split") or "train"), str(cfg.get("split") or "test"), int(cfg.get("seed") or 0)


def run_bank(run_dir: str | Path, open_run: Any = None) -> Any:
    """The bank of the run in ``run_dir``: its ``bank_<train>.npz``, or (a run written before banks, or one whose model
    reads image files) its training split encoded by its model now and kept in that file (``open_run``: an
    :class:`~crossview.engine.session.OpenRun` already open, else the run is opened)."""
    from crossview.eval.embeddings import load_embeddings

    folder = Path(run_dir)
    train_split, _, seed = _train_split(folder)
    path = bank_path(folder, train_split)
    if path.is_file():
        return load_embeddings(path)
    if open_run is None:
        from crossview.engine.session import open_run as _open

        try:
            open_run = _open(folder)
        except CrossViewError as e:
            raise CrossViewError(f"{folder}: no {path.name} (the run predates scoring banks) and the run cannot be "
                                 f"opened to encode its {train_split} split ({e}); use --scoring plain") from None
    bank = open_bank(open_run, train_split, seed)
    try:                  # kept for the next use (an end-to-end run's bank is made on first use, see FitStage)
        from crossview.eval.embeddings import save_embeddings

        bank.info = {"split": train_split, "what": "bank"}
        save_embeddings(path, bank)
    except (OSError, CrossViewError) as e:
        import warnings
        warnings.warn(f"{path}: could not keep the scoring bank ({e}); it is made again next time", stacklevel=2)
    return bank


def open_bank(run: Any, train_split: str | None = None, seed: int | None = None) -> Any:
    """The bank of an open run (:class:`~crossview.engine.session.OpenRun`): its training split encoded now."""
    from crossview.data.method_data import MethodData

    train_split = train_split or str(run.config.get("train_split") or "train")
    seed = int(run.config.get("seed") or 0) if seed is None else seed
    ds, f = run.dataset, run.features
    if train_split not in ds.splits:
        raise CrossViewError(f"{run.run_dir}: the dataset has no {train_split!r} split to draw the scoring bank "
                             "from; use --scoring plain")
    files = bool(getattr(run.method, "wants_image_files", False)) and getattr(ds, "image_paths", None) is not None
    train = MethodData.from_features(ds, f.image, f.text, train_split, with_paths=files)
    return encode_bank(run.method, train, seed)


def choose_scoring(bank: Any, scoring: str, param: float | None = None, seed: int = 0,
                   train_split: str = "train") -> dict[str, Any]:
    """The record of ``scoring``'s parameter: ``param`` as given (``selected_on: "given"``), or chosen on a
    hold-out of the bank (:func:`crossview.eval.scoring.select_scoring`)."""
    scoring = check_scoring(scoring)
    if param is not None and PARAMS[scoring] is not None:
        from crossview.eval.scoring import Scorer

        p = Scorer(scoring, param, bank.image[:1], bank.text[:1]).param     # checked as the scorer checks it
        return {"scoring": scoring, "param_name": PARAMS[scoring], "param": p, "selected_on": "given",
                "candidates": []}
    return select_scoring(bank, scoring, seed=seed, bank_name=train_split)


def run_scorers(bank: Any, record: dict[str, Any], block_size: int = DEFAULT_BLOCK) -> dict[str, Any]:
    """The ``{"i2t", "t2i"}`` scorers of a choice ``record`` (:func:`choose_scoring`) over ``bank``."""
    return scorers_for(record["scoring"], record["param"], bank, block_size)


def check_select(select: Any) -> str:
    """``select`` if it is one of :data:`SELECTIONS`, else one clear :class:`CrossViewError`."""
    if not isinstance(select, str) or select not in SELECTIONS:
        raise CrossViewError(f"unknown --select {select!r}; choose one of {', '.join(SELECTIONS)}")
    return select


def _cv_runs_done(folder: Path, folds: int) -> bool:
    from crossview.engine.runs import run_finished

    return all(run_finished(folder / CV_DIR / f"f{f + 1}") for f in range(folds))


def resolve_select(run_dir: str | Path, select: str = "auto", folds: int = CV_FOLDS) -> tuple[str, str]:
    """``("cv" | "bank", note)`` for the run in ``run_dir``: ``select`` itself unless it is ``"auto"`` (module
    docstring); ``note`` says why ``auto`` chose ``bank`` (``""`` otherwise). ``"cv"`` for a run that cannot be
    trained again (a fused run, an in-memory dataset, a folder that is not writable) is one clear line."""
    import os

    from crossview.engine.cv_runs import check_retrainable
    from crossview.engine.run_folder import read_config

    select = check_select(select)
    if select == "bank":
        return "bank", ""
    folder = Path(run_dir)
    config = read_config(folder)
    try:
        check_retrainable(config, folder.name, "use --select bank (a hold-out of its training bank, in-sample)")
        if not os.access(folder, os.W_OK):
            raise CrossViewError(f"{folder} is not writable, so its cross-validation runs cannot be kept there; use "
                                 "--select bank (a hold-out of its training bank, in-sample) or copy the run folder")
    except CrossViewError as e:
        if select == "cv":
            raise
        return "bank", f"scoring parameter chosen in-sample (--select bank): {e}".split("; use --select")[0]
    if select == "cv" or _cv_runs_done(folder, folds):
        return "cv", ""
    from crossview.engine.run_folder import read_summary

    try:
        seconds = float(read_summary(folder).get("train_seconds") or 0.0)
    except (CrossViewError, OSError, TypeError, ValueError):
        seconds = float("inf")
    estimate = seconds * folds * (folds - 1) / folds
    if estimate <= AUTO_CV_SECONDS:
        return "cv", ""
    return "bank", (f"scoring parameter chosen in-sample on a hold-out of the training bank (--select bank): the "
                    f"cross-validation would train the run again {folds} times (about {estimate:,.0f} s from its own "
                    f"training time); give --select cv for it")


def iter_select_cv(run_dir: str | Path, scoring: str, folds: int = CV_FOLDS, grid: Any = None,
                   block_size: int = DEFAULT_BLOCK) -> Iterator[Event]:
    """Choose ``scoring``'s parameter for the run in ``run_dir`` by ``folds``-fold cross-validation of its training
    images (module docstring): the fold runs (``RUN/scoring-cv/f1 ...``; started, resumed or read back), then
    :func:`crossview.eval.scoring.iter_select_scoring_cv` over their held-out folds and banks. Yields events
    (:class:`Log`, :class:`Progress` of stages ``"cv run"``, ``"cv"`` and ``"choose"``) and returns the record. The
    evaluation split is never read."""
    from crossview.engine.cv_runs import check_retrainable, iter_fold_run, load_run_dataset, run_folds
    from crossview.engine.run_folder import read_config
    from crossview.eval.scoring import iter_select_scoring_cv

    scoring = check_scoring(scoring)
    folder = Path(run_dir)
    config = read_config(folder)
    check_retrainable(config, folder.name, "use --select bank (a hold-out of its training bank, in-sample)")
    train_split, _, seed = _train_split(folder)
    if folds < 2:
        raise CrossViewError(f"cross-validation needs at least 2 folds, got {folds}")
    ds = load_run_dataset(config)
    parts = run_folds(ds, config, folds, seed)
    where = folder / CV_DIR
    yield Log(f"choosing {scoring}'s {PARAMS[scoring]}: {len(parts)}-fold cross-validation of the "
              f"{len(ds.splits[train_split]):,} {train_split} images, the run's {config.get('method')} trained again "
              f"on each fold's other images (runs in {where}, kept for the next choice)")
    sets = []
    for f, (tr, te) in enumerate(parts):
        fold = yield from iter_fold_run(config, ds, where / f"f{f + 1}", tr, te, f"cv fold {f + 1}/{len(parts)}")
        sets.append((fold.emb, fold.bank))
        yield Progress(f + 1, len(parts), "cross-validation runs", stage="cv")
    label = f"choosing {scoring}'s {PARAMS[scoring]} on the {train_split} folds"
    record = yield from relay(iter_select_scoring_cv(sets, scoring, grid, train_split, block_size),
                              lambda done, total: Progress(done, total, label, stage="choose"))
    record.update(seed=seed, fold_runs=[str(where / f"f{f + 1}") for f in range(len(parts))],
                  how=f"{len(parts)}-fold cross-validation of the {train_split} images: the run's method trained "
                      "again on each fold's other images, the fold scored against a bank of those images")
    return record


def recorded_choice(run_dir: str | Path | None, scoring: str, train_split: str = "train") -> dict[str, Any] | None:
    """The cross-validated choice of ``scoring``'s parameter the run recorded (its ``scoring.json``, any split: the
    choice is made on the training images only), without the metrics it was reported with; None when there is
    none (or the file is unreadable)."""
    import json

    if run_dir is None:
        return None
    path = Path(run_dir) / SCORING_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for entry in (v.get(scoring) for v in data.values() if isinstance(v, dict)):
        if isinstance(entry, dict) and isinstance(entry.get("folds"), list) and \
                str(entry.get("selected_on", "")).startswith(f"{train_split}-cv") and entry.get("param") is not None:
            return {k: v for k, v in entry.items() if k not in ("i2t", "t2i", "rsum", "hubness", "reported_on")}
    return None


def iter_run_choice(run_dir: str | Path, scoring: str, *, param: float | None = None, select: str = "auto",
                    folds: int = CV_FOLDS, bank: Any = None, use_recorded: bool = False) -> Iterator[Event]:
    """The choice record of ``scoring``'s parameter for the run in ``run_dir``: ``param`` as given; else (with
    ``use_recorded``, and ``select`` not ``bank``) the cross-validated choice the run recorded; else by ``select``
    (:func:`resolve_select`: :func:`iter_select_cv`, or a hold-out of ``bank``, the run's training bank by default).
    Yields events (a :class:`Log` when ``auto`` falls back to the bank) and returns the record."""
    scoring = check_scoring(scoring)
    select = check_select(select)
    folder = Path(run_dir)
    train_split, _, seed = _train_split(folder)
    if PARAMS[scoring] is None:
        return choose_scoring(bank, scoring)
    if param is not None:
        return choose_scoring(run_bank(folder) if bank is None else bank, scoring, param, seed, train_split)
    if use_recorded and select != "bank":
        record = recorded_choice(folder, scoring, train_split)
        if record is not None:
            return record
    mode, note = resolve_select(folder, select, folds)
    if mode == "cv":
        return (yield from iter_select_cv(folder, scoring, folds))
    if note:
        yield Log(note)
    return choose_scoring(run_bank(folder) if bank is None else bank, scoring, None, seed, train_split)


def iter_evaluate_run(run_dir: str | Path, scoring: str = "plain", *, split: str | None = None,
                      param: float | None = None, select: str = "auto", folds: int = CV_FOLDS,
                      ks: tuple[int, ...] = (1, 5, 10), block_size: int = DEFAULT_BLOCK, record: bool = True,
                      bank: Any = None, protocol: str = "standard") -> Iterator[Event]:
    """:func:`evaluate_run` as a generator of the choice's events (the cross-validation runs' progress); returns
    the result."""
    from crossview.eval.embeddings import evaluate_embeddings, load_embeddings
    from crossview.eval.protocols import check_coco_size

    scoring = check_scoring(scoring)
    select = check_select(select)
    folder = Path(run_dir)
    train_split, eval_split, seed = _train_split(folder)
    split = split or eval_split
    path = folder / f"embeddings_{split}.npz"
    if not path.is_file():
        raise CrossViewError(f"{folder}: no embeddings for split {split!r}; the run may not have finished its "
                             f"evaluation - resume it with 'crossview train --resume {folder}'")
    emb = load_embeddings(path)
    check_coco_size(protocol, int(emb.image.shape[0]))        # before any bank or cross-validation is made
    if scoring == "plain":
        res = evaluate_embeddings(emb, protocol, ks)
        res["scoring"] = {"scoring": "plain", "param_name": None, "param": None, "selected_on": "nothing",
                          "reported_on": split}
        return res
    if split == train_split:
        raise CrossViewError(f"{folder}: split {split!r} is the run's training split, where the scoring bank comes "
                             f"from; evaluate {scoring} on another split, or use --scoring plain")
    bank = run_bank(folder) if bank is None else bank
    choice = yield from iter_run_choice(folder, scoring, param=param, select=select, folds=folds, bank=bank)
    choice = {**choice, "reported_on": split}
    label = f"{scoring} scores of {split} against the {train_split} bank"
    res = yield from relay(iter_evaluate_scoring(emb, bank, scoring, choice["param"], ks, block_size=block_size,
                                                 protocol=protocol),
                           lambda done, total: Progress(done, total, label, stage="score"))
    res["scoring"] = choice
    if record and protocol != "coco1k":      # scoring.json holds the whole-split results the app shows
        _record(folder, split, choice, res)
    return res


def evaluate_run(run_dir: str | Path, scoring: str = "plain", *, split: str | None = None, param: float | None = None,
                 select: str = "auto", folds: int = CV_FOLDS, ks: tuple[int, ...] = (1, 5, 10),
                 block_size: int = DEFAULT_BLOCK, record: bool = True, bank: Any = None,
                 protocol: str = "standard") -> dict[str, Any]:
    """The metrics of the run in ``run_dir`` on ``split`` (default: the split it was evaluated on) under
    ``scoring``, as :func:`crossview.eval.embeddings.evaluate_embeddings` gives them, plus ``"scoring"`` (the
    choice record, :func:`iter_run_choice`, with ``reported_on``). The parameter is ``param`` as given, else chosen
    by ``select`` on the training images (module docstring). With ``record``, the choice and the result go into
    the run folder's ``scoring.json`` (not for ``protocol`` ``coco1k``, whose metrics are fold means: see
    :func:`crossview.eval.scoring.evaluate_scoring`). ``bank`` overrides the run's own (tests)."""
    work = iter_evaluate_run(run_dir, scoring, split=split, param=param, select=select, folds=folds, ks=ks,
                             block_size=block_size, record=record, bank=bank, protocol=protocol)
    while True:
        try:
            next(work)
        except StopIteration as stop:
            return stop.value


def _record(folder: Path, split: str, choice: dict[str, Any], res: dict[str, Any]) -> None:
    """Add ``choice`` and its result to the run's ``scoring.json`` (atomically; other entries kept)."""
    import json

    from crossview.core.io import atomic_write_json

    path = folder / SCORING_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    entry = {**choice, "i2t": res["i2t"], "t2i": res["t2i"], "rsum": res["rsum"], "hubness": res["hubness"]}
    data.setdefault(split, {})[choice["scoring"]] = entry
    try:
        atomic_write_json(path, data)
    except OSError:
        pass    # a read-only run folder (a colleague's): the numbers are printed all the same



def retriever_scoring(retriever: Any, scoring: str, *, run_dir: str | Path | None = None,
                      train_split: str = "train", seed: int = 0, param: float | None = None,
                      bank: Any = None, choice: dict[str, Any] | None = None
                      ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``(scorers, record)`` for ``retriever`` (a :class:`~crossview.engine.retriever.Retriever`) under
    ``scoring``, to hand to its ``set_scoring``: the bank is ``bank``, else the run folder's
    ``bank_<train_split>.npz``, else ``train_split`` of the retriever's dataset encoded by its method (never the
    gallery's split: a gallery that is the training split itself is refused). ``scorers`` is None for plain.

    The parameter is ``choice``'s (a record made already, :func:`iter_run_choice`), else ``param`` as given, else
    the cross-validated choice the run recorded (:func:`recorded_choice`), else the quick in-sample choice on a
    hold-out of the bank. Nothing here trains: the app calls it from a worker, never a cross-validation."""
    from crossview.data.method_data import MethodData

    scoring = check_scoring(scoring)
    if scoring == "plain":
        return None, {"scoring": "plain", "param_name": None, "param": None, "selected_on": "nothing"}
    if getattr(retriever, "gallery_name", None) == train_split:
        raise CrossViewError(f"the gallery is the run's training split {train_split!r}, where the scoring bank "
                             f"comes from; choose another gallery for {scoring}, or plain scoring")
    if bank is None and run_dir is not None and bank_path(run_dir, train_split).is_file():
        from crossview.eval.embeddings import load_embeddings
        bank = load_embeddings(bank_path(run_dir, train_split))
    if bank is None:
        ds, f, m = retriever.dataset, retriever.features, retriever.method
        if train_split not in getattr(ds, "splits", {}):
            raise CrossViewError(f"dataset {ds.name!r} has no {train_split!r} split to draw the scoring bank from; "
                                 "use plain scoring")
        files = bool(getattr(m, "wants_image_files", False)) and getattr(ds, "image_paths", None) is not None
        train = MethodData.from_features(ds, f.image, f.text, train_split, with_paths=files)
        bank = encode_bank(m, train, seed)
    record = choice if choice is not None else None
    if record is None and param is None:
        record = recorded_choice(run_dir, scoring, train_split)
    if record is None:
        record = choose_scoring(bank, scoring, param, seed=seed, train_split=train_split)
    return run_scorers(bank, record), record


def apply_scoring(run: Any, retriever: Any, scoring: str, param: float | None = None,
                  bank: Any = None, choice: dict[str, Any] | None = None) -> dict[str, Any]:
    """Make ``retriever`` (over the open ``run``, :class:`~crossview.engine.session.OpenRun`) rank by ``scoring``
    with the run's training bank (:func:`retriever_scoring`); returns the choice record (``param`` chosen on a
    hold-out of train unless given)."""
    train_split = str(run.config.get("train_split") or "train")
    scorers, record = retriever_scoring(retriever, scoring, run_dir=run.run_dir, train_split=train_split,
                                        seed=int(run.config.get("seed") or 0), param=param, bank=bank,
                                        choice=choice)
    retriever.set_scoring(scorers, record)
    return record



# ---------------------------------------------------------------------------------------- a run's own scoring
def default_scoring(method: str) -> dict[str, Any]:
    """The record of ``method``'s default scoring (:data:`DEFAULT_SCORINGS`; plain for a method not there):
    ``{"scoring", "param_name", "param", "selected_on", "default": True}``."""
    entry = DEFAULT_SCORINGS.get(str(method))
    if entry is None:
        return {**PLAIN_RECORD, "default": True}
    name, param = entry
    evidence = DEFAULT_EVIDENCE.get(str(method), "bench/results/")
    return {"scoring": name, "param_name": PARAMS[name], "param": param, "default": True,
            "selected_on": f"method default (3-fold CV on the Flickr8k sample's train photos: {evidence})"}


def resolve_run_scoring(method: str, scoring: Any = None, param: float | None = None) -> dict[str, Any]:
    """The scoring record a new run of ``method`` records in its config.json (``"scoring"``): ``scoring`` is None or
    ``"plain"`` (plain), ``"default"`` (the method's, :func:`default_scoring`), a name of
    :data:`crossview.eval.scoring.SCORINGS`, or a record already made. ``param`` fixes a named scoring's parameter
    (``selected_on: "given"``); without it the parameter is chosen after training (:func:`score_run_evaluation`: a
    hold-out of the training bank; ``crossview train`` then applies ``--select``). One clear line for bad values."""
    from crossview.eval.scoring import Scorer

    if isinstance(scoring, dict):
        rec = dict(scoring)
        name = check_scoring(rec.get("scoring", "plain"))
        if name == "plain":
            return {**PLAIN_RECORD, **({"default": True} if rec.get("default") else {})}
        if rec.get("param") is not None:
            rec["param"] = Scorer(name, rec["param"], np.zeros((1, 1)), np.zeros((1, 1))).param
        rec.setdefault("param_name", PARAMS[name])
        rec.setdefault("selected_on", "given" if rec.get("param") is not None else PENDING)
        return rec
    if scoring is None or scoring == "plain":
        if param is not None:
            raise CrossViewError(f"--param {param:g}: plain scoring has no parameter; give --scoring csls (k), "
                                 "isoftmax or dsoftmax (beta)")
        return dict(PLAIN_RECORD)
    if scoring == "default":
        rec = default_scoring(method)
        if param is None:
            return rec
        if rec["scoring"] == "plain":
            raise CrossViewError(f"--param {param:g}: {method}'s default scoring is plain, which has no parameter; "
                                 "give --scoring csls (k), isoftmax or dsoftmax (beta) with it")
        scoring = rec["scoring"]
    name = check_scoring(scoring)
    if name == "plain":
        return dict(PLAIN_RECORD)
    if param is None:
        return {"scoring": name, "param_name": PARAMS[name], "param": None, "selected_on": PENDING}
    p = Scorer(name, param, np.zeros((1, 1)), np.zeros((1, 1))).param        # checked as the scorer checks it
    return {"scoring": name, "param_name": PARAMS[name], "param": p, "selected_on": "given"}


def pending_scoring(record: dict[str, Any] | None) -> bool:
    """Whether ``record`` is a scoring whose parameter is still to be chosen (:func:`resolve_run_scoring`)."""
    return isinstance(record, dict) and record.get("scoring", "plain") != "plain" and record.get("param") is None


def run_scoring(config: dict[str, Any] | None) -> dict[str, Any]:
    """The scoring a run ranks by: its config.json's ``"scoring"`` record; plain for a run written before runs
    recorded one (or a record that does not parse)."""
    rec = (config or {}).get("scoring")
    if not isinstance(rec, dict):
        return dict(PLAIN_RECORD)
    try:
        name = check_scoring(rec.get("scoring", "plain"))
    except CrossViewError:
        return dict(PLAIN_RECORD)
    return dict(PLAIN_RECORD) if name == "plain" else dict(rec)


def describe_run_scoring(record: dict[str, Any] | None, bank: str | None = "train", full: bool = False) -> str:
    """One line: ``scored with csls k=10 (method default), bank: train`` / ``scored with plain (dot product)``;
    ``full``: a method default says where it was chosen (its ``selected_on``)."""
    rec = record if isinstance(record, dict) else PLAIN_RECORD
    name = rec.get("scoring", "plain")
    if name == "plain":
        return "scored with plain (dot product)" + (" (method default)" if rec.get("default") else "")
    sel = str(rec.get("selected_on") or "")
    how = ((sel if full and sel else "method default") if rec.get("default") else "given" if sel == "given"
           else f"chosen on {sel}" + (", in-sample" if rec.get("in_sample") else ""))
    param = rec.get("param")
    what = f" {rec.get('param_name') or PARAMS.get(name)}={param:g}" if param is not None else ""
    return f"scored with {name}{what} ({how})" + (f", bank: {bank}" if bank else "")


def score_run_evaluation(emb: Any, bank: Any, record: dict[str, Any], seed: int = 0,
                         train_split: str = "train") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(result, record)``: the evaluation embeddings ``emb`` under the run's scoring ``record`` with its
    training ``bank`` (:func:`crossview.eval.scoring.evaluate_scoring`); a record still pending gets its parameter
    from a hold-out of the bank (quick, labelled in-sample; ``crossview train`` may replace it by ``--select``)."""
    return drive(iter_score_run_evaluation(emb, bank, record, seed, train_split))


def iter_score_run_evaluation(emb: Any, bank: Any, record: dict[str, Any], seed: int = 0,
                              train_split: str = "train") -> Generator[tuple[int, int], None, tuple[dict, dict]]:
    """:func:`score_run_evaluation` as a generator of the re-scoring's ``(done, total)``; returns its pair."""
    if pending_scoring(record):
        chosen = choose_scoring(bank, record["scoring"], None, seed, train_split)
        record = {**chosen, "selected_on": chosen.get("selected_on")}
    res = yield from iter_evaluate_scoring(emb, bank, record["scoring"], record["param"])
    return res, record


def scored_summary(summary: dict[str, Any], res: dict[str, Any], record: dict[str, Any], train_split: str,
                   seed: int = 0) -> dict[str, Any]:
    """``summary`` (plain metrics) with its metrics, intervals and hubness replaced by ``res`` (the same split under
    ``record``'s scoring), the plain ones kept as ``metrics_plain``, and ``scoring`` (``record`` with its bank and
    the split it is reported on). A summary already scored keeps its first ``metrics_plain``."""
    from crossview.eval.bootstrap import bootstrap_ci
    from crossview.engine.run_folder import _METRIC_KEYS

    plain = summary.get("metrics_plain") or {k: summary.get(k) for k in ("i2t", "t2i", "rsum", "ci", "hubness")}
    ci = np.asarray(res.get("caption_image")) if res.get("caption_image") is not None else None
    out = dict(summary)
    out.update({
        "i2t": {k: float(res["i2t"][k]) for k in _METRIC_KEYS if k in res["i2t"]},
        "t2i": {k: float(res["t2i"][k]) for k in _METRIC_KEYS if k in res["t2i"]},
        "rsum": float(res["rsum"]),
        "hubness": res.get("hubness"),
        "scoring": {**{k: v for k, v in record.items() if k not in ("i2t", "t2i", "rsum", "hubness")},
                    "bank": train_split, "reported_on": summary.get("split")},
        "metrics_plain": plain,
    })
    sel = str(record.get("selected_on") or "")
    if sel and sel not in ("given", "nothing") and not record.get("default"):
        # a parameter chosen from data is one of the run's choices (a hold-out or folds of train, never the split)
        choices = [c for c in out.get("choices") or [] if not str(c.get("what", "")).startswith("scoring")]
        choices.append({"what": f"scoring {record['scoring']} {record.get('param_name')}", "on": sel})
        places = list(dict.fromkeys(c["on"] for c in choices))
        out.update(choices=choices, selected_on=", ".join(places),
                   optimistic=bool(out.get("optimistic")) or summary.get("split") in places)
    if ci is not None:
        out["ci"] = bootstrap_ci(res["ranks"]["i2t"], res["ranks"]["t2i"], ci, seed=seed)
    return out


def adopt_run_scoring(run_dir: str | Path, res: dict[str, Any]) -> dict[str, Any]:
    """Make ``res`` (the run's evaluation split under a scoring, :func:`iter_evaluate_run`) the run's own: its
    summary.json (metrics, ``metrics_plain`` kept), config.json's ``"scoring"`` and ranks.npz (the per-query ranks
    Inspect reads) say that scoring from now on. Returns the new summary. ``crossview train --scoring csls --select
    cv`` calls it once the choice is made after training."""
    from crossview.core.io import atomic_write_json
    from crossview.engine.run_folder import CONFIG, SUMMARY, read_config, read_summary
    from crossview.eval.embeddings import load_embeddings

    folder = Path(run_dir)
    train_split, split, seed = _train_split(folder)
    record = {k: v for k, v in res["scoring"].items() if k not in ("reported_on",)}
    emb = load_embeddings(folder / f"embeddings_{split}.npz")
    summary = scored_summary(read_summary(folder), {**res, "caption_image": emb.caption_image}, record,
                             train_split, seed)
    write_scored_ranks(folder, res["ranks"])
    config = read_config(folder)
    config["scoring"] = record
    atomic_write_json(folder / CONFIG, config)
    atomic_write_json(folder / SUMMARY, summary)
    return summary


def write_scored_ranks(folder: str | Path, ranks: dict[str, np.ndarray]) -> None:
    """Replace ranks.npz's ``i2t`` / ``t2i`` by ``ranks`` (the run's scoring), keeping the first plain ones as
    ``i2t_plain`` / ``t2i_plain`` and every other array."""
    from crossview.core.io import atomic_writer, read_npz
    from crossview.engine.run_folder import RANKS

    path = Path(folder) / RANKS
    arrays = read_npz(path, todo="train the run again (its evaluation writes ranks.npz)")
    for d in ("i2t", "t2i"):
        arrays.setdefault(f"{d}_plain", arrays[d])
        arrays[d] = np.asarray(ranks[d], np.int64)
    atomic_writer(path, lambda f: np.savez(f, **arrays))


def use_run_scoring(retriever: Any, run_dir: str | Path) -> dict[str, Any]:
    """Make ``retriever`` rank by the scoring the run in ``run_dir`` recorded (:func:`run_scoring`), with its
    parameter as recorded and its bank file (else its training split encoded); plain for a run without one, one
    whose parameter is still to be chosen, or a gallery that is the run's training split (the bank's). Returns the
    record in use (``crossview serve``)."""
    from crossview.engine.run_folder import read_config

    config = read_config(Path(run_dir))
    record = run_scoring(config)
    train_split = str(config.get("train_split") or "train")
    if record["scoring"] == "plain" or pending_scoring(record) or \
            getattr(retriever, "gallery_name", None) == train_split:
        return retriever.scoring_record
    scorers, rec = retriever_scoring(retriever, record["scoring"], run_dir=run_dir, train_split=train_split,
                                     seed=int(config.get("seed") or 0), choice=record)
    retriever.set_scoring(scorers, rec)
    return rec
