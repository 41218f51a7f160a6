"""A method's defaults re-examined on real photos with ``crossview tune``: chosen by 3-fold cross-validation of the
Flickr8k sample's 600 training photos, then the chosen point and the defaults each reported once on the 100 val
photos, with the paired difference.

Selection is never on the reported split: every trial is an ordinary ``crossview tune`` trial (``select_on=cv``:
each fold trains on 400 training photos and ranks the other 200; the val photos play no part), and the search runs
in stages, each a ``tune`` grid over a few parameters with the others fixed at the best point so far (the first
stage's grid holds the defaults, so the defaults' cross-validation score is measured beside the others). Stage 1's
point with the best mean rsum over the folds is taken; a later stage's best replaces the point so far only when its
paired difference over it on the folds' pooled queries has its interval above 0 (the rule the defaults move by, at
every step: a gain within the noise keeps the value, so a search does not drift to e.g. twice the components for
+0.3). Every trial runs under the method's default scoring, as ``crossview train`` does. Then:

- on the folds: the chosen point against the defaults, paired on the same held-out queries (the three folds' 600
  photos and 3,000 captions pooled; crossview.eval.paired, resampling photos with their captions). This interval
  is what decides whether a default moves (its lower end above 0), before val is read. It is optimistic for the
  chosen point (the best of many trials on the same folds), so val is the check;
- on val, once each: the defaults (``crossview train METHOD``, no flags) and the chosen point (the same with
  ``--set``), rsum with the bootstrap interval the run records, and the paired difference with its interval and
  the minimal detectable effect (2.80 x its standard error: 80% power at a two-sided 5% level).

    python bench/method_tune.py --method wsabie --stage "lr=0.001,0.003,0.01 lr_decay_epoch=0,12" \\
        --stage "margin=0.5,1,2" --work /tmp/w --out bench/results/tune_wsabie_flickr8k.md

"The defaults" are the method's defaults in the code that runs (its constructor's, which its card mirrors): run again
after a default moved, the search starts from the new ones. Each ``--stage`` is a space-separated list of
``crossview tune --grid`` items (typed by the method's card); a later stage's single-parameter grid skips the value
the best point so far already has (measured). Run
folders go to ``--work`` (default: a temporary folder); running again with the same ``--work`` reads finished
runs back and resumes interrupted ones. ``--stages-only`` stops after the search (no val runs).

``--seeds 0,1,2`` (the stochastic methods: WSABIE, TIMAM, the deep ones): every trial's folds and each val run are
trained once per seed (``crossview tune --seeds``), a trial is scored by the mean over its seeds first, and both
paired effects average each query's rank over the seeds before the photos are resampled (the folds' held-out queries
pooled per seed, then stacked). One seed (the default) is the folder layout and the numbers of old.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)

SAMPLE = _stamp.FLICKR8K


def _parse_seeds(text: str) -> list[int]:
    from crossview.core.errors import CrossViewError
    from crossview.core.run_settings import parse_seeds

    try:
        return list(parse_seeds(text))
    except CrossViewError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _seeds_text(seeds: list[int] | None) -> str:
    if not seeds or len(seeds) == 1:
        return f"seed {seeds[0] if seeds else 0} everywhere"
    return (f"every trial (each fold) and each val run trained at seeds {', '.join(map(str, seeds))}, each query "
            "averaged over the seeds first")


def _label(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items()) or "defaults"


def _ranks(run_dir: str | Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A run folder's held-out ranks ``({"i2t", "t2i"}, caption_image)``, as :func:`method_cv.pool_folds` takes them."""
    with np.load(Path(run_dir) / "ranks.npz") as z:
        return {"i2t": np.asarray(z["i2t"]), "t2i": np.asarray(z["t2i"])}, np.asarray(z["caption_image"])


def _pooled_seeds(runs: list[list[str]]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``runs[part][seed]`` (a trial's run folders: its folds, each at each seed) as one query set per seed,
    stacked ``(n_seeds, n_queries)``: what :func:`crossview.eval.paired.paired_effect` averages per query first."""
    from method_cv import pool_folds
    return pool_folds([[_ranks(part[s]) for part in runs] for s in range(len(runs[0]))])


#: the searchable keys that are the run's feature normalisations, not the method's parameters
NORM_KEYS = ("image_norm", "text_norm")


def _defaults(method: str) -> dict[str, Any]:
    """The method's defaults as a search point: its parameters and its default feature normalisations."""
    from crossview.methods import method_class

    cls = method_class(method)
    return {**cls.default_params(), "image_norm": cls.default_image_norm, "text_norm": cls.default_text_norm}


def _scored(method: str) -> str:
    """``scored with isoftmax beta=10 (method default)``: how ``crossview train METHOD`` ranks (its default scoring)."""
    from crossview.engine.scoring import describe_run_scoring, resolve_run_scoring

    return describe_run_scoring(resolve_run_scoring(method, "default"), None)


def _val_folder(name: str, params: dict[str, Any]) -> str:
    """``val-defaults``, or ``val-chosen-<8 hex of the point>``: a folder continued later with another chosen point
    (a stage added, a rule changed) is a new run, never the old point's run read back as this one's."""
    if name == "defaults":
        return "val-defaults"
    import hashlib
    import json

    key = json.dumps({k: params[k] for k in sorted(params)}, default=str)
    return f"val-{name}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def _incumbent(current: dict[str, Any] | None, challenger: dict[str, Any],
               defaults: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``(the best point so far, a note)`` after a stage whose best trial is ``challenger``: stage 1's best point
    (``current`` None); later, the challenger only when it scores above ``current`` and its paired difference on
    the pooled held-out queries has its 95% interval above 0 (the rule the defaults themselves move by), else
    ``current`` stays. The note says which and by how much."""
    from crossview.eval.paired import paired_effect

    if current is None:
        return challenger, ""
    what = _label({k: v for k, v in challenger["point"].items() if current["point"].get(k) != v})
    if challenger["score"] <= current["score"]:
        return current, f"; this stage's best ({what}, {challenger['score']:.1f}) does not beat it"
    base, caps = _pooled_seeds(current["runs"])
    r = paired_effect(base, _pooled_seeds(challenger["runs"])[0], caps, seed=0)["rsum"]
    gap = f"{what} {r['diff']:+.1f} (95% interval {r['ci'][0]:+.1f} to {r['ci'][1]:+.1f}) over the point so far"
    if r["ci"][0] > 0:
        return challenger, f"; {gap}: taken"
    return current, f"; {gap}: within the noise, so the point so far stays"


def _effect_line(eff: dict[str, Any], what: str) -> str:
    r = eff["rsum"]
    return (f"{what}: rsum {r['diff']:+.1f} (95% interval {r['ci'][0]:+.1f} to {r['ci'][1]:+.1f}, p = {r['p']:.3g}; "
            f"paired bootstrap over {eff['n_images']} photos with their {eff['n_captions']} captions; minimal "
            f"detectable effect {eff['mde']['rsum']:.1f}); i2t R@1 {eff['i2t']['R@1']['diff']:+.1f}, "
            f"t2i R@1 {eff['t2i']['R@1']['diff']:+.1f}")


def run(args: argparse.Namespace) -> int:
    from crossview.data import load_dataset
    from crossview.core.events import Log
    from crossview.engine.tune import TuneResult, parse_grid, tune
    from crossview.eval.paired import paired_effect
    from crossview.methods import method_class

    method = args.method
    ds = load_dataset(args.data)
    work = Path(args.work)
    defaults = _defaults(method)
    stages = [parse_grid(method, shlex.split(s)) for s in args.stage]
    seeds = args.seeds
    if args.val_only:
        return _val(args, ds, work, {})
    fixed = {k: v for k, v in (p.split("=", 1) for p in args.set)} if args.set else {}
    fixed = parse_grid(method, [f"{k}={v}" for k, v in fixed.items()]) if fixed else {}
    fixed = {k: v[0] for k, v in fixed.items()}
    from crossview.features.image import DEFAULT_IMAGE_ENCODER
    from crossview.features.text.base import DEFAULT_TEXT_ENCODER

    cls = method_class(method)
    image_enc = cls.default_image_encoder or DEFAULT_IMAGE_ENCODER
    text_enc = cls.default_text_encoder or DEFAULT_TEXT_ENCODER
    print(f"Data: {ds.name} ({len(ds.splits['train'])} train photos, {len(ds.splits.get('val', []))} val), "
          f"{method}'s default encoders (images {image_enc}, captions {text_enc}) and its default feature "
          f"normalisation; {_seeds_text(seeds)}; device {args.device}. Every run (each fold of each trial, and on "
          f"val) {_scored(method)}, as `crossview train {method}` ranks and reports: the fold scores and the val "
          "numbers are the ones a user of the defaults sees. rsum = R@1+5+10 both ways.\n")

    # ---- the search: stages of `crossview tune`, 3-fold CV of train, each stage around the best point so far
    trials: list[dict[str, Any]] = []          # every trial of every stage, with its full parameter point
    best: dict[str, Any] = dict(fixed)
    best_trial: dict[str, Any] | None = None   # the incumbent: stage 1's best, then a later stage's only on evidence
    for k, grid in enumerate(stages, 1):
        t0 = time.monotonic()
        if k > 1:   # a value the best point so far already has was measured: not trained again
            grid = {key: [v for v in vals if v != best.get(key, defaults.get(key))] or vals
                    for key, vals in grid.items()} if len(grid) == 1 else grid
        params = {key: v for key, v in best.items() if key not in grid}
        result = None
        for ev in tune(method, ds, grid, params={key: v for key, v in params.items() if key not in NORM_KEYS},
                       out=work / f"stage{k}", select_on=args.select_on, folds=args.folds, device=args.device,
                       seed=0, refit=False, seeds=seeds, scoring="default", image_norm=params.get("image_norm"),
                       text_norm=params.get("text_norm")):
            if isinstance(ev, TuneResult):
                result = ev
            elif isinstance(ev, Log):   # each finished trial, to stderr: a stage of 18 runs is an hour on the CPU
                print(f"[{time.strftime('%H:%M:%S')}] stage {k}: {ev.message}", file=sys.stderr, flush=True)
        assert result is not None
        stage_trials = []
        for r in result.trials:
            full = {**params, **r["point"]}
            parts = r.get("folds") or [{"rsum": r["rsum"], "run_dir": r["run_dir"],     # holdout: one part
                                        **({"runs": r["runs"]} if "runs" in r else {})}]
            stage_trials.append({"stage": k, "point": full, "score": r["score"], "sd": r["sd"],
                                 "folds": [f["rsum"] for f in parts],
                                 "runs": [f.get("runs") or [f["run_dir"]] for f in parts],     # [part][seed]
                                 "i2t": r["i2t"], "t2i": r["t2i"]})
        trials += stage_trials
        best_trial, verdict = _incumbent(best_trial, max(stage_trials, key=lambda t: t["score"]), defaults)
        top = best_trial
        best = {key: v for key, v in top["point"].items()}
        grid_text = " ".join(f"--grid {key}={','.join(map(str, v))}" for key, v in grid.items())
        set_text = " ".join(f"--{key.replace('_', '-')} {v}" if key in NORM_KEYS else f"--set {key}={v}"
                            for key, v in params.items())
        parts = f"{args.folds} folds" if args.select_on == "cv" else "1 run (a seeded 20% of train held out)"
        words = " ".join(w for w in (grid_text, set_text, f"--select-on {args.select_on} --no-refit") if w)
        print(f"- stage {k}: `crossview tune {method} --data <sample> {words}`: {len(result.trials)} points x "
              f"{parts} ({time.monotonic() - t0:.0f} s in this invocation; finished runs are read back); best "
              f"so far: {_label({k2: v for k2, v in best.items() if defaults.get(k2) != v}) or 'the defaults'} "
              f"({top['score']:.1f}){verdict}")

    def differs(point: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in point.items() if defaults.get(k) != v}

    # the defaults' trial (every stage-1 grid holds them): the first trial whose point equals the defaults
    default_trial = next((t for t in trials if not differs(t["point"])), None)
    seen: set[str] = set()
    unique = []
    for t in sorted(trials, key=lambda t: -t["score"]):
        key = _label(differs(t["point"]))
        if key not in seen:
            seen.add(key)
            unique.append(t)
    where = (f"Cross-validation of the {len(ds.splits['train'])} training photos ({args.folds} folds; each trains on "
             "the other folds and ranks its own photos; val not read)" if args.select_on == "cv" else
             f"A seeded 20% of the {len(ds.splits['train'])} training photos held out (trained on the rest; val not "
             "read)")
    print(f"\n### {where}, {len(unique)} distinct points, best first\n")
    print("| point (what differs from the defaults) | stage | rsum per fold | mean | sd | i2t R@1 | t2i R@1 |")
    print("|---|---|---|---|---|---|---|")
    shown = unique[:args.top]
    if default_trial is not None and default_trial not in shown:
        shown.append(default_trial)
    for t in shown:
        name = _label(differs(t["point"]))
        name = f"**{name}**" if t is best_trial else name
        print(f"| {name} | {t['stage']} | {' '.join(f'{x:.1f}' for x in t['folds'])} | {t['score']:.1f} | "
              f"{t['sd'] or 0:.1f} | {t['i2t']['R@1']:.1f} | {t['t2i']['R@1']:.1f} |")
    if len(unique) > len(shown):
        print(f"\n({len(unique) - len(shown)} more points below; all in {work}/stage*/tune.json)")
    assert best_trial is not None
    chosen = differs(best_trial["point"])
    print(f"\nChosen on train ({'cross-validation' if args.select_on == 'cv' else 'the held-out 20%'}): "
          f"{_label(chosen) or 'the defaults'} (in bold: stage 1's best point, replaced by a later stage's best only "
          "where its paired interval over the point so far, on the same queries, lay above 0: a change within the "
          "noise keeps the value it would have changed).")
    if default_trial is None:
        print("The defaults were not among the trials (give a first stage whose grid holds them).")
        return 1
    if not chosen:
        print("\n- The search chose the defaults: no other point beat them by the rule, so there is nothing to "
              "compare on the folds.")
        return 0 if args.stages_only else _val(args, ds, work, chosen)
    base, caps = _pooled_seeds(default_trial["runs"])
    cv = paired_effect(base, _pooled_seeds(best_trial["runs"])[0], caps, seed=0)
    per_fold = [b - a for a, b in zip(default_trial["folds"], best_trial["folds"])]
    averaged = (f"each query's rank averaged over the {len(seeds)} seeds first" if seeds and len(seeds) > 1
                else "")
    on = (f"on the folds (the held-out photos of the folds pooled{'; ' + averaged if averaged else ''})"
          if args.select_on == "cv" else
          f"on the held-out 20% of train{' (' + averaged + ')' if averaged else ''}")
    print("\n- " + _effect_line(cv, f"Chosen minus defaults {on}")
          + f"; per fold {' '.join(f'{d:+.1f}' for d in per_fold)}.")
    move = bool(chosen) and cv["rsum"]["ci"][0] > 0
    print(f"- Rule, fixed before val is read: a default moves when this interval lies above 0. "
          f"{'It does' if move else 'It does not'}: the defaults {'move' if move else 'stay'}. The chosen "
          f"point is the best of {len(unique)} on these same folds, so its fold score is optimistic; val is the check.")
    if args.stages_only:
        return 0
    return _val(args, ds, work, chosen)


def _val(args: argparse.Namespace, ds: Any, work: Path, chosen: dict[str, Any]) -> int:
    """Train the defaults (and ``chosen``, when not empty) on all training photos and report each once on val."""
    from crossview.core.io import read_json
    from crossview.engine.run import train
    from crossview.engine.runs import drain, ensure_run
    from crossview.eval.paired import paired_effect

    method = args.method
    seeds = list(args.seeds or [0])
    several = len(seeds) > 1
    rows = {}
    for name, params in (("defaults", {}), ("chosen", chosen)):
        if name == "chosen" and not chosen:
            break
        runs = []
        for seed in seeds:     # one seed: the folder of old (val-NAME); several: val-NAME-sS
            run_dir = work / (f"{_val_folder(name, params)}-s{seed}" if several else _val_folder(name, params))
            t0 = time.monotonic()
            _, it = ensure_run(run_dir, lambda: train(
                method, ds, run_dir=run_dir, params={k: v for k, v in params.items() if k not in NORM_KEYS},
                device=args.device, seed=seed, scoring="default",
                **{k: v for k, v in params.items() if k in NORM_KEYS}), data=ds)
            summary = drain(it, str(run_dir)) if it is not None else None
            if summary is None:
                summary = read_json(run_dir / "summary.json")
            runs.append((summary, run_dir, time.monotonic() - t0))
        rows[name] = runs
    each = (f"at seeds {', '.join(map(str, seeds))}, R@K the mean over the seeds, reported once each" if several
            else "reported once each")
    print(f"\n### Val ({len(ds.splits.get('val', []))} photos), trained on all {len(ds.splits['train'])} training "
          f"photos, {each}\n")
    print(f"| run | options | i2t R@1/5/10 | t2i R@1/5/10 | rsum | {'rsum per seed' if several else 'rsum 95% CI'} | "
          "selected on | reported on | train s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, runs in rows.items():
        summaries = [r[0] for r in runs]
        s = summaries[0]
        cells = " | ".join("/".join(f"{np.mean([x[d][k] for x in summaries]):.1f}" for k in ("R@1", "R@5", "R@10"))
                           for d in ("i2t", "t2i"))
        rsum = float(np.mean([x["rsum"] for x in summaries]))
        if several:
            spread = " / ".join(f"{x['rsum']:.1f}" for x in summaries)
        else:
            ci = s.get("ci", {}).get("rsum")
            spread = f"{ci[0]:.1f}-{ci[1]:.1f}" if ci else "-"
        sets = " ".join(f"`--{k.replace('_', '-')} {v}`" if k in NORM_KEYS else f"`--set {k}={v}`"
                        for k, v in (chosen if name == "chosen" else {}).items()) or "(none)"
        # the chosen run is an ordinary `crossview train --set ...` run: its summary says selected_on nothing (no
        # choice inside it); its parameters were chosen by this bench's search on train
        selected = (f"train ({args.select_on}, this search)" if name == "chosen" else
                    f"{s.get('selected_on', '-')} (the defaults)")
        seconds = sum(x.get("train_seconds", wall) for x, _, wall in runs)
        print(f"| {name} | {sets} | {cells} | {rsum:.1f} | {spread} | "
              f"{selected} | {s.get('reported_on', s.get('split'))} | {seconds:.0f} |")
    print("\ntrain s: the training seconds each run records (a run read back from an earlier invocation keeps its "
          "own); other jobs may have shared the CPU (the stamp's load average says how busy it was when written): a "
          "rough cost, not a timing to compare closely.")
    if "chosen" in rows:
        a, caps = _pooled_seeds([[str(r[1]) for r in rows["defaults"]]])
        b, _ = _pooled_seeds([[str(r[1]) for r in rows["chosen"]]])
        what = "Chosen minus defaults on val" + (" (each query's rank averaged over the seeds first)" if several
                                                  else "")
        print("\n- " + _effect_line(paired_effect(a, b, caps, seed=0), what) + ".")
    elif not args.val_only:
        print("\nThe search chose the defaults: nothing to compare on val.")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", required=True)
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--stage", action="append", default=[], metavar="'NAME=V1,V2 NAME=...'",
                    help="one stage of the search: crossview tune --grid items, space-separated (repeatable)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a parameter fixed for every trial and for the chosen run")
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--select-on", default="cv", choices=["cv", "holdout"],
                    help="where the trials are scored: cv (--folds-fold CV of train) or holdout (a seeded 20%% of "
                         "train: one run a trial, for a method too slow for CV)")
    ap.add_argument("--top", type=int, default=12, help="rows of the CV table (the defaults' row is always shown)")
    ap.add_argument("--seeds", type=_parse_seeds, default=None, metavar="S,S,...",
                    help="train every trial (each fold) and each val run once per seed; scores and the paired "
                         "effects average each query over the seeds first (default: seed 0 alone)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--work", default="", help="run folders (default: a temporary folder)")
    ap.add_argument("--stages-only", action="store_true", help="stop after the search: no val runs")
    ap.add_argument("--val-only", action="store_true",
                    help="no search: the defaults trained on train and reported on val (a method too slow to search)")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "tune_method_flickr8k.md")
    args = ap.parse_args(argv)
    if not args.stage and not args.val_only:
        ap.error("give at least one --stage")
    if not Path(args.data).exists():
        print(f"no dataset at {args.data} (the shared Flickr8k sample); skipped", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        if not args.work:
            args.work = tmp
        return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                                  title=f"{args.method}'s defaults re-examined with `crossview tune` on the Flickr8k "
                                        "sample (3-fold CV of train, then val once)")


if __name__ == "__main__":
    sys.exit(main())
