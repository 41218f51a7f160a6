"""Retrieval methods: one module per method and the registry (timm's ``_registry`` / ``_factory`` habit).

The registry name of a method is its module name: ``crossview/methods/cca.py`` registers ``"cca"``.
Method modules are imported lazily, from the fixed list :data:`METHOD_MODULES`, the first time a
method is asked for, so ``import crossview.methods`` (and listing the method names) never imports
torch. ::

    from crossview.methods import create_method, list_methods
    list_methods()                       # ['cca', 'wsabie', 'bitr', ...] (those that are installed)
    m = create_method("cca", n_components=64)
    m.fit(train_data)                    # train_data: crossview.methods.base.MethodData
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable, TypeVar

from crossview.core.errors import CrossViewError
from crossview.methods.base import Method, MethodData

__all__ = ["register_method", "create_method", "method_from_params", "list_methods", "method_class", "method_card",
           "default_norms_of", "default_encoders_of", "default_encoders_for", "Method", "MethodData", "METHOD_MODULES"]

#: Every method module, in the order they are listed to the user. A name whose module does not
#: exist (yet) is skipped.
METHOD_MODULES: tuple[str, ...] = ("cca", "wsabie", "bitr", "vsepp", "webly", "smoothap", "timam", "wknn", "svm")

_REGISTRY: dict[str, type[Method]] = {}

M = TypeVar("M", bound=type[Method])


def register_method(name: str) -> Callable[[M], M]:
    """Class decorator: register a :class:`Method` subclass under ``name`` (its module name)."""
    def deco(cls: M) -> M:
        if not (isinstance(cls, type) and issubclass(cls, Method)):
            raise TypeError(f"@register_method({name!r}) must decorate a Method subclass, got {cls!r}")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"method name {name!r} is already registered by {existing.__module__}."
                             f"{existing.__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def _module_exists(name: str) -> bool:
    return importlib.util.find_spec(f"crossview.methods.{name}") is not None


def list_methods() -> list[str]:
    """Names of the available methods (modules of :data:`METHOD_MODULES` that exist, then any other
    registered ones), without importing them."""
    names = [n for n in METHOD_MODULES if n in _REGISTRY or _module_exists(n)]
    return names + sorted(n for n in _REGISTRY if n not in names)


def method_class(name: str) -> type[Method]:
    """The class registered as ``name`` (importing its module on first use).

    Raises :class:`CrossViewError` naming the known methods when ``name`` is unknown.
    """
    if name not in _REGISTRY and name in METHOD_MODULES and _module_exists(name):
        importlib.import_module(f"crossview.methods.{name}")
    cls = _REGISTRY.get(name)
    if cls is None:
        raise CrossViewError(f"unknown method {name!r}; known methods: {', '.join(list_methods()) or 'none'}")
    return cls


def create_method(name: str, **params: Any) -> Method:
    """An unfitted instance of method ``name`` with ``params`` (the rest take their defaults).

    Unknown parameter names raise :class:`CrossViewError` listing the method's parameters; a run setting
    (``device``, ``seed`` ...) one saying how to give it (``.with_run(...)``).
    """
    cls = method_class(name)
    valid = cls.param_names()
    unknown = [k for k in params if k not in valid and k not in cls.RUN_SETTINGS]   # run settings: said by cls()
    if unknown:
        raise CrossViewError(f"method {name!r} has no parameter {unknown[0]!r}; its parameters are: "
                             f"{', '.join(valid)}")
    return cls(**params)


def method_from_params(name: str, params: dict[str, Any]) -> Method:
    """:func:`create_method` for parameters as a user gave them (``--set seed=3`` among them): the run settings
    among them (:data:`crossview.core.run_settings.RUN_SETTING_PARAMS`) go to the method's run settings
    (:meth:`Method.with_run`), the rest are its parameters. For checking what a run will be asked before it starts."""
    from crossview.core.run_settings import split_run_settings

    hyper, run = split_run_settings(dict(params))
    method = create_method(name, **hyper)
    return method.with_run(**run) if run else method


def method_card(name: str) -> Any:
    """The :class:`~crossview.methods.cards.MethodCard` of method ``name`` (``models/<name>.toml``), or
    None when it has no card. An unknown method raises :class:`CrossViewError` naming the known ones."""
    from crossview.methods.cards import find_card

    if name not in list_methods():
        raise CrossViewError(f"unknown method {name!r}; known methods: {', '.join(list_methods()) or 'none'}")
    return find_card(name)


def default_norms_of(method: str, params: dict[str, Any] | None = None) -> tuple[str, str]:
    """``(image_norm, text_norm)`` a run of ``method`` with ``params`` uses unless told otherwise: the
    method's own ``default_image_norm`` / ``default_text_norm``, chosen on real photos for the encoders'
    features (``bench/results/defaults_flickr8k.md``), and ``none`` when the method trains on a
    representation of its own (BITR's TR / CTR topic distributions must stay distributions)."""
    try:
        return default_norms_for(method_from_params(method, params or {}))
    except (CrossViewError, AttributeError, TypeError):
        cls = method_class(method)       # bad parameters are reported by the run's own checks
        return (getattr(cls, "default_image_norm", "none"), getattr(cls, "default_text_norm", "none"))


def default_encoders_of(method: str, params: dict[str, Any] | None = None) -> tuple[str | None, str | None]:
    """``(image_encoder, text_encoder)`` a run of ``method`` with ``params`` uses unless told otherwise: the method's
    own ``default_image_encoder`` / ``default_text_encoder`` (chosen by cross-validation on real photos,
    ``bench/results/rich_features_flickr8k.md``); None for the package defaults, and for a method that trains on a
    representation of its own (BITR's TR / CTR), reads the captions itself (no text encoder then) or the image files
    (``image_model=cnn``: no image encoder then)."""
    try:
        return default_encoders_for(method_from_params(method, params or {}))
    except (CrossViewError, AttributeError, TypeError):
        cls = method_class(method)
        return (getattr(cls, "default_image_encoder", None), getattr(cls, "default_text_encoder", None))


def default_encoders_for(method: Any) -> tuple[str | None, str | None]:
    """:func:`default_encoders_of` for a method object already made."""
    try:
        own = method.feature_representation()
    except (CrossViewError, AttributeError, TypeError):
        own = None
    if own:
        return (None, None)
    text = getattr(method, "default_text_encoder", None) if getattr(method, "needs_text_features", True) else None
    # a model that encodes the image files itself (image_model=cnn) gains nothing from richer frozen features
    image = None if getattr(method, "wants_image_files", False) else getattr(method, "default_image_encoder", None)
    return (image, text)


def default_norms_for(method: Any) -> tuple[str, str]:
    """:func:`default_norms_of` for a method object already made (the run makes one per start)."""
    try:
        own = method.feature_representation()
    except (CrossViewError, AttributeError, TypeError):
        own = None
    if own:
        return ("none", "none")
    return (getattr(method, "default_image_norm", "none"), getattr(method, "default_text_norm", "none"))
