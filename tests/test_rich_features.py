"""Richer frozen features (issue 33, item 3): flip averaging, concatenated backbones, combined caption features."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.data.dataset import PairedDataset
from crossview.features import FeatureCache, extract_features, run_image_encoder
from crossview.features.image import ConcatImageEncoder, create_image_encoder, parse_image_encoder
from crossview.features.normalize import concat_blocks
from crossview.features.text import CombinedTextEncoder, TextEncoder, create_text_encoder

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[str]:
    """Five small RGB images, not left-right symmetric (a gradient plus noise)."""
    folder = tmp_path_factory.mktemp("rich_imgs")
    rng = np.random.default_rng(1)
    paths = []
    for i in range(5):
        h, w = 48 + 5 * i, 64 - 2 * i
        ramp = np.linspace(0, 200, w)[None, :, None] * np.array([1.0, 0.5 + 0.1 * i, 0.2])
        arr = np.clip(ramp + rng.random((h, w, 3)) * 55, 0, 255).astype(np.uint8)
        p = folder / f"im{i}.png"
        Image.fromarray(arr).save(p)
        paths.append(str(p))
    return paths


def _dataset(paths: list[str]) -> PairedDataset:
    caps = [f"a picture number {i} of a red dog" for i in range(len(paths))]
    return PairedDataset(name="rich", captions=caps, caption_image=np.arange(len(paths)), image_paths=paths,
                         splits={"train": np.arange(len(paths))})


# ------------------------------------------------------------------------------------------ names

def test_encoder_names_parse_and_bad_ones_say_what_to_write() -> None:
    assert parse_image_encoder("efficientnet_lite0") == (["efficientnet_lite0"], False)
    assert parse_image_encoder("efficientnet_lite0:flip") == (["efficientnet_lite0"], True)
    assert parse_image_encoder("efficientnet_lite0+mobilenet_v2:flip") == (["efficientnet_lite0", "mobilenet_v2"],
                                                                            True)
    for bad, says in [("efficientnet_lite0:flop", "only option is ':flip'"), ("resnet18++vgg19", "empty part"),
                      ("resnet18+resnet18", "twice"), ("resnet9+resnet18", "unknown image encoder 'resnet9'")]:
        with pytest.raises(CrossViewError, match=says):
            parse_image_encoder(bad)
    with pytest.raises(CrossViewError, match="--weights names one backbone"):
        create_image_encoder("resnet18+mobilenet_v2", weights="x.pth", allow_random=True)


# ------------------------------------------------------------------------------------------ flip

def test_flip_averaging_is_the_mean_of_the_two_passes_done_by_hand(images) -> None:
    plain = create_image_encoder("resnet18", allow_random=True)
    flip = create_image_encoder("resnet18:flip", allow_random=True)
    assert flip.flip and flip.name == "resnet18" and flip.full_name == "resnet18:flip"
    got = flip.encode_paths(images, batch_size=2, num_workers=0)

    mods = plain.load()
    transform = plain.make_transform()
    with torch.inference_mode():
        x = torch.stack([transform(Image.open(p).convert("RGB")) for p in images])
        a = mods["head"](mods["body"](x))
        b = mods["head"](mods["body"](torch.flip(x, dims=[3])))   # the mirror: columns reversed
    want = ((a + b) / 2).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    unflipped = plain.encode_paths(images, num_workers=0)
    np.testing.assert_allclose(unflipped, a.numpy(), rtol=1e-4, atol=1e-5)
    assert np.abs(got - unflipped).max() > 1e-3, "the images are not symmetric: flipping must change the features"

    # local descriptors: the mirror's map flipped back, so their mean is still the pooled (flip-averaged) feature
    local = flip.encode_paths(images, num_workers=0, local=True)
    np.testing.assert_allclose(local.mean(axis=1), got, rtol=1e-4, atol=1e-5)


def test_flip_is_part_of_the_cache_key_and_a_flip_run_does_not_reuse_plain_features(images, tmp_path) -> None:
    plain = create_image_encoder("resnet18", allow_random=True)
    flip = create_image_encoder("resnet18:flip", allow_random=True)
    assert "flip" not in plain.cache_parts(), "plain features keep their old keys"
    assert FeatureCache.make_key(**plain.cache_parts()) != FeatureCache.make_key(**flip.cache_parts())
    assert FeatureCache.make_key(**flip.cache_parts()) != FeatureCache.make_key(**flip.cache_parts(local=True))

    ds = _dataset(images)
    cache = FeatureCache(tmp_path / "cache")
    kw = dict(text_encoder="tfidf", cache=cache, num_workers=0, allow_random=True)
    first = extract_features(ds, "resnet18", **kw)
    assert not first.image_cache_hit
    flipped = extract_features(ds, "resnet18:flip", **kw)
    assert not flipped.image_cache_hit, "a flip run must not be served the plain features"
    assert not np.allclose(flipped.image, first.image, atol=1e-4)
    assert flipped.image_encoder == "resnet18:flip" and flipped.spec["image"]["flip"] is True
    again = extract_features(ds, "resnet18:flip", **kw)
    assert again.image_cache_hit
    np.testing.assert_array_equal(again.image, flipped.image)
    # a query image goes through the same flip averaging as the run's rows
    enc = run_image_encoder(flipped)
    assert enc.flip and enc.full_name == "resnet18:flip"
    np.testing.assert_allclose(enc.encode_paths(images[:1], num_workers=0), flipped.image[:1], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------ concatenation

def test_concat_blocks_are_each_l2_normalised_and_scaled() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.random((4, 6)) * 30, rng.random((4, 3)) * 0.1
    b[2] = 0
    x = concat_blocks([a, b])
    assert x.shape == (4, 9) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x[:, :6], axis=1), np.full(4, 2 ** -0.5), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(x[[0, 1, 3], 6:], axis=1), np.full(3, 2 ** -0.5), rtol=1e-6)
    assert not x[2, 6:].any(), "an empty block stays empty"
    np.testing.assert_allclose(x[:, :6], a / np.linalg.norm(a, axis=1, keepdims=True) / np.sqrt(2), rtol=1e-6)
    with pytest.raises(CrossViewError, match="same n"):
        concat_blocks([a, b[:3]])


def test_concatenated_backbones_normalise_each_block_and_reuse_each_backbones_cache(images, tmp_path) -> None:
    ds = _dataset(images)
    cache = FeatureCache(tmp_path / "cache")
    kw = dict(text_encoder="tfidf", cache=cache, num_workers=0, allow_random=True)
    r18 = extract_features(ds, "resnet18", **kw).image
    n_entries = len(cache.entries())
    both = extract_features(ds, "resnet18+mobilenet_v2", **kw)
    assert isinstance(create_image_encoder("resnet18+mobilenet_v2", allow_random=True), ConcatImageEncoder)
    assert both.image.shape == (len(images), 512 + 1280) and both.image_encoder == "resnet18+mobilenet_v2"
    assert not both.image_cache_hit
    assert len(cache.entries()) == n_entries + 1, "the resnet18 block comes from its own cache entry"
    np.testing.assert_allclose(np.linalg.norm(both.image[:, :512], axis=1), 2 ** -0.5, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(both.image[:, 512:], axis=1), 2 ** -0.5, rtol=1e-5)
    np.testing.assert_allclose(both.image[:, :512], r18 / np.linalg.norm(r18, axis=1, keepdims=True) / np.sqrt(2),
                               rtol=1e-5, atol=1e-7)
    assert extract_features(ds, "resnet18+mobilenet_v2", **kw).image_cache_hit
    # a query image: the same blocks, the same combination
    enc = run_image_encoder(both)
    np.testing.assert_allclose(enc.encode_paths(images[:2], num_workers=0), both.image[:2], rtol=1e-4, atol=1e-5)
    # local descriptors (region maps): each block's map at its pooled row's scale, so their mean is the combined row
    local = enc.encode_paths(images[:2], num_workers=0, local=True)
    assert local.shape == (2, 49, 512 + 1280)
    np.testing.assert_allclose(local.mean(axis=1), both.image[:2], rtol=1e-4, atol=1e-6)
    with pytest.raises(CrossViewError, match="fc7"):
        create_image_encoder("resnet18+vgg19", allow_random=True).encode_paths(images[:1], local=True)


# ------------------------------------------------------------------------------------------ captions

def test_combined_caption_features_shape_block_norms_and_state() -> None:
    caps = ["a dog runs on the grass", "two men ride bikes down a hill", "qwzx"]
    enc = create_text_encoder("minilm+tfidf")
    assert isinstance(enc, CombinedTextEncoder) and enc.name == "minilm+tfidf" and enc.needs_fit
    enc.fit(caps[:2])
    x = enc.encode(caps)
    vocab = len(enc.blocks[1].vocabulary_)
    assert x.shape == (3, 384 + vocab) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x[:, :384], axis=1), 2 ** -0.5, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(x[:2, 384:], axis=1), 2 ** -0.5, rtol=1e-5)
    assert not x[2, 384:].any(), "a caption with no known word has an empty TF-IDF block"
    alone = create_text_encoder("minilm").encode(caps)
    np.testing.assert_allclose(x[:, :384], alone / np.linalg.norm(alone, axis=1, keepdims=True) / np.sqrt(2),
                               rtol=1e-4, atol=1e-6)
    again = TextEncoder.from_state_dict(enc.state_dict())
    np.testing.assert_array_equal(again.encode(caps), x)
    assert enc.cache_parts() != create_text_encoder("minilm+glove").cache_parts()

    g = create_text_encoder("minilm+glove").encode(caps)
    assert g.shape == (3, 384 + 50)
    np.testing.assert_allclose(np.linalg.norm(g[:2, 384:], axis=1), 2 ** -0.5, rtol=1e-5)
    for bad, says in [("minilm+nope", "unknown text encoder 'nope'"), ("minilm+minilm", "twice"),
                      ("minilm+", "two or more"), ("minilm+vocab", "cannot be combined")]:
        with pytest.raises(CrossViewError, match=says):
            create_text_encoder(bad)
    with pytest.raises(CrossViewError, match="takes no parameters"):
        create_text_encoder("minilm+tfidf", max_features=10)


# ------------------------------------------------------------------------------------------ command line

@pytest.mark.parametrize("flag, value, says", [
    ("--image-encoder", "efficientnet_lite0:flop", "unknown option 'flop'"),
    ("--image-encoder", "efficientnet_lite0+nope", "unknown image encoder 'nope'"),
    ("--text-encoder", "minilm+nope", "unknown text encoder 'nope'"),
])
def test_cli_bad_feature_options_are_one_line(flag: str, value: str, says: str, capsys, tmp_path: Path) -> None:
    assert main(["train", "cca", "--data", "demo", flag, value, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("crossview: error: ") and says in err, err
    assert "Traceback" not in err


# ------------------------------------------------------------------------------------------ a method's own defaults

def test_a_methods_own_feature_pipelines_are_its_runs_defaults(tmp_path: Path, monkeypatch) -> None:
    import json

    from _engine_helpers import make_toy_dataset
    from crossview.engine.run import train
    from crossview.methods import default_encoders_of
    from crossview.methods.cca import CCA

    monkeypatch.setattr(CCA, "default_text_encoder", "bow")
    monkeypatch.setattr(CCA, "default_image_encoder", "resnet18:flip")
    assert default_encoders_of("cca") == ("resnet18:flip", "bow")
    ds = make_toy_dataset(n_images=60)
    list(train("cca", ds, run_dir=tmp_path / "own", device="cpu", params={"n_components": 4}))
    summary = json.loads((tmp_path / "own" / "summary.json").read_text())
    config = json.loads((tmp_path / "own" / "config.json").read_text())
    assert summary["text_encoder"] == "bow" and config["text_encoder"] == "bow"
    assert summary["image_encoder"] == "precomp", "no image files: the image default does not apply"
    list(train("cca", ds, run_dir=tmp_path / "asked", device="cpu", params={"n_components": 4}, text_encoder="tfidf"))
    assert json.loads((tmp_path / "asked" / "summary.json").read_text())["text_encoder"] == "tfidf"


def test_own_feature_defaults_apply_only_to_the_features_a_model_reads_and_each_card_quotes_its_evidence() -> None:
    """A method's frozen-feature defaults: no image encoder for a model that reads the image files (image_model=cnn),
    no text encoder for one that reads the captions (a GRU, TIMAM's Bi-LSTM); a subclass says its own (vsepp's are
    not inherited silently), and every card of a method with its own pipelines names them and the results file."""
    from crossview.methods import default_encoders_of, list_methods, method_card, method_class

    assert default_encoders_of("vsepp", {"image_model": "cnn"})[0] is None
    assert default_encoders_of("vsepp", {"text_model": "gru"})[1] is None
    assert default_encoders_of("timam", {"text_model": "bilstm"})[1] is None      # its Bi-LSTM reads the captions
    assert default_encoders_of("timam")[1] == "minilm+glove"       # its default reads the caption features
    vsepp = method_class("vsepp")
    for name in list_methods():
        cls = method_class(name)
        if issubclass(cls, vsepp) and cls is not vsepp:
            assert "default_image_encoder" in vars(cls) and "default_text_encoder" in vars(cls), name
        own = [e for e in (cls.default_image_encoder, cls.default_text_encoder) if e]
        if own:
            card = method_card(name)
            text = " ".join(str(getattr(card, k, "") or "") for k in ("description", "notes"))
            assert "rich_features_flickr8k.md" in text, name
            assert all(e in text for e in own), (name, own)


def test_a_flip_averaged_default_is_dropped_when_captions_say_left_or_right() -> None:
    """Features averaged with the mirror image cannot tell left from right: a method's flip-averaged default image
    encoder is taken without ``:flip`` when 5% or more of the training captions say left or right (the built-in demo:
    42%; Flickr8k: 0.4%), and the run says so."""
    from crossview.features.image import MIRROR_WORDS_SHARE, mirror_words_share, without_flip

    assert without_flip("efficientnet_lite0+mobilenet_v2:flip") == "efficientnet_lite0+mobilenet_v2"
    assert without_flip("efficientnet_lite0") == "efficientnet_lite0"
    assert mirror_words_share(["a dog on the left", "a cat", "the Right hand", "bright light", "leftover"]) == 0.4
    assert mirror_words_share([]) == 0.0
    assert MIRROR_WORDS_SHARE == 0.05


def test_the_engine_resolves_the_flip_default_by_the_training_captions(images, tmp_path, monkeypatch) -> None:
    from crossview.engine import run as run_mod
    from crossview.methods.cca import CCA

    monkeypatch.setattr(CCA, "default_image_encoder", "mobilenet_v2:flip")
    monkeypatch.setattr(CCA, "default_text_encoder", "bow")
    base = _dataset(images)
    splits = {"train": np.arange(3), "test": np.arange(3, 5)}
    plain = PairedDataset(name="plain", captions=base.captions, caption_image=base.caption_image,
                          image_paths=base.image_paths, splits=splits)
    sided = PairedDataset(name="sided", captions=[f"{c} on the left" for c in plain.captions],
                          caption_image=base.caption_image, image_paths=base.image_paths, splits=splits)
    real = run_mod.FeatureStage.__init__
    for data, want, said in ((plain, "mobilenet_v2:flip", False), (sided, "mobilenet_v2", True)):
        seen = {}

        def spy(self, cfg, *a, **k):
            seen["enc"] = cfg.image_encoder
            return real(self, cfg, *a, **k)

        monkeypatch.setattr(run_mod.FeatureStage, "__init__", spy)
        it = run_mod.train("cca", data, run_dir=tmp_path / data.name, device="cpu", params={"n_components": 2})
        logs = []
        for ev in it:
            logs.append(getattr(ev, "message", ""))
            if "splits:" in logs[-1]:
                break
        it.close()
        assert seen["enc"] == want
        assert any("say left or right" in m and "100%" in m for m in logs) == said, logs


def test_a_combined_caption_encoders_progress_weights_each_block_by_its_cost(monkeypatch) -> None:
    """minilm+glove reported each block as half its work, though MiniLM is most of the time: a run's ETA took
    MiniLM's pace for GloVe's half and overshot 2.8x. Each block's share now follows its relative cost; the total
    and the features are unchanged."""
    from crossview.features.text.base import TextEncoder

    class Slow(TextEncoder):
        registry_name = "slow_test"
        relative_cost = 9.0

        def _dim(self) -> int:
            return 2

        def _encode_batch(self, captions, ctx):
            return np.ones((len(captions), 2), np.float32)

    class Fast(Slow):
        registry_name = "fast_test"
        relative_cost = 1.0

    enc = CombinedTextEncoder.__new__(CombinedTextEncoder)
    TextEncoder.__init__(enc)
    enc.blocks = [Slow(), Fast()]
    caps = [f"caption {i}" for i in range(40)]
    work = enc.iter_encode(caps, batch_size=10)
    seen = []
    while True:
        try:
            seen.append(next(work))
        except StopIteration as end:
            out = end.value
            break
    assert all(total == 80 for _, total in seen)
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[0] == 0 and done[-1] == 80
    # the slow block's last batch is 90% of the work (9 of 10 cost units), the fast block's first batch 92.5%
    assert done[4] == 72 and done[5] == 74
    assert out.shape == (40, 4)
