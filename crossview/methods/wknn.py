"""Weighted k-nearest-neighbour label transfer (wKNN), the BITR paper's baseline for image <-> phrase and
image <-> label retrieval (paper 001, Experiments 3 and 4: "similar to [4]", TagProp, Guillaumin et al. 2009).

Fitting stores the labelled training images (their normalised feature rows and label sets). For a query image
``x`` with similarities ``s_j = sim(x, x_j)`` to the training images:

- its neighbours ``N(x)`` are the ``k`` training images of highest similarity (all of them when fewer);
- neighbour ``j`` gets the weight ``w_j = exp(s_j / T) / sum_{j' in N(x)} exp(s_j' / T)`` (TagProp's
  distance-based weights, ``pi_ij ~ exp(-d(i, j))``, with one fixed scale ``T = temperature`` instead of a
  learned metric; ``T -> infinity`` is plain majority voting over the ``k`` neighbours);
- ``score(x, label) = sum_{j in N(x) having label} w_j``, the weighted fraction of the neighbourhood that has
  the label: in ``[0, 1]``, and the weights of one image sum to 1 so the scores of different images are on one
  scale (Text2Im ranks the images of a label by the same score column).

Similarity: ``normalize="l2"`` (default) is the cosine ``x . x_j / (|x| |x_j|)``; ``"none"`` is
``-|x - x_j|^2 / 2`` on the features as given (the run's ``--image-norm`` still applies first). On unit-norm
features the two differ by a constant per query, so they give the same weights. Training images without
labels are not stored (an unannotated image says nothing about which labels are absent). Unlike the other
methods, wKNN compares the query with the training *images* at test time, as the paper notes.

The state is plain arrays: ``train_features_ (n, p) float32``, the label sets as CSR rows
(``label_indptr_ (n + 1,)``, ``label_indices_ (nnz,)`` int64) and ``label_names_``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.events import Event, Log, Progress, Validation
from crossview.methods import register_method
from crossview.methods._labels import LabelMethod, sets_to_csr
from crossview.methods.base import MethodData

__all__ = ["WKNN"]

#: score this many similarity entries (query rows x training images) at a time (64 MB of float32)
_CHUNK_ELEMENTS = 1 << 24


@register_method("wknn")
class WKNN(LabelMethod):
    """Weighted kNN label transfer (see the module docstring for the formulas).

    Parameters:
        target: what a label is: ``"label_sets"`` (the images' label sets / phrases), ``"labels"`` (their class
            label), ``"tags"``.
        k: neighbours per query image (capped at the number of labelled training images).
        temperature: ``T`` of the weights ``exp(sim / T)``, in units of the similarity (cosine for
            ``normalize="l2"``); smaller = the nearest neighbours count more.
        normalize: ``"l2"`` (cosine similarity) or ``"none"`` (minus half the squared Euclidean distance).

    Learned: ``train_features_``, ``label_indptr_``, ``label_indices_``, ``label_names_``, ``n_train_``.
    """

    # Not centred before the cosine (unlike BITR and WSABIE), measured: on the demo the run's --image-norm center
    # instead of ssr lowers val i2t mAP 63.4 -> 60.8 (labels), 28.7 -> 24.3 (label_sets), 80.0 -> 79.8 (tags),
    # at the default k and T (T is in cosine units, and centred cosines spread wider). The option stays there.
    iterative = False
    validation_note = ("wKNN has nothing to train (it stores the training images), so there is nothing to validate "
                       "per epoch; its val P@K and mAP are reported once, after fitting.")

    def __init__(self, *, target: str = "label_sets", k: int = 50, temperature: float = 0.05,
                 normalize: str = "l2") -> None:
        self.target = target
        self.k = k
        self.temperature = temperature
        self.normalize = normalize

    # ------------------------------------------------------------------ training
    def _check_params(self) -> None:
        self._check_common()
        if not isinstance(self.k, (int, np.integer)) or isinstance(self.k, bool) or self.k < 1:
            raise CrossViewError(f"wknn: k must be a whole number >= 1 (neighbours per image), got {self.k!r}")
        t = self.temperature
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t <= 0:
            raise CrossViewError(f"wknn: temperature must be a positive number (e.g. 0.05 for cosine "
                                 f"similarities), got {t!r}")

    def fit_iter(self, train: MethodData, val: MethodData | None = None, *,
                 resume: bool = False) -> Iterator[Event]:
        """Store the labelled training images (``resume`` is ignored: fitting is a copy), yielding ``Progress``,
        a ``Log`` and, with ``val``, a ``Validation`` event of its label P@K / mAP both ways."""
        self._check_params()
        yield Progress(0, 1, "wknn: storing the training images")
        X, sets, names, dropped = self._training_sets(train)
        indptr, indices = sets_to_csr(sets)
        self.train_features_ = np.ascontiguousarray(X, dtype=np.float32)
        self.label_indptr_, self.label_indices_ = indptr, indices
        self.label_names_ = list(names)
        self.n_train_ = int(len(X))
        yield Progress(1, 1, "wknn: done")
        k = min(int(self.k), self.n_train_)
        note = f"; {dropped} unlabelled training image(s) left out" if dropped else ""
        cap = f" (k capped from {self.k})" if k < self.k else ""
        yield Log(f"wknn ({self.target}): {self.n_train_} training images, {len(names)} labels, k = {k}{cap}, "
                  f"T = {self.temperature}, {'cosine' if self.normalize == 'l2' else 'Euclidean'} similarity{note}")
        metrics = self._validation(val)
        if metrics is not None:
            yield Validation(0, metrics)

    # ------------------------------------------------------------------ scoring
    def _feature_dim(self) -> int:
        return int(self.train_features_.shape[1])

    def _label_matrix(self) -> Any:
        import scipy.sparse as sp

        n, L = int(self.train_features_.shape[0]), len(self.label_names_)
        indices = np.asarray(self.label_indices_, dtype=np.int64)
        return sp.csr_matrix((np.ones(len(indices), dtype=np.float64), indices,
                              np.asarray(self.label_indptr_, dtype=np.int64)), shape=(n, L))

    def neighbours(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ids (m, k) int64, weights (m, k) float64)``: the neighbours of normalised image rows ``X (m, p)``
        among the training images and their weights (each row sums to 1), nearest first."""
        T = self.train_features_
        n = T.shape[0]
        k = min(int(self.k), n)
        half_sq = 0.5 * np.einsum("ij,ij->i", T, T, dtype=np.float64).astype(np.float32) \
            if self.normalize == "none" else None
        ids = np.empty((len(X), k), dtype=np.int64)
        weights = np.empty((len(X), k), dtype=np.float64)
        step = max(1, _CHUNK_ELEMENTS // max(1, n))
        for start in range(0, len(X), step):
            S = X[start:start + step] @ T.T                          # (m, n) similarities
            if half_sq is not None:
                S -= half_sq      # -|x - t|^2 / 2 up to the query's own -|x|^2 / 2, which the weights ignore
            idx = np.argpartition(-S, k - 1, axis=1)[:, :k] if k < n else np.broadcast_to(np.arange(n), S.shape)
            s = np.take_along_axis(S, idx, axis=1).astype(np.float64)
            order = np.argsort(-s, axis=1, kind="stable")
            idx, s = np.take_along_axis(idx, order, axis=1), np.take_along_axis(s, order, axis=1)
            w = np.exp((s - s[:, :1]) / float(self.temperature))
            ids[start:start + step] = idx
            weights[start:start + step] = w / w.sum(axis=1, keepdims=True)
        return ids, weights

    def _scores_of(self, X: np.ndarray) -> np.ndarray:
        import scipy.sparse as sp

        Y = self._label_matrix()
        n = int(self.train_features_.shape[0])
        out = np.zeros((len(X), len(self.label_names_)), dtype=np.float32)
        step = max(1, _CHUNK_ELEMENTS // max(1, n))
        for start in range(0, len(X), step):
            ids, w = self.neighbours(X[start:start + step])
            m, k = ids.shape
            W = sp.csr_matrix((w.ravel(), ids.ravel(), np.arange(0, m * k + 1, k)), shape=(m, n))
            out[start:start + m] = (W @ Y).toarray()
        return out
