"""BITR on paper 001's TR / CTR representations in ordinary runs (``--set representation=tr|ctr``):
fitted on train only, saved in the checkpoint as arrays, rebuilt by open_run, queried with new inputs."""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest
import torch

from crossview.core.errors import CrossViewError
from crossview.features import topics as T

PARAMS = {"n_topics": 6, "n_words": 24, "C": 10.0}


class PatchEncoder:
    """A fast stand-in for the CNN on the demo's real image files: a 4 x 4 grid of patches per image,
    each descriptor the patch's RGB mean and standard deviation (16 local descriptors of 6-d; pooled: their
    mean)."""

    name = "patches"
    local_dim = 6
    weights_hash = "patches-v1"
    weights_source = "package"
    weights_path = None

    def __init__(self) -> None:
        self.calls = 0

    def cache_parts(self, local: bool = False) -> dict:
        return {"name": self.name, "local": local, "weights": self.weights_hash}

    def encode_paths(self, paths, *, local=False, progress=None, should_stop=None, **_):
        from PIL import Image

        self.calls += 1
        out = []
        for p in paths:
            a = np.asarray(Image.open(p).convert("RGB").resize((32, 32)), dtype=np.float32) / 255
            patches = a.reshape(4, 8, 4, 8, 3).transpose(0, 2, 1, 3, 4).reshape(16, 64, 3)
            out.append(np.concatenate([patches.mean(1), patches.std(1)], axis=1))
        if progress is not None:
            progress(len(paths), len(paths))
        out = np.stack(out).astype(np.float32)
        return out if local else out.mean(axis=1)


@pytest.fixture()
def encoder(monkeypatch):
    """The patch encoder in place of every image backbone the representation (and the queries) create."""
    enc = PatchEncoder()
    from crossview.features import image as image_mod

    monkeypatch.setattr(image_mod, "create_image_encoder", lambda name, **kw: enc)
    return enc


@pytest.fixture(scope="module")
def demo():
    """The demo at a small size: 60 rendered scenes (real PNG files), 5 captions each."""
    from crossview.data.demo import load_demo

    ds = load_demo(n_scenes=60, n_web=0)
    assert ds.image_paths is not None and {"train", "test"} <= set(ds.splits)
    return ds


def _train(ds, run_dir, **params):
    from crossview.engine import run as run_mod

    it = run_mod.train("bitr", ds, run_dir=run_dir, params={**PARAMS, **params}, checkpoint_seconds=1e9)
    events = list(it)
    return events[-1].summary


def _only_plain(obj, where="state"):
    """Every leaf is a numpy array, a tensor or a plain Python value (what a weights-only load accepts
    once arrays are tensors): no scikit-learn or other class."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert isinstance(k, str), f"{where}: key {k!r}"
            _only_plain(v, f"{where}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _only_plain(v, f"{where}[{i}]")
    else:
        assert obj is None or isinstance(obj, (str, int, float, bool, np.ndarray, torch.Tensor)), \
            f"{where}: {type(obj).__name__}"


def _to_tensors(obj):
    if isinstance(obj, dict):
        return {k: _to_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_tensors(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    return obj


@pytest.mark.parametrize("rep", ["tr", "ctr"])
def test_run_saves_the_representation_and_open_run_queries_it(rep, demo, encoder, tmp_path):
    from PIL import Image

    from crossview.core.io import load_checkpoint
    from crossview.engine.session import open_run
    from crossview.eval.embeddings import load_embeddings
    from crossview.data.method_data import MethodData

    run_dir = tmp_path / rep
    summary = _train(demo, run_dir, representation=rep)
    # CTR is TR with its CCA fitted by BITR itself (so that the cross-validation of C refits it in each fold)
    assert summary["image_encoder"] == "patches+tr" and summary["text_encoder"] == "lda+tr"
    assert summary["params"]["representation"] == rep

    # Everything fitted is in the checkpoint, as arrays and plain values only.
    ckpt = load_checkpoint(run_dir / "checkpoint.pt")
    state = ckpt["features"]["representation"]
    _only_plain(state)
    assert state["name"] == "tr" and state["visual"]["codebook"].shape == (24, 6)
    assert state["visual"]["lda"]["components"].shape == (6, 24)
    assert state["visual"]["reducer"]["in_dim"] == 6
    assert state["text"]["name"] == "lda" and state["text"]["state"]["components"].shape[0] == 6
    assert state["cca"] is None
    bitr_state = ckpt["method_state"]["state"]
    assert (bitr_state["pca_"]["image"] is not None) == (rep == "ctr")    # the CTR step lives in BITR
    if rep == "ctr":
        assert tuple(bitr_state["pca_"]["text"]["components"].shape) == (6, 6)
    assert ckpt["text_model"] is None          # the text side is kept once, in the representation
    # The same state survives a weights-only load once its arrays are tensors (a generic converter's
    # job), and rebuilds the same representation.
    buf = io.BytesIO()
    torch.save(_to_tensors(state), buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    again = T.TopicRepresentation.from_state_dict(loaded)

    # open_run rebuilds the features from the checkpoint (nothing refitted): the same embeddings as the run's.
    opened = open_run(run_dir, demo)
    f = opened.features
    assert isinstance(f, T.RepresentationFeatures) and f.image.shape[1] == f.text.shape[1]
    np.testing.assert_allclose(f.image.sum(1), 1.0, atol=1e-5)
    split = summary["split"]
    emb = load_embeddings(run_dir / f"embeddings_{split}.npz")
    data = MethodData.from_features(demo, f.image, f.text, split)
    m = opened.method
    np.testing.assert_allclose(m.encode_images(data, "i2t"), emb.image, atol=1e-5)
    np.testing.assert_allclose(m.encode_texts(data, "i2t"), emb.text, atol=1e-5)
    np.testing.assert_allclose(m.encode_images(data, "t2i"), emb.image_t2i, atol=1e-5)
    np.testing.assert_allclose(m.encode_texts(data, "t2i"), emb.text_t2i, atol=1e-5)
    # The tensor round trip encodes exactly like the opened run.
    gi = demo.splits[split]
    np.testing.assert_allclose(again.encode_image_files([demo.image_paths[i] for i in gi]), f.image[gi], atol=1e-6)

    # A new image file goes through local descriptors -> visual words -> topics [-> CCA]: a copy of a
    # dataset image is ranked exactly like that image; an image unlike any other is ranked too.
    r = opened.retriever()
    i = int(gi[0])
    copy = tmp_path / "copy.png"
    Image.open(demo.image_paths[i]).save(copy)
    by_file, by_index = r.query_image(copy, k=5), r.query_image(i, k=5)
    assert by_file.query == {"file": str(copy)}
    np.testing.assert_array_equal(by_file.items, by_index.items)
    np.testing.assert_allclose(by_file.scores, by_index.scores, atol=1e-5)
    noise = tmp_path / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(noise)
    other = r.query_image(noise, k=5)
    assert other.query == {"file": str(noise)} and len(other.items) == 5
    assert np.all(np.diff(other.scores) <= 1e-6)

    # A new sentence goes through the lda encoder -> topics [-> CCA]; a typed dataset caption is encoded
    # exactly like its stored row.
    c = int(np.flatnonzero(demo.caption_image == i)[0])
    typed, stored = r.query_text(demo.captions[c], k=3), r.query_text(c, k=3)
    np.testing.assert_array_equal(typed.items, stored.items)
    np.testing.assert_allclose(typed.scores, stored.scores, atol=1e-5)
    new = r.query_text("a small green circle above a large red square", k=3)
    assert new.query == {"text": "a small green circle above a large red square"} and len(new.items) == 3


def test_resume_continues_on_the_saved_representation(demo, encoder, tmp_path, monkeypatch):
    """A cancelled TR run resumes on the representation its checkpoint saved (nothing is refitted)."""
    from crossview.engine import run as run_mod
    from crossview.core.events import Finished, Loss

    run_dir = tmp_path / "run"
    it = run_mod.train("bitr", demo, run_dir=run_dir, params={**PARAMS, "representation": "tr"},
                       checkpoint_seconds=1e9)
    for ev in it:
        if isinstance(ev, Loss):
            break
    it.close()
    assert run_mod.read_status(run_dir)["status"] == "cancelled"

    def refit(*a, **k):
        raise AssertionError("the representation was fitted again on resume")

    monkeypatch.setattr(T, "representation_features", refit)
    monkeypatch.setattr(T, "iter_representation_features", refit)     # what the run's feature stage drives
    events = list(run_mod.resume(run_dir, data=demo))
    assert isinstance(events[-1], Finished) and events[-1].summary["image_encoder"] == "patches+tr"


@pytest.mark.slow
def test_tune_searches_c_on_tr(demo, encoder, tmp_path):
    """crossview tune passes the encoders' features to every trial; a TR trial builds TR instead (slow: tune
    extracts those encoder features first, MiniLM included, though TR trials do not use them)."""
    from crossview.engine.tune import TuneResult, tune

    out = list(tune("bitr", demo, {"C": [1.0, 100.0]}, params={**PARAMS, "representation": "tr"},
                    out=tmp_path / "search", refit=False, select_on="val", cache=False))
    result = out[-1]
    assert isinstance(result, TuneResult) and len(result.trials) == 2
    for row in result.trials:
        summary = json.loads((tmp_path / "search" / f"trial-{row['trial']:03d}" / "summary.json").read_text())
        assert summary["image_encoder"] == "patches+tr" and summary["params"]["representation"] == "tr"


def test_rebuilt_lda_gives_the_same_topics():
    rng = np.random.default_rng(0)
    counts = rng.poisson(0.7, size=(50, 30)).astype(np.float64)
    lda = T.fit_topic_model(counts, 5, seed=1, max_iter=10)
    state = T.lda_state(lda)
    _only_plain(state)
    rebuilt = T.lda_from_state(_to_tensors(state))
    new = rng.poisson(0.7, size=(7, 30)).astype(np.float64)
    np.testing.assert_allclose(rebuilt.transform(new), lda.transform(new), rtol=1e-12, atol=1e-12)
    bad = dict(state, components=np.ones((4, 30)))
    with pytest.raises(CrossViewError, match="damaged"):
        T.lda_from_state(bad)


def test_a_damaged_saved_representation_is_one_clear_error(demo, encoder):
    import copy

    state = T.representation_features(demo, "ctr", n_topics=4, n_words=12, cache=False).spec["representation"]
    T.TopicRepresentation.from_state_dict(copy.deepcopy(state))          # intact: fine
    for damage in (lambda s: s["visual"].__setitem__("codebook", np.ones((5, 6), np.float32)),
                   lambda s: s["visual"]["lda"].__setitem__("components", np.ones(4)),
                   lambda s: s["visual"]["reducer"].__setitem__("dim", "many"),
                   lambda s: s["cca"].__setitem__("x_proj", np.ones((3, 4))),
                   lambda s: s.__setitem__("cca", None),
                   lambda s: s.__setitem__("name", "xyz"),
                   lambda s: s["visual"]["lda"]["components"].__setitem__((0, 0), np.nan)):
        bad = copy.deepcopy(state)
        damage(bad)
        with pytest.raises(CrossViewError, match="checkpoint"):
            T.TopicRepresentation.from_state_dict(bad)


def test_fitted_on_train_only(demo, encoder, tmp_path):
    """Changing the test images and captions changes nothing fitted, nor the training rows."""
    from PIL import Image

    test = demo.splits["test"]
    paths = list(demo.image_paths)
    for i in test:
        p = tmp_path / f"test{i}.png"
        Image.open(paths[i]).transpose(Image.Transpose.FLIP_TOP_BOTTOM).convert("L").convert("RGB").save(p)
        paths[i] = str(p)
    in_test = np.isin(demo.caption_image, test)
    caps = [("zebra giraffe " * 3 if t else c) for c, t in zip(demo.captions, in_test)]
    changed = dataclasses.replace(demo, image_paths=paths, captions=caps)
    kw = {"n_topics": 6, "n_words": 24, "cache": False}
    a = T.representation_features(demo, "ctr", **kw)
    b = T.representation_features(changed, "ctr", **kw)
    sa, sb = a.spec["representation"], b.spec["representation"]
    np.testing.assert_array_equal(sa["visual"]["codebook"], sb["visual"]["codebook"])
    np.testing.assert_array_equal(sa["visual"]["lda"]["components"], sb["visual"]["lda"]["components"])
    np.testing.assert_array_equal(sa["visual"]["reducer"]["pca"] is None, sb["visual"]["reducer"]["pca"] is None)
    np.testing.assert_array_equal(sa["text"]["state"]["components"], sb["text"]["state"]["components"])
    assert sa["text"]["state"]["vocabulary"] == sb["text"]["state"]["vocabulary"]
    assert "zebra" not in sb["text"]["state"]["vocabulary"]
    for k in ("x_proj", "y_proj", "x_mean", "y_mean"):
        np.testing.assert_array_equal(sa["cca"][k], sb["cca"][k])
    train = demo.splits["train"]
    np.testing.assert_array_equal(a.image[train], b.image[train])
    assert not np.allclose(a.image[test], b.image[test])           # the test images did change
    # ... while fitting on all images would have seen them: the codebook then differs.
    c = T.representation_features(changed, "ctr", fit_on="test", **kw)
    assert not np.array_equal(c.spec["representation"]["visual"]["codebook"], sa["visual"]["codebook"])


def test_bad_values_are_refused_before_any_extraction(demo, encoder, tmp_path, capsys):
    from crossview.cli import main
    from crossview.engine import run as run_mod

    with pytest.raises(CrossViewError, match="representation must be one of features, tr, ctr.*'xyz'"):
        run_mod.train("bitr", demo, run_dir=tmp_path / "a", params={"representation": "xyz"})
    with pytest.raises(CrossViewError, match="drop --text-encoder"):
        run_mod.train("bitr", demo, run_dir=tmp_path / "b", params={"representation": "tr"}, text_encoder="tfidf")
    precomp = dataclasses.replace(demo, image_paths=None,
                                  image_features=np.zeros((demo.n_images, 4), np.float32))
    with pytest.raises(CrossViewError, match="image files"):
        run_mod.train("bitr", precomp, run_dir=tmp_path / "d", params={"representation": "tr"})
    with pytest.raises(CrossViewError, match="n_words must be an integer >= 2"):
        run_mod.train("bitr", demo, run_dir=tmp_path / "e", params={"representation": "tr", "n_words": 1})
    assert encoder.calls == 0
    assert not any((tmp_path / n).exists() for n in "abde")
    # The command line refuses the value with one line naming it, before anything runs.
    data = demo.source
    assert main(["train", "bitr", "--data", data, "--run-dir", str(tmp_path / "f"),
                 "--set", "representation=xyz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("crossview: error:") and "'xyz'" in err and "representation" in err
    assert "Traceback" not in err
    assert encoder.calls == 0 and not (tmp_path / "f").exists()


@pytest.mark.slow
def test_tr_learns_on_the_flickr8k_sample(flickr8k_sample, tmp_path):
    """``crossview train bitr --set representation=tr`` with the default backbone and the paper's sizes
    (1,000 visual words, 100 topics), train 600 -> val 100 images: far above chance, which is i2t R@10
    9.6% (5 relevant captions among 500), t2i R@10 10% and rsum about 31. Measured: i2t R@10 21.0, t2i R@10
    21.0, rsum 74.4 (TR is weak, as in the paper's Table 2: the default encoders give i2t R@10 77); an
    image file of the sample queried as a new file gets the stored image's topics."""
    from crossview.engine import run as run_mod
    from crossview.engine.session import open_run

    data = str(flickr8k_sample / "dataset_flickr8k_sample.json")
    events = list(run_mod.train("bitr", data, run_dir=tmp_path / "tr", params={"representation": "tr"},
                                checkpoint_seconds=1e9))
    summary = events[-1].summary
    print("flickr8k sample, BITR-C on TR:", json.dumps({d: summary[d] for d in ("i2t", "t2i")}))
    assert summary["split"] == "val" and summary["n_images"] == 100
    assert summary["i2t"]["R@10"] >= 14.0
    assert summary["t2i"]["R@10"] >= 18.0
    assert summary["rsum"] >= 60.0
    opened = open_run(tmp_path / "tr")
    r = opened.retriever()
    i = int(opened.dataset.splits["val"][0])
    by_file = r.query_image(opened.dataset.image_paths[i], k=10)
    assert by_file.query == {"file": opened.dataset.image_paths[i]} and len(by_file.items) == 10
    # One image through the CNN alone (not in a batch) lands on the same topics, up to float noise.
    x = opened.features.encode_new_images([opened.dataset.image_paths[i]])[0]
    y = opened.features.image[i]
    assert float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))) > 0.99
    assert len(r.query_text("two dogs run across the grass", k=10).items) == 10


@pytest.mark.gui
def test_the_app_opens_a_ctr_run_and_queries_it_with_new_inputs(qtbot, demo, encoder, tmp_path, monkeypatch):
    pytest.importorskip("pytestqt")
    from PIL import Image

    from crossview.gui.main_window import MainWindow

    run_dir = tmp_path / "ctr"
    _train(demo, run_dir, representation="ctr")
    monkeypatch.setenv("CROSSVIEW_HOME", str(tmp_path / "home"))
    win = MainWindow()
    qtbot.addWidget(win)
    win.show()
    try:
        task = win.open_run(str(run_dir), show="query")
        with qtbot.waitSignal(task.succeeded, timeout=60_000):
            pass
        qtbot.waitUntil(lambda: win.run is not None and win.run.run_dir == run_dir, timeout=30_000)
        qp = win.query_panel
        new_image = tmp_path / "new.png"
        Image.open(demo.image_paths[int(demo.splits["test"][0])]).rotate(180).save(new_image)
        with qtbot.waitSignal(qp.answered, timeout=30_000) as sig:
            qp.query_image(str(new_image))
        assert sig.args[0].direction == "i2t" and sig.args[0].query == {"file": str(new_image)}
        assert len(sig.args[0].items) > 0
        with qtbot.waitSignal(qp.answered, timeout=30_000) as sig:
            qp.query_text("a blue star under a small yellow circle")
        assert sig.args[0].direction == "t2i" and qp.image_grid.count() > 0
    finally:
        win.close()


class BatchedPatchEncoder(PatchEncoder):
    """The patch encoder with the generator interface the engine drives (``iter_encode_paths``: ``(done, total)``
    at the start and after each batch of ``batch_size`` images, the features returned)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def iter_encode_paths(self, paths, *, local=False, batch_size=16, **_):
        paths = list(paths)
        out = []
        yield 0, len(paths)
        for s in range(0, len(paths), batch_size):
            out.append(PatchEncoder.encode_paths(self, paths[s:s + batch_size], local=local))
            self.batches += 1
            yield min(len(paths), s + batch_size), len(paths)
        return np.concatenate(out)


@pytest.mark.parametrize("how", ["bitr-ctr", "recorded-ctr"])
def test_tr_ctr_features_are_the_runs_own_events_from_its_own_thread(how, demo, tmp_path, monkeypatch):
    """A TR / CTR run's feature stage is a generator the run drives: every report arrives as a Progress event
    (stage ``features``) on the thread iterating the run, with no other thread alive, and the reports are the
    very ``(stage, done, total)`` triples the callback API gives for the same work. ``bitr-ctr``: BITR's own
    representation (TR features; BITR does CTR's CCA itself); ``recorded-ctr``: a run recorded on CTR
    (``representation=``, built by :func:`crossview.features.topics.iter_build_representation`)."""
    import threading

    from crossview.core.events import Finished, Progress
    from crossview.engine import run as run_mod
    from crossview.features import image as image_mod
    from crossview.features.cache import FeatureCache
    from crossview.methods import create_method

    enc = BatchedPatchEncoder()
    monkeypatch.setattr(image_mod, "create_image_encoder", lambda name, **kw: enc)
    if how == "bitr-ctr":
        params, kw = {**PARAMS, "representation": "ctr"}, {}
        method, encoded = "bitr", "patches+tr"
    else:
        record = T.representation_record("ctr", {"n_topics": 6, "n_words": 24})
        method, params, kw = "cca", {}, {"representation": record}
        encoded = image_mod.DEFAULT_IMAGE_ENCODER       # the name it asks for (the patch encoder stands in)
    before = set(threading.enumerate())
    reports, events = [], []
    for ev in run_mod.train(method, demo, run_dir=tmp_path / "run", params=params, checkpoint_seconds=1e9,
                            device="cpu", cache=FeatureCache(tmp_path / "cache1"), **kw):
        events.append(ev)
        if isinstance(ev, Progress) and ev.stage == "features":
            assert threading.current_thread() is threading.main_thread()
            assert set(threading.enumerate()) <= before, "a thread besides the run's"
            reports.append((ev.message.split(": ", 1)[1], ev.step, ev.total))
    assert isinstance(events[-1], Finished) and events[-1].summary["image_encoder"] == encoded
    n = demo.n_images
    assert [r for r in reports if r[0] == "local descriptors"] == \
        [("local descriptors", d, n) for d in [0, *range(16, n, 16), n]]
    steps = [s for s, _, _ in reports if s not in ("local descriptors", "captions")]
    # the callback API drives the same generators: the same reports, in the same order
    calls = []
    cache = FeatureCache(tmp_path / "cache2")
    if how == "bitr-ctr":
        assert steps == ["visual words"] * 4 + ["fit text"] * 2 + ["topics"] * 2
        T.representation_features(demo, fit_on="train", cache=cache, progress=lambda *r: calls.append(r),
                                  **T.representation_request(create_method("bitr", **params)))
    else:
        assert steps == ["visual words"] * 4 + ["fit text"] * 2 + ["cca"] * 2
        T.rebuild_representation_features(demo, record, fit_on="train", cache=cache,
                                          progress=lambda *r: calls.append(r))
    assert calls == reports


def test_cancelling_during_tr_features_stops_between_steps_and_resumes(demo, tmp_path, monkeypatch):
    """Stop requested at the first report of the TR features: the run says cancelled before a single batch is
    encoded; stopped at the visual words' first report, the k-means codebook is never computed; a resume
    finishes the run."""
    from crossview.core.events import Finished, Progress
    from crossview.engine import run as run_mod
    from crossview.features import image as image_mod
    from crossview.features.cache import FeatureCache

    enc = BatchedPatchEncoder()
    monkeypatch.setattr(image_mod, "create_image_encoder", lambda name, **kw: enc)
    kmeans = []
    real_kmeans = T.kmeans_codebook
    monkeypatch.setattr(T, "kmeans_codebook", lambda *a, **k: kmeans.append(1) or real_kmeans(*a, **k))
    run_dir, cache = tmp_path / "run", FeatureCache(tmp_path / "cache")
    params = {**PARAMS, "representation": "tr"}

    def stop_at(it, message):
        """Iterate the run to its first feature report named ``message``, close it there; the reports seen."""
        seen = []
        for ev in it:
            if isinstance(ev, Progress) and ev.stage == "features":
                seen.append(ev.message)
                if ev.message == message:
                    it.close()
                    return seen
        raise AssertionError(f"no report {message!r}")

    seen = stop_at(run_mod.train("bitr", demo, run_dir=run_dir, params=params, checkpoint_seconds=1e9,
                                 device="cpu", cache=cache), "features: local descriptors")
    assert seen == ["features: local descriptors"]          # stopped at the very first report
    assert run_mod.read_status(run_dir)["status"] == "cancelled"
    assert enc.batches == 0 and not kmeans                  # nothing encoded after it
    seen = stop_at(run_mod.resume(run_dir, data=demo, cache=cache), "features: visual words")
    assert run_mod.read_status(run_dir)["status"] == "cancelled"
    assert enc.batches == 4 and not kmeans                  # the descriptors are done, the codebook never began
    events = list(run_mod.resume(run_dir, data=demo, cache=cache))
    assert isinstance(events[-1], Finished) and events[-1].summary["image_encoder"] == "patches+tr"
    assert kmeans == [1] and enc.batches == 4               # the descriptors came from the cache
