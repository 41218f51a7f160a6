"""Exact top-k by inner product over large galleries, streamed in chunks.

How it works
------------
The gallery is scored chunk by chunk (``chunk_rows`` rows at a time) and a running top-k is kept
per query. After the first chunk every query has a threshold (its current k-th best score); a later
chunk contributes only the items scoring *strictly* above it -- later items have larger indices and
so lose ties -- found with one comparison pass, and only those few candidates are merged
(:func:`crossview.index.base.merge_topk`, exact under the tie rule). Selection therefore costs a
small fraction of the matrix product, which for one query is a memory-bound matrix-vector product:
the search runs close to the speed of a bare ``gallery @ query``.

Kernels. On the CPU the products go through numpy's BLAS (OpenBLAS in the numpy wheels): on the
AMD EPYC development machine it was 1.3-3x faster than torch's CPU BLAS (MKL, which takes slow
paths on AMD) for both matrix-vector and matrix-matrix products. On CUDA (``device="cuda"``, or
``engine="torch"`` on the CPU) the chunks are torch tensors: the gallery is uploaded once when it
fits in GPU memory, otherwise streamed; top-k uses ``torch.topk`` on 64-bit keys that encode
(score, -index), so it follows the same tie rule.

Storage. ``dtype="float32"`` keeps a float32 gallery as given (a reference, no copy; a
``np.load(..., mmap_mode="r")`` memmap is streamed from disk and never loaded whole).
``dtype="float16"`` stores half-precision values (half the memory; a float16 memmap is streamed as
is) and converts each block to float32 before the product, so scores are accumulated in float32;
the result is exact for the float16-rounded gallery but not for the original, hence
``exact=False``. On the CPU that conversion makes float16 search somewhat slower than float32; it
is a memory option. For faster reduced-precision search see ``FaissIndex(kind="sq8")``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.io import open_npy
from crossview.index.base import Index, TopKResult, merge_topk

__all__ = ["ExactIndex"]

_DTYPES = {"float32": np.float32, "float16": np.float16}
_SCORE_ELEMENTS = 1 << 22      # (m x chunk) score block: 16 MB of float32
_SINGLE_QUERY_ROWS = 1 << 20   # rows per chunk for one query (400 MB of float32 at d=100)
_FIRST_ROWS = 1 << 14          # a small first chunk makes the initial partition cheap
_GPU_SCORE_ELEMENTS = 1 << 27  # (m x chunk) score block on a GPU: 512 MB of float32
_HALF_BLOCK_ROWS = 1 << 14     # float16 -> float32 conversion block (fits in L2/L3)


class ExactIndex(Index):
    """Exhaustive inner-product search with chunked products and a running top-k.

    ``gallery (n, d)`` (array, memmap or torch tensor; optional, see :meth:`add`), ``dtype``
    ``"float32"`` or ``"float16"`` storage, ``device`` ``"cpu"``, ``"cuda[:i]"`` or ``"auto"``,
    ``chunk_rows`` gallery rows per product (default: chosen from the number of queries),
    ``engine`` ``"auto"`` (numpy BLAS on the CPU, torch on CUDA) or ``"torch"`` (torch kernels on
    any device).
    """

    def __init__(self, gallery: Any = None, *, dtype: str = "float32", device: str = "cpu",
                 chunk_rows: int | None = None, engine: str = "auto") -> None:
        super().__init__()
        if dtype not in _DTYPES:
            raise CrossViewError(f"unknown storage dtype {dtype!r}; choose one of {sorted(_DTYPES)}")
        if engine not in ("auto", "torch"):
            raise CrossViewError(f"unknown engine {engine!r}; choose 'auto' or 'torch'")
        if chunk_rows is not None and chunk_rows < 1:
            raise CrossViewError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.dtype = dtype
        self.chunk_rows = chunk_rows
        self.device = _resolve_device(device)
        self.engine = "torch" if (engine == "torch" or self.device != "cpu") else "numpy"
        self.backend = "exact" if dtype == "float32" else "exact-fp16"
        self._segments: list[tuple[int, Any]] = []     # (first global id, (rows, d) array)
        self._device_cache: dict[int, Any] = {}
        self._device_norms: dict[int, Any] = {}
        if gallery is not None:
            self.add(gallery)

    @classmethod
    def from_npy(cls, path: str | Path, **kwargs: Any) -> ExactIndex:
        """An index over a ``.npy`` file opened as a read-only memmap (streamed, never loaded)."""
        return cls(open_npy(path, todo="save the gallery with numpy.save as an (n, d) array"), **kwargs)

    # ------------------------------------------------------------------ building
    def add(self, gallery: Any) -> None:
        """Append ``gallery (n, d)`` rows (ids continue after the existing rows).

        Arrays already in the storage dtype and C order are referenced, not copied; others are
        converted chunk by chunk into a new array of the storage dtype.
        """
        g = self._check_gallery(gallery)
        if g.shape[0] == 0:
            if self._dim is None:
                self._dim = int(g.shape[1])
            return
        target = _DTYPES[self.dtype]
        if g.dtype != target or not g.flags.c_contiguous:
            converted = np.empty(g.shape, dtype=target)
            step = max(1, (1 << 24) // max(1, g.shape[1]))
            for a in range(0, g.shape[0], step):
                converted[a:a + step] = g[a:a + step]
            g = converted
        self._segments.append((self._size, g))
        self._size += int(g.shape[0])
        self._dim = int(g.shape[1])
        self._device_cache.clear()
        self._device_norms.clear()

    # ------------------------------------------------------------------ search
    def search(self, queries: Any, k: int) -> TopKResult:
        """Top-``k`` gallery rows for ``queries (m, d)`` or ``(d,)``.

        Returns :class:`TopKResult` with ``(m, min(k, size))`` indices and float32 scores, best
        first (ties: smaller index first).
        """
        q, k = self._check_search(queries, k)
        if self.engine == "numpy":
            best_s, best_i = self._search_numpy(q, k)
        else:
            best_s, best_i = self._search_torch(q, k)
        return TopKResult(indices=best_i, scores=best_s, exact=self.dtype == "float32",
                          backend=self.backend)

    def _chunks(self, n_queries: int) -> Iterator[tuple[int, int, int]]:
        """(segment number, start, stop) row ranges; the very first chunk is small."""
        if self.chunk_rows is not None:
            size = first = self.chunk_rows
        else:
            size = _SINGLE_QUERY_ROWS if n_queries == 1 else max(4096, _SCORE_ELEMENTS // n_queries)
            first = min(size, _FIRST_ROWS)
        for seg, (_, g) in enumerate(self._segments):
            a = 0
            while a < g.shape[0]:
                b = min(g.shape[0], a + first)
                first = size
                yield seg, a, b
                a = b

    def _search_numpy(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        m = q.shape[0]
        best_s = np.full((m, k), -np.inf, dtype=np.float32)
        best_i = np.full((m, k), -1, dtype=np.int64)
        half = self.dtype == "float16"
        scratch = _HalfScratch(self._dim or 0, m) if half else None
        limit = _blas_single_thread() if (half and scratch.numpy_product) else nullcontext()
        out1 = mask_buf = None
        if m == 1:   # reused buffers: no fresh pages to fault in per chunk
            rows_max = min(self._size, self.chunk_rows or _SINGLE_QUERY_ROWS)
            out1 = np.empty(rows_max, dtype=np.float32)
            mask_buf = np.empty(rows_max, dtype=bool)
        with limit:
            for seg, a, b in self._chunks(m):
                offset, g = self._segments[seg]
                block = g[a:b]
                if half:
                    s = scratch.scores(block, q)
                elif m == 1:
                    s = np.dot(block, q[0], out=out1[:b - a])[None, :]
                else:
                    s = np.asarray(q @ block.T)
                best_s, best_i = _update(best_s, best_i, s, offset + a, k, mask_buf)
        return best_s, best_i

    def _search_torch(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import torch

        dev = torch.device(self.device)
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")       # no TF32: exact float32 products
        try:
            keys = self._torch_keys_topk(torch, dev, q, k)
        finally:
            torch.set_float32_matmul_precision(previous)
        best_s, best_i = _torch_decode(torch, keys)
        return best_s.cpu().numpy(), best_i.cpu().numpy()

    def _torch_keys_topk(self, torch: Any, dev: Any, q: np.ndarray, k: int) -> Any:
        tq = torch.from_numpy(q).to(dev)
        m = q.shape[0]
        keys = None
        resident = self._resident_on_device(torch, dev)
        chunks = self._gpu_chunks(m) if resident is not None else self._chunks(m)
        for seg, a, b in chunks:
            offset, g = self._segments[seg]
            if resident is not None:
                tb = resident[seg][a:b]
            else:
                with warnings.catch_warnings():      # read-only memmaps: we never write to them
                    warnings.simplefilter("ignore", UserWarning)
                    tb = torch.from_numpy(np.ascontiguousarray(g[a:b])).to(dev, non_blocking=True)
            ck = None
            if dev.type == "cuda":
                gnorm = self._device_norms.get(seg) if resident is not None else None
                ck = _candidate_keys(torch, tq, tb, offset + a, k, gnorm)
            if ck is None:       # CPU torch engine, or too many ties at the k-th score: all keys
                tbf = tb if tb.dtype == torch.float32 else tb.float()
                s = tq @ tbf.T                                     # (m, c) float32
                ids = torch.arange(offset + a, offset + b, device=dev, dtype=torch.int64)
                ck = _torch_keys(torch, s, ids)
                ck = torch.topk(ck, min(k, ck.shape[1]), dim=1).values
            keys = ck if keys is None else torch.topk(torch.cat([keys, ck], 1),
                                                      min(k, keys.shape[1] + ck.shape[1]), 1).values
        return keys

    def _gpu_chunks(self, n_queries: int) -> Iterator[tuple[int, int, int]]:
        """Large chunks for a device-resident gallery: few kernel launches, scores <= 512 MB."""
        size = self.chunk_rows or max(4096, _GPU_SCORE_ELEMENTS // max(1, n_queries))
        for seg, (_, g) in enumerate(self._segments):
            for a in range(0, g.shape[0], size):
                yield seg, a, min(g.shape[0], a + size)

    def _resident_on_device(self, torch: Any, dev: Any) -> list[Any] | None:
        """Gallery segments as device tensors when on a GPU with room for them, else ``None``."""
        if dev.type != "cuda":
            return None
        if self._device_cache:
            return [self._device_cache[i] for i in range(len(self._segments))]
        nbytes = sum(g.nbytes for _, g in self._segments)
        free, _ = torch.cuda.mem_get_info(dev)
        if nbytes > 0.6 * free:
            return None
        for i, (_, g) in enumerate(self._segments):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                self._device_cache[i] = torch.from_numpy(np.ascontiguousarray(g)).to(dev)
                if self._device_cache[i].dtype == torch.float16:
                    self._device_norms[i] = torch.linalg.vector_norm(
                        self._device_cache[i], dim=1, dtype=torch.float32).max()
        return [self._device_cache[i] for i in range(len(self._segments))]


def _update(best_s: np.ndarray, best_i: np.ndarray, s: np.ndarray, offset: int, k: int,
            mask_buf: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Merge the scores ``s (m, c)`` of gallery rows ``offset..offset+c`` into the running top-k.

    ``mask_buf`` is an optional reusable ``(>= m * c,) bool`` scratch buffer.
    """
    m, c = s.shape
    full = best_i[:, k - 1] >= 0
    if full.all():
        # Later rows have larger ids, so they lose ties: only strictly better scores can enter.
        # (flatnonzero + divmod is ~10x faster than a 2-D np.nonzero)
        if mask_buf is not None and mask_buf.size >= m * c:
            mask = np.greater(s, best_s[:, k - 1][:, None], out=mask_buf[:m * c].reshape(m, c))
        else:
            mask = s > best_s[:, k - 1][:, None]
        rows, cols = np.divmod(np.flatnonzero(mask), c)
        if rows.size == 0:
            return best_s, best_i
        if m == 1 and cols.size > 8 * k:
            # many candidates (early chunks): keep only their own top-k, ties at the k-th included
            vals = s[0, cols]
            kth = np.partition(vals, vals.size - k)[vals.size - k]
            cols = cols[vals >= kth]
            rows = np.zeros(cols.size, dtype=cols.dtype)
    else:
        # Rows still filling up: candidates are this chunk's own top-k (with all ties at its k-th).
        kk = min(k, c)
        kth = np.partition(s, c - kk, axis=1)[:, c - kk]
        thr = np.where(full, best_s[:, k - 1], kth)[:, None]
        mask = np.where(full[:, None], s > thr, s >= thr)
        rows, cols = np.divmod(np.flatnonzero(mask), c)
    have_r, have_c = np.nonzero(best_i >= 0)
    all_rows = np.concatenate([have_r, rows])
    all_ids = np.concatenate([best_i[have_r, have_c], offset + cols.astype(np.int64)])
    all_s = np.concatenate([best_s[have_r, have_c], s[rows, cols].astype(np.float32)])
    return merge_topk(all_s, all_ids, all_rows, m, k)


class _HalfScratch:
    """Converts float16 blocks to float32 in cache-sized pieces and scores them.

    torch converts half -> float with SIMD, about 20x faster than numpy's ``astype`` here. For a
    few queries the product is a numpy BLAS call (limited to one thread, see
    :func:`_blas_single_thread`); for many queries it is a torch product, so the two libraries'
    thread pools never alternate.
    """

    def __init__(self, d: int, n_queries: int) -> None:
        self.buf = np.empty((_HALF_BLOCK_ROWS, d), dtype=np.float32)
        try:
            import torch
        except ImportError:   # pragma: no cover - torch is a dependency
            self.torch = None
            self.numpy_product = True
        else:
            self.torch = torch
            self.tbuf = torch.from_numpy(self.buf)
            self.numpy_product = n_queries <= 8

    def scores(self, block: np.ndarray, q: np.ndarray) -> np.ndarray:
        """``block (c, d) float16``, ``q (m, d) float32`` -> ``(m, c) float32``."""
        n = block.shape[0]
        out = np.empty((q.shape[0], n), dtype=np.float32)
        torch = self.torch
        tq = tout = None
        if torch is not None and not self.numpy_product:
            tq, tout = torch.from_numpy(q), torch.from_numpy(out)
        for a in range(0, n, _HALF_BLOCK_ROWS):
            b = min(n, a + _HALF_BLOCK_ROWS)
            buf = self.buf[:b - a]
            if torch is not None:
                with warnings.catch_warnings():   # read-only memmaps: only read
                    warnings.simplefilter("ignore", UserWarning)
                    self.tbuf[:b - a].copy_(torch.from_numpy(np.ascontiguousarray(block[a:b])))
            else:
                np.copyto(buf, block[a:b])
            if tq is not None:
                torch.matmul(tq, self.tbuf[:b - a].T, out=tout[:, a:b])
            elif q.shape[0] == 1:
                np.dot(buf, q[0], out=out[0, a:b])
            else:
                out[:, a:b] = q @ buf.T
        return out


def _blas_single_thread() -> Any:
    """Limit numpy's BLAS to one thread while torch converts blocks.

    Alternating torch (OpenMP) and OpenBLAS calls on few cores makes each library's spinning
    threads starve the other (measured: up to 30x slower); one BLAS thread avoids it.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - comes with scikit-learn
        return nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _torch_keys(torch: Any, s: Any, ids: Any) -> Any:
    """int64 keys ordered like (score desc, id asc); see :func:`crossview.index.base.order_keys`."""
    b = (s + 0.0).contiguous().view(torch.int32).to(torch.int64)
    b = b ^ ((b >> 31) & 0x7FFFFFFF)
    return (b << 32) | (0xFFFFFFFF - ids)[None, :]


def _candidate_keys(torch: Any, tq: Any, tb: Any, offset: int, k: int, gnorm: Any = None) -> Any | None:
    """Top-``k`` keys of one chunk from a ``torch.topk`` over scores, exact under the tie rule.

    ``torch.topk`` breaks ties arbitrarily, so it takes ``k + pad`` candidates; when the k-th best
    score is strictly above the last candidate's, every item tied with the k-th is a candidate and
    ordering the candidates by (score, -index) keys is exact. For float16 storage the product runs
    in half precision (fp32 accumulation, half output) and the candidates are re-scored in float32;
    exactness then needs the k-th re-scored value above the last candidate's half score plus the
    half rounding bounds (of the output, and of the query rounded to half: at most
    ``u * ||x|| * ||q||`` by Cauchy-Schwarz, ``gnorm`` being the largest gallery row norm). Returns ``None`` (caller falls back to keys over the whole chunk) when the
    condition fails, e.g. many equal scores.
    """
    c = tb.shape[0]
    half = tb.dtype == torch.float16
    pad = max(32, 4 * k) if half else 32
    kk, kp = min(k, c), min(c, k + pad)
    if half:
        prev = torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        try:                                                       # (m, c) float16, fp32 accumulation
            s = torch.mv(tb, tq[0].half())[None] if tq.shape[0] == 1 else tq.half() @ tb.T
        finally:
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = prev
    else:
        s = torch.mv(tb, tq[0])[None] if tq.shape[0] == 1 else tq @ tb.T   # GEMV for one query
    vals, idx = torch.topk(s, kp, dim=1, sorted=True)
    if half:
        cand = tb[idx.reshape(-1)].float().reshape(idx.shape[0], kp, -1)
        exact_vals = torch.einsum("mkd,md->mk", cand, tq)
        if kp < c:
            # items outside the candidates score at most last_half * (1 + u) + tiny in float32
            if gnorm is None:
                gnorm = torch.linalg.vector_norm(tb, dim=1, dtype=torch.float32).max()
            u = 2.0 ** -10                                        # twice half's unit roundoff
            bound = (vals[:, -1].float() + u * vals.float().abs().amax(1)
                     + u * gnorm * torch.linalg.vector_norm(tq, dim=1) + 1e-30)
            kth = torch.topk(exact_vals, kk, dim=1).values[:, -1]
            # (an overflow to inf in half makes the bound inf or NaN: the check fails and we fall back)
            if not bool((kth > bound).all()):
                return None
        vals = exact_vals
    elif kp < c and not bool((vals[:, kk - 1] > vals[:, kp - 1]).all()):
        return None
    keys = _torch_keys_2d(torch, vals.float(), idx + offset)
    return torch.topk(keys, kk, dim=1).values


def _torch_keys_2d(torch: Any, s: Any, ids: Any) -> Any:
    """Like :func:`_torch_keys` with per-row ids ``(m, c)``."""
    b = (s + 0.0).contiguous().view(torch.int32).to(torch.int64)
    b = b ^ ((b >> 31) & 0x7FFFFFFF)
    return (b << 32) | (0xFFFFFFFF - ids)


def _torch_decode(torch: Any, keys: Any) -> tuple[Any, Any]:
    ids = 0xFFFFFFFF - (keys & 0xFFFFFFFF)
    b = keys >> 32
    b = b ^ ((b >> 31) & 0x7FFFFFFF)
    scores = b.to(torch.int32).view(torch.float32)
    return scores, ids


def _resolve_device(device: str) -> str:
    if device == "cpu":
        return "cpu"
    if device == "auto" or device.startswith("cuda"):
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is a dependency
            if device == "auto":
                return "cpu"
            raise CrossViewError(f"device {device!r} needs torch with CUDA, and torch is not installed")
        if torch.cuda.is_available():
            return "cuda" if device == "auto" else device
        if device == "auto":
            return "cpu"
        raise CrossViewError(f"device {device!r} was asked for, but torch sees no CUDA GPU; use device='cpu' or 'auto'")
    raise CrossViewError(f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'auto'")
