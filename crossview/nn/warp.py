"""WARP, the Weighted Approximate-Rank Pairwise loss of WSABIE (Weston, Bengio & Usunier, IJCAI 2011).

For a positive pair with score ``f_pos``, the sequential algorithm (paper 001, appendix A, Algorithm 1)
draws negatives uniformly (with replacement) from the ``n_neg`` candidates that are not positives,
counting the draws ``N``, until one *violates* the margin (``f_neg > f_pos - margin``) or ``N >= n_neg``.
When the last draw violates, it steps on::

    L(floor(n_neg / N)) * |margin - f_pos + f_neg|_+          L(k) = sum_{j<=k} 1/j

``floor(n_neg / N)`` estimates the rank of the positive (few draws to a violator = many violators = a
low rank), and ``L`` turns the rank into a weight that favours precision at the top of the list.

Vectorised sampling (:func:`sample_violators`)
----------------------------------------------
For a minibatch of positives we draw ``K`` candidates per positive at once, score them all, drop the
draws that hit a positive of that row (rejection: what is left are iid uniform draws over the row's
negatives, so rejected draws are not counted), and take the *first* violator in draw order; its
position among the counted draws is ``N``. Rows without a violator among their ``K`` draws keep
drawing (``K`` doubles each round, within an element budget) until they find one or have made
``n_neg`` counted draws. Because the draws are iid and only the first violator is used, ``N`` and the
chosen negative have exactly the sequential sampler's distribution for fixed parameters: ``N`` is
geometric with ``p = (#violators / n_neg)``, truncated at ``n_neg`` (``tests/test_warp.py`` checks
it against :func:`sample_violator_sequential` and the closed form).

Rows with rare violators (a well-trained model) would need up to ``n_neg`` draws each. Once a round
would draw ``switch_draws`` or more per row, the rows still open are scored against *every* candidate
(one matrix product, given ``full_score_fn``) and their outcome is sampled from that exact
distribution: with ``v`` violators among the ``n_neg`` negatives and ``d`` draws already made without
one, ``N = d + G`` with ``G ~ Geometric(v / n_neg)`` (no violator if ``N`` passes the limit), and the
violator is uniform among the ``v``. Draws are memoryless, so this is the same distribution as
drawing on, at the cost of one BLAS product instead of thousands of gathers. ``max_draws`` optionally caps the
search; a row with no violator within ``max_draws`` draws is then treated as "no violation" (the
sequential algorithm would have found a rarely violated row and stepped with a weight of at most
``L(floor(n_neg / max_draws))``).

What does differ from the paper's per-example SGD is that all rows of one minibatch sample against the
same parameters and their gradient steps are applied together (see :mod:`crossview.methods.wsabie`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["harmonic_table", "rank_weight", "warp_loss", "WarpDraw", "sample_violators", "draw_from_full_scores",
           "sample_violator_sequential", "max_norm_columns_"]

ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``score_fn(rows (M,) int64, cand (M, K) int64) -> (M, K)``: score of candidate ``cand[m, k]``
for the positive of row ``rows[m]``."""

FullScoreFn = Callable[[torch.Tensor], torch.Tensor]
"""``full_score_fn(rows (M,) int64) -> (M, n_candidates)``: scores of every candidate for those rows."""

PositiveFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``is_positive(rows (M,), cand (M, K)) -> (M, K) bool``: True where the candidate is a positive of
that row (not a negative; such draws are rejected and not counted). It is also called with ``cand`` of
shape ``(1, n_candidates)`` (every candidate, the same for all rows) and must then broadcast to
``(M, n_candidates)``."""


def harmonic_table(n_max: int, dtype: torch.dtype = torch.float32,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """``(n_max + 1,)`` table of ``L(k) = sum_{j=1..k} 1/j`` with ``L(0) = 0``.

    Summed in float64 (then cast), so ``L(10^6)`` is exact to float32 precision.
    """
    if n_max < 0:
        raise ValueError(f"n_max must be >= 0, got {n_max}")
    out = torch.zeros(n_max + 1, dtype=torch.float64)
    if n_max:
        out[1:] = torch.cumsum(1.0 / torch.arange(1, n_max + 1, dtype=torch.float64), 0)
    return out.to(dtype=dtype, device=device)


def rank_weight(n_draws: torch.Tensor, n_negatives: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``L(floor(n_negatives / n_draws))`` per row, ``(B,)`` in ``table``'s dtype; 0 where ``n_draws == 0``.

    ``n_draws``, ``n_negatives``: ``(B,)`` int64 (``n_negatives`` is the paper's ``Y - 1``);
    ``table`` from :func:`harmonic_table` with ``n_max >= n_negatives.max()``.
    """
    n_draws = torch.as_tensor(n_draws, device=table.device)
    n_negatives = torch.as_tensor(n_negatives, device=table.device)
    k = torch.div(n_negatives, n_draws.clamp(min=1), rounding_mode="floor")
    w = table[k.long()]
    return torch.where(n_draws > 0, w, torch.zeros_like(w))


def warp_loss(f_pos: torch.Tensor, f_neg: torch.Tensor, n_draws: torch.Tensor, n_negatives: torch.Tensor,
              violated: torch.Tensor, table: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """Per-row WARP loss ``(B,)``: ``L(floor(n_neg / N)) * |margin - f_pos + f_neg|_+``, 0 without a violator.

    ``f_pos``, ``f_neg``: ``(B,)`` scores of the positive and of the sampled violator (differentiable);
    ``n_draws`` ``(B,)`` int64 is ``N``; ``violated`` ``(B,)`` bool. The rank weight is a constant.
    """
    hinge = (margin - f_pos + f_neg).clamp(min=0)
    w = rank_weight(n_draws, n_negatives, table).to(device=hinge.device, dtype=hinge.dtype)
    return torch.where(violated.to(hinge.device), w * hinge, torch.zeros_like(hinge))


@dataclass
class WarpDraw:
    """The outcome of sampling for a batch of ``B`` positives (all ``(B,)`` tensors)."""

    negative: torch.Tensor   #: int64 candidate index of the first violator, -1 where there is none
    n_draws: torch.Tensor    #: int64 ``N``: counted draws up to and including the violator (else the limit)
    violated: torch.Tensor   #: bool, a violator was found
    f_neg: torch.Tensor      #: score of the violator (0 where there is none)


def sample_violators(f_pos: torch.Tensor, n_candidates: int, n_negatives: torch.Tensor, score_fn: ScoreFn,
                     is_positive: PositiveFn | None = None, *, margin: float = 1.0,
                     draws_per_round: int = 32, max_draws: int | None = None,
                     round_budget: int = 1 << 20, full_score_fn: FullScoreFn | None = None,
                     switch_draws: int | None = None, full_budget: int = 1 << 23,
                     generator: torch.Generator | None = None) -> WarpDraw:
    """Vectorised WARP negative sampling for ``B`` positives at once (see the module docstring).

    ``f_pos (B,)``: scores of the positives (no gradient needed). Candidates are ``0 .. n_candidates-1``;
    ``n_negatives (B,)`` int64 is how many of them are negatives of each row (``n_candidates - #positives``).
    ``score_fn`` scores drawn candidates, ``is_positive`` flags draws to reject (``None``: no row has a
    positive among the candidates). Rounds draw ``draws_per_round`` candidates per open row, doubling
    per round, with ``rows x draws <= round_budget`` (bounds memory). ``max_draws`` caps ``N``
    (``None``: up to ``n_negatives``, exactly the sequential algorithm). With ``full_score_fn``, rows
    still open when a round would draw ``switch_draws`` (default ``n_candidates // 256``) or more each are
    resolved from their full score rows (same distribution, see the module docstring), in chunks of
    ``rows x n_candidates <= full_budget``.
    """
    if draws_per_round < 1:
        raise ValueError(f"draws_per_round must be >= 1, got {draws_per_round}")
    device = f_pos.device
    f_pos = f_pos.detach()
    b = f_pos.shape[0]
    n_neg_all = torch.as_tensor(n_negatives, dtype=torch.int64, device=device)
    limit = n_neg_all.clone()
    if max_draws is not None:
        limit = limit.clamp(max=int(max_draws))
    negative = torch.full((b,), -1, dtype=torch.int64, device=device)
    n_draws = limit.clone()               # rows that never find a violator end at their limit
    violated = torch.zeros(b, dtype=torch.bool, device=device)
    f_neg = torch.zeros(b, dtype=f_pos.dtype, device=device)
    drawn = torch.zeros(b, dtype=torch.int64, device=device)
    active = torch.nonzero(limit > 0).squeeze(1)
    k = draws_per_round
    if switch_draws is None:
        # One gathered candidate row costs about as much as scoring a few hundred candidates in a
        # matrix product, so once a row needs ~n_candidates/256 draws the full product is cheaper.
        switch_draws = max(1, n_candidates // 256)
    while active.numel():
        if full_score_fn is not None and k >= switch_draws:
            _resolve_from_full_scores(active, f_pos, n_candidates, n_neg_all, limit, drawn, full_score_fn,
                                      is_positive, margin, full_budget, generator, negative, n_draws,
                                      violated, f_neg)
            break
        m = active.numel()
        left = int((limit[active] - drawn[active]).max())
        k_round = max(1, min(k, left, round_budget // m))
        cand = torch.randint(0, n_candidates, (m, k_round), device=device, generator=generator)
        if is_positive is None:
            eligible = torch.ones((m, k_round), dtype=torch.bool, device=device)
        else:
            eligible = ~is_positive(active, cand)
        count = drawn[active].unsqueeze(1) + torch.cumsum(eligible, dim=1)
        counted = eligible & (count <= limit[active].unsqueeze(1))
        scores = score_fn(active, cand).detach()
        viol = counted & (scores > (f_pos[active] - margin).unsqueeze(1))
        has = viol.any(dim=1)
        if bool(has.any()):
            first = viol[has].to(torch.uint8).argmax(dim=1)    # argmax returns the first maximum
            rows = active[has]
            sub = torch.nonzero(has).squeeze(1)
            negative[rows] = cand[sub, first]
            n_draws[rows] = count[sub, first]
            f_neg[rows] = scores[sub, first].to(f_neg.dtype)
            violated[rows] = True
        miss = ~has
        rows = active[miss]
        drawn[rows] = torch.minimum(count[miss, -1], limit[rows])
        active = rows[drawn[rows] < limit[rows]]
        k = min(2 * k, round_budget)
    return WarpDraw(negative=negative, n_draws=n_draws, violated=violated, f_neg=f_neg)


def _resolve_from_full_scores(active: torch.Tensor, f_pos: torch.Tensor, n_candidates: int,
                              n_negatives: torch.Tensor, limit: torch.Tensor, drawn: torch.Tensor,
                              full_score_fn: FullScoreFn, is_positive: PositiveFn | None, margin: float,
                              full_budget: int, generator: torch.Generator | None, negative: torch.Tensor,
                              n_draws: torch.Tensor, violated: torch.Tensor, f_neg: torch.Tensor) -> None:
    """Finish the open rows ``active`` exactly from their full score rows (writes the outputs in place)."""
    device = f_pos.device
    chunk = max(1, full_budget // max(1, n_candidates))
    all_cand = torch.arange(n_candidates, device=device).unsqueeze(0)       # (1, n): broadcast over rows
    for a in range(0, active.numel(), chunk):
        rows = active[a:a + chunk]
        d = draw_from_full_scores(full_score_fn(rows), f_pos[rows], n_negatives[rows], limit[rows], drawn[rows],
                                  None if is_positive is None else is_positive(rows, all_cand), margin=margin,
                                  generator=generator)
        negative[rows], n_draws[rows], violated[rows] = d.negative, d.n_draws, d.violated
        f_neg[rows] = d.f_neg.to(f_neg.dtype)


def draw_from_full_scores(scores: torch.Tensor, f_pos: torch.Tensor, n_negatives: torch.Tensor, limit: torch.Tensor,
                          drawn: torch.Tensor | None = None, positive: torch.Tensor | None = None, *,
                          margin: float = 1.0, generator: torch.Generator | None = None) -> WarpDraw:
    """The sampler's outcome for ``M`` rows drawn at once from their full score rows ``scores (M, n)``: with ``v``
    violators among a row's ``n_negatives`` negatives (``positive (M, n)`` flags its positives, excluded) and
    ``drawn`` draws already made without one, ``N = drawn + G``, ``G ~ Geometric(v / n_negatives)``, no violator when
    ``N`` passes ``limit``, the violator uniform among the ``v`` (the module docstring says why this is the
    sequential algorithm's distribution). Fixed shapes and nothing read on the host: a step that draws this way can
    be captured as a CUDA graph (WSABIE does on a GPU)."""
    m = scores.shape[0]
    device = scores.device
    scores = scores.detach()
    drawn = torch.zeros(m, dtype=torch.int64, device=device) if drawn is None else drawn
    viol = scores > (f_pos.detach() - margin).unsqueeze(1)
    if positive is not None:
        viol = viol & ~positive
    n_viol = viol.sum(dim=1)
    p = n_viol.double() / n_negatives.double().clamp(min=1)
    u = torch.rand(m, dtype=torch.float64, device=device, generator=generator)
    # G ~ Geometric(p) on 1, 2, ...: the number of further draws up to the first violator (p = 0: no violator,
    # G is then huge and never a hit)
    geo = torch.where(p >= 1, torch.ones_like(p),
                      torch.floor(torch.log1p(-u) / torch.log1p(-p.clamp(min=1e-12, max=1.0 - 1e-12))) + 1)
    hit = (n_viol > 0) & (geo <= (limit - drawn).double())
    pick = torch.floor(torch.rand(m, dtype=torch.float64, device=device, generator=generator)
                       * n_viol.double()).long()                                # which violator, uniform
    rank_in_row = torch.cumsum(viol, dim=1)                                     # 1..v at the violators
    col = (rank_in_row > pick.unsqueeze(1)).to(torch.uint8).argmax(dim=1)
    f_col = scores.gather(1, col.unsqueeze(1)).squeeze(1)
    return WarpDraw(negative=torch.where(hit, col, torch.full_like(col, -1)),
                    n_draws=torch.where(hit, drawn + geo.clamp(max=2.0 ** 62).long(), limit),
                    violated=hit, f_neg=torch.where(hit, f_col, torch.zeros_like(f_col)))


def sample_violator_sequential(f_pos: float, neg_scores: np.ndarray, rng: np.random.Generator,
                               margin: float = 1.0) -> tuple[int, int]:
    """The paper's inner loop, one draw at a time (the reference the vectorised sampler is tested on).

    ``neg_scores (n_neg,)``: scores of the positive's negatives. Returns ``(N, j)`` with ``j`` the index
    into ``neg_scores`` of the violator, or ``-1`` when ``N`` reached ``n_neg`` without one.
    """
    n_neg = len(neg_scores)
    n = 0
    while n < n_neg:
        j = int(rng.integers(n_neg))
        n += 1
        if neg_scores[j] > f_pos - margin:
            return n, j
    return n, -1


@torch.no_grad()
def max_norm_columns_(matrix: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale every column ``matrix[:, j]`` with L2 norm above ``max_norm`` back to ``max_norm``, in place.

    ``matrix (P, n)``: WSABIE's constraint ``||V_i|| <= lambda`` (and the same for ``W`` / ``Z``).
    Returns ``matrix``.
    """
    norms = torch.linalg.vector_norm(matrix, dim=0, keepdim=True)
    matrix.mul_((max_norm / norms.clamp(min=1e-30)).clamp(max=1.0))
    return matrix
