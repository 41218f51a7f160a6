"""How much the BITR table's TR rows move with the draw of the TR build (Flickr8k sample).

The TR representation (paper 001, section 6.1; :mod:`crossview.features.topics`) learns a 1,000-word visual
codebook by k-means of the training images' local descriptors, then LDA topics of the visual and the caption
words. The seed of the build draws the k-means++ start, the k-means sample and both LDAs. The BITR table on TR
(``bitr_table_flickr8k_tr.md``) is one build (seed 0); this script rebuilds TR with ``--seeds`` and with two k-means++
starts: scikit-learn's ``kmeans_plusplus`` (the default; :func:`crossview.features.topics._seed_centres`) and the
hand-written copy that was the default from 05892a3 to 5e81516 (kept here, :func:`_former_own_seeding`),
trains the table's CCA row (CCA at its defaults, as ``crossview experiment bitr-table`` does) on the 600 training
images, and reports on the 100 val images:

- each build's Im2Text R@10 / R@50 and Text2Im R@10 (percent), and the mean and standard deviation over seeds;
- the k-means objective (sum of squared distances of the training descriptors to their nearest visual word) of
  each seeding's codebook after the Lloyd iterations, seed by seed: the seeding's own quality, whatever the
  retrieval does;
- the paired effect of the two starts (:func:`crossview.eval.paired.paired_effect`: each query's hits averaged
  over the seeds first, images resampled with their captions; 95% intervals and the minimal detectable effect).

Diagnostic of the representation, not of a method: everything is chosen beforehand (no selection on val).

    .venv/bin/python bench/tr_seed_spread.py --seeds 0,1,2 --work /tmp/tr-seeds
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stamp  # noqa: E402  (bench/_stamp.py)

SEEDINGS = ("scikit-learn", "former own")


def _former_own_seeding(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """The hand-written greedy k-means++ start that was the TR default from 05892a3 to 5e81516 (Arthur &
    Vassilvitskii 2007 with scikit-learn's ``2 + log k`` local trials a centre): ``(k, c) float32`` rows of ``x``."""
    n = x.shape[0]
    x2 = np.einsum("ij,ij->i", x, x)
    out = np.empty((k, x.shape[1]), dtype=np.float32)
    first = int(rng.integers(n))
    out[0] = x[first]
    closest = np.maximum(x2 - 2.0 * (x @ x[first]) + x2[first], 0.0).astype(np.float64)
    trials = 2 + int(np.log(k))
    for c in range(1, k):
        cum = np.cumsum(closest)
        if cum[-1] <= 0:
            cand = rng.integers(n, size=1)
        else:
            cand = np.minimum(np.searchsorted(cum, rng.random(trials) * cum[-1]), n - 1)
        dist = np.maximum(x2[:, None] - 2.0 * (x @ x[cand].T) + x2[cand][None, :], 0.0)
        new = np.minimum(closest[:, None], dist)
        best = int(np.argmin(new.sum(axis=0)))
        closest = new[:, best]
        out[c] = x[cand[best]]
    return out


def _build(ds, seed: int, seeding: str, cache):  # noqa: ANN001 - dataset, FeatureCache
    """The TR representation of ``ds`` at ``seed`` with ``seeding``'s k-means++ start (cached under its own key)."""
    from crossview.features import topics as T

    default, version = T._seed_centres, T._TR_VERSION
    if seeding == "former own":
        T._seed_centres, T._TR_VERSION = _former_own_seeding, f"{version}+former-own-seeding"
    try:
        return T.build_representation(ds, "tr", seed=seed, cache=cache, num_workers=0)
    finally:
        T._seed_centres, T._TR_VERSION = default, version


def _inertia(ds, seed: int, seeding: str, cache) -> float:  # noqa: ANN001
    """The k-means objective of the codebook the TR build at ``seed`` learns, on the training descriptors."""
    import faiss

    from crossview.features import image as image_mod
    from crossview.features import topics as T

    enc = image_mod.create_image_encoder(image_mod.DEFAULT_IMAGE_ENCODER)
    local, _, _ = T.local_descriptors(ds, enc, cache=cache, num_workers=0)
    fit = np.sort(np.asarray(ds.splits["train"], dtype=np.int64))
    _, reduce_block = T.prepare_descriptors(local, fit, dim=128, seed=seed)
    x = np.ascontiguousarray(reduce_block(local[fit]), dtype=np.float32)
    default = T._seed_centres
    if seeding == "former own":
        T._seed_centres = _former_own_seeding
    try:
        codebook = T.kmeans_codebook(x, 1000, seed=seed)
    finally:
        T._seed_centres = default
    index = faiss.IndexFlatL2(x.shape[1])
    index.add(np.ascontiguousarray(codebook, dtype=np.float32))
    d, _ = index.search(x, 1)
    return float(d.sum())


def main(args: argparse.Namespace) -> int:
    from crossview.data import load_dataset
    from crossview.features.cache import FeatureCache
    from crossview.eval.paired import paired_effect
    from crossview.features.topics import method_data_for_images
    from crossview.methods import create_method

    seeds = [int(s) for s in args.seeds.split(",")]
    ds = load_dataset(args.data)
    train = np.asarray(ds.splits["train"], dtype=np.int64)
    val = np.asarray(ds.splits[args.split], dtype=np.int64)
    cache = FeatureCache(Path(args.work) / "features")
    print(f"TR on {ds.name}: train on {len(train)} images, report on the {len(val)} images of split "
          f"'{args.split}'; CCA at its defaults; seeds {args.seeds}; k-means++ seedings: {', '.join(SEEDINGS)}")
    print()
    rows = []
    ranks: dict[str, dict[str, list[np.ndarray]]] = {s: {"i2t": [], "t2i": []} for s in SEEDINGS}
    for seeding in SEEDINGS:
        for seed in seeds:
            t = time.time()
            rep = _build(ds, seed, seeding, cache)
            cca = create_method("cca").fit(method_data_for_images(ds, rep, train))
            res = cca.evaluate(method_data_for_images(ds, rep, val))
            inertia = _inertia(ds, seed, seeding, cache)
            r_i, r_t = res["ranks"]["i2t"], res["ranks"]["t2i"]
            ranks[seeding]["i2t"].append(r_i)
            ranks[seeding]["t2i"].append(r_t)
            rows.append((seeding, seed, 100 * np.mean(r_i <= 10), 100 * np.mean(r_i <= 50),
                         100 * np.mean(r_t <= 10), inertia))
            print(f"  built and scored {seeding} seed {seed} in {time.time() - t:.0f} s", file=sys.stderr,
                  flush=True)
    print("| k-means++ seeding | seed | Im2Text R@10 | Im2Text R@50 | Text2Im R@10 | k-means objective |")
    print("|---|---:|---:|---:|---:|---:|")
    for seeding, seed, a, b, c, inertia in rows:
        print(f"| {seeding} | {seed} | {a:.1f} | {b:.1f} | {c:.1f} | {inertia:,.1f} |")
    print()
    print("| k-means++ seeding | Im2Text R@10 mean (sd) | Im2Text R@50 mean (sd) | Text2Im R@10 mean (sd) | "
          "k-means objective mean |")
    print("|---|---:|---:|---:|---:|")
    for seeding in SEEDINGS:
        r = np.array([x[2:] for x in rows if x[0] == seeding], dtype=float)
        sd = r.std(axis=0, ddof=1) if len(r) > 1 else np.zeros(r.shape[1])
        print(f"| {seeding} | {r[:, 0].mean():.1f} ({sd[0]:.1f}) | {r[:, 1].mean():.1f} ({sd[1]:.1f}) | "
              f"{r[:, 2].mean():.1f} ({sd[2]:.1f}) | {r[:, 3].mean():,.1f} |")
    caption_image = method_data_for_images(ds, rep, val).caption_image
    eff = paired_effect({d: np.stack(v) for d, v in ranks["former own"].items()},
                        {d: np.stack(v) for d, v in ranks["scikit-learn"].items()}, caption_image, ks=(1, 5, 10))
    print()
    print(f"Paired effect, scikit-learn - former own start ({len(seeds)} seeds of each; resampled: {eff['resampled']}; "
          f"{eff['n_images']} images, {eff['n_captions']} captions):")
    print()
    for d, name in (("i2t", "Im2Text"), ("t2i", "Text2Im")):
        r = eff[d]["R@10"]
        print(f"- {name} R@10: {r['a']:.1f} -> {r['b']:.1f}, {r['diff']:+.1f} (95% interval {r['ci'][0]:+.1f} to "
              f"{r['ci'][1]:+.1f})")
    r = eff["rsum"]
    print(f"- rsum: {r['a']:.1f} -> {r['b']:.1f}, {r['diff']:+.1f} (95% interval {r['ci'][0]:+.1f} to "
          f"{r['ci'][1]:+.1f}); minimal detectable effect {eff['mde']['rsum']:.1f}")
    r10 = np.array([x[2] for x in rows], dtype=float)
    sd = float(r10.std(ddof=1))
    print(f"- Im2Text R@10 of the CCA row over all {len(rows)} builds: {r10.min():.0f} to {r10.max():.0f} "
          f"(sd {sd:.1f}): two builds of the same code give numbers {1.96 * np.sqrt(2) * sd:.0f} points of R@10 "
          "apart or more one time in twenty, so a TR row that moves by less between two versions of the code "
          "may be the draw alone")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(_stamp.FLICKR8K))
    ap.add_argument("--split", default="val")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--work", required=True, help="scratch folder (its own feature cache)")
    _stamp.add_out_argument(ap, _stamp.RESULTS / "tr_seed_spread_flickr8k.md")
    a = ap.parse_args()
    sys.exit(_stamp.run_stamped(lambda: main(a), a.out, data=lambda: [_stamp.dataset_fingerprint(a.data)],
                                title="How much the BITR table's TR rows move with the draw of the TR build"))
