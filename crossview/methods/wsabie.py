"""WSABIE (Weston, Bengio & Usunier, IJCAI 2011) and its caption variant (paper 001, appendix A).

Two models, one embedding space ``R^P``:

- labels: ``f_l(x) = W_l^T V x`` with ``V: (P, p)`` and one column ``W_l`` of ``W: (P, Y)`` per label
  (``target="labels"``: the images' class labels; ``"label_sets"``: the images' label sets;
  ``"tags"``: the images' tags);
- captions: ``g_y(x) = y^T Z^T V x`` with ``Z: (P, q)`` mapping caption features into the same space
  (``target="captions"``, the default).

Training is SGD on the WARP loss (:mod:`crossview.nn.warp`): for each positive pair, sample negatives
until one violates the margin, step on ``L(floor(n_neg / N)) * |1 - f_pos + f_neg|_+`` and project every
column of ``V`` and ``W`` / ``Z`` back to norm ``<= max_norm`` (the paper's lambda). As in WSABIE, the
learning rate is constant (chosen on validation) and training stops when the validation score has not
improved for ``patience`` passes, or after ``max_epochs`` passes (20, as in the BITR paper's timing);
the best validation epoch is kept.

Minibatches: the positives of one batch sample their negatives against the same parameters and their
per-example SGD steps (learning rate ``lr`` each) are summed into one update. With ``batch_size=1``
this is exactly the paper's algorithm. Negative sampling has the sequential algorithm's distribution
(:func:`crossview.nn.warp.sample_violators`); a positive that has no violator among its first draws is
finished from its full score row, so the cost of a pass grows towards ``n_pairs^2 * q`` as the model
fits the training set (as it does for the paper's loop, which then draws up to every negative).
``max_draws`` caps N where that is too slow (``bench/wsabie_train.py`` measures both).

Both retrieval directions use the one model: ``encode_images = V x`` and ``encode_texts = Z y``, so
``score(i, j) = (V x_i) . (Z y_j)``. In the label variants a caption is embedded as the mean of the
columns ``W_l`` of the labels whose names it contains (whole-word phrase match); a caption that names
no label gets the zero vector. :meth:`Wsabie.encode_labels` gives the label embeddings themselves
(image -> label ranking as in the paper's Experiments 3 and 4).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from crossview.core.events import Log, Loss, Progress, Validation
from crossview.core.errors import CrossViewError
from crossview.methods import register_method
from crossview.methods.base import Method, MethodData
from crossview.nn.warp import harmonic_table, max_norm_columns_, rank_weight, sample_violators

__all__ = ["Wsabie", "TARGETS", "caption_gradients", "label_gradients", "caption_warp_step",
           "label_warp_step", "StepStats"]

#: What the text side is: caption feature vectors (``Z``) or a label vocabulary (``W``).
TARGETS = ("captions", "labels", "label_sets", "tags")


# ====================================================================== the maths, as plain functions
def caption_gradients(V: torch.Tensor, Z: torch.Tensor, x: torch.Tensor, y_pos: torch.Tensor,
                      y_neg: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``sum_b weight_b * (1 - g_{y_pos_b}(x_b) + g_{y_neg_b}(x_b))`` w.r.t. ``V`` and ``Z``.

    ``V (P, p)``, ``Z (P, q)``, ``x (B, p)``, ``y_pos``/``y_neg (B, q)``, ``weight (B,)`` (the WARP rank
    weight, 0 for rows without an active hinge). Returns ``(dV (P, p), dZ (P, q))``.
    """
    dy = y_neg - y_pos                                   # (B, q)
    u = x @ V.T                                          # (B, P): V x
    dV = ((dy @ Z.T) * weight[:, None]).T @ x            # sum_b w_b Z dy_b x_b^T
    dZ = (u * weight[:, None]).T @ dy                    # sum_b w_b (V x_b) dy_b^T
    return dV, dZ


def label_gradients(V: torch.Tensor, W: torch.Tensor, x: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor,
                    weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``sum_b weight_b * (1 - f_{pos_b}(x_b) + f_{neg_b}(x_b))`` w.r.t. ``V`` and ``W``.

    ``V (P, p)``, ``W (P, Y)``, ``x (B, p)``, ``pos``/``neg (B,)`` int64 label ids, ``weight (B,)``.
    Returns ``(dV (P, p), dW (P, Y))``.
    """
    u = x @ V.T                                          # (B, P)
    dw = (W[:, neg] - W[:, pos]) * weight[None, :]       # (P, B)
    dV = dw @ x
    wu = u * weight[:, None]                             # (B, P)
    dW = torch.zeros_like(W)
    dW.index_add_(1, neg, wu.T)
    dW.index_add_(1, pos, -wu.T)
    return dV, dW


@dataclass
class StepStats:
    """What one WARP minibatch step did (plain floats, for Loss events)."""

    loss: float        #: mean over the batch of the weighted hinge (0 for rows without a violator)
    violated: float    #: fraction of rows that found a violator (and stepped)
    draws: float       #: mean N over the rows


def _warp_update(draw: Any, f_pos: torch.Tensor, n_neg: torch.Tensor, table: torch.Tensor,
                 margin: float) -> tuple[torch.Tensor, StepStats]:
    w = rank_weight(draw.n_draws, n_neg, table).to(f_pos.dtype) * draw.violated.to(f_pos.dtype)
    hinge = (margin - f_pos + draw.f_neg).clamp(min=0)
    b = max(1, f_pos.shape[0])
    stats = StepStats(loss=float((w * hinge).sum()) / b, violated=float(draw.violated.float().mean()),
                      draws=float(draw.n_draws.float().mean()))
    return w, stats


@torch.no_grad()
def caption_warp_step(V: torch.Tensor, Z: torch.Tensor, x: torch.Tensor, caption_ids: torch.Tensor,
                      image_ids: torch.Tensor, y_all: torch.Tensor, caption_image: torch.Tensor,
                      n_neg: torch.Tensor, table: torch.Tensor, *, lr: float, max_norm: float,
                      margin: float = 1.0, exclude_same_image: bool = True, draws_per_round: int = 32,
                      max_draws: int | None = None, generator: torch.Generator | None = None) -> StepStats:
    """One WARP SGD step of the caption model on a minibatch of positive (image, caption) pairs, in place.

    ``x (B, p)`` image features of the pairs, ``caption_ids (B,)`` their captions (rows of
    ``y_all (n_captions, q)``), ``image_ids (B,)`` their images; ``caption_image (n_captions,)``;
    ``n_neg (B,)`` the number of negatives of each pair (captions of other images when
    ``exclude_same_image``, else every other caption). Updates ``V`` and ``Z`` and projects their columns.
    """
    u = x @ V.T                                          # (B, P)
    t = u @ Z                                            # (B, q): score of y is y . t
    y_pos = y_all[caption_ids]
    f_pos = (y_pos * t).sum(1)

    def score_fn(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        return torch.bmm(y_all[cand], t[rows].unsqueeze(2)).squeeze(2)

    if exclude_same_image:
        def is_positive(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
            return caption_image[cand] == image_ids[rows].unsqueeze(1)
    else:
        def is_positive(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
            return cand == caption_ids[rows].unsqueeze(1)

    def full_score_fn(rows: torch.Tensor) -> torch.Tensor:
        return t[rows] @ y_all.T

    # Gathered candidates cost (rows x draws x q) floats: keep a round near 16 MB.
    draw = sample_violators(f_pos, y_all.shape[0], n_neg, score_fn, is_positive, margin=margin,
                            draws_per_round=draws_per_round, max_draws=max_draws,
                            round_budget=max(1024, (1 << 22) // y_all.shape[1]), full_score_fn=full_score_fn,
                            generator=generator)
    w, stats = _warp_update(draw, f_pos, n_neg, table, margin)
    if stats.violated > 0:
        y_neg = y_all[draw.negative.clamp(min=0)]
        dV, dZ = caption_gradients(V, Z, x, y_pos, y_neg, w)
        V.sub_(lr * dV)
        Z.sub_(lr * dZ)
        max_norm_columns_(V, max_norm)
        max_norm_columns_(Z, max_norm)
    return stats


@torch.no_grad()
def label_warp_step(V: torch.Tensor, W: torch.Tensor, x: torch.Tensor, labels: torch.Tensor,
                    image_ids: torch.Tensor, positive_keys: torch.Tensor, n_neg: torch.Tensor,
                    table: torch.Tensor, *, lr: float, max_norm: float, margin: float = 1.0,
                    draws_per_round: int = 32, max_draws: int | None = None,
                    generator: torch.Generator | None = None) -> StepStats:
    """One WARP SGD step of the label model on a minibatch of positive (image, label) pairs, in place.

    ``x (B, p)``, ``labels (B,)`` the positive label ids, ``image_ids (B,)`` the images (any ids, used
    only to look up positives); ``positive_keys`` sorted int64 ``image_id * Y + label`` of every positive
    pair (a drawn label that is a positive of the row's image is rejected); ``n_neg (B,)``
    ``= Y - |labels of the image|``. Updates ``V`` and ``W`` and projects their columns.
    """
    n_labels = W.shape[1]
    u = x @ V.T                                          # (B, P)
    f_pos = (W[:, labels].T * u).sum(1)
    Wt = W.T

    def score_fn(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        return torch.bmm(Wt[cand], u[rows].unsqueeze(2)).squeeze(2)

    def is_positive(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        return torch.isin(image_ids[rows].unsqueeze(1) * n_labels + cand, positive_keys)

    def full_score_fn(rows: torch.Tensor) -> torch.Tensor:
        return u[rows] @ W

    draw = sample_violators(f_pos, n_labels, n_neg, score_fn, is_positive, margin=margin,
                            draws_per_round=draws_per_round, max_draws=max_draws,
                            round_budget=max(1024, (1 << 22) // W.shape[0]), full_score_fn=full_score_fn,
                            generator=generator)
    w, stats = _warp_update(draw, f_pos, n_neg, table, margin)
    if stats.violated > 0:
        dV, dW = label_gradients(V, W, x, labels, draw.negative.clamp(min=0), w)
        V.sub_(lr * dV)
        W.sub_(lr * dW)
        max_norm_columns_(V, max_norm)
        max_norm_columns_(W, max_norm)
    return stats


# ====================================================================== helpers
def _normalize(a: np.ndarray, how: str) -> np.ndarray:
    a = np.asarray(a, dtype=np.float32)
    if how == "none":
        return a
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.maximum(norms, 1e-12)


def _resolve_device(device: str) -> torch.device:
    from crossview.core.devices import torch_device  # auto | cpu | cuda[:n] | mps, checked

    return torch_device(device)


def _np(t: Any) -> np.ndarray:
    """A learned matrix (torch tensor on any device, or numpy) as float32 numpy."""
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().numpy()
    return np.asarray(t, dtype=np.float32)


_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _mentioned(caption_words: list[str], name_words: list[list[str]]) -> list[int]:
    """Ids of the names whose words occur as a contiguous run in the caption's words."""
    joined = " " + " ".join(caption_words) + " "
    return [i for i, nw in enumerate(name_words) if nw and (" " + " ".join(nw) + " ") in joined]


# ====================================================================== the method
@register_method("wsabie")
class Wsabie(Method):
    """WSABIE with the WARP loss: label version (``W``) and caption version (``Z``), see the module docstring.

    Learned attributes: ``V_ (P, p)``, ``Z_ (P, q)`` (captions) or ``W_ (P, Y)`` and ``label_names_``
    (label targets), ``epoch_``, ``step_``, ``best_score_``, ``history_`` and the training position.
    """

    iterative = True

    #: chosen on real photos (bench/results/defaults_flickr8k.md): signed square root, then L2, on the CNN
    #: features and a 256-d space (3-fold CV rsum on the Flickr8k sample's train images 222 -> 238)
    default_image_norm = "ssr"

    def __init__(self, *, target: str = "captions", dim: int = 256, lr: float = 0.003, max_norm: float = 10.0,
                 margin: float = 1.0, batch_size: int = 128, max_epochs: int = 20, patience: int = 3,
                 draws_per_round: int = 32, max_draws: int = 0, exclude_same_image: bool = True,
                 normalize: str = "l2", device: str = "auto", seed: int = 0, log_every: int = 10) -> None:
        self.target = target
        self.dim = dim
        self.lr = lr
        self.max_norm = max_norm
        self.margin = margin
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.patience = patience
        self.draws_per_round = draws_per_round
        self.max_draws = max_draws
        self.exclude_same_image = exclude_same_image
        self.normalize = normalize
        self.device = device
        self.seed = seed
        self.log_every = log_every

    # ------------------------------------------------------------------ checks
    def _check_params(self) -> None:
        if self.target not in TARGETS:
            raise CrossViewError(f"wsabie: target {self.target!r} is not one of {', '.join(TARGETS)}")
        if self.normalize not in ("l2", "none"):
            raise CrossViewError(f"wsabie: normalize {self.normalize!r} must be 'l2' or 'none'")
        for name in ("dim", "batch_size", "max_epochs", "draws_per_round", "log_every"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise CrossViewError(f"wsabie: {name} must be a whole number >= 1, got {v!r}")
        if not isinstance(self.patience, (int, np.integer)) or self.patience < 0:
            raise CrossViewError(f"wsabie: patience must be a whole number >= 0 (0 = never stop early), "
                                 f"got {self.patience!r}")
        for name in ("lr", "max_norm", "margin"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise CrossViewError(f"wsabie: {name} must be a positive number, got {v!r}")
        if self.max_draws is not None and (not isinstance(self.max_draws, (int, np.integer))
                                           or self.max_draws < 0):
            raise CrossViewError(f"wsabie: max_draws must be 0 (no cap: up to all negatives, as in the paper) "
                                 f"or a whole number >= 1, got {self.max_draws!r}")

    # ------------------------------------------------------------------ the label vocabulary
    def _label_sets_of(self, data: MethodData, names: list[str] | None = None) -> tuple[list[list[int]], list[str]]:
        """Per-image label ids and the vocabulary, for the label targets. With ``names`` (a fitted model's
        vocabulary) the data's labels are mapped onto it and unknown ones dropped."""
        where = f"the {data.name or 'given'} data"
        if self.target == "labels":
            if data.labels is None:
                raise CrossViewError(f"wsabie target 'labels' needs class labels but {where} has none; "
                                     "use a dataset with per-image labels or target 'captions'")
            ds_names = getattr(data.dataset, "label_names", None)
            raw = [[str(ds_names[int(v)]) if ds_names else str(int(v))] for v in data.labels]
        elif self.target == "label_sets":
            if data.label_sets is None:
                raise CrossViewError(f"wsabie target 'label_sets' needs per-image label sets but {where} "
                                     "has none; use a dataset with label sets, or target 'tags' / 'captions'")
            lsn = data.label_set_names
            raw = [[str(lsn[i]) if lsn else str(i) for i in s] for s in data.label_sets]
        else:  # tags
            tags = getattr(data.dataset, "tags", None)
            if tags is None:
                raise CrossViewError(f"wsabie target 'tags' needs per-image tags but {where} has none; "
                                     "use a dataset with tags, or target 'captions'")
            raw = [[str(t) for t in ts] for ts in tags]
        if names is None:
            names = sorted({n for s in raw for n in s})
        lookup = {n: i for i, n in enumerate(names)}
        return [sorted({lookup[n] for n in s if n in lookup}) for s in raw], names

    # ------------------------------------------------------------------ training
    def _init_state(self, train: MethodData, p: int, q: int | None, n_labels: int | None,
                    gen: torch.Generator) -> None:
        P = int(self.dim)
        # WSABIE initialises at random with mean 0 and standard deviation 1/sqrt(input dimension).
        self.V_ = torch.randn(P, p, generator=gen) / math.sqrt(p)
        if q is not None:
            self.Z_ = torch.randn(P, q, generator=gen) / math.sqrt(q)
        if n_labels is not None:
            self.W_ = torch.randn(P, n_labels, generator=gen) / math.sqrt(P)
        max_norm_columns_(self.V_, float(self.max_norm))
        for name in ("Z_", "W_"):
            if hasattr(self, name):
                max_norm_columns_(getattr(self, name), float(self.max_norm))
        self.epoch_ = 0
        self.step_ = 0
        self.batch_pos_ = 0
        self.perm_ = None
        self.best_score_ = -math.inf
        self.best_epoch_ = 0
        self.bad_epochs_ = 0
        self.best_params_ = None
        self.epoch_sums_ = [0.0, 0.0, 0.0, 0]
        self.history_ = []
        self.stopped_ = False
        self.done_ = False

    def fit_iter(self, train: MethodData, val: MethodData | None = None, *,
                 resume: bool = False) -> Iterator[Any]:
        """Train with WARP SGD, yielding Progress every batch, Loss every ``log_every`` batches and at the
        end of each pass, and Validation after each pass when ``val`` is given."""
        self._check_params()
        dev = _resolve_device(str(self.device))
        x_np = _normalize(train.image_features, self.normalize)
        p = x_np.shape[1]
        captions = self.target == "captions"
        if captions:
            y_np = _normalize(train.require_text_features("wsabie"), self.normalize)
            if train.n_captions < 2:
                raise CrossViewError("wsabie needs at least 2 training captions to draw negatives from")
        if resume:
            self.check_is_fitted()
            if getattr(self, "done_", False):
                yield Log("wsabie: the loaded state has already finished training", "info")
                return
            if self.V_.shape[1] != p:
                raise CrossViewError(f"wsabie: cannot resume: the checkpoint expects {self.V_.shape[1]}-d image "
                                     f"features, the data has {p}-d; use the features the run was started with")
        gen = torch.Generator().manual_seed(int(self.seed))
        if captions:
            if resume and self.Z_.shape[1] != y_np.shape[1]:
                raise CrossViewError(f"wsabie: cannot resume: the checkpoint expects {self.Z_.shape[1]}-d caption "
                                     f"features, the data has {y_np.shape[1]}-d")
            if not resume:
                self._init_state(train, p, y_np.shape[1], None, gen)
                self.label_names_ = None
            ci = torch.as_tensor(train.caption_image)
            per_image = torch.bincount(ci, minlength=train.n_images)
            n_pairs = train.n_captions
            n_neg_all = (train.n_captions - per_image[ci]) if self.exclude_same_image else \
                torch.full((n_pairs,), train.n_captions - 1)
            if int(n_neg_all.max()) < 1:
                raise CrossViewError("wsabie: every training caption belongs to one image, so there are no "
                                     "negatives; train on a split with captions of at least two images")
        else:
            names = self.label_names_ if resume else None
            sets, names = self._label_sets_of(train, names)
            if len(names) < 2:
                raise CrossViewError(f"wsabie target {self.target!r}: the training data has {len(names)} distinct "
                                     "label(s); WARP needs at least 2 to rank")
            if not resume:
                self._init_state(train, p, None, len(names), gen)
                self.label_names_ = list(names)
            n_labels = len(names)
            pair_img = torch.as_tensor([i for i, s in enumerate(sets) for _ in s], dtype=torch.int64)
            pair_lab = torch.as_tensor([l for s in sets for l in s], dtype=torch.int64)
            n_pairs = len(pair_img)
            if n_pairs == 0:
                raise CrossViewError(f"wsabie target {self.target!r}: no training image has a label")
            sizes = torch.as_tensor([len(s) for s in sets], dtype=torch.int64)
            n_neg_all = n_labels - sizes[pair_img]
            positive_keys = torch.sort(pair_img * n_labels + pair_lab).values.to(dev)
        if resume:
            gen.set_state(torch.as_tensor(self.rng_state_, dtype=torch.uint8))

        # The learned tensors live on the device as the attributes themselves (state_dict copies them).
        self.V_ = self.V_.to(dev)
        if captions:
            self.Z_ = self.Z_.to(dev)
        else:
            self.W_ = self.W_.to(dev)
        V = self.V_
        T = self.Z_ if captions else self.W_
        table = harmonic_table(int(n_neg_all.max()), dtype=V.dtype, device=dev)
        X = torch.as_tensor(x_np).to(dev)
        if captions:
            Y = torch.as_tensor(y_np).to(dev)
            ci_dev = ci.to(dev)
        else:
            pair_img, pair_lab = pair_img.to(dev), pair_lab.to(dev)
        n_neg_all = n_neg_all.to(dev)
        bs = int(self.batch_size)
        n_batches = (n_pairs + bs - 1) // bs
        total = int(self.max_epochs) * n_batches
        lr, max_norm, margin = float(self.lr), float(self.max_norm), float(self.margin)
        if dev.type == "cpu":
            dev_gen = gen
        else:  # negatives are drawn on the device with a generator of its own, seeded from ``gen``
            dev_gen = torch.Generator(device=dev)
            if resume and getattr(self, "device_rng_state_", None) is not None:
                dev_gen.set_state(torch.as_tensor(self.device_rng_state_, dtype=torch.uint8))
            else:
                dev_gen.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))

        def sync() -> None:  # what a checkpoint taken at the next yield needs besides the tensors
            self.rng_state_ = gen.get_state().numpy().copy()
            self.device_rng_state_ = None if dev_gen is gen else dev_gen.get_state().cpu().numpy().copy()

        sync()
        if not resume:
            yield Log(f"wsabie ({self.target}): {n_pairs} positive pairs, {n_batches} batches per pass, "
                      f"embedding dim {self.dim}, device {dev}", "info")
        while self.epoch_ < int(self.max_epochs) and not self.stopped_:
            if self.perm_ is None:
                self.perm_ = torch.randperm(n_pairs, generator=gen).numpy()
                self.batch_pos_ = 0
                self.epoch_sums_ = [0.0, 0.0, 0.0, 0]
            sums = list(self.epoch_sums_)
            perm = torch.as_tensor(self.perm_).to(dev)
            while self.batch_pos_ < n_batches:
                idx = perm[self.batch_pos_ * bs:(self.batch_pos_ + 1) * bs]
                if captions:
                    img = ci_dev[idx]
                    stats = caption_warp_step(V, T, X[img], idx, img, Y, ci_dev, n_neg_all[idx], table, lr=lr,
                                              max_norm=max_norm, margin=margin,
                                              exclude_same_image=bool(self.exclude_same_image),
                                              draws_per_round=int(self.draws_per_round),
                                              max_draws=int(self.max_draws or 0) or None, generator=dev_gen)
                else:
                    img = pair_img[idx]
                    stats = label_warp_step(V, T, X[img], pair_lab[idx], img, positive_keys,
                                            n_neg_all[idx], table, lr=lr, max_norm=max_norm, margin=margin,
                                            draws_per_round=int(self.draws_per_round),
                                            max_draws=int(self.max_draws or 0) or None, generator=dev_gen)
                if not all(math.isfinite(v) for v in (stats.loss, stats.draws)):
                    raise CrossViewError(f"wsabie: the loss became {stats.loss} at step {self.step_}; "
                                         f"lower the learning rate (lr={self.lr})")
                n = len(idx)
                sums[0] += stats.loss * n
                sums[1] += stats.violated * n
                sums[2] += stats.draws * n
                sums[3] += n
                self.epoch_sums_ = list(sums)
                self.batch_pos_ += 1
                self.step_ += 1
                sync()
                yield Progress(self.step_, total, f"epoch {self.epoch_ + 1}/{self.max_epochs}")
                if self.step_ % int(self.log_every) == 0:
                    yield Loss(self.step_, self.epoch_ + 1, {"loss": stats.loss, "violated": stats.violated,
                                                               "draws": stats.draws})
            self.epoch_ += 1
            self.perm_ = None
            m = max(1, sums[3])
            terms = {"epoch_loss": sums[0] / m, "violated": sums[1] / m, "draws": sums[2] / m}
            self.epoch_sums_ = [0.0, 0.0, 0.0, 0]
            record: dict[str, Any] = {"epoch": self.epoch_, **terms}
            stop = False
            if val is not None:
                metrics, score = self._validate(val)
                record["val"] = score
                if score > self.best_score_:
                    self.best_score_, self.best_epoch_, self.bad_epochs_ = score, self.epoch_, 0
                    self.best_params_ = {"V_": V.detach().cpu().clone(), "T_": T.detach().cpu().clone()}
                else:
                    self.bad_epochs_ += 1
                    stop = int(self.patience) > 0 and self.bad_epochs_ >= int(self.patience)
            self.history_.append(record)
            self.stopped_ = stop
            sync()
            yield Loss(self.step_, self.epoch_, terms)
            if val is not None:
                yield Validation(self.epoch_, metrics)
            if stop:
                yield Log(f"wsabie: validation has not improved for {self.bad_epochs_} passes; stopping at pass "
                          f"{self.epoch_} and keeping pass {self.best_epoch_}", "info")
                break
        if self.best_params_ is not None:
            V.copy_(self.best_params_["V_"].to(dev))
            T.copy_(self.best_params_["T_"].to(dev))
        self.done_ = True
        sync()

    # ------------------------------------------------------------------ validation
    def _validate(self, val: MethodData) -> tuple[dict[str, Any], float]:
        """Validation metrics and the score that early stopping maximises (rsum for captions, the mAP of
        image -> label ranking for the label targets)."""
        if self.target == "captions":
            res = self.evaluate(val)
            res.pop("ranks", None)
            return res, float(res["rsum"])
        res = self.evaluate_labels(val)
        return res, float(res["mAP"])

    def evaluate_labels(self, data: MethodData, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
        """Image -> label ranking on ``data`` (label targets): ``{"P@K": %, "mAP": %}`` over its images
        that have labels in the model's vocabulary (Experiments 3 and 4 of the BITR paper)."""
        from crossview.eval.protocols import mean_average_precision, precision_at_k

        self._require_labels()
        sets, _ = self._label_sets_of(data, self.label_names_)
        keep = [i for i, s in enumerate(sets) if s]
        if not keep:
            raise CrossViewError(f"wsabie: no image of the {data.name or 'given'} data has a label the model knows")
        scores = self.encode_images(data)[keep] @ self.encode_labels().T
        rel = np.zeros(scores.shape, dtype=bool)
        for r, i in enumerate(keep):
            rel[r, sets[i]] = True
        ks = [k for k in ks if k <= scores.shape[1]]
        out = dict(precision_at_k(scores, rel, ks))
        out["mAP"] = mean_average_precision(scores, rel)["mAP"]
        return out

    # ------------------------------------------------------------------ inference
    def _require_labels(self) -> None:
        self.check_is_fitted()
        if getattr(self, "W_", None) is None:
            raise CrossViewError("wsabie: this model was trained on captions (target 'captions'); it has no "
                                 "label embeddings")

    def encode_images(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """``(n_images, P) float32``: ``V x`` of every image (both directions use it)."""
        self.check_is_fitted()
        x = _normalize(data.image_features, self.normalize)
        V = _np(self.V_)
        if x.shape[1] != V.shape[1]:
            raise CrossViewError(f"wsabie: the model expects {V.shape[1]}-d image features, the "
                                 f"{data.name or 'given'} data has {x.shape[1]}-d; use the image encoder it "
                                 "was trained with")
        return np.ascontiguousarray(x @ V.T, dtype=np.float32)

    def encode_texts(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """``(n_captions, P) float32``: ``Z y`` of every caption; for the label targets, the mean of the
        embeddings of the labels each caption names (zero when it names none)."""
        self.check_is_fitted()
        if getattr(self, "Z_", None) is not None:
            y = _normalize(data.require_text_features("wsabie"), self.normalize)
            Z = _np(self.Z_)
            if y.shape[1] != Z.shape[1]:
                raise CrossViewError(f"wsabie: the model expects {Z.shape[1]}-d caption features, the "
                                     f"{data.name or 'given'} data has {y.shape[1]}-d; use the text encoder it "
                                     "was trained with")
            return np.ascontiguousarray(y @ Z.T, dtype=np.float32)
        labels = self.encode_labels()
        name_words = [_words(n) for n in self.label_names_]
        out = np.zeros((data.n_captions, labels.shape[1]), dtype=np.float32)
        for j, cap in enumerate(data.captions):
            ids = _mentioned(_words(cap), name_words)
            if ids:
                out[j] = labels[ids].mean(axis=0)
        return out

    def encode_labels(self) -> np.ndarray:
        """``(Y, P) float32``: the label embeddings ``W_l`` (label targets), rows in ``label_names_`` order."""
        self._require_labels()
        return np.ascontiguousarray(_np(self.W_).T)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Parameters and learned state as numpy arrays / Python objects (tensors converted)."""
        d = super().state_dict()
        state = {}
        for k, v in d["state"].items():
            if isinstance(v, torch.Tensor):
                v = v.detach().cpu().numpy().copy()
            elif isinstance(v, dict):
                v = {kk: (vv.detach().cpu().numpy().copy() if isinstance(vv, torch.Tensor) else copy.deepcopy(vv))
                     for kk, vv in v.items()}
            elif isinstance(v, np.ndarray):
                v = v.copy()
            else:
                v = copy.deepcopy(v)
            state[k] = v
        d["state"] = state
        return d

    def load_state_dict(self, d: dict[str, Any]) -> "Wsabie":
        """Restore from :meth:`state_dict` (arrays become CPU tensors again)."""
        super().load_state_dict(d)
        for k in ("V_", "Z_", "W_"):
            v = getattr(self, k, None)
            if isinstance(v, np.ndarray):
                setattr(self, k, torch.from_numpy(np.array(v, dtype=np.float32)))
        best = getattr(self, "best_params_", None)
        if isinstance(best, dict):
            self.best_params_ = {k: torch.from_numpy(np.array(v, dtype=np.float32)) if isinstance(v, np.ndarray)
                                 else v for k, v in best.items()}
        return self
