"""WARP maths: harmonic rank weight, loss, WSABIE's step against the paper's update and a naive loop, the vectorised sampler's
distribution against the paper's sequential loop, and the max-norm projection."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

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


# ---------------------------------------------------------------------------- WSABIE's step on the trainer
def _double(v):
    """A prepared tensor, or WSABIE's centred image rows (nn.sparse_rows.DenseRows), in float64."""
    from crossview.nn.sparse_rows import DenseRows

    if isinstance(v, DenseRows):
        return DenseRows(v.base.double(), None if v.center is None else v.center.double(), v.norms.double())
    return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v


def _one_sgd_step(method, data, V: torch.Tensor, T: torch.Tensor, batch: list[int]) -> dict:
    """Set the model to ``V``, ``T``, run the method's training step on ``batch`` and one SGD step with
    the method's lr, then its projection: what the trainer does for one batch."""
    spec = method.model_spec(data, False)
    model = method.build_model(spec).double()
    with torch.no_grad():
        model.V.copy_(V)
        model.text_matrix.copy_(T)
    method.prepare(data, torch.device("cpu"))
    method._t = {k: _double(v) for k, v in method._t.items()}
    opt = torch.optim.SGD(model.parameters(), lr=method.lr)
    terms = method.training_step(model, torch.tensor(batch), torch.Generator().manual_seed(0))
    terms["loss"].backward()
    opt.step()
    with torch.no_grad():
        method.after_step(model)
    return {"V": model.V.detach(), "T": model.text_matrix.detach(), **{k: float(v.detach()) for k, v in terms.items()}}


def test_caption_step_is_one_paper_sgd_step() -> None:
    """Batch of 1, two images with one caption each: the only negative is the other caption (N = 1,
    weight L(1) = 1), so the step is exactly the paper's update followed by the projection; with
    ``directions='both'`` the mirror term (the other image as the negative) is added."""
    from crossview.data.method_data import MethodData
    from crossview.methods import create_method

    g = torch.Generator().manual_seed(3)
    P, p, q = 4, 3, 5
    V = torch.randn(P, p, generator=g, dtype=torch.float64)
    Z = torch.randn(P, q, generator=g, dtype=torch.float64) * 0.1
    X = torch.randn(2, p, generator=g, dtype=torch.float32).double()   # features are float32
    Y = torch.randn(2, q, generator=g, dtype=torch.float32).double()   # features are float32
    data = MethodData(image_features=X.numpy(), text_features=Y.numpy(), captions=["a", "b"],
                      caption_image=np.array([0, 1]), name="train")
    lr, lam = 0.3, 1.1
    for directions in ("i2t", "both"):
        m = create_method("wsabie", dim=P, lr=lr, max_norm=lam, margin=100.0, normalize="none",
                          directions=directions).with_run(device="cpu")
        out = _one_sgd_step(m, data, V, Z, [0])
        assert out["violated"] == 1.0 and out["draws"] == 1.0
        Vn, Zn = V.numpy().copy(), Z.numpy().copy()
        x0, x1, yp, yn = X[0].numpy(), X[1].numpy(), Y[0].numpy(), Y[1].numpy()
        # i2t: 100 - (Vx0).(Z y0) + (Vx0).(Z y1); t2i: 100 - (Vx0).(Z y0) + (Vx1).(Z y0), each weight L(1) = 1
        dV = np.outer(Zn @ (yn - yp), x0)
        dZ = np.outer(Vn @ x0, yn - yp)
        if directions == "both":
            dV += np.outer(Zn @ yp, x1 - x0)
            dZ += np.outer(Vn @ (x1 - x0), yp)
        Vn, Zn = Vn - lr * dV, Zn - lr * dZ
        for M in (Vn, Zn):
            norms = np.linalg.norm(M, axis=0)
            M *= np.minimum(1.0, lam / norms)
        np.testing.assert_allclose(out["V"].numpy(), Vn, rtol=1e-12)
        np.testing.assert_allclose(out["T"].numpy(), Zn, rtol=1e-12)
        assert float(torch.linalg.vector_norm(out["V"], dim=0).max()) <= lam + 1e-12


def test_caption_step_gradient_matches_naive_loop() -> None:
    """A batch of several positives: the summed WARP step equals the per-example paper steps added up
    (each with its own violator and rank weight), computed by a plain loop from the drawn negatives."""
    from crossview.data.method_data import MethodData
    from crossview.methods import create_method
    from crossview.nn import warp

    g = torch.Generator().manual_seed(5)
    P, p, q, n_img = 3, 4, 6, 6
    V = torch.randn(P, p, generator=g, dtype=torch.float64)
    Z = torch.randn(P, q, generator=g, dtype=torch.float64)
    X = torch.randn(n_img, p, generator=g, dtype=torch.float32).double()   # features are float32
    ci = np.repeat(np.arange(n_img), 2)
    Y = torch.randn(len(ci), q, generator=g, dtype=torch.float32).double()   # features are float32
    data = MethodData(image_features=X.numpy(), text_features=Y.numpy(), captions=[str(j) for j in range(len(ci))],
                      caption_image=ci, name="train")
    draws: list = []
    real = warp.sample_violators

    def spy(*a, **k):
        d = real(*a, **k)
        draws.append(d)
        return d

    lr = 0.01
    m = create_method("wsabie", dim=P, lr=lr, max_norm=1e6, margin=5.0, normalize="none",
                      directions="i2t").with_run(device="cpu")
    import crossview.methods.wsabie as W
    W.sample_violators = spy
    try:
        batch = [0, 3, 7, 10]
        out = _one_sgd_step(m, data, V, Z, batch)
    finally:
        W.sample_violators = real
    d = draws[0]
    Vn, Zn, Xn, Yn = V.numpy(), Z.numpy(), X.numpy(), Y.numpy()
    dV, dZ = np.zeros_like(Vn), np.zeros_like(Zn)
    for r, j in enumerate(batch):
        if not bool(d.violated[r]):
            continue
        x, yp, yn = Xn[ci[j]], Yn[j], Yn[int(d.negative[r])]
        assert ci[int(d.negative[r])] != ci[j]                 # never a caption of the same image
        w = _harmonic((len(ci) - 2) // int(d.n_draws[r]))
        if 5.0 - (Vn @ x) @ (Zn @ yp) + (Vn @ x) @ (Zn @ yn) <= 0:
            continue
        dV += w * np.outer(Zn @ (yn - yp), x)
        dZ += w * np.outer(Vn @ x, yn - yp)
    assert np.abs(dV).max() > 0.1                            # steps were taken
    # (the method's rank-weight table is float32: L(k) to ~1e-7 relative)
    np.testing.assert_allclose(out["V"].numpy(), Vn - lr * dV, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(out["T"].numpy(), Zn - lr * dZ, rtol=1e-6, atol=1e-9)


def test_label_step_skips_positives_and_steps_on_a_negative() -> None:
    """Image 0 has tags {0, 1} of Y = 3, image 1 has tag {2}: for the pair (image 0, label 0) the only
    label negative is 2, and it is the one stepped on (the positive moves towards V x, the negative away)."""
    from crossview.data.method_data import MethodData
    from crossview.methods import create_method

    class _Tags:
        tags = [["a", "b"], ["c"]]

    g = torch.Generator().manual_seed(4)
    P, p = 3, 4
    V = torch.randn(P, p, generator=g, dtype=torch.float64)
    W = torch.zeros(P, 3, dtype=torch.float64)
    x = torch.randn(2, p, generator=g, dtype=torch.float32).double()   # features are float32
    data = MethodData(image_features=x.numpy(), text_features=None, captions=[], caption_image=np.zeros(0, np.int64),
                      dataset=_Tags(), name="train")
    m = create_method("wsabie", target="tags", dim=P, lr=0.5, max_norm=100.0, normalize="none",
                      directions="i2t").with_run(device="cpu")
    out = _one_sgd_step(m, data, V, W, [0])
    assert out["violated"] == 1.0 and out["draws"] == 1.0
    u = V @ x[0]
    torch.testing.assert_close(out["T"][:, 0], 0.5 * u)     # the positive moves towards V x
    torch.testing.assert_close(out["T"][:, 2], -0.5 * u)    # the negative away from it
    torch.testing.assert_close(out["T"][:, 1], torch.zeros(P, dtype=torch.float64))


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
