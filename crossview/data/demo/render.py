"""Rendering a demo scene with Pillow: textured background, anti-aliased shapes, a 128x128 JPEG."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw

from crossview.data.demo.spec import COLOURS, IMAGE_SIZE, JPEG_QUALITY, SHAPES, Scene, _SCALE


_GRID: tuple[np.ndarray, np.ndarray] | None = None


def _grid() -> tuple[np.ndarray, np.ndarray]:
    """Integer pixel coordinates at the drawing scale, ``(256, 256) int32`` each."""
    global _GRID
    if _GRID is None:
        n = IMAGE_SIZE * _SCALE
        y, x = np.mgrid[0:n, 0:n].astype(np.int32)
        _GRID = (x, y)
    return _GRID


def _accent(rgb: Sequence[int], amount: int) -> np.ndarray:
    """``rgb`` shifted by ``amount`` grey levels towards the middle (darker on light colours)."""
    lum = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    return np.clip(np.asarray(rgb, dtype=np.float64) + (-amount if lum > 128 else amount), 0, 255)


def render_background(bg: dict) -> np.ndarray:
    """``(256, 256, 3) uint8``: the background at the drawing scale. Texture contrast is kept low
    (about 30 grey levels; 55 across a gradient) so objects stay clearly visible."""
    n = IMAGE_SIZE * _SCALE
    x, y = _grid()
    base = np.asarray(bg["rgb"], dtype=np.float64)
    kind = bg["kind"]
    if kind == "plain":
        return np.broadcast_to(base.astype(np.uint8), (n, n, 3)).copy()
    if kind == "gradient":
        # A lookup table along the gradient's coordinate, indexed per pixel.
        coord = {"horizontal": x, "vertical": y, "diagonal": x + y}[bg["direction"]]
        steps = int(coord.max()) + 1
        t = np.arange(steps, dtype=np.float64)[:, None] / (steps - 1)
        lut = np.rint(base + t * (_accent(bg["rgb"], 55) - base)).astype(np.uint8)
        return lut[coord]
    if kind == "noise":
        # Noise at the output scale, repeated 2x2, so downsampling keeps it as drawn.
        noise = np.random.default_rng(bg["noise_seed"]).standard_normal((IMAGE_SIZE, IMAGE_SIZE))
        sign = -1.0 if 0.299 * base[0] + 0.587 * base[1] + 0.114 * base[2] > 128 else 1.0
        img = np.clip(np.rint(base + (sign * 10 + 12 * noise)[..., None]), 0, 255).astype(np.uint8)
        return img.repeat(_SCALE, axis=0).repeat(_SCALE, axis=1)
    palette = np.rint(np.stack([base, _accent(bg["rgb"], 30)])).astype(np.uint8)
    return palette[_texture_mask(kind, *(bg[k] for k in _TEXTURE_PARAMS[kind]))]


_TEXTURE_PARAMS = {"stripes": ("orientation", "period"), "dots": ("spacing", "dot_radius"),
                   "checkerboard": ("cell",)}


@functools.lru_cache(maxsize=128)
def _texture_mask(kind: str, *params) -> np.ndarray:
    """``(256, 256) uint8`` 0/1: where a two-tone texture takes its accent colour (few distinct
    parameter sets, so they are cached)."""
    n = IMAGE_SIZE * _SCALE
    x, y = _grid()
    if kind == "stripes":
        orientation, period = params
        coord = {"horizontal": y, "vertical": x, "diagonal": x + y, "antidiagonal": x - y + n}[orientation]
        mask = (coord // period) % 2  # half a period per stripe, in 2x pixels
    elif kind == "dots":
        s, r = params[0] * _SCALE, params[1] * _SCALE
        mask = ((x % s) - s // 2) ** 2 + ((y % s) - s // 2) ** 2 <= r * r
    elif kind == "checkerboard":
        c = params[0] * _SCALE
        mask = (x // c + y // c) % 2
    else:
        raise ValueError(f"unknown background kind {kind!r}")
    mask = mask.astype(np.uint8)
    mask.flags.writeable = False
    return mask


def _unit_polygon(shape: str) -> list[tuple[float, float]]:
    """The shape's outline in a [-1, 1] box, centred at 0 (y down)."""
    if shape == "square":
        return [(-0.9, -0.9), (0.9, -0.9), (0.9, 0.9), (-0.9, 0.9)]
    if shape == "triangle":
        return [(0.0, -1.0), (1.0, 0.9), (-1.0, 0.9)]
    if shape == "diamond":
        return [(0.0, -1.0), (0.8, 0.0), (0.0, 1.0), (-0.8, 0.0)]
    if shape == "hexagon":
        return [(math.cos(math.radians(a)), math.sin(math.radians(a))) for a in range(0, 360, 60)]
    if shape == "star":
        return [((1.0 if k % 2 == 0 else 0.45) * math.cos(math.radians(-90 + 36 * k)),
                 (1.0 if k % 2 == 0 else 0.45) * math.sin(math.radians(-90 + 36 * k))) for k in range(10)]
    if shape == "cross":
        w = 0.34
        return [(-w, -1), (w, -1), (w, -w), (1, -w), (1, w), (w, w), (w, 1), (-w, 1), (-w, w), (-1, w),
                (-1, -w), (-w, -w)]
    if shape == "heart":
        ts = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        hx = 16 * np.sin(ts) ** 3
        hy = -(13 * np.cos(ts) - 5 * np.cos(2 * ts) - 2 * np.cos(3 * ts) - np.cos(4 * ts))
        cy = (hy.max() + hy.min()) / 2
        scale = max(hx.max() - hx.min(), hy.max() - hy.min()) / 2
        return [(float(px / scale), float((py - cy) / scale)) for px, py in zip(hx, hy)]
    raise ValueError(f"unknown shape {shape!r}")


_POLYGONS = {s: _unit_polygon(s) for s in SHAPES if s != "circle"}


def render_scene(scene: Scene) -> Image.Image:
    """The scene as a 128x128 RGB image: drawn at 2x with a darker outline, then box-downsampled."""
    img = Image.fromarray(render_background(scene.background), "RGB")
    draw = ImageDraw.Draw(img)
    for o in scene.objects:
        fill = COLOURS[o.colour]
        outline = tuple(int(c * 0.55) for c in fill)
        cx, cy, r = (o.cx + 0.5) * _SCALE, (o.cy + 0.5) * _SCALE, o.radius * _SCALE
        if o.shape == "circle":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill, outline=outline, width=_SCALE)
        else:
            pts = [(cx + r * u, cy + r * v) for u, v in _POLYGONS[o.shape]]
            draw.polygon(pts, fill=fill, outline=outline, width=_SCALE)
    return img.reduce(_SCALE)


def _save_jpeg(img: Image.Image, path: Path) -> None:
    img.save(path, "JPEG", quality=JPEG_QUALITY, subsampling=0)
