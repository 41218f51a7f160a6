"""TR / CTR / modern representations (crossview.features.topics): visual words, topics, CCA projection."""

from __future__ import annotations

import numpy as np
import pytest

from crossview.data.dataset import PairedDataset
from crossview.core.errors import CrossViewError
from crossview.features import FeatureCache
from crossview.features import topics as T


# ---------------------------------------------------------------------------------- plain functions
def test_histograms_count_every_descriptor_once():
    rng = np.random.default_rng(0)
    words = rng.integers(0, 7, size=(5, 13))
    hist = T.bovw_histograms(words, 7)
    assert hist.shape == (5, 7)
    np.testing.assert_array_equal(hist.sum(1), np.full(5, 13))   # one count per local descriptor
    naive = np.zeros((5, 7))
    for i in range(5):
        for w in words[i]:
            naive[i, w] += 1
    np.testing.assert_array_equal(hist, naive)
    with pytest.raises(CrossViewError, match=r"\[0, 7\)"):
        T.bovw_histograms(np.array([[0, 7]]), 7)


def test_assign_visual_words_is_the_nearest_centre():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((200, 6)).astype(np.float32)
    cb = rng.standard_normal((9, 6)).astype(np.float32)
    got = T.assign_visual_words(x, cb, chunk=37)
    naive = [int(np.argmin([np.sum((xi - c) ** 2) for c in cb])) for xi in x]
    np.testing.assert_array_equal(got, naive)


def test_kmeans_codebook_finds_separated_clusters_and_is_seeded():
    rng = np.random.default_rng(2)
    centres = rng.standard_normal((5, 8)).astype(np.float32) * 10
    x = (np.repeat(centres, 60, axis=0) + 0.1 * rng.standard_normal((300, 8))).astype(np.float32)
    cb = T.kmeans_codebook(x, 5, seed=3)
    assert cb.shape == (5, 8) and cb.dtype == np.float32
    dist = np.sqrt(((centres[:, None, :] - cb[None]) ** 2).sum(-1))
    assert dist.min(1).max() < 0.5          # every true centre has a code word next to it
    np.testing.assert_array_equal(cb, T.kmeans_codebook(x, 5, seed=3))
    with pytest.raises(CrossViewError, match="lower n_words"):
        T.kmeans_codebook(x[:9], 5)


def test_topic_rows_are_distributions():
    rng = np.random.default_rng(3)
    counts = rng.poisson(1.0, size=(40, 30)).astype(np.float32)
    counts[:, 0] += 1  # no empty document
    lda = T.fit_topic_model(counts, 6, seed=0, max_iter=5)
    t = T.topic_distributions(lda, counts)
    assert t.shape == (40, 6) and t.dtype == np.float32
    assert (t >= 0).all()
    np.testing.assert_allclose(t.sum(1), 1.0, atol=1e-5)
    with pytest.raises(CrossViewError, match="n_topics"):
        T.fit_topic_model(counts, 0)


# ---------------------------------------------------------------------------------- the pipeline
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30)}


class PatchEncoder:
    """A fast stand-in for the CNN: 4 x 4 patches of each image, descriptor = patch mean and std of RGB."""

    name = "patches"
    local_dim = 6

    def __init__(self) -> None:
        self.calls = 0

    def cache_parts(self, local: bool = False) -> dict:
        return {"name": self.name, "local": local}

    def encode_paths(self, paths, *, local=False, progress=None, should_stop=None, **_):
        from PIL import Image

        self.calls += 1
        out = []
        for p in paths:
            a = np.asarray(Image.open(p).convert("RGB").resize((32, 32)), dtype=np.float32) / 255
            patches = a.reshape(4, 8, 4, 8, 3).transpose(0, 2, 1, 3, 4).reshape(16, 64, 3)
            out.append(np.concatenate([patches.mean(1), patches.std(1)], axis=1))
        return np.stack(out).astype(np.float32)


@pytest.fixture(scope="module")
def colour_dataset(tmp_path_factory):
    """48 images: a coloured square on a grey background (4 colours in turn), captions naming the colour."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("colours")
    rng = np.random.default_rng(0)
    names = list(COLOURS)
    paths, caps, ci = [], [], []
    for i in range(48):
        c = names[i % 4]
        img = np.full((32, 32, 3), 128, dtype=np.uint8)
        x, y = rng.integers(0, 9, 2)
        img[y:y + 24, x:x + 24] = COLOURS[c]
        p = folder / f"{i}.png"
        Image.fromarray(img).save(p)
        paths.append(str(p))
        for t in (f"a {c} square", f"the {c} box on grey", f"{c} shape in a picture"):
            caps.append(t)
            ci.append(i)
    return PairedDataset(name="colours", captions=caps, caption_image=np.array(ci), image_paths=paths,
                         splits={"train": np.arange(36), "val": np.arange(36, 42), "test": np.arange(42, 48)})


@pytest.fixture()
def patch_encoder(monkeypatch):
    enc = PatchEncoder()
    from crossview.features import image as image_mod

    monkeypatch.setattr(image_mod, "create_image_encoder", lambda name, **kw: enc)
    return enc


def test_tr_rows_sum_to_one_and_are_fitted_on_train_only(colour_dataset, patch_encoder, tmp_path):
    cache = FeatureCache(tmp_path / "cache")
    kw = {"n_words": 20, "n_topics": 4, "cache": cache}
    stages = []
    rep = T.build_representation(colour_dataset, "tr", progress=lambda s, d, n: stages.append(s), **kw)
    assert rep.image.shape == (48, 4) and rep.text.shape == (144, 4)
    np.testing.assert_allclose(rep.image.sum(1), 1.0, atol=1e-5)
    np.testing.assert_allclose(rep.text.sum(1), 1.0, atol=1e-5)
    assert "visual words" in stages and "fit text" in stages
    np.testing.assert_array_equal(rep.fit_images, np.arange(36))
    assert rep.info["descriptors_per_image"] == 16 and not rep.info["image_cache_hit"]
    # Topics separate the colours: images of one colour are closer to each other than to other colours.
    colour = np.arange(48) % 4
    sim = rep.image @ rep.image.T
    same = sim[colour[:, None] == colour[None, :]].mean()
    other = sim[colour[:, None] != colour[None, :]].mean()
    assert same > other
    # A second build hits the cache (no CNN pass) and gives the same features.
    again = T.build_representation(colour_dataset, "tr", **kw)
    assert again.info["image_cache_hit"] and again.info["local_cache_hit"] and patch_encoder.calls == 1
    np.testing.assert_array_equal(again.image, rep.image)
    # Test captions never reach the fitted text side: changing them leaves the training rows unchanged.
    ds2 = colour_dataset.subset(np.arange(48))
    ds2.captions = [c if i < 126 else "zebra zebra zebra" for i, c in enumerate(ds2.captions)]
    rep2 = T.build_representation(ds2, "tr", **kw)
    np.testing.assert_allclose(rep2.text[:108], rep.text[:108], atol=1e-6)
    np.testing.assert_allclose(rep.encode_captions(["a red square"]), rep.text[:1], atol=1e-6)


def test_ctr_shapes_normalisation_and_correlation_order(colour_dataset, patch_encoder, tmp_path):
    rep = T.build_representation(colour_dataset, "ctr", n_words=20, n_topics=6, cache=FeatureCache(tmp_path))
    assert rep.image.shape == (48, 6) and rep.text.shape == (144, 6)
    np.testing.assert_allclose(np.linalg.norm(rep.image, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(rep.text, axis=1), 1.0, atol=1e-5)
    corr = np.asarray(rep.info["correlations"])
    assert np.all(np.diff(corr) <= 1e-12) and corr[0] > 0.5
    # The canonical variates (before normalisation) of the training pairs have exactly these correlations.
    res = rep.info["cca"]
    tr = T.build_representation(colour_dataset, "tr", n_words=20, n_topics=6, cache=FeatureCache(tmp_path))
    caps = np.flatnonzero(colour_dataset.caption_image < 36)
    u = (tr.image[colour_dataset.caption_image[caps]] - res.x_mean) @ res.x_proj
    v = (tr.text[caps] - res.y_mean) @ res.y_proj
    live = int(np.sum(corr > 1e-3))  # TR rows sum to 1, so the last direction(s) carry no correlation
    assert live >= 2
    emp = np.array([np.corrcoef(u[:, k], v[:, k])[0, 1] for k in range(live)])
    assert np.all(np.diff(emp) <= 1e-6)                  # ordered by correlation
    # The ridge only adds to the variances, so the reported correlations are at most the empirical ones.
    assert np.all(corr[:live] <= emp + 1e-6) and np.all(corr[:live] >= emp - 0.15)
    # Matching by the CTR dot product finds a caption of the right colour far above chance (1/4).
    best = (rep.image @ rep.text.T).argmax(1)
    assert np.mean(colour_dataset.caption_image[best] % 4 == np.arange(48) % 4) >= 0.75


def test_splits_give_method_data_of_each_split(colour_dataset, patch_encoder, tmp_path):
    sp = T.representation_splits(colour_dataset, "tr", n_words=20, n_topics=6, cache=FeatureCache(tmp_path))
    assert (sp.train.n_images, sp.val.n_images, sp.test.n_images) == (36, 6, 6)
    assert sp.train.n_captions == 108 and sp.test.captions[0] == colour_dataset.captions[126]
    np.testing.assert_array_equal(sp.test.image_features, sp.representation.image[42:])
    no_test = colour_dataset.subset(np.arange(42))
    no_test.splits = {k: v for k, v in no_test.splits.items() if k != "test"}
    assert T.representation_splits(no_test, "tr", n_words=20, n_topics=6, cache=FeatureCache(tmp_path)).test is None


def test_modern_is_pca_of_cnn_features_and_glove(tmp_path):
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((300, 200)).astype(np.float32)
    caps = [f"a dog number {i % 7}" for i in range(300)]
    ds = PairedDataset(name="pre", captions=caps, caption_image=np.arange(300), image_features=feats,
                       splits={"train": np.arange(250), "test": np.arange(250, 300)})
    sp = T.representation_splits(ds, "modern", cache=FeatureCache(tmp_path))
    assert sp.train.image_features.shape == (250, 128) and sp.test.image_features.shape == (50, 128)
    assert sp.train.text_features.shape[1] == 50 and sp.representation.info["text_encoder"] == "glove"
    from crossview.features.image import PCAReducer

    np.testing.assert_allclose(sp.test.image_features, PCAReducer(128).fit(feats[:250]).transform(feats[250:]),
                               atol=1e-4)
    with pytest.raises(CrossViewError, match="representation modern or default"):
        T.build_representation(ds, "tr", cache=FeatureCache(tmp_path))


def test_bad_arguments_are_clear(colour_dataset):
    with pytest.raises(CrossViewError, match="unknown representation 'sift'.*default, modern, tr, ctr"):
        T.build_representation(colour_dataset, "sift")
    with pytest.raises(CrossViewError, match="no split 'restval'.*train, val, test"):
        T.build_representation(colour_dataset, "tr", fit_images="restval")
    with pytest.raises(CrossViewError, match="--text-encoder only applies"):
        T.build_representation(colour_dataset, "tr", text_encoder="tfidf")
