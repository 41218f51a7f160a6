"""How the defaults of CCA, WSABIE and BITR were chosen on real photos (bench/results/defaults_flickr8k.md).

For each method, a grid of settings (feature normalisation and the method's main parameters) is scored two
ways on the shared Flickr8k sample with the default encoders (EfficientNet-Lite0 + MiniLM):

- ``cv``: k-fold cross-validation over the 600 *training* images (train on k-1 folds, rank within the
  held-out fold: ~200 images, 1,000 captions), mean rsum over the folds. The choice is made by this number alone,
  so the 100 val images play no part in it;
- ``val``: the chosen point of each grid only, trained on all 600 training images, rsum on the 100 val images,
  reported once (a val number beside every point would invite choosing by val).

This was the first search, on one backbone per side (EfficientNet-Lite0, MiniLM) under plain scoring; each
method's defaults are now re-examined on its own default features and default scoring with ``crossview tune``
(bench/method_tune.py: tune_cca_bitr_flickr8k.md, tune_wsabie_timam_flickr8k.md).

Run: ``python bench/defaults_search.py [--methods cca,wsabie,bitr] [--folds 3] [--data PATH] [--out FILE]``. Features
come from the feature cache (extracted once). Prints a markdown table per method, best cv first, and writes them to
bench/results/defaults_flickr8k.md (``--out``), stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)

SAMPLE = REPO.parent / "shared" / "data" / "flickr8k-sample" / "dataset_flickr8k_sample.json"

GRIDS = {
    "cca": {"image_norm": ["none", "ssr", "whiten"], "reg": [0.3, 1.0, 3.0, 10.0],
            "n_components": [64, 256], "weight_power": [1.0, 4.0]},
    # the neighbourhood of the best coarse point
    "cca:fine": {"image_norm": ["ssr"], "reg": [2.0, 3.0, 5.0], "n_components": [64, 128, 256],
                 "weight_power": [0.0, 0.5, 1.0, 2.0]},
    "cca:fine2": {"image_norm": ["ssr"], "reg": [5.0, 8.0, 12.0], "n_components": [128, 256],
                  "weight_power": [0.25, 0.5]},
    "wsabie": {"image_norm": ["none", "ssr"], "dim": [100, 256, 1024], "lr": [0.003, 0.01, 0.03]},
    "wsabie:lowlr": {"image_norm": ["ssr"], "dim": [256, 1024], "lr": [0.001]},
    # on the shared trainer: both ranking directions, a binding max_norm and one lr drop (epoch 12 of 20)
    "wsabie:both": {"image_norm": ["ssr"], "dim": [256, 512, 1024], "max_norm": [1.0, 1.5],
                    "directions": ["both"], "lr": [0.003]},
    "wsabie:i2t": {"image_norm": ["ssr"], "dim": [256], "max_norm": [1.0, 10.0], "directions": ["i2t"],
                   "lr": [0.003]},
    "bitr": {"image_norm": ["none", "ssr"], "C": [1e-1, 1e1, 1e3]},
    "bitr:white": {"image_norm": ["ssr", "whiten"], "text_norm": ["none", "whiten"], "C": [1e2, 1e3, 1e4]},
    "bitr:fine": {"image_norm": ["none", "ssr"], "C": [1e3, 1e4, 1e5], "pca_dim": [128, 256]},
}


def _with_splits(ds, splits):
    import copy
    out = copy.copy(ds)
    out.splits = splits
    return out


def score(method: str, point: dict, ds, feats, train_idx, test_idx, seed: int = 0) -> float:
    from crossview.features.normalize import FeatureNorm
    from crossview.methods import create_method
    from crossview.data.method_data import MethodData

    d = _with_splits(ds, {"a": np.sort(train_idx), "b": np.sort(test_idx)})
    in_train = np.zeros(ds.n_images, bool)
    in_train[train_idx] = True
    img_norm = FeatureNorm(point.get("image_norm", "none")).fit(feats.image[train_idx])
    txt_norm = FeatureNorm(point.get("text_norm", "none")).fit(feats.text[in_train[ds.caption_image]])
    image, text = img_norm.transform(feats.image), txt_norm.transform(feats.text)
    params = {k: v for k, v in point.items() if k not in ("image_norm", "text_norm")}
    m = create_method(method, **params).with_run(seed=seed)
    tr = MethodData.from_features(d, image, text, "a")
    te = MethodData.from_features(d, image, text, "b")
    m.fit(tr)
    return float(m.evaluate(te)["rsum"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--methods", default="cca,wsabie,bitr")
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1,
                    help="the chosen point's val rsum is the mean over this many seeds of the method (cv uses --seed "
                         "only)")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "defaults_flickr8k.md")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"no dataset at {args.data}", file=sys.stderr)
        return 2
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                              title="Defaults searched on real photos (the Flickr8k sample)")


def run(args: argparse.Namespace) -> int:
    """The search proper: one Markdown table per grid on stdout, progress on stderr."""
    from sklearn.model_selection import KFold

    from crossview.data import load_dataset
    from crossview.features import extract_features

    print(f"Each setting is scored by {args.folds}-fold cross-validation over the training images (train on "
          f"{args.folds - 1} folds, rank the held-out one; mean ± sd over the folds), and the best of each grid is "
          f"chosen by that alone; only the chosen point is then trained on all training images and reported once on "
          f"val (mean over {args.seeds} seed(s) of the method). Features: one backbone per side (the dataset-level "
          "default encoders), plain scoring, from the feature cache. Grids: `GRIDS` in bench/defaults_search.py. "
          "This was the first search; each method's defaults are re-examined on its own default features and "
          "default scoring in tune_cca_bitr_flickr8k.md and tune_wsabie_timam_flickr8k.md (bench/method_tune.py).")
    ds = load_dataset(args.data)
    t0 = time.time()
    feats = extract_features(ds, fit_on="train")
    print(f"features: {feats.image_encoder} {feats.image.shape}, {feats.text_encoder} {feats.text.shape} "
          f"({time.time() - t0:.0f} s)", file=sys.stderr)
    train_images = np.asarray(ds.splits["train"])
    val_images = np.asarray(ds.splits["val"])
    folds = list(KFold(args.folds, shuffle=True, random_state=args.seed).split(train_images))
    for key in args.methods.split(","):
        grid = GRIDS[key]
        method = key.split(":")[0]
        names = list(grid)
        rows = []
        points = [dict(zip(names, combo)) for combo in itertools.product(*(grid[n] for n in names))]
        for i, point in enumerate(points, 1):
            t = time.time()
            cv = [score(method, point, ds, feats, train_images[a], train_images[b], args.seed) for a, b in folds]
            rows.append((float(np.mean(cv)), float(np.std(cv)), point))
            print(f"{method} {i}/{len(points)} {point}: cv {np.mean(cv):.1f} ({time.time() - t:.1f} s)",
                  file=sys.stderr, flush=True)
        rows.sort(key=lambda r: -r[0])        # stable: a tie keeps the grid's order, never val's
        print(f"\n### {key} ({args.folds}-fold CV on the {len(train_images)} train images)\n")
        print("| " + " | ".join(names) + " | cv rsum (mean ± sd) |")
        print("|" + "---|" * (len(names) + 1))
        for cv, sd, point in rows:
            print("| " + " | ".join(str(point[n]) for n in names) + f" | {cv:.1f} ± {sd:.1f} |")
        chosen = rows[0][2]
        vals = [score(method, chosen, ds, feats, train_images, val_images, args.seed + k) for k in range(args.seeds)]
        print(f"\nChosen by CV: {', '.join(f'{n} {chosen[n]}' for n in names)}; on val once (trained on the "
              f"{len(train_images)} train images, ranked among the {len(val_images)} val images"
              + (f", mean of {args.seeds} seeds" if args.seeds > 1 else "") + f"): rsum {np.mean(vals):.1f}.")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
