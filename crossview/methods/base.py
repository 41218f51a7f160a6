"""The method contract: :class:`MethodData` in, events out, embeddings whose dot product is the score.

Every retrieval method (CCA, WSABIE, BITR and the deep ones) subclasses :class:`Method` and follows
scikit-learn's conventions (STYLE.md 4):

- ``__init__`` takes keyword parameters only and stores each, unchanged, as an attribute of the same
  name (no logic, no validation there); :meth:`Method.get_params` / :meth:`Method.set_params` read
  and write them; learned attributes end in ``_`` (``W_``, ``projections_``). The parameters are the
  model, loss and optimisation hyperparameters (the card's); how a run executes (device, amp, seed,
  workers, log_every) is the run's :class:`~crossview.core.run_settings.RunSettings`, which the method
  reads from :attr:`Method.run_settings` (set by ``configure_run`` / ``with_run``).
- :meth:`Method.fit_iter` is a generator that does the work and yields
  :mod:`crossview.core.events` (``Progress``, ``Loss``, ``Validation``, ``Log``); it must yield at
  least once per batch / cutting-plane iteration, because cancelling is the consumer stopping the
  iteration. :meth:`Method.fit` drains it and returns ``self``.
- :meth:`Method.encode_images` / :meth:`Method.encode_texts` return ``(n, D) float32`` matrices with
  ``score(image i, caption j) = encode_images(data)[i] . encode_texts(data)[j]``. Methods whose
  Im2Text and Text2Im models differ (BITR) set ``directions_differ = True`` and honour
  ``direction="i2t" | "t2i"``; evaluation ranks i2t with the i2t model and t2i with the t2i model.
- :meth:`Method.state_dict` / :meth:`Method.load_state_dict` hold everything a checkpoint needs
  (numpy / torch / plain Python objects only). For methods with ``iterative = True`` the state at any
  point where ``fit_iter`` has yielded must include the training progress (epoch, working set, optimiser
  state ...) so that ``load_state_dict(state)`` followed by ``fit_iter(train, val, resume=True)``
  continues the run; closed-form methods (``iterative = False``) ignore ``resume`` and refit.

Register a method with ``@register_method("name")`` from :mod:`crossview.methods`; the registry name
is the module name.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from crossview.data.method_data import MethodData
from crossview.core.errors import CrossViewError
from crossview.core.run_settings import RUN_SETTING_PARAMS, RunSettings

__all__ = ["MethodData", "Method", "DIRECTIONS", "check_direction"]

# MethodData lives in the data layer (every layer above builds or reads it); re-exported as part of the
# method contract.

#: The two retrieval directions, in the one spelling used everywhere (STYLE.md 11).
DIRECTIONS = ("i2t", "t2i")


def check_direction(direction: str) -> str:
    """``direction`` if it is ``"i2t"`` or ``"t2i"``; a :class:`CrossViewError` otherwise."""
    if direction not in DIRECTIONS:
        raise CrossViewError(f"direction must be 'i2t' (image -> text) or 't2i' (text -> image), "
                             f"got {direction!r}")
    return direction


def _run_setting_message(method: str, name: str) -> str:
    field = RUN_SETTING_PARAMS[name]
    return (f"{name} is a run setting, not a parameter of method {method!r}: give it to the run "
            f"(crossview.train(..., {field}=...), or --set {name}=... on the command line) or to the method "
            f"object with .with_run({field}=...)")


class Method:
    """Base class of every retrieval method (see the module docstring for the contract).

    Class attributes a subclass sets:
        name: the registry name (set by ``@register_method``).
        directions_differ: True when the i2t and t2i models differ (BITR).
        iterative: True when ``fit_iter(..., resume=True)`` continues from a loaded state.
        needs_text_features: False for methods that encode the captions themselves.
        wants_image_files: True for methods that train on the image files (end to end); the engine
            then builds their data with ``image_paths`` beside the feature rows.
        has_epoch_validation: False when the method does not score ``val`` per epoch / iteration
            (closed form, or parameters chosen another way); ``validation_note`` then says how it
            validates, in one sentence for the Train panel.
    """

    name: ClassVar[str] = ""
    directions_differ: ClassVar[bool] = False
    iterative: ClassVar[bool] = False
    needs_text_features: ClassVar[bool] = True
    wants_image_files: ClassVar[bool] = False
    has_epoch_validation: ClassVar[bool] = True
    validation_note: ClassVar[str] = ""
    #: what each loss term a method reports is (``{"L_M": "cross-modal projection matching ..."}``): the curves'
    #: tooltips
    loss_terms: ClassVar[dict[str, str]] = {}
    #: feature normalisations (crossview.features.normalize) a run uses for this method unless told otherwise
    default_image_norm: ClassVar[str] = "none"
    default_text_norm: ClassVar[str] = "none"
    #: feature pipelines (``--image-encoder`` / ``--text-encoder`` names) a run uses for this method unless told
    #: otherwise; None: the package defaults (crossview.features.image / crossview.features.text)
    default_image_encoder: ClassVar[str | None] = None
    default_text_encoder: ClassVar[str | None] = None
    #: names that say how a run executes, not what is learned (device, amp, seed / random_state, workers / n_jobs,
    #: log_every: crossview.core.run_settings): never a method's parameters. A method reads them from
    #: :attr:`run_settings` (the properties :attr:`device`, :attr:`seed`, ...), which the engine sets with
    #: :meth:`configure_run` and a library user with :meth:`with_run`; a checkpoint neither saves nor restores them
    #: (a run trained on cuda:0 resumes or opens on the device asked for now)
    RUN_SETTINGS: ClassVar[frozenset[str]] = frozenset(RUN_SETTING_PARAMS)
    #: the run's settings (default: ``RunSettings()``, the CPU, seed 0, amp off): set by :meth:`configure_run`
    run_settings: RunSettings = RunSettings()
    #: what ``workers`` / ``log_every`` are when the run's settings leave them at ``None`` (the method's own)
    default_workers: ClassVar[int] = 0
    default_log_every: ClassVar[int] = 10
    #: True when the method trains in mixed precision when the run asks for it (``amp``; the Train panel greys the
    #: box out for the others, and :attr:`amp` is False for them whatever the run says)
    supports_amp: ClassVar[bool] = False

    def __new__(cls, *args: Any, **params: Any) -> "Method":
        # a run setting given as a parameter (Vsepp(device="cpu")) is said in one line, not as a TypeError
        given = [k for k in params if k in RUN_SETTING_PARAMS]
        if given:
            raise CrossViewError(_run_setting_message(cls.name or cls.__name__, given[0]))
        return super().__new__(cls)

    # ------------------------------------------------------------------ parameters
    @classmethod
    def param_names(cls) -> list[str]:
        """The keyword parameters of ``__init__``, in signature order."""
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values()
                if p.name != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]

    @classmethod
    def default_params(cls) -> dict[str, Any]:
        """``{name: default}`` from the ``__init__`` signature."""
        sig = inspect.signature(cls.__init__)
        return {n: sig.parameters[n].default for n in cls.param_names()
                if sig.parameters[n].default is not inspect.Parameter.empty}

    def get_params(self) -> dict[str, Any]:
        """The current parameters, ``{name: value}``."""
        return {n: getattr(self, n) for n in self.param_names()}

    def check_params(self) -> None:
        """Raise :class:`CrossViewError` naming the first invalid parameter (a bad range, grid or choice).

        The engine calls it before any feature extraction or training, so a typo costs nothing; methods
        implement ``_check_params`` (which their ``fit_iter`` calls too)."""
        check = getattr(self, "_check_params", None)
        if check is not None:
            check()

    def set_params(self, **params: Any) -> "Method":
        """Set parameters by name; an unknown name raises :class:`CrossViewError` listing the valid ones."""
        valid = self.param_names()
        for k, v in params.items():
            if k in RUN_SETTING_PARAMS:
                raise CrossViewError(_run_setting_message(self.name or type(self).__name__, k))
            if k not in valid:
                raise CrossViewError(f"method {self.name or type(self).__name__!r} has no parameter {k!r}; "
                                     f"its parameters are: {', '.join(valid)}")
            setattr(self, k, v)
        return self

    def check_dataset(self, dataset: Any) -> None:
        """Raise :class:`CrossViewError` when ``dataset`` lacks what this method trains on (labels, tags ...);
        the engine calls it with :meth:`check_params`, before the run's folder is made. Default: nothing."""

    def configure_run(self, settings: RunSettings) -> "Method":
        """Take the run's settings (a :class:`crossview.core.run_settings.RunSettings`, its device resolved): the
        method reads its device, amp, seed, workers and log_every from them from now on. Returns ``self``."""
        if not isinstance(settings, RunSettings):
            raise CrossViewError(f"configure_run takes a crossview.core.run_settings.RunSettings, got "
                                 f"{type(settings).__name__}; use with_run(device=..., seed=...) to give fields")
        self.run_settings = settings
        return self

    def with_run(self, **fields: Any) -> "Method":
        """:meth:`configure_run` with these :class:`RunSettings` fields changed from the current ones
        (``Vsepp(max_epochs=2).with_run(device="cpu", seed=0)``); ``random_state`` / ``n_jobs`` are taken as
        ``seed`` / ``workers`` and ``device="auto"`` is resolved to the device there is. Returns ``self``."""
        known = {f.name for f in dataclasses.fields(RunSettings)}
        out: dict[str, Any] = {}
        for k, v in fields.items():
            field = RUN_SETTING_PARAMS.get(k, k)
            if field not in known:
                raise CrossViewError(f"with_run: {k!r} is not a run setting; the run settings are: "
                                     f"{', '.join(sorted(known))}")
            out[field] = v
        if "device" in out:
            from crossview.core.devices import select_device
            out["device"] = select_device(out["device"])
        return self.configure_run(dataclasses.replace(self.run_settings, **out))

    # the run settings a method reads (read-only: they are the run's, see with_run / configure_run)
    @property
    def device(self) -> str:
        """The run's device (``"cpu"``, ``"cuda:0"``)."""
        return self.run_settings.device

    @property
    def seed(self) -> int:
        """The run's seed."""
        return self.run_settings.seed

    @property
    def amp(self) -> bool:
        """Mixed precision: the run's ``amp`` for a method that :attr:`supports_amp`, else False."""
        return bool(self.run_settings.amp) and self.supports_amp

    @property
    def workers(self) -> int:
        """Loader workers / parallel jobs: the run's, or the method's :attr:`default_workers`."""
        w = self.run_settings.workers
        return self.default_workers if w is None else w

    @property
    def log_every(self) -> int:
        """Steps between loss events: the run's, or the method's :attr:`default_log_every`."""
        n = self.run_settings.log_every
        return self.default_log_every if n is None else n

    def __repr__(self) -> str:
        defaults = self.default_params()
        changed = {k: v for k, v in self.get_params().items() if k not in defaults or defaults[k] != v}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    # ------------------------------------------------------------------ training
    def fit_iter(self, train: MethodData, val: MethodData | None = None, *,
                 resume: bool = False) -> Iterator[Any]:
        """Fit on ``train`` (early stopping / model selection on ``val``), yielding events.

        ``resume=True`` (only meaningful when ``iterative``) continues from the state loaded with
        :meth:`load_state_dict` instead of starting over; when no learned state was loaded (a run
        cancelled before its first step) it starts fresh. Subclasses must accept ``resume``.
        """
        raise NotImplementedError

    def selection_info(self, train_split: str, val_split: str | None) -> list[dict[str, str]]:
        """What a fit with these parameters chooses from data, and on which images: ``[{"what": "epoch",
        "on": "val"}, {"what": "C", "on": "train-cv5"}]`` (``on``: a split, or ``<train>-cvK`` /
        ``<train>-holdoutP`` for parts of the training split). ``val_split`` is the split ``fit_iter`` gets as
        ``val`` (``None`` when it gets none). The engine records it in the run's summary beside the split the run
        is reported on, so a reader sees that the two differ. A method that chooses nothing returns ``[]``."""
        return []

    def fit(self, train: MethodData, val: MethodData | None = None) -> "Method":
        """Drain :meth:`fit_iter`; returns ``self``."""
        for _ in self.fit_iter(train, val):
            pass
        return self

    # ------------------------------------------------------------------ inference
    def encode_images(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """``(n_images, D) float32`` image embeddings of ``data`` for ``direction``."""
        raise NotImplementedError

    def encode_texts(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """``(n_captions, D) float32`` caption embeddings of ``data`` for ``direction``."""
        raise NotImplementedError

    def scores(self, data: MethodData, direction: str = "i2t",
               texts: MethodData | None = None) -> np.ndarray:
        """``(n_images, n_captions) float32`` scores of the images of ``data`` against the captions of
        ``texts`` (default: ``data``'s own captions), with the ``direction`` model."""
        check_direction(direction)
        img = self.encode_images(data, direction=direction)
        txt = self.encode_texts(texts if texts is not None else data, direction=direction)
        return np.asarray(img @ txt.T, dtype=np.float32)

    def evaluate(self, data: MethodData, ks: Sequence[int] = (1, 5, 10), hubness: bool = False) -> dict[str, Any]:
        """Retrieval metrics on ``data`` (:func:`crossview.eval.metrics.evaluate`'s dict, with ``"ranks"``).

        i2t ranks come from the i2t model's scores, t2i ranks from the t2i model's when they differ.
        The scores are formed block by block from the embeddings (:func:`crossview.eval.metrics.embedding_ranks`),
        never as one ``(n_images, n_captions)`` matrix; a method that overrides :meth:`scores` is scored through it.
        ``hubness``: also ``"hubness"`` of the embeddings' retrieval, from the same score blocks (not given by a
        method that overrides :meth:`scores`).
        """
        from crossview.eval import metrics as M

        if type(self).scores is not Method.scores:      # scores that are not the embeddings' dot product
            s_i2t = self.scores(data, "i2t")
            if not self.directions_differ:
                return M.evaluate(s_i2t, data.caption_image, ks)
            s_t2i = self.scores(data, "t2i")
            r_i2t = M.i2t_ranks(s_i2t, data.caption_image)
            r_t2i = M.t2i_ranks(s_t2i, data.caption_image)
            i2t, t2i = M.rank_metrics(r_i2t, ks), M.rank_metrics(r_t2i, ks)
            return {"i2t": i2t, "t2i": t2i, "rsum": M.rsum_of(i2t, t2i, ks), "ranks": {"i2t": r_i2t, "t2i": r_t2i}}
        two = self.directions_differ
        return M.evaluate_embeddings_blocked(
            self.encode_images(data, direction="i2t"), self.encode_texts(data, direction="i2t"), data.caption_image,
            ks, image_t2i=self.encode_images(data, direction="t2i") if two else None,
            text_t2i=self.encode_texts(data, direction="t2i") if two else None, hubness=hubness)

    # ------------------------------------------------------------------ state
    def _learned_names(self) -> list[str]:
        return sorted(k for k in vars(self) if k.endswith("_") and not k.startswith("_"))

    @property
    def is_fitted(self) -> bool:
        """True once learned attributes (names ending in ``_``) exist."""
        return bool(self._learned_names())

    def check_is_fitted(self) -> None:
        """Raise :class:`CrossViewError` if the method has not been fitted or loaded."""
        if not self.is_fitted:
            raise CrossViewError(f"method {self.name or type(self).__name__!r} is not fitted yet: call fit() "
                                 "or load a checkpoint first")

    def state_dict(self) -> dict[str, Any]:
        """``{"method", "params", "state"}``: the parameters and every learned attribute (``*_``).

        Subclasses holding torch modules or optimisers override this (and :meth:`load_state_dict`)."""
        return {"method": self.name, "params": self.saved_params(), "stream": self.stream_state(),
                "state": {k: getattr(self, k) for k in self._learned_names()}}

    def checkpoint_state(self) -> dict[str, Any]:
        """:meth:`state_dict` for a checkpoint written at once, before the method changes again: it may share memory
        with what the method is still training (a torch method's live weights), where :meth:`state_dict` is a
        snapshot to keep."""
        return self.state_dict()

    def stream_state(self) -> dict[str, Any]:
        """``{"seed": 7}``: the seed this method's training draws from, kept with the learned state (``"stream"``) so
        that a state loaded into a new object continues the very same stream (the engine sets it from the run
        anyway)."""
        return {"seed": self.seed}

    def saved_params(self) -> dict[str, Any]:
        """The parameters a checkpoint keeps (its hyperparameters: run settings are never among them)."""
        return self.get_params()

    def load_state_dict(self, d: dict[str, Any]) -> "Method":
        """Restore parameters and learned attributes from :meth:`state_dict`'s output; returns ``self``."""
        if d.get("method") and self.name and d["method"] != self.name:
            raise CrossViewError(f"this checkpoint is for method {d['method']!r}, not {self.name!r}; "
                                 f"load it with create_method({d['method']!r})")
        # run settings in a checkpoint written when they were parameters are not restored: this object's stand
        self.set_params(**{k: v for k, v in d.get("params", {}).items() if k not in self.RUN_SETTINGS})
        # the seed the training drew from (a state written before "stream" existed kept it among its params)
        stream = d.get("stream") if isinstance(d.get("stream"), dict) else d.get("params", {})
        seed = stream.get("seed", stream.get("random_state"))
        if seed is not None:
            self.run_settings = dataclasses.replace(self.run_settings, seed=int(seed))
        for k, v in d.get("state", {}).items():
            setattr(self, k, v)
        return self

    def save(self, path: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """Write a checkpoint (``state_dict()`` plus ``extra``, e.g. the feature spec) atomically, in the
        weights-only format of :func:`crossview.core.io.save_checkpoint` (``"format": 2``)."""
        from crossview.core.io import save_checkpoint
        return save_checkpoint(path, {"method_state": self.checkpoint_state(), **(extra or {})})

    @classmethod
    def load(cls, path: str | Path) -> "Method":
        """A method rebuilt from a checkpoint written by :meth:`save` or by a run."""
        from crossview.core.io import load_checkpoint
        from crossview.methods import create_method

        ckpt = load_checkpoint(path)   # weights-only: the file can hold no code
        state = ckpt.get("method_state")
        if not isinstance(state, dict):
            raise CrossViewError(f"{path}: not a CrossView method checkpoint (no 'method_state')")
        name = state.get("method") or cls.name
        if not isinstance(name, str) or not name:
            raise CrossViewError(f"{path}: the checkpoint names no method; it is damaged: save the method again")
        method = create_method(name) if (cls is Method or cls.name != name) else cls()
        try:
            return method.load_state_dict(state)
        except CrossViewError:
            raise
        except Exception as e:  # noqa: BLE001 - anything a malformed state makes the method raise
            raise CrossViewError(f"{path}: the method state does not fit {name!r} ({type(e).__name__}: "
                                 f"{str(e)[:160]}); the checkpoint is damaged: save the method again") from None
