"""The grid of the SVM-style regularisation constant ``C`` that BITR and the one-vs-rest SVMs cross-validate
(parameter ``c_grid``), parsed once for both. Imports neither torch nor scikit-learn."""

from __future__ import annotations

import math
from typing import Any

from crossview.core.errors import CrossViewError

__all__ = ["PAPER_C_GRID", "c_grid_values"]

#: the BITR paper's grid for C (five-fold cross-validation over 10^-5 ... 10^5)
PAPER_C_GRID: tuple[float, ...] = tuple(10.0 ** k for k in range(-5, 6))


def c_grid_values(value: Any, who: str) -> tuple[float, ...]:
    """``c_grid`` as a sorted tuple of positive floats: ``None`` / ``""`` / ``"none"`` / empty = no
    cross-validation, ``"paper"`` (or ``"default"`` / ``"cv"``) = :data:`PAPER_C_GRID`, ``"LOW:HIGH"`` = every
    power of ten in between, or numbers (a sequence, or a string separated by commas / spaces). ``who`` names
    the method in the one-line errors."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return ()
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "none"):
            return ()
        if text in ("paper", "default", "cv"):
            return PAPER_C_GRID
        if ":" in text:
            lo_s, hi_s = text.split(":", 1)
            try:
                lo, hi = float(lo_s), float(hi_s)
            except ValueError:
                lo = hi = float("nan")
            if not (lo > 0 and hi >= lo and math.isfinite(hi)):
                raise CrossViewError(f"{who}: c_grid range {value!r} must be 'LOW:HIGH' with 0 < LOW <= HIGH, "
                                     "e.g. '1e-5:1e5'")
            a, b = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
            if a > b:
                raise CrossViewError(f"{who}: c_grid range {value!r} holds no power of ten; widen it or list values")
            return tuple(10.0 ** k for k in range(a, b + 1))
        items: list[Any] = [t for t in text.replace(",", " ").split() if t]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        items = [value]
    else:
        items = list(value)
    out = []
    for v in items:
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = float("nan")
        if not (math.isfinite(f) and f > 0):
            raise CrossViewError(f"{who}: c_grid {value!r} must be 'paper', a range 'LOW:HIGH' or positive numbers "
                                 f"(e.g. 1e-5,1e-3,1e-1,10,1e3): c_grid value {v!r} is not one")
        out.append(f)
    return tuple(sorted(set(out)))
