"""An optimiser for a large matrix of which a step updates a few rows through a sparse gradient.

TIMAM's identification classifier at COCO size has one 512-d row per training image (110K rows, 215 MB) and a
step's softmax reads 16K of them (Partial FC). Adam keeps two more matrices of that size (0.43 GB at COCO size,
0.4x the image features by themselves, issue 34). :class:`RowwiseRMSprop` keeps one number per row instead, as
the row-wise AdaGrad used for large embedding tables (recommendation models, FBGEMM) and Adafactor's factored
second moment do: the update of row ``i`` is

    v_i <- beta v_i + (1 - beta) mean_j g_ij^2,      w_i <- w_i - lr g_i / (sqrt(v_i / (1 - beta^t_i)) + eps)

with ``t_i`` the number of updates row ``i`` has had (its own bias correction: a row first sampled late in the
run takes a normalised first step, where a global step count, SparseAdam's, would scale it by up to
``1 / sqrt(1 - beta)``). Rows a step does not touch keep their weights and statistics (lazy, as SparseAdam).
No momentum: a row is sampled every few steps, and a per-element first moment would be the matrix again.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["RowwiseRMSprop"]


class RowwiseRMSprop(torch.optim.Optimizer):
    """Row-wise RMSprop with a per-row bias correction for 2-d (or higher) parameters, sparse or dense gradients.

    State per parameter: ``sq`` (float32, one per row: the running mean of the row's squared gradient) and
    ``row_steps`` (int32, one per row: the updates it has had). A dense gradient updates every row."""

    def __init__(self, params: Any, lr: float = 1e-3, beta: float = 0.999, eps: float = 1e-8) -> None:
        if not lr > 0.0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        super().__init__(params, {"lr": float(lr), "beta": float(beta), "eps": float(eps)})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict.get("param_groups") or []
        if any("beta" not in g for g in groups):
            raise ValueError("this optimiser state was saved by another optimiser (no 'beta' in its groups), "
                             "not by RowwiseRMSprop")
        super().load_state_dict(state_dict)
        for st in self.state.values():          # torch casts a floating parameter's state to its dtype: counts back
            if "row_steps" in st:
                st["row_steps"] = st["row_steps"].to(torch.int32)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, beta, eps = group["lr"], group["beta"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dim() < 2:
                    raise ValueError(f"RowwiseRMSprop updates rows of a matrix; got a parameter of shape "
                                     f"{tuple(p.shape)}")
                state = self.state[p]
                if "sq" not in state:
                    state["sq"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
                    state["row_steps"] = torch.zeros(p.shape[0], dtype=torch.int32, device=p.device)
                sq, steps = state["sq"], state["row_steps"]
                grad = p.grad
                if grad.is_sparse:
                    grad = grad.coalesce()                  # repeated rows summed
                    rows, values = grad.indices()[0], grad.values()
                else:
                    rows, values = None, grad
                if values.shape[0] == 0:
                    continue
                g = values.float()
                mean_sq = g.reshape(g.shape[0], -1).square().mean(1)
                if rows is None:
                    v = sq.mul_(beta).add_(mean_sq, alpha=1.0 - beta)
                    t = steps.add_(1)
                else:
                    v = sq.index_select(0, rows).mul_(beta).add_(mean_sq, alpha=1.0 - beta)
                    t = steps.index_select(0, rows).add_(1)
                    sq.index_copy_(0, rows, v)
                    steps.index_copy_(0, rows, t)
                correction = 1.0 - torch.pow(torch.tensor(beta, dtype=torch.float64, device=t.device), t.double())
                denom = (v.double() / correction).sqrt().float().add_(eps)
                update = (g / denom.view(-1, *([1] * (g.dim() - 1)))).to(p.dtype)
                if rows is None:
                    p.add_(update, alpha=-lr)
                else:
                    p.index_add_(0, rows, update, alpha=-lr)
        return loss
