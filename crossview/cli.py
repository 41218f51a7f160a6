"""The ``crossview`` command.

With no arguments it opens the desktop app on the built-in demo data. Sub-commands work without a
display. Errors caused by input (a missing file, a malformed dataset) print one line and exit with 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Sequence

from crossview import __version__
from crossview.commands._common import ProgressPrinter, _add_dataset_args  # noqa: F401 (re-exported)
from crossview.commands._common import float_option, int_option, seed_option
from crossview.core.errors import CrossViewError, is_storage_error, storage_error
from crossview.core.text import printable

# Command groups that live in their own modules under crossview/commands/, by the top-level command each adds;
# each module has ``register(subparsers)`` adding its parsers with ``set_defaults(func=...)``. `main` imports only
# the module of the command it is given (a module may import torch, the method registry or Qt: seconds that
# `crossview query` should not pay); a bare or unknown command, or `--help`, imports them all.
COMMAND_MODULES: dict[str, str] = {
    "features": "crossview.commands.features",
    "eval": "crossview.commands.eval",
    "train": "crossview.commands.train",
    "tune": "crossview.commands.tune",
    "experiment": "crossview.commands.experiment",
    "query": "crossview.commands.query",
    "serve": "crossview.commands.serve",
    "explain": "crossview.commands.explain",
    "screenshot": "crossview.commands.screenshot",
    "runs": "crossview.commands.runs",
    "fuse": "crossview.commands.fuse",
}

#: The commands defined in this module (the app, datasets): building the parser for one of them imports no
#: command module.
BUILTIN_COMMANDS = ("gui", "data")

EXIT_USAGE = 2


# ---------------------------------------------------------------------------- data
def cmd_data_info(args: argparse.Namespace) -> int:
    from crossview.commands._common import load_dataset_reporting
    from crossview.data.dataset import PairedDataset
    from crossview.data.stats import dataset_info, format_info

    ds = load_dataset_reporting(args.dataset, format=args.format, image_root=args.image_root)
    info = dataset_info(ds)
    if args.check_images and isinstance(ds, PairedDataset) and ds.image_paths is not None:
        from crossview.data.images import verify_images
        bad = verify_images(ds.image_paths, progress=ProgressPrinter("checking images"))
        info["unreadable_images"] = [msg for _, msg in bad]
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(format_info(info))
        if "unreadable_images" in info:
            bad = info["unreadable_images"]
            print(f"image check: {len(bad)} of {info['images']:,} images unreadable" if bad
                  else f"image check: all {info['images']:,} images decode")
            for msg in bad[:10]:
                print(f"  {printable(msg)}")
    return 1 if info.get("unreadable_images") else 0


def cmd_data_demo(args: argparse.Namespace) -> int:
    from crossview.data.demo import write_demo

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise CrossViewError(f"{out}: the folder exists and is not empty; give a new or empty folder with --out")
    path = write_demo(out, n_scenes=args.n_scenes, n_web=args.n_web, seed=args.seed,
                      progress=ProgressPrinter("rendering demo"))
    print(f"wrote the demo dataset ({args.n_scenes} scenes, {args.n_web} web images) to {path}")
    print(f"read it with: crossview data info {path}")
    return 0


def cmd_data_make_web(args: argparse.Namespace) -> int:
    from crossview.data import load_dataset
    from crossview.features.web_set import make_web_set

    ds = load_dataset(args.dataset, format=args.format, image_root=args.image_root)
    path = make_web_set(ds, args.out, split=args.split, drop=args.drop, add=args.add, seed=args.seed,
                        progress=ProgressPrinter(f"tags of the {args.split} captions"))
    info = json.loads((path.parent / "web.json").read_text(encoding="utf-8"))
    print(f"wrote {path} ({info['images']} images, {info['true_tags_per_image']:.1f} true and "
          f"{info['noisy_tags_per_image']:.1f} noisy tags per image; {info['what']})")
    print(f"read it with: crossview data info {path.parent}")
    return 0


def cmd_data_formats(args: argparse.Namespace) -> int:
    from crossview.data import READERS
    print(f"{'demo':<17} the built-in synthetic demo (rendered on first use, then cached)")
    for name, info in READERS.items():
        print(f"{name:<17} {info.description}")
    return 0


# ---------------------------------------------------------------------------- gui
def cmd_gui(args: argparse.Namespace) -> int:
    from crossview.gui.launch import launch
    return launch(dataset=args.data)


# ---------------------------------------------------------------------------- parser
def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or with ``only`` (a command of COMMAND_MODULES) one that registers just that command's
    module besides the built-in `gui` and `data` (an unknown name registers every module)."""
    parser = argparse.ArgumentParser(
        prog="crossview",
        description="Cross-modal image <-> text retrieval. With no command, opens the desktop app on the "
                    "built-in demo data.",
        epilog="Datasets are named by a path or 'demo'. Run 'crossview COMMAND --help' for each command.")
    parser.add_argument("--version", action="version", version=f"crossview {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("gui", help="open the desktop app", description="Open the desktop app.")
    p.add_argument("--data", default="demo", help="dataset to open (a path or 'demo'; default: demo)")
    p.set_defaults(func=cmd_gui)

    data = sub.add_parser("data", help="inspect datasets, write the demo",
                          description="Inspect datasets and write the built-in demo.")
    dsub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)

    p = dsub.add_parser("info", help="print a dataset's counts and statistics",
                        description="Print counts (images, captions, captions per image, splits, labels, tags), "
                                    "vocabulary size and caption-length statistics.")
    p.add_argument("dataset", metavar="PATH|demo", help="dataset file or folder, or 'demo'")
    _add_dataset_args(p)
    p.add_argument("--check-images", action="store_true", help="decode every image and report unreadable ones")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_data_info)

    p = dsub.add_parser("demo", help="write the built-in demo as a Karpathy-JSON folder",
                        description="Render the built-in synthetic demo (deterministic from --seed) into a "
                                    "folder: dataset_demo.json, images/, scenes.json and the noisy web set "
                                    "in web/.")
    p.add_argument("--out", required=True, metavar="DIR", help="new or empty output folder")
    p.add_argument("--seed", type=seed_option, default=0, help="random seed (default 0)")
    p.add_argument("--n-scenes", type=int_option(1, 200_000), default=2400, help="image-caption scenes (default 2400)")
    p.add_argument("--n-web", type=int_option(0, 200_000), default=800, help="noisy web image-tag scenes (default 800)")
    p.set_defaults(func=cmd_data_demo)

    p = dsub.add_parser(
        "make-web", help="build a noisy web image-tag set from a caption dataset (for webly Stage II)",
        description="Write a web image-tag set (tags.jsonl + web.json) for a dataset that has none: the images "
                    "of --split, tags = the nouns and verbs of their captions, each dropped with probability "
                    "--drop, plus Binomial(n, --add) wrong tags drawn from the set's tags by frequency. It is not "
                    "independent web data (the images are the dataset's own); web.json says so.")
    p.add_argument("dataset", metavar="PATH", help="image-caption dataset file or folder")
    _add_dataset_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="new folder for tags.jsonl and web.json")
    p.add_argument("--split", default="train", help="the images to use (default: train)")
    p.add_argument("--drop", type=float_option(0, 1), default=0.2, help="probability of dropping each true tag (default 0.2)")
    p.add_argument("--add", type=float_option(0, 1), default=0.2,
                   help="wrong tags added per true tag, on average (default 0.2)")
    p.add_argument("--seed", type=seed_option, default=0, help="seed of the noise (default 0)")
    p.set_defaults(func=cmd_data_make_web)

    p = dsub.add_parser("formats", help="list the dataset formats CrossView reads",
                        description="List the dataset formats and what each expects.")
    p.set_defaults(func=cmd_data_formats)

    import importlib
    names = ([COMMAND_MODULES[only]] if only in COMMAND_MODULES else [] if only in BUILTIN_COMMANDS
             else list(COMMAND_MODULES.values()))
    for name in names:
        importlib.import_module(name).register(sub)
    return parser


def _safe_streams() -> None:
    """Text the terminal cannot take (a lone UTF-16 surrogate from a dataset, a character outside a non-UTF-8
    locale) is written as a backslash escape instead of raising UnicodeEncodeError mid-print."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) in ("strict", "surrogateescape"):
            try:
                reconfigure(errors="backslashreplace")
            except (OSError, ValueError):
                pass


def main(argv: Sequence[str] | None = None) -> int:
    _safe_streams()
    words = list(sys.argv[1:] if argv is None else argv)
    # bare `crossview` is `crossview gui`: its parser alone (every module's would import torch first: 2-3 s)
    parser = build_parser(only=words[0] if words else "gui")
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:  # bare `crossview`: the app on the demo
        args = parser.parse_args(["gui", *(argv or [])])
        func = args.func
    terminated = {"yes": False}

    def on_sigterm(signum: int, frame: object) -> None:
        # a scheduler's or `timeout`'s stop goes the Ctrl-C way (runs record where they stopped, resumable);
        # `crossview train` installs its own gentler handler (stop at the next batch, checkpoint)
        terminated["yes"] = True
        raise KeyboardInterrupt

    previous = None
    # not for the commands that run Qt's event loop (the app, screenshots): a Python handler only runs between two
    # Python calls there, so SIGTERM keeps its default, immediate effect
    qt_loop = func is cmd_gui or getattr(func, "__module__", "") == "crossview.commands.screenshot"
    if not qt_loop and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return int(func(args) or 0)
    except CrossViewError as e:
        print(f"crossview: error: {printable(str(e), newlines=True, tabs=True)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        # a full disk or a place the user cannot write is the environment, not a bug: one line naming the path
        if not is_storage_error(e):
            raise
        print(f"crossview: error: {printable(str(storage_error(e)), newlines=True, tabs=True)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        if terminated["yes"]:
            print("crossview: stopped by SIGTERM", file=sys.stderr)
            return 128 + signal.SIGTERM
        print("crossview: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
