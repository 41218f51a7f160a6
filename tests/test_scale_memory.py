"""Memory that follows the data (issue 34): block-wise evaluation gives the full matrix's ranks, CCA keeps sparse
caption features sparse, and a contiguous split of a feature matrix is a view, not a copy."""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from crossview.data.dataset import take_rows
from crossview.data.method_data import MethodData
from crossview.eval import metrics as M
from crossview.eval.embeddings import Embeddings, evaluate_embeddings
from crossview.methods.cca import CCA


def _embeddings(n_images: int, per: int, d: int, seed: int, levels: int | None = None):
    """Image and caption embeddings with ``per`` captions an image (shuffled caption order); ``levels`` rounds
    them to a coarse grid so that many scores tie."""
    rng = np.random.default_rng(seed)
    img = rng.standard_normal((n_images, d)).astype(np.float32)
    ci = rng.permutation(np.repeat(np.arange(n_images), per))
    txt = (img[ci] + rng.standard_normal((len(ci), d)).astype(np.float32)).astype(np.float32)
    if levels is not None:
        img, txt = np.round(img * levels) / levels, np.round(txt * levels) / levels
    return img.astype(np.float32), txt.astype(np.float32), ci.astype(np.int64)


@pytest.mark.parametrize("levels", [None, 1])
@pytest.mark.parametrize("block_rows", [1, 3, 7, 40, None])
def test_blocked_ranks_equal_the_full_matrix(levels, block_rows):
    img, txt, ci = _embeddings(40, 5, 8, seed=1, levels=levels)
    full = M.evaluate(img @ txt.T, ci)
    got = M.embedding_ranks(img, txt, ci, block_rows=block_rows)
    np.testing.assert_array_equal(got["i2t"], full["ranks"]["i2t"])
    np.testing.assert_array_equal(got["t2i"], full["ranks"]["t2i"])
    if levels is not None:      # the grid made ties, and the tie rule still matches
        assert len(np.unique(img @ txt.T)) < (img @ txt.T).size // 2


def test_blocked_ranks_with_a_second_model_for_t2i():
    img, txt, ci = _embeddings(30, 3, 6, seed=2)
    img2, txt2, _ = _embeddings(30, 3, 6, seed=3)
    got = M.evaluate_embeddings_blocked(img, txt, ci, image_t2i=img2, text_t2i=txt2, block_rows=4)
    np.testing.assert_array_equal(got["ranks"]["i2t"], M.i2t_ranks(img @ txt.T, ci))
    np.testing.assert_array_equal(got["ranks"]["t2i"], M.t2i_ranks(img2 @ txt2.T, ci))


def test_standard_protocol_of_saved_embeddings_matches_the_full_matrix():
    img, txt, ci = _embeddings(25, 5, 8, seed=4)
    out = evaluate_embeddings(Embeddings(image=img, text=txt, caption_image=ci))
    full = M.evaluate(img @ txt.T, ci)
    assert out["i2t"] == full["i2t"] and out["t2i"] == full["t2i"]
    np.testing.assert_array_equal(out["ranks"]["t2i"], full["ranks"]["t2i"])


@pytest.mark.parametrize("levels", [None, 1])
@pytest.mark.parametrize("block_rows", [1, 4, None])
def test_blocked_average_precision_equals_the_full_matrix(levels, block_rows, monkeypatch):
    """SmoothAP's validation mAP, block by block, equals protocols.mean_average_precision of the whole matrix
    (ties included: the grid makes many), with images of 1 to 6 captions and the relevant captions compared a
    few at a time."""
    from crossview.eval.protocols import mean_average_precision

    rng = np.random.default_rng(7)
    n, d = 30, 6
    img = rng.standard_normal((n, d)).astype(np.float32)
    ci = rng.permutation(np.concatenate([np.arange(n), rng.integers(0, n, 60)]))
    txt = (img[ci] + rng.standard_normal((len(ci), d))).astype(np.float32)
    if levels is not None:
        img, txt = np.round(img * levels) / levels, np.round(txt * levels) / levels
    monkeypatch.setattr(M, "_CHUNK_ELEMENTS", 3 * len(ci))       # three relevant captions compared at a time
    s = img @ txt.T
    rel = np.arange(n)[:, None] == ci[None, :]
    got = M.embedding_average_precision(img, txt, ci, block_rows=block_rows)
    assert got["i2t"] == pytest.approx(mean_average_precision(s, rel)["mAP"], rel=1e-12)
    assert got["t2i"] == pytest.approx(mean_average_precision(s.T, rel.T)["mAP"], rel=1e-12)
    ranks = M.embedding_ranks(img, txt, ci)["t2i"]
    again = M.embedding_average_precision(img, txt, ci, t2i_ranks=ranks)
    assert again["i2t"] == pytest.approx(got["i2t"], rel=1e-12) and again["t2i"] == pytest.approx(got["t2i"], rel=1e-12)
    bad = img.copy()
    bad[2, 1] = np.nan
    with pytest.raises(Exception, match="NaN"):
        M.embedding_average_precision(bad, txt, ci)


def test_blocked_ranks_hold_about_two_blocks_of_scores_whatever_the_set(monkeypatch):
    """The default blocks: ranking 2,000 images x 10,000 captions (a 76 MB matrix) holds about two blocks (a block
    and its comparison temporaries), not the matrix; the limit is lowered so the test stays small."""
    monkeypatch.setattr(M, "_SCORE_BLOCK_ELEMENTS", 1 << 20)          # 4 MB blocks
    img, txt, ci = _embeddings(2000, 5, 16, seed=3)
    tracemalloc.start()
    try:
        M.embedding_ranks(img, txt, ci)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * 4 * (1 << 20) + 4 * 10_000 * 8, peak / 2**20           # blocks + per-caption vectors


def test_blocked_ranks_refuse_bad_input_in_one_line():
    img, txt, ci = _embeddings(5, 2, 4, seed=5)
    with pytest.raises(Exception, match="same D"):
        M.embedding_ranks(img, txt[:, :3], ci)
    with pytest.raises(Exception, match="no caption"):
        M.embedding_ranks(np.vstack([img, img[:1]]), txt, ci)
    bad = img.copy()
    bad[0, 0] = np.nan
    with pytest.raises(Exception, match="NaN"):
        M.embedding_ranks(bad, txt, ci)


def _sparse_pairs(n_images: int, per: int, p: int, vocab: int, seed: int):
    """Images ``(n_images, p)`` and TF-IDF-like sparse captions ``(n_images * per, vocab)`` sharing a latent topic."""
    rng = np.random.default_rng(seed)
    topics = rng.integers(0, 10, n_images)
    centres = rng.standard_normal((10, p)).astype(np.float32)
    img = (centres[topics] + 0.5 * rng.standard_normal((n_images, p))).astype(np.float32)
    ci = np.repeat(np.arange(n_images), per)
    n = len(ci)
    words = 6
    cols = (topics[ci, None] * 7 + rng.integers(0, 7, (n, words // 2))) % vocab
    cols = np.hstack([cols, rng.integers(0, vocab, (n, words - words // 2))])
    text = sp.csr_matrix((np.full(n * words, 1 / np.sqrt(words), dtype=np.float32),
                          (np.repeat(np.arange(n), words), cols.ravel())), shape=(n, vocab))
    text.sum_duplicates()
    return img, text, ci


@pytest.mark.parametrize("pairs", ["captions", "images"])
def test_cca_on_sparse_text_equals_cca_on_the_dense_matrix(pairs):
    img, text, ci = _sparse_pairs(300, 5, 12, 60, seed=0)
    caps = [""] * len(ci)
    dense = CCA(n_components=8, reg=0.1, pairs=pairs).fit(MethodData(img, text.toarray(), caps, ci))
    sparse_data = MethodData(img, text, caps, ci)
    assert sp.issparse(sparse_data.text_features)
    sparse = CCA(n_components=8, reg=0.1, pairs=pairs).fit(sparse_data)
    np.testing.assert_allclose(sparse.correlations_, dense.correlations_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.abs(sparse.encode_texts(sparse_data) @ sparse.encode_images(sparse_data).T),
                               np.abs(dense.encode_texts(MethodData(img, text.toarray(), caps, ci))
                                      @ dense.encode_images(sparse_data).T), atol=1e-3)
    res = sparse.evaluate(sparse_data)
    assert res["rsum"] > 0


def test_cca_on_sparse_text_never_densifies_the_caption_matrix():
    # 30,000 captions x 800 words: dense float32 would be 96 MB (float64 192 MB); the covariance it needs is
    # 800 x 800 float64 (5 MB) and the per-image sums 6,000 x 800 (38 MB float64)
    img, text, ci = _sparse_pairs(6000, 5, 16, 800, seed=1)
    data = MethodData(img, text, [""] * len(ci), ci)
    dense_bytes = text.shape[0] * text.shape[1] * 4
    tracemalloc.start()
    try:
        m = CCA(n_components=8, reg=0.1).fit(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * dense_bytes, f"fit peaked at {peak / 1e6:.0f} MB; dense is {dense_bytes / 1e6:.0f} MB"
    assert m.correlations_[0] > 0.5


def test_contiguous_rows_are_a_read_only_view():
    a = np.arange(40, dtype=np.float32).reshape(10, 4)
    v = take_rows(a, np.arange(3, 8))
    assert np.shares_memory(v, a) and not v.flags.writeable
    np.testing.assert_array_equal(v, a[3:8])
    with pytest.raises(ValueError):
        v[0, 0] = 1
    c = take_rows(a, np.array([1, 3, 2]))      # not one range: a copy, as before
    assert not np.shares_memory(c, a)
    np.testing.assert_array_equal(c, a[[1, 3, 2]])


def test_a_precomp_style_split_shares_the_features(tmp_path):
    from crossview.data.dataset import PairedDataset

    feats = np.random.default_rng(0).standard_normal((12, 5)).astype(np.float32)
    ci = np.repeat(np.arange(12), 2)
    ds = PairedDataset(name="t", captions=[f"c {i}" for i in range(24)], caption_image=ci, image_features=feats,
                       splits={"train": np.arange(0, 8), "test": np.arange(8, 12)})
    text = np.random.default_rng(1).standard_normal((24, 3)).astype(np.float32)
    train = MethodData.from_features(ds, feats, text, "train")
    assert np.shares_memory(train.image_features, feats) and np.shares_memory(train.text_features, text)
    np.testing.assert_array_equal(train.image_features, feats[:8])
    np.testing.assert_array_equal(train.text_features, text[:16])
    np.testing.assert_array_equal(train.caption_image, ci[:16])


@pytest.mark.parametrize("sparse_text", [False, True])
def test_cca_of_caption_pairs_equals_cca_of_repeated_image_rows(sparse_text):
    from crossview.core.linalg import fit_cca, fit_cca_pairs

    img, text, ci = _sparse_pairs(200, 5, 10, 40, seed=2)
    ci = np.concatenate([ci[:-7], np.full(7, 3)])      # uneven caption counts, image 199 has fewer
    want = fit_cca(img[ci], text.toarray(), 6, 0.1)
    got = fit_cca_pairs(img, text if sparse_text else text.toarray(), ci, 6, 0.1)
    np.testing.assert_allclose(got.correlations, want.correlations, rtol=1e-5)
    np.testing.assert_allclose(got.x_mean, want.x_mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.abs(got.x_proj), np.abs(want.x_proj), rtol=1e-3, atol=1e-5)


def test_dropped_pages_of_a_mapped_array_read_back_the_same(tmp_path):
    from crossview.core.io import drop_pages

    a = np.random.default_rng(0).standard_normal((300, 64)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    m = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert float(m.sum()) == pytest.approx(float(a.sum()), rel=1e-5)
    drop_pages(m)
    drop_pages(m[::5])
    drop_pages(a)                  # not mapped: nothing happens
    np.testing.assert_array_equal(m, a)


def test_a_large_precomp_set_is_stacked_into_a_mapped_file(tmp_path, monkeypatch):
    """Split files stacked into one memory-mapped temporary file (not anonymous memory), values unchanged, and a
    plain view of it can give its pages back (drop_pages walks to the mapping)."""
    from crossview.core.io import drop_pages
    from crossview.data.readers import precomp

    rng = np.random.default_rng(0)
    folder = tmp_path / "t_precomp"
    folder.mkdir()
    parts = {}
    for prefix, n in (("train", 30), ("dev", 6), ("test", 6)):
        parts[prefix] = rng.random((n, 8)).astype(np.float32) + 0.1
        np.save(folder / f"{prefix}_ims.npy", parts[prefix])
        (folder / f"{prefix}_caps.txt").write_text("".join(f"a photo {prefix} {i}\n" for i in range(n)))
    in_memory = precomp.read(folder).image_features
    assert not isinstance(in_memory, np.memmap)
    monkeypatch.setattr(precomp, "STACK_FILE_BYTES", 64)
    mapped = precomp.read(folder).image_features
    assert isinstance(mapped, np.memmap)
    np.testing.assert_array_equal(mapped, in_memory)
    np.testing.assert_array_equal(mapped[:30], parts["train"])
    view = np.asarray(mapped)[3:9]
    drop_pages(view)                   # pages dropped: read back again from the file, the same values
    np.testing.assert_array_equal(view, in_memory[3:9])


def test_a_checkpoint_is_streamed_to_its_file_not_serialised_in_memory_first(tmp_path):
    """save_checkpoint writes as torch serialises (a COCO-size TIMAM's ~0.7 GB of classifier and moments were
    first serialised into a buffer, doubling them at every save): no payload-sized Python allocation, and the file
    reads back, read-only arrays included (shared, not copied, on the way)."""
    import torch  # noqa: F401 - imported before tracing (importing it is tens of MB of Python objects)

    from crossview.core.io import load_checkpoint, save_checkpoint

    big = np.arange(8 << 20, dtype=np.float32)                   # 32 MB
    frozen = np.arange(10, dtype=np.float64)
    frozen.flags.writeable = False
    tracemalloc.start()
    try:
        save_checkpoint(tmp_path / "c.pt", {"w": big, "frozen": frozen, "n": 3})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    back = load_checkpoint(tmp_path / "c.pt")
    np.testing.assert_array_equal(back["w"], big)
    np.testing.assert_array_equal(back["frozen"], frozen)
    assert back["n"] == 3


def test_a_torch_method_keeps_no_copy_of_its_live_state_between_checkpoints(tmp_path):
    """While training, a checkpoint's state shares the live weights (checkpoint_state, written at once) and the
    method keeps no copy of them afterwards; state_dict stays a snapshot that later steps do not change; once
    done, the model's state is the best epoch's weights themselves (one copy, not two) and a saved run reloads."""
    import _engine_helpers as H
    from crossview.core.events import Loss
    from crossview.core.io import save_checkpoint
    from crossview.methods import create_method
    from crossview.methods.base import Method

    ds = H.make_toy_dataset()
    img, txt = H.toy_features(ds)
    train, val = (MethodData.from_features(ds, img, txt, s) for s in ("train", "test"))
    m = create_method("smoothap", embed_dim=16, batch_size=8, max_epochs=3, text_model="features").with_run(
        device="cpu", log_every=1)
    it = m.fit_iter(train, val)
    seen = 0
    for ev in it:
        seen += isinstance(ev, Loss)
        if seen == 3:
            break
    model, _trainer = m._live
    live = dict(model.named_parameters())
    shared = m.checkpoint_state()["state"]["model_state_"]
    assert all(np.shares_memory(shared[k], live[k].detach().numpy()) for k in live)
    snap = m.state_dict()["state"]["model_state_"]
    assert not any(np.shares_memory(snap[k], live[k].detach().numpy()) for k in live)
    save_checkpoint(tmp_path / "mid.pt", {"method_state": m.checkpoint_state()})
    assert m.model_state_ is None and m.train_state_ is None          # nothing kept on the method
    frozen = {k: v.copy() for k, v in snap.items()}
    for ev in it:                                                    # training goes on, the snapshot stays
        pass
    assert all(np.array_equal(frozen[k], snap[k]) for k in frozen)
    assert m.best_state_ is not None
    final = dict(m.model().named_parameters())                         # the trained model itself, not a rebuild
    assert all(np.shares_memory(m.model_state_[k], final[k].detach().numpy()) for k in final)
    assert m.best_state_ is m.model_state_          # the best epoch's weights are the model's: one set, stored once
    m.save(tmp_path / "done.pt")
    again = Method.load(tmp_path / "done.pt")
    assert all(np.shares_memory(again.model_state_[k], again.best_state_[k]) for k in again.model_state_)
    np.testing.assert_allclose(again.encode_images(val), m.encode_images(val), rtol=1e-6)


def test_large_normalised_features_are_file_backed_and_equal(tmp_path, monkeypatch):
    """A normalisation's large result (the run's image features at COCO size) is a memory-mapped scratch file with
    no name (nothing left behind), whose pages can leave the resident set once a step is done with them; the same
    rows as in memory. Where no scratch file can be made it is plain memory."""
    import crossview.core.io as eio
    import crossview.features.normalize as N

    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 6)).astype(np.float32)
    want = N.FeatureNorm("ssr").transform(x)
    monkeypatch.setattr(eio, "SCRATCH_BYTES", 256)
    monkeypatch.setattr(N, "_CHUNK_ROWS", 7)
    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    got = N.FeatureNorm("ssr").transform(x)
    assert isinstance(got, np.memmap) and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), want)
    assert list((tmp_path / "cache" / "scratch").iterdir()) == []           # unlinked: no file to clean up
    eio.drop_pages(got)
    np.testing.assert_array_equal(take_rows(got, np.array([40, 3, 17])), want[[40, 3, 17]])   # read back
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("x")
    plain = eio.scratch_array((100, 10), np.float32, folder=blocked)
    assert not isinstance(plain, np.memmap) and plain.shape == (100, 10) and not plain.any()


def test_the_training_features_leave_the_resident_set_while_each_validation_runs(monkeypatch):
    """Each epoch's validation embeds its own split: the training split's (file-backed) features are given back
    first, so at size they are not held beside the validation's embeddings; training then goes on the same."""
    import _engine_helpers as H
    import crossview.methods.torch_method as TM
    from crossview.core.events import Validation
    from crossview.methods import create_method

    ds = H.make_toy_dataset()
    img, txt = H.toy_features(ds)
    train, val = (MethodData.from_features(ds, img, txt, s) for s in ("train", "test"))
    order: list[str] = []
    monkeypatch.setattr(TM, "drop_pages", lambda arr: order.append("drop") if arr is train.image_features else None)
    m = create_method("smoothap", embed_dim=16, batch_size=8, max_epochs=2, text_model="features").with_run(
        device="cpu", log_every=1)
    for ev in m.fit_iter(train, val):
        if isinstance(ev, Validation):
            order.append("validation")
    assert order == ["drop", "validation"] * 2


def _resident_bytes(arr: np.ndarray) -> int:
    """Bytes of ``arr``'s memory mapping resident in this process now (``/proc/self/smaps``)."""
    start = arr.ctypes.data
    with open("/proc/self/smaps") as fh:
        inside = False
        for line in fh:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= start < hi
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError("the array's mapping is not in /proc/self/smaps")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_a_mapped_array_is_written_to_a_checkpoint_a_chunk_at_a_time(tmp_path, monkeypatch):
    """A file-backed array in a checkpoint (the best epoch's weights at COCO size) is never resident whole while it is
    saved: after each chunk its pages read so far are given back; the file reads back equal."""
    import crossview.core.io as eio

    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(eio, "_SINK_CHUNK", 1 << 20)
    big = eio.scratch_array((4 << 20,), np.float32, min_bytes=1)         # 16 MB, file-backed
    big[:] = np.arange(big.size, dtype=np.float32)
    eio.drop_pages(big)
    assert isinstance(big, np.memmap) and _resident_bytes(big) < 1 << 20
    seen: list[int] = []
    real = eio._write_payload

    def watch(f, data):
        seen.append(_resident_bytes(big))
        real(f, data)

    monkeypatch.setattr(eio, "_write_payload", watch)
    eio.save_checkpoint(tmp_path / "c.pt", {"w": big, "small": np.ones(3)})
    assert len(seen) >= 16 and max(seen) <= 2 << 20, seen
    assert _resident_bytes(big) <= 1 << 20
    back = eio.load_checkpoint(tmp_path / "c.pt")
    np.testing.assert_array_equal(back["w"], np.arange(4 << 20, dtype=np.float32))
    np.testing.assert_array_equal(back["small"], np.ones(3))
    plain = eio._read_plain_without_torch(tmp_path / "c.pt", ("w",))          # read as the app reads a run
    assert plain is not None and len(plain["w"]["__ndarray__"]) == 16
    np.testing.assert_array_equal(eio.from_plain(plain)["w"], np.arange(4 << 20, dtype=np.float32))


def test_a_damaged_chunked_array_is_one_clear_line(tmp_path):
    import torch

    from crossview.core.errors import CrossViewError
    from crossview.core.io import CHECKPOINT_FORMAT, load_checkpoint

    bad = {"format": CHECKPOINT_FORMAT, "w": {"__ndarray__": [torch.zeros(3), 7], "dtype": "<f4", "shape": [4],
                                              "chunked": True}}
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(CrossViewError, match=r"bad\.pt: the checkpoint is damaged"):
        load_checkpoint(tmp_path / "bad.pt")
    bad["w"]["__ndarray__"] = [torch.zeros(3), torch.zeros(3)]                 # 6 values for a shape of 4
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(CrossViewError, match=r"bad\.pt: the checkpoint is damaged"):
        load_checkpoint(tmp_path / "bad.pt")


def test_the_best_epochs_large_weights_wait_in_file_backed_arrays(tmp_path, monkeypatch):
    """A weight of KEPT_SCRATCH_BYTES or more kept as the best epoch's is a file-backed array (a COCO-size TIMAM's
    classifier was 0.22 GB resident beside the live one from the second epoch on): equal to the weights at the best
    epoch, loaded into the model when training ends, saved and read back with the run; small ones stay in memory."""
    import _engine_helpers as H
    import crossview.methods.torch_method as TM
    from crossview.core.events import Validation
    from crossview.methods import create_method
    from crossview.methods.base import Method

    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(TM, "KEPT_SCRATCH_BYTES", 1024)
    ds = H.make_toy_dataset()
    img, txt = H.toy_features(ds)
    train, val = (MethodData.from_features(ds, img, txt, s) for s in ("train", "test"))
    m = create_method("smoothap", embed_dim=16, batch_size=8, max_epochs=5, lr=1.0, text_model="features").with_run(
        device="cpu", log_every=1)
    at_best: dict[str, np.ndarray] = {}
    best = -np.inf
    kept: dict[str, np.ndarray] = {}
    for ev in m.fit_iter(train, val):
        if isinstance(ev, Validation):
            kept = m.best_state_                 # what waits beside the live model until training ends
            if m.best_epoch_ == ev.epoch and m.best_score_ > best:
                best = m.best_score_
                at_best = {k: v.detach().numpy().copy() for k, v in m._live[0].state_dict().items()}
    big = [k for k, v in at_best.items() if v.nbytes >= 1024]
    small = [k for k, v in at_best.items() if v.nbytes < 1024]
    assert big and small and m.best_epoch_ < len(m.history_)         # the last epoch was not the best
    assert all(isinstance(kept[k], np.memmap) for k in big)
    assert not any(isinstance(kept[k], np.memmap) for k in small)
    assert all(np.array_equal(kept[k], at_best[k]) for k in at_best)
    final = m.model().state_dict()
    assert all(np.array_equal(final[k].numpy(), at_best[k]) for k in at_best)
    m.save(tmp_path / "done.pt")
    again = Method.load(tmp_path / "done.pt")
    np.testing.assert_allclose(again.encode_images(val), m.encode_images(val), rtol=1e-6)


@pytest.mark.parametrize("levels", [None, 1])
@pytest.mark.parametrize("block_rows", [1, 3, 7, None])
@pytest.mark.parametrize("two", [False, True])
def test_blocked_hubness_equals_the_full_matrix_and_its_naive_loop(levels, block_rows, two):
    """The hubness read from the ranking's own score blocks (i2t: each block's rows; t2i: each caption's best images
    carried from block to block) equals hubness() of the whole matrix and of its transpose, ties included (the grid
    makes many), with one model and with a separate t2i model; the ranks are those of the full matrices."""
    from crossview.eval.hubness import hubness

    img, txt, ci = _embeddings(23, 3, 4, seed=11, levels=levels)
    img2, txt2, _ = _embeddings(23, 3, 4, seed=12, levels=levels) if two else (img, txt, None)
    got = M.evaluate_embeddings_blocked(img, txt, ci, image_t2i=img2 if two else None,
                                        text_t2i=txt2 if two else None, block_rows=block_rows, hubness=True)
    s, s2 = img @ txt.T, img2 @ txt2.T
    assert got["hubness"]["i2t"] == hubness(s).as_dict()
    assert got["hubness"]["t2i"] == hubness(s2.T).as_dict()
    np.testing.assert_array_equal(got["ranks"]["i2t"], M.i2t_ranks(s, ci))
    np.testing.assert_array_equal(got["ranks"]["t2i"], M.t2i_ranks(s2, ci))
    # each caption's top-10 images, against a sort of its column by (-score, index)
    tops = M.embedding_ranks(img, txt, ci, image_t2i=img2 if two else None, text_t2i=txt2 if two else None,
                             block_rows=block_rows, top=10)["top"]
    for j in range(s2.shape[1]):
        ref = sorted(range(s2.shape[0]), key=lambda i: (-float(s2[i, j]), i))[:10]
        assert tops["t2i"][j].tolist() == ref


def test_one_model_forms_its_score_blocks_twice_two_models_three_times(monkeypatch):
    """The passes over the score blocks: ranking both ways and the hubness of both from 2 passes with one model
    (the t2i gold scores read in the i2t pass), 3 with a separate t2i model (it was 3 and 5 with the hubness's own
    products: 5 and 7)."""
    img, txt, ci = _embeddings(20, 3, 4, seed=13)
    calls = []
    real = M._score_blocks

    def counted(a, b, rows):
        calls.append(rows)
        return real(a, b, rows)

    monkeypatch.setattr(M, "_score_blocks", counted)
    M.evaluate_embeddings_blocked(img, txt, ci, block_rows=6, hubness=True)
    assert len(calls) == 2
    calls.clear()
    M.evaluate_embeddings_blocked(img, txt, ci, image_t2i=img, text_t2i=txt, block_rows=6, hubness=True)
    assert len(calls) == 3


def test_the_t2i_model_is_checked_like_the_i2t_one():
    img, txt, ci = _embeddings(6, 2, 4, seed=14)
    with pytest.raises(Exception, match="the t2i model: .*same D"):
        M.embedding_ranks(img, txt, ci, image_t2i=img, text_t2i=txt[:, :3])
    with pytest.raises(Exception, match="t2i model's image embeddings have 5 rows"):
        M.embedding_ranks(img, txt, ci, image_t2i=img[:5], text_t2i=txt)
