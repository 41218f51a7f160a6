"""Regularised canonical correlation analysis (CCA), the BITR paper's baseline (Rasiwasia et al. 2010).

The closed-form solve (covariances, whitening, SVD) is :mod:`crossview.core.linalg`, shared with
BITR's CTR topic features; this module is the method: pairing captions with images, progress events,
matching and the saved state.

Matching is by normalised correlation (Rasiwasia et al.): the cosine of the projected, centred
features, optionally with dimension ``k`` weighted by ``corr_k ** p`` (Gong et al. 2014, ``p = 4``).
:meth:`CCA.encode_images` / :meth:`CCA.encode_texts` return the L2-normalised weighted projections,
so the score is their dot product.

With several captions per image (``pairs="captions"``) the image covariance is computed once per
image, weighted by its caption count, instead of once per caption.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from crossview.core.events import Event, Log, Progress, Validation
from crossview.core.errors import CrossViewError
from crossview.core.linalg import (cca_from_covariances, cca_transform, check_finite, column_mean, covariance_steps,
                                   cross_covariance, group_sums, is_sparse)
from crossview.methods import register_method
from crossview.methods.base import Method, MethodData, check_direction

__all__ = ["CCA"]


@register_method("cca")
class CCA(Method):
    """Regularised CCA with normalised-correlation (cosine) matching.

    Parameters:
        n_components: number of canonical directions ``d`` kept (capped at the feature dimensions).
        reg: ridge on each view's covariance, as a fraction of its average variance (0 = plain CCA).
        weight_power: weight canonical dimension k by ``corr_k ** weight_power`` before the cosine
            (0 = unweighted, Rasiwasia et al.; 4 = Gong et al.).
        pairs: ``"captions"`` (one training pair per caption, images repeated) or ``"images"``
            (one pair per image with the mean of its caption features).

    Learned: ``x_proj_ (p, d)``, ``y_proj_ (q, d)``, ``x_mean_ (p,)``, ``y_mean_ (q,)``,
    ``correlations_ (d,)``, ``n_train_`` (pairs fitted).
    """

    iterative = False
    has_epoch_validation = False
    validation_note = "CCA is closed-form: it fits once, so there is nothing to validate per epoch."

    #: chosen on real photos (bench/results/defaults_flickr8k.md): signed square root, then L2, on the
    #: CNN features; weight power 0.5. reg 12: re-examined on today's default features under the default scoring
    #: (bench/results/tune_cca_bitr_flickr8k.md at e4ccff0: 3-fold CV of train, reg 12 over the former 5 +7.0, 95%
    #: interval +1.9 to +12.3; val once 405.0 -> 414.8)
    default_image_norm = "ssr"
    #: chosen by 3-fold CV on the Flickr8k sample's training photos (bench/results/rich_features_flickr8k.md, plain
    #: dot products): both backbones, flip-averaged, CV rsum 291.6 -> 313.2 (paired +21.6, +14.5 to +28.6). Captions:
    #: MiniLM + TF-IDF wins there (323.5 with both backbones) but not under the default scoring (isoftmax 10,
    #: bench/results/text_encoder_cv_flickr8k.md: -2.2 against MiniLM + GloVe, -9.5 to +5.1, detectable 10.5), and
    #: GloVe's fit is ~10x faster
    default_image_encoder = "efficientnet_lite0+mobilenet_v2:flip"
    default_text_encoder = "minilm+glove"

    def __init__(self, n_components: int = 256, reg: float = 12.0, weight_power: float = 0.5,
                 pairs: str = "captions") -> None:
        self.n_components = n_components
        self.reg = reg
        self.weight_power = weight_power
        self.pairs = pairs

    # ------------------------------------------------------------------ training
    def _check_params(self) -> None:
        if not isinstance(self.n_components, (int, np.integer)) or self.n_components < 1:
            raise CrossViewError(f"cca: n_components must be a positive integer, got {self.n_components!r}")
        if not np.isfinite(self.reg) or self.reg < 0:
            raise CrossViewError(f"cca: reg must be a number >= 0 (e.g. 0.1), got {self.reg!r}")
        if self.pairs not in ("captions", "images"):
            raise CrossViewError(f"cca: pairs must be 'captions' or 'images', got {self.pairs!r}")

    def fit_iter(self, train: MethodData, val: MethodData | None = None, *,
                 resume: bool = False) -> Iterator[Event]:
        """Fit the closed form on ``train`` (``resume`` is ignored: refitting is cheap), yielding
        ``Progress`` per covariance chunk, then a ``Log`` with the top correlations and, with ``val``,
        a ``Validation`` event with its retrieval metrics."""
        self._check_params()
        text = train.require_text_features("cca", sparse=True)
        img = train.image_features
        ci = train.caption_image
        counts = np.bincount(ci, minlength=train.n_images).astype(np.float64)
        if self.pairs == "captions":
            weights: np.ndarray | None = counts
            t_rows = text
        else:
            has = counts > 0
            if not has.all():         # a copy of the image rows only when some image has no caption
                img = img[has]
            sums = group_sums(text, ci, train.n_images)[has]
            if is_sparse(sums):
                import scipy.sparse as sp
                t_rows = (sp.diags(1.0 / counts[has]) @ sums).astype(np.float32).tocsr()
            else:
                t_rows = (sums / counts[has, None]).astype(np.float32)
            ci = np.arange(img.shape[0])
            weights = None
        n = float(t_rows.shape[0])
        if n < 2:
            raise CrossViewError(f"cca needs at least 2 training pairs, got {int(n)} in the "
                                 f"{train.name or 'training'} data")

        total = img.shape[0] + t_rows.shape[0] + 2
        yield Progress(0, total, "cca: covariances")
        # means in float64 a chunk at a time: no float64 copy of the training matrices
        mx = column_mean(img, weights)
        my = column_mean(t_rows)
        # Image covariance once per image, weighted by its number of captions.
        Cxx = None
        for out in covariance_steps(img, mx, weights):
            if isinstance(out, np.ndarray):
                Cxx = out
            else:
                yield Progress(out, total, "cca: image covariance")
        Cyy = None
        for out in covariance_steps(t_rows, my, None):
            if isinstance(out, np.ndarray):
                Cyy = out
            else:
                yield Progress(img.shape[0] + out, total, "cca: text covariance")
        assert Cxx is not None and Cyy is not None
        # Cross covariance: sum over captions of (x_img - mx)(y - my)^T = (X - mx)^T (sum of the caption rows per
        # image) - (sum_i c_i (x_i - mx)) my^T, and the last sum is 0 (mx is the caption-weighted mean of the
        # images): the per-image sums need no centring, so sparse captions give sparse sums.
        ysum = group_sums(t_rows, ci, img.shape[0])
        Cxy = cross_covariance(img, ysum, mx, np.zeros(t_rows.shape[1]))
        check_finite(Cxx, Cyy, Cxy)
        yield Progress(total - 1, total, "cca: whitening and SVD")
        A, B, corr = cca_from_covariances(Cxx / (n - 1), Cyy / (n - 1), Cxy / (n - 1), self.n_components,
                                          self.reg)
        self.x_proj_, self.y_proj_, self.correlations_ = A, B, corr
        self.x_mean_, self.y_mean_ = mx, my
        self.n_train_ = int(n)
        yield Progress(total, total, "cca: done")
        top = ", ".join(f"{c:.3f}" for c in corr[:5])
        yield Log(f"cca: {len(corr)} directions from {int(n)} pairs; top correlations {top}")
        if val is not None and val.text_features is not None:
            res = self.evaluate(val)
            yield Validation(0, {"i2t": res["i2t"], "t2i": res["t2i"], "rsum": res["rsum"]})

    # ------------------------------------------------------------------ inference
    def encode_images(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """``(n_images, d) float32``: centred image features projected, weighted, L2-normalised."""
        check_direction(direction)
        self.check_is_fitted()
        self._check_dim(data.image_features, self.x_proj_, "image")
        return cca_transform(data.image_features, self.x_mean_, self.x_proj_, self.correlations_,
                             self.weight_power)

    def encode_texts(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """``(n_captions, d) float32``: centred caption features projected, weighted, L2-normalised."""
        check_direction(direction)
        self.check_is_fitted()
        text = data.require_text_features("cca", sparse=True)
        self._check_dim(text, self.y_proj_, "text")
        return cca_transform(text, self.y_mean_, self.y_proj_, self.correlations_, self.weight_power)

    @staticmethod
    def _check_dim(Z: np.ndarray, proj: np.ndarray, what: str) -> None:
        if Z.shape[1] != proj.shape[0]:
            raise CrossViewError(f"cca was fitted on {proj.shape[0]}-d {what} features but got "
                                 f"{Z.shape[1]}-d ones; use the same {what} encoder as for training")
