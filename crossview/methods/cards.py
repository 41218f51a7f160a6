"""Method cards: ``models/<method>.toml`` (format in ``models/README.md``), read with :mod:`tomllib`.

A card holds what the code cannot say about itself: the paper, a description for people, help texts,
types, ranges and choices of the parameters (the GUI builds its training form from them, the command
line types ``--set key=value`` with them) and the numbers the paper reports. Defaults are written once,
in the method's ``__init__`` signature: a card that states one is an error (issue 12: they were written
twice and could drift apart), and :attr:`ParamSpec.default` is read from the signature.
"""

from __future__ import annotations

import ast
import math
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crossview.core.errors import CrossViewError
from crossview.core.resources import models_dir

__all__ = ["ParamSpec", "MethodCard", "card_path", "load_card", "find_card", "list_cards", "parse_card",
           "PARAM_TYPES", "coerce_param", "run_setting_spec"]

#: Parameter types a card may declare.
PARAM_TYPES = ("int", "float", "str", "bool", "list[int]", "list[float]", "list[str]")

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}


def _infer_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (list, tuple)):
        inner = {_infer_type(v) for v in value}
        if inner <= {"int"}:
            return "list[int]"
        if inner <= {"int", "float"}:
            return "list[float]"
        return "list[str]"
    return "str"


def _scalar(kind: str, value: Any, where: str) -> Any:
    """``value`` (a string from the command line or a TOML / Python value) as ``kind``."""
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                return int(value)
            if isinstance(value, str):
                text = value.strip().replace("_", "")
                try:
                    return int(text)
                except ValueError:
                    f = float(text)         # "1e3" is a fine way to write 1000
                    if not f.is_integer():
                        raise
                    return int(f)
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            f = float(value)
            if not math.isfinite(f):      # inf / nan (or 1e999) is no setting: it trained all-zero embeddings
                raise CrossViewError(f"{where}: expected a finite number, got {value!r}")
            return f
        return str(value)
    except (TypeError, ValueError, OverflowError):
        expected = {"bool": "true or false", "int": "an integer", "float": "a number"}.get(kind, "text")
        raise CrossViewError(f"{where}: expected {expected}, got {value!r}") from None


def coerce_param(kind: str, value: Any, where: str = "parameter") -> Any:
    """``value`` converted to the card type ``kind``; strings are parsed (lists: comma-separated or a
    Python/JSON list literal). Raises :class:`CrossViewError` naming ``where`` when it does not fit."""
    if kind not in PARAM_TYPES:
        raise CrossViewError(f"{where}: unknown type {kind!r}; use one of {', '.join(PARAM_TYPES)}")
    if not kind.startswith("list["):
        return _scalar(kind, value, where)
    inner = kind[5:-1]
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("[", "(")):
            try:
                value = list(ast.literal_eval(text))
            except (ValueError, SyntaxError):
                raise CrossViewError(f"{where}: cannot read the list {value!r}; write e.g. 1e-3,1e-1,10") from None
        else:
            value = [v for v in (p.strip() for p in text.split(",")) if v]
    elif not isinstance(value, (list, tuple)):
        value = [value]
    return [_scalar(inner, v, where) for v in value]


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of a card: ``default``, ``type`` (see :data:`PARAM_TYPES`), ``help``, optional
    ``choices`` / ``min`` / ``max``, and ``flag`` (an extra command-line option for it, e.g. ``--c-grid``)."""

    name: str
    default: Any
    type: str
    help: str = ""
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    flag: str | None = None
    optional: bool = False  #: the value may also be None ("none" on the command line)

    @property
    def default_text(self) -> str:
        """The default as one would type it after ``--set NAME=``: ``none``, ``1,2,3`` for a list, else its repr."""
        if self.default is None:
            return "none"
        if isinstance(self.default, (list, tuple)):
            return ",".join(map(str, self.default))
        return repr(self.default)

    def coerce(self, value: Any, method: str = "") -> Any:
        """``value`` (or a command-line string) converted to this type and checked against the range
        and choices; :class:`CrossViewError` naming the parameter otherwise."""
        where = f"{method + ' ' if method else ''}parameter {self.name!r}"
        if self.optional and (value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null"))):
            return None
        v = coerce_param(self.type, value, where)
        for item in (v if isinstance(v, list) else [v]):
            if self.choices is not None and item not in self.choices:
                raise CrossViewError(f"{where}: {item!r} is not one of {', '.join(map(repr, self.choices))}")
            if self.min is not None and item < self.min:
                raise CrossViewError(f"{where}: {item!r} is below the minimum {self.min}")
            if self.max is not None and item > self.max:
                raise CrossViewError(f"{where}: {item!r} is above the maximum {self.max}")
        return v


@dataclass(frozen=True)
class MethodCard:
    """A parsed ``models/<name>.toml``."""

    name: str
    title: str
    description: str
    paper: str = ""
    citation: str = ""
    params: dict[str, ParamSpec] = field(default_factory=dict)
    paper_results: list[dict[str, Any]] = field(default_factory=list)
    path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """The first sentence / line of the description (for ``crossview train --list``)."""
        text = " ".join(self.description.split())
        end = text.find(". ")
        return text if end < 0 else text[:end + 1]

    def defaults(self) -> dict[str, Any]:
        """``{param: default}`` of the card's parameters (read from the method's signature)."""
        return {n: p.default for n, p in self.params.items()}

    def coerce_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Each of ``params`` converted with its :class:`ParamSpec` (unknown names pass through)."""
        return {k: (self.params[k].coerce(v, self.name) if k in self.params else v) for k, v in params.items()}


_RUN_SETTING_MIN = {"seed": 0, "workers": 0, "log_every": 1}


def run_setting_spec(name: str) -> ParamSpec | None:
    """How to read a run setting given like a parameter (``--set seed=3``, ``--set n_jobs=4``): a :class:`ParamSpec`
    typed by its :class:`~crossview.core.run_settings.RunSettings` field (cards never list run settings);
    ``None`` when ``name`` is not a run setting."""
    from crossview.core.run_settings import RUN_SETTING_HELP, RUN_SETTING_PARAMS, RunSettings

    field_name = RUN_SETTING_PARAMS.get(name)
    if field_name is None:
        return None
    hint = typing.get_type_hints(RunSettings)[field_name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    kind = {bool: "bool", int: "int", float: "float"}.get(base, "str")
    default = RunSettings.__dataclass_fields__[field_name].default
    return ParamSpec(name=name, default=default, type=kind, help=RUN_SETTING_HELP.get(field_name, ""),
                     min=_RUN_SETTING_MIN.get(field_name), optional=bool(args) and type(None) in typing.get_args(hint))


def card_path(name: str) -> Path:
    """``models_dir() / f"{name}.toml"``."""
    return models_dir() / f"{name}.toml"


def _signature_defaults(path: Path) -> dict[str, Any]:
    """``{param: default}`` of the registered method the card at ``path`` describes."""
    from crossview.methods import list_methods, method_class

    if path.stem not in list_methods():
        raise CrossViewError(f"{path}: no registered method {path.stem!r} to take the parameter defaults from "
                             "(a card describes the method of its file name; defaults live in its __init__)")
    return method_class(path.stem).default_params()


def parse_card(path: str | Path, defaults: dict[str, Any] | None = None) -> MethodCard:
    """Read and check one card file; :class:`CrossViewError` naming the file and the entry otherwise.

    ``defaults``: ``{param: default}`` of the method (default: read from the ``__init__`` signature of the
    registered method named like the file); every parameter of the card must have one there.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CrossViewError(f"{path}: method card not found") from None
    except tomllib.TOMLDecodeError as e:
        raise CrossViewError(f"{path}: not valid TOML ({e}); see models/README.md for the card format") from None
    meta = raw.get("method")
    if not isinstance(meta, dict):
        raise CrossViewError(f"{path}: no [method] table; see models/README.md for the card format")
    for key in ("name", "title", "description"):
        if not isinstance(meta.get(key), str) or not meta[key].strip():
            raise CrossViewError(f"{path}: [method] needs a non-empty string {key!r}")
    if meta["name"] != path.stem:
        raise CrossViewError(f"{path}: [method] name is {meta['name']!r} but the file is {path.name}; "
                             "the card of method NAME must be models/NAME.toml")
    params: dict[str, ParamSpec] = {}
    specs = raw.get("params") or {}
    if specs and defaults is None:
        defaults = _signature_defaults(path)
    for pname, spec in specs.items():
        where = f"{path} [params.{pname}]"
        if not isinstance(spec, dict):
            raise CrossViewError(f"{where}: must be a table of help, type, min, max, choices, flag, optional")
        if "default" in spec:
            raise CrossViewError(f"{where}: states a default; the method's __init__ signature is the one place "
                                 "for defaults (delete the 'default' line)")
        assert defaults is not None
        if pname not in defaults:
            raise CrossViewError(f"{where}: the method has no parameter {pname!r} with a default (its "
                                 f"parameters: {', '.join(defaults) or 'none'})")
        default = defaults[pname]
        optional = bool(spec.get("optional", False)) or default is None
        kind = spec.get("type") or (_infer_type(default) if default is not None else "str")
        if kind not in PARAM_TYPES:
            raise CrossViewError(f"{where}: type {kind!r} is not one of {', '.join(PARAM_TYPES)}")
        unknown = set(spec) - {"type", "help", "choices", "min", "max", "flag", "optional"}
        if unknown:
            raise CrossViewError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        flag = spec.get("flag")
        if flag is not None and (not isinstance(flag, str) or not flag.startswith("--")):
            raise CrossViewError(f"{where}: flag must look like '--name', got {flag!r}")
        choices = spec.get("choices")
        p = ParamSpec(name=pname, default=default, type=kind, help=str(spec.get("help", "")),
                      choices=tuple(choices) if choices is not None else None,
                      min=spec.get("min"), max=spec.get("max"), flag=flag, optional=optional)
        if default is not None:
            try:
                p = ParamSpec(**{**p.__dict__, "default": p.coerce(default)})
            except CrossViewError as e:
                raise CrossViewError(f"{where}: the signature's default {default!r} does not fit the card's spec "
                                     f"({e})") from None
        params[pname] = p
    results = raw.get("paper_results") or []
    if isinstance(results, dict):
        results = [results]
    for i, r in enumerate(results):
        if not isinstance(r, dict) or "dataset" not in r:
            raise CrossViewError(f"{path}: paper_results entry {i + 1} needs at least 'dataset' "
                                 "(and 'setting' and the metrics)")
    return MethodCard(name=meta["name"], title=meta["title"].strip(), description=meta["description"].strip(),
                      paper=str(meta.get("paper", "")), citation=str(meta.get("citation", "")).strip(),
                      params=params, paper_results=list(results), path=path,
                      extra={k: v for k, v in raw.items() if k not in ("method", "params", "paper_results")})


def find_card(name: str) -> MethodCard | None:
    """The card of method ``name``, or None when ``models/<name>.toml`` does not exist."""
    path = card_path(name)
    return parse_card(path) if path.is_file() else None


def load_card(name: str) -> MethodCard:
    """The card of method ``name``; :class:`CrossViewError` naming the expected file when it is missing."""
    card = find_card(name)
    if card is None:
        raise CrossViewError(f"no card for method {name!r}: expected {card_path(name)} "
                             "(see models/README.md for the format)")
    return card


def list_cards() -> list[str]:
    """Names of the cards in ``models/``."""
    folder = models_dir()
    return sorted(p.stem for p in folder.glob("*.toml")) if folder.is_dir() else []
