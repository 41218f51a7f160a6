"""Caption tokenizing shared by statistics, vocabularies and text encoders."""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def tokenize(caption: str) -> list[str]:
    """Lower-cased word tokens: runs of letters/digits, keeping an apostrophe suffix ("man's")."""
    return _TOKEN.findall(caption.lower())


def word_counts(captions: Iterable[str]) -> Counter:
    """Token frequencies over a caption collection."""
    counts: Counter = Counter()
    for c in captions:
        counts.update(tokenize(c))
    return counts
