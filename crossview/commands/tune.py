"""``crossview tune METHOD``: a parameter search, every trial a run, chosen on other images than those the refit
of the best is reported on.

::

    crossview tune cca --data D --grid reg=0.3,1,3,10 --grid n_components=64,128,256
    crossview tune wsabie --data D --grid lr=0.01,0.1 --grid image_norm=none,ssr --trials 4 --select-on holdout
"""

from __future__ import annotations

import argparse
import json
import sys

from crossview.engine.tune import parse_grid  # noqa: F401  (moved to the engine: the app's search uses it too)

__all__ = ["register", "cmd_tune", "parse_grid"]


def cmd_tune(args: argparse.Namespace) -> int:
    from crossview.commands._common import EventPrinter
    from crossview.commands.train import parse_set_values
    from crossview.core.events import Log, Progress
    from crossview.engine.tune import TuneResult, format_tune_table, tune

    grid = parse_grid(args.method, args.grid)
    params = parse_set_values(args.method, args.set_values)
    seeds = None
    if args.seeds is not None:
        from crossview.core.run_settings import parse_seeds
        seeds = list(parse_seeds(args.seeds))
    scoring, scoring_param = _scoring(args)
    printer = EventPrinter()
    result: TuneResult | None = None
    gen = tune(args.method, args.data, grid, params=params, metric=args.metric, trials=args.trials, out=args.out,
               select_on=args.select_on, folds=args.folds, optimistic=args.optimistic, image_encoder=args.image_encoder, text_encoder=args.text_encoder,
               image_norm=args.image_norm, text_norm=args.text_norm, data_format=args.format,
               image_root=args.image_root, device=args.device, seed=args.seed, refit=not args.no_refit, seeds=seeds,
               scoring=scoring, scoring_param=scoring_param)
    try:
        for ev in gen:
            if isinstance(ev, TuneResult):
                result = ev
            elif isinstance(ev, (Log, Progress)):
                printer(ev)
    except KeyboardInterrupt:
        printer.close()
        gen.close()
        print("crossview: search stopped; run the same command with --out to continue it", file=sys.stderr)
        return 130
    printer.close()
    assert result is not None
    if args.json:
        print(json.dumps({"folder": str(result.folder), "metric": result.metric, **result.selection,
                          "scoring": result.scoring,
                          "seeds": result.seeds, "trials": result.trials, "best": result.best, "refit": result.refit,
                          "refit_rsum": result.refit_rsum, "refits": result.refits}, indent=2))
    else:
        print(format_tune_table(result))
        print(f"search folder: {result.folder}")
    return 0


def _scoring(args: argparse.Namespace) -> tuple[object, float | None]:
    """``(scoring, param)`` for :func:`crossview.engine.tune.tune`: ``--scoring`` as given (``default``: the
    method's default scoring, as ``crossview train`` ranks by); not given, the method's default for a new search and
    the recorded one for a search continued in ``--out`` (so the same command continues it)."""
    from pathlib import Path

    from crossview.commands._common import check_param_applies, scoring_name
    from crossview.core.io import read_json
    from crossview.engine.tune import TUNE_FILE, recorded_scoring

    if args.scoring is None:
        record = Path(args.out) / TUNE_FILE if args.out else None
        if record is not None and record.is_file():
            old = read_json(record)
            if isinstance(old, dict) and old.get("method") == args.method:
                if args.param is None:
                    return recorded_scoring(old), None
                name = recorded_scoring(old)["scoring"]
                check_param_applies(name, args.param)
                return name, args.param
        args.scoring = "default"
    name = scoring_name(args, args.method)         # one line for an unknown name or a --param that does not apply
    return ("default" if args.scoring == "default" and args.param is None else name), args.param


def register(sub: argparse._SubParsersAction) -> None:
    from crossview.commands._common import _add_dataset_args, float_option, int_option, seed_option
    from crossview.features.normalize import NORMS

    p = sub.add_parser(
        "tune", help="search a method's parameters (every trial a run; chosen apart from where it is reported)",
        description="Train METHOD once per point of the grid (or --trials points drawn from it), score each where "
                    "--select-on says, print the trials best first, then refit the best point on all training "
                    "images and report it once on the dataset's evaluation split (test, else val, else a held-out "
                    "part of train). Choosing and reporting use different images: by default the trials are "
                    "scored on val when the dataset also has a test split, else by 3-fold cross-validation of the "
                    "training images (each fold a run). The table and tune.json say where the trials were chosen "
                    "(selected_on) and where the refit is reported (reported_on). Every trial is a run folder "
                    "inside the search folder: open, inspect and compare them in the app. Running the same "
                    "command with the same --out continues an interrupted search.",
        epilog="Grid keys are the method's parameters (typed and range-checked by its card) and image_norm / "
               "text_norm. Separate the values with ';' instead when a value holds commas "
               "(--grid 'c_grid=1,10;1e2,1e4'). "
               "Example: crossview tune cca --data D --grid reg=0.3,1,3 --grid image_norm=none,ssr")
    p.add_argument("method", metavar="METHOD", help="method name (see 'crossview train --list')")
    p.add_argument("--data", default="demo", metavar="PATH|demo", help="dataset (default: the built-in demo)")
    _add_dataset_args(p)
    p.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,...", required=True,
                   help="values to try for one parameter (repeatable; the search is their product)")
    p.add_argument("--set", dest="set_values", action="append", default=[], metavar="NAME=VALUE",
                   help="a parameter fixed for every trial (repeatable)")
    p.add_argument("--trials", type=int_option(1, 100_000), default=None,
                   help="try only this many points of the grid, drawn at random (default: all of them)")
    p.add_argument("--metric", default="rsum",
                   help="what the trials are ranked by: rsum, or DIRECTION.KEY such as i2t.R@1, t2i.R@10, "
                        "t2i.MedR (default rsum)")
    p.add_argument("--select-on", "--val-split", dest="select_on", default="auto", metavar="WHERE",
                   help="where the trials are scored: auto (val when the dataset has a test split to report on, "
                        "else cross-validation of the training images), cv (k-fold cross-validation of the "
                        "training images; cv5 for 5 folds), holdout (a seeded 20%% of the training images), or a "
                        "split name (default: auto)")
    p.add_argument("--folds", type=int_option(2, 100), default=None, metavar="K",
                   help="folds of --select-on cv (default 3)")
    p.add_argument("--optimistic", action="store_true",
                   help="allow --select-on to name the split the refit is reported on; every output then says "
                        "'optimistic: chosen and reported on the same split'")
    p.add_argument("--image-encoder", metavar="E",
                   help="image encoder (default: the method's own, as 'crossview train METHOD' uses)")
    p.add_argument("--text-encoder", metavar="T",
                   help="text encoder (default: the method's own, as 'crossview train METHOD' uses)")
    p.add_argument("--image-norm", choices=NORMS, default=None, help="image normalisation for every trial")
    p.add_argument("--text-norm", choices=NORMS, default=None, help="text normalisation for every trial")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps (default: auto)")
    p.add_argument("--seed", type=seed_option, default=0, help="seed of every trial, and of the random draw (default 0)")
    p.add_argument("--seeds", metavar="S[,S...]",
                   help="train every trial (each fold) and the refit once per seed, e.g. 0,1,2, and score by the mean "
                        "over the seeds first (run folders trial-NNN[-fK]-sS, best-sS); --seed then only draws the "
                        "points and the folds")
    from crossview.commands._common import default_scorings_text
    from crossview.eval.scoring import SCORINGS

    defaults = default_scorings_text()
    p.add_argument("--scoring", default=None, metavar="default|" + "|".join(SCORINGS),
                   help="how every trial and the refit rank and are evaluated, so the trials are ranked by what a "
                        "'crossview train' run of the same point reports (default: the method's default scoring, "
                        f"as crossview train's: {defaults}, the others plain; continuing a search in --out: the "
                        "scoring it recorded). plain: the dot product; csls / isoftmax / dsoftmax with --param, or "
                        "their parameter chosen in each run on a hold-out of its training images")
    p.add_argument("--param", type=float_option(0, above=True), default=None, metavar="K_OR_BETA",
                   help="the scoring's parameter (csls: k; isoftmax / dsoftmax: beta)")
    p.add_argument("--out", metavar="DIR",
                   help="search folder (default: <user data>/runs/tune-<method>-<dataset>-<timestamp>)")
    p.add_argument("--no-refit", action="store_true", help="do not refit the best point at the end")
    p.add_argument("--json", action="store_true", help="print the trials as JSON instead of a table")
    p.set_defaults(func=cmd_tune)
