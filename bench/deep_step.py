"""The training step of every deep method through the shared trainer, with its steps captured as CUDA graphs and
eagerly (``CROSSVIEW_CUDA_GRAPHS=0``), in the same run, on the same data (issue 32 item 4).

Data (synthetic, seeded): ``--images`` images x 2048-d features, 5 captions each of 8-20 words drawn from a Zipf
law over 8,000 words, and 384-d caption features (MiniLM's size) for the methods that read them. Each method runs
with its defaults except as listed in :data:`PARAMS` (the paper's GRU over words for the VSE family, so that the
text encoder is part of the step). Timed: ``--steps`` steps after ``--warmup`` (which cover the graphs' eager
warm-up steps and their capture). Printed per method: captions per second both ways, graphs / eager, and the
trainer's line on whether and why its steps were captured.

Run: ``python bench/deep_step.py [--device cuda] [--methods vsepp,smoothap,webly,timam,wsabie] [--steps 100]``;
``--out FILE`` writes the lines stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)
from vsepp_epoch import synthetic  # noqa: E402  (the same captions as bench/vsepp_epoch.py)

METHODS = ("vsepp", "smoothap", "webly", "timam", "wsabie")
#: what differs from each method's defaults here (one epoch long enough for the timed steps; no validation)
PARAMS: dict[str, dict] = {
    "vsepp": {"text_model": "gru", "batch_size": 128},
    "smoothap": {"text_model": "gru", "batch_size": 128},
    "webly": {"text_model": "gru", "batch_size": 128, "tag_branch": "sentence"},   # (its default reads GloVe)
    "timam": {"text_model": "gru", "batch_size": 128},   # (its default reads MiniLM's token states)
    "wsabie": {},
}
TEXT_DIM = 384


def run_method(name: str, data, device: torch.device, steps: int, warmup: int, graphs: bool,
               amp: bool) -> tuple[float, int, str]:
    """``(seconds, captions, the trainer's graph line)`` of ``steps`` timed steps of ``name``."""
    from crossview.core.events import Progress
    from crossview.methods import create_method

    os.environ["CROSSVIEW_CUDA_GRAPHS"] = "1" if graphs else "0"
    params = {**PARAMS.get(name, {}), "max_epochs": 1}
    m = create_method(name, **params).with_run(device=str(device), seed=0, amp=amp, log_every=1000)
    it = m.fit_iter(data)
    t0, done, captions, note = 0.0, 0, 0, ""
    for ev in it:
        live = getattr(m, "_live", None)
        if not isinstance(ev, Progress) or live is None:      # (progress of work before training: not a step)
            continue
        n_rows = len(live[1].batch_host) if live is not None and live[1].batch_host is not None else 0
        if ev.step == live[1].step and ev.step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        elif ev.step > warmup:
            done += 1
            captions += n_rows
        if done >= steps:
            note = live[1].graph_note if live is not None else ""
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    it.close()
    if done < steps:
        raise RuntimeError(f"only {done} timed steps in one epoch: give more --images")
    return elapsed, captions, note


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--images", type=int, default=8000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--amp", action="store_true", help="mixed precision (bfloat16 on GPUs that have it)")
    ap.add_argument("--out", default="-", metavar="FILE")
    args = ap.parse_args(argv)
    data = [_stamp.synthetic(seed=0, images=args.images, dim=2048, captions_per_image=5, vocabulary=8000,
                             words="8-20 (Zipf)", text_features=f"{TEXT_DIM}-d Gaussian")]
    return _stamp.run_stamped(lambda: run(args), args.out, data)


def run(args: argparse.Namespace) -> int:
    from crossview.core.errors import CrossViewError
    from crossview.data.method_data import MethodData

    device = torch.device(args.device)
    image, captions, ci = synthetic(args.images)
    txt = np.random.default_rng(1).standard_normal((len(captions), TEXT_DIM), dtype=np.float32)
    data = MethodData(image_features=image, text_features=txt, captions=captions, caption_image=ci, name="train")
    print(f"data: {len(image):,} images x {image.shape[1]}-d, {len(captions):,} captions; machine "
          f"{platform.processor() or platform.machine()}, torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + (", amp" if args.amp else ""), flush=True)
    for name in [m.strip() for m in args.methods.split(",") if m.strip()]:
        try:
            rates = {}
            notes = {}
            for graphs in ((True, False) if device.type == "cuda" else (False,)):
                s, n, note = run_method(name, data, device, args.steps, args.warmup, graphs, args.amp)
                rates[graphs], notes[graphs] = n / s, note
            line = f"{name}: eager {rates[False]:,.0f} captions/s"
            if True in rates:
                line += f"; graphs {rates[True]:,.0f} captions/s = {rates[True] / rates[False]:.2f}x eager"
            print(line + (f" ({notes.get(True)})" if notes.get(True) else ""), flush=True)
        except (CrossViewError, RuntimeError) as e:
            print(f"{name}: not measured: {str(e).splitlines()[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
