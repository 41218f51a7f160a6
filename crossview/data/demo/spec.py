"""The demo's scene model: shapes, colours, sizes, layouts and tags (the constants), an object and a
scene, and what follows from their geometry (relations, the layout class, frame regions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


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
