"""Dataset strings made safe to show: one helper for the terminal and for labels.

A caption, split name, path or dataset name comes from a file someone else wrote. Printed as it is, an ANSI
escape sequence (``"\\x1b[31m"``) recolours or rewrites the user's terminal, a ``"\\r"`` overwrites the line,
and a lone UTF-16 surrogate (``"\\ud83d"``, legal in JSON) makes ``print`` raise ``UnicodeEncodeError``.
:func:`printable` shows each such character as its Python escape (``\\x1b``, ``\\r``, ``\\ud83d``), the way
``repr`` would, and leaves every other character (accents, CJK, emoji) as it is.
"""

from __future__ import annotations

import html
import re

#: C0 controls (tab and newline by flag), DEL, C1 controls, the Unicode line and paragraph separators
#: (``str.splitlines`` breaks on them), the bidirectional overrides and isolates (they reorder what follows
#: them on the line: "Trojan source"), and lone surrogates.
_OTHERS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_PATTERNS = {(nl, tab): re.compile("[" + _OTHERS + ("" if nl else "\n") + ("" if tab else "\t") + "]")
             for nl in (False, True) for tab in (False, True)}
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    c = match.group(0)
    if c in _NAMED:
        return _NAMED[c]
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, newlines: bool = False, tabs: bool = False) -> str:
    r"""``str(text)`` with control characters, line separators, bidirectional overrides and lone surrogates
    escaped (ESC shows as ``\x1b``, a lone surrogate as ``\ud83d``), so it can be printed or shown as one
    label whatever it holds. ``newlines`` / ``tabs`` keep newline / tab as they are (multi-line messages)."""
    return _PATTERNS[(newlines, tabs)].sub(_escape, str(text))


def html_text(text: object) -> str:
    """:func:`printable`, then HTML-escaped: a dataset string for a rich-text label (``<b>`` in a caption shows
    as written instead of turning the rest of the label bold)."""
    return html.escape(printable(text), quote=False)


def check_sentence(text: str, what: str = "the sentence") -> str:
    """``text`` when it is text a tokenizer can take, else one clear :class:`CrossViewError`: a lone UTF-16
    surrogate (bytes that were not UTF-8 on the command line, ``"\\ud800"`` in JSON) is no character at all, and
    the text encoders fail on it with their own traceback."""
    bad = re.search("[\ud800-\udfff]", text)
    if bad is not None:
        from crossview.core.errors import CrossViewError

        start = max(0, bad.start() - 12)
        raise CrossViewError(f"{what} is not valid UTF-8 text: it holds {printable(bad.group(0))} (bytes that are no "
                             f"character) in '{printable(text[start:bad.end() + 12])}'; give the sentence as UTF-8")
    return text


def has_unsafe(text: str) -> bool:
    """Whether :func:`printable` would change ``text`` (tabs and newlines counted as unsafe)."""
    return _PATTERNS[(False, False)].search(text) is not None
