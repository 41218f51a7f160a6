"""BITR's cutting-plane trainer works a block of samples at a time: the result does not depend on the
block size (beyond float rounding), and the block size bounds the per-iteration temporaries."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from crossview.core.errors import CrossViewError
from crossview.methods.bitr import CuttingPlaneTrainer, normalize_rows

torch.set_num_threads(1)


def _problem(domain: str, N: int = 120, p: int = 5, q: int = 4, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = normalize_rows(rng.normal(size=(N, p)), "l2")
    T = rng.normal(size=(p, q))
    if domain == "simplex":
        Y = normalize_rows(np.exp(X @ T + 0.3 * rng.normal(size=(N, q))), "l1")
    else:
        Y = normalize_rows(X @ T + 0.5 * rng.normal(size=(N, q)), "l2")
    return X.astype(np.float32), Y.astype(np.float32)


@pytest.mark.parametrize("loss,domain,line_search,finite", [
    ("C", "sphere", True, False), ("E", "sphere", False, False), ("M", "sphere", True, False),
    ("E", "simplex", True, False), ("C", "sphere", True, True)])
def test_chunked_training_equals_one_chunk(loss: str, domain: str, line_search: bool, finite: bool) -> None:
    """Seven-row blocks (the last one short) against one block of all rows. The objective is 1-strongly convex,
    so a run that stops with gap ``<= C * epsilon`` is within ``sqrt(2 C epsilon)`` (Frobenius) of the unique
    minimiser, and two such runs within twice that of each other, whatever last-bit differences the block sums
    make along the way (they do change the path: the cutting planes' QP is nearly singular). A block dropped,
    misplaced or counted twice moves the minimiser by far more. The M loss draws random starts: the blocks
    must draw what one pass would (its most violated outputs come from a local search, so there the bound
    is a check of agreement rather than a theorem)."""
    X, Y = _problem(domain)
    C, eps = 3.0, 1e-8
    kw = dict(loss=loss, C=C, domain=domain, epsilon=eps, max_iter=2000, line_search=line_search, seed=5)
    if finite:
        kw.update(candidates=Y[::3], true_group=np.arange(len(Y)) // 3, cand_group=np.arange(len(Y[::3])))
    one = CuttingPlaneTrainer(X, Y, chunk_rows=len(X), **kw).fit()
    small = CuttingPlaneTrainer(X, Y, chunk_rows=7, **kw).fit()
    assert one.converged and small.converged and one.iteration > 3
    assert np.linalg.norm(small.solution - one.solution) <= 2 * np.sqrt(2 * C * eps)
    # the reported primals: each within C * epsilon of the optimum, up to float32 rounding of the planes
    assert small.history[-1]["primal"] == pytest.approx(one.history[-1]["primal"], rel=1e-6, abs=2 * C * eps)


class _LargestTensor(TorchDispatchMode):
    """Records the most elements of any new tensor an aten op returns while active (views allocate nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and not t._is_view():
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("loss", ["C", "E"])
def test_chunk_rows_bounds_the_temporaries(loss: str) -> None:
    """With the closed-form losses on the sphere (BITR's default, the one trained at COCO size) every tensor an
    iteration makes (line search and plane) is at most a block's ``(rows, q)`` or six numbers per sample; with
    a single block the same iteration makes whole ``N x q`` matrices. (tracemalloc cannot see torch's
    allocations, hence the dispatch hook. The simplex, finite-candidate and M paths keep the segment's
    ``N x q`` (or ``N x m``) scores for their many line-search evaluations by design.)"""
    N, p, q, rows = 3000, 8, 32, 100
    X, Y = _problem("sphere", N=N, p=p, q=q)

    def largest(chunk: int) -> int:
        tr = CuttingPlaneTrainer(X, Y, loss=loss, C=10.0, chunk_rows=chunk)
        for _ in range(2):
            tr.step()                   # the first iteration has no line search: measure the third
        with _LargestTensor() as mode:
            tr.step()
        return mode.largest

    bound = max(rows * q, 6 * N, p * q)
    assert largest(rows) <= bound
    assert largest(N) >= N * q > bound   # the measure would catch unchunked temporaries


def test_chunk_rows_must_be_positive() -> None:
    X, Y = _problem("sphere", N=10)
    with pytest.raises(CrossViewError, match="chunk_rows"):
        CuttingPlaneTrainer(X, Y, chunk_rows=0)
