"""crossview.nn.losses.contrastive_loss: VSE0 (sum of negatives) and VSE++ (hardest negative), checked
against a naive double loop on random batches, hand-worked 3x3 cases, and autograd.gradcheck in float64."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crossview.nn.losses import contrastive_loss, negative_mask


def naive(im: torch.Tensor, s: torch.Tensor, margin: float, hardest: bool, ids=None) -> tuple[float, float]:
    """The loss written out term by term, in Python floats."""
    n = im.shape[0]
    S = [[float(im[i] @ s[j]) for j in range(n)] for i in range(n)]
    same = (lambda i, j: i == j) if ids is None else (lambda i, j: i == j or int(ids[i]) == int(ids[j]))
    i2t = t2i = 0.0
    for q in range(n):
        terms_s = [max(0.0, margin + S[q][j] - S[q][q]) for j in range(n) if not same(q, j)]
        terms_im = [max(0.0, margin + S[i][q] - S[q][q]) for i in range(n) if not same(i, q)]
        if hardest:
            i2t += max(terms_s, default=0.0)
            t2i += max(terms_im, default=0.0)
        else:
            i2t += sum(terms_s)
            t2i += sum(terms_im)
    return i2t, t2i


def _unit(n: int, d: int, gen: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    x = torch.randn(n, d, generator=gen, dtype=dtype)
    return x / x.norm(dim=1, keepdim=True)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 9), d=st.integers(1, 6), seed=st.integers(0, 10_000), hardest=st.booleans(),
       margin=st.floats(0.0, 1.5), with_ids=st.booleans())
def test_matches_a_naive_double_loop(n, d, seed, hardest, margin, with_ids) -> None:
    gen = torch.Generator().manual_seed(seed)
    im, s = _unit(n, d, gen), _unit(n, d, gen)
    ids = torch.randint(0, max(1, n // 2), (n,), generator=gen) if with_ids else None
    got = contrastive_loss(im, s, margin=margin, hardest=hardest, image_ids=ids)
    want = naive(im, s, margin, hardest, ids)
    assert float(got[0]) == pytest.approx(want[0], abs=1e-9)
    assert float(got[1]) == pytest.approx(want[1], abs=1e-9)


# Hand-worked: scores S = im @ s.T with im = I (3x3) and s chosen so that S = s.T row by row.
# S = [[0.9, 0.5, 0.1],
#      [0.8, 0.6, 0.0],
#      [0.2, 0.7, 0.3]]   margin 0.2
# i2t (image i, negative caption j): [0.2 + S[i,j] - S[i,i]]_+
#   i=0: 0.2+0.5-0.9=-0.2 -> 0 ; 0.2+0.1-0.9 -> 0                      sum 0,   max 0
#   i=1: 0.2+0.8-0.6=0.4 ; 0.2+0.0-0.6 -> 0                            sum 0.4, max 0.4
#   i=2: 0.2+0.2-0.3=0.1 ; 0.2+0.7-0.3=0.6                             sum 0.7, max 0.6
#   VSE0 i2t = 1.1, VSE++ i2t = 1.0
# t2i (caption j, negative image i): [0.2 + S[i,j] - S[j,j]]_+
#   j=0: 0.2+0.8-0.9=0.1 ; 0.2+0.2-0.9 -> 0                            sum 0.1, max 0.1
#   j=1: 0.2+0.5-0.6=0.1 ; 0.2+0.7-0.6=0.3                             sum 0.4, max 0.3
#   j=2: 0.2+0.1-0.3=0.0 ; 0.2+0.0-0.3 -> 0                            sum 0,   max 0
#   VSE0 t2i = 0.5, VSE++ t2i = 0.4
S3 = torch.tensor([[0.9, 0.5, 0.1], [0.8, 0.6, 0.0], [0.2, 0.7, 0.3]], dtype=torch.float64)


@pytest.mark.parametrize("hardest,want", [(False, (1.1, 0.5)), (True, (1.0, 0.4))])
def test_hand_worked_3x3(hardest, want) -> None:
    i2t, t2i = contrastive_loss(torch.eye(3, dtype=torch.float64), S3.t().contiguous(), margin=0.2,
                                hardest=hardest)
    assert (float(i2t), float(t2i)) == pytest.approx(want, abs=1e-12)


def test_hand_worked_3x3_two_captions_of_one_image_are_not_negatives() -> None:
    """Pairs 1 and 2 share an image: (1, 2) and (2, 1) drop out. VSE0 i2t: i=1 keeps 0.4 (j=0), i=2 keeps
    0.1 (j=0) -> 0.5; t2i: j=0 keeps 0.1 + 0 -> 0.1, j=1 keeps 0.1 (i=0), j=2 keeps 0 -> 0.2."""
    ids = torch.tensor([0, 5, 5])
    i2t, t2i = contrastive_loss(torch.eye(3, dtype=torch.float64), S3.t().contiguous(), margin=0.2,
                                hardest=False, image_ids=ids)
    assert (float(i2t), float(t2i)) == pytest.approx((0.5, 0.2), abs=1e-12)
    i2t, t2i = contrastive_loss(torch.eye(3, dtype=torch.float64), S3.t().contiguous(), margin=0.2,
                                hardest=True, image_ids=ids)
    assert (float(i2t), float(t2i)) == pytest.approx((0.4 + 0.1, 0.1 + 0.1), abs=1e-12)


@pytest.mark.parametrize("hardest", [False, True])
def test_gradcheck_float64(hardest) -> None:
    gen = torch.Generator().manual_seed(3)
    im = torch.randn(6, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    s = torch.randn(6, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([0, 0, 1, 2, 3, 3])

    def f(a, b):
        i2t, t2i = contrastive_loss(a, b, margin=0.3, hardest=hardest, image_ids=ids)
        return i2t + 2 * t2i

    assert torch.autograd.gradcheck(f, (im, s), eps=1e-6, atol=1e-5)


def test_a_batch_of_one_has_no_negatives_and_zero_loss() -> None:
    x = torch.ones(1, 3)
    for hardest in (False, True):
        assert [float(v) for v in contrastive_loss(x, x, hardest=hardest)] == [0.0, 0.0]


def test_half_precision_inputs_give_a_float32_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    im, s = _unit(8, 5, gen, torch.float32), _unit(8, 5, gen, torch.float32)
    ref = contrastive_loss(im, s)
    half = contrastive_loss(im.half(), s.half())
    assert half[0].dtype == torch.float32
    assert float(half[0]) == pytest.approx(float(ref[0]), abs=5e-3)


def test_shape_mismatch_and_bad_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        contrastive_loss(torch.zeros(3, 2), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="image_ids"):
        negative_mask(3, torch.tensor([0, 1]))
