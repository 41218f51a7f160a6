"""A small dataset whose captions and tags are English words GloVe knows (the toy dataset's ``class3`` words are
not), and a webly method trained on it in a few seconds: for the tag-branch tests (embed_tags, the Query panel's
tag mode, ``crossview query --tags``)."""

from __future__ import annotations

import numpy as np

from crossview.data.dataset import PairedDataset

#: one (subject, place) pair of nouns per latent class
CONCEPTS = [("dog", "grass"), ("cat", "sofa"), ("car", "street"), ("boat", "water"),
            ("bird", "tree"), ("horse", "field"), ("pizza", "table"), ("plane", "sky")]
_FORMS = ["a {a} on the {b}", "the {a} near some {b}", "one {a} and the {b}", "a photo of a {a} by the {b}"]

#: small settings: Stage I only (no web set), a second or two on a CPU
FAST = {"embed_dim": 16, "batch_size": 32, "max_epochs": 6, "lr": 0.005, "lr_decay_epoch": 0,
        "stage2_epochs": 0, "text_model": "features", "patience": 0}
#: the run settings they train with (Method.with_run; --device / --set on the command line)
RUN = {"device": "cpu", "log_every": 50}


def make_word_dataset(n_images: int = 160, seed: int = 0) -> PairedDataset:
    """Images of ``len(CONCEPTS)`` classes (16-d features: class mean + noise), two captions each naming the
    class's two nouns; the true tags of an image are its class's nouns. Splits 60 / 20 / 20 %."""
    rng = np.random.default_rng(seed)
    k = len(CONCEPTS)
    classes = np.arange(n_images) % k
    means = rng.normal(size=(k, 16)) * 2.0
    image = (means[classes] + rng.normal(size=(n_images, 16))).astype(np.float32)
    captions, caption_image = [], []
    for i, c in enumerate(classes):
        a, b = CONCEPTS[c]
        for form in rng.choice(_FORMS, size=2, replace=False):
            captions.append(form.format(a=a, b=b))
            caption_image.append(i)
    n_tr, n_va = int(0.6 * n_images), int(0.2 * n_images)
    splits = {"train": np.arange(n_tr), "val": np.arange(n_tr, n_tr + n_va),
              "test": np.arange(n_tr + n_va, n_images)}
    return PairedDataset(name="words", captions=captions, caption_image=np.array(caption_image),
                         image_features=image, labels=classes, splits=splits, format="toy",
                         tags=[list(CONCEPTS[c]) for c in classes])


class WordCounts:
    """A text 'encoder': counts of the dataset's caption words (what :func:`word_features` gives its captions),
    so new sentences can be queried too."""

    name = "word-counts"

    def __init__(self, ds: PairedDataset) -> None:
        self.index = {w: j for j, w in enumerate(sorted({w for c in ds.captions for w in c.split()}))}

    def encode(self, captions: list[str], device: str = "cpu", **_: object) -> np.ndarray:
        out = np.zeros((len(captions), len(self.index)), dtype=np.float32)
        for r, c in enumerate(captions):
            for w in c.lower().replace(",", " ").split():
                if w in self.index:
                    out[r, self.index[w]] += 1
        return out


def word_features(ds: PairedDataset) -> tuple[np.ndarray, np.ndarray]:
    """``(image, text)``: the dataset's image rows and bag-of-words counts of its captions."""
    return np.asarray(ds.image_features), WordCounts(ds).encode(ds.captions)


def trained_webly(ds: PairedDataset, **params):
    """A webly method fitted (Stage I) on the dataset's train split."""
    from crossview.data.method_data import MethodData
    from crossview.methods import create_method

    img, txt = word_features(ds)
    m = create_method("webly", **{**FAST, **params}).with_run(**RUN)
    m.fit(MethodData.from_features(ds, img, txt, "train"))
    return m
