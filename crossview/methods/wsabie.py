"""WSABIE (Weston, Bengio & Usunier, IJCAI 2011) and its caption variant (paper 001, appendix A).

Two models, one embedding space ``R^P``:

- labels: ``f_l(x) = W_l^T V x`` with ``V: (P, p)`` and one column ``W_l`` of ``W: (P, Y)`` per label
  (``target="labels"``: the images' class labels; ``"label_sets"``: the images' label sets;
  ``"tags"``: the images' tags);
- captions: ``g_y(x) = y^T Z^T V x`` with ``Z: (P, q)`` mapping caption features into the same space
  (``target="captions"``, the default).

Training is SGD on the WARP loss (:mod:`crossview.nn.warp`): for each positive pair, sample negatives
until one violates the margin, step on ``L(floor(n_neg / N)) * |1 - f_pos + f_neg|_+`` and project every
column of ``V`` and ``W`` / ``Z`` back to norm ``<= max_norm`` (the paper's lambda). It runs on the one
training loop (:class:`crossview.methods.torch_method.TorchMethod` over :mod:`crossview.nn.trainer`):
the step's loss is the *sum* of the batch's weighted hinges, so plain SGD with learning rate ``lr``
applies each positive's own paper step (``batch_size=1`` is exactly the paper's algorithm); the
positives of one batch sample their negatives against the same parameters.

``directions="both"`` (the default ``"auto"`` for captions) adds the mirror term that METHODS.md asks of the one model ("the
same model ranks captions for an image and images for a caption"): for each positive pair, images (for
labels: images without that label) are drawn until one violates, with the same WARP weight over the
image negatives. ``"i2t"`` is the paper's loss (captions / labels ranked for an image only), and what ``"auto"`` trains for
the label targets, whose task is image -> label ranking.
On real photos the mirror term, a 1024-d space, a tighter ``max_norm`` (1) and one learning-rate drop
(``lr_decay_epoch``) lifted val rsum on the Flickr8k sample from 330 to 365 (mean of 3 seeds;
bench/results/defaults_flickr8k.md as of commit c1b1061). A later search with ``crossview tune`` (3-fold CV of the training photos,
bench/results/tune_wsabie_timam_flickr8k.md as of commit 1bc5759) moved P to 4096 and lr to 0.002: +8.9 rsum on
the folds (95% interval +4.1 to +13.5, better on every fold). The same search run again from there (that file as
of commit 153c276) moved lr to 0.001 and the margin to 0.3: 300.5 against 287.8 on the folds at the same 20 passes
(+12.7, 95% interval +7.8 to +17.7, better on every fold); its best point, which also trains 40 passes, scored
+0.7 more for twice the training, so the passes stay at 20. The label targets take the same defaults.

Negative sampling has the sequential algorithm's distribution (:func:`crossview.nn.warp.sample_violators`);
a positive that has no violator among its first draws is finished from its full score row, so the cost
of a pass grows towards ``n_pairs^2 * q`` as the model fits the training set (as it does for the paper's
loop, which then draws up to every negative). ``max_draws`` caps N where that is too slow
(``bench/wsabie_train.py`` measures both).

Both retrieval directions use the one model: ``encode_images = V x`` and ``encode_texts = Z y``, so
``score(i, j) = (V x_i) . (Z y_j)``. In the label variants a caption is embedded as the mean of the
columns ``W_l`` of the labels whose names it contains (whole-word phrase match); a caption that names
no label gets the zero vector. :meth:`Wsabie.encode_labels` gives the label embeddings themselves
(image -> label ranking as in the paper's Experiments 3 and 4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from crossview.data.method_data import MethodData
from crossview.core.errors import CrossViewError
from crossview.methods import register_method
from crossview.methods._labels import label_sets_of, mentioned, normalize_rows, words
from crossview.methods.torch_method import TorchMethod
from crossview.core.linalg import column_mean, is_sparse
from crossview.nn.sparse_rows import DenseRows, SparseRows
from crossview.nn.trainer import unwrap
from crossview.nn.warp import harmonic_table, max_norm_columns_, sample_violators, warp_loss

__all__ = ["Wsabie", "WsabieModel", "TARGETS", "DIRECTIONS_TRAINED"]

#: What the text side is: caption feature vectors (``Z``) or a label vocabulary (``W``).
TARGETS = ("captions", "labels", "label_sets", "tags")
#: Which rankings the WARP loss trains: both (captions / labels for an image and images for them), i2t, or
#: auto (both for captions; i2t for the label targets, whose task is image -> label ranking: the mirror term
#: there trains label -> image ranking and costs image -> label P@1 80+ -> ~35 on separable classes).
DIRECTIONS_TRAINED = ("auto", "both", "i2t")


# ====================================================================== helpers
# ====================================================================== the model
class WsabieModel(torch.nn.Module):
    """``V (P, p)`` and the text side: ``Z (P, q)`` (captions) or ``W (P, Y)`` (labels).

    ``forward(x (B, p), t)`` returns ``(V x (B, P), text embeddings (B, P))``: ``Z y`` for caption
    feature rows ``t (B, q)``, or the columns ``W_t`` for int64 label ids ``t (B,)``."""

    def __init__(self, dim: int, p: int, q: int | None = None, n_labels: int | None = None) -> None:
        super().__init__()
        # WSABIE initialises at random with mean 0 and standard deviation 1/sqrt(input dimension).
        self.V = torch.nn.Parameter(torch.randn(dim, p) / math.sqrt(p))
        self.Z = torch.nn.Parameter(torch.randn(dim, q) / math.sqrt(q)) if q is not None else None
        self.W = torch.nn.Parameter(torch.randn(dim, n_labels) / math.sqrt(dim)) if n_labels is not None else None

    @property
    def text_matrix(self) -> torch.Tensor:
        return self.Z if self.Z is not None else self.W

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.Z is not None:
            return x @ self.V.T, t @ self.Z.T
        return x @ self.V.T, self.W[:, t].T


def _np(t: Any) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().numpy()
    return np.asarray(t, dtype=np.float32)


# ====================================================================== the method
@register_method("wsabie")
class Wsabie(TorchMethod):
    """WSABIE with the WARP loss: label version (``W``) and caption version (``Z``), see the module docstring.

    Learned attributes (besides :class:`TorchMethod`'s): ``label_names_`` (label targets). ``V_``, ``Z_``
    and ``W_`` are the learned matrices (read-only views of the model).
    """

    loss_is_sum = True

    #: chosen on real photos (bench/results/defaults_flickr8k.md): signed square root, then L2, on the CNN
    #: features (3-fold CV rsum on the Flickr8k sample's train images at lr 0.003, regenerated at f5c9967:
    #: 242.1 -> 253.8 at 256-d, 246.8 -> 252.7 at 1024-d). The max_norm default (1)
    #: assumes such features: on raw counts dominated by a few large entries it leaves too little room for
    #: the margin (use max_norm=10 there)
    default_image_norm = "ssr"
    #: chosen by 3-fold CV on the Flickr8k sample's training photos (bench/results/rich_features_flickr8k.md): both
    #: backbones, flip-averaged, and MiniLM + GloVe captions, CV rsum 264.6 -> 283.1 (paired +18.5, 95% interval
    #: +10.8 to +26.4; +9.8 to +27.4 widened for the 2 variants compared); val 367.8 -> 372.2
    default_image_encoder = "efficientnet_lite0+mobilenet_v2:flip"
    default_text_encoder = "minilm+glove"

    def __init__(self, *, target: str = "captions", dim: int = 4096, lr: float = 0.001, max_norm: float = 1.0,
                 margin: float = 0.3, directions: str = "auto", batch_size: int = 128, max_epochs: int = 20,
                 lr_decay_epoch: int = 12, lr_decay: float = 0.1, optimizer: str = "sgd", patience: int = 3,
                 draws_per_round: int = 32, max_draws: int = 0, exclude_same_image: bool = True,
                 normalize: str = "l2") -> None:
        self.target = target
        self.dim = dim
        self.lr = lr
        self.max_norm = max_norm
        self.margin = margin
        self.directions = directions
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.lr_decay_epoch = lr_decay_epoch
        self.lr_decay = lr_decay
        self.optimizer = optimizer
        self.patience = patience
        self.draws_per_round = draws_per_round
        self.max_draws = max_draws
        self.exclude_same_image = exclude_same_image
        self.normalize = normalize

    # ------------------------------------------------------------------ checks
    def _check_params(self) -> None:
        if self.target not in TARGETS:
            raise CrossViewError(f"wsabie: target {self.target!r} is not one of {', '.join(TARGETS)}")
        if self.directions not in DIRECTIONS_TRAINED:
            raise CrossViewError(f"wsabie: directions {self.directions!r} must be 'auto', 'both' or 'i2t'")
        if self.optimizer not in ("sgd", "adam"):
            raise CrossViewError(f"wsabie: optimizer {self.optimizer!r} must be 'sgd' (the paper's) or 'adam'")
        if self.normalize not in ("l2", "none"):
            raise CrossViewError(f"wsabie: normalize {self.normalize!r} must be 'l2' or 'none'")
        for name in ("dim", "batch_size", "max_epochs", "draws_per_round", "log_every"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise CrossViewError(f"wsabie: {name} must be a whole number >= 1, got {v!r}")
        for name, what in (("patience", "0 = never stop early"), ("lr_decay_epoch", "0 = a constant rate")):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise CrossViewError(f"wsabie: {name} must be a whole number >= 0 ({what}), got {v!r}")
        for name in ("lr", "max_norm", "margin", "lr_decay"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise CrossViewError(f"wsabie: {name} must be a positive number, got {v!r}")
        if self.max_draws is not None and (not isinstance(self.max_draws, (int, np.integer))
                                           or self.max_draws < 0):
            raise CrossViewError(f"wsabie: max_draws must be 0 (no cap: up to all negatives, as in the paper) "
                                 f"or a whole number >= 1, got {self.max_draws!r}")

    # ------------------------------------------------------------------ the label vocabulary
    def _label_sets_of(self, data: MethodData, names: list[str] | None = None) -> tuple[list[list[int]], list[str]]:
        """Per-image label ids and the vocabulary, for the label targets. With ``names`` (a fitted model's
        vocabulary) the data's labels are mapped onto it and unknown ones dropped."""
        return label_sets_of(data, self.target, "wsabie", names)

    # ------------------------------------------------------------------ the model and its data
    def model_spec(self, train: MethodData, resume: bool) -> dict[str, Any]:
        self._check_params()
        if not resume:        # a resumed model keeps the centring it was trained with (none if saved before it)
            self._fit_centring(train)
        spec: dict[str, Any] = {"dim": int(self.dim),
                                "image_dim": int(train.require_image_features("wsabie").shape[1]), "text_dim": None,
                                "n_labels": None}
        if self.target == "captions":
            spec["text_dim"] = int(train.require_text_features("wsabie", sparse=True).shape[1])
            if train.n_captions < 2:
                raise CrossViewError("wsabie needs at least 2 training captions to draw negatives from")
        else:
            names = getattr(self, "label_names_", None) if resume else None
            sets, names = self._label_sets_of(train, names)
            if len(names) < 2:
                raise CrossViewError(f"wsabie target {self.target!r}: the training data has {len(names)} distinct "
                                     "label(s); WARP needs at least 2 to rank")
            if not any(sets):
                raise CrossViewError(f"wsabie target {self.target!r}: no training image has a label")
            self.label_names_ = list(names)
            spec["n_labels"] = len(names)
        return spec

    def build_model(self, spec: dict[str, Any]) -> torch.nn.Module:
        model = WsabieModel(int(spec["dim"]), int(spec["image_dim"]), spec.get("text_dim"), spec.get("n_labels"))
        with torch.no_grad():
            self.after_step(model)
        return model

    def after_step(self, model: torch.nn.Module) -> None:
        m = unwrap(model)
        max_norm_columns_(m.V, float(self.max_norm))
        max_norm_columns_(m.text_matrix, float(self.max_norm))

    def _trains_both(self) -> bool:
        return self.directions == "both" or (self.directions == "auto" and self.target == "captions")

    def start_message(self, train: MethodData, n_items: int, n_batches: int, device: torch.device) -> str:
        return (f"wsabie ({self.target}, WARP {'both ways' if self._trains_both() else 'i2t'}): {n_items} "
                f"positive pairs, {n_batches} batches per pass, embedding dim {self.dim}, device {device}")

    def n_train_items(self, train: MethodData) -> int:
        if self.target == "captions":
            return train.n_captions
        sets, _ = self._label_sets_of(train, self.label_names_)
        return sum(len(s) for s in sets)

    def _fit_centring(self, train: MethodData) -> None:
        """``center_``: the training rows' mean of each view that :meth:`_rows` L2-normalises (caption target).

        Pooled CNN features are non-negative and averaged word vectors share a large common direction, so
        uncentred unit rows all have cosines near 1 and the few rows nearest the common direction top every
        list: on the Flickr8k sample's modern features (GloVe-50 captions) centring lifts val rsum 122 -> 204
        and the most frequent caption falls from 26% to 8% of the val images' top-5 lists over the training
        captions; with the default encoders (ssr image rows, MiniLM) rsum stays 363 -> 364
        (bench/hubness_centring.py). ``normalize="none"`` keeps the features as given; the label targets are
        not centred (not measured)."""
        center: dict[str, np.ndarray | None] = {"image": None, "text": None}
        if self.normalize == "l2" and self.target == "captions":
            for mod, a in (("image", train.require_image_features("wsabie")),
                           ("text", train.require_text_features("wsabie", sparse=True))):
                if a.shape[0]:      # summed in float64 a chunk of rows at a time: no float64 copy (1.8 GB at
                    center[mod] = column_mean(a).astype(np.float32)     # COCO size), TF-IDF kept sparse
        self.center_ = center

    def _rows(self, a: np.ndarray, mod: str) -> np.ndarray:
        """``(n, d) float32``: feature rows of ``mod`` as the model sees them (minus ``center_``, if any,
        then normalised); a model saved before the centring has no ``center_`` and is not centred."""
        c = getattr(self, "center_", {}).get(mod)
        a = np.asarray(a, dtype=np.float32)
        if c is not None and a.ndim == 2 and a.shape[1] == c.shape[0]:
            a = a - c        # a wrong width is left to the model's own dimension check, which names the encoder
        return normalize_rows(a, self.normalize)

    def _sparse_text_rows(self, a: Any, device: Any) -> SparseRows:
        """Sparse caption rows (TF-IDF) as :meth:`_rows` gives them (minus ``center_``, then normalised), held
        sparse: a step densifies only the rows it reads (:class:`crossview.nn.sparse_rows.SparseRows`)."""
        c = getattr(self, "center_", {}).get("text")
        if c is not None and c.shape[0] != a.shape[1]:
            c = None         # a wrong width is left to the model's own dimension check, which names the encoder
        return SparseRows.from_csr(a, c, self.normalize, device)

    def prepare(self, train: MethodData, device: torch.device) -> None:
        """The training tensors on ``device``: features, positives, negative counts and the L table."""
        # the image rows as the model sees them (centred, normalised) are computed where read, over the run's
        # features: no second image matrix (issue 34)
        image = train.require_image_features("wsabie")
        c = getattr(self, "center_", {}).get("image")
        X = DenseRows.from_array(image, c if c is not None and c.shape[0] == image.shape[1] else None,
                                 self.normalize, device)
        n_img = X.shape[0]
        t: dict[str, Any] = {"X": X, "n_img": n_img}
        if self.target == "captions":
            text = train.require_text_features("wsabie", sparse=True)
            if is_sparse(text):      # TF-IDF: never the dense n_captions x vocabulary matrix (issue 34)
                Y: Any = self._sparse_text_rows(text, device)
            else:
                Y = torch.as_tensor(np.require(self._rows(text, "text"), requirements="W")).to(device)
            ci = torch.as_tensor(train.caption_image, dtype=torch.int64).to(device)
            per_image = torch.bincount(ci, minlength=n_img)
            n = Y.shape[0]
            n_neg = (n - per_image[ci]) if self.exclude_same_image else torch.full((n,), n - 1, device=device)
            if int(n_neg.max()) < 1:
                raise CrossViewError("wsabie: every training caption belongs to one image, so there are no "
                                     "negatives; train on a split with captions of at least two images")
            t.update(Y=Y, pair_img=ci, pair_text=torch.arange(n, device=device), n_neg_text=n_neg,
                     n_neg_img=torch.full((n,), n_img - 1, device=device), n_text=n)
        else:
            sets, names = self._label_sets_of(train, self.label_names_)
            n_labels = len(names)
            pair_img = torch.as_tensor([i for i, s in enumerate(sets) for _ in s], dtype=torch.int64)
            pair_lab = torch.as_tensor([lab for s in sets for lab in s], dtype=torch.int64)
            sizes = torch.as_tensor([len(s) for s in sets], dtype=torch.int64)
            per_label = torch.bincount(pair_lab, minlength=n_labels)
            t.update(pair_img=pair_img.to(device), pair_text=pair_lab.to(device),
                     n_neg_text=(n_labels - sizes[pair_img]).to(device),
                     n_neg_img=(n_img - per_label[pair_lab]).to(device), n_text=n_labels,
                     keys=torch.sort(pair_img * n_labels + pair_lab).values.to(device))
        t["table"] = harmonic_table(int(max(int(t["n_neg_text"].max()), n_img)), device=device)
        self._t = t

    # ------------------------------------------------------------------ one step
    #: the most bytes the dense draw of a captured step may take (batch x candidates x ~20 bytes of work tensors)
    GRAPH_DRAW_BYTES = 2 << 30
    _graphing = False

    def graph_key(self) -> tuple[Any, str]:
        """CUDA graphs (crossview.nn.trainer): the sampler's rounds draw a data-dependent number of candidates, so a
        captured step draws every row from its full score row at once (:func:`crossview.nn.warp.draw_from_full_scores`:
        the same distribution, fixed shapes), when that fits :attr:`GRAPH_DRAW_BYTES`."""
        t = self._t
        if isinstance(t.get("Y"), SparseRows):
            return None, "sparse caption rows are gathered with data-dependent sizes"
        most = max(int(t["n_text"]), int(t["n_img"]))
        need = int(self.batch_size) * most * 20
        if need > self.GRAPH_DRAW_BYTES:
            return None, (f"drawing each row from all {most:,} candidates at once would take {need / 2**30:.1f} GB "
                          "(the sampler's rounds draw a data-dependent number)")
        return (lambda host: ()), ""

    def _draw(self, f_pos: torch.Tensor, n_cand: int, n_neg: torch.Tensor, score_fn: Any, pos_fn: Any, full_fn: Any,
              budget: int, kw: dict[str, Any]) -> Any:
        """The violators of a batch: the sampler's rounds (eager), or, while steps are captured, every row drawn from
        its full score row (the same distribution; nothing read on the host)."""
        if not self._graphing:
            return sample_violators(f_pos, n_cand, n_neg, score_fn, pos_fn, round_budget=budget, full_score_fn=full_fn,
                                    **kw)
        from crossview.nn.warp import draw_from_full_scores

        rows = torch.arange(f_pos.shape[0], device=f_pos.device)
        limit = n_neg if kw.get("max_draws") is None else n_neg.clamp(max=int(kw["max_draws"]))
        cand = torch.arange(int(n_cand), device=f_pos.device).unsqueeze(0)
        return draw_from_full_scores(full_fn(rows), f_pos, n_neg, limit, positive=pos_fn(rows, cand),
                                     margin=float(kw["margin"]), generator=kw.get("generator"))

    def training_step(self, model: torch.nn.Module, batch: torch.Tensor,
                      generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The summed WARP loss of a batch of positive pairs (ids into the training pairs)."""
        t = self._t
        m = unwrap(model)
        X, n_img, table, margin = t["X"], t["n_img"], t["table"], float(self.margin)
        img, txt = t["pair_img"][batch], t["pair_text"][batch]
        captions = self.target == "captions"
        max_draws = int(self.max_draws or 0) or None
        kw = dict(margin=margin, draws_per_round=int(self.draws_per_round), max_draws=max_draws, generator=generator)
        with torch.no_grad():
            u, z = m(X[img], t["Y"][txt] if captions else txt)          # (B, P) each
            f_pos = (u * z).sum(1)
            T = m.text_matrix                                          # (P, q) or (P, Y)
            s = u @ T                                                  # text candidates: score = cand . s
            if captions:
                Y, ci = t["Y"], t["pair_img"]

                def score_t(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
                    return torch.bmm(Y[cand], s[rows].unsqueeze(2)).squeeze(2)

                if self.exclude_same_image:
                    def pos_t(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
                        return ci[cand] == img[rows].unsqueeze(1)
                else:
                    def pos_t(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
                        return cand == txt[rows].unsqueeze(1)

                if isinstance(Y, SparseRows):
                    def full_t(rows: torch.Tensor) -> torch.Tensor:
                        return Y.scores(s[rows])
                else:
                    def full_t(rows: torch.Tensor) -> torch.Tensor:
                        return s[rows] @ Y.T
                budget = max(1024, (1 << 22) // Y.shape[1])
            else:
                Tt, keys, n_lab = T.T, t["keys"], t["n_text"]

                def score_t(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
                    return torch.bmm(Tt[cand], u[rows].unsqueeze(2)).squeeze(2)

                def pos_t(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
                    return torch.isin(img[rows].unsqueeze(1) * n_lab + cand, keys)

                def full_t(rows: torch.Tensor) -> torch.Tensor:
                    return s[rows]
                budget = max(1024, (1 << 22) // T.shape[0])
            d_t = self._draw(f_pos, t["n_text"], t["n_neg_text"][batch], score_t, pos_t, full_t, budget, kw)
            both = self._trains_both()
            if both:
                w = z @ m.V                                             # (B, p): image candidates score x . w

                def score_i(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
                    return torch.bmm(X[cand], w[rows].unsqueeze(2)).squeeze(2)

                if captions:
                    def pos_i(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
                        return cand == img[rows].unsqueeze(1)
                else:
                    def pos_i(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
                        return torch.isin(cand * t["n_text"] + txt[rows].unsqueeze(1), t["keys"])

                def full_i(rows: torch.Tensor) -> torch.Tensor:
                    return X.scores(w[rows])
                d_i = self._draw(f_pos, n_img, t["n_neg_img"][batch], score_i, pos_i, full_i,
                                 max(1024, (1 << 22) // X.shape[1]), kw)
        # the differentiable part, through the (possibly DDP-wrapped) model: one forward for every row used
        b = len(batch)
        neg_t = d_t.negative.clamp(min=0)
        x_rows = [X[img]] + ([X[d_i.negative.clamp(min=0)]] if both else [])
        t_rows = [t["Y"][txt], t["Y"][neg_t]] if captions else [txt, neg_t]
        ex, et = model(torch.cat(x_rows), torch.cat(t_rows))
        u, z_pos, z_neg = ex[:b], et[:b], et[b:]
        f_pos = (u * z_pos).sum(1)
        i2t = warp_loss(f_pos, (u * z_neg).sum(1), d_t.n_draws, t["n_neg_text"][batch], d_t.violated, table, margin)
        terms = {"i2t": i2t.sum() / max(1, b), "violated": d_t.violated.float().mean(),
                 "draws": d_t.n_draws.float().mean()}
        loss = i2t.sum()
        if both:
            t2i = warp_loss(f_pos, (ex[b:] * z_pos).sum(1), d_i.n_draws, t["n_neg_img"][batch], d_i.violated,
                            table, margin)
            loss = loss + t2i.sum()
            terms["t2i"] = t2i.sum() / max(1, b)
            terms["violated"] = 0.5 * (terms["violated"] + d_i.violated.float().mean())
        return {"loss": loss, **terms}

    def validation_score(self, val: MethodData) -> tuple[dict[str, Any], float]:
        """Validation metrics and the score that early stopping maximises (rsum for captions, the mAP of
        image -> label ranking for the label targets)."""
        if self.target == "captions":
            return super().validation_score(val)
        res = self.evaluate_labels(val)
        return res, float(res["mAP"])

    # ------------------------------------------------------------------ the learned matrices
    def _matrix(self, name: str) -> Any:
        self.check_is_fitted()
        live = getattr(self, "_live", None)
        if live is not None:
            return getattr(live[0], name)
        state = self.model_state_ or {}
        return state.get(name)

    @property
    def V_(self) -> Any:
        """``(P, p)``: the image map (a tensor while training, numpy afterwards)."""
        return self._matrix("V")

    @property
    def Z_(self) -> Any:
        """``(P, q)``: the caption map (captions target), else ``None``."""
        return self._matrix("Z")

    @property
    def W_(self) -> Any:
        """``(P, Y)``: the label embeddings (label targets), else ``None``."""
        return self._matrix("W")

    def load_state_dict(self, d: dict[str, Any]) -> "Wsabie":
        """Restore from :meth:`state_dict`; a finished model saved before WSABIE ran on the shared trainer
        (matrices ``V_`` / ``Z_`` / ``W_`` as learned attributes) loads too, for querying (not resuming). A
        state from before the centring (no ``center_``) stays uncentred, as its model was trained on
        uncentred rows."""
        state = dict(d.get("state") or {})
        if "V_" in state:
            mats = {k[0]: np.asarray(state.pop(k), dtype=np.float32) for k in ("V_", "Z_", "W_")
                    if state.get(k) is not None}
            V = mats["V"]
            state = {"model_spec_": {"dim": int(V.shape[0]), "image_dim": int(V.shape[1]),
                                     "text_dim": int(mats["Z"].shape[1]) if "Z" in mats else None,
                                     "n_labels": int(mats["W"].shape[1]) if "W" in mats else None},
                     "model_state_": mats, "label_names_": state.get("label_names_"),
                     "history_": state.get("history_", []), "epoch_": state.get("epoch_", 0),
                     "step_": state.get("step_", 0), "best_score_": state.get("best_score_", -math.inf),
                     "best_epoch_": state.get("best_epoch_", 0), "done_": True, "train_state_": None,
                     "best_state_": None, "bad_epochs_": 0}
            params = {k: v for k, v in (d.get("params") or {}).items()
                      if k in self.param_names() or k in self.RUN_SETTINGS}   # the seed: the stream (base)
            d = {**d, "params": params, "state": state}
        super().load_state_dict(d)
        if "center_" not in (d.get("state") or {}):
            vars(self).pop("center_", None)
        return self

    # ------------------------------------------------------------------ label ranking
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

    def label_scores(self, data: MethodData) -> np.ndarray:
        """``(n_images, n_labels) float32``: ``f_l(x) = (V x) . W_l`` of every image of ``data`` and label
        (label targets), columns in ``label_names_`` order; the label baselines (``wknn``, ``svm``) have the
        same call."""
        self._require_labels()
        return np.ascontiguousarray(self.encode_images(data) @ self.encode_labels().T, dtype=np.float32)

    # ------------------------------------------------------------------ inference
    def _require_labels(self) -> None:
        self.check_is_fitted()
        if self.W_ is None:
            raise CrossViewError("wsabie: this model was trained on captions (target 'captions'); it has no "
                                 "label embeddings")

    def embed_images(self, data: MethodData) -> np.ndarray:
        """``(n_images, P)``: ``V x`` of every image (both directions use it)."""
        x = self._rows(data.require_image_features("wsabie"), "image")
        V = _np(self.V_)
        if x.shape[1] != V.shape[1]:
            raise CrossViewError(f"wsabie: the model expects {V.shape[1]}-d image features, the "
                                 f"{data.name or 'given'} data has {x.shape[1]}-d; use the image encoder it "
                                 "was trained with")
        return x @ V.T

    def embed_texts(self, data: MethodData) -> np.ndarray:
        """``(n_captions, P)``: ``Z y`` of every caption; for the label targets, the mean of the
        embeddings of the labels each caption names (zero when it names none)."""
        if self.Z_ is not None:
            text = data.require_text_features("wsabie", sparse=True)
            if is_sparse(text):
                return self._embed_sparse_texts(text, data)
            y = self._rows(text, "text")
            Z = _np(self.Z_)
            if y.shape[1] != Z.shape[1]:
                raise CrossViewError(f"wsabie: the model expects {Z.shape[1]}-d caption features, the "
                                     f"{data.name or 'given'} data has {y.shape[1]}-d; use the text encoder it "
                                     "was trained with")
            return y @ Z.T
        labels = self.encode_labels()
        name_words = [words(n) for n in self.label_names_]
        out = np.zeros((data.n_captions, labels.shape[1]), dtype=np.float32)
        for j, cap in enumerate(data.captions):
            ids = mentioned(words(cap), name_words)
            if ids:
                out[j] = labels[ids].mean(axis=0)
        return out

    def _embed_sparse_texts(self, text: Any, data: MethodData) -> np.ndarray:
        """``Z y`` of sparse caption rows (centred and normalised as in training), a block of rows at a time."""
        Z = torch.as_tensor(_np(self.Z_))
        if text.shape[1] != Z.shape[1]:
            raise CrossViewError(f"wsabie: the model expects {Z.shape[1]}-d caption features, the "
                                 f"{data.name or 'given'} data has {text.shape[1]}-d; use the text encoder it "
                                 "was trained with")
        out = np.empty((text.shape[0], Z.shape[0]), dtype=np.float32)
        step = max(1, (32 << 20) // (4 * max(1, Z.shape[0])))      # ~32 MB of output rows a block
        for a in range(0, text.shape[0], step):
            out[a:a + step] = self._sparse_text_rows(text[a:a + step], "cpu").embed(Z).numpy()
        return out

    def encode_labels(self) -> np.ndarray:
        """``(Y, P) float32``: the label embeddings ``W_l`` (label targets), rows in ``label_names_`` order."""
        self._require_labels()
        return np.ascontiguousarray(_np(self.W_).T)
