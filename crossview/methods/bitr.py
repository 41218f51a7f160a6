"""BITR: Bilateral Image-Text Retrieval with a structural SVM (paper 001, Verma & Jawahar).

Score ``F(x, y) = x^T W y`` with ``W (p, q)``, i.e. ``w . (x (x) y)`` over the tensor-product joint
feature, which is never materialised. Training solves the n-slack structural SVM with margin rescaling::

    min_W  1/2 ||W||_F^2 + C/N sum_i xi_i
    s.t.   x_i^T W y_i >= x_i^T W y + Delta(y_i, y) - xi_i      for all i and all outputs y

in its equivalent 1-slack form (Joachims, Finley & Yu 2009, Algorithm 4): each cutting-plane iteration
finds every sample's most violated output, adds ONE averaged constraint
``<W, A> >= b - xi`` with ``A = 1/N sum_i x_i (y_i - y^_i)^T (p, q)`` and ``b = 1/N sum_i Delta(y_i, y^_i)``,
and re-solves the small dual QP over the working set (:mod:`crossview.methods._qp`) with the Gram
matrix ``G_jk = <A_j, A_k>_F``. Im2Text and Text2Im are two separate models (for Text2Im the roles of
image and caption swap). Inference is one matrix product: ``s = (x^T W) Y`` (section 5.2).

Losses (eq. 5-7): ``Delta_M = ||y_i - y||_1``, ``Delta_E = ||y_i - y||_2^2``, ``Delta_C = 1 - y_i . y``.
Outputs live on the unit sphere (L2-normalised features) or on the probability simplex (L1-normalised,
non-negative features such as LDA topics). Most violated constraints ``argmax_y Delta(y_i, y) + c_i . y``
with ``c_i = W^T x_i``:

- sphere, C: ``normalise(c_i - y_i)``; sphere, E: ``normalise(c_i - 2 y_i)`` (closed forms);
- simplex (any of the three): the best vertex ``e_k`` (a convex function is maximised at a vertex);
- sphere, M: no closed form. ``||y_i - y||_1 = max_{s in {-1,1}^q} s . (y_i - y)``, so we alternate
  ``y <- normalise(c_i - s)`` and ``s <- sign(y_i - y)`` from several starts. This is projected
  subgradient ascent with an infinite step (``y <- P(g)``, ``g = c_i + sign(y - y_i)``), which never
  decreases a convex objective on the sphere;
- finite: ``y`` ranges over a candidate set (the training outputs); one matrix product per chunk.

Three modules, along the seams: :mod:`crossview.methods._bitr_losses` (the losses and the most-violated
search, plain functions: torch tensors or numpy arrays in, the same kind out),
:mod:`crossview.methods._bitr_trainer` (the cutting-plane trainer :class:`CuttingPlaneTrainer`) and this
one (the registered method and its cross-validation of C); the names of the first two are re-exported here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from crossview.core.errors import CrossViewError
from crossview.core.linalg import cca_transform, column_mean, is_sparse, to_dense
from crossview.methods import register_method
from crossview.methods._cgrid import PAPER_C_GRID, c_grid_values
from crossview.methods._bitr_losses import (DOMAINS, LOSSES, _check_loss, _one_blas_thread, delta, delta_matrix,
                                            hinge_terms, most_violated, most_violated_finite, normalize_rows,
                                            primal_objective, vertex_losses)
from crossview.methods._bitr_trainer import CuttingPlaneTrainer, IterationInfo
from crossview.methods.base import Method, MethodData, check_direction

__all__ = [
    "LOSSES", "DOMAINS", "normalize_rows", "delta", "delta_matrix", "vertex_losses", "most_violated",
    "most_violated_finite", "hinge_terms", "primal_objective", "CuttingPlaneTrainer", "IterationInfo",
    "Bitr", "PAPER_C_GRID", "parse_c_grid", "cv_folds",
]

#: How BITR reduces its input features (the ``reduce`` parameter): ``cca`` projects both views on the top
#: ``cca_dim`` canonical directions of the training pairs, ``pca`` reduces each view wider than ``pca_dim``.
REDUCTIONS = ("auto", "pca", "cca", "ctr")
#: The CCA of ``reduce="cca"``: relative ridge and correlation weighting (CCA's defaults on real photos when BITR's
#: were chosen; CCA's own reg has since moved to 12, tune_cca_bitr_flickr8k.md; BITR's C was re-chosen with this 5).
CCA_REG = 5.0
CCA_WEIGHT_POWER = 0.5

#: What a run trains BITR on (the ``representation`` parameter): the encoders' features, or paper 001's
#: TR / CTR, built and fitted on the training split by the run (crossview.features.topics).
REPRESENTATIONS = ("features", "tr", "ctr")


# ------------------------------------------------------------------------------ the registered method
def parse_c_grid(value: Any) -> tuple[float, ...]:
    """``c_grid`` as a sorted tuple of positive floats (:func:`crossview.methods._cgrid.c_grid_values`)."""
    return c_grid_values(value, "BITR")


def cv_folds(n_images: int, k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``k`` ``(train, test)`` image folds of BITR's cross-validation (a caption stays with its image):
    scikit-learn's ``KFold`` over a permutation drawn by ``default_rng(seed)``, the same partition as
    :func:`crossview.engine.splits.fold_splits` (not imported: methods sit below the engine)."""
    from sklearn.model_selection import KFold

    perm = np.random.default_rng(int(seed)).permutation(int(n_images))
    return [(np.sort(perm[tr]), np.sort(perm[te])) for tr, te in KFold(n_splits=int(k)).split(perm)]


def _pca_fit(a: np.ndarray, dim: int) -> dict[str, np.ndarray]:
    """Principal axes of ``a (n, d)``: ``{"mean": (d,), "components": (dim, d)}`` (float32).

    From the ``n x n`` Gram matrix when there are fewer rows than columns, else from the top ``dim``
    eigenvectors of the ``d x d`` covariance (both exact; only the cost differs).
    """
    with _one_blas_thread():
        return _pca_fit_inner(a, dim)


def _pca_fit_inner(a: np.ndarray, dim: int) -> dict[str, np.ndarray]:
    import scipy.linalg

    a64 = np.asarray(a, dtype=np.float64)
    n, d = a64.shape
    mean = a64.mean(axis=0)
    z = a64 - mean
    k = min(dim, d)
    if n < d:
        vals, vecs = np.linalg.eigh(z @ z.T)
        order = np.argsort(vals)[::-1][:k]
        comps = (z.T @ vecs[:, order]).T
        comps /= np.maximum(np.linalg.norm(comps, axis=1, keepdims=True), 1e-300)
        # directions beyond the rank of a small sample carry no variance: keep them orthonormal anyway
        keep = vals[order] > 1e-12 * max(vals.max(), 1e-300)
        comps = comps[keep]
    else:
        vals, vecs = scipy.linalg.eigh(z.T @ z, subset_by_index=[d - k, d - 1])
        comps = vecs[:, ::-1].T
    # a deterministic sign for each axis
    signs = np.sign(comps[np.arange(comps.shape[0]), np.abs(comps).argmax(axis=1)])
    signs[signs == 0] = 1
    return {"mean": mean.astype(np.float32), "components": (comps * signs[:, None]).astype(np.float32)}


#: paper 001's CTR step when BITR does it itself (``representation="ctr"``): a CCA of the training pairs over all
#: the topic dimensions, unweighted, with CTR's ridge (:func:`crossview.features.topics.representation_features`)
CTR_REG = 0.1


def fit_preprocessing(image: np.ndarray, text: np.ndarray, caption_image: np.ndarray, *, reduction: str,
                      cca_dim: int, pca_dim: int, normalize: str, loss: str) -> dict[str, dict[str, Any]]:
    """What BITR does to its input features before the structured SVM, fitted on these training rows only:
    ``{"pca": {mod: {"mean", "components"} | None}, "norm": {mod: "l2" | "l1" | "none"}, "domain": {mod: "sphere" |
    "simplex"}, "center": {mod: (d,) | None}}`` for ``mod`` in image / text.

    ``image (n_images, p)``, ``text (n_captions, q)`` and ``caption_image (n_captions,)`` are the training split;
    ``reduction`` is ``"cca"`` (both views on the top ``cca_dim`` canonical directions of the pairs, weighted by
    corr ** 0.5), ``"ctr"`` (paper 001's CTR: the CCA over all dimensions, unweighted), or ``"pca"`` (each view
    wider than ``pca_dim`` by its own PCA). The CCAs learn from the pairs, so the cross-validation of C refits
    this function inside every fold on the fold's training rows (:func:`_cv_job`)."""
    pca_of: dict[str, Any] = {}
    cca = None
    if reduction in ("cca", "ctr") and (cca_dim or reduction == "ctr"):
        # One training pair per caption (images repeated), as the CCA method does. "cca": dimension k weighted
        # by corr_k ** 0.5 (CCA_REG, CCA_WEIGHT_POWER: bench/results/defaults_flickr8k.md); the
        # structured SVM then learns W on top of that space.
        # fit_cca_pairs: the images enter once, weighted by their caption counts (never repeated per caption)
        from crossview.core.linalg import fit_cca_pairs

        X = np.asarray(image, dtype=np.float32)
        Y = text if is_sparse(text) else np.asarray(text, dtype=np.float32)     # TF-IDF stays sparse
        ci = np.asarray(caption_image)
        if reduction == "ctr":
            res = fit_cca_pairs(X, Y, ci, int(min(X.shape[1], Y.shape[1])), CTR_REG)
            w = np.ones_like(np.asarray(res.correlations, dtype=np.float64))
        else:
            res = fit_cca_pairs(X, Y, ci, int(cca_dim), CCA_REG)
            w = np.power(np.maximum(res.correlations, 0), CCA_WEIGHT_POWER)
        cca = {"image": {"mean": res.x_mean.astype(np.float32), "components": (res.x_proj * w).T.astype(np.float32)},
               "text": {"mean": res.y_mean.astype(np.float32), "components": (res.y_proj * w).T.astype(np.float32)}}
    state: dict[str, dict[str, Any]] = {"pca": {}, "norm": {}, "domain": {}, "center": {}}
    for mod, a in (("image", image), ("text", text)):
        # sparse captions (TF-IDF) stay sparse through the CCA; a PCA or a centring needs them dense
        a = a if is_sparse(a) and cca is not None else to_dense(a) if is_sparse(a) else np.asarray(a)
        pca = None
        if cca is not None:
            pca = cca[mod]
        elif pca_dim and a.shape[1] > pca_dim:
            pca = _pca_fit(a, int(pca_dim))
        pca_of[mod] = pca
        if normalize == "paper":
            # the paper: L1 for the M loss on topic features (probability distributions), L2 otherwise
            is_dist = pca is None and a.size and a.min() >= 0 and np.allclose(a.sum(axis=1), 1.0, atol=1e-3)
            norm = "l1" if (_check_loss(loss) == "M" and is_dist) else "l2"
        else:
            norm = normalize
        state["pca"][mod] = pca
        state["norm"][mod] = norm
        state["domain"][mod] = "simplex" if norm == "l1" else "sphere"
        # PCA and CCA subtract their mean; a view that gets neither (narrower than pca_dim, e.g. GloVe-50
        # captions) would be put on the sphere around the origin, where rows that share a large common
        # direction all have cosines near 1 and a few captions top every list (issue 28: one caption in
        # 31 of 100 top-5 lists). Centred first, the cosine compares what differs between rows. Not for
        # l1: the simplex needs the non-negative distributions as they are.
        state["center"][mod] = (column_mean(a).astype(np.float32)
                                if pca is None and norm == "l2" and len(a) else None)
    return state


def apply_preprocessing(state: dict[str, dict[str, Any]], a: np.ndarray, mod: str) -> np.ndarray:
    """Features of modality ``mod`` as the model sees them (:func:`fit_preprocessing`'s ``state``): PCA / CCA
    (if fitted), else minus the training mean (if fitted: checkpoints from before the centring have none), then
    normalised. ``(n, d) -> (n, d') float32``."""
    sparse = is_sparse(a)
    if not sparse:
        a = np.asarray(a, dtype=np.float32)
    pca = state["pca"].get(mod)
    center = (state.get("center") or {}).get(mod)
    fitted = pca["components"] if pca is not None else center
    d = None if fitted is None else fitted.shape[-1]
    if d is not None and a.ndim == 2 and a.shape[1] != d:
        raise CrossViewError(f"BITR: the model was trained on {d}-d {mod} features, these are "
                             f"{a.shape[1]}-d; use the same {mod} encoder as for training")
    if pca is not None:
        # a chunk of rows at a time (no centred copy of the whole matrix, 0.9 GB of image rows at COCO size);
        # sparse rows are never centred: (a - mean) P^T = a P^T - mean P^T
        a = cca_transform(a, pca["mean"], pca["components"].T, normalize=False)
    elif sparse:
        a = to_dense(a) if center is None else to_dense(a) - center
    elif center is not None:
        a = a - center
    return normalize_rows(a, state["norm"][mod], what=f"{mod} features")


def _resolve_device(device: str) -> torch.device:
    from crossview.core.devices import torch_device  # auto | cpu | cuda[:n] | mps, checked

    return torch_device(device)


def _direction_problem(direction: str, img: np.ndarray, txt: np.ndarray, caption_image: np.ndarray,
                       outputs: str, max_candidates: int, seed: int) -> dict[str, Any]:
    """Inputs, outputs and (finite variant) candidates of one direction's structural SVM.

    Im2Text: every caption is a sample ``(x = its image, y = the caption)``; candidates are training
    captions, those of the sample's own image excluded. Text2Im swaps the roles: ``(x = caption,
    y = its image)``, candidates are the training images.
    """
    ci = np.asarray(caption_image, dtype=np.int64)
    if direction == "i2t":
        X, Y = img[ci], txt
        cands, cand_group = txt, ci
    else:
        X, Y = txt, img[ci]
        cands, cand_group = img, np.arange(img.shape[0], dtype=np.int64)
    prob: dict[str, Any] = {"X": X, "Y": Y}
    if outputs == "train":
        if cands.shape[0] > max_candidates:
            pick = np.sort(np.random.default_rng(seed).choice(cands.shape[0], max_candidates, replace=False))
            cands, cand_group = cands[pick], cand_group[pick]
        prob.update(candidates=cands, cand_group=cand_group, true_group=ci)
    return prob


def _cv_job(job: dict[str, Any]):
    """One cross-validation job: a fold of one direction over the whole C grid (ascending, warm-started:
    the working set's cutting planes stay valid for every C). A generator yielding ``IterationInfo``;
    its return value is ``{C: {"score", "R@1", "R@5", "R@10", "MedR", "iterations"}}``."""
    from crossview.eval import metrics as M

    d = job["direction"]
    img, txt, ci = job["img"], job["txt"], job["caption_image"]
    tr_img, te_img = job["train_images"], job["test_images"]
    tr_mask = np.isin(ci, tr_img)
    te_mask = np.isin(ci, te_img)
    remap = np.full(img.shape[0], -1, dtype=np.int64)
    remap[tr_img] = np.arange(len(tr_img))
    tr_ci = remap[ci[tr_mask]]
    remap_te = np.full(img.shape[0], -1, dtype=np.int64)
    remap_te[te_img] = np.arange(len(te_img))
    te_ci = remap_te[ci[te_mask]]
    # the raw features: the preprocessing (its CCA learns from pairs) is fitted on this fold's training rows
    # only, so the held-out fold that scores C never shaped the space C is chosen in
    prep = fit_preprocessing(img[tr_img], txt[tr_mask], tr_ci, **job["prep"])
    img_tr, txt_tr = apply_preprocessing(prep, img[tr_img], "image"), apply_preprocessing(prep, txt[tr_mask], "text")
    img_te, txt_te = apply_preprocessing(prep, img[te_img], "image"), apply_preprocessing(prep, txt[te_mask], "text")
    prob = _direction_problem(d, img_tr, txt_tr, tr_ci, job["outputs"], job["max_candidates"], job["seed"])
    job = {**job, "trainer": {**job["trainer"], "domain": prep["domain"]["text" if d == "i2t" else "image"]}}
    trainer = None
    results: dict[float, dict[str, float]] = {}
    for C in job["c_grid"]:
        if trainer is None:
            trainer = CuttingPlaneTrainer(prob.pop("X"), prob.pop("Y"), C=C, **prob, **job["trainer"])
        else:
            trainer.set_C(C)
        for info in trainer.run():
            yield info
        W = trainer.solution.astype(np.float32)
        if d == "i2t":
            ranks = M.i2t_ranks((img_te @ W) @ txt_te.T, te_ci)
        else:
            ranks = M.t2i_ranks(img_te @ (txt_te @ W).T, te_ci)
        m = M.rank_metrics(ranks)
        results[C] = {"score": m["R@1"] + m["R@5"] + m["R@10"], "R@1": m["R@1"], "R@5": m["R@5"],
                      "R@10": m["R@10"], "MedR": m["MedR"], "iterations": float(trainer.iteration),
                      "converged": float(trainer.converged)}
    return results


class _SharedArray:
    """A job's large array handed to a worker process as a file: ``.npy`` (memory-mapped by every worker, one copy
    in the page cache) or ``.npz`` for a sparse matrix. A job then pickles to a few hundred bytes: a pickled
    array went through the pool's pipe whole (twice the features per job), and a cancelled run's pool feeder
    thread stayed blocked for good writing one to a worker that had been killed."""

    def __init__(self, folder: str, name: str, a: Any) -> None:
        import os

        self.sparse = is_sparse(a)
        self.path = os.path.join(folder, name + (".npz" if self.sparse else ".npy"))
        if self.sparse:
            import scipy.sparse as sp

            sp.save_npz(self.path, a.tocsr(), compressed=False)
        else:
            np.save(self.path, np.asarray(a), allow_pickle=False)

    def load(self) -> Any:
        if self.sparse:
            import scipy.sparse as sp

            return sp.load_npz(self.path)
        return np.load(self.path, mmap_mode="r", allow_pickle=False)


def _cv_job_process(job: dict[str, Any]) -> tuple[str, int, dict[float, dict[str, float]]]:
    """:func:`_cv_job` drained in a worker process (one torch thread per worker); its arrays read from their
    files (:class:`_SharedArray`)."""
    torch.set_num_threads(1)
    job = {k: v.load() if isinstance(v, _SharedArray) else v for k, v in job.items()}
    gen = _cv_job(job)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return job["direction"], job["fold"], stop.value


@register_method("bitr")
class Bitr(Method):
    """Bilateral Image-Text Retrieval (paper 001): two structural SVMs, ``x^T W y``, trained by 1-slack
    cutting planes. See the module docstring for the maths and ``models/bitr.toml`` for the card.

    Parameters:
        loss: ``"M"`` (Manhattan), ``"E"`` (squared Euclidean) or ``"C"`` (normalised correlation).
        C: the trade-off of eq. 3 when no ``c_grid`` is given.
        c_grid: values of C for k-fold cross-validation (each direction picks its own); empty: use ``C``.
            Accepts ``"paper"`` (10^-5 ... 10^5), ``"1e-3:1e3"`` or ``"0.1,1,10"``.
        cv_folds: folds of the cross-validation (by image).
        normalize: ``"l2"`` (outputs on the unit sphere), ``"l1"`` (on the probability simplex; needs
            non-negative features) or ``"paper"`` (the paper's rule: L1 for the M loss on topic features,
            i.e. rows that are distributions, L2 otherwise). Not ``"paper"`` by default: with exact
            loss-augmented inference the simplex's most violated output is a vertex, and then every W
            has hinge ``>= 2 - 2 |y_i|^2`` while W = 0 has ``2 - 2 min_k y_ik``; with diffuse topic
            vectors that leaves almost nothing to learn (measured on the Flickr8k TR features: retrieval
            at chance). On the sphere, or with ``outputs="train"``, the same loss learns.
        reduce: ``"cca"`` (both views projected on the top ``cca_dim`` canonical directions of the training
            pairs, weighted by corr ** 0.5), ``"pca"`` (each view wider than ``pca_dim`` reduced by its own PCA,
            as the paper does), ``"ctr"`` (paper 001's CTR step: the CCA of the pairs over all dimensions,
            unweighted, ridge :data:`CTR_REG`: BITR on TR features with ``reduce="ctr"`` is BITR on CTR) or
            ``"auto"``: cca on the encoders' features (best on real photos: bench/results/defaults_flickr8k.md),
            pca on TR, ctr for ``representation="ctr"``. Every reduction is refitted inside each fold of the
            cross-validation of C.
        cca_dim: canonical directions kept by ``reduce="cca"``; 0 keeps the features as they are.
        pca_dim: features wider than this are reduced by PCA fitted on the training split (the paper
            reduces CNN features to 128-d); 0 keeps them.
        outputs: ``"continuous"`` (y ranges over the sphere / simplex: closed forms) or ``"train"``
            (y ranges over the training captions / images: the finite variant).
        max_candidates: at most this many candidates in the finite variant (a fixed random subset).
        epsilon: stopping tolerance (the model ends within ``C * epsilon`` of the optimum).
        max_iter: cutting-plane iteration limit per model.
        line_search: OCAS line search (same optimum, far fewer iterations at large C); False is
            Joachims et al.'s plain 1-slack algorithm.
        inactive_limit: iterations with zero dual weight before a constraint leaves the working set.
        mv_starts, mv_steps: starts and steps of projected subgradient ascent (M loss on the sphere).
        representation: what a run (:mod:`crossview.engine.run`) trains on: ``"features"`` (the run's
            image and text encoders), ``"tr"`` (paper 001's topic representation: LDA topics of visual
            words, i.e. k-means clusters of the backbone's local descriptors, and of caption words) or
            ``"ctr"`` (TR projected by a CCA fitted on the training pairs). The run fits the
            representation on its training split and keeps it in the checkpoint, so queries with new
            images and sentences go through it (:func:`crossview.features.topics.representation_features`).
            :meth:`fit` on given :class:`MethodData` uses the features it is given.
        n_topics: LDA topics per modality for ``tr`` / ``ctr`` (the paper's 100).
        n_words: visual words (k-means centres) for ``tr`` / ``ctr`` (the paper's 1000).

    Run settings it reads (:class:`~crossview.core.run_settings.RunSettings`, not parameters): ``device`` for the
    large products, ``seed`` (folds, random starts, candidate subset, TR) and ``workers`` (``n_jobs``: processes
    for the cross-validation jobs, folds x directions; default 1).
    """

    directions_differ = True
    iterative = True
    default_workers = 1      # processes for the cross-validation jobs unless the run says otherwise
    #: chosen on real photos (bench/results/defaults_flickr8k.md): ssr image features, reduce="cca" to 64-d; C 10
    #: (bench/results/tune_cca_bitr_flickr8k.md at e4ccff0, on today's default features and scoring: 3-fold CV of
    #: train +10.9 over the former C 1000, 95% interval +5.8 to +15.9; val once 407.4 -> 422.0)
    default_image_norm = "ssr"
    #: chosen by 3-fold CV on the Flickr8k sample's training photos (bench/results/rich_features_flickr8k.md): both
    #: backbones, flip-averaged, and MiniLM + TF-IDF captions, CV rsum at C 10 250.5 -> 305.3 (paired +54.8, 95%
    #: interval +44.5 to +65.2; +40.8 to +68.6 widened for the 6 variants compared); val 335.8 -> 391.2. Not for TR /
    #: CTR.
    default_image_encoder = "efficientnet_lite0+mobilenet_v2:flip"
    default_text_encoder = "minilm+tfidf"
    has_epoch_validation = False
    validation_note = ("BITR validates by k-fold cross-validation of C on the training split when c_grid is "
                       "set (the chosen C and the score of each C are in the log), not per iteration.")

    def __init__(self, *, loss: str = "C", C: float = 10.0, c_grid: Any = None, cv_folds: int = 5,
                 normalize: str = "l2", reduce: str = "auto", cca_dim: int = 64,
                 pca_dim: int = 128, outputs: str = "continuous",
                 max_candidates: int = 5000, epsilon: float = 1e-3, max_iter: int = 1000,
                 line_search: bool = True, inactive_limit: int = 50, mv_starts: int = 8, mv_steps: int = 30,
                 representation: str = "features", n_topics: int = 100,
                 n_words: int = 1000) -> None:
        self.loss = loss
        self.C = C
        self.c_grid = c_grid
        self.cv_folds = cv_folds
        self.normalize = normalize
        self.reduce = reduce
        self.cca_dim = cca_dim
        self.pca_dim = pca_dim
        self.outputs = outputs
        self.max_candidates = max_candidates
        self.epsilon = epsilon
        self.max_iter = max_iter
        self.line_search = line_search
        self.inactive_limit = inactive_limit
        self.mv_starts = mv_starts
        self.mv_steps = mv_steps
        self.representation = representation
        self.n_topics = n_topics
        self.n_words = n_words

    # ------------------------------------------------------------------ parameters
    def _check_params(self) -> tuple[float, ...]:
        _check_loss(self.loss)
        if self.reduce not in REDUCTIONS:
            raise CrossViewError(f"BITR: reduce must be one of {', '.join(REDUCTIONS)} (auto = cca on the encoders' "
                                 f"features, pca on TR / CTR), got {self.reduce!r}")
        if self.normalize not in ("l2", "l1", "paper"):
            raise CrossViewError(f"BITR: normalize must be 'l2', 'l1' or 'paper', got {self.normalize!r}")
        if self.representation not in REPRESENTATIONS:
            raise CrossViewError(f"BITR: representation must be one of {', '.join(REPRESENTATIONS)} "
                                 f"(features = the run's encoders, tr = topics of visual and caption words, "
                                 f"ctr = tr projected by CCA), got {self.representation!r}")
        if self.outputs not in ("continuous", "train"):
            raise CrossViewError(f"BITR: outputs must be 'continuous' (closed forms over the sphere / simplex) "
                                 f"or 'train' (the training captions / images), got {self.outputs!r}")
        try:
            C = float(self.C)
        except (TypeError, ValueError):
            C = float("nan")
        if not (math.isfinite(C) and C > 0):
            raise CrossViewError(f"BITR: C must be a positive number, got {self.C!r}; the paper searches 1e-5 ... 1e5")
        for name, lo in (("cv_folds", 2), ("workers", 1), ("max_iter", 1), ("max_candidates", 2),
                         ("mv_starts", 1), ("mv_steps", 1), ("inactive_limit", 1), ("pca_dim", 0), ("cca_dim", 0),
                         ("n_topics", 1), ("n_words", 2)):
            v = getattr(self, name)
            if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= lo):
                raise CrossViewError(f"BITR: {name} must be an integer >= {lo}, got {v!r}")
        if not (isinstance(self.epsilon, (int, float)) and self.epsilon > 0):
            raise CrossViewError(f"BITR: epsilon must be a positive number, got {self.epsilon!r}; default 1e-3")
        return parse_c_grid(self.c_grid)

    def selection_info(self, train_split: str, val_split: str | None) -> list[dict[str, str]]:
        """C is chosen by ``cv_folds``-fold cross-validation of the training images when ``c_grid`` is given."""
        return [{"what": "C", "on": f"{train_split}-cv{int(self.cv_folds)}"}] if parse_c_grid(self.c_grid) else []

    def feature_representation(self) -> dict[str, Any] | None:
        """What the run's features are to be (:func:`crossview.features.topics.representation_request`):
        ``None`` for the encoders' features, else the TR / CTR settings."""
        self._check_params()
        if self.representation == "features":
            return None
        # CTR is TR followed by a CCA of the training pairs: BITR fits that CCA itself (reduction "ctr"), so the
        # cross-validation of C can refit it inside each fold instead of choosing C on a CCA that saw every fold
        return {"name": "tr", "n_topics": int(self.n_topics), "n_words": int(self.n_words), "seed": int(self.seed)}

    def _trainer_kwargs(self, device: torch.device) -> dict[str, Any]:
        return {"loss": self.loss, "epsilon": float(self.epsilon), "max_iter": int(self.max_iter),
                "inactive_limit": int(self.inactive_limit), "n_starts": int(self.mv_starts),
                "n_steps": int(self.mv_steps), "seed": int(self.seed), "device": device,
                "line_search": bool(self.line_search)}

    # ------------------------------------------------------------------ features
    def _reduction(self) -> str:
        """``"cca"``, ``"pca"`` or ``"ctr"``: ``reduce="auto"`` is CCA on the run's encoder features, PCA (the
        paper's) on TR; ``representation="ctr"`` is TR with paper 001's CTR step done here (:data:`CTR_REG`),
        so that the cross-validation of C refits that CCA inside each fold."""
        if self.representation == "ctr" or self.reduce == "ctr":
            return "ctr"
        if self.reduce != "auto":
            return self.reduce
        return "cca" if self.representation == "features" else "pca"

    def _preprocessing_settings(self) -> dict[str, Any]:
        return {"reduction": self._reduction(), "cca_dim": int(self.cca_dim), "pca_dim": int(self.pca_dim),
                "normalize": self.normalize, "loss": self.loss}

    def _fit_preprocessing(self, train: MethodData, text: np.ndarray) -> None:
        """Fit what :meth:`_prep` applies on the training rows only (:func:`fit_preprocessing`): the CCA or PCA
        of each view (``pca_``), the training mean of a view that gets neither (``center_``), the normalisation
        and output domain."""
        st = fit_preprocessing(train.image_features, text, train.caption_image, **self._preprocessing_settings())
        self.pca_, self.norm_, self.domain_, self.center_ = st["pca"], st["norm"], st["domain"], st["center"]

    def _prep(self, a: np.ndarray, mod: str) -> np.ndarray:
        """Features of modality ``mod`` as the model sees them (:func:`apply_preprocessing`)."""
        return apply_preprocessing({"pca": self.pca_, "norm": self.norm_, "center": getattr(self, "center_", {})},
                                   a, mod)

    # ------------------------------------------------------------------ training
    def fit_iter(self, train: MethodData, val: MethodData | None = None, *, resume: bool = False):
        """Cross-validate C (if ``c_grid``), then train the Im2Text and the Text2Im models.

        Yields a ``Loss`` (primal, dual, gap, violation, ...) and a ``Progress`` event every cutting-plane
        iteration, ``Log`` messages, and a ``Validation`` with both directions' metrics on ``val`` at the end.
        """
        from crossview.core.events import Log, Loss, Progress, Validation

        grid = self._check_params()
        dev = _resolve_device(str(self.device))
        text = train.require_text_features("bitr", sparse=True)
        if train.n_images < 2 or train.n_captions < 2:
            raise CrossViewError(f"BITR needs at least 2 images and 2 captions to train, the "
                                 f"{train.name or 'training'} data has {train.n_images} and {train.n_captions}")
        prog = getattr(self, "progress_", None) if resume else None
        if prog is not None and prog.get("phase") == "done":
            yield Log("bitr: the loaded state has already finished training", "info")
            return
        if prog is None:
            self._fit_preprocessing(train, text)
            prog = {"phase": "cv" if grid else "train", "cv": {}, "direction": None, "trainer": None, "step": 0}
            self.W_, self.C_, self.n_iter_, self.converged_ = {}, {}, {}, {}
            self.cv_ = None
        else:
            for mod, a in (("image", train.image_features), ("text", text)):
                pca = self.pca_[mod]
                d = pca["components"].shape[1] if pca is not None else None
                if d is not None and a.shape[1] != d:
                    raise CrossViewError(f"bitr: cannot resume: the checkpoint expects {d}-d {mod} features, "
                                         f"got {a.shape[1]}-d; resume with the features of the original run")
        self.progress_ = prog
        img = self._prep(train.image_features, "image")
        txt = self._prep(text, "text")
        ci = train.caption_image
        if not resume or prog["step"] == 0:
            yield Log(f"bitr (loss {self.loss}, outputs {self.outputs}): {train.n_captions} pairs, image "
                      f"features {img.shape[1]}-d ({self.norm_['image']}), text {txt.shape[1]}-d "
                      f"({self.norm_['text']}), device {dev}", "info")

        if prog["phase"] == "cv":
            yield from self._cross_validate(grid, np.asarray(train.image_features, dtype=np.float32),
                                            text if is_sparse(text) else np.asarray(text, dtype=np.float32), ci, dev)
            prog["phase"] = "train"
        for di, d in enumerate(("i2t", "t2i")):
            if d in self.W_:
                continue
            C = float(self.C_.get(d, self.C))
            self.C_[d] = C
            prob = _direction_problem(d, img, txt, ci, self.outputs, int(self.max_candidates), int(self.seed))
            domain = self.domain_["text" if d == "i2t" else "image"]
            trainer = CuttingPlaneTrainer(prob.pop("X"), prob.pop("Y"), C=C, domain=domain, **prob,
                                          **self._trainer_kwargs(dev))
            if prog["direction"] == d and prog["trainer"] is not None:
                trainer.load_state_dict(prog["trainer"])
            prog["direction"] = d
            self._trainer = trainer
            for info in trainer.run():
                prog["step"] += 1
                yield Loss(prog["step"], di, info.terms())
                yield Progress(trainer.iteration, int(self.max_iter),
                               f"{d} iteration {trainer.iteration}: gap {info.gap:.4g}, violation "
                               f"{info.violation:.3g} (stops at {self.epsilon:g})")
            self.W_[d] = trainer.solution.astype(np.float32)
            self.n_iter_[d] = trainer.iteration
            self.converged_[d] = trainer.converged
            self._trainer = None
            prog["direction"], prog["trainer"] = None, None
            last = trainer.history[-1] if trainer.history else {}
            if trainer.converged:
                yield Log(f"bitr {d}: converged after {trainer.iteration} iterations (C = {C:g}, primal "
                          f"{last.get('primal', float('nan')):.6g}, dual {last.get('dual', float('nan')):.6g})")
            else:
                yield Log(f"bitr {d}: stopped at max_iter = {self.max_iter} before reaching epsilon = "
                          f"{self.epsilon:g} (violation {last.get('violation', float('nan')):.3g}); raise max_iter "
                          "or epsilon", "warning")
            # this direction's problem and trainer (its per-caption copy of the image rows among them) go before
            # the next direction builds its own: at COCO size the two overlapped at the start of t2i (the peak)
            prob = trainer = None       # noqa: F841
        prog["phase"] = "done"
        # the projected training rows are not needed to score val: let them go first, or they and the scoring
        # blocks peak together (~370 MB at COCO size with the last trainer)
        img = txt = None       # noqa: F841
        if val is not None and val.text_features is not None and val.n_images > 0:
            res = self.evaluate(val)
            res.pop("ranks", None)
            yield Validation(0, res)

    def _cross_validate(self, grid: tuple[float, ...], img: np.ndarray, txt: np.ndarray, ci: np.ndarray,
                        dev: torch.device):
        """Choose C per direction by k-fold cross-validation of the training images. ``img`` / ``txt`` are the
        raw training features: each fold fits the preprocessing on its own training rows (:func:`_cv_job`)."""
        from crossview.core.events import Log, Loss, Progress

        k = int(self.cv_folds)
        n_img = img.shape[0]
        if n_img < k:
            raise CrossViewError(f"BITR: {k}-fold cross-validation needs at least {k} training images, "
                                 f"there are {n_img}; lower cv_folds or give a fixed C (c_grid empty)")
        folds = cv_folds(n_img, k, int(self.seed))
        base = self._trainer_kwargs(torch.device("cpu") if int(self.workers) > 1 else dev)
        jobs = []
        for d in ("i2t", "t2i"):
            for f in range(k):
                key = f"{d}/{f}"
                if key in self.progress_["cv"]:
                    continue
                tr, te = folds[f]
                jobs.append({"key": key, "direction": d, "fold": f, "img": img, "txt": txt, "caption_image": ci,
                             "train_images": tr, "test_images": te, "c_grid": grid, "outputs": self.outputs,
                             "max_candidates": int(self.max_candidates), "seed": int(self.seed),
                             "prep": self._preprocessing_settings(), "trainer": dict(base)})
        total = 2 * k
        yield Log(f"bitr: choosing C by {k}-fold cross-validation over {len(grid)} values "
                  f"({grid[0]:g} ... {grid[-1]:g}), {len(jobs)} jobs, {int(self.workers)} process(es); each fold "
                  f"fits the {self._reduction().upper()} preprocessing on its own training rows")
        if int(self.workers) <= 1:
            for job in jobs:
                gen = _cv_job(job)
                it = 0
                while True:
                    try:
                        info = next(gen)
                    except StopIteration as stop:
                        self.progress_["cv"][job["key"]] = stop.value
                        break
                    it += 1
                    yield Loss(self.progress_["step"], -1, {**info.terms(), "cv_fold": float(job["fold"])})
                    yield Progress(len(self.progress_["cv"]), total, f"cross-validation {job['key']}: "
                                   f"iteration {it}, gap {info.gap:.4g}")
        else:
            import concurrent.futures as cf
            import tempfile

            # loky's executor (bundled with joblib): the concurrent.futures API, plus a documented
            # shutdown(kill_workers=True) that stops the workers of a cancelled run at once (the standard
            # executor can only wait for running jobs, which take minutes here)
            from joblib.externals.loky import ProcessPoolExecutor

            tmp = tempfile.TemporaryDirectory(prefix="crossview-bitr-cv-", ignore_cleanup_errors=True)
            try:
                shared = {k: _SharedArray(tmp.name, k, a)
                          for k, a in (("img", img), ("txt", txt), ("caption_image", ci))}
            except OSError as e:
                tmp.cleanup()
                raise CrossViewError(f"BITR: cannot write the features for the cross-validation's worker processes "
                                     f"to {tmp.name} ({e.strerror or e}); free space there, point TMPDIR at a disk "
                                     "with room, or set n_jobs=1") from None
            jobs = [{**job, **shared} for job in jobs]
            ex = ProcessPoolExecutor(max_workers=int(self.workers))
            try:
                # at most one job per worker in the pool at a time: a job waiting in loky's queues when the pool
                # is killed (a cancelled run) made its manager thread fail (KeyError in add_call_item_to_queue)
                # and leave the call queue's feeder thread waiting for good
                queue = list(jobs)
                pending: set[Any] = set()
                while pending or queue:
                    while queue and len(pending) < int(self.workers):
                        pending.add(ex.submit(_cv_job_process, queue.pop(0)))
                    done, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
                    for fut in done:
                        d, f, res = fut.result()
                        self.progress_["cv"][f"{d}/{f}"] = res
                    yield Progress(len(self.progress_["cv"]), total,
                                   f"cross-validation: {len(self.progress_['cv'])} of {total} jobs done")
            finally:
                ex.shutdown(wait=True, kill_workers=True)
                tmp.cleanup()
        table: dict[str, dict[float, dict[str, float]]] = {}
        for d in ("i2t", "t2i"):
            rows = [self.progress_["cv"][f"{d}/{f}"] for f in range(k)]
            table[d] = {C: {m: float(np.mean([r[C][m] for r in rows])) for m in rows[0][C]} for C in grid}
            best = max(grid, key=lambda C: (table[d][C]["score"], -C))
            self.C_[d] = best
            yield Log(f"bitr {d}: cross-validation picks C = {best:g} (mean R@1+R@5+R@10 "
                      f"{table[d][best]['score']:.2f}); "
                      + ", ".join(f"{C:g}: {table[d][C]['score']:.1f}" for C in grid))
        self.cv_ = {"grid": list(grid), "folds": k,
                    "table": {d: {repr(C): v for C, v in t.items()} for d, t in table.items()}}

    # ------------------------------------------------------------------ inference
    def encode_images(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """i2t: ``W^T x`` ``(n_images, q)``; t2i: the normalised image features ``(n_images, p)``."""
        check_direction(direction)
        self._require(direction)
        x = self._prep(data.image_features, "image")
        return np.ascontiguousarray(x @ self.W_["i2t"]) if direction == "i2t" else x

    def encode_texts(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """i2t: the normalised caption features ``(n_captions, q)``; t2i: ``W'^T y`` ``(n_captions, p)``."""
        check_direction(direction)
        self._require(direction)
        y = self._prep(data.require_text_features("bitr", sparse=True), "text")
        return y if direction == "i2t" else np.ascontiguousarray(y @ self.W_["t2i"])

    def _require(self, direction: str) -> None:
        W = getattr(self, "W_", None)
        if not W or direction not in W:
            raise CrossViewError(f"BITR's {direction} model is not trained yet: call fit() or load a "
                                 "checkpoint of a finished run first")

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Parameters and learned state; while training, the live working set of the model in progress."""
        import copy

        d = super().state_dict()
        state = {k: copy.deepcopy(v) for k, v in d["state"].items()}
        tr = getattr(self, "_trainer", None)
        if tr is not None and "progress_" in state:
            state["progress_"]["trainer"] = tr.state_dict()
        d["state"] = state
        return d

    def load_state_dict(self, d: dict[str, Any]) -> "Bitr":
        """:meth:`Method.load_state_dict`; a state saved before the centring (no ``center_``) keeps its
        rows uncentred, as its W was learned on them, also when this object was fitted before."""
        super().load_state_dict(d)
        if "center_" not in (d.get("state") or {}):
            vars(self).pop("center_", None)
        return self
