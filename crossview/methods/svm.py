"""One-vs-rest linear SVMs, the BITR paper's baseline for image <-> phrase and image <-> label retrieval (paper
001, Experiments 3 and 4; Cristianini & Shawe-Taylor 2000).

One binary linear SVM per label on the image features: label ``l``'s positives are the training images that
have it, every other labelled training image is a negative, and

    min_{w_l, b_l}  1/2 (|w_l|^2 + b_l^2) + C sum_i max(0, 1 - y_il (w_l . x_i + b_l))

(scikit-learn's :class:`~sklearn.svm.LinearSVC` with ``loss="hinge"``, solved in the dual by liblinear; its
intercept is regularised like a weight, ``intercept_scaling=1``). ``score(x, l) = w_l . x + b_l``: Im2Text ranks
a row of these scores, Text2Im ranks the images by one label's column. A label with no positive training image
gets ``w_l = 0, b_l = -1`` (every image scores -1: what the hinge loss reaches on negatives alone), one that
every training image has gets ``w_l = 0, b_l = +1``. Training images without labels are left out.

C: a fixed value (``C``, default 1: a few seconds for 2,000 images x 100 labels x 512-d), or chosen by k-fold
cross-validation (``c_grid``; ``"paper"`` = the paper's ``{1e-5, 1e-4, ..., 1e5}`` with ``cv_folds=5``; ``C="cv"``
is short for that): the training images are split into ``cv_folds`` folds (shuffled with the run's ``seed``),
every C of the grid is fitted on each fold's complement and scored by the Im2Text mAP of the held-out images, and
the C of the best mean is refitted on all of them (ties: the smaller C). The run's ``workers`` (``n_jobs``) threads
fit labels in parallel (liblinear releases the GIL). liblinear draws its coordinate order from one C-level random
generator that threads fitting at once share, so with more than one thread the weights may differ from a one-thread
fit in their fifth digit (the same seed in one thread is exactly reproducible).

The state is plain arrays: ``coef_ (n_labels, p) float32``, ``intercept_ (n_labels,) float32``, ``label_names_``,
``C_`` (the C used) and, after cross-validation, ``cv_grid_`` / ``cv_scores_`` (mean held-out mAP per C).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.events import Event, Log, Progress, Validation
from crossview.methods import register_method
from crossview.methods._cgrid import PAPER_C_GRID, c_grid_values
from crossview.methods._labels import LabelMethod, sets_to_csr
from crossview.methods.base import MethodData

__all__ = ["SVM", "PAPER_C_GRID", "parse_c_grid"]



def parse_c_grid(value: Any) -> tuple[float, ...]:
    """``c_grid`` as a sorted tuple of positive floats (:func:`crossview.methods._cgrid.c_grid_values`)."""
    return c_grid_values(value, "svm")


def _fit_label(X: np.ndarray, y: np.ndarray, C: float, max_iter: int, seed: int) -> tuple[np.ndarray, float, bool]:
    """``(w (p,), b, stopped at max_iter)`` of one label's SVM; ``y (n,) bool``."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.svm import LinearSVC

    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == len(y):
        return np.zeros(X.shape[1]), (1.0 if n_pos else -1.0), False
    clf = LinearSVC(loss="hinge", dual=True, C=C, max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y.astype(np.int64))
    return clf.coef_[0], float(clf.intercept_[0]), bool(np.max(clf.n_iter_) >= max_iter)


@register_method("svm")
class SVM(LabelMethod):
    """One linear SVM per label (see the module docstring for the objective, the constant labels and C's
    cross-validation).

    Parameters:
        target: what a label is: ``"label_sets"``, ``"labels"`` (class labels) or ``"tags"``.
        C: the hinge loss's weight, used when ``c_grid`` is not set; ``"cv"`` = ``c_grid="paper"``.
        c_grid: values of C to choose from by cross-validation (``"paper"``, ``"LOW:HIGH"``, a list), or None.
        cv_folds: folds of that cross-validation (the paper: 5).
        normalize: ``"l2"`` (unit-norm image rows, the paper's CTR setting) or ``"none"``.
        max_iter: liblinear's passes per label (labels that reach it are counted in the log).

    Run settings it reads (not parameters): ``workers`` (``n_jobs``: threads fitting labels in parallel, default 1)
    and ``seed`` (folds and liblinear's coordinate order).

    Learned: ``coef_``, ``intercept_``, ``label_names_``, ``C_``, ``cv_grid_``, ``cv_scores_``, ``n_train_``,
    ``n_not_converged_``.
    """

    # Not centred before the L2 (unlike BITR and WSABIE): a linear SVM with an intercept scores
    # w . (x - m) + b = w . x + b' whatever the common mean m, and each label's column is ranked on its own
    # scale, so the shared direction of uncentred rows cannot make a hub the way it does in a cosine.
    iterative = False
    default_workers = 1      # threads fitting labels unless the run says otherwise
    validation_note = ("The one-vs-rest SVMs are fitted once (C by cross-validation on the training split when "
                       "c_grid is set, with each C's score in the log); val P@K and mAP are reported after fitting.")

    def __init__(self, *, target: str = "label_sets", C: Any = 1.0, c_grid: Any = None, cv_folds: int = 5,
                 normalize: str = "l2", max_iter: int = 1000) -> None:
        self.target = target
        self.C = C
        self.c_grid = c_grid
        self.cv_folds = cv_folds
        self.normalize = normalize
        self.max_iter = max_iter

    # ------------------------------------------------------------------ parameters
    def _grid(self) -> tuple[float, ...]:
        if isinstance(self.C, str) and self.C.strip().lower() == "cv" and self.c_grid is None:
            return PAPER_C_GRID
        return parse_c_grid(self.c_grid)

    def _check_params(self) -> tuple[float, ...]:
        self._check_common()
        grid = self._grid()
        if not grid:
            try:
                C = float(self.C)
            except (TypeError, ValueError):
                C = float("nan")
            if isinstance(self.C, bool) or not (math.isfinite(C) and C > 0):
                raise CrossViewError(f"svm: C must be a positive number or 'cv' (five-fold cross-validation over "
                                     f"1e-5 ... 1e5, as the paper), got {self.C!r}")
        for name, lo in (("cv_folds", 2), ("max_iter", 1), ("workers", 1)):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
                raise CrossViewError(f"svm: {name} must be a whole number >= {lo}, got {v!r}")
        return grid

    def selection_info(self, train_split: str, val_split: str | None) -> list[dict[str, str]]:
        """C is chosen by ``cv_folds``-fold cross-validation of the training images when a grid is given."""
        return [{"what": "C", "on": f"{train_split}-cv{int(self.cv_folds)}"}] if self._grid() else []

    # ------------------------------------------------------------------ training
    def _fit_all(self, X: np.ndarray, Y: np.ndarray, C: float, what: str, done: int,
                 total: int, out: dict[str, Any]) -> Iterator[Event]:
        """Fit every label's SVM on ``X (n, p) float64`` / ``Y (n, L) bool``, yielding ``Progress`` per chunk of
        labels; ``out`` gets ``coef (L, p)``, ``intercept (L,)``, ``not_converged``."""
        from joblib import Parallel, delayed

        L = Y.shape[1]
        coef = np.zeros((L, X.shape[1]), dtype=np.float32)
        intercept = np.zeros(L, dtype=np.float32)
        bad = 0
        jobs, seed, max_iter = int(self.workers), int(self.seed), int(self.max_iter)
        chunk = 4 * jobs
        with Parallel(n_jobs=jobs, prefer="threads") as parallel:
            for start in range(0, L, chunk):
                stop = min(L, start + chunk)
                if jobs == 1:
                    res = [_fit_label(X, Y[:, j], C, max_iter, seed) for j in range(start, stop)]
                else:
                    res = parallel(delayed(_fit_label)(X, Y[:, j], C, max_iter, seed) for j in range(start, stop))
                for j, (w, b, stopped) in zip(range(start, stop), res):
                    coef[j], intercept[j] = w, b
                    bad += int(stopped)
                yield Progress(done + stop, total, f"svm: {what}")
        out.update(coef=coef, intercept=intercept, not_converged=bad)

    def fit_iter(self, train: MethodData, val: MethodData | None = None, *,
                 resume: bool = False) -> Iterator[Event]:
        """Fit (``resume`` is ignored: the fit is refitted), yielding ``Progress`` per chunk of labels, a ``Log``
        per C of the cross-validation and at the end, and, with ``val``, a ``Validation`` event of its label P@K /
        mAP both ways."""
        from crossview.eval.protocols import label_retrieval_metrics

        grid = self._check_params()
        X32, sets, names, dropped = self._training_sets(train)
        n, L = len(X32), len(names)
        X = np.ascontiguousarray(X32, dtype=np.float64)
        indptr, indices = sets_to_csr(sets)
        Y = np.zeros((n, L), dtype=bool)
        Y[np.repeat(np.arange(n), np.diff(indptr)), indices] = True
        folds: list[tuple[np.ndarray, np.ndarray]] = []
        if grid:
            if n < int(self.cv_folds):
                raise CrossViewError(f"svm: {self.cv_folds}-fold cross-validation of C needs at least {self.cv_folds} "
                                     f"labelled training images, got {n}; lower cv_folds or set C")
            rng = np.random.default_rng(int(self.seed))
            perm = rng.permutation(n)
            folds = [(np.sort(np.setdiff1d(perm, held)), np.sort(held))
                     for held in np.array_split(perm, int(self.cv_folds))]
        total = (len(grid) * len(folds) + 1) * L
        yield Progress(0, total, "svm: fitting")
        done = 0
        scores: list[float] = []
        for C in grid:
            fold_maps = []
            for f, (tr, te) in enumerate(folds):
                out: dict[str, Any] = {}
                yield from self._fit_all(X[tr], Y[tr], C, f"C = {C:g}, fold {f + 1}/{len(folds)}", done, total, out)
                done += L
                s = X[te] @ out["coef"].T.astype(np.float64) + out["intercept"]
                fold_maps.append(label_retrieval_metrics(s, Y[te], ks=())["i2t"]["mAP"])
            scores.append(float(np.mean(fold_maps)))
            yield Log(f"svm: C = {C:g}: mean held-out i2t mAP {scores[-1]:.2f} over {len(folds)} folds")
        C_best = float(grid[int(np.argmax(scores))]) if grid else float(self.C)
        out = {}
        yield from self._fit_all(X, Y, C_best, f"C = {C_best:g}, all {n} images", done, total, out)
        self.coef_, self.intercept_ = out["coef"], out["intercept"]
        self.label_names_ = list(names)
        self.C_ = C_best
        self.cv_grid_ = np.asarray(grid, dtype=np.float64)
        self.cv_scores_ = np.asarray(scores, dtype=np.float64)
        self.n_train_ = int(n)
        self.n_not_converged_ = int(out["not_converged"])
        constant = int((~Y.any(axis=0)).sum() + Y.all(axis=0).sum())
        bad = self.n_not_converged_
        notes = [f"{dropped} unlabelled training image(s) left out" if dropped else "",
                 f"{constant} label(s) with one class only get a constant score" if constant else "",
                 f"{bad} label(s) stopped at max_iter {self.max_iter}" if bad else ""]
        chosen = f"C = {C_best:g}" + (f" (best of {len(grid)} by {len(folds)}-fold cross-validation)" if grid else "")
        yield Log(f"svm ({self.target}): {L} one-vs-rest SVMs on {n} images, {chosen}"
                  + "".join(f"; {t}" for t in notes if t),
                  "warning" if bad else "info")
        metrics = self._validation(val)
        if metrics is not None:
            yield Validation(0, metrics)

    # ------------------------------------------------------------------ scoring
    def _feature_dim(self) -> int:
        return int(np.asarray(self.coef_).shape[1])

    def _scores_of(self, X: np.ndarray) -> np.ndarray:
        W = np.asarray(self.coef_, dtype=np.float32)
        b = np.asarray(self.intercept_, dtype=np.float32)
        return X @ W.T + b
