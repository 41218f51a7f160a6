"""Sparse feature rows on a device, densified only where a step reads them (TF-IDF captions for WSABIE).

A COCO-size set has 616K captions over a vocabulary of thousands of words, about ten of them non-zero in a row: the
dense float32 matrix is 600K x 500 x 4 = 1.2 GB for a 500-word vocabulary (issue 34), the CSR form ~53 MB.
:class:`SparseRows` keeps the CSR form and gives what a training step asks of the rows *as the model sees them*,
``(y_i - c) * s_i`` (a centring ``c`` and a per-row scale ``s_i``, e.g. the L2 norm of the centred row):

- ``rows[idx]``: the dense rows of any index tensor, shape ``idx.shape + (q,)`` (a batch, or a batch's candidates);
- ``rows.scores(u)``: ``u @ rows.T`` for ``u (B, q)``, one sparse product (``(Y u^T - 1 (c . u)) * s``).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

__all__ = ["SparseRows", "DenseRows", "shared_tensor"]


class SparseRows:
    """``(n, q)`` rows ``(y_i - center) * scale_i`` of a scipy CSR matrix ``Y``, held sparse on ``device``."""

    def __init__(self, csr: Any, center: np.ndarray | None, scale: np.ndarray, device: Any) -> None:
        csr = csr.tocsr()
        n, q = csr.shape
        self.shape = (int(n), int(q))
        self.device = torch.device(device)
        # int32 indices where they fit (they do below 2^31 non-zeros): on the CPU then the CSR's own arrays, shared,
        # not int64 copies (43 MB at COCO size, issue 34)
        index = np.int32 if max(csr.nnz, n, q) < np.iinfo(np.int32).max else np.int64
        self.indptr = shared_tensor(np.asarray(csr.indptr, dtype=index)).to(self.device)
        self.indices = shared_tensor(np.asarray(csr.indices, dtype=index)).to(self.device)
        self.data = shared_tensor(np.asarray(csr.data, dtype=np.float32)).to(self.device)
        self.center = None if center is None else torch.as_tensor(np.asarray(center, np.float32)).to(self.device)
        self.scale = torch.as_tensor(np.asarray(scale, dtype=np.float32)).to(self.device)
        with warnings.catch_warnings():     # torch says CSR tensors are "beta": the one product used here is tested
            warnings.simplefilter("ignore", UserWarning)
            self._csr = torch.sparse_csr_tensor(self.indptr, self.indices, self.data, size=self.shape,
                                                check_invariants=False)

    @classmethod
    def from_csr(cls, csr: Any, center: np.ndarray | None, normalize: str, device: Any) -> "SparseRows":
        """The rows ``csr - center`` (``center (q,)`` or None), each scaled to unit L2 norm when ``normalize`` is
        ``"l2"`` (a zero row stays zero; norms below 1e-12 count as 1e-12, as :func:`normalize_rows` does) or left
        as they are for ``"none"``. The norms are exact without centring a row: ``|y - c|^2 = |y|^2 - 2 y.c +
        |c|^2``."""
        csr = csr.tocsr()
        n = csr.shape[0]
        if normalize == "none":
            scale = np.ones(n, dtype=np.float32)
        elif normalize == "l2":
            sq = np.asarray(csr.multiply(csr).sum(axis=1), dtype=np.float64).ravel()
            if center is not None:
                c = np.asarray(center, dtype=np.float64)
                sq = sq - 2.0 * np.asarray(csr @ c, dtype=np.float64).ravel() + float(c @ c)
            scale = (1.0 / np.maximum(np.sqrt(np.maximum(sq, 0.0)), 1e-12)).astype(np.float32)
        else:
            raise ValueError(f"normalize must be 'l2' or 'none', got {normalize!r}")
        return cls(csr, center, scale, device)

    @property
    def nbytes(self) -> int:
        """Bytes held on the device (the CSR parts and the per-row scale)."""
        return sum(t.numel() * t.element_size() for t in (self.indptr, self.indices, self.data, self.scale))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx: torch.Tensor) -> torch.Tensor:
        """The dense rows ``idx`` (an int64 tensor of any shape), ``idx.shape + (q,)`` float32."""
        idx = torch.as_tensor(idx, device=self.device)
        flat = idx.reshape(-1)
        m, q = flat.numel(), self.shape[1]
        out = torch.zeros((m, q), dtype=torch.float32, device=self.device)
        if m:
            start, stop = self.indptr[flat].long(), self.indptr[flat + 1].long()
            lengths = stop - start
            row = torch.repeat_interleave(torch.arange(m, device=self.device), lengths)
            first = torch.cumsum(lengths, 0) - lengths          # where each row's entries begin in the gather
            src = start[row] + (torch.arange(row.numel(), device=self.device) - first[row])
            out[row, self.indices[src]] = self.data[src]
            if self.center is not None:
                out -= self.center
            out *= self.scale[flat].unsqueeze(1)
        return out.reshape(*idx.shape, q)

    def scores(self, u: torch.Tensor) -> torch.Tensor:
        """``u @ rows.T``: ``(B, n)`` float32 for ``u (B, q)``, without densifying a row."""
        u = u.to(torch.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            prod = torch.sparse.mm(self._csr, u.T.contiguous())       # (n, B): Y u^T
        if self.center is not None:
            prod = prod - (u @ self.center).unsqueeze(0)
        return (prod * self.scale.unsqueeze(1)).T.contiguous()

    def embed(self, Z: torch.Tensor) -> torch.Tensor:
        """``rows @ Z.T`` for ``Z (P, q)``: ``(n, P)`` float32, computed in place after the one sparse product."""
        Z = Z.to(torch.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            out = torch.sparse.mm(self._csr, Z.T.contiguous())        # (n, P): Y Z^T
        if self.center is not None:
            out -= (Z @ self.center).unsqueeze(0)
        out *= self.scale.unsqueeze(1)
        return out


class DenseRows:
    """``(n, q)`` rows ``(x_i - center) / norm_i`` of a dense matrix, read from its memory (no centred copy).

    WSABIE's image rows: the model sees them centred and L2-normalised, and making that copy cost a second image
    matrix (0.9 GB at COCO size, issue 34) on top of the run's. A gathered row is computed exactly as
    :func:`crossview.methods._labels.normalize_rows` computes it (float32 ``(x - c) / max(|x - c|, 1e-12)``), and
    :meth:`scores` centres a block of rows at a time."""

    #: rows centred at a time by :meth:`scores`
    BLOCK = 8192

    def __init__(self, base: torch.Tensor, center: torch.Tensor | None, norms: torch.Tensor) -> None:
        self.base, self.center, self.norms = base, center, norms
        self.shape = (int(base.shape[0]), int(base.shape[1]))
        self.device = base.device

    @classmethod
    def from_array(cls, a: np.ndarray, center: np.ndarray | None, normalize: str, device: Any) -> "DenseRows":
        """Rows of ``a (n, q)`` minus ``center`` (or None), L2-normalised for ``"l2"``, as they are for ``"none"``;
        ``a`` is shared, not copied, on the CPU (:func:`shared_tensor`)."""
        a = np.asarray(a, dtype=np.float32)
        c = None if center is None else np.asarray(center, dtype=np.float32)
        if normalize == "none":
            norms = np.ones(a.shape[0], dtype=np.float32)
        elif normalize == "l2":
            norms = np.empty(a.shape[0], dtype=np.float32)
            for start in range(0, a.shape[0], cls.BLOCK):
                block = a[start:start + cls.BLOCK]
                if c is not None:
                    block = block - c
                norms[start:start + cls.BLOCK] = np.maximum(np.linalg.norm(block, axis=1), np.float32(1e-12))
        else:
            raise ValueError(f"normalize must be 'l2' or 'none', got {normalize!r}")
        dev = torch.device(device)
        return cls(shared_tensor(a).to(dev), None if c is None else torch.as_tensor(c).to(dev),
                   torch.as_tensor(norms).to(dev))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx: torch.Tensor) -> torch.Tensor:
        """The rows ``idx`` (an int64 tensor of any shape), ``idx.shape + (q,)`` float32."""
        rows = self.base[idx]
        if self.center is not None:
            rows = rows - self.center
        return rows / self.norms[idx].unsqueeze(-1)

    def block(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` as the model sees them."""
        rows = self.base[start:stop]
        if self.center is not None:
            rows = rows - self.center
        return rows / self.norms[start:stop].unsqueeze(1)

    def scores(self, u: torch.Tensor) -> torch.Tensor:
        """``u @ rows.T``: ``(B, n)`` for ``u (B, q)``, a block of rows centred at a time."""
        n = self.shape[0]
        out = torch.empty((u.shape[0], n), dtype=u.dtype, device=u.device)
        for start in range(0, n, self.BLOCK):
            stop = min(n, start + self.BLOCK)
            out[:, start:stop] = u @ self.block(start, stop).T
        return out


def shared_tensor(a: np.ndarray) -> torch.Tensor:
    """A CPU tensor over ``a``'s memory, without a copy also when ``a`` is read-only (a split of the run's feature
    matrix is a read-only view, :func:`crossview.data.dataset.take_rows`; copying it to make it writable cost a
    second image matrix at COCO size, issue 34). The tensor must only be read (batches are gathered from it)."""
    a = np.ascontiguousarray(a)
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():     # torch warns that writing to it would be undefined: nothing writes to it
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(a)
