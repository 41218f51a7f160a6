"""The Retriever: rankings agree with the evaluation's ranks; galleries; new sentences; corpus galleries."""

from __future__ import annotations

import numpy as np
import pytest

from crossview.data.dataset import TextCorpus
from crossview.engine.retriever import Retriever, ranks_of
from crossview.core.errors import CrossViewError
from crossview.eval import evaluate
from toy import BagOfColours, Identity, toy_setup  # noqa: F401


@pytest.fixture
def setup():
    return toy_setup()


def test_ranks_of_follows_the_tie_rule():
    s = np.array([0.5, 0.9, 0.5, 0.1, 0.9])
    assert ranks_of(s, np.array([1, 4, 0, 2, 3])).tolist() == [1, 2, 3, 4, 5]


def test_gold_ranks_equal_the_evaluation_ranks(setup):
    ds, feats, _ = setup
    r = Retriever(Identity().fit(None), ds, feats, gallery="test")
    assert r.n_gallery_images == 10 and r.n_gallery_captions == 20
    test = ds.split("test")
    gi = ds.splits["test"]
    scores = feats.image[gi] @ feats.text[r.gallery_captions].T
    ev = evaluate(scores, test.caption_image)
    for pos, img in enumerate(gi):
        ans = r.query_image(int(img), k=5)
        assert ans.best_gold_rank == ev["ranks"]["i2t"][pos]
        assert len(ans.items) == 5 and np.all(np.diff(ans.scores) <= 0)
        assert all(ds.caption_image[c] in gi for c in ans.items), "only gallery captions are ranked"
    for pos, c in enumerate(r.gallery_captions):
        ans = r.query_text(int(c), k=3)
        assert ans.best_gold_rank == ev["ranks"]["t2i"][pos]
        assert ans.gold.tolist() == [ds.caption_image[c]]


def test_typed_sentences_and_galleries(setup):
    ds, feats, colours = setup
    r = Retriever(Identity().fit(None), ds, feats, gallery="all")
    ans = r.query_text("a GREEN one", k=5)
    assert ans.direction == "t2i" and len(ans.gold) == 0 and ans.best_gold_rank is None
    assert all(colours[i] == 1 for i in ans.items)
    same = r.query_text("something red", k=3)      # equals a dataset caption: has its ground truth
    assert "caption" in same.query and same.best_gold_rank is not None
    with pytest.raises(CrossViewError, match="type a sentence"):
        r.query_text("   ")
    with pytest.raises(CrossViewError, match="splits"):
        Retriever(Identity().fit(None), ds, feats, gallery="val")
    with pytest.raises(CrossViewError, match="not in dataset"):
        r.query_image(99)


def test_corpus_gallery_ranks_captions_only(setup):
    ds, feats, colours = setup
    corpus = TextCorpus(name="c", captions=["red red", "blue", "green things", "nothing"])
    r = Retriever(Identity().fit(None), ds, feats, gallery=corpus)
    red_image = int(np.flatnonzero(colours == 0)[0])
    ans = r.query_image(red_image, k=2)
    assert r.gallery_caption_text(int(ans.items[0])) == "red red"
    assert len(ans.gold) == 0
    with pytest.raises(CrossViewError, match="no images"):
        r.query_text("red")


def test_unfitted_method_is_refused(setup):
    ds, feats, _ = setup
    with pytest.raises(CrossViewError, match="not fitted"):
        Retriever(Identity(), ds, feats)


class _CountingColours(BagOfColours):
    """BagOfColours with a cache key (its 'fitted state' is ``state``) that counts the captions it encodes."""

    def __init__(self, state="s1"):
        self.state = state
        self.encoded = 0

    def cache_parts(self):
        return {"name": self.name, "fit": self.state}

    def encode(self, captions, device="cpu", progress=None, should_stop=None, **_):
        self.encoded += len(captions)
        out = super().encode(captions)
        if progress is not None:
            progress(len(captions), len(captions))
        return out


def test_corpus_features_are_cached_so_the_second_build_does_not_encode(setup, tmp_path):
    from crossview.features import FeatureCache

    ds, feats, colours = setup
    store = FeatureCache(tmp_path / "features")
    corpus = TextCorpus(name="gen", captions=[f"{w} item {i}" for i in range(300) for w in ("red", "blue")])
    spy = _CountingColours()
    feats.text_model = spy
    events = []
    first = Retriever(Identity().fit(None), ds, feats, gallery=corpus, cache=store,
                      progress=lambda stage, done, total: events.append((stage, done, total)))
    assert spy.encoded == corpus.n_captions and first.corpus_cache_hit is False
    assert events and events[-1] == ("corpus captions", corpus.n_captions, corpus.n_captions)
    events.clear()
    second = Retriever(Identity().fit(None), ds, feats, gallery=corpus, cache=store,
                       progress=lambda stage, done, total: events.append((stage, done, total)))
    assert spy.encoded == corpus.n_captions, "the second build must not call the encoder"
    assert second.corpus_cache_hit is True
    assert events == [("corpus captions", corpus.n_captions, corpus.n_captions)]
    red = int(np.flatnonzero(colours == 0)[0])
    a, b = first.query_image(red, k=20), second.query_image(red, k=20)
    np.testing.assert_array_equal(a.items, b.items)
    np.testing.assert_array_equal(a.scores, b.scores)
    # Another fitted state of the encoder, or another corpus, is another entry.
    feats.text_model = _CountingColours(state="s2")
    Retriever(Identity().fit(None), ds, feats, gallery=corpus, cache=store)
    assert feats.text_model.encoded == corpus.n_captions
    other = TextCorpus(name="gen", captions=corpus.captions[:-1])
    Retriever(Identity().fit(None), ds, feats, gallery=other, cache=store)
    assert feats.text_model.encoded == corpus.n_captions + other.n_captions
