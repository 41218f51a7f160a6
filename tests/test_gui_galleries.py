"""crossview.gui.galleries without a panel: the gallery choices and the line that warns on training images."""

from __future__ import annotations

from crossview.engine.retriever import Retriever
from crossview.gui.galleries import gallery_choices, gallery_note, training_images_in
from toy import Identity, toy_setup


def _retriever(gallery: str) -> Retriever:
    ds, feats, _ = toy_setup()
    return Retriever(Identity().fit(None), ds, feats, gallery=gallery)


def test_the_evaluation_split_is_named_and_matches_inspect() -> None:
    r = _retriever("test")
    assert training_images_in(r, "train") == 0 and training_images_in(r, None) == 0
    note = gallery_note(r, "test", "train")
    assert "Ranking against: <b>test</b> (10 images, 20 captions)" in note and "ranks match Inspect" in note
    assert "Warning" not in note


def test_a_gallery_with_training_images_warns() -> None:
    r = _retriever("all")
    assert training_images_in(r, "train") == 20
    note = gallery_note(r, "test", "train")
    assert "<b>all images</b>" in note and "includes 20 training images" in note and "choose the test split" in note
    assert "Warning" not in gallery_note(r, "test", None)       # training split unknown: nothing to warn about
    train = gallery_note(_retriever("train"), "test", "train")
    assert "includes 20 training images" in train


def test_gallery_choices_label_the_splits() -> None:
    choices, current = gallery_choices(_retriever("test"), "test", "train")
    assert current == "test"
    assert choices == [("train split (20 images) - training images", "train"),
                       ("test split (10 images) - the run's evaluation split", "test"),
                       ("all images (30) - includes training images", "all"),
                       ("caption corpus file...", "corpus:?"),
                       ("photo folder...", "photos:?")]
