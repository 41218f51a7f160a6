"""The built-in demo: a deterministic synthetic image-caption dataset rendered with Pillow.

Each scene holds 1-3 non-overlapping objects on a textured background. An object has a shape
(:data:`SHAPES`), a colour (:data:`COLOURS`), a size word (``small`` / ``medium`` / ``large``) and a
place in the 128x128 frame. Everything else is derived from that geometry:

- relations between objects (``left of``, ``right of``, ``above``, ``below``, ``next to``), from the
  objects' bounding boxes (:func:`relations_between`);
- a layout class per scene (:data:`LAYOUTS`, :func:`classify_layout`), stored as the image's ``label``;
- 5 pairwise distinct captions from a varied grammar (synonyms, word orders, optional size, frame
  position and background, counting), every statement of which is true of the scene;
- tags: shape, colour and size words of the objects, the background kind and colour.

A separate "web" set (another seed stream) pairs images with *noisy* tags: each true tag is dropped
with probability ``web_drop`` (default :data:`WEB_DROP_RATE` = 0.20) and ``Binomial(n_true, web_add)``
wrong tags (default :data:`WEB_ADD_RATE` = 0.15, i.e. about 15% of the true tag count) are added from the
tag vocabulary. An item left with no tag at all gets one true tag back (rare: under 0.1% of items).

On disk (:func:`write_demo`)::

    dataset_demo.json        Karpathy split JSON with per-image "label", "tags" and "labels"
    images/demo_00000.jpg    128x128 RGB JPEG (quality 90, 4:4:4), drawn at 2x and downsampled
    scenes.json              the full scene specification of every image (objects, relations, ...)
    web/tags.jsonl           {"image": "images/web_00000.jpg", "tags": [...]} (noisy tags)
    web/images/web_00000.jpg
    web/scenes.json          the web scenes with their true and noisy tags
    .complete                written last: the build parameters

Scenes are pure functions of ``(seed, stream, index)`` and images pure functions of their scene, so
the same seed gives byte-identical files. The folder is built in a temporary sibling and renamed into
place, so an interrupted or concurrent build never leaves a half-written cache.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from PIL import Image, ImageDraw

from crossview.data.dataset import PairedDataset
from crossview.core.errors import DatasetError
from crossview.core.settings import get_settings

#: Bump when scenes, captions or rendering change: the cache folder is keyed on it.
DEMO_VERSION = 1
DEFAULT_N_SCENES = 2400
DEFAULT_N_WEB = 800
IMAGE_SIZE = 128
#: Drawn at this multiple of the image size, then downsampled (anti-aliasing).
_SCALE = 2
JPEG_QUALITY = 90
MARKER = ".complete"

#: Web tag noise: probability that a true tag is dropped, and expected wrong tags per true tag.
WEB_DROP_RATE = 0.20
WEB_ADD_RATE = 0.15

SHAPES = ("circle", "square", "triangle", "star", "cross", "diamond", "hexagon", "heart")

#: Saturated object colours, far from each other and from every background colour.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "orange": (245, 135, 20),
    "yellow": (245, 215, 30),
    "green": (40, 160, 60),
    "cyan": (30, 195, 215),
    "blue": (35, 75, 215),
    "purple": (135, 55, 185),
    "pink": (240, 120, 190),
}

#: Low-saturation background colours, so that objects stay clearly visible on every texture.
BACKGROUND_COLOURS: dict[str, tuple[int, int, int]] = {
    "white": (245, 245, 242),
    "light gray": (200, 200, 200),
    "beige": (232, 222, 196),
    "dark gray": (62, 62, 62),
    "black": (18, 18, 18),
}

BACKGROUND_KINDS = ("plain", "stripes", "dots", "checkerboard", "gradient", "noise")

#: Half-extent (pixels at 128x128) of each size class; the ranges leave gaps so sizes stay distinct.
SIZES: dict[str, tuple[int, int]] = {"small": (7, 10), "medium": (12, 16), "large": (19, 24)}

#: Layout classes, derived from the geometry by :func:`classify_layout`.
LAYOUTS = ("one object", "pair side by side", "pair stacked", "pair diagonal",
           "three in a row", "three in a column", "three scattered")
LAYOUT_COUNTS = {"one object": 1, "pair side by side": 2, "pair stacked": 2, "pair diagonal": 2,
                 "three in a row": 3, "three in a column": 3, "three scattered": 3}

RELATIONS = ("left of", "right of", "above", "below", "next to")

#: Every tag a scene can have (the web set's wrong tags are drawn from it).
TAG_VOCABULARY = (*SHAPES, *COLOURS, *SIZES, *BACKGROUND_KINDS, *BACKGROUND_COLOURS)

_MARGIN = 2          # objects keep this far from the frame edge
_GAP = 4             # boxes of two objects are this far apart along at least one axis
_NEXT_TO_GAP = 24    # "next to": horizontal gap at most this
_STREAM_CAPTIONED = 0
_STREAM_WEB = 1


# ====================================================================== scene specification
@dataclass
class SceneObject:
    """One object. Geometry in pixels of the 128x128 image; y grows downwards."""

    shape: str
    colour: str
    size: str
    radius: int
    cx: int
    cy: int

    @property
    def bbox(self) -> tuple[int, int, int, int]:
        """``(x0, y0, x1, y1)`` of the square the shape is drawn in."""
        r = self.radius
        return self.cx - r, self.cy - r, self.cx + r, self.cy + r

    def to_json(self) -> dict:
        return {"shape": self.shape, "colour": self.colour, "rgb": list(COLOURS[self.colour]),
                "size": self.size, "radius": self.radius, "centre": [self.cx, self.cy],
                "bbox": list(self.bbox), "frame": _frame_region(self)}


@dataclass
class Scene:
    """A scene: objects, background, derived layout label, relations, tags and (for the captioned
    set) captions."""

    index: int
    objects: list[SceneObject]
    background: dict
    label: str
    captions: list[str] = field(default_factory=list)

    @property
    def tags(self) -> list[str]:
        out: list[str] = []
        for o in self.objects:
            for t in (o.shape, o.colour, o.size):
                if t not in out:
                    out.append(t)
        for t in (self.background["kind"], self.background["colour"]):
            if t not in out:
                out.append(t)
        return out

    @property
    def phrases(self) -> list[str]:
        """The label set of the image: ``"red circle"``-style phrases, one per object."""
        return [f"{o.colour} {o.shape}" for o in self.objects]

    def relations(self) -> list[dict]:
        out = []
        for i, a in enumerate(self.objects):
            for j, b in enumerate(self.objects):
                if i != j:
                    for rel in relations_between(a, b):
                        out.append({"subject": i, "relation": rel, "object": j})
        return out

    def to_json(self) -> dict:
        return {"objects": [o.to_json() for o in self.objects], "relations": self.relations(),
                "background": self.background, "label": self.label, "tags": self.tags}


def relations_between(a: SceneObject, b: SceneObject) -> list[str]:
    """The relations ``a <rel> b`` that hold, from the bounding boxes.

    ``left of``: a's box lies entirely left of b's (likewise right, above, below). ``next to``: the
    boxes are side by side (vertical overlap of at least half the smaller box) with a gap of at most
    24 px.
    """
    ax0, ay0, ax1, ay1 = a.bbox
    bx0, by0, bx1, by1 = b.bbox
    out = []
    if ax1 <= bx0:
        out.append("left of")
    if bx1 <= ax0:
        out.append("right of")
    if ay1 <= by0:
        out.append("above")
    if by1 <= ay0:
        out.append("below")
    x_gap = max(bx0 - ax1, ax0 - bx1)
    y_overlap = min(ay1, by1) - max(ay0, by0)
    if 0 <= x_gap <= _NEXT_TO_GAP and y_overlap >= min(a.radius, b.radius):
        out.append("next to")
    return out


def classify_layout(objects: Sequence[SceneObject]) -> tuple[str, bool]:
    """The layout class of a scene and whether it is clear-cut (far from the class boundaries).

    Pairs: the angle of the line between the centres (``side by side`` when the vertical offset is
    at most 0.4 of the horizontal one, ``stacked`` the other way round, else ``diagonal``). Triples:
    the spread of the centres (``in a row`` when the vertical spread is at most 0.3 of the horizontal
    one, ``in a column`` the other way round, else ``scattered``).
    """
    n = len(objects)
    if n == 1:
        return "one object", True
    if n == 2:
        a, b = objects
        adx, ady = abs(a.cx - b.cx), abs(a.cy - b.cy)
        xsep, ysep = _x_gap(a, b) >= _GAP, _y_gap(a, b) >= _GAP
        if ady <= 0.4 * adx:
            return "pair side by side", ady <= 0.25 * adx and xsep
        if adx <= 0.4 * ady:
            return "pair stacked", adx <= 0.25 * ady and ysep
        return "pair diagonal", 0.6 * adx <= ady <= adx / 0.6 and xsep and ysep
    if n == 3:
        xs = [o.cx for o in objects]
        ys = [o.cy for o in objects]
        sx, sy = max(xs) - min(xs), max(ys) - min(ys)
        if sy <= 0.3 * sx:
            by_x = sorted(objects, key=lambda o: o.cx)
            return "three in a row", sy <= 0.2 * sx and all(
                _x_gap(p, q) >= _GAP for p, q in zip(by_x, by_x[1:]))
        if sx <= 0.3 * sy:
            by_y = sorted(objects, key=lambda o: o.cy)
            return "three in a column", sx <= 0.2 * sy and all(
                _y_gap(p, q) >= _GAP for p, q in zip(by_y, by_y[1:]))
        return "three scattered", sy >= 0.45 * sx and sx >= 0.45 * sy
    raise ValueError(f"a demo scene has 1-3 objects, got {n}")


def _x_gap(a: SceneObject, b: SceneObject) -> int:
    return max(b.cx - b.radius - (a.cx + a.radius), a.cx - a.radius - (b.cx + b.radius))


def _y_gap(a: SceneObject, b: SceneObject) -> int:
    return max(b.cy - b.radius - (a.cy + a.radius), a.cy - a.radius - (b.cy + b.radius))


def _separated(objects: Sequence[SceneObject]) -> bool:
    return all(max(_x_gap(a, b), _y_gap(a, b)) >= _GAP
               for i, a in enumerate(objects) for b in objects[i + 1:])


def _region(v: int) -> str | None:
    """Which third of the frame a coordinate is clearly in (None near a boundary)."""
    third = IMAGE_SIZE / 3
    if v <= third - 6:
        return "low"
    if third + 5 <= v <= 2 * third - 5:
        return "mid"
    if v >= 2 * third + 6:
        return "high"
    return None


def _frame_region(o: SceneObject) -> dict:
    row = {"low": "top", "mid": "middle", "high": "bottom"}.get(_region(o.cy) or "")
    col = {"low": "left", "mid": "centre", "high": "right"}.get(_region(o.cx) or "")
    return {"row": row, "col": col}


# ====================================================================== scene sampling
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


@dataclass
class WebItem:
    """A web image: its scene, the true tags and the noisy tags the collection shows."""

    scene: Scene
    true_tags: list[str]
    tags: list[str]
    dropped: list[str]
    added: list[str]

    def to_json(self) -> dict:
        return {**self.scene.to_json(), "true_tags": self.true_tags, "noisy_tags": self.tags,
                "dropped": self.dropped, "added": self.added}


def make_web_item(seed: int, index: int, web_drop: float = WEB_DROP_RATE,
                  web_add: float = WEB_ADD_RATE) -> WebItem:
    """Web item ``index``: a scene of the web stream with noisy tags (see the module docstring)."""
    scene = make_scene(seed, index, stream=_STREAM_WEB, captions=False)
    rng = _rng(seed, _STREAM_WEB + 100, index)
    true = scene.tags
    drop_mask = rng.random(len(true)) < web_drop
    kept = [t for t, d in zip(true, drop_mask) if not d]
    dropped = [t for t, d in zip(true, drop_mask) if d]
    wrong_pool = [t for t in TAG_VOCABULARY if t not in true]
    n_add = min(int(rng.binomial(len(true), web_add)), len(wrong_pool))
    added = [wrong_pool[k] for k in sorted(rng.choice(len(wrong_pool), size=n_add, replace=False))]
    tags = kept + added
    if not tags:  # a web image always shows at least one tag
        back = dropped.pop(int(rng.integers(len(dropped))))
        tags = [back]
    order = rng.permutation(len(tags))
    return WebItem(scene, true, [tags[k] for k in order], dropped, added)


def make_web_items(n: int, seed: int = 0, web_drop: float = WEB_DROP_RATE,
                   web_add: float = WEB_ADD_RATE) -> list[WebItem]:
    """The first ``n`` web items (no rendering)."""
    return [make_web_item(seed, i, web_drop, web_add) for i in range(n)]


# ====================================================================== captions
_SHAPE_WORDS = {
    "circle": ("circle", "circle", "disc", "round shape"),
    "square": ("square", "square", "box", "block"),
    "triangle": ("triangle", "triangle", "triangular shape"),
    "star": ("star", "star", "five-pointed star"),
    "cross": ("cross", "cross", "plus sign"),
    "diamond": ("diamond", "diamond", "rhombus"),
    "hexagon": ("hexagon", "hexagon", "six-sided shape"),
    "heart": ("heart", "heart", "heart shape"),
}
_SIZE_WORDS = {"small": ("small", "little", "tiny"), "medium": ("medium-sized", "mid-sized"),
               "large": ("large", "big", "huge")}
_LEFT = ("to the left of", "to the left of", "left of")
_RIGHT = ("to the right of", "to the right of", "right of")
_ABOVE = ("above", "above", "on top of", "over")
_BELOW = ("below", "below", "under", "beneath", "underneath")
_NEXT = ("next to", "beside")
_VERBS = ("is", "is", "sits", "lies", "is placed", "appears", "can be seen")
_KIND_ADJ = {"plain": ("plain", "solid", "uniform"), "stripes": ("striped",),
             "dots": ("dotted", "polka-dot", "spotted"), "checkerboard": ("checkered", "checkerboard", "chequered"),
             "gradient": ("gradient", "shaded"), "noise": ("noisy", "grainy", "speckled")}
_KIND_WITH = {"stripes": "with stripes", "dots": "with dots", "checkerboard": "with a checkerboard pattern",
              "gradient": "with a gradient", "noise": "with a grainy texture"}
_SHAPES_NOUN = ("shapes", "objects", "figures")
_IMAGE_OF = ("An image of", "A picture of", "A drawing of", "An image showing", "A picture showing")


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" and not word.startswith(("uni", "one")) else "a"


class _Captioner:
    """Builds one caption at a time for a scene; every statement it makes is checked against the
    geometry (relations from :func:`relations_between`, frame positions from :func:`_frame_region`)."""

    def __init__(self, scene: Scene, rng: np.random.Generator) -> None:
        self.s = scene
        self.rng = rng
        objs = scene.objects
        self.unique_shape = {o.shape for o in objs if sum(p.shape == o.shape for p in objs) == 1}
        self.unique_colour = {o.colour for o in objs if sum(p.colour == o.colour for p in objs) == 1}

    def p(self, prob: float) -> bool:
        return bool(self.rng.random() < prob)

    def np(self, o: SceneObject, article: str = "a", size_p: float = 0.35) -> str:
        """A noun phrase naming ``o`` unambiguously: [size] colour shape (colour or shape sometimes
        left out when the other one alone identifies the object)."""
        words = []
        if self.p(size_p):
            words.append(_pick(self.rng, _SIZE_WORDS[o.size]))
        r = self.rng.random()
        if o.shape in self.unique_shape and r < 0.1:
            words.append(_pick(self.rng, _SHAPE_WORDS[o.shape]))
        elif o.colour in self.unique_colour and r > 0.93:
            words += [o.colour, _pick(self.rng, ("shape", "object"))]
        else:
            words += [o.colour, _pick(self.rng, _SHAPE_WORDS[o.shape])]
        phrase = " ".join(words)
        if article == "a":
            return f"{_article(phrase)} {phrase}"
        return f"{article} {phrase}" if article else phrase

    def frame(self, o: SceneObject) -> str | None:
        """A true phrase for where ``o`` is in the frame, or None when it is near a boundary."""
        f = _frame_region(o)
        row, col = f["row"], f["col"]
        opts: list[str] = []
        if row in ("top", "bottom") and col in ("left", "right"):
            alt = {"top": "upper", "bottom": "lower"}[row]
            opts = [f"in the {row} {col} corner", f"in the {alt} {col} corner", f"at the {row} {col}"]
        elif row in ("top", "bottom") and col in ("centre", None):
            opts = [f"at the {row}", f"near the {row}"]
        elif col in ("left", "right") and row in ("middle", None):
            opts = [f"on the {col}", f"on the {col} side"]
        elif row == "middle" and col == "centre":
            opts = ["in the centre", "in the center", "in the middle"]
        return _pick(self.rng, opts) if opts else None

    def bg(self) -> str:
        b = self.s.background
        kind, colour = b["kind"], b["colour"]
        prep = _pick(self.rng, ("on", "on", "against"))
        adj = _pick(self.rng, _KIND_ADJ[kind])
        form = int(self.rng.integers(4))
        if form == 0:
            desc = f"{adj} {colour} background"
        elif form == 1 and kind in _KIND_WITH:
            desc = f"{colour} background {_KIND_WITH[kind]}"
        elif form == 2:
            desc = f"{adj} background"
        else:
            desc = f"{colour} background"
        return f"{prep} {_article(desc)} {desc}"

    def maybe_bg(self, prob: float = 0.3) -> str:
        return " " + self.bg() if self.p(prob) else ""

    def rel(self, a: SceneObject, b: SceneObject, combined: bool = True) -> str:
        """A true relation phrase for ``a <rel> b``: the dominant axis, both axes for clear diagonals,
        sometimes ``next to``."""
        holds = relations_between(a, b)
        h = [r for r in holds if r in ("left of", "right of")]
        v = [r for r in holds if r in ("above", "below")]
        dx, dy = abs(a.cx - b.cx), abs(a.cy - b.cy)
        axes: list[str] = []
        if h and v:
            if 0.5 * dx <= dy <= 2 * dx:
                axes = ["h", "v", "hv"] if combined else ["h", "v"]
            else:
                axes = ["h"] if dx > dy else ["v"]
        elif h:
            axes = ["h"]
        elif v:
            axes = ["v"]
        if "next to" in holds and dy <= 0.4 * dx:
            axes.append("n")
        choice = _pick(self.rng, axes)
        words = {"left of": _LEFT, "right of": _RIGHT, "above": _ABOVE, "below": _BELOW}
        if choice == "h":
            return _pick(self.rng, words[h[0]])
        if choice == "v":
            return _pick(self.rng, words[v[0]])
        if choice == "n":
            return _pick(self.rng, _NEXT)
        vword = "above" if v[0] == "above" else "below"
        return f"{vword} and {_pick(self.rng, words[h[0]])}"

    def with_frame(self, o: SceneObject, article: str = "a", prob: float = 0.5) -> str:
        f = self.frame(o) if self.p(prob) else None
        return self.np(o, article) + (f" {f}" if f else "")

    # ------------------------------------------------------------------ templates
    def one(self) -> str:
        (o,) = self.s.objects
        f = self.frame(o)
        t = int(self.rng.integers(8))
        if t == 0:
            return f"{self.with_frame(o)}{self.maybe_bg(0.5)}"
        if t == 1:
            return f"There is {self.with_frame(o)}{self.maybe_bg(0.5)}"
        if t == 2:
            lone = _pick(self.rng, ("A single", "A lone"))
            return f"{lone} {self.np(o, '')}{' ' + f if f and self.p(0.5) else ''}{self.maybe_bg(0.5)}"
        if t == 3:
            only = _pick(self.rng, ("Only one shape", "Just one object", "A single shape"))
            return f"{only}{self.maybe_bg(0.4)}: {self.with_frame(o)}"
        if t == 4 and f:
            return f"{f}, {self.np(o)}{self.maybe_bg(0.5)}"
        if t == 5:
            return f"{_pick(self.rng, _IMAGE_OF)} {self.with_frame(o)}{self.maybe_bg(0.5)}"
        if t == 6 and f:
            return f"{self.np(o)} {_pick(self.rng, _VERBS)} {f}{self.maybe_bg(0.4)}"
        desc = self.bg().split(" ", 1)[1]  # "a striped white background"
        return f"{desc} with {self.with_frame(o, prob=0.7)}"

    def two(self) -> str:
        a, b = self.s.objects
        if self.p(0.5):
            a, b = b, a
        t = int(self.rng.integers(10))
        if t == 0:
            return f"{self.np(a)} {self.rel(a, b)} {self.np(b)}{self.maybe_bg()}"
        if t == 1:
            return f"{self.np(a)} {_pick(self.rng, _VERBS)} {self.rel(a, b)} {self.np(b)}{self.maybe_bg()}"
        if t == 2:
            return f"There is {self.np(a)} {self.rel(a, b)} {self.np(b)}{self.maybe_bg()}"
        if t == 3:
            rel = self.rel(a, b)
            be = _pick(self.rng, ("is", "sits", "there is", "lies"))
            return f"{rel} {self.np(b, _pick(self.rng, ('a', 'the')))} {be} {self.np(a)}"
        if t == 4:
            n = _pick(self.rng, ("Two " + _pick(self.rng, _SHAPES_NOUN), "A pair of shapes"))
            return f"{n}{self.maybe_bg(0.4)}: {self.with_frame(a, prob=0.3)} and {self.with_frame(b, prob=0.3)}"
        if t == 5:
            n = "Two " + _pick(self.rng, _SHAPES_NOUN)
            return f"{n}: {self.np(a)} {self.rel(a, b)} {self.np(b)}"
        if t == 6:
            fa, fb = self.frame(a), self.frame(b)
            if fa and fb:
                return f"{self.np(a)} {fa} and {self.np(b)} {fb}{self.maybe_bg()}"
        if t == 7:
            lay = {"pair side by side": ("side by side", "placed side by side"),
                   "pair stacked": ("stacked vertically", "in a vertical line"),
                   "pair diagonal": ("placed diagonally", "arranged diagonally")}[self.s.label]
            if self.p(0.5) and self.s.label != "pair diagonal":
                key = (lambda o: o.cx) if self.s.label == "pair side by side" else (lambda o: o.cy)
                first, second = sorted(self.s.objects, key=key)
                order = "from left to right" if self.s.label == "pair side by side" else "from top to bottom"
                return (f"Two {_pick(self.rng, _SHAPES_NOUN)} {lay[0]}{self.maybe_bg()}, {order}: "
                        f"{self.np(first)} and {self.np(second)}")
            return f"{self.np(a)} and {self.np(b)} {_pick(self.rng, lay)}{self.maybe_bg()}"
        if t == 8:
            return f"{_pick(self.rng, _IMAGE_OF)} {self.np(a)} {self.rel(a, b)} {self.np(b)}{self.maybe_bg()}"
        return f"{self.np(a)} {self.rel(a, b)} {self.np(b)}, {self.bg()}"

    def three(self) -> str:
        objs = list(self.s.objects)
        perm = self.rng.permutation(3)
        a, b, c = (objs[k] for k in perm)
        t = int(self.rng.integers(8))
        if t == 0:
            return (f"{self.np(a)} {self.rel(a, b)} {self.np(b)}, which {_pick(self.rng, _VERBS)} "
                    f"{self.rel(b, c)} {self.np(c)}{self.maybe_bg(0.2)}")
        if t == 1:
            fc = self.frame(c)
            tail = f", and {self.np(c)} {fc}" if fc else f"; there is also {self.np(c)}"
            return f"{self.np(a)} {self.rel(a, b)} {self.np(b)}{tail}"
        if t == 2:
            n = "Three " + _pick(self.rng, _SHAPES_NOUN)
            return f"{n}{self.maybe_bg(0.4)}: {self.np(a)}, {self.np(b)} and {self.np(c)}"
        if t == 3:
            d = (a, b)[int(self.rng.integers(2))]
            return (f"{self.np(a)} {self.rel(a, b)} {self.np(b)}, and {self.np(c)} "
                    f"{self.rel(c, d)} {self.np(d, 'the')}")
        if t == 4 and self.s.label in ("three in a row", "three in a column"):
            row = self.s.label == "three in a row"
            first, second, third = sorted(objs, key=(lambda o: o.cx) if row else (lambda o: o.cy))
            lay = _pick(self.rng, ("in a row", "in a horizontal line") if row else
                        ("in a column", "in a vertical line", "stacked vertically"))
            order = "from left to right" if row else "from top to bottom"
            if self.p(0.6):
                return (f"Three {_pick(self.rng, _SHAPES_NOUN)} {lay}{self.maybe_bg()}, {order}: "
                        f"{self.np(first)}, {self.np(second)} and {self.np(third)}")
            return f"{self.np(a)}, {self.np(b)} and {self.np(c)} {lay}{self.maybe_bg()}"
        if t == 4 and self.s.label == "three scattered":
            how = _pick(self.rng, ("scattered", "spread out", "scattered around"))
            return f"{self.np(a)}, {self.np(b)} and {self.np(c)} {how}{self.maybe_bg()}"
        if t == 5:
            return (f"There are three {_pick(self.rng, _SHAPES_NOUN)}: {self.with_frame(a)}, "
                    f"{self.with_frame(b)} and {self.with_frame(c)}")
        if t == 6:
            return f"{_pick(self.rng, _IMAGE_OF)} {self.np(a)}, {self.np(b)} and {self.np(c)}{self.maybe_bg(0.5)}"
        return f"There is {self.np(a)} {self.rel(a, b)} {self.np(b)}; {self.with_frame(c, prob=0.6)} is also there"


def make_captions(scene: Scene, rng: np.random.Generator, n: int = 5) -> list[str]:
    """``n`` pairwise distinct true captions of ``scene``."""
    cap = _Captioner(scene, rng)
    make = {1: cap.one, 2: cap.two, 3: cap.three}[len(scene.objects)]
    out: list[str] = []
    for _ in range(200):
        s = make()
        s = s[0].upper() + s[1:] + "."
        if s not in out:
            out.append(s)
            if len(out) == n:
                return out
    raise RuntimeError(f"could not make {n} distinct captions for scene {scene.index}")  # pragma: no cover


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens (hyphenated words kept whole), as in the Karpathy files."""
    return re.findall(r"[a-z0-9]+(?:[-'][a-z0-9]+)*", text.lower())


# ====================================================================== rendering
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


# ====================================================================== writing
def _dump_json(obj: object, path: Path) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")


def _marker(seed: int, n_scenes: int, n_web: int, web_drop: float, web_add: float) -> dict:
    return {"version": DEMO_VERSION, "seed": seed, "n_scenes": n_scenes, "n_web": n_web,
            "web_drop": web_drop, "web_add": web_add}


def _read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _build(tmp: Path, n_scenes: int, n_web: int, seed: int, web_drop: float, web_add: float,
           progress: Callable[[int, int], None] | None) -> None:
    total = n_scenes + n_web
    (tmp / "images").mkdir()
    entries, specs = [], []
    sentid = 0
    for i in range(n_scenes):
        scene = make_scene(seed, i)
        name = f"demo_{i:05d}.jpg"
        _save_jpeg(render_scene(scene), tmp / "images" / name)
        split = split_of(i, n_scenes)
        sentences = []
        for cap in scene.captions:
            sentences.append({"raw": cap, "tokens": tokenize(cap), "sentid": sentid, "imgid": i})
            sentid += 1
        entries.append({"filename": name, "imgid": i, "split": split,
                        "sentids": [s["sentid"] for s in sentences], "sentences": sentences,
                        "label": scene.label, "tags": scene.tags, "labels": scene.phrases})
        specs.append({"image": f"images/{name}", "imgid": i, "split": split, **scene.to_json(),
                      "captions": scene.captions})
        if progress is not None:
            progress(i + 1, total)
    _dump_json({"dataset": "demo", "images": entries}, tmp / "dataset_demo.json")
    _dump_json({"version": DEMO_VERSION, "seed": seed, "image_size": IMAGE_SIZE, "layouts": list(LAYOUTS),
                "scenes": specs}, tmp / "scenes.json")

    web = tmp / "web"
    (web / "images").mkdir(parents=True)
    lines, web_specs = [], []
    for i in range(n_web):
        item = make_web_item(seed, i, web_drop, web_add)
        rel = f"images/web_{i:05d}.jpg"
        _save_jpeg(render_scene(item.scene), web / rel)
        lines.append(json.dumps({"image": rel, "tags": item.tags}, ensure_ascii=False))
        web_specs.append({"image": rel, **item.to_json()})
        if progress is not None:
            progress(n_scenes + i + 1, total)
    (web / "tags.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    _dump_json({"version": DEMO_VERSION, "seed": seed, "web_drop": web_drop, "web_add": web_add,
                "scenes": web_specs}, web / "scenes.json")
    _dump_json(_marker(seed, n_scenes, n_web, web_drop, web_add), tmp / MARKER)


def _publish(tmp: Path, out_dir: Path, marker: dict, replace_unmarked: bool) -> None:
    """Renames the finished ``tmp`` to ``out_dir``. When ``out_dir`` already holds the same build
    (another process won the race), ours is discarded."""
    try:
        os.rename(tmp, out_dir)
        return
    except OSError:
        if not out_dir.exists():
            raise
    existing = _read_marker(out_dir)
    if existing == marker:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    if existing is None and not replace_unmarked:
        raise DatasetError("the folder exists and is not a CrossView demo folder", out_dir,
                           hint="Remove it or choose another output folder")
    # An older build with other parameters (or a stale folder in our cache): move it aside.
    trash = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(out_dir, trash)
    except FileNotFoundError:
        pass
    try:
        os.rename(tmp, out_dir)
    except OSError:
        if _read_marker(out_dir) != marker:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(trash, ignore_errors=True)


def write_demo(out_dir: str | Path, n_scenes: int = DEFAULT_N_SCENES, n_web: int = DEFAULT_N_WEB,
               seed: int = 0, progress: Callable[[int, int], None] | None = None, *,
               web_drop: float = WEB_DROP_RATE, web_add: float = WEB_ADD_RATE) -> Path:
    """Renders the demo into ``out_dir`` (see the module docstring for the layout) and returns it.

    Built in a temporary sibling folder and renamed into place; if ``out_dir`` already holds the same
    build when ours is done, ours is discarded. ``progress(done, total)`` is called after each image
    (``total = n_scenes + n_web``). Raises ``ValueError`` on bad sizes or rates.
    """
    if n_scenes < 1 or n_web < 0:
        raise ValueError(f"n_scenes must be >= 1 and n_web >= 0, got {n_scenes} and {n_web}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if not (0 <= web_drop < 1 and 0 <= web_add <= 1):
        raise ValueError(f"web_drop must be in [0, 1) and web_add in [0, 1], got {web_drop}, {web_add}")
    return _write(Path(out_dir).expanduser(), n_scenes, n_web, seed, progress, web_drop, web_add,
                  replace_unmarked=False)


def _write(out_dir: Path, n_scenes: int, n_web: int, seed: int, progress, web_drop: float,
           web_add: float, replace_unmarked: bool) -> Path:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        os.chmod(tmp, 0o755)
        _build(tmp, n_scenes, n_web, seed, web_drop, web_add, progress)
        _publish(tmp, out_dir, _marker(seed, n_scenes, n_web, web_drop, web_add), replace_unmarked)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _remove_stale(parent: Path, max_age_s: float = 6 * 3600) -> None:
    """Removes temporary folders of builds that were interrupted long ago."""
    now = time.time()
    for p in parent.glob(".*.tmp-*"):
        try:
            if now - p.stat().st_mtime > max_age_s:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def demo_path(seed: int | None = None, n_scenes: int = DEFAULT_N_SCENES, n_web: int = DEFAULT_N_WEB,
              progress: Callable[[int, int], None] | None = None) -> Path:
    """The demo's folder in the cache, ``demo_dir/v{DEMO_VERSION}-seed{seed}-n{n_scenes}``, built
    first if it is not complete yet. ``seed`` defaults to the settings' ``demo_seed``."""
    settings = get_settings()
    seed = settings.demo_seed if seed is None else int(seed)
    name = f"v{DEMO_VERSION}-seed{seed}-n{n_scenes}" + ("" if n_web == DEFAULT_N_WEB else f"-w{n_web}")
    path = settings.demo_dir / name
    if (path / MARKER).is_file():
        return path
    try:
        settings.demo_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale(settings.demo_dir)
        if seed < 0 or n_scenes < 1 or n_web < 0:
            raise ValueError(f"bad demo size or seed: seed={seed}, n_scenes={n_scenes}, n_web={n_web}")
        return _write(path, n_scenes, n_web, seed, progress, WEB_DROP_RATE, WEB_ADD_RATE,
                      replace_unmarked=True)
    except OSError as e:
        raise DatasetError(f"cannot write the demo dataset ({e.strerror or e})", path,
                           hint="Set CROSSVIEW_CACHE_DIR to a writable folder") from None


def load_demo(seed: int | None = None, n_scenes: int = DEFAULT_N_SCENES, n_web: int = DEFAULT_N_WEB,
              progress: Callable[[int, int], None] | None = None) -> PairedDataset:
    """The demo as a :class:`PairedDataset` (5 captions per image, ``label`` = layout class, tags and
    object phrases as label sets), rendered into the cache on first use."""
    from crossview.data.readers import karpathy

    path = demo_path(seed, n_scenes, n_web, progress)
    ds = karpathy.read(path / "dataset_demo.json")
    ds.meta["demo"] = _read_marker(path)
    return ds


def load_demo_web(seed: int | None = None, n_scenes: int = DEFAULT_N_SCENES, n_web: int = DEFAULT_N_WEB,
                  progress: Callable[[int, int], None] | None = None) -> PairedDataset:
    """The demo's noisy web image-tag set (no captions; ``tags`` per image)."""
    from crossview.data.readers import webtags  # written alongside; imported only when used

    path = demo_path(seed, n_scenes, n_web, progress)
    ds = webtags.read(path / "web")
    ds.name = "demo-web"
    ds.meta["demo"] = _read_marker(path)
    return ds
