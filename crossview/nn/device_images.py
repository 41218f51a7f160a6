"""Training images decoded and augmented on the device (the GPU path of end-to-end training).

The CPU path (:mod:`crossview.nn.images`) decodes each file with Pillow in loader workers and augments the
``PIL.Image``: random resized crop, horizontal flip, ``ToTensor``, normalisation. On a GPU that path is bound
by the CPU (a 500 x 375 JPEG costs a worker a few ms). Here the host only reads the files' bytes (cheap), the
JPEGs of a batch are decoded together by ``torchvision.io.decode_jpeg(..., device="cuda")`` (nvJPEG), and the
crop, resize, flip and normalisation run on the decoded tensors on the device.

The random parameters are drawn exactly as the CPU path draws them (``RandomResizedCrop.get_params`` and one
``torch.rand(1)`` for the flip per image, in the batch's image order, from the global RNG seeded by the
batch's seed), so a batch gets the same crops and flips on either path; only the resize differs by rounding
(Pillow's antialiased bilinear on ``uint8`` against torch's, see ``tests/test_device_images.py``).

A file that is not a JPEG (a PNG in the set), or that nvJPEG refuses, is decoded on the CPU with Pillow and
joins the batch on the device (per file: the rest of the batch stays on the GPU path).

Decoding split between the GPU and the CPU (``$CROSSVIEW_CPU_DECODE_SHARE``, off by default): torchvision's
nvJPEG decoder runs one batch at a time behind one lock, so it does not get faster with more threads; a share
of each batch's images can instead be decoded, cropped and flipped by worker processes on the CPU (the run's
loader workers) while nvJPEG decodes the rest. The crops of the whole batch are drawn first, from the images'
sizes in their headers, so either share gets the crops it would have got on its own.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from crossview.core.errors import CrossViewError

__all__ = ["is_jpeg", "read_bytes", "decode_images", "draw_params", "augment", "crop_images", "normalise",
           "image_size", "DeviceImageBatches", "device_decode_available", "train_transform_params",
           "DECODE_AHEAD_ENV", "CPU_SHARE_ENV"]

_JPEG_MAGIC = b"\xff\xd8\xff"

#: ``1``: the read-ahead thread decodes the next batch too, on a CUDA stream of its own
#: (:meth:`DeviceImageBatches.read_ahead`)
DECODE_AHEAD_ENV = "CROSSVIEW_DECODE_AHEAD"

#: a fraction in [0, 0.9]: the share of each batch's distinct images decoded by worker processes on the CPU
#: while nvJPEG decodes the rest (:class:`DeviceImageBatches`); 0 (the default): all on the device
CPU_SHARE_ENV = "CROSSVIEW_CPU_DECODE_SHARE"

_log = logging.getLogger(__name__)

_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}       # start-of-frame markers (DHT, JPG, DAC are not)


def is_jpeg(data: torch.Tensor | bytes) -> bool:
    """Whether ``data`` (a file's bytes) starts like a JPEG."""
    head = bytes(data[:3].tolist()) if isinstance(data, torch.Tensor) else bytes(data[:3])
    return head == _JPEG_MAGIC


def image_size(data: torch.Tensor | bytes) -> tuple[int, int] | None:
    """``(height, width)`` of an image file's bytes, read from its header (a JPEG's start-of-frame segment;
    Pillow's header read for any other format) without decoding it; None when the header cannot be read."""
    raw = data.numpy().tobytes() if isinstance(data, torch.Tensor) else bytes(data)
    if raw[:3] == _JPEG_MAGIC:
        k = 2
        while k + 4 <= len(raw):
            if raw[k] != 0xFF:
                return None
            marker = raw[k + 1]
            if marker == 0xFF:                   # fill byte
                k += 1
                continue
            if marker in (0x01, *range(0xD0, 0xD8)):     # markers without a length
                k += 2
                continue
            length = int.from_bytes(raw[k + 2:k + 4], "big")
            if marker in _SOF:
                if k + 9 > len(raw):
                    return None
                h, w = int.from_bytes(raw[k + 5:k + 7], "big"), int.from_bytes(raw[k + 7:k + 9], "big")
                return (h, w) if h > 0 and w > 0 else None
            if marker in (0xD9, 0xDA) or length < 2:     # end of image, start of scan: no frame before them
                return None
            k += 2 + length
        return None
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as im:
            w, h = im.size
    except Exception:  # noqa: BLE001 - Pillow raises many types; the caller decodes the file, which says why
        return None
    return int(h), int(w)


def read_bytes(path: str) -> torch.Tensor:
    """The bytes of the file at ``path`` as a 1-D ``uint8`` tensor (what ``decode_jpeg`` takes)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CrossViewError(f"{path}: cannot read this image ({type(e).__name__}: {e}); fix or remove "
                             "the file") from None
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)


def _decode_pil(path: str, data: torch.Tensor) -> torch.Tensor:
    """``(3, H, W) uint8`` of one file decoded by Pillow (the CPU path's decoder)."""
    import io

    from PIL import Image
    from torchvision.transforms.functional import pil_to_tensor

    from crossview.data.images import image_problem

    try:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as im:
            return pil_to_tensor(im.convert("RGB"))
    except Exception as e:  # noqa: BLE001 - Pillow raises many types (image_problem)
        raise CrossViewError(f"{path}: {image_problem(e)}; fix or remove the file") from None


def decode_images(paths: Sequence[str], device: torch.device,
                  datas: Sequence[torch.Tensor] | None = None) -> tuple[list[torch.Tensor], int]:
    """``(images, n_on_cpu)``: each file as a ``(3, H, W) uint8`` tensor on ``device``. The JPEGs are decoded
    together by ``torchvision.io.decode_jpeg`` on ``device`` (nvJPEG on a GPU, libjpeg-turbo on the CPU); a
    file that is not a JPEG, or that the batch decode refuses, is decoded by Pillow on the CPU and copied over.
    ``n_on_cpu`` counts those. ``datas``: the files' bytes when already read (:func:`read_bytes`)."""
    import warnings

    from torchvision.io import ImageReadMode, decode_jpeg

    from crossview.data.images import too_many_pixels

    datas = [read_bytes(p) for p in paths] if datas is None else list(datas)
    out: list[torch.Tensor | None] = [None] * len(paths)
    # a JPEG whose header declares more pixels than Pillow's decompression-bomb limit goes to Pillow, which refuses
    # it with one line naming the file (libjpeg-turbo and nvJPEG have no such limit: gigabytes, or an opaque error)
    # (from the first 64 KiB: a frame header after a larger EXIF block is not read, and that file is decoded as before)
    jpeg = [k for k, d in enumerate(datas)
            if is_jpeg(d) and not too_many_pixels(*(image_size(d[:65536]) or (0, 0)))]
    # torchvision 0.29 deprecates its decoders in favour of torchcodec's (a warning at every call); they work
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _decode_jpegs(datas, jpeg, out, device, decode_jpeg, ImageReadMode.RGB)
    n_cpu = 0
    for k, im in enumerate(out):
        if im is None:
            out[k] = _decode_pil(paths[k], datas[k]).to(device, non_blocking=True)
            n_cpu += 1
    return [im for im in out if im is not None], n_cpu


def _decode_jpegs(datas: Sequence[torch.Tensor], jpeg: list[int], out: list[torch.Tensor | None],
                  device: torch.device, decode_jpeg: Any, mode: Any) -> None:
    """Fill ``out[k]`` for the JPEGs ``jpeg`` of ``datas``: all in one call, else one by one (a file the
    decoder refuses stays None, for Pillow)."""
    if jpeg:
        if device.type == "cuda":
            # nvJPEG's hardware engine writes its outputs without waiting for the work already queued on the
            # stream it is given, and the caching allocator hands it blocks that queued kernels (the previous
            # step's backward) may still read: corrupted activations, NaN losses (seen: fine-tuned end to end on an
            # H200, NaN at step 2; torchcodec PR #1634 / torchvision PR #9606 describe it). Drain the stream first
            torch.cuda.current_stream(device).synchronize()
        try:
            got = decode_jpeg([datas[k] for k in jpeg], mode=mode, device=device)
            for k, im in zip(jpeg, got):
                out[k] = im
        except RuntimeError:           # one file the batch decoder refuses: each on its own, then Pillow
            for k in jpeg:
                try:
                    out[k] = decode_jpeg(datas[k], mode=mode, device=device)
                except RuntimeError:
                    pass


def train_transform_params(transform: Any) -> dict[str, Any]:
    """``{crop, scale, ratio, flip_p, mean, std}`` of a training transform built as
    ``Compose([RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize])`` (the deep methods' own);
    raises ``ValueError`` for any other shape (that transform then stays on the CPU path)."""
    from torchvision import transforms as T

    ts = list(getattr(transform, "transforms", []))
    kinds = (T.RandomResizedCrop, T.RandomHorizontalFlip, T.ToTensor, T.Normalize)
    if len(ts) != 4 or not all(isinstance(t, k) for t, k in zip(ts, kinds)):
        raise ValueError(f"not a random-resized-crop / flip / normalise transform: {transform!r}")
    rrc, flip, _, norm = ts
    size = rrc.size if isinstance(rrc.size, (tuple, list)) else (rrc.size, rrc.size)
    return {"crop": (int(size[0]), int(size[-1])), "scale": tuple(rrc.scale), "ratio": tuple(rrc.ratio),
            "flip_p": float(flip.p), "mean": tuple(float(v) for v in norm.mean),
            "std": tuple(float(v) for v in norm.std)}


def draw_params(sizes: Sequence[tuple[int, int]], scale: tuple[float, float],
                ratio: tuple[float, float], flip_p: float,
                seed: int | None = None) -> list[tuple[int, int, int, int, bool]]:
    """``(top, left, height, width, flip)`` of each image of heights x widths ``sizes``, drawn in the order the
    CPU path draws them (crop then flip, image after image): from a generator seeded with ``seed`` (the same
    numbers as the global RNG seeded with it, which the CPU path's loader workers use), else from the global RNG.
    The crop is ``RandomResizedCrop.get_params``' draw, made here with the generator (a thread drawing a batch's
    crops ahead must not touch the global RNG the training thread uses)."""
    import math

    g = torch.Generator().manual_seed(int(seed)) if seed is not None else None
    log_ratio = torch.log(torch.tensor(ratio))
    out = []
    for height, width in sizes:
        height, width = int(height), int(width)
        area = height * width
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=g).item()
            aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=g)).item()
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                i = int(torch.randint(0, height - h + 1, size=(1,), generator=g).item())
                j = int(torch.randint(0, width - w + 1, size=(1,), generator=g).item())
                break
        else:                                          # the central crop
            in_ratio = width / height
            if in_ratio < min(ratio):
                w, h = width, int(round(width / min(ratio)))
            elif in_ratio > max(ratio):
                h, w = height, int(round(height * max(ratio)))
            else:
                w, h = width, height
            i, j = (height - h) // 2, (width - w) // 2
        flip = bool(torch.rand(1, generator=g) < flip_p)
        out.append((i, j, h, w, flip))
    return out


def augment(images: Sequence[torch.Tensor], params: Sequence[tuple[int, int, int, int, bool]],
            crop: tuple[int, int], mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(n, 3, crop_h, crop_w) float32`` on the images' device: each ``(3, H, W) uint8`` image cropped to
    its ``(top, left, height, width)``, resized (bilinear, antialiased, rounded to ``uint8`` as Pillow does),
    flipped where asked, scaled to [0, 1] and normalised by ``mean`` / ``std``. Runs with autocast off (it is
    data preparation, not the model: float32 whatever the step's precision)."""
    if not images:
        return torch.zeros((0, 3, *crop), dtype=torch.float32)
    return normalise(crop_images(images, params, crop), mean, std)


def crop_images(images: Sequence[torch.Tensor], params: Sequence[tuple[int, int, int, int, bool]],
                crop: tuple[int, int]) -> torch.Tensor:
    """``(n, 3, crop_h, crop_w) uint8``: :func:`augment`'s crop, antialiased resize and flip of each image."""
    from torchvision.transforms.v2 import functional as F2

    if not images:
        return torch.zeros((0, 3, *crop), dtype=torch.uint8)
    with torch.autocast(images[0].device.type, enabled=False):
        crops = []
        for im, (i, j, h, w, flip) in zip(images, params):
            c = F2.resized_crop(im, i, j, h, w, list(crop), interpolation=F2.InterpolationMode.BILINEAR,
                                antialias=True)
            crops.append(c.flip(-1) if flip else c)
        return torch.stack(crops)


def normalise(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(n, 3, h, w) float32`` of ``uint8`` crops: scaled to [0, 1], less ``mean``, over ``std`` (float32
    whatever the step's precision)."""
    dev = x.device
    with torch.autocast(dev.type, enabled=False):
        out = x.float().div_(255.0)
        m = torch.tensor(mean, dtype=torch.float32).to(dev, non_blocking=True).view(1, -1, 1, 1)
        s = torch.tensor(std, dtype=torch.float32).to(dev, non_blocking=True).view(1, -1, 1, 1)
        return out.sub_(m).div_(s)


def _cpu_crops(paths: Sequence[str], datas: Sequence[bytes], params: Sequence[tuple[int, int, int, int, bool]],
               crop: tuple[int, int], sizes: Sequence[tuple[int, int]]) -> tuple[Any, int]:
    """In a CPU worker process: ``(crops, n_pillow)``, the images of ``datas`` (their files' bytes) decoded on
    the CPU (libjpeg-turbo, Pillow for other formats), cropped and flipped as ``params`` say: a ``uint8`` numpy
    array ``(n, 3, crop_h, crop_w)``, and how many needed Pillow; ``(None, 0)`` when an image's size is not
    ``sizes``' (its header's, from which its crop was drawn)."""
    tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
    images, n_pil = decode_images(list(paths), torch.device("cpu"), tensors)
    if [tuple(im.shape[-2:]) for im in images] != [tuple(sz) for sz in sizes]:
        return None, 0
    return crop_images(images, params, crop).numpy(), n_pil


def _worker_init() -> None:
    torch.set_num_threads(1)


def device_decode_available(device: torch.device) -> bool:
    """Whether JPEGs can be decoded on ``device`` (a CUDA device, with torchvision's nvJPEG decoder)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        import torchvision.io as tio
    except ImportError:
        return False
    return hasattr(tio, "decode_jpeg")


class DeviceImageBatches:
    """The decoded, augmented images of training batches, on ``device``: ``batch(image_ids, seed) ->
    (images (U, 3, H, W) float32, rows (B,))`` with the batch's distinct images once (``rows`` maps its items
    onto them), the augmentation drawn from ``seed`` as :class:`crossview.nn.images.BatchImages` draws it.

    ``paths``: every training image's file; ``transform``: the CPU path's training transform (its crop size,
    scale and ratio ranges, flip probability and normalisation are read from it). ``cpu_share``: the share of
    each batch's distinct images decoded, cropped and flipped by ``workers`` processes on the CPU while the
    device decodes the rest (None: ``$CROSSVIEW_CPU_DECODE_SHARE``, default 0: all on the device)."""

    def __init__(self, paths: Sequence[str], transform: Any, device: torch.device,
                 on_cpu_decode: Callable[[int], None] | None = None, decode_ahead: bool | None = None,
                 cpu_share: float | None = None, workers: int = 1) -> None:
        self.paths = [str(p) for p in paths]
        self.p = train_transform_params(transform)
        self.device = torch.device(device)
        self.n_cpu_decoded = 0          # files Pillow decoded (not JPEGs, or refused by the JPEG decoder)
        self.n_cpu_share = 0            # images the CPU workers decoded and cropped (the CPU share)
        self.on_cpu_decode = on_cpu_decode
        # decode_ahead: the read-ahead thread decodes too (:meth:`read_ahead`); None: $CROSSVIEW_DECODE_AHEAD=1
        # turns it on (off by default until measured on a GPU: bench/gpu_all.sh's e2e step runs both)
        self.decode_ahead = (os.environ.get(DECODE_AHEAD_ENV, "") == "1") if decode_ahead is None \
            else bool(decode_ahead)
        self.cpu_share = _cpu_share_from_env() if cpu_share is None else float(cpu_share)
        if not 0.0 <= self.cpu_share <= 0.9:
            raise ValueError(f"cpu_share {self.cpu_share} is not between 0 and 0.9")
        self.workers = max(1, int(workers))
        self._ahead: tuple[tuple[int, ...], int | None, Any] | None = None   # (distinct ids, seed, future)
        self._pool: Any = None
        self._procs: Any = None                                     # the CPU share's worker processes
        self._procs_lock = threading.Lock()
        self._stream: Any = None                                    # the decode thread's CUDA stream

    def read_ahead(self, image_ids: Any, seed: int | None = None) -> None:
        """Start reading the files of a coming batch in a background thread (the host's only work on this path,
        overlapped with the step before it); :meth:`batch` with the same ids (and ``seed``) then takes them.

        With :attr:`decode_ahead` and the batch's ``seed`` the thread prepares the whole batch: it draws the
        crops, decodes (the CPU share in the worker processes) and crops on a CUDA stream of its own, so that
        nvJPEG works while the step before runs instead of after it; :meth:`batch` only normalises. Why this is
        safe from nvJPEG's writes ignoring stream order (see :func:`_decode_jpegs`): the caching allocator keeps
        a pool per stream, so the decoder's stream is only handed blocks freed on it, i.e. earlier batches'
        outputs and the decoder's own buffers; the thread drains its stream before each decode (their queued
        reads are done), and the batch's crops are recorded on the training stream when handed over (their
        block is not reused until the training stream's work on them is done). The crops are drawn from a
        generator of the thread's own (:func:`draw_params`): the same numbers as in the step."""
        from concurrent.futures import ThreadPoolExecutor

        uniq = tuple(int(j) for j in torch.unique(torch.as_tensor(image_ids, dtype=torch.int64)))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="crossview-read")
        if self.decode_ahead and seed is not None:
            if self.device.type == "cuda" and self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)
            self._ahead = (uniq, int(seed), self._pool.submit(self._read_and_prepare, uniq, int(seed)))
        else:
            self._ahead = (uniq, None, self._pool.submit(lambda: [read_bytes(self.paths[j]) for j in uniq]))

    def _read_and_prepare(self, uniq: tuple[int, ...], seed: int) -> tuple[torch.Tensor, int, int, Any]:
        """In the read-ahead thread: ``(crops, n_pillow, n_cpu_share, event)``, the batch of ``uniq`` cropped on
        the device (on :attr:`_stream` on a GPU; ``event`` marks the end of that work there, None on a CPU)."""
        datas = [read_bytes(self.paths[j]) for j in uniq]
        if self.device.type != "cuda":
            return (*self._prepare(uniq, datas, seed), None)
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            got = self._prepare(uniq, datas, seed)         # drains this stream before decoding
            done = torch.cuda.Event()
            done.record(self._stream)
        return (*got, done)

    def _prepare(self, uniq: tuple[int, ...], datas: list[torch.Tensor],
                 seed: int) -> tuple[torch.Tensor, int, int]:
        """``(crops (U, 3, h, w) uint8 on the device, n_pillow, n_cpu_share)`` of the files ``uniq`` (their bytes
        ``datas``) with the crops and flips drawn from ``seed``: split between the CPU workers and the device
        when :attr:`cpu_share` asks and every header gives the image's size, else all on the device."""
        paths = [self.paths[j] for j in uniq]
        p = self.p
        if self.cpu_share > 0 and len(uniq) > 1:
            sizes = [image_size(d) for d in datas]
            if all(sizes):
                got = self._prepare_split(paths, datas, sizes, seed)      # type: ignore[arg-type]
                if got is not None:
                    return got
        images, n_pil = decode_images(paths, self.device, datas)
        params = draw_params([tuple(im.shape[-2:]) for im in images], p["scale"], p["ratio"], p["flip_p"], seed)
        return crop_images(images, params, p["crop"]).to(self.device), n_pil, 0

    def _prepare_split(self, paths: list[str], datas: list[torch.Tensor], sizes: list[tuple[int, int]],
                       seed: int) -> tuple[torch.Tensor, int, int] | None:
        """:meth:`_prepare` with :attr:`cpu_share` of the images (the files that are not JPEGs first, then the
        batch's last JPEGs) decoded and cropped by the worker processes while the device decodes the rest;
        None when an image's decoded size is not its header's (the caller then decodes the batch on the device)
        or the workers are gone (the rest of the run then decodes on the device)."""
        from concurrent.futures.process import BrokenProcessPool

        import numpy as np

        p = self.p
        params = draw_params(sizes, p["scale"], p["ratio"], p["flip_p"], seed)
        n = len(paths)
        k = min(n - 1, max(1, round(self.cpu_share * n)))
        jpeg = [is_jpeg(d) for d in datas]
        others = [i for i in range(n) if not jpeg[i]]
        need = max(0, k - len(others))
        on_cpu = sorted(others + ([i for i in range(n) if jpeg[i]][-need:] if need else []))
        taken = set(on_cpu)
        on_dev = [i for i in range(n) if i not in taken]
        pool = self._process_pool()
        futures = [pool.submit(_cpu_crops, [paths[i] for i in c], [datas[i].numpy().tobytes() for i in c],
                               [params[i] for i in c], p["crop"], [sizes[i] for i in c])
                   for c in np.array_split(np.asarray(on_cpu), min(self.workers, len(on_cpu))) if len(c)]
        out = torch.empty((n, 3, *p["crop"]), dtype=torch.uint8, device=self.device)
        n_pil = 0
        if on_dev:
            images, n_pil = decode_images([paths[i] for i in on_dev], self.device, [datas[i] for i in on_dev])
            if any(tuple(im.shape[-2:]) != sizes[i] for im, i in zip(images, on_dev)):
                for f in futures:
                    f.cancel()
                return None
            out[on_dev] = crop_images(images, [params[i] for i in on_dev], p["crop"])
        try:
            parts = [f.result() for f in futures]
        except BrokenProcessPool as e:
            # a worker died (killed, out of memory): the device decodes the rest of the run, and the log says so
            _log.warning("the CPU workers sharing the decoding stopped (%s): the device decodes every image from "
                         "now on", e)
            self.cpu_share = 0.0
            self._close_procs()
            return None
        if any(a is None for a, _ in parts):
            return None
        out[on_cpu] = torch.from_numpy(np.concatenate([a for a, _ in parts])).to(self.device)
        self.n_cpu_share += len(on_cpu)
        return out, n_pil + sum(m for _, m in parts), len(on_cpu)

    def _process_pool(self) -> Any:
        with self._procs_lock:            # the read-ahead thread and the step may both ask (a batch not read ahead)
            return self._make_process_pool()

    def _make_process_pool(self) -> Any:
        if self._procs is None:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            # forked where the platform can, as the loader workers (DataLoader) are: a spawned worker would import
            # the program's main module again, running a user's script without a __main__ guard a second time.
            # The workers use neither CUDA nor any lock of this process's threads: they decode bytes they are sent
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            self._procs = ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx, initializer=_worker_init)
        return self._procs

    def _close_procs(self) -> None:
        with self._procs_lock:
            procs, self._procs = self._procs, None
        if procs is not None:
            procs.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Stop the read-ahead thread (a batch read ahead and never taken is dropped) and the CPU workers."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._ahead = None, None
        self._close_procs()

    def batch(self, image_ids: Any, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(image_ids, dtype=torch.int64)
        uniq, rows = torch.unique(ids, return_inverse=True)
        key = tuple(int(j) for j in uniq)
        datas, prepared = None, None
        if self._ahead is not None:
            ahead_ids, ahead_seed, future = self._ahead
            if ahead_ids == key and ahead_seed in (None, int(seed)):
                got = future.result()            # a file that could not be read raises here, naming it
                if ahead_seed is None:
                    datas = got
                else:
                    prepared = got
        self._ahead = None
        with torch.autocast(self.device.type, enabled=False):
            if prepared is not None:
                crops, n_pil, _n_share, done = prepared
                if done is not None:             # the training stream waits for the thread's work, then owns it
                    stream = torch.cuda.current_stream(self.device)
                    stream.wait_event(done)
                    crops.record_stream(stream)
            else:
                if datas is None:
                    datas = [read_bytes(self.paths[j]) for j in key]
                crops, n_pil, _n_share = self._prepare(key, datas, int(seed))
            if n_pil:
                self.n_cpu_decoded += n_pil
                if self.on_cpu_decode is not None:
                    self.on_cpu_decode(n_pil)
            x = normalise(crops, self.p["mean"], self.p["std"])
        return x, rows


def _cpu_share_from_env() -> float:
    """``$CROSSVIEW_CPU_DECODE_SHARE`` as a fraction (0 when unset); one clear error for anything else."""
    raw = os.environ.get(CPU_SHARE_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        share = float(raw)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 0.9:
        raise CrossViewError(f"{CPU_SHARE_ENV}={raw!r} is not a fraction between 0 and 0.9 (the share of each "
                             "batch's images decoded on the CPU while the GPU decodes the rest); unset it or "
                             "give e.g. 0.4")
    return share
