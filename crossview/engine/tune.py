"""A search for any method's parameters: every trial an ordinary run, chosen on other images than those the
refit of the best is reported on.

``tune(method, data, grid={"reg": [0.3, 1, 3], "n_components": [64, 128]})`` trains one run per point of
the grid (or ``trials`` points drawn from it at random) and scores it where :func:`plan_selection` says, then
refits the best point on all the training images and reports it **once** on the dataset's evaluation split
(test, else val, else a held-out part of train). Choosing and reporting are different images, always:

- a dataset with a test split: the trials are scored on ``val``, the refit reported on ``test``;
- a dataset without one (the evaluation split is ``val`` or a held-out part of train): the trials are scored by
  k-fold cross-validation of the training images (3 folds unless ``folds`` says otherwise; each fold an ordinary
  run ``trial-NNN-fK`` trained on the other folds), the mean over the folds ranks them;
- ``select_on="holdout"``: a seeded 20% of the training images scores them (one run per trial, cheaper);
- ``select_on=SPLIT`` names a split; the reported split itself is refused unless ``optimistic=True``, and then
  every output (log, table, ``tune.json``, the refit's summary) says "optimistic: chosen and reported on the same
  split".

``tune.json`` records ``selected_on`` (``train-cv3``, ``train-holdout20``, ``val``) and ``reported_on``; the refit's
``summary.json`` carries the same. Feature normalisations are searched like parameters (``image_norm`` /
``text_norm`` keys). Everything lives in one folder the app's runs list reads::

    TUNE_DIR/
      tune.json        the search: method, data, grid, metric, selection, and one row per finished trial
      trial-001/ ...   ordinary run folders (trial-001-f1, -f2, -f3 under cross-validation)
      best/            the refit of the best point

Features are extracted once (the cache answers later trials anyway) and shared by every trial. An
interrupted search continues where it stopped: finished trials are read back, an interrupted one resumes.

``seeds=(0, 1, 2)`` trains every trial (each fold) once per seed (``trial-001-f1-s0`` ...) and scores it by the mean
over the seeds first, so a stochastic method (WSABIE, the deep methods) is not chosen on one seed's luck; the refit
of the best is then trained at each seed (``best-s0`` ...) and reported as the mean over them. ``seed`` draws the
random points and the folds (and is the runs' seed when ``seeds`` is not given).

``scoring`` is how every trial and the refit rank and are evaluated, as :func:`crossview.engine.run.train` takes it:
None / ``"plain"`` (the library's default, so the papers' experiments stay plain) or ``"default"`` (the method's
default scoring: what ``crossview tune`` and the app's search ask for, so that a search ranks its trials by the
number a ``crossview train`` run of the same point reports, and its refit is comparable with the runs beside it).
``tune.json`` records it; a folder continues only under its own scoring (one recorded before searches had one is
plain: :func:`recorded_scoring`).

Why a grid or random draws and not a model-based search (Optuna's TPE): the spaces are small and
categorical (a handful of values per parameter, a few dozen points), each trial is a whole run that the
user may want to open, and a plain grid is what a reader can reproduce from the table.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.events import Event, Finished, Log, Progress, TrialFinished
from crossview.core.io import atomic_write_json, read_json
from crossview.core.errors import CrossViewError

__all__ = ["tune", "TuneResult", "metric_value", "TUNE_FILE", "RUN_KEYS", "format_tune_table", "parse_grid",
           "parse_grid_values", "split_values", "plan_selection", "Selection", "OPTIMISTIC", "DEFAULT_FOLDS",
           "INNER_HOLDOUT", "recorded_scoring"]

TUNE_FILE = "tune.json"
#: grid keys that are options of the run rather than parameters of the method
RUN_KEYS = ("image_norm", "text_norm")


@dataclass
class TuneResult:
    """What a search found: trials sorted best first, and the refit of the best (``None`` if skipped)."""

    folder: Path
    metric: str
    trials: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    refit: dict[str, Any] | None = None
    #: where the trials were scored and where the refit is reported (:meth:`Selection.record`)
    selection: dict[str, Any] = field(default_factory=dict)
    #: the runs' seeds (each trial and the refit trained once per seed, scores averaged over them)
    seeds: list[int] = field(default_factory=lambda: [0])
    #: the refit's summary at each seed (``refit`` is the first's; ``refit_rsum`` their mean)
    refits: list[dict[str, Any]] = field(default_factory=list)
    #: how the trials and the refit ranked and were evaluated (a run's scoring record; plain by default)
    scoring: dict[str, Any] = field(default_factory=lambda: {"scoring": "plain"})

    @property
    def refit_rsum(self) -> float | None:
        """The refit's rsum on the reported split, averaged over the seeds."""
        vals = [float(r["rsum"]) for r in self.refits or ([self.refit] if self.refit else []) if "rsum" in r]
        return float(np.mean(vals)) if vals else None


def recorded_scoring(record: dict[str, Any]) -> dict[str, Any]:
    """The scoring a search's ``tune.json`` record ranks its trials by: its ``"scoring"`` record, plain for a
    search recorded before searches had one (they were all plain)."""
    from crossview.engine.scoring import PLAIN_RECORD

    rec = record.get("scoring") if isinstance(record, dict) else None
    return dict(rec) if isinstance(rec, dict) else dict(PLAIN_RECORD)


def _scoring_key(record: dict[str, Any]) -> tuple[str, Any]:
    """What makes two searches' scorings the same: the scoring and its parameter (None: chosen in each run)."""
    name = str(record.get("scoring", "plain"))
    return (name, None if name == "plain" else record.get("param"))


def _scoring_flags(record: dict[str, Any]) -> str:
    """The command-line options that give ``record``'s scoring again (``--scoring csls --param 5``)."""
    name, param = _scoring_key(record)
    return f"--scoring {name}" + (f" --param {float(param):g}" if param is not None else "")


def metric_value(summary: dict[str, Any], metric: str) -> float:
    """``summary[metric]`` for ``rsum``, or ``summary["i2t"]["R@1"]`` for ``i2t.R@1`` (higher is better; MedR /
    MeanR are negated so that higher stays better)."""
    if metric == "rsum":
        return float(summary["rsum"])
    direction, _, key = metric.partition(".")
    if direction not in ("i2t", "t2i") or not key:
        raise CrossViewError(f"metric {metric!r}: use rsum or DIRECTION.KEY such as i2t.R@1, t2i.R@10, t2i.MedR")
    value = summary.get(direction, {}).get(key)
    if value is None:
        raise CrossViewError(f"metric {metric!r}: the runs report {', '.join(summary.get(direction, {}))} "
                             f"for {direction}")
    return -float(value) if key in ("MedR", "MeanR") else float(value)


def _points(grid: dict[str, list[Any]], trials: int | None, seed: int) -> list[dict[str, Any]]:
    names = list(grid)
    every = [dict(zip(names, combo)) for combo in itertools.product(*(grid[n] for n in names))]
    if trials is None or trials >= len(every):
        return every
    if trials < 1:
        raise CrossViewError(f"--trials {trials}: give a positive number")
    return random.Random(seed).sample(every, trials)


def split_values(text: str) -> list[str]:
    """``"0.3, 1,3"`` -> ``["0.3", "1", "3"]``; values are separated by ``;`` instead when the text has one
    (for a value that itself holds commas, such as BITR's ``c_grid``: ``"1,10;100,1e4"``)."""
    sep = ";" if ";" in text else ","
    return [v.strip() for v in text.split(sep) if v.strip()]


def parse_grid_values(method: str, name: str, values: list[str]) -> list[Any]:
    """``values`` (strings) of grid key ``name`` typed and range-checked by ``method``'s card (or by the
    class default when the card does not list it); ``image_norm`` / ``text_norm`` checked against
    :data:`crossview.features.normalize.NORMS`. A :class:`CrossViewError` names the key and the bad value."""
    from crossview.features.normalize import check_norm
    from crossview.methods import method_class
    from crossview.methods.cards import ParamSpec, _infer_type, find_card

    if not values:
        raise CrossViewError(f"--grid {name}: give at least one value")
    if name in RUN_KEYS:
        return [check_norm(v, name) for v in values]
    _refuse_run_setting(name)
    cls = method_class(method)
    valid = cls.param_names()
    if name not in valid:
        raise CrossViewError(f"--grid {name}: method {method!r} has no parameter {name!r}; its parameters are: "
                             f"{', '.join(valid)} (and {', '.join(RUN_KEYS)})")
    card = find_card(method)
    spec = card.params.get(name) if card is not None else None
    if spec is None:
        default = cls.default_params().get(name)
        spec = ParamSpec(name=name, default=default,
                         type=_infer_type(default) if default is not None else "str", optional=default is None)
    return [spec.coerce(v, method) for v in values]


def parse_grid(method: str, items: list[str]) -> dict[str, list[Any]]:
    """``["reg=0.3,1", "image_norm=none,ssr"]`` -> ``{"reg": [0.3, 1.0], "image_norm": ["none", "ssr"]}``,
    each value typed and range-checked by the method's card (:func:`parse_grid_values`); the values are
    split by :func:`split_values`. Used by ``crossview tune --grid`` and the app's search dialog."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise CrossViewError(f"--grid {item!r}: write NAME=V1,V2,... e.g. --grid reg=0.3,1,3")
        name, values = (s.strip() for s in item.split("=", 1))
        name = name.replace("-", "_")
        raw = split_values(values)
        if not raw:
            raise CrossViewError(f"--grid {item!r}: give at least one value after '='")
        if name in grid:
            raise CrossViewError(f"--grid {name} is given twice; put all its values in one --grid")
        grid[name] = parse_grid_values(method, name, raw)
    return grid


def _label(point: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def _refuse_run_setting(name: str) -> None:
    from crossview.core.run_settings import RUN_SETTING_PARAMS

    if name in RUN_SETTING_PARAMS:
        own = f"--{name} VALUE or " if name in ("device", "seed") else ""
        raise CrossViewError(f"--grid {name}: {name} is a run setting, not a parameter to search over; give it to "
                             f"every trial with {own}--set {name}=VALUE")


def _check_grid(method: str, grid: dict[str, list[Any]]) -> None:
    from crossview.features.normalize import check_norm
    from crossview.methods import method_class

    if not grid:
        raise CrossViewError("give at least one --grid NAME=V1,V2,...")
    valid = method_class(method).param_names()
    for name, values in grid.items():
        if not values:
            raise CrossViewError(f"--grid {name}: give at least one value")
        if name in RUN_KEYS:
            for v in values:
                check_norm(v, name)
            continue
        _refuse_run_setting(name)
        if name not in valid:
            raise CrossViewError(f"--grid {name}: method {method!r} has no parameter {name!r}; its parameters are: "
                                 f"{', '.join(valid)} (and {', '.join(RUN_KEYS)})")


#: the share of the training images an inner hold-out (``select_on="holdout"``) scores the trials on
INNER_HOLDOUT = 0.2
#: folds of ``select_on="cv"`` unless ``folds`` says otherwise
DEFAULT_FOLDS = 3
#: the words every output of a search chosen on its reported split carries
OPTIMISTIC = "optimistic: chosen and reported on the same split"


@dataclass
class Part:
    """One run of a trial: a fold of the cross-validation, the inner hold-out, or the whole scoring split."""

    suffix: str                                   #: appended to the trial's folder name ("" or "-f1")
    train_split: str
    eval_split: str
    derived: dict[str, list[int]] | None = None   #: the fold as derived splits (recorded in the run)


@dataclass
class Selection:
    """Where a search chooses (``selected_on``) and where the refit of its choice is reported (``reported_on``):
    different images unless ``optimistic``."""

    selected_on: str            #: "train-cv3", "train-holdout20" or a split name such as "val"
    reported_on: str            #: the refit's evaluation split: "test", "val" or "heldout"
    optimistic: bool
    parts: list[Part]
    description: str            #: one line for logs and the app

    @property
    def folds(self) -> int:
        return len(self.parts)

    def record(self) -> dict[str, Any]:
        return {"selected_on": self.selected_on, "reported_on": self.reported_on, "optimistic": self.optimistic,
                "description": self.description}


def _parse_select(select_on: str | None, folds: int | None) -> tuple[str, int]:
    """``"cv5"`` -> ``("cv", 5)``; ``"cv"`` -> ``("cv", folds or 3)``; other values unchanged."""
    s = str(select_on or "auto").strip()
    k = DEFAULT_FOLDS if folds is None else folds
    if s.lower().startswith("cv") and s[2:].isdigit():
        s, k = "cv", int(s[2:])
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise CrossViewError(f"--folds {k!r}: cross-validation needs a whole number of folds >= 2")
    return (s.lower() if s.lower() in ("auto", "cv", "holdout") else s), k


def plan_selection(ds: Any, select_on: str | None = "auto", *, folds: int | None = None, train_split: str = "train",
                   seed: int = 0, optimistic: bool = False, reported_on: str | None = None) -> Selection:
    """Where a search on ``ds`` scores its trials and where its refit is reported (the rule: never the same
    images, unless ``optimistic``).

    The refit is reported on the dataset's own evaluation split (:func:`crossview.engine.splits.plan_splits`:
    test, else val, else a held-out part of train), or on ``reported_on`` when the caller reports elsewhere (an
    experiment's evaluation split). ``select_on``:

    - ``"auto"``: ``val`` when the dataset has it and it is not the reported split (a dataset with a test split),
      else ``folds``-fold cross-validation of the refit's training images;
    - ``"cv"`` (or ``"cvK"``): ``folds``-fold cross-validation of the refit's training images (by image);
    - ``"holdout"``: a seeded :data:`INNER_HOLDOUT` of those training images;
    - a split name: that split. The reported split itself only with ``optimistic=True``, and every output then
      says :data:`OPTIMISTIC`.
    """
    from crossview.engine.splits import fold_splits, plan_splits

    mode, k = _parse_select(select_on, folds)
    if reported_on is not None:
        if reported_on not in ds.splits or reported_on == train_split:
            raise CrossViewError(f"dataset {ds.name!r}: cannot report on {reported_on!r} (its splits: "
                                 f"{', '.join(ds.split_names) or 'none'}; the training split is {train_split!r})")
        reported = reported_on
        train_images = np.asarray(ds.splits[train_split], dtype=np.int64)
    else:
        refit = plan_splits(ds, None, train_split, "val", seed)
        reported = refit.eval
        train_images = np.asarray(refit.derived.get(train_split, ds.splits[train_split]), dtype=np.int64)
    n = len(train_images)
    if mode == "auto":
        mode = "val" if "val" in ds.splits and len(ds.splits["val"]) and reported != "val" else "cv"
    if mode == "cv":
        if n < 2 * k:
            raise CrossViewError(f"{k}-fold cross-validation needs at least {2 * k} training images, {ds.name!r} "
                                 f"has {n}; lower --folds or choose --select-on holdout")
        parts = [Part(f"-f{f + 1}", "cv-train", "cv-test", {"cv-train": tr.tolist(), "cv-test": te.tolist()})
                 for f, (tr, te) in enumerate(fold_splits(train_images, k, seed))]
        label = f"{train_split}-cv{k}"
        desc = (f"chosen by {k}-fold cross-validation of the {n:,} {train_split} images (each fold trains on the "
                f"rest), reported once on {reported}")
        return Selection(label, reported, False, parts, desc)
    if mode == "holdout":
        n_out = int(round(INNER_HOLDOUT * n))
        if n_out < 2 or n - n_out < 2:
            raise CrossViewError(f"an inner hold-out needs more training images than {ds.name!r} has ({n}); "
                                 "choose --select-on cv or a split")
        held = np.sort(np.random.default_rng(seed).choice(train_images, size=n_out, replace=False))
        rest = np.setdiff1d(train_images, held)
        parts = [Part("", "inner-train", "inner-val", {"inner-train": rest.tolist(), "inner-val": held.tolist()})]
        label = f"{train_split}-holdout{round(100 * INNER_HOLDOUT)}"
        desc = (f"chosen on a seeded hold-out of {n_out:,} of the {n:,} {train_split} images (seed {seed}), "
                f"reported once on {reported}")
        return Selection(label, reported, False, parts, desc)
    split = mode
    if split not in ds.splits or not len(ds.splits[split]):
        raise CrossViewError(f"dataset {ds.name!r} has no split {split!r} to choose on (it has: "
                             f"{', '.join(ds.split_names) or 'none'}); use --select-on auto, cv, holdout or a split")
    if split == train_split:
        raise CrossViewError(f"--select-on {split}: the trials train on {split}; scoring them there says nothing. "
                             "Use --select-on auto (cross-validation of the training images)")
    same = split == reported
    if same and not optimistic:
        raise CrossViewError(f"choosing on {split}, where the best trial's refit is reported too, would make its "
                             f"number optimistic (chosen and reported on the same images): choose on auto instead "
                             f"({k}-fold cross-validation of the {n:,} {train_split} images), or allow optimistic "
                             "numbers (--optimistic; in the app, the 'optimistic' box) and every output says so")
    desc = (f"chosen on {split}, reported once on {reported}" if not same else
            f"chosen and reported on {split} ({OPTIMISTIC})")
    return Selection(split, reported, same, [Part("", train_split, split)], desc)


def _mean_metrics(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """``rsum`` and the ``i2t`` / ``t2i`` metrics averaged over the parts of a trial."""
    out: dict[str, Any] = {"rsum": float(np.mean([float(s["rsum"]) for s in summaries]))}
    for d in ("i2t", "t2i"):
        keys = [k for k in (summaries[0].get(d) or {}) if all(k in (s.get(d) or {}) for s in summaries)]
        out[d] = {k: float(np.mean([float(s[d][k]) for s in summaries])) for k in keys}
    return out


def tune(method: str, data: Any, grid: dict[str, list[Any]], *, params: dict[str, Any] | None = None,
         metric: str = "rsum", trials: int | None = None, out: str | Path | None = None,
         select_on: str | None = "auto", folds: int | None = None, optimistic: bool = False,
         reported_on: str | None = None, train_split: str = "train", image_encoder: str | None = None,
         text_encoder: str | None = None, image_norm: str | None = None, text_norm: str | None = None,
         data_format: str | None = None, image_root: str | None = None, device: str = "auto", seed: int = 0,
         refit: bool = True, cache: Any = None, seeds: Sequence[int] | None = None, scoring: Any = None,
         scoring_param: float | None = None) -> Iterator[Event | TuneResult]:
    """Run the search (see the module docstring), yielding events and, last, the :class:`TuneResult`.

    ``grid`` maps parameter names (or ``image_norm`` / ``text_norm``) to the values to try; ``params``
    are fixed for every trial. Each trial is scored by ``metric`` (:func:`metric_value`) where
    :func:`plan_selection` says (``select_on``, ``folds``, ``optimistic``): by default k-fold cross-validation
    of the training images when the evaluation split would otherwise be used, the mean over the folds. ``seeds``:
    train every trial and the refit once per seed and average over the seeds first (``seed`` then only draws the
    points and the folds). ``scoring`` / ``scoring_param``: how the trials and the refit rank and are evaluated
    (:func:`crossview.engine.scoring.resolve_run_scoring`; None is plain, ``"default"`` the method's default).
    Every input is checked before anything is extracted or trained.
    """
    from crossview.engine.run import SUMMARY, _load, train
    from crossview.engine.scoring import describe_run_scoring, resolve_run_scoring
    from crossview.engine.runs import ensure_run, run_finished
    from crossview.methods import method_from_params

    from crossview.core.run_settings import check_seed, parse_seeds

    run_seeds = list(parse_seeds(seeds)) if seeds is not None else [check_seed(seed)]
    several = len(run_seeds) > 1

    def seeded(name: str, s: int) -> str:            # one run folder per seed only when there are several
        return f"{name}-s{s}" if several else name

    ds, source = _load(data, data_format, image_root)
    _check_grid(method, grid)
    fixed = dict(params or {})
    points = _points(grid, trials, seed)
    for p in points:     # every point is a valid parameter set, before any work
        method_from_params(method, {**fixed, **{k: v for k, v in p.items() if k not in RUN_KEYS}}).check_params()
    if train_split not in ds.splits:
        raise CrossViewError(f"dataset {ds.name!r} has no split {train_split!r} to train the trials on (it has: "
                             f"{', '.join(ds.split_names) or 'none'})")
    if reported_on is not None and refit:
        raise CrossViewError("tune: reported_on is for callers that report elsewhere themselves; give refit=False")
    sel = plan_selection(ds, select_on, folds=folds, train_split=train_split, seed=seed, optimistic=optimistic,
                         reported_on=reported_on)
    scoring_record = resolve_run_scoring(method, scoring, scoring_param)
    metric_value({"rsum": 0.0, "i2t": {"R@1": 0, "R@5": 0, "R@10": 0, "MedR": 0, "MeanR": 0},
                  "t2i": {"R@1": 0, "R@5": 0, "R@10": 0, "MedR": 0, "MeanR": 0}}, metric)
    if out is None:
        from crossview.core.settings import get_settings
        from crossview.engine.run_folder import safe_name, unused_dir
        out = unused_dir(get_settings().runs_dir, "tune", method, safe_name(ds.name))
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise CrossViewError(f"{folder} is a file, not a folder: give a new folder for the search (--out)")
    if folder.is_dir() and not (folder / TUNE_FILE).is_file() and any(folder.iterdir()):
        raise CrossViewError(f"{folder} exists and is not a search folder (no {TUNE_FILE}; it holds other files, e.g. "
                             "a run): give a new or empty folder for the search (--out)")
    if image_encoder is None or text_encoder is None:   # the method's own feature pipelines, as its runs get them
        from crossview.methods import default_encoders_of
        own_image, own_text = default_encoders_of(method, fixed)
        if image_encoder is None and getattr(ds, "image_paths", None) is not None:
            image_encoder = own_image
        text_encoder = own_text if text_encoder is None else text_encoder
    record = {"method": method, "data": source, "grid": grid, "params": fixed, "metric": metric,
              "select_on": str(select_on or "auto"), "folds": sel.folds if sel.selected_on.endswith(
                  f"cv{sel.folds}") else None, **sel.record(),
              "train_split": train_split, "seed": seed, "seeds": run_seeds, "trials": trials,
              "image_encoder": image_encoder, "text_encoder": text_encoder, "image_norm": image_norm,
              "text_norm": text_norm, "scoring": scoring_record}
    if (folder / TUNE_FILE).is_file():
        old = read_json(folder / TUNE_FILE)
        keys = ("method", "grid", "metric", "params", "selected_on", "reported_on")
        if not isinstance(old, dict) or any(k in old and old.get(k) != record[k] for k in keys):
            raise CrossViewError(f"{folder} holds another search (another method, grid, metric, parameters or "
                                 f"selection); give a new --out folder")
        if list(old.get("seeds") or [old.get("seed", 0)]) != run_seeds:
            raise CrossViewError(f"{folder} holds a search at seeds {old.get('seeds') or [old.get('seed', 0)]}, not "
                                 f"{run_seeds}; give the same seeds to continue it, or a new --out folder")
        if _scoring_key(recorded_scoring(old)) != _scoring_key(scoring_record):
            was = describe_run_scoring(recorded_scoring(old), None).removeprefix("scored with ")
            now = describe_run_scoring(scoring_record, None).removeprefix("scored with ")
            raise CrossViewError(f"{folder} holds a search scored with {was}, not {now}; continue it under its own "
                                 f"scoring ({_scoring_flags(recorded_scoring(old))}), or give a new --out folder")
        yield Log(f"continuing the search in {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / TUNE_FILE).is_file():     # the folder is a search (listed, continued) from its first trial on
        atomic_write_json(folder / TUNE_FILE, {**record, "results": []})

    from crossview.features import extract_features
    n_parts = len(sel.parts)
    yield Log(f"tuning {method} on {ds.name}: {len(points)} trial(s)"
              + (f" x {n_parts} folds" if n_parts > 1 else "")
              + (f" x {len(run_seeds)} seeds ({', '.join(map(str, run_seeds))}; averaged first)" if several else "")
              + f", ranked by {metric} {describe_run_scoring(scoring_record, None)}; {sel.description}",
              "warning" if sel.optimistic else "info")
    yield Progress(0, len(points), "trials")
    feats = None
    results: list[dict[str, Any]] = []
    for i, point in enumerate(points, 1):
        run_kw = {k: point[k] for k in RUN_KEYS if k in point}
        method_params = {**fixed, **{k: v for k, v in point.items() if k not in RUN_KEYS}}
        per_part: list[list[dict[str, Any]]] = []       # [part][seed] summaries
        dirs: list[list[str]] = []
        for j, part in enumerate(sel.parts, 1):
            per_part.append([])
            dirs.append([])
            for sd_seed in run_seeds:
                run_dir = folder / seeded(f"trial-{i:03d}{part.suffix}", sd_seed)
                dirs[-1].append(str(run_dir))
                where = (f"trial {i}/{len(points)}" + (f" fold {j}/{n_parts}" if n_parts > 1 else "")
                         + (f" seed {sd_seed}" if several else ""))
                if run_finished(run_dir):
                    per_part[-1].append(read_json(run_dir / SUMMARY))
                    continue
                if feats is None:
                    feats = extract_features(ds, image_encoder, text_encoder, fit_on=train_split, cache=cache,
                                             device=device)
                _, it = ensure_run(run_dir, lambda: train(
                    method, ds, run_dir=run_dir, params=method_params, split=part.eval_split,
                    train_split=part.train_split, val_split=None, image_encoder=image_encoder,
                    text_encoder=text_encoder, device=device, seed=sd_seed, features=feats, cache=cache,
                    derived_splits=part.derived, image_norm=run_kw.get("image_norm", image_norm),
                    text_norm=run_kw.get("text_norm", text_norm), scoring=scoring_record),
                    data=ds, features=feats, cache=cache)
                summary = None
                for ev in it:
                    if isinstance(ev, Finished):
                        summary = ev.summary
                    elif isinstance(ev, Progress):
                        yield Progress(ev.step, ev.total, f"{where}: {ev.message}".rstrip(": "))
                if summary is None:
                    raise CrossViewError(f"{run_dir}: the trial ended without a summary")
                per_part[-1].append(summary)
        # each part's score: the mean over its seeds first; the trial's: the mean over the parts
        scores = [float(np.mean([metric_value(x, metric) for x in part_runs])) for part_runs in per_part]
        score = float(np.mean(scores))
        sd = float(np.std(scores)) if len(scores) > 1 else None
        mean = _mean_metrics([x for part_runs in per_part for x in part_runs])
        row = {"trial": i, "point": point, "score": score, "sd": sd, "rsum": mean["rsum"], "run_dir": dirs[0][0],
               "i2t": mean["i2t"], "t2i": mean["t2i"], "selected_on": sel.selected_on}
        if several:
            row["runs"] = [d for part_dirs in dirs for d in part_dirs]
        if n_parts > 1:
            row["folds"] = [{"run_dir": d[0], "score": s, "rsum": _mean_metrics(m)["rsum"],
                             **({"runs": d} if several else {})}
                            for d, s, m in zip(dirs, scores, per_part)]
        results.append(row)
        atomic_write_json(folder / TUNE_FILE, {**record, "results": results})   # recorded before it is announced
        best = max(results, key=lambda r: r["score"])
        spread = f" ± {sd:.1f} over {n_parts} folds" if sd is not None else ""
        yield Log(f"trial {i}/{len(points)} {_label(point)}: {metric} {abs(score):.1f}{spread} on "
                  f"{sel.selected_on} (best {abs(best['score']):.1f}: trial {best['trial']})")
        yield TrialFinished(trial=i, total=len(points), point=dict(point), metric=metric, score=score,
                            rsum=mean["rsum"], i2t=dict(mean["i2t"]), t2i=dict(mean["t2i"]), run_dir=dirs[0][0],
                            best_trial=best["trial"], sd=sd, selected_on=sel.selected_on)
        yield Progress(i, len(points), "trials")
    ranked = sorted(results, key=lambda r: (-r["score"] if math.isfinite(r["score"]) else math.inf, r["trial"]))
    result = TuneResult(folder=folder, metric=metric, trials=ranked, best=ranked[0], selection=sel.record(),
                        seeds=list(run_seeds), scoring=dict(scoring_record))
    if refit:
        best = ranked[0]["point"]
        yield Log(f"refitting the best point ({_label(best)}) on all {train_split} images"
                  + (f" at seeds {', '.join(map(str, run_seeds))}" if several else "") + f", reported on "
                  f"{sel.reported_on}" + (f" ({OPTIMISTIC})" if sel.optimistic else ""),
                  "warning" if sel.optimistic else "info")
        best_dirs = [folder / seeded("best", x) for x in run_seeds]
        for best_seed, best_dir in zip(run_seeds, best_dirs):
            summary = None
            if run_finished(best_dir):
                summary = read_json(best_dir / SUMMARY)
            else:
                if feats is None:
                    feats = extract_features(ds, image_encoder, text_encoder, fit_on=train_split, cache=cache,
                                             device=device)
                provenance = {"what": "parameters", "by": "search", "search": str(folder), "point": dict(best),
                              "metric": metric, **sel.record()}
                _, it = ensure_run(best_dir, lambda: train(
                    method, ds, run_dir=best_dir,
                    params={**fixed, **{k: v for k, v in best.items() if k not in RUN_KEYS}},
                    train_split=train_split, val_split="val", image_encoder=image_encoder, text_encoder=text_encoder,
                    device=device, seed=best_seed, features=feats, cache=cache,
                    image_norm=best.get("image_norm", image_norm), text_norm=best.get("text_norm", text_norm),
                    selection=provenance, scoring=scoring_record),
                    data=ds, features=feats, cache=cache)
                for ev in it:
                    if isinstance(ev, Finished):
                        summary = ev.summary
                    elif isinstance(ev, Progress):
                        yield Progress(ev.step, ev.total,
                                       (f"refit seed {best_seed}: " if several else "refit: ") + ev.message)
            if summary is not None and summary.get("split") != sel.reported_on:
                raise CrossViewError(f"{best_dir}: the refit was evaluated on {summary.get('split')!r}, not on "
                                     f"{sel.reported_on!r}; the search folder is inconsistent: give a new --out")
            if summary is not None:
                result.refits.append(summary)
        result.refit = result.refits[0] if result.refits else None
        atomic_write_json(folder / TUNE_FILE, {
            **record, "results": results, "best": ranked[0],
            "refit": {"run_dir": str(best_dirs[0]), "split": (result.refit or {}).get("split"),
                      "rsum": result.refit_rsum,
                      **({"run_dirs": [str(d) for d in best_dirs],
                          "rsum_per_seed": [r.get("rsum") for r in result.refits]} if several else {})}})
    yield result


def format_tune_table(result: TuneResult) -> str:
    """The trials best first: the point, the metric (± its spread over the folds), R@1/5/10 both ways (means over
    the folds), the run folder's name; a first line says where the trials were chosen and the refit reported."""
    sel = result.selection or {}
    keys = sorted({k for r in result.trials for k in r["point"]})
    head = "  ".join(f"{k:>12}" for k in keys)
    folds = any(r.get("sd") is not None for r in result.trials)
    lines = []
    if sel:
        lines.append(("# OPTIMISTIC NUMBERS: " if sel.get("optimistic") else "# ") + str(sel.get("description", "")))
    from crossview.engine.scoring import describe_run_scoring
    lines.append(f"# every trial and the refit {describe_run_scoring(result.scoring, None)}")
    lines.append(f"{'#':>4}  {head}  {result.metric:>9}" + (f"  {'± sd':>6}" if folds else "")
                 + f"  {'i2t R@1/5/10':>17}  {'t2i R@1/5/10':>17}  run")
    for r in result.trials:
        vals = "  ".join(f"{str(r['point'].get(k, '')):>12}" for k in keys)
        rec = "  ".join(f"{r[d]['R@1']:5.1f}/{r[d]['R@5']:4.1f}/{r[d]['R@10']:4.1f}" if r.get(d) else f"{'-':>17}"
                        for d in ("i2t", "t2i"))
        sd = (f"  {r['sd']:6.1f}" if r.get("sd") is not None else f"  {'-':>6}") if folds else ""
        lines.append(f"{r['trial']:>4}  {vals}  {abs(r['score']):>9.1f}{sd}  {rec}  {Path(r['run_dir']).name}")
    if result.refit:
        where = sel.get("selected_on", "?")
        several = len(result.refits) > 1
        rsum = result.refit_rsum
        lines.append(f"best: trial {result.best['trial']} ({_label(result.best['point'])}), chosen on {where}; "
                     f"refit on all training images in "
                     + (f"{result.folder}/best-s* at seeds {', '.join(map(str, result.seeds))}: rsum "
                        f"{rsum if rsum is not None else float('nan'):.1f} (mean; "
                        + ", ".join(f"{float(r.get('rsum', float('nan'))):.1f}" for r in result.refits) + ")"
                        if several else f"{result.folder / 'best'}: rsum "
                        f"{result.refit.get('rsum', float('nan')):.1f}")
                     + f" on split {result.refit.get('split')}"
                     + (f" ({OPTIMISTIC})" if sel.get("optimistic") else " (reported once, not chosen on)"))
    if len(result.seeds) > 1:
        lines.append(f"each trial trained at seeds {', '.join(map(str, result.seeds))}; its {result.metric} is the "
                     "mean over the seeds first, then over the folds")
    return "\n".join(lines)
