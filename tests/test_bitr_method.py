"""BITR as a registered method: learns on the demo (losses M, E, C and the finite variant), the bilinear
score through the embeddings, events every cutting-plane iteration, cancellation and exact resume,
save/load, cross-validation of C (in-process and in worker processes), and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crossview.core.events import Log, Loss, Progress, Validation
from crossview.core.errors import CrossViewError
from crossview.methods import create_method, method_class
from crossview.methods.base import Method, MethodData
from crossview.methods.bitr import Bitr

torch.set_num_threads(1)


# ---------------------------------------------------------------------------- demo features
def _colour_grid(paths: list[str]) -> np.ndarray:
    """``(n, 16 * P + P)``: for a 4x4 grid of cells, how many pixels (at 32x32) are nearest to each demo
    palette colour, plus whole-image counts. Cheap and independent of the image encoders."""
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
    """The demo's test split and the first 600 training images (3,000 pairs: a fast fit)."""
    ds = demo_dataset
    image = _colour_grid(ds.image_paths)
    train_images = set(ds.splits["train"].tolist())
    text = _bag_of_words(ds.captions, [c for c, i in zip(ds.captions, ds.caption_image.tolist()) if i in train_images])
    train = MethodData.from_features(ds, image, text, "train")
    keep = np.arange(600)
    cap = np.isin(train.caption_image, keep)
    small = MethodData(image_features=train.image_features[keep], text_features=train.text_features[cap],
                       captions=[c for c, k in zip(train.captions, cap) if k], caption_image=train.caption_image[cap],
                       name="train[:600]")
    return {"train": small, "val": MethodData.from_features(ds, image, text, "val"),
            "test": MethodData.from_features(ds, image, text, "test")}


def _synthetic(n_img: int = 60, caps: int = 2, p: int = 6, q: int = 5, seed: int = 0) -> MethodData:
    rng = np.random.default_rng(seed)
    img = rng.normal(size=(n_img, p)).astype(np.float32)
    ci = np.repeat(np.arange(n_img), caps)
    txt = (img[ci] @ rng.normal(size=(p, q)) + 0.3 * rng.normal(size=(len(ci), q))).astype(np.float32)
    return MethodData(image_features=img, text_features=txt, captions=[f"c{j}" for j in range(len(ci))],
                      caption_image=ci, name="synthetic")


def _chance(data: MethodData, k: int) -> tuple[float, float]:
    """Expected i2t and t2i R@k (percent) of a random ranking."""
    from math import comb

    n_cap, n_img = data.n_captions, data.n_images
    per = np.bincount(data.caption_image, minlength=n_img)
    i2t = np.mean([1 - comb(n_cap - g, k) / comb(n_cap, k) for g in per])
    return 100.0 * i2t, 100.0 * k / n_img


# ---------------------------------------------------------------------------- registry and card
def test_registered_with_its_card() -> None:
    from crossview.methods import method_card

    assert method_class("bitr") is Bitr
    m = create_method("bitr", loss="E", C=5.0)
    assert isinstance(m, Method) and m.loss == "E" and m.C == 5.0 and Bitr.directions_differ
    card = method_card("bitr")
    assert card.defaults() == Bitr.default_params()
    assert card.params["c_grid"].flag == "--c-grid"
    t7 = [r for r in card.paper_results if r["table"] == "Table 7" and r["dataset"].startswith("Pascal")
          and r.get("loss") == "C" and r["direction"] == "i2t"]
    assert t7 and t7[0]["metrics"]["R@50"] == 75.10 and t7[0]["metrics"]["MedR"] == 18.75
    assert "dense SIFT" in card.description


# ---------------------------------------------------------------------------- learning on the demo
# M with continuous outputs on the sphere needs projected ascent for each most violated output (no closed
# form): minutes here, so its learning check is the cheaper one in test_experiments.py.
@pytest.mark.parametrize("params", [{"loss": "C"}, {"loss": "E"},
                                    {"loss": "M", "outputs": "train", "max_candidates": 1500, "C": 1000.0},
                                    {"loss": "C", "outputs": "train", "max_candidates": 1500}],
                         ids=["C", "E", "M-finite", "C-finite"])
def test_learns_on_demo(demo, params: dict) -> None:
    m = create_method("bitr", **params).with_run(device="cpu")
    events = list(m.fit_iter(demo["train"], demo["val"]))
    assert all(m.converged_.values()), m.n_iter_
    assert m.domain_ == {"image": "sphere", "text": "sphere"}  # normalize="l2" by default (see the card)
    res = m.evaluate(demo["test"])
    c_i2t, c_t2i = _chance(demo["test"], 10)                  # about 5 % each
    assert res["i2t"]["R@10"] > 4 * c_i2t, res["i2t"]
    assert res["t2i"]["R@10"] > 3 * c_t2i, res["t2i"]
    val = [e for e in events if isinstance(e, Validation)]
    assert len(val) == 1 and val[0].metrics["i2t"]["R@10"] > 2 * c_i2t


def test_embeddings_give_the_bilinear_score(demo) -> None:
    m = create_method("bitr", C=100.0).with_run(device="cpu").fit(demo["train"])
    test = demo["test"]
    x = m._prep(test.image_features, "image")
    y = m._prep(test.text_features, "text")
    p, q = x.shape[1], y.shape[1]
    assert m.W_["i2t"].shape == (p, q) and m.W_["t2i"].shape == (q, p)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-5)
    img, txt = m.encode_images(test), m.encode_texts(test)
    assert img.shape == (test.n_images, q) and txt.shape == (test.n_captions, q) and img.dtype == np.float32
    i, j = 3, 17
    assert float(img[i] @ txt[j]) == pytest.approx(float(x[i] @ m.W_["i2t"] @ y[j]), rel=1e-4, abs=1e-6)
    s = m.scores(test, "t2i")
    assert s[i, j] == pytest.approx(float(y[j] @ m.W_["t2i"] @ x[i]), rel=1e-4, abs=1e-6)
    assert m.encode_images(test, direction="t2i").shape == (test.n_images, p)
    assert not np.allclose(m.scores(test, "i2t"), s)  # two separate models


# ---------------------------------------------------------------------------- events, cancel, resume
def test_events_every_iteration_and_cancel_resume_is_exact(demo) -> None:
    train = demo["train"]
    kw = dict(C=300.0, loss="E", epsilon=1e-4)
    full = create_method("bitr", **kw).with_run(device="cpu")
    events = list(full.fit_iter(train))
    losses = [e for e in events if isinstance(e, Loss)]
    assert len(losses) == sum(full.n_iter_.values())  # one Loss per cutting-plane iteration
    for e in losses:
        assert {"primal", "dual", "gap", "violation"} <= set(e.terms)
        assert e.terms["gap"] >= -1e-6 * max(1.0, abs(e.terms["primal"]))
    assert sum(isinstance(e, Progress) for e in events) == len(losses)
    assert [e.epoch for e in losses] == sorted(e.epoch for e in losses)  # i2t (0) then t2i (1)

    # stop in the middle of the t2i model, checkpoint, resume in a fresh object
    stop_at = full.n_iter_["i2t"] + 3
    part = create_method("bitr", **kw)
    it = part.fit_iter(train)
    n = 0
    for ev in it:
        n += isinstance(ev, Loss)
        if n == stop_at:
            break
    it.close()
    state = part.state_dict()
    assert state["state"]["progress_"]["direction"] == "t2i"
    assert state["state"]["progress_"]["trainer"]["iteration"] == 3
    again = create_method("bitr").load_state_dict(state)
    rest = list(again.fit_iter(train, resume=True))
    assert sum(isinstance(e, Loss) for e in rest) == full.n_iter_["t2i"] - 3
    for d in ("i2t", "t2i"):
        np.testing.assert_array_equal(again.W_[d], full.W_[d])
    done = list(again.fit_iter(train, resume=True))
    assert len(done) == 1 and isinstance(done[0], Log) and "already finished" in done[0].message


def test_save_load_round_trip(tmp_path, demo) -> None:
    m = create_method("bitr", C=50.0).with_run(device="cpu").fit(demo["train"])
    path = m.save(tmp_path / "bitr.pt")
    back = Method.load(path)
    assert isinstance(back, Bitr) and back.C == 50.0
    for d in ("i2t", "t2i"):
        np.testing.assert_array_equal(back.encode_images(demo["test"], d), m.encode_images(demo["test"], d))
        np.testing.assert_array_equal(back.encode_texts(demo["test"], d), m.encode_texts(demo["test"], d))


# ---------------------------------------------------------------------------- cross-validation
def test_cross_validation_picks_the_best_c_of_the_grid() -> None:
    data = _synthetic()
    m = create_method("bitr", c_grid="1e-3,1,1e3", cv_folds=3).with_run(device="cpu")
    events = list(m.fit_iter(data))
    assert m.cv_["grid"] == [1e-3, 1.0, 1e3] and m.cv_["folds"] == 3
    for d in ("i2t", "t2i"):
        table = {float(k): v["score"] for k, v in m.cv_["table"][d].items()}
        assert set(table) == {1e-3, 1.0, 1e3}
        assert m.C_[d] == max(table, key=lambda c: (table[c], -c))
    cv_losses = [e for e in events if isinstance(e, Loss) and e.epoch == -1]
    assert cv_losses and all("cv_fold" in e.terms for e in cv_losses)
    assert any(isinstance(e, Log) and "cross-validation picks" in e.message for e in events)


@pytest.mark.parametrize("reduce", ["cca", "pca"])
def test_cross_validation_refits_the_preprocessing_inside_each_fold(monkeypatch, reduce) -> None:
    """Issue 28: the CCA (learnt from the pairs) that C is chosen in is fitted on each fold's training rows, never
    on the held-out fold that scores C; the final model's preprocessing is fitted on all training rows."""
    import crossview.methods.bitr as B

    data = _synthetic(n_img=36, p=8, q=7)
    fitted: list[tuple[int, int, bytes]] = []
    real = B.fit_preprocessing

    def spy(image, text, caption_image, **kw):
        fitted.append((len(image), len(text), np.asarray(image, dtype=np.float32).tobytes()))
        return real(image, text, caption_image, **kw)

    monkeypatch.setattr(B, "fit_preprocessing", spy)
    m = create_method("bitr", c_grid="0.1,10", cv_folds=3, reduce=reduce, cca_dim=4, pca_dim=4).with_run(device="cpu")
    m.fit(data)
    folds = B.cv_folds(36, 3, 0)
    assert fitted[0][:2] == (36, 72), "the final model: every training row"
    per_fold = fitted[1:]
    assert len(per_fold) == 2 * 3, "one fit per fold and direction"
    for (n_img, n_cap, rows), (f, d) in zip(per_fold, [(f, d) for d in ("i2t", "t2i") for f in range(3)]):
        tr, te = folds[f]
        assert (n_img, n_cap) == (len(tr), 2 * len(tr))
        assert rows == data.image_features[tr].astype(np.float32).tobytes(), "only the fold's training images"


def test_cross_validation_in_worker_processes_matches_in_process() -> None:
    data = _synthetic(n_img=30, seed=1)
    one = create_method("bitr", c_grid=[0.1, 100.0], cv_folds=2).with_run(device="cpu").fit(data)
    two = create_method("bitr", c_grid=[0.1, 100.0], cv_folds=2).with_run(device="cpu", n_jobs=2).fit(data)
    assert one.C_ == two.C_
    assert one.cv_["table"] == two.cv_["table"]


def test_no_room_for_the_workers_files_is_one_clear_error(monkeypatch) -> None:
    import errno

    import crossview.methods.bitr as B

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(B.np, "save", full)
    data = _synthetic(n_img=30, seed=1)
    m = create_method("bitr", c_grid=[0.1, 100.0], cv_folds=2).with_run(device="cpu", n_jobs=2)
    with pytest.raises(CrossViewError, match="No space left on device.*TMPDIR.*n_jobs=1"):
        m.fit(data)


def test_a_worker_job_carries_its_arrays_as_files_dense_or_sparse(tmp_path) -> None:
    """What a cross-validation job sends a worker: the features as files it memory-maps (sparse TF-IDF as .npz),
    the same values back, and a job small enough for the pool's pipe buffer (64 KiB) whatever the data's size."""
    import pickle

    import scipy.sparse as sp

    from crossview.methods.bitr import _SharedArray

    dense = np.random.default_rng(0).standard_normal((3000, 40)).astype(np.float32)
    sparse = sp.random(5000, 300, density=0.05, format="csr", dtype=np.float32, random_state=0)
    a, b = _SharedArray(str(tmp_path), "img", dense), _SharedArray(str(tmp_path), "txt", sparse)
    assert len(pickle.dumps({"img": a, "txt": b, "fold": 1})) < 2048 < dense.nbytes
    got = a.load()
    assert isinstance(got, np.memmap) and got.dtype == np.float32 and np.array_equal(got, dense)
    back = b.load()
    assert sp.issparse(back) and (back != sparse).nnz == 0 and back.dtype == np.float32


def _live_children() -> set[int]:
    """PIDs of this process's children that are running (not zombies), from /proc; not the resource trackers
    (loky's and multiprocessing's, one each per interpreter for its life, started by the first pool)."""
    import os
    from pathlib import Path

    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            try:
                if b"resource_tracker" in (stat.parent / "cmdline").read_bytes():
                    continue
            except OSError:
                continue
            out.add(int(stat.parent.name))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_stopping_during_cross_validation_in_worker_processes_kills_them() -> None:
    """The pool is stopped through loky's documented shutdown(kill_workers=True), not a private attribute, and
    leaves no thread behind: the jobs carry their arrays as files (a few hundred bytes each), so the pool's feeder
    thread is never caught writing a pickled array to a killed worker (it stayed blocked there for good)."""
    import threading
    import time

    data = _synthetic(n_img=400, caps=5, p=40, q=30, seed=3)
    before = _live_children()
    threads_before = set(threading.enumerate())
    m = create_method("bitr", c_grid=[1e3, 1e4, 1e5], cv_folds=5).with_run(device="cpu", n_jobs=2)
    gen = m.fit_iter(data)
    for ev in gen:
        if isinstance(ev, Progress) and ev.message.startswith("cross-validation:"):
            break
    assert len(m.progress_["cv"]) < 30, "all jobs finished before the stop: the test needs longer jobs"
    assert _live_children() - before, "the workers are running"
    gen.close()                                   # what cancelling a run does
    assert not _live_children() - before, "a cancelled run left its worker processes running"
    deadline = time.monotonic() + 20
    while (left := [t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()]) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"a cancelled run left threads behind: {left}"


# ---------------------------------------------------------------------------- errors
def test_bad_input_gives_clear_errors(demo) -> None:
    data = _synthetic(n_img=8)
    no_text = MethodData(image_features=data.image_features, text_features=None, captions=data.captions,
                         caption_image=data.caption_image)
    with pytest.raises(CrossViewError, match="needs caption features"):
        create_method("bitr").fit(no_text)
    with pytest.raises(CrossViewError, match="unknown BITR loss 'Q'"):
        create_method("bitr", loss="Q").fit(data)
    with pytest.raises(CrossViewError, match="c_grid value 'ten'"):
        create_method("bitr", c_grid="1,ten").fit(data)
    with pytest.raises(CrossViewError, match="C must be a positive number, got -1"):
        create_method("bitr", C=-1).fit(data)
    with pytest.raises(CrossViewError, match="outputs must be 'continuous'"):
        create_method("bitr", outputs="all").fit(data)
    with pytest.raises(CrossViewError, match="normalize='l1'.*smallest is"):
        create_method("bitr", normalize="l1").fit(data)  # Gaussian features have negative values
    with pytest.raises(CrossViewError, match="10-fold cross-validation needs at least 10 training images"):
        create_method("bitr", c_grid="1,10", cv_folds=10).fit(data)
    with pytest.raises(CrossViewError, match="not trained yet"):
        create_method("bitr").encode_images(data)
    m = create_method("bitr", C=1.0, pca_dim=4).with_run(device="cpu").fit(data)
    wrong = MethodData(image_features=np.ones((3, 9), np.float32), text_features=np.ones((3, 5), np.float32),
                       captions=["a", "b", "c"], caption_image=np.arange(3))
    with pytest.raises(CrossViewError, match="trained on 6-d image features, these are 9-d"):
        m.encode_images(wrong)
    with pytest.raises(CrossViewError, match="direction must be"):
        m.encode_texts(data, direction="both")
    with pytest.raises(CrossViewError, match="cannot resume.*6-d image features"):
        state = create_method("bitr", pca_dim=4).with_run(device="cpu")
        it = state.fit_iter(data)
        next(it)
        next(it)
        it.close()
        list(create_method("bitr").load_state_dict(state.state_dict()).fit_iter(
            MethodData(image_features=np.ones((8, 9), np.float32), text_features=data.text_features,
                       captions=data.captions, caption_image=data.caption_image), resume=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_trains_on_gpu_like_on_cpu() -> None:
    data = _synthetic(n_img=200, p=20, q=16)
    cpu = create_method("bitr", C=100.0).with_run(device="cpu").fit(data)
    gpu = create_method("bitr", C=100.0).with_run(device="cuda").fit(data)
    for d in ("i2t", "t2i"):
        a, b = cpu.W_[d], gpu.W_[d]
        assert np.linalg.norm(a - b) <= 1e-2 * np.linalg.norm(a)


def test_cross_validation_folds_are_the_engines_kfold_partition():
    """One k-fold splitter: BITR's C cross-validation uses the same (KFold) image folds as the engine's
    experiments, each image held out once, reproducible from the seed."""
    from crossview.engine.splits import fold_splits
    from crossview.methods.bitr import cv_folds

    for n, k, seed in ((50, 5, 0), (23, 4, 7)):
        ours = cv_folds(n, k, seed)
        for (tr, te), (tr2, te2) in zip(ours, fold_splits(n, k, seed)):
            np.testing.assert_array_equal(tr, tr2)
            np.testing.assert_array_equal(te, te2)
        np.testing.assert_array_equal(np.sort(np.concatenate([te for _, te in ours])), np.arange(n))
        assert all(not set(tr) & set(te) for tr, te in ours)
