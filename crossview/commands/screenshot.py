"""``crossview screenshot --out DIR``: each panel of the app, on a dataset with a trained run, as PNG files."""

from __future__ import annotations

import argparse
import sys

from crossview.commands._common import int_option


def cmd_screenshot(args: argparse.Namespace) -> int:
    from crossview.gui.screenshots import render_screenshots

    paths = render_screenshots(args.out, data=args.data, run=args.run, compare=args.compare, method=args.method,
                               sentence=args.sentence, size=(args.width, args.height),
                               log=lambda m: print(m, file=sys.stderr), explain=args.explain,
                               dialogs=args.dialogs)
    print(f"wrote {len(paths)} screenshots to {args.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("screenshot", help="render each panel of the app to PNG files",
                       description="Open the app (off screen when there is no display) on a dataset with a trained "
                                   "run and save the Data, Train, Query (both directions), Inspect and presentation "
                                   "views as PNG files. Without --run a run of --method is trained first.")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the PNG files")
    p.add_argument("--data", default="demo", help="dataset (default: demo)")
    p.add_argument("--run", metavar="RUN_DIR", help="a trained run to show (default: train one)")
    p.add_argument("--compare", metavar="RUN_DIR", help="a second run to compare with in Inspect")
    p.add_argument("--method", default="cca", help="method to train when no --run is given (default cca)")
    p.add_argument("--sentence", default=None,
                   help="the text query to show (default: a demo sentence on the demo, else a caption of the "
                        "run's evaluation split)")
    p.add_argument("--dialogs", action="store_true",
                   help="also shoot the app's own dialogs (search, rename, delete, an error, about), each opened as a "
                        "user opens it and closed without acting")
    p.add_argument("--explain", action="store_true",
                   help="also shoot the Query panel and presentation mode with Explain on (region maps over the "
                        "images, the caption's words shaded by importance)")
    p.add_argument("--width", type=int_option(320, 16384), default=1440)
    p.add_argument("--height", type=int_option(240, 16384), default=900)
    p.set_defaults(func=cmd_screenshot)
