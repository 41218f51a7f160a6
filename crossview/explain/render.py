"""Drawing explanations with Pillow (no Qt): a region map over its image, and a heat colour per word.

The map is stretched from its smallest to its largest cell (what stands out is what the eye should find),
smoothed to the crop the backbone saw, and blended over the image: cold cells transparent, the peak
strongly coloured. The same colours shade the caption's words in the app.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError

__all__ = ["heat_colour", "heat_rgba", "overlay", "explain_figure", "word_colours"]

# A perceptually ordered dark-blue -> purple -> orange -> yellow ramp (close to matplotlib's "inferno",
# written out so that nothing needs matplotlib).
_ANCHORS = np.array([[0, 0, 4], [40, 11, 84], [101, 21, 110], [159, 42, 99], [212, 72, 66], [245, 125, 21],
                     [250, 193, 39], [252, 255, 164]], dtype=np.float64)


def heat_colour(t: Any) -> np.ndarray:
    """RGB ``uint8`` of values ``t`` in [0, 1] (any shape; the last axis of the result is RGB)."""
    t = np.clip(np.asarray(t, dtype=np.float64), 0.0, 1.0)
    pos = t * (len(_ANCHORS) - 1)
    lo = np.floor(pos).astype(int).clip(0, len(_ANCHORS) - 2)
    frac = (pos - lo)[..., None]
    return np.round(_ANCHORS[lo] * (1 - frac) + _ANCHORS[lo + 1] * frac).astype(np.uint8)


def _stretch(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    lo, hi = float(v.min()), float(v.max())
    return np.zeros_like(v) if hi - lo <= 1e-12 * max(1.0, abs(hi)) else (v - lo) / (hi - lo)


def heat_rgba(values: np.ndarray, size: tuple[int, int], max_alpha: float = 0.7) -> np.ndarray:
    """``(height, width, 4) uint8``: the map ``values (h, w)`` stretched to [0, 1], smoothed (bilinear) to
    ``size = (width, height)`` and coloured, alpha rising with the value (peak ``max_alpha``)."""
    from PIL import Image

    if values.ndim != 2 or values.size == 0:
        raise CrossViewError(f"a region map must be a non-empty 2-D array, got shape {values.shape}")
    w, h = max(1, int(round(size[0]))), max(1, int(round(size[1])))
    t = Image.fromarray(_stretch(values).astype(np.float32), mode="F").resize((w, h), Image.Resampling.BILINEAR)
    t = np.clip(np.asarray(t, dtype=np.float64), 0.0, 1.0)
    rgba = np.empty((h, w, 4), dtype=np.uint8)
    rgba[..., :3] = heat_colour(t)
    rgba[..., 3] = np.round(255 * max_alpha * t ** 1.6).astype(np.uint8)   # mid values stay light: no haze
    return rgba


def overlay(image: Any, region: Any, max_alpha: float = 0.7) -> Any:
    """The image (a path or a ``PIL.Image``) with ``region`` (a :class:`~crossview.explain.maps.RegionMap`)
    blended over the crop it covers; an RGB ``PIL.Image`` the size of the original."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        from crossview.data.images import image_problem

        try:
            with Image.open(image) as im:
                image = im.convert("RGB")
        except Exception as e:  # noqa: BLE001 - Pillow raises many types (image_problem)
            raise CrossViewError(f"{image}: {image_problem(e)}") from None
    base = image.convert("RGBA")
    left, top, right, bottom = region.crop_box
    heat = Image.fromarray(heat_rgba(region.values, (right - left, bottom - top), max_alpha), mode="RGBA")
    layer = Image.new("RGBA", base.size, (0, 0, 0, 0))
    layer.paste(heat, (int(round(left)), int(round(top))))
    return Image.alpha_composite(base, layer).convert("RGB")


def explain_figure(image: Any, region: Any, min_width: int = 640, title: str = "") -> Any:
    """The overlay as a figure to keep: scaled up to at least ``min_width`` pixels wide (small images, such as
    the demo's 200 x 150, are unreadable otherwise), ``title`` above it (the query, the score), and under it a
    colour bar saying what the colours mean (the map is stretched between its least and most contributing
    regions). An RGB ``PIL.Image``."""
    from PIL import Image, ImageDraw, ImageFont

    im = overlay(image, region)
    if im.width < min_width:
        scale = min_width / im.width
        im = im.resize((min_width, max(1, int(round(im.height * scale)))), Image.Resampling.LANCZOS)
    try:
        font = ImageFont.load_default(size=max(12, im.width // 48))
    except TypeError:               # Pillow < 10.1: one fixed size
        font = ImageFont.load_default()
    line = int(font.getbbox("Ag")[3]) + 6
    top = line + 4 if title else 0
    bar_h, pad = max(12, im.width // 40), 8
    fig = Image.new("RGB", (im.width, top + im.height + pad + bar_h + line + pad), "white")
    draw = ImageDraw.Draw(fig)
    if title:
        draw.text((pad, 3), title, fill=(31, 35, 40), font=font)
    fig.paste(im, (0, top))
    y = top + im.height + pad
    ramp = heat_colour(np.linspace(0.0, 1.0, im.width - 2 * pad))[None].repeat(bar_h, axis=0)
    fig.paste(Image.fromarray(ramp, mode="RGB"), (pad, y))
    y += bar_h + 2
    draw.text((pad, y), "adds least to the score", fill=(87, 96, 106), font=font)
    right = "adds most"
    draw.text((im.width - pad - draw.textlength(right, font=font), y), right, fill=(87, 96, 106), font=font)
    return fig


def word_colours(values: Any) -> list[tuple[int, int, int, float]]:
    """``(r, g, b, strength)`` per word: the heat colour of the word's value stretched over the caption, and
    ``strength`` in [0, 1] (0 for words that lower the score or add nothing)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return []
    top = float(v.max())
    strength = np.clip(v / top, 0.0, 1.0) if top > 0 else np.zeros_like(v)
    rgb = heat_colour(0.35 + 0.65 * strength)
    return [(int(r), int(g), int(b), float(s)) for (r, g, b), s in zip(rgb, strength)]
