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

The TIMAM losses (paper 002, Sarafianos et al. 2019) are further down: :func:`cmpm_loss`,
:func:`norm_softmax_id_loss`, and the modality discriminator's :func:`discriminator_loss`,
:func:`generator_loss` and :func:`discriminator_accuracy`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["cmpm_loss", "contrastive_loss", "discriminator_accuracy", "discriminator_loss", "discriminator_targets",
           "generator_loss", "info_nce_loss", "negative_mask", "norm_softmax_id_loss", "smooth_ap_loss"]


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


# ====================================================================== SmoothAP and InfoNCE (paper 004)
def _positive_columns(positives: torch.Tensor, p_max: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(idx, valid)``: each query's positive columns, left-aligned in a ``(q, p_max)`` int64 tensor (padding
    points at column 0), and which entries are real. ``p_max``: at least the most positives of any query (None:
    counted, which waits for the device)."""
    counts = positives.sum(dim=1)
    if p_max is None:
        p_max = int(counts.max()) if positives.numel() else 0
    p_max = min(int(p_max), positives.shape[1])      # a query has no more positives than candidates
    # a stable sort puts each row's positive columns first, in column order
    order = torch.sort(positives.to(torch.int8), dim=1, descending=True, stable=True).indices[:, :max(p_max, 1)]
    valid = torch.arange(max(p_max, 1), device=positives.device)[None, :] < counts[:, None]
    return order.masked_fill(~valid, 0), valid


def smooth_ap_loss(scores: torch.Tensor, positives: torch.Tensor, *, tau: float = 0.01,
                   max_positives: int | None = None) -> torch.Tensor:
    """``1 - mean_q AP_q``: SmoothAP (Brown et al. 2020; paper 004 eq. 5) of every query row of ``scores``.

    ``scores``: ``(q, m)`` the score of each of ``m`` candidates for each query; ``positives``: ``(q, m)`` bool,
    the relevant candidates. For query ``q`` with positives ``P`` and ``D_ij = s_j - s_i``, ``G(d) =
    sigmoid(d / tau)``::

        AP_q = 1/|P| sum_{i in P} (1 + sum_{j in P, j != i} G(D_ij)) / (1 + sum_{j != i} G(D_ij))

    As ``tau -> 0`` this is the exact average precision of the ranking (ties aside). Only the rows ``i in P``
    of the difference matrix are formed: ``(q, |P|max, m)`` numbers, not the ``(q, m, m)`` of the reference
    code (i2t with B images x 5 captions: B * 5 * 5B, 420K at B = 128, against 52M). Queries without a
    positive are left out of the mean (0 when no query has one). Scores are taken in float32 at least.

    ``max_positives``: at least the most positives any query has (e.g. the most captions of an image), so that
    nothing here waits for the device; None counts them (one wait). A larger bound gives the same value.
    """
    if scores.ndim != 2 or positives.shape != scores.shape:
        raise ValueError(f"smooth_ap_loss needs (q, m) scores and a positives mask of the same shape, got "
                         f"{tuple(scores.shape)} and {tuple(positives.shape)}")
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    s = scores.to(torch.promote_types(scores.dtype, torch.float32))
    pos = positives.to(torch.bool)
    has = pos.any(dim=1)
    # every query is computed and those without a positive weigh 0 (no boolean selection: its size is data)
    idx, valid = _positive_columns(pos, max_positives)           # (q, p)
    s_i = torch.gather(s, 1, idx)                                # (q, p): the positives' own scores
    g = torch.sigmoid((s[:, None, :] - s_i[:, :, None]) / tau)   # (q, p, m): G(D_ij)
    g = g.masked_fill(torch.zeros_like(g, dtype=torch.bool).scatter_(2, idx[:, :, None], True), 0.0)  # j != i
    rank_all = 1.0 + g.sum(dim=2)                                # (q, p)
    rank_pos = 1.0 + (g * pos[:, None, :]).sum(dim=2)
    ap = ((rank_pos / rank_all) * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1)
    n_has = has.sum()
    return torch.where(n_has > 0, 1.0 - (ap * has).sum() / n_has.clamp(min=1), s.sum() * 0.0)


def info_nce_loss(scores: torch.Tensor, positives: torch.Tensor, *, temperature: float = 0.1) -> torch.Tensor:
    """InfoNCE / NT-Xent of every (query, positive) pair, averaged: ``-log(e^{x_qp} / (e^{x_qp} + sum_{n in N_q}
    e^{x_qn}))`` with ``x = scores / temperature``. ``N_q`` are the query's negatives; its other positives (the
    other captions of one image) are in neither the numerator nor the denominator, so with one positive per
    query this is the usual softmax cross-entropy (paper 004's NT-Xent). Queries without a positive add
    nothing; a pair with no negative adds 0."""
    if scores.ndim != 2 or positives.shape != scores.shape:
        raise ValueError(f"info_nce_loss needs (q, m) scores and a positives mask of the same shape, got "
                         f"{tuple(scores.shape)} and {tuple(positives.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    x = scores.to(torch.promote_types(scores.dtype, torch.float32)) / temperature
    pos = positives.to(torch.bool)
    neg_lse = torch.logsumexp(x.masked_fill(pos, float("-inf")), dim=1, keepdim=True)   # (q, 1); -inf: none
    terms = torch.logaddexp(neg_lse, x) - x                                             # (q, m)
    # the mean over the positive pairs, without selecting them (a boolean selection waits for the device);
    # no positive at all: 0
    return terms.masked_fill(~pos, 0.0).sum() / pos.sum().clamp(min=1)


# ====================================================================== TIMAM (paper 002)
def cmpm_loss(image_emb: torch.Tensor, text_emb: torch.Tensor, labels: torch.Tensor, *,
              eps: float = 1e-8) -> tuple[torch.Tensor, torch.Tensor]:
    """``(i2t, t2i)``: Cross-Modal Projection Matching (Zhang & Lu, ECCV 2018), TIMAM's ``L_M^V`` and ``L_M^T``.

    ``image_emb`` ``v`` and ``text_emb`` ``t``: ``(n, d)`` embeddings of ``n`` (image, text) pairs; ``labels``:
    ``(n,)`` the identity / class / image of each pair. For i2t each image is scalar-projected on the
    L2-normalised texts, ``t_bar_j = t_j / |t_j|`` (the image is *not* normalised, so its norm acts as an inverse
    temperature), and the projections are turned into a matching distribution over the batch::

        p_ij = softmax_j(v_i . t_bar_j)        q_ij = [y_i == y_j] / sum_k [y_i == y_k]
        i2t  = 1/n sum_i sum_j p_ij (log p_ij - log(q_ij + eps))

    the KL divergence ``KL(p_i || q_i)`` of each row, averaged over the rows; ``eps`` keeps ``log q`` finite
    where ``q_ij = 0`` (such a term costs ``p_ij (log p_ij - log eps)``, which drives ``p_ij`` to 0). t2i is the
    same with the roles swapped: ``p_ij = softmax_j(t_i . v_bar_j)``. ``q`` is the paper's "true matching
    probability", ``q`` row-normalised to sum 1 (the original TensorFlow code divides the label mask by its row
    sum too; one PyTorch port divides by the row's L2 norm, which is not a distribution).

    The mean over rows (not a sum) is what the original code does (``reduce_mean(reduce_sum(., 1))``). It writes
    the log as ``log(1e-8 + p / (q + 1e-8))``; here ``log p`` comes from ``log_softmax``, which stays finite when
    ``p`` underflows, and the two agree to about ``1e-16`` per term. Scores are computed in float32 at least.
    """
    if image_emb.ndim != 2 or text_emb.ndim != 2 or image_emb.shape != text_emb.shape:
        raise ValueError(f"cmpm_loss needs two (n, d) embeddings of one shape, got {tuple(image_emb.shape)} "
                         f"and {tuple(text_emb.shape)}")
    n = image_emb.shape[0]
    y = labels.reshape(-1).to(image_emb.device)
    if y.numel() != n:
        raise ValueError(f"labels has {y.numel()} entries for a batch of {n} pairs")
    if n == 0:
        raise ValueError("cmpm_loss needs a batch of at least one pair, got 0")
    dtype = torch.promote_types(image_emb.dtype, torch.float32)
    v, t = image_emb.to(dtype), text_emb.to(dtype)
    mask = (y[:, None] == y[None, :]).to(dtype)
    log_q = torch.log(mask / mask.sum(dim=1, keepdim=True) + eps)     # symmetric: one q serves both ways

    def kl(query: torch.Tensor, gallery: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(query @ F.normalize(gallery, dim=1).t(), dim=1)
        return (log_p.exp() * (log_p - log_q)).sum(dim=1).mean()

    return kl(v, t), kl(t, v)


def norm_softmax_id_loss(emb: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *, scale: float = 1.0,
                         normalize_features: bool = False) -> torch.Tensor:
    """Mean norm-softmax cross-entropy of classifying each embedding into its identity / class: TIMAM's
    identification losses ``L_I^V`` (image embeddings) and ``L_I^T`` (text embeddings).

    ``emb``: ``(n, d)``; ``weight``: ``(n_classes, d)``, one row per class (the layout of ``nn.Linear(d,
    n_classes, bias=False).weight``); ``labels``: ``(n,)`` int64 in ``[0, n_classes)``. Each class's weight
    vector is L2-normalised before the product, so a class cannot win by the length of its vector, only by its
    direction::

        loss = -1/n sum_i log softmax_c(scale * x_i . W_c / |W_c|)[y_i]       (no bias)

    The paper names the loss ("Norm-softmax cross entropy loss used for identification", supplementary Table 1)
    and refers to CMPM for it; CMPM's code (``W_norm = l2_normalize(W, dim=0)``, logits = features @ W_norm, no
    bias) normalises the weights only, with no scale: the defaults here. So the feature's norm stays free and
    acts as an inverse temperature. ``normalize_features=True`` also normalises ``x_i`` (cosine logits, NormFace),
    which then needs a ``scale`` well above 1 (e.g. 16-32) to reach a low loss. CMPM shares one ``W`` between the
    image and the text classifier; whether to share is the caller's choice (pass the same tensor twice).
    Logits are computed in float32 at least.
    """
    if emb.ndim != 2 or weight.ndim != 2 or emb.shape[1] != weight.shape[1]:
        raise ValueError(f"norm_softmax_id_loss needs (n, d) embeddings and (n_classes, d) weights, got "
                         f"{tuple(emb.shape)} and {tuple(weight.shape)}")
    y = labels.reshape(-1).to(emb.device)
    if y.numel() != emb.shape[0]:
        raise ValueError(f"labels has {y.numel()} entries for {emb.shape[0]} embeddings")
    if emb.shape[0] == 0:
        raise ValueError("norm_softmax_id_loss needs at least one embedding, got 0")
    dtype = torch.promote_types(torch.promote_types(emb.dtype, weight.dtype), torch.float32)
    x = emb.to(dtype)
    if normalize_features:
        x = F.normalize(x, dim=1)
    logits = scale * (x @ F.normalize(weight.to(dtype), dim=1).t())
    return F.cross_entropy(logits, y.long())


# The modality discriminator. TIMAM's supplementary: "labels were smoothed by replacing each positive label
# (visual domain) with a random number in [0.8, 1.2], and each label equal to zero (textual domain) with a random
# number in [0, 0.3], and (iii) labels were flipped with 20% probability to introduce some noise."
IMAGE_TARGETS = (0.8, 1.2)
TEXT_TARGETS = (0.0, 0.3)


def discriminator_targets(n_image: int, n_text: int, *, rng: torch.Generator | None, soft: bool = True,
                          flip: float = 0.2, image_range: tuple[float, float] = IMAGE_TARGETS,
                          text_range: tuple[float, float] = TEXT_TARGETS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(image_targets, text_targets)``: ``(n_image,)`` and ``(n_text,)`` float32 BCE targets of the modality
    discriminator, image = 1 ("positive label (visual domain)"), text = 0, with TIMAM's two tricks.

    Each sample's label is flipped to the other modality's with probability ``flip`` (independently, so the
    flipped share is ``flip`` on average, not exactly); then, with ``soft``, a label 1 becomes a uniform draw from
    ``image_range`` and a label 0 one from ``text_range`` (a flipped image sample draws from ``text_range``), and
    without it stays exactly 1 or 0. ``rng`` makes the draws reproducible (``None``: torch's global generator);
    they are made on ``rng``'s device, in this order: image flips, image uniforms, text flips, text uniforms (the
    uniforms are drawn even when ``soft`` is off, so the flips of a seed do not depend on ``soft``).
    """
    if not 0.0 <= flip <= 1.0:
        raise ValueError(f"flip is a probability in [0, 1], got {flip}")
    for name, (lo, hi) in (("image_range", image_range), ("text_range", text_range)):
        if not lo <= hi:
            raise ValueError(f"{name} must be (low, high) with low <= high, got {(lo, hi)}")
    device = rng.device if rng is not None else None

    def draw(n: int, own: tuple[float, float], other: tuple[float, float], own_hard: float) -> torch.Tensor:
        flipped = torch.rand(n, generator=rng, device=device) < flip
        u = torch.rand(n, generator=rng, device=device)
        if not soft:
            return torch.where(flipped, 1.0 - own_hard, own_hard)
        lo = torch.where(flipped, other[0], own[0])
        hi = torch.where(flipped, other[1], own[1])
        return lo + u * (hi - lo)

    return draw(n_image, image_range, text_range, 1.0), draw(n_text, text_range, image_range, 0.0)


def _bce_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean of ``-[y log s + (1 - y) log(1 - s)]``, ``s = sigmoid(x)``, in float32 at least. It equals
    ``softplus(-x) + (1 - y) x`` for any ``y``; torch takes targets outside [0, 1] (1.2) without complaint."""
    x = logits.reshape(-1)
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return F.binary_cross_entropy_with_logits(x, targets.to(x.device, x.dtype))


def _check_logits(name: str, logits_image: torch.Tensor, logits_text: torch.Tensor) -> None:
    if logits_image.numel() == 0 or logits_text.numel() == 0:
        raise ValueError(f"{name} needs logits of both modalities, got {logits_image.numel()} image and "
                         f"{logits_text.numel()} text logits")


def discriminator_loss(logits_image: torch.Tensor, logits_text: torch.Tensor, *, rng: torch.Generator | None,
                       soft: bool = True, flip: float = 0.2, image_range: tuple[float, float] = IMAGE_TARGETS,
                       text_range: tuple[float, float] = TEXT_TARGETS) -> torch.Tensor:
    """The modality discriminator's loss (TIMAM's ``L_D``, the discriminator's side): BCE-with-logits of its
    outputs on image embeddings against targets near 1 and on text embeddings against targets near 0.

    ``logits_image``: ``(n_image,)`` or ``(n_image, 1)`` the discriminator's logits on a batch of image embeddings
    (detached from the encoders for a discriminator step); ``logits_text`` the same for texts. The two are
    separate batches (the paper's first trick: "different mini-batches were constructed for the features of
    each domain"), so the loss is the mean over the image batch plus the mean over the text batch, as a DCGAN's
    ``errD_real + errD_fake``. Targets come from :func:`discriminator_targets` (soft labels, ``flip``);
    ``soft=False, flip=0`` is the plain BCE ``-mean log s(x_img) - mean log(1 - s(x_txt))``.

    A soft target ``y > 1`` has no finite minimiser (the per-sample loss ``softplus(-x) + (1 - y) x`` keeps falling
    as ``x`` grows), so with the soft labels the loss can go below 0; it is the paper's recipe all the same.
    """
    _check_logits("discriminator_loss", logits_image, logits_text)
    y_image, y_text = discriminator_targets(logits_image.numel(), logits_text.numel(), rng=rng, soft=soft, flip=flip,
                                            image_range=image_range, text_range=text_range)
    return _bce_logits(logits_image, y_image) + _bce_logits(logits_text, y_text)


def generator_loss(logits_image: torch.Tensor, logits_text: torch.Tensor, target: str = "swapped") -> torch.Tensor:
    """The encoders' side of the modality game, the discriminator's BCE of each batch averaged and the two added.

    ``target="swapped"``: the hard labels swapped, image embeddings against 0 and text embeddings against 1::

        -mean log(1 - s(x_img)) - mean log s(x_txt)

    Minimised by embeddings the discriminator takes for the other modality; 2 ln 2 when it cannot tell (every
    logit 0). This is the non-saturating generator loss of Goodfellow et al. (2014), for alternating updates;
    the paper only writes ``L = L_D + L_I^V + L_I^T + L_M^V + L_M^T`` and says the encoders try to fool ``D``. A
    gradient-reversal layer (minimising ``-discriminator_loss`` through the encoders) is the other reading.

    ``target="confusion"``: both modalities against 0.5 (the "maximal confusion" target of Tzeng et al., 2015)::

        -mean [log s(x_img) + log(1 - s(x_img))] / 2 - mean [log s(x_txt) + log(1 - s(x_txt))] / 2

    Minimised, at 2 ln 2 with zero gradient, exactly where ``D`` cannot tell (logit 0), so the encoders stop
    pushing once they fool it instead of overshooting to the other side (the swapped form keeps pushing, and
    the discriminator's accuracy drops below chance).

    The GAN tricks (soft labels, flips) are for the discriminator's targets only, as in Chintala's list.
    """
    _check_logits("generator_loss", logits_image, logits_text)
    x_image, x_text = logits_image.reshape(-1), logits_text.reshape(-1)
    if target == "swapped":
        return _bce_logits(x_image, torch.zeros_like(x_image)) + _bce_logits(x_text, torch.ones_like(x_text))
    if target == "confusion":
        return _bce_logits(x_image, torch.full_like(x_image, 0.5)) + _bce_logits(x_text, torch.full_like(x_text, 0.5))
    raise ValueError(f"generator_loss: target {target!r} must be 'swapped' or 'confusion'")


def discriminator_accuracy(logits_image: torch.Tensor, logits_text: torch.Tensor) -> torch.Tensor:
    """0-d float32: the share of the ``n_image + n_text`` embeddings whose modality the discriminator gets
    right at threshold 0.5, i.e. an image when ``sigmoid(logit) > 0.5`` (``logit > 0``), else a text (a logit of
    exactly 0 counts as text). 0.5 means it cannot tell the modalities apart. No gradient."""
    _check_logits("discriminator_accuracy", logits_image, logits_text)
    with torch.no_grad():
        right = (logits_image.reshape(-1) > 0).sum() + (logits_text.reshape(-1) <= 0).sum()
        return right.to(torch.float32) / (logits_image.numel() + logits_text.numel())
