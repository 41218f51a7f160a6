"""TF-IDF caption features sparse end to end (issue 34): the encoder gives CSR rows, the feature cache stores and
returns them sparse, CCA / BITR / WSABIE and the deep methods on caption features (VSE++, SmoothAP, TIMAM, webly)
train on them with the dense matrix's results, and no dense ``n_captions x vocabulary`` array is made on the
way."""

from __future__ import annotations

import json
import tracemalloc
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from crossview.core.progress import drive
from crossview.data.method_data import MethodData
from crossview.features import FeatureCache, encode_captions
from crossview.features import cache as cache_mod
from crossview.features.text import create_text_encoder
from crossview.methods import create_method

from _engine_helpers import make_toy_dataset

WORDS = [f"w{i}" for i in range(48)]


def _captions(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = [" ".join(rng.choice(WORDS, int(rng.integers(3, 9)))) for _ in range(n)]
    out[5] = ""                      # an empty caption: a zero row
    out[6] = "unknown words only"    # no known word: a zero row
    return out


@pytest.mark.parametrize("name, params", [("tfidf", {}), ("tfidf", {"sublinear_tf": True, "norm": "l1"}),
                                          ("bow", {}), ("bow", {"binary": True, "norm": "l2"})])
def test_sparse_rows_equal_the_dense_encoding(name, params):
    caps = _captions(300, 0)
    enc = create_text_encoder(name, **params).fit(caps[7:200])
    got = drive(enc.iter_encode_sparse(caps, batch_size=64))
    assert sp.isspmatrix_csr(got) and got.dtype == np.float32 and got.shape == (300, enc.dim)
    np.testing.assert_allclose(got.toarray(), enc.encode(caps), rtol=1e-6, atol=1e-7)
    assert got[5].nnz == 0 and got[6].nnz == 0


@pytest.mark.parametrize("mmap_bytes", [None, 1000])
def test_tfidf_round_trip_through_the_cache_stays_sparse(tmp_path, monkeypatch, mmap_bytes):
    if mmap_bytes is not None:       # the file memory-mapped, as a COCO-size entry is
        monkeypatch.setattr(cache_mod, "MMAP_BYTES", mmap_bytes)
    caps = _captions(400, 1)
    enc = create_text_encoder("tfidf").fit(caps)
    store = FeatureCache(tmp_path / "cache")
    first, hit = encode_captions(caps, enc, cache=store)
    assert not hit and sp.isspmatrix_csr(first)
    again, hit = encode_captions(caps, enc, cache=store)
    assert hit and sp.isspmatrix_csr(again) and again.dtype == np.float32
    assert (again != first).nnz == 0
    np.testing.assert_allclose(again.toarray(), enc.encode(caps), rtol=1e-6, atol=1e-7)
    entry = store.entries()[0]
    assert entry["sparse"]["shape"] == [400, enc.dim] and entry["sparse"]["nnz"] == first.nnz
    # stored compactly: the file holds the non-zeros, not the 400 x dim matrix
    assert entry["file_size"] < 0.5 * 400 * enc.dim * 4
    if mmap_bytes is not None:
        assert isinstance(again.data.base, np.memmap) or isinstance(again.data, np.memmap) or \
            not again.data.flags.owndata


def test_a_damaged_sparse_description_is_a_miss(tmp_path):
    caps = _captions(50, 2)
    enc = create_text_encoder("tfidf").fit(caps)
    store = FeatureCache(tmp_path)
    encode_captions(caps, enc, cache=store)
    meta_path = next(tmp_path.glob("??/*.json"))
    meta = json.loads(meta_path.read_text())
    meta["sparse"]["parts"]["indptr"]["count"] = 10 ** 9
    meta_path.write_text(json.dumps(meta))
    _, hit = encode_captions(caps, enc, cache=store)     # deleted and encoded again, no traceback
    assert not hit


def _pairs(n_images: int = 60, per: int = 3, vocab: int = 30, p: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    topics = rng.integers(0, 4, n_images)
    img = (rng.standard_normal((n_images, p)) + 3 * np.eye(4, p)[topics]).astype(np.float32)
    rows = []
    for i in range(n_images):
        for _ in range(per):
            r = np.zeros(vocab, np.float32)
            w = rng.choice(vocab, 4, replace=False)
            w[0] = topics[i]
            r[w] = rng.random(4) + 0.1
            rows.append(r / np.linalg.norm(r))
    return img, np.stack(rows), np.repeat(np.arange(n_images), per)


@pytest.mark.parametrize("name, params", [
    ("cca", {"n_components": 8}),
    ("bitr", {"c_grid": "", "max_iter": 20, "cca_dim": 8}),
    ("bitr", {"c_grid": "0.1,1", "cv_folds": 2, "max_iter": 10, "cca_dim": 6}),
    ("wsabie", {"dim": 8, "max_epochs": 2, "batch_size": 16}),
    # the deep methods on caption features densify a batch's rows only (issue 34: the whole matrix before)
    ("vsepp", {"text_model": "features", "embed_dim": 8, "max_epochs": 2, "batch_size": 16}),
    ("smoothap", {"text_model": "features", "embed_dim": 8, "max_epochs": 2, "batch_size": 16}),
    ("timam", {"embed_dim": 8, "max_epochs": 2, "batch_size": 16}),
    ("webly", {"text_model": "features", "embed_dim": 8, "max_epochs": 2, "batch_size": 16}),
])
def test_dense_and_sparse_captions_give_the_same_model(name, params):
    torch.set_num_threads(1)
    img, dense, ci = _pairs()
    caps = [f"c{i}" for i in range(len(ci))]
    out = []
    for text in (dense, sp.csr_matrix(dense)):
        data = MethodData(image_features=img, text_features=text, captions=caps, caption_image=ci, name="train")
        m = create_method(name, **params).with_run(device="cpu", seed=0)
        m.fit(data)
        out.append((m.encode_images(data), m.encode_texts(data), m.encode_texts(data, direction="t2i")))
    for a, b in zip(*out):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)


def test_sparse_captions_are_never_densified(monkeypatch):
    """CCA, BITR, WSABIE and the deep methods on caption features on 15,000 sparse captions x 400 words (dense
    float32: 24 MB): no scipy densify of the matrix, no torch gather of all its rows, and numpy's traced peak stays
    under half the dense bytes."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(3)
    n_img, per, vocab = 3000, 5, 400
    topics = rng.integers(0, 20, n_img)
    img = (rng.standard_normal((n_img, 12)) + 2 * rng.standard_normal((20, 12))[topics]).astype(np.float32)
    ci = np.repeat(np.arange(n_img), per)
    n = len(ci)
    cols = np.hstack([(topics[ci, None] * 20 + rng.integers(0, 20, (n, 3))) % vocab, rng.integers(0, vocab, (n, 3))])
    text = sp.csr_matrix((np.full(cols.size, 0.4, np.float32), (np.repeat(np.arange(n), 6), cols.ravel())),
                         shape=(n, vocab))
    text.sum_duplicates()
    dense_bytes = n * vocab * 4

    def refuse(self, *a, **k):
        if self.shape[0] * self.shape[1] >= 0.1 * n * vocab:
            raise AssertionError(f"densified a {self.shape} sparse matrix")
        return real_toarray(self, *a, **k)

    from crossview.nn.sparse_rows import SparseRows
    real_toarray = sp.csr_matrix.toarray
    real_getitem = SparseRows.__getitem__

    def gather(self, idx):      # a batch's rows or one sampling round's candidates (4M values), never them all
        rows = torch.as_tensor(idx).numel()
        assert rows < n and rows * vocab <= 1 << 22, f"gathered {rows} of {n} caption rows at once"
        return real_getitem(self, idx)

    monkeypatch.setattr(sp.csr_matrix, "toarray", refuse)
    monkeypatch.setattr(sp.csr_matrix, "todense", refuse)
    monkeypatch.setattr(SparseRows, "__getitem__", gather)
    data = MethodData(image_features=img, text_features=text, captions=[""] * n, caption_image=ci, name="train")
    for name, params in [("cca", {"n_components": 8}), ("bitr", {"c_grid": "", "max_iter": 3, "cca_dim": 8}),
                         ("wsabie", {"dim": 16, "max_epochs": 1, "batch_size": 1024, "max_draws": 20})] + [
                         (deep, {"embed_dim": 16, "max_epochs": 1, "batch_size": 512, **(
                             {} if deep == "timam" else {"text_model": "features"})})
                         for deep in ("vsepp", "smoothap", "timam", "webly")]:
        # once on a few images first: the modules a first fit imports (torch's compiler stack) are not features
        create_method(name, **params).with_run(device="cpu", seed=0).fit(data.subset(np.arange(60)))
        m = create_method(name, **params).with_run(device="cpu", seed=0)
        tracemalloc.start()
        try:
            m.fit(data)
            m.encode_texts(data)
            m.encode_texts(data, direction="t2i")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 0.5 * dense_bytes, f"{name} peaked at {peak / 1e6:.0f} MB; dense is {dense_bytes / 1e6:.0f} MB"


def test_a_tfidf_run_keeps_its_caption_features_sparse(tmp_path, monkeypatch):
    """Through the engine: extracted sparse, cached sparse, CCA trained and evaluated on them, and a caller that
    asks for them dense gets them dense."""
    from crossview.engine import run as run_mod
    from crossview.features import extract_features

    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    ds = make_toy_dataset(n_images=60)
    feats = extract_features(ds, text_encoder="tfidf", cache=FeatureCache(tmp_path / "cache"))
    assert sp.isspmatrix_csr(feats.text) and feats.text.shape[0] == ds.n_captions
    run = run_mod.train("cca", ds, run_dir=tmp_path / "r", text_encoder="tfidf", device="cpu",
                        cache=FeatureCache(tmp_path / "cache"))
    for _ in run:
        pass
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["rsum"] > 0
    train = MethodData.from_features(ds, feats.image, feats.text, "train")
    assert sp.isspmatrix_csr(train.text_features)
    dense = train.require_text_features("vsepp")
    assert isinstance(dense, np.ndarray) and dense.shape == train.text_features.shape


def test_a_full_disk_gives_the_sparse_rows_unstored(tmp_path, monkeypatch):
    import errno

    def full(self, key, array, meta, sparse=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(FeatureCache, "_save", full)
    monkeypatch.setattr(cache_mod, "_UNWRITABLE", set())
    caps = _captions(40, 3)
    enc = create_text_encoder("tfidf").fit(caps)
    got, hit = encode_captions(caps, enc, cache=FeatureCache(tmp_path))
    assert not hit and sp.isspmatrix_csr(got)
    np.testing.assert_allclose(got.toarray(), enc.encode(caps), rtol=1e-6, atol=1e-7)
    assert not list(tmp_path.glob("??/*"))


@pytest.mark.parametrize("center", [False, True])
def test_sparse_rows_share_the_csr_and_equal_its_dense_rows(center):
    """nn.sparse_rows.SparseRows on the CPU holds the CSR's own int32 index and float32 value arrays (int64 copies of
    the indices were 43 MB at COCO size, issue 34); gathered rows, scores and embeddings equal the dense matrix's."""
    from crossview.nn.sparse_rows import SparseRows

    rng = np.random.default_rng(0)
    dense_in = sp.random(40, 25, density=0.3, dtype=np.float32, random_state=1).toarray()
    dense_in[7] = 0                                                     # an empty row
    csr = sp.csr_matrix(dense_in)
    c = rng.standard_normal(25).astype(np.float32) if center else None
    rows = SparseRows.from_csr(csr, c, "l2", "cpu")
    idx = torch.tensor([[3, 7], [39, 3]])
    assert rows.indices.dtype == torch.int32 and np.shares_memory(rows.indices.numpy(), csr.indices)
    assert np.shares_memory(rows.data.numpy(), csr.data)
    frozen = sp.csr_matrix(csr, copy=True)
    for part in (frozen.data, frozen.indices, frozen.indptr):
        part.flags.writeable = False                                    # the feature cache's are read-only maps
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shared = SparseRows.from_csr(frozen, c, "l2", "cpu")
    assert np.shares_memory(shared.indices.numpy(), frozen.indices)
    np.testing.assert_array_equal(shared[idx].numpy(), rows[idx].numpy())
    dense = csr.toarray() - (c if center else 0.0)
    dense = dense / np.maximum(np.linalg.norm(dense, axis=1, keepdims=True), 1e-12)
    np.testing.assert_allclose(rows[idx].numpy(), dense[idx.numpy()], rtol=1e-5, atol=1e-6)
    u = rng.standard_normal((4, 25)).astype(np.float32)
    np.testing.assert_allclose(rows.scores(torch.from_numpy(u)).numpy(), u @ dense.T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rows.embed(torch.from_numpy(u)).numpy(), dense @ u.T, rtol=1e-4, atol=1e-5)
