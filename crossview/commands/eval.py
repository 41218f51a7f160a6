"""``crossview eval RUN_OR_EMBEDDINGS``: the metric table of a run or of an embeddings file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from crossview.commands._common import ProgressPrinter
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


def cmd_eval(args: argparse.Namespace) -> int:
    from crossview.eval.embeddings import evaluate_embeddings, format_report, load_embeddings

    path = _embeddings_path(args.target, args.split)
    emb = load_embeddings(path)
    try:
        ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
    except ValueError:
        raise CrossViewError(f"--k {args.k!r}: give comma-separated integers, e.g. 1,5,10") from None
    if not ks or ks[0] < 1:
        raise CrossViewError(f"--k {args.k!r}: K must be positive integers")
    bars: dict[str, ProgressPrinter] = {}

    def progress(stage: str, done: int, total: int) -> None:
        bars.setdefault(stage, ProgressPrinter(stage))(done, total)

    res = evaluate_embeddings(emb, args.protocol, ks, overlap=args.overlap, progress=progress)
    res["source"] = str(path)
    res.update({k: v for k, v in emb.info.items()})
    if args.ranks_out:
        if "ranks" not in res:
            raise CrossViewError(f"protocol {args.protocol!r} gives no per-query ranks to write")
        np.savez(args.ranks_out, **{d: r for d, r in res["ranks"].items()})
    if args.json:
        print(json.dumps(_jsonable(res), indent=2))
    else:
        who = " ".join(f"{k} {v}" for k, v in emb.info.items())
        print(format_report(res, title=f"{path}" + (f"  ({who})" if who else "")))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from crossview.eval.embeddings import PROTOCOLS

    p = sub.add_parser(
        "eval", help="evaluate a run or an embeddings file (R@K, MedR, MeanR, rsum, ...)",
        description="Print the metric table of a trained run (its embeddings_<split>.npz) or of any embeddings "
                    ".npz file (keys image, text, caption_image; see crossview.eval.embeddings). Ranks are "
                    "1-based; ties are broken by the smaller index. Protocols: "
                    + "; ".join(f"{k}: {v}" for k, v in PROTOCOLS.items()) + ".")
    p.add_argument("target", metavar="RUN_OR_EMBEDDINGS", help="a run folder or an embeddings .npz file")
    p.add_argument("--split", default=None,
                   help="split of a run to evaluate (default: the split the run was evaluated on)")
    p.add_argument("--protocol", default="standard", choices=list(PROTOCOLS), help="evaluation protocol")
    p.add_argument("--k", default="1,5,10", help="comma-separated K for R@K / P@K (default 1,5,10)")
    p.add_argument("--overlap", action="store_true",
                   help="also BLEU-1..4 and ROUGE-1/L of the top-5 (needs captions in the file)")
    p.add_argument("--ranks-out", metavar="FILE.npz", help="write the per-query ranks (i2t, t2i) here")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_eval)
