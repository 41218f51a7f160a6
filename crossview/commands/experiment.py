"""``crossview experiment ...``: the papers' experiments as commands.

``crossview experiment bitr-table --data D`` runs Experiment 1 of the BITR paper (image <-> caption
retrieval with CCA, WSABIE and BITR-M/E/C, :mod:`crossview.experiments.bitr_table`) and prints the
paper's table; ``crossview experiment loss-compare --data D`` trains the VSE++ model with each loss of paper 004
(:mod:`crossview.experiments.loss_compare`) and compares them; ``crossview experiment webly-ablation --data D --web W``
runs paper 003's ablations (:mod:`crossview.experiments.webly_ablation`) and ``crossview experiment timam-ablation
--data D`` paper 002's (:mod:`crossview.experiments.timam_ablation`). Their trials are run folders under ``--exp-dir``
(resumable, listed in the app). Progress and messages go to stderr; the table (or ``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from crossview.commands._common import EventPrinter, _add_dataset_args, int_option, out_file, seed_option
from crossview.commands._common import feature_progress as _feature_progress
from crossview.core.errors import CrossViewError
from crossview.core.io import atomic_write_bytes


def _parse_params(items: list[str] | None, table: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """``["bitr.C=100", "wsabie.lr=0.01"]`` -> ``{"bitr": {"C": "100"}, "wsabie": {"lr": "0.01"}}`` (the methods
    of ``table``: the BITR table's rows by default)."""
    from crossview.experiments.bitr_table import TABLE_METHODS

    TABLE_METHODS = table or TABLE_METHODS   # noqa: N806 - the rows these parameters may name
    out: dict[str, dict[str, Any]] = {}
    registries = {r for r, _ in TABLE_METHODS.values()}
    for item in items or []:
        left, eq, value = item.partition("=")
        method, dot, key = left.partition(".")
        method = method.strip().lower()
        if not eq or not dot or not key.strip():
            raise CrossViewError(f"--param {item!r}: write METHOD.NAME=VALUE, e.g. --param bitr.C=100 or "
                                 f"--param bitr-c.c_grid=1e-2:1e2")
        if method not in TABLE_METHODS and method not in registries:
            raise CrossViewError(f"--param {item!r}: unknown method {method!r}; use one of "
                                 f"{', '.join(sorted(set(TABLE_METHODS) | registries))}")
        out.setdefault(method, {})[key.strip()] = value.strip()
    return out


def _command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (for the Markdown report)."""
    parts = ["crossview", "experiment", "bitr-table", "--data", str(args.data)]
    if args.format:
        parts += ["--format", args.format]
    if args.image_root:
        parts += ["--image-root", str(args.image_root)]
    parts += ["--representation", args.representation, "--methods", args.methods, "--k", str(args.k)]
    if args.folds is not None:
        parts += ["--folds", str(args.folds)]
    if args.split is not None:
        parts += ["--split", args.split]
    if args.corpus:
        parts += ["--corpus", str(args.corpus)]
    if args.test_data:
        parts += ["--test-data", str(args.test_data)]
        if args.test_format:
            parts += ["--test-format", args.test_format]
        if args.test_parts != 10:
            parts += ["--test-parts", str(args.test_parts)]
    if args.index:
        parts += ["--index", args.index]
    for flag, v in (("--image-encoder", args.image_encoder), ("--text-encoder", args.text_encoder)):
        if v:
            parts += [flag, v]
    for flag, v, default in (("--n-topics", args.n_topics, 100), ("--n-words", args.n_words, 1000),
                             ("--seed", args.seed, 0)):
        if v != default:
            parts += [flag, str(v)]
    if getattr(args, "seeds", None) is not None:
        parts += ["--seeds", args.seeds]
    for p in args.param or []:
        parts += ["--param", p]
    if args.out:
        parts += ["--out", str(args.out)]
    if args.exp_dir:
        parts += ["--exp-dir", str(args.exp_dir)]
    return " ".join(shlex.quote(p) for p in parts)


def _print_experiment(start: Any) -> dict[str, Any]:
    """Run ``start(feature_progress)`` (an experiment's event generator) with its events on stderr (progress bars
    for feature extraction, which runs outside the event stream); its result."""
    from crossview.core.events import Finished, Log

    feature_progress = _feature_progress()    # a bar per feature stage that does work (none for cached ones)

    printer = EventPrinter(prefix="experiment: ")
    result = None
    try:
        for ev in start(feature_progress):
            if isinstance(ev, Finished):
                result = ev.summary
            else:
                if isinstance(ev, Log):
                    feature_progress.clear()
                printer(ev)
    finally:
        printer.close()
    assert result is not None
    return result


def cmd_bitr_table(args: argparse.Namespace) -> int:
    from crossview.data import load_dataset
    from crossview.data.dataset import PairedDataset
    from crossview.core.run_settings import parse_seeds
    from crossview.experiments.bitr_table import (format_markdown, format_table, parse_ks, parse_methods,
                                                  run_bitr_table_seeds)

    methods = parse_methods(args.methods)
    ks = parse_ks(args.k)
    if args.seeds is not None and args.seed != 0:
        raise CrossViewError(f"give --seed or --seeds, not both (--seed {args.seed}, --seeds {args.seeds})")
    seeds = parse_seeds(args.seeds) if args.seeds is not None else (args.seed,)
    params = _parse_params(args.param)
    if args.n_topics < 1 or args.n_words < 2:
        raise CrossViewError(f"--n-topics must be >= 1 and --n-words >= 2, got {args.n_topics} and {args.n_words} "
                             "(the paper: 100 topics, 1000 visual words)")
    out_file(args.out, "--out", (".md", ".markdown"), "results.md")      # before any work
    ds = load_dataset(args.data, format=args.format, image_root=args.image_root)
    if not isinstance(ds, PairedDataset):
        raise CrossViewError(f"{args.data}: this is a caption corpus without images; --data needs an image-caption "
                             f"dataset (pass the corpus with --corpus)")
    test_ds = None
    if args.test_data:
        test_ds = load_dataset(args.test_data, format=args.test_format)
        if not isinstance(test_ds, PairedDataset):
            raise CrossViewError(f"--test-data {args.test_data}: a caption corpus without images; the cross-dataset "
                                 "test needs an image-caption dataset")
    corpus = None
    if args.corpus:
        corpus = load_dataset(args.corpus)
        if not getattr(corpus, "captions", None):
            raise CrossViewError(f"--corpus {args.corpus}: no captions in it; give a text file with one caption a line")
    rep_params: dict[str, Any] = {"device": args.device}
    if args.image_encoder:
        rep_params["image_encoder"] = args.image_encoder
    if args.text_encoder:
        rep_params["text_encoder"] = args.text_encoder
    if args.representation in ("tr", "ctr"):
        rep_params.update(n_topics=args.n_topics, n_words=args.n_words)
    if args.no_cache:
        rep_params["cache"] = False
    elif args.cache_dir:
        from crossview.features import FeatureCache
        rep_params["cache"] = FeatureCache(args.cache_dir)

    result = _print_experiment(lambda progress: run_bitr_table_seeds(
        ds, representation=args.representation, methods=methods, folds=args.folds, split=args.split, ks=ks,
        corpus=corpus, method_params=params, representation_params=rep_params, seeds=seeds, out=args.exp_dir,
        test_dataset=test_ds, test_parts=args.test_parts, index=args.index, feature_progress=progress))
    if args.out:
        out = Path(args.out)
        atomic_write_bytes(out, format_markdown(result, _command_line(args)).encode("utf-8"))
        print(f"experiment: wrote {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(format_table(result))
    return 0


def cmd_bitr_labels(args: argparse.Namespace) -> int:
    from crossview.data import load_dataset
    from crossview.data.dataset import PairedDataset
    from crossview.core.run_settings import parse_seeds
    from crossview.experiments.bitr_labels import (LABEL_METHODS, format_markdown, format_table, parse_methods,
                                                   run_bitr_labels_seeds)
    from crossview.experiments.bitr_table import parse_ks

    methods = parse_methods(args.methods)
    ks = parse_ks(args.k)
    if args.seeds is not None and args.seed != 0:
        raise CrossViewError(f"give --seed or --seeds, not both (--seed {args.seed}, --seeds {args.seeds})")
    seeds = parse_seeds(args.seeds) if args.seeds is not None else (args.seed,)
    params = _parse_params(args.param, LABEL_METHODS)
    out_file(args.out, "--out", (".md", ".markdown"), "results.md")      # before any work
    ds = load_dataset(args.data, format=args.format, image_root=args.image_root)
    if not isinstance(ds, PairedDataset):
        raise CrossViewError(f"{args.data}: a caption corpus without images; --data needs an image dataset")
    rep_params: dict[str, Any] = {"device": args.device}
    if args.image_encoder:
        rep_params["image_encoder"] = args.image_encoder
    if args.no_cache:
        rep_params["cache"] = False
    result = _print_experiment(lambda progress: run_bitr_labels_seeds(
        ds, kind=args.text, min_images=args.min_images, representation=args.representation, methods=methods,
        folds=args.folds, split=args.split, ks=ks, method_params=params, representation_params=rep_params,
        seeds=seeds, out=args.exp_dir, feature_progress=progress))
    if args.out:
        parts = ["crossview", "experiment", "bitr-labels", "--data", str(args.data), "--text", args.text]
        if args.text == "phrases":
            parts += ["--min-images", str(args.min_images)]
        parts += ["--representation", args.representation, "--methods", args.methods, "--k", str(args.k)]
        for flag, v in (("--folds", args.folds), ("--split", args.split), ("--format", args.format)):
            if v is not None:
                parts += [flag, str(v)]
        if args.seeds is not None:
            parts += ["--seeds", args.seeds]
        elif args.seed != 0:
            parts += ["--seed", str(args.seed)]
        for item in args.param or []:
            parts += ["--param", item]
        out = Path(args.out)
        atomic_write_bytes(out, format_markdown(result, " ".join(shlex.quote(p) for p in parts)).encode("utf-8"))
        print(f"experiment: wrote {out}", file=sys.stderr)
    print(json.dumps(result, indent=2, default=str) if args.json else format_table(result))
    return 0


def _study_command(args: argparse.Namespace, exp_dir: Path, name: str, chosen: str) -> str:
    """The command that reproduces a study (loss-compare, webly-ablation), for its Markdown report."""
    parts = ["crossview", "experiment", name, "--data", str(args.data)]
    for flag, v in (("--format", args.format), ("--image-root", args.image_root), ("--split", args.split),
                    ("--web", getattr(args, "web", None)), ("--held-out", getattr(args, "held_out", None)),
                    ("--n-concepts", getattr(args, "n_concepts", None) if getattr(args, "held_out", None) == "auto"
                     else None),
                    ("--image-encoder", args.image_encoder), ("--text-encoder", args.text_encoder)):
        if v:
            parts += [flag, str(v)]
    parts += [chosen, getattr(args, chosen[2:]), "--seeds", str(args.seeds)]
    if args.epochs is not None:
        parts += ["--epochs", str(args.epochs)]
    if getattr(args, "budget", None):
        parts += ["--budget", str(args.budget)]
    if getattr(args, "no_choose", False):
        parts += ["--no-choose"]
    if getattr(args, "folds", None) is not None:
        parts += ["--folds", str(args.folds)]
    for item in args.set_values or []:
        parts += ["--set", item]
    parts += ["--exp-dir", str(exp_dir)]
    return " ".join(shlex.quote(p) for p in parts)


def _run_study_command(args: argparse.Namespace, study: Any, chosen: str, runner: Any = None) -> int:
    """Load the dataset, run the study's trials (progress on stderr), write results.md / results.json into the
    experiment folder and print the table (or --json). ``runner`` (default
    :func:`crossview.experiments.variants.run_study` with ``study``) takes the dataset and run_study's keywords."""
    from crossview.core.events import Finished
    from crossview.core.io import atomic_write_json
    from crossview.data import load_dataset
    from crossview.data.dataset import PairedDataset
    from crossview.experiments import variants as V

    out_file(args.out, "--out", (".md", ".markdown"), "results.md")      # before any work
    names = V.parse_variants(study, getattr(args, chosen[2:]))
    params = V.parse_variant_params(study, args.set_values, names)
    if args.seeds < 1 or args.seeds > 1000:
        raise CrossViewError(f"--seeds must be >= 1 and at most 1,000, got {args.seeds}")
    from crossview.experiments.budget import MAX_EPOCHS
    if args.epochs is not None and not 1 <= args.epochs <= MAX_EPOCHS:
        raise CrossViewError(f"--epochs must be >= 1 and at most {MAX_EPOCHS:,} (the methods' cards cap max_epochs "
                             f"so), got {args.epochs}")
    ds = load_dataset(args.data, format=args.format, image_root=args.image_root)
    if not isinstance(ds, PairedDataset):
        raise CrossViewError(f"{args.data}: this is a caption corpus without images; --data needs an image-caption "
                             "dataset")
    from crossview.experiments._common import new_experiment_dir

    exp_dir = Path(args.exp_dir) if args.exp_dir else new_experiment_dir(study.kind, ds.name)
    from crossview.experiments.budget import parse_budget
    if study.kind == "loss-compare" and args.budget is None and args.epochs is None:
        from crossview.experiments.loss_compare import DEFAULT_BUDGET
        args.budget = DEFAULT_BUDGET
    budget = parse_budget(args.budget)
    printer = EventPrinter(prefix="experiment: ")
    result = None
    try:
        run = runner or (lambda data, **kw: V.run_study(study, data, **kw))
        for ev in run(ds, variants=names, seeds=args.seeds, epochs=args.epochs, params=params,
                      split=args.split, out=exp_dir, device=args.device,
                      image_encoder=args.image_encoder, text_encoder=args.text_encoder,
                      budget=budget, choose=not args.no_choose, folds=args.folds):
            if isinstance(ev, Finished):
                result = ev.summary
            else:
                printer(ev)
    finally:
        printer.close()
    assert result is not None
    if study.plural == "losses":
        result = {**result, "losses": result["variants"]}
    report = V.format_markdown(study, result, _study_command(args, exp_dir, study.kind, chosen))
    (exp_dir / "results.md").write_text(report, encoding="utf-8")
    atomic_write_json(exp_dir / "results.json", json.loads(json.dumps(result, default=str)))
    if args.out:
        atomic_write_bytes(Path(args.out), report.encode("utf-8"))
    print(f"experiment: wrote {exp_dir / 'results.md'} and results.json" + (f" and {args.out}" if args.out else ""),
          file=sys.stderr)
    print(json.dumps(result, indent=2, default=str) if args.json else V.format_table(study, result))
    return 0


def cmd_loss_compare(args: argparse.Namespace) -> int:
    from crossview.experiments.loss_compare import STUDY

    return _run_study_command(args, STUDY, "--losses")


def cmd_webly_ablation(args: argparse.Namespace) -> int:
    from crossview.experiments.webly_ablation import DEFAULT_VARIANTS, STUDY, run_webly_ablation, study_for

    if args.web and args.held_out:
        raise CrossViewError("give either --web (a web set) or --held-out (the held-out-concepts design), not both")
    web = args.web or ("demo" if str(args.data) == "demo" and not args.held_out else "")
    args.web = web
    if not args.variants:
        args.variants = ",".join((*DEFAULT_VARIANTS, "half-train" if web else "oracle"))
    held = None if web else (args.held_out or "auto")
    args.held_out = held

    def runner(data: Any, **kw: Any) -> Any:
        return run_webly_ablation(data, web=web or None, held_out=held, n_concepts=args.n_concepts, **kw)

    return _run_study_command(args, study_for(web) if web else STUDY, "--variants", runner)


def cmd_timam_ablation(args: argparse.Namespace) -> int:
    from crossview.experiments.timam_ablation import STUDY, default_variants

    args.variants = args.variants or ",".join(default_variants())
    return _run_study_command(args, STUDY, "--variants")


def _add_study_args(p: argparse.ArgumentParser, noun: str, example: str) -> None:
    p.add_argument("--seeds", type=int, default=3, help=f"seeds per {noun}, 0..N-1 (default 3; at most 1,000)")
    p.add_argument("--epochs", type=int, metavar="E",
                   help=f"max_epochs of every {noun} (default: the method's own); lr_decay_epoch moves in "
                        "proportion to the method's default schedule")
    p.add_argument("--budget", metavar="EPOCHSxBATCH[@DECAY]",
                   help=f"the same training budget for every {noun}: EPOCHS passes over the training captions in "
                        "batches of BATCH captions (methods that batch images take BATCH / captions-per-image "
                        "images: the same optimiser steps), the learning rate / 10 after DECAY of the epochs "
                        "(default 0.7), e.g. 20x128 or 20x128@0.5; 'defaults' keeps each method's own schedule"
                        + (" (default for loss-compare: 20x128)" if noun == "loss" else " (default: 'defaults')"))
    p.add_argument("--no-choose", action="store_true",
                   help=f"keep each {noun}'s own setting (margin, temperature) at its method default instead of "
                        "choosing it first by cross-validation of the training images (never on the reported "
                        "split)")
    p.add_argument("--folds", type=int_option(2, 100), default=None, metavar="K",
                   help="folds of that cross-validation (default 3)")
    p.add_argument("--split", metavar="NAME", help="evaluate on this split (default: test, else val)")
    p.add_argument("--set", dest="set_values", action="append", metavar=f"[{noun.upper()}.]NAME=VALUE",
                   help=f"a parameter, repeatable: {example} (one {noun}), embed_dim=512 (every {noun} whose method "
                        "has it)")
    p.add_argument("--image-encoder", metavar="NAME", help="image backbone (default: the package default)")
    p.add_argument("--text-encoder", metavar="NAME", help="caption features for text_model=features (default minilm)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default: auto)")
    p.add_argument("--exp-dir", metavar="DIR",
                   help="the experiment folder (default: a new folder in the runs folder); give an existing one to "
                        "continue it")
    p.add_argument("--out", metavar="FILE.md", help="also write the Markdown report here")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")


def register(sub: argparse._SubParsersAction) -> None:
    exp = sub.add_parser("experiment", help="run the papers' experiments (BITR table, loss comparison, ablations)",
                         description="Run the papers' experiments and print their tables.")
    esub = exp.add_subparsers(dest="experiment_command", metavar="EXPERIMENT", required=True)

    p = esub.add_parser(
        "bitr-table", help="Experiments 1 and 2 of the BITR paper: CCA, WSABIE, BITR-M/E/C, image <-> caption "
                           "(within a dataset, or trained on one and tested on another)",
        description="Experiment 1 of the BITR paper (Tables 2 and 7): image <-> caption retrieval with CCA, "
                    "WSABIE and BITR with the M, E and C losses on one representation. Prints Im2Text and "
                    "Text2Im BLEU-1 and ROUGE-1 (top 5 retrieved from the training set), R@K and MedR (within "
                    "the test set), Im2Text BLEU-1 / ROUGE-1 from an independent caption corpus (--corpus), and "
                    "the paper's own numbers from the method cards. Protocol: --folds N (N partitions, each the "
                    "test set once) or --split NAME (train on 'train', test on NAME); default: the 'test' split "
                    "when the dataset has one, else 10 folds. Every fold of every method is an ordinary run "
                    "folder (listed in the app's runs list, opened like any run) under one experiment folder "
                    "(--exp-dir); running the command again with the same --exp-dir skips the finished runs "
                    "and resumes an interrupted one. The random row is computed, not trained (no run). "
                    "Experiment 2 (Table 4): --test-data D2 evaluates the models trained on --data (its train "
                    "split) on another dataset, unchanged: R@K and MedR within each of --test-parts parts of D2, "
                    "BLEU-1 / ROUGE-1 with D2's images and captions as queries over all of --data. --seeds 0,1,2 "
                    "builds the table once per seed and reports the mean over the builds, their standard "
                    "deviation, and (--split without --test-data) each method paired against the first on the "
                    "same queries, with 95% intervals.")
    p.add_argument("--data", required=True, metavar="PATH|demo", help="image-caption dataset, or 'demo'")
    _add_dataset_args(p)
    p.add_argument("--representation", default="modern", choices=["modern", "tr", "ctr", "default"],
                   help="modern: CNN + PCA 128-d and averaged GloVe vectors (default); tr: LDA topics of visual "
                        "and caption words; ctr: TR projected by CCA; default: the default encoders")
    p.add_argument("--methods", default="cca,wsabie,bitr-m,bitr-e,bitr-c",
                   help="comma-separated rows: cca, wsabie, bitr-m, bitr-e, bitr-c, random (chance baseline) "
                        "(default: the paper's five)")
    p.add_argument("--folds", type=int_option(2, 100), metavar="N", help="N-fold protocol over all images (the paper: 10)")
    p.add_argument("--split", metavar="NAME", help="test on this split, train on 'train' (e.g. val or test)")
    p.add_argument("--k", default="50", metavar="K[,K...]", help="K of R@K, one or more (default 50, as the paper)")
    p.add_argument("--corpus", metavar="PATH", help="independent caption corpus (one caption a line) for Im2Text")
    p.add_argument("--test-data", metavar="PATH|demo",
                   help="Experiment 2: test the models on this other dataset (cross-dataset; the paper trains on SBU "
                        "and tests on Pascal and IAPR)")
    p.add_argument("--test-format", metavar="FORMAT", help="format of --test-data when it cannot be told from the path")
    p.add_argument("--index", metavar="BACKEND",
                   help="search the training collection for BLEU / ROUGE with this index backend (exact: chunked "
                        "exhaustive search; exact-fp16; faiss-flat; approximate: faiss-ivf, faiss-sq8, faiss-sqfp16, "
                        "faiss-pq4) instead of a dense score matrix: for collections of a million captions (the "
                        "paper's SBU); the search time is reported")
    p.add_argument("--test-parts", type=int_option(1, 1000), default=10, metavar="N",
                   help="partitions of --test-data that R@K and MedR are computed within (default 10, as the paper)")
    p.add_argument("--param", action="append", metavar="METHOD.NAME=VALUE",
                   help="a method parameter, repeatable: bitr.C=100 (all BITR rows), bitr-c.c_grid=paper, "
                        "wsabie.lr=0.01, cca.reg=0.1. BITR's C is chosen by 5-fold cross-validation of the training "
                        "images as the paper does (c_grid paper; BITR-M 1e-2:1e1) unless C or c_grid is given "
                        "(bitr.c_grid=none: the card's fixed C); the report lists the C each fold chose")
    p.add_argument("--image-encoder", metavar="NAME", help="image backbone (default: the package default)")
    p.add_argument("--text-encoder", metavar="NAME", help="text encoder for --representation default")
    p.add_argument("--n-topics", type=int, default=100, help="LDA topics for tr / ctr (default 100, as the paper)")
    p.add_argument("--n-words", type=int, default=1000, help="visual words for tr / ctr (default 1000, as the paper)")
    p.add_argument("--seed", type=seed_option, default=0, help="seed of the folds, k-means and LDA (default 0)")
    p.add_argument("--seeds", metavar="S[,S...]",
                   help="build the table once per seed (e.g. 0,1,2; each in EXP_DIR/seed-S) and report the mean "
                        "over the builds with their standard deviation (instead of --seed)")
    p.add_argument("--device", default="cpu", help="device for feature extraction (cpu, cuda, auto)")
    p.add_argument("--cache-dir", metavar="DIR", help="feature cache folder (default: the user cache)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the feature cache")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    p.add_argument("--out", metavar="FILE.md", help="also write the table and settings as Markdown")
    p.add_argument("--exp-dir", metavar="DIR",
                   help="the experiment folder: experiment.json and one run folder per fold and method "
                        "(default: a new bitr-table-<data>-<representation>-<time> folder in the runs folder); "
                        "give an existing one to continue it")
    p.set_defaults(func=cmd_bitr_table)

    p = esub.add_parser(
        "bitr-labels", help="Experiments 3 and 4 of the BITR paper: image <-> phrase / label retrieval",
        description="Experiments 3 and 4 of the BITR paper (Tables 5 and 6): the text side is the dataset's labels "
                    "(--text labels: IAPR TC-12's annotation words, the demo's objects) or its captions' relation "
                    "phrases (--text phrases: noun-verb, noun-prep-noun, verb-prep-noun from spaCy's dependency "
                    "parse), each one discrete text. CCA and BITR-M/E/C rank the labels' text, WSABIE (original: "
                    "one vector per label), wKNN and one-vs-rest SVMs the label ids. Prints Im2Text and Text2Im "
                    "P@K and mAP beside the paper's numbers. Protocol: --folds N (the paper: 10) or --split NAME; "
                    "every fold of every method is an ordinary run folder under --exp-dir (resumable, in the "
                    "app's runs list).")
    p.add_argument("--data", required=True, metavar="PATH|demo", help="image dataset with labels or captions, or 'demo'")
    _add_dataset_args(p)
    p.add_argument("--text", choices=["labels", "phrases"], default="labels",
                   help="labels (Experiment 4) or the captions' relation phrases (Experiment 3)")
    p.add_argument("--min-images", type=int_option(1), default=2, metavar="N",
                   help="phrases: keep a phrase when at least N images have it (default 2)")
    p.add_argument("--representation", default="modern", choices=["modern", "tr", "ctr", "default"],
                   help="features, as bitr-table (default modern: CNN + PCA, averaged GloVe of the label's words)")
    p.add_argument("--methods", default="cca,wknn,svm,wsabie,bitr-m,bitr-e,bitr-c,random",
                   help="comma-separated rows: cca, wknn, svm, wsabie, bitr-m, bitr-e, bitr-c, random")
    p.add_argument("--folds", type=int_option(2, 100), metavar="N", help="N-fold protocol over all images (the paper: 10)")
    p.add_argument("--split", metavar="NAME", help="test on this split, train on 'train'")
    p.add_argument("--k", default="5", metavar="K[,K...]", help="K of P@K (default 5, as the paper)")
    p.add_argument("--param", action="append", metavar="METHOD.NAME=VALUE",
                   help="a method parameter, repeatable: wknn.k=20, svm.C=10, bitr.C=100. BITR's C is chosen by "
                        "5-fold cross-validation of the training images as the paper does (c_grid paper; BITR-M "
                        "1e-2:1e1) unless C or c_grid is given (bitr.c_grid=none: the card's fixed C); the report "
                        "lists the C each fold chose")
    p.add_argument("--image-encoder", metavar="NAME", help="image backbone (default: the package default)")
    p.add_argument("--seed", type=seed_option, default=0, help="seed of the folds and the representation (default 0)")
    p.add_argument("--seeds", metavar="S[,S...]",
                   help="build the table once per seed (e.g. 0,1,2; each in EXP_DIR/seed-S): the mean over the builds "
                        "with their standard deviation, each method's mAP paired against the first with each "
                        "query's AP averaged over the builds first (instead of --seed)")
    p.add_argument("--device", default="cpu", help="device for feature extraction (cpu, cuda, auto)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the feature cache")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    p.add_argument("--out", metavar="FILE.md", help="also write the table as Markdown")
    p.add_argument("--exp-dir", metavar="DIR", help="the experiment folder (default: a new one in the runs folder); "
                                                   "give an existing one to continue it")
    p.set_defaults(func=cmd_bitr_labels)

    p = esub.add_parser(
        "loss-compare", help="paper 004: the VSE++ model trained with each loss (triplet, SmoothAP, InfoNCE)",
        description="Paper 004's question: does the hardest-negative triplet loss still win for image-caption "
                    "retrieval? Trains the same model (the VSE++ model with the run's encoders) with each loss, "
                    "once per seed: vsepp (triplet, hardest negative: the baseline), vse0 (triplet, sum of "
                    "negatives), smoothap (SmoothAP), infonce (InfoNCE / NT-Xent) and smoothap-paper (SmoothAP at "
                    "paper 004's tau 0.01). Every loss gets the same budget (--budget: epochs, captions a step, "
                    "hence optimiser steps, and the schedule's shape), and its own margin or temperature is chosen "
                    "first by cross-validation of the training images (or on val when the table reports on "
                    "test), never on the reported split (--no-choose keeps the method defaults). Evaluates on the "
                    "test split (val then chooses each run's epoch), else on val (the last epoch kept), and prints "
                    "R@1/5/10 both ways, rsum and the steps, mean and spread over the seeds, and the paired effect "
                    "of each loss against vsepp: seeds averaged per query, a bootstrap over the images for the "
                    "rsum and R@1 differences and the median rank change with 95% intervals, won / lost / tied "
                    "queries and the minimal detectable difference. Every (loss, seed) is an ordinary run folder "
                    "in --exp-dir (listed in the app; its Inspect panel compares any two); running again with the "
                    "same --exp-dir reads finished runs back and resumes an interrupted one. Writes results.md and "
                    "results.json into --exp-dir.")
    p.add_argument("--data", required=True, metavar="PATH|demo", help="image-caption dataset, or 'demo'")
    _add_dataset_args(p)
    p.add_argument("--losses", default="vsepp,vse0,smoothap,infonce,smoothap-paper",
                   help="comma-separated: vsepp, vse0, smoothap, infonce, smoothap-paper (SmoothAP at paper 004's "
                        "tau 0.01) (default: all five)")
    _add_study_args(p, "loss", "smoothap.tau=0.01")
    p.set_defaults(func=cmd_loss_compare)

    p = esub.add_parser(
        "webly-ablation", help="paper 003: which parts of webly supervised training carry its gain",
        description="Paper 003's ablations: method webly on the same features, once per seed, as full (Stage I, "
                    "then Stage II on the web set with the curriculum: the baseline), no-stage2 (Stage I only: does "
                    "the web data help?), no-curriculum (Stage II over the whole web set at once), no-lit (no "
                    "image-tag loss in Stage I), sentence-tags (no tag branch: the sentence branch reads the tags as "
                    "a string), sentence-only (no tags, no web data: the VSE model alone) and a positive control. "
                    "Without --web (the default on a dataset of image files): held-out concepts: a few frequent "
                    "nouns of the training captions are held out (--held-out auto, or name them), every training "
                    "image that names one leaves the clean training set and becomes the web set with noisy tags, "
                    "Stage II gets about as many optimiser steps as Stage I, and the positive control oracle trains "
                    "Stage I on every training image with its captions; the table also compares the variants on "
                    "the evaluation queries that name a held-out concept. With --web W: the ablations on a given "
                    "web set, the positive control half-train (full on half the training images). Evaluates on the "
                    "test split (val then chooses each run's epoch), else on val (the last epoch kept); prints "
                    "R@1/5/10 both ways, rsum and steps, mean and spread over the seeds, and the paired effect "
                    "against full (seeds averaged per query, bootstrap over the images, 95% intervals, the minimal "
                    "detectable difference). Every (variant, seed) is an ordinary run folder in --exp-dir (listed "
                    "in the app); the same --exp-dir again reads finished runs back and resumes an interrupted "
                    "one. Writes results.md and results.json into --exp-dir.")
    p.add_argument("--data", required=True, metavar="PATH|demo", help="image-caption dataset, or 'demo'")
    _add_dataset_args(p)
    p.add_argument("--web", metavar="PATH|demo",
                   help="a web image-tag set for Stage II (a webtags collection; 'crossview data make-web D --out "
                        "DIR' builds one from D's own training images); default with --data demo: the demo's; "
                        "otherwise the held-out-concepts design")
    p.add_argument("--held-out", metavar="auto|NOUN,NOUN",
                   help="the held-out-concepts design (the default without --web): auto (the --n-concepts most "
                        "frequent caption nouns that each name at most 12%% of the training images) or the nouns")
    p.add_argument("--n-concepts", type=int_option(1, 1000), default=3, metavar="N",
                   help="concepts held out by --held-out auto (default 3)")
    p.add_argument("--variants",
                   help="comma-separated: full, no-stage2, no-curriculum, no-lit, sentence-tags, sentence-only, "
                        "oracle (held-out design), half-train (with --web) (default: the six ablations and the "
                        "design's positive control)")
    _add_study_args(p, "variant", "no-curriculum.stage2_lr=1e-4")
    p.set_defaults(func=cmd_webly_ablation)

    from crossview.experiments.timam_ablation import VARIANTS as TIMAM_VARIANTS

    p = esub.add_parser(
        "timam-ablation", help="paper 002: does the modality discriminator help TIMAM (and its other parts)?",
        description="Paper 002's ablations: method timam on the same features, once per seed, as full (its "
                    "defaults: identification + CMPM + the modality discriminator; the baseline), "
                    "no-discriminator (adv_weight=0: the paper's claim is that the discriminator helps), "
                    "no-identification (id_weight=0), lm-frozen (the paper's Bi-LSTM over the language model's "
                    "token states, text_model=bilstm at lr 2e-4, the language model frozen throughout) and "
                    "lm-finetuned (the same with a second phase fine-tuning its top layers); a variant that is "
                    "the defaults is left out unless named. Evaluates on the test split (val then chooses each "
                    "run's epoch), else on val (the last epoch kept); prints R@1/5/10 both ways and rsum, mean and "
                    "spread over the seeds, and the paired effect against full (seeds averaged per query, a "
                    "bootstrap over the images: rsum and R@1 differences with 95% intervals, won / lost / tied, the "
                    "minimal detectable difference), and says whether the design resolves the discriminator "
                    "effect paper 002 reports (~1.8 R@1: the minimal detectable difference must be below that; add "
                    "--seeds when it is not). Every (variant, seed) is an ordinary run folder in --exp-dir "
                    "(listed in the app); the same --exp-dir again reads finished runs back and resumes an "
                    "interrupted one. Writes results.md and results.json into --exp-dir. On the demo, "
                    "--set labels=identity trains on its layout classes as identities.")
    p.add_argument("--data", required=True, metavar="PATH|demo", help="image-caption dataset, or 'demo'")
    _add_dataset_args(p)
    p.add_argument("--variants",
                   help=f"comma-separated: {', '.join(TIMAM_VARIANTS)} (default: all but the lm-* variant that is "
                        "timam's default)")
    _add_study_args(p, "variant", "no-discriminator.flip=0")
    p.set_defaults(func=cmd_timam_ablation)
