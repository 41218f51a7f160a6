"""The content-addressed feature cache: hits, misses, memory mapping, corrupt and partial entries."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crossview.features import cache as cache_mod
from crossview.features.cache import FeatureCache


@pytest.fixture
def store(tmp_path):
    return FeatureCache(tmp_path / "features")


def test_key_is_canonical_and_sensitive():
    k1 = FeatureCache.make_key(images="abc", encoder={"name": "mobilenet_v2", "weights": "b0353104"})
    k2 = FeatureCache.make_key(encoder={"weights": "b0353104", "name": "mobilenet_v2"}, images="abc")
    k3 = FeatureCache.make_key(images="abc", encoder={"name": "mobilenet_v2", "weights": "b0353105"})
    assert k1 == k2 and k1 != k3 and len(k1) == 64


def test_second_extraction_is_a_hit(store):
    calls = []

    def compute():
        calls.append(1)
        return np.arange(12, dtype=np.float32).reshape(3, 4)

    key = store.make_key(what="x")
    a, hit_a = store.get_or_compute(key, compute, {"what": "x"})
    b, hit_b = store.get_or_compute(key, compute, {"what": "x"})
    assert (hit_a, hit_b) == (False, True) and len(calls) == 1
    np.testing.assert_array_equal(a, b)
    assert store.meta(key)["parts"] == {"what": "x"}
    assert [e["key"] for e in store.entries()] == [key]


def test_large_arrays_are_memory_mapped(store, monkeypatch):
    monkeypatch.setattr(cache_mod, "MMAP_BYTES", 1000)
    key = store.make_key(what="big")
    arr = store.save(key, np.ones((100, 10), np.float32))
    assert isinstance(arr, np.memmap) and not arr.flags.writeable
    small = store.save(store.make_key(what="small"), np.ones((2, 2), np.float32))
    assert not isinstance(small, np.memmap)


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "no_json", "bad_json", "wrong_shape"])
def test_corrupt_entry_is_detected_and_rebuilt(store, damage):
    key = store.make_key(what="c")
    good = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    store.save(key, good)
    npy = store.path_of(key)
    meta = npy.with_suffix(".json")
    if damage == "truncate":
        npy.write_bytes(npy.read_bytes()[:-40])
    elif damage == "flip_byte":
        raw = bytearray(npy.read_bytes())
        raw[-5] ^= 0xFF
        npy.write_bytes(bytes(raw))
    elif damage == "no_json":
        meta.unlink()
    elif damage == "bad_json":
        meta.write_text("{not json")
    elif damage == "wrong_shape":
        info = json.loads(meta.read_text())
        info["shape"] = [25, 16]
        meta.write_text(json.dumps(info))
    assert store.load(key) is None
    assert not npy.exists() and not meta.exists()
    rebuilt, hit = store.get_or_compute(key, lambda: good.copy())
    assert not hit
    np.testing.assert_array_equal(rebuilt, good)
    assert store.load(key) is not None


def test_crash_during_write_leaves_no_entry_and_keeps_the_old_one(store, monkeypatch):
    key = store.make_key(what="w")
    old = np.zeros((4, 4), np.float32)
    store.save(key, old)

    def exploding_save(f, arr, allow_pickle=False):
        f.write(b"\x93NUMPY partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", exploding_save)
    with pytest.raises(OSError):
        store.save(store.make_key(what="new"), np.ones((4, 4), np.float32))
    monkeypatch.undo()
    assert store.load(store.make_key(what="new")) is None
    assert not list(store.root.glob("*/*.tmp")), "temporary files must be cleaned up"
    np.testing.assert_array_equal(store.load(key), old)


def test_rejects_bad_keys_and_object_arrays(store):
    with pytest.raises(ValueError):
        store.load("../../etc/passwd")
    with pytest.raises(ValueError):
        store.save(store.make_key(what="o"), np.array([object()], dtype=object))


def _overwrite_rows(path, first_row, last_row, row_bytes, value=b"\0"):
    """Overwrite rows ``first_row..last_row`` of the .npy at ``path`` in place (size and header unchanged)."""
    import os
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        offset = f.tell()
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, value * ((last_row - first_row + 1) * row_bytes), offset + first_row * row_bytes)
    finally:
        os.close(fd)


def test_corrupt_middle_rows_of_a_large_entry_are_detected_and_recomputed(store, caplog):
    """The bug: only the first and last MiB were hashed, so rows in the middle could rot unseen."""
    clean = np.random.default_rng(1).standard_normal((4000, 512)).astype(np.float32)  # 8 MiB
    key = store.make_key(what="middle")
    calls = []

    def compute():
        calls.append(1)
        return clean.copy()

    store.get_or_compute(key, compute)
    npy = store.path_of(key)
    _overwrite_rows(npy, 1500, 2400, clean.shape[1] * 4)
    with caplog.at_level("WARNING", logger="crossview.features.cache"):
        again, hit = store.get_or_compute(key, compute)
    assert not hit and len(calls) == 2, "the corrupt entry must be recomputed"
    np.testing.assert_array_equal(again, clean)
    msg = caplog.text
    assert str(npy) in msg and "checksum mismatch" in msg and "extracted again" in msg
    assert "crossview features cache --clear" in msg
    rows = [int(r.replace(",", "")) for r in msg.split("rows ", 1)[1].split(")")[0].split(";")[0].split("-")]
    assert rows[0] <= 1500 and rows[1] >= 2400, msg
    third, hit = store.get_or_compute(key, compute)
    assert hit and len(calls) == 2
    np.testing.assert_array_equal(third, clean)


def test_memory_mapped_entries_are_verified_over_the_whole_file(store, monkeypatch):
    monkeypatch.setattr(cache_mod, "MMAP_BYTES", 1000)
    monkeypatch.setattr(cache_mod, "CHUNK_BYTES", 4096)
    clean = np.arange(64 * 1000, dtype=np.float32).reshape(1000, 64)
    key = store.make_key(what="mapped")
    store.save(key, clean)
    assert len(store.meta(key)["checksum"]["chunks"]) == -(-store.path_of(key).stat().st_size // 4096)
    assert store.verify(key) is None
    _overwrite_rows(store.path_of(key), 500, 500, 64 * 4, value=b"\x01")
    problem = store.verify(key)
    assert problem is not None and "rows 495-511" in problem  # the 4 KiB chunk that holds row 500 (after a 128-byte header)
    assert store.load(key) is None and not store.path_of(key).exists()


def test_entry_without_a_whole_file_checksum_is_rebuilt(store):
    key = store.make_key(what="old")
    store.save(key, np.ones((3, 3), np.float32))
    meta_path = store.path_of(key).with_suffix(".json")
    info = json.loads(meta_path.read_text())
    del info["checksum"]                      # what CrossView wrote before the whole-file checksum
    meta_path.write_text(json.dumps(info))
    assert "older CrossView" in store.verify(key)
    assert store.load(key) is None


def test_loaded_small_arrays_are_writable_copies(store):
    key = store.make_key(what="w2")
    store.save(key, np.arange(6, dtype=np.float64).reshape(2, 3))
    a = store.load(key)
    assert a.dtype == np.float64 and a.shape == (2, 3) and a.flags.writeable
    a[0, 0] = 7  # a private copy: the file is not changed
    assert store.load(key)[0, 0] == 0


def _tfidf(captions):
    from crossview.features.text import create_text_encoder
    return create_text_encoder("tfidf").fit(captions)


CAPTIONS = [f"a {c} {o} on the {p}" for c in ("red", "blue", "green", "black") for o in ("dog", "cat", "ball")
            for p in ("grass", "beach", "road")]


def test_nan_rows_in_a_cached_entry_are_extracted_again(store, caplog):
    from crossview.features import _captions_fingerprint, encode_captions

    model = _tfidf(CAPTIONS)
    clean, hit = encode_captions(CAPTIONS, model, cache=store)
    assert not hit
    # TF-IDF rows are cached sparse (CSR, issue 34), under a key that says so
    parts = {"kind": "text", "captions": _captions_fingerprint(CAPTIONS), "encoder": model.cache_parts(),
             "layout": "csr"}
    key = FeatureCache.make_key(**parts)
    assert store.contains(key)
    poisoned = clean.copy()
    poisoned.data[poisoned.indptr[5]:poisoned.indptr[9]] = np.nan
    store.save(key, poisoned, parts)          # a consistent entry (checksums match) with NaN rows
    with caplog.at_level("WARNING"):
        again, hit = encode_captions(CAPTIONS, model, cache=store)
    assert not hit and np.isfinite(again.toarray()).all()
    np.testing.assert_array_equal(again.toarray(), clean.toarray())
    assert str(store.path_of(key)) in caplog.text and "NaN" in caplog.text
    assert "crossview features extract" in caplog.text


def test_an_encoder_that_makes_nan_is_a_clear_error_and_nothing_is_cached(store):
    from crossview.core.errors import CrossViewError
    from crossview.features import encode_captions

    model = _tfidf(CAPTIONS)
    real = model.iter_encode_sparse    # what encode_captions drives for TF-IDF (sparse rows)

    def broken(captions, **kw):
        out = yield from real(captions, **kw)
        out.data[out.indptr[3]] = np.inf
        return out

    model.iter_encode_sparse = broken
    with pytest.raises(CrossViewError, match=r"NaN or infinite values in 1 of 36 rows \(first: caption 3"):
        encode_captions(CAPTIONS, model, cache=store)
    assert store.entries() == []


def test_cli_features_cache_verify_finds_and_deletes_a_corrupt_entry(store, capsys):
    from crossview.cli import main

    good = store.make_key(what="good")
    store.save(good, np.ones((10, 4), np.float32))
    bad = store.make_key(what="bad")
    store.save(bad, np.zeros((600, 1024), np.float32))
    _overwrite_rows(store.path_of(bad), 300, 310, 1024 * 4, value=b"\x07")
    assert main(["features", "cache", "--cache-dir", str(store.root), "--verify"]) == 1
    out = capsys.readouterr()
    assert "1 corrupt, deleted" in out.out and bad[:12] in out.err and "rows 0-599" in out.err  # one 4 MiB chunk covers the file
    assert store.load(good) is not None and not store.contains(bad)
    assert main(["features", "cache", "--cache-dir", str(store.root), "--verify"]) == 0
    assert "all intact" in capsys.readouterr().out
