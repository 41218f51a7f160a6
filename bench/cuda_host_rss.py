"""Host memory that CUDA itself costs a process: peak RSS of an interpreter that imports torch and the
CrossView CLI and runs one small convolution + GRU training step on ``--device`` (the libraries and kernels
that CUDA loads into host memory, which ``bench/scale.py --device cuda`` counts in every training step's peak).

Run: ``python bench/cuda_host_rss.py --device cuda`` and ``--device cpu`` (each in a fresh process).
"""

from __future__ import annotations

import argparse
import resource
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    import torch

    import crossview.cli  # noqa: F401  (what every `crossview` command imports)

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    dev = torch.device(args.device)
    conv = torch.nn.Conv2d(3, 32, 3).to(dev)
    gru = torch.nn.GRU(300, 1024, batch_first=True).to(dev)
    for amp in (False, True):
        with torch.autocast(dev.type, enabled=amp, dtype=torch.bfloat16):
            loss = conv(torch.randn(128, 3, 224, 224, device=dev)).float().mean()
            loss = loss + gru(torch.randn(128, 20, 300, device=dev))[0].float().mean()
        loss.backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.device}: peak RSS {before:,.0f} MB after importing torch and the CLI, {after:,.0f} MB after a "
          "conv + GRU step in float32 and bf16 autocast")
    return 0


if __name__ == "__main__":
    sys.exit(main())
