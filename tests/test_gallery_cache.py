"""Gallery embeddings cached per run (issue 34): equal to fresh ones, invalidated by a new checkpoint or corpus,
a second query that encodes no gallery and loads no dataset, and a failed cache write that only warns."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from _engine_helpers import train_toy_runs
from crossview.cli import main
from crossview.data.dataset import TextCorpus

METHOD_SETS = {"cca": ["n_components=6"],
               # the run's own text encoder (a GRU over its learned words): the case item 3 of issue 34 is about
               "vsepp": ["max_epochs=2", "embed_dim=16", "word_dim=8", "text_model=gru", "batch_size=32"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("gallery_cache")
    return train_toy_runs(base, METHOD_SETS)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A fresh, empty cache folder for this test (features and gallery embeddings)."""
    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


class _Spy:
    """Counts the gallery rows a method class encodes (patched over its encode_images / encode_texts)."""

    def __init__(self, monkeypatch, cls) -> None:
        self.images: list[int] = []
        self.texts: list[int] = []
        orig_images, orig_texts = cls.encode_images, cls.encode_texts
        spy = self

        def encode_images(self_, data, direction="i2t"):
            out = orig_images(self_, data, direction)
            spy.images.append(len(out))
            return out

        def encode_texts(self_, data, direction="i2t"):
            out = orig_texts(self_, data, direction)
            spy.texts.append(len(out))
            return out

        monkeypatch.setattr(cls, "encode_images", encode_images)
        monkeypatch.setattr(cls, "encode_texts", encode_texts)


def _corpus(n: int = 60, name: str = "lines") -> TextCorpus:
    words = ["red", "blue", "green", "square", "circle", "left", "right", "big", "small"]
    return TextCorpus(name=name, captions=[f"a {words[i % 9]} {words[(i * 5) % 9]} thing {i}" for i in range(n)])


@pytest.mark.parametrize("method", list(METHOD_SETS))
def test_cached_embeddings_equal_fresh_ones_for_splits_and_corpora(runs, cache_dir, method):
    from crossview.engine.session import open_run

    run = open_run(runs[method])
    for gallery in (None, "val", _corpus()):
        fresh = run.retriever(gallery=gallery, cache=False)          # computed, nothing cached
        first = run.retriever(gallery=gallery)
        second = run.retriever(gallery=gallery)
        assert first.gallery_cache_hit is False and second.gallery_cache_hit is True
        np.testing.assert_array_equal(np.asarray(second._caption_emb), fresh._caption_emb)
        if fresh._image_emb is not None:
            np.testing.assert_array_equal(np.asarray(second._image_emb), fresh._image_emb)
        else:
            assert second._image_emb is None


@pytest.mark.parametrize("method", list(METHOD_SETS))
def test_second_retriever_encodes_no_gallery(runs, cache_dir, monkeypatch, method):
    from crossview.engine.session import open_run
    from crossview.methods import method_class

    run = open_run(runs[method])
    spy = _Spy(monkeypatch, method_class(method))
    corpus = _corpus(90)
    run.retriever()
    run.retriever(gallery=corpus)
    assert sum(spy.texts) > corpus.n_captions and sum(spy.images) > 0     # the first time: every gallery row
    spy.images.clear()
    spy.texts.clear()
    split = run.retriever()
    lines = run.retriever(gallery=corpus)
    assert spy.images == [] and spy.texts == [], "the second retriever must not call the method's encoders"
    assert lines.corpus_cache_hit is True
    split.query_text("a red square", 3)
    assert spy.texts == [1]                    # the query, and only the query


@pytest.mark.parametrize("method", list(METHOD_SETS))
def test_second_cli_query_reads_only_the_cache(runs, cache_dir, monkeypatch, capsys, method):
    """The first ``crossview query --text`` fills the cache; the second answers the same without loading the
    dataset, extracting features or encoding the gallery."""
    from crossview.engine import run as run_mod
    from crossview.engine.session import open_run
    from crossview.methods import method_class

    ds = open_run(runs[method]).dataset
    image = int(ds.splits["test"][2])
    sentence = ds.captions[ds.captions_of(image)[0]]        # a dataset caption: it has a ground truth
    argv = ["query", str(runs[method]), "--text", sentence, "--k", "16", "--json"]
    capsys.readouterr()
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["ground_truth"][0]["item"] == image

    def refuse(*a, **k):
        raise AssertionError("the second query must not load the dataset")

    monkeypatch.setattr(run_mod, "_load", refuse)
    monkeypatch.setattr("crossview.features.extract_features", refuse)
    spy = _Spy(monkeypatch, method_class(method))
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert spy.images == [] and spy.texts == [1]
    assert second == first
    # a new sentence, and a caption corpus queried by an image file, the same way
    assert main(["query", str(runs[method]), "--text", "a green circle", "--k", "3"]) == 0
    assert "ranked images (t2i)" in capsys.readouterr().out


def test_corpus_query_by_image_file_is_cached_per_run(runs, cache_dir, tmp_path, monkeypatch, capsys):
    """An image file against a corpus needs the run's image encoder: a precomp run has none, and says so in one
    line both times (the cached path gives the full path's message)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(_corpus(30).captions) + "\n", encoding="utf-8")
    photo = tmp_path / "x.png"
    from PIL import Image
    Image.new("RGB", (8, 8), "red").save(photo)
    for _ in range(2):
        assert main(["query", str(runs["vsepp"]), "--image", str(photo), "--corpus", str(corpus)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "precomputed image features" in err[0]


@pytest.mark.parametrize("method", list(METHOD_SETS))
def test_changed_checkpoint_invalidates_the_cache(runs, cache_dir, tmp_path, method):
    import shutil

    import torch

    from crossview.core.io import load_checkpoint, save_checkpoint
    from crossview.engine.session import open_run

    run_dir = tmp_path / "run"
    shutil.copytree(runs[method], run_dir)
    corpus = _corpus(40)
    old = open_run(run_dir)
    old.retriever()
    old.retriever(gallery=corpus)
    old_emb = np.asarray(old.retriever()._image_emb).copy()
    old_key = old.model_key

    ckpt = load_checkpoint(run_dir / "checkpoint.pt")       # a retrained run: other weights, other bytes

    def perturb(obj):
        if isinstance(obj, torch.Tensor) and obj.is_floating_point() and obj.ndim == 2:
            return obj * 2.0 + 0.1
        if isinstance(obj, np.ndarray) and obj.dtype.kind == "f" and obj.ndim == 2:
            return obj * 2.0 + 0.1
        if isinstance(obj, dict):
            return {k: perturb(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [perturb(v) for v in obj]
        return obj

    ckpt["method_state"] = perturb(ckpt["method_state"])
    save_checkpoint(run_dir / "checkpoint.pt", ckpt)
    new = open_run(run_dir)
    assert new.model_key != old_key
    split, lines = new.retriever(), new.retriever(gallery=corpus)
    assert split.gallery_cache_hit is False and lines.gallery_cache_hit is False
    fresh = new.retriever(cache=False)
    np.testing.assert_array_equal(np.asarray(split._image_emb), fresh._image_emb)
    assert not np.allclose(np.asarray(split._image_emb), old_emb)


def test_changed_corpus_invalidates_and_the_same_lines_elsewhere_hit(runs, cache_dir):
    from crossview.engine.session import open_run

    run = open_run(runs["vsepp"])
    corpus = _corpus(50)
    assert run.retriever(gallery=corpus).gallery_cache_hit is False
    changed = TextCorpus(name="lines", captions=corpus.captions[:-1] + ["a different last line"])
    assert run.retriever(gallery=changed).gallery_cache_hit is False
    renamed = TextCorpus(name="a copy elsewhere", captions=list(corpus.captions))
    assert run.retriever(gallery=renamed).gallery_cache_hit is True


def test_a_failed_cache_write_warns_and_the_query_still_answers(runs, cache_dir, monkeypatch, caplog, capsys):
    from crossview.features import cache as cache_mod

    def full(self, key, array, meta):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod.FeatureCache, "_save", full)
    monkeypatch.setattr(cache_mod, "_UNWRITABLE", set())
    with caplog.at_level(logging.WARNING):
        rc = main(["query", str(runs["vsepp"]), "--text", "a red square", "--k", "3"])
    assert rc == 0 and "ranked images (t2i)" in capsys.readouterr().out
    assert any("cannot write" in r.getMessage() for r in caplog.records)


def test_packed_strings_read_one_string_at_a_time():
    from crossview.engine.gallery_cache import PackedStrings

    texts = ["a dog", "", "ünïcode ☃", "last"]
    blob, offsets = PackedStrings.pack(texts)
    assert list(PackedStrings(blob, offsets)) == texts
    sparse = PackedStrings(blob, offsets, np.array([3, 7, 8, 20]))
    assert sparse[8] == "ünïcode ☃" and sparse[20] == "last"
    with pytest.raises(KeyError):
        sparse[4]


def test_cached_open_reads_only_the_side_it_is_asked_for(runs, cache_dir, tmp_path):
    from crossview.core.errors import CrossViewError
    from crossview.engine.gallery_cache import open_cached_retriever
    from crossview.engine.session import open_run

    assert open_cached_retriever(runs["cca"]) is None             # nothing cached yet: the caller opens in full
    full = open_run(runs["cca"]).retriever()
    run, r = open_cached_retriever(runs["cca"], sides=("images",))
    assert r._caption_emb is None and r.gallery_name == run.eval_split == "test"
    a, b = r.query_text("a red square", 5), full.query_text("a red square", 5)
    assert a.items.tolist() == b.items.tolist()
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-6)
    with pytest.raises(CrossViewError, match="no captions"):
        r._search("i2t", np.zeros((1, r._image_emb.shape[1]), np.float32), 3)
