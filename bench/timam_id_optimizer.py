"""TIMAM's sampled identification classifier on real photos: its optimiser (row-wise RMSprop, one number per class
row, against SparseAdam, two moments per weight), by 3-fold CV of the Flickr8k sample's 600 training photos.

At COCO size the identification softmax has one class per training image (110K) and samples 16,384 of them a step
(Partial FC); the sampled rows have their own optimiser. SparseAdam's two moments are twice the classifier again
(0.43 GB at COCO size); :class:`crossview.nn.row_optim.RowwiseRMSprop` keeps 8 bytes a row (issue 34). The sample
has 400 classes a fold, so ``id_classes=100`` makes each step sample a quarter of them (COCO: 15%) and exercises the
same code; the full softmax (``id_classes=0``) is the reference.

Protocol: bench/timam_text_cv.py's (the engine's ``--select cv`` folds, seed 0; each fold run trained on 400 photos,
its 200 held-out photos ranked against a bank of those 400; two-backbone flip-averaged image features, MiniLM+GloVe
caption features; TIMAM's defaults otherwise); seeds 0-2, each query's hits averaged over the seeds first, paired
bootstrap over photos with their captions (crossview.eval.paired). Val is not read.

    python bench/timam_id_optimizer.py --work /tmp/timam-idopt --out bench/results/timam_id_optimizer_flickr8k.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _quality as Q  # noqa: E402
import _stamp  # noqa: E402
from timam_text_cv import GLOVE, SCORINGS, fold_runs, pooled  # noqa: E402

BASE = {"text_model": "features", "lr": 0.003}          # TIMAM's defaults, as timam_text_cv's moved configuration
CONFIGS: list[tuple[str, dict[str, Any], str]] = [
    ("full", {**BASE, "id_classes": 0}, "the full softmax over the fold's 400 classes (the reference)"),
    ("sampled_adam", {**BASE, "id_classes": 100, "id_optimizer": "adam"},
     "100 classes a step, the sampled rows by SparseAdam (before)"),
    ("sampled_rowwise", {**BASE, "id_classes": 100, "id_optimizer": "rowwise"},
     "100 classes a step, the sampled rows by row-wise RMSprop (now)"),
]
PAIRS = (("sampled_rowwise", "sampled_adam"), ("sampled_rowwise", "full"), ("sampled_adam", "full"))


def run(args: argparse.Namespace) -> int:
    from crossview.engine.cv_runs import load_run_dataset
    from crossview.eval.paired import paired_effect

    Q.one_thread()
    work = Path(args.work)
    cfg0 = {"data": str(args.data), "train_split": "train", "image_encoder": "efficientnet_lite0+mobilenet_v2:flip"}
    ds = load_run_dataset(cfg0)
    seeds = list(range(args.seeds))
    t0 = time.monotonic()
    folders = {name: {s: fold_runs(ds, cfg0, work, name, params, GLOVE, s) for s in seeds}
               for name, params, _ in CONFIGS}
    Q.log(f"fold runs ready in {time.monotonic() - t0:.0f} s")
    got: dict[tuple[str, str], Any] = {}
    for name, _, _ in CONFIGS:
        for scoring, param in SCORINGS:
            runs = [pooled(folders[name][s], scoring, param) for s in seeds]
            got[(name, scoring)] = ({d: np.stack([r[0][d] for r in runs]) for d in ("i2t", "t2i")}, runs[0][1],
                                    [x for r in runs for x in r[2]])
    from crossview.engine.run_folder import read_summary
    secs = {name: np.mean([float(read_summary(folders[name][s] / f"f{f}").get("train_seconds") or 0)
                           for s in seeds for f in (1, 2, 3)]) for name, _, _ in CONFIGS}
    print("Data: the Flickr8k sample's 600 training photos, 3-fold CV (each fold run trained on 400 photos = 400 "
          "classes, its 200 held-out photos ranked against a bank of those 400); image features EfficientNet-Lite0 + "
          "MobileNet-V2 flip-averaged, caption features MiniLM+GloVe; TIMAM's defaults otherwise (features -> FC, "
          f"lr 3e-3, 10 epochs, 512-d); seeds {seeds[0]}-{seeds[-1]}. CV rsum: the mean of the fold rsums over the "
          "seeds; differences on the 600 held-out photos pooled, each query's hits averaged over the seeds first, "
          "paired bootstrap over photos with their captions. Val is not read.\n")
    print("| config | what | CV rsum isoftmax 10 (TIMAM's scoring) | CV rsum plain | train s a fold run |")
    print("|---|---|---|---|---|")
    for name, _, what in CONFIGS:
        cells = [f"{np.mean(got[(name, sc)][2]):.1f}" for sc, _ in SCORINGS]
        print(f"| {name} | {what} | {' | '.join(cells)} | {secs[name]:.1f} |")
    print("\n| difference | scoring | rsum difference (95% CI, p) | interval half-width |")
    print("|---|---|---|---|")
    for a, b in PAIRS:
        for scoring, param in SCORINGS:
            eff = paired_effect(got[(b, scoring)][0], got[(a, scoring)][0], got[(a, scoring)][1], seed=0)
            lo, hi = eff["rsum"]["ci"]
            print(f"| {a} - {b} | {scoring}{f' {param:g}' if param else ''} | {Q.diff_cell(eff)} | "
                  f"{(hi - lo) / 2:.1f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(_stamp.FLICKR8K))
    ap.add_argument("--work", default=str(Q.default_work("timam_id_optimizer")))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default="-", help="also write the table here, stamped (default '-': print only)")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"no dataset at {args.data} (the shared Flickr8k sample); skipped", file=sys.stderr)
        return 0
    notes = ["the sample cannot show the memory: 400 classes x 512 floats are 0.8 MB (bench/results/scale_cpu.txt "
             "measures COCO size); this table checks that the row-wise optimiser learns as SparseAdam does where "
             "the softmax samples"]
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                              notes=notes,
                              title="TIMAM's sampled identification classifier: row-wise RMSprop against SparseAdam "
                                    "(3-fold CV on the Flickr8k sample, isoftmax 10 and plain, paired)")

if __name__ == "__main__":
    sys.exit(main())
