"""A fused run against its members on real photos: ``crossview train METHOD --data <the Flickr8k sample>`` with
each method's defaults (no flags), then ``crossview fuse RUN RUN ... --weights auto``.

The weights are chosen by rsum on 3 folds of the training split's bank (the 600 training photos encoded by each
member), never on val; every run is reported once on the 100 val photos (the sample has no test split). One line
per member and one for the fused run: R@1/5/10 both ways, rsum with its 95% bootstrap interval over the val images,
the weight, where the choice was made and where it is reported; then the fused run against the best member as a
paired effect on the same val queries (crossview.eval.paired), and the weight grid's rsum on the training folds.

    python bench/fuse_quality.py [--methods cca,bitr,smoothap] [--out FILE]
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


def _ranks(run_dir: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    with np.load(run_dir / "ranks.npz") as z:
        return {"i2t": z["i2t"], "t2i": z["t2i"]}, z["caption_image"]


def run(args: argparse.Namespace) -> int:
    from crossview.core.events import Finished
    from crossview.data import load_dataset
    from crossview.engine.fuse import fuse
    from crossview.engine.run import train
    from crossview.eval.paired import paired_effect

    ds = load_dataset(args.data)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    print(f"Data: {ds.name} ({len(ds.splits['train'])} train images, {len(ds.splits.get('val', []))} val), "
          "each method's default encoders and parameters (no flags), then `crossview fuse` of those runs with "
          "--weights auto; rsum = R@1+5+10 both ways; interval: 95% bootstrap over the val images.\n")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        for m in methods:
            summary = None
            t0 = time.monotonic()
            for ev in train(m, ds, run_dir=Path(tmp) / m):
                if isinstance(ev, Finished):
                    summary = ev.summary
            if summary is None:
                print(f"{m}: the run did not finish", file=sys.stderr)
                return 1
            summary["_wall"] = time.monotonic() - t0
            dirs.append(Path(tmp) / m)
            rows.append(summary)
        t0 = time.monotonic()
        fused = fuse(dirs, "auto", run_dir=Path(tmp) / "fused")
        fuse_wall = time.monotonic() - t0
        weights = fused["fusion"]["weights"]
        choice = fused["fusion"]["choice"]
        print("| run | i2t R@1/5/10 | t2i R@1/5/10 | rsum on val | rsum 95% CI | weight | rsum on train folds | "
              "selected on | reported on | wall s |")
        print("|---|---|---|---|---|---|---|---|---|---|")

        def cells(s: dict) -> str:
            return " | ".join("/".join(f"{s[d][k]:.1f}" for k in ("R@1", "R@5", "R@10")) for d in ("i2t", "t2i"))

        for s, w, cv in zip(rows, weights, choice["members_rsum"]):
            print(f"| {s['method']} | {cells(s)} | {s['rsum']:.1f} | {s['ci']['rsum'][0]:.1f}-{s['ci']['rsum'][1]:.1f}"
                  f" | {w:.2f} | {cv:.1f} | {s.get('selected_on')} | {s.get('reported_on')} | {s['_wall']:.0f} |")
        best_cv = max(c["rsum"] for c in choice["candidates"])
        print(f"| **fused** ({'+'.join(methods)}) | {cells(fused)} | **{fused['rsum']:.1f}** | "
              f"{fused['ci']['rsum'][0]:.1f}-{fused['ci']['rsum'][1]:.1f} | 1.00 | {best_cv:.1f} | "
              f"{fused['selected_on']} | {fused['reported_on']} | {fuse_wall:.0f} |")
        best = max(range(len(rows)), key=lambda i: rows[i]["rsum"])
        a, ci = _ranks(dirs[best])
        b, _ = _ranks(Path(tmp) / "fused")
        eff = paired_effect(a, b, ci, seed=0)
        r = eff["rsum"]
        print(f"\nFused against the best member on val ({rows[best]['method']}, chosen here by its val rsum, for "
              f"this comparison only): rsum {r['diff']:+.1f} (95% interval {r['ci'][0]:+.1f} to {r['ci'][1]:+.1f}, "
              f"p = {r['p']:.3g}; paired bootstrap over the {eff['n_images']} val images with their captions; "
              f"minimal detectable effect {eff['mde']['rsum']:.1f}).")
        print(f"\nWeights ({', '.join(f'{m} {w:.1f}' for m, w in zip(methods, weights))}) chosen by mean rsum on "
              f"{choice['selected_on']}: folds of {', '.join(map(str, choice['fold_images']))} training images, each "
              f"fold a gallery of its images and captions, grid step {choice['grid_step']} over the simplex "
              f"({len(choice['candidates'])} points); val was not read for the choice. The banks are the members' "
              "own training images, which they were fitted on, so the train-fold rsum is optimistic for every "
              "point alike; it ranks the weights, it does not predict val.")
        top = sorted(choice["candidates"], key=lambda c: -c["rsum"])[:5]
        print("\nBest grid points on the training folds: " + "; ".join(
            f"({', '.join(f'{x:.1f}' for x in c['weights'])}) {c['rsum']:.1f}" for c in top) + ".")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--methods", default="cca,bitr,smoothap")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "fuse_quality_flickr8k.md")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"no dataset at {args.data} (the shared Flickr8k sample); skipped", file=sys.stderr)
        return 0
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                              title="A fused run against its members on the Flickr8k sample (train 600 -> val 100)")


if __name__ == "__main__":
    sys.exit(main())
