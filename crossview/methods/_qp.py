"""The small dual QP of 1-slack cutting-plane training, solved exactly by a primal active-set method.

Problem (the dual of the working-set problem of Joachims et al. 2009, Algorithm 4)::

    maximise   b . a - 1/2 a^T G a        over a (K,)
    subject to a >= 0,  sum(a) <= C

``G (K, K)`` is the Gram matrix of the constraint directions (positive semi-definite, often nearly
singular once many cutting planes point in similar directions) and ``b (K,)`` their losses.

Method. A slack variable ``a_K = C - sum(a)`` turns the feasible set into the scaled simplex
``{a >= 0, sum(a) = C}`` (the slack has zero gradient and zero curvature). We then run the classic
primal active-set method for convex QPs (Nocedal & Wright, Algorithm 16.3) on it: keep the set ``F``
of free variables, minimise the quadratic on the face ``{a_j = 0 for j not in F, sum = C}`` by a
Newton step in an orthonormal basis of ``1^perp`` (a Householder reflection), shorten the step at the
first variable that would turn negative and fix it at zero, and once the face minimum is reached free
the variable whose Lagrange multiplier is most negative. Singular faces (zero-curvature directions,
common here) are handled exactly: if the reduced gradient has a component in the null space of the
reduced Hessian, that component is a descent direction of zero curvature, and since the simplex is
bounded some variable blocks it. The method finishes in a finite number of steps, is warm-started
from the previous cutting-plane iteration's solution (the new constraint starts at zero), and needs
only dense linear algebra on the free set, which stays small.

No dependency: numpy and scipy's LAPACK wrappers only. Kept rather than a library QP because it measures
faster and exact: on working sets of K = 20 / 80 / 200 near-singular constraints (a shared, loaded 2-core
CPU, 2026-11) it took 36 / 46 / 37 ms, scipy's SLSQP 1.7 / 1.8 / 4.4 s (same optimum) and scipy's
trust-constr 0.8 / 19 / 138 s (a worse objective); none of osqp / quadprog / cvxopt is a dependency.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from crossview.core.errors import CrossViewError

__all__ = ["QPResult", "solve_dual_qp", "dual_objective"]


@dataclass
class QPResult:
    """The solution of :func:`solve_dual_qp`.

    ``alpha (K,) float64`` is the maximiser, ``objective`` the dual value ``b.a - 1/2 a^T G a``,
    ``iterations`` the active-set steps taken and ``converged`` whether the KKT conditions hold to the
    tolerance (False only if ``max_iter`` ran out, which signals a bug or a degenerate cycle).
    """

    alpha: np.ndarray
    objective: float
    iterations: int
    converged: bool


def dual_objective(G: np.ndarray, b: np.ndarray, alpha: np.ndarray) -> float:
    """``b . alpha - 1/2 alpha^T G alpha`` in float64 (``G (K, K)``, ``b, alpha (K,)``)."""
    alpha = np.asarray(alpha, dtype=np.float64)
    return float(b @ alpha - 0.5 * alpha @ (G @ alpha))


def _reduced_face_step(Gf: np.ndarray, gf: np.ndarray, tol_g: float) -> tuple[np.ndarray, bool, bool]:
    """Step on one face ``{sum(d) = 0}`` of the free variables.

    Returns ``(d, zero_curvature, stationary)``: the Newton step minimising ``g.d + 1/2 d^T G d``
    subject to ``sum(d) = 0`` when the reduced gradient lies in the range of the reduced Hessian;
    otherwise the projection of minus the reduced gradient on the Hessian's null space (a descent
    direction of zero curvature, ``zero_curvature=True``). ``stationary`` is True when the reduced
    gradient is already below tolerance (then ``d`` is zero).
    """
    m = gf.shape[0]
    if m <= 1:
        return np.zeros(m), False, True
    # Householder reflection Q (symmetric, orthogonal) with Q e_1 = 1/sqrt(m); columns 2.. of Q span 1^perp.
    u = np.full(m, 1.0 / np.sqrt(m))
    u[0] -= 1.0
    beta = 2.0 / float(u @ u)
    Gu = Gf @ u
    uGu = float(u @ Gu)
    QGQ = Gf - beta * np.outer(u, Gu) - beta * np.outer(Gu, u) + (beta * beta * uGu) * np.outer(u, u)
    H = QGQ[1:, 1:]
    H = 0.5 * (H + H.T)
    r = (gf - beta * u * float(u @ gf))[1:]
    if np.max(np.abs(r)) <= tol_g:
        return np.zeros(m), False, True
    v = None
    zero_curv = False
    # Fast path: a well-conditioned Cholesky factor.
    try:
        cf = scipy.linalg.cho_factor(H, lower=True, check_finite=False)
        diag = np.abs(np.diag(cf[0]))
        if diag.min() > 1e-7 * diag.max():
            v = -scipy.linalg.cho_solve(cf, r, check_finite=False)
    except np.linalg.LinAlgError:
        v = None
    if v is None:
        lam, U = np.linalg.eigh(H)
        lam_max = max(float(lam[-1]), 0.0)
        thresh = max(lam_max * 1e-12 * m, 1e-300)
        c = U.T @ r
        pos = lam > thresh
        c0 = c[~pos]
        if c0.size and np.linalg.norm(c0) > tol_g:
            v = -(U[:, ~pos] @ c0)
            zero_curv = True
        else:
            v = -(U[:, pos] @ (c[pos] / lam[pos]))
    w = np.concatenate([[0.0], v])
    d = w - beta * u * float(u @ w)
    return d, zero_curv, False


def solve_dual_qp(G: np.ndarray, b: np.ndarray, C: float, alpha0: np.ndarray | None = None, *,
                  tol: float = 1e-10, max_iter: int | None = None) -> QPResult:
    """Maximise ``b.a - 1/2 a^T G a`` subject to ``a >= 0``, ``sum(a) <= C``.

    Args:
        G: ``(K, K)`` symmetric positive semi-definite Gram matrix.
        b: ``(K,)`` linear term (the constraints' losses).
        C: the bound on ``sum(a)`` (> 0).
        alpha0: ``(K,)`` warm start (clipped to the feasible set), e.g. the previous solution padded with 0.
        tol: KKT tolerance, relative to ``max(1, max|b|)``.
        max_iter: active-set step limit (default ``50 * K + 100``).

    Returns:
        :class:`QPResult` with ``alpha (K,) float64``.
    """
    G = np.asarray(G, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64).ravel()
    K = b.shape[0]
    if G.shape != (K, K):
        raise CrossViewError(f"QP: the Gram matrix must be ({K}, {K}) to match b, got {G.shape}")
    if not (np.isfinite(C) and C > 0):
        raise CrossViewError(f"QP: C must be a positive finite number, got {C!r}")
    if not (np.all(np.isfinite(G)) and np.all(np.isfinite(b))):
        raise CrossViewError("QP: the Gram matrix or the losses contain NaN or inf; check the input features")
    if K == 0:
        return QPResult(np.zeros(0), 0.0, 0, True)
    C = float(C)
    n = K + 1  # the last variable is the slack C - sum(a)
    Ge = np.zeros((n, n))
    Ge[:K, :K] = 0.5 * (G + G.T)
    be = np.zeros(n)
    be[:K] = b
    a = np.zeros(n)
    if alpha0 is not None:
        a0 = np.clip(np.asarray(alpha0, dtype=np.float64).ravel()[:K], 0.0, None)
        a[: a0.shape[0]] = a0
        s = a[:K].sum()
        if s > C:
            a[:K] *= C / s
    a[K] = max(C - a[:K].sum(), 0.0)
    tol_g = tol * max(1.0, float(np.max(np.abs(b))))
    free = a > 0
    if not free.any():
        a[K] = C
        free[K] = True
    limit = max_iter if max_iter is not None else 50 * n + 100
    face_min = False
    it = 0
    converged = False
    while it < limit:
        it += 1
        g = Ge @ a - be
        F = np.flatnonzero(free)
        if not face_min:
            d, zero_curv, stationary = _reduced_face_step(Ge[np.ix_(F, F)], g[F], tol_g)
            if stationary:
                face_min = True
                continue
            neg = d < 0
            if zero_curv and not neg.any():  # cannot happen on the simplex (sum(d) = 0, d != 0)
                face_min = True
                continue
            ratios = np.full(F.shape[0], np.inf)
            ratios[neg] = a[F][neg] / -d[neg]
            j = int(np.argmin(ratios))
            t = float(ratios[j])
            if zero_curv or t < 1.0:
                a[F] += t * d
                a[F[j]] = 0.0
                free[F[j]] = False
                # variables that reached zero within rounding leave the free set too
                tiny = (a[F] <= 1e-15 * C) & free[F]
                tiny[j] = False
                for k in F[tiny]:
                    if free.sum() > 1:
                        a[k] = 0.0
                        free[k] = False
            else:
                a[F] += d
                face_min = True
            a[a < 0] = 0.0
            continue
        # At the minimum of the current face: check the multipliers of the variables held at zero.
        lam = -float(np.mean(g[F]))
        fixed = np.flatnonzero(~free)
        if fixed.size == 0:
            converged = True
            break
        mu = g[fixed] + lam
        k = int(np.argmin(mu))
        if mu[k] >= -tol_g:
            converged = True
            break
        free[fixed[k]] = True
        face_min = False
    alpha = a[:K].copy()
    s = alpha.sum()
    if s > C:
        alpha *= C / s
    return QPResult(alpha, dual_objective(G, b, alpha), it, converged)
