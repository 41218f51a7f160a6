"""The one caption tokenizer, shared by statistics, vocabularies, text encoders, the demo's Karpathy files
and the POS tagger (issue 12: there were four regexes).

Words are runs of ASCII letters and digits, keeping an apostrophe suffix (``man's``, ``isn't``) and split at
hyphens (``t-shirt`` is ``t``, ``shirt``). With ``punctuation=True`` (what a POS tagger wants, as in the Penn
Treebank) a hyphenated compound stays one token and every other non-space character is a token of its own.
The word pattern is the one bag-of-words, TF-IDF and the vocabularies have always used, so their cached
features stay valid: feature cache keys do not include the tokenizer, and nothing cached changed.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

_WORD = r"[A-Za-z0-9]+(?:'[A-Za-z]+)?"
# group 1: a word or a hyphenated compound of words; group 2: any other non-space character
_TOKEN = re.compile(rf"({_WORD}(?:-{_WORD})*)|([^\sA-Za-z0-9])")


def tokenize(caption: str, *, lower: bool = True, punctuation: bool = False) -> list[str]:
    """Word tokens of ``caption`` in order, lower-cased unless ``lower=False``.

    ``punctuation=False`` (words for vocabularies and statistics): compounds are split at their hyphens and
    punctuation is dropped. ``punctuation=True`` (for a tagger): compounds stay whole and each punctuation
    mark is a token.
    """
    text = caption.lower() if lower else caption
    if punctuation:
        return [word or mark for word, mark in _TOKEN.findall(text)]
    return [part for word, _ in _TOKEN.findall(text) if word for part in word.split("-")]


def word_counts(captions: Iterable[str]) -> Counter:
    """Token frequencies over a caption collection."""
    counts: Counter = Counter()
    for c in captions:
        counts.update(tokenize(c))
    return counts
