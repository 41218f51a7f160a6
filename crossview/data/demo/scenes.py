"""Drawing demo scenes: pure functions of ``(seed, stream, index)``, and the train / val / test split."""

from __future__ import annotations

import numpy as np

from crossview.data.demo.captions import make_captions
from crossview.data.demo.spec import (BACKGROUND_COLOURS, BACKGROUND_KINDS, COLOURS, IMAGE_SIZE, LAYOUTS,
                                      LAYOUT_COUNTS, SHAPES, SIZES, Scene, SceneObject, _MARGIN, _STREAM_CAPTIONED,
                                      _separated, classify_layout)


def _rng(seed: int, stream: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, index])


def _propose(rng: np.random.Generator, layout: str, radii: list[int]) -> list[tuple[int, int]]:
    lo = [r + _MARGIN for r in radii]
    hi = [IMAGE_SIZE - _MARGIN - r for r in radii]
    uniform = [(int(rng.integers(l, h + 1)), int(rng.integers(l, h + 1))) for l, h in zip(lo, hi)]
    if layout in ("pair side by side", "three in a row", "pair stacked", "three in a column"):
        base = int(rng.integers(max(lo), min(hi) + 1))
        jitter = [int(rng.integers(-4, 5)) for _ in radii]
        if layout in ("pair side by side", "three in a row"):
            return [(x, min(max(base + j, l), h)) for (x, _), j, l, h in zip(uniform, jitter, lo, hi)]
        return [(min(max(base + j, l), h), y) for (_, y), j, l, h in zip(uniform, jitter, lo, hi)]
    return uniform


def _sample_objects(rng: np.random.Generator, layout: str) -> list[SceneObject]:
    n = LAYOUT_COUNTS[layout]
    size_names = list(SIZES)
    for attempt in range(4000):
        if attempt % 40 == 0:
            # Crowded layouts that keep failing get smaller objects.
            pool = size_names if attempt < 400 else size_names[:2] if attempt < 1200 else size_names[:1]
            sizes = [pool[int(rng.integers(len(pool)))] for _ in range(n)]
            radii = [int(rng.integers(SIZES[s][0], SIZES[s][1] + 1)) for s in sizes]
        centres = _propose(rng, layout, radii)
        objs = [SceneObject("", "", s, r, x, y) for s, r, (x, y) in zip(sizes, radii, centres)]
        if not _separated(objs):
            continue
        got, clear = classify_layout(objs)
        if got == layout and clear:
            break
    else:  # pragma: no cover - the sampler always succeeds with small objects
        raise RuntimeError(f"could not place a {layout!r} scene")
    seen: set[tuple[str, str]] = set()
    for o in objs:
        while True:
            shape = SHAPES[int(rng.integers(len(SHAPES)))]
            colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
            if (shape, colour) not in seen:
                break
        seen.add((shape, colour))
        o.shape, o.colour = shape, colour
    return objs


def _sample_background(rng: np.random.Generator) -> dict:
    kind = BACKGROUND_KINDS[int(rng.integers(len(BACKGROUND_KINDS)))]
    colour = list(BACKGROUND_COLOURS)[int(rng.integers(len(BACKGROUND_COLOURS)))]
    bg: dict = {"kind": kind, "colour": colour, "rgb": list(BACKGROUND_COLOURS[colour])}
    if kind == "stripes":
        bg["orientation"] = ("horizontal", "vertical", "diagonal", "antidiagonal")[int(rng.integers(4))]
        bg["period"] = int(rng.integers(6, 13))
    elif kind == "dots":
        bg["spacing"] = int(rng.integers(8, 13))
        bg["dot_radius"] = float(rng.choice([1.5, 2.0, 2.5]))
    elif kind == "checkerboard":
        bg["cell"] = int(rng.integers(8, 17))
    elif kind == "gradient":
        bg["direction"] = ("horizontal", "vertical", "diagonal")[int(rng.integers(3))]
    elif kind == "noise":
        bg["noise_seed"] = int(rng.integers(2**31))
    return bg


def make_scene(seed: int, index: int, stream: int = _STREAM_CAPTIONED, captions: bool = True) -> Scene:
    """Scene ``index`` of a seed's stream (0: captioned set, 1: web set); a pure function of them."""
    rng = _rng(seed, stream, index)
    layout = LAYOUTS[int(rng.integers(len(LAYOUTS)))]
    objects = _sample_objects(rng, layout)
    scene = Scene(index=index, objects=objects, background=_sample_background(rng),
                  label=classify_layout(objects)[0])
    if captions:
        scene.captions = make_captions(scene, _rng(seed, stream + 100, index))
    return scene


def make_scenes(n: int, seed: int = 0) -> list[Scene]:
    """The first ``n`` scenes of the captioned set (no rendering)."""
    return [make_scene(seed, i) for i in range(n)]


def split_sizes(n: int) -> dict[str, int]:
    """Train / val / test sizes: 1/12 each for val and test (200 of 2,400), the rest train."""
    n_eval = max(1, round(n / 12)) if n >= 3 else 0
    return {"train": n - 2 * n_eval, "val": n_eval, "test": n_eval}


def split_of(index: int, n: int) -> str:
    s = split_sizes(n)
    if index < s["train"]:
        return "train"
    return "val" if index < s["train"] + s["val"] else "test"
