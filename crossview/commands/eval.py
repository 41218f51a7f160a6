"""``crossview eval RUN_OR_EMBEDDINGS``: the metric table of a run or of an embeddings file;
``crossview eval A [A2 ...] --compare B [B2 ...]``: the paired effect of run(s) B against run(s) A on the same
queries (:func:`crossview.eval.paired.paired_effect`: several runs on one side are seeds of one variant)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from crossview.commands._common import (ProgressPrinter, add_scoring_options, int_option, print_events, print_result,
                                        scoring_select)
from crossview.core.errors import CrossViewError


def _run_split(run: Path) -> str:
    """The split a run folder was evaluated on (config.json), ``test`` for folders that do not say."""
    import json

    try:
        split = json.loads((run / "config.json").read_text(encoding="utf-8")).get("split")
    except (OSError, ValueError, AttributeError):
        split = None
    return split if isinstance(split, str) and split else "test"


def _embeddings_path(target: str, split: str | None) -> Path:
    p = Path(target).expanduser()
    if p.is_dir():
        if split is None:
            split = _run_split(p)
        cand = p / f"embeddings_{split}.npz"
        if cand.is_file():
            return cand
        have = sorted(q.name for q in p.glob("embeddings_*.npz"))
        if (p / "config.json").is_file():
            hint = (f"it has {', '.join(have)}; choose --split accordingly" if have else
                    "it has no embeddings file; the run may have been stopped before its evaluation - resume it "
                    "with 'crossview train --resume " + str(p) + "'")
            raise CrossViewError(f"{p}: run has no embeddings for split {split!r}; {hint}")
        raise CrossViewError(f"{p}: neither a run folder (config.json) nor an embeddings .npz file")
    if not p.exists():
        raise CrossViewError(f"{p}: no such run folder or embeddings file")
    return p


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items() if k != "ranks"}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _ks(value: str) -> list[int]:
    items = value.split(",")
    if any(not k.strip() for k in items):
        raise CrossViewError(f"--k {value!r}: an empty item; give comma-separated integers, e.g. 1,5,10")
    try:
        ks = sorted({int(k) for k in items})
    except ValueError:
        raise CrossViewError(f"--k {value!r}: give comma-separated integers, e.g. 1,5,10") from None
    if not ks or ks[0] < 1:
        raise CrossViewError(f"--k {value!r}: K must be positive integers")
    return ks


def _ranks_out(value: str) -> Path:
    """The file ``--ranks-out`` names (``.npz`` added when missing, as numpy does), checked before evaluating: a
    folder is refused (its ranks would land beside it, or over a run's own ranks.npz inside it)."""
    p = Path(value).expanduser()
    if p.is_dir():
        raise CrossViewError(f"--ranks-out {p}: that is a folder; give a file name, e.g. {p / 'ranks-eval.npz'}")
    if p.suffix != ".npz":
        p = p.with_name(p.name + ".npz")
    if not p.parent.is_dir():
        raise CrossViewError(f"--ranks-out {p}: the folder {p.parent} does not exist; create it or choose another")
    return p


def _compare_runs(targets: list[str], split: str | None, plain: bool = False) -> list[tuple[Path, Any, str, str]]:
    """The runs of one side of ``--compare`` (their ranks.npz), checked; with their split and dataset. ``plain``:
    each run's plain ranks (``i2t_plain`` / ``t2i_plain``, kept beside a scored run's own), not its scoring's."""
    from crossview.engine.results import load_run_results

    runs = []
    for t in targets:
        p = Path(t).expanduser()
        if not p.is_dir():
            what = "an embeddings file: it holds no ranks of its own" if p.is_file() else "no such folder"
            raise CrossViewError(f"{p}: --compare compares run folders (their ranks.npz), and this is {what}")
        if not (p / "ranks.npz").is_file():
            raise CrossViewError(f"{p}: no ranks.npz - the run has not finished its evaluation; resume it with "
                                 f"'crossview train --resume {p}'")
        r = load_run_results(p, plain=plain)
        if "i2t" not in r.ranks or "t2i" not in r.ranks:
            raise CrossViewError(f"{p / 'ranks.npz'}: needs both i2t and t2i ranks to compare")
        r_split = str(r.summary.get("split") or _run_split(p))
        if split is not None and r_split != split:
            raise CrossViewError(f"{p}: its ranks.npz holds the {r_split} evaluation, not --split {split}; runs "
                                 "are compared on the split they were evaluated on")
        runs.append((p, r, r_split, str(r.summary.get("dataset", "?"))))
    return runs


def _check_same_queries(runs: list[tuple[Path, Any, str, str]]) -> np.ndarray | None:
    """The caption -> image map all the runs share (``None`` if one lacks it); refuses different query sets."""
    p0, r0, split0, data0 = runs[0]
    for p, r, split, data in runs[1:]:
        if (split, data) != (split0, data0):
            raise CrossViewError(f"{p} was evaluated on {data} {split}, {p0} on {data0} {split0}; compare runs "
                                 "evaluated on the same split")
        for d in ("i2t", "t2i"):
            same = r.ranks[d].shape == r0.ranks[d].shape and (
                d not in r.queries or d not in r0.queries or np.array_equal(r.queries[d], r0.queries[d]))
            if not same:
                raise CrossViewError(f"{p} and {p0} ranked different {d} query sets ({r.ranks[d].size} and "
                                     f"{r0.ranks[d].size} queries); compare runs evaluated on the same split")
        if r.caption_image is not None and r0.caption_image is not None and \
                not np.array_equal(r.caption_image, r0.caption_image):
            raise CrossViewError(f"{p} and {p0} map their captions to different images; compare runs evaluated "
                                 "on the same split")
    maps = [r.caption_image for _, r, _, _ in runs]
    return None if any(m is None for m in maps) else maps[0]


def _scoring_label(summary: dict[str, Any]) -> str:
    sc = summary.get("scoring") if isinstance(summary.get("scoring"), dict) else {}
    name = sc.get("scoring", "plain")
    return name + (f" {sc.get('param_name')}={sc['param']:g}" if sc.get("param") is not None else "")


def _format_compare(res: dict) -> str:
    """The paired effect as a small plain-text table."""
    def ci(v: float, band: list[float]) -> str:
        return f"{v:+.1f} [{band[0]:+.1f}, {band[1]:+.1f}]"

    def p(x: float) -> str:
        return "<0.001" if x < 1e-3 else f"{x:.3f}"

    rows = [["", "A", "B", f"B - A [{100 * res['level']:.0f}% CI]", "p"]]
    for d in ("i2t", "t2i"):
        r = res[d]
        rows += [[f"{d} R@{k}", f"{r[f'R@{k}']['a']:.1f}", f"{r[f'R@{k}']['b']:.1f}",
                  ci(r[f"R@{k}"]["diff"], r[f"R@{k}"]["ci"]), ""] for k in res["ks"]]
        m = r["median_rank_change"]
        rows.append([f"{d} median rank change", "", "", ci(m["value"], m["ci"]), ""])
        rows.append([f"{d} won / lost / tied", "", "", f"{r['won']} / {r['lost']} / {r['tied']}", p(r["p"])])
    rs = res["rsum"]
    rows.append(["rsum", f"{rs['a']:.1f}", f"{rs['b']:.1f}", ci(rs["diff"], rs["ci"]), p(rs["p"])])
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    a, b = res["runs_a"], res["runs_b"]
    head = (f"B - A: {', '.join(b)} ({res['seeds_b']} seed(s)) against {', '.join(a)} ({res['seeds_a']} seed(s)); "
            f"{res['dataset']} {res['split']}: n = {res['n_images']} images / {res['n_captions']} captions")
    mde = res["mde"]
    return "\n".join([
        head, "", *lines, "",
        *([f"scoring: {res['scoring']} (--scoring plain compares the plain ranks)"] if res.get("scoring") else []),
        f"resampled: {res['resampled']}; {res['resamples']} resamples, percentile intervals",
        "won / lost / tied: queries (ranks averaged over the seeds) that B ranks higher / lower / the same; "
        "a negative rank change: B ranks the ground truth higher",
        f"p: {res['p_method']}",
        "minimal detectable difference: " + ", ".join(f"{k} {v:.1f}" for k, v in mde.items() if k != "explanation")
        + f" ({mde['explanation']})"])


def _check_distinct_runs(side_a: list[str], side_b: list[str]) -> None:
    """One line when a run folder is named twice: on both sides its difference is 0 by construction; twice on one
    side it would count as two seeds' observations."""
    seen: dict[Path, str] = {}
    for side, targets in (("A", side_a), ("B", side_b)):
        for t in targets:
            key = Path(t).expanduser().resolve()
            if key in seen:
                where = (f"on side {side} twice (it would count as two seeds)" if seen[key] == side else
                         "on both sides of --compare (its difference with itself is 0 by construction)")
                raise CrossViewError(f"{t}: named {where}; give each run folder once")
            seen[key] = side


def cmd_compare(args: argparse.Namespace) -> int:
    """``crossview eval A [A2 ...] --compare B [B2 ...]``: the paired effect of B against A."""
    from crossview.eval.paired import paired_effect

    for flag, given in (("--protocol", args.protocol != "standard"), ("--overlap", args.overlap),
                        ("--ranks-out", bool(args.ranks_out)),
                        ("--scoring", args.scoring not in (None, "plain")),
                        ("--select", args.select is not None)):
        if given:
            raise CrossViewError(f"{flag} does not apply to --compare: it compares the runs' recorded ranks, each "
                                 "under its own scoring, or with --scoring plain their plain ranks (evaluate each "
                                 "run without --compare for that)")
    ks = _ks(args.k)
    _check_distinct_runs(args.target, args.compare)
    plain = args.scoring == "plain"
    side_a, side_b = (_compare_runs(args.target, args.split, plain),
                      _compare_runs(args.compare, args.split, plain))
    caption_image = _check_same_queries(side_a + side_b)
    stack = lambda side: {d: np.stack([r.ranks[d] for _, r, _, _ in side]) for d in ("i2t", "t2i")}  # noqa: E731
    res = paired_effect(stack(side_a), stack(side_b), caption_image, ks=ks, resamples=args.resamples)
    res.update(runs_a=[str(p) for p, *_ in side_a], runs_b=[str(p) for p, *_ in side_b],
               split=side_a[0][2], dataset=side_a[0][3],
               scoring="plain" if plain else "each run's own: " + ", ".join(
                   _scoring_label(r.summary) for _, r, _, _ in side_a + side_b))
    print_result(json.dumps(res, indent=2) if args.json else _format_compare(res))
    return 0


def metric_table(res: dict[str, Any], ci: dict[str, Any] | None = None) -> tuple[list[str], list[list]]:
    """The metric table of an :func:`~crossview.eval.embeddings.evaluate_embeddings` result as a spreadsheet reads
    it: a header and one row per direction (i2t, t2i; ``labels`` for the labels protocol), each metric beside the
    ends of its interval from ``ci`` (:func:`crossview.eval.bootstrap.bootstrap_ci`) in columns of their own
    (``R@1``, ``R@1_low``, ``R@1_high``: empty where there is none); rsum last."""
    def num(v: Any) -> Any:
        return round(float(v), 4) if isinstance(v, (int, float, np.integer, np.floating)) else ""

    if "labels" in res:
        lab = res["labels"]
        keys = [k for k in lab if k.startswith("P@")] + ["mAP"]
        return ["direction", *keys], [["labels", *(num(lab[k]) for k in keys)]]
    ci = ci or {}
    keys = list(res["i2t"]) + (["rsum"] if res.get("rsum") is not None else [])
    header = ["direction"] + [c for k in keys for c in (k, f"{k}_low", f"{k}_high")]
    rows = []
    for d in ("i2t", "t2i"):
        row: list = [d]
        for k in keys:
            band = ci.get("rsum") if k == "rsum" else (ci.get(d) or {}).get(k)
            row += [num(res["rsum"] if k == "rsum" else res[d].get(k)), *(num(x) for x in (band or ("", "")))]
        rows.append(row)
    return header, rows


def _write_csv(path: str, res: dict[str, Any], caption_image: np.ndarray, ks: tuple[int, ...]) -> Path:
    """``--csv``: :func:`metric_table` with bootstrap intervals over the images (when the protocol gives ranks)."""
    import csv

    from crossview.eval.bootstrap import bootstrap_ci

    ci = None
    if "ranks" in res and "labels" not in res:
        ci = bootstrap_ci(res["ranks"]["i2t"], res["ranks"]["t2i"], caption_image, ks=ks)
        if tuple(ks) != (1, 5, 10):       # its rsum sums the K asked for; rsum is R@1, 5 and 10 both ways
            ci["rsum"] = bootstrap_ci(res["ranks"]["i2t"], res["ranks"]["t2i"], caption_image)["rsum"]
    header, rows = metric_table(res, ci)
    out = Path(path).expanduser()
    try:
        with open(out, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
    except OSError as e:
        raise CrossViewError(f"cannot write {out}: {e.strerror or e}; give --csv a path in a folder you can write "
                             "to") from None
    return out


def cmd_eval(args: argparse.Namespace) -> int:
    from crossview.eval.embeddings import evaluate_embeddings, format_report, load_embeddings

    if args.compare:
        return cmd_compare(args)
    if len(args.target) != 1:
        raise CrossViewError(f"eval takes one run or embeddings file, got {len(args.target)}; several runs (seeds) "
                             "only with --compare: crossview eval A1 A2 --compare B1 B2")
    select = scoring_select(args)
    path = _embeddings_path(args.target[0], args.split)
    scoring, recorded, note = _scoring(args, path, Path(args.target[0]).expanduser().is_dir())
    ranks_out = _ranks_out(args.ranks_out) if args.ranks_out else None
    emb = load_embeddings(path)
    ks = _ks(args.k)
    bars: dict[str, ProgressPrinter] = {}

    def progress(stage: str, done: int, total: int) -> None:
        bars.setdefault(stage, ProgressPrinter(stage))(done, total)

    if scoring != "plain":
        from crossview.engine.scoring import iter_evaluate_run

        run = Path(args.target[0]).expanduser()
        if not run.is_dir() or not (run / "config.json").is_file():
            raise CrossViewError(f"{run}: --scoring {scoring} needs a run folder (its training split is the bank the "
                                 "scores are normalised with), not an embeddings file; use --scoring plain")
        for flag, given in (("--protocol", args.protocol not in ("standard", "coco5k", "coco1k")),
                            ("--overlap", args.overlap)):
            if given:
                raise CrossViewError(f"{flag} does not apply to --scoring {scoring} (it re-scores the standard, "
                                     "coco5k and coco1k protocols); leave it out or use --scoring plain")
        param = args.param if recorded is None else recorded["param"]
        res = print_events(iter_evaluate_run(run, scoring, split=path.name[len("embeddings_"):-len(".npz")],
                                              param=param, select=select, ks=tuple(ks),
                                              # the run's own scoring is its summary already, not a re-scoring
                                              record=recorded is None, protocol=args.protocol))
        if recorded is not None:     # the run's own scoring: its record (a method default), not "given"
            res["scoring"] = {**recorded, "reported_on": res["scoring"]["reported_on"]}
        res["protocol"] = args.protocol
    else:
        res = evaluate_embeddings(emb, args.protocol, ks, overlap=args.overlap, progress=progress)
    res["source"] = str(path)
    res.update({k: v for k, v in emb.info.items()})
    if args.ranks_out:
        if "ranks" not in res:
            raise CrossViewError(f"protocol {args.protocol!r} gives no per-query ranks to write")
        from crossview.core.io import atomic_writer

        atomic_writer(ranks_out, lambda f: np.savez(f, **{d: r for d, r in res["ranks"].items()}))
    if args.csv:
        _write_csv(args.csv, res, emb.caption_image, ks)
    if args.json:
        print_result(json.dumps(_jsonable(res), indent=2))
    else:
        from crossview.eval.scoring import describe_scoring

        who = " ".join(f"{k} {v}" for k, v in emb.info.items())
        report = format_report(res, title=f"{path}" + (f"  ({who})" if who else ""))
        from crossview.engine.scoring import describe_run_scoring

        how = describe_scoring(res.get("scoring"))
        if how and isinstance(res["scoring"], dict) and res["scoring"].get("default"):
            how = describe_run_scoring(res["scoring"], None, full=True)
        print_result(report + (f"\n{how}; reported on {res['scoring']['reported_on']}" if how else "")
                     + (f"\n{note}" if note else ""))
    return 0


def _scoring(args: argparse.Namespace, path: Path, run_folder: bool = True) -> tuple[str, dict[str, Any] | None, str]:
    """``(scoring, recorded, note)``: the scoring to evaluate under, checked (one clear line for an unknown name,
    ``--param`` only where it applies). Without ``--scoring`` it is the run's own (config.json's record; plain for
    an embeddings file, an old run, or where a scoring cannot apply: another protocol, caption overlap, the run's
    training split, each said in ``note``); ``recorded`` is that record when its parameter is used as it is (no
    ``--param`` / ``--select``), else None."""
    from crossview.commands._common import scoring_name
    from crossview.engine.run_folder import read_config
    from crossview.engine.scoring import pending_scoring, run_scoring

    folder = path.parent
    config = None
    if run_folder and (folder / "config.json").is_file():
        try:
            config = read_config(folder)
        except CrossViewError:
            config = None       # a damaged config.json: the embeddings file alone is evaluated, plain
    scoring = scoring_name(args, None, config)
    if args.scoring is not None:
        if args.scoring == "default" and scoring != "plain" and args.param is None and args.select is None:
            from crossview.engine.scoring import default_scoring
            return scoring, default_scoring(str((config or {}).get("method") or "")), ""
        return scoring, None, ""
    record = run_scoring(config)
    if scoring == "plain":
        return "plain", None, ""
    split = path.name[len("embeddings_"):-len(".npz")]
    why = ("caption overlap is scored plain" if args.overlap else
           f"protocol {args.protocol} is scored plain" if args.protocol not in ("standard", "coco5k", "coco1k") else
           f"split {split} is its training split, the bank's" if split == str(config.get("train_split") or "train")
           else "")
    if why:
        return "plain", None, f"plain scores: the run's {scoring} does not apply here ({why})"
    if args.param is not None or args.select is not None or pending_scoring(record):
        return scoring, None, ""
    return scoring, record, ""



def register(sub: argparse._SubParsersAction) -> None:
    from crossview.eval.embeddings import PROTOCOLS

    p = sub.add_parser(
        "eval", help="evaluate a run or an embeddings file (R@K, MedR, MeanR, rsum, ...)",
        description="Print the metric table of a trained run (its embeddings_<split>.npz) or of any embeddings "
                    ".npz file (keys image, text, caption_image; see crossview.eval.embeddings), or with --compare "
                    "the paired effect of one variant's runs against another's. Ranks are "
                    "1-based; ties are broken by the smaller index. Protocols: "
                    + "; ".join(f"{k}: {v}" for k, v in PROTOCOLS.items()) + ".")
    p.add_argument("target", metavar="RUN_OR_EMBEDDINGS", nargs="+",
                   help="a run folder or an embeddings .npz file; with --compare, one or more run folders (the "
                        "seeds of the baseline A)")
    p.add_argument("--compare", metavar="RUN_B", nargs="+", default=None,
                   help="the paired effect of these runs (B: one or more seeds of the variant) against the "
                        "positional runs (A), on the same queries: R@K and rsum B - A with 95%% intervals, the "
                        "median rank change, queries won / lost / tied, a sign test over images and the minimal "
                        "detectable difference; seeds are averaged per query and the bootstrap resamples images "
                        "(each with its captions). Reads each run's ranks.npz")
    p.add_argument("--resamples", type=int_option(10, 100_000), default=2000, help="bootstrap resamples for --compare (default 2000)")
    p.add_argument("--split", default=None,
                   help="split of a run to evaluate (default: the split the run was evaluated on)")
    p.add_argument("--protocol", default="standard", choices=list(PROTOCOLS), help="evaluation protocol")
    p.add_argument("--k", default="1,5,10", help="comma-separated K for R@K / P@K (default 1,5,10)")
    p.add_argument("--overlap", action="store_true",
                   help="also BLEU-1..4 and ROUGE-1/L of the top-5 (needs captions in the file)")
    p.add_argument("--ranks-out", metavar="FILE.npz", help="write the per-query ranks (i2t, t2i) here")
    add_scoring_options(p, param=True)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--csv", metavar="FILE.csv",
                   help="also write the metric table as CSV: a header, one row per direction, each R@K beside its "
                        "95%% bootstrap interval over the images in columns of their own (R@1, R@1_low, R@1_high)")
    p.set_defaults(func=cmd_eval)
