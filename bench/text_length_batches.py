"""Caption encoding with batches sorted by length against a plain loop (issue 30: "encoding is as fast as the encoder
allows"): the same captions through the same transformer encoder, in batches of 256, three ways in this process:
in the given order (a plain loop over batches), sorted by characters (what the encoder did before) and sorted by
word pieces (what ``TransformerEncoder.iter_encode`` does now). Each batch is padded to its longest caption, so
the order decides how many token positions the model computes; those are counted too (a measure the machine's load
does not change).

    .venv/bin/python bench/text_length_batches.py [--corpus FILE] [--n 5000] [--encoder minilm] [--batch 256]

The captions are ``--n`` lines drawn at random (seed 0) from ``--corpus`` (default: the Flickr8k sample's caption
corpus). Prints captions/s, token positions computed, ratios against the plain loop, the load average
(``os.getloadavg``) before and after each timing, and checks that the rows are the same whatever the order.
Writes bench/results/text_length_batches_cpu.txt (``--out``).
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

CORPUS = _stamp.FLICKR8K.parent / "corpus_captions.txt"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=_stamp.display_path(CORPUS), help="a text file, one caption a line")
    ap.add_argument("--n", type=int, default=5000, help="captions encoded (default 5000)")
    ap.add_argument("--encoder", default="minilm", help="a transformer text encoder (minilm, bert:PATH)")
    ap.add_argument("--batch", type=int, default=256, help="captions a batch (default 256, the encoders' default)")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "text_length_batches_cpu.txt")
    args = ap.parse_args(argv)
    corpus = Path(args.corpus)
    if not corpus.is_file():
        print(f"{corpus}: no such caption file; give --corpus FILE (one caption a line)", file=sys.stderr)
        return 2
    if args.n < 1 or args.batch < 1:
        ap.error("--n and --batch must be at least 1")
    return _stamp.run_stamped(lambda: run(args, corpus), args.out,
                              [f"captions: {_stamp.file_fingerprint(corpus)}, {args.n} lines drawn with seed 0"])


def _load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def run(args: argparse.Namespace, corpus: Path) -> int:
    import numpy as np
    import torch

    from crossview.features.text import create_text_encoder

    lines = [s.strip() for s in corpus.read_text(encoding="utf-8").splitlines() if s.strip()]
    rng = np.random.default_rng(0)
    captions = [lines[i] for i in rng.choice(len(lines), size=min(args.n, len(lines)), replace=False)]
    enc = create_text_encoder(args.encoder)
    if not hasattr(enc, "token_lengths"):
        print(f"text encoder {args.encoder!r} is not a transformer: it pads nothing, so the order does not matter",
              file=sys.stderr)
        return 2
    ctx = enc._begin("cpu")
    t = time.perf_counter()
    pieces = enc.token_lengths(captions)
    order_cost = time.perf_counter() - t
    enc._encode_batch(captions[:8], ctx)            # warm-up: the model loaded and run once
    n, b = len(captions), args.batch
    orders = {"plain loop (given order)": np.arange(n),
              "sorted by characters (before)": np.argsort(-np.array([len(c) for c in captions]), kind="stable"),
              "sorted by word pieces (now)": enc._order(captions)}
    print(f"{n} captions of {_stamp.display_path(corpus)} through {enc.name}, batches of {b}, torch "
          f"{torch.get_num_threads()} threads; {int(pieces.sum())} word pieces in all ([CLS] and [SEP] included), "
          f"{pieces.mean():.1f} a caption (from {pieces.min()} to {pieces.max()}); counting them for the sort "
          f"took {order_cost:.2f} s")
    rows, secs, positions = {}, {}, {}
    for name, order in orders.items():
        out = np.zeros((n, enc.dim), np.float32)
        before = _load()
        t = time.perf_counter()
        for a in range(0, n, b):
            idx = order[a:a + b]
            out[idx] = enc._encode_batch([captions[i] for i in idx], ctx)
        secs[name] = time.perf_counter() - t
        if name.startswith("sorted by word"):
            secs[name] += order_cost                 # the sort's own cost, counted against it
        rows[name] = out
        positions[name] = int(sum(len(order[a:a + b]) * pieces[order[a:a + b]].max() for a in range(0, n, b)))
        print(f"  {name:31s} {secs[name]:7.1f} s   ({before} before, {_load()} after)")
    base = "plain loop (given order)"
    print(f"{'order':31s} {'captions/s':>11s} {'speed-up':>9s} {'token positions':>16s} {'padding':>8s}")
    for name in orders:
        pad = 1 - pieces.sum() / positions[name]
        print(f"{name:31s} {n / secs[name]:11.1f} {secs[base] / secs[name]:8.2f}x {positions[name]:16d} {pad:8.1%}")
    diff = max(float(np.abs(rows[k] - rows[base]).max()) for k in orders)
    print(f"the rows whatever the order: max |difference| {diff:.1e} (each in its caption's place)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
