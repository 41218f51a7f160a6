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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.eval.scoring import (DEFAULT_BLOCK, PARAMS, check_scoring, evaluate_scoring, scorers_for,
                                    select_scoring)

__all__ = ["BANK_MAX_IMAGES", "SCORING_FILE", "bank_path", "encode_bank", "write_bank", "run_bank", "open_bank",
           "choose_scoring", "evaluate_run", "run_scorers", "retriever_scoring", "apply_scoring"]

#: the most training images a bank holds (QB-Norm's banks are a few thousand queries; the statistics settle)
BANK_MAX_IMAGES = 5000
#: where a run records its scorings' choices and results
SCORING_FILE = "scoring.json"


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


def evaluate_run(run_dir: str | Path, scoring: str = "plain", *, split: str | None = None, param: float | None = None,
                 ks: tuple[int, ...] = (1, 5, 10), block_size: int = DEFAULT_BLOCK, record: bool = True,
                 bank: Any = None) -> dict[str, Any]:
    """The metrics of the run in ``run_dir`` on ``split`` (default: the split it was evaluated on) under
    ``scoring``, as :func:`crossview.eval.embeddings.evaluate_embeddings` gives them, plus ``"scoring"`` (the
    choice record, :func:`choose_scoring`, with ``reported_on``). With ``record``, the choice and the result go
    into the run folder's ``scoring.json``. ``bank`` overrides the run's own (tests)."""
    from crossview.eval.embeddings import evaluate_embeddings, load_embeddings

    scoring = check_scoring(scoring)
    folder = Path(run_dir)
    train_split, eval_split, seed = _train_split(folder)
    split = split or eval_split
    path = folder / f"embeddings_{split}.npz"
    if not path.is_file():
        raise CrossViewError(f"{folder}: no embeddings for split {split!r}; the run may not have finished its "
                             f"evaluation - resume it with 'crossview train --resume {folder}'")
    emb = load_embeddings(path)
    if scoring == "plain":
        res = evaluate_embeddings(emb, "standard", ks)
        res["scoring"] = {"scoring": "plain", "param_name": None, "param": None, "selected_on": "nothing",
                          "reported_on": split}
        return res
    if split == train_split:
        raise CrossViewError(f"{folder}: split {split!r} is the run's training split, where the scoring bank comes "
                             f"from; evaluate {scoring} on another split, or use --scoring plain")
    bank = run_bank(folder) if bank is None else bank
    choice = choose_scoring(bank, scoring, param, seed=seed, train_split=train_split)
    choice["reported_on"] = split
    res = evaluate_scoring(emb, bank, scoring, choice["param"], ks, block_size=block_size)
    res["scoring"] = choice
    if record:
        _record(folder, split, choice, res)
    return res


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
                      bank: Any = None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``(scorers, record)`` for ``retriever`` (a :class:`~crossview.engine.retriever.Retriever`) under
    ``scoring``, to hand to its ``set_scoring``: the bank is ``bank``, else the run folder's
    ``bank_<train_split>.npz``, else ``train_split`` of the retriever's dataset encoded by its method (never the
    gallery's split: a gallery that is the training split itself is refused). ``scorers`` is None for plain."""
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
    record = choose_scoring(bank, scoring, param, seed=seed, train_split=train_split)
    return run_scorers(bank, record), record


def apply_scoring(run: Any, retriever: Any, scoring: str, param: float | None = None,
                  bank: Any = None) -> dict[str, Any]:
    """Make ``retriever`` (over the open ``run``, :class:`~crossview.engine.session.OpenRun`) rank by ``scoring``
    with the run's training bank (:func:`retriever_scoring`); returns the choice record (``param`` chosen on a
    hold-out of train unless given)."""
    train_split = str(run.config.get("train_split") or "train")
    scorers, record = retriever_scoring(retriever, scoring, run_dir=run.run_dir, train_split=train_split,
                                        seed=int(run.config.get("seed") or 0), param=param, bank=bank)
    retriever.set_scoring(scorers, record)
    return record
