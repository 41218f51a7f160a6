"""A validation search for any method: every trial an ordinary run, scored on val, the best refitted.

``tune(method, data, grid={"reg": [0.3, 1, 3], "n_components": [64, 128]})`` trains one run per point of
the grid (or ``trials`` points drawn from it at random) on the training split, scores each on the
validation split, and finally refits the best point with the dataset's own split rule (evaluated on
``test`` when there is one: the honest number). Feature normalisations are searched like parameters
(``image_norm`` / ``text_norm`` keys). Everything lives in one folder the app's runs list reads::

    TUNE_DIR/
      tune.json        the search: method, data, grid, metric, and one row per finished trial
      trial-001/ ...   ordinary run folders (open, inspect, compare, resume them)
      best/            the refit of the best point

Features are extracted once (the cache answers later trials anyway) and shared by every trial. An
interrupted search continues where it stopped: finished trials are read back, an interrupted one resumes.

Why a grid or random draws and not a model-based search (Optuna's TPE): the spaces are small and
categorical (a handful of values per parameter, a few dozen points), each trial is a whole run that the
user may want to open, and a plain grid is what a reader can reproduce from the table.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from crossview.core.events import Event, Finished, Log, Progress, TrialFinished
from crossview.core.io import atomic_write_json, read_json
from crossview.core.errors import CrossViewError

__all__ = ["tune", "TuneResult", "metric_value", "TUNE_FILE", "RUN_KEYS", "format_tune_table", "parse_grid",
           "parse_grid_values", "split_values"]

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
        elif name not in valid:
            raise CrossViewError(f"--grid {name}: method {method!r} has no parameter {name!r}; its parameters are: "
                                 f"{', '.join(valid)} (and {', '.join(RUN_KEYS)})")


def tune(method: str, data: Any, grid: dict[str, list[Any]], *, params: dict[str, Any] | None = None,
         metric: str = "rsum", trials: int | None = None, out: str | Path | None = None,
         val_split: str = "val", train_split: str = "train", image_encoder: str | None = None,
         text_encoder: str | None = None, image_norm: str | None = None, text_norm: str | None = None,
         data_format: str | None = None, image_root: str | None = None, device: str = "auto", seed: int = 0,
         refit: bool = True, cache: Any = None) -> Iterator[Event | TuneResult]:
    """Run the search (see the module docstring), yielding events and, last, the :class:`TuneResult`.

    ``grid`` maps parameter names (or ``image_norm`` / ``text_norm``) to the values to try; ``params``
    are fixed for every trial. Each trial trains on ``train_split`` and is scored on ``val_split`` by
    ``metric`` (:func:`metric_value`). Every input is checked before anything is extracted or trained.
    """
    from crossview.engine.run import SUMMARY, _load, resume, train
    from crossview.engine.splits import plan_splits
    from crossview.methods import create_method

    ds, source = _load(data, data_format, image_root)
    _check_grid(method, grid)
    fixed = dict(params or {})
    points = _points(grid, trials, seed)
    for p in points:     # every point is a valid parameter set, before any work
        create_method(method, **{**fixed, **{k: v for k, v in p.items() if k not in RUN_KEYS}}).check_params()
    if val_split not in ds.splits:
        raise CrossViewError(f"dataset {ds.name!r} has no split {val_split!r} to score the trials on (it has: "
                             f"{', '.join(ds.split_names) or 'none'}); name one with --val-split")
    plan_splits(ds, val_split, train_split, None, seed)
    metric_value({"rsum": 0.0, "i2t": {"R@1": 0, "R@5": 0, "R@10": 0, "MedR": 0, "MeanR": 0},
                  "t2i": {"R@1": 0, "R@5": 0, "R@10": 0, "MedR": 0, "MeanR": 0}}, metric)
    if out is None:
        from crossview.core.settings import get_settings
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in ds.name) or "data"
        out = get_settings().runs_dir / f"tune-{method}-{safe}-{stamp}"
    folder = Path(out)
    record = {"method": method, "data": source, "grid": grid, "params": fixed, "metric": metric,
              "val_split": val_split, "train_split": train_split, "seed": seed, "trials": trials,
              "image_encoder": image_encoder, "text_encoder": text_encoder, "image_norm": image_norm,
              "text_norm": text_norm}
    if (folder / TUNE_FILE).is_file():
        old = read_json(folder / TUNE_FILE)
        if not isinstance(old, dict) or any(old.get(k) != record[k] for k in ("method", "grid", "metric", "params")):
            raise CrossViewError(f"{folder} holds another search; give a new --out folder")
        yield Log(f"continuing the search in {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / TUNE_FILE).is_file():     # the folder is a search (listed, continued) from its first trial on
        atomic_write_json(folder / TUNE_FILE, {**record, "results": []})

    from crossview.features import extract_features
    yield Log(f"tuning {method} on {ds.name}: {len(points)} trial(s), scored by {metric} on {val_split}")
    yield Progress(0, len(points), "trials")
    feats = None
    results: list[dict[str, Any]] = []
    for i, point in enumerate(points, 1):
        run_dir = folder / f"trial-{i:03d}"
        run_kw = {k: point[k] for k in RUN_KEYS if k in point}
        method_params = {**fixed, **{k: v for k, v in point.items() if k not in RUN_KEYS}}
        if not (run_dir / SUMMARY).is_file():
            if feats is None:
                feats = extract_features(ds, image_encoder, text_encoder, fit_on=train_split, cache=cache,
                                         device="cpu")
            if (run_dir / "config.json").is_file():
                it = resume(run_dir, data=ds, features=feats, cache=cache)
            else:
                it = train(method, ds, run_dir=run_dir, params=method_params, split=val_split,
                           train_split=train_split, val_split=None, image_encoder=image_encoder,
                           text_encoder=text_encoder, device=device, seed=seed, features=feats, cache=cache,
                           image_norm=run_kw.get("image_norm", image_norm),
                           text_norm=run_kw.get("text_norm", text_norm))
            summary = None
            for ev in it:
                if isinstance(ev, Finished):
                    summary = ev.summary
                elif isinstance(ev, Progress):
                    yield Progress(ev.step, ev.total, f"trial {i}/{len(points)}: {ev.message}".rstrip(": "))
            if summary is None:
                raise CrossViewError(f"{run_dir}: the trial ended without a summary")
        else:
            summary = read_json(run_dir / SUMMARY)
        score = metric_value(summary, metric)
        row = {"trial": i, "point": point, "score": score, "rsum": summary.get("rsum"), "run_dir": str(run_dir),
               "i2t": summary.get("i2t"), "t2i": summary.get("t2i")}
        results.append(row)
        atomic_write_json(folder / TUNE_FILE, {**record, "results": results})   # recorded before it is announced
        best = max(results, key=lambda r: r["score"])
        yield Log(f"trial {i}/{len(points)} {_label(point)}: {metric} {abs(score):.1f}  "
                  f"(best {abs(best['score']):.1f}: trial {best['trial']})")
        yield TrialFinished(trial=i, total=len(points), point=dict(point), metric=metric, score=score,
                            rsum=summary.get("rsum"), i2t=dict(summary.get("i2t") or {}),
                            t2i=dict(summary.get("t2i") or {}), run_dir=str(run_dir), best_trial=best["trial"])
        yield Progress(i, len(points), "trials")
    ranked = sorted(results, key=lambda r: (-r["score"] if math.isfinite(r["score"]) else math.inf, r["trial"]))
    result = TuneResult(folder=folder, metric=metric, trials=ranked, best=ranked[0])
    if refit:
        best = ranked[0]["point"]
        best_dir = folder / "best"
        yield Log(f"refitting the best point ({_label(best)}) with the dataset's split rule")
        if (best_dir / SUMMARY).is_file():
            result.refit = read_json(best_dir / SUMMARY)
        else:
            if feats is None:
                feats = extract_features(ds, image_encoder, text_encoder, fit_on=train_split, cache=cache,
                                         device="cpu")
            it = (resume(best_dir, data=ds, features=feats, cache=cache) if (best_dir / "config.json").is_file()
                  else train(method, ds, run_dir=best_dir,
                             params={**fixed, **{k: v for k, v in best.items() if k not in RUN_KEYS}},
                             train_split=train_split, val_split=val_split, image_encoder=image_encoder,
                             text_encoder=text_encoder, device=device, seed=seed, features=feats, cache=cache,
                             image_norm=best.get("image_norm", image_norm), text_norm=best.get("text_norm", text_norm)))
            for ev in it:
                if isinstance(ev, Finished):
                    result.refit = ev.summary
                elif isinstance(ev, Progress):
                    yield Progress(ev.step, ev.total, f"refit: {ev.message}".rstrip(": "))
        atomic_write_json(folder / TUNE_FILE, {**record, "results": results, "best": ranked[0],
                                               "refit": {"run_dir": str(best_dir), "split": (result.refit or {}).get("split"),
                                                         "rsum": (result.refit or {}).get("rsum")}})
    yield result


def format_tune_table(result: TuneResult) -> str:
    """The trials best first: the point, the metric, R@1/5/10 both ways, the run folder's name."""
    keys = sorted({k for r in result.trials for k in r["point"]})
    head = "  ".join(f"{k:>12}" for k in keys)
    lines = [f"{'#':>4}  {head}  {result.metric:>9}  {'i2t R@1/5/10':>17}  {'t2i R@1/5/10':>17}  run"]
    for r in result.trials:
        vals = "  ".join(f"{str(r['point'].get(k, '')):>12}" for k in keys)
        rec = "  ".join(f"{r[d]['R@1']:5.1f}/{r[d]['R@5']:4.1f}/{r[d]['R@10']:4.1f}" if r.get(d) else f"{'-':>17}"
                        for d in ("i2t", "t2i"))
        lines.append(f"{r['trial']:>4}  {vals}  {abs(r['score']):>9.1f}  {rec}  {Path(r['run_dir']).name}")
    if result.refit:
        lines.append(f"best: trial {result.best['trial']} ({_label(result.best['point'])}); refit in "
                     f"{result.folder / 'best'}: rsum {result.refit.get('rsum', float('nan')):.1f} on split "
                     f"{result.refit.get('split')}")
    return "\n".join(lines)
