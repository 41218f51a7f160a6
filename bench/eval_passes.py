"""A run's plain evaluation at COCO 5K size: ranks both ways and the hubness of both, block by block.

A run's test evaluation ranks the split (``Method.evaluate``) and reports the hubness of both directions. Until
this commit the hubness formed its own products (``embeddings_hubness``: images x captions, then captions x
images) after the ranking's three passes over the score blocks (i2t ranks; t2i's gold scores; t2i's counts):
**five** products of the split. Now the ranking reads t2i's gold scores in its i2t pass and takes both hubness
lists from its own blocks: **two** products with one model (three with a separate t2i model, BITR).

Measured in the same run, on the same embeddings (seeded unit vectors near their image's, 5 captions an image):

- ``before``: the former path, rebuilt from today's functions: ``embedding_ranks`` given the same model as a
  separate t2i model (its three passes, as before) plus ``embeddings_hubness`` (two more products);
- ``now``: ``evaluate_embeddings_blocked(..., hubness=True)`` (``Method.evaluate(test, hubness=True)``, what a
  run's fit stage calls);
- ``floor``: the two bare block products ``image @ text.T`` alone (no ranking, no top-k), the least a two-pass
  evaluation can cost.

Both paths must give the same ranks and the same hubness (checked). Times are the best of ``--repeats``,
alternating the paths.

    .venv/bin/python bench/eval_passes.py                       # 5,000 images x 25,000 captions, 1024-d
    .venv/bin/python bench/eval_passes.py --images 1000 --out - # quick
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stamp  # noqa: E402  (bench/_stamp.py)


def _embeddings(n_images: int, per: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    img = rng.standard_normal((n_images, dim), dtype=np.float32)
    img /= np.linalg.norm(img, axis=1, keepdims=True)
    ci = rng.permutation(np.repeat(np.arange(n_images), per))
    txt = img[ci] + 0.9 * rng.standard_normal((len(ci), dim), dtype=np.float32) / np.sqrt(dim)
    txt /= np.linalg.norm(txt, axis=1, keepdims=True)
    return img, txt.astype(np.float32), ci


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--per", type=int, default=5, help="captions per image")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    _stamp.add_out_argument(ap, _stamp.RESULTS / "eval_passes_cpu.txt")
    return ap


def main(args: argparse.Namespace) -> int:
    from crossview.eval import metrics as M
    from crossview.eval.embeddings import Embeddings, embeddings_hubness

    img, txt, ci = _embeddings(args.images, args.per, args.dim, seed=0)
    emb = Embeddings(image=img, text=txt, caption_image=ci)
    block_rows = max(1, M._SCORE_BLOCK_ELEMENTS // max(1, txt.shape[0]))

    def before():
        ranks = M.embedding_ranks(img, txt, ci, image_t2i=img, text_t2i=txt)
        return ranks, embeddings_hubness(emb)

    def now():
        r = M.evaluate_embeddings_blocked(img, txt, ci, hubness=True)
        return r["ranks"], r["hubness"]

    def floor():
        for _ in range(2):
            for _start, _stop, _s in M._score_blocks(img, txt, block_rows):
                pass

    times: dict[str, list[float]] = {"before": [], "now": [], "floor": []}
    outs = {}
    for _ in range(args.repeats):
        for name, fn in (("before", before), ("now", now), ("floor", floor)):
            t = time.perf_counter()
            outs[name] = fn()
            times[name].append(time.perf_counter() - t)
    (rb, hb), (rn, hn) = outs["before"], outs["now"]
    same_ranks = all(np.array_equal(rb[d], rn[d]) for d in ("i2t", "t2i"))
    same_hub = hb == hn
    best = {k: min(v) for k, v in times.items()}
    print(f"{args.images:,} images x {len(ci):,} captions, {args.dim}-d float32 embeddings, one model; blocks of "
          f"{block_rows} images ({block_rows * len(ci) * 4 / 2**20:.0f} MB of scores); best of {args.repeats}")
    print()
    print(f"{'path':<8} {'products':>8} {'best s':>8} {'runs s':>24}")
    for name, passes in (("before", 5), ("now", 2), ("floor", 2)):
        print(f"{name:<8} {passes:>8} {best[name]:>8.2f} {' '.join(f'{t:.2f}' for t in times[name]):>24}")
    print()
    print(f"now / before: {best['now'] / best['before']:.2f} (the evaluation takes {best['before'] / best['now']:.2f}x "
          f"less time); now / floor: {best['now'] / best['floor']:.2f}")
    print(f"same ranks: {same_ranks}; same hubness: {same_hub} (i2t skewness {hn['i2t']['skewness']:.3f}, "
          f"t2i {hn['t2i']['skewness']:.3f})")
    if not (same_ranks and same_hub):
        print("the two paths disagree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    a = _parser().parse_args()
    sys.exit(_stamp.run_stamped(lambda: main(a), a.out, data=[_stamp.synthetic(
        seed=0, images=a.images, captions_per_image=a.per, dim=a.dim, kind="unit vectors near their image's")]))
