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
from collections.abc import Callable
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


def pool_folds(per_seed: list[list[tuple[dict, np.ndarray]]]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A config's held-out ranks, ``per_seed[seed][fold] = (ranks {"i2t", "t2i"}, caption_image)``, as one query
    set per seed (the folds side by side, each fold's images numbered after the previous folds'), stacked
    ``(n_seeds, n_queries)``: what :func:`crossview.eval.paired.paired_effect` averages per query first. With folds
    of one size, R@K over the pooled queries is the mean of the folds' R@K."""
    stacked: dict[str, list[np.ndarray]] = {"i2t": [], "t2i": []}
    caps = np.zeros(0, np.int64)
    for folds in per_seed:
        parts: dict[str, list[np.ndarray]] = {"i2t": [], "t2i": []}
        cis, offset = [], 0
        for ranks, ci in folds:
            for d in parts:
                parts[d].append(np.asarray(ranks[d]))
            cis.append(np.asarray(ci, np.int64) + offset)
            offset += len(ranks["i2t"])
        for d in parts:
            stacked[d].append(np.concatenate(parts[d]))
        caps = np.concatenate(cis)
    return {d: np.stack(v) for d, v in stacked.items()}, caps


def paired_cells(base: tuple[dict, np.ndarray], other: tuple[dict, np.ndarray]) -> tuple[str, str]:
    """``other`` minus ``base`` (both :func:`pool_folds`): the rsum difference with its 95% interval, and the
    minimal detectable effect (photos resampled with their captions)."""
    from crossview.eval.paired import paired_effect

    eff = paired_effect(base[0], other[0], base[1], seed=0)
    r = eff["rsum"]
    return f"{r['diff']:+.1f} ({r['ci'][0]:+.1f} to {r['ci'][1]:+.1f})", f"{eff['mde']['rsum']:.1f}"


def paired_note(n_seeds: int, n_folds: int) -> str:
    """What the paired columns are (printed under a table that has them)."""
    seeds = f"; each query's rank averaged over the {n_seeds} seeds first" if n_seeds > 1 else ""
    where = f"the {n_folds} folds' held-out photos pooled" if n_folds > 1 else "the evaluation photos"
    return (f"Paired: each config minus the first on the same queries ({where}{seeds}), rsum points, 95% "
            "interval of a bootstrap resampling photos with their captions; minimal detectable: the effect this "
            "design finds 80% of the time (2.8 standard errors). Each row is one comparison with the first; the "
            "intervals are not widened for the number of rows.")


def config_table(configs: list[dict], n_seeds: int, splits: list, trial: Callable, *, head: str, protocol: str,
                 sd: bool = True, json_path: str = "", json_extra: dict | None = None) -> None:
    """Print one Markdown row per config: ``trial(cfg, seed, train_ids, test_ids) -> (Method.evaluate's result,
    the held-out MethodData, training seconds)`` at each seed and split; the rsum per fold / seed, their mean (and
    sd), the config minus the first paired on the held-out queries (:func:`pool_folds`, :func:`paired_cells`), the
    mean training time; then :func:`paired_note`. ``json_path``: also one JSON line per config there."""
    print(f"| {head} | {protocol} rsum per fold / seed | mean |{' sd |' if sd else ''} minus the first: rsum "
          "(95% interval) | minimal detectable | train s |")
    print("|---" * (6 + sd) + "|")
    first = None
    for cfg in configs:
        scores, seconds, held = [], [], []
        for seed in range(n_seeds):
            held.append([])
            for a, b in splits:
                res, test, secs = trial(cfg, seed, a, b)
                seconds.append(secs)
                scores.append(float(res["rsum"]))
                held[-1].append((res["ranks"], test.caption_image))
        name = ",".join(f"{k}={v}" for k, v in cfg.items()) or "defaults"
        pooled = pool_folds(held)
        diff, mde = ("-", "-") if first is None else paired_cells(first, pooled)
        first = pooled if first is None else first
        spread = f" {np.std(scores, ddof=1) if len(scores) > 1 else 0:.1f} |" if sd else ""
        print(f"| {name} | {' '.join(f'{x:.1f}' for x in scores)} | {np.mean(scores):.1f} |{spread} {diff} | {mde} | "
              f"{np.mean(seconds):.0f} |", flush=True)
        if json_path:
            with open(json_path, "a") as fh:
                fh.write(json.dumps({**(json_extra or {}), "config": cfg, "protocol": protocol, "rsum": scores,
                                     "seconds": seconds}) + "\n")
    if len(configs) > 1:
        print("\n" + paired_note(n_seeds, len(splits)))


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

    def trial(cfg: dict, seed: int, a: np.ndarray, b: np.ndarray) -> tuple[dict, MethodData, float]:
        image = FeatureNorm(norm_name).fit(f.image[a]).transform(f.image).astype(np.float32)
        m = method_from_params(args.method, {"device": "cpu", **cfg, "seed": seed})
        t0 = time.time()
        for _ in m.fit_iter(data_for(a, image, "train"), None):
            pass
        seconds = time.time() - t0
        test = data_for(b, image, "test")
        return m.evaluate(test), test, seconds

    config_table(parse_configs(args.configs), args.seeds, splits, trial, head=f"{args.method} config",
                 protocol=args.protocol, json_path=args.json, json_extra={"method": args.method})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
