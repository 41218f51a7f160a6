"""Images per second of MobileNet-V2 feature extraction: our DataLoader pipeline vs a plain loop.

Baseline ("plain loop"): one process opens each image of a batch with Pillow, transforms it, stacks the
batch and runs the network, one batch at a time, so decoding and the network never overlap.
Ours: ``ImageEncoder.encode_paths``: the inference copy of the network (batch norms folded into the
convolutions, channels-last weights and batches) and a torch DataLoader whose worker processes decode and
transform the next batches while the main process runs the network (pinned memory and non-blocking copies on a
GPU; 0 workers decodes in the main process).
Both use the same network, transform, batch size and torch thread count, in the same run, and must give
the same features.

    .venv/bin/python bench/feature_throughput.py                      # CPU, 160 images, 3 rounds
    .venv/bin/python bench/feature_throughput.py --encoder efficientnet_lite0,mobilenet_v2 --workers 0,1
    .venv/bin/python bench/feature_throughput.py --device cuda --limit 700 --batch-size 64

Writes bench/results/feature_throughput_<device type>.txt (``--out``), stamped with the command, commit, machine
and data.
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

DEFAULT_DATA = REPO.parent / "shared" / "data" / "flickr8k-sample"


def plain_loop(enc, paths: list[str], batch_size: int, device) -> "np.ndarray":  # noqa: F821
    """The baseline: open, transform, forward one batch at a time in this process."""
    import numpy as np
    import torch

    from crossview.data.images import open_image

    mods = enc.load()
    body, head = mods["body"].to(device), mods["head"].to(device)
    tf = enc.make_transform()
    out = []
    with torch.inference_mode():
        for s in range(0, len(paths), batch_size):
            batch = torch.stack([tf(open_image(p)) for p in paths[s:s + batch_size]])
            out.append(head(body(batch.to(device))).float().cpu().numpy())
    if device.type == "cuda":
        torch.cuda.synchronize()
    return np.concatenate(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with an images/ subfolder "
                    "(default: the shared Flickr8k sample)")
    ap.add_argument("--encoder", default="mobilenet_v2", help="a backbone, or a comma-separated list measured one "
                    "after the other (default mobilenet_v2)")
    ap.add_argument("--limit", type=int, default=160, help="number of images (default 160)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", default=None, help="DataLoader workers, or a comma-separated list to compare "
                    "several (default min(2, cpu count))")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; each round times every pipeline once, "
                    "interleaved, and the best round of each is reported (default 3)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for the network, both pipelines (default: torch's default)")
    ap.add_argument("--out", metavar="FILE",
                    help="write the table here, stamped with the command, commit, machine and data (default "
                         "bench/results/feature_throughput_<cpu|cuda>.txt by --device; '-' prints only)")
    args = ap.parse_args(argv)
    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    if args.device == "auto":
        import torch

        kind = "cuda" if torch.cuda.is_available() else "cpu"
    out = args.out or str(REPO / "bench" / "results" / f"feature_throughput_{kind}.txt")
    return _stamp.run_stamped(lambda: run(args), out, lambda: [_stamp.dataset_fingerprint(args.data)])


def run(args: argparse.Namespace) -> int:
    """The measurement proper: prints one table per backbone."""
    import torch

    from crossview.features.image import default_num_workers, resolve_device

    folder = args.data / "images" if (args.data / "images").is_dir() else args.data
    paths = sorted(str(p) for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if not paths:
        print(f"no images in {folder}: pass --data FOLDER (the shared Flickr8k sample is expected at "
              f"{DEFAULT_DATA})", file=sys.stderr)
        return 2
    paths = paths[:args.limit]
    device = resolve_device(args.device)
    worker_counts = [default_num_workers(args.device)] if args.workers is None else \
        [int(w) for w in str(args.workers).split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    for i, name in enumerate(args.encoder.split(",")):
        if i:
            print()
        measure(name, paths, folder, device, worker_counts, args)
    return 0


def measure(name: str, paths: list[str], folder: Path, device, worker_counts: list[int],  # noqa: ANN001
            args: argparse.Namespace) -> None:
    """One backbone's table."""
    import numpy as np
    import torch

    from crossview.features.image import create_image_encoder

    enc = create_image_encoder(name)
    enc.load()
    print(f"{name} ({enc.weights_source} weights), {len(paths)} images from {folder}, batch "
          f"{args.batch_size}, device {device}, torch threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} CPUs")

    # Warm-up: first-call costs (allocator, cuDNN autotune, page cache of the files) for both sides.
    plain_loop(enc, paths[:args.batch_size], args.batch_size, device)
    for p in paths:
        Path(p).read_bytes()

    # Rounds interleave the pipelines so that load from other processes on a shared machine hits them
    # alike; the best round of each is its time.
    t_plain = float("inf")
    times = {w: float("inf") for w in worker_counts}
    diff = 0.0
    for _ in range(args.repeats):
        t = time.perf_counter()
        ref = plain_loop(enc, paths, args.batch_size, device)
        t_plain = min(t_plain, time.perf_counter() - t)
        for workers in worker_counts:
            t = time.perf_counter()
            ours = enc.encode_paths(paths, batch_size=args.batch_size, num_workers=workers, device=str(device))
            times[workers] = min(times[workers], time.perf_counter() - t)
            diff = max(diff, float(np.abs(ours - ref).max()))
            assert diff <= 1e-3 * max(float(np.abs(ref).max()), 1.0), f"outputs differ: max |diff| {diff}"
    timings = list(times.items())

    n = len(paths)
    print(f"{'pipeline':<44} {'seconds':>8} {'images/s':>9} {'ratio':>6}")
    print(f"{'baseline: plain single-process loop':<44} {t_plain:8.2f} {n / t_plain:9.1f} {1:6.2f}")
    for workers, secs in timings:
        label = f"ours: DataLoader, {workers} worker process{'es' if workers != 1 else ''}"
        print(f"{label:<44} {secs:8.2f} {n / secs:9.1f} {t_plain / secs:6.2f}")
    best = min(timings, key=lambda wt: wt[1])
    print(f"speed-up of ours ({best[0]} workers, the fastest) vs the plain loop: {t_plain / best[1]:.2f}x "
          f"(features agree to {diff:.1e}; the folded network rounds differently)")


if __name__ == "__main__":
    raise SystemExit(main())
