"""FAISS backends (``faiss-cpu``): exact flat, IVF, and 8-bit / float16 scalar quantizers.

Kinds
-----
- ``"flat"``: ``IndexFlatIP``, exact inner products (``exact=True``). Its results are re-sorted with
  the tie rule; which of several items tied at the k-th place FAISS keeps is FAISS's choice.
- ``"ivf"``: ``IndexIVFFlat`` with inner product; ``nlist`` lists (default ``4 * sqrt(n)``, capped
  so that every list gets >= 39 training points) trained by k-means on a seeded sample of
  ``train_size`` rows; ``nprobe`` lists are visited per query. Approximate.
- ``"sq8"``: ``IndexScalarQuantizer`` with 8-bit codes (``QT_8bit_direct_signed``) and a
  per-dimension scale ``127 / max|x_j|`` taken from the first gallery block (later rows beyond that
  range are clipped); the scale is folded into the query, so a score is ``sum_j code_ij *
  q_j / scale_j``. One byte per value: a quarter of the memory traffic of float32. Approximate.
- ``"sqfp16"``: ``IndexScalarQuantizer`` with float16 codes. Approximate.
- ``"pq4"``: ``IndexPQFastScan``, product quantization with one 4-bit code per pair of dimensions
  (``d/2`` sub-quantizers, codebooks trained on the sample; 2 bits per value, 1/16 of float32),
  scored with FAISS's SIMD look-up-table kernel. Approximate; the fastest reduced-precision
  option on a CPU, and with the default ``rerank=16`` its recall@k is close to 1 on embedding-like
  data.

Two things make the quantized kinds fast for a single query on a CPU: vectors are zero-padded (to
a multiple of 8 dimensions for the scalar quantizers, whose SIMD kernels need ``d % 8 == 0``; at
d=100 the scalar fallback is ~5x slower), and the gallery is split into ``shards`` (default: one per
thread) searched in parallel threads, because FAISS parallelises over queries, not over the
gallery. With ``rerank`` (default 4 for sq8/sqfp16, 16 for pq4) the ``k * rerank`` best candidates
are re-scored exactly in float32 from the original gallery (kept by reference; a memmap is read
row by row), so the returned scores are exact and recall@k is close to 1.

Measured on a 2-core AMD EPYC (bench/topk_scale.py, one query, 10^7 x 100): the 8-bit and float16
scalar quantizers are compute-bound at roughly 0.5-0.7x the float32 time, while pq4 reads 25 bytes
per vector through a shuffle-based kernel and takes a small fraction of it.

Approximate kinds report ``exact=False``; where they find fewer than ``k`` items (IVF with few
probes) the missing places hold index ``-1`` and score ``-inf``.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.index.base import Index, TopKResult, merge_topk

__all__ = ["FaissIndex", "FAISS_KINDS"]

FAISS_KINDS = ("flat", "ivf", "sq8", "sqfp16", "pq4")
_ADD_ROWS = 1 << 18


def _import_faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - faiss-cpu is a dependency
        raise CrossViewError("the FAISS backends need faiss: pip install faiss-cpu") from exc
    return faiss


class _IdRuns:
    """Maps a shard's local row numbers to global ids (contiguous runs, no per-row array)."""

    def __init__(self) -> None:
        self.local: list[int] = []
        self.glob: list[int] = []
        self.count = 0

    def append(self, global_start: int, length: int) -> None:
        self.local.append(self.count)
        self.glob.append(global_start)
        self.count += length

    def map(self, local_ids: np.ndarray) -> np.ndarray:
        loc, glo = np.asarray(self.local, dtype=np.int64), np.asarray(self.glob, dtype=np.int64)
        run = np.clip(np.searchsorted(loc, local_ids, side="right") - 1, 0, None)
        return np.where(local_ids >= 0, glo[run] + (local_ids - loc[run]), -1)


class FaissIndex(Index):
    """Inner-product search with FAISS (see the module docstring for the kinds).

    ``gallery (n, d)`` (optional, see :meth:`add`), ``kind`` one of :data:`FAISS_KINDS`, ``nlist``
    / ``nprobe`` / ``train_size`` / ``seed`` for IVF, ``rerank`` candidate factor for exact
    re-scoring (``1`` = none), ``shards`` parallel shards for the scalar quantizers.
    """

    def __init__(self, gallery: Any = None, *, kind: str = "flat", nlist: int | None = None,
                 nprobe: int = 16, train_size: int = 200_000, seed: int = 0,
                 rerank: int | None = None, shards: int | None = None) -> None:
        super().__init__()
        if kind not in FAISS_KINDS:
            raise CrossViewError(f"unknown FAISS index kind {kind!r}; choose one of {', '.join(FAISS_KINDS)}")
        self._faiss = _import_faiss()
        self.kind = kind
        self.backend = f"faiss-{kind}"
        self.nlist = nlist
        self._nprobe = int(nprobe)
        self.train_size = int(train_size)
        self.seed = int(seed)
        quantized = kind in ("sq8", "sqfp16", "pq4")
        default_rerank = {"sq8": 4, "sqfp16": 4, "pq4": 16}.get(kind, 1)
        self.rerank = int(rerank if rerank is not None else default_rerank)
        if self.rerank < 1:
            raise CrossViewError(f"rerank must be >= 1, got {rerank}")
        n_shards = shards if shards is not None else (self._faiss.omp_get_max_threads() if quantized else 1)
        if n_shards < 1 or (n_shards > 1 and not quantized):
            raise CrossViewError("shards must be >= 1, and only the sq8/sqfp16/pq4 kinds can be sharded")
        self.n_shards = int(n_shards)
        self._indexes: list[Any] = []
        self._ids: list[_IdRuns] = []
        self._source: list[tuple[int, Any]] = []      # (first id, gallery block) for re-scoring
        self._scale: np.ndarray | None = None         # sq8: per-dimension code scale
        self._d_pad = 0
        self._pool: ThreadPoolExecutor | None = None
        if gallery is not None:
            self.add(gallery)

    # ------------------------------------------------------------------ parameters
    @property
    def nprobe(self) -> int:
        """IVF lists visited per query (more = slower, higher recall)."""
        return self._nprobe

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        if value < 1:
            raise CrossViewError(f"nprobe must be >= 1, got {value}")
        self._nprobe = int(value)
        for ix in self._indexes:
            if hasattr(ix, "nprobe"):
                ix.nprobe = self._nprobe

    # ------------------------------------------------------------------ building
    def add(self, gallery: Any) -> None:
        """Append ``gallery (n, d)`` rows; the first call also trains (IVF) or sets the scale (sq8)."""
        g = self._check_gallery(gallery)
        n = int(g.shape[0])
        if n == 0:
            return
        if not self._indexes:
            self._build(g)
        if self.n_shards == 1:
            parts = [(0, n)]
        else:
            cuts = [n * j // self.n_shards for j in range(self.n_shards + 1)]
            parts = list(zip(cuts[:-1], cuts[1:]))
        for shard, (lo, hi) in enumerate(parts):
            if hi <= lo:
                continue
            self._ids[shard].append(self._size + lo, hi - lo)
            for a in range(lo, hi, _ADD_ROWS):
                self._indexes[shard].add(self._encode(g[a:min(hi, a + _ADD_ROWS)]))
        if self.rerank > 1:
            self._source.append((self._size, g))
        self._size += n

    def _build(self, g: Any) -> None:
        faiss = self._faiss
        n, d = int(g.shape[0]), int(g.shape[1])
        self._dim = d
        self._d_pad = d
        if self.kind == "flat":
            self._indexes = [faiss.IndexFlatIP(d)]
        elif self.kind == "ivf":
            sample = self._sample(g)
            nlist = self.nlist or int(round(4 * math.sqrt(n)))
            nlist = max(1, min(nlist, sample.shape[0] // 39 or 1, n))
            self.nlist = nlist
            quantizer = faiss.IndexFlatIP(d)
            ix = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            ix.cp.seed = self.seed
            ix.train(sample)
            ix.nprobe = self._nprobe
            self._quantizer = quantizer      # the IVF index does not own it: keep it alive
            self._indexes = [ix]
        elif self.kind == "pq4":
            self._d_pad = d + d % 2
            first = faiss.IndexPQFastScan(self._d_pad, self._d_pad // 2, 4, faiss.METRIC_INNER_PRODUCT)
            first.train(self._encode(self._sample(g)))
            # the shards share the trained codebooks: clone before anything is added
            self._indexes = [first] + [faiss.clone_index(first) for _ in range(self.n_shards - 1)]
        else:
            self._d_pad = -(-d // 8) * 8
            if self.kind == "sq8" and self._d_pad % 32 == 0:
                # FAISS 1.15's 8-bit direct codec ranks wrongly when d is a multiple of 32 (its 32-wide SIMD
                # path: recall@5 ~0.4 at d = 64, 96, 128, 256; right at 104-120, 136): 8 more zero columns
                self._d_pad += 8
            if self.kind == "sq8":
                max_abs = np.zeros(d, dtype=np.float32)
                for a in range(0, n, _ADD_ROWS):
                    block = np.abs(np.asarray(g[a:a + _ADD_ROWS], dtype=np.float32))
                    np.maximum(max_abs, block.max(axis=0), out=max_abs)
                self._scale = (127.0 / np.where(max_abs > 0, max_abs, 1.0)).astype(np.float32)
                qtype = faiss.ScalarQuantizer.QT_8bit_direct_signed
            else:
                qtype = faiss.ScalarQuantizer.QT_fp16
            self._indexes = []
            for _ in range(self.n_shards):
                ix = faiss.IndexScalarQuantizer(self._d_pad, qtype, faiss.METRIC_INNER_PRODUCT)
                ix.train(np.zeros((1, self._d_pad), dtype=np.float32))   # nothing to learn
                self._indexes.append(ix)
        if len(self._indexes) > 1:
            self._pool = ThreadPoolExecutor(len(self._indexes), thread_name_prefix="crossview-faiss")
        self._ids = [_IdRuns() for _ in self._indexes]

    def _sample(self, g: Any) -> np.ndarray:
        n = g.shape[0]
        if n <= self.train_size:
            return np.ascontiguousarray(g, dtype=np.float32)
        idx = np.sort(np.random.default_rng(self.seed).choice(n, self.train_size, replace=False))
        return np.ascontiguousarray(g[idx], dtype=np.float32)

    def _encode(self, block: Any) -> np.ndarray:
        """Gallery rows as FAISS wants them: float32, padded, and for sq8 pre-rounded integers."""
        x = np.asarray(block, dtype=np.float32)
        if self._scale is not None:
            # FAISS's direct 8-bit codec truncates and wraps around; give it exact integers.
            x = np.clip(np.rint(x * self._scale), -127, 127)
        if self._d_pad != x.shape[1]:
            x = np.pad(x, ((0, 0), (0, self._d_pad - x.shape[1])))
        return np.ascontiguousarray(x, dtype=np.float32)

    def _encode_queries(self, q: np.ndarray) -> np.ndarray:
        if self._scale is not None:
            q = q / self._scale
        if self._d_pad != q.shape[1]:
            q = np.pad(q, ((0, 0), (0, self._d_pad - q.shape[1])))
        return np.ascontiguousarray(q, dtype=np.float32)

    # ------------------------------------------------------------------ search
    def search(self, queries: Any, k: int) -> TopKResult:
        """Top-``k`` gallery rows for ``queries (m, d)`` or ``(d,)`` (``(m, min(k, size))`` result)."""
        q, k = self._check_search(queries, k)
        m = q.shape[0]
        n_cand = min(self._size, k * self.rerank)
        xq = self._encode_queries(q)
        for ix in self._indexes:
            if hasattr(ix, "parallel_mode"):
                # one query: let FAISS split the probed lists across threads instead
                ix.parallel_mode = 1 if m < self._faiss.omp_get_max_threads() else 0

        def one(shard: int) -> tuple[np.ndarray, np.ndarray]:
            ix = self._indexes[shard]
            kk = min(n_cand, ix.ntotal)
            if kk == 0:
                return np.empty((m, 0), np.float32), np.empty((m, 0), np.int64)
            dist, loc = ix.search(xq, kk)
            return dist, self._ids[shard].map(loc)

        shards = range(len(self._indexes))
        if self._pool is not None and m < self.n_shards * 2:
            results = list(self._pool.map(one, shards))
        else:
            results = [one(s) for s in shards]
        dist = np.concatenate([r[0] for r in results], axis=1)
        ids = np.concatenate([r[1] for r in results], axis=1)
        rows = np.broadcast_to(np.arange(m, dtype=np.int64)[:, None], ids.shape)
        ok = ids >= 0
        if self.rerank > 1:
            dist = self._exact_scores(q, ids)
        best_s, best_i = merge_topk(dist[ok].astype(np.float32), ids[ok], rows[ok], m, k)
        return TopKResult(indices=best_i, scores=best_s, exact=self.kind == "flat",
                          backend=self.backend)

    def _exact_scores(self, q: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """float32 inner products of ``q (m, d)`` with gallery rows ``ids (m, c)`` (-1: ``-inf``)."""
        out = np.full(ids.shape, -np.inf, dtype=np.float32)
        flat = ids.ravel()
        vecs = np.zeros((flat.size, self._dim or 0), dtype=np.float32)
        for offset, g in self._source:
            sel = np.flatnonzero((flat >= offset) & (flat < offset + g.shape[0]))
            if sel.size:
                order = sel[np.argsort(flat[sel], kind="stable")]    # sequential reads on a memmap
                vecs[order] = g[flat[order] - offset]
        vecs = vecs.reshape(ids.shape + (vecs.shape[1],))
        for r in range(q.shape[0]):
            out[r] = np.where(ids[r] >= 0, vecs[r] @ q[r], -np.inf)
        return out

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)
