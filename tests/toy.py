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


def toy_images(folder, size=(40, 40), n: int = 30) -> list[str]:
    """``n`` small PNGs ``im<i>.png`` in ``folder`` (one colour each); ``size`` is ``(w, h)`` or a function of
    the index giving it."""
    from PIL import Image

    paths = []
    for i in range(n):
        p = folder / f"im{i}.png"
        Image.new("RGB", size(i) if callable(size) else size, (i * 8, 100, 200)).save(p)
        paths.append(str(p))
    return paths


def toy_retriever(folder, size=(40, 40), hook=None, gallery: str = "test"):
    """A :class:`~crossview.engine.retriever.Retriever` of :class:`Identity` on :func:`toy_setup` with real image
    files in ``folder`` (``hook(features)`` may change the features first)."""
    from crossview.engine.retriever import Retriever

    ds, feats, _ = toy_setup(toy_images(folder, size))
    if hook is not None:
        hook(feats)
    return Retriever(Identity().fit(None), ds, feats, gallery=gallery)


def hand_explanation(path: str, text: str, direction: str):
    """An explanation drawn by hand for the image file ``path`` and ``text``: a map rising to the lower right
    over the whole image, word values rising along the caption (tests of the explain views, no backbone)."""
    from PIL import Image

    from crossview.explain import Explanation, RegionMap, WordImportance, caption_words

    with Image.open(path) as im:
        w, h = im.size
    values = np.add.outer(np.arange(4), np.arange(4)).astype(np.float32)
    region = RegionMap(values=values, score=float(values.mean()), mode="exact", crop_box=(0, 0, w, h),
                       image_size=(w, h), residual=0.0, direction=direction)
    words = caption_words(text)
    wi = WordImportance(words, np.linspace(-0.2, 1.0, len(words)).astype(np.float32), 0.5, "exact", 0.0)
    return Explanation(region=region, words=wi, image_path=path, text=text)
