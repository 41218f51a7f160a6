"""Device selection: ``auto | cpu | cuda | cuda:N | mps``.

Everything runs on the CPU; a GPU makes the deep methods faster. :func:`select_device` turns the
user's spelling into a canonical, available device name (or a :class:`CrossViewError` saying what is
there instead); :func:`list_devices` is what the GUI's device menu shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from crossview.core.errors import CrossViewError

__all__ = ["DeviceInfo", "select_device", "torch_device", "list_devices", "DEVICE_CHOICES"]

#: The spellings accepted on the command line (``cuda:N`` for any N).
DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N", "mps")

_PATTERN = re.compile(r"^(auto|cpu|mps|cuda)(?::(\d+))?$")


@dataclass(frozen=True)
class DeviceInfo:
    """One device: ``name`` (``"cpu"``, ``"cuda:0"``, ``"mps"``) and a human ``description``."""

    name: str
    description: str


def _cuda_count() -> int:
    import torch
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver means "no CUDA" to the user
        return 0


def _mps_available() -> bool:
    import torch
    backend = getattr(torch.backends, "mps", None)
    try:
        return bool(backend is not None and backend.is_available())
    except Exception:  # noqa: BLE001
        return False


def list_devices() -> list[DeviceInfo]:
    """The devices available now: the CPU first, then each CUDA GPU, then Apple's MPS."""
    import os

    import torch

    out = [DeviceInfo("cpu", f"CPU ({os.cpu_count() or 1} cores, {torch.get_num_threads()} torch threads)")]
    for i in range(_cuda_count()):
        try:
            props = torch.cuda.get_device_properties(i)
            desc = f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
        except Exception:  # noqa: BLE001
            desc = "CUDA GPU"
        out.append(DeviceInfo(f"cuda:{i}", desc))
    if _mps_available():
        out.append(DeviceInfo("mps", "Apple GPU (Metal)"))
    return out


def select_device(spec: str | None = "auto") -> str:
    """The canonical name of the device ``spec`` asks for, checked to be available.

    ``auto`` -> ``cuda:0`` if a CUDA GPU is there, else ``mps`` if available, else ``cpu``;
    ``cuda`` -> ``cuda:0``. An unknown spelling or an unavailable device raises
    :class:`CrossViewError` naming the value and the devices that are available.
    """
    text = "auto" if spec is None else str(spec).strip().lower()
    m = _PATTERN.match(text)
    if not m or (m.group(2) is not None and m.group(1) != "cuda"):
        raise CrossViewError(f"unknown device {spec!r}; use one of: auto, cpu, cuda, cuda:N (N = GPU index), mps")
    kind, index = m.group(1), m.group(2)
    if kind == "cpu":
        return "cpu"
    available = ", ".join(d.name for d in list_devices())
    if kind == "auto":
        if _cuda_count() > 0:
            return "cuda:0"
        return "mps" if _mps_available() else "cpu"
    if kind == "mps":
        if not _mps_available():
            raise CrossViewError(f"device 'mps' is not available on this machine (it needs an Apple GPU and "
                                 f"a torch build with MPS); available: {available}; use --device auto or cpu")
        return "mps"
    n = _cuda_count()
    if n == 0:
        raise CrossViewError(f"device {spec!r} is not available: torch sees no CUDA GPU on this machine "
                             f"(available: {available}); use --device auto or cpu")
    i = int(index or 0)
    if i >= n:
        raise CrossViewError(f"device {spec!r} is not available: there {'is' if n == 1 else 'are'} only {n} "
                             f"CUDA GPU{'s' if n != 1 else ''} (cuda:0 .. cuda:{n - 1}); available: {available}")
    return f"cuda:{i}"


def torch_device(spec: Any = "auto") -> Any:
    """:func:`select_device` as a ``torch.device`` (a ``torch.device`` or ``None`` is accepted too):
    the one place where every layer turns a device spelling into a device."""
    import torch

    return torch.device(select_device(None if spec is None else str(spec)))
