"""Row norms that :mod:`crossview.explain` can hold fixed: one switch for every L2 normalisation on the way
from an image feature (or a caption feature) to its embedding.

Most methods normalise rows somewhere (feature normalisation, CCA's unit rows, VSE++'s ``l2norm``, BITR's
``normalize``). Each such step divides a row by a scalar computed from that row. An explanation splits one
pooled row into parts (the spatial positions of a CNN map, the words of a caption) and sends the parts
through the same pipeline; for the parts to add up to the whole, each division must use the *whole* row's
scalar, not the part's own. Inside :func:`frozen_row_norms` every normalisation that calls :func:`row_norms`
does exactly that: it divides every row of the batch by the norm of the batch's **first** row (the
explainer puts the whole row first). With the scalars held, the pipeline is affine wherever the rest of it
is (projections, centring, whitening, FC layers, BatchNorm in eval mode), so the parts' scores sum to the
whole's score exactly; the explainer checks this numerically and says when it does not hold (a ReLU).

The signed square root of :mod:`crossview.features.normalize` is held the same way, channel by channel:
``sign(x) sqrt|x| = x / sqrt|x|``, and inside the block the divisor is the first row's ``sqrt|x|``, so the
average of the parts' outputs is the whole's output exactly.

``frozen_row_norms(group=k)`` holds the scales of several wholes in one batch: the rows come in consecutive
blocks of ``k`` (a whole, then its parts) and each row is divided by its own block's first row's scalar, so
the explainer sends the region maps of many images through the pipeline in one pass (every step after the
scales is per row). A method that splits a batch internally must cut it at a multiple of ``k`` (the explainer
keeps each batch within the smallest such chunk, see :mod:`crossview.explain.maps`).

Outside the context nothing changes: each row uses its own norm. The switch is per thread, so a training
run in another thread is never affected.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["frozen_row_norms", "row_norms", "norms_frozen", "first_rows"]

_state = threading.local()


@contextmanager
def frozen_row_norms(group: int | None = None) -> Iterator[None]:
    """Within the block (this thread only), :func:`row_norms` returns the first row's norm for every row, or
    with ``group=k`` the first row's of each consecutive block of ``k`` rows."""
    if group is not None and int(group) < 1:
        raise ValueError(f"group must be at least 1, got {group}")
    depth, old = getattr(_state, "depth", 0), getattr(_state, "group", None)
    _state.depth, _state.group = depth + 1, (None if group is None else int(group))
    try:
        yield
    finally:
        _state.depth, _state.group = depth, old


def norms_frozen() -> bool:
    """Whether this thread is inside :func:`frozen_row_norms`."""
    return getattr(_state, "depth", 0) > 0


def first_rows(x: Any) -> Any:
    """For each row of ``x`` (a numpy array or torch tensor, ``(n, ...)``), the first row of its block: row 0
    for every row, or with :func:`frozen_row_norms`'s ``group=k`` row ``k * (i // k)`` for row ``i``."""
    group = getattr(_state, "group", None)
    if len(x) == 0:
        return x
    if group is None or group >= len(x):
        first = x[:1]
        if hasattr(first, "expand_as"):      # torch
            return first.expand_as(x)
        import numpy as np

        return np.broadcast_to(first, x.shape).copy()
    if hasattr(x, "expand_as"):              # torch
        import torch

        idx = torch.div(torch.arange(len(x), device=x.device), group, rounding_mode="floor") * group
        return x[idx]
    import numpy as np

    return x[(np.arange(len(x)) // group) * group]


def row_norms(norms: Any) -> Any:
    """``norms`` (an ``(n, 1)`` numpy array or torch tensor of per-row norms or sums), or, inside
    :func:`frozen_row_norms`, the first row's value for every row (with ``group=k``: the first row's of each
    block of ``k``), same shape and type."""
    if not norms_frozen() or len(norms) == 0:
        return norms
    return first_rows(norms)
