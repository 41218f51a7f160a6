"""Which offline image backbone retrieves better with CCA: MobileNet-V2 or EfficientNet-Lite0? (It picked
``DEFAULT_IMAGE_ENCODER`` in crossview/features/image.py, the dataset-level default.)

Both encoders' features of the shared Flickr8k sample (600 train / 100 val photos, 5 captions each) through the
feature cache, captions as MiniLM sentence embeddings, CCA at its defaults but for the ridge ``reg`` (a small grid,
so that neither backbone hinges on one setting tuned for the other), the images normalised as a CCA run does
(signed square root + L2, fitted on the training images of each fold).

Chosen on train, reported once on val:

- 3-fold cross-validation of the 600 training photos (train on 400, rank the other 200; val not read): each
  backbone's ridge is the one with the best mean rsum over the folds, and the backbones are compared paired on
  the folds' pooled held-out photos (each backbone at its chosen ridge; photos resampled with their captions);
- val, once each: each backbone at its chosen ridge trained on all 600 photos, rsum with its bootstrap interval,
  and the paired difference with its interval and the minimal detectable effect.

    .venv/bin/python bench/backbone_compare.py [--out bench/results/backbone_compare.md]
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
import _stamp  # noqa: E402  (bench/_stamp.py)
from method_cv import fold_data, paired_cells, pool_folds  # noqa: E402  (bench/method_cv.py: shared with it)

DEFAULT_DATA = REPO.parent / "shared" / "data" / "flickr8k-sample" / "dataset_flickr8k_sample.json"
ENCODERS = ("mobilenet_v2", "efficientnet_lite0")


def trial(ds, image: np.ndarray, text: np.ndarray, train_ids: np.ndarray, test_ids: np.ndarray,
          reg: float) -> tuple[dict, np.ndarray]:
    """CCA (its defaults, ridge ``reg``) trained on ``train_ids``, scored on ``test_ids``: the evaluation
    (``rsum``, R@K, ``ranks``) and the held-out captions' image map."""
    from crossview.features.normalize import FeatureNorm
    from crossview.methods import create_method

    normed = FeatureNorm("ssr").fit(image[train_ids]).transform(image).astype(np.float32)
    m = create_method("cca", reg=reg).fit(fold_data(ds, text, train_ids, normed, "train"))
    test = fold_data(ds, text, test_ids, normed, "test")
    return m.evaluate(test), test.caption_image


def run(args: argparse.Namespace) -> int:
    from sklearn.model_selection import KFold

    from crossview.data import load_dataset
    from crossview.eval.bootstrap import bootstrap_ci
    from crossview.eval.paired import paired_effect
    from crossview.features import extract_features

    ds = load_dataset(str(args.data))
    train, val = np.asarray(ds.splits["train"]), np.asarray(ds.splits["val"])
    folds = [(train[a], train[b]) for a, b in KFold(3, shuffle=True, random_state=0).split(train)]
    regs = [float(r) for r in args.regs.split(",")]
    print(f"Data: {ds.name}, {len(train)} train / {len(val)} val photos, 5 captions each; captions: MiniLM "
          "sentence embeddings; CCA at its defaults but for the ridge (reg), the images signed-square-rooted and "
          "L2-normalised as a CCA run does (fitted on each fold's training photos). Chosen on 3-fold "
          "cross-validation of the training photos, reported once on val. rsum = R@1+5+10 both ways.\n")
    feats = {name: extract_features(ds, name, "minilm", fit_on="train") for name in ENCODERS}

    print("### Cross-validation of the training photos (mean rsum over the 3 folds; val not read)\n")
    print("| backbone | " + " | ".join(f"reg {r:g}" for r in regs) + " | chosen reg |")
    print("|---|" + "---|" * (len(regs) + 1))
    chosen, pooled = {}, {}
    for name in ENCODERS:
        f = feats[name]
        runs = {r: [trial(ds, f.image, f.text, a, b, r) for a, b in folds] for r in regs}
        mean = {r: float(np.mean([res["rsum"] for res, _ in runs[r]])) for r in regs}
        chosen[name] = max(regs, key=lambda r: mean[r])
        pooled[name] = pool_folds([[(res["ranks"], ci) for res, ci in runs[chosen[name]]]])
        print(f"| {name} | " + " | ".join(f"**{mean[r]:.1f}**" if r == chosen[name] else f"{mean[r]:.1f}"
                                          for r in regs) + f" | {chosen[name]:g} |")
    a, b = ENCODERS
    diff, mde = paired_cells(pooled[a], pooled[b])
    print(f"\n{b} minus {a} on the folds (each at its chosen ridge; the 600 held-out photos and their captions "
          f"pooled, photos resampled with their captions): rsum {diff}, minimal detectable {mde}.")

    print("\n### Val (100 photos), each backbone at its chosen ridge trained on all 600 training photos, reported "
          "once\n")
    print("| backbone | reg | i2t R@1/5/10 | t2i R@1/5/10 | rsum | rsum 95% interval |")
    print("|---|---|---|---|---|---|")
    on_val = {}
    for name in ENCODERS:
        res, ci = trial(ds, feats[name].image, feats[name].text, train, val, chosen[name])
        on_val[name] = (res, ci)
        low, high = bootstrap_ci(res["ranks"]["i2t"], res["ranks"]["t2i"], ci, seed=0)["rsum"]
        cells = " | ".join("/".join(f"{res[d][k]:.1f}" for k in ("R@1", "R@5", "R@10")) for d in ("i2t", "t2i"))
        print(f"| {name} | {chosen[name]:g} | {cells} | {res['rsum']:.1f} | {low:.1f}-{high:.1f} |")
    eff = paired_effect(on_val[a][0]["ranks"], on_val[b][0]["ranks"], on_val[a][1], seed=0)
    r = eff["rsum"]
    print(f"\n{b} minus {a} on val: rsum {r['diff']:+.1f} (95% interval {r['ci'][0]:+.1f} to {r['ci'][1]:+.1f}; "
          f"paired bootstrap over {eff['n_images']} photos with their {eff['n_captions']} captions; minimal "
          f"detectable effect {eff['mde']['rsum']:.1f}).")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Karpathy-format JSON with train/val splits")
    ap.add_argument("--regs", default="1,5,25", help="CCA ridges to try (CCA's reg; its default is 12)")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "backbone_compare.md")
    args = ap.parse_args(argv)
    if not args.data.is_file():
        print(f"{args.data} not found: pass --data (the shared Flickr8k sample is expected at {DEFAULT_DATA})",
              file=sys.stderr)
        return 2
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                              title="Image backbones compared with CCA on the Flickr8k sample (chosen on train "
                                    "folds, reported once on val)")


if __name__ == "__main__":
    raise SystemExit(main())
