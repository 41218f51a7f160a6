"""BITR: Bilateral Image-Text Retrieval with a structural SVM (paper 001, Verma & Jawahar).

Score ``F(x, y) = x^T W y`` with ``W (p, q)``, i.e. ``w . (x (x) y)`` over the tensor-product joint
feature, which is never materialised. Training solves the n-slack structural SVM with margin rescaling::

    min_W  1/2 ||W||_F^2 + C/N sum_i xi_i
    s.t.   x_i^T W y_i >= x_i^T W y + Delta(y_i, y) - xi_i      for all i and all outputs y

in its equivalent 1-slack form (Joachims, Finley & Yu 2009, Algorithm 4): each cutting-plane iteration
finds every sample's most violated output, adds ONE averaged constraint
``<W, A> >= b - xi`` with ``A = 1/N sum_i x_i (y_i - y^_i)^T (p, q)`` and ``b = 1/N sum_i Delta(y_i, y^_i)``,
and re-solves the small dual QP over the working set (:mod:`crossview.methods._qp`) with the Gram
matrix ``G_jk = <A_j, A_k>_F``. Im2Text and Text2Im are two separate models (for Text2Im the roles of
image and caption swap). Inference is one matrix product: ``s = (x^T W) Y`` (section 5.2).

Losses (eq. 5-7): ``Delta_M = ||y_i - y||_1``, ``Delta_E = ||y_i - y||_2^2``, ``Delta_C = 1 - y_i . y``.
Outputs live on the unit sphere (L2-normalised features) or on the probability simplex (L1-normalised,
non-negative features such as LDA topics). Most violated constraints ``argmax_y Delta(y_i, y) + c_i . y``
with ``c_i = W^T x_i``:

- sphere, C: ``normalise(c_i - y_i)``; sphere, E: ``normalise(c_i - 2 y_i)`` (closed forms);
- simplex (any of the three): the best vertex ``e_k`` (a convex function is maximised at a vertex);
- sphere, M: no closed form. ``||y_i - y||_1 = max_{s in {-1,1}^q} s . (y_i - y)``, so we alternate
  ``y <- normalise(c_i - s)`` and ``s <- sign(y_i - y)`` from several starts. This is projected
  subgradient ascent with an infinite step (``y <- P(g)``, ``g = c_i + sign(y - y_i)``), which never
  decreases a convex objective on the sphere;
- finite: ``y`` ranges over a candidate set (the training outputs); one matrix product per chunk.

This module holds the maths as plain functions (torch tensors or numpy arrays in, the same kind out)
and the cutting-plane trainer :class:`CuttingPlaneTrainer`; the registered method wraps them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from crossview.core.errors import CrossViewError
from crossview.methods import register_method
from crossview.methods._qp import solve_dual_qp
from crossview.methods.base import Method, MethodData, check_direction

__all__ = [
    "LOSSES", "DOMAINS", "normalize_rows", "delta", "delta_matrix", "most_violated",
    "most_violated_finite", "hinge_terms", "primal_objective", "CuttingPlaneTrainer", "IterationInfo",
]

#: Loss name -> what it is (eq. 5, 6, 7 of the paper).
LOSSES: dict[str, str] = {
    "M": "Manhattan distance ||y_i - y||_1",
    "E": "squared Euclidean distance ||y_i - y||_2^2",
    "C": "normalised correlation 1 - y_i . y",
}
#: Where the outputs live: the unit sphere (L2-normalised) or the probability simplex (L1, non-negative).
DOMAINS = ("sphere", "simplex")
#: How BITR reduces its input features (the ``reduce`` parameter): ``cca`` projects both views on the top
#: ``cca_dim`` canonical directions of the training pairs, ``pca`` reduces each view wider than ``pca_dim``.
REDUCTIONS = ("auto", "pca", "cca")
#: The CCA of ``reduce="cca"``: relative ridge and correlation weighting (CCA's defaults on real photos).
CCA_REG = 5.0
CCA_WEIGHT_POWER = 0.5

#: What a run trains BITR on (the ``representation`` parameter): the encoders' features, or paper 001's
#: TR / CTR, built and fitted on the training split by the run (crossview.features.topics).
REPRESENTATIONS = ("features", "tr", "ctr")

_EPS = 1e-12
#: The finite variant keeps the (N, m) loss matrix, and its line search two more, when N * m is at most this.
_FINITE_CACHE_ELEMENTS = 1 << 26


# ------------------------------------------------------------------------------------------ helpers
def _check_loss(loss: str) -> str:
    key = str(loss).upper()
    if key not in LOSSES:
        raise CrossViewError(f"unknown BITR loss {loss!r}; choose one of {', '.join(LOSSES)} "
                             "(M = Manhattan, E = squared Euclidean, C = normalised correlation)")
    return key


def _check_domain(domain: str) -> str:
    if domain not in DOMAINS:
        raise CrossViewError(f"unknown output domain {domain!r}; choose one of {', '.join(DOMAINS)}")
    return domain


def _to_torch(*arrays: Any) -> tuple[list[torch.Tensor], bool]:
    """Tensors of the inputs and whether they came as numpy (so results go back as numpy)."""
    was_numpy = any(not isinstance(a, torch.Tensor) for a in arrays if a is not None)
    out = []
    for a in arrays:
        if a is None or isinstance(a, torch.Tensor):
            out.append(a)
        else:
            arr = np.asarray(a)
            if arr.dtype not in (np.float32, np.float64) and arr.dtype.kind == "f":
                arr = arr.astype(np.float64)
            out.append(torch.from_numpy(np.ascontiguousarray(arr)))
    return out, was_numpy


def _back(x: torch.Tensor, to_numpy: bool) -> Any:
    return x.detach().cpu().numpy() if to_numpy else x


_BLAS = None


def _one_blas_thread() -> Any:
    """Context in which numpy's BLAS / LAPACK use one thread.

    The dense algebra here on numpy's side (the QP, Gram rows, ``W = alpha A``, PCA) is small, and
    OpenBLAS's thread pool is slower than one thread at these sizes - by 10-40x on a busy shared CPU,
    measured. The big ``N x p x q`` products run in torch, whose threads this does not touch.
    """
    global _BLAS
    try:
        if _BLAS is None:
            import threadpoolctl
            _BLAS = threadpoolctl.ThreadpoolController()
        return _BLAS.limit(limits=1, user_api="blas")
    except Exception:  # noqa: BLE001 - threadpoolctl missing or confused: just run with the defaults
        import contextlib
        return contextlib.nullcontext()


def _l2n(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True).clamp_min(_EPS)


def normalize_rows(a: np.ndarray, norm: str, what: str = "features") -> np.ndarray:
    """Rows of ``a (n, d)`` scaled to unit L1 (``"l1"``, needs non-negative values) or L2 norm.

    Zero rows stay zero. Returns float32 ``(n, d)``.
    """
    a = np.asarray(a, dtype=np.float32)
    if a.ndim != 2:
        raise CrossViewError(f"BITR: {what} must be a 2-D (n, d) matrix, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise CrossViewError(f"BITR: the {what} contain NaN or inf values; re-extract the features")
    if norm == "l1":
        if a.size and a.min() < 0:
            raise CrossViewError(
                f"BITR: normalize='l1' puts the {what} on the probability simplex and needs non-negative "
                f"values, but the smallest is {a.min():.4g}; use normalize='l2', or non-negative "
                "features such as LDA topic distributions")
        s = a.sum(axis=1, keepdims=True)
    elif norm == "l2":
        s = np.sqrt((a.astype(np.float64) ** 2).sum(axis=1, keepdims=True)).astype(np.float32)
    else:
        raise CrossViewError(f"BITR: unknown normalisation {norm!r}; choose 'l2', 'l1' or 'paper'")
    s[s == 0] = 1.0
    return (a / s).astype(np.float32)


# ------------------------------------------------------------------------------------------ losses
def delta(loss: str, y_true: Any, y: Any) -> Any:
    """Row-wise structured loss ``Delta(y_true[i], y[i])``.

    Args:
        loss: ``"M"``, ``"E"`` or ``"C"``.
        y_true, y: ``(n, q)`` float arrays or tensors (the same kind).

    Returns:
        ``(n,)`` losses, numpy if the inputs were numpy.
    """
    loss = _check_loss(loss)
    (yt, yy), np_in = _to_torch(y_true, y)
    yy = yy.to(yt.dtype)
    if loss == "M":
        out = (yt - yy).abs().sum(-1)
    elif loss == "E":
        out = ((yt - yy) ** 2).sum(-1)
    else:
        out = 1.0 - (yt * yy).sum(-1)
    return _back(out, np_in)


def delta_matrix(loss: str, y_true: Any, cands: Any) -> Any:
    """All-pairs loss ``Delta(y_true[i], cands[j])``: ``(n, q), (m, q) -> (n, m)``."""
    loss = _check_loss(loss)
    (yt, cd), np_in = _to_torch(y_true, cands)
    cd = cd.to(yt.dtype)
    if loss == "M":
        out = torch.cdist(yt, cd, p=1)
    elif loss == "E":
        out = ((yt * yt).sum(1, keepdim=True) + (cd * cd).sum(1)[None, :] - 2.0 * yt @ cd.T).clamp_min(0)
    else:
        out = 1.0 - yt @ cd.T
    return _back(out, np_in)


# ------------------------------------------------------------------------ most violated constraint
def _manhattan_sphere(c: torch.Tensor, yt: torch.Tensor, n_starts: int, n_steps: int,
                      generator: torch.Generator | None) -> torch.Tensor:
    """``argmax_{||y||=1} ||yt - y||_1 + c.y`` by alternating ``y = normalise(c - s)``, ``s = sign(yt - y)``.

    ``c, yt (n, q)``; returns ``y (n, q)`` (best of the starts). Starts: ``s = sign(yt)`` (move away
    from the truth), the sign patterns of the closed-form maximisers of the C and E losses and of
    ``normalise(c)``, then random sign vectors.
    """
    n, q = c.shape

    def sgn(v: torch.Tensor) -> torch.Tensor:
        return torch.where(v >= 0, 1.0, -1.0).to(c.dtype)

    starts = [sgn(yt), sgn(yt - _l2n(c - yt)), sgn(yt - _l2n(c - 2 * yt)), sgn(yt - _l2n(c))]
    starts = starts[:max(1, n_starts)]
    n_rand = max(0, n_starts - len(starts))
    s = torch.stack(starts, dim=1)  # (n, S, q)
    if n_rand:
        r = torch.randint(0, 2, (n, n_rand, q), generator=generator, device="cpu").to(c.device, c.dtype) * 2 - 1
        s = torch.cat([s, r], dim=1)
    S = s.shape[1]
    cc = c[:, None, :].expand(n, S, q).reshape(n * S, q)
    ytt = yt[:, None, :].expand(n, S, q).reshape(n * S, q)
    s = s.reshape(n * S, q).contiguous()
    y = _l2n(cc - s)
    live = torch.arange(n * S, device=c.device)  # (sample, start) pairs still changing sign pattern
    for _ in range(n_steps):
        if live.numel() == 0:
            break
        yl, sl, tl = y[live], s[live], ytt[live]
        diff = tl - yl
        s_new = torch.where(diff > 0, 1.0, torch.where(diff < 0, -1.0, sl)).to(c.dtype)
        changed = (s_new != sl).any(dim=1)
        live = live[changed]
        s[live] = s_new[changed]
        y[live] = _l2n(cc[live] - s[live])
    val = ((ytt - y).abs().sum(-1) + (cc * y).sum(-1)).reshape(n, S)
    best = val.argmax(dim=1)
    return y.reshape(n, S, q)[torch.arange(n, device=c.device), best]


def vertex_losses(loss: str, yt: torch.Tensor) -> torch.Tensor:
    """``Delta(yt[i], e_k)`` for every sample and simplex vertex ``e_k``: ``(n, q) -> (n, q)``."""
    if loss == "M":
        return yt.abs().sum(1, keepdim=True) - yt.abs() + (1.0 - yt).abs()
    if loss == "E":
        return (yt * yt).sum(1, keepdim=True) - 2.0 * yt + 1.0
    return 1.0 - yt


def most_violated(loss: str, c: Any, y_true: Any, domain: str = "sphere", *, n_starts: int = 8,
                  n_steps: int = 30, generator: torch.Generator | None = None) -> tuple[Any, Any]:
    """``argmax_y Delta(y_true[i], y) + c[i] . y`` over the unit sphere or the probability simplex.

    Args:
        loss: ``"M"``, ``"E"`` or ``"C"``.
        c: ``(n, q)`` the scores' linear part, ``c_i = W^T x_i``.
        y_true: ``(n, q)`` the true outputs (on the same domain).
        domain: ``"sphere"`` (L2-normalised outputs) or ``"simplex"`` (L1-normalised, non-negative).
        n_starts, n_steps, generator: for the M loss on the sphere (projected subgradient ascent).

    Returns:
        ``(y_hat (n, q), value (n,))`` with ``value = Delta(y_true, y_hat) + c . y_hat``.
    """
    loss = _check_loss(loss)
    domain = _check_domain(domain)
    (cc, yt), np_in = _to_torch(c, y_true)
    yt = yt.to(cc.dtype)
    n, q = cc.shape
    if domain == "simplex":
        # value at vertex e_k of Delta(yt, e_k) + c_k
        vals = vertex_losses(loss, yt) + cc
        k = vals.argmax(dim=1)
        y_hat = torch.zeros_like(cc)
        y_hat[torch.arange(n, device=cc.device), k] = 1.0
    elif loss in ("C", "E"):
        # C: 1 - yt.y + c.y = 1 + (c - yt).y  ->  y = normalise(c - yt), value 1 + ||c - yt||
        # E (unit y): |yt|^2 + 1 - 2 yt.y + c.y  ->  y = normalise(c - 2 yt), value |yt|^2 + 1 + ||c - 2 yt||
        kappa = 1.0 if loss == "C" else 2.0
        d = cc - kappa * yt
        nrm = d.norm(dim=1, keepdim=True)
        y_hat = torch.where(nrm > _EPS, d / nrm.clamp_min(_EPS), _l2n(yt))
        base = 1.0 if loss == "C" else (yt * yt).sum(1) + 1.0
        return _back(y_hat, np_in), _back(base + nrm[:, 0], np_in)
    else:
        y_hat = _manhattan_sphere(cc, yt, n_starts, n_steps, generator)
    value = delta(loss, yt, y_hat) + (cc * y_hat).sum(1)
    return _back(y_hat, np_in), _back(value, np_in)


def most_violated_finite(loss: str, c: Any, y_true: Any, cands: Any, *, true_group: Any = None,
                         cand_group: Any = None, chunk_elements: int = 1 << 23) -> tuple[Any, Any]:
    """``argmax_j Delta(y_true[i], cands[j]) + c[i] . cands[j]`` over a finite candidate set.

    Candidates whose group equals the sample's group (the other captions of the same image, or the
    sample's own image) are excluded: they are not wrong outputs.

    Args:
        loss: ``"M"``, ``"E"`` or ``"C"``.
        c: ``(n, q)``, ``c_i = W^T x_i``.
        y_true: ``(n, q)`` the true outputs.
        cands: ``(m, q)`` the candidate outputs.
        true_group: ``(n,) int64`` group of each sample (or None: nothing excluded).
        cand_group: ``(m,) int64`` group of each candidate.
        chunk_elements: rows are processed in chunks of about this many ``(rows, m)`` scores.

    Returns:
        ``(index (n,) int64, value (n,))``; ``value`` is ``-inf`` where every candidate is excluded.
    """
    loss = _check_loss(loss)
    (cc, yt, cd), np_in = _to_torch(c, y_true, cands)
    yt = yt.to(cc.dtype)
    cd = cd.to(cc.dtype)
    n = cc.shape[0]
    m = cd.shape[0]
    tg = cg = None
    if true_group is not None and cand_group is not None:
        (tg, cg), _ = _to_torch(true_group, cand_group)
        tg = tg.to(cc.device)
        cg = cg.to(cc.device)
    idx = torch.empty(n, dtype=torch.int64, device=cc.device)
    val = torch.empty(n, dtype=cc.dtype, device=cc.device)
    rows = max(1, chunk_elements // max(m, 1))
    cd_sq = (cd * cd).sum(1)
    for s in range(0, n, rows):
        e = min(n, s + rows)
        ci, yi = cc[s:e], yt[s:e]
        if loss == "C":
            sc = 1.0 + (ci - yi) @ cd.T
        elif loss == "E":
            sc = (yi * yi).sum(1, keepdim=True) + cd_sq[None, :] + (ci - 2.0 * yi) @ cd.T
        else:
            sc = torch.cdist(yi, cd, p=1) + ci @ cd.T
        if tg is not None:
            sc = sc.masked_fill(tg[s:e, None] == cg[None, :], float("-inf"))
        v, j = sc.max(dim=1)
        idx[s:e] = j
        val[s:e] = v
    return _back(idx, np_in), _back(val, np_in)


# ------------------------------------------------------------------------------- primal objective
def hinge_terms(loss: str, X: Any, Y: Any, W: Any, domain: str = "sphere", *, candidates: Any = None,
                true_group: Any = None, cand_group: Any = None, n_starts: int = 8, n_steps: int = 30,
                generator: torch.Generator | None = None) -> tuple[Any, Any]:
    """Each sample's structured hinge ``max(0, max_y Delta(y_i, y) + x_i^T W y - x_i^T W y_i)``.

    ``X (N, p)``, ``Y (N, q)``, ``W (p, q)``; ``candidates (m, q)`` switches to the finite variant.
    Returns ``(hinge (N,), y_hat (N, q))`` where ``y_hat`` is the most violated output (``y_i`` itself
    where the hinge is zero).
    """
    (Xt, Yt, Wt), np_in = _to_torch(X, Y, W)
    Wt = Wt.to(Xt.dtype)
    Yt = Yt.to(Xt.dtype)
    c = Xt @ Wt
    own = (c * Yt).sum(1)
    if candidates is None:
        y_hat, value = most_violated(loss, c, Yt, domain, n_starts=n_starts, n_steps=n_steps, generator=generator)
    else:
        (cd,), _ = _to_torch(candidates)
        cd = cd.to(Xt.dtype)
        j, value = most_violated_finite(loss, c, Yt, cd, true_group=true_group, cand_group=cand_group)
        y_hat = cd[j]
    h = value - own
    active = h > 0
    h = torch.where(active, h, torch.zeros_like(h))
    y_hat = torch.where(active[:, None], y_hat, Yt)
    return _back(h, np_in), _back(y_hat, np_in)


def primal_objective(loss: str, X: Any, Y: Any, W: Any, C: float, domain: str = "sphere", **kw: Any) -> float:
    """The n-slack primal ``1/2 ||W||_F^2 + C/N sum_i hinge_i`` (eq. 3) at ``W (p, q)``."""
    h, _ = hinge_terms(loss, X, Y, W, domain, **kw)
    Wn = np.asarray(W.detach().cpu() if isinstance(W, torch.Tensor) else W, dtype=np.float64)
    return float(0.5 * (Wn ** 2).sum() + C * float(np.mean(np.asarray(h, dtype=np.float64))))


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
    """

    def __init__(self, X: Any, Y: Any, *, loss: str = "C", C: float = 1.0, domain: str = "sphere",
                 epsilon: float = 1e-3, max_iter: int = 1000, inactive_limit: int = 50,
                 candidates: Any = None, true_group: Any = None, cand_group: Any = None,
                 n_starts: int = 8, n_steps: int = 30, seed: int = 0, device: str | torch.device = "cpu",
                 line_search: bool = True, mu: float = 0.1) -> None:
        self.loss = _check_loss(loss)
        self.domain = _check_domain(domain)
        if not (isinstance(C, (int, float)) and math.isfinite(C) and C > 0):
            raise CrossViewError(f"BITR: C must be a positive number, got {C!r}; typical values are 1e-5 ... 1e5")
        if not epsilon > 0:
            raise CrossViewError(f"BITR: epsilon must be positive, got {epsilon!r}; the default is 1e-3")
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
    def _scores(self, *Ws: np.ndarray) -> list[torch.Tensor]:
        """``X @ W`` for each ``W (p, q)`` (one product for all of them): ``(N, q)`` float32 each."""
        Wt = torch.from_numpy(np.concatenate([W.astype(np.float32) for W in Ws], axis=1)).to(self.device)
        c = self.X @ Wt
        return [c[:, i * self.q:(i + 1) * self.q] for i in range(len(Ws))]

    def _violators(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Most violated outputs at scores ``c (N, q)``: ``(y_hat (N, q), margin_violation (N,), active (N,))``."""
        own = (c * self.Y).sum(1)
        if self.candidates is not None:
            base = self._finite_base()
            if base is not None:  # Delta (with the excluded candidates at -inf) is fixed: one product per call
                value, j = (base + c @ self.candidates.T).max(dim=1)
            else:
                j, value = most_violated_finite(self.loss, c, self.Y, self.candidates,
                                                true_group=self.true_group, cand_group=self.cand_group)
            y_hat = self.candidates[j]
        else:
            gen = None
            if self.loss == "M" and self.domain == "sphere":
                gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.iteration)
            y_hat, value = most_violated(self.loss, c, self.Y, self.domain, n_starts=self.n_starts,
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

    def _plane(self, c: torch.Tensor) -> tuple[np.ndarray, float]:
        """The most violated 1-slack constraint at scores ``c = X W``: ``(A (p*q,) float32 values, b)``."""
        y_hat, _, active = self._violators(c)
        D = torch.where(active[:, None], self.Y - y_hat, torch.zeros_like(y_hat))
        A = (self.X.T @ D) / self.N
        lv = torch.where(active, delta(self.loss, self.Y, y_hat), torch.zeros(1, dtype=y_hat.dtype,
                                                                               device=y_hat.device))
        return A.cpu().numpy().astype(np.float32).ravel(), float(lv.double().mean())

    def _segment(self, cb: torch.Tensor, e: torch.Tensor) -> Callable[[float], tuple[float, float]]:
        """``k -> (R(k), R'(k))``: the mean hinge at scores ``cb + k e`` and its derivative in ``k``.

        Sphere with the C or E loss: each hinge is ``base_i + ||u_i + k e_i|| - (cb_i + k e_i) . y_i``
        (``u = cb - kappa y``), so five numbers per sample make every evaluation O(N). On the simplex and
        with finite candidates every output's score is linear in ``k`` (``P + k Q``, made once): one max
        per evaluation. Otherwise (M on the sphere) the most violated outputs are recomputed (Danskin:
        ``dh_i/dk = e_i . (y^_i - y_i)`` where ``h_i > 0``).
        """
        if self.candidates is None and self.domain == "sphere" and self.loss in ("C", "E"):
            kappa = 1.0 if self.loss == "C" else 2.0
            u = cb - kappa * self.Y
            dots = torch.stack([(u * u).sum(1), (u * e).sum(1), (e * e).sum(1), (cb * self.Y).sum(1),
                                (e * self.Y).sum(1)]).double()
            uu, ue, ee, cy, ey = dots
            base = 1.0 if self.loss == "C" else (self.Y * self.Y).sum(1).double() + 1.0

            def f(k: float) -> tuple[float, float]:
                nrm = (uu + 2 * k * ue + k * k * ee).clamp_min(0).sqrt()
                h = base + nrm - (cy + k * ey)
                act = h > 0
                dh = (ue + k * ee) / nrm.clamp_min(1e-30) - ey
                return float((h * act).mean()), float((dh * act).mean())
            return f

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
        if P is not None:
            own_b, own_e = (cb * self.Y).sum(1), (e * self.Y).sum(1)

            def fin(k: float) -> tuple[float, float]:
                v, j = (P + k * Q).max(dim=1)
                h = v - (own_b + k * own_e)
                act = h > 0
                dh = Q.gather(1, j[:, None])[:, 0] - own_e
                return float((h * act).double().mean()), float((dh * act).double().mean())
            return fin

        def g(k: float) -> tuple[float, float]:
            c = cb + k * e
            y_hat, h, active = self._violators(c)
            dh = (e * (y_hat - self.Y)).sum(1)
            return float((h * active).double().mean()), float((dh * active).double().mean())
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
            cb, cc = self._scores(self.Wb, Wc)
            e = cc - cb
            k, self.Fb = self._line_search(self.Wb, Wc, self._segment(cb, e))
            self.Wb = self.Wb + k * (Wc - self.Wb)
            Ws = (1.0 - self.mu) * self.Wb + self.mu * Wc
            cs = cb + ((1.0 - self.mu) * k + self.mu) * e
        else:
            Ws = Wc
            (cs,) = self._scores(Wc)
        a, b = self._plane(cs)
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


# ------------------------------------------------------------------------------ the registered method
#: The paper's C grid (section 7.4): 10^-5, 10^-4, ..., 10^5.
PAPER_C_GRID: tuple[float, ...] = tuple(10.0 ** k for k in range(-5, 6))


def parse_c_grid(value: Any) -> tuple[float, ...]:
    """``c_grid`` as a sorted tuple of positive floats.

    Accepts a sequence of numbers, a string of comma/space separated numbers (``"1e-3,1,1e3"``), a
    range ``"1e-5:1e5"`` (every power of ten in between) or ``"paper"`` (10^-5 ... 10^5). Empty / None:
    no cross-validation.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return ()
    if isinstance(value, (list, tuple)) and not value:
        return ()
    if isinstance(value, (int, float)):
        vals: list[Any] = [value]
    elif isinstance(value, str):
        text = value.strip().lower()
        if text in ("paper", "default"):
            return PAPER_C_GRID
        if ":" in text:
            lo_s, hi_s = text.split(":", 1)
            try:
                lo, hi = float(lo_s), float(hi_s)
            except ValueError:
                lo = hi = float("nan")
            if not (lo > 0 and hi >= lo):
                raise CrossViewError(f"BITR: c_grid range {value!r} must be 'LOW:HIGH' with 0 < LOW <= HIGH, "
                                     "e.g. '1e-5:1e5'")
            a, b = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
            return tuple(10.0 ** k for k in range(a, b + 1))
        vals = [t for t in text.replace(",", " ").split() if t]
    else:
        vals = list(value)
    out = []
    for v in vals:
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = float("nan")
        if not (math.isfinite(f) and f > 0):
            raise CrossViewError(f"BITR: c_grid value {v!r} is not a positive number; give e.g. "
                                 "c_grid=1e-5,1e-3,1e-1,10,1e3 or c_grid=paper")
        out.append(f)
    return tuple(sorted(set(out)))


def _pca_fit(a: np.ndarray, dim: int) -> dict[str, np.ndarray]:
    """Principal axes of ``a (n, d)``: ``{"mean": (d,), "components": (dim, d)}`` (float32).

    From the ``n x n`` Gram matrix when there are fewer rows than columns, else from the top ``dim``
    eigenvectors of the ``d x d`` covariance (both exact; only the cost differs).
    """
    with _one_blas_thread():
        return _pca_fit_inner(a, dim)


def _pca_fit_inner(a: np.ndarray, dim: int) -> dict[str, np.ndarray]:
    import scipy.linalg

    a64 = np.asarray(a, dtype=np.float64)
    n, d = a64.shape
    mean = a64.mean(axis=0)
    z = a64 - mean
    k = min(dim, d)
    if n < d:
        vals, vecs = np.linalg.eigh(z @ z.T)
        order = np.argsort(vals)[::-1][:k]
        comps = (z.T @ vecs[:, order]).T
        comps /= np.maximum(np.linalg.norm(comps, axis=1, keepdims=True), 1e-300)
        # directions beyond the rank of a small sample carry no variance: keep them orthonormal anyway
        keep = vals[order] > 1e-12 * max(vals.max(), 1e-300)
        comps = comps[keep]
    else:
        vals, vecs = scipy.linalg.eigh(z.T @ z, subset_by_index=[d - k, d - 1])
        comps = vecs[:, ::-1].T
    # a deterministic sign for each axis
    signs = np.sign(comps[np.arange(comps.shape[0]), np.abs(comps).argmax(axis=1)])
    signs[signs == 0] = 1
    return {"mean": mean.astype(np.float32), "components": (comps * signs[:, None]).astype(np.float32)}


def _resolve_device(device: str) -> torch.device:
    from crossview.core.devices import torch_device  # auto | cpu | cuda[:n] | mps, checked

    return torch_device(device)


def _direction_problem(direction: str, img: np.ndarray, txt: np.ndarray, caption_image: np.ndarray,
                       outputs: str, max_candidates: int, seed: int) -> dict[str, Any]:
    """Inputs, outputs and (finite variant) candidates of one direction's structural SVM.

    Im2Text: every caption is a sample ``(x = its image, y = the caption)``; candidates are training
    captions, those of the sample's own image excluded. Text2Im swaps the roles: ``(x = caption,
    y = its image)``, candidates are the training images.
    """
    ci = np.asarray(caption_image, dtype=np.int64)
    if direction == "i2t":
        X, Y = img[ci], txt
        cands, cand_group = txt, ci
    else:
        X, Y = txt, img[ci]
        cands, cand_group = img, np.arange(img.shape[0], dtype=np.int64)
    prob: dict[str, Any] = {"X": X, "Y": Y}
    if outputs == "train":
        if cands.shape[0] > max_candidates:
            pick = np.sort(np.random.default_rng(seed).choice(cands.shape[0], max_candidates, replace=False))
            cands, cand_group = cands[pick], cand_group[pick]
        prob.update(candidates=cands, cand_group=cand_group, true_group=ci)
    return prob


def _cv_job(job: dict[str, Any]):
    """One cross-validation job: a fold of one direction over the whole C grid (ascending, warm-started:
    the working set's cutting planes stay valid for every C). A generator yielding ``IterationInfo``;
    its return value is ``{C: {"score", "R@1", "R@5", "R@10", "MedR", "iterations"}}``."""
    from crossview.eval import metrics as M

    d = job["direction"]
    img, txt, ci = job["img"], job["txt"], job["caption_image"]
    tr_img, te_img = job["train_images"], job["test_images"]
    tr_mask = np.isin(ci, tr_img)
    te_mask = np.isin(ci, te_img)
    remap = np.full(img.shape[0], -1, dtype=np.int64)
    remap[tr_img] = np.arange(len(tr_img))
    prob = _direction_problem(d, img[tr_img], txt[tr_mask], remap[ci[tr_mask]], job["outputs"],
                              job["max_candidates"], job["seed"])
    remap_te = np.full(img.shape[0], -1, dtype=np.int64)
    remap_te[te_img] = np.arange(len(te_img))
    te_ci = remap_te[ci[te_mask]]
    img_te, txt_te = img[te_img], txt[te_mask]
    trainer = None
    results: dict[float, dict[str, float]] = {}
    for C in job["c_grid"]:
        if trainer is None:
            trainer = CuttingPlaneTrainer(prob.pop("X"), prob.pop("Y"), C=C, **prob, **job["trainer"])
        else:
            trainer.set_C(C)
        for info in trainer.run():
            yield info
        W = trainer.solution.astype(np.float32)
        if d == "i2t":
            ranks = M.i2t_ranks((img_te @ W) @ txt_te.T, te_ci)
        else:
            ranks = M.t2i_ranks(img_te @ (txt_te @ W).T, te_ci)
        m = M.rank_metrics(ranks)
        results[C] = {"score": m["R@1"] + m["R@5"] + m["R@10"], "R@1": m["R@1"], "R@5": m["R@5"],
                      "R@10": m["R@10"], "MedR": m["MedR"], "iterations": float(trainer.iteration),
                      "converged": float(trainer.converged)}
    return results


def _cv_job_process(job: dict[str, Any]) -> tuple[str, int, dict[float, dict[str, float]]]:
    """:func:`_cv_job` drained in a worker process (one torch thread per worker)."""
    torch.set_num_threads(1)
    gen = _cv_job(job)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return job["direction"], job["fold"], stop.value


@register_method("bitr")
class Bitr(Method):
    """Bilateral Image-Text Retrieval (paper 001): two structural SVMs, ``x^T W y``, trained by 1-slack
    cutting planes. See the module docstring for the maths and ``models/bitr.toml`` for the card.

    Parameters:
        loss: ``"M"`` (Manhattan), ``"E"`` (squared Euclidean) or ``"C"`` (normalised correlation).
        C: the trade-off of eq. 3 when no ``c_grid`` is given.
        c_grid: values of C for k-fold cross-validation (each direction picks its own); empty: use ``C``.
            Accepts ``"paper"`` (10^-5 ... 10^5), ``"1e-3:1e3"`` or ``"0.1,1,10"``.
        cv_folds: folds of the cross-validation (by image).
        n_jobs: worker processes for the cross-validation jobs (folds x directions).
        normalize: ``"l2"`` (outputs on the unit sphere), ``"l1"`` (on the probability simplex; needs
            non-negative features) or ``"paper"`` (the paper's rule: L1 for the M loss on topic features,
            i.e. rows that are distributions, L2 otherwise). Not ``"paper"`` by default: with exact
            loss-augmented inference the simplex's most violated output is a vertex, and then every W
            has hinge ``>= 2 - 2 |y_i|^2`` while W = 0 has ``2 - 2 min_k y_ik``; with diffuse topic
            vectors that leaves almost nothing to learn (measured on the Flickr8k TR features: retrieval
            at chance). On the sphere, or with ``outputs="train"``, the same loss learns.
        reduce: ``"cca"`` (both views projected on the top ``cca_dim`` canonical directions of the training
            pairs, weighted by corr ** 0.5), ``"pca"`` (each view wider than ``pca_dim`` reduced by its own PCA,
            as the paper does) or ``"auto"``: cca on the encoders' features (best on real photos:
            bench/results/defaults_flickr8k.md), pca on the TR / CTR representations.
        cca_dim: canonical directions kept by ``reduce="cca"``; 0 keeps the features as they are.
        pca_dim: features wider than this are reduced by PCA fitted on the training split (the paper
            reduces CNN features to 128-d); 0 keeps them.
        outputs: ``"continuous"`` (y ranges over the sphere / simplex: closed forms) or ``"train"``
            (y ranges over the training captions / images: the finite variant).
        max_candidates: at most this many candidates in the finite variant (a fixed random subset).
        epsilon: stopping tolerance (the model ends within ``C * epsilon`` of the optimum).
        max_iter: cutting-plane iteration limit per model.
        line_search: OCAS line search (same optimum, far fewer iterations at large C); False is
            Joachims et al.'s plain 1-slack algorithm.
        inactive_limit: iterations with zero dual weight before a constraint leaves the working set.
        mv_starts, mv_steps: starts and steps of projected subgradient ascent (M loss on the sphere).
        device: ``auto | cpu | cuda[:n] | mps`` for the large products.
        seed: random seed (folds, random starts, candidate subset).
        representation: what a run (:mod:`crossview.engine.run`) trains on: ``"features"`` (the run's
            image and text encoders), ``"tr"`` (paper 001's topic representation: LDA topics of visual
            words, i.e. k-means clusters of the backbone's local descriptors, and of caption words) or
            ``"ctr"`` (TR projected by a CCA fitted on the training pairs). The run fits the
            representation on its training split and keeps it in the checkpoint, so queries with new
            images and sentences go through it (:func:`crossview.features.topics.representation_features`).
            :meth:`fit` on given :class:`MethodData` uses the features it is given.
        n_topics: LDA topics per modality for ``tr`` / ``ctr`` (the paper's 100).
        n_words: visual words (k-means centres) for ``tr`` / ``ctr`` (the paper's 1000).
    """

    directions_differ = True
    iterative = True
    #: chosen on real photos (bench/results/defaults_flickr8k.md): ssr image features, reduce="cca" to 64-d
    default_image_norm = "ssr"
    has_epoch_validation = False
    validation_note = ("BITR validates by k-fold cross-validation of C on the training split when c_grid is "
                       "set (the chosen C and the score of each C are in the log), not per iteration.")

    def __init__(self, *, loss: str = "C", C: float = 1000.0, c_grid: Any = None, cv_folds: int = 5,
                 n_jobs: int = 1, normalize: str = "l2", reduce: str = "auto", cca_dim: int = 64,
                 pca_dim: int = 128, outputs: str = "continuous",
                 max_candidates: int = 5000, epsilon: float = 1e-3, max_iter: int = 1000,
                 line_search: bool = True, inactive_limit: int = 50, mv_starts: int = 8, mv_steps: int = 30,
                 device: str = "auto", seed: int = 0, representation: str = "features", n_topics: int = 100,
                 n_words: int = 1000) -> None:
        self.loss = loss
        self.C = C
        self.c_grid = c_grid
        self.cv_folds = cv_folds
        self.n_jobs = n_jobs
        self.normalize = normalize
        self.reduce = reduce
        self.cca_dim = cca_dim
        self.pca_dim = pca_dim
        self.outputs = outputs
        self.max_candidates = max_candidates
        self.epsilon = epsilon
        self.max_iter = max_iter
        self.line_search = line_search
        self.inactive_limit = inactive_limit
        self.mv_starts = mv_starts
        self.mv_steps = mv_steps
        self.device = device
        self.seed = seed
        self.representation = representation
        self.n_topics = n_topics
        self.n_words = n_words

    # ------------------------------------------------------------------ parameters
    def _check_params(self) -> tuple[float, ...]:
        _check_loss(self.loss)
        if self.reduce not in REDUCTIONS:
            raise CrossViewError(f"BITR: reduce must be one of {', '.join(REDUCTIONS)} (auto = cca on the encoders' "
                                 f"features, pca on TR / CTR), got {self.reduce!r}")
        if self.normalize not in ("l2", "l1", "paper"):
            raise CrossViewError(f"BITR: normalize must be 'l2', 'l1' or 'paper', got {self.normalize!r}")
        if self.representation not in REPRESENTATIONS:
            raise CrossViewError(f"BITR: representation must be one of {', '.join(REPRESENTATIONS)} "
                                 f"(features = the run's encoders, tr = topics of visual and caption words, "
                                 f"ctr = tr projected by CCA), got {self.representation!r}")
        if self.outputs not in ("continuous", "train"):
            raise CrossViewError(f"BITR: outputs must be 'continuous' (closed forms over the sphere / simplex) "
                                 f"or 'train' (the training captions / images), got {self.outputs!r}")
        try:
            C = float(self.C)
        except (TypeError, ValueError):
            C = float("nan")
        if not (math.isfinite(C) and C > 0):
            raise CrossViewError(f"BITR: C must be a positive number, got {self.C!r}; the paper searches 1e-5 ... 1e5")
        for name, lo in (("cv_folds", 2), ("n_jobs", 1), ("max_iter", 1), ("max_candidates", 2),
                         ("mv_starts", 1), ("mv_steps", 1), ("inactive_limit", 1), ("pca_dim", 0), ("cca_dim", 0),
                         ("n_topics", 1), ("n_words", 2)):
            v = getattr(self, name)
            if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= lo):
                raise CrossViewError(f"BITR: {name} must be an integer >= {lo}, got {v!r}")
        if not (isinstance(self.epsilon, (int, float)) and self.epsilon > 0):
            raise CrossViewError(f"BITR: epsilon must be a positive number, got {self.epsilon!r}; default 1e-3")
        return parse_c_grid(self.c_grid)

    def feature_representation(self) -> dict[str, Any] | None:
        """What the run's features are to be (:func:`crossview.features.topics.representation_request`):
        ``None`` for the encoders' features, else the TR / CTR settings."""
        self._check_params()
        if self.representation == "features":
            return None
        return {"name": self.representation, "n_topics": int(self.n_topics), "n_words": int(self.n_words),
                "seed": int(self.seed)}

    def _trainer_kwargs(self, device: torch.device) -> dict[str, Any]:
        return {"loss": self.loss, "epsilon": float(self.epsilon), "max_iter": int(self.max_iter),
                "inactive_limit": int(self.inactive_limit), "n_starts": int(self.mv_starts),
                "n_steps": int(self.mv_steps), "seed": int(self.seed), "device": device,
                "line_search": bool(self.line_search)}

    # ------------------------------------------------------------------ features
    def _reduction(self) -> str:
        """``"cca"`` or ``"pca"``: ``reduce="auto"`` is CCA on the run's encoder features, PCA (the paper's)
        on the TR / CTR topic representations."""
        if self.reduce != "auto":
            return self.reduce
        return "cca" if self.representation == "features" else "pca"

    def _fit_preprocessing(self, train: MethodData, text: np.ndarray) -> None:
        self.pca_, self.norm_, self.domain_ = {}, {}, {}
        cca = None
        if self._reduction() == "cca" and self.cca_dim:
            # Both views projected on the top canonical directions of the training pairs (one pair per
            # caption), dimension k weighted by corr_k ** 0.5: CCA's own best setting on real photos
            # (bench/results/defaults_flickr8k.md). The structured SVM then learns W on top of that space.
            from crossview.core.linalg import fit_cca

            X = np.asarray(train.image_features, dtype=np.float32)[np.asarray(train.caption_image)]
            res = fit_cca(X, np.asarray(text, dtype=np.float32), int(self.cca_dim), CCA_REG)
            w = np.power(np.maximum(res.correlations, 0), CCA_WEIGHT_POWER)
            cca = {"image": {"mean": res.x_mean.astype(np.float32),
                             "components": (res.x_proj * w).T.astype(np.float32)},
                   "text": {"mean": res.y_mean.astype(np.float32),
                            "components": (res.y_proj * w).T.astype(np.float32)}}
        for mod, a in (("image", train.image_features), ("text", text)):
            pca = None
            if cca is not None:
                pca = cca[mod]
            elif self.pca_dim and a.shape[1] > self.pca_dim:
                pca = _pca_fit(a, int(self.pca_dim))
            self.pca_[mod] = pca
            if self.normalize == "paper":
                # the paper: L1 for the M loss on topic features (probability distributions), L2 otherwise
                is_dist = pca is None and a.size and a.min() >= 0 and np.allclose(a.sum(axis=1), 1.0, atol=1e-3)
                norm = "l1" if (_check_loss(self.loss) == "M" and is_dist) else "l2"
            else:
                norm = self.normalize
            self.norm_[mod] = norm
            self.domain_[mod] = "simplex" if norm == "l1" else "sphere"

    def _prep(self, a: np.ndarray, mod: str) -> np.ndarray:
        """Features of modality ``mod`` as the model sees them: PCA (if fitted) then normalised."""
        a = np.asarray(a, dtype=np.float32)
        pca = self.pca_[mod]
        if pca is not None:
            d = pca["components"].shape[1]
            if a.shape[1] != d:
                raise CrossViewError(f"BITR: the model was trained on {d}-d {mod} features, these are "
                                     f"{a.shape[1]}-d; use the same {mod} encoder as for training")
            a = (a - pca["mean"]) @ pca["components"].T
        return normalize_rows(a, self.norm_[mod], what=f"{mod} features")

    # ------------------------------------------------------------------ training
    def fit_iter(self, train: MethodData, val: MethodData | None = None, *, resume: bool = False):
        """Cross-validate C (if ``c_grid``), then train the Im2Text and the Text2Im models.

        Yields a ``Loss`` (primal, dual, gap, violation, ...) and a ``Progress`` event every cutting-plane
        iteration, ``Log`` messages, and a ``Validation`` with both directions' metrics on ``val`` at the end.
        """
        from crossview.core.events import Log, Loss, Progress, Validation

        grid = self._check_params()
        dev = _resolve_device(str(self.device))
        text = train.require_text_features("bitr")
        if train.n_images < 2 or train.n_captions < 2:
            raise CrossViewError(f"BITR needs at least 2 images and 2 captions to train, the "
                                 f"{train.name or 'training'} data has {train.n_images} and {train.n_captions}")
        prog = getattr(self, "progress_", None) if resume else None
        if prog is not None and prog.get("phase") == "done":
            yield Log("bitr: the loaded state has already finished training", "info")
            return
        if prog is None:
            self._fit_preprocessing(train, text)
            prog = {"phase": "cv" if grid else "train", "cv": {}, "direction": None, "trainer": None, "step": 0}
            self.W_, self.C_, self.n_iter_, self.converged_ = {}, {}, {}, {}
            self.cv_ = None
        else:
            for mod, a in (("image", train.image_features), ("text", text)):
                pca = self.pca_[mod]
                d = pca["components"].shape[1] if pca is not None else None
                if d is not None and a.shape[1] != d:
                    raise CrossViewError(f"bitr: cannot resume: the checkpoint expects {d}-d {mod} features, "
                                         f"got {a.shape[1]}-d; resume with the features of the original run")
        self.progress_ = prog
        img = self._prep(train.image_features, "image")
        txt = self._prep(text, "text")
        ci = train.caption_image
        if not resume or prog["step"] == 0:
            yield Log(f"bitr (loss {self.loss}, outputs {self.outputs}): {train.n_captions} pairs, image "
                      f"features {img.shape[1]}-d ({self.norm_['image']}), text {txt.shape[1]}-d "
                      f"({self.norm_['text']}), device {dev}", "info")

        if prog["phase"] == "cv":
            yield from self._cross_validate(grid, img, txt, ci, dev)
            prog["phase"] = "train"
        for di, d in enumerate(("i2t", "t2i")):
            if d in self.W_:
                continue
            C = float(self.C_.get(d, self.C))
            self.C_[d] = C
            prob = _direction_problem(d, img, txt, ci, self.outputs, int(self.max_candidates), int(self.seed))
            domain = self.domain_["text" if d == "i2t" else "image"]
            trainer = CuttingPlaneTrainer(prob.pop("X"), prob.pop("Y"), C=C, domain=domain, **prob,
                                          **self._trainer_kwargs(dev))
            if prog["direction"] == d and prog["trainer"] is not None:
                trainer.load_state_dict(prog["trainer"])
            prog["direction"] = d
            self._trainer = trainer
            for info in trainer.run():
                prog["step"] += 1
                yield Loss(prog["step"], di, info.terms())
                yield Progress(trainer.iteration, int(self.max_iter),
                               f"{d} iteration {trainer.iteration}: gap {info.gap:.4g}, violation "
                               f"{info.violation:.3g} (stops at {self.epsilon:g})")
            self.W_[d] = trainer.solution.astype(np.float32)
            self.n_iter_[d] = trainer.iteration
            self.converged_[d] = trainer.converged
            self._trainer = None
            prog["direction"], prog["trainer"] = None, None
            last = trainer.history[-1] if trainer.history else {}
            if trainer.converged:
                yield Log(f"bitr {d}: converged after {trainer.iteration} iterations (C = {C:g}, primal "
                          f"{last.get('primal', float('nan')):.6g}, dual {last.get('dual', float('nan')):.6g})")
            else:
                yield Log(f"bitr {d}: stopped at max_iter = {self.max_iter} before reaching epsilon = "
                          f"{self.epsilon:g} (violation {last.get('violation', float('nan')):.3g}); raise max_iter "
                          "or epsilon", "warning")
        prog["phase"] = "done"
        if val is not None and val.text_features is not None and val.n_images > 0:
            res = self.evaluate(val)
            res.pop("ranks", None)
            yield Validation(0, res)

    def _cross_validate(self, grid: tuple[float, ...], img: np.ndarray, txt: np.ndarray, ci: np.ndarray,
                        dev: torch.device):
        from crossview.core.events import Log, Loss, Progress

        k = int(self.cv_folds)
        n_img = img.shape[0]
        if n_img < k:
            raise CrossViewError(f"BITR: {k}-fold cross-validation needs at least {k} training images, "
                                 f"there are {n_img}; lower cv_folds or give a fixed C (c_grid empty)")
        perm = np.random.default_rng(int(self.seed)).permutation(n_img)
        folds = np.array_split(perm, k)
        base = self._trainer_kwargs(torch.device("cpu") if int(self.n_jobs) > 1 else dev)
        jobs = []
        for d in ("i2t", "t2i"):
            for f in range(k):
                key = f"{d}/{f}"
                if key in self.progress_["cv"]:
                    continue
                te = np.sort(folds[f])
                tr = np.sort(np.concatenate([folds[g] for g in range(k) if g != f]))
                jobs.append({"key": key, "direction": d, "fold": f, "img": img, "txt": txt, "caption_image": ci,
                             "train_images": tr, "test_images": te, "c_grid": grid, "outputs": self.outputs,
                             "max_candidates": int(self.max_candidates), "seed": int(self.seed),
                             "trainer": {**base, "domain": self.domain_["text" if d == "i2t" else "image"]}})
        total = 2 * k
        yield Log(f"bitr: choosing C by {k}-fold cross-validation over {len(grid)} values "
                  f"({grid[0]:g} ... {grid[-1]:g}), {len(jobs)} jobs, {int(self.n_jobs)} process(es)")
        if int(self.n_jobs) <= 1:
            for job in jobs:
                gen = _cv_job(job)
                it = 0
                while True:
                    try:
                        info = next(gen)
                    except StopIteration as stop:
                        self.progress_["cv"][job["key"]] = stop.value
                        break
                    it += 1
                    yield Loss(self.progress_["step"], -1, {**info.terms(), "cv_fold": float(job["fold"])})
                    yield Progress(len(self.progress_["cv"]), total, f"cross-validation {job['key']}: "
                                   f"iteration {it}, gap {info.gap:.4g}")
        else:
            import concurrent.futures as cf

            # loky's executor (bundled with joblib): the concurrent.futures API, plus a documented
            # shutdown(kill_workers=True) that stops the workers of a cancelled run at once (the standard
            # executor can only wait for running jobs, which take minutes here)
            from joblib.externals.loky import ProcessPoolExecutor

            ex = ProcessPoolExecutor(max_workers=int(self.n_jobs))
            try:
                futs = {ex.submit(_cv_job_process, job): job["key"] for job in jobs}
                pending = set(futs)
                while pending:
                    done, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
                    for fut in done:
                        d, f, res = fut.result()
                        self.progress_["cv"][f"{d}/{f}"] = res
                    yield Progress(len(self.progress_["cv"]), total,
                                   f"cross-validation: {len(self.progress_['cv'])} of {total} jobs done")
            finally:
                ex.shutdown(wait=True, kill_workers=True)
        table: dict[str, dict[float, dict[str, float]]] = {}
        for d in ("i2t", "t2i"):
            rows = [self.progress_["cv"][f"{d}/{f}"] for f in range(k)]
            table[d] = {C: {m: float(np.mean([r[C][m] for r in rows])) for m in rows[0][C]} for C in grid}
            best = max(grid, key=lambda C: (table[d][C]["score"], -C))
            self.C_[d] = best
            yield Log(f"bitr {d}: cross-validation picks C = {best:g} (mean R@1+R@5+R@10 "
                      f"{table[d][best]['score']:.2f}); "
                      + ", ".join(f"{C:g}: {table[d][C]['score']:.1f}" for C in grid))
        self.cv_ = {"grid": list(grid), "folds": k,
                    "table": {d: {repr(C): v for C, v in t.items()} for d, t in table.items()}}

    # ------------------------------------------------------------------ inference
    def encode_images(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """i2t: ``W^T x`` ``(n_images, q)``; t2i: the normalised image features ``(n_images, p)``."""
        check_direction(direction)
        self._require(direction)
        x = self._prep(data.image_features, "image")
        return np.ascontiguousarray(x @ self.W_["i2t"]) if direction == "i2t" else x

    def encode_texts(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """i2t: the normalised caption features ``(n_captions, q)``; t2i: ``W'^T y`` ``(n_captions, p)``."""
        check_direction(direction)
        self._require(direction)
        y = self._prep(data.require_text_features("bitr"), "text")
        return y if direction == "i2t" else np.ascontiguousarray(y @ self.W_["t2i"])

    def _require(self, direction: str) -> None:
        W = getattr(self, "W_", None)
        if not W or direction not in W:
            raise CrossViewError(f"BITR's {direction} model is not trained yet: call fit() or load a "
                                 "checkpoint of a finished run first")

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Parameters and learned state; while training, the live working set of the model in progress."""
        import copy

        d = super().state_dict()
        state = {k: copy.deepcopy(v) for k, v in d["state"].items()}
        tr = getattr(self, "_trainer", None)
        if tr is not None and "progress_" in state:
            state["progress_"]["trainer"] = tr.state_dict()
        d["state"] = state
        return d
