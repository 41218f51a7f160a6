"""What the quality benches on the Flickr8k sample share: reusable runs in a work folder, the CV folds' pooled ranks,
each scoring's CV choice with its paired effect against plain (on the folds and on val), fused runs that reuse
their members' fold runs, and the table cells.

A run lives in ``WORK/<name>`` (an ordinary run folder: :func:`crossview.engine.runs.ensure_run` reads a finished
one back, resumes a stopped one, starts an absent one), its cross-validation fold runs in ``WORK/<name>/scoring-cv``
(the engine's ``--select cv``), so a second call costs only the evaluations. Used by ``bench/quality.py``,
``bench/scoring_quality.py`` and ``bench/fuse_quality.py``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: the re-scorings measured against plain (crossview.eval.scoring)
SCORINGS = ("csls", "isoftmax", "dsoftmax")
#: methods whose result depends on the seed (the others are deterministic given the data)
SEEDED = {"wsabie", "vsepp", "smoothap", "webly", "timam"}


def log(msg: str) -> None:
    """A progress line on stderr (the results file holds stdout only)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def one_thread() -> None:
    """Train on one CPU thread (the bench machine is shared): torch's intra-op threads and BLAS pools."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


def default_work(name: str) -> Path:
    """The default work folder of a bench: ``$TMPDIR/crossview-bench-<name>`` (kept between calls)."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"crossview-bench-{name}"


def check_defaults(method: str, run_dir: Path, params: dict[str, Any]) -> None:
    """Refuse (one line, exit 2) to read ``run_dir`` back as ``method``'s defaults when it was trained with other
    parameters than today's defaults (plus ``params``), e.g. a work folder kept from before a default moved: its
    numbers would be reported as the defaults'. Nothing is deleted; the line says what to do."""
    import json

    from crossview.methods import method_class

    cfg_file = Path(run_dir) / "config.json"
    if not cfg_file.is_file():
        return
    try:
        recorded = json.loads(cfg_file.read_text()).get("params") or {}
    except (OSError, ValueError, AttributeError):
        return                      # a damaged run: ensure_run says so in its own words
    want = json.loads(json.dumps({**method_class(method).default_params(), **params}, default=str))
    differ = {k: (recorded.get(k), v) for k, v in want.items() if k in recorded and recorded.get(k) != v}
    if differ:
        what = ", ".join(f"{k}={old} (today's default {new})" for k, (old, new) in differ.items())
        raise SystemExit(f"{run_dir}: trained with {what}, not {method}'s defaults at this commit; delete that "
                         "folder (or give another --work) to train it at today's defaults")


def ensure_trained(method: str, data: Any, run_dir: Path, seed: int = 0, **settings: Any) -> dict[str, Any]:
    """The summary of ``crossview train METHOD --data DATA`` with the method's defaults (``seed`` the run's seed and,
    for a seeded method other than 0, its ``seed`` parameter; ``settings``: more of
    :func:`crossview.engine.run.train`'s keywords, e.g. ``text_encoder``) in ``run_dir``: read back when finished,
    resumed when stopped, else trained now. Adds ``_wall`` (seconds this call took) and ``_state`` (``finished``,
    ``resumed`` or ``started``)."""
    from crossview.engine.run import train
    from crossview.engine.run_folder import read_summary
    from crossview.engine.runs import drain, ensure_run

    t0 = time.monotonic()
    params = {"seed": seed} if seed and method in SEEDED else None
    check_defaults(method, run_dir, params or {})
    state, events = ensure_run(run_dir, lambda: train(method, data, run_dir=run_dir, seed=seed, params=params,
                                                                **settings),
                               data=data if not isinstance(data, (str, Path)) else None)
    if events is None:
        summary = read_summary(run_dir)
    else:
        log(f"{method}: {state} training in {run_dir}")
        summary = drain(events, f"{method} run in {run_dir}")
    summary["_wall"] = time.monotonic() - t0
    summary["_state"] = state
    return summary


def run_ranks(run_dir: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``({"i2t", "t2i"}, caption_image)`` of a run's evaluation under plain scores: its ranks.npz's ``i2t_plain`` /
    ``t2i_plain`` where the run is scored by another scoring of its own (a fused run's default), else ``i2t`` /
    ``t2i``."""
    with np.load(Path(run_dir) / "ranks.npz") as z:
        plain = "i2t_plain" in z.files
        return ({d: z[f"{d}_plain" if plain else d] for d in ("i2t", "t2i")}, z["caption_image"])


def caption_image(run_dir: Path, split: str) -> np.ndarray:
    """The caption -> image map of a run's embeddings of ``split``."""
    from crossview.eval.embeddings import load_embeddings

    return np.asarray(load_embeddings(Path(run_dir) / f"embeddings_{split}.npz").caption_image, np.int64)


def fold_dirs(run_dir: Path) -> list[Path]:
    """The run's cross-validation fold runs (``RUN/scoring-cv/f1 ...``), in order."""
    from crossview.engine.scoring import CV_DIR

    return sorted((Path(run_dir) / CV_DIR).iterdir(), key=lambda p: int(p.name.lstrip("f") or 0))


def cv_ranks(run_dir: Path, scoring: str, param: float | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The ranks of the CV folds' held-out training photos (each fold against its own bank and gallery), pooled:
    ``({"i2t", "t2i"}, caption_image)`` with the folds' images numbered one after another."""
    from crossview.eval.embeddings import load_embeddings
    from crossview.eval.scoring import evaluate_scoring

    i2t, t2i, caps, offset = [], [], [], 0
    for fold in fold_dirs(run_dir):
        held = load_embeddings(fold / "embeddings_cv-test.npz")
        bank = load_embeddings(fold / "bank_cv-train.npz")
        res = evaluate_scoring(held, bank, scoring, param)
        i2t.append(res["ranks"]["i2t"])
        t2i.append(res["ranks"]["t2i"])
        caps.append(np.asarray(held.caption_image, np.int64) + offset)
        offset += held.image.shape[0]
    return {"i2t": np.concatenate(i2t), "t2i": np.concatenate(t2i)}, np.concatenate(caps)


def rsum(ranks: dict[str, np.ndarray]) -> float:
    from crossview.eval.metrics import rank_metrics, rsum_of

    return float(rsum_of(rank_metrics(np.asarray(ranks["i2t"])), rank_metrics(np.asarray(ranks["t2i"]))))


def diff_cell(eff: dict[str, Any], mde: bool = False) -> str:
    """``+12.3 (+4.5 to +20.1, p = 0.003)``: the rsum difference of a paired effect with its interval; with ``mde``
    also the smallest difference it could have detected (80% power, two-sided 5%: ``; detectable 7.9``)."""
    r = eff["rsum"]
    return (f"{r['diff']:+.1f} ({r['ci'][0]:+.1f} to {r['ci'][1]:+.1f}, p = {r['p']:.2g}"
            + (f"; detectable {eff['mde']['rsum']:.1f})" if mde else ")"))


def ci_cell(ranks: dict[str, np.ndarray], caps: np.ndarray) -> str:
    """``lo-hi``: the 95% bootstrap interval of rsum over the images (each with its captions); ``ranks`` of one run
    ``(n_queries,)`` (crossview.eval.bootstrap) or of several seeds ``(n_seeds, n_queries)``, whose hits are
    averaged per query first (one observation per query, as crossview.eval.paired does)."""
    from crossview.eval.bootstrap import DEFAULT_RESAMPLES, bootstrap_ci

    r_i, r_t = np.atleast_2d(ranks["i2t"]), np.atleast_2d(ranks["t2i"])
    if r_i.shape[0] == 1:
        lo, hi = bootstrap_ci(r_i[0], r_t[0], caps)["rsum"]
        return f"{lo:.1f}-{hi:.1f}"
    n = r_i.shape[1]
    ci = np.asarray(caps, np.int64)
    counts = np.random.default_rng(0).multinomial(n, np.full(n, 1.0 / n), size=DEFAULT_RESAMPLES).astype(np.float64)
    denom = counts @ np.bincount(ci, minlength=n).astype(np.float64)
    total = np.zeros(DEFAULT_RESAMPLES)
    for k in (1, 5, 10):
        hit_i = (r_i <= k).mean(axis=0)
        hit_t = np.bincount(ci, weights=(r_t <= k).mean(axis=0), minlength=n)
        total += 100 * (counts @ hit_i) / n + 100 * (counts @ hit_t) / np.maximum(denom, 1)
    lo, hi = np.percentile(total, [2.5, 97.5])
    return f"{lo:.1f}-{hi:.1f}"


def seed_val(run_dirs: Sequence[Path], scoring: str, param: float | None) -> dict[str, Any]:
    """The evaluation of several seeds' runs (same data, same evaluation split) under ``scoring`` with ``param``
    (given, not chosen again): ``{"i2t", "t2i": R@K means over the seeds, "rsum": mean, "rsum_sd": sd over the
    seeds, "seeds", "ranks": {"i2t", "t2i"} (n_seeds, n_queries)}``, the layout evaluate_run's result has, so the
    cells read either."""
    from crossview.engine.scoring import evaluate_run

    res = [evaluate_run(d, scoring, param=param, record=False) for d in run_dirs]
    out: dict[str, Any] = {d: {f"R@{k}": float(np.mean([r[d][f"R@{k}"] for r in res])) for k in (1, 5, 10)}
                           for d in ("i2t", "t2i")}
    rs = np.array([r["rsum"] for r in res], np.float64)
    out.update(rsum=float(rs.mean()), rsum_sd=float(rs.std()), seeds=len(res), scoring=res[0]["scoring"],
               ranks={d: np.stack([np.asarray(r["ranks"][d]) for r in res]) for d in ("i2t", "t2i")})
    return out


def recall_cells(res: dict[str, Any]) -> str:
    """``i2t R@1/5/10 | t2i R@1/5/10`` of a result (summary or evaluate_run's dict)."""
    return " | ".join("/".join(f"{res[d][k]:.1f}" for k in ("R@1", "R@5", "R@10")) for d in ("i2t", "t2i"))


def verdict(ci: Sequence[float]) -> str:
    lo, hi = ci
    return "better than plain" if lo > 0 else "worse than plain" if hi < 0 else "not distinguishable from plain"


def scoring_results(run_dir: Path, scorings: Sequence[str] = SCORINGS, bank_choice: bool = False
                    ) -> dict[str, dict[str, Any]]:
    """Plain and each of ``scorings`` for the run in ``run_dir``, the parameter chosen by ``--select cv`` (its fold
    runs trained now or read back): per scoring ``{"val": evaluate_run's result on the run's evaluation split,
    "choice": the CV record (None for plain), "cv_rsum": the chosen parameter's mean rsum over the folds,
    "cv_eff": paired effect against plain on the pooled folds, "val_eff": paired effect against plain on val,
    "bank": the in-sample --select bank choice (with ``bank_choice``), "wall": seconds}``. The choice is recorded
    in the run's scoring.json as ``crossview eval RUN --scoring S --select cv`` does."""
    from crossview.engine.run_folder import read_summary
    from crossview.engine.scoring import evaluate_run
    from crossview.eval.paired import paired_effect

    split = str(read_summary(run_dir)["split"])
    caps = caption_image(run_dir, split)
    t0 = time.monotonic()
    plain = evaluate_run(run_dir, "plain", record=False)
    out: dict[str, dict[str, Any]] = {"plain": {"val": plain, "choice": None, "wall": time.monotonic() - t0}}
    cv_plain = None
    for s in scorings:
        t0 = time.monotonic()
        res = evaluate_run(run_dir, s, select="cv")
        wall = time.monotonic() - t0
        sel = res["scoring"]
        cand = next(c for c in sel["candidates"] if c["param"] == sel["param"])
        if cv_plain is None:
            cv_plain = cv_ranks(run_dir, "plain", None)
            out["plain"]["cv_rsum"] = float(sel["plain_rsum"])
        cv_b, cv_caps = cv_ranks(run_dir, s, sel["param"])
        out[s] = {"val": res, "choice": sel, "cv_rsum": float(cand["rsum"]), "wall": wall,
                  "cv_eff": paired_effect(cv_plain[0], cv_b, cv_caps, seed=0),
                  "val_eff": paired_effect(plain["ranks"], res["ranks"], caps, seed=0),
                  "bank": evaluate_run(run_dir, s, select="bank", record=False)["scoring"] if bank_choice else None}
        log(f"{run_dir.name} + {s}: {sel['param_name']} = {sel['param']:g} (cv), CV {cand['rsum']:.1f}, "
            f"val {res['rsum']:.1f}")
    out["plain"]["caps"] = caps
    out["plain"]["cv_ranks"] = cv_plain
    out["plain"]["folds"] = out[scorings[0]]["choice"]["fold_images"] if scorings else None
    return out


def link_fold_runs(members: Sequence[Path], fused_dir: Path, folds: int) -> int:
    """Let a ``--weights auto`` fusion of ``members`` reuse their ``--select cv`` fold runs (the same method,
    settings, seed and image folds: :func:`crossview.engine.cv_runs.iter_fold_run` in both) instead of training
    them again: a link ``FUSED/cv/<k>-<member>-f<f>`` -> ``MEMBER/scoring-cv/f<f>`` for each finished fold run
    whose image folds are the ones the fusion draws (checked, else left for the fusion to train). Returns how many
    were linked."""
    import json

    from crossview.engine.cv_runs import FOLD_TEST, FOLD_TRAIN, load_run_dataset, run_folds
    from crossview.engine.run_folder import read_config
    from crossview.engine.runs import run_finished

    cfg0 = read_config(members[0])
    parts = run_folds(load_run_dataset(cfg0), cfg0, folds, int(cfg0.get("seed") or 0))
    linked = 0
    for k, m in enumerate(members):
        for f, (tr, te) in enumerate(parts):
            src = Path(m) / "scoring-cv" / f"f{f + 1}"
            dst = fused_dir / "cv" / f"{k + 1}-{Path(m).name}-f{f + 1}"
            if dst.exists() or not run_finished(src):
                continue
            derived = json.loads((src / "config.json").read_text(encoding="utf-8")).get("derived_splits") or {}
            if sorted(derived.get(FOLD_TRAIN, [])) != sorted(map(int, tr)) or \
                    sorted(derived.get(FOLD_TEST, [])) != sorted(map(int, te)):
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(src.resolve(), target_is_directory=True)
            linked += 1
    return linked


def ensure_fused(members: Sequence[Path], fused_dir: Path, weights: str = "auto") -> dict[str, Any]:
    """The summary of ``crossview fuse MEMBER ... --weights WEIGHTS --run-dir FUSED``: read back when finished
    (the same members), else fused now, ``auto`` reusing the members' fold runs (:func:`link_fold_runs`)."""
    from crossview.engine.fuse import FOLDS, fuse, iter_fuse
    from crossview.engine.run_folder import read_config
    from crossview.engine.runs import drain

    members = [Path(m).resolve() for m in members]
    if (fused_dir / "config.json").is_file():
        cfg = read_config(fused_dir)
        if [Path(p).resolve() for p in cfg.get("members") or []] == members and cfg.get("weights") == weights:
            return drain(iter_fuse(None, run_dir=fused_dir), "fusion")     # read back, or finished
        import shutil
        shutil.rmtree(fused_dir)                # other members: a fusion of its own
    if weights == "auto":
        n = link_fold_runs(members, fused_dir, FOLDS)
        log(f"{fused_dir.name}: {n} fold runs reused from the members' --select cv")
    return fuse(members, weights, run_dir=fused_dir)


def fused_fold_sets(fused_dir: Path) -> list[tuple[Any, Any]]:
    """Per fold of an ``auto`` fusion, ``(held-out embeddings, training bank)`` of the fused model under its chosen
    weights (crossview.engine.fuse.fused_embeddings of the members' fold runs, each standardised with its fold
    run's own bank): what a fused run's own scoring would be cross-validated on."""
    from crossview.engine.cv_runs import FoldRun
    from crossview.engine.fuse import _scales, fused_embeddings, score_stats
    from crossview.engine.run_folder import read_summary

    w = [float(x) for x in read_summary(fused_dir)["fusion"]["weights"]]
    runs = list((fused_dir / "cv").iterdir())
    out = []
    for f in sorted({int(p.name.rsplit("-f", 1)[1]) for p in runs}):
        fr = [FoldRun(p) for p in sorted((p for p in runs if int(p.name.rsplit("-f", 1)[1]) == f),
                                         key=lambda p: int(p.name.split("-")[0]))]
        stats = [{d: score_stats(x.bank, d) for d in ("i2t", "t2i")} for x in fr]
        scales = {d: _scales(stats, w, d) for d in ("i2t", "t2i")}
        out.append((fused_embeddings([x.emb for x in fr], scales), fused_embeddings([x.bank for x in fr], scales)))
    return out


def fused_scoring_cv(fused_dir: Path, scoring: str) -> tuple[dict[str, Any], dict[str, np.ndarray], np.ndarray]:
    """``(choice record, pooled fold ranks, caption_image)``: ``scoring``'s parameter for the fused run chosen on
    its folds (:func:`fused_fold_sets`; crossview.eval.scoring.iter_select_scoring_cv, as ``--select cv`` does for
    a run that can be trained again) and the folds' pooled ranks under it."""
    from crossview.eval.scoring import evaluate_scoring, iter_select_scoring_cv

    sets = fused_fold_sets(fused_dir)
    work = iter_select_scoring_cv(sets, scoring)
    while True:
        try:
            next(work)
        except StopIteration as stop:
            record = stop.value
            break
    i2t, t2i, caps, offset = [], [], [], 0
    for held, bank in sets:
        res = evaluate_scoring(held, bank, scoring, record["param"])
        i2t.append(res["ranks"]["i2t"])
        t2i.append(res["ranks"]["t2i"])
        caps.append(np.asarray(held.caption_image, np.int64) + offset)
        offset += held.image.shape[0]
    return record, {"i2t": np.concatenate(i2t), "t2i": np.concatenate(t2i)}, np.concatenate(caps)


def fused_cv_ranks(fused_dir: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The pooled ranks of the held-out training photos of an ``auto`` fusion's folds under its chosen weights
    (each fold's members standardised with their fold run's own training bank, as the choice scored them):
    ``({"i2t", "t2i"}, caption_image)``, the folds' images numbered one after another."""
    from crossview.engine.cv_runs import FoldRun
    from crossview.engine.fuse import _scales, fused_ranks, score_stats
    from crossview.engine.run_folder import read_summary

    summary = read_summary(fused_dir)
    w = [float(x) for x in summary["fusion"]["weights"]]
    cv = fused_dir / "cv"
    runs = sorted(cv.iterdir(), key=lambda p: (int(p.name.split("-")[0]), int(p.name.rsplit("-f", 1)[1])))
    n_members = len(w)
    folds = sorted({int(p.name.rsplit("-f", 1)[1]) for p in runs})
    i2t, t2i, caps, offset = [], [], [], 0
    for f in folds:
        fr = [FoldRun(p) for p in runs if int(p.name.rsplit("-f", 1)[1]) == f]
        if len(fr) != n_members:
            raise ValueError(f"{cv}: fold {f} has {len(fr)} member runs, expected {n_members}")
        stats = [{d: score_stats(x.bank, d) for d in ("i2t", "t2i")} for x in fr]
        scales = {d: _scales(stats, w, d) for d in ("i2t", "t2i")}
        r = fused_ranks([x.emb for x in fr], scales)
        i2t.append(r["i2t"])
        t2i.append(r["t2i"])
        caps.append(np.asarray(fr[0].emb.caption_image, np.int64) + offset)
        offset += fr[0].emb.image.shape[0]
    return {"i2t": np.concatenate(i2t), "t2i": np.concatenate(t2i)}, np.concatenate(caps)


#: where a per-method default-scoring table or function may live (searched in this order)
DEFAULT_SCORING_MODULES = ("crossview.engine.scoring", "crossview.methods")


def method_default_scoring(method: str, run_dir: Path | None = None) -> tuple[str, float | None, str]:
    """``(scoring, param, where it was read)``: the scoring ``crossview train METHOD`` reports with by default at
    this commit, read from the code (a public table or function whose name holds "default" and "scoring" in
    :data:`DEFAULT_SCORING_MODULES`, when the code has one: a dict ``{method: ("csls", 10) | {"name", "param"} |
    "plain"}`` or a function of the method's name), else from what the run in ``run_dir`` records (its config's
    ``scoring``), else plain (runs evaluate plain)."""
    import importlib

    for mod_name in DEFAULT_SCORING_MODULES:
        mod = importlib.import_module(mod_name)
        for name in dir(mod):
            if name.startswith("_") or "default" not in name.lower() or "scoring" not in name.lower():
                continue
            obj = getattr(mod, name)
            try:
                value = obj.get(method, "plain") if isinstance(obj, dict) else (
                    obj(method) if callable(obj) and not isinstance(obj, type) else None)
            except Exception:   # noqa: BLE001 - a helper with another signature: not the table we look for
                continue
            parsed = _parse_scoring(value)
            if parsed is not None:
                return (*parsed, f"{mod_name}.{name}")
    if run_dir is not None:
        from crossview.engine.run_folder import read_config

        parsed = _parse_scoring(read_config(run_dir).get("scoring"))
        if parsed is not None:
            return (*parsed, f"{Path(run_dir).name}/config.json")
    return "plain", None, "no per-method default scoring in this code (runs report plain)"


def _parse_scoring(value: Any) -> tuple[str, float | None] | None:
    from crossview.eval.scoring import PARAMS

    if isinstance(value, str) and value in PARAMS:
        return value, None
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], str) and value[0] in PARAMS:
        return value[0], (float(value[1]) if len(value) > 1 and value[1] is not None else None)
    if isinstance(value, dict):
        name = value.get("name", value.get("scoring"))
        if isinstance(name, str) and name in PARAMS:
            p = value.get("param")
            return name, (float(p) if p is not None else None)
    return None
