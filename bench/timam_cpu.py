"""TIMAM on a CPU against VSE++ with a transformer text encoder: whole runs on the Flickr8k sample, back to back.

Runs through the engine (``crossview.train``), same data (train 600 photos -> val 100), same image features
(each run's default image encoder, from the feature cache, extracted before timing), same machine, same torch
thread count:

- **vsepp**: ``text_model=transformer`` (all-MiniLM-L6-v2 over each batch's tokens, frozen, mean -> FC; VSE0, its
  card's defaults) for ``--epochs`` epochs: the transformer runs on every caption of every epoch;
- **timam**: TIMAM's defaults (``text_model=features``: the run's MiniLM + GloVe caption features -> FC) for
  ``--epochs`` epochs. Its caption features come from the feature cache as the image ones do; what a first run
  spends making them is measured apart, on the same captions without the cache (row **caption features**), so
  **cold** = caption features + timam and **warm** = timam (the cache filled);
- **timam-bilstm, cold / warm**: the paper's text side (``text_model=bilstm``: MiniLM's token states -> Bi-LSTM ->
  max -> FC), its token-state cache empty (a fresh folder: the run first encodes every caption's token states, the
  ``tokens`` stage), then the same run again with the token states cached (``crossview.features.token_cache``).

Each row: the wall seconds (token states, training, evaluation; image features excluded: cached for all), the
token-state stage's seconds, the val rsum (a speed-up must not hide a quality drop) and the load average of the
machine before and after the run (the machine may be shared: a busy machine slows every row). Ratios against
vsepp, cold and warm, for the defaults and for the Bi-LSTM; the goal is TIMAM within 2x of VSE++.

Run: ``python bench/timam_cpu.py [--epochs 10] [--threads 1]``; ``--out`` (default
bench/results/timam_cpu.txt) writes it stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _run(method: str, data: str, work: Path, name: str, params: dict) -> dict:
    from crossview.engine.run import train
    from crossview.core.events import Finished, Progress

    before = _load()
    t0 = time.perf_counter()
    tokens = [None, None]
    summary: dict = {}
    for ev in train(method, data, run_dir=work / name, params=params, device="cpu", seed=0):
        if isinstance(ev, Progress) and ev.stage == "tokens":
            now = time.perf_counter() - t0
            tokens[0] = now if tokens[0] is None else tokens[0]
            tokens[1] = now
        if isinstance(ev, Finished):
            summary = ev.summary
    seconds = time.perf_counter() - t0
    return {"name": name, "seconds": seconds, "tokens": (tokens[1] - tokens[0]) if tokens[0] is not None else 0.0,
            "rsum": float(summary.get("rsum", float("nan"))), "load": f"{before} -> {_load()}"}


def run(args: argparse.Namespace) -> int:
    import torch

    from crossview.data import load_dataset
    from crossview.features import extract_features
    import crossview.features.token_cache as token_cache
    from crossview.methods import default_encoders_of

    torch.set_num_threads(int(args.threads))
    data = str(args.data)
    ds = load_dataset(data)
    runs = (("vsepp", {"text_model": "transformer"}), ("timam", {}), ("timam", {"text_model": "bilstm"}))
    for method, params in runs:
        image_enc, _ = default_encoders_of(method, params)
        extract_features(ds, image_enc, "none")               # each run's image features, cached before any timing
    print(f"# TIMAM vs VSE++ (transformer text), {args.epochs} epochs each, Flickr8k sample (train 600 -> val 100), "
          f"CPU, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"# load average (1/5/15 min) at the start: {_load()}\n")
    rows = []
    image_enc, text_enc = default_encoders_of("timam")
    before = _load()
    t0 = time.perf_counter()
    extract_features(ds, None, text_enc, cache=False)          # what a first timam run spends on its captions
    feats = {"name": "caption features", "seconds": time.perf_counter() - t0, "tokens": 0.0, "rsum": float("nan"),
             "load": f"{before} -> {_load()}", "note": f"{text_enc}, {len(ds.captions):,} captions, no cache"}
    extract_features(ds, image_enc, text_enc)                # into the cache (untimed): the timam row is warm
    with tempfile.TemporaryDirectory(prefix="timam_cpu_") as tmp:
        work = Path(tmp)
        rows.append(_run("vsepp", data, work, "vsepp", {"text_model": "transformer", "max_epochs": args.epochs}))
        rows.append(feats)
        rows.append(_run("timam", data, work, "timam", {"max_epochs": args.epochs}))
        store = work / "tokens"                          # an empty token-state cache: the cold run encodes all
        token_cache.token_store_dir = lambda: store      # noqa: E731 - the module reads it at each TokenCache
        bilstm = {"max_epochs": args.epochs, "text_model": "bilstm"}
        rows.append(_run("timam", data, work, "timam-bilstm-cold", bilstm))
        rows.append(_run("timam", data, work, "timam-bilstm-warm", bilstm))
    print(f"{'run':<19}{'seconds':>9}{'tokens s':>10}{'val rsum':>10}   load average before -> after")
    for r in rows:
        rsum = "-" if r["rsum"] != r["rsum"] else f"{r['rsum']:.1f}"
        print(f"{r['name']:<19}{r['seconds']:>9.1f}{r['tokens']:>10.1f}{rsum:>10}   {r['load']}"
              + (f"   ({r['note']})" if r.get("note") else ""))
    by = {r["name"]: r["seconds"] for r in rows}
    base = by["vsepp"]
    cold = (by["caption features"] + by["timam"]) / base
    print(f"\nratio timam / vsepp (defaults, text_model=features): cold {cold:.2f}x, warm {by['timam'] / base:.2f}x "
          "(goal: within 2x)")
    print(f"ratio timam / vsepp (text_model=bilstm, the paper's): cold {by['timam-bilstm-cold'] / base:.2f}x, "
          f"warm {by['timam-bilstm-warm'] / base:.2f}x")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(_stamp.FLICKR8K))
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads for all runs (default 1: on a shared 2-core machine two threads "
                         "made a TIMAM step 18x slower, bench notes)")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "timam_cpu.txt")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"no Flickr8k sample at {args.data}: pass --data PATH/dataset_flickr8k_sample.json", file=sys.stderr)
        return 2
    return _stamp.run_stamped(lambda: run(args), args.out, [_stamp.dataset_fingerprint(args.data)])


if __name__ == "__main__":
    raise SystemExit(main())
