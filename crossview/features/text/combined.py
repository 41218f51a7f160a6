"""Caption features that combine encoders: ``minilm+tfidf``, ``minilm+glove``, any ``A+B[+C...]``.

Each block's rows are L2-normalised, concatenated and scaled by ``1/sqrt(k)``
(:func:`crossview.features.normalize.concat_blocks`): MiniLM rows have norm 1, TF-IDF rows norm 1, averaged GloVe
rows norms of a few units, so without it one block would weigh more by its scale alone. The dot product of two
combined rows is the mean of the blocks' cosines; a block that is all zeros for a caption (TF-IDF or GloVe of a
caption with no known word) stays zero.

Fitted blocks (tfidf, bow, lda) learn on the fit captions as they would alone. The combined encoder's state is its
blocks' state dicts, so a run's checkpoint rebuilds it exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.features.text.base import TextEncoder, _check_captions

__all__ = ["CombinedTextEncoder", "TEXT_ENCODER_EXAMPLES"]

#: Combinations worth offering beside the single encoders (CLI help, the app's Train panel).
TEXT_ENCODER_EXAMPLES = ("minilm+tfidf", "minilm+glove")

_VERSION = 1


class CombinedTextEncoder(TextEncoder):
    """Several caption encoders side by side, each block L2-normalised: ``(n, sum of dims) float32``.

    Build with ``create_text_encoder("minilm+tfidf")``; it takes no parameters of its own (each block has its
    defaults). ``blocks`` are the encoders in order.
    """

    defaults: dict[str, Any] = {}

    def __init__(self, names: Sequence[str]) -> None:
        from crossview.features.text.base import create_text_encoder

        super().__init__()
        names = [str(n).strip() for n in names]
        if len(names) < 2 or any(not n for n in names):
            raise CrossViewError(f"combined text encoder {'+'.join(names)!r}: join two or more encoder names with "
                                 "'+', e.g. minilm+tfidf")
        if len(set(names)) != len(names):
            raise CrossViewError(f"combined text encoder {'+'.join(names)!r} names an encoder twice")
        for n in names:
            if n == "vocab":
                raise CrossViewError("text encoder 'vocab' (token ids for the recurrent encoders) cannot be "
                                     "combined with others: its values are ids, not features")
        self.blocks = [create_text_encoder(n) for n in names]
        self.needs_fit = any(b.needs_fit for b in self.blocks)   # type: ignore[misc]  # per instance here
        self._fitted = not self.needs_fit

    @property
    def name(self) -> str:
        return "+".join(b.name for b in self.blocks)

    def check_available(self) -> None:
        for b in self.blocks:
            b.check_available()

    def _dim(self) -> int:
        return sum(b.dim for b in self.blocks)

    def _fit(self, captions: list[str]) -> None:
        for b in self.blocks:
            b.fit(captions)

    def iter_encode(self, captions: Sequence[str], *, batch_size: int = 256,
                    device: str = "cpu") -> Iterator[tuple[int, int]]:
        """Each block's features of ``captions`` in turn, combined; yields ``(done, total)`` over all blocks'
        captions (``total`` = ``k * n``), each block's share of it in proportion to its
        :attr:`~crossview.features.text.base.TextEncoder.relative_cost` (MiniLM's half of ``minilm+glove`` is most of
        the time: counted as half, a run's ETA took its pace for GloVe's too and overshot 2.8x), and returns
        ``(n, dim) float32``."""
        captions = _check_captions(captions)
        self._check_fitted()
        n, k = len(captions), len(self.blocks)
        total = k * n
        costs = [max(1e-6, float(getattr(b, "relative_cost", 1.0))) for b in self.blocks]
        before = [sum(costs[:j]) for j in range(k)]
        yield 0, total
        parts = []
        for j, b in enumerate(self.blocks):
            work = b.iter_encode(captions, batch_size=batch_size, device=device)
            while True:
                try:
                    done, _ = next(work)
                except StopIteration as end:
                    parts.append(np.asarray(end.value, dtype=np.float32))
                    break
                if done:
                    yield min(total, round(total * (before[j] + costs[j] * done / max(1, n)) / sum(costs))), total
        return self.combine(parts)

    @staticmethod
    def combine(parts: Sequence[np.ndarray]) -> np.ndarray:
        """The blocks' rows ``[(n, d_j)]`` -> ``(n, sum d_j) float32`` (per-block L2, ``1/sqrt(k)``)."""
        from crossview.features.normalize import concat_blocks

        return concat_blocks(parts)

    def cache_parts(self) -> dict[str, Any]:
        return {"name": self.name, "blocks": [b.cache_parts() for b in self.blocks], "combine": "l2-blocks",
                "version": _VERSION}

    def _get_state(self) -> dict[str, Any]:
        return {"blocks": [b.state_dict() for b in self.blocks]}

    def _set_state(self, state: Mapping[str, Any]) -> None:
        saved = state.get("blocks") if isinstance(state, Mapping) else None
        if not isinstance(saved, (list, tuple)) or len(saved) != len(self.blocks):
            raise CrossViewError(f"saved text encoder {self.name!r} does not hold one state per block; the "
                                 "checkpoint may be damaged: retrain")
        self.blocks = [TextEncoder.from_state_dict(d) for d in saved]
