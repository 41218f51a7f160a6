"""One structural hasher for cache keys: nested dicts, lists, arrays, tensors and plain values fed into a
``hashlib`` object canonically (dict keys sorted, arrays by dtype, shape and bytes), so equal content gives an
equal key whatever the container order of a dict. Used by the text encoders' fitted-state keys and the photo
store's representation identity."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["hash_into", "utf8_bytes", "repair_text"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8_bytes(text: str) -> bytes:
    """``text`` as UTF-8 for a hash or a key, whatever it holds: bytes a file name could not decode (the
    ``surrogateescape`` code points) go back to those bytes, as before; any other lone UTF-16 surrogate (a broken
    ``"\\ud83d"`` in a JSON file), which strict UTF-8 refuses, is written with ``surrogatepass``."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def repair_text(text: str) -> tuple[str, int]:
    """``(text, n)``: ``text`` with each lone UTF-16 surrogate replaced by U+FFFD (a valid high + low pair
    becomes the character it encodes), and how many were replaced. Tokenizers, encoders and files need valid
    Unicode; a caption holding half an emoji is otherwise unchanged."""
    if not _SURROGATE.search(text):
        return text, 0
    fixed = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return fixed, fixed.count("\ufffd") - text.count("\ufffd")


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
        h.update(utf8_bytes(json.dumps(obj, default=repr)))
