"""BITR maths: the three losses, their most violated constraints (closed forms, projected subgradient
ascent, the finite variant) against brute force, the dual QP solver against a reference, and 1-slack
cutting-plane training against the n-slack problem solved exactly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from crossview.core.errors import CrossViewError
from crossview.methods._qp import dual_objective, solve_dual_qp
from crossview.methods.bitr import (CuttingPlaneTrainer, delta, delta_matrix, hinge_terms, most_violated,
                                    most_violated_finite, normalize_rows, parse_c_grid, primal_objective)

torch.set_num_threads(1)
LOSSES = ("M", "E", "C")


def _unit(rng: np.random.Generator, n: int, q: int) -> np.ndarray:
    return normalize_rows(rng.normal(size=(n, q)), "l2").astype(np.float64)


def _simplex(rng: np.random.Generator, n: int, q: int) -> np.ndarray:
    return rng.dirichlet(np.full(q, 0.7), size=n)


def _objective(loss: str, c: np.ndarray, yt: np.ndarray, cands: np.ndarray) -> np.ndarray:
    """``Delta(yt, y) + c . y`` for one sample and every candidate ``(m, q)`` -> ``(m,)`` (brute force,
    straight from eq. 5-7)."""
    if loss == "M":
        d = np.abs(yt[None, :] - cands).sum(1)
    elif loss == "E":
        d = ((yt[None, :] - cands) ** 2).sum(1)
    else:
        d = 1.0 - cands @ yt
    return d + cands @ c


def _naive_delta(loss: str, a: np.ndarray, b: np.ndarray) -> float:
    s = 0.0
    for u, v in zip(a, b):
        s += abs(u - v) if loss == "M" else (u - v) ** 2 if loss == "E" else -u * v
    return s + (1.0 if loss == "C" else 0.0)


# ---------------------------------------------------------------------------------------- losses
def test_losses_hand_values() -> None:
    yt = np.array([[0.6, 0.8, 0.0]])
    y = np.array([[0.0, 0.6, 0.8]])
    assert delta("M", yt, y)[0] == pytest.approx(0.6 + 0.2 + 0.8)
    assert delta("E", yt, y)[0] == pytest.approx(0.36 + 0.04 + 0.64)
    assert delta("C", yt, y)[0] == pytest.approx(1 - 0.48)
    for loss in LOSSES:  # a valid loss: zero at the truth
        assert delta(loss, yt, yt)[0] == pytest.approx(0.0, abs=1e-12)
    assert delta("c", yt, y)[0] == pytest.approx(0.52)  # lower case accepted
    with pytest.raises(CrossViewError, match="unknown BITR loss 'X'.*M = Manhattan"):
        delta("X", yt, y)


@pytest.mark.parametrize("loss", LOSSES)
def test_loss_matrix_matches_naive_loop(loss: str) -> None:
    rng = np.random.default_rng(1)
    yt, cd = rng.normal(size=(7, 5)), rng.normal(size=(9, 5))
    naive = np.array([[_naive_delta(loss, a, b) for b in cd] for a in yt])
    np.testing.assert_allclose(delta_matrix(loss, yt, cd), naive, rtol=1e-10, atol=1e-10)
    t = delta_matrix(loss, torch.from_numpy(yt), torch.from_numpy(cd))
    assert isinstance(t, torch.Tensor)


# --------------------------------------------------------------------- most violated: continuous
@pytest.mark.parametrize("loss", ["C", "E"])
def test_sphere_closed_forms_beat_random_search(loss: str) -> None:
    rng = np.random.default_rng(2)
    n, q = 12, 6
    c, yt = rng.normal(size=(n, q)) * rng.uniform(0.1, 3, (n, 1)), _unit(rng, n, q)
    y_hat, value = most_violated(loss, c, yt, "sphere")
    np.testing.assert_allclose(np.linalg.norm(y_hat, axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(value, _objective_rows(loss, c, yt, y_hat), atol=1e-10)
    cands = _unit(rng, 10_000, q)
    for i in range(n):
        best = _objective(loss, c[i], yt[i], cands).max()
        assert value[i] >= best - 1e-12
        assert value[i] - best < 0.5  # and random search comes near it: the value is a real maximum


def _objective_rows(loss: str, c: np.ndarray, yt: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.array([_objective(loss, c[i], yt[i], y[i][None])[0] for i in range(len(c))])


@pytest.mark.parametrize("loss", ["C", "E"])
def test_sphere_closed_forms_equal_a_fine_grid(loss: str) -> None:
    rng = np.random.default_rng(3)
    theta = np.linspace(0, 2 * np.pi, 200_001)
    circle = np.stack([np.cos(theta), np.sin(theta)], 1)
    c, yt = rng.normal(size=(5, 2)) * 2, _unit(rng, 5, 2)
    _, value = most_violated(loss, c, yt, "sphere")
    for i in range(5):
        assert value[i] == pytest.approx(_objective(loss, c[i], yt[i], circle).max(), abs=1e-8)
    # 3-d: a Fibonacci sphere of 400K points
    k = np.arange(400_000) + 0.5
    phi, z = np.pi * (1 + 5 ** 0.5) * k, 1 - 2 * k / 400_000
    sphere = np.stack([np.sqrt(1 - z * z) * np.cos(phi), np.sqrt(1 - z * z) * np.sin(phi), z], 1)
    c, yt = rng.normal(size=(4, 3)), _unit(rng, 4, 3)
    _, value = most_violated(loss, c, yt, "sphere")
    for i in range(4):
        grid = _objective(loss, c[i], yt[i], sphere).max()
        assert grid <= value[i] + 1e-12 and value[i] - grid < 2e-4


@pytest.mark.parametrize("loss", LOSSES)
def test_simplex_vertex_is_the_maximum(loss: str) -> None:
    rng = np.random.default_rng(4)
    n, q = 10, 5
    c, yt = rng.normal(size=(n, q)), _simplex(rng, n, q)
    y_hat, value = most_violated(loss, c, yt, "simplex")
    assert np.all((y_hat == 0) | (y_hat == 1)) and np.all(y_hat.sum(1) == 1)
    np.testing.assert_allclose(value, _objective_rows(loss, c, yt, y_hat), atol=1e-10)
    cands = _simplex(rng, 10_000, q)
    for i in range(n):
        assert value[i] >= _objective(loss, c[i], yt[i], cands).max() - 1e-12
    # 3-d: every point of a grid of step 1/200 on the simplex
    g = np.array([(a, b, 200 - a - b) for a in range(201) for b in range(201 - a)], float) / 200
    c, yt = rng.normal(size=(4, 3)), _simplex(rng, 4, 3)
    _, value = most_violated(loss, c, yt, "simplex")
    for i in range(4):
        assert value[i] == pytest.approx(_objective(loss, c[i], yt[i], g).max(), abs=1e-12)


def test_manhattan_on_the_simplex_has_a_hinge_floor_no_w_can_lower() -> None:
    """Why BITR-M on the simplex (normalize="paper"/"l1") learns little: for every W,
    ``hinge_i >= sum_k y_ik (2 - 2 y_ik + c_k) - c.y_i = 2 - 2 |y_i|^2`` (the max over vertices is at
    least their y_i-weighted mean), while W = 0 gives ``2 - 2 min_k y_ik``. With diffuse topic vectors
    (|y|^2 small) the whole room to learn is ``2 (|y|^2 - min y)``: a weak signal against ``|W|^2``."""
    rng = np.random.default_rng(12)
    N, p, q = 40, 6, 20
    X, Y = _simplex(rng, N, p), _simplex(rng, N, q)
    floor = 2 - 2 * (Y ** 2).sum(1)
    h0, _ = hinge_terms("M", X, Y, np.zeros((p, q)), "simplex")
    np.testing.assert_allclose(h0, 2 - 2 * Y.min(1), atol=1e-12)
    for scale in (0.1, 1.0, 10.0, 1000.0):
        for _ in range(20):
            h, _ = hinge_terms("M", X, Y, scale * rng.normal(size=(p, q)), "simplex")
            assert np.all(h >= floor - 1e-9)
    # ... and the floor is reached where the scores copy the true output: c_i = 2 y_i (+ any constant)
    c = 2 * Y + 0.7
    y_hat, value = most_violated("M", c, Y, "simplex")
    np.testing.assert_allclose(value - (c * Y).sum(1), floor, atol=1e-12)


def _manhattan_sphere_exact(c: np.ndarray, yt: np.ndarray) -> float:
    """``max_{|y|=1} |yt - y|_1 + c.y = max_{s in {-1,1}^q} s.yt + |c - s|`` by enumerating the signs."""
    best = -np.inf
    for s in itertools.product((-1.0, 1.0), repeat=len(c)):
        s = np.array(s)
        best = max(best, s @ yt + np.linalg.norm(c - s))
    return best


def test_manhattan_sphere_projected_ascent() -> None:
    rng = np.random.default_rng(5)
    n, q = 40, 7
    c = rng.normal(size=(n, q)) * rng.uniform(0.05, 2, (n, 1))
    yt = _unit(rng, n, q)
    y_hat, value = most_violated("M", c, yt, "sphere", n_starts=8, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(np.linalg.norm(y_hat, axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(value, _objective_rows("M", c, yt, y_hat), atol=1e-10)
    cands = _unit(rng, 10_000, q)
    exact_hits = 0
    for i in range(n):
        assert value[i] >= _objective("M", c[i], yt[i], cands).max() - 1e-12  # never worse than random search
        exact = _manhattan_sphere_exact(c[i], yt[i])
        assert value[i] <= exact + 1e-9
        exact_hits += value[i] >= exact - 1e-9
    assert exact_hits >= 0.9 * n  # the global maximum almost always (a local one otherwise)
    # 2-d: against a fine grid of the circle
    theta = np.linspace(0, 2 * np.pi, 200_001)
    circle = np.stack([np.cos(theta), np.sin(theta)], 1)
    c2, yt2 = rng.normal(size=(6, 2)), _unit(rng, 6, 2)
    _, v2 = most_violated("M", c2, yt2, "sphere")
    for i in range(6):
        assert v2[i] == pytest.approx(_objective("M", c2[i], yt2[i], circle).max(), abs=1e-8)


# ------------------------------------------------------------------------ most violated: finite
@pytest.mark.parametrize("loss", LOSSES)
def test_finite_variant_matches_naive_loop(loss: str) -> None:
    rng = np.random.default_rng(6)
    n, m, q = 9, 13, 4
    c, yt, cd = rng.normal(size=(n, q)), rng.normal(size=(n, q)), rng.normal(size=(m, q))
    tg, cg = rng.integers(0, 4, n), rng.integers(0, 4, m)
    idx, val = most_violated_finite(loss, c, yt, cd, true_group=tg, cand_group=cg)
    idx_small, val_small = most_violated_finite(loss, c, yt, cd, true_group=tg, cand_group=cg, chunk_elements=7)
    for i in range(n):
        obj = _objective(loss, c[i], yt[i], cd)
        obj[cg == tg[i]] = -np.inf
        assert idx[i] == np.argmax(obj) and val[i] == pytest.approx(obj.max(), abs=1e-10)
    np.testing.assert_array_equal(idx, idx_small)
    np.testing.assert_allclose(val, val_small, atol=1e-12)
    idx_all, _ = most_violated_finite(loss, c, yt, cd)  # nothing excluded
    for i in range(n):
        assert idx_all[i] == np.argmax(_objective(loss, c[i], yt[i], cd))


def test_hinge_terms_and_primal_by_hand() -> None:
    rng = np.random.default_rng(7)
    X, Y = _unit(rng, 5, 3), _unit(rng, 5, 3)
    W = rng.normal(size=(3, 3))
    h, y_hat = hinge_terms("C", X, Y, W)
    for i in range(5):
        c = W.T @ X[i]
        expect = max(0.0, 1 + np.linalg.norm(c - Y[i]) - c @ Y[i])
        assert h[i] == pytest.approx(expect, abs=1e-12)
    assert primal_objective("C", X, Y, W, 3.0) == pytest.approx(0.5 * (W ** 2).sum() + 3.0 * np.mean(h))


# ------------------------------------------------------------------------------------ the dual QP
def _reference_qp(G: np.ndarray, b: np.ndarray, C: float) -> float:
    K = len(b)
    res = minimize(lambda a: -(b @ a - 0.5 * a @ G @ a), np.full(K, C / (2 * K)), jac=lambda a: -(b - G @ a),
                   method="SLSQP", bounds=[(0, None)] * K,
                   constraints=[{"type": "ineq", "fun": lambda a: C - a.sum(), "jac": lambda a: -np.ones(K)}],
                   options={"ftol": 1e-15, "maxiter": 2000})
    return -res.fun


def test_qp_matches_a_reference_on_random_problems() -> None:
    rng = np.random.default_rng(8)
    for trial in range(60):
        K, d = int(rng.integers(1, 14)), int(rng.integers(1, 12))
        A = rng.normal(size=(K, d)) * rng.uniform(0.01, 1)
        if trial % 3 == 0 and K > 2:
            A[-1] = 0.5 * (A[0] + A[1])  # singular Gram matrix
        G, b, C = A @ A.T, rng.uniform(-0.5, 2, K), 10.0 ** rng.uniform(-3, 4)
        r = solve_dual_qp(G, b, C)
        assert r.converged
        assert np.all(r.alpha >= 0) and r.alpha.sum() <= C * (1 + 1e-12)
        assert r.objective == pytest.approx(dual_objective(G, b, r.alpha))
        ref = _reference_qp(G, b, C)
        assert r.objective >= ref - 1e-8 * max(1.0, abs(ref))
        # KKT: with lam = max(0, max_j grad_j) every free variable has gradient lam, others <= lam
        grad = b - G @ r.alpha
        lam = max(0.0, grad.max())
        assert np.all(grad <= lam + 1e-8)
        if r.alpha.sum() < C * (1 - 1e-9):
            assert lam <= 1e-8
        # warm start from anywhere gives the same optimum
        warm = solve_dual_qp(G, b, C, alpha0=rng.uniform(0, C, K))
        assert warm.objective == pytest.approx(r.objective, rel=1e-9, abs=1e-12)


def test_qp_edge_cases_and_errors() -> None:
    r = solve_dual_qp(np.zeros((0, 0)), np.zeros(0), 1.0)
    assert r.alpha.shape == (0,) and r.objective == 0.0
    r = solve_dual_qp(np.array([[2.0]]), np.array([1.0]), 10.0)  # interior: a = b / G
    assert r.alpha[0] == pytest.approx(0.5)
    r = solve_dual_qp(np.array([[2.0]]), np.array([1.0]), 0.1)  # at the bound
    assert r.alpha[0] == pytest.approx(0.1)
    r = solve_dual_qp(np.eye(3), -np.ones(3), 5.0)  # no constraint worth weight
    assert np.all(r.alpha == 0)
    with pytest.raises(CrossViewError, match="C must be a positive"):
        solve_dual_qp(np.eye(2), np.ones(2), 0.0)
    with pytest.raises(CrossViewError, match=r"\(2, 2\)"):
        solve_dual_qp(np.eye(3), np.ones(2), 1.0)
    with pytest.raises(CrossViewError, match="NaN"):
        solve_dual_qp(np.eye(2), np.array([1.0, np.nan]), 1.0)


# ------------------------------------------------------------------------- 1-slack cutting plane
def _n_slack_exact(loss: str, X: np.ndarray, Y: np.ndarray, cands: np.ndarray, tg: np.ndarray,
                   cg: np.ndarray, C: float) -> tuple[float, np.ndarray]:
    """The n-slack problem (eq. 3) over a finite output set, solved as one QP in (W, xi) by SLSQP."""
    N, p = X.shape
    q = Y.shape[1]
    rows, rhs = [], []
    for i in range(N):
        for j in range(len(cands)):
            if cg[j] == tg[i]:
                continue
            # x_i^T W (y_i - y_j) + xi_i >= Delta(y_i, y_j)
            coef = np.zeros(p * q + N)
            coef[:p * q] = np.outer(X[i], Y[i] - cands[j]).ravel()
            coef[p * q + i] = 1.0
            rows.append(coef)
            rhs.append(_objective(loss, np.zeros(q), Y[i], cands[j][None])[0])
    Acon, bcon = np.array(rows), np.array(rhs)
    n_var = p * q + N

    def f(z: np.ndarray) -> float:
        return 0.5 * z[:p * q] @ z[:p * q] + C / N * z[p * q:].sum()

    def g(z: np.ndarray) -> np.ndarray:
        return np.concatenate([z[:p * q], np.full(N, C / N)])

    z0 = np.zeros(n_var)
    z0[p * q:] = bcon.max() + 1.0  # a feasible start
    res = minimize(f, z0, jac=g, method="SLSQP",
                   bounds=[(None, None)] * (p * q) + [(0, None)] * N,
                   constraints=[{"type": "ineq", "fun": lambda z: Acon @ z - bcon, "jac": lambda z: Acon}],
                   options={"ftol": 1e-13, "maxiter": 1000})
    # status 8 ("positive directional derivative") is SLSQP stopping at the optimum below its ftol
    assert res.status in (0, 8), res.message
    assert (Acon @ res.x - bcon).min() > -1e-8 and res.x[p * q:].min() > -1e-8  # a feasible point
    return float(res.fun), res.x[:p * q].reshape(p, q)


@pytest.mark.parametrize("line_search", [False, True])
@pytest.mark.parametrize("loss,C", [("C", 0.5), ("E", 10.0), ("M", 1000.0)])
def test_one_slack_equals_the_exact_n_slack_solution(loss: str, C: float, line_search: bool) -> None:
    rng = np.random.default_rng(9)
    N, m, p, q = 6, 5, 3, 3
    X, cands = _unit(rng, N, p), _unit(rng, m, q)
    tg = np.arange(N) % m          # sample i's true output is candidate tg[i]
    Y, cg = cands[tg], np.arange(m)
    ref, W_ref = _n_slack_exact(loss, X, Y, cands, tg, cg, C)
    tr = CuttingPlaneTrainer(X, Y, loss=loss, C=C, candidates=cands, true_group=tg, cand_group=cg,
                             epsilon=1e-7, max_iter=5000, line_search=line_search).fit()
    assert tr.converged
    W = tr.solution
    ours = primal_objective(loss, X, Y, W, C, candidates=cands, true_group=tg, cand_group=cg)
    assert ours == pytest.approx(ref, rel=1e-4, abs=1e-6)
    assert tr.history[-1]["dual"] <= ref * (1 + 1e-6) + 1e-9   # the dual is a lower bound
    np.testing.assert_allclose(W, W_ref, atol=2e-3 * max(1.0, np.abs(W_ref).max()))


def test_continuous_cutting_plane_reaches_the_primal_minimum() -> None:
    """Closed-form C loss: the cutting-plane solution's primal equals a long L-BFGS run on eq. 3 directly."""
    rng = np.random.default_rng(10)
    N, p, q, C = 60, 4, 4, 50.0
    X = _unit(rng, N, p)
    Y = normalize_rows(X @ rng.normal(size=(p, q)) + 0.4 * rng.normal(size=(N, q)), "l2").astype(np.float64)
    tr = CuttingPlaneTrainer(X, Y, loss="C", C=C, epsilon=1e-6, max_iter=3000).fit()
    assert tr.converged
    ours = primal_objective("C", X, Y, tr.solution, C)

    def f(w: np.ndarray) -> tuple[float, np.ndarray]:
        W = w.reshape(p, q)
        h, y_hat = hinge_terms("C", X, Y, W)
        act = (h > 0)[:, None]
        grad = W + C / N * X.T @ ((y_hat - Y) * act)
        return 0.5 * w @ w + C * h.mean(), grad.ravel()

    ref = minimize(f, np.zeros(p * q), jac=True, method="L-BFGS-B", options={"maxiter": 5000, "gtol": 1e-12})
    assert ours <= ref.fun + 1e-6 * C             # within C * epsilon of the optimum, which L-BFGS bounds
    assert ours == pytest.approx(ref.fun, rel=1e-4)
    last = tr.history[-1]
    assert last["dual"] <= ref.fun + 1e-9 and ours - last["dual"] <= 1e-6 * C * 1.0001


def test_iterations_report_primal_dual_gap_and_keep_the_gram_matrix_exact() -> None:
    rng = np.random.default_rng(11)
    X, Y = _unit(rng, 200, 5), _unit(rng, 200, 4)
    tr = CuttingPlaneTrainer(X, Y, loss="E", C=100.0, epsilon=1e-4, line_search=False, inactive_limit=3)
    infos = list(tr.run())
    assert tr.converged and len(infos) == tr.iteration >= 3
    for info in infos:
        assert info.gap >= -1e-8 and info.primal >= info.dual - 1e-8
        assert set(info.terms()) >= {"primal", "dual", "gap", "violation", "xi", "hinge"}
    assert infos[-1].violation <= 1e-4
    duals = [i.dual for i in infos]
    np.testing.assert_allclose(tr.G, tr.A @ tr.A.T, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(tr.W, (tr.alpha @ tr.A).reshape(5, 4), atol=1e-12)
    assert max(duals) == pytest.approx(infos[-1].dual, rel=1e-3)  # the lower bound rises (pruning aside)


def test_primal_reported_equals_objective_at_the_iterate() -> None:
    rng = np.random.default_rng(12)
    X, Y = _unit(rng, 100, 4), _unit(rng, 100, 3)
    tr = CuttingPlaneTrainer(X, Y, loss="C", C=30.0, epsilon=1e-5, line_search=False)
    for _ in range(4):
        W = tr.W.copy()
        info = tr.step()
        assert info.primal == pytest.approx(primal_objective("C", X, Y, W, 30.0), rel=1e-5)


@pytest.mark.parametrize("line_search", [False, True])
def test_resume_from_a_saved_working_set_gives_the_same_model(line_search: bool) -> None:
    rng = np.random.default_rng(13)
    X, Y = _unit(rng, 300, 6), _unit(rng, 300, 5)
    kw = dict(loss="M", C=200.0, epsilon=1e-4, line_search=line_search, seed=3)  # M on the sphere: random starts
    full = CuttingPlaneTrainer(X, Y, **kw).fit()
    part = CuttingPlaneTrainer(X, Y, **kw)
    for _ in range(4):
        part.step()
    saved = part.state_dict()
    assert saved["A"].dtype == np.float32
    again = CuttingPlaneTrainer(X, Y, **kw)
    again.load_state_dict(saved)
    again.fit()
    assert again.iteration == full.iteration
    np.testing.assert_array_equal(again.solution, full.solution)
    with pytest.raises(CrossViewError, match="same features"):
        CuttingPlaneTrainer(X[:, :4], Y, **kw).load_state_dict(saved)


def test_warm_start_over_a_c_grid_reaches_each_optimum() -> None:
    rng = np.random.default_rng(14)
    X, Y = _unit(rng, 150, 4), _unit(rng, 150, 4)
    tr = CuttingPlaneTrainer(X, Y, loss="C", C=0.1, epsilon=1e-5)
    for C in (0.1, 10.0, 1000.0):
        tr.set_C(C)
        tr.fit()
        fresh = CuttingPlaneTrainer(X, Y, loss="C", C=C, epsilon=1e-5).fit()
        a, b = primal_objective("C", X, Y, tr.solution, C), primal_objective("C", X, Y, fresh.solution, C)
        assert a == pytest.approx(b, rel=1e-4, abs=2e-5 * C)


def test_trainer_input_errors() -> None:
    X = np.ones((4, 3))
    with pytest.raises(CrossViewError, match="C must be a positive"):
        CuttingPlaneTrainer(X, X, C=-1)
    with pytest.raises(CrossViewError, match="same N"):
        CuttingPlaneTrainer(X, X[:3])
    with pytest.raises(CrossViewError, match="epsilon"):
        CuttingPlaneTrainer(X, X, epsilon=0)
    with pytest.raises(CrossViewError, match=r"candidates must be \(m, 3\)"):
        CuttingPlaneTrainer(X, X, candidates=np.ones((5, 2)))
    with pytest.raises(CrossViewError, match="unknown output domain"):
        CuttingPlaneTrainer(X, X, domain="cube")
    with pytest.raises(CrossViewError, match="non-negative.*smallest is -1"):
        normalize_rows(-np.ones((2, 2)), "l1", "text features")
    with pytest.raises(CrossViewError, match="NaN"):
        normalize_rows(np.full((2, 2), np.nan), "l2")


def test_c_grid_parsing() -> None:
    assert parse_c_grid(None) == () and parse_c_grid("") == () and parse_c_grid([]) == ()
    assert parse_c_grid("paper") == tuple(10.0 ** k for k in range(-5, 6))
    assert parse_c_grid("1e-2:1e1") == (0.01, 0.1, 1.0, 10.0)
    assert parse_c_grid("10, 0.1 1") == (0.1, 1.0, 10.0)
    assert parse_c_grid([3, 1]) == (1.0, 3.0)
    with pytest.raises(CrossViewError, match="c_grid value 'x'"):
        parse_c_grid("1,x")
    with pytest.raises(CrossViewError, match="LOW:HIGH"):
        parse_c_grid("5:1")
