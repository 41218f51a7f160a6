"""Top-k inner-product search over large galleries: exact (chunked) and FAISS backends.

``build_index(gallery, backend)`` picks a backend by name (:data:`BACKENDS`); every backend is an
:class:`Index` whose ``search(queries, k)`` returns a :class:`TopKResult`. Results follow the tie
rule of :mod:`crossview.eval.metrics` (descending score, then ascending index), and ``k`` larger
than the gallery is clipped to its size. Neither torch nor faiss is imported until a backend that
needs it is used.
"""

from __future__ import annotations

from typing import Any

from crossview.core.errors import CrossViewError
from crossview.index.base import Index, TopKResult
from crossview.index.exact import ExactIndex
from crossview.index.faiss_index import FAISS_KINDS, FaissIndex

__all__ = ["BACKENDS", "Index", "TopKResult", "ExactIndex", "FaissIndex", "FAISS_KINDS",
           "build_index", "list_backends"]

BACKENDS: dict[str, str] = {
    "exact": "exhaustive float32 search, chunked (numpy BLAS on CPU, torch on CUDA)",
    "exact-fp16": "exhaustive search over float16 storage (half the memory), float32 scores",
    "faiss-flat": "FAISS IndexFlatIP (exact)",
    "faiss-ivf": "FAISS IndexIVFFlat, inner product (approximate; nlist, nprobe)",
    "faiss-sq8": "FAISS 8-bit scalar quantizer, sharded, exact re-scoring (approximate)",
    "faiss-sqfp16": "FAISS float16 scalar quantizer, sharded, exact re-scoring (approximate)",
    "faiss-pq4": "FAISS 4-bit product quantizer, fast-scan, sharded, exact re-scoring (approximate)",
}


def list_backends() -> list[str]:
    """Names accepted by :func:`build_index`."""
    return list(BACKENDS)


def build_index(gallery: Any = None, backend: str = "exact", **kwargs: Any) -> Index:
    """An index over ``gallery (n, d)`` with the named ``backend``; ``kwargs`` go to its constructor.

    Raises :class:`CrossViewError` naming the known backends when ``backend`` is unknown.
    """
    if backend == "exact":
        return ExactIndex(gallery, **kwargs)
    if backend == "exact-fp16":
        return ExactIndex(gallery, dtype="float16", **kwargs)
    if backend.startswith("faiss-") and backend[len("faiss-"):] in FAISS_KINDS:
        return FaissIndex(gallery, kind=backend[len("faiss-"):], **kwargs)
    raise CrossViewError(f"unknown index backend {backend!r}; known backends: {', '.join(BACKENDS)}")
