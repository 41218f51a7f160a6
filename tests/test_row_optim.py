"""RowwiseRMSprop (crossview.nn.row_optim): each update against a naive per-row loop, lazy rows, dense gradients,
its state in a checkpoint, and the memory it keeps."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from crossview.nn.row_optim import RowwiseRMSprop


def _naive(w: np.ndarray, grads: list[tuple[list[int], np.ndarray]], lr: float, beta: float,
           eps: float) -> np.ndarray:
    """The update of the module docstring, one row and one number at a time, in float64."""
    w = w.astype(np.float64).copy()
    v = np.zeros(w.shape[0])
    t = np.zeros(w.shape[0], dtype=np.int64)
    for rows, g in grads:
        summed: dict[int, np.ndarray] = {}
        for r, gr in zip(rows, g):                      # a sparse gradient's repeated rows add up
            summed[r] = summed.get(r, 0.0) + gr.astype(np.float64)
        for r, gr in summed.items():
            v[r] = beta * v[r] + (1 - beta) * sum(x * x for x in gr) / len(gr)
            t[r] += 1
            vhat = v[r] / (1 - beta ** t[r])
            for j in range(len(gr)):
                w[r, j] -= lr * gr[j] / (math.sqrt(vhat) + eps)
    return w


def _sparse(rows: list[int], values: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.tensor([rows]), torch.as_tensor(values, dtype=torch.float32), shape)


def test_sparse_steps_match_a_naive_loop_and_leave_other_rows_alone() -> None:
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(7, 5)).astype(np.float32)
    steps = [([1, 4, 4], rng.normal(size=(3, 5))), ([0, 1], rng.normal(size=(2, 5)) * 10),
             ([6], rng.normal(size=(1, 5)) * 1e-3), ([1, 6, 2], rng.normal(size=(3, 5)))]
    p = torch.nn.Parameter(torch.as_tensor(w0.copy()))
    opt = RowwiseRMSprop([p], lr=0.05, beta=0.9, eps=1e-6)
    for rows, g in steps:
        p.grad = _sparse(rows, g, tuple(w0.shape))
        opt.step()
    want = _naive(w0, steps, 0.05, 0.9, 1e-6)
    np.testing.assert_allclose(p.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    assert np.array_equal(p.detach().numpy()[[3, 5]], w0[[3, 5]])          # never sampled: untouched
    st = opt.state[p]
    assert st["row_steps"].tolist() == [1, 3, 1, 0, 1, 0, 2]
    assert st["sq"].shape == (7,) and st["sq"][3] == 0


def test_a_first_update_is_normalised_whatever_the_row_missed() -> None:
    """Bias correction per row: a row first sampled after 1,000 steps moves by lr per weight (as in the first
    step), where a global step count would move it by up to 1 / sqrt(1 - beta) = 31.6 times that."""
    p = torch.nn.Parameter(torch.zeros(2, 4))
    opt = RowwiseRMSprop([p], lr=0.01, beta=0.999, eps=0.0)
    for _ in range(1000):
        p.grad = _sparse([0], np.ones((1, 4)), (2, 4))
        opt.step()
    p.grad = _sparse([1], np.full((1, 4), 3.0), (2, 4))
    opt.step()
    np.testing.assert_allclose(p.detach().numpy()[1], -0.01, rtol=1e-6)


def test_dense_gradients_update_every_row_as_the_loop_does() -> None:
    rng = np.random.default_rng(1)
    w0 = rng.normal(size=(4, 3)).astype(np.float32)
    grads = [rng.normal(size=(4, 3)) for _ in range(3)]
    p = torch.nn.Parameter(torch.as_tensor(w0.copy()))
    opt = RowwiseRMSprop([p], lr=0.02, beta=0.99, eps=1e-8)
    for g in grads:
        p.grad = torch.as_tensor(g, dtype=torch.float32)
        opt.step()
    want = _naive(w0, [(list(range(4)), g) for g in grads], 0.02, 0.99, 1e-8)
    np.testing.assert_allclose(p.detach().numpy(), want, rtol=1e-5, atol=1e-6)


def test_it_learns_a_sampled_softmax_and_its_state_round_trips() -> None:
    """Rows of a classifier trained through a sampled, sparse gather (as TIMAM's Partial FC): the loss falls;
    a copy made from the state dict mid-way continues exactly as the original."""
    torch.manual_seed(0)
    n, d = 50, 8
    x = torch.nn.functional.normalize(torch.randn(n, d), dim=1)
    w = torch.nn.Parameter(torch.randn(n, d) * 0.01)
    opt = RowwiseRMSprop([w], lr=0.05)

    def step(param: torch.nn.Parameter, o: torch.optim.Optimizer, gen: torch.Generator) -> float:
        lab = torch.randint(n, (16,), generator=gen)
        idx = torch.unique(torch.cat([lab, torch.randint(n, (10,), generator=gen)]))
        sub = torch.nn.functional.embedding(idx, param, sparse=True)
        loss = torch.nn.functional.cross_entropy(x[lab] @ sub.T * 10, torch.searchsorted(idx, lab))
        o.zero_grad()
        loss.backward()
        o.step()
        return float(loss)

    gen = torch.Generator().manual_seed(1)
    first = [step(w, opt, gen) for _ in range(20)]
    w2 = torch.nn.Parameter(w.detach().clone())
    opt2 = RowwiseRMSprop([w2], lr=0.05)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))     # a state dict holds the live tensors
    gen2 = torch.Generator().manual_seed(2)
    gen.manual_seed(2)
    for _ in range(200):
        a, b = step(w, opt, gen), step(w2, opt2, gen2)
        assert a == b
    assert torch.equal(w, w2) and torch.equal(opt.state[w]["sq"], opt2.state[w2]["sq"])
    assert opt2.state[w2]["row_steps"].dtype == torch.int32
    last = [step(w, opt, gen) for _ in range(20)]
    assert np.mean(last) < 0.5 * np.mean(first), (np.mean(first), np.mean(last))


def test_state_is_one_number_per_row() -> None:
    p = torch.nn.Parameter(torch.zeros(1000, 512))
    opt = RowwiseRMSprop([p], lr=0.1)
    p.grad = _sparse([3, 9], np.ones((2, 512)), (1000, 512))
    opt.step()
    held = sum(t.numel() * t.element_size() for t in opt.state[p].values() if isinstance(t, torch.Tensor))
    assert held == 1000 * (4 + 4)                     # sq float32 + row_steps int32: 1/64 of the matrix


def test_bad_settings_and_foreign_state_are_refused() -> None:
    p = torch.nn.Parameter(torch.zeros(3, 2))
    for kw in ({"lr": 0.0}, {"beta": 1.0}, {"beta": -0.1}, {"eps": -1.0}):
        with pytest.raises(ValueError):
            RowwiseRMSprop([p], **kw)
    adam = torch.optim.SparseAdam([p], lr=0.1)
    with pytest.raises(ValueError, match="another optimiser"):
        RowwiseRMSprop([p], lr=0.1).load_state_dict(adam.state_dict())
    v = torch.nn.Parameter(torch.zeros(3))
    v.grad = torch.ones(3)
    with pytest.raises(ValueError, match="rows of a matrix"):
        RowwiseRMSprop([v], lr=0.1).step()
