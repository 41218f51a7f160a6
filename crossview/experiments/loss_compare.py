"""Paper 004's question as one experiment: does the hardest-negative triplet loss still win for image-caption
retrieval against the losses of metric learning?

Each loss trains the same VSE++ model (same encoders, same features) through the run engine, once per seed:

- ``vsepp``: the triplet loss with the hardest negative (method ``vsepp``, ``loss=vsepp``): the baseline;
- ``vse0``: the triplet loss summed over all negatives (``vsepp``, ``loss=vse0``);
- ``smoothap``: SmoothAP (method ``smoothap``, ``loss=smoothap``);
- ``infonce``: InfoNCE / NT-Xent (``smoothap``, ``loss=infonce``).

Every (loss, seed) is an ordinary run folder ``<loss>-seed<N>`` under one experiment folder (with an
``experiment.json``), so the app's runs list shows them and its Inspect panel compares any two; running the
experiment again on the same folder reads finished runs back and resumes unfinished ones. Each loss keeps its
method's defaults (chosen by cross-validation on real photos, see the cards) unless ``epochs`` or ``params``
say otherwise; ``epochs`` sets every loss's ``max_epochs`` and moves its ``lr_decay_epoch`` in proportion.

The evaluation split is the dataset's ``test`` split (``val`` then chooses each run's epoch), else ``val``
(nothing then chooses the epoch: the last one is kept, as ``crossview train`` does). The result: R@1/5/10 both
ways and rsum, mean and standard deviation over the seeds, and a paired comparison per query against the
baseline: for each query, the rank of its first ground truth under the loss and under the baseline trained with
the same seed; how many queries each loss wins, loses and ties (pooled over the seeds), the two-sided sign test
and the Wilcoxon signed-rank test (ties dropped) of those rank differences, and the queries it wins and loses
most (by the mean rank difference over the seeds).

:func:`run_loss_compare` is a generator of :mod:`crossview.core.events` whose last event is
``Finished(summary=result)``; :func:`loss_compare` drains it; :func:`format_table` and :func:`format_markdown`
lay the result out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.events import Event, Finished, Log, Progress
from crossview.experiments._common import mean_std, new_experiment_dir, plain, relay_run, run_finished

__all__ = ["LOSSES", "DEFAULT_LOSSES", "BASELINE", "EXPERIMENT_FILE", "parse_losses", "parse_loss_params",
           "paired", "run_loss_compare", "loss_compare", "format_table", "format_markdown",
           "default_experiment_dir"]

#: loss name -> (registered method, the parameters that select the loss)
LOSSES: dict[str, tuple[str, dict[str, Any]]] = {
    "vsepp": ("vsepp", {"loss": "vsepp"}), "vse0": ("vsepp", {"loss": "vse0"}),
    "smoothap": ("smoothap", {"loss": "smoothap"}), "infonce": ("smoothap", {"loss": "infonce"})}
LABELS = {"vsepp": "triplet, hardest negative: VSE++", "vse0": "triplet, sum of negatives: VSE0",
          "smoothap": "SmoothAP", "infonce": "InfoNCE / NT-Xent"}
DEFAULT_LOSSES = ("vsepp", "vse0", "smoothap", "infonce")
BASELINE = "vsepp"
EXPERIMENT_FILE = "experiment.json"
KS = (1, 5, 10)
N_EXTREMES = 10


def parse_losses(value: str | Sequence[str]) -> list[str]:
    """``"vsepp,smoothap"`` -> ``["vsepp", "smoothap"]`` (checked, duplicates dropped, order kept)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for raw in items:
        name = str(raw).strip().lower()
        if not name:
            continue
        if name not in LOSSES:
            raise CrossViewError(f"unknown loss {name!r}; choose from {', '.join(LOSSES)}")
        if name not in out:
            out.append(name)
    if not out:
        raise CrossViewError(f"no loss to compare; give --losses from {', '.join(LOSSES)}")
    return out


def parse_loss_params(items: Sequence[str] | None, losses: Sequence[str]) -> dict[str, dict[str, str]]:
    """``["smoothap.tau=0.01", "embed_dim=512"]`` -> ``{"smoothap": {"tau": "0.01"}, "*": {"embed_dim": "512"}}``
    (``LOSS.NAME=VALUE`` for one loss, ``NAME=VALUE`` for every loss)."""
    out: dict[str, dict[str, str]] = {}
    for item in items or []:
        left, eq, value = item.partition("=")
        loss, dot, key = left.rpartition(".") if "." in left else ("*", "", left)
        loss, key = loss.strip().lower(), key.strip()
        if not eq or not key:
            raise CrossViewError(f"--set {item!r}: write NAME=VALUE (every loss) or LOSS.NAME=VALUE, e.g. "
                                 "--set smoothap.tau=0.01")
        if loss != "*" and loss not in losses:
            raise CrossViewError(f"--set {item!r}: {loss!r} is not among the losses compared ({', '.join(losses)})")
        if key == "loss":
            raise CrossViewError(f"--set {item!r}: the loss is what the experiment varies; choose it with --losses")
        out.setdefault(loss, {})[key] = value.strip()
    return out


def _coerce(method: str, key: str, value: Any) -> Any:
    """A parameter value from the command line, typed by the method's card."""
    if not isinstance(value, str):
        return value
    from crossview.methods import method_card

    card = method_card(method)
    if card is None or key not in card.params:
        raise CrossViewError(f"{method} has no parameter {key!r}; 'crossview train {method} --help' lists them")
    return card.params[key].coerce(value, method)


def loss_params(loss: str, given: dict[str, dict[str, Any]] | None, epochs: int | None) -> dict[str, Any]:
    """The parameters of ``loss``'s runs: the method's defaults, ``epochs`` (max_epochs, and lr_decay_epoch
    in proportion to the method's default schedule), then those given for every loss, then for this loss."""
    from crossview.methods import method_class

    method, fixed = LOSSES[loss]
    out: dict[str, Any] = {}
    if epochs is not None:
        if int(epochs) < 1:
            raise CrossViewError(f"--epochs must be >= 1, got {epochs}")
        d = method_class(method).default_params()
        out["max_epochs"] = int(epochs)
        if d.get("lr_decay_epoch") and d.get("max_epochs"):
            out["lr_decay_epoch"] = max(1, round(int(epochs) * d["lr_decay_epoch"] / d["max_epochs"]))
    names = method_class(method).param_names()
    for k, v in ((given or {}).get("*") or {}).items():     # every loss whose method has the parameter
        if k in names:
            out[k] = _coerce(method, k, v)
    for k, v in ((given or {}).get(loss) or {}).items():
        out[k] = _coerce(method, k, v)
    return {**out, **fixed}


def paired(ranks_loss: Sequence[np.ndarray], ranks_base: Sequence[np.ndarray],
           query_ids: np.ndarray | None = None) -> dict[str, Any]:
    """Per-query comparison of one loss against the baseline, seed by seed (rank arrays of the same queries),
    pooled: ``won`` / ``lost`` / ``tied`` (the loss ranks the ground truth higher / lower / the same), the
    two-sided sign test and Wilcoxon signed-rank p-values of the rank differences (ties dropped), the median
    difference, and the queries with the largest mean gain and loss over the seeds (``query_ids`` names them)."""
    from crossview.eval.compare import sign_test, wilcoxon_test

    if len(ranks_loss) != len(ranks_base) or not ranks_loss:
        raise CrossViewError("paired comparison needs the same seeds for both losses")
    a = [np.asarray(r, dtype=np.int64) for r in ranks_loss]
    b = [np.asarray(r, dtype=np.int64) for r in ranks_base]
    if any(x.shape != y.shape or x.ndim != 1 for x, y in zip(a, b)) or len({x.shape for x in a}) != 1:
        raise CrossViewError("the runs ranked different query sets; compare runs evaluated on the same split")
    delta = np.stack(a) - np.stack(b)                     # (seeds, queries): negative = the loss ranks higher
    flat = delta.ravel()
    won, lost = int((flat < 0).sum()), int((flat > 0).sum())
    wil = wilcoxon_test(flat)
    mean = delta.mean(axis=0)
    ids = np.arange(delta.shape[1]) if query_ids is None else np.asarray(query_ids)
    order = np.argsort(mean, kind="stable")
    best = [(int(ids[i]), float(mean[i])) for i in order[:N_EXTREMES] if mean[i] < 0]
    worst = [(int(ids[i]), float(mean[i])) for i in order[::-1][:N_EXTREMES] if mean[i] > 0]
    return {"n": int(flat.size), "seeds": int(delta.shape[0]), "won": won, "lost": lost,
            "tied": int(flat.size - won - lost), "sign_p": sign_test(won, lost), "wilcoxon_p": wil,
            "median_delta": float(np.median(flat)), "most_won": best, "most_lost": worst}


def default_experiment_dir(dataset_name: str) -> Path:
    """``<runs folder>/loss-compare-<dataset>-<timestamp>`` (a new name)."""
    return new_experiment_dir("loss-compare", dataset_name)


def _check_same(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The experiment record already in ``folder`` (``{}`` for none); another experiment's is refused."""
    from crossview.core.io import read_json

    path = folder / EXPERIMENT_FILE
    if not path.is_file():
        if folder.is_dir() and any(folder.iterdir()):
            raise CrossViewError(f"{folder} is not empty and holds no loss-compare experiment; give a new or empty "
                                 "--exp-dir")
        return {}
    try:
        old = read_json(path)
    except Exception:  # noqa: BLE001 - damaged JSON: one line
        old = None
    if not isinstance(old, dict) or old.get("experiment") != "loss-compare":
        raise CrossViewError(f"{path}: not a loss-compare experiment (or damaged); give another --exp-dir")
    for key in ("dataset_fingerprint", "split", "val_split", "encoders"):
        if old.get(key) != record[key]:
            raise CrossViewError(f"{folder} holds a loss comparison with another {key.replace('_', ' ')} "
                                 f"({old.get(key)!r}, now {record[key]!r}); give a new --exp-dir")
    for loss, p in (old.get("params") or {}).items():
        if loss in record["params"] and p != record["params"][loss]:
            raise CrossViewError(f"{folder}: its {loss} runs were trained with {p}, now {record['params'][loss]}; "
                                 "give a new --exp-dir, or the same --epochs / --set")
    return old


def run_loss_compare(dataset: Any, *, losses: Sequence[str] = DEFAULT_LOSSES, seeds: int = 3,
                     epochs: int | None = None, params: dict[str, dict[str, Any]] | None = None,
                     split: str | None = None, out: str | Path | None = None, device: str = "auto",
                     image_encoder: str | None = None, text_encoder: str | None = None,
                     should_stop: Callable[[], bool] | None = None) -> Iterator[Event]:
    """Train every loss with every seed and compare them (see the module docstring). ``params``:
    ``{"*": {...}, "smoothap": {...}}`` (every loss; one loss). Yields events; the last is
    ``Finished(summary=result)`` with ``{"dataset", "split", "selection", "losses", "seeds", "baseline",
    "results": {loss: {"i2t", "t2i", "rsum", "train_seconds"}}, "std": {...}, "per_seed": {...},
    "paired": {loss: {"i2t": ..., "t2i": ...}}, "params", "experiment_dir", "runs"}``."""
    from crossview.core.io import atomic_write_json
    from crossview.engine.run import RANKS, read_summary, resume, train
    from crossview.methods import create_method

    losses = parse_losses(list(losses))
    if not isinstance(seeds, (int, np.integer)) or isinstance(seeds, bool) or seeds < 1:
        raise CrossViewError(f"--seeds must be a whole number >= 1, got {seeds!r}")
    from crossview.methods import method_class

    for k in ((params or {}).get("*") or {}):
        if not any(k in method_class(LOSSES[loss][0]).param_names() for loss in losses):
            raise CrossViewError(f"--set {k}=...: no method of the losses compared has a parameter {k!r}; "
                                 "'crossview train vsepp --help' and 'crossview train smoothap --help' list them")
    per_loss = {loss: loss_params(loss, params, epochs) for loss in losses}
    for loss, p in per_loss.items():            # bad names and values fail now, before any training
        create_method(LOSSES[loss][0], **p).check_params()
    splits = dict(getattr(dataset, "splits", {}) or {})
    if "train" not in splits:
        raise CrossViewError(f"dataset {dataset.name!r} has no train split; the losses need one to train on")
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
    folder = Path(out) if out is not None else default_experiment_dir(dataset.name)
    if folder.exists() and not folder.is_dir():
        raise CrossViewError(f"--exp-dir {folder} is a file; give a folder for the experiment's runs")
    record = {"experiment": "loss-compare", "data": getattr(dataset, "source", None) or None,
              "dataset": dataset.name, "dataset_fingerprint": dataset.fingerprint(), "split": split,
              "val_split": val_split, "encoders": {"image": image_encoder, "text": text_encoder},
              "params": plain(per_loss)}
    old = _check_same(folder, record)
    params_all = {**(old.get("params") or {}), **record["params"]}
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / EXPERIMENT_FILE, {**record, "params": params_all})
    stop = should_stop or (lambda: False)
    yield Log(f"loss comparison on {dataset.name}: {', '.join(losses)} x {seeds} seed(s), evaluated on {split} "
              f"({selection}); runs in {folder}" + (" (continuing: finished runs are read back)" if old else ""))
    total = len(losses) * seeds
    summaries: dict[str, list[dict[str, Any]]] = {loss: [] for loss in losses}
    ranks: dict[str, list[dict[str, np.ndarray]]] = {loss: [] for loss in losses}
    runs: dict[str, list[str]] = {loss: [] for loss in losses}
    query_ids: dict[str, np.ndarray] = {}
    k = 0
    for seed in range(int(seeds)):
        for loss in losses:
            method, _ = LOSSES[loss]
            run_dir = folder / f"{loss}-seed{seed}"
            runs[loss].append(str(run_dir))
            yield Progress(k, total, f"{loss} seed {seed}")
            if run_finished(run_dir):
                yield Log(f"{loss} seed {seed}: finished earlier ({run_dir.name}), read back")
            else:
                if (run_dir / "config.json").is_file():
                    yield Log(f"{loss} seed {seed}: resuming {run_dir.name}")
                    it = resume(run_dir, data=dataset)
                else:
                    it = train(method, dataset, run_dir=run_dir, params={**per_loss[loss], "seed": seed},
                               split=split, train_split="train", val_split=val_split, device=device, seed=seed,
                               image_encoder=image_encoder, text_encoder=text_encoder)
                if (yield from relay_run(it, f"{loss} seed {seed}", folder, stop)):
                    return
                if not run_finished(run_dir):
                    raise CrossViewError(f"{run_dir}: the run did not finish; see its metrics.jsonl, then run the "
                                         f"experiment again with --exp-dir {folder} to resume it")
            s = read_summary(run_dir)
            with np.load(run_dir / RANKS, allow_pickle=False) as z:
                ranks[loss].append({"i2t": z["i2t"].copy(), "t2i": z["t2i"].copy()})
                query_ids.setdefault("i2t", z["image_ids"].copy())
                query_ids.setdefault("t2i", z["caption_ids"].copy())
            summaries[loss].append({"i2t": {f"R@{q}": float(s["i2t"][f"R@{q}"]) for q in KS},
                                    "t2i": {f"R@{q}": float(s["t2i"][f"R@{q}"]) for q in KS},
                                    "rsum": float(s["rsum"]), "train_seconds": float(s.get("train_seconds") or 0)})
            k += 1
            yield Log(f"{loss} seed {seed}: rsum {s['rsum']:.1f} ({run_dir.name})")
    base = BASELINE if BASELINE in losses else losses[0]
    results, stds = {}, {}
    for loss in losses:
        results[loss], stds[loss] = mean_std(summaries[loss])
    pairs = {loss: {d: paired([r[d] for r in ranks[loss]], [r[d] for r in ranks[base]], query_ids.get(d))
                    for d in ("i2t", "t2i")} for loss in losses if loss != base}
    n_img = len(query_ids.get("i2t", ()))
    n_cap = len(query_ids.get("t2i", ()))
    result = {"dataset": dataset.name, "source": getattr(dataset, "source", ""), "split": split,
              "val_split": val_split, "selection": selection, "train_images": len(splits["train"]),
              "test_images": n_img, "test_captions": n_cap, "losses": losses, "seeds": int(seeds),
              "baseline": base, "results": results, "std": stds, "per_seed": summaries, "paired": pairs,
              "params": plain(per_loss), "experiment_dir": str(folder), "runs": runs}
    atomic_write_json(folder / EXPERIMENT_FILE, {**record, "params": params_all, "result": plain(result)})
    yield Progress(total, total, "done")
    yield Finished(summary=result)


def loss_compare(dataset: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_loss_compare` drained; returns its result."""
    result = None
    for ev in run_loss_compare(dataset, **kwargs):
        if isinstance(ev, Finished):
            result = ev.summary
    if result is None:
        raise CrossViewError("the loss comparison stopped before it finished; run it again to continue")
    return result


# ====================================================================== layout
def _p(p: float) -> str:
    return "<0.001" if p < 1e-3 else f"{p:.3f}"


def _cell(mean: float, sd: float, n: int) -> str:
    return f"{mean:.1f}" if n < 2 else f"{mean:.1f} ± {sd:.1f}"


def _rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    n = int(result["seeds"])
    for loss in result["losses"]:
        r, s = result["results"][loss], result["std"][loss]
        rows.append([loss, *[_cell(r[d][f"R@{q}"], s[d][f"R@{q}"], n) for d in ("i2t", "t2i") for q in KS],
                     _cell(r["rsum"], s["rsum"], n), f"{r['train_seconds']:.0f}"])
    return rows


def _paired_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for loss, pr in result["paired"].items():
        cells = [loss]
        for d in ("i2t", "t2i"):
            p = pr[d]
            cells += [f"{p['won']} / {p['lost']} / {p['tied']}", _p(p["sign_p"]), _p(p["wilcoxon_p"])]
        rows.append(cells)
    return rows


def _title(result: dict[str, Any]) -> str:
    return (f"Loss comparison (paper 004) on {result['dataset']}: train {result['train_images']} images, evaluated "
            f"on {result['split']} ({result['test_images']} images, {result['test_captions']} captions); "
            f"{result['selection']}; mean ± sd over {result['seeds']} seed(s)")


HEAD = ["loss", "i2t R@1", "R@5", "R@10", "t2i R@1", "R@5", "R@10", "rsum", "train s"]
PHEAD = ["loss", "i2t won / lost / tied", "sign p", "Wilcoxon p", "t2i won / lost / tied", "sign p", "Wilcoxon p"]


def format_table(result: dict[str, Any]) -> str:
    """The result as plain text: the metric table, then the paired comparison against the baseline."""
    def table(head: list[str], rows: list[list[str]]) -> list[str]:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)] if rows else \
            [len(h) for h in head]
        fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                      for i, (c, w) in enumerate(zip(cells, widths)))
        return [fmt(head), *[fmt(r) for r in rows]]

    lines = [_title(result), "", *table(HEAD, _rows(result))]
    if result["paired"]:
        lines += ["", f"Per query against {result['baseline']} (same seed; won: the loss ranks the first ground "
                      f"truth higher; pooled over {result['seeds']} seed(s)):", *table(PHEAD, _paired_rows(result))]
    lines += ["", f"runs: {result['experiment_dir']}"]
    return "\n".join(lines)


def format_markdown(result: dict[str, Any], command: str | None = None) -> str:
    """The result as a Markdown report (with the command that made it)."""
    def md(head: list[str], rows: list[list[str]]) -> list[str]:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *["| " + " | ".join(r) + " |" for r in rows]]

    out = [f"## {_title(result)}", ""]
    if command:
        out += ["```", command, "```", ""]
    rows = [[f"{r[0]} ({LABELS[r[0]]})", *r[1:]] for r in _rows(result)]
    out += md(HEAD, rows)
    if result["paired"]:
        out += ["", f"Per query against **{result['baseline']}** trained with the same seed: won / lost / tied = "
                    "queries whose first ground truth the loss ranks higher / lower / the same, pooled over "
                    f"{result['seeds']} seed(s); two-sided sign test and Wilcoxon signed-rank test of the rank "
                    "differences (ties dropped).", "", *md(PHEAD, _paired_rows(result)), ""]
        for loss, pr in result["paired"].items():
            for d, what in (("i2t", "images"), ("t2i", "captions")):
                won = ", ".join(f"{q} ({v:+.1f})" for q, v in pr[d]["most_won"][:5]) or "none"
                lost = ", ".join(f"{q} ({v:+.1f})" for q, v in pr[d]["most_lost"][:5]) or "none"
                out.append(f"- {loss} {d}: {what} it wins most (mean rank change): {won}; loses most: {lost}")
    params = "; ".join(f"{loss}: " + ", ".join(f"{k}={v}" for k, v in p.items()) for loss, p in result["params"].items())
    out += ["", f"Parameters besides the methods' defaults: {params}.", f"Runs: `{result['experiment_dir']}`.", ""]
    return "\n".join(out)
