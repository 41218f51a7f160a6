"""Webly (paper 003) defaults on real photos: 3-fold cross-validation over the Flickr8k sample's 600 training
photos, the 100 val images untouched (bench/results/webly_flickr8k.md).

Each fold trains on 400 photos and ranks the other 200. Its web set is built the way `crossview data make-web`
builds one, from the fold's own 400 training photos only (nouns and verbs of their captions, 20% dropped, a fifth
as many wrong ones added, seeded), so that no held-out photo is seen in Stage II. As a run on the sample does (its
val split is its evaluation split), nothing chooses the epoch: the last epoch is scored. Image features: the
default encoder (EfficientNet-Lite0) with the run's default normalisation (ssr), caption features MiniLM.

    python bench/webly_quality.py --configs "loss=vsepp;loss=vse0" --seeds 1
    python bench/webly_quality.py --configs "loss=vse0,stage2_epochs=0;loss=vse0,stage2_lr=2e-4"

Writes bench/results/webly_flickr8k.md (``--out``), stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
SAMPLE = REPO.parent / "shared" / "data" / "flickr8k-sample" / "dataset_flickr8k_sample.json"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stamp  # noqa: E402  (bench/_stamp.py)
from method_cv import config_table, fold_data, parse_configs  # noqa: E402  (bench/method_cv.py: shared with it)


def fold_web(ds, images: np.ndarray, seed: int) -> tuple[np.ndarray, list[list[str]]]:
    """The web set of ``images`` (dataset ids): each image's caption nouns and verbs with make-web's noise."""
    from crossview.features.tags import extract_tags
    from crossview.features.web_set import noisy_tags

    ci = np.asarray(ds.caption_image)
    true = []
    for i in images:
        counts: Counter[str] = Counter()
        for c in np.flatnonzero(ci == i):
            counts.update(extract_tags(ds.captions[c]))
        true.append(sorted(counts, key=lambda t: -counts[t]))
    freq = Counter(t for tags in true for t in tags)
    pool = sorted(freq)
    weights = np.array([freq[t] for t in pool], dtype=np.float64)
    rng = np.random.default_rng(seed)
    return images, [noisy_tags(t, rng, pool, weights) for t in true]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--configs", default="loss=vsepp;loss=vse0")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--protocol", choices=["cv", "val"], default="cv",
                    help="cv: folds of the training photos (choose defaults by it); val: train 600, score val 100")
    ap.add_argument("--json", default="", help="append one JSON line per config to this file")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "webly_flickr8k.md")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"no dataset at {args.data}", file=sys.stderr)
        return 2
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                              title="Webly (paper 003) settings on real photos: the Flickr8k sample")


def run(args: argparse.Namespace) -> int:
    """The cross-validation proper: one table row per config."""
    from sklearn.model_selection import KFold

    from crossview.data import load_dataset
    from crossview.features import encode_texts, extract_features
    from crossview.features.normalize import FeatureNorm
    from crossview.methods import method_from_params
    from crossview.methods.webly import web_method_data

    ds = load_dataset(args.data)
    f = extract_features(ds, fit_on="train")
    train = np.asarray(ds.splits["train"])
    if args.protocol == "cv":
        splits = [(train[a], train[b]) for a, b in KFold(args.folds, shuffle=True, random_state=0).split(train)]
    else:
        splits = [(train, np.asarray(ds.splits["val"]))]

    def data_for(images: np.ndarray, image: np.ndarray, name: str):
        return fold_data(ds, f.text, images, image, name)

    what = (f"{args.folds}-fold cross-validation over the training photos (each fold's web set built from its own "
            "training photos, as `crossview data make-web` builds one)" if args.protocol == "cv" else
            "train on the training photos, rank the val photos")
    seeds = f"seeds 0-{args.seeds - 1}" if args.seeds > 1 else "seed 0"
    print(f"Method `webly`, {what}; the last epoch is scored; {seeds}; every config is the "
          "method's defaults but for what it names.\n")

    def trial(cfg: dict, seed: int, a: np.ndarray, b: np.ndarray):
        image = FeatureNorm("ssr").fit(f.image[a]).transform(f.image).astype(np.float32)
        ids, tags = fold_web(ds, a, seed)
        web = web_method_data(image[ids], tags)
        m = method_from_params("webly", {"device": "cpu", **cfg, "seed": seed})
        m.set_text_encoder(lambda c: encode_texts(f, c))
        t0 = time.time()
        for _ in m.fit_iter(data_for(a, image, "train"), None, web=web):
            pass
        seconds = time.time() - t0
        test = data_for(b, image, "test")
        return m.evaluate(test), test, seconds

    config_table(parse_configs(args.configs), args.seeds, splits, trial, head="config", protocol=args.protocol,
                 sd=False, json_path=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
