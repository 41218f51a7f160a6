"""crossview.nn.losses, the TIMAM losses (paper 002): cmpm_loss (against a naive double loop, the original
code's formula, hand-worked 2x2 cases, its limits: one class, identity matching) and norm_softmax_id_loss
(against a naive loop and by hand), and the modality discriminator's targets, discriminator_loss, generator_loss
and discriminator_accuracy (against the BCE written out, by hand, the flip rate over many draws, reproducibility
with a seeded generator); the losses also with autograd.gradcheck in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch.nn.functional as F

from crossview.nn.losses import (cmpm_loss, discriminator_accuracy, discriminator_loss, discriminator_targets,
                                 generator_loss, norm_softmax_id_loss)


def _randn(*shape: int, gen: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=dtype)


# ------------------------------------------------------------------------------------------------ CMPM
def naive_cmpm(v: torch.Tensor, t: torch.Tensor, labels: torch.Tensor, eps: float) -> tuple[float, float]:
    """CMPM written out pair by pair in Python floats: p from an explicit softmax, q from counting labels."""
    n = v.shape[0]
    y = [int(k) for k in labels]

    def one_way(a: torch.Tensor, b: torch.Tensor) -> float:
        total = 0.0
        for i in range(n):
            s = [sum(float(a[i, k]) * float(b[j, k]) for k in range(a.shape[1])) / math.sqrt(
                sum(float(b[j, k]) ** 2 for k in range(a.shape[1]))) for j in range(n)]
            m = max(s)
            z = sum(math.exp(x - m) for x in s)
            same = sum(1 for j in range(n) if y[j] == y[i])
            for j in range(n):
                p = math.exp(s[j] - m) / z
                q = (1.0 if y[j] == y[i] else 0.0) / same
                if p > 0:
                    total += p * (math.log(p) - math.log(q + eps))
        return total / n

    return one_way(v, t), one_way(t, v)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 7), d=st.integers(1, 5), n_classes=st.integers(1, 7), seed=st.integers(0, 10_000),
       eps=st.sampled_from([1e-8, 1e-3, 0.1]))
def test_cmpm_matches_a_naive_double_loop(n, d, n_classes, seed, eps) -> None:
    gen = torch.Generator().manual_seed(seed)
    v, t = _randn(n, d, gen=gen) * 2, _randn(n, d, gen=gen) * 2
    labels = torch.randint(0, n_classes, (n,), generator=gen)
    got = cmpm_loss(v, t, labels, eps=eps)
    want = naive_cmpm(v, t, labels, eps)
    assert float(got[0]) == pytest.approx(want[0], rel=1e-9, abs=1e-9)
    assert float(got[1]) == pytest.approx(want[1], rel=1e-9, abs=1e-9)


def test_cmpm_agrees_with_the_original_codes_formula() -> None:
    """The TensorFlow code: q = mask / row sum, loss = mean_i sum_j p log(1e-8 + p / (q + 1e-8))."""
    gen = torch.Generator().manual_seed(11)
    v, t = _randn(16, 8, gen=gen), _randn(16, 8, gen=gen)
    labels = torch.randint(0, 5, (16,), generator=gen)
    vn, tn, y = v.numpy(), t.numpy(), labels.numpy()
    mask = (y[:, None] == y[None, :]).astype(np.float64)
    q = mask / mask.sum(axis=1, keepdims=True)

    def tf_way(a: np.ndarray, b: np.ndarray) -> float:
        s = a @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        return float(np.mean(np.sum(p * np.log(1e-8 + p / (q + 1e-8)), axis=1)))

    i2t, t2i = cmpm_loss(v, t, labels)
    assert float(i2t) == pytest.approx(tf_way(vn, tn), abs=1e-7)
    assert float(t2i) == pytest.approx(tf_way(tn, vn), abs=1e-7)


# Hand-worked 2x2: v = [[ln 3, 0], [0, 1]], t = [[2, 0], [0, 3]], so t_bar = I and v_bar = I.
# i2t scores v @ t_bar.T = [[ln 3, 0], [0, 1]]: p_0 = (3/4, 1/4), p_1 = (a, b) with a = 1/(1+e), b = e/(1+e).
# t2i scores t @ v_bar.T = [[2, 0], [0, 3]]:      p_0 = (e^2, 1)/(1+e^2),   p_1 = (1, e^3)/(1+e^3).
# One class (labels 7, 7): q = (1/2, 1/2) in both rows, eps = 0, so each row is sum_j p_j ln(2 p_j):
#   i2t row 0 = 3/4 ln(3/2) + 1/4 ln(1/2) = 3/4 ln 3 - ln 2.
# Two classes (labels 0, 1): q = I; with eps = 0.01 a row is sum_j p_j (ln p_j - ln(q_j + 0.01)):
#   i2t row 0 = 3/4 ln((3/4) / 1.01) + 1/4 ln((1/4) / 0.01) = 3/4 ln(75/101) + 1/4 ln 25.
V2 = torch.tensor([[math.log(3.0), 0.0], [0.0, 1.0]], dtype=torch.float64)
T2 = torch.tensor([[2.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
E = math.e


def _row(p: tuple[float, float], q: tuple[float, float], eps: float) -> float:
    return sum(pj * (math.log(pj) - math.log(qj + eps)) for pj, qj in zip(p, q))


def test_cmpm_hand_worked_2x2_one_class() -> None:
    a, b = 1 / (1 + E), E / (1 + E)
    i2t = (0.75 * math.log(3) - math.log(2) + a * math.log(2 * a) + b * math.log(2 * b)) / 2
    t2i = (_row((E**2 / (1 + E**2), 1 / (1 + E**2)), (0.5, 0.5), 0.0)
           + _row((1 / (1 + E**3), E**3 / (1 + E**3)), (0.5, 0.5), 0.0)) / 2
    got = cmpm_loss(V2, T2, torch.tensor([7, 7]), eps=0.0)
    assert (float(got[0]), float(got[1])) == pytest.approx((i2t, t2i), abs=1e-12)


def test_cmpm_hand_worked_2x2_two_classes() -> None:
    a, b = 1 / (1 + E), E / (1 + E)
    i2t = (0.75 * math.log(75 / 101) + 0.25 * math.log(25) + a * math.log(a / 0.01) + b * math.log(b / 1.01)) / 2
    t2i = (_row((E**2 / (1 + E**2), 1 / (1 + E**2)), (1.0, 0.0), 0.01)
           + _row((1 / (1 + E**3), E**3 / (1 + E**3)), (0.0, 1.0), 0.01)) / 2
    got = cmpm_loss(V2, T2, torch.tensor([0, 1]), eps=0.01)
    assert (float(got[0]), float(got[1])) == pytest.approx((i2t, t2i), abs=1e-12)


def test_cmpm_one_class_is_the_kl_to_the_uniform_distribution() -> None:
    """q_ij = 1/n everywhere: each row is KL(p_i || uniform) = sum_j p_ij ln p_ij + ln n (eps = 0)."""
    gen = torch.Generator().manual_seed(5)
    v, t = _randn(6, 3, gen=gen), _randn(6, 3, gen=gen)
    p = torch.softmax(v @ (t / t.norm(dim=1, keepdim=True)).t(), dim=1)
    want = float((p * p.log()).sum(dim=1).mean()) + math.log(6)
    assert float(cmpm_loss(v, t, torch.full((6,), 3), eps=0.0)[0]) == pytest.approx(want, abs=1e-12)


def test_cmpm_with_distinct_labels_is_identity_matching_whatever_the_label_values() -> None:
    """All labels distinct: q = I, the pairs themselves are the matches; the values of the labels do not
    matter, and a row is -ln p_ii + sum_{j != i} p_ij ln(p_ij / eps) (up to ln(1 + eps) on the diagonal)."""
    gen = torch.Generator().manual_seed(6)
    v, t = _randn(5, 4, gen=gen), _randn(5, 4, gen=gen)
    a = cmpm_loss(v, t, torch.arange(5))
    b = cmpm_loss(v, t, torch.tensor([40, 3, 17, 8, 0]))
    assert (float(a[0]), float(a[1])) == (float(b[0]), float(b[1]))
    eps = 1e-3
    p = torch.softmax(v @ (t / t.norm(dim=1, keepdim=True)).t(), dim=1)
    off = ~torch.eye(5, dtype=torch.bool)
    rows = (p * p.log()).sum(dim=1) - p.diagonal() * math.log(1 + eps) - (p * off).sum(dim=1) * math.log(eps)
    assert float(cmpm_loss(v, t, torch.arange(5), eps=eps)[0]) == pytest.approx(float(rows.mean()), abs=1e-12)


def test_cmpm_normalises_the_gallery_side_only() -> None:
    """i2t is unchanged when each text is rescaled (t is normalised) and changes when the images are (v is
    not); t2i the other way round."""
    gen = torch.Generator().manual_seed(8)
    v, t = _randn(6, 4, gen=gen), _randn(6, 4, gen=gen)
    labels = torch.tensor([0, 0, 1, 2, 2, 2])
    scale = torch.rand(6, 1, generator=gen, dtype=torch.float64) * 3 + 0.5
    base = cmpm_loss(v, t, labels)
    text_scaled = cmpm_loss(v, t * scale, labels)
    image_scaled = cmpm_loss(v * scale, t, labels)
    assert float(text_scaled[0]) == pytest.approx(float(base[0]), abs=1e-12)
    assert float(image_scaled[1]) == pytest.approx(float(base[1]), abs=1e-12)
    assert abs(float(image_scaled[0]) - float(base[0])) > 1e-3
    assert abs(float(text_scaled[1]) - float(base[1])) > 1e-3


def test_cmpm_swapping_the_modalities_swaps_i2t_and_t2i() -> None:
    gen = torch.Generator().manual_seed(9)
    v, t = _randn(7, 3, gen=gen), _randn(7, 3, gen=gen)
    labels = torch.tensor([1, 2, 1, 3, 3, 0, 2])
    i2t, t2i = cmpm_loss(v, t, labels)
    t2i_swapped, i2t_swapped = cmpm_loss(t, v, labels)
    assert (float(i2t), float(t2i)) == (float(i2t_swapped), float(t2i_swapped))
    assert float(i2t) != pytest.approx(float(t2i), abs=1e-6)


def test_cmpm_is_near_zero_when_p_matches_q() -> None:
    """Images far along their own class's (orthogonal) text direction: p_i puts ~1/|class| on each of its
    class's texts, which is q_i, so the KL is ~0; the same images pointing at another class cost a lot."""
    t = torch.eye(3, dtype=torch.float64).repeat_interleave(2, dim=0)     # texts of classes 0, 0, 1, 1, 2, 2
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    good, _ = cmpm_loss(40 * t, t, labels)
    bad, _ = cmpm_loss(40 * t.roll(2, dims=0), t, labels)
    assert abs(float(good)) < 1e-6      # eps makes it a touch negative: ln(1/2 / (1/2 + eps)) = -2e-8
    assert float(bad) > 10


def test_cmpm_gradcheck_float64() -> None:
    gen = torch.Generator().manual_seed(3)
    v = _randn(6, 4, gen=gen).requires_grad_()
    t = _randn(6, 4, gen=gen).requires_grad_()
    labels = torch.tensor([0, 0, 1, 2, 3, 3])

    def f(a, b):
        i2t, t2i = cmpm_loss(a, b, labels, eps=1e-3)
        return i2t + 2 * t2i

    assert torch.autograd.gradcheck(f, (v, t), eps=1e-6, atol=1e-6)


def test_cmpm_half_precision_inputs_give_a_float32_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    v, t = _randn(8, 5, gen=gen, dtype=torch.float32), _randn(8, 5, gen=gen, dtype=torch.float32)
    labels = torch.tensor([0, 1, 1, 2, 3, 3, 3, 4])
    ref = cmpm_loss(v, t, labels)
    half = cmpm_loss(v.half(), t.half(), labels)
    assert half[0].dtype == torch.float32
    assert float(half[0]) == pytest.approx(float(ref[0]), abs=2e-2)


def test_cmpm_refuses_bad_shapes() -> None:
    with pytest.raises(ValueError, match="shape"):
        cmpm_loss(torch.zeros(3, 2), torch.zeros(4, 2), torch.zeros(3))
    with pytest.raises(ValueError, match="labels"):
        cmpm_loss(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(2))
    with pytest.raises(ValueError, match="at least one"):
        cmpm_loss(torch.zeros(0, 2), torch.zeros(0, 2), torch.zeros(0))


# ------------------------------------------------------------------------------------------------ norm-softmax
def naive_norm_softmax(x: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, scale: float,
                       normalize_features: bool) -> float:
    """-log softmax of the true class, sample by sample in Python floats, each class row divided by its norm."""
    n, d = x.shape
    total = 0.0
    for i in range(n):
        xi = [float(x[i, k]) for k in range(d)]
        if normalize_features:
            r = math.sqrt(sum(v * v for v in xi))
            xi = [v / r for v in xi]
        logits = []
        for c in range(w.shape[0]):
            wc = [float(w[c, k]) for k in range(d)]
            logits.append(scale * sum(a * b for a, b in zip(xi, wc)) / math.sqrt(sum(b * b for b in wc)))
        m = max(logits)
        total += -(logits[int(labels[i])] - m - math.log(sum(math.exp(z - m) for z in logits)))
    return total / n


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), d=st.integers(1, 5), n_classes=st.integers(1, 6), seed=st.integers(0, 10_000),
       scale=st.sampled_from([1.0, 4.0, 30.0]), normalize_features=st.booleans())
def test_norm_softmax_matches_a_naive_loop(n, d, n_classes, seed, scale, normalize_features) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, w = _randn(n, d, gen=gen) * 2, _randn(n_classes, d, gen=gen) * 3
    labels = torch.randint(0, n_classes, (n,), generator=gen)
    got = norm_softmax_id_loss(x, w, labels, scale=scale, normalize_features=normalize_features)
    want = naive_norm_softmax(x, w, labels, scale, normalize_features)
    assert float(got) == pytest.approx(want, rel=1e-9, abs=1e-9)


# Hand-worked: x = (3, 4), class rows W = [(1, 0), (0, 2)] -> normalised to [(1, 0), (0, 1)], logits (3, 4).
#   label 1: -ln(e^4 / (e^3 + e^4)) = ln(1 + e^-1);  label 0: -ln(e^3 / (e^3 + e^4)) = ln(1 + e).
#   The batch [(x, 1), (x, 0)] averages them. Unnormalised W would give logits (3, 8) instead.
# With normalize_features and scale 10: x -> (0.6, 0.8), logits (6, 8); label 1: ln(1 + e^-2).
def test_norm_softmax_hand_worked() -> None:
    x = torch.tensor([[3.0, 4.0], [3.0, 4.0]], dtype=torch.float64)
    w = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    got = norm_softmax_id_loss(x, w, torch.tensor([1, 0]))
    assert float(got) == pytest.approx((math.log(1 + math.exp(-1)) + math.log(1 + math.e)) / 2, abs=1e-12)
    got = norm_softmax_id_loss(x[:1], w, torch.tensor([1]), scale=10.0, normalize_features=True)
    assert float(got) == pytest.approx(math.log(1 + math.exp(-2)), abs=1e-12)


def test_norm_softmax_ignores_the_length_of_each_class_vector_but_not_of_the_features() -> None:
    gen = torch.Generator().manual_seed(12)
    x, w = _randn(9, 4, gen=gen), _randn(5, 4, gen=gen)
    labels = torch.randint(0, 5, (9,), generator=gen)
    base = float(norm_softmax_id_loss(x, w, labels))
    lengths = torch.rand(5, 1, generator=gen, dtype=torch.float64) * 10 + 0.1
    assert float(norm_softmax_id_loss(x, w * lengths, labels)) == pytest.approx(base, abs=1e-12)
    assert abs(float(norm_softmax_id_loss(3 * x, w, labels)) - base) > 1e-3      # features are not normalised
    assert float(norm_softmax_id_loss(3 * x, w, labels, normalize_features=True)) == pytest.approx(
        float(norm_softmax_id_loss(x, w, labels, normalize_features=True)), abs=1e-12)


def test_norm_softmax_with_one_class_is_zero() -> None:
    gen = torch.Generator().manual_seed(13)
    assert float(norm_softmax_id_loss(_randn(4, 3, gen=gen), _randn(1, 3, gen=gen), torch.zeros(4))) == 0.0


def test_norm_softmax_gradcheck_float64() -> None:
    gen = torch.Generator().manual_seed(4)
    x = _randn(5, 3, gen=gen).requires_grad_()
    w = _randn(4, 3, gen=gen).requires_grad_()
    labels = torch.tensor([0, 3, 3, 1, 2])
    for normalize_features in (False, True):
        def f(a, b):
            return norm_softmax_id_loss(a, b, labels, scale=2.0, normalize_features=normalize_features)

        assert torch.autograd.gradcheck(f, (x, w), eps=1e-6, atol=1e-6)


def test_norm_softmax_refuses_bad_shapes() -> None:
    with pytest.raises(ValueError, match="n_classes, d"):
        norm_softmax_id_loss(torch.zeros(3, 4), torch.zeros(4, 5), torch.zeros(3))
    with pytest.raises(ValueError, match="labels"):
        norm_softmax_id_loss(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(2))


# ------------------------------------------------------------------------------------------------ discriminator
def naive_bce(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """-[y log s + (1 - y) log(1 - s)], s = 1 / (1 + e^-x), averaged, in Python floats."""
    terms = []
    for x, y in zip(logits.reshape(-1).tolist(), targets.reshape(-1).tolist()):
        s = 1.0 / (1.0 + math.exp(-x))
        terms.append(-(y * math.log(s) + (1.0 - y) * math.log(1.0 - s)))
    return sum(terms) / len(terms)


def _rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_torch_bce_with_logits_takes_targets_outside_0_1() -> None:
    """Soft targets reach 1.2: the loss is the formula, and can be negative (here softplus(-5) - 0.2 * 5)."""
    x = torch.tensor([5.0, -2.0, 0.3, 1.0], dtype=torch.float64)
    y = torch.tensor([1.2, 1.2, 0.8, -0.1], dtype=torch.float64)
    per = F.binary_cross_entropy_with_logits(x, y, reduction="none")
    for k in range(4):
        assert float(per[k]) == pytest.approx(naive_bce(x[k:k + 1], y[k:k + 1]), abs=1e-12)
    assert float(per[0]) == pytest.approx(math.log1p(math.exp(-5.0)) - 1.0, abs=1e-12)
    assert float(per[0]) < 0


@settings(max_examples=40, deadline=None)
@given(n_image=st.integers(1, 9), n_text=st.integers(1, 9), seed=st.integers(0, 10_000), soft=st.booleans(),
       flip=st.sampled_from([0.0, 0.2, 0.5, 1.0]))
def test_discriminator_loss_is_the_bce_against_the_drawn_targets(n_image, n_text, seed, soft, flip) -> None:
    """The targets of one seed, fed to the BCE written out: the loss uses them, image batch and text batch each
    averaged, the two added."""
    gen = _rng(seed + 1)
    li, lt = _randn(n_image, 1, gen=gen) * 3, _randn(n_text, gen=gen) * 3
    yi, yt = discriminator_targets(n_image, n_text, rng=_rng(seed), soft=soft, flip=flip)
    want = naive_bce(li, yi) + naive_bce(lt, yt)
    got = discriminator_loss(li, lt, rng=_rng(seed), soft=soft, flip=flip)
    assert float(got) == pytest.approx(want, rel=1e-6, abs=1e-6)     # the targets are float32


# Hand-worked, soft=False and flip=0 (plain BCE, image -> 1, text -> 0):
#   image logits (0, ln 3): -ln s(0) = ln 2, -ln s(ln 3) = -ln(3/4) = ln(4/3); mean (ln 2 + ln(4/3)) / 2
#   text logits (0, -ln 3): -ln(1 - s(0)) = ln 2, -ln(1 - s(-ln 3)) = -ln(3/4);  mean the same
#   loss = ln 2 + ln(4/3) = ln(8/3)
def test_discriminator_loss_hand_worked_plain_bce() -> None:
    li = torch.tensor([0.0, math.log(3)], dtype=torch.float64)
    got = discriminator_loss(li, -li, rng=_rng(0), soft=False, flip=0.0)
    assert float(got) == pytest.approx(math.log(8 / 3), abs=1e-7)
    # rng=None (the global generator) is fine when nothing is random
    assert float(discriminator_loss(li, -li, rng=None, soft=False, flip=0.0)) == pytest.approx(math.log(8 / 3),
                                                                                                abs=1e-7)


def test_discriminator_hard_targets_and_full_flip_is_the_generator_loss() -> None:
    gen = _rng(21)
    li, lt = _randn(7, 1, gen=gen), _randn(5, 1, gen=gen)
    yi, yt = discriminator_targets(7, 5, rng=_rng(1), soft=False, flip=0.0)
    assert yi.tolist() == [1.0] * 7 and yt.tolist() == [0.0] * 5
    flipped = discriminator_loss(li, lt, rng=_rng(1), soft=False, flip=1.0)
    assert float(flipped) == pytest.approx(float(generator_loss(li, lt)), abs=1e-6)


def test_soft_targets_lie_in_the_papers_ranges_and_fill_them() -> None:
    yi, yt = discriminator_targets(20_000, 20_000, rng=_rng(2), soft=True, flip=0.0)
    assert 0.8 <= float(yi.min()) < 0.805 and 1.195 < float(yi.max()) <= 1.2
    assert 0.0 <= float(yt.min()) < 0.005 and 0.295 < float(yt.max()) <= 0.3
    assert float(yi.mean()) == pytest.approx(1.0, abs=0.005)
    assert float(yt.mean()) == pytest.approx(0.15, abs=0.004)


@pytest.mark.parametrize("flip", [0.2, 0.5])
def test_the_flipped_share_is_flip_over_many_draws(flip) -> None:
    """100 000 labels per modality: the binomial share's standard deviation is <= 0.0016, the bound is 5 of it.
    A flipped image label is 0 (hard) or drawn from the text range (soft), and the other way round."""
    n = 100_000
    yi, yt = discriminator_targets(n, n, rng=_rng(3), soft=False, flip=flip)
    assert float((yi == 0).double().mean()) == pytest.approx(flip, abs=0.008)
    assert float((yt == 1).double().mean()) == pytest.approx(flip, abs=0.008)
    si, st_ = discriminator_targets(n, n, rng=_rng(3), soft=True, flip=flip)
    assert bool(((si >= 0.8) | (si <= 0.3)).all()) and bool(((st_ >= 0.8) | (st_ <= 0.3)).all())
    # the flips of a seed do not depend on soft: the same samples are flipped
    assert torch.equal(si <= 0.3, yi == 0) and torch.equal(st_ >= 0.8, yt == 1)


def test_the_draws_are_reproducible_with_a_seeded_generator() -> None:
    a = discriminator_targets(50, 40, rng=_rng(4))
    b = discriminator_targets(50, 40, rng=_rng(4))
    c = discriminator_targets(50, 40, rng=_rng(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    li, lt = torch.linspace(-2, 2, 50), torch.linspace(-1, 3, 40)
    assert float(discriminator_loss(li, lt, rng=_rng(4))) == float(discriminator_loss(li, lt, rng=_rng(4)))
    # one generator carried across steps gives a new draw each step
    g = _rng(4)
    assert float(discriminator_loss(li, lt, rng=g)) != float(discriminator_loss(li, lt, rng=g))


def test_generator_loss_by_hand() -> None:
    """Every logit 0 (D cannot tell): ln 2 + ln 2. An image logit ln 3 (D says image at 3/4): -ln(1/4) = ln 4;
    a text logit -ln 3 (D says text at 3/4): -ln(1/4) = ln 4; the two batches averaged then added."""
    z = torch.zeros(3, dtype=torch.float64)
    assert float(generator_loss(z, z[:2])) == pytest.approx(2 * math.log(2), abs=1e-7)
    li = torch.tensor([0.0, math.log(3)], dtype=torch.float64)
    lt = torch.tensor([-math.log(3)], dtype=torch.float64)
    assert float(generator_loss(li, lt)) == pytest.approx((math.log(2) + math.log(4)) / 2 + math.log(4), abs=1e-7)
    gen = _rng(6)
    li, lt = _randn(6, 1, gen=gen) * 2, _randn(4, 1, gen=gen) * 2
    assert float(generator_loss(li, lt)) == pytest.approx(naive_bce(li, torch.zeros(6)) + naive_bce(lt, torch.ones(4)),
                                                          abs=1e-9)


def test_confusion_generator_loss_by_hand() -> None:
    """Against 0.5: every logit 0 gives ln 2 + ln 2 and no gradient (the minimum); a logit +-ln 3 gives
    (-ln(3/4) - ln(1/4)) / 2 = ln(4 / sqrt 3) for either sign; a naive loop on random logits."""
    z = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    loss = generator_loss(z, z[:2], target="confusion")
    assert float(loss) == pytest.approx(2 * math.log(2), abs=1e-7)
    loss.backward()
    assert torch.allclose(z.grad, torch.zeros(3, dtype=torch.float64), atol=1e-12)
    li = torch.tensor([math.log(3)], dtype=torch.float64)
    lt = torch.tensor([-math.log(3)], dtype=torch.float64)
    want = 2 * math.log(4 / math.sqrt(3))
    assert float(generator_loss(li, lt, target="confusion")) == pytest.approx(want, abs=1e-7)
    assert float(generator_loss(-li, -lt, target="confusion")) == pytest.approx(want, abs=1e-7)
    gen = _rng(16)
    li, lt = _randn(6, 1, gen=gen) * 2, _randn(4, 1, gen=gen) * 2
    assert float(generator_loss(li, lt, target="confusion")) == pytest.approx(
        naive_bce(li, torch.full((6,), 0.5)) + naive_bce(lt, torch.full((4,), 0.5)), abs=1e-9)
    # any logit away from 0 costs more than the minimum, on either side
    assert float(generator_loss(li, lt, target="confusion")) > 2 * math.log(2)
    with pytest.raises(ValueError, match="target"):
        generator_loss(li, lt, target="reversed")


def test_discriminator_and_generator_gradcheck_float64() -> None:
    gen = _rng(7)
    li = _randn(5, 1, gen=gen).requires_grad_()
    lt = _randn(4, 1, gen=gen).requires_grad_()

    def d(a, b):
        return discriminator_loss(a, b, rng=_rng(9), soft=True, flip=0.3)

    assert torch.autograd.gradcheck(d, (li, lt), eps=1e-6, atol=1e-6)
    assert torch.autograd.gradcheck(generator_loss, (li, lt), eps=1e-6, atol=1e-6)
    assert torch.autograd.gradcheck(lambda a, b: generator_loss(a, b, target="confusion"), (li, lt), eps=1e-6,
                                    atol=1e-6)


def test_discriminator_accuracy_on_hand_logits() -> None:
    """Images (2, -1, 0.5, 0): right on 2 and 0.5 (a logit of 0 counts as text); texts (-3, 0.1, 0.4): right on
    -3. 3 of 7. All logits 0: every text right, every image wrong."""
    acc = discriminator_accuracy(torch.tensor([[2.0], [-1.0], [0.5], [0.0]]), torch.tensor([-3.0, 0.1, 0.4]))
    assert acc.dtype == torch.float32 and acc.ndim == 0
    assert float(acc) == pytest.approx(3 / 7)
    assert float(discriminator_accuracy(torch.zeros(2), torch.zeros(3))) == pytest.approx(3 / 5)
    assert float(discriminator_accuracy(torch.ones(3), -torch.ones(5))) == 1.0
    assert float(discriminator_accuracy(-torch.ones(3), torch.ones(5))) == 0.0


def test_discriminator_functions_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="flip"):
        discriminator_targets(3, 3, rng=_rng(0), flip=1.5)
    with pytest.raises(ValueError, match="image_range"):
        discriminator_targets(3, 3, rng=_rng(0), image_range=(1.2, 0.8))
    for f in (lambda a, b: discriminator_loss(a, b, rng=None), generator_loss, discriminator_accuracy):
        with pytest.raises(ValueError, match="both modalities"):
            f(torch.zeros(0), torch.zeros(3))
