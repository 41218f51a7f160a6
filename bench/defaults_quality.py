"""What each method gives with its defaults on real photos, as a user gets it: ``crossview train METHOD --data
<the Flickr8k sample>`` with no flags (train on the 600 training photos, reported once on the 100 val photos; the
sample has no test split, so nothing is chosen on val: each run's summary says where its choices were made).

One line per method: R@1/5/10 both ways, rsum with its 95% bootstrap interval over the val images, the mean and
spread over seeds for the methods that depend on one, where the run chose (``selected_on``) and where it reports
(``reported_on``), the hubness figure, and the training time. The README's quality figures quote this file.

    python bench/defaults_quality.py [--methods cca,bitr,wsabie,vsepp] [--seeds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)

SAMPLE = REPO.parent / "shared" / "data" / "flickr8k-sample" / "dataset_flickr8k_sample.json"
#: methods whose result depends on the seed (the others are deterministic given the data)
SEEDED = {"wsabie", "vsepp", "smoothap", "webly", "timam"}


def run(args: argparse.Namespace) -> int:
    from crossview.core.events import Finished
    from crossview.data import load_dataset
    from crossview.engine.run import train

    ds = load_dataset(args.data)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    print(f"Data: {ds.name} ({len(ds.splits['train'])} train images, {len(ds.splits.get('val', []))} val), "
          "default encoders and parameters (no flags); rsum = R@1+5+10 both ways; interval: 95% bootstrap over "
          "the val images (of the first seed's run); mean ± sd over seeds where the method depends on one.\n")
    print("| method | seeds | i2t R@1/5/10 | t2i R@1/5/10 | rsum | rsum 95% CI | selected on | reported on | "
          "i2t top-5 lists holding the most frequent caption | train s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for m in methods:
            seeds = range(args.seeds if m in SEEDED else 1)
            sums = []
            for seed in seeds:
                summary = None
                for ev in train(m, ds, run_dir=Path(tmp) / f"{m}-{seed}", seed=seed, params={"seed": seed}
                                if m in SEEDED else None):
                    if isinstance(ev, Finished):
                        summary = ev.summary
                if summary is None:
                    print(f"{m}: the run did not finish", file=sys.stderr)
                    return 1
                sums.append(summary)
            s0 = sums[0]
            r = np.array([s["rsum"] for s in sums])

            def cell(d: str) -> str:
                return "/".join(f"{np.mean([s[d][k] for s in sums]):.1f}" for k in ("R@1", "R@5", "R@10"))

            share = ((s0.get("hubness") or {}).get("i2t") or {}).get("top5_share")
            print(f"| {m} | {len(sums)} | {cell('i2t')} | {cell('t2i')} | "
                  + (f"{r.mean():.1f} ± {r.std():.1f}" if len(r) > 1 else f"{r[0]:.1f}")
                  + f" | {s0['ci']['rsum'][0]:.1f}-{s0['ci']['rsum'][1]:.1f} | {s0.get('selected_on')} | "
                  f"{s0.get('reported_on')} | " + (f"{100 * share:.0f}%" if share is not None else "-")
                  + f" | {np.mean([s['train_seconds'] for s in sums]):.0f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--methods", default="cca,bitr,wsabie,vsepp")
    ap.add_argument("--seeds", type=int, default=3)
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "defaults_quality_flickr8k.md")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"no dataset at {args.data} (the shared Flickr8k sample); give --data", file=sys.stderr)
        return 2
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                              title="Each method's defaults on the Flickr8k sample (train 600 -> val 100)")


if __name__ == "__main__":
    sys.exit(main())
