"""BITR's losses and most-violated-constraint search (paper 001, eq. 5-7), as plain functions.

Torch tensors or numpy arrays in, the same kind out. Losses: ``Delta_M = ||y_i - y||_1``,
``Delta_E = ||y_i - y||_2^2``, ``Delta_C = 1 - y_i . y``. Most violated constraints
``argmax_y Delta(y_i, y) + c_i . y`` with ``c_i = W^T x_i``:

- sphere, C: ``normalise(c_i - y_i)``; sphere, E: ``normalise(c_i - 2 y_i)`` (closed forms);
- simplex (any of the three): the best vertex ``e_k`` (a convex function is maximised at a vertex);
- sphere, M: no closed form. ``||y_i - y||_1 = max_{s in {-1,1}^q} s . (y_i - y)``, so we alternate
  ``y <- normalise(c_i - s)`` and ``s <- sign(y_i - y)`` from several starts (projected subgradient
  ascent with an infinite step, which never decreases a convex objective on the sphere);
- finite: ``y`` ranges over a candidate set (the training outputs); one matrix product per chunk.

The trainer that uses them is :mod:`crossview.methods._bitr_trainer`; the method is
:mod:`crossview.methods.bitr`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from crossview.core.errors import CrossViewError

__all__ = ["LOSSES", "DOMAINS", "normalize_rows", "delta", "delta_matrix", "vertex_losses", "most_violated",
           "most_violated_finite", "hinge_terms", "primal_objective"]

#: Loss name -> what it is (eq. 5, 6, 7 of the paper).
LOSSES: dict[str, str] = {
    "M": "Manhattan distance ||y_i - y||_1",
    "E": "squared Euclidean distance ||y_i - y||_2^2",
    "C": "normalised correlation 1 - y_i . y",
}
#: Where the outputs live: the unit sphere (L2-normalised) or the probability simplex (L1, non-negative).
DOMAINS = ("sphere", "simplex")

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
    from crossview.core.rownorm import row_norms

    s = row_norms(s)
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
