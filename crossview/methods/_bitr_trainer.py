"""BITR's 1-slack cutting-plane trainer (Joachims, Finley & Yu 2009, Algorithm 4; OCAS line search).

Each iteration finds every sample's most violated output (:mod:`crossview.methods._bitr_losses`),
adds ONE averaged constraint ``<W, A> >= b - xi`` with ``A = 1/N sum_i x_i (y_i - y^_i)^T (p, q)`` and
``b = 1/N sum_i Delta(y_i, y^_i)``, and re-solves the small dual QP over the working set
(:mod:`crossview.methods._qp`) with the Gram matrix ``G_jk = <A_j, A_k>_F``.

The QP solver is our own active-set method rather than a QP library: exact on the nearly singular Gram
matrices the cutting planes produce, warm-started from the previous iteration, and measured 40-100x
faster than scipy's SLSQP on such working sets (the numbers are in :mod:`crossview.methods._qp`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from crossview.core.errors import CrossViewError
from crossview.methods._bitr_losses import (_FINITE_CACHE_ELEMENTS, _check_domain, _check_loss, _one_blas_thread,
                                            delta, delta_matrix, most_violated, most_violated_finite, vertex_losses)
from crossview.methods._qp import solve_dual_qp

__all__ = ["CuttingPlaneTrainer", "IterationInfo"]


# ------------------------------------------------------------------------ 1-slack cutting plane
@dataclass
class IterationInfo:
    """What one cutting-plane iteration reports (one ``Loss`` event's terms).

    ``primal`` is the full n-slack objective (eq. 3) at the iterate ``W_t`` (exact: the most violated
    constraint gives every hinge), ``dual`` the working-set dual after the new constraint was added
    (a lower bound of the optimum), ``gap = best primal so far - dual``, ``violation`` how much the
    most violated 1-slack constraint exceeds the working-set slack ``xi`` (training stops when it is
    at most ``epsilon``), ``loss`` the mean hinge ``1/N sum_i xi_i`` at ``W_t``.
    """

    iteration: int
    primal: float
    dual: float
    gap: float
    violation: float
    xi: float
    loss: float
    norm_w: float
    n_constraints: int
    qp_steps: int
    converged: bool
    seconds: float

    def terms(self) -> dict[str, float]:
        """The numbers as a flat dict for a ``Loss`` event."""
        return {"primal": self.primal, "dual": self.dual, "gap": self.gap, "violation": self.violation,
                "xi": self.xi, "hinge": self.loss, "norm_w": self.norm_w,
                "constraints": float(self.n_constraints), "qp_steps": float(self.qp_steps),
                "seconds": self.seconds}


class CuttingPlaneTrainer:
    """1-slack cutting-plane training (Joachims et al. 2009, margin rescaling) of one BITR model.

    Inputs ``X (N, p)`` are the query side, ``Y (N, q)`` the true outputs (already normalised onto
    ``domain``). The model is ``W (p, q)``; the joint feature ``x (x) y`` is never formed: a
    constraint direction is the ``(p, q)`` matrix ``1/N X^T (Y - Y^)``, kept flattened (float32
    values, stored in float64 so that the Gram matrix and ``W`` are exact functions of what a
    checkpoint saves). One :meth:`step` is one iteration; :meth:`state_dict` at any point between
    steps resumes to exactly the same result.

    Args:
        loss: ``"M"``, ``"E"`` or ``"C"``.
        C: the trade-off of eq. 3 (``C/N sum xi_i``).
        domain: ``"sphere"`` or ``"simplex"`` (continuous outputs) - ignored when ``candidates`` is given.
        epsilon: stop when the most violated constraint exceeds the working-set slack by at most this.
        max_iter: iteration limit.
        inactive_limit: drop a constraint after this many iterations with zero dual weight.
        candidates: ``(m, q)`` finite output set (the finite variant), with ``true_group (N,)`` and
            ``cand_group (m,)`` marking candidates that are not wrong for a sample.
        n_starts, n_steps: projected subgradient ascent for the M loss on the sphere.
        seed: seeds the random starts (per iteration, so a resumed run draws the same ones).
        device: torch device for the ``N x p x q`` products of each iteration.
        line_search: OCAS acceleration (Franc & Sonnenburg 2009): the same working set and QP, but the
            new plane is taken near the best point found by an exact line search of the true primal.
            Same optimum and the same ``C * epsilon`` guarantee; far fewer iterations at large C.
        mu: where between the best point and the QP solution the new plane is taken (OCAS uses 0.1).
        chunk_rows: samples per block in the per-iteration passes over the data (scores, most violated
            outputs, the plane's sums, the line search's hinges), so that their ``(rows, q)`` temporaries
            stay ``chunk_rows x q`` instead of ``N x q`` each (about 140 MB apiece at 550K captions and
            q = 64). The result does not depend on it beyond float rounding (the sums go in float64).
    """

    def __init__(self, X: Any, Y: Any, *, loss: str = "C", C: float = 1.0, domain: str = "sphere",
                 epsilon: float = 1e-3, max_iter: int = 1000, inactive_limit: int = 50,
                 candidates: Any = None, true_group: Any = None, cand_group: Any = None,
                 n_starts: int = 8, n_steps: int = 30, seed: int = 0, device: str | torch.device = "cpu",
                 line_search: bool = True, mu: float = 0.1, chunk_rows: int = 1 << 15) -> None:
        self.loss = _check_loss(loss)
        self.domain = _check_domain(domain)
        if not (isinstance(C, (int, float)) and math.isfinite(C) and C > 0):
            raise CrossViewError(f"BITR: C must be a positive number, got {C!r}; typical values are 1e-5 ... 1e5")
        if not epsilon > 0:
            raise CrossViewError(f"BITR: epsilon must be positive, got {epsilon!r}; the default is 1e-3")
        if not (isinstance(chunk_rows, int) and chunk_rows > 0):
            raise CrossViewError(f"BITR: chunk_rows must be a positive integer, got {chunk_rows!r}; "
                                 f"the default is {1 << 15}")
        self.chunk_rows = int(chunk_rows)
        self.C = float(C)
        self.epsilon = float(epsilon)
        self.max_iter = int(max_iter)
        self.inactive_limit = int(inactive_limit)
        self.n_starts = int(n_starts)
        self.n_steps = int(n_steps)
        self.seed = int(seed)
        self.device = torch.device(device)
        self.X = torch.as_tensor(np.asarray(X, dtype=np.float32) if not isinstance(X, torch.Tensor) else X,
                                 dtype=torch.float32).to(self.device)
        self.Y = torch.as_tensor(np.asarray(Y, dtype=np.float32) if not isinstance(Y, torch.Tensor) else Y,
                                 dtype=torch.float32).to(self.device)
        if self.X.ndim != 2 or self.Y.ndim != 2 or self.X.shape[0] != self.Y.shape[0] or self.X.shape[0] == 0:
            raise CrossViewError(f"BITR: inputs and outputs must be (N, p) and (N, q) with the same N > 0, "
                                 f"got {tuple(self.X.shape)} and {tuple(self.Y.shape)}")
        self.N, self.p = self.X.shape
        self.q = self.Y.shape[1]
        self.candidates = None
        self.true_group = self.cand_group = None
        if candidates is not None:
            cd = torch.as_tensor(np.asarray(candidates, dtype=np.float32)
                                 if not isinstance(candidates, torch.Tensor) else candidates, dtype=torch.float32)
            if cd.ndim != 2 or cd.shape[1] != self.q:
                raise CrossViewError(f"BITR: candidates must be (m, {self.q}), got {tuple(cd.shape)}")
            self.candidates = cd.to(self.device)
            if true_group is not None:
                self.true_group = torch.as_tensor(np.asarray(true_group, dtype=np.int64)).to(self.device)
                self.cand_group = torch.as_tensor(np.asarray(cand_group, dtype=np.int64)).to(self.device)
        self._base: torch.Tensor | None = None
        self._base_too_big = False
        pq = self.p * self.q
        self._A_buf = np.empty((16, pq))
        self.A = self._A_buf[:0]
        self.b = np.zeros(0)
        self.G = np.zeros((0, 0))
        self.alpha = np.zeros(0)
        self.idle = np.zeros(0, dtype=np.int64)
        self.W = np.zeros((self.p, self.q))
        self.line_search = bool(line_search)
        self.mu = float(mu)
        self.Wb = np.zeros((self.p, self.q))
        self.Fb = math.inf
        self.iteration = 0
        self.best_primal = math.inf
        self.converged = False
        self.history: list[dict[str, float]] = []

    # -------------------------------------------------------------------------------- pieces
    def _blocks(self) -> list[slice]:
        """The samples in blocks of :attr:`chunk_rows` rows, in order."""
        return [slice(s, min(self.N, s + self.chunk_rows)) for s in range(0, self.N, self.chunk_rows)]

    def _scores(self, *Ws: np.ndarray, rows: slice = slice(None)) -> list[torch.Tensor]:
        """``X[rows] @ W`` for each ``W (p, q)`` (one product for all of them): ``(rows, q)`` float32 each."""
        Wt = torch.from_numpy(np.concatenate([W.astype(np.float32) for W in Ws], axis=1)).to(self.device)
        c = self.X[rows] @ Wt
        return [c[:, i * self.q:(i + 1) * self.q] for i in range(len(Ws))]

    def _generator(self) -> torch.Generator | None:
        """The random starts' generator of one pass over the samples (M loss on the sphere only): made once
        a pass and handed to each block in order, so the blocks draw what one unchunked call would."""
        if self.candidates is None and self.loss == "M" and self.domain == "sphere":
            return torch.Generator().manual_seed(self.seed * 1_000_003 + self.iteration)
        return None

    def _violators(self, c: torch.Tensor, rows: slice = slice(None), gen: torch.Generator | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Most violated outputs of the samples ``rows`` at their scores ``c (n, q)``:
        ``(y_hat (n, q), margin_violation (n,), active (n,))``. ``gen``: from :meth:`_generator`."""
        Y = self.Y[rows]
        own = (c * Y).sum(1)
        if self.candidates is not None:
            base = self._finite_base()
            if base is not None:  # Delta (with the excluded candidates at -inf) is fixed: one product per call
                value, j = (base[rows] + c @ self.candidates.T).max(dim=1)
            else:
                tg = self.true_group[rows] if self.true_group is not None else None
                j, value = most_violated_finite(self.loss, c, Y, self.candidates,
                                                true_group=tg, cand_group=self.cand_group)
            y_hat = self.candidates[j]
        else:
            y_hat, value = most_violated(self.loss, c, Y, self.domain, n_starts=self.n_starts,
                                         n_steps=self.n_steps, generator=gen)
        h = value - own
        active = h > 0
        return y_hat, h, active

    def _finite_base(self) -> torch.Tensor | None:
        """``Delta(y_i, cand_j)`` for every sample and candidate, ``-inf`` where excluded: ``(N, m)``.

        It does not depend on W, so it is made once (chunked) and kept, when it fits in
        :data:`_FINITE_CACHE_ELEMENTS`; None otherwise (then each search recomputes the losses in chunks).
        """
        if self._base is None and not self._base_too_big:
            m = self.candidates.shape[0]
            if self.N * m > _FINITE_CACHE_ELEMENTS:
                self._base_too_big = True
                return None
            base = torch.empty(self.N, m, dtype=self.Y.dtype, device=self.device)
            rows = max(1, (1 << 22) // max(m, 1))
            for s in range(0, self.N, rows):
                e = min(self.N, s + rows)
                base[s:e] = delta_matrix(self.loss, self.Y[s:e], self.candidates)
                if self.true_group is not None:
                    base[s:e].masked_fill_(self.true_group[s:e, None] == self.cand_group[None, :], float("-inf"))
            self._base = base
        return self._base

    def _plane(self, W: np.ndarray) -> tuple[np.ndarray, float]:
        """The most violated 1-slack constraint at ``W (p, q)``: ``(A (p*q,) float32 values, b)``.

        One pass over the samples in blocks: each block's scores, most violated outputs and its share of
        ``X^T (Y - Y^)`` and of the losses; nothing ``N x q`` is formed.
        """
        gen = self._generator()
        A = torch.zeros(self.p, self.q, dtype=torch.float64, device=self.device)
        lsum = 0.0
        for r in self._blocks():
            (c,) = self._scores(W, rows=r)
            y_hat, _, active = self._violators(c, r, gen)
            Y = self.Y[r]
            D = (Y - y_hat).mul_(active[:, None])
            A += (self.X[r].T @ D).double()
            lsum += float((delta(self.loss, Y, y_hat) * active).double().sum())
        A /= self.N
        return A.cpu().numpy().astype(np.float32).ravel(), lsum / self.N

    def _segment(self, Wb: np.ndarray, Wc: np.ndarray) -> Callable[[float], tuple[float, float]]:
        """``k -> (R(k), R'(k))``: the mean hinge at ``W = Wb + k (Wc - Wb)`` and its derivative in ``k``.

        With ``cb = X Wb`` and ``e = X (Wc - Wb)``, the scores are ``cb + k e``. Sphere with the C or E loss:
        each hinge is ``base_i + ||u_i + k e_i|| - (cb_i + k e_i) . y_i`` (``u = cb - kappa y``), so five
        numbers per sample (made a block at a time, with ``||y_i||^2`` for E) make every evaluation O(N). On the simplex and with finite
        candidates every output's score is linear in ``k`` (``P + k Q``, made once): one max per evaluation,
        a block at a time. Otherwise (M on the sphere) the most violated outputs are recomputed (Danskin:
        ``dh_i/dk = e_i . (y^_i - y_i)`` where ``h_i > 0``), a block at a time.
        """
        Dw = Wc - Wb
        if self.candidates is None and self.domain == "sphere" and self.loss in ("C", "E"):
            kappa = 1.0 if self.loss == "C" else 2.0
            parts = []
            for r in self._blocks():
                cb, e = self._scores(Wb, Dw, rows=r)
                Y = self.Y[r]
                u = cb - kappa * Y
                parts.append(torch.stack([(u * u).sum(1), (u * e).sum(1), (e * e).sum(1), (cb * Y).sum(1),
                                          (e * Y).sum(1), (Y * Y).sum(1)]).double())
            uu, ue, ee, cy, ey, yy = torch.cat(parts, dim=1)
            base = 1.0 if self.loss == "C" else yy + 1.0

            def f(k: float) -> tuple[float, float]:
                nrm = (uu + 2 * k * ue + k * k * ee).clamp_min(0).sqrt()
                h = base + nrm - (cy + k * ey)
                act = h > 0
                dh = (ue + k * ee) / nrm.clamp_min(1e-30) - ey
                return float((h * act).mean()), float((dh * act).mean())
            return f

        cb, e = self._scores(Wb, Dw)
        base = self._finite_base() if self.candidates is not None else None
        if self.candidates is None and self.domain == "simplex":
            # the most violated output is one of the q vertices: a finite set whose scores are P + k Q
            P, Q = vertex_losses(self.loss, self.Y) + cb, e
        elif base is not None:
            # every candidate's score is linear in k: P + k Q, with two (N, m) matrices made once
            P = base + cb @ self.candidates.T
            Q = e @ self.candidates.T
        else:
            P = None
        blocks = self._blocks()
        if P is not None:
            own_b, own_e = (cb * self.Y).sum(1), (e * self.Y).sum(1)
            del cb, e

            def fin(k: float) -> tuple[float, float]:
                hs = ds = 0.0
                for r in blocks:
                    v, j = (P[r] + k * Q[r]).max(dim=1)
                    h = v - (own_b[r] + k * own_e[r])
                    act = h > 0
                    dh = Q[r].gather(1, j[:, None])[:, 0] - own_e[r]
                    hs += float((h * act).double().sum())
                    ds += float((dh * act).double().sum())
                return hs / self.N, ds / self.N
            return fin

        def g(k: float) -> tuple[float, float]:
            gen = self._generator()
            hs = ds = 0.0
            for r in blocks:
                er = e[r]
                c = cb[r] + k * er
                y_hat, h, active = self._violators(c, r, gen)
                dh = (er * (y_hat - self.Y[r])).sum(1)
                hs += float((h * active).double().sum())
                ds += float((dh * active).double().sum())
            return hs / self.N, ds / self.N
        return g

    def _line_search(self, Wb: np.ndarray, Wc: np.ndarray, seg: Callable[[float], tuple[float, float]]
                     ) -> tuple[float, float]:
        """``argmin_{k >= 0} F(Wb + k (Wc - Wb))`` of the true primal (convex in k) by safeguarded
        secant / bisection on the derivative. Returns ``(k, F at k)``."""
        Dw = Wc - Wb
        dd = float((Dw * Dw).sum())
        bb = float((Wb * Wb).sum())
        bd = float((Wb * Dw).sum())

        def F(k: float) -> tuple[float, float]:
            r, dr = seg(k)
            return 0.5 * (bb + 2 * k * bd + k * k * dd) + self.C * r, bd + k * dd + self.C * dr

        # sphere C / E segments cost O(N) per evaluation and simplex ones O(N q): search finely; finite
        # candidates cost O(N m) and M on the sphere re-solves the most violated outputs each time, so a
        # coarse minimiser is enough there (any k with F(k) <= F(0) keeps OCAS's guarantees)
        cheap = self.candidates is None and (self.domain == "simplex" or self.loss in ("C", "E"))
        max_evals = 40 if cheap else 10
        f0, g0 = F(0.0)
        if dd <= 0 or g0 >= 0:
            return 0.0, f0
        lo, glo = 0.0, g0
        hi = 1.0
        fhi, ghi = F(hi)
        while ghi < 0 and hi < 1e6:
            lo, glo = hi, ghi
            hi *= 2.0
            fhi, ghi = F(hi)
        if ghi < 0:
            return hi, fhi
        best_k, best_f = (hi, fhi) if fhi < f0 else (0.0, f0)
        for _ in range(max_evals):
            k = lo + (hi - lo) * (-glo) / (ghi - glo) if ghi > glo else 0.5 * (lo + hi)
            if not (lo + 0.01 * (hi - lo) < k < hi - 0.01 * (hi - lo)):
                k = 0.5 * (lo + hi)
            fk, gk = F(k)
            if fk < best_f:
                best_k, best_f = k, fk
            if gk < 0:
                lo, glo = k, gk
            else:
                hi, ghi = k, gk
            if hi - lo <= 1e-7 * hi or abs(gk) <= 1e-10 * abs(g0):
                break
        return best_k, best_f

    def _solve(self) -> int:
        if self.b.shape[0] == 0:
            self.alpha = np.zeros(0)
            self.W = np.zeros((self.p, self.q))
            return 0
        res = solve_dual_qp(self.G, self.b, self.C, self.alpha)
        self.alpha = res.alpha
        self.W = (self.alpha @ self.A).reshape(self.p, self.q)
        return res.iterations

    def _add(self, a: np.ndarray, b: float) -> None:
        a64 = a.astype(np.float64)
        K = self.b.shape[0]
        row = self.A @ a64
        # grow the direction buffer by doubling (appending with vstack would copy it every iteration)
        if K >= self._A_buf.shape[0]:
            buf = np.empty((max(16, 2 * K), a64.shape[0]))
            buf[:K] = self.A
            self._A_buf = buf
        self._A_buf[K] = a64
        self.A = self._A_buf[:K + 1]
        G = np.empty((K + 1, K + 1))
        G[:K, :K] = self.G
        G[K, :K] = row
        G[:K, K] = row
        G[K, K] = a64 @ a64
        self.G = G
        self.b = np.append(self.b, b)
        self.alpha = np.append(self.alpha, 0.0)
        self.idle = np.append(self.idle, 0)

    def _prune(self) -> None:
        zero = self.alpha <= 0
        self.idle = np.where(zero, self.idle + 1, 0)
        keep = self.idle <= self.inactive_limit
        if not keep.all():
            n_keep = int(keep.sum())
            self._A_buf[:n_keep] = self.A[keep]
            self.A = self._A_buf[:n_keep]
            self.b = self.b[keep]
            self.G = self.G[np.ix_(keep, keep)]
            self.alpha = self.alpha[keep]
            self.idle = self.idle[keep]
            self.W = (self.alpha @ self.A).reshape(self.p, self.q) if self.b.shape[0] else np.zeros((self.p, self.q))

    def _bounds(self) -> tuple[float, float, float]:
        """``(xi, ||W||^2, dual)`` of the current working-set solution."""
        if self.b.shape[0] == 0:
            return 0.0, 0.0, 0.0
        Ga = self.G @ self.alpha
        wsq = float(self.alpha @ Ga)
        xi = max(0.0, float(np.max(self.b - Ga)))
        return xi, wsq, float(self.b @ self.alpha - 0.5 * wsq)

    # ------------------------------------------------------------------------------ training
    def step(self) -> IterationInfo:
        """One cutting-plane iteration: most violated constraint, stop test, add it, re-solve the QP.

        Plain (Joachims et al. 2009): the new plane is computed at the working-set solution ``W_c``.
        With ``line_search`` (OCAS, Franc & Sonnenburg 2009): first ``W_b`` (the best point so far)
        moves to the minimiser of the true primal on the segment towards ``W_c``, and the plane is
        computed at ``(1 - mu) W_b + mu W_c``. Both stop when the model is within ``C * epsilon`` of
        the optimum.
        """
        with _one_blas_thread():
            return self._step()

    def _step(self) -> IterationInfo:
        import time
        t0 = time.perf_counter()
        K = self.b.shape[0]
        xi, wsq_c, dual = self._bounds()
        Wc = self.W
        if self.line_search and K > 0:
            k, self.Fb = self._line_search(self.Wb, Wc, self._segment(self.Wb, Wc))
            self.Wb = self.Wb + k * (Wc - self.Wb)
            Ws = (1.0 - self.mu) * self.Wb + self.mu * Wc
        else:
            Ws = Wc
        a, b = self._plane(Ws)
        hinge = b - float(Ws.ravel() @ a.astype(np.float64))  # = 1/N sum_i xi_i at Ws
        wsq_s = wsq_c if Ws is Wc else float((Ws ** 2).sum())
        primal = 0.5 * wsq_s + self.C * hinge
        violation = hinge - xi
        if self.line_search:
            if primal < self.Fb:
                self.Wb, self.Fb = Ws.copy(), primal
            self.best_primal = self.Fb
            done = (self.Fb - dual) <= self.C * self.epsilon and K > 0
        else:
            self.best_primal = min(self.best_primal, primal)
            done = violation <= self.epsilon
        qp_steps = 0
        if done:
            self.converged = True
        else:
            self._add(a, b)
            qp_steps = self._solve()
            self._prune()
            _, _, dual = self._bounds()
        self.iteration += 1
        info = IterationInfo(iteration=self.iteration, primal=self.best_primal if self.line_search else primal,
                             dual=dual, gap=self.best_primal - dual, violation=violation, xi=xi, loss=hinge,
                             norm_w=math.sqrt(max(wsq_s, 0.0)), n_constraints=int(self.b.shape[0]),
                             qp_steps=qp_steps, converged=self.converged, seconds=time.perf_counter() - t0)
        self.history.append(info.terms())
        return info

    @property
    def solution(self) -> np.ndarray:
        """The learned ``W (p, q) float64``: the best point (line search) or the last QP solution."""
        return self.Wb if self.line_search else self.W

    def run(self, should_stop: Callable[[], bool] | None = None):
        """Iterate until converged or ``max_iter``; yields one :class:`IterationInfo` per iteration."""
        while not self.converged and self.iteration < self.max_iter:
            if should_stop is not None and should_stop():
                return
            yield self.step()

    def fit(self) -> "CuttingPlaneTrainer":
        """Run to the end; returns self."""
        for _ in self.run():
            pass
        return self

    def set_C(self, C: float) -> None:
        """Change ``C`` keeping the working set (cutting planes do not depend on C): warm start for
        a grid of increasing C. Re-solves the QP and clears the convergence flag."""
        if not (math.isfinite(C) and C > 0):
            raise CrossViewError(f"BITR: C must be a positive number, got {C!r}")
        self.C = float(C)
        self.converged = False
        self.best_primal = math.inf
        self.Fb = math.inf
        self.idle = np.zeros_like(self.idle)
        with _one_blas_thread():
            self._solve()

    # ------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The working set and solution (numpy/python only); directions saved as float32 losslessly."""
        return {"A": self.A.astype(np.float32).reshape(-1, self.p, self.q), "b": self.b.copy(),
                "G": self.G.copy(), "alpha": self.alpha.copy(), "idle": self.idle.copy(), "C": self.C,
                "iteration": self.iteration, "best_primal": self.best_primal, "converged": self.converged,
                "history": list(self.history), "shape": (self.p, self.q), "Wb": self.Wb.copy(), "Fb": self.Fb}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (the data and options come from the constructor)."""
        if tuple(d["shape"]) != (self.p, self.q):
            raise CrossViewError(f"BITR: the saved working set is for {tuple(d['shape'])} features, these "
                                 f"are ({self.p}, {self.q}); resume with the same features")
        A = np.asarray(d["A"], dtype=np.float32).reshape(-1, self.p * self.q)
        self._A_buf = np.empty((max(16, 2 * A.shape[0]), self.p * self.q))
        self._A_buf[:A.shape[0]] = A
        self.A = self._A_buf[:A.shape[0]]
        self.b = np.asarray(d["b"], dtype=np.float64).copy()
        self.G = np.asarray(d["G"], dtype=np.float64).copy()
        self.alpha = np.asarray(d["alpha"], dtype=np.float64).copy()
        self.idle = np.asarray(d["idle"], dtype=np.int64).copy()
        self.C = float(d["C"])
        self.iteration = int(d["iteration"])
        self.best_primal = float(d["best_primal"])
        self.converged = bool(d["converged"])
        self.history = list(d.get("history", []))
        self.Wb = np.asarray(d["Wb"], dtype=np.float64).copy()
        self.Fb = float(d["Fb"])
        self.W = (self.alpha @ self.A).reshape(self.p, self.q) if self.b.shape[0] else np.zeros((self.p, self.q))
