"""Why a fine-tuned backbone's VSE++ step is slow under CUDA autocast (issue 32 item 3): the step alone (one
batch's images replayed, no decoding; ``bench/vsepp_e2e.py``'s phase) in float32, and with autocast in
channels-last layout (the default), in NCHW, and with cuDNN's autotuner on; then the costliest operators of
the default's steps (torch.profiler, device time).

Run: ``python bench/finetune_amp_probe.py [--device cuda] [--batches 5] [--images 300]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vsepp_e2e as E  # noqa: E402  (bench/vsepp_e2e.py)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--backbone", default="efficientnet_lite0")
    ap.add_argument("--top", type=int, default=15, help="operators listed from the profile (0: no profile)")
    args = ap.parse_args(argv)
    from crossview.nn import encoders

    default_layout = encoders._channels_last
    with tempfile.TemporaryDirectory() as tmp:
        paths = E.write_jpegs(Path(tmp), args.images)
        captions, ci = E.captions_for(args.images)

        def step(label: str, amp: bool, profile: int = 0) -> None:
            s, n = E.run(paths, captions, ci, args.device, args.batches, True, amp, 0, args.backbone,
                         replay=True, profile=profile)
            print(f"fine-tuned step alone, {label}: {n / s:,.0f} captions/s ({n} in {s:.2f} s)", flush=True)

        step("float32 (NCHW)", False)
        step("autocast, channels-last (the default)", True)
        encoders._channels_last = lambda images: False
        step("autocast, NCHW", True)
        encoders._channels_last = default_layout
        torch.backends.cudnn.benchmark = True
        step("autocast, channels-last, cudnn.benchmark on", True)
        torch.backends.cudnn.benchmark = False
        if args.top:
            print("profile of two steps, autocast, channels-last (the default):", flush=True)
            step("autocast, channels-last, profiled", True, profile=args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
