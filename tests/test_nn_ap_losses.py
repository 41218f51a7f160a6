"""crossview.nn.losses.smooth_ap_loss and info_nce_loss (paper 004): checked against naive per-query loops,
against the exact average precision (scikit-learn) as tau -> 0 on hand-made score lists, by hand, and with
autograd.gradcheck in float64."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score

from crossview.nn.losses import info_nce_loss, smooth_ap_loss


def naive_smooth_ap(scores: torch.Tensor, pos: torch.Tensor, tau: float) -> float:
    """Paper 004 eq. 5 written out query by query, in Python floats: 1 - mean over queries of AP_q."""
    aps = []
    for q in range(scores.shape[0]):
        s = [float(v) for v in scores[q]]
        P = [j for j in range(len(s)) if bool(pos[q, j])]
        if not P:
            continue
        G = lambda d: 1.0 / (1.0 + math.exp(-d / tau))  # noqa: E731
        terms = []
        for i in P:
            r_pos = 1.0 + sum(G(s[j] - s[i]) for j in P if j != i)
            r_all = 1.0 + sum(G(s[j] - s[i]) for j in range(len(s)) if j != i)
            terms.append(r_pos / r_all)
        aps.append(sum(terms) / len(P))
    return 1.0 - sum(aps) / len(aps) if aps else 0.0


def naive_info_nce(scores: torch.Tensor, pos: torch.Tensor, temperature: float) -> float:
    """-log softmax of each positive against the query's negatives only, averaged over (query, positive)."""
    terms = []
    for q in range(scores.shape[0]):
        x = [float(v) / temperature for v in scores[q]]
        negs = [x[j] for j in range(len(x)) if not bool(pos[q, j])]
        for p in range(len(x)):
            if bool(pos[q, p]):
                den = math.exp(x[p]) + sum(math.exp(v) for v in negs)
                terms.append(-(x[p] - math.log(den)))
    return sum(terms) / len(terms) if terms else 0.0


def _case(q: int, m: int, seed: int, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(q, m, generator=gen, dtype=dtype) * 2 - 1
    pos = torch.rand(q, m, generator=gen) < 0.3
    return scores, pos


# ------------------------------------------------------------------------------------------------ SmoothAP
@settings(max_examples=60, deadline=None)
@given(q=st.integers(1, 6), m=st.integers(1, 12), seed=st.integers(0, 10_000),
       tau=st.sampled_from([0.01, 0.05, 0.3, 1.0]))
def test_smooth_ap_matches_a_naive_per_query_loop(q, m, seed, tau) -> None:
    scores, pos = _case(q, m, seed)
    got = float(smooth_ap_loss(scores, pos, tau=tau))
    assert got == pytest.approx(naive_smooth_ap(scores, pos, tau), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(2, 30), data=st.data())
def test_smooth_ap_is_the_exact_ap_as_tau_goes_to_zero(m, data) -> None:
    # distinct scores at least 0.01 apart: sigmoid(0.01 / 1e-5) is 1 to double precision
    order = data.draw(st.permutations(range(m)))
    scores = torch.tensor([[0.01 * r for r in order]], dtype=torch.float64)
    labels = data.draw(st.lists(st.booleans(), min_size=m, max_size=m).filter(any))
    pos = torch.tensor([labels])
    want = average_precision_score(labels, scores[0].numpy())
    assert 1.0 - float(smooth_ap_loss(scores, pos, tau=1e-5)) == pytest.approx(want, abs=1e-9)


def test_smooth_ap_hand_made_lists() -> None:
    s = torch.tensor([[0.9, 0.8, 0.7, 0.6],     # positives at ranks 1 and 3: AP = (1/1 + 2/3) / 2 = 5/6
                      [0.1, 0.4, 0.3, 0.2],     # one positive at rank 4: AP = 1/4
                      [0.5, 0.6, 0.7, 0.8]],    # every candidate positive: AP = 1
                     dtype=torch.float64)
    pos = torch.tensor([[1, 0, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert float(smooth_ap_loss(s, pos, tau=1e-6)) == pytest.approx(1.0 - (5 / 6 + 1 / 4 + 1) / 3, abs=1e-12)
    # tau large: every sigmoid is ~1/2, so AP_q -> (1 + (|P| - 1) / 2) / (1 + (m - 1) / 2) for each positive
    want = 1.0 - ((1 + 0.5) / 2.5 + 1 / 2.5 + 1.0) / 3
    assert float(smooth_ap_loss(s, pos, tau=1e6)) == pytest.approx(want, abs=1e-6)


def test_smooth_ap_leaves_queries_without_a_positive_out() -> None:
    s = torch.tensor([[0.9, 0.8], [0.1, 0.9]], dtype=torch.float64)
    pos = torch.tensor([[False, True], [False, False]])
    assert float(smooth_ap_loss(s, pos, tau=1e-6)) == pytest.approx(0.5)
    none = smooth_ap_loss(s, torch.zeros_like(pos), tau=0.01)
    assert float(none) == 0.0 and none.requires_grad is False


def test_smooth_ap_gradcheck_float64() -> None:
    scores, pos = _case(4, 7, seed=3)
    pos[0, 0] = True
    scores.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: smooth_ap_loss(x, pos, tau=0.1), (scores,))


def test_smooth_ap_gradient_raises_positives_and_lowers_negatives() -> None:
    s = torch.tensor([[0.5, 0.52, 0.48, 0.1]], dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([[True, False, False, True]])
    smooth_ap_loss(s, pos, tau=0.05).backward()
    g = s.grad[0]
    assert g[0] < 0 and g[3] < 0          # descending the loss raises the positives' scores
    assert g[1] > 0 and g[2] > 0          # and lowers the negatives that outrank or crowd them


def test_smooth_ap_half_precision_gives_a_float32_loss() -> None:
    scores, pos = _case(3, 5, seed=1, dtype=torch.float16)
    pos[:, 0] = True
    out = smooth_ap_loss(scores, pos)
    assert out.dtype == torch.float32 and torch.isfinite(out)


@pytest.mark.parametrize("fn", [smooth_ap_loss, info_nce_loss])
def test_bad_shapes_and_temperatures_are_refused(fn) -> None:
    with pytest.raises(ValueError, match="same shape"):
        fn(torch.zeros(2, 3), torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="same shape"):
        fn(torch.zeros(6), torch.zeros(6, dtype=torch.bool))
    key = "tau" if fn is smooth_ap_loss else "temperature"
    with pytest.raises(ValueError, match=f"{key} must be > 0"):
        fn(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), **{key: 0.0})


def test_smooth_ap_difference_tensor_is_only_positive_rows() -> None:
    """At B = 128 images x 5 captions the i2t loss forms (128, 5, 640) differences, not (128, 640, 640): the
    autograd graph's saved tensors stay a few MB."""
    b = 128
    scores = torch.randn(b, 5 * b, requires_grad=True)
    pos = torch.zeros(b, 5 * b, dtype=torch.bool)
    pos[torch.arange(b).repeat_interleave(5), torch.arange(5 * b)] = True
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = smooth_ap_loss(scores, pos)
    loss.backward()
    assert max(saved) <= b * 5 * 5 * b       # the largest saved tensor is (q, |P|, m)
    assert max(saved) < (5 * b) ** 2 * b // 100


# ------------------------------------------------------------------------------------------------ InfoNCE
@settings(max_examples=60, deadline=None)
@given(q=st.integers(1, 6), m=st.integers(1, 12), seed=st.integers(0, 10_000),
       temperature=st.sampled_from([0.05, 0.1, 0.5, 1.0]))
def test_info_nce_matches_a_naive_loop(q, m, seed, temperature) -> None:
    scores, pos = _case(q, m, seed)
    got = float(info_nce_loss(scores, pos, temperature=temperature))
    assert got == pytest.approx(naive_info_nce(scores, pos, temperature), rel=1e-9, abs=1e-12)


def test_info_nce_with_one_positive_is_softmax_cross_entropy() -> None:
    scores, _ = _case(5, 5, seed=7)
    got = info_nce_loss(scores, torch.eye(5, dtype=torch.bool), temperature=0.1)
    want = torch.nn.functional.cross_entropy(scores / 0.1, torch.arange(5))
    assert float(got) == pytest.approx(float(want), abs=1e-12)


def test_info_nce_hand_worked() -> None:
    # one query, scores (1, 0, 0), positive the first, temperature 1: -log(e / (e + 2))
    got = info_nce_loss(torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64),
                        torch.tensor([[True, False, False]]), temperature=1.0)
    assert float(got) == pytest.approx(-math.log(math.e / (math.e + 2)), abs=1e-12)
    # other positives of the query are not negatives: adding a second positive leaves the first term alone
    got2 = info_nce_loss(torch.tensor([[1.0, 5.0, 0.0, 0.0]], dtype=torch.float64),
                         torch.tensor([[True, True, False, False]]), temperature=1.0)
    want2 = (-math.log(math.e / (math.e + 2)) - math.log(math.e ** 5 / (math.e ** 5 + 2))) / 2
    assert float(got2) == pytest.approx(want2, abs=1e-12)


def test_info_nce_without_negatives_is_zero_and_without_positives_is_zero() -> None:
    s = torch.tensor([[0.3, 0.2]], dtype=torch.float64)
    assert float(info_nce_loss(s, torch.tensor([[True, True]]))) == pytest.approx(0.0, abs=1e-12)
    assert float(info_nce_loss(s, torch.tensor([[False, False]]))) == 0.0


def test_info_nce_gradcheck_float64() -> None:
    scores, pos = _case(4, 6, seed=11)
    pos[:, 0] = True
    scores.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: info_nce_loss(x, pos, temperature=0.2), (scores,))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_smooth_ap_with_a_bound_on_the_positives_is_the_same_loss(seed: int) -> None:
    """``max_positives`` (which spares the loss a wait for the device) gives the naive loop's value for any bound at
    least the most positives of a query, queries without a positive included; no positive anywhere: 0."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(6, 9, generator=g, dtype=torch.float64)
    pos = torch.rand(6, 9, generator=g) < 0.3
    pos[0] = False                                                   # a query without a positive
    pos[1, :4] = True                                                # one with at least 4
    most = int(pos.sum(1).max())
    want = naive_smooth_ap(scores, pos, 0.1)
    for bound in (most, most + 3):
        assert float(smooth_ap_loss(scores, pos, tau=0.1, max_positives=bound)) == pytest.approx(want, rel=1e-12)
    none = torch.zeros_like(pos)
    assert float(smooth_ap_loss(scores, none, tau=0.1, max_positives=2)) == 0.0
