"""The word vocabulary of the recurrent text encoders (VSE++'s GRU, the webly method, TIMAM's LSTM).

Ids follow VSE++'s ``vocab.py``: ``<pad>`` = 0, ``<start>`` = 1, ``<end>`` = 2, ``<unk>`` = 3, then the
kept words by decreasing count (ties alphabetical, so a vocabulary is a pure function of its captions).
Words are the tokens of :func:`crossview.data.text.tokenize` (lower-cased). A vocabulary is saved as a
plain dict (:meth:`Vocabulary.to_dict`), which goes into a method's checkpoint.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from crossview.data.text import tokenize
from crossview.core.errors import CrossViewError

__all__ = ["Vocabulary", "PAD", "START", "END", "UNK", "SPECIALS"]

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
_FORMAT = 1


class Vocabulary:
    """Word <-> id maps with the four special tokens first.

    Build one with :meth:`from_captions`; ``len(vocab)`` counts the special tokens too.
    """

    def __init__(self, words: Sequence[str] = (), counts: Mapping[str, int] | None = None,
                 min_count: int = 1) -> None:
        """``words``: the kept words in id order, without the special tokens."""
        self.min_count = int(min_count)
        self.words: list[str] = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.word_to_id: dict[str, int] = {w: i for i, w in enumerate(self.words)}
        if len(self.word_to_id) != len(self.words):
            raise CrossViewError("vocabulary has a word twice; rebuild it with Vocabulary.from_captions")
        self.counts: dict[str, int] = dict(counts or {})

    pad_id, start_id, end_id, unk_id = 0, 1, 2, 3

    @classmethod
    def from_captions(cls, captions: Iterable[str], min_count: int = 1,
                      max_size: int | None = None) -> "Vocabulary":
        """Words seen at least ``min_count`` times (VSE++ uses 4), the ``max_size`` most frequent at most."""
        if min_count < 1:
            raise CrossViewError(f"vocabulary min_count must be >= 1, got {min_count}")
        if max_size is not None and max_size < 1:
            raise CrossViewError(f"vocabulary max_size must be >= 1 or None, got {max_size}")
        counts: Counter = Counter()
        n = 0
        for c in captions:
            counts.update(tokenize(c))
            n += 1
        if n == 0:
            raise CrossViewError("cannot build a vocabulary from no captions; give it the training captions")
        kept = sorted((w for w, k in counts.items() if k >= min_count and w not in SPECIALS),
                      key=lambda w: (-counts[w], w))
        if max_size is not None:
            kept = kept[:max_size]
        return cls(kept, {w: counts[w] for w in kept}, min_count=min_count)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self.word_to_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.words == other.words

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} ids, min_count={self.min_count})"

    def id_of(self, word: str) -> int:
        """The id of ``word`` (``unk_id`` when it is not in the vocabulary)."""
        return self.word_to_id.get(word, self.unk_id)

    def encode(self, caption: str, add_start_end: bool = True) -> list[int]:
        """Token ids of one caption, framed by ``<start>`` / ``<end>`` unless ``add_start_end`` is False.

        An empty caption gives ``[<start>, <end>]`` (or ``[]``).
        """
        ids = [self.word_to_id.get(w, self.unk_id) for w in tokenize(caption)]
        return [self.start_id, *ids, self.end_id] if add_start_end else ids

    def encode_batch(self, captions: Sequence[str], max_len: int | None = None,
                     add_start_end: bool = True, trim: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(ids (n, L) int64 padded with <pad>, lengths (n,) int64)``.

        ``L`` is ``max_len`` when given (longer captions are cut, keeping ``<end>`` as the last token),
        else the longest caption's length; ``trim``: at most the longest caption's length (the columns past it
        are all ``<pad>``; a table of COCO's 550K training captions is 282 MB at ``max_len`` 64, 70 MB at its
        longest caption, 16 ids).
        """
        if max_len is not None and max_len < (2 if add_start_end else 1):
            raise CrossViewError(f"max_len={max_len} is too short to hold a caption")
        seqs = [self.encode(c, add_start_end) for c in captions]
        if max_len is not None:
            seqs = [s if len(s) <= max_len else
                    (s[:max_len - 1] + [self.end_id] if add_start_end else s[:max_len]) for s in seqs]
        longest = max((len(s) for s in seqs), default=0)
        width = longest if max_len is None else min(max_len, longest) if trim else max_len
        ids = np.full((len(seqs), width), self.pad_id, dtype=np.int64)
        lengths = np.zeros(len(seqs), dtype=np.int64)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = s
            lengths[i] = len(s)
        return ids, lengths

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> list[str]:
        """Words of an id sequence (stops at ``<end>`` and drops ``<pad>``/``<start>`` when ``skip_special``)."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.words):
                raise CrossViewError(f"token id {i} is outside this vocabulary of {len(self.words)} ids")
            if skip_special:
                if i == self.end_id:
                    break
                if i in (self.pad_id, self.start_id):
                    continue
            out.append(self.words[i])
        return out

    # ---------------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON-able) that :meth:`from_dict` turns back into an equal vocabulary."""
        return {"format": _FORMAT, "specials": list(SPECIALS), "words": self.words[len(SPECIALS):],
                "counts": [int(self.counts.get(w, 0)) for w in self.words[len(SPECIALS):]],
                "min_count": self.min_count}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Vocabulary":
        """Inverse of :meth:`to_dict`; raises :class:`CrossViewError` on a malformed dict."""
        if not isinstance(d, Mapping) or "words" not in d:
            raise CrossViewError("not a saved vocabulary (no 'words' entry); the checkpoint may be damaged "
                                 "or from another program: retrain or rebuild the vocabulary")
        if list(d.get("specials", SPECIALS)) != list(SPECIALS):
            raise CrossViewError(f"saved vocabulary has special tokens {d.get('specials')}, expected "
                                 f"{list(SPECIALS)}; it was written by an incompatible version: rebuild it")
        words = [str(w) for w in d["words"]]
        counts = d.get("counts") or []
        if counts and len(counts) != len(words):
            raise CrossViewError(f"saved vocabulary has {len(words)} words but {len(counts)} counts: rebuild it")
        return cls(words, dict(zip(words, (int(c) for c in counts))), min_count=int(d.get("min_count", 1)))
