"""WARP maths: harmonic rank weight, loss and gradients against naive loops, the vectorised sampler's
distribution against the paper's sequential loop, and the max-norm projection."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

from crossview.methods.wsabie import (caption_gradients, caption_warp_step, label_gradients,
                                      label_warp_step)
from crossview.nn.warp import (harmonic_table, max_norm_columns_, rank_weight, sample_violator_sequential,
                               sample_violators, warp_loss)

torch.set_num_threads(1)


def _harmonic(k: int) -> float:
    return float(sum(Fraction(1, j) for j in range(1, k + 1)))


# ---------------------------------------------------------------------------- rank weight
def test_harmonic_table_hand_values() -> None:
    t = harmonic_table(5, dtype=torch.float64)
    assert t.tolist() == pytest.approx([0.0, 1.0, 1.5, 11 / 6, 25 / 12, 137 / 60], abs=1e-15)
    big = harmonic_table(100_000, dtype=torch.float64)
    assert float(big[100_000]) == pytest.approx(np.sum(1.0 / np.arange(1, 100_001)[::-1]), rel=1e-13)
    assert float(harmonic_table(0)[0]) == 0.0
    with pytest.raises(ValueError):
        harmonic_table(-1)


def test_rank_weight_hand_values() -> None:
    table = harmonic_table(99, dtype=torch.float64)
    n_neg = torch.tensor([99, 99, 99, 99, 99, 7, 7])
    n = torch.tensor([1, 10, 50, 99, 0, 2, 3])
    # floor(99/1)=99, floor(99/10)=9, floor(99/50)=1, floor(99/99)=1, N=0 -> 0, floor(7/2)=3, floor(7/3)=2
    expected = [_harmonic(99), 7129 / 2520, 1.0, 1.0, 0.0, 11 / 6, 1.5]
    assert rank_weight(n, n_neg, table).tolist() == pytest.approx(expected, abs=1e-12)


def test_warp_loss_matches_naive_loop() -> None:
    rng = np.random.default_rng(0)
    b = 200
    f_pos = rng.normal(size=b)
    f_neg = rng.normal(size=b)
    n_neg = rng.integers(1, 500, size=b)
    n = np.array([rng.integers(1, m + 1) for m in n_neg])
    violated = rng.random(b) < 0.7
    table = harmonic_table(int(n_neg.max()), dtype=torch.float64)
    got = warp_loss(torch.tensor(f_pos), torch.tensor(f_neg), torch.tensor(n), torch.tensor(n_neg),
                    torch.tensor(violated), table, margin=1.0).numpy()
    for i in range(b):
        want = _harmonic(n_neg[i] // n[i]) * max(0.0, 1.0 - f_pos[i] + f_neg[i]) if violated[i] else 0.0
        assert got[i] == pytest.approx(want, abs=1e-12)


# ---------------------------------------------------------------------------- gradients
def test_caption_gradients_match_autograd_and_naive_loop() -> None:
    g = torch.Generator().manual_seed(1)
    P, p, q, b = 6, 5, 4, 9
    V = torch.randn(P, p, generator=g, dtype=torch.float64)
    Z = torch.randn(P, q, generator=g, dtype=torch.float64)
    x = torch.randn(b, p, generator=g, dtype=torch.float64)
    yp = torch.randn(b, q, generator=g, dtype=torch.float64)
    yn = torch.randn(b, q, generator=g, dtype=torch.float64)
    n_neg = torch.randint(1, 50, (b,), generator=g)
    n = torch.clamp(torch.randint(1, 50, (b,), generator=g), max=n_neg)
    viol = torch.ones(b, dtype=torch.bool)
    viol[2] = False
    table = harmonic_table(50, dtype=torch.float64)
    margin = 1000.0  # keeps every hinge active, so the linear gradient is the whole gradient
    w = rank_weight(n, n_neg, table) * viol

    dV, dZ = caption_gradients(V, Z, x, yp, yn, w)

    Va, Za = V.clone().requires_grad_(), Z.clone().requires_grad_()
    u = x @ Va.T
    loss = warp_loss((yp @ Za.T * u).sum(1), (yn @ Za.T * u).sum(1), n, n_neg, viol, table, margin).sum()
    loss.backward()
    torch.testing.assert_close(dV, Va.grad)
    torch.testing.assert_close(dZ, Za.grad)

    Vn, Zn, xn, ypn, ynn, wn = (t.numpy() for t in (V, Z, x, yp, yn, w))
    dV_naive, dZ_naive = np.zeros_like(Vn), np.zeros_like(Zn)
    for i in range(b):  # d/dV and d/dZ of w_i * (m - y+^T Z^T V x + y-^T Z^T V x), one example at a time
        dV_naive += wn[i] * np.outer(Zn @ (ynn[i] - ypn[i]), xn[i])
        dZ_naive += wn[i] * np.outer(Vn @ xn[i], ynn[i] - ypn[i])
    np.testing.assert_allclose(dV.numpy(), dV_naive, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dZ.numpy(), dZ_naive, rtol=1e-10, atol=1e-12)


def test_label_gradients_match_autograd_and_naive_loop() -> None:
    g = torch.Generator().manual_seed(2)
    P, p, Y, b = 5, 4, 7, 12
    V = torch.randn(P, p, generator=g, dtype=torch.float64)
    W = torch.randn(P, Y, generator=g, dtype=torch.float64)
    x = torch.randn(b, p, generator=g, dtype=torch.float64)
    pos = torch.randint(0, Y, (b,), generator=g)
    neg = (pos + torch.randint(1, Y, (b,), generator=g)) % Y   # repeated labels exercise the accumulation
    w = torch.rand(b, generator=g, dtype=torch.float64) * 3

    dV, dW = label_gradients(V, W, x, pos, neg, w)

    Va, Wa = V.clone().requires_grad_(), W.clone().requires_grad_()
    u = x @ Va.T
    hinge = 10.0 - (Wa[:, pos].T * u).sum(1) + (Wa[:, neg].T * u).sum(1)
    (w * hinge).sum().backward()
    torch.testing.assert_close(dV, Va.grad)
    torch.testing.assert_close(dW, Wa.grad)

    Vn, Wn, xn = V.numpy(), W.numpy(), x.numpy()
    dV_naive, dW_naive = np.zeros_like(Vn), np.zeros_like(Wn)
    for i in range(b):
        ux = Vn @ xn[i]
        dV_naive += float(w[i]) * np.outer(Wn[:, int(neg[i])] - Wn[:, int(pos[i])], xn[i])
        dW_naive[:, int(neg[i])] += float(w[i]) * ux
        dW_naive[:, int(pos[i])] -= float(w[i]) * ux
    np.testing.assert_allclose(dV.numpy(), dV_naive, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dW.numpy(), dW_naive, rtol=1e-10, atol=1e-12)


def test_caption_step_is_one_paper_sgd_step() -> None:
    """Batch of 1, two images with one caption each: the only negative is the other caption (N = 1,
    weight L(1) = 1), so the step is exactly the paper's update followed by the projection."""
    g = torch.Generator().manual_seed(3)
    P, p, q = 4, 3, 5
    V = torch.randn(P, p, generator=g, dtype=torch.float64)
    Z = torch.randn(P, q, generator=g, dtype=torch.float64) * 0.1
    X = torch.randn(2, p, generator=g, dtype=torch.float64)
    Y = torch.randn(2, q, generator=g, dtype=torch.float64)
    ci = torch.tensor([0, 1])
    lr, lam = 0.3, 1.1
    Vn, Zn = V.numpy().copy(), Z.numpy().copy()
    stats_ = caption_warp_step(V, Z, X[[0]], torch.tensor([0]), torch.tensor([0]), Y, ci, torch.tensor([1]),
                               harmonic_table(1, dtype=torch.float64), lr=lr, max_norm=lam, margin=100.0,
                               generator=torch.Generator().manual_seed(0))
    assert stats_.violated == 1.0 and stats_.draws == 1.0
    x, yp, yn = X[0].numpy(), Y[0].numpy(), Y[1].numpy()
    dV = np.outer(Zn @ (yn - yp), x)
    dZ = np.outer(Vn @ x, yn - yp)
    Vn, Zn = Vn - lr * dV, Zn - lr * dZ
    for M in (Vn, Zn):
        norms = np.linalg.norm(M, axis=0)
        M *= np.minimum(1.0, lam / norms)
    np.testing.assert_allclose(V.numpy(), Vn, rtol=1e-12)
    np.testing.assert_allclose(Z.numpy(), Zn, rtol=1e-12)
    assert float(torch.linalg.vector_norm(V, dim=0).max()) <= lam + 1e-12


def test_label_step_skips_positives_and_steps_on_a_negative() -> None:
    """Image 0 has labels {0, 1} of Y = 3: the only negative is label 2 and it is the one stepped on."""
    g = torch.Generator().manual_seed(4)
    P, p = 3, 4
    V = torch.randn(P, p, generator=g, dtype=torch.float64)
    W = torch.zeros(P, 3, dtype=torch.float64)
    x = torch.randn(1, p, generator=g, dtype=torch.float64)
    keys = torch.tensor([0, 1])  # image 0 * 3 + label
    u = (V @ x[0]).clone()
    st = label_warp_step(V, W, x, torch.tensor([0]), torch.tensor([0]), keys, torch.tensor([1]),
                         harmonic_table(2, dtype=torch.float64), lr=0.5, max_norm=100.0,
                         generator=torch.Generator().manual_seed(0))
    assert st.violated == 1.0 and st.draws == 1.0
    torch.testing.assert_close(W[:, 0], 0.5 * u)     # the positive moves towards V x
    torch.testing.assert_close(W[:, 2], -0.5 * u)    # the negative away from it
    torch.testing.assert_close(W[:, 1], torch.zeros(P, dtype=torch.float64))


# ---------------------------------------------------------------------------- sampling statistics
def _truncated_geometric(n_neg: int, n_viol: int, cap: int | None = None) -> tuple[np.ndarray, float]:
    """P(N = n and a violator found), n = 1..limit, and P(no violator), for iid uniform draws."""
    limit = n_neg if cap is None else min(cap, n_neg)
    p = n_viol / n_neg
    n = np.arange(1, limit + 1)
    return (1 - p) ** (n - 1) * p, (1 - p) ** limit


def _hist(n: np.ndarray, violated: np.ndarray, limit: int) -> np.ndarray:
    """Counts of N = 1..limit among violating rows, then the count of rows without a violator."""
    return np.concatenate([np.bincount(n[violated], minlength=limit + 1)[1:limit + 1], [np.sum(~violated)]])


def _pooled(counts: np.ndarray, expected: np.ndarray, min_expected: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Merge adjacent bins (tail into its neighbour) until every expected count is >= min_expected."""
    c_out, e_out, c_acc, e_acc = [], [], 0.0, 0.0
    for c, e in zip(counts, expected):
        c_acc, e_acc = c_acc + c, e_acc + e
        if e_acc >= min_expected:
            c_out.append(c_acc)
            e_out.append(e_acc)
            c_acc = e_acc = 0.0
    if e_acc:
        c_out[-1] += c_acc
        e_out[-1] += e_acc
    return np.array(c_out), np.array(e_out)


@pytest.mark.parametrize("n_viol,draws_per_round,max_draws,switch", [
    (4, 3, None, None), (1, 8, None, None), (6, 32, 5, None),      # drawing only
    (4, 3, None, 6), (1, 2, None, 1), (6, 2, 5, 4),                # then (or at once) from full score rows
])
def test_vectorised_sampler_matches_sequential_distribution(n_viol: int, draws_per_round: int,
                                                            max_draws: int | None, switch: int | None) -> None:
    """40 negatives (and 10 positives mixed into the candidates, which must be rejected), ``n_viol`` of
    the negatives violate: the N histogram of the vectorised sampler, of the paper's sequential loop and
    the closed form (geometric truncated at n_neg or max_draws) agree (chi-square, seeded). ``switch``:
    rows still open once a round would draw that many are finished from their full score rows."""
    n_neg, n_pos, rows = 40, 10, 20_000
    n_cand = n_neg + n_pos
    rng = np.random.default_rng(5)
    perm = rng.permutation(n_cand)
    positives = perm[:n_pos]                            # candidate ids that are positives of every row
    negatives = perm[n_pos:]
    scores = np.full(n_cand, -5.0)
    scores[positives] = 50.0                            # positives would "violate" if they were not rejected
    scores[negatives[:n_viol]] = 0.5                    # f_pos = 0, margin 1: these violate
    s_t = torch.tensor(scores, dtype=torch.float32)
    pos_mask = torch.zeros(n_cand, dtype=torch.bool)
    pos_mask[torch.as_tensor(positives)] = True

    full = None if switch is None else (lambda r: s_t.expand(len(r), n_cand))
    draw = sample_violators(torch.zeros(rows), n_cand, torch.full((rows,), n_neg),
                            lambda r, c: s_t[c], lambda r, c: pos_mask[c], draws_per_round=draws_per_round,
                            max_draws=max_draws, full_score_fn=full, switch_draws=switch,
                            full_budget=4096, generator=torch.Generator().manual_seed(6))
    vec_n, vec_v = draw.n_draws.numpy(), draw.violated.numpy()
    assert set(draw.negative[draw.violated].tolist()) <= set(negatives[:n_viol].tolist())
    assert torch.all(draw.negative[~draw.violated] == -1)
    np.testing.assert_allclose(draw.f_neg[draw.violated].numpy(), 0.5)

    neg_scores = scores[negatives]
    seq = [sample_violator_sequential(0.0, neg_scores if max_draws is None else neg_scores, rng)
           for _ in range(rows)]
    seq_n = np.array([n if max_draws is None else min(n, max_draws) for n, _ in seq])
    seq_v = np.array([j >= 0 and (max_draws is None or n <= max_draws) for n, j in seq])

    limit = n_neg if max_draws is None else max_draws
    assert vec_n.max() <= limit and vec_n.min() >= 1
    assert np.all(vec_n[~vec_v] == limit)
    h_vec, h_seq = _hist(vec_n, vec_v, limit), _hist(seq_n, seq_v, limit)
    pmf, p_none = _truncated_geometric(n_neg, n_viol, max_draws)
    expected = np.concatenate([pmf, [p_none]]) * rows
    for h in (h_vec, h_seq):  # each against the closed form
        c, e = _pooled(h, expected)
        assert stats.chisquare(c, e).pvalue > 1e-3
    keep = (h_vec + h_seq) > 0                          # the two samplers against each other
    assert stats.chi2_contingency(np.stack([h_vec[keep], h_seq[keep]])).pvalue > 1e-3
    assert vec_n.mean() == pytest.approx(seq_n.mean(), rel=0.05)
    # The violator is uniform among the violators.
    if n_viol > 1:
        picks = np.bincount(np.searchsorted(np.sort(negatives[:n_viol]), draw.negative[draw.violated].numpy()),
                            minlength=n_viol)
        assert stats.chisquare(picks).pvalue > 1e-3


def test_sampler_edge_cases() -> None:
    # a row with no negatives never draws; a row where everything violates stops at N = 1
    draw = sample_violators(torch.tensor([0.0, 0.0]), 5, torch.tensor([0, 5]), lambda r, c: torch.ones(c.shape),
                            generator=torch.Generator().manual_seed(0))
    assert draw.violated.tolist() == [False, True]
    assert draw.n_draws.tolist() == [0, 1]
    # nothing violates: every row draws exactly n_neg times and reports no violator
    draw = sample_violators(torch.zeros(50), 30, torch.full((50,), 30), lambda r, c: torch.full(c.shape, -9.0),
                            draws_per_round=4, generator=torch.Generator().manual_seed(0))
    assert not draw.violated.any() and torch.all(draw.n_draws == 30)
    with pytest.raises(ValueError):
        sample_violators(torch.zeros(1), 3, torch.tensor([3]), lambda r, c: c.float(), draws_per_round=0)


def test_sequential_reference_loop() -> None:
    rng = np.random.default_rng(0)
    assert sample_violator_sequential(0.0, np.array([-3.0, -3.0]), rng) == (2, -1)
    n, j = sample_violator_sequential(0.0, np.array([-3.0, 0.5]), rng)
    assert j == 1 and 1 <= n <= 2


# ---------------------------------------------------------------------------- projection
def test_max_norm_columns() -> None:
    m = torch.tensor([[3.0, 0.1, 0.0, -6.0],
                      [4.0, 0.2, 0.0, 8.0]])
    out = max_norm_columns_(m, 2.0)
    assert out is m
    torch.testing.assert_close(m[:, 0], torch.tensor([1.2, 1.6]))        # norm 5 -> 2, same direction
    torch.testing.assert_close(m[:, 1], torch.tensor([0.1, 0.2]))        # under the bound: unchanged
    torch.testing.assert_close(m[:, 2], torch.tensor([0.0, 0.0]))        # zero column stays zero
    torch.testing.assert_close(m[:, 3], torch.tensor([-1.2, 1.6]))
    assert torch.all(torch.linalg.vector_norm(m, dim=0) <= 2.0 + 1e-6)
