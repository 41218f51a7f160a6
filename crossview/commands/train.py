"""``crossview train``: train a method in a run folder, print its progress and the final metric table.

::

    crossview train cca --data demo --run-dir runs/cca-demo --set n_components=128 --set reg=0.05
    crossview train --resume runs/cca-demo        # continue an interrupted run
    crossview train --list                        # the registered methods and their cards
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from crossview.commands._common import (EventPrinter, _add_dataset_args, add_scoring_options, float_option,
                                        print_events, render_demo_reporting, scoring_select, seed_option)
from crossview.core.errors import CrossViewError

__all__ = ["register", "cmd_train", "parse_set_values", "format_metric_table"]


def _card_flags() -> dict[str, list[tuple[str, Any]]]:
    """``{--flag: [(method, ParamSpec), ...]}`` for the card parameters that ask for their own option."""
    from crossview.methods.cards import find_card, list_cards

    flags: dict[str, list[tuple[str, Any]]] = {}
    for name in list_cards():
        try:
            card = find_card(name)
        except CrossViewError:
            continue  # a broken card is reported when that method is used, not for every command
        if card is None:
            continue
        for spec in card.params.values():
            if spec.flag:
                flags.setdefault(spec.flag, []).append((name, spec))
    return flags


def method_help(name: str) -> str:
    """The parameters of method ``name`` from its card: name, type, default, range or choices, help."""
    import textwrap

    from crossview.methods import method_class
    from crossview.methods.cards import find_card

    card = find_card(name)
    if card is None:
        defaults = method_class(name).default_params()
        return f"Parameters of {name} (no card; from its signature): " + ", ".join(
            f"{k}={v!r}" for k, v in defaults.items())
    lines = [f"Parameters of {name} ({card.title}; --set NAME=VALUE):"]
    for spec in card.params.values():
        if spec.choices:
            rng = f" {{{', '.join(map(str, spec.choices))}}}"
        elif spec.min is not None and spec.max is not None:
            rng = f" [{spec.min}, {spec.max}]"
        elif spec.min is not None or spec.max is not None:
            rng = f" >= {spec.min}" if spec.min is not None else f" <= {spec.max}"
        else:
            rng = ""
        lines.append(f"  {spec.name} ({spec.type}, default {spec.default_text}){rng}")
        lines += textwrap.wrap(spec.help, width=100, initial_indent="      ", subsequent_indent="      ")
    lines.append("Run settings (the run's, not the method's: --device, --seed, or --set NAME=VALUE): device, seed, "
                 "amp, workers (n_jobs), log_every")
    return "\n".join(lines)


class _MethodHelp(argparse.Action):
    """``-h``: the command's help; after a METHOD, that method's parameters from its card as well."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.print_help()
        name = getattr(namespace, "method", None)
        if name:
            from crossview.methods import list_methods

            if name in list_methods():
                print("\n" + method_help(name))
            else:
                print(f"\nno method {name!r}: 'crossview train --list' shows the registered methods")
        parser.exit()


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``train`` command to the ``crossview`` parser."""
    p = sub.add_parser(
        "train", help="train a retrieval method in a run folder", add_help=False,
        description="Train METHOD on a dataset: features are extracted (and cached), the method is fitted on "
                    "the train split (val for early stopping), evaluated on --split, and the run folder gets "
                    "config.json, metrics.jsonl, checkpoint.pt, ranks.npz and summary.json. Ctrl-C or SIGTERM (a "
                    "scheduler's stop) cancels cleanly (checkpoint kept); --resume continues.",
        epilog="Method parameters: --set NAME=VALUE (repeatable), typed by the method's card in models/ "
               "(lists: comma-separated). 'crossview train --list' shows the methods; 'crossview train METHOD --help' "
               "lists METHOD's parameters with their defaults, ranges and help.")
    p.add_argument("-h", "--help", action=_MethodHelp, nargs=0,
                   help="show this help message (after METHOD: with that method's parameters) and exit")
    p.add_argument("method", nargs="?", metavar="METHOD", help="method name (see --list)")
    p.add_argument("--list", action="store_true", help="list the registered methods and exit")
    p.add_argument("--data", default="demo", metavar="PATH|demo", help="dataset (default: the built-in demo)")
    _add_dataset_args(p)
    p.add_argument("--run-dir", metavar="DIR",
                   help="run folder (default: <user data>/runs/<method>-<dataset>-<timestamp>)")
    p.add_argument("--split", default=None,
                   help="split to evaluate on (default: test if the dataset has it, else val, else a held-out "
                        "10%% of train; the run records it and 'crossview eval' and the app default to it)")
    p.add_argument("--train-split", default="train", help="split to train on (default: train)")
    p.add_argument("--val-split", default="val", help="validation split, used when present (default: val)")
    p.add_argument("--image-encoder", metavar="E",
                   help="image encoder (default: the method's own, see its card, else the features default): a backbone, NAME:flip (mean of the image's "
                        "and its mirror's features) or NAME+NAME (backbones concatenated, each block L2-normalised), "
                        "e.g. efficientnet_lite0+mobilenet_v2:flip")
    p.add_argument("--text-encoder", metavar="T",
                   help="text encoder (default: the method's own, else the features default), or two joined with '+' (each block "
                        "L2-normalised), e.g. minilm+tfidf, minilm+glove")
    from crossview.features.normalize import NORMS
    p.add_argument("--image-norm", choices=NORMS, default=None,
                   help="normalise the image features first: none, l2, ssr (signed square root, then L2), center "
                        "(minus the train mean, then L2), whiten (PCA-whitening fitted on train, then L2) "
                        "(default: the method's, e.g. ssr for cca; see 'crossview train --list')")
    p.add_argument("--text-norm", choices=NORMS, default=None,
                   help="normalise the caption features first, same choices (default: the method's)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps (default: auto)")
    p.add_argument("--seed", type=seed_option, default=0, help="seed of python, numpy and torch (default 0)")
    p.add_argument("--resume", metavar="DIR", help="continue the interrupted run in DIR (refused while another "
                   "process writes it; from its last checkpoint, which never runs code)")
    p.add_argument("--set", dest="set_values", action="append", default=[], metavar="NAME=VALUE",
                   help="set a method parameter (repeatable)")
    p.add_argument("--checkpoint-seconds", type=float_option(0, above=True), default=60.0,
                   help="write a checkpoint at least this often while training (default 60)")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    add_scoring_options(p, param=True, training=True)
    for flag, owners in sorted(_card_flags().items()):
        spec = owners[0][1]
        who = ", ".join(m for m, _ in owners)
        p.add_argument(flag, dest=f"card_flag:{flag}", metavar="VALUE", default=None,
                       help=f"{spec.help} ({who}: sets {spec.name}; default {spec.default_text})")
    p.set_defaults(func=cmd_train)


def parse_set_values(method: str, items: list[str]) -> dict[str, Any]:
    """``["reg=0.1", "pairs=images"]`` -> ``{"reg": 0.1, "pairs": "images"}``, typed by the card of
    ``method`` (or by the class default when the card does not list the parameter)."""
    from crossview.methods import method_class
    from crossview.core.run_settings import RUN_SETTING_PARAMS
    from crossview.methods.cards import ParamSpec, _infer_type, find_card, run_setting_spec

    cls = method_class(method)
    card = find_card(method)
    defaults = cls.default_params()
    valid = cls.param_names()
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise CrossViewError(f"--set {item!r}: write NAME=VALUE, e.g. --set {valid[0] if valid else 'name'}=...")
        name, value = (s.strip() for s in item.split("=", 1))
        name = name.replace("-", "_")
        run_spec = run_setting_spec(name)      # --set seed=3 / amp=true: the run's, typed by RunSettings
        if run_spec is not None:
            out[name] = run_spec.coerce(value, method)
            continue
        if name not in valid:
            raise CrossViewError(f"--set {item!r}: method {method!r} has no parameter {name!r}; "
                                 f"its parameters are: {', '.join(valid)} (and the run settings "
                                 f"{', '.join(RUN_SETTING_PARAMS)})")
        spec = card.params.get(name) if card is not None else None
        if spec is None:
            default = defaults.get(name)
            spec = ParamSpec(name=name, default=default,
                             type=_infer_type(default) if default is not None else "str", optional=default is None)
        out[name] = spec.coerce(value, method)
    return out


def _fmt(v: float) -> str:
    return f"{v:.1f}" if abs(v) < 1e4 else f"{v:.0f}"


def format_metric_table(summary: dict[str, Any]) -> str:
    """The final table: R@1/5/10, MedR, MeanR for i2t and t2i (each R@K with the half-width of its bootstrap
    interval when the summary has one), then rsum with its interval and the training time."""
    cols = ("R@1", "R@5", "R@10", "MedR", "MeanR")
    ci = summary.get("ci") if isinstance(summary.get("ci"), dict) else None
    lines = [f"{summary.get('method', '?')} on {summary.get('dataset', '?')}, split {summary.get('split', '?')}"
             + (f" ({summary['n_images']} images, {summary['n_captions']} captions)" if "n_images" in summary else ""),
             f"{'':6}" + "".join(f"{c:>8}" for c in cols)]
    for d in ("i2t", "t2i"):
        row = summary.get(d) or {}
        lines.append(f"{d:6}" + "".join(f"{_fmt(row[c]):>8}" if c in row else f"{'-':>8}" for c in cols))
        band = (ci or {}).get(d)
        if isinstance(band, dict):
            lines.append(f"{'':6}" + "".join(
                f"{'±' + _fmt((band[c][1] - band[c][0]) / 2):>8}" if isinstance(band.get(c), list) else f"{'':>8}"
                for c in cols).rstrip())
    rsum = f"rsum {summary.get('rsum', float('nan')):.1f}"
    if ci is not None and isinstance(ci.get("rsum"), list) and len(ci["rsum"]) == 2:
        level = int(round(100 * float(ci.get("level", 0.95))))
        rsum += (f" ({level}% interval {ci['rsum'][0]:.1f}-{ci['rsum'][1]:.1f}, bootstrap over the "
                 f"{ci.get('n', '?')} images)")
    lines.append(f"{rsum}   train {summary.get('train_seconds', 0):.1f} s")
    if isinstance(summary.get("scoring"), dict):
        from crossview.engine.scoring import describe_run_scoring

        sc = summary["scoring"]
        plain = summary.get("metrics_plain") if isinstance(summary.get("metrics_plain"), dict) else {}
        lines.append(describe_run_scoring(sc, sc.get("bank"))
                     + (f"; plain: rsum {float(plain['rsum']):.1f}" if plain.get("rsum") is not None else ""))
    if summary.get("selected_on") is not None:
        what = "; ".join(f"{c.get('what')} on {c.get('on')}" for c in summary.get("choices") or [])
        lines.append((f"OPTIMISTIC: chosen and reported on the same split ({what})" if summary.get("optimistic") else
                      f"chosen: {what or 'nothing (no choice made on data)'}; reported on "
                      f"{summary.get('reported_on')}"))
    return "\n".join(lines)


def _list_methods() -> int:
    from crossview.methods import list_methods
    from crossview.methods.cards import find_card

    for name in list_methods():
        try:
            card = find_card(name)
            desc = f"{card.title}: {card.summary}" if card else "(no card in models/)"
        except CrossViewError as e:
            desc = f"(card unreadable: {e})"
        print(f"{name:<10} {desc}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Run (or resume) a training run and print the metric table."""
    import json

    from crossview.core.events import Finished
    from crossview.engine.run import read_status, resume, train

    if args.list:
        return _list_methods()
    from crossview.commands._common import scoring_name
    from crossview.engine.scoring import pending_scoring, resolve_run_scoring

    if args.resume and (args.scoring != "default" or args.param is not None or args.select is not None):
        raise CrossViewError("--resume continues a run with its own scoring; leave out --scoring, --param and "
                             "--select (re-score it with 'crossview eval RUN --scoring ...')")
    # one line for a bad name or combination, before any training
    scoring = scoring_name(args, args.method) if args.method and not args.resume else "plain"
    select = scoring_select(args)
    # --select chooses the parameter of the scoring (the method's default one, or the one named) after training
    scoring_arg = scoring if args.select is not None else args.scoring
    record = resolve_run_scoring(args.method or "", scoring_arg, args.param) if not args.resume else None
    flag_values = {k.split(":", 1)[1]: v for k, v in vars(args).items()
                   if k.startswith("card_flag:") and v is not None}
    if args.resume:
        if args.method or args.set_values or flag_values or args.image_norm or args.text_norm:
            raise CrossViewError("--resume continues a run with its own method and parameters; "
                                 "leave out METHOD, --set and method options")
        gen = resume(args.resume, device=None if args.device == "auto" else args.device)
    else:
        if not args.method:
            raise CrossViewError("name a METHOD to train (see 'crossview train --list'), or --resume DIR")
        params = parse_set_values(args.method, args.set_values)
        if flag_values:
            from crossview.methods.cards import find_card
            card = find_card(args.method)
            for flag, value in flag_values.items():
                spec = next((p for p in (card.params.values() if card else []) if p.flag == flag), None)
                if spec is None:
                    raise CrossViewError(f"{flag} is not an option of method {args.method!r}")
                params[spec.name] = spec.coerce(value, args.method)
        if args.data == "demo" or args.format == "demo":
            # bad values cost nothing: refused before the demo's first rendering (~10 s), not after it
            from crossview.core.devices import select_device
            from crossview.features.image import check_image_encoder_name
            from crossview.methods import method_from_params

            method_from_params(args.method, params).check_params()
            select_device(args.device)
            if args.image_encoder and args.image_encoder != "precomp":
                check_image_encoder_name(args.image_encoder)
            if args.text_encoder and args.text_encoder != "none":
                from crossview.features.text import create_text_encoder

                create_text_encoder(args.text_encoder).check_available()
            render_demo_reporting()      # the first use renders it (~10 s): say so, with progress
        gen = train(args.method, args.data, run_dir=args.run_dir, params=params, split=args.split,
                    train_split=args.train_split, val_split=args.val_split or None,
                    image_encoder=args.image_encoder, text_encoder=args.text_encoder,
                    data_format=args.format, image_root=args.image_root, device=args.device, seed=args.seed,
                    checkpoint_seconds=args.checkpoint_seconds, image_norm=args.image_norm,
                    text_norm=args.text_norm, scoring=record)
    # under torchrun every process runs this command; rank 0 alone prints and writes (the others train)
    follower = os.environ.get("RANK", "0") not in ("", "0")
    printer = EventPrinter(stream=open(os.devnull, "w")) if follower else EventPrinter()
    summary = None
    stop = {"asked": False, "signal": None}

    def on_signal(signum: int, frame: Any) -> None:
        # Ctrl-C and SIGTERM (a scheduler's or `timeout`'s stop) alike: stop at the next event, checkpoint, resume
        if stop["asked"]:          # a second one: stop now, keeping the last checkpoint
            raise KeyboardInterrupt
        stop["asked"], stop["signal"] = True, signum
        again = "Ctrl-C again" if signum == signal.SIGINT else "a second SIGTERM"
        print(f"\ncrossview: {signal.Signals(signum).name} received: stopping after the current batch "
              f"({again} to stop at once)", file=sys.stderr)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for ev in gen:
            printer(ev)
            if isinstance(ev, Finished):
                summary = ev.summary
            if stop["asked"] and summary is None:
                break
    except KeyboardInterrupt:
        stop["asked"] = summary is None
    finally:
        printer.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop["asked"] and summary is None:
        gen.close()  # cancel at this event: the engine checkpoints and records "cancelled"
        how = "stopped by SIGTERM" if stop["signal"] == signal.SIGTERM else "cancelled"
        print(f"crossview: {how}; continue with: crossview train --resume "
              f"{gen.run_dir}", file=sys.stderr)
        return 128 + int(stop["signal"] or signal.SIGINT)
    if follower:
        return 0
    if summary is None:  # pragma: no cover - the engine always ends with Finished or raises
        raise CrossViewError("the run ended without a summary")
    if pending_scoring(record) and read_status(gen.run_dir).get("status") == "finished":
        from crossview.engine.scoring import adopt_run_scoring, iter_evaluate_run

        # the parameter chosen by --select (auto: cross-validation where it is cheap), recorded in the run's
        # scoring.json and made the run's own scoring; the cross-validation runs print their progress
        scored = print_events(iter_evaluate_run(gen.run_dir, record["scoring"], select=select))
        summary = adopt_run_scoring(gen.run_dir, scored)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_metric_table(summary))
        print(f"run folder: {gen.run_dir}")
    return 0 if read_status(gen.run_dir).get("status") == "finished" else 1
