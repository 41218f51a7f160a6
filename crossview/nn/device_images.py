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
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from crossview.core.errors import CrossViewError

__all__ = ["is_jpeg", "read_bytes", "decode_images", "draw_params", "augment", "DeviceImageBatches",
           "device_decode_available", "train_transform_params", "DECODE_AHEAD_ENV"]

_JPEG_MAGIC = b"\xff\xd8\xff"

#: ``1``: the read-ahead thread decodes the next batch too, on a CUDA stream of its own
#: (:meth:`DeviceImageBatches.read_ahead`)
DECODE_AHEAD_ENV = "CROSSVIEW_DECODE_AHEAD"


def is_jpeg(data: torch.Tensor | bytes) -> bool:
    """Whether ``data`` (a file's bytes) starts like a JPEG."""
    head = bytes(data[:3].tolist()) if isinstance(data, torch.Tensor) else bytes(data[:3])
    return head == _JPEG_MAGIC


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

    from PIL import Image, UnidentifiedImageError
    from torchvision.transforms.functional import pil_to_tensor

    try:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as im:
            return pil_to_tensor(im.convert("RGB"))
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise CrossViewError(f"{path}: cannot read this image ({type(e).__name__}: {e}); fix or remove "
                             "the file") from None


def decode_images(paths: Sequence[str], device: torch.device,
                  datas: Sequence[torch.Tensor] | None = None) -> tuple[list[torch.Tensor], int]:
    """``(images, n_on_cpu)``: each file as a ``(3, H, W) uint8`` tensor on ``device``. The JPEGs are decoded
    together by ``torchvision.io.decode_jpeg`` on ``device`` (nvJPEG on a GPU, libjpeg-turbo on the CPU); a
    file that is not a JPEG, or that the batch decode refuses, is decoded by Pillow on the CPU and copied over.
    ``n_on_cpu`` counts those. ``datas``: the files' bytes when already read (:func:`read_bytes`)."""
    import warnings

    from torchvision.io import ImageReadMode, decode_jpeg

    datas = [read_bytes(p) for p in paths] if datas is None else list(datas)
    out: list[torch.Tensor | None] = [None] * len(paths)
    jpeg = [k for k, d in enumerate(datas) if is_jpeg(d)]
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
                ratio: tuple[float, float], flip_p: float) -> list[tuple[int, int, int, int, bool]]:
    """``(top, left, height, width, flip)`` of each image of heights x widths ``sizes``, drawn from the global
    RNG in the order the CPU path draws them (crop then flip, image after image)."""
    from torchvision import transforms as T

    out = []
    for h, w in sizes:
        i, j, ch, cw = T.RandomResizedCrop.get_params(torch.empty((1, int(h), int(w)), dtype=torch.uint8),
                                                      list(scale), list(ratio))
        flip = bool(torch.rand(1) < flip_p)
        out.append((int(i), int(j), int(ch), int(cw), flip))
    return out


def augment(images: Sequence[torch.Tensor], params: Sequence[tuple[int, int, int, int, bool]],
            crop: tuple[int, int], mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(n, 3, crop_h, crop_w) float32`` on the images' device: each ``(3, H, W) uint8`` image cropped to
    its ``(top, left, height, width)``, resized (bilinear, antialiased, rounded to ``uint8`` as Pillow does),
    flipped where asked, scaled to [0, 1] and normalised by ``mean`` / ``std``. Runs with autocast off (it is
    data preparation, not the model: float32 whatever the step's precision)."""
    from torchvision.transforms.v2 import functional as F2

    if not images:
        return torch.zeros((0, 3, *crop), dtype=torch.float32)
    dev = images[0].device
    with torch.autocast(dev.type, enabled=False):
        crops = []
        for im, (i, j, h, w, flip) in zip(images, params):
            c = F2.resized_crop(im, i, j, h, w, list(crop), interpolation=F2.InterpolationMode.BILINEAR,
                                antialias=True)
            crops.append(c.flip(-1) if flip else c)
        x = torch.stack(crops).float().div_(255.0)
        m = torch.tensor(mean, dtype=torch.float32).to(dev, non_blocking=True).view(1, -1, 1, 1)
        s = torch.tensor(std, dtype=torch.float32).to(dev, non_blocking=True).view(1, -1, 1, 1)
        return x.sub_(m).div_(s)


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
    scale and ratio ranges, flip probability and normalisation are read from it)."""

    def __init__(self, paths: Sequence[str], transform: Any, device: torch.device,
                 on_cpu_decode: Callable[[int], None] | None = None, decode_ahead: bool | None = None) -> None:
        self.paths = [str(p) for p in paths]
        self.p = train_transform_params(transform)
        self.device = torch.device(device)
        self.n_cpu_decoded = 0
        self.on_cpu_decode = on_cpu_decode
        # decode_ahead: the read-ahead thread decodes too (:meth:`read_ahead`); None: $CROSSVIEW_DECODE_AHEAD=1
        # turns it on (off by default until measured on a GPU: bench/gpu_all.sh's e2e step runs both)
        self.decode_ahead = (os.environ.get(DECODE_AHEAD_ENV, "") == "1") if decode_ahead is None \
            else bool(decode_ahead)
        self._ahead: tuple[tuple[int, ...], Any] | None = None    # (distinct ids, future of their bytes / images)
        self._pool: Any = None
        self._stream: Any = None                                    # the decode thread's CUDA stream

    def read_ahead(self, image_ids: Any) -> None:
        """Start reading the files of a coming batch in a background thread (the host's only work on this path,
        overlapped with the step before it); :meth:`batch` with the same ids then takes the bytes read.

        With :attr:`decode_ahead` the thread decodes them too, on a CUDA stream of its own, so that nvJPEG works
        while the step before runs instead of after it (the stream is drained before each decode, and training
        otherwise waits for that). Why this is safe from nvJPEG's writes ignoring stream order (see
        :func:`_decode_jpegs`): the caching allocator keeps a pool per stream, so the decoder's stream is only
        handed blocks freed on it, i.e. earlier decodes' outputs and the decoder's own buffers; the thread drains
        its stream before each decode (their queued reads are done), and each decoded image is recorded on the
        training stream when handed over (its block is not reused until the training stream's work on it is
        done). Augmentation stays on the training stream, its random crops drawn there as before."""
        from concurrent.futures import ThreadPoolExecutor

        uniq = tuple(int(j) for j in torch.unique(torch.as_tensor(image_ids, dtype=torch.int64)))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="crossview-read")
        if self.decode_ahead:
            if self.device.type == "cuda" and self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)
            self._ahead = (uniq, self._pool.submit(self._read_and_decode, uniq))
        else:
            self._ahead = (uniq, self._pool.submit(lambda: [read_bytes(self.paths[j]) for j in uniq]))

    def _read_and_decode(self, uniq: tuple[int, ...]) -> tuple[list[torch.Tensor], int, Any]:
        """In the read-ahead thread: ``(images, n_on_cpu, event)``, the files of ``uniq`` decoded on the device (on
        :attr:`_stream` on a GPU; ``event`` marks the end of that work there, None on a CPU)."""
        paths = [self.paths[j] for j in uniq]
        datas = [read_bytes(p) for p in paths]
        if self.device.type != "cuda":
            return (*decode_images(paths, self.device, datas), None)
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            images, n_cpu = decode_images(paths, self.device, datas)    # drains this stream first
            done = torch.cuda.Event()
            done.record(self._stream)
        return images, n_cpu, done

    def close(self) -> None:
        """Stop the read-ahead thread (a batch read ahead and never taken is dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._ahead = None, None

    def batch(self, image_ids: Any, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(image_ids, dtype=torch.int64)
        uniq, rows = torch.unique(ids, return_inverse=True)
        key = tuple(int(j) for j in uniq)
        datas, decoded = None, None
        if self._ahead is not None and self._ahead[0] == key:
            got = self._ahead[1].result()        # a file that could not be read raises here, naming it
            if isinstance(got, tuple):
                decoded = got
            else:
                datas = got
        self._ahead = None
        with torch.autocast(self.device.type, enabled=False):
            if decoded is not None:
                images, n_cpu, done = decoded
                if done is not None:             # the training stream waits for the decode, then owns the images
                    stream = torch.cuda.current_stream(self.device)
                    stream.wait_event(done)
                    for im in images:
                        im.record_stream(stream)
            else:
                images, n_cpu = decode_images([self.paths[j] for j in key], self.device, datas)
            if n_cpu:
                self.n_cpu_decoded += n_cpu
                if self.on_cpu_decode is not None:
                    self.on_cpu_decode(n_cpu)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed))
                params = draw_params([tuple(im.shape[-2:]) for im in images], self.p["scale"], self.p["ratio"],
                                     self.p["flip_p"])
            x = augment(images, params, self.p["crop"], self.p["mean"], self.p["std"])
        return x, rows
