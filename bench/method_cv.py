"""Any method's settings on real photos: 3-fold cross-validation over the Flickr8k sample's 600 training photos
(train on 400, rank the other 200; the 100 val images untouched), or train 600 -> val 100 (``--protocol val``).

As a run on the sample does (its val split is its evaluation split), nothing chooses the epoch: the last epoch
is scored. Image features: the default encoder (EfficientNet-Lite0) with the method's default normalisation (ssr
for the deep methods), caption features MiniLM (read by ``text_model=features``; the others read the captions).
Choose defaults by ``cv``, report by ``val`` (bench/results/timam_flickr8k.md).

    python bench/method_cv.py --method timam --configs "image_optimizer=sgd;image_optimizer=adam" --seeds 1
    python bench/method_cv.py --method timam --protocol val --configs "" --seeds 3

Its table is part of bench/results/timam_flickr8k.md, which ``bench/regenerate.py --only timam_flickr8k`` assembles;
``--out FILE`` writes the table alone, stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)
SAMPLE = REPO.parent / "shared" / "data" / "flickr8k-sample" / "dataset_flickr8k_sample.json"


def parse_configs(text: str) -> list[dict]:
    """``"a=1;a=2,b=x"`` -> ``[{"a": 1}, {"a": 2, "b": "x"}]`` (values read as JSON where they parse)."""
    def value(v: str):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
    out = []
    for cfg in text.split(";"):
        cfg = cfg.strip()
        out.append({k.strip(): value(v.strip()) for k, v in (p.split("=", 1) for p in cfg.split(",") if p)}
                   if cfg else {})
    return out


def fold_data(ds, text: np.ndarray, images: np.ndarray, image: np.ndarray, name: str):
    """The :class:`MethodData` of dataset images ``images`` (their rows of ``image``, their captions and caption
    features ``text``), renumbered from 0: a fold's training or held-out part."""
    from crossview.data.method_data import MethodData

    pos = {int(i): k for k, i in enumerate(images)}
    caps = np.flatnonzero(np.isin(ds.caption_image, images))
    return MethodData(image_features=image[images], text_features=np.asarray(text[caps], np.float32),
                      captions=[ds.captions[c] for c in caps],
                      caption_image=np.array([pos[int(ds.caption_image[c])] for c in caps]), name=name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", required=True)
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--configs", default="")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--protocol", choices=["cv", "val"], default="cv")
    ap.add_argument("--json", default="", help="append one JSON line per config to this file")
    ap.add_argument("--out", default="-", metavar="FILE",
                    help="also write the table here, stamped with the command, commit, machine and data (default "
                         "'-': print only)")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"no dataset at {args.data}", file=sys.stderr)
        return 2
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)])


def run(args: argparse.Namespace) -> int:
    """The cross-validation proper: one table row per config."""
    from sklearn.model_selection import KFold

    from crossview.data import load_dataset
    from crossview.data.method_data import MethodData
    from crossview.features import extract_features
    from crossview.features.normalize import FeatureNorm
    from crossview.methods import method_class, method_from_params

    ds = load_dataset(args.data)
    f = extract_features(ds, fit_on="train")
    train = np.asarray(ds.splits["train"])
    if args.protocol == "cv":
        splits = [(train[a], train[b]) for a, b in KFold(args.folds, shuffle=True, random_state=0).split(train)]
    else:
        splits = [(train, np.asarray(ds.splits["val"]))]
    norm_name = getattr(method_class(args.method), "default_image_norm", "none") or "none"

    def data_for(images: np.ndarray, image: np.ndarray, name: str) -> MethodData:
        return fold_data(ds, f.text, images, image, name)

    print(f"| {args.method} config | {args.protocol} rsum per fold / seed | mean | sd | train s |")
    print("|---|---|---|---|---|")
    for cfg in parse_configs(args.configs):
        scores, seconds = [], []
        for seed in range(args.seeds):
            for a, b in splits:
                image = FeatureNorm(norm_name).fit(f.image[a]).transform(f.image).astype(np.float32)
                m = method_from_params(args.method, {"device": "cpu", **cfg, "seed": seed})
                t0 = time.time()
                for _ in m.fit_iter(data_for(a, image, "train"), None):
                    pass
                seconds.append(time.time() - t0)
                scores.append(float(m.evaluate(data_for(b, image, "test"))["rsum"]))
        name = ",".join(f"{k}={v}" for k, v in cfg.items()) or "defaults"
        print(f"| {name} | {' '.join(f'{s:.1f}' for s in scores)} | {np.mean(scores):.1f} | "
              f"{np.std(scores, ddof=1) if len(scores) > 1 else 0:.1f} | {np.mean(seconds):.0f} |", flush=True)
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps({"method": args.method, "config": cfg, "protocol": args.protocol,
                                     "rsum": scores, "seconds": seconds}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
