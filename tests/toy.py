"""Tiny fitted 'methods', encoders and datasets shared by tests of the query machinery."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.methods.base import Method


class Identity(Method):
    """A fitted 'method' whose embeddings are the features themselves (the features share one space)."""

    name = "identity-test"

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def fit_iter(self, train, val=None, *, resume=False):
        self.fitted_ = True
        yield from ()

    def encode_images(self, data, direction="i2t"):
        return data.image_features * self.scale

    def encode_texts(self, data, direction="i2t"):
        return data.require_text_features(self.name)


class BagOfColours:
    """A text 'encoder' mapping a sentence to counts of three colour words (enough to test queries)."""

    name = "colours"
    words = ("red", "green", "blue")

    def encode(self, captions, device="cpu", **_):
        return np.array([[c.lower().split().count(w) for w in self.words] for c in captions], np.float32)


def toy_setup(image_paths=None):
    rng = np.random.default_rng(0)
    n = 30
    colours = rng.integers(0, 3, n)
    image = np.eye(3, dtype=np.float32)[colours] + 0.01 * rng.standard_normal((n, 3)).astype(np.float32)
    caps, ci = [], []
    for i in range(n):
        w = BagOfColours.words[colours[i]]
        caps += [f"a {w} thing {i}", f"something {w}"]
        ci += [i, i]
    ds = PairedDataset(name="toy", captions=caps, caption_image=np.array(ci), image_paths=image_paths or [f"/x/{i}.png" for i in range(n)],
                       splits={"train": np.arange(20), "test": np.arange(20, 30)})
    enc = BagOfColours()
    text = enc.encode(caps) + 0.01 * rng.standard_normal((len(caps), 3)).astype(np.float32)
    feats = SimpleNamespace(image=image, text=text, text_model=enc, image_encoder="x", spec={})
    return ds, feats, colours
