"""Richer frozen features per method, chosen by 3-fold cross-validation on the Flickr8k sample's training photos.

Feature pipelines (issue 33, item 3), each a choice of the run's ``--image-encoder`` / ``--text-encoder``:

- ``plain``: EfficientNet-Lite0 pooled features, MiniLM captions (today's defaults);
- ``flip``: ``efficientnet_lite0:flip`` (each image's feature averaged with its mirror's);
- ``concat``: ``efficientnet_lite0+mobilenet_v2`` (each backbone's block L2-normalised, then concatenated);
- ``concat+flip``: ``efficientnet_lite0+mobilenet_v2:flip``;
- ``minilm+tfidf`` / ``minilm+glove``: MiniLM with TF-IDF or averaged GloVe, each block L2-normalised;
- ``best image + best text``: per method, the image pipeline and the text pipeline that won CV (when both differ
  from plain), so the combination is scored too.

Protocol: the 600 training photos in 3 folds (train on 400, rank the other 200 and their 1,000 captions); the 100
val photos untouched until the end. Each method gets its default parameters and default feature normalisation
(fitted on the fold's training rows). TF-IDF is fitted on the fold's training captions only. CV rsum is over the
pooled held-out queries of the three folds (600 images, 3,000 captions; ranks within each fold's gallery of 200),
with a 95% bootstrap interval over images (each with its captions), and the paired difference from ``plain`` on the
same queries with its 95% interval (:func:`crossview.eval.paired.paired_effect`). The configuration with the best CV
rsum is then trained once on all 600 and reported on val (beside ``plain``), and a default is worth changing only
when its CV difference's interval lies above 0.

    .venv/bin/python bench/rich_features.py --methods cca,bitr --out bench/results/rich_features_flickr8k.md

Feature extraction is cached (crossview.features): the first run extracts the flip and MobileNet-V2 features of the
700 photos (minutes per backbone on a CPU), later runs only fit.
"""

from __future__ import annotations

import argparse
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

PLAIN_IMAGE, PLAIN_TEXT = "efficientnet_lite0", "minilm"
#: (label, image encoder, text encoder)
CONFIGS = [
    ("plain", PLAIN_IMAGE, PLAIN_TEXT),
    ("flip", "efficientnet_lite0:flip", PLAIN_TEXT),
    ("concat", "efficientnet_lite0+mobilenet_v2", PLAIN_TEXT),
    ("concat+flip", "efficientnet_lite0+mobilenet_v2:flip", PLAIN_TEXT),
    ("minilm+tfidf", PLAIN_IMAGE, "minilm+tfidf"),
    ("minilm+glove", PLAIN_IMAGE, "minilm+glove"),
]


class Blocks:
    """The feature rows of every pipeline, from the feature cache; TF-IDF blocks fitted on the captions given."""

    def __init__(self, ds) -> None:
        from crossview.features import extract_features

        self.ds = ds
        self.image = {}
        for _, enc, _ in CONFIGS:
            if enc not in self.image:
                t0 = time.time()
                self.image[enc] = extract_features(ds, enc, "none").image
                print(f"<!-- image features {enc}: {self.image[enc].shape[1]}-d, {time.time() - t0:.0f} s -->",
                      file=sys.stderr)
        self.minilm = extract_features(ds, PLAIN_IMAGE, "minilm").text
        self.glove = extract_features(ds, PLAIN_IMAGE, "glove").text

    def text(self, name: str, fit_images: np.ndarray) -> np.ndarray:
        """``(n_captions, e)`` caption features of pipeline ``name``; TF-IDF fitted on ``fit_images``' captions."""
        from crossview.features.text import CombinedTextEncoder, create_text_encoder

        if name == "minilm":
            return self.minilm
        if name == "minilm+glove":
            return CombinedTextEncoder.combine([self.minilm, self.glove])
        if name == "minilm+tfidf":
            caps = [c for c, i in zip(self.ds.captions, self.ds.caption_image) if int(i) in set(map(int, fit_images))]
            tfidf = create_text_encoder("tfidf").fit(caps).encode(list(self.ds.captions))
            return CombinedTextEncoder.combine([self.minilm, tfidf])
        raise ValueError(name)


def score(method: str, blocks: Blocks, image_enc: str, text_enc: str, splits, seed: int = 0):
    """Train ``method`` on each split's first part, rank its second: pooled ranks, caption -> image map, seconds."""
    from crossview.features.normalize import FeatureNorm
    from crossview.methods import default_norms_of, method_from_params
    from method_cv import fold_data

    img_norm, txt_norm = default_norms_of(method)
    r_i, r_t, ci, secs, offset = [], [], [], [], 0
    for a, b in splits:
        image = FeatureNorm(img_norm).fit(blocks.image[image_enc][a]).transform(blocks.image[image_enc])
        text = blocks.text(text_enc, a)
        caps_a = np.flatnonzero(np.isin(blocks.ds.caption_image, a))
        text = FeatureNorm(txt_norm).fit(text[caps_a]).transform(text)
        m = method_from_params(method, {"seed": seed})
        t0 = time.time()
        for _ in m.fit_iter(fold_data(blocks.ds, text, a, image.astype(np.float32), "train"), None):
            pass
        secs.append(time.time() - t0)
        test = fold_data(blocks.ds, text, b, image.astype(np.float32), "test")
        res = m.evaluate(test)
        r_i.append(res["ranks"]["i2t"])
        r_t.append(res["ranks"]["t2i"])
        ci.append(np.asarray(test.caption_image) + offset)
        offset += len(b)
    return {"i2t": np.concatenate(r_i), "t2i": np.concatenate(r_t)}, np.concatenate(ci), float(np.sum(secs))


def rsum(ranks) -> float:
    from crossview.eval.metrics import rank_metrics, rsum_of

    return float(rsum_of(rank_metrics(ranks["i2t"]), rank_metrics(ranks["t2i"])))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="cca,bitr")
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--out", default="-", metavar="FILE",
                    help="also write the tables here, stamped with the command, commit, machine and data (default "
                         "'-': print only)")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"no dataset at {args.data}", file=sys.stderr)
        return 2
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: [_stamp.dataset_fingerprint(args.data)],
                              title="Richer frozen features per method: flip averaging, two backbones, combined "
                                    "captions (3-fold CV on the Flickr8k sample's training photos, then val once)")


def run(args: argparse.Namespace) -> int:
    from sklearn.model_selection import KFold

    from crossview.data import load_dataset
    from crossview.eval.bootstrap import bootstrap_ci
    from crossview.eval.paired import paired_effect

    ds = load_dataset(args.data)
    train, val = np.asarray(ds.splits["train"]), np.asarray(ds.splits["val"])
    folds = [(train[a], train[b]) for a, b in KFold(args.folds, shuffle=True, random_state=0).split(train)]
    blocks = Blocks(ds)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    print(f"Data: {ds.name}, {len(train)} train photos in {args.folds} folds (train on {len(folds[0][0])}, rank the "
          f"other {len(folds[0][1])} and their captions), {len(val)} val photos kept for the end. Default parameters "
          "and feature normalisation of each method; seed 0. rsum = R@1+5+10 both ways over the pooled held-out "
          "queries of the folds; CI: 95% bootstrap over images (with their captions); Δ: paired difference from "
          "plain on the same queries.\n")
    chosen = {}
    for method in methods:
        print(f"## {method}\n")
        print("| config | image encoder | text encoder | CV rsum | 95% CI | Δ vs plain | Δ 95% CI | train s (3 folds) |")
        print("|---|---|---|---|---|---|---|---|")
        rows, kept, base = {}, {}, None
        configs = list(CONFIGS)
        k = 0
        while k < len(configs):
            label, ie, te = configs[k]
            k += 1
            ranks, ci, secs = score(method, blocks, ie, te, folds)
            rs = rsum(ranks)
            lo, hi = bootstrap_ci(ranks["i2t"], ranks["t2i"], ci, resamples=args.resamples)["rsum"]
            if base is None:
                base = ranks
                d, dci = 0.0, (0.0, 0.0)
            else:
                eff = paired_effect(base, ranks, ci, resamples=args.resamples)["rsum"]
                d, dci = eff["diff"], eff["ci"]
            rows[label] = (rs, d, dci, ie, te)
            kept[label] = (ranks, ci)
            print(f"| {label} | {ie} | {te} | {rs:.1f} | {lo:.1f}-{hi:.1f} | {d:+.1f} | {dci[0]:+.1f} to {dci[1]:+.1f} "
                  f"| {secs:.0f} |", flush=True)
            if k == len(CONFIGS):       # the best image and best text pipelines together, when both beat plain
                best_i = max((r for r in rows if rows[r][4] == PLAIN_TEXT), key=lambda r: rows[r][0])
                best_t = max((r for r in rows if rows[r][3] == PLAIN_IMAGE), key=lambda r: rows[r][0])
                if best_i != "plain" and best_t != "plain":
                    configs.append((f"{best_i} & {best_t}", rows[best_i][3], rows[best_t][4]))
        best = max(rows, key=lambda r: rows[r][0])
        rs, d, dci, ie, te = rows[best]
        if best == "plain":
            supported, adj = False, (0.0, 0.0)
            verdict = "today's default."
        else:
            # the best of several variants: its interval widened for the number of comparisons (Bonferroni)
            level = 1 - 0.05 / (len(rows) - 1)
            adj = paired_effect(base, kept[best][0], kept[best][1], resamples=max(args.resamples, 4000),
                                level=level)["rsum"]["ci"]
            supported = adj[0] > 0
            verdict = (f"its interval widened for the {len(rows) - 1} variants compared ({100 * level:.1f}%: "
                       f"{adj[0]:+.1f} to {adj[1]:+.1f}) " +
                       ("lies above 0: a default worth changing." if supported else
                        "includes 0: not enough to change the default."))
        chosen[method] = (best, ie, te, supported, d, dci)
        print(f"\nCV choice for {method}: **{best}** (CV rsum {rs:.1f}, Δ {d:+.1f}, 95% CI {dci[0]:+.1f} to "
              f"{dci[1]:+.1f}); " + verdict + "\n")

    print("## Val, once: each method trained on the 600 training photos, scored on the 100 val photos\n")
    print("The configuration was chosen by CV above, never on val; plain is shown beside it for reference.\n")
    print("| method | CV choice | val rsum plain | val rsum CV choice | 95% CI (choice) | Δ | Δ 95% CI |")
    print("|---|---|---|---|---|---|---|")
    for method in methods:
        best, ie, te, supported, _, _ = chosen[method]
        base, ci, _ = score(method, blocks, PLAIN_IMAGE, PLAIN_TEXT, [(train, val)])
        if best == "plain":
            lo, hi = bootstrap_ci(base["i2t"], base["t2i"], ci, resamples=args.resamples)["rsum"]
            print(f"| {method} | plain | {rsum(base):.1f} | {rsum(base):.1f} | {lo:.1f}-{hi:.1f} | +0.0 | - |")
            continue
        ranks, ci, _ = score(method, blocks, ie, te, [(train, val)])
        lo, hi = bootstrap_ci(ranks["i2t"], ranks["t2i"], ci, resamples=args.resamples)["rsum"]
        eff = paired_effect(base, ranks, ci, resamples=args.resamples)["rsum"]
        print(f"| {method} | {best} ({ie}, {te}) | {rsum(base):.1f} | {rsum(ranks):.1f} | {lo:.1f}-{hi:.1f} | "
              f"{eff['diff']:+.1f} | {eff['ci'][0]:+.1f} to {eff['ci'][1]:+.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
