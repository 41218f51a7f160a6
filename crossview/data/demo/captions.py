"""Captions of a demo scene: a varied grammar (synonyms, word orders, optional size, frame position,
background, counting) in which every statement is true of the scene."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from crossview.data.demo.spec import Scene, SceneObject, _frame_region, relations_between


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
