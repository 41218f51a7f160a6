"""A method's caption features head to head under the scoring it ships with: ``crossview train METHOD --data <the
Flickr8k sample> --text-encoder T`` for each T (everything else the method's defaults), on the engine's
cross-validation folds of the 600 training photos and once on the 100 val photos.

bench/rich_features.py chooses feature pipelines under plain (dot-product) scores, one change at a time. A method
ranks by its default scoring (crossview.engine.scoring.DEFAULT_SCORINGS), and re-scoring takes away part of what
richer caption features add (both cut hubs), so a pipeline that wins under plain scores need not win under the
default scoring. This compares the first encoder (the baseline, by default the method's own) with each other one
on the same held-out photos (the engine's ``--select cv`` folds: trained on 400, each of the other 200 ranked
against a bank of those 400), paired per query, under plain scores and under the default scoring with its fixed
parameter; the choice is read from the folds, val is reported once.

    python bench/text_encoder_cv.py --method cca --text-encoders minilm+glove,minilm+tfidf [--work DIR] [--out FILE]

Run folders are kept in ``--work`` and read back on the next call.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _quality as Q  # noqa: E402  (bench/_quality.py: the runs, folds and cells bench/quality.py shares)
import _stamp  # noqa: E402  (bench/_stamp.py)

SAMPLE = _stamp.FLICKR8K


def compare(method: str, encoders: list[str], data: str, work: Path) -> list[dict]:
    """Per encoder after the first, per scoring (plain, the method's default): the paired effects of it minus the
    first on the pooled CV folds and on val, and both sides' rsums. Trains (or reads back) one run per encoder and
    its CV fold runs."""
    from crossview.engine.run_folder import read_summary
    from crossview.engine.scoring import evaluate_run
    from crossview.eval.paired import paired_effect

    default, param, _ = Q.method_default_scoring(method)
    scorings = [("plain", None)] + ([] if default == "plain" else [(default, param)])
    runs, seconds = {}, {}
    for te in encoders:
        run_dir = work / f"{method}-{te.replace('+', '_')}"
        summary = Q.ensure_trained(method, data, run_dir, text_encoder=te)
        if summary.get("text_encoder") != te:
            raise SystemExit(f"{run_dir}: trained with text encoder {summary.get('text_encoder')}, not {te}; give "
                             "another --work")
        Q.log(f"{method} {te}: CV fold runs (--select cv)")
        evaluate_run(run_dir, "csls", select="cv", record=False)   # trains the fold runs every scoring reads
        runs[te], seconds[te] = run_dir, float(summary.get("train_seconds") or 0.0)
    base = encoders[0]
    split = str(read_summary(runs[base])["split"])
    caps = Q.caption_image(runs[base], split)
    rows = []
    for s, p in scorings:
        cv_a, cv_caps = Q.cv_ranks(runs[base], s, p)
        val_a = evaluate_run(runs[base], s, param=p, record=False)
        for te in encoders[1:]:
            cv_b, cv_caps_b = Q.cv_ranks(runs[te], s, p)
            if not np.array_equal(cv_caps, cv_caps_b):
                raise SystemExit(f"{runs[te]}: its CV folds hold other photos than {runs[base]}'s")
            val_b = evaluate_run(runs[te], s, param=p, record=False)
            rows.append({"scoring": s, "param": p, "default": s == default, "base": base, "other": te,
                         "cv": (Q.rsum(cv_a), Q.rsum(cv_b)), "cv_eff": paired_effect(cv_a, cv_b, cv_caps, seed=0),
                         "val": (val_a["rsum"], val_b["rsum"]),
                         "val_eff": paired_effect(val_a["ranks"], val_b["ranks"], caps, seed=0),
                         "seconds": (seconds[base], seconds[te])})
    return rows


def run(args: argparse.Namespace) -> int:
    Q.one_thread()
    from crossview.methods import method_class

    encoders = [t.strip() for t in args.text_encoders.split(",") if t.strip()] if args.text_encoders else []
    if not encoders:
        encoders = [method_class(args.method).default_text_encoder, "minilm+tfidf"]
    if len(encoders) < 2 or len(set(encoders)) != len(encoders):
        print(f"--text-encoders: give two or more different encoders, the baseline first; got {encoders}",
              file=sys.stderr)
        return 2
    work = Path(args.work).expanduser().absolute()
    rows = compare(args.method, encoders, str(Path(args.data).absolute()), work)
    cls = method_class(args.method)
    print(f"Data: the Flickr8k sample (600 train photos, 100 val). `crossview train {args.method} --data <sample> "
          "--text-encoder T` (seed 0), every other setting the method's default (image encoder "
          f"{cls.default_image_encoder}); the engine's 3 CV folds of the training photos (each fold's model trained "
          "on the other 400, its 200 held-out photos and their captions ranked against a bank of those 400), "
          "pooled: every training photo a query once; val: the run trained on all 600, once. rsum = R@1+5+10 both "
          "ways; differences paired per query (95% bootstrap over photos with their captions; \"detectable\": the "
          "smallest difference found with 80% power, two-sided 5%).\n")
    print(f"| scoring | caption features | CV rsum | CV: - {encoders[0]} (95% CI, p; detectable) | val rsum | "
          f"val: - {encoders[0]} (95% CI, p; detectable) | train s (600 photos) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        name = r["scoring"] + ("" if r["param"] is None else f" {r['param']:g}") + (" (default)" if r["default"]
                                                                                     else "")
        print(f"| {name} | {r['base']} | {r['cv'][0]:.1f} | - | {r['val'][0]:.1f} | - | {r['seconds'][0]:.1f} |")
        print(f"| {name} | {r['other']} | {r['cv'][1]:.1f} | {Q.diff_cell(r['cv_eff'], mde=True)} | "
              f"{r['val'][1]:.1f} | {Q.diff_cell(r['val_eff'], mde=True)} | {r['seconds'][1]:.1f} |")
    print()
    for r in (r for r in rows if r["default"]):
        ci = r["cv_eff"]["rsum"]["ci"]
        verdict = (f"above 0: {r['other']} is the better under this scoring" if ci[0] > 0 else
                   f"below 0: {r['base']} is the better under this scoring" if ci[1] < 0 else
                   "spans 0: no evidence that either is better")
        print(f"- Under the scoring {args.method} ranks by ({r['scoring']}"
              + ("" if r["param"] is None else f" {r['param']:g}") + f"), {r['other']} minus {r['base']} on the "
              f"folds: {Q.diff_cell(r['cv_eff'], mde=True)}; the interval {verdict}.")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--method", default="cca")
    ap.add_argument("--text-encoders", default="", metavar="T,T[,T...]",
                    help="the baseline first (default: the method's default text encoder, then minilm+tfidf)")
    ap.add_argument("--work", default=str(Q.default_work("text_encoder_cv")), metavar="DIR",
                    help="run folders, kept and reused between calls (default %(default)s)")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "text_encoder_cv_flickr8k.md")
    args = ap.parse_args(argv)
    if not Path(args.data).exists():
        print(f"no dataset at {args.data} (the shared Flickr8k sample); skipped", file=sys.stderr)
        return 0
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                              title=f"{args.method}'s caption features under its default scoring, on the CV folds of "
                                    "the Flickr8k sample's training photos (then val once)")


if __name__ == "__main__":
    sys.exit(main())
