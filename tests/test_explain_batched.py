"""Many images explained with one sentence at once (issue 30): held row scales per block of rows, the batched
maps and words equal to the one-at-a-time ones (and to a naive loop worked by hand) on a toy pipeline, the
passes counted, an unreadable file failing only its own pair, and a real run (MobileNet-V2 conv maps, the
default MiniLM sentence encoder) giving the same explanations either way."""

from __future__ import annotations

import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from crossview.core.errors import Cancelled, CrossViewError
from crossview.core.rownorm import first_rows, frozen_row_norms, row_norms
from crossview.explain import Explainer, caption_words
from crossview.explain import maps as M
from crossview.features.normalize import FeatureNorm


# ------------------------------------------------------------------------------------------ held scales per block
def test_row_norms_hold_each_blocks_first_row_with_a_group() -> None:
    n = np.array([[2.0], [3.0], [5.0], [7.0], [11.0]])
    with frozen_row_norms(group=2):
        np.testing.assert_array_equal(row_norms(n), [[2.0], [2.0], [5.0], [5.0], [11.0]])
        t = torch.tensor([[4.0], [1.0], [9.0]])
        assert row_norms(t).tolist() == [[4.0], [4.0], [9.0]]
        with frozen_row_norms():               # nested without a group: the whole batch's first row again
            np.testing.assert_array_equal(row_norms(n), [[2.0]] * 5)
        np.testing.assert_array_equal(first_rows(np.arange(6).reshape(3, 2)), [[0, 1], [0, 1], [4, 5]])
    with frozen_row_norms(group=10):           # a block longer than the batch: one block
        np.testing.assert_array_equal(row_norms(n), [[2.0]] * 5)
    assert row_norms(n) is n
    with pytest.raises(ValueError):
        with frozen_row_norms(group=0):
            pass


def test_the_signed_square_root_is_held_per_block() -> None:
    """ssr + l2 inside a group of 3: each row divided channel-wise by sqrt|its block's first row| and by that
    row's ssr norm (worked by hand)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 4)).astype(np.float32)
    with frozen_row_norms(group=3):
        got = FeatureNorm("ssr").transform(x)
    for b in (0, 3):
        root = np.sqrt(np.abs(x[b]))
        scale = np.linalg.norm(np.sign(x[b]) * root)
        np.testing.assert_allclose(got[b:b + 3], x[b:b + 3] / root / scale, rtol=1e-5)


# ------------------------------------------------------------------------------------------ a toy pipeline
C, D = 6, 5
VOCAB = ["a", "dog", "runs", "on", "the", "grass", "red", "ball"]


class ToyMethod:
    """``l2((x - mean) @ W)`` for images, ``l2(sum of word vectors @ Wt)`` for texts, every L2 through
    :func:`row_norms` (so the held scales apply) unless ``free_text_norm`` (then the words cannot split)."""

    name = "toy"
    wants_image_files = False
    needs_text_features = True

    def __init__(self, free_text_norm: bool = False) -> None:
        rng = np.random.default_rng(1)
        self.W = rng.normal(size=(C, D))
        self.mean = rng.normal(size=C) * 0.1
        self.words = {w: rng.normal(size=D) for w in VOCAB}
        self.free_text_norm = free_text_norm

    def encode_images(self, data, direction: str = "i2t") -> np.ndarray:
        y = (np.asarray(data.image_features, np.float64) - self.mean) @ self.W
        return y / np.maximum(row_norms(np.linalg.norm(y, axis=1, keepdims=True)), 1e-12)

    def text_rows(self, sentences: list[str]) -> np.ndarray:
        y = np.array([sum((self.words.get(w, np.zeros(D)) for w in caption_words(s)), np.zeros(D))
                      for s in sentences])
        n = np.linalg.norm(y, axis=1, keepdims=True)
        return y / np.maximum(n if self.free_text_norm else row_norms(n), 1e-12)


def _toy_map(path: str, side: int) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(path.encode()))
    return (rng.random((side * side, C)) ** 2 + 0.05).astype(np.float32)


def _toy_explainer(tmp_path: Path, n: int = 12, sides=None, bad=(), free_text_norm=False):
    """An Explainer over ``n`` small image files whose conv maps are made up (``sides[i] x sides[i]``, 4x4 by
    default), ssr feature normalisation and :class:`ToyMethod`; ``bad`` images are unreadable."""
    paths = []
    for i in range(n):
        p = tmp_path / f"im{i}.png"
        Image.new("RGB", (40 + i, 30 + 2 * i), (i * 9, 80, 160)).save(p)
        paths.append(str(p))
    sides = sides or [4] * n
    norm = FeatureNorm("ssr")
    pooled = np.stack([_toy_map(p, s).astype(np.float64).mean(axis=0) for p, s in zip(paths, sides)])
    method = ToyMethod(free_text_norm)
    run = SimpleNamespace(
        method=method,
        dataset=SimpleNamespace(name="toy", n_images=n, image_paths=paths, n_captions=0, captions=[]),
        features=SimpleNamespace(spec={}, image_encoder="toy", image=norm.transform(pooled.astype(np.float32)),
                                 image_transform=norm.transform))
    ex = Explainer(run)
    side_of = dict(zip(paths, sides))
    ex.passes = []

    def conv_maps(batch):
        ex.passes.append(list(batch))
        if any(paths.index(p) in bad for p in batch):
            raise CrossViewError(f"{[p for p in batch if paths.index(p) in bad][0]}: cannot read the image")
        return [(_toy_map(p, side_of[p]), 32, 28) for p in batch]

    ex._conv_maps = conv_maps
    ex._image_encoder = lambda: None
    ex._text_embeddings = lambda sentences, direction: method.text_rows(list(sentences))
    return ex, run


def _naive_map(run, path: str, side: int, sentence: str) -> np.ndarray:
    """Each position's score at the whole image's scales, one position at a time (float64, by hand)."""
    m = run.method
    parts = _toy_map(path, side).astype(np.float64)
    pooled = parts.mean(axis=0)
    root = np.sqrt(np.abs(pooled))
    ssr_scale = np.linalg.norm(np.sign(pooled) * root)
    out_scale = np.linalg.norm(((np.sign(pooled) * root / ssr_scale) - m.mean) @ m.W)
    v = m.text_rows([sentence])[0]
    return np.array([((p / root / ssr_scale - m.mean) @ m.W) / out_scale @ v for p in parts]).reshape(side, side)


def _same(a, b, atol=1e-6) -> None:
    assert (a.region is None) == (b.region is None) and a.region_error == b.region_error
    if a.region is not None:
        assert a.region.mode == b.region.mode and a.region.crop_box == b.region.crop_box
        np.testing.assert_allclose(a.region.values, b.region.values, atol=atol)
        assert a.region.score == pytest.approx(b.region.score, abs=atol)
    assert a.words.mode == b.words.mode and a.words.words == b.words.words
    np.testing.assert_allclose(a.words.values, b.words.values, atol=atol)
    assert a.words.score == pytest.approx(b.words.score, abs=atol)


@pytest.mark.parametrize("free_text_norm", [False, True], ids=["exact-words", "deletion-words"])
def test_many_images_at_once_equal_one_at_a_time_and_the_naive_loop(tmp_path: Path, free_text_norm: bool) -> None:
    n, text = 40, "a dog runs on the grass"
    sides = [4] * 20 + [5] * 19 + [23]          # three map sizes; 23 x 23 is too large for one held pass
    ex, run = _toy_explainer(tmp_path, n, sides, free_text_norm=free_text_norm)
    images = list(range(n - 1)) + [run.dataset.image_paths[-1]]       # dataset images and a file
    seen = []
    many = ex.explain_many(images, text, progress=lambda done, total: seen.append((done, total)))
    batched_passes = ex.passes

    one, one_run = _toy_explainer(tmp_path, n, sides, free_text_norm=free_text_norm)
    singles = [one.explain(i if isinstance(i, int) else one_run.dataset.image_paths[-1], text, "t2i")
               for i in images]
    for a, b in zip(many, singles):
        _same(a, b)
    for k, e in enumerate(many):
        assert e.region.mode == "exact" and e.region.values.mean() == pytest.approx(e.region.score, abs=1e-6)
        np.testing.assert_allclose(e.region.values, _naive_map(run, run.dataset.image_paths[k], sides[k], text),
                                   rtol=1e-4, atol=1e-6)
        assert e.words.mode == ("deletion" if free_text_norm else "exact")
    # the conv maps: 8 images to a pass, not one each; progress after each pass, ending at all of them
    assert [len(p) for p in batched_passes] == [8, 8, 8, 8, 8] and len(one.passes) == n
    assert seen[0] == (0, n) and seen[-1] == (n, n) and len(seen) == 6
    # asked again: every pair from the cache, nothing read
    assert all(a is b for a, b in zip(ex.explain_many(images, text), many)) and len(ex.passes) == 5


def test_the_held_passes_carry_many_images(tmp_path: Path, monkeypatch) -> None:
    ex, run = _toy_explainer(tmp_path, 24)
    calls = []
    embed = ex._image_rows_to_embedding
    monkeypatch.setattr(ex, "_image_rows_to_embedding", lambda rows, d: calls.append(len(rows)) or embed(rows, d))
    ex.explain_many(list(range(24)), "a red ball")
    # 24 blocks of 17 rows: 30 fit in one pass of at most 512 rows; one pass for the 24 scores, one for the
    # files' pooled rows is not needed (dataset images score their words against their own feature rows)
    assert calls == [24, 24 * 17]
    calls.clear()
    ex.explain(ex.dataset.image_paths[0], "a red ball", "t2i")
    assert max(calls) <= M._ROWS_PER_PASS


def test_an_unheld_step_gives_the_same_first_order_maps_either_way(tmp_path: Path) -> None:
    text = "a red ball on the grass"
    ex, _ = _toy_explainer(tmp_path, 10)
    one, _ = _toy_explainer(tmp_path, 10)
    for e in (ex, one):
        linear = e._image_rows_to_embedding
        e._image_rows_to_embedding = lambda rows, d, linear=linear: np.tanh(4.0 * linear(rows, d))
    many = ex.explain_many(list(range(10)), text)
    for k, e in enumerate(many):
        assert e.region.mode == "first-order" and e.region.residual > 1e-4
        _same(e, one.explain(k, text, "t2i"))


def test_an_unreadable_file_fails_only_its_own_pair(tmp_path: Path) -> None:
    ex, run = _toy_explainer(tmp_path, 10, bad={3})
    paths = run.dataset.image_paths
    got = ex.explain_many([paths[k] for k in range(10)], "a dog")
    assert isinstance(got[3], CrossViewError) and "im3.png: cannot read" in str(got[3])
    assert all(e.region is not None for k, e in enumerate(got) if k != 3)
    with pytest.raises(CrossViewError, match="im3.png"):           # one at a time it raises the same
        ex.explain(paths[3], "a dog", "t2i")
    # a dataset image whose file cannot be read: its words still come (from its feature row), no map, why
    e = ex.explain_many([3], "a dog")[0]
    assert e.region is None and "im3.png" in e.region_error and e.words.mode == "exact"
    with pytest.raises(CrossViewError, match="give a caption"):
        ex.explain_many([0], "   ")


def test_stopping_between_passes_keeps_what_was_read(tmp_path: Path) -> None:
    ex, _ = _toy_explainer(tmp_path, 20)
    asked = []
    with pytest.raises(Cancelled):
        ex.explain_many(list(range(20)), "a dog", should_stop=lambda: asked.append(1) or len(asked) > 1)
    assert len(ex.passes) == 1 and len(ex._local) == 8
    ex.explain_many(list(range(20)), "a dog")
    assert [len(p) for p in ex.passes] == [8, 8, 4]      # the first 8 were not read again


# ------------------------------------------------------------------------------------------ a real run
@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    """CCA on a 20-scene demo: MobileNet-V2 conv maps, the default sentence encoder (MiniLM)."""
    from crossview.data.demo import write_demo
    from crossview.engine.run import train
    from crossview.engine.session import open_run
    from crossview.features.text import create_text_encoder

    try:
        create_text_encoder("minilm").check_available()
    except CrossViewError as e:
        pytest.skip(str(e))
    root = tmp_path_factory.mktemp("explain-many")
    data = write_demo(root / "demo", n_scenes=20, n_web=0, seed=3)
    for _ in train("cca", str(data), run_dir=root / "run", params={"n_components": 8},
                   image_encoder="mobilenet_v2", text_encoder="minilm", device="cpu"):
        pass
    return open_run(root / "run")


@pytest.mark.slow
def test_a_real_run_gives_the_same_explanations_batched(minilm_run) -> None:
    images = [int(i) for i in minilm_run.retriever().gallery_images[:3]]
    text = "a red circle above a blue square"
    many = Explainer(minilm_run).explain_many(images, text)
    one = Explainer(minilm_run)
    for i, e in zip(images, many):
        assert e.region is not None and e.region.mode == "exact" and e.words.mode == "deletion"
        _same(e, one.explain(i, text, "t2i"), atol=1e-5)
