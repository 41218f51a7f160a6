"""A fused run against its members on real photos: ``crossview train METHOD --data <the Flickr8k sample>`` with
each method's defaults (no flags), then ``crossview fuse RUN RUN ... --weights auto``.

The weights are chosen on the 600 training photos only, never on val: ``--weights auto`` by 3-fold cross-validation
(each member trained again on 400, scoring the other 200), and for comparison ``--weights bank`` (folds of the
members' own training banks, no training, in-sample). Every run is reported once on the 100 val photos (the sample
has no test split). One line per member and one per fused run: R@1/5/10 both ways, rsum with its 95% bootstrap
interval over the val images, the weights, where they were chosen and where reported; then each fused run against
the best member as a paired effect on the same val queries (crossview.eval.paired), and the best grid points.

    python bench/fuse_quality.py [--methods cca,bitr,vsepp] [--out FILE]

The default members are CCA, BITR and VSE++ (the three best defaults in defaults_quality_flickr8k.md): SmoothAP's
default training took 619 s here (a first run of this bench, load average ~10), and ``--weights auto`` trains each
member 3 more times on 400 images, which with SmoothAP passes the bench's half-hour budget;
``--methods cca,bitr,smoothap`` runs that set.
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
          "--weights auto (and, for comparison, --weights bank); rsum = R@1+5+10 both ways; interval: 95% "
          "bootstrap over the val images.\n")
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
        fused, walls = {}, {}
        for mode in ("auto", "bank"):
            t0 = time.monotonic()
            fused[mode] = fuse(dirs, mode, run_dir=Path(tmp) / f"fused-{mode}")
            walls[mode] = time.monotonic() - t0
        auto = fused["auto"]
        print("| run | i2t R@1/5/10 | t2i R@1/5/10 | rsum on val | rsum 95% CI | weights (auto) | rsum on the "
              "CV folds | selected on | reported on | wall s |")
        print("|---|---|---|---|---|---|---|---|---|---|")

        def cells(s: dict) -> str:
            return " | ".join("/".join(f"{s[d][k]:.1f}" for k in ("R@1", "R@5", "R@10")) for d in ("i2t", "t2i"))

        def ci(s: dict) -> str:
            return f"{s['ci']['rsum'][0]:.1f}-{s['ci']['rsum'][1]:.1f}"

        choice = auto["fusion"]["choice"]
        for s, w, cv in zip(rows, auto["fusion"]["weights"], choice["members_rsum"]):
            print(f"| {s['method']} | {cells(s)} | {s['rsum']:.1f} | {ci(s)} | {w:.1f} | {cv:.1f} | "
                  f"{s.get('selected_on')} | {s.get('reported_on')} | {s['_wall']:.0f} |")
        for mode, label in (("auto", "fused, --weights auto (CV)"), ("bank", "fused, --weights bank")):
            f = fused[mode]
            c = f["fusion"]["choice"]
            w = ", ".join(f"{x:.1f}" for x in f["fusion"]["weights"])
            best_cv = max(x["rsum"] for x in c["candidates"])
            print(f"| **{label}** | {cells(f)} | **{f['rsum']:.1f}** | {ci(f)} | ({w}) | "
                  f"{best_cv:.1f}{' (in-sample)' if mode == 'bank' else ''} | {f['selected_on']} | "
                  f"{f['reported_on']} | {walls[mode]:.0f} |")
        best = max(range(len(rows)), key=lambda i: rows[i]["rsum"])
        a, caps = _ranks(dirs[best])
        print()
        for mode in ("auto", "bank"):
            b, _ = _ranks(Path(tmp) / f"fused-{mode}")
            eff = paired_effect(a, b, caps, seed=0)
            r = eff["rsum"]
            print(f"- Fused ({mode}) against the best member on val ({rows[best]['method']}, picked here by its val "
                  f"rsum for this comparison only): rsum {r['diff']:+.1f} (95% interval {r['ci'][0]:+.1f} to "
                  f"{r['ci'][1]:+.1f}, p = {r['p']:.3g}; paired bootstrap over the {eff['n_images']} val images with "
                  f"their captions; minimal detectable effect {eff['mde']['rsum']:.1f}).")
        print(f"\nWeights (auto): {choice['how']}; folds of {', '.join(map(str, choice['fold_images']))} images, "
              f"grid step {choice['grid_step']} over the simplex ({len(choice['candidates'])} points), the best mean "
              "rsum over the folds wins; val was not read for the choice. \"rsum on the CV folds\" is each member "
              "alone (and the chosen weights) on the same folds: models trained on 400 images, galleries of 200, "
              "so below the val numbers (trained on 600, galleries of 100); it ranks the weights. --weights bank "
              "scores folds of the members' own training banks, the images they were fitted on (in-sample).")
        top = sorted(choice["candidates"], key=lambda c: -c["rsum"])[:5]
        print("\nBest grid points on the CV folds (auto): " + "; ".join(
            f"({', '.join(f'{x:.1f}' for x in c['weights'])}) {c['rsum']:.1f}" for c in top) + ".")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--methods", default="cca,bitr,vsepp")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "fuse_quality_flickr8k.md")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"no dataset at {args.data} (the shared Flickr8k sample); skipped", file=sys.stderr)
        return 0
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                              title="A fused run against its members on the Flickr8k sample (train 600 -> val 100)")


if __name__ == "__main__":
    sys.exit(main())
