"""Hubness and retrieval before / after centring the views a method L2-normalises (issue 28, item 5).

Setting: the Flickr8k sample's ``modern`` representation (EfficientNet-Lite0 pooled features reduced by a PCA
fitted on the train images to 128-d; captions = mean GloVe-50 vectors, which nothing centres), trained on
``train`` (600 images) and reported on ``val`` (100 images), one fixed C per BITR model (no cross-validation).

For each method, two fits that differ only in centring:

- ``bitr-*``: **uncentred** = the caption rows L2-normalised as they are (what BITR did before; its
  ``center_`` emptied after the preprocessing fit), **centred** = BITR as it is now (training mean subtracted
  from a view that gets no PCA, then L2);
- ``wsabie``: **uncentred** = its L2-normalised rows as they are (WSABIE before the centring), **centred** =
  WSABIE as it is now (both views minus their training mean, then L2);
- ``cca``: **uncentred** = the features as built, **centred** = both views minus their training mean first
  (CCA centres internally, so its two rows agree).

Printed per fit: val R@1/5/10 both ways and rsum; the hubness of val (:mod:`crossview.eval.hubness`: N_10
skewness, the share of top-5 lists holding the most frequent item, anti-hubs) and of val images against the
3,000 training captions (the gallery of the Im2Text BLEU); the Im2Text / Text2Im BLEU-1 of the top 5 from
the training set (the bitr-table's); and the mean pairwise cosine of the val caption rows the model sees.

    python bench/hubness_centring.py                          # bitr-c at C = 10
    python bench/hubness_centring.py --methods bitr-c,bitr-e,wsabie --C 10
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from crossview.data.method_data import MethodData  # noqa: E402
from crossview.data.readers import load_dataset  # noqa: E402
from crossview.eval.hubness import format_hubness, hubness_of_embeddings  # noqa: E402
from crossview.experiments.bitr_table import evaluate_fold  # noqa: E402
from crossview.features.topics import build_representation, method_data_for_images  # noqa: E402
from crossview.methods import create_method  # noqa: E402
from crossview.methods.bitr import Bitr  # noqa: E402
from crossview.methods.wsabie import Wsabie  # noqa: E402

DATA = "/work/shared/data/flickr8k-sample/dataset_flickr8k_sample.json"


class UncentredWsabie(Wsabie):
    """WSABIE as it was before the centring."""

    name = "wsabie"

    def _fit_centring(self, train: MethodData) -> None:
        super()._fit_centring(train)
        self.center_ = {mod: None for mod in self.center_}


class UncentredBitr(Bitr):
    """BITR as it was before the centring: the preprocessing fit without ``center_``."""

    name = "bitr"

    def _fit_preprocessing(self, train: MethodData, text: np.ndarray) -> None:
        super()._fit_preprocessing(train, text)
        self.center_ = {mod: None for mod in self.center_}


def centred(md: MethodData, img_mean: np.ndarray, txt_mean: np.ndarray) -> MethodData:
    return MethodData(image_features=md.image_features - img_mean, text_features=md.text_features - txt_mean,
                      captions=md.captions, caption_image=md.caption_image, name=md.name)


def mean_pairwise_cosine(rows: np.ndarray) -> float:
    """Mean cosine over distinct pairs of ``rows (n, d)``."""
    x = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    n = len(x)
    s = x.sum(axis=0)
    return float((s @ s - n) / (n * (n - 1)))


def fit_one(name: str, centre: bool, C: float, train: MethodData, val: MethodData, seed: int) -> dict[str, Any]:
    params: dict[str, Any]
    if name.startswith("bitr-"):
        params = {"loss": name[-1].upper(), "reduce": "pca", "C": C}
        m = (Bitr(**params) if centre else UncentredBitr(**params)).with_run(seed=seed, device="cpu")
        tr, va = train, val
    elif name == "wsabie":
        m = (Wsabie if centre else UncentredWsabie)().with_run(seed=seed, device="cpu")
        tr, va = train, val
    else:
        m = create_method(name)
        tr, va = train, val
        if centre:
            mi, mt = train.image_features.mean(0), train.text_features.mean(0)
            tr, va = centred(train, mi, mt), centred(val, mi, mt)
    t0 = time.monotonic()
    m.fit(tr)             # no val: WSABIE would stop early on the split reported here
    seconds = time.monotonic() - t0
    res = evaluate_fold(m, tr, va, ks=(1, 5, 10))
    out: dict[str, Any] = {"seconds": seconds, "res": res}
    img_i2t, txt_i2t = m.encode_images(va, "i2t"), m.encode_texts(va, "i2t")
    two = getattr(m, "directions_differ", False)
    img_t2i = m.encode_images(va, "t2i") if two else img_i2t
    txt_t2i = m.encode_texts(va, "t2i") if two else txt_i2t
    out["hub_i2t"] = hubness_of_embeddings(img_i2t, txt_i2t)
    out["hub_t2i"] = hubness_of_embeddings(txt_t2i, img_t2i)
    out["hub_i2t_train"] = hubness_of_embeddings(img_i2t, m.encode_texts(tr, "i2t"))
    rows = m._prep(va.text_features, "text") if isinstance(m, Bitr) else \
        m._rows(va.text_features, "text") if isinstance(m, Wsabie) else va.text_features
    out["cos"] = mean_pairwise_cosine(np.asarray(rows, dtype=np.float64))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--methods", default="bitr-c")
    ap.add_argument("--C", type=float, default=10.0, help="BITR's C for both directions (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--representation", default="modern", choices=("modern", "default"),
                    help="modern (the issue's) or default: the default encoders, image rows ssr-normalised as a "
                         "run does for wsabie / cca / bitr")
    args = ap.parse_args()
    ds = load_dataset(args.data)
    t0 = time.monotonic()
    rep = build_representation(ds, args.representation, fit_images="train")
    train = method_data_for_images(ds, rep, ds.splits["train"], "train")
    val = method_data_for_images(ds, rep, ds.splits["val"], "val")
    if args.representation == "default":
        from crossview.features.normalize import FeatureNorm

        for md in (train, val):
            md.image_features = FeatureNorm("ssr").transform(md.image_features)
    print(f"# {args.representation} on {ds.name}: {train.n_images} train / {val.n_images} val images, image "
          f"{train.image_features.shape[1]}-d, text {train.text_features.shape[1]}-d "
          f"({time.monotonic() - t0:.1f} s); C = {args.C:g} (bitr)")
    for name in [m.strip() for m in args.methods.split(",") if m.strip()]:
        for centre in (False, True):
            r = fit_one(name, centre, args.C, train, val, args.seed)
            res = r["res"]
            rsum = sum(res[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
            tag = f"{name} {'centred' if centre else 'uncentred'}"
            print(f"{tag}: fit {r['seconds']:.1f} s; val caption rows' mean pairwise cosine {r['cos']:.3f}")
            for d in ("i2t", "t2i"):
                print(f"  {d}: R@1 {res[d]['R@1']:.1f} R@5 {res[d]['R@5']:.1f} R@10 {res[d]['R@10']:.1f} "
                      f"MedR {res[d]['MedR']:g}  BLEU-1 (top 5 from train) {res[d]['BLEU-1']:.2f}")
            print(f"  rsum {rsum:.1f}")
            print(f"  hubness val i2t: {format_hubness(r['hub_i2t'])}")
            print(f"  hubness val t2i: {format_hubness(r['hub_t2i'])}")
            h = r["hub_i2t_train"]
            print(f"  hubness val images -> {h.n_gallery} train captions: {format_hubness(h)} "
                  f"(item {h.top5_item}: {h.top5_count} of {h.n_queries} lists)")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
