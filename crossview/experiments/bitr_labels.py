"""Experiments 3 and 4 of the BITR paper (paper 001, sections 7.5.3-7.5.4, Tables 5 and 6): image <-> phrase and
image <-> label retrieval.

The text side is a dataset's labels (Experiment 4: IAPR TC-12's annotation words; the demo's objects; a
``labels`` file) or its captions' relation phrases (Experiment 3: noun-verb, noun-prep-noun, verb-prep-noun from a
dependency parse), each label one discrete text (:mod:`crossview.data.views`). Rows: CCA and BITR-M/E/C on the
label's text (the representation's text side of its words), WSABIE in its original form (one vector per label,
``target="label_sets"``), weighted kNN and one-vs-rest SVMs (``wknn``, ``svm``) and a random ranking.

Metrics, as the paper: Im2Text, each test image a query ranking the labels (those seen in the fold's training
images): P@K and mAP over the images with at least one such label; Text2Im, each label a query ranking the test
images: P@K and mAP over the labels some test image has (:func:`crossview.eval.protocols.label_retrieval_metrics`;
percentages). Protocol: ``folds=N`` over all images (the paper: ten partitions of IAPR) or ``split=NAME``.

Every (fold, method) is an ordinary run of the engine on the dataset's text view (``config.json`` records the
view and the fold: resume and the app's runs list see it like any run); running again on the same folder reads
finished trials back and resumes the others. :func:`run_bitr_labels` yields events, the last
``Finished(summary=result)``; :func:`format_table` / :func:`format_markdown` lay the result out beside the
paper's Table 5 or 6 (from the method cards).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.events import Event, Finished, Log, Progress
from crossview.experiments._common import (markdown_table, mean_std, new_experiment_dir, plain, relay_run,
                                           run_finished, run_seed_builds, several_seeds, text_table)
from crossview.methods.base import MethodData

__all__ = ["LABEL_METHODS", "DEFAULT_METHODS", "METHOD_LABELS", "run_bitr_labels", "bitr_labels", "label_metrics",
           "format_table", "format_markdown", "paper_rows", "label_aps", "paired_against_first",
           "run_bitr_labels_seeds"]

EXPERIMENT_FILE = "experiment.json"
#: Table rows: name -> (registry name, fixed parameters); ``random`` is computed, not trained.
LABEL_METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "cca": ("cca", {}),
    "wknn": ("wknn", {}),
    "svm": ("svm", {}),
    "wsabie": ("wsabie", {"target": "label_sets"}),
    "bitr-m": ("bitr", {"loss": "M", "reduce": "pca"}),
    "bitr-e": ("bitr", {"loss": "E", "reduce": "pca"}),
    "bitr-c": ("bitr", {"loss": "C", "reduce": "pca"}),
    "random": ("random", {}),
}
DEFAULT_METHODS = ("cca", "wknn", "svm", "wsabie", "bitr-m", "bitr-e", "bitr-c", "random")
METHOD_LABELS = {"cca": "CCA", "wknn": "wKNN", "svm": "SVM", "wsabie": "WSABIE", "bitr-m": "BITR-M",
                 "bitr-e": "BITR-E", "bitr-c": "BITR-C", "random": "random"}
#: the label methods score (image, label) directly; the others score the label's text
_LABEL_SCORERS = ("wknn", "svm", "wsabie")


def parse_methods(value: str | Sequence[str]) -> list[str]:
    names = [v.strip().lower() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]
    bad = [n for n in names if n not in LABEL_METHODS]
    if not names or bad:
        raise CrossViewError(f"unknown method {bad[0]!r} for the label table" if bad else "no method given"
                             + f"; choose from {', '.join(LABEL_METHODS)}")
    return list(dict.fromkeys(names))


# ====================================================================== metrics
def label_metrics(s_i2t: np.ndarray, s_t2i: np.ndarray, relevance: np.ndarray,
                  ks: Sequence[int]) -> dict[str, dict[str, float]]:
    """Im2Text from the rows of ``s_i2t`` and Text2Im from the columns of ``s_t2i`` (``(n_images, n_labels)``
    scores; the same matrix for a method with one model), against ``relevance`` (bool, same shape)."""
    from crossview.eval.protocols import label_retrieval_metrics

    i2t = label_retrieval_metrics(s_i2t, relevance, ks)["i2t"]
    t2i = label_retrieval_metrics(s_t2i, relevance, ks)["t2i"] if s_t2i is not s_i2t else \
        label_retrieval_metrics(s_i2t, relevance, ks)["t2i"]
    return {"i2t": {k: float(v) for k, v in i2t.items()}, "t2i": {k: float(v) for k, v in t2i.items()}}


def label_aps(s_i2t: np.ndarray, s_t2i: np.ndarray, relevance: np.ndarray) -> dict[str, list[float]]:
    """Each query's average precision (percent) behind :func:`label_metrics`' mAP: Im2Text the images (rows) with a
    relevant label, Text2Im the labels (columns) some image has, in index order; the same queries for every method
    of a fold, so two methods pair query by query."""
    from crossview.eval.protocols import average_precisions

    rel = np.asarray(relevance, dtype=bool)
    i2t = average_precisions(s_i2t, rel)[rel.any(axis=1)]
    t2i = average_precisions(np.ascontiguousarray(np.asarray(s_t2i).T), rel.T)[rel.any(axis=0)]
    return {"i2t": [float(v) for v in i2t], "t2i": [float(v) for v in t2i]}


def paired_against_first(aps: dict[str, dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """Each method after the first against the first, on the same queries: the mAP difference both ways with its
    interval (:func:`crossview.eval.paired.paired_mean_difference`; each query's AP one observation, queries
    resampled). ``aps``: ``{method: {"i2t": [...], "t2i": [...]}}``, the folds' queries concatenated; a
    ``(n_seeds, n_queries)`` array per direction for several builds (averaged per query first)."""
    from crossview.eval.paired import paired_mean_difference

    base = methods[0]
    return {"baseline": base,
            "rows": {m: {d: paired_mean_difference(aps[base][d], aps[m][d]) for d in ("i2t", "t2i")}
                     for m in methods[1:]}}


def _reindexed(scores: np.ndarray, names: Sequence[str], vocab: Sequence[str]) -> np.ndarray:
    """A label method's score columns (in its ``names`` order) in the experiment's ``vocab`` order; a label it
    does not know scores below every known one."""
    col = {n: i for i, n in enumerate(names)}
    out = np.full((scores.shape[0], len(vocab)), np.float32(scores.min() - 1.0) if scores.size else 0.0,
                  dtype=np.float32)
    for j, v in enumerate(vocab):
        if v in col:
            out[:, j] = scores[:, col[v]]
    return out


def _scores(method: Any, table_name: str, test: MethodData, vocab: list[str], vocab_text: MethodData
            ) -> tuple[np.ndarray, np.ndarray]:
    if table_name in _LABEL_SCORERS:
        s = _reindexed(np.asarray(method.label_scores(test), np.float32), list(method.label_names_), vocab)
        return s, s
    s_i2t = method.scores(test, "i2t", texts=vocab_text)
    s_t2i = method.scores(test, "t2i", texts=vocab_text) if method.directions_differ else s_i2t
    return s_i2t, s_t2i


# ====================================================================== the paper's numbers
def paper_rows(kind: str, methods: Sequence[str]) -> dict[str, dict[str, dict[str, float]]]:
    """The paper's Table 5 (``kind="phrases"``) or Table 6 (``"labels"``) rows of ``methods`` from their cards,
    CTR where the paper has TR and CTR (its best setting)."""
    from crossview.methods.cards import find_card

    table = "table 5" if kind == "phrases" else "table 6"
    out: dict[str, dict[str, dict[str, float]]] = {}
    for m in methods:
        registry = LABEL_METHODS[m][0]
        if registry == "random":
            continue
        try:
            card = find_card(registry)
        except CrossViewError:
            continue
        row: dict[str, dict[str, float]] = {}
        for e in card.paper_results:
            if not isinstance(e, dict) or str(e.get("table", "")).strip().lower() != table:
                continue
            text = " ".join(str(v) for k, v in e.items() if k != "metrics").lower()
            if registry == "bitr" and f"bitr-{m[-1]}" not in text and str(e.get("loss", "")).lower() != m[-1]:
                continue
            if " tr" in f" {text} ".replace("(", " ").replace(")", " ") and "ctr" not in text:
                continue                                # the paper's TR row: CTR is the one shown
            d = str(e.get("direction", "")).lower()
            if d in ("i2t", "t2i") and d not in row:
                row[d] = {k: float(v) for k, v in (e.get("metrics") or {}).items()}
        if row:
            out[m] = row
    return out


# ====================================================================== the runner
def _check_same(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    from crossview.core.io import read_json

    path = folder / EXPERIMENT_FILE
    if not path.is_file():
        return {}
    old = read_json(path)
    if not isinstance(old, dict) or old.get("experiment") != record["experiment"]:
        raise CrossViewError(f"{path}: not a BITR label experiment (or damaged); give another --exp-dir folder")
    for key in ("dataset_fingerprint", "view", "representation", "representation_params", "protocol", "seed"):
        if old.get(key) != record[key]:
            raise CrossViewError(f"{folder} holds a label experiment with another {key.replace('_', ' ')} "
                                 f"({old.get(key)!r}, now {record[key]!r}); give a new --exp-dir folder")
    return old


def run_bitr_labels(dataset: Any, *, kind: str = "labels", min_images: int = 2, representation: str = "modern",
                    methods: Sequence[str] = DEFAULT_METHODS, folds: int | None = None, split: str | None = None,
                    ks: Sequence[int] = (5,), method_params: dict[str, dict[str, Any]] | None = None,
                    representation_params: dict[str, Any] | None = None, seed: int = 0,
                    out: str | Path | None = None, feature_progress: Callable[[str, int, int], None] | None = None,
                    should_stop: Callable[[], bool] | None = None) -> Iterator[Event]:
    """Run Experiment 4 (``kind="labels"``) or 3 (``"phrases"``, ``min_images``: a phrase's fewest images);
    yields ``Progress`` / ``Log`` events, finally ``Finished(summary=result)`` (see the module docstring;
    the arguments as :func:`crossview.experiments.bitr_table.run_bitr_table`'s)."""
    from crossview.core.io import atomic_write_json
    from crossview.data.views import check_text_view, label_text, text_view
    from crossview.engine.run import read_summary, train
    from crossview.engine.runs import ensure_run, load_fitted
    from crossview.experiments.bitr_table import (_representation_record, chosen_c, make_folds, mean_std_with_c,
                                                  parse_ks, table_params)
    from crossview.features import Features
    from crossview.features.topics import (build_representation, built_representation_features,
                                           check_representation, method_data_for_images, representation_record)
    from crossview.methods import method_from_params

    view = check_text_view({"kind": kind, "min_images": int(min_images)} if kind == "phrases" else {"kind": kind})
    methods = parse_methods(list(methods))
    ks = parse_ks(list(ks))
    rep_kw = dict(representation_params or {})
    stop = should_stop or (lambda: False)
    params = table_params(method_params, methods, LABEL_METHODS)
    for m in methods:        # bad parameter names and values fail now, not after the first fold's features
        registry, fixed = LABEL_METHODS[m]
        if registry != "random":
            method_from_params(registry, {**params[m], **fixed}).check_params()
    yield Log(f"{dataset.name}: the {kind} view" + (" (parsing the captions)" if kind == "phrases" else ""))
    vds = text_view(dataset, view)
    check_representation(vds, representation, image_encoder=rep_kw.get("image_encoder"),
                         text_encoder=rep_kw.get("text_encoder"))
    fold_list, protocol = make_folds(vds, folds=folds, split=split, seed=seed)
    has = np.asarray([bool(s) for s in vds.label_sets])
    unlabelled = int((~has).sum())
    if unlabelled:           # no relevant label: such an image is neither trained on nor queried
        fold_list = [f._replace(train=f.train[has[f.train]], test=f.test[has[f.test]],
                                val=None if f.val is None or not has[f.val].any() else f.val[has[f.val]])
                     for f in fold_list]
        protocol += f"; the {unlabelled} images without any of the {kind} left out"
    n_labels = len({x for s in vds.label_sets for x in s})
    folder = Path(out) if out is not None else new_experiment_dir(f"bitr-{kind}", f"{dataset.name}-{representation}")
    record: dict[str, Any] = {
        "experiment": "bitr-labels", "data": getattr(dataset, "source", None) or None, "dataset": dataset.name,
        "dataset_fingerprint": dataset.fingerprint(), "view": view, "representation": representation,
        "representation_params": _representation_record(rep_kw),
        "protocol": {"folds": folds, "split": split, "description": protocol}, "seed": int(seed)}
    old = _check_same(folder, record)
    trials: dict[str, Any] = dict(old.get("trials") or {})
    rep_record = None if representation == "default" else representation_record(representation,
                                                                                 record["representation_params"])
    eval_key = {"ks": list(ks)}

    def save() -> None:
        atomic_write_json(folder / EXPERIMENT_FILE, {**record, "trials": trials})

    folder.mkdir(parents=True, exist_ok=True)
    save()
    yield Log(f"experiment {'3' if kind == 'phrases' else '4'} on {dataset.name}: image <-> {kind}, {n_labels} "
              f"{kind} over {sum(1 for s in vds.label_sets if s)} images; {protocol}; representation "
              f"{representation}; runs in {folder}")
    learned = [m for m in methods if m != "random"]
    total = len(fold_list) * (len(methods) + 1)
    step = 0
    per_fold: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    runs: dict[str, list[str]] = {m: [] for m in learned}
    aps: dict[str, dict[str, list[float]]] = {m: {"i2t": [], "t2i": []} for m in learned}
    device = str(rep_kw.get("device", "cpu"))
    for fold in fold_list:
        vocab = sorted({x for i in fold.train for x in vds.label_sets[int(i)]})
        rel = np.array([[v in set(vds.label_sets[int(i)]) for v in vocab] for i in fold.test], dtype=bool)
        yield Progress(step, total, f"{fold.name}: {representation} features")
        t0 = time.monotonic()
        rep = build_representation(vds, representation, fit_images=fold.train, **rep_kw, progress=feature_progress,
                                   should_stop=stop)
        test_md = method_data_for_images(vds, rep, fold.test, "test")
        vocab_text = MethodData(image_features=np.zeros((1, rep.image.shape[1]), np.float32),
                                text_features=rep.encode_captions([label_text(v) for v in vocab]),
                                captions=[label_text(v) for v in vocab], caption_image=np.zeros(len(vocab), np.int64),
                                name="labels")
        feats = (Features(image=rep.image, text=rep.text, image_encoder=rep.info.get("image_encoder", "?"),
                          text_encoder=rep.info.get("text_encoder", "?")) if representation == "default"
                 else built_representation_features(rep, rep_record))
        yield Log(f"{fold.name}: {len(vocab)} {kind} in the training images, {int(rel.any(1).sum())} of "
                  f"{len(fold.test)} test images have one; features in {time.monotonic() - t0:.1f} s")
        step += 1
        for m in methods:
            if stop():
                return
            if m == "random":
                rng = np.random.default_rng([int(seed), zlib.crc32(fold.key.encode())])
                s = rng.standard_normal(rel.shape).astype(np.float32)
                res: dict[str, Any] = {**label_metrics(s, s, rel, ks), "train_seconds": 0.0}
                per_fold[m].append(res)
                step += 1
                continue
            name = f"{fold.key}-{m}"
            run_dir = folder / name
            runs[m].append(str(run_dir))
            if name in trials and trials[name].get("eval") == eval_key and run_finished(run_dir):
                if not isinstance(trials[name].get("ap"), dict):   # a trial from before per-query APs were kept
                    trials[name]["ap"] = label_aps(*_scores(load_fitted(run_dir), m, test_md, vocab, vocab_text), rel)
                    save()
                if LABEL_METHODS[m][0] == "bitr" and "C" not in trials[name]["metrics"]:   # from before C was kept
                    trials[name]["metrics"]["C"] = chosen_c(load_fitted(run_dir))
                    save()
                per_fold[m].append(trials[name]["metrics"])
                for d in ("i2t", "t2i"):
                    aps[m][d] += trials[name]["ap"][d]
                step += 1
                yield Log(f"{fold.name} {m}: finished earlier ({name}), read back")
                continue
            registry, fixed = LABEL_METHODS[m]
            _, it = ensure_run(run_dir, lambda: train(
                registry, vds, run_dir=run_dir, params={**params[m], **fixed}, split="exp-test",
                train_split="exp-train", val_split="exp-val" if fold.val is not None else None,
                derived_splits=fold.derived_splits(), device=device, seed=seed, features=feats,
                image_encoder=feats.image_encoder if representation == "default" else None,
                text_encoder=feats.text_encoder if representation == "default" else None,
                representation=rep_record, image_norm="none", text_norm="none", text_view=view),
                data=vds, features=feats)
            if it is not None:
                yield Progress(step, total, f"{fold.name}: training {m}")
                if (yield from relay_run(it, f"{fold.name} {m}", folder, stop)):
                    return
            method = load_fitted(run_dir)
            s_i2t, s_t2i = _scores(method, m, test_md, vocab, vocab_text)
            res = {**label_metrics(s_i2t, s_t2i, rel, ks),
                   "train_seconds": float(read_summary(run_dir).get("train_seconds", float("nan")))}
            if registry == "bitr":
                res["C"] = chosen_c(method)
            per_fold[m].append(res)
            ap = label_aps(s_i2t, s_t2i, rel)
            for d in ("i2t", "t2i"):
                aps[m][d] += ap[d]
            trials[name] = {"fold": fold.name, "method": m, "run_dir": name, "eval": eval_key, "metrics": plain(res),
                            "ap": ap}
            save()
            step += 1
            k0 = f"P@{ks[0]}"
            yield Log(f"{fold.name} {m}: i2t {k0} {res['i2t'].get(k0, float('nan')):.2f} mAP {res['i2t']['mAP']:.2f}, "
                      f"t2i {k0} {res['t2i'].get(k0, float('nan')):.2f} mAP {res['t2i']['mAP']:.2f}")
    results, stds = {}, {}
    for m in methods:
        results[m], stds[m] = mean_std_with_c(per_fold[m])
    result = {"dataset": dataset.name, "source": getattr(dataset, "source", ""), "kind": kind, "view": view,
              "representation": representation, "protocol": protocol, "folds": len(fold_list), "ks": list(ks),
              "methods": methods, "n_labels": n_labels, "results": results, "std": stds,
              "paper": paper_rows(kind, methods), "method_params": {m: plain(p) for m, p in params.items()},
              "experiment_dir": str(folder), "runs": runs}
    result["aps"] = aps
    if len(learned) > 1:
        result["paired"] = paired_against_first(aps, learned)
    yield Progress(total, total, "done")
    yield Finished(summary=result)


def run_bitr_labels_seeds(dataset: Any, *, seeds: Sequence[int], out: str | Path | None = None,
                          representation_params: dict[str, Any] | None = None, **kwargs: Any) -> Iterator[Event]:
    """The label table built once per seed (``OUT/seed-<s>``, each an ordinary :func:`run_bitr_labels` experiment)
    and reported as the mean over the builds with their standard deviation; each method paired against the first
    with each query's AP averaged over the builds first. One seed is exactly :func:`run_bitr_labels`."""
    from crossview.core.run_settings import parse_seeds
    from crossview.experiments.bitr_table import mean_std_with_c

    seeds = parse_seeds(seeds)
    rep_kw = dict(representation_params or {})
    if len(seeds) == 1:
        yield from run_bitr_labels(dataset, seed=seeds[0], out=out,
                                   representation_params={**rep_kw, "seed": seeds[0]}, **kwargs)
        return
    folder = Path(out) if out is not None else new_experiment_dir(
        f"bitr-{kwargs.get('kind', 'labels')}", f"{dataset.name}-{kwargs.get('representation', 'modern')}")
    results = yield from run_seed_builds(
        folder, seeds, "label experiment", EXPERIMENT_FILE,
        lambda s, d: run_bitr_labels(dataset, seed=s, out=d, representation_params={**rep_kw, "seed": s}, **kwargs))
    if results is None:
        return
    out_result = dict(results[0])
    means, stds = {}, {}
    for m in results[0]["methods"]:    # a build's C is listed fold by fold; the builds' lists one after another
        means[m], stds[m] = mean_std_with_c([r["results"][m] for r in results])
    learned = [m for m in results[0]["methods"] if m != "random"]
    aps = {m: {d: np.stack([np.asarray(r["aps"][m][d], dtype=np.float64) for r in results]) for d in ("i2t", "t2i")}
           for m in learned}
    out_result.update(results=means, seed_std=stds, seeds=[int(x) for x in seeds], experiment_dir=str(folder),
                      per_seed={m: [r["results"][m] for r in results] for m in results[0]["methods"]},
                      runs={m: [d for r in results for d in r["runs"].get(m, [])] for m in results[0]["runs"]},
                      aps={m: {d: v.tolist() for d, v in a.items()} for m, a in aps.items()})
    out_result.pop("paired", None)
    if len(learned) > 1:
        out_result["paired"] = paired_against_first(aps, learned)
    yield Finished(summary=out_result)


def bitr_labels(dataset: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_bitr_labels` drained: the result."""
    from crossview.engine.runs import drain
    return drain(run_bitr_labels(dataset, **kwargs), "label experiment (run it again with the same --exp-dir)")


# ====================================================================== layout
def _columns(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(d, k) for d in ("i2t", "t2i") for k in [*(f"P@{k}" for k in result["ks"]), "mAP"]]


def _cell(v: Any) -> str:
    return "-" if v is None or not np.isfinite(v) else f"{v:.2f}"


def _title(result: dict[str, Any]) -> str:
    n = "3" if result["kind"] == "phrases" else "4"
    what = "image <-> phrase" if result["kind"] == "phrases" else "image <-> label"
    builds = f"; the mean of {len(result['seeds'])} builds" if several_seeds(result) else ""
    return (f"Experiment {n} (BITR paper): {what} retrieval on {result['dataset']} ({result['n_labels']} "
            f"{result['kind']}), representation {result['representation']}; {result['protocol']}{builds}")


def _table_rows(result: dict[str, Any]) -> tuple[list[tuple[str, list[str]]], list[tuple[str, list[str]]]]:
    cols = _columns(result)
    ours = [(METHOD_LABELS[m], [_cell(result["results"][m].get(d, {}).get(k)) for d, k in cols])
            for m in result["methods"]]
    if several_seeds(result):       # the spread over the builds, under the means
        ours += [(f"sd {METHOD_LABELS[m]}", [_cell(result["seed_std"][m].get(d, {}).get(k)) for d, k in cols])
                 for m in result["methods"]]
    paper = [(METHOD_LABELS[m], [_cell(result["paper"][m].get(d, {}).get(k)) if k in result["paper"][m].get(d, {})
                                 else "" for d, k in cols]) for m in result["methods"] if m in result["paper"]]
    return ours, paper


def _paired_rows(result: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """The paired section (:func:`paired_against_first`): title, header and rows; no rows without one."""
    pr = result.get("paired") or {}
    if not pr.get("rows"):
        return "", [], []
    base = METHOD_LABELS[pr["baseline"]]

    def cell(v: dict[str, Any]) -> str:
        return f"{v['diff']:+.1f} ({v['ci'][0]:+.1f} to {v['ci'][1]:+.1f})"

    first = next(iter(pr["rows"].values()))
    title = (f"Paired against {base} on the same queries ({first['i2t']['queries']} images, "
             f"{first['t2i']['queries']} {result['kind']}): mAP of the method minus {base}, points, with the 95% "
             "interval (each query's average precision one observation"
             + (f", averaged over the {len(result['seeds'])} builds first" if several_seeds(result)
                else "") + ", queries resampled) and the minimal detectable difference (80% power, two-sided 5%)")
    header = [f"Method - {base}", "Im2Text mAP", "minimal detectable", "Text2Im mAP", "minimal detectable"]
    rows = [[METHOD_LABELS[m], cell(r["i2t"]), f"{r['i2t']['mde']:.1f}", cell(r["t2i"]), f"{r['t2i']['mde']:.1f}"]
            for m, r in pr["rows"].items()]
    return title, header, rows


#: the heading of :func:`_settings`' lines; a C is listed once however many folds and builds chose it
SETTINGS_TITLE = "Parameters given, and the values of C that cross-validation chose (over the folds and builds):"


def _settings(result: dict[str, Any]) -> list[str]:
    """A line for each row trained with parameters of its own or a C chosen by cross-validation: what it was given,
    and the values of C its folds chose (``BITR-C: c_grid = paper; C used: i2t 10000 / 1000, t2i 1000``)."""
    from crossview.experiments.bitr_table import c_text

    lines = []
    for m in result["methods"]:
        given = (result.get("method_params") or {}).get(m) or {}
        c = result["results"][m].get("C")
        if given or c:
            lines.append(f"{METHOD_LABELS[m]}: " + ", ".join(f"{k} = {v}" for k, v in given.items())
                         + (f"{'; ' if given else ''}C used: {c_text(c)}" if c else ""))
    return lines


def format_table(result: dict[str, Any]) -> str:
    cols = _columns(result)
    heads = [f"{'Im2Text' if d == 'i2t' else 'Text2Im'} %{k}" for d, k in cols]
    w0 = 8
    widths = [max(8, len(h)) for h in heads]
    lines = [_title(result), "", "Method".ljust(w0) + "".join("  " + h.rjust(w) for h, w in zip(heads, widths))]
    ours, paper = _table_rows(result)
    lines += [label.ljust(w0) + "".join("  " + c.rjust(w) for c, w in zip(cells, widths)) for label, cells in ours]
    if paper:
        lines += ["", f"The paper's Table {'5' if result['kind'] == 'phrases' else '6'} (IAPR TC-12, CTR "
                      "features; other data and features than ours):"]
        lines += [label.ljust(w0) + "".join("  " + c.rjust(w) for c, w in zip(cells, widths)) for label, cells in paper]
    title, header, rows = _paired_rows(result)
    if rows:
        lines += ["", title, *text_table(header, rows)]
    lines += ["", "Im2Text: each test image ranks the labels seen in training (images without one left out); "
                  "Text2Im: each label some test image has ranks the test images; percentages"
              + ("; rows 'sd': the standard deviation over the builds (seeds "
                 f"{', '.join(map(str, result['seeds']))})" if several_seeds(result) else "")]
    settings = _settings(result)
    if settings:
        lines += ["", SETTINGS_TITLE, *settings]
    return "\n".join(lines)


def format_markdown(result: dict[str, Any], command: str | None = None) -> str:
    cols = _columns(result)
    head = "| Method | " + " | ".join(f"{'Im2Text' if d == 'i2t' else 'Text2Im'} %{k}" for d, k in cols) + " |"
    sep = "|---|" + "---:|" * len(cols)
    out = [f"# {_title(result)}", ""]
    if command:
        out += ["```", command, "```", ""]
    ours, paper = _table_rows(result)
    out += [head, sep] + [f"| {label} | " + " | ".join(cells) + " |" for label, cells in ours]
    title, header, rows = _paired_rows(result)
    if rows:
        out += ["", title, "", *markdown_table(header, rows)]
    if paper:
        out += ["", f"The paper's Table {'5' if result['kind'] == 'phrases' else '6'} (IAPR TC-12, CTR features; "
                    "other data and features than ours):", "", head, sep]
        out += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in paper]
    out += ["", "Im2Text: each test image ranks the labels seen in the fold's training images (images without one "
                "left out of both metrics); Text2Im: each label some test image has ranks the test images; "
                "percentages, mean over the folds" + (f" and over {len(result['seeds'])} builds (seeds "
                f"{', '.join(map(str, result['seeds']))}; rows 'sd': the standard deviation over them)"
                if several_seeds(result) else "") + ". Runs: `" + result["experiment_dir"] + "`."]
    settings = _settings(result)
    if settings:
        out += ["", SETTINGS_TITLE, "",
                *(f"- {line}" for line in settings)]
    return "\n".join(out) + "\n"
