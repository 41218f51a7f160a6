"""The one structural hasher behind cache keys (text encoders' fitted state, the photo store's identity)."""

import hashlib

import numpy as np
import torch

from crossview.core.hashing import hash_into


def _key(obj):
    h = hashlib.sha256()
    hash_into(h, obj)
    return h.hexdigest()


def test_keys_follow_content_not_container_order():
    a = {"idf": np.arange(4, dtype=np.float32), "vocab": ["a", "b"], "n": 3}
    b = {"n": 3, "vocab": ["a", "b"], "idf": np.arange(4, dtype=np.float32)}
    assert _key(a) == _key(b)
    assert _key(a) != _key({**a, "n": 4})
    assert _key([1, 2]) != _key([2, 1])                     # lists keep their order
    assert _key(np.zeros(3, np.float32)) != _key(np.zeros(3, np.float64))   # dtype counts
    assert _key(np.zeros((2, 3))) != _key(np.zeros((3, 2)))                 # shape counts
    assert _key(np.int64(5)) == _key(5)                                      # a numpy scalar is its value


def test_a_tensor_hashes_as_its_array_and_odd_values_as_their_repr():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert _key({"w": t}) == _key({"w": t.numpy()})
    assert _key({"p": object}) == _key({"p": object})        # not JSON: its repr, no error


def test_the_text_encoders_cache_keys_did_not_move():
    """The byte stream is pinned: a change here would silently orphan every cached caption feature."""
    expected = hashlib.sha256()
    expected.update(b"{")
    expected.update(b"n:")
    expected.update(b"3")
    expected.update(b"v:")
    expected.update(b"[")
    expected.update(b"nd<f4(2,)")
    expected.update(np.array([0.0, 1.0], dtype="<f4").tobytes())
    expected.update(b",")
    expected.update(b'"a"')
    expected.update(b",")
    expected.update(b"]")
    expected.update(b"}")
    assert _key({"v": [np.array([0.0, 1.0], dtype="<f4"), "a"], "n": 3}) == expected.hexdigest()
