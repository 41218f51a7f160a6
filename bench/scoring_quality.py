"""Hubness-aware scoring on real photos with its parameter chosen honestly: ``crossview train METHOD --data <the
Flickr8k sample>`` with each method's defaults (no flags), then ``crossview eval RUN --scoring S --select cv`` for
S in plain, csls, isoftmax, dsoftmax.

``--select cv`` chooses k (csls) or beta (the softmaxes) by 3-fold cross-validation of the 600 training photos only:
the method trained again on 400, the other 200 scored against a bank of those 400's embeddings, the best mean rsum
over the folds wins; val is never read for the choice. Each scoring is then reported once on the 100 val photos
(the sample has no test split) with its 95% bootstrap interval over the val images and its paired difference
against plain on the same val queries (crossview.eval.paired). For the question "should the default move from
plain?" the paired difference is also computed on the CV folds (the 600 training photos, each scored by a model
that did not see it, pooled over the folds): that interval, not val's, decides. For comparison, the parameter the
quick in-sample choice (``--select bank``) makes.

    python bench/scoring_quality.py [--methods cca,bitr] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)

SAMPLE = _stamp.FLICKR8K
SCORINGS = ("csls", "isoftmax", "dsoftmax")


def _cv_ranks(run_dir: Path, scoring: str, param: float | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The ranks of the CV folds' held-out training photos (each fold against its own bank and gallery), pooled:
    ``({"i2t", "t2i"}, caption_image)`` with the folds' images numbered one after another."""
    from crossview.eval.embeddings import load_embeddings
    from crossview.eval.scoring import evaluate_scoring

    i2t, t2i, caps, offset = [], [], [], 0
    for fold in sorted((run_dir / "scoring-cv").iterdir()):
        held = load_embeddings(fold / "embeddings_cv-test.npz")
        bank = load_embeddings(fold / "bank_cv-train.npz")
        res = evaluate_scoring(held, bank, scoring, param)
        i2t.append(res["ranks"]["i2t"])
        t2i.append(res["ranks"]["t2i"])
        caps.append(np.asarray(held.caption_image, np.int64) + offset)
        offset += held.image.shape[0]
    return {"i2t": np.concatenate(i2t), "t2i": np.concatenate(t2i)}, np.concatenate(caps)


def _diff(eff: dict) -> str:
    r = eff["rsum"]
    return f"{r['diff']:+.1f} ({r['ci'][0]:+.1f} to {r['ci'][1]:+.1f}, p = {r['p']:.2g})"


def run(args: argparse.Namespace) -> int:
    from crossview.core.events import Finished
    from crossview.data import load_dataset
    from crossview.engine.run import train
    from crossview.engine.scoring import evaluate_run
    from crossview.eval.bootstrap import bootstrap_ci
    from crossview.eval.paired import paired_effect

    ds = load_dataset(args.data)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    print(f"Data: {ds.name} ({len(ds.splits['train'])} train images, {len(ds.splits.get('val', []))} val), each "
          "method's default encoders and parameters (no flags); k / beta chosen by `--select cv` (3-fold "
          "cross-validation of the training photos); rsum = R@1+5+10 both ways; intervals: 95% bootstrap over the "
          "images (paired for differences).\n")
    print("| method | scoring | chosen (cv) | chosen (bank, in-sample) | CV rsum (mean of 3 folds) | CV: - plain, "
          "pooled folds | val i2t R@1/5/10 | val t2i R@1/5/10 | val rsum | val 95% CI | val: - plain | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in methods:
            run_dir = Path(tmp) / m
            t0 = time.monotonic()
            summary = None
            for ev in train(m, ds, run_dir=run_dir):
                if isinstance(ev, Finished):
                    summary = ev.summary
            if summary is None:
                print(f"{m}: the run did not finish", file=sys.stderr)
                return 1
            train_wall = time.monotonic() - t0
            plain = evaluate_run(run_dir, "plain", record=False)
            caps = _caption_image(run_dir, str(summary["split"]))
            results = {"plain": (plain, None, None, train_wall)}
            for s in SCORINGS:
                t0 = time.monotonic()
                res = evaluate_run(run_dir, s, select="cv")
                wall = time.monotonic() - t0
                bank = evaluate_run(run_dir, s, select="bank", record=False)["scoring"]
                results[s] = (res, bank, None, wall)
            cv_plain = None
            for s in ("plain", *SCORINGS):
                res, bank, _, wall = results[s]
                sel = res["scoring"]
                ci = bootstrap_ci(res["ranks"]["i2t"], res["ranks"]["t2i"], caps)["rsum"]
                cells = " | ".join("/".join(f"{res[d][k]:.1f}" for k in ("R@1", "R@5", "R@10")) for d in ("i2t", "t2i"))
                if s == "plain":
                    rec = results["csls"][0]["scoring"]
                    cv_plain = rec["plain_rsum"]
                    print(f"| {m} | plain | - | - | {cv_plain:.1f} | - | {cells} | {res['rsum']:.1f} | "
                          f"{ci[0]:.1f}-{ci[1]:.1f} | - | {wall:.0f} (training) |")
                    continue
                cand = next(c for c in sel["candidates"] if c["param"] == sel["param"])
                cv_a, cv_caps = _cv_ranks(run_dir, "plain", None)
                cv_b, _ = _cv_ranks(run_dir, s, sel["param"])
                cv_eff = paired_effect(cv_a, cv_b, cv_caps, seed=0)
                val_eff = paired_effect(plain["ranks"], res["ranks"], caps, seed=0)
                pname = sel["param_name"]
                print(f"| {m} | {s} | {pname} = {sel['param']:g} | {pname} = {bank['param']:g} | {cand['rsum']:.1f} | "
                      f"{_diff(cv_eff)} | {cells} | {res['rsum']:.1f} | {ci[0]:.1f}-{ci[1]:.1f} | {_diff(val_eff)} | "
                      f"{wall:.0f} |")
                verdicts.append((m, s, cv_eff["rsum"]))
            folds = results["csls"][0]["scoring"]
            print(f"| | | | | folds of {'/'.join(map(str, folds['fold_images']))} photos | | | | | | | |")
        print()
        for m, s, r in verdicts:
            lo, hi = r["ci"]
            word = ("better than plain" if lo > 0 else "worse than plain" if hi < 0 else
                    "not distinguishable from plain")
            print(f"- {m} + {s}: on the CV folds {r['diff']:+.1f} rsum ({lo:+.1f} to {hi:+.1f}): {word}.")
        supported = sorted(s for s in SCORINGS if all(r["ci"][0] > 0 for m, x, r in verdicts if x == s))
        best = max(SCORINGS, key=lambda s: min(r["diff"] for m, x, r in verdicts if x == s))
        print("\nDefault: " + (f"the CV intervals support {', '.join(supported)} over plain for every method "
                               f"measured ({', '.join(methods)}); {best} gains most in the worst case. The default "
                               "stays plain all the same: these are the two linear methods on one set of frozen "
                               "features; the deep methods are not measured, and for them --select auto falls back "
                               "to the in-sample choice, whose parameter differs from the cross-validated one "
                               "(column \"chosen (bank)\"). A per-method default (cca and bitr) is the step this "
                               "supports" if supported else
                               "no scoring beats plain on the CV folds for every method measured with an interval "
                               "above 0, so the default stays plain") + ".")
        print("\n\"CV rsum\" is the chosen parameter's mean rsum over the 3 folds (models trained on 400 photos, "
              "galleries of 200, so below val's 600/100); \"CV: - plain\" is the paired difference to plain on the "
              "same held-out training photos, pooled over the folds (the parameter was chosen on these folds, so "
              "it is mildly optimistic for the re-scorings; plain has nothing to choose). \"chosen (bank)\" is the "
              "in-sample choice of --select bank for comparison. The val columns are reported once; nothing was "
              "chosen on val. wall s: the first scoring's includes the 3 fold runs, shared by the others.")
    return 0


def _caption_image(run_dir: Path, split: str) -> np.ndarray:
    from crossview.eval.embeddings import load_embeddings

    return np.asarray(load_embeddings(run_dir / f"embeddings_{split}.npz").caption_image, np.int64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--methods", default="cca,bitr")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "scoring_flickr8k.md")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"no dataset at {args.data} (the shared Flickr8k sample); skipped", file=sys.stderr)
        return 0
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                              title="Hubness-aware scoring with its parameter chosen by cross-validation of train, on "
                                    "the Flickr8k sample (train 600 -> val 100)")


if __name__ == "__main__":
    sys.exit(main())
