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
