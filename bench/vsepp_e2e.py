"""VSE++ end to end: training throughput with the CNN over image files (``image_model=cnn``), frozen or
fine-tuned, decoded and augmented (random resized crop, flip) by loader workers.

Data: ``--images`` synthetic JPEG photos (500 x 375, smooth colour noise, written once to a temporary
folder, as Flickr's sizes), 5 captions each (words from a Zipf law, 8-20 words). The backbone comes from its
offline weights (``--backbone``, EfficientNet-Lite0 by default; nothing is downloaded). Timed: ``--batches``
batches of 128 captions after 3 warm-up batches; prints captions per second and decoded images per second.

Run: ``python bench/vsepp_e2e.py [--device cuda] [--batches 30] [--workers 8] [--amp] [--decode cpu]
[--decode-ahead] [--graphs] [--cudnn-benchmark] [--cpu-share F] [--phases]``
(on CUDA the JPEGs are decoded and augmented on the GPU unless ``--decode cpu``; each run prints which path).
Its lines are part of bench/results/vsepp_epoch_gpu.txt, which ``bench/regenerate.py --only vsepp_epoch_gpu``
assembles; ``--out FILE`` writes them alone, stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)


def write_jpegs(folder: Path, n: int, seed: int = 0) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        small = rng.integers(0, 256, size=(24, 32, 3), dtype=np.uint8)
        im = Image.fromarray(small).resize((500, 375), Image.BILINEAR)
        p = folder / f"im{i:05d}.jpg"
        im.save(p, quality=90)
        paths.append(str(p))
    return paths


def captions_for(n_images: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(2000)])
    p = 1.0 / np.arange(1, len(vocab) + 1)
    p /= p.sum()
    caps = [" ".join(rng.choice(vocab, size=int(rng.integers(8, 21)), p=p)) for _ in range(n_images * 5)]
    return caps, np.repeat(np.arange(n_images), 5)


def run(paths: list[str], captions: list[str], ci: np.ndarray, device: str, batches: int, finetune: bool,
        amp: bool, workers: int, backbone: str, decode: str = "auto", replay: bool = False,
        profile: int = 0) -> tuple[float, int]:
    """``(seconds, captions)`` of ``batches`` training batches after 3 warm-up ones. ``replay``: the images of
    the first batch are kept and handed to every later step (no decoding, no augmentation; the same rows
    map): what the step itself allows, the ceiling decoding can at best reach. ``profile``: print the
    ``profile`` costliest operators (device time) of two steps after the warm-up ones."""
    from crossview.core.events import Progress
    from crossview.data.method_data import MethodData
    from crossview.methods import create_method
    from crossview.nn import device_images

    if decode == "cpu":          # the loader workers' path even on a GPU (the path before issue 32)
        device_images.device_decode_available = lambda _device: False

    data = MethodData(image_features=None, text_features=None, captions=captions, caption_image=ci, name="train",
                      image_paths=paths)
    m = create_method("vsepp", image_model="cnn", backbone=backbone, finetune_cnn=finetune, text_model="gru",
                      max_epochs=1, batch_size=128).with_run(device=device, amp=amp, workers=workers,
                                                             log_every=1000)
    if replay:
        real, kept = m._batch_images, {}

        def replayed(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if len(batch) not in kept:      # (an epoch's last, shorter batch decodes its own)
                kept[len(batch)] = real(batch)
            return kept[len(batch)]

        m._batch_images = replayed
    it = m.fit_iter(data)
    t0, done = 0.0, 0
    for ev in it:
        if getattr(ev, "level", None) == "info" and "images:" in getattr(ev, "message", ""):
            print("  " + ev.message.split("images:", 1)[1].strip(), flush=True)
        if not isinstance(ev, Progress):
            continue
        if ev.step == 3:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            if profile:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                              + ([torch.profiler.ProfilerActivity.CUDA]
                                                 if device.startswith("cuda") else []))
                prof.__enter__()
        elif profile and ev.step == 5:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            keys = ["self_cuda_time_total", "self_cpu_time_total"] if device.startswith("cuda") else \
                ["self_cpu_time_total"]
            for key in keys:      # the device's time, then the host's (a step bound by the host shows there)
                print(f"  by {key}:", flush=True)
                print(prof.key_averages().table(sort_by=key, row_limit=int(profile), max_name_column_width=60),
                      flush=True)
            done += 128
        elif ev.step > 3:
            done += 128
        if ev.step >= batches + 3:
            break
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    it.close()
    return elapsed, done


def decode_split(paths: list[str], device: str, batches: int, backbone: str) -> tuple[float, float, float]:
    """``(decoding, augmenting, drawing)`` images per second, each timed alone over ``batches`` batches of 126
    distinct images after 2 warm-up batches: nvJPEG's decoding of bytes already in memory (the stream drained
    before each batch, as training does), the crops' drawing on the host, and the device's crop / resize / flip /
    normalisation of the decoded images; which of the three bounds :func:`decode_rate`."""
    from crossview.methods.vsepp import Vsepp
    from crossview.nn import device_images

    v = Vsepp(image_model="cnn", backbone=backbone)
    v.model_spec_ = {"backbone": backbone}
    p = device_images.train_transform_params(v._transforms()[0])
    rng = np.random.default_rng(2)
    n = batches + 2
    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()
    datas = [[device_images.read_bytes(paths[j]) for j in rng.choice(len(paths), size=126, replace=False)]
             for _ in range(n)]
    decoded, t0 = [], 0.0
    for k in range(n):
        if k == 2:
            sync()
            t0 = time.perf_counter()
        decoded.append(device_images.decode_images(["(in memory)"] * len(datas[k]), dev, datas[k])[0])
    sync()
    dec = batches * 126 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    params = [device_images.draw_params([tuple(im.shape[-2:]) for im in ims], p["scale"], p["ratio"], p["flip_p"])
              for ims in decoded]
    draw = n * 126 / (time.perf_counter() - t0)
    for k in range(n):
        if k == 2:
            sync()
            t0 = time.perf_counter()
        device_images.augment(decoded[k], params[k], p["crop"], p["mean"], p["std"])
    sync()
    return dec, batches * 126 / (time.perf_counter() - t0), draw


def decode_rate(paths: list[str], device: str, workers: int, decode: str, batches: int,
                backbone: str) -> tuple[float, str]:
    """``(images per second, which path)`` of decoding and augmenting alone: ``batches`` batches of 126
    distinct images (what a VSE++ batch of 128 captions holds), on the device (nvJPEG) or by ``workers`` loader
    processes, as training does, after 2 warm-up batches; no model."""
    from crossview.methods.vsepp import Vsepp
    from crossview.nn import device_images
    from crossview.nn.images import BatchImages, batch_image_loader

    v = Vsepp(image_model="cnn", backbone=backbone)
    v.model_spec_ = {"backbone": backbone}       # (what fitting sets; _transforms reads only the backbone)
    transform = v._transforms()[0]
    rng = np.random.default_rng(1)
    n = batches + 2
    ids = [rng.choice(len(paths), size=126, replace=False) for _ in range(n)]
    dev = torch.device(device)
    on_device = decode != "cpu" and device_images.device_decode_available(dev)
    if on_device:
        imgs = device_images.DeviceImageBatches(paths, transform, dev, workers=workers)
        t0 = 0.0
        for k in range(n):
            if k == 2:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            imgs.batch(ids[k], k)
            if k + 1 < n:              # as training reads ahead: after taking a batch, the next one's
                imgs.read_ahead(ids[k + 1], k + 1)
        torch.cuda.synchronize()
        imgs.close()
        how = "on the device (nvJPEG), " + ("decoded ahead by a thread" if imgs.decode_ahead else
                                            "bytes read ahead by a thread")
        if imgs.cpu_share:
            how += f", {imgs.cpu_share:.0%} of each batch by {imgs.workers} CPU workers"
        return batches * 126 / (time.perf_counter() - t0), how
    ds = BatchImages(paths, transform, lambda k: ids[k], lambda k: k, 0, n)
    t0 = 0.0
    for k, images, _rows in batch_image_loader(ds, workers):
        images = images.to(dev, non_blocking=True)
        if k == 2:
            t0 = time.perf_counter()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return batches * 126 / (time.perf_counter() - t0), f"by {workers} loader workers on the CPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--images", type=int, default=4000)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--backbone", default="efficientnet_lite0")
    ap.add_argument("--amp", action="store_true")
    ap.add_argument("--decode", choices=("auto", "cpu"), default="auto",
                    help="auto: JPEGs decoded and augmented on the GPU when the device is CUDA; cpu: by the loader "
                         "workers whatever the device (the path before issue 32)")
    ap.add_argument("--decode-ahead", action="store_true",
                    help="the read-ahead thread decodes each coming batch on a CUDA stream of its own, while the "
                         "step before runs ($CROSSVIEW_DECODE_AHEAD=1; off by default)")
    ap.add_argument("--graphs", action="store_true",
                    help="capture the end-to-end steps as CUDA graphs, their images decoded before each step into "
                         "static tensors ($CROSSVIEW_E2E_GRAPHS=1; off by default)")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="torch.backends.cudnn.benchmark on: cuDNN times its algorithms once per shape (a fine-tuned "
                         "batch under autocast has a fixed row count, so once per run)")
    ap.add_argument("--cpu-share", type=float, default=0.0, metavar="F",
                    help="with device decoding: CPU worker processes (--workers) decode, crop and flip this share of "
                         "each batch's images while nvJPEG decodes the rest ($CROSSVIEW_CPU_DECODE_SHARE; 0, the "
                         "default: all on the device)")
    ap.add_argument("--phases", action="store_true",
                    help="also time the steps alone (one batch's images replayed) and decoding alone")
    ap.add_argument("--out", default="-", metavar="FILE",
                    help="also write the lines here, stamped (default '-': print only)")
    args = ap.parse_args(argv)
    from crossview.methods.vsepp import E2E_GRAPHS_ENV
    from crossview.nn.device_images import CPU_SHARE_ENV, DECODE_AHEAD_ENV

    for on, name in ((args.decode_ahead, DECODE_AHEAD_ENV), (args.graphs, E2E_GRAPHS_ENV)):
        if on:            # read when the run's image batches are set up
            os.environ[name] = "1"
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    if args.cpu_share:
        os.environ[CPU_SHARE_ENV] = str(args.cpu_share)
    data = [_stamp.synthetic(seed=0, jpegs=args.images, size="500x375", captions_per_image=5, vocabulary=2000,
                             words="8-20 (Zipf)")]
    return _stamp.run_stamped(lambda: run_all(args), args.out, data)


def run_all(args: argparse.Namespace) -> int:
    """The measurement proper: frozen, then fine-tuned."""
    print(f"machine: {platform.machine()}, torch {torch.__version__}, threads {torch.get_num_threads()}, device "
          f"{args.device}" + (f" ({torch.cuda.get_device_name(0)})" if args.device.startswith("cuda") else "")
          + f", {args.workers} loader workers, decode {args.decode}"
          + (", decode ahead" if args.decode_ahead else "") + (", end-to-end graphs" if args.graphs else "")
          + (", cudnn.benchmark" if args.cudnn_benchmark else "")
          + (f", {args.cpu_share:.0%} of each batch decoded by the CPU workers" if args.cpu_share else ""),
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        paths = write_jpegs(Path(tmp), args.images)
        captions, ci = captions_for(args.images)
        print(f"data: {len(paths):,} JPEGs 500x375, {len(captions):,} captions ({time.perf_counter() - t:.1f} s)",
              flush=True)
        for finetune in (False, True):
            s, n = run(paths, captions, ci, args.device, args.batches, finetune, args.amp, args.workers,
                       args.backbone, args.decode)
            print(f"{args.backbone} {'fine-tuned' if finetune else 'frozen'}{' amp' if args.amp else ''}: "
                  f"{n / s:,.0f} captions/s ({n:,} captions in {s:.1f} s; each batch decodes the distinct images "
                  "of its captions, ~126 of 128)", flush=True)
        if args.phases:
            # where the time goes: the same steps without decoding (the first batch's images replayed), and
            # decoding + augmenting without steps; end to end is at best the slower of the two
            for finetune in (False, True):
                s, n = run(paths, captions, ci, args.device, args.batches, finetune, args.amp, args.workers,
                           args.backbone, args.decode, replay=True)
                print(f"  phase: {'fine-tuned' if finetune else 'frozen'} step alone (one batch's images "
                      f"replayed, no decoding): {n / s:,.0f} captions/s", flush=True)
            rate, how = decode_rate(paths, args.device, args.workers, args.decode, args.batches, args.backbone)
            print(f"  phase: decoding + augmenting alone, {how}: {rate:,.0f} images/s (~{rate * 128 / 126:,.0f} "
                  "captions/s of batches)", flush=True)
            if args.decode != "cpu" and args.device.startswith("cuda"):
                dec, aug, draw = decode_split(paths, args.device, args.batches, args.backbone)
                print(f"  phase: of which decoding alone (bytes in memory, nvJPEG): {dec:,.0f} images/s; drawing the "
                      f"crops (host): {draw:,.0f} images/s; cropping, resizing, flipping, normalising alone: "
                      f"{aug:,.0f} images/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
