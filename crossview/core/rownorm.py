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

Outside the context nothing changes: each row uses its own norm. The switch is per thread, so a training
run in another thread is never affected.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["frozen_row_norms", "row_norms", "norms_frozen"]

_state = threading.local()


@contextmanager
def frozen_row_norms() -> Iterator[None]:
    """Within the block (this thread only), :func:`row_norms` returns the first row's norm for every row."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth


def norms_frozen() -> bool:
    """Whether this thread is inside :func:`frozen_row_norms`."""
    return getattr(_state, "depth", 0) > 0


def row_norms(norms: Any) -> Any:
    """``norms`` (an ``(n, 1)`` numpy array or torch tensor of per-row norms or sums), or, inside
    :func:`frozen_row_norms`, the first row's value for every row (same shape and type)."""
    if not norms_frozen() or len(norms) == 0:
        return norms
    first = norms[:1]
    if hasattr(first, "expand_as"):          # torch
        return first.expand_as(norms)
    import numpy as np

    return np.broadcast_to(first, norms.shape).copy()
