"""One structural hasher for cache keys: nested dicts, lists, arrays, tensors and plain values fed into a
``hashlib`` object canonically (dict keys sorted, arrays by dtype, shape and bytes), so equal content gives an
equal key whatever the container order of a dict. Used by the text encoders' fitted-state keys and the photo
store's representation identity."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["hash_into"]


def hash_into(h: Any, obj: Any) -> None:
    """Feed ``obj`` into hash ``h`` (anything with ``update(bytes)``). Scalars go in as their JSON text (a value
    JSON cannot write, as its ``repr``); a torch tensor as its array."""
    if hasattr(obj, "detach") and hasattr(obj, "cpu") and not isinstance(obj, np.ndarray):   # a torch tensor
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        h.update(f"nd{obj.dtype.str}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for k in sorted(obj, key=str):
            h.update(str(k).encode() + b":")
            hash_into(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for x in obj:
            hash_into(h, x)
            h.update(b",")
        h.update(b"]")
    else:
        if isinstance(obj, np.generic):
            obj = obj.item()
        h.update(json.dumps(obj, default=repr).encode("utf-8", "surrogateescape"))
