"""What the label baselines (``wknn``, ``svm``) share: the label vocabulary of a split, the image -> label score
matrix, image <-> label evaluation, and caption scoring through the labels a caption names.

These methods learn ``score(image, label)`` only (paper 001's Experiments 3 and 4: one label or phrase is one
discrete text). :meth:`LabelMethod.label_scores` is that matrix, ``(n_images, n_labels) float32``, columns
in ``label_names_`` order: Im2Text ranks a row, Text2Im ranks a column. :meth:`LabelMethod.evaluate_labels`
gives P@K and mAP both ways (:func:`crossview.eval.protocols.label_retrieval_metrics`).

The engine and the app rank captions with ``encode_images`` / ``encode_texts`` (a run ends with
:meth:`Method.evaluate`, the Query panel embeds typed sentences). For them these methods do what WSABIE's
label targets do: a caption is scored by the mean of the image's scores for the labels whose names it contains
(whole-word phrase match, a possessive ``'s`` dropped), 0 when it names none. So
``encode_images = label_scores`` and ``encode_texts`` = the mean of the one-hot rows of the named labels,
and a run on a dataset with label sets trains, evaluates and can be queried like any other. That caption
ranking is only as good as the label vocabulary's coverage of the captions; the labels' own metrics are
``evaluate_labels``.

Imports neither torch nor scikit-learn (``list_methods`` and the GUI's forms stay light).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.methods.base import Method, MethodData, check_direction

__all__ = ["LABEL_TARGETS", "LabelMethod", "label_sets_of", "words", "mentioned", "normalize_rows",
           "sets_to_csr"]

#: What a label of these methods is: a label set entry (phrases, IAPR labels), the image's class label, a tag.
LABEL_TARGETS = ("label_sets", "labels", "tags")


def normalize_rows(a: np.ndarray, how: str) -> np.ndarray:
    """``a`` as ``float32``, each row scaled to unit L2 norm for ``how="l2"`` (zero rows stay zero)."""
    a = np.asarray(a, dtype=np.float32)
    if how == "none":
        return a
    from crossview.core.rownorm import row_norms

    norms = row_norms(np.linalg.norm(a, axis=1, keepdims=True))
    return a / np.maximum(norms, 1e-12)


def words(text: str) -> list[str]:
    """The project's words of ``text`` (:func:`crossview.data.text.tokenize`), a possessive ``'s`` dropped
    (as WSABIE's label targets read captions)."""
    from crossview.data.text import tokenize

    return [w[:-2] if w.endswith("'s") else w for w in tokenize(text)]


def mentioned(caption_words: list[str], name_words: list[list[str]]) -> list[int]:
    """Ids of the names whose words occur as a contiguous run in the caption's words."""
    joined = " " + " ".join(caption_words) + " "
    return [i for i, nw in enumerate(name_words) if nw and (" " + " ".join(nw) + " ") in joined]


def label_sets_of(data: MethodData, target: str, method: str,
                  names: list[str] | None = None) -> tuple[list[list[int]], list[str]]:
    """Per-image label ids and the vocabulary for ``target`` (see :data:`LABEL_TARGETS`).

    Without ``names`` the vocabulary is every label name the data uses, sorted; with ``names`` (a fitted
    model's vocabulary) the data's labels are mapped onto it and unknown ones dropped. A
    :class:`CrossViewError` names what is missing when the data has no such labels."""
    where = f"the {data.name or 'given'} data"
    if target == "labels":
        if data.labels is None:
            raise CrossViewError(f"{method} target 'labels' needs class labels but {where} has none; use a dataset "
                                 "with per-image labels, or target 'label_sets'")
        ds_names = getattr(data.dataset, "label_names", None)
        raw = [[str(ds_names[int(v)]) if ds_names else str(int(v))] for v in data.labels]
    elif target == "label_sets":
        if data.label_sets is None:
            raise CrossViewError(f"{method} target 'label_sets' needs per-image label sets but {where} has none; "
                                 "use a dataset with label sets (e.g. IAPR TC-12 with its label files), or "
                                 "target 'labels' / 'tags'")
        lsn = data.label_set_names
        raw = [[str(lsn[i]) if lsn else str(i) for i in s] for s in data.label_sets]
    elif target == "tags":
        tags = getattr(data.dataset, "tags", None)
        if tags is None:
            raise CrossViewError(f"{method} target 'tags' needs per-image tags but {where} has none; use a dataset "
                                 "with tags, or target 'label_sets'")
        raw = [[str(t) for t in ts] for ts in tags]
    else:
        raise CrossViewError(f"{method}: target {target!r} is not one of {', '.join(LABEL_TARGETS)} ({method} "
                             "ranks labels, not captions)")
    if names is None:
        names = sorted({n for s in raw for n in s})
    lookup = {n: i for i, n in enumerate(names)}
    return [sorted({lookup[n] for n in s if n in lookup}) for s in raw], list(names)


def sets_to_csr(sets: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr (n + 1,) int64, indices (nnz,) int64)``: per-image label ids as a CSR row structure."""
    lengths = np.fromiter((len(s) for s in sets), dtype=np.int64, count=len(sets))
    indptr = np.zeros(len(sets) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    indices = np.fromiter((i for s in sets for i in s), dtype=np.int64, count=int(indptr[-1]))
    return indptr, indices


class LabelMethod(Method):
    """Base of the methods that learn ``score(image, label)`` only (see the module docstring).

    A subclass has parameters ``target`` and ``normalize``, sets ``label_names_`` when fitted and implements
    :meth:`_scores_of` (image feature rows, already normalised, to the score matrix)."""

    needs_text_features = False          # captions are read through the label names they contain
    has_epoch_validation = False
    #: like CCA and WSABIE on CNN features (signed square root, then L2); not measured for these methods
    default_image_norm = "ssr"

    target: str
    normalize: str
    label_names_: list[str]

    # ------------------------------------------------------------------ shared checks
    def check_dataset(self, dataset: Any) -> None:
        """The labels the target needs must be in the dataset (said before a run's folder is made)."""
        who, where = self.name or type(self).__name__, f"dataset {getattr(dataset, 'name', '?')!r}"
        need = {"labels": ("labels", "class labels", "target 'label_sets'"),
                "label_sets": ("label_sets", "per-image label sets", "a dataset with label sets (e.g. IAPR TC-12 "
                               "with its label files), or target 'labels' / 'tags'"),
                "tags": ("tags", "per-image tags", "a dataset with tags, or target 'label_sets'")}.get(self.target)
        if need is not None and getattr(dataset, need[0], None) is None:
            raise CrossViewError(f"{who} target {self.target!r} needs {need[1]} but {where} has none; use {need[2]}")

    def _check_common(self) -> None:
        who = self.name or type(self).__name__
        if self.target not in LABEL_TARGETS:
            raise CrossViewError(f"{who}: target {self.target!r} is not one of {', '.join(LABEL_TARGETS)} "
                                 f"({who} ranks labels, not captions)")
        if self.normalize not in ("l2", "none"):
            raise CrossViewError(f"{who}: normalize {self.normalize!r} must be 'l2' or 'none'")

    def _training_sets(self, train: MethodData) -> tuple[np.ndarray, list[list[int]], list[str], int]:
        """``(features of the labelled training images, their label ids, the vocabulary, n dropped)``.

        Training images without any label are dropped: an image nobody annotated says nothing about
        which labels do not apply to it."""
        who = self.name
        X = train.require_image_features(who)
        sets, names = label_sets_of(train, self.target, who)
        keep = [i for i, s in enumerate(sets) if s]
        if not keep or not names:
            raise CrossViewError(f"{who} target {self.target!r}: no image of the {train.name or 'training'} data "
                                 "has a label")
        X = normalize_rows(X[np.asarray(keep, dtype=np.int64)], self.normalize)
        return X, [sets[i] for i in keep], names, len(sets) - len(keep)

    def _features(self, data: MethodData, dim: int) -> np.ndarray:
        who = self.name
        X = data.require_image_features(who)
        if X.shape[1] != dim:
            raise CrossViewError(f"{who}: the model expects {dim}-d image features, the {data.name or 'given'} data "
                                 f"has {X.shape[1]}-d; use the image encoder (and normalisation) it was trained with")
        return normalize_rows(X, self.normalize)

    # ------------------------------------------------------------------ label ranking
    def _scores_of(self, X: np.ndarray) -> np.ndarray:
        """``(n, n_labels) float32`` scores of normalised image rows ``X (n, p)``."""
        raise NotImplementedError

    def _feature_dim(self) -> int:
        raise NotImplementedError

    def label_scores(self, data: MethodData) -> np.ndarray:
        """``(n_images, n_labels) float32``: ``score(image, label)`` of every image of ``data``, columns in
        ``label_names_`` order (Im2Text ranks a row, Text2Im a column)."""
        self.check_is_fitted()
        return np.ascontiguousarray(self._scores_of(self._features(data, self._feature_dim())), dtype=np.float32)

    def evaluate_labels(self, data: MethodData, ks: Sequence[int] = (1, 5)) -> dict[str, Any]:
        """Image <-> label ranking on ``data`` (Experiments 3 and 4 of the BITR paper), in percent.

        Returns WSABIE's keys for Im2Text (``"P@K"``, ``"mAP"``: each image with at least one label the model
        knows ranks the model's labels) plus ``"n_queries"`` / ``"n_excluded"`` (images without one) and
        ``"t2i"``: ``{"P@K", "mAP", "n_queries", "n_excluded"}`` with each label a query ranking all the images
        of ``data`` (labels no image of ``data`` has are excluded). K larger than the gallery is left out."""
        from crossview.eval.protocols import label_retrieval_metrics

        self.check_is_fitted()
        sets, _ = label_sets_of(data, self.target, self.name, self.label_names_)
        if not any(sets):
            raise CrossViewError(f"{self.name}: no image of the {data.name or 'given'} data has a label the model "
                                 "knows")
        scores = self.label_scores(data)
        rel = np.zeros(scores.shape, dtype=bool)
        for i, s in enumerate(sets):
            rel[i, s] = True
        res = label_retrieval_metrics(scores, rel, ks)
        return {**res["i2t"], "t2i": res["t2i"]}

    def _validation(self, val: MethodData | None) -> dict[str, Any] | None:
        """``{"i2t": {...}, "t2i": {...}}`` label metrics on ``val`` (for a ``Validation`` event), or None
        when there is no ``val`` or it has no labels the model knows."""
        if val is None or not val.has_images or val.image_features is None:
            return None
        try:
            res = self.evaluate_labels(val)
        except CrossViewError:
            return None
        t2i = res.pop("t2i")
        return {"i2t": res, "t2i": t2i}

    # ------------------------------------------------------------------ captions, through the label names
    def encode_images(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """``(n_images, n_labels) float32``: :meth:`label_scores` (both directions)."""
        check_direction(direction)
        return self.label_scores(data)

    def encode_texts(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """``(n_captions, n_labels) float32``: row j is the mean of the one-hot vectors of the labels caption j
        names (zeros when it names none), so ``image . caption`` = the mean score of those labels."""
        check_direction(direction)
        self.check_is_fitted()
        name_words = [words(n) for n in self.label_names_]
        out = np.zeros((data.n_captions, len(self.label_names_)), dtype=np.float32)
        for j, cap in enumerate(data.captions):
            ids = mentioned(words(cap), name_words)
            if ids:
                out[j, ids] = 1.0 / len(ids)
        return out
