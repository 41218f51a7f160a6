"""A fused run against its members on real photos: ``crossview train METHOD --data <the Flickr8k sample>`` with
each method's defaults (no flags), then ``crossview fuse RUN RUN ... --weights auto``.

The weights are chosen on the 600 training photos only, never on val: ``--weights auto`` by 3-fold cross-validation
(each member trained again on 400, scoring the other 200), and for comparison ``--weights bank`` (folds of the
members' own training banks, no training, in-sample). Every run is reported once on the 100 val photos (the sample
has no test split). One line per member and one per fused run: R@1/5/10 both ways, rsum with its 95% bootstrap
interval over the val images, the weights, where they were chosen and where reported; then each fused run against
the best member as a paired effect on the same val queries (crossview.eval.paired), and the best grid points.

    python bench/fuse_quality.py [--methods cca,bitr,vsepp] [--work DIR] [--out FILE]

Runs are kept in ``--work`` (bench/_quality.py; the layout bench/quality.py uses, so the members' runs and their
``--select cv`` fold runs are shared and read back).

The default members are CCA, BITR and VSE++ (three of the best defaults; bench/quality.py fuses CCA, BITR and the deep method with the best CV rsum): SmoothAP's
default training took 619 s here (a first run of this bench, load average ~10), and ``--weights auto`` trains each
member 3 more times on 400 images, which with SmoothAP passes the bench's half-hour budget;
``--methods cca,bitr,smoothap`` runs that set.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _quality as Q  # noqa: E402  (bench/_quality.py: runs kept in --work, fused runs reusing fold runs)
import _stamp  # noqa: E402  (bench/_stamp.py)

SAMPLE = _stamp.FLICKR8K


def _default_scorings(methods: list[str]) -> str:
    """``isoftmax beta=10 for cca, csls k=10 for bitr, ...``: each member's and the fused run's default scoring at
    this commit, as bench/_quality.py reads it from the code."""
    from crossview.eval.scoring import PARAMS

    parts = []
    for m in [*methods, "fused"]:
        name, param, _ = Q.method_default_scoring(m)
        parts.append(f"{name}{f' {PARAMS[name]}={param:g}' if param is not None else ''} for {m}")
    return ", ".join(parts)


def run(args: argparse.Namespace) -> int:
    from crossview.eval.paired import paired_effect

    Q.one_thread()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    work = Path(args.work).expanduser().absolute()
    print("Data: flickr8k (600 train images, 100 val), each method's default encoders and parameters (no flags), "
          "then `crossview fuse` of those runs with --weights auto (and, for comparison, --weights bank); rsum = "
          "R@1+5+10 both ways; interval: 95% bootstrap over the val images. Every number here is under plain scoring "
          "(the runs' plain metrics, members and fused runs alike); bench/results/quality_flickr8k.md reports each "
          f"run under its default scoring ({_default_scorings(methods)}).\n")
    rows, dirs = [], []
    for m in methods:
        summary = Q.ensure_trained(m, str(Path(args.data).absolute()), work / m)
        summary["_wall"] = float(summary.get("train_seconds") or 0.0)
        dirs.append(work / m)
        rows.append(summary)
    fused = {mode: Q.ensure_fused(dirs, work / f"fused-{mode}-{'+'.join(methods)}", mode) for mode in ("auto", "bank")}
    auto = fused["auto"]
    print("| run | i2t R@1/5/10 | t2i R@1/5/10 | rsum on val | rsum 95% CI | weights (auto) | rsum on the "
          "CV folds | selected on | reported on | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")

    cells = Q.recall_cells

    def ci(s: dict) -> str:
        return f"{s['ci']['rsum'][0]:.1f}-{s['ci']['rsum'][1]:.1f}"

    choice = auto["fusion"]["choice"]
    for s, w, cv in zip(rows, auto["fusion"]["weights"], choice["members_rsum"]):
        print(f"| {s['method']} | {cells(s)} | {s['rsum']:.1f} | {ci(s)} | {w:.1f} | {cv:.1f} | "
              f"{s.get('selected_on')} | {s.get('reported_on')} | {s['_wall']:.0f} |")
    for mode, label in (("auto", "fused, --weights auto (CV)"), ("bank", "fused, --weights bank")):
        f = fused[mode]
        fp = f.get("metrics_plain") or f     # the plain fusion (a fused run's summary is under its own scoring)
        c = f["fusion"]["choice"]
        w = ", ".join(f"{x:.1f}" for x in f["fusion"]["weights"])
        best_cv = max(x["rsum"] for x in c["candidates"])
        print(f"| **{label}** | {cells(fp)} | **{fp['rsum']:.1f}** | {ci(fp)} | ({w}) | "
              f"{best_cv:.1f}{' (in-sample)' if mode == 'bank' else ''} | {f['selected_on']} | "
              f"{f['reported_on']} | {float(f.get('train_seconds') or 0):.0f} |")
    best = max(range(len(rows)), key=lambda i: rows[i]["rsum"])
    a, caps = Q.run_ranks(dirs[best])
    print()
    for mode in ("auto", "bank"):
        b, _ = Q.run_ranks(work / f"fused-{mode}-{'+'.join(methods)}")
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
          "scores folds of the members' own training banks, the images they were fitted on (in-sample). wall s: "
          "a member's training seconds as its run recorded them; a fused run's, the fusion's as its run recorded them "
          "(its fold runs read back from the work folder when there).")
    top = sorted(choice["candidates"], key=lambda c: -c["rsum"])[:5]
    print("\nBest grid points on the CV folds (auto): " + "; ".join(
        f"({', '.join(f'{x:.1f}' for x in c['weights'])}) {c['rsum']:.1f}" for c in top) + ".")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--methods", default="cca,bitr,vsepp")
    ap.add_argument("--work", default=str(Q.default_work("quality")), metavar="DIR",
                    help="run folders, kept and reused between calls (shared with bench/quality.py; default "
                         "%(default)s)")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "fuse_quality_flickr8k.md")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"no dataset at {args.data} (the shared Flickr8k sample); skipped", file=sys.stderr)
        return 0
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                              title="A fused run against its members on the Flickr8k sample (train 600 -> val 100)")


if __name__ == "__main__":
    sys.exit(main())
