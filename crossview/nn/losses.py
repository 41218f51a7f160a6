"""Ranking losses of joint embeddings, as pure functions of a batch's embeddings (no state, no module).

:func:`contrastive_loss` is the hinge loss of VSE0 (Kiros et al. 2014) and VSE++ (Faghri et al. 2018):
for a batch of ``n`` (image, caption) pairs, scores ``S = im @ s.T`` (cosine when both are L2-normalised),
row ``i`` the image of pair ``i``, column ``j`` the caption of pair ``j``. With margin ``m``:

- caption retrieval (i2t), for each image ``i`` and negative caption ``j``: ``[m + S[i, j] - S[i, i]]_+``
- image retrieval (t2i), for each caption ``j`` and negative image ``i``: ``[m + S[i, j] - S[j, j]]_+``

VSE0 sums over every negative; VSE++ keeps only the largest term of each query (its hardest negative), so
each query adds at most one term. Negatives are the off-diagonal pairs; with ``image_ids``, pairs whose image
is the same (two captions of one image in a batch) are not negatives of each other either -- the official
code counts them, which pushes apart a caption and its own image's other caption.
"""

from __future__ import annotations

import torch

__all__ = ["contrastive_loss", "negative_mask"]


def negative_mask(n: int, image_ids: torch.Tensor | None = None, device: torch.device | None = None) -> torch.Tensor:
    """``(n, n)`` bool: True where ``(i, j)`` is a negative pair (off the diagonal, and of different images when
    ``image_ids`` is given)."""
    neg = ~torch.eye(n, dtype=torch.bool, device=device)
    if image_ids is not None:
        ids = image_ids.reshape(-1).to(device)
        if ids.numel() != n:
            raise ValueError(f"image_ids has {ids.numel()} entries for a batch of {n} pairs")
        neg &= ids[:, None] != ids[None, :]
    return neg


def contrastive_loss(im: torch.Tensor, s: torch.Tensor, *, margin: float = 0.2, hardest: bool = True,
                     image_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(i2t, t2i)``: the summed hinge loss of caption retrieval and of image retrieval (see the module).

    ``im`` and ``s``: ``(n, d)`` embeddings of the ``n`` pairs (row ``k`` of each is pair ``k``).
    ``hardest``: VSE++ (the hardest negative of each query) or VSE0 (the sum over negatives).
    ``image_ids``: ``(n,)`` the image of each pair; pairs of one image are not each other's negatives.
    Scores are computed in float32 at least (also under float16 autocast); a query with no negative adds 0.
    """
    if im.ndim != 2 or s.ndim != 2 or im.shape != s.shape:
        raise ValueError(f"contrastive_loss needs two (n, d) embeddings of one shape, got {tuple(im.shape)} "
                         f"and {tuple(s.shape)}")
    dtype = torch.promote_types(im.dtype, torch.float32)
    scores = im.to(dtype) @ s.to(dtype).t()
    n = scores.shape[0]
    pos = scores.diagonal()
    neg = negative_mask(n, image_ids, scores.device)
    # [i, j]: image i against caption j (i2t), and caption j against image i (t2i)
    cost_s = (margin + scores - pos[:, None]).clamp(min=0).masked_fill(~neg, 0)
    cost_im = (margin + scores - pos[None, :]).clamp(min=0).masked_fill(~neg, 0)
    if hardest:
        if n == 0:
            return scores.sum(), scores.sum()
        return cost_s.amax(dim=1).sum(), cost_im.amax(dim=0).sum()
    return cost_s.sum(), cost_im.sum()
