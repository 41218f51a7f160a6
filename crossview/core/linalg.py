"""The closed-form regularised CCA solve, shared by the ``cca`` method and BITR's CTR topic features.

It sits in the ground floor because two layers need it: :mod:`crossview.features.topics` (CTR topics
are a CCA of image and text features) and :mod:`crossview.methods.cca` / :mod:`crossview.methods.bitr`;
the feature layer sits below the methods and may not import them. It is numpy / scipy only, and kept
instead of scikit-learn's iterative ``CCA``, which was 269x slower on 5,000 pairs of (100, 50)-d
features with the same correlations (``bench/cca_fit.py``, ``bench/results/cca_fit.txt``).

Closed form (METHODS.md): with centred views ``X (n, p)``, ``Y (n, q)`` and covariances
``C_xx = X^T X / (n-1) + r_x I``, ``C_yy = Y^T Y / (n-1) + r_y I``, ``C_xy = X^T Y / (n-1)``::

    T = W_x C_xy W_y^T = U S V^T                     (thin SVD; W = C^{-1/2} or L^{-1}, C = L L^T)
    A = W_x^T U[:, :d],   B = W_y^T V[:, :d],   correlations = S[:d]

so ``A^T C_xx A = B^T C_yy B = I`` and ``A^T C_xy B = diag(correlations)``. The ridge is relative:
``r_x = reg * trace(X^T X / (n-1)) / p`` (``reg`` times the average variance), so ``reg`` means the
same thing for any feature scale; ``reg -> 0`` gives plain CCA.

Cost: the two covariance matrices (``O(n (p^2 + q^2))``, accumulated in float32 chunks into float64),
two Cholesky factorisations (whitening by ``L^{-1}`` gives the same directions as ``C^{-1/2}``; the
eigendecomposition route is kept for singular covariances) and one ``p x q`` SVD; 100K x (2048, 384)
fits in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from crossview.core.errors import CrossViewError

__all__ = ["CCAResult", "fit_cca", "fit_cca_pairs", "group_sums", "cca_from_covariances", "column_mean", "covariance",
           "covariance_steps", "cross_covariance", "cca_transform", "check_finite", "check_views", "is_sparse",
           "to_dense"]

# Rows per chunk when accumulating X^T X (keeps float32 temporaries near 64 MB for p = 2048).
_CHUNK_ROWS = 8192


class CCAResult(NamedTuple):
    """The fitted CCA: ``x_proj (p, d)``, ``y_proj (q, d)``, ``x_mean (p,)``, ``y_mean (q,)`` (float64)
    and ``correlations (d,)``, descending."""

    x_proj: np.ndarray
    y_proj: np.ndarray
    x_mean: np.ndarray
    y_mean: np.ndarray
    correlations: np.ndarray


def covariance(X: np.ndarray, mean: np.ndarray, weights: np.ndarray | None = None,
               chunk_rows: int = _CHUNK_ROWS) -> np.ndarray:
    """``sum_i w_i (x_i - mean)(x_i - mean)^T``, ``(p, p) float64``, for ``X (n, p)`` and optional
    row weights ``(n,)`` (unnormalised: divide by ``sum(w) - 1`` yourself).

    Chunks are centred and multiplied in float32 (fast BLAS) and summed in float64.
    """
    for out in covariance_steps(X, mean, weights, chunk_rows):
        if isinstance(out, np.ndarray):
            return out
    raise AssertionError("unreachable")


def is_sparse(X: Any) -> bool:
    """Whether ``X`` is a scipy sparse matrix (kept sparse by every function here: never densified whole)."""
    return hasattr(X, "tocsr") and hasattr(X, "nnz")


def to_dense(X: Any) -> np.ndarray:
    """``X`` as a dense float32 array: a scipy sparse matrix densified (only where a consumer has no sparse path:
    its bytes are rows x columns x 4), anything else through ``np.asarray``."""
    if is_sparse(X):
        return np.asarray(X.toarray(), dtype=np.float32)
    return np.asarray(X, dtype=np.float32)


def column_mean(X: Any, weights: np.ndarray | None = None, chunk_rows: int = _CHUNK_ROWS) -> np.ndarray:
    """``(p,) float64``: the (``weights (n,)``-weighted) mean of the rows of ``X (n, p)``, dense or scipy sparse,
    summed in float64 a chunk at a time (no float64 copy of ``X``)."""
    n, p = X.shape
    acc = np.zeros(p, dtype=np.float64)
    for start in range(0, n, chunk_rows):
        block = X[start:start + chunk_rows]
        w = None if weights is None else np.asarray(weights[start:start + chunk_rows], dtype=np.float64)
        if is_sparse(block):
            acc += np.asarray(block.sum(axis=0) if w is None else block.T @ w, dtype=np.float64).ravel()
        else:
            block = np.asarray(block, dtype=np.float64)
            acc += block.sum(axis=0) if w is None else w @ block
    total = float(n) if weights is None else float(np.sum(weights, dtype=np.float64))
    return acc / total


def covariance_steps(X: np.ndarray, mean: np.ndarray, weights: np.ndarray | None,
                     chunk_rows: int = _CHUNK_ROWS) -> Iterator[int | np.ndarray]:
    """Generator form of :func:`covariance`: yields rows done after each chunk, then the matrix. A scipy sparse
    ``X`` stays sparse: ``sum_i w_i x_i x_i^T - W m m^T`` (``W = sum w``), one chunk's product at a time."""
    n, p = X.shape
    acc = np.zeros((p, p), dtype=np.float64)
    if is_sparse(X):
        import scipy.sparse as sp

        mean = np.asarray(mean, dtype=np.float64)
        total = 0.0
        for start in range(0, n, chunk_rows):
            block = X[start:start + chunk_rows]
            if weights is not None:
                w = np.asarray(weights[start:start + chunk_rows], dtype=np.float64)
                total += float(w.sum())
                block = sp.diags(np.sqrt(w)) @ block
            else:
                total += block.shape[0]
            acc += (block.T @ block).toarray()
            yield min(n, start + chunk_rows)
        acc -= total * np.outer(mean, mean)
        yield (acc + acc.T) / 2
        return
    m32 = np.asarray(mean, dtype=np.float32)
    for start in range(0, n, chunk_rows):
        block = np.asarray(X[start:start + chunk_rows], dtype=np.float32) - m32
        if weights is not None:
            # sqrt-weighted rows keep the product of the form B^T B, which numpy hands to BLAS syrk
            # (half the flops of a general product).
            block *= np.sqrt(np.asarray(weights[start:start + chunk_rows], dtype=np.float32))[:, None]
        acc += block.T @ block
        yield min(n, start + chunk_rows)
    yield (acc + acc.T) / 2  # exact symmetry for eigh


def cross_covariance(X: np.ndarray, Y: np.ndarray, x_mean: np.ndarray, y_mean: np.ndarray,
                     chunk_rows: int = _CHUNK_ROWS) -> np.ndarray:
    """``sum_i (x_i - x_mean)(y_i - y_mean)^T``, ``(p, q) float64``, for paired rows ``X (n, p)``,
    ``Y (n, q)``."""
    acc = np.zeros((X.shape[1], Y.shape[1]), dtype=np.float64)
    mx, my = np.asarray(x_mean, dtype=np.float32), np.asarray(y_mean, dtype=np.float32)
    if is_sparse(Y):      # sum (x - mx) (y - my)^T = sum (x - mx) y^T - (sum (x - mx)) my^T
        sx = np.zeros(X.shape[1], dtype=np.float64)
        for start in range(0, X.shape[0], chunk_rows):
            bx = np.asarray(X[start:start + chunk_rows], dtype=np.float32) - mx
            acc += np.asarray((Y[start:start + chunk_rows].T @ bx).T, dtype=np.float64)
            sx += bx.sum(axis=0, dtype=np.float64)
        return acc - np.outer(sx, np.asarray(y_mean, dtype=np.float64))
    for start in range(0, X.shape[0], chunk_rows):
        bx = np.asarray(X[start:start + chunk_rows], dtype=np.float32) - mx
        by = np.asarray(Y[start:start + chunk_rows], dtype=np.float32) - my
        acc += bx.T @ by
    return acc


def _inv_sqrt(C: np.ndarray, ridge: float) -> np.ndarray:
    """``(C + ridge I)^{-1/2}`` of a symmetric PSD matrix; eigenvalues below ``1e-10 * max`` are clipped
    (plain CCA on rank-deficient data is then the pseudo-inverse solution)."""
    evals, evecs = np.linalg.eigh(C + ridge * np.eye(C.shape[0]))
    floor = max(float(evals.max()), 1e-300) * 1e-10
    inv = 1.0 / np.sqrt(np.maximum(evals, floor))
    inv[evals < floor] = 0.0
    return (evecs * inv) @ evecs.T


def _cholesky(C: np.ndarray, ridge: float) -> np.ndarray | None:
    """Lower Cholesky factor of ``C + ridge I``, or None when it is not safely positive definite."""
    from scipy.linalg import LinAlgError, cholesky

    M = C + ridge * np.eye(C.shape[0])
    try:
        L = cholesky(M, lower=True, check_finite=False)
    except LinAlgError:
        return None
    diag = np.abs(np.diag(L))
    # A nearly singular factor would amplify noise directions; leave those to the eigen route.
    if diag.min() <= 1e-7 * diag.max():
        return None
    return L


def cca_from_covariances(Cxx: np.ndarray, Cyy: np.ndarray, Cxy: np.ndarray, n_components: int,
                         reg: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CCA directions from covariances ``Cxx (p, p)``, ``Cyy (q, q)``, ``Cxy (p, q)`` (same normalisation).

    Returns ``x_proj (p, d)``, ``y_proj (q, d)`` and ``correlations (d,)`` with
    ``d = min(n_components, p, q)``; the ridge is ``reg`` times the average variance of each view.
    """
    p, q = Cxy.shape
    if reg < 0:
        raise CrossViewError(f"reg must be >= 0, got {reg}")
    # The factorisations are small next to the covariance products; multi-threaded OpenBLAS LAPACK
    # on a busy machine (threads spinning while descheduled) was measured 10-30x slower than one
    # thread for the 2048-d Cholesky and SVD here, so they run single-threaded.
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return _cca_from_covariances(Cxx, Cyy, Cxy, n_components, reg)


def _cca_from_covariances(Cxx: np.ndarray, Cyy: np.ndarray, Cxy: np.ndarray, n_components: int,
                          reg: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p, q = Cxy.shape
    d = min(int(n_components), p, q)
    rx = reg * float(np.trace(Cxx)) / p
    ry = reg * float(np.trace(Cyy)) / q
    chol = _cholesky(Cxx, rx), _cholesky(Cyy, ry)
    if chol[0] is not None and chol[1] is not None:
        # Whitening by the Cholesky factor (C = L L^T, W = L^{-1}) instead of C^{-1/2}: any whitening
        # gives the same canonical directions, and a Cholesky factorisation is ~50x cheaper than eigh.
        from scipy.linalg import solve_triangular

        Lx, Ly = chol
        M = solve_triangular(Lx, Cxy, lower=True)                   # Lx^{-1} Cxy          (p, q)
        T = solve_triangular(Ly, M.T, lower=True).T                 # Lx^{-1} Cxy Ly^{-T}  (p, q)
        U, S, Vt = np.linalg.svd(T, full_matrices=False)
        A = solve_triangular(Lx.T, U[:, :d], lower=False)           # Lx^{-T} U
        B = solve_triangular(Ly.T, Vt[:d].T, lower=False)
    else:  # singular covariance (reg = 0 on rank-deficient data): pseudo-inverse square roots
        Wx = _inv_sqrt(Cxx, rx)
        Wy = _inv_sqrt(Cyy, ry)
        U, S, Vt = np.linalg.svd(Wx @ Cxy @ Wy, full_matrices=False)
        A = Wx @ U[:, :d]
        B = Wy @ Vt[:d].T
    # A sign convention so results are reproducible: the largest-magnitude entry of each x direction > 0.
    signs = np.sign(A[np.argmax(np.abs(A), axis=0), np.arange(d)])
    signs[signs == 0] = 1.0
    return A * signs, B * signs, np.clip(S[:d], 0.0, 1.0)


def fit_cca(X: np.ndarray, Y: np.ndarray, n_components: int, reg: float = 0.0) -> CCAResult:
    """Regularised CCA of paired views ``X (n, p)`` and ``Y (n, q)`` (closed form, see the module docstring).

    Returns a :class:`CCAResult`: ``(x_proj (p, d), y_proj (q, d), x_mean (p,), y_mean (q,),
    correlations (d,))``; the canonical variates are ``(X - x_mean) @ x_proj`` and ``(Y - y_mean) @ y_proj``.
    """
    X = np.asarray(X)
    Y = np.asarray(Y)
    check_views(X, Y)
    n = X.shape[0]
    mx = X.mean(axis=0, dtype=np.float64)
    my = Y.mean(axis=0, dtype=np.float64)
    Cxx = covariance(X, mx) / (n - 1)
    Cyy = covariance(Y, my) / (n - 1)
    Cxy = cross_covariance(X, Y, mx, my) / (n - 1)
    check_finite(Cxx, Cyy, Cxy)
    A, B, corr = cca_from_covariances(Cxx, Cyy, Cxy, n_components, reg)
    return CCAResult(A, B, mx, my, corr)


def group_sums(rows: Any, groups: np.ndarray, n_groups: int) -> Any:
    """``(n_groups, q)``: the sum of the rows of each group (``rows (n, q)`` dense or scipy sparse, ``groups (n,)
    int64``), as one sparse product on ``rows`` as they are: float32 stays float32 and sparse stays sparse (no
    centred or float64 copy of the rows)."""
    import scipy.sparse as sp

    groups = np.asarray(groups, dtype=np.int64)
    dtype = np.float32 if rows.dtype == np.float32 else np.float64
    ind = sp.csr_matrix((np.ones(len(groups), dtype=dtype), (groups, np.arange(len(groups)))),
                        shape=(n_groups, len(groups)))
    summed = ind @ rows
    return summed.tocsr() if is_sparse(summed) else np.asarray(summed)


def fit_cca_pairs(image: Any, text: Any, caption_image: np.ndarray, n_components: int,
                  reg: float = 0.0) -> CCAResult:
    """:func:`fit_cca` of one pair per caption, ``X = image[caption_image]`` and ``Y = text``, without repeating
    the image rows: ``image (n_images, p)`` enters once, weighted by its number of captions, and ``text
    (n_captions, q)`` (dense or scipy sparse) is never centred or copied. Same result as ``fit_cca(image[ci],
    text, ...)`` up to rounding."""
    ci = np.asarray(caption_image, dtype=np.int64)
    n = len(ci)
    if n < 2:
        raise CrossViewError(f"CCA needs at least 2 training pairs, got {n}")
    if text.shape[0] != n:
        raise CrossViewError(f"CCA needs one text row per caption: {text.shape[0]} rows for {n} captions")
    counts = np.bincount(ci, minlength=image.shape[0]).astype(np.float64)
    mx = column_mean(image, counts)
    my = column_mean(text)
    Cxx = covariance(image, mx, counts) / (n - 1)
    Cyy = covariance(text, my) / (n - 1)
    # sum over captions of (x - mx)(y - my)^T = (X - mx)^T (per-image sums of y): the my term vanishes because
    # mx is the caption-weighted mean of the images
    Cxy = cross_covariance(image, group_sums(text, ci, image.shape[0]), mx, np.zeros(text.shape[1])) / (n - 1)
    check_finite(Cxx, Cyy, Cxy)
    A, B, corr = cca_from_covariances(Cxx, Cyy, Cxy, n_components, reg)
    return CCAResult(A, B, mx, my, corr)


def cca_transform(Z: np.ndarray, mean: np.ndarray, proj: np.ndarray, correlations: np.ndarray | None = None,
                  power: float = 0.0, normalize: bool = True) -> np.ndarray:
    """Project ``Z (n, p)`` into the canonical space: ``(Z - mean) @ proj``, dimension k times
    ``correlations[k] ** power`` when ``power != 0``, rows L2-normalised when ``normalize``.
    Returns ``(n, d) float32``. ``Z`` (dense, memory-mapped or scipy sparse) is read a chunk of rows at a time:
    no centred copy of the whole of it is made."""
    n = Z.shape[0]
    proj32 = np.asarray(proj, np.float32)
    m32 = np.asarray(mean, dtype=np.float32)
    out = np.empty((n, proj32.shape[1]), dtype=np.float32)
    if is_sparse(Z):
        shift = m32 @ proj32                    # (Z - m) P = Z P - m P, so the sparse rows are never centred
        for start in range(0, n, _CHUNK_ROWS):
            out[start:start + _CHUNK_ROWS] = np.asarray(Z[start:start + _CHUNK_ROWS] @ proj32) - shift
    else:
        for start in range(0, n, _CHUNK_ROWS):
            out[start:start + _CHUNK_ROWS] = (np.asarray(Z[start:start + _CHUNK_ROWS], dtype=np.float32)
                                              - m32) @ proj32
    if power and correlations is not None:
        out *= np.power(np.asarray(correlations, dtype=np.float32), np.float32(power))
    if normalize:
        from crossview.core.rownorm import row_norms

        norms = row_norms(np.linalg.norm(out, axis=1, keepdims=True))
        out /= np.maximum(norms, np.float32(1e-12))
    return out


def check_finite(*mats: np.ndarray) -> None:
    """A :class:`CrossViewError` when a covariance holds NaN / inf (NaN / inf anywhere in the features
    reaches the covariances, so checking those is enough)."""
    if not all(np.isfinite(m).all() for m in mats):
        raise CrossViewError("cca: the training features contain NaN or infinite values; re-extract them")


def check_views(X: np.ndarray, Y: np.ndarray) -> None:
    """A :class:`CrossViewError` unless ``X`` and ``Y`` are 2-D with the same number (>= 2) of rows."""
    if X.ndim != 2 or Y.ndim != 2:
        raise CrossViewError(f"CCA needs two 2-D feature matrices, got shapes {X.shape} and {Y.shape}")
    if X.shape[0] != Y.shape[0]:
        raise CrossViewError(f"CCA needs paired rows: X has {X.shape[0]} rows and Y has {Y.shape[0]}")
    if X.shape[0] < 2:
        raise CrossViewError(f"CCA needs at least 2 training pairs, got {X.shape[0]}")
