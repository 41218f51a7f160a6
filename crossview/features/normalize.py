"""Feature normalisation: a recorded, fitted choice of the feature spec, applied before any method.

Frozen CNN features of real photos are far from what the linear methods assume: a few channels carry most
of the energy and the rows' norms vary with the image. Normalising them first is worth a large part of the
accuracy on real photos (``bench/results/defaults_flickr8k.md``). The choices:

- ``none``: the features as extracted;
- ``l2``: each row scaled to unit length;
- ``ssr``: signed square root of every value, then ``l2`` (power normalisation: damps the channels that
  dominate pooled CNN activations; Perronnin et al. 2010, Jegou et al. 2012);
- ``center``: the training mean subtracted, then ``l2`` (a centred cosine);
- ``whiten``: PCA-whitening fitted on the training rows (the components that explain 99% of the variance,
  each scaled to unit variance), then ``l2``.

``center`` and ``whiten`` learn from the training split only, so no test row leaks into them; their state
(mean, projection) is saved in the run's checkpoint, and queries (new image files, typed sentences) get the
very same transform. The feature cache keeps the raw features: normalising is cheap and applied after it.

``l2`` and ``ssr`` do not centre, and stay so: they are per-row maps with no training state (which is what
keeps a query's transform and its explanation exact), and a run's method sees them before its own
preprocessing. The methods whose cosine assumes centred rows centre on their training rows themselves: CCA,
BITR for a view that gets no PCA / CCA, and WSABIE (uncentred rows that share a large common direction, such
as pooled CNN features >= 0 or averaged GloVe vectors, have cosines near 1 and make hubs: issue 28,
``bench/hubness_centring.py``). ``center`` / ``whiten`` centre for any method.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.io import drop_pages, scratch_array
from crossview.core.rownorm import first_rows, norms_frozen, row_norms

__all__ = ["NORMS", "FeatureNorm", "check_norm", "normalize_features", "restore_normalized", "concat_blocks"]

NORMS = ("none", "l2", "ssr", "center", "whiten")


_EXPLAINED = 0.99


def check_norm(kind: Any, what: str = "normalisation") -> str:
    """``kind`` if it is one of :data:`NORMS`; a :class:`CrossViewError` naming the choices otherwise."""
    if kind not in NORMS:
        raise CrossViewError(f"{what} {kind!r} is not one of: {', '.join(NORMS)}")
    return str(kind)


#: Rows normalised at a time by :meth:`FeatureNorm.transform`.
_CHUNK_ROWS = 4096


def _l2(x: np.ndarray) -> np.ndarray:
    n = row_norms(np.linalg.norm(x, axis=1, keepdims=True))
    return x / np.maximum(n, 1e-12)


class FeatureNorm:
    """One normalisation of feature rows: ``FeatureNorm("whiten").fit(train_rows).transform(rows)``.

    ``transform`` maps ``(n, d)`` rows to ``(n, d')`` float32 rows (``d' = d`` except for ``whiten``).
    """

    def __init__(self, kind: str = "none") -> None:
        self.kind = check_norm(kind)
        self.mean_: np.ndarray | None = None
        self.proj_: np.ndarray | None = None

    @property
    def needs_fit(self) -> bool:
        return self.kind in ("center", "whiten")

    def fit(self, rows: Any) -> "FeatureNorm":
        """Learn the mean (and the whitening projection) from ``rows (n, d)``; a no-op for the others."""
        if not self.needs_fit:
            return self
        x = np.asarray(rows, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] < 2:
            raise CrossViewError(f"feature normalisation {self.kind!r} needs at least 2 training rows, "
                                 f"got shape {x.shape}")
        self.mean_ = x.mean(axis=0)
        if self.kind == "whiten":
            from sklearn.decomposition import PCA

            pca = PCA(n_components=_EXPLAINED, svd_solver="full", random_state=0).fit(x)
            scale = np.sqrt(np.maximum(pca.explained_variance_, 1e-12))
            self.proj_ = (pca.components_.T / scale).astype(np.float32)       # (d, k)
        return self

    def transform(self, rows: Any) -> Any:
        """The normalised rows, ``float32``. Sparse rows (TF-IDF captions, a scipy CSR matrix) stay sparse for the
        per-row norms (``none``, ``l2``, ``ssr``); ``center`` / ``whiten`` make every value non-zero, so they give
        dense rows (a chunk of rows densified at a time)."""
        if hasattr(rows, "tocsr") and hasattr(rows, "nnz"):
            return self._transform_sparse(rows.tocsr())
        x = np.asarray(rows, dtype=np.float32)
        if x.ndim != 2:
            raise CrossViewError(f"feature normalisation expects (rows, dims), got shape {x.shape}")
        if self.kind == "none":
            return x
        if self.needs_fit and self.mean_ is None:
            raise CrossViewError(f"feature normalisation {self.kind!r} is used before it was fitted")
        if self.mean_ is not None and x.shape[1] != self.mean_.shape[0]:
            raise CrossViewError(f"feature normalisation {self.kind!r} was fitted on {self.mean_.shape[0]}-d "
                                 f"features, got {x.shape[1]}-d ones")
        if norms_frozen() or x.shape[0] <= _CHUNK_ROWS:
            return self._transform_block(x)
        # a chunk of rows at a time into one float32 result: the temporaries stay ~tens of MB whatever the size; a
        # large result is file-backed (core.io.scratch_array): its pages leave the resident set as they are written
        # and once a step is done with them (the evaluation after training reads a few thousand of its rows)
        width = self.proj_.shape[1] if self.kind == "whiten" else x.shape[1]
        out = scratch_array((x.shape[0], width), np.float32)
        for start in range(0, x.shape[0], _CHUNK_ROWS):
            out[start:start + _CHUNK_ROWS] = self._transform_block(x[start:start + _CHUNK_ROWS])
            drop_pages(rows)        # cached features are memory-mapped: read once, they need not stay resident
            drop_pages(out)
        return out

    def _transform_sparse(self, x: Any) -> Any:
        if x.shape[1] and self.mean_ is not None and x.shape[1] != self.mean_.shape[0]:
            raise CrossViewError(f"feature normalisation {self.kind!r} was fitted on {self.mean_.shape[0]}-d "
                                 f"features, got {x.shape[1]}-d ones")
        x = x.astype(np.float32)            # a copy: the cached rows are read-only
        if self.kind == "none":
            return x
        if self.needs_fit:
            if self.mean_ is None:
                raise CrossViewError(f"feature normalisation {self.kind!r} is used before it was fitted")
            width = self.proj_.shape[1] if self.kind == "whiten" else x.shape[1]
            out = np.empty((x.shape[0], width), dtype=np.float32)
            for start in range(0, x.shape[0], _CHUNK_ROWS):
                out[start:start + _CHUNK_ROWS] = self._transform_block(x[start:start + _CHUNK_ROWS].toarray())
            return out
        if self.kind == "ssr":
            x.data = (np.sign(x.data) * np.sqrt(np.abs(x.data))).astype(np.float32)
        sq = np.asarray(x.multiply(x).sum(axis=1), dtype=np.float64).ravel()
        norms = np.maximum(np.sqrt(sq), 1e-12).astype(np.float32)
        x.data /= np.repeat(norms, np.diff(x.indptr))
        return x

    def _transform_block(self, x: np.ndarray) -> np.ndarray:
        """``transform`` of ``x (n, d) float32`` in one piece (an explanation's frozen norms need all the rows)."""
        if self.kind == "ssr":
            if norms_frozen():      # an explanation: each channel's scale held at the first (whole) row's
                d = np.sqrt(np.abs(first_rows(x)))
                x = np.where(d > 0, x / np.where(d > 0, d, 1.0), 0.0).astype(np.float32)
            else:
                x = np.sign(x) * np.sqrt(np.abs(x))
        elif self.kind == "center":
            x = x - self.mean_.astype(np.float32)
        elif self.kind == "whiten":
            assert self.proj_ is not None
            x = (x - self.mean_.astype(np.float32)) @ self.proj_
        return _l2(x).astype(np.float32, copy=False)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """``{"kind", "mean", "proj"}`` (arrays or ``None``): what a checkpoint keeps."""
        return {"kind": self.kind, "mean": self.mean_, "proj": self.proj_}

    @classmethod
    def from_state_dict(cls, state: Any) -> "FeatureNorm":
        """The norm a :meth:`state_dict` describes (checked: a run folder from elsewhere is data)."""
        if not isinstance(state, dict):
            raise CrossViewError("checkpoint: feature normalisation state must be a mapping; the run is damaged")
        norm = cls(state.get("kind", "none"))
        for key, attr in (("mean", "mean_"), ("proj", "proj_")):
            value = state.get(key)
            if value is not None:
                arr = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
                if not np.issubdtype(arr.dtype, np.floating) or arr.ndim != (1 if key == "mean" else 2):
                    raise CrossViewError(f"checkpoint: feature normalisation {key!r} has shape {arr.shape} / "
                                         f"dtype {arr.dtype}; the run is damaged")
                setattr(norm, attr, arr)
        if norm.needs_fit and norm.mean_ is None or norm.kind == "whiten" and norm.proj_ is None:
            raise CrossViewError(f"checkpoint: feature normalisation {norm.kind!r} has no fitted state; "
                                 "the run is damaged")
        return norm

    def __repr__(self) -> str:
        return f"FeatureNorm({self.kind!r})"


def normalize_features(features: Any, image_norm: str, text_norm: str, train_images: Any,
                       train_captions: Any) -> tuple[Any, dict[str, Any]]:
    """``(features', states)``: ``features`` (a :class:`crossview.features.Features`) with both matrices
    normalised, the norms fitted on rows ``train_images`` / ``train_captions``, and ``image_transform`` /
    ``text_transform`` set so that new queries get the same transform; ``states`` is what the checkpoint
    keeps (``{"image": FeatureNorm.state_dict(), "text": ...}``)."""

    from crossview.data.dataset import take_rows

    img, txt = FeatureNorm(image_norm), FeatureNorm(text_norm)
    if img.needs_fit:       # the training rows are gathered only for a norm that learns from them
        img.fit(take_rows(np.asarray(features.image), np.asarray(train_images, dtype=np.int64)))
    if features.text is not None and txt.needs_fit:
        rows = np.asarray(train_captions, dtype=np.int64)
        text = features.text
        txt.fit(text.tocsr()[rows].toarray() if hasattr(text, "tocsr") else take_rows(np.asarray(text), rows))
    return _with_norms(features, img, txt), {"image": img.state_dict(), "text": txt.state_dict()}


def restore_normalized(features: Any, states: Any) -> Any:
    """``features`` normalised by the fitted norms a checkpoint recorded (see :func:`normalize_features`);
    runs saved before normalisation existed (no states) are returned as they are."""
    if not states:
        return features
    if not isinstance(states, dict):
        raise CrossViewError("checkpoint: feature normalisation states must be a mapping; the run is damaged")
    img = FeatureNorm.from_state_dict(states.get("image") or {"kind": "none"})
    txt = FeatureNorm.from_state_dict(states.get("text") or {"kind": "none"})
    return _with_norms(features, img, txt)


def _with_norms(features: Any, img: FeatureNorm, txt: FeatureNorm) -> Any:
    import dataclasses

    if img.kind == "none" and txt.kind == "none":
        return features
    return dataclasses.replace(
        features,
        image=img.transform(features.image),
        text=None if features.text is None else txt.transform(features.text),
        image_transform=None if img.kind == "none" else img.transform,
        text_transform=None if txt.kind == "none" else txt.transform,
        spec={**(features.spec or {}), "norm": {"image": img.kind, "text": txt.kind}})


def concat_blocks(blocks: Any) -> np.ndarray:
    """Feature blocks of the same rows, each L2-normalised per row, concatenated and scaled by ``1/sqrt(k)``.

    ``blocks``: ``k`` arrays ``(n, d_j)``; returns ``(n, sum d_j) float32`` whose ``j``-th block has norm
    ``1/sqrt(k)`` in every row (0 for a row that is all zeros in that block, e.g. a caption with no known word for
    TF-IDF), so a row with no empty block has unit norm. Per-block unit norms keep one block from dominating the
    other by its scale alone (a 1280-d pooled CNN feature has norms in the tens, MiniLM rows have norm 1): the
    dot product of two rows is the mean of their blocks' cosines. Stateless, per row: a query goes through it
    exactly as the dataset's rows did, and the cache can keep each block separately.
    """
    arrays = [np.asarray(b, dtype=np.float32) for b in blocks]
    if not arrays:
        raise CrossViewError("concat_blocks needs at least one feature block")
    n = arrays[0].shape[0]
    for j, a in enumerate(arrays):
        if a.ndim != 2 or a.shape[0] != n:
            raise CrossViewError(f"feature block {j} has shape {a.shape}; every block must be (n, d) with the "
                                 f"same n = {n} rows")
    scale = 1.0 / np.sqrt(len(arrays))
    out = []
    for a in arrays:
        norms = np.linalg.norm(a.astype(np.float64), axis=1, keepdims=True)
        out.append((a / np.where(norms > 0, norms, 1.0) * scale).astype(np.float32))
    return np.concatenate(out, axis=1)
