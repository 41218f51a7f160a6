"""Length-sorted text batches (issue 30): the transformer encoder batches captions by their length in word
pieces, longest first, and returns the rows in the captions' own order, equal to encoding each caption alone
(no padding at all) and to plain batches in the given order."""

from __future__ import annotations

import numpy as np
import pytest

from crossview.core.errors import CrossViewError
from crossview.features.text import create_text_encoder

CAPTIONS = [
    "A dog .",
    "Two black and white dogs are looking at a grey and white kitty perched on some old equipment .",
    "A man in a red jacket climbs a snowy mountain with an ice axe",
    "kids",
    "A girl in a pink dress runs across the grass towards her father , who is holding a frisbee .",
    "Surfer rides a big wave",
    "",
    "Xylophonists zeugmata",          # fewer characters than "Surfer rides a big wave", more word pieces
    "A black and gray cat stands on a contraption while two big dogs stare at it .",
    "People",
]


@pytest.fixture(scope="module")
def minilm():
    enc = create_text_encoder("minilm")
    try:
        enc.check_available()
    except CrossViewError as e:
        pytest.skip(str(e))
    return enc


def test_batches_follow_word_pieces_longest_first(minilm) -> None:
    lengths = minilm.token_lengths(CAPTIONS)
    tok = minilm._begin("cpu")[0]
    assert lengths.tolist() == [len(tok(c)["input_ids"]) for c in CAPTIONS]     # [CLS] ... [SEP]
    order = minilm._order(CAPTIONS)
    assert sorted(order.tolist()) == list(range(len(CAPTIONS)))
    assert np.all(np.diff(lengths[order]) <= 0)
    # word pieces, not characters: the long rare words outrank a caption with more characters
    assert lengths[7] > lengths[5] and len(CAPTIONS[7]) < len(CAPTIONS[5])
    assert list(order).index(7) < list(order).index(5)


def test_sorted_batches_return_each_caption_in_its_place(minilm) -> None:
    got = minilm.encode(CAPTIONS, batch_size=3)
    ctx = minilm._begin("cpu")
    alone = np.vstack([minilm._encode_batch([c], ctx) for c in CAPTIONS])        # no padding at all
    plain = np.vstack([minilm._encode_batch(CAPTIONS[a:a + 3], ctx) for a in range(0, len(CAPTIONS), 3)])
    assert got.shape == (len(CAPTIONS), minilm.dim)
    np.testing.assert_allclose(got, alone, atol=2e-5)
    np.testing.assert_allclose(got, plain, atol=2e-5)
    # rows differ from one another (a mix-up of the order could not pass the comparison above by chance)
    assert np.min(np.linalg.norm(got[:, None] - got[None], axis=2)[~np.eye(len(CAPTIONS), dtype=bool)]) > 0.05
