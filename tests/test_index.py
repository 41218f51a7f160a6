"""Top-k indexes: exact search against a naive full sort (with the tie rule), FAISS backends."""

from __future__ import annotations

import numpy as np
import pytest

from crossview.core.errors import CrossViewError
from crossview.index import (
    BACKENDS,
    ExactIndex,
    FaissIndex,
    TopKResult,
    build_index,
    list_backends,
)
from crossview.index.base import merge_topk, order_keys


def naive_topk(gallery, queries, k):
    """Full stable sort of every score row: descending score, ascending index on ties."""
    s = np.atleast_2d(queries).astype(np.float64) @ gallery.astype(np.float64).T
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(s, order, axis=1)


def integer_data(rng, n, d, m, high=3):
    """Small-integer vectors: every product is exact in float32, and ties are everywhere."""
    g = rng.integers(-high, high + 1, (n, d)).astype(np.float32)
    q = rng.integers(-high, high + 1, (m, d)).astype(np.float32)
    return g, q


def recall(found, truth):
    return np.mean([len(set(f[f >= 0]) & set(t)) / len(t) for f, t in zip(found, truth)])


def clustered(rng, n, d, n_clusters, noise=0.15):
    centres = rng.standard_normal((n_clusters, d)).astype(np.float32)
    x = centres[rng.integers(0, n_clusters, n)] + noise * rng.standard_normal((n, d)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

# ---------------------------------------------------------------- tie-rule helpers


def test_order_keys_follow_score_then_index():
    rng = np.random.default_rng(0)
    vals = np.array([0.0, -0.0, 1.5, -1.5, np.inf, -np.inf, 3e-39, -3e-39, 1e30, -1e30],
                    dtype=np.float32)
    s = np.concatenate([vals, rng.standard_normal(200).astype(np.float32), vals])
    ids = rng.permutation(s.size).astype(np.int64)
    keys = order_keys(s, ids)
    by_key = np.argsort(keys)[::-1]                         # key descending
    naive = sorted(range(s.size), key=lambda j: (-float(s[j]), int(ids[j])))
    assert by_key.tolist() == naive


def test_merge_topk_matches_naive():
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 5, 60)
    ids = rng.permutation(60).astype(np.int64)
    scores = np.round(rng.standard_normal(60), 0).astype(np.float32)
    got_s, got_i = merge_topk(scores, ids, rows, 6, 4)
    for r in range(6):
        cand = sorted([(-float(scores[j]), int(ids[j])) for j in range(60) if rows[j] == r])[:4]
        expect_i = [c[1] for c in cand] + [-1] * (4 - len(cand))
        assert got_i[r].tolist() == expect_i
        assert got_s[r][: len(cand)].tolist() == [-c[0] for c in cand]
        assert np.all(np.isneginf(got_s[r][len(cand):]))

# ---------------------------------------------------------------- exact index


@pytest.mark.parametrize("engine", ["auto", "torch"])
@pytest.mark.parametrize("chunk_rows", [None, 7, 64, 1000])
@pytest.mark.parametrize("m", [1, 5])
def test_exact_equals_naive_sort_with_ties(engine, chunk_rows, m):
    rng = np.random.default_rng(2)
    g, q = integer_data(rng, 1001, 6, m)         # 1001 rows: not a multiple of any chunk size
    index = ExactIndex(g, chunk_rows=chunk_rows, engine=engine)
    for k in (1, 10, 50):                        # k = 10, 50 exceed the 7-row chunks
        res = index.search(q, k)
        order, scores = naive_topk(g, q, k)
        assert res.indices.tolist() == order.tolist()
        np.testing.assert_array_equal(res.scores, scores.astype(np.float32))
        assert res.indices.dtype == np.int64 and res.scores.dtype == np.float32
        assert res.exact and res.backend == "exact"


def test_exact_equals_naive_on_continuous_data():
    rng = np.random.default_rng(3)
    g = rng.standard_normal((5000, 32)).astype(np.float32)
    q = rng.standard_normal((4, 32)).astype(np.float32)
    for chunk_rows in (None, 333):
        res = ExactIndex(g, chunk_rows=chunk_rows).search(q, 25)
        order, scores = naive_topk(g, q, 25)
        assert res.indices.tolist() == order.tolist()
        np.testing.assert_allclose(res.scores, scores, rtol=1e-5, atol=1e-5)
    single = ExactIndex(g).search(q[2], 25)      # a (d,) query is one query
    assert single.indices.shape == (1, 25)
    assert single.indices[0].tolist() == naive_topk(g, q[2], 25)[0][0].tolist()


def test_k_larger_than_gallery_is_clipped():
    rng = np.random.default_rng(4)
    g, q = integer_data(rng, 9, 4, 2)
    res = ExactIndex(g, chunk_rows=4).search(q, 50)
    assert res.indices.shape == (2, 9)
    assert res.indices.tolist() == naive_topk(g, q, 9)[0].tolist()
    assert sorted(res.indices[0].tolist()) == list(range(9))


def test_float16_storage():
    rng = np.random.default_rng(5)
    # exact for the float16-rounded gallery (integers are exact in float16)
    g, q = integer_data(rng, 3000, 8, 3)
    ix = ExactIndex(g, dtype="float16", chunk_rows=500)
    res = ix.search(q, 20)
    assert res.indices.tolist() == naive_topk(g, q, 20)[0].tolist()
    assert not res.exact and res.backend == "exact-fp16"
    assert ix._segments[0][1].dtype == np.float16          # stored at half size
    # many queries take the all-torch product; same answer
    g2, q2 = integer_data(rng, 3000, 8, 12)
    res2 = ExactIndex(g2, dtype="float16").search(q2, 20)
    assert res2.indices.tolist() == naive_topk(g2, q2, 20)[0].tolist()
    # on real-valued unit vectors the rounding costs almost no recall
    x = clustered(rng, 20000, 64, 100)
    qs = clustered(rng, 20, 64, 100)
    truth = ExactIndex(x).search(qs, 50).indices
    approx = ExactIndex(x, dtype="float16").search(qs, 50).indices
    assert recall(approx, truth) >= 0.99


def test_memmap_gallery_is_streamed(tmp_path):
    rng = np.random.default_rng(6)
    g, q = integer_data(rng, 2500, 5, 3)
    path = tmp_path / "gallery.npy"
    np.save(path, g)
    ix = ExactIndex.from_npy(path, chunk_rows=300)
    assert isinstance(ix._segments[0][1], np.memmap)       # referenced, not loaded
    res = ix.search(q, 30)
    assert res.indices.tolist() == naive_topk(g, q, 30)[0].tolist()
    half = ExactIndex.from_npy(path, dtype="float16", chunk_rows=300).search(q, 30)
    assert half.indices.tolist() == res.indices.tolist()
    with pytest.raises(CrossViewError, match="missing.npy: no such file; save the gallery with numpy.save"):
        ExactIndex.from_npy(tmp_path / "missing.npy")
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CrossViewError, match=r"gallery.npy: not a readable .npy array \(it is cut short"):
        ExactIndex.from_npy(path)


def test_add_appends_ids_and_converts_dtypes():
    rng = np.random.default_rng(7)
    g, q = integer_data(rng, 400, 6, 2)
    ix = ExactIndex(chunk_rows=64)
    ix.add(g[:150].astype(np.float64))                      # converted to float32
    ix.add(np.asfortranarray(g[150:]))                      # non-C-order: converted
    assert ix.size == 400 and ix.dim == 6 and len(ix) == 400
    assert ix.search(q, 40).indices.tolist() == naive_topk(g, q, 40)[0].tolist()


def test_index_errors_are_clear():
    g = np.zeros((10, 4), dtype=np.float32)
    with pytest.raises(CrossViewError, match="empty"):
        ExactIndex().search(np.zeros(4), 3)
    with pytest.raises(CrossViewError, match="dimension 5"):
        ExactIndex(g).search(np.zeros(5), 3)
    with pytest.raises(CrossViewError, match="dimension 3"):
        ExactIndex(g).add(np.zeros((2, 3)))
    with pytest.raises(CrossViewError, match="k must be"):
        ExactIndex(g).search(np.zeros(4), 0)
    with pytest.raises(CrossViewError, match="NaN"):
        ExactIndex(g).search(np.full(4, np.nan), 1)
    with pytest.raises(CrossViewError, match="storage dtype"):
        ExactIndex(g, dtype="int4")
    with pytest.raises(CrossViewError, match="unknown device"):
        ExactIndex(g, device="tpu")
    with pytest.raises(CrossViewError) as err:
        build_index(g, "annoy")
    for name in BACKENDS:
        assert name in str(err.value)
    with pytest.raises(CrossViewError, match="kind"):
        FaissIndex(g, kind="hnsw")


def test_cuda_request_without_gpu_is_an_error_and_auto_falls_back():
    import torch
    if torch.cuda.is_available():
        ix = ExactIndex(np.eye(4, dtype=np.float32), device="auto")
        assert ix.device.startswith("cuda")
        res = ix.search(np.eye(4, dtype=np.float32), 2)
        assert res.indices[:, 0].tolist() == [0, 1, 2, 3]
        return
    with pytest.raises(CrossViewError, match="no CUDA GPU"):
        ExactIndex(np.eye(4, dtype=np.float32), device="cuda")
    assert ExactIndex(np.eye(4, dtype=np.float32), device="auto").device == "cpu"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cuda_exact_index_agrees_with_the_naive_sort(dtype):
    """Runs where a GPU is present (the device machine); skipped on CPU-only machines and CI."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    rng = np.random.default_rng(21)
    g, q = integer_data(rng, 30_000, 16, 37)         # exact products, many ties
    res = ExactIndex(g, device="cuda", dtype=dtype).search(q, 25)
    ref_i, ref_s = naive_topk(g, q, 25)
    np.testing.assert_array_equal(res.indices, ref_i)
    np.testing.assert_allclose(res.scores, ref_s)
    big = rng.standard_normal((200_000, 64)).astype(np.float32)
    qq = rng.standard_normal((5, 64)).astype(np.float32)
    got = ExactIndex(big, device="cuda").search(qq, 10).indices
    np.testing.assert_array_equal(got, naive_topk(big, qq, 10)[0])


def test_gpu_candidate_selection_logic_on_cpu_tensors():
    """The GPU path's topk-candidates + keys step, run on CPU tensors so CI checks its logic."""
    torch = pytest.importorskip("torch")
    from crossview.index.exact import _candidate_keys, _torch_decode
    rng = np.random.default_rng(5)
    g = rng.standard_normal((5000, 12)).astype(np.float32)
    q = rng.standard_normal((4, 12)).astype(np.float32)
    keys = _candidate_keys(torch, torch.from_numpy(q), torch.from_numpy(g), 100, 10)
    s, i = _torch_decode(torch, keys)
    ref_i, ref_s = naive_topk(g, q, 10)
    np.testing.assert_array_equal(i.numpy(), ref_i + 100)
    np.testing.assert_allclose(s.numpy(), ref_s, rtol=1e-5)
    # float16 storage: candidates re-scored in float32 give the top-k of the half-rounded gallery
    g16 = g.astype(np.float16)
    keys = _candidate_keys(torch, torch.from_numpy(q), torch.from_numpy(g16), 0, 10)
    ref_i16, _ = naive_topk(g16.astype(np.float32), q, 10)
    assert keys is not None
    np.testing.assert_array_equal(_torch_decode(torch, keys)[1].numpy(), ref_i16)
    # many equal scores at the k-th place: the shortcut declines and the caller falls back
    gi, qi = integer_data(rng, 3000, 4, 3, high=1)
    assert _candidate_keys(torch, torch.from_numpy(qi), torch.from_numpy(gi), 0, 10) is None

# ---------------------------------------------------------------- FAISS


def test_faiss_flat_equals_exact():
    rng = np.random.default_rng(8)
    g = rng.standard_normal((4000, 24)).astype(np.float32)
    q = rng.standard_normal((6, 24)).astype(np.float32)
    exact = ExactIndex(g).search(q, 20)
    flat = build_index(g, "faiss-flat").search(q, 20)
    assert flat.indices.tolist() == exact.indices.tolist()
    np.testing.assert_allclose(flat.scores, exact.scores, rtol=1e-5, atol=1e-5)
    assert flat.exact and flat.backend == "faiss-flat"
    one = build_index(g, "faiss-flat").search(q[0], 20)
    assert one.indices[0].tolist() == exact.indices[0].tolist()


def test_faiss_ivf_recall_on_clustered_data():
    rng = np.random.default_rng(9)
    g = clustered(rng, 20000, 32, 200)
    q = clustered(rng, 50, 32, 200)
    ix = FaissIndex(g, kind="ivf", nprobe=8)
    assert ix.nlist == min(int(round(4 * np.sqrt(20000))), 20000 // 39)   # >= 39 points per list
    truth = ExactIndex(g).search(q, 10).indices
    res = ix.search(q, 10)
    assert not res.exact and res.backend == "faiss-ivf"
    assert recall(res.indices, truth) >= 0.9
    ix.nprobe = 1
    low = recall(ix.search(q, 10).indices, truth)
    ix.nprobe = ix.nlist                                     # all lists: exhaustive
    assert recall(ix.search(q, 10).indices, truth) == 1.0
    assert low < 1.0
    single = ix.search(q[0], 10)
    assert single.indices.shape == (1, 10)


@pytest.mark.parametrize("kind, d", [("sq8", 100), ("sqfp16", 100), ("sq8", 128), ("sq8", 64)])
def test_scalar_quantizers_with_rerank(kind, d):
    """d=100 is padded to 104 internally; 64 and 128 (multiples of 32, where FAISS 1.15's 8-bit direct codec
    ranks wrongly) to 72 and 136."""
    rng = np.random.default_rng(10)
    g = clustered(rng, 30000, d, 300)
    q = clustered(rng, 30, d, 300)
    exact = ExactIndex(g).search(q, 50)
    ix = build_index(g, f"faiss-{kind}", shards=2)
    res = ix.search(q, 50)
    assert not res.exact and res.backend == f"faiss-{kind}"
    assert recall(res.indices, exact.indices) >= 0.99
    # re-scored exactly: the returned scores are the float32 inner products of the returned rows
    expect = np.einsum("mkd,md->mk", g[res.indices], q)
    np.testing.assert_allclose(res.scores, expect, rtol=1e-5, atol=1e-5)
    # one query takes the threaded shard path; the same answer as in the batch
    one = ix.search(q[3], 50)
    assert one.indices[0].tolist() == res.indices[3].tolist()
    # rerank=1: raw quantized scores, still a good ranking for sq kinds
    raw = FaissIndex(g, kind=kind, rerank=1, shards=3).search(q, 50)
    assert recall(raw.indices, exact.indices) >= 0.9


def test_sharded_ids_follow_multiple_adds():
    rng = np.random.default_rng(11)
    g = clustered(rng, 3001, 16, 30)
    ix = FaissIndex(kind="sqfp16", shards=3)
    ix.add(g[:1000])
    ix.add(g[1000:])
    q = g[[5, 1500, 2999]]
    res = ix.search(q, 1)
    assert res.indices[:, 0].tolist() == [5, 1500, 2999]    # a unit vector finds itself


def test_backend_list_and_result_type():
    assert list_backends() == list(BACKENDS)
    g = np.eye(5, dtype=np.float32)
    res = build_index(g).search(g[1], 3)
    assert isinstance(res, TopKResult) and res.k == 3
    assert res.indices[0].tolist() == [1, 0, 2]             # ties at 0.0: smaller index first
