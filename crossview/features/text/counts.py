"""Count-based encoders fitted on the training captions: bag of words, TF-IDF (scikit-learn) and LDA topics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from crossview.data.text import tokenize
from crossview.core.errors import CrossViewError
from crossview.core.rownorm import norms_frozen, row_norms
from crossview.features.text.base import TextEncoder, register_text_encoder


class _CountsEncoder(TextEncoder):
    """Shared by bow / tfidf / lda: a word-count vocabulary chosen by scikit-learn on the fit captions."""

    needs_fit = True

    def _vectorizer_kwargs(self) -> dict[str, Any]:
        sw = self.params.get("stop_words")
        if sw not in (None, "english"):
            raise CrossViewError(f"stop_words must be None or 'english', got {sw!r}")
        mf = self.params.get("max_features")
        if mf is not None and (not isinstance(mf, int) or mf < 1):
            raise CrossViewError(f"max_features must be a positive integer or None, got {mf!r}")
        return {"tokenizer": tokenize, "lowercase": False, "token_pattern": None, "stop_words": sw,
                "max_features": mf, "min_df": self.params.get("min_df", 1)}

    def _fit_counts(self, vectorizer: Any, captions: list[str]) -> Any:
        try:
            x = vectorizer.fit_transform(captions)
        except ValueError as e:  # "empty vocabulary", min_df too high, ...
            raise CrossViewError(f"text encoder {self.name!r} found no usable words in the {len(captions)} "
                                 f"fit captions ({e}); lower min_df or pass captions with words") from None
        vocab = vectorizer.vocabulary_
        self.vocabulary_ = sorted(vocab, key=vocab.__getitem__)
        self._index = {w: i for i, w in enumerate(self.vocabulary_)}
        return x

    def _counts(self, captions: list[str]) -> Any:
        """``(n, V)`` scipy CSR word counts over the fit vocabulary (unknown words dropped)."""
        import scipy.sparse as sp

        rows, cols = [], []
        for r, c in enumerate(captions):
            for w in tokenize(c):
                j = self._index.get(w)
                if j is not None:
                    rows.append(r)
                    cols.append(j)
        data = np.ones(len(rows), dtype=np.float64)
        m = sp.csr_matrix((data, (rows, cols)), shape=(len(captions), len(self.vocabulary_)))
        m.sum_duplicates()
        return m

    def _dim(self) -> int:
        return len(self.vocabulary_)

    def _get_state(self) -> dict[str, Any]:
        return {"vocabulary": list(self.vocabulary_)}

    def _set_state(self, state: Mapping[str, Any]) -> None:
        self.vocabulary_ = [str(w) for w in state["vocabulary"]]
        self._index = {w: i for i, w in enumerate(self.vocabulary_)}


def _normalise_sparse_rows(x: Any, norm: str | None) -> Any:
    """:func:`_normalise_rows` of a float64 CSR matrix, in place on its values (zero rows stay zero)."""
    if norm is None:
        return x
    if norm == "l2":
        d = np.sqrt(np.asarray(x.multiply(x).sum(axis=1), dtype=np.float64).ravel())
    elif norm == "l1":
        d = np.asarray(abs(x).sum(axis=1), dtype=np.float64).ravel()
    else:
        raise CrossViewError(f"norm must be 'l1', 'l2' or None, got {norm!r}")
    d = np.where(d > 0, d, 1.0)
    x.data /= np.repeat(d, np.diff(x.indptr))
    return x


def _normalise_rows(x: np.ndarray, norm: str | None) -> np.ndarray:
    if norm is None:
        return x
    if norm == "l2":
        d = np.sqrt((x * x).sum(axis=1, keepdims=True))
    elif norm == "l1":
        d = np.abs(x).sum(axis=1, keepdims=True)
    else:
        raise CrossViewError(f"norm must be 'l1', 'l2' or None, got {norm!r}")
    d = row_norms(d)
    return x / np.where(d > 0, d, 1.0)


@register_text_encoder("bow")
class BagOfWordsEncoder(_CountsEncoder):
    """Word counts (``binary``: presence) over the ``max_features`` most frequent fit words, ``(n, V)``.

    ``norm`` ``None`` (raw counts), ``"l1"`` or ``"l2"``; an all-unknown or empty caption is a zero row.
    """

    defaults = {"max_features": 10000, "min_df": 1, "stop_words": None, "binary": False, "norm": None}
    sparse_output = True

    def _fit(self, captions: list[str]) -> None:
        from sklearn.feature_extraction.text import CountVectorizer

        self._fit_counts(CountVectorizer(**self._vectorizer_kwargs()), captions)

    def _encode_sparse_batch(self, captions: list[str]) -> Any:
        x = self._counts(captions)
        if self.params["binary"]:
            x.data[:] = 1.0
        return _normalise_sparse_rows(x, self.params["norm"]).astype(np.float32)

    def _encode_batch(self, captions: list[str], ctx: Any) -> np.ndarray:
        x = self._counts(captions).toarray()
        if self.params["binary"]:
            x = (x > 0).astype(np.float64)
        return _normalise_rows(x, self.params["norm"]).astype(np.float32)


@register_text_encoder("tfidf")
class TfidfEncoder(_CountsEncoder):
    """scikit-learn TF-IDF ``(n, V)``: ``tf(w) * idf(w)``, ``idf = ln((1 + n) / (1 + df)) + 1``, row ``norm``.

    ``sublinear_tf`` replaces ``tf`` by ``1 + ln(tf)``. Same numbers as ``TfidfVectorizer`` with these
    parameters; an all-unknown or empty caption is a zero row.
    """

    defaults = {"max_features": 10000, "min_df": 1, "stop_words": None, "sublinear_tf": False, "norm": "l2"}
    sparse_output = True

    def _fit(self, captions: list[str]) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer

        v = TfidfVectorizer(**self._vectorizer_kwargs(), sublinear_tf=self.params["sublinear_tf"],
                            norm=self.params["norm"], smooth_idf=True)
        self._fit_counts(v, captions)
        self.idf_ = np.asarray(v.idf_, dtype=np.float64)

    def _encode_batch(self, captions: list[str], ctx: Any) -> np.ndarray:
        x = self._counts(captions).toarray()
        if self.params["sublinear_tf"]:
            x = np.where(x > 0, 1.0 + np.log(np.maximum(x, 1.0)), 0.0)
        return _normalise_rows(x * self.idf_, self.params["norm"]).astype(np.float32)

    def _encode_sparse_batch(self, captions: list[str]) -> Any:
        x = self._counts(captions)                      # float64 CSR, duplicates summed
        if self.params["sublinear_tf"]:
            x.data = 1.0 + np.log(np.maximum(x.data, 1.0))
        x.data *= self.idf_[x.indices]
        return _normalise_sparse_rows(x, self.params["norm"]).astype(np.float32)

    def _get_state(self) -> dict[str, Any]:
        return {**super()._get_state(), "idf": self.idf_}

    def _set_state(self, state: Mapping[str, Any]) -> None:
        super()._set_state(state)
        self.idf_ = np.asarray(state["idf"], dtype=np.float64)
        if len(self.idf_) != len(self.vocabulary_):
            raise CrossViewError("saved tfidf encoder has mismatched vocabulary and idf sizes: refit it")


@register_text_encoder("lda")
class LdaEncoder(_CountsEncoder):
    """LDA topic distributions ``(n, n_topics)`` (scikit-learn ``LatentDirichletAllocation``; rows sum to 1).

    The BITR paper's "TR" text features (100 topics). Topics are learned from the word counts of the
    fit captions (English stop words dropped by default: they would fill every topic). A caption with
    no known word gets the prior's mean, the uniform distribution.
    """

    defaults = {"n_topics": 100, "max_features": 10000, "min_df": 1, "stop_words": "english",
                "max_iter": 20, "learning_method": "batch", "random_state": 0}

    def _fit(self, captions: list[str]) -> None:
        from sklearn.decomposition import LatentDirichletAllocation
        from sklearn.feature_extraction.text import CountVectorizer

        k = self.params["n_topics"]
        if not isinstance(k, int) or k < 1:
            raise CrossViewError(f"lda n_topics must be a positive integer, got {k!r}")
        if self.params["learning_method"] not in ("batch", "online"):
            raise CrossViewError(f"lda learning_method must be 'batch' or 'online', "
                                 f"got {self.params['learning_method']!r}")
        x = self._fit_counts(CountVectorizer(**self._vectorizer_kwargs()), captions)
        lda = LatentDirichletAllocation(n_components=k, max_iter=self.params["max_iter"],
                                        learning_method=self.params["learning_method"],
                                        random_state=self.params["random_state"], n_jobs=1)
        lda.fit(x)
        self.lda_ = lda

    def _dim(self) -> int:
        return int(self.params["n_topics"])

    def _encode_batch(self, captions: list[str], ctx: Any) -> np.ndarray:
        if norms_frozen() and len(captions) > 1:
            return self._held_parts(captions)
        return self.lda_.transform(self._counts(captions)).astype(np.float32)

    def _held_parts(self, captions: list[str]) -> np.ndarray:
        """An explanation's rows (:mod:`crossview.core.rownorm`): the first caption's topic distribution, then
        each other row as the share of it that its words carry, so the parts add up exactly.

        Variational LDA ends with ``gamma = alpha + sum_w n_w phi_w``, ``phi_w`` being word ``w``'s topic
        responsibilities, and the distribution is ``gamma / sum(gamma)``. So the caption's distribution is a
        *base* (``alpha`` and what the last E-step iteration left, ``(gamma - sum_w n_w phi_w) / sum(gamma)``)
        plus one share ``n_w phi_w / sum(gamma)`` per word. Row ``r >= 1`` is ``base`` + the shares of its
        words (a word of the caption gives its share, an unknown word or an empty row gives ``base`` alone),
        so ``sum_r (row_r - base) = distribution - base`` exactly."""
        from scipy.special import psi

        x = self._counts(captions)
        gamma = np.asarray(self.lda_.transform(x[:1], normalize=False), dtype=np.float64)[0]
        total = gamma.sum()
        expdoc = np.exp(psi(gamma) - psi(total))                                     # (K,)
        beta = np.asarray(self.lda_.exp_dirichlet_component_, dtype=np.float64)      # (K, V)
        phi = expdoc[:, None] * beta
        phi /= phi.sum(axis=0, keepdims=True) + np.finfo(np.float64).tiny           # (K, V): per word, over topics
        counts0 = np.asarray(x[:1].todense(), dtype=np.float64)[0]
        base = (gamma - phi @ counts0) / total
        rows = np.asarray(x.todense(), dtype=np.float64)
        out = base[None, :] + rows @ phi.T / total
        out[0] = gamma / total
        return out.astype(np.float32)

    def _get_state(self) -> dict[str, Any]:
        lda = self.lda_
        return {**super()._get_state(), "components": lda.components_,
                "exp_dirichlet_component": lda.exp_dirichlet_component_,
                "doc_topic_prior": float(lda.doc_topic_prior_), "topic_word_prior": float(lda.topic_word_prior_),
                "n_iter": int(lda.n_iter_), "n_batch_iter": int(lda.n_batch_iter_), "bound": float(lda.bound_)}

    def _set_state(self, state: Mapping[str, Any]) -> None:
        from sklearn.decomposition import LatentDirichletAllocation

        super()._set_state(state)
        comp = np.asarray(state["components"], dtype=np.float64)
        if comp.shape != (self.params["n_topics"], len(self.vocabulary_)):
            raise CrossViewError(f"saved lda encoder has topics of shape {comp.shape}, expected "
                                 f"({self.params['n_topics']}, {len(self.vocabulary_)}): refit it")
        lda = LatentDirichletAllocation(n_components=self.params["n_topics"], max_iter=self.params["max_iter"],
                                        learning_method=self.params["learning_method"],
                                        random_state=self.params["random_state"], n_jobs=1)
        # The fitted attributes scikit-learn's transform reads (it is deterministic given them).
        lda.components_ = comp
        lda.exp_dirichlet_component_ = np.asarray(state["exp_dirichlet_component"], dtype=np.float64)
        lda.doc_topic_prior_ = float(state["doc_topic_prior"])
        lda.topic_word_prior_ = float(state["topic_word_prior"])
        lda.n_iter_ = int(state["n_iter"])
        lda.n_batch_iter_ = int(state["n_batch_iter"])
        lda.bound_ = float(state["bound"])
        lda.n_features_in_ = comp.shape[1]
        self.lda_ = lda
