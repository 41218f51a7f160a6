"""One experiment shape shared by the papers' comparisons: several *variants* of a method (paper 004's losses,
paper 003's ablations, paper 002's ablations), each trained once per seed through the run engine, compared on
one evaluation split, with a paired per-query test of each variant against a baseline variant.

A :class:`Study` names the variants (each a registered method and the parameters that make it that variant),
their labels, the baseline, and the words its messages use. Every (variant, seed) is an ordinary run folder
``<variant>-seed<N>`` under one experiment folder (with an ``experiment.json``), so the app's runs list shows
them and its Inspect panel compares any two; running the experiment again on the same folder reads finished
runs back and resumes unfinished ones. Each variant keeps its method's defaults (chosen by cross-validation on
real photos, see the cards) unless ``epochs`` or ``params`` say otherwise; ``epochs`` sets every variant's
``max_epochs`` and moves its ``lr_decay_epoch`` in proportion.

The evaluation split is the dataset's ``test`` split (``val`` then chooses each run's epoch), else ``val``
(nothing then chooses the epoch: the last one is kept, as ``crossview train`` does). The result: R@1/5/10 both
ways and rsum, mean and standard deviation over the seeds, and the paired effect of each variant against the
baseline (:func:`crossview.eval.paired.paired_effect`): per query, the rank of its first ground truth and its hits
are averaged over each variant's seeds first (one observation per query, not seeds x queries), and a bootstrap
over the evaluated images (each with its captions) gives the rsum difference, per direction the R@1 difference
and the median rank change, each with its 95% interval; how many queries each variant wins, loses and ties; a
sign test over images; the minimal detectable rsum difference; and the queries it wins and loses most (by the
mean rank difference over the seeds).

:func:`run_study` is a generator of :mod:`crossview.core.events` whose last event is
``Finished(summary=result)``; :func:`format_table` and :func:`format_markdown` lay the result out.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.events import Event, Finished, Log, Progress
from crossview.core.run_settings import RUN_SETTING_PARAMS
from crossview.engine.runs import drain  # noqa: F401  (the run store's; experiments call V.drain)
from crossview.eval.paired import DEFAULT_RESAMPLES, paired_effect
from crossview.experiments._common import mean_std, new_experiment_dir, plain, relay_run, run_finished, text_table

__all__ = ["Study", "EXPERIMENT_FILE", "KS", "parse_variants", "parse_variant_params", "variant_params",
           "paired", "run_study", "drain", "format_table", "format_markdown"]

EXPERIMENT_FILE = "experiment.json"
KS = (1, 5, 10)
N_EXTREMES = 10


@dataclass(frozen=True)
class Study:
    """What one comparison varies (see the module docstring)."""

    kind: str                                        #: the experiment's name: "loss-compare", "webly-ablation"
    title: str                                       #: "Loss comparison (paper 004)"
    variants: dict[str, tuple[str, dict[str, Any]]]  #: name -> (registered method, the parameters that make it)
    labels: dict[str, str]                           #: name -> what it is, for the reports
    baseline: str                                    #: the variant every other one is paired against
    noun: str = "variant"                            #: "loss": what the messages call a variant
    plural: str = "variants"                         #: "losses"
    flag: str = "--variants"                         #: the command-line option that chooses them
    varied: tuple[str, ...] = ()                     #: parameters only the variants set (refused in --set)
    #: parameters every variant gets from the experiment itself (e.g. webly's web set), recorded with the runs
    shared: dict[str, Any] = field(default_factory=dict)
    #: per variant, values of its own setting (a temperature, a margin) to choose before its runs, never on the
    #: reported split (:func:`crossview.experiments.budget.choose_params`); ``run_study(choose=False)`` skips it
    tuned: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    #: per variant, the effect (B - baseline) a paper reports: ``{"metric": "i2t R@1" | "t2i R@1" | "rsum",
    #: "value": -1.8, "source": "paper 002, Flickr30K"}``; the report says whether this design can resolve it
    expected: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: variants that are positive controls: known to change the result, they show the design detects a change
    controls: tuple[str, ...] = ()

    @property
    def methods(self) -> list[str]:
        return sorted({m for m, _ in self.variants.values()})

    def with_shared(self, **params: Any) -> "Study":
        return replace(self, shared={**self.shared, **params})


def parse_variants(study: Study, value: str | Sequence[str]) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]`` (checked against the study, duplicates dropped, order kept)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for raw in items:
        name = str(raw).strip().lower()
        if not name:
            continue
        if name not in study.variants:
            raise CrossViewError(f"unknown {study.noun} {name!r}; choose from {', '.join(study.variants)}")
        if name not in out:
            out.append(name)
    if not out:
        raise CrossViewError(f"no {study.noun} to compare; give {study.flag} from {', '.join(study.variants)}")
    return out


def parse_variant_params(study: Study, items: Sequence[str] | None,
                         chosen: Sequence[str]) -> dict[str, dict[str, str]]:
    """``["b.tau=0.01", "embed_dim=512"]`` -> ``{"b": {"tau": "0.01"}, "*": {"embed_dim": "512"}}``
    (``VARIANT.NAME=VALUE`` for one variant, ``NAME=VALUE`` for every one)."""
    out: dict[str, dict[str, str]] = {}
    example = f"--set {chosen[-1] if chosen else list(study.variants)[-1]}.margin=0.1"
    for item in items or []:
        left, eq, value = item.partition("=")
        name, dot, key = left.rpartition(".") if "." in left else ("*", "", left)
        name, key = name.strip().lower(), key.strip()
        if not eq or not key:
            raise CrossViewError(f"--set {item!r}: write NAME=VALUE (every {study.noun}) or "
                                 f"{study.noun.upper()}.NAME=VALUE, e.g. {example}")
        if name != "*" and name not in chosen:
            raise CrossViewError(f"--set {item!r}: {name!r} is not among the {study.plural} compared "
                                 f"({', '.join(chosen)})")
        if key in study.varied:
            raise CrossViewError(f"--set {item!r}: the {key} is what the experiment varies; choose it with "
                                 f"{study.flag}")
        out.setdefault(name, {})[key] = value.strip()
    return out


def _coerce(method: str, key: str, value: Any) -> Any:
    """A parameter value from the command line, typed by the method's card."""
    if not isinstance(value, str):
        return value
    from crossview.methods import method_card
    from crossview.methods.cards import run_setting_spec

    run_spec = run_setting_spec(key)        # seed, amp ...: the run's, typed by its RunSettings field
    if run_spec is not None:
        return run_spec.coerce(value, method)
    card = method_card(method)
    if card is None or key not in card.params:
        raise CrossViewError(f"{method} has no parameter {key!r}; 'crossview train {method} --help' lists them")
    return card.params[key].coerce(value, method)


def variant_params(study: Study, name: str, given: dict[str, dict[str, Any]] | None,
                   epochs: int | None) -> dict[str, Any]:
    """The parameters of ``name``'s runs: the method's defaults, the study's shared ones, ``epochs``
    (max_epochs, and lr_decay_epoch in proportion to the method's default schedule), then those given for every
    variant, then for this one; the variant's own parameters last (they make it that variant)."""
    from crossview.methods import method_class

    method, fixed = study.variants[name]
    out: dict[str, Any] = {k: _coerce(method, k, v) for k, v in study.shared.items()}
    if epochs is not None:
        if int(epochs) < 1:
            raise CrossViewError(f"--epochs must be >= 1, got {epochs}")
        d = method_class(method).default_params()
        out["max_epochs"] = int(epochs)
        if d.get("lr_decay_epoch") and d.get("max_epochs"):
            out["lr_decay_epoch"] = max(1, round(int(epochs) * d["lr_decay_epoch"] / d["max_epochs"]))
    names = method_class(method).param_names()
    for k, v in ((given or {}).get("*") or {}).items():     # every variant whose method has the parameter
        if k in names or k in RUN_SETTING_PARAMS:
            out[k] = _coerce(method, k, v)
    for k, v in ((given or {}).get(name) or {}).items():
        out[k] = _coerce(method, k, v)
    return {**out, **fixed}


def paired(ranks_variant: Sequence[dict[str, np.ndarray]], ranks_base: Sequence[dict[str, np.ndarray]],
           caption_image: np.ndarray | None, query_ids: dict[str, np.ndarray] | None = None, *,
           resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """The paired effect of one variant (B) against the baseline (A): ``ranks_variant`` and ``ranks_base`` hold
    each seed's ``{"i2t": (n_images,), "t2i": (n_captions,)}`` 1-based ranks of the same queries (the seed counts
    may differ), ``caption_image (n_captions,)`` maps captions to images (``None``: unknown). Returns
    :func:`crossview.eval.paired.paired_effect`'s result (``KS``; seeds averaged per query, bootstrap over
    images), with per direction ``most_won`` / ``most_lost``: the queries with the largest mean gain and loss
    over the seeds, as ``(query id, mean rank change)`` (``query_ids[d]`` names them)."""
    if not ranks_variant or not ranks_base:
        raise CrossViewError("paired comparison needs at least one seed of each")
    stacked = []
    for runs in (ranks_base, ranks_variant):
        try:
            stacked.append({d: np.stack([np.asarray(r[d], dtype=np.int64) for r in runs]) for d in ("i2t", "t2i")})
        except ValueError:
            raise CrossViewError("the runs ranked different query sets; compare runs evaluated on the same "
                                 "split") from None
    base, var = stacked
    out = paired_effect(base, var, caption_image, ks=KS, resamples=resamples, seed=seed)
    for d in ("i2t", "t2i"):
        mean = var[d].mean(axis=0) - base[d].mean(axis=0)      # negative: the variant ranks higher
        ids = np.arange(mean.size) if not query_ids or d not in query_ids else np.asarray(query_ids[d])
        order = np.argsort(mean, kind="stable")
        out[d]["most_won"] = [(int(ids[i]), float(mean[i])) for i in order[:N_EXTREMES] if mean[i] < 0]
        out[d]["most_lost"] = [(int(ids[i]), float(mean[i])) for i in order[::-1][:N_EXTREMES] if mean[i] > 0]
    return out


def _check_same(study: Study, folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The experiment record already in ``folder`` (``{}`` for none); another experiment's is refused."""
    from crossview.core.io import read_json

    path = folder / EXPERIMENT_FILE
    if not path.is_file():
        if folder.is_dir() and any(folder.iterdir()):
            raise CrossViewError(f"{folder} is not empty and holds no {study.kind} experiment; give a new or empty "
                                 "--exp-dir")
        return {}
    try:
        old = read_json(path)
    except Exception:  # noqa: BLE001 - damaged JSON: one line
        old = None
    if not isinstance(old, dict) or old.get("experiment") != study.kind:
        raise CrossViewError(f"{path}: not a {study.kind} experiment (or damaged); give another --exp-dir")
    for key in ("dataset_fingerprint", "split", "val_split", "encoders"):
        if old.get(key) != record[key]:
            raise CrossViewError(f"{folder} holds a {study.kind} experiment with another {key.replace('_', ' ')} "
                                 f"({old.get(key)!r}, now {record[key]!r}); give a new --exp-dir")
    for name, p in (old.get("params") or {}).items():
        if name in record["params"] and p != record["params"][name]:
            raise CrossViewError(f"{folder}: its {name} runs were trained with {p}, now {record['params'][name]}; "
                                 "give a new --exp-dir, or the same --epochs / --set")
    return old


def run_study(study: Study, dataset: Any, *, variants: Sequence[str] | None = None, seeds: int = 3,
              epochs: int | None = None, params: dict[str, dict[str, Any]] | None = None,
              split: str | None = None, out: str | Path | None = None, device: str = "auto",
              image_encoder: str | None = None, text_encoder: str | None = None,
              should_stop: Callable[[], bool] | None = None, budget: Any = None, choose: bool = True,
              folds: int | None = None, train_splits: dict[str, str] | None = None,
              derived_splits: dict[str, Any] | None = None,
              subsets: dict[str, Any] | None = None, notes: Sequence[str] = (),
              prepare: Callable[[Path], Iterator[Event]] | None = None,
              prepared_params: tuple[str, ...] = ()) -> Iterator[Event]:
    """Train every variant with every seed and compare them (see the module docstring). ``params``:
    ``{"*": {...}, "<variant>": {...}}`` (every variant; one). ``budget``
    (:class:`crossview.experiments.budget.Budget` or its text, e.g. ``"20x128"``) gives every variant the same
    epochs, captions a step and schedule shape; ``choose`` picks each variant's :attr:`Study.tuned` values first
    (``folds``-fold cross-validation of the training images, or val when the comparison reports on test).
    ``train_splits`` (variant -> split) and ``derived_splits`` (recorded in every run) let variants train on
    different parts of the data; ``subsets`` (name -> dataset image indices of the evaluation split) adds a paired
    comparison restricted to those images (i2t) and their captions (t2i). ``notes`` are lines for the report.
    ``prepare(folder)`` (a generator of events) makes what the runs read inside the experiment folder (a web set)
    once the folder is there, before any run; it must do nothing when that is there already. Parameters named in
    ``prepared_params`` point at what ``prepare`` makes: they are checked after it, the others before anything.
    Yields events; the last is ``Finished(summary=result)`` with ``{"experiment", "dataset", "split",
    "selection", "variants", "seeds", "baseline", "results": {name: {"i2t", "t2i", "rsum", "train_seconds",
    "steps"}}, "std": {...}, "per_seed": {...}, "paired": {name: ...}, "paired_subsets": {subset: {name: ...}},
    "resolution": {name: ...}, "budget", "chosen", "params", "experiment_dir", "runs"}``."""
    from crossview.core.io import atomic_write_json, read_json, read_npz
    from crossview.engine.run import RANKS, STATUS, read_summary, train
    from crossview.engine.runs import ensure_run
    from crossview.experiments.budget import choose_params, parse_budget
    from crossview.methods import method_class, method_from_params

    names = parse_variants(study, list(variants) if variants is not None else list(study.variants))
    if not isinstance(seeds, (int, np.integer)) or isinstance(seeds, bool) or seeds < 1:
        raise CrossViewError(f"--seeds must be a whole number >= 1, got {seeds!r}")
    for k in ((params or {}).get("*") or {}):
        if k not in RUN_SETTING_PARAMS and not any(k in method_class(study.variants[n][0]).param_names()
                                                   for n in names):
            raise CrossViewError(f"--set {k}=...: no method of the {study.plural} compared has a parameter {k!r}; "
                                 + " and ".join(f"'crossview train {m} --help'" for m in study.methods) + " list them")
    budget = parse_budget(budget)
    if budget is not None and epochs is not None:
        raise CrossViewError("give either --budget (every variant's epochs, batch and schedule) or --epochs, not both")
    if derived_splits:
        from crossview.engine.splits import apply_derived_splits, checked_derived_splits
        derived_splits = checked_derived_splits(dataset, derived_splits)
        dataset = apply_derived_splits(dataset, derived_splits)
    train_of = {n: (train_splits or {}).get(n, "train") for n in names}
    splits = dict(getattr(dataset, "splits", {}) or {})
    for n, t in train_of.items():
        if t not in splits:
            raise CrossViewError(f"dataset {dataset.name!r} has no split {t!r} for the {n} runs to train on; the "
                                 f"{study.plural} need one")
    per = {n: variant_params(study, n, params, epochs) for n in names}
    if budget is not None:
        for n in names:
            tr = np.asarray(splits[train_of[n]], dtype=np.int64)
            n_caps = int(np.isin(np.asarray(dataset.caption_image), tr).sum())
            per[n] = {**per[n], **budget.params_for(study.variants[n][0], n_caps / max(len(tr), 1)),
                      **study.variants[n][1]}
    for n, p in per.items():                # bad names and values fail now, before any training
        method_from_params(study.variants[n][0],
                           {k: v for k, v in p.items() if k not in prepared_params}).check_params()
    if split is None:
        split = "test" if "test" in splits else "val" if "val" in splits else None
        if split is None:
            raise CrossViewError(f"dataset {dataset.name!r} has neither a test nor a val split to compare on; "
                                 "give --split")
    if split not in splits or split == "train":
        raise CrossViewError(f"--split {split!r}: choose a held-out split of {dataset.name!r} "
                             f"({', '.join(s for s in splits if s != 'train') or 'none'})")
    val_split = "val" if "val" in splits and split != "val" else None
    selection = (f"the epoch with the best {val_split} rsum is kept" if val_split else
                 f"no epoch selection ({split} is the evaluation split): the last epoch is kept")
    folder = Path(out) if out is not None else new_experiment_dir(study.kind, dataset.name)
    if folder.exists() and not folder.is_dir():
        raise CrossViewError(f"--exp-dir {folder} is a file; give a folder for the experiment's runs")
    record = {"experiment": study.kind, "data": getattr(dataset, "source", None) or None,
              "dataset": dataset.name, "dataset_fingerprint": dataset.fingerprint(), "split": split,
              "val_split": val_split, "encoders": {"image": image_encoder, "text": text_encoder},
              "params": plain(per), "budget": None if budget is None else budget.record(),
              "train_splits": train_of, "derived_splits": plain(derived_splits or {})}
    old = _check_same(study, folder, record)
    params_all = {**(old.get("params") or {}), **record["params"]}
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / EXPERIMENT_FILE, {**record, "params": params_all})
    stop = should_stop or (lambda: False)
    yield Log(f"{study.title} on {dataset.name}: {', '.join(names)} x {seeds} seed(s), evaluated on {split} "
              f"({selection}); runs in {folder}" + (" (continuing: finished runs are read back)" if old else ""))
    if prepare is not None:
        yield from prepare(folder)
        for n, p in per.items():
            method_from_params(study.variants[n][0], p).check_params()
    if budget is not None:
        yield Log(f"budget of every {study.noun}: {budget.describe()}")
    chosen: dict[str, dict[str, Any]] = {}
    for n in names:
        given = set(((params or {}).get("*") or {})) | set(((params or {}).get(n) or {}))
        grid = {k: v for k, v in (study.tuned.get(n) or {}).items() if k not in given} if choose else None
        if not grid:         # nothing to choose, or the user fixed it with --set
            continue
        grid = {k: [_coerce(study.variants[n][0], k, v) for v in vals] for k, vals in grid.items()}
        yield Log(f"{n}: choosing {', '.join(grid)} among {'; '.join(f'{k} = ' + ', '.join(map(str, v)) for k, v in grid.items())}"
                  f", never on {split}")
        for ev in choose_params(study.variants[n][0], dataset, grid, {**per[n], "seed": 0}, reported_on=split,
                                out=folder / f"choose-{n}", label=f"choosing for {n}", device=device,
                                image_encoder=image_encoder, text_encoder=text_encoder, folds=folds):
            if isinstance(ev, dict):
                chosen[n] = ev
            else:
                yield ev
            if stop():
                yield Log(f"{n}: stopped while choosing; run the experiment again with --exp-dir {folder} to "
                          "continue", "warning")
                return
        yield Log(f"{n}: chose {', '.join(f'{k}={v}' for k, v in chosen[n]['point'].items())} on "
                  f"{chosen[n]['selected_on']} (rsum {chosen[n]['score']:.1f})")
    run_params = {n: {**per[n], **chosen.get(n, {}).get("point", {})} for n in names}
    total = len(names) * seeds
    summaries: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    ranks: dict[str, list[dict[str, np.ndarray]]] = {n: [] for n in names}
    runs: dict[str, list[str]] = {n: [] for n in names}
    query_ids: dict[str, np.ndarray] = {}
    caption_image: np.ndarray | None = None      # the t2i queries' images: the paired bootstrap's clusters
    k = 0
    for seed in range(int(seeds)):
        for n in names:
            method, _ = study.variants[n]
            run_dir = folder / f"{n}-seed{seed}"
            runs[n].append(str(run_dir))
            yield Progress(k, total, f"{n} seed {seed}")
            how, it = ensure_run(run_dir, lambda: train(
                method, dataset, run_dir=run_dir, params={**run_params[n], "seed": seed}, split=split,
                train_split=train_of[n], val_split=val_split, device=device, seed=seed, image_encoder=image_encoder,
                text_encoder=text_encoder, derived_splits=derived_splits or None,
                selection=None if n not in chosen else
                {"what": ", ".join(chosen[n]["point"]), "by": "experiment", "selected_on": chosen[n]["selected_on"],
                 "search": chosen[n]["folder"]}), data=dataset)
            if it is None:
                yield Log(f"{n} seed {seed}: finished earlier ({run_dir.name}), read back")
            else:
                if how == "resumed":
                    yield Log(f"{n} seed {seed}: resuming {run_dir.name}")
                if (yield from relay_run(it, f"{n} seed {seed}", folder, stop)):
                    return
                if not run_finished(run_dir):
                    raise CrossViewError(f"{run_dir}: the run did not finish; see its metrics.jsonl, then run the "
                                         f"experiment again with --exp-dir {folder} to resume it")
            s = read_summary(run_dir)
            z = read_npz(run_dir / RANKS, todo=f"delete {run_dir} and run the experiment again with --exp-dir "
                         f"{folder} (that run is trained again)")
            missing = [k for k in ("i2t", "t2i", "image_ids", "caption_ids") if k not in z]
            if missing:
                raise CrossViewError(f"{run_dir / RANKS}: has no {', '.join(missing)}; delete {run_dir} and run the "
                                     f"experiment again with --exp-dir {folder} (that run is trained again)")
            ranks[n].append({"i2t": z["i2t"], "t2i": z["t2i"]})
            query_ids.setdefault("i2t", z["image_ids"])
            query_ids.setdefault("t2i", z["caption_ids"])
            if caption_image is None and "caption_image" in z:
                caption_image = z["caption_image"]
            try:
                steps = float(read_json(run_dir / STATUS).get("checkpoint_step") or 0)
            except CrossViewError:
                steps = 0.0
            summaries[n].append({"i2t": {f"R@{q}": float(s["i2t"][f"R@{q}"]) for q in KS},
                                 "t2i": {f"R@{q}": float(s["t2i"][f"R@{q}"]) for q in KS},
                                 "rsum": float(s["rsum"]), "train_seconds": float(s.get("train_seconds") or 0),
                                 "steps": steps})
            k += 1
            yield Log(f"{n} seed {seed}: rsum {s['rsum']:.1f} ({run_dir.name})")
    base = study.baseline if study.baseline in names else names[0]
    results, stds = {}, {}
    for n in names:
        results[n], stds[n] = mean_std(summaries[n])
    pairs = {n: paired(ranks[n], ranks[base], caption_image, query_ids)
             for n in names if n != base}
    by_subset: dict[str, dict[str, Any]] = {}
    for sub, images in (subsets or {}).items():
        keep_i, keep_t, ci_sub = _subset_queries(query_ids, caption_image, images)
        if not keep_i.any():
            continue
        cut = lambda rs: [{"i2t": r["i2t"][keep_i], "t2i": r["t2i"][keep_t]} for r in rs]  # noqa: E731
        by_subset[sub] = {"n_images": int(keep_i.sum()), "n_captions": int(keep_t.sum()),
                          "paired": {n: paired(cut(ranks[n]), cut(ranks[base]), ci_sub,
                                               {"i2t": query_ids["i2t"][keep_i], "t2i": query_ids["t2i"][keep_t]})
                                     for n in names if n != base}}
    resolution = {n: _resolution(study.expected[n], pairs[n]) for n in names if n in study.expected and n in pairs}
    result = {"experiment": study.kind, "dataset": dataset.name, "source": getattr(dataset, "source", ""),
              "split": split, "val_split": val_split, "selection": selection,
              "train_images": {n: len(splits[train_of[n]]) for n in names} if len(set(train_of.values())) > 1
              else len(splits[train_of[names[0]]]),
              "test_images": len(query_ids.get("i2t", ())), "test_captions": len(query_ids.get("t2i", ())),
              "variants": names, "seeds": int(seeds), "baseline": base, "results": results, "std": stds,
              "per_seed": summaries, "paired": pairs, "paired_subsets": by_subset, "resolution": resolution,
              "budget": None if budget is None else {**budget.record(), "describe": budget.describe()},
              "chosen": chosen, "controls": [n for n in study.controls if n in names], "notes": list(notes),
              "params": plain(run_params), "experiment_dir": str(folder), "runs": runs}
    atomic_write_json(folder / EXPERIMENT_FILE, {**record, "params": params_all, "result": plain(result)})
    yield Progress(total, total, "done")
    yield Finished(summary=result)


def _subset_queries(query_ids: dict[str, np.ndarray], caption_image: np.ndarray | None,
                    images: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Masks of the i2t queries (images) and t2i queries (their captions) among ``images`` (dataset indices),
    and the kept captions' image positions among the kept images."""
    ids_i = np.asarray(query_ids.get("i2t", []))
    keep_i = np.isin(ids_i, np.asarray(list(images), dtype=np.int64))
    if caption_image is None:
        raise CrossViewError("a comparison on a subset of the images needs each run's caption -> image map "
                             "(ranks.npz 'caption_image'); train the runs again with this version")
    ci = np.asarray(caption_image, dtype=np.int64)
    keep_t = keep_i[ci]
    new_pos = np.cumsum(keep_i) - 1
    return keep_i, keep_t, new_pos[ci[keep_t]]


def _resolution(expected: dict[str, Any], pr: dict[str, Any]) -> dict[str, Any]:
    """Whether the design resolves the effect a paper reports: its minimal detectable difference (the effect it
    detects with 80% power at a two-sided 5% level) against the paper's value; the half-width of its 95% interval
    is reported beside it. (A half-width just under the paper's value is not enough: an effect of exactly that
    size then gives an interval that reaches zero about half the time.)"""
    metric = str(expected["metric"])
    if metric == "rsum":
        ci, diff, mde = pr["rsum"]["ci"], pr["rsum"]["diff"], pr["mde"]["rsum"]
    else:
        d, _, k = metric.partition(" ")
        ci, diff, mde = pr[d][k]["ci"], pr[d][k]["diff"], pr["mde"][metric]
    half = (float(ci[1]) - float(ci[0])) / 2
    value = float(expected["value"])
    return {"metric": metric, "paper": value, "source": expected.get("source", ""), "observed": float(diff),
            "ci": [float(ci[0]), float(ci[1])], "half_width": half, "mde": float(mde),
            "resolves": bool(float(mde) < abs(value)), "excludes_paper": bool(not ci[0] <= value <= ci[1])}


# ====================================================================== layout
def _p(p: float) -> str:
    return "<0.001" if p < 1e-3 else f"{p:.3f}"


def _cell(mean: float, sd: float, n: int) -> str:
    return f"{mean:.1f}" if n < 2 else f"{mean:.1f} ± {sd:.1f}"


def _names(result: dict[str, Any]) -> list[str]:
    return list(result.get("variants") or result.get("losses") or [])


def _rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    n = int(result["seeds"])
    for name in _names(result):
        r, s = result["results"][name], result["std"][name]
        rows.append([name, *[_cell(r[d][f"R@{q}"], s[d][f"R@{q}"], n) for d in ("i2t", "t2i") for q in KS],
                     _cell(r["rsum"], s["rsum"], n), f"{r.get('steps', 0):.0f}", f"{r['train_seconds']:.0f}"])
    return rows


def _ci(value: float, ci: Sequence[float]) -> str:
    return f"{value:+.1f} [{ci[0]:+.1f}, {ci[1]:+.1f}]"


def _paired_rows(result: dict[str, Any], paired_results: dict[str, Any] | None = None) -> list[list[str]]:
    """Two rows per variant (i2t, t2i); the rsum columns on the first."""
    rows = []
    for name, pr in (result["paired"] if paired_results is None else paired_results).items():
        for d in ("i2t", "t2i"):
            p, med = pr[d], pr[d]["median_rank_change"]
            first = [name, _ci(pr["rsum"]["diff"], pr["rsum"]["ci"]), _p(pr["rsum"]["p"])] if d == "i2t" else \
                ["", "", ""]
            rows.append([*first, d, _ci(p["R@1"]["diff"], p["R@1"]["ci"]), _ci(med["value"], med["ci"]),
                         f"{p['won']} / {p['lost']} / {p['tied']}", _p(p["p"])])
    return rows


def _paired_notes(study: Study, result: dict[str, Any], paired_results: dict[str, Any] | None = None) -> list[str]:
    """What the paired table is: n, seeds, what was resampled, the p-values, the minimal detectable effects."""
    prs = result["paired"] if paired_results is None else paired_results
    one = next(iter(prs.values()))
    base = result["baseline"]
    mde = "; ".join(f"{n} rsum {pr['mde']['rsum']:.1f}, i2t R@1 {pr['mde']['i2t R@1']:.1f}, t2i R@1 "
                    f"{pr['mde']['t2i R@1']:.1f}" for n, pr in prs.items())
    seeds = (f"{one['seeds_b']} seed(s) each" if one["seeds_a"] == one["seeds_b"] else
             f"{one['seeds_b']} seed(s) per {study.noun}, {one['seeds_a']} of {base}")
    return [f"B - A: each {study.noun} (B) against {base} (A), one observation per query (its rank and hits "
            f"averaged over the seeds first); n = {one['n_images']} images / {one['n_captions']} captions, "
            f"{seeds}; resampled: {one['resampled']}; {one['resamples']} resamples, "
            f"{100 * one['level']:.0f}% percentile intervals.",
            f"won / lost / tied: queries whose first ground truth the {study.noun} ranks higher / lower / the "
            f"same (a negative rank change: it ranks it higher); p: {one['p_method']}.",
            f"Minimal detectable difference ({one['mde']['explanation']}): {mde}."]


def _title(study: Study, result: dict[str, Any]) -> str:
    tr = result["train_images"]
    train = (f"train {tr} images" if not isinstance(tr, dict) else
             "train " + ", ".join(f"{n} {k}" for n, k in tr.items()) + " images")
    return (f"{study.title} on {result['dataset']}: {train}, evaluated "
            f"on {result['split']} ({result['test_images']} images, {result['test_captions']} captions); "
            f"{result['selection']}; mean ± sd over {result['seeds']} seed(s)")


def _design_notes(study: Study, result: dict[str, Any]) -> list[str]:
    """The budget, what each variant chose and where, the positive controls, whether a paper's effect can be
    resolved, and the experiment's own notes."""
    out = []
    if result.get("budget"):
        out.append(f"Budget, the same for every {study.noun}: {result['budget']['describe']} (--budget "
                   f"{result['budget']['text']}); the steps column counts the optimiser steps of each run.")
    for n, c in (result.get("chosen") or {}).items():
        grid = "; ".join(", ".join(f"{k}={v}" for k, v in t["point"].items()) + f": {abs(t['score']):.1f}"
                         + (f" ± {t['sd']:.1f}" if t.get("sd") is not None else "") for t in c["trials"])
        out.append(f"{n}: {', '.join(f'{k}={v}' for k, v in c['point'].items())} chosen by rsum on "
                   f"{c['selected_on']}, not on {result['split']} (mean ± sd over the folds, best first: {grid}).")
    for n in result.get("controls") or []:
        out.append(f"{n} is a positive control: it is known to change the result, so a clear difference there "
                   "shows the design can detect a change of that size.")
    for n, r in (result.get("resolution") or {}).items():
        verdict = ("this design detects an effect of that size (80% power)" if r["resolves"] else
                   "this design CANNOT reliably detect an effect of that size (its minimal detectable difference "
                   "is larger)")
        out.append(f"{n} - {result['baseline']}: {r['source']} reports {r['paper']:+.1f} {r['metric']}; here "
                   f"{r['observed']:+.1f} [{r['ci'][0]:+.1f}, {r['ci'][1]:+.1f}] (95% interval half-width "
                   f"{r['half_width']:.1f}, minimal detectable {r['mde']:.1f}): {verdict}"
                   + ("; the paper's value lies outside the interval." if r["excludes_paper"] else "."))
    out += list(result.get("notes") or [])
    return out


def _subset_title(sub: str, info: dict[str, Any]) -> str:
    return f"Restricted to {sub} ({info['n_images']} images as i2t queries, their {info['n_captions']} captions as t2i queries)"


def _heads(study: Study) -> tuple[list[str], list[str]]:
    return ([study.noun, "i2t R@1", "R@5", "R@10", "t2i R@1", "R@5", "R@10", "rsum", "steps", "train s"],
            [study.noun, "rsum B - A [95% CI]", "p", "dir", "R@1 B - A [95% CI]", "median rank change [95% CI]",
             "won / lost / tied", "p"])


def format_table(study: Study, result: dict[str, Any]) -> str:
    """The result as plain text: the metric table, then the paired comparison against the baseline."""
    head, phead = _heads(study)
    lines = [_title(study, result), "", *text_table(head, _rows(result))]
    if result["paired"]:
        lines += ["", f"Per query against {result['baseline']} (B - A: the {study.noun} minus {result['baseline']}):",
                  *text_table(phead, _paired_rows(result)),
                  *[w for note in _paired_notes(study, result) for w in textwrap.wrap(note, 116)]]
    for sub, info in (result.get("paired_subsets") or {}).items():
        lines += ["", _subset_title(sub, info) + ":", *text_table(phead, _paired_rows(result, info["paired"])),
                  *[w for note in _paired_notes(study, result, info["paired"])[-1:] for w in textwrap.wrap(note, 116)]]
    design = _design_notes(study, result)
    if design:
        lines += ["", *[w for note in design for w in textwrap.wrap(note, 116)]]
    lines += ["", f"runs: {result['experiment_dir']}"]
    return "\n".join(lines)


def format_markdown(study: Study, result: dict[str, Any], command: str | None = None) -> str:
    """The result as a Markdown report (with the command that made it)."""
    def md(head: list[str], rows: list[list[str]]) -> list[str]:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *["| " + " | ".join(r) + " |" for r in rows]]

    head, phead = _heads(study)
    out = [f"## {_title(study, result)}", ""]
    if command:
        out += ["```", command, "```", ""]
    controls = set(result.get("controls") or [])
    rows = [[(f"{r[0]} ({study.labels[r[0]]})" if r[0] in study.labels else r[0])
             + (" - positive control" if r[0] in controls else ""), *r[1:]] for r in _rows(result)]
    out += md(head, rows)
    if result["paired"]:
        out += ["", f"Per query against **{result['baseline']}** (B - A: the {study.noun} minus "
                    f"{result['baseline']}):", "", *md(phead, _paired_rows(result)), "",
                " ".join(_paired_notes(study, result)), ""]
    for sub, info in (result.get("paired_subsets") or {}).items():
        out += [f"{_subset_title(sub, info)}:", "", *md(phead, _paired_rows(result, info["paired"])), "",
                _paired_notes(study, result, info["paired"])[-1], ""]
    design = _design_notes(study, result)
    if design:
        out += ["Design:", "", *[f"- {d}" for d in design], ""]
    if result["paired"]:
        for name, pr in result["paired"].items():
            for d, what in (("i2t", "images"), ("t2i", "captions")):
                won = ", ".join(f"{q} ({v:+.1f})" for q, v in pr[d]["most_won"][:5]) or "none"
                lost = ", ".join(f"{q} ({v:+.1f})" for q, v in pr[d]["most_lost"][:5]) or "none"
                out.append(f"- {name} {d}: {what} it wins most (mean rank change): {won}; loses most: {lost}")
    params = "; ".join(f"{n}: " + (", ".join(f"{k}={v}" for k, v in p.items()) or "the defaults")
                       for n, p in result["params"].items())
    out += ["", f"Parameters besides the methods' defaults: {params}.", f"Runs: `{result['experiment_dir']}`.", ""]
    return "\n".join(out)
