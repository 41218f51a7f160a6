"""How long *Explain* takes for a sentence query's results (issue 30: 51-160 s for the 24 results in view, goal
under 5 s): the per-image path as the app ran it before (each image's conv map read alone, the sentence's
word-deletion variants encoded again for every image), the same one image at a time with the sentence's side
shared (``Explainer.explain`` now), and the batched path (``Explainer.explain_many``: the sentence once, 8
images to a backbone pass, many images to a held-scale pass), all in this process, on the same images (the top
``--n`` results of the sentence), the backbone and sentence encoder loaded before any timing.

    .venv/bin/python bench/explain_sentence.py RUN [--n 24] [--text "a dog runs on the grass"] [--threads N]

RUN is a run folder (``crossview train cca --data ../shared/data/flickr8k-sample/dataset_flickr8k_sample.json
--run-dir RUN``: EfficientNet-Lite0 conv maps, MiniLM sentences). Prints seconds for the 24 and the ratios; the
batched maps are checked against the per-image ones. The overlays the app draws (PIL, per image) are timed apart.
``--threads`` sets torch's intra-op threads (default: torch's own); the load average (``os.getloadavg``) is
printed before and after each timing, since other work on the machine shows in every number. Writes
bench/results/explain_sentence_cpu.txt (``--out``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)

FLICKR_TEXT = "a dog runs on the grass"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", metavar="RUN", help="a run folder")
    ap.add_argument("--n", type=int, default=24, help="results explained (default 24: a screenful)")
    ap.add_argument("--text", default=FLICKR_TEXT, help=f"the sentence query (default {FLICKR_TEXT!r})")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own)")
    ap.add_argument("--repeats", type=int, default=1, help="timings of each path (the median is printed)")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "explain_sentence_cpu.txt")
    args = ap.parse_args(argv)
    if args.n < 1 or args.repeats < 1:
        ap.error("--n and --repeats must be at least 1")
    return _stamp.run_stamped(lambda: run(args), args.out, lambda: run_data(args.run))


def run_data(run_dir: str) -> list[str]:
    """``data:`` lines of a run folder: the dataset it was trained on and its checkpoint."""
    from crossview.engine.run import CHECKPOINT, read_config

    config = read_config(Path(run_dir))
    lines = [_stamp.dataset_fingerprint(config["data"])] if config.get("data") else []
    return lines + [_stamp.file_fingerprint(Path(run_dir) / CHECKPOINT, "run checkpoint")]


def _load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from crossview.engine.session import open_run
    from crossview.explain import Explainer, overlay

    if args.threads:
        torch.set_num_threads(args.threads)
    run = open_run(args.run)
    retriever = run.retriever()
    images = [int(i) for i in retriever.query_text(args.text, k=args.n).items]
    spare = next(int(i) for i in retriever.gallery_images if int(i) not in images)
    ex = Explainer(run)
    t = time.perf_counter()
    ex.explain(spare, "a warm-up sentence", "t2i")       # loads the backbone and the sentence encoder
    warm = time.perf_counter() - t
    print(f"run {run.name} ({run.method.name} on {run.dataset.name}, image encoder {run.features.image_encoder}, "
          f"text encoder {run.features.text_encoder}); sentence {args.text!r}; its top "
          f"{len(images)} results; torch {torch.get_num_threads()} threads")
    print(f"loading the encoders (not counted below): {warm:.2f} s")

    def per_image_before() -> list:
        """What the app did before: one image at a time, the sentence's word rows encoded again each time (the
        sentence embedding itself was kept, as it was)."""
        out = []
        for i in images:
            ex._word_rows.clear()
            out.append(ex.explain(i, args.text, "t2i"))
        return out

    def per_image_shared() -> list:
        return [ex.explain(i, args.text, "t2i") for i in images]

    def batched() -> list:
        return ex.explain_many(images, args.text, "t2i")

    paths = {"per image, as before": per_image_before, "per image, sentence shared": per_image_shared,
             "batched (explain_many)": batched}
    times: dict[str, list[float]] = {k: [] for k in paths}
    got: dict[str, list] = {}
    for _ in range(args.repeats):
        for name, fn in paths.items():
            ex.clear_caches()
            ex._sentence_embedding(args.text, "t2i")    # kept across images before too: not part of any path
            before = _load()
            t = time.perf_counter()
            got[name] = fn()
            times[name].append(time.perf_counter() - t)
            print(f"  {name:28s} {times[name][-1]:7.2f} s   ({before} before, {_load()} after)")
    t = time.perf_counter()
    for e in got["batched (explain_many)"]:
        pic = overlay(e.image_path, e.region)
        pic.thumbnail((256, 256))
    drawn = time.perf_counter() - t

    ref = got["per image, as before"]
    diff = max(float(np.abs(a.region.values - b.region.values).max()) for a, b in zip(got["batched (explain_many)"], ref))
    wdiff = max(float(np.abs(a.words.values - b.words.values).max()) for a, b in zip(got["batched (explain_many)"], ref))
    modes = sorted({e.region.mode for e in ref}), sorted({e.words.mode for e in ref})
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["per image, as before"]
    print(f"{len(images)} results, median of {args.repeats}:")
    for name in paths:
        print(f"  {name:28s} {med[name]:7.2f} s  {med[name] / len(images) * 1000:7.0f} ms a result  "
              f"speed-up {base / med[name]:5.1f}x")
    print(f"overlays as the app draws them (PIL, 256 px): {drawn:.2f} s for {len(images)}")
    print(f"batched vs per image: max |map difference| {diff:.2e}, max |word difference| {wdiff:.2e} "
          f"(maps {', '.join(modes[0])}; words {', '.join(modes[1])})")
    print(f"goal: under 5 s for 24 results: batched {med['batched (explain_many)']:.2f} s "
          f"({'met' if med['batched (explain_many)'] < 5 else 'not met'} here, {_load()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
