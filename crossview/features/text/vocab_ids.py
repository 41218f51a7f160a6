"""Token ids of a fitted vocabulary as features (``<start> ... <end>``, padded), for recurrent encoders."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from crossview.features.text.base import TextEncoder, _check_captions, register_text_encoder
from crossview.features.vocab import Vocabulary


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
