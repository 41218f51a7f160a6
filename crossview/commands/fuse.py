"""``crossview fuse RUN RUN ... [--weights auto|w1,w2,...] [--run-dir DIR]``: a fused run (:mod:`crossview.engine.fuse`).

::

    crossview fuse runs/cca runs/bitr runs/smoothap                 # weights by 3-fold CV of train
    crossview fuse runs/cca runs/bitr --weights bank                # quick: folds of the training banks
    crossview fuse runs/cca runs/bitr --weights 0.7,0.3 --run-dir runs/fused-cca-bitr
    crossview fuse --resume runs/fused-cca-bitr                     # finish a fusion that was stopped

The fused run is a run folder like any other: ``crossview eval``, ``query``, ``runs show`` and the app read it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from crossview.core.errors import CrossViewError

__all__ = ["register", "cmd_fuse"]


def _run_path(text: str) -> Path:
    """A run given as a folder path, or as a name in the runs folder."""
    from crossview.core.settings import get_settings

    p = Path(text).expanduser()
    if p.is_dir() or p.is_absolute() or len(p.parts) > 1:
        return p
    return get_settings().runs_dir / p


def cmd_fuse(args: argparse.Namespace) -> int:
    from crossview.commands._common import EventPrinter
    from crossview.commands.train import format_metric_table
    from crossview.core.events import Finished
    from crossview.engine.fuse import iter_fuse

    if args.resume:
        if args.runs:
            raise CrossViewError("--resume takes the fused run's folder alone; give no RUN arguments with it")
        gen = iter_fuse(None, run_dir=_run_path(args.resume))
    else:
        if len(args.runs) < 2:
            raise CrossViewError(f"give at least two runs to fuse (got {len(args.runs)}); e.g. crossview fuse "
                                 "runs/cca runs/bitr")
        gen = iter_fuse([_run_path(r) for r in args.runs], args.weights, run_dir=args.run_dir)
    printer = EventPrinter()
    summary = None
    try:
        for ev in gen:
            printer(ev)
            if isinstance(ev, Finished):
                summary = ev.summary
    finally:
        printer.close()
    if summary is None:  # pragma: no cover - the engine ends with Finished or raises
        raise CrossViewError("the fusion ended without a summary")
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    fusion = summary.get("fusion", {})
    print(format_metric_table(summary))
    for row in fusion.get("members", []):
        rsum = row.get("rsum")
        print(f"  {row['weight']:.2f}  {row['name']} ({row.get('method')}"
              + (f", rsum {rsum:.1f} alone" if isinstance(rsum, (int, float)) else "") + ")")
    choice = fusion.get("choice", {})
    how = ("given" if choice.get("by") != "rsum" else
           f"chosen by rsum on {choice.get('selected_on')} ({choice.get('how')}; grid step {choice.get('grid_step')})")
    print(f"weights {how}; reported on {summary.get('reported_on')}")
    print(f"run folder: {summary.get('run_dir')}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``fuse`` command to the ``crossview`` parser."""
    p = sub.add_parser(
        "fuse", help="combine finished runs into a fused run (weighted sum of their standardised scores)",
        description="Fuse two or more finished runs on the same dataset and split: each run's scores are "
                    "standardised with their mean and deviation over its training bank, and summed with weights. "
                    "The weights are chosen by rsum on folds of the training split (a grid over the simplex); the "
                    "evaluation split is only reported on. The fused run is a run folder that eval, query, runs "
                    "and the app open like any other.",
        epilog="A RUN is a run folder, or a run's name in the runs folder.")
    p.add_argument("runs", nargs="*", metavar="RUN", help="the runs to fuse (two or more)")
    p.add_argument("--weights", default="auto", metavar="auto|bank|W1,W2,...",
                   help="'auto' (default): chosen by 3-fold cross-validation of the training images, each run "
                        "trained again on each fold's other images (about 2x the runs' training time); 'bank': "
                        "chosen on 3 folds of the runs' training banks, no training (quick, but in-sample); or one "
                        "weight >= 0 per run, in order (normalised to sum 1)")
    p.add_argument("--run-dir", default=None, metavar="DIR",
                   help="the fused run's folder (default: fused-<dataset>-<time> in the runs folder)")
    p.add_argument("--resume", default=None, metavar="DIR", help="finish the fused run in DIR (from its config)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_fuse)

