"""WSABIE as a registered method: learns on the demo (caption and label versions), both directions from
one model, norm constraint, early stopping, cancellation, save/load and resume, and clear errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from crossview.core.events import Log, Loss, Progress, Validation
from crossview.core.errors import CrossViewError
from crossview.core.run_settings import RunSettings
from crossview.methods import create_method, list_methods, method_class
from crossview.data.method_data import MethodData
from crossview.methods.wsabie import Wsabie

torch.set_num_threads(1)


# ---------------------------------------------------------------------------- demo features
def _colour_grid_features(paths: list[str]) -> np.ndarray:
    """``(n, 16 * C + C)`` float32: for a 4x4 grid of cells, how many pixels (at 32x32) are nearest to
    each demo palette colour, plus the whole-image counts. Cheap, deterministic and independent of the
    image encoders; enough for colour, size and position words."""
    from PIL import Image

    from crossview.data.demo import BACKGROUND_COLOURS, COLOURS

    pal = np.array(list(COLOURS.values()) + list(BACKGROUND_COLOURS.values()), dtype=np.float32)
    eye = np.eye(len(pal), dtype=np.float32)
    out = []
    for p in paths:
        with Image.open(p) as im:
            a = np.asarray(im.convert("RGB").resize((32, 32), Image.BILINEAR), dtype=np.float32)
        onehot = eye[((a[:, :, None, :] - pal[None, None]) ** 2).sum(-1).argmin(-1)]
        cells = onehot.reshape(4, 8, 4, 8, -1).sum(axis=(1, 3)).reshape(-1)
        out.append(np.concatenate([cells, onehot.sum(axis=(0, 1))]))
    return np.stack(out)


def _bag_of_words(captions: list[str], fit_on: list[str]) -> np.ndarray:
    from crossview.data.text import tokenize

    vocab = {w: i for i, w in enumerate(sorted({w for c in fit_on for w in tokenize(c)}))}
    out = np.zeros((len(captions), len(vocab)), dtype=np.float32)
    for j, c in enumerate(captions):
        for w in tokenize(c):
            if w in vocab:
                out[j, vocab[w]] += 1.0
    return out


@pytest.fixture(scope="module")
def demo(demo_dataset) -> dict[str, MethodData]:
    ds = demo_dataset
    image = _colour_grid_features(ds.image_paths)
    train_images = set(ds.splits["train"].tolist())
    train_caps = [c for c, i in zip(ds.captions, ds.caption_image.tolist()) if i in train_images]
    text = _bag_of_words(ds.captions, train_caps)
    # square-rooted counts, as the engine's default image normalisation for wsabie (ssr) feeds it
    image = np.sqrt(image)
    return {s: MethodData.from_features(ds, image, text, split=s) for s in ("train", "val", "test")}


def _chance_i2t(data: MethodData, k: int) -> float:
    """Expected i2t R@K (%) of random scores: 1 - P(none of an image's captions in the top K)."""
    n = data.n_captions
    per_image = np.bincount(data.caption_image, minlength=data.n_images)
    miss = [np.prod([(n - m - j) / (n - j) for j in range(k)]) for m in per_image]
    return 100.0 * (1.0 - float(np.mean(miss)))


def _synthetic(n_img: int = 120, caps: int = 3, p: int = 12, q: int = 10, seed: int = 0,
               name: str = "train") -> MethodData:
    """Captions are noisy linear images of their image's features (learnable by V, Z)."""
    rng = np.random.default_rng(seed)
    A = np.random.default_rng(99).normal(size=(p, q))
    x = rng.normal(size=(n_img, p)).astype(np.float32)
    ci = np.repeat(np.arange(n_img), caps)
    y = (x[ci] @ A + 0.5 * rng.normal(size=(len(ci), q))).astype(np.float32)
    return MethodData(image_features=x, text_features=y, captions=[f"c{j}" for j in range(len(ci))],
                      caption_image=ci, labels=(np.arange(n_img) % 4), name=name)


def _fit(method: Wsabie, train: MethodData, val: MethodData | None = None) -> list:
    return list(method.fit_iter(train, val))


# ---------------------------------------------------------------------------- registry and params
def test_registered_with_keyword_params() -> None:
    assert "wsabie" in list_methods()
    assert method_class("wsabie") is Wsabie
    m = create_method("wsabie", dim=32, lr=0.01)
    assert m.get_params()["dim"] == 32 and m.get_params()["target"] == "captions"
    assert Wsabie.default_params()["max_epochs"] == 20     # the BITR paper's 20 passes
    with pytest.raises(CrossViewError, match="no parameter 'lamda'"):
        create_method("wsabie", lamda=3)


# ---------------------------------------------------------------------------- learning on the demo
def test_caption_version_learns_on_demo(demo) -> None:
    # The card's defaults otherwise, except max_norm: these hand-made bag-of-words captions (a few words of
    # weight ~0.3 each) need the looser norm the card's help names for count features
    m = create_method("wsabie", max_epochs=8, patience=0, max_norm=10.0).with_run(device="cpu")
    events = _fit(m, demo["train"], demo["val"])
    vals = [e for e in events if isinstance(e, Validation)]
    assert len(vals) == 8 and all("rsum" in v.metrics for v in vals)
    res = m.evaluate(demo["test"])
    chance_i2t = _chance_i2t(demo["test"], 10)                  # about 5 %
    chance_t2i = 100.0 * 10 / demo["test"].n_images             # 5 %
    print("wsabie captions, demo test:", res["i2t"], res["t2i"])
    assert res["i2t"]["R@10"] > 4 * chance_i2t, res["i2t"]
    assert res["t2i"]["R@10"] > 4 * chance_t2i, res["t2i"]
    # both directions come from one model: the score matrix is V x . Z y whatever the direction
    img, txt = m.encode_images(demo["test"]), m.encode_texts(demo["test"])
    assert img.shape == (demo["test"].n_images, m.dim) and txt.shape == (demo["test"].n_captions, m.dim)   # dim
    np.testing.assert_array_equal(m.encode_images(demo["test"], direction="t2i"), img)
    np.testing.assert_allclose(m.scores(demo["test"], "t2i"), img @ txt.T, rtol=1e-6)
    # the norm constraint holds after training
    assert float(torch.linalg.vector_norm(torch.as_tensor(m.V_), dim=0).max()) <= 10.0 + 1e-4
    assert float(torch.linalg.vector_norm(torch.as_tensor(m.Z_), dim=0).max()) <= 10.0 + 1e-4


@pytest.mark.parametrize("target,epochs", [("tags", 4), ("label_sets", 12)])
def test_label_version_learns_on_demo(demo, target: str, epochs: int) -> None:
    """Image -> label ranking far above chance (tags: shape/colour/size/background words; label sets:
    "red circle"-style phrases, harder for colour-grid features), and caption retrieval through the
    labels a caption names."""
    m = create_method("wsabie", target=target, lr=0.01, max_norm=10.0, max_epochs=epochs, patience=0,
                      batch_size=128).with_run(device="cpu")
    events = _fit(m, demo["train"], demo["val"])
    assert any(isinstance(e, Validation) and "mAP" in e.metrics for e in events)
    test = demo["test"]
    res = m.evaluate_labels(test)
    sets, names = m._label_sets_of(test, m.label_names_)
    chance_p1 = 100.0 * float(np.mean([len(s) for s in sets if s])) / len(names)
    print(f"wsabie {target}, demo test:", res, "chance P@1", chance_p1)
    assert res["P@1"] > 2.5 * chance_p1, (res, chance_p1)
    assert m.encode_labels().shape == (len(m.label_names_), m.dim)
    if target == "tags":
        # Captions name most tags word for word; phrases are often paraphrased ("a six-sided shape"),
        # so caption retrieval through label names is only checked for tags.
        cap = m.evaluate(test)
        assert cap["t2i"]["R@10"] > 3 * 100.0 * 10 / test.n_images, cap["t2i"]
        assert cap["i2t"]["R@10"] > 3 * _chance_i2t(test, 10), cap["i2t"]
    assert float(torch.linalg.vector_norm(torch.as_tensor(m.W_), dim=0).max()) <= 10.0 + 1e-4


def test_class_label_version_learns() -> None:
    """target='labels' (one class per image): Gaussian classes, 10 of them."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(10, 16)) * 2

    def data(n: int, seed: int) -> MethodData:
        r = np.random.default_rng(seed)
        lab = r.integers(0, 10, n)
        x = (centres[lab] + r.normal(size=(n, 16))).astype(np.float32)
        return MethodData(image_features=x, text_features=None, captions=[], caption_image=np.zeros(0, np.int64),
                          labels=lab, name="train")

    m = create_method("wsabie", target="labels", dim=16, lr=0.05, max_epochs=5, patience=0).with_run(device="cpu")
    m.fit(data(1000, 1), data(200, 2))
    res = m.evaluate_labels(data(300, 3))
    assert res["P@1"] > 80.0, res                      # chance is 10 %
    assert m.label_names_ == [str(i) for i in range(10)]


# ---------------------------------------------------------------------------- training loop behaviour
def test_events_and_cancellation_within_one_batch() -> None:
    train = _synthetic()
    m = create_method("wsabie", dim=8, batch_size=32, max_epochs=2).with_run(log_every=2, device="cpu")
    it = m.fit_iter(train)
    kinds = []
    for ev in it:
        kinds.append(type(ev))
        if isinstance(ev, Progress):
            break                                        # the consumer cancels after the first batch
    it.close()
    assert kinds[0] is Log and kinds[-1] is Progress
    assert m.step_ == 1 and m.epoch_ == 0                # one batch done, no more

    m = create_method("wsabie", dim=8, batch_size=32, max_epochs=2).with_run(log_every=2, device="cpu")
    events = _fit(m, train)
    n_batches = (train.n_captions + 31) // 32
    progress = [e for e in events if isinstance(e, Progress)]
    assert [e.step for e in progress] == list(range(1, 2 * n_batches + 1))
    assert all(e.total == 2 * n_batches for e in progress)
    losses = [e for e in events if isinstance(e, Loss)]
    assert {e.epoch for e in losses} == {1, 2} and all(np.isfinite(v) for e in losses for v in e.terms.values())
    assert m.done_ and len(m.history_) == 2


def test_learns_on_synthetic_and_early_stopping_keeps_the_best_pass() -> None:
    train, val = _synthetic(seed=0), _synthetic(seed=1, name="val")
    m = create_method("wsabie", dim=12, lr=0.01, max_epochs=6, patience=0).with_run(device="cpu")
    _fit(m, train, val)
    res = m.evaluate(_synthetic(seed=2, name="test"))
    assert res["t2i"]["R@1"] > 5 * 100.0 / 120, res["t2i"]          # chance R@1 = 0.8 %

    # A validation set unrelated to training never improves for long: patience 1 stops early and the
    # model is the best validation pass, not the last.
    noise = _synthetic(seed=3, name="val")
    noise.text_features = np.random.default_rng(4).normal(size=noise.text_features.shape).astype(np.float32)
    m = create_method("wsabie", dim=12, lr=0.01, max_epochs=20, patience=1).with_run(device="cpu")
    events = _fit(m, train, noise)
    assert len(m.history_) < 20 and m.stopped_
    assert any(isinstance(e, Log) and "stopping" in e.message for e in events)
    np.testing.assert_array_equal(np.asarray(m.V_), np.asarray(m.best_state_["V"]))
    best = max(range(len(m.history_)), key=lambda i: m.history_[i]["val"])
    assert m.best_epoch_ == best + 1


# ---------------------------------------------------------------------------- checkpoints
def test_save_load_round_trip(tmp_path) -> None:
    train = _synthetic()
    m = create_method("wsabie", dim=8, max_epochs=2).with_run(device="cpu")
    m.fit(train)
    path = m.save(tmp_path / "wsabie.pt")
    back = Wsabie.load(path)
    assert isinstance(back, Wsabie) and back.saved_params() == m.saved_params()
    assert back.run_settings == RunSettings() and "device" not in back.saved_params(), \
        "the device is not the model's: a saved model opens on the device its loader is given"
    np.testing.assert_array_equal(back.encode_images(train), m.encode_images(train))
    np.testing.assert_array_equal(back.encode_texts(train), m.encode_texts(train))
    state = m.state_dict()
    assert all(not isinstance(v, torch.Tensor) for v in state["state"].values())

    labels = create_method("wsabie", target="labels", dim=8, max_epochs=1).with_run(device="cpu").fit(train)
    back = Wsabie.load(labels.save(tmp_path / "labels.pt"))
    assert back.label_names_ == labels.label_names_
    np.testing.assert_array_equal(back.encode_labels(), labels.encode_labels())


@pytest.mark.parametrize("target", ["captions", "labels"])
def test_resume_continues_exactly(target: str) -> None:
    """Stop mid-pass, checkpoint, restore into a new object and resume: the result is bit-identical to
    an uninterrupted run (same sampling stream, same batch order)."""
    train, val = _synthetic(seed=0), _synthetic(seed=1, name="val")
    params = dict(target=target, dim=8, batch_size=50, max_epochs=3, patience=0, lr=0.01)
    n_pairs = train.n_captions if target == "captions" else train.n_images
    stop_at = -(-n_pairs // 50) + 2                       # two batches into the second pass
    full = create_method("wsabie", **params).with_run(device="cpu", seed=7)
    _fit(full, train, val)

    part = create_method("wsabie", **params).with_run(device="cpu", seed=7)
    it = part.fit_iter(train, val)
    n_progress = 0
    for ev in it:
        if isinstance(ev, Progress):
            n_progress += 1
            if n_progress == stop_at:
                break
    it.close()
    state = copy.deepcopy(part.state_dict())
    assert state["state"]["train_state_"]["epoch"] == 1 and state["state"]["train_state_"]["batch_pos"] > 0

    resumed = create_method("wsabie").load_state_dict(state)
    events = list(resumed.fit_iter(train, val, resume=True))
    assert not any(isinstance(e, Log) and "positive pairs" in e.message for e in events)
    assert resumed.step_ == full.step_ and resumed.epoch_ == full.epoch_ == 3
    np.testing.assert_array_equal(np.asarray(resumed.V_), np.asarray(full.V_))
    key = "Z_" if target == "captions" else "W_"
    np.testing.assert_array_equal(np.asarray(getattr(resumed, key)), np.asarray(getattr(full, key)))
    assert [h["epoch_loss"] for h in resumed.history_] == [h["epoch_loss"] for h in full.history_]

    # resuming a finished run does nothing more
    again = list(create_method("wsabie").load_state_dict(resumed.state_dict()).fit_iter(train, val, resume=True))
    assert len(again) == 1 and isinstance(again[0], Log)


# ---------------------------------------------------------------------------- errors a user can act on
def test_bad_input_gives_clear_errors() -> None:
    train = _synthetic()
    with pytest.raises(CrossViewError, match="target 'words' is not one of captions, labels"):
        _fit(create_method("wsabie", target="words"), train)
    with pytest.raises(CrossViewError, match="lr must be a positive number, got -1"):
        _fit(create_method("wsabie", lr=-1), train)
    with pytest.raises(CrossViewError, match="batch_size must be a whole number >= 1, got 0"):
        _fit(create_method("wsabie", batch_size=0), train)
    with pytest.raises(CrossViewError, match="needs per-image label sets"):
        _fit(create_method("wsabie", target="label_sets"), train)
    with pytest.raises(CrossViewError, match="needs per-image tags"):
        _fit(create_method("wsabie", target="tags"), train)
    no_text = MethodData(image_features=train.image_features, text_features=None, captions=train.captions,
                         caption_image=train.caption_image, name="train")
    with pytest.raises(CrossViewError, match="needs caption features.*--text-encoder"):
        _fit(create_method("wsabie"), no_text)
    with pytest.raises(CrossViewError, match="not fitted yet"):
        create_method("wsabie").encode_images(train)

    m = create_method("wsabie", dim=4, max_epochs=1).with_run(device="cpu").fit(train)
    wrong = _synthetic(p=7, name="test")
    with pytest.raises(CrossViewError, match="expects 12-d image features.*has 7-d"):
        m.encode_images(wrong)
    with pytest.raises(CrossViewError, match="trained on captions.*no label embeddings"):
        m.encode_labels()
    with pytest.raises(CrossViewError, match="cannot resume: image_dim 12 in the checkpoint, 7 in the data"):
        _fit_resume = list(create_method("wsabie").load_state_dict(
            {**m.state_dict(), "state": {**m.state_dict()["state"], "done_": False}}).fit_iter(wrong, resume=True))
        del _fit_resume
    one_image = MethodData(image_features=train.image_features[:1], text_features=train.text_features[:3],
                           captions=train.captions[:3], caption_image=np.zeros(3, np.int64), name="train")
    with pytest.raises(CrossViewError, match="no negatives"):
        _fit(create_method("wsabie").with_run(device="cpu"), one_image)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_trains_on_gpu() -> None:
    train, val = _synthetic(seed=0), _synthetic(seed=1, name="val")
    m = create_method("wsabie", dim=12, lr=0.01, max_epochs=4, patience=0).with_run(device="cuda")
    events = _fit(m, train, val)
    assert any(isinstance(e, Log) and "device cuda" in e.message for e in events)
    res = m.evaluate(_synthetic(seed=2, name="test"))
    assert res["t2i"]["R@1"] > 5 * 100.0 / 120


# ---------------------------------------------------------------------------- the card
def test_card_matches_the_method() -> None:
    from crossview.methods.cards import load_card

    card = load_card("wsabie")
    assert card.name == "wsabie" and card.paper.startswith("000_")
    assert set(card.params) == set(Wsabie.param_names())
    assert card.defaults() == Wsabie.default_params()
    for spec in card.params.values():
        assert spec.help
    assert card.params["target"].choices == ("captions", "labels", "label_sets", "tags")
    with pytest.raises(CrossViewError, match="'words' is not one of"):
        card.coerce_params({"target": "words"})
    table7 = {(r["dataset"].split()[0], r["direction"]): r["metrics"] for r in card.paper_results
              if r["table"] == "Table 7"}
    assert table7[("Pascal", "i2t")] == {"BLEU-1": 32.98, "ROUGE-1": 23.43, "R@50": 35.40, "MedR": 28.30}
    assert table7[("SBU", "t2i")]["MedR"] == 194.50
    assert {r["table"] for r in card.paper_results} == {"Table 2", "Table 4", "Table 5", "Table 6", "Table 7"}


def test_label_names_are_matched_on_the_projects_words() -> None:
    """Caption -> label matching (label targets) uses the one tokenizer: hyphenated compounds split, case and
    punctuation ignored, a possessive 's dropped; a name must occur as a contiguous run of whole words."""
    from crossview.methods._labels import mentioned as _mentioned, words as _words

    names = [_words(n) for n in ("red circle", "dog", "ball", "circ")]
    assert _mentioned(_words("The dog's Red circle, by a red-ball."), names) == [0, 1, 2]
    assert _mentioned(_words("a circle that is red"), names) == []
