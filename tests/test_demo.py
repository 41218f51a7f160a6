"""The built-in demo: determinism, layout on disk, and that captions, tags, labels and pixels are
true of the scene specification.

The caption checks parse each caption with this file's own word tables (colour words, shape synonyms,
relation and position phrases), not with the generator's, and check every statement they find
against the geometry in ``scenes.json``.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from crossview.data import demo
from crossview.data.readers import karpathy
from crossview.core.errors import DatasetError

N, N_WEB = 60, 20
W = 128  # image size


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return demo.write_demo(tmp_path_factory.mktemp("demo") / "seed0", n_scenes=N, n_web=N_WEB, seed=0)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _scenes(root: Path) -> list[dict]:
    return json.loads((root / "scenes.json").read_text())["scenes"]


# ====================================================================== determinism and layout
def test_same_seed_same_bytes_different_seed_differs(built, tmp_path):
    again = demo.write_demo(tmp_path / "again", n_scenes=N, n_web=N_WEB, seed=0)
    a, b = _files(built), _files(again)
    assert sorted(a) == sorted(b)
    assert len(a) == N + N_WEB + 5  # images, dataset JSON, scenes.json x2, tags.jsonl, marker
    for name in a:
        assert a[name] == b[name], name
    other = _files(demo.write_demo(tmp_path / "seed1", n_scenes=N, n_web=N_WEB, seed=1))
    assert other["scenes.json"] != a["scenes.json"]
    assert other["web/tags.jsonl"] != a["web/tags.jsonl"]
    images = [n for n in a if n.endswith(".jpg")]
    assert sum(a[n] != other[n] for n in images) >= 0.95 * len(images)


def test_files_counts_and_splits(built):
    doc = json.loads((built / "dataset_demo.json").read_text())
    assert doc["dataset"] == "demo"
    entries = doc["images"]
    assert len(entries) == N
    sentids = [s["sentid"] for e in entries for s in e["sentences"]]
    assert sentids == list(range(5 * N))
    for k, e in enumerate(entries):
        assert e["filename"] == f"demo_{k:05d}.jpg" and e["imgid"] == k
        assert e["sentids"] == [s["sentid"] for s in e["sentences"]]
        assert all(s["imgid"] == k and s["tokens"] for s in e["sentences"])
        assert {"label", "tags", "labels", "split"} <= set(e)
        with Image.open(built / "images" / e["filename"]) as im:
            assert im.format == "JPEG" and im.size == (W, W) and im.mode == "RGB"
    ds = karpathy.read(built)
    assert ds.n_images == N and ds.n_captions == 5 * N
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 50, "val": 5, "test": 5}
    assert demo.split_sizes(2400) == {"train": 2000, "val": 200, "test": 200}
    assert set(ds.label_names) <= set(demo.LAYOUTS)
    web_lines = (built / "web" / "tags.jsonl").read_text().splitlines()
    assert len(web_lines) == N_WEB
    for k, line in enumerate(web_lines):
        item = json.loads(line)
        assert item["image"] == f"images/web_{k:05d}.jpg" and (built / "web" / item["image"]).is_file()
        assert item["tags"]
    assert (built / demo.MARKER).is_file()
    assert not [p for p in built.parent.iterdir() if ".tmp-" in p.name]


def test_five_distinct_captions_per_image(built):
    scenes = _scenes(built)
    for s in scenes:
        assert len(s["captions"]) == 5 and len(set(s["captions"])) == 5
    # Also over a larger sample, without rendering.
    for s in demo.make_scenes(300, seed=5):
        assert len(set(s.captions)) == 5


# ====================================================================== captions are true
COLOUR_WORDS = {"red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink"}
SIZE_WORDS = {"small": "small", "little": "small", "tiny": "small", "medium": "medium",
              "medium-sized": "medium", "mid-sized": "medium", "large": "large", "big": "large", "huge": "large"}
SHAPE_WORDS = {  # None: a generic noun, a mention only with a colour or a size
    ("round", "shape"): "circle", ("circle",): "circle", ("disc",): "circle",
    ("square",): "square", ("box",): "square", ("block",): "square",
    ("triangular", "shape"): "triangle", ("triangle",): "triangle",
    ("five-pointed", "star"): "star", ("star",): "star",
    ("plus", "sign"): "cross", ("cross",): "cross",
    ("diamond",): "diamond", ("rhombus",): "diamond",
    ("six-sided", "shape"): "hexagon", ("hexagon",): "hexagon",
    ("heart", "shape"): "heart", ("heart",): "heart",
    ("shape",): None, ("object",): None, ("figure",): None,
}
RELATION_WORDS = {
    ("to", "the", "left", "of"): "left", ("left", "of"): "left",
    ("to", "the", "right", "of"): "right", ("right", "of"): "right",
    ("above",): "above", ("on", "top", "of"): "above", ("over",): "above",
    ("below",): "below", ("under",): "below", ("beneath",): "below", ("underneath",): "below",
    ("next", "to"): "next", ("beside",): "next",
}
KIND_WORDS = {"plain": "plain", "solid": "plain", "uniform": "plain", "striped": "stripes", "stripes": "stripes",
              "dotted": "dots", "dots": "dots", "polka-dot": "dots", "spotted": "dots",
              "checkered": "checkerboard", "checkerboard": "checkerboard", "chequered": "checkerboard",
              "gradient": "gradient", "shaded": "gradient", "noisy": "noise", "grainy": "noise",
              "speckled": "noise"}
BG_COLOUR_WORDS = {("light", "gray"): "light gray", ("dark", "gray"): "dark gray", ("white",): "white",
                   ("black",): "black", ("beige",): "beige"}


def _match(tokens: list[str], i: int, table: dict) -> tuple[int, object] | None:
    """The longest phrase of ``table`` starting at token ``i``: (length, value)."""
    for key in sorted(table, key=len, reverse=True):
        if tuple(tokens[i:i + len(key)]) == key:
            return len(key), table[key]
    return None


def _parse_clause(tokens: list[str]) -> list[tuple[str, int, object]]:
    """Items in order: ("M", pos, {colour, shape, size}), ("R", pos, rel), ("F", pos, (row, col))."""
    items = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        # Position in the frame.
        nxt = tokens[i + 1:i + 5]
        if t in ("in", "at") and nxt[:1] == ["the"] and len(nxt) >= 3 and nxt[1] in (
                "top", "bottom", "upper", "lower") and nxt[2] in ("left", "right"):
            row = {"upper": "top", "lower": "bottom"}.get(nxt[1], nxt[1])
            items.append(("F", i, (row, nxt[2])))
            i += 4 if nxt[3:4] == ["corner"] else 3
            continue
        if t in ("at", "near") and nxt[:1] == ["the"] and nxt[1:2] in (["top"], ["bottom"]):
            items.append(("F", i, (nxt[1], None)))
            i += 3
            continue
        if t == "on" and nxt[:1] == ["the"] and nxt[1:2] in (["left"], ["right"]) and nxt[2:3] != ["of"]:
            items.append(("F", i, (None, nxt[1])))
            i += 4 if nxt[2:3] == ["side"] else 3
            continue
        if t == "in" and nxt[:1] == ["the"] and nxt[1:2] in (["centre"], ["center"], ["middle"]):
            items.append(("F", i, ("middle", "centre")))
            i += 3
            continue
        rel = _match(tokens, i, RELATION_WORDS)
        if rel:
            items.append(("R", i, rel[1]))
            i += rel[0]
            continue
        # A mention: [size] [colour] shape.
        j, size, colour = i, None, None
        if tokens[j] in SIZE_WORDS:
            size, j = SIZE_WORDS[tokens[j]], j + 1
        if j < len(tokens) and tokens[j] in COLOUR_WORDS:
            colour, j = tokens[j], j + 1
        shape = _match(tokens, j, SHAPE_WORDS) if j < len(tokens) else None
        if shape and (shape[1] is not None or size or colour):
            items.append(("M", i, {"colour": colour, "shape": shape[1], "size": size}))
            i = j + shape[0]
            continue
        i += 1
    return items


def _resolve(mention: dict, objects: list[dict]) -> list[int]:
    return [k for k, o in enumerate(objects)
            if (mention["colour"] is None or o["colour"] == mention["colour"])
            and (mention["shape"] is None or o["shape"] == mention["shape"])
            and (mention["size"] is None or o["size"] == mention["size"])]


def _holds(rel: str, a: dict, b: dict) -> bool:
    """The relation in the spec's geometry (bounding boxes, y down)."""
    ax0, ay0, ax1, ay1 = a["bbox"]
    bx0, by0, bx1, by1 = b["bbox"]
    if rel == "left":
        return ax1 <= bx0
    if rel == "right":
        return bx1 <= ax0
    if rel == "above":
        return ay1 <= by0
    if rel == "below":
        return by1 <= ay0
    assert rel == "next"
    x_gap = max(bx0 - ax1, ax0 - bx1)
    return 0 <= x_gap <= 32 and min(ay1, by1) - max(ay0, by0) > 0


def _in_frame(frame: tuple, o: dict) -> bool:
    row, col = frame
    cx, cy = o["centre"]
    rows = {"top": cy < W / 3, "middle": W / 3 <= cy <= 2 * W / 3, "bottom": cy > 2 * W / 3}
    cols = {"left": cx < W / 3, "centre": W / 3 <= cx <= 2 * W / 3, "right": cx > 2 * W / 3}
    return (row is None or rows[row]) and (col is None or cols[col])


def check_caption(caption: str, scene: dict) -> None:
    """Asserts that everything the caption states is true of the scene."""
    objects = scene["objects"]
    text = caption.lower()
    where = f"{caption!r} for {[(o['size'], o['colour'], o['shape']) for o in objects]}"
    clauses = [re.findall(r"[a-z]+(?:-[a-z]+)*", c) for c in re.split(r"[.;]", text)]
    n_mentions = 0
    for tokens in clauses:
        items = _parse_clause(tokens)
        mentions = [(pos, m) for kind, pos, m in items if kind == "M"]
        n_mentions += len(mentions)
        for _, m in mentions:
            assert len(_resolve(m, objects)) == 1, f"mention {m} is not one object: {where}"
        for kind, pos, value in items:
            before = [m for p, m in mentions if p < pos]
            after = [m for p, m in mentions if p > pos]
            if kind == "R":
                if before:
                    subj, obj = before[-1], after[0]
                else:  # fronted: "To the left of the blue square is a red circle"
                    obj, subj = after[0], after[1]
                a, b = objects[_resolve(subj, objects)[0]], objects[_resolve(obj, objects)[0]]
                assert _holds(value, a, b), f"{subj} {value} {obj} is false: {where}"
            elif kind == "F":
                m = before[-1] if before else after[0]
                o = objects[_resolve(m, objects)[0]]
                assert _in_frame(value, o), f"{m} is not at {value} (centre {o['centre']}): {where}"
        # "from left to right: A, B and C" lists the objects in that order.
        for phrase, axis in (("from left to right", 0), ("from top to bottom", 1)):
            if phrase in " ".join(tokens):
                start = " ".join(tokens).index(phrase)
                pos0 = len(" ".join(tokens)[:start].split())
                listed = [objects[_resolve(m, objects)[0]] for p, m in mentions if p > pos0]
                coords = [o["centre"][axis] for o in listed]
                assert len(listed) == len(objects) and coords == sorted(coords), where
    assert n_mentions >= 1, f"no object mentioned: {where}"
    # Counting.
    n = len(objects)
    for word, count in (("two", 2), ("three", 3)):
        if re.search(rf"\b{word} (shapes|objects|figures|items)\b", text):
            assert n == count, where
    if "pair of" in text:
        assert n == 2, where
    if re.search(r"\b(single|lone)\b|\b(only|just) one\b", text):
        assert n == 1, where
    # Layout words.
    label = scene["label"]
    if "side by side" in text:
        assert label == "pair side by side", where
    if "in a row" in text or "horizontal line" in text:
        assert label == "three in a row", where
    if "column" in text or "vertical line" in text or "stacked" in text:
        assert label in ("pair stacked", "three in a column"), where
    if "diagonal" in text:
        assert label == "pair diagonal", where
    if "scattered" in text or "spread out" in text:
        assert label == "three scattered", where
    # Background: kind and colour words around "background".
    tokens = re.findall(r"[a-z]+(?:-[a-z]+)*", text)
    for k, t in enumerate(tokens):
        if t != "background":
            continue
        window = tokens[max(0, k - 3):k] + tokens[k + 1:k + 5]
        for w in window:
            if w in KIND_WORDS:
                assert KIND_WORDS[w] == scene["background"]["kind"], where
        for j in range(len(window)):
            got = _match(window, j, BG_COLOUR_WORDS)  # a bare "gray" is never a background colour
            if got:
                assert got[1] == scene["background"]["colour"], where


def test_captions_are_true_of_the_rendered_scenes(built):
    for s in _scenes(built):
        for c in s["captions"]:
            check_caption(c, s)


def test_captions_are_true_on_a_larger_sample():
    for scene in demo.make_scenes(400, seed=3):
        spec = scene.to_json()
        for c in scene.captions:
            check_caption(c, spec)


def test_the_checker_catches_false_captions():
    scene = next(s for s in demo.make_scenes(50) if s.label == "pair side by side").to_json()
    left, right = sorted(scene["objects"], key=lambda o: o["centre"][0])
    with pytest.raises(AssertionError):
        check_caption(f"A {right['colour']} {right['shape']} to the left of a {left['colour']} "
                      f"{left['shape']}.", scene)
    wrong = next(c for c in COLOUR_WORDS if c not in (left["colour"], right["colour"]))
    with pytest.raises(AssertionError):
        check_caption(f"A {wrong} {left['shape']}.", scene)
    with pytest.raises(AssertionError):
        check_caption(f"Three shapes: a {left['colour']} {left['shape']}.", scene)


def test_captions_vary():
    caps = [c for s in demo.make_scenes(200) for c in s.captions]
    words = {w for c in caps for w in re.findall(r"[a-z-]+", c.lower())}
    for w in ("disc", "box", "big", "tiny", "left", "above", "beside", "corner", "there", "background",
              "two", "three", "sits"):
        assert w in words, w
    starts = {" ".join(c.split()[:2]) for c in caps}
    assert len(starts) > 30  # varied word order, not one template


# ====================================================================== pictures match the spec
def test_object_colour_at_object_centre(built):
    scenes = _scenes(built)
    for s in scenes:
        im = np.asarray(Image.open(built / s["image"]).convert("RGB"), dtype=np.int32)
        bg = np.asarray(s["background"]["rgb"])
        for o in s["objects"]:
            cx, cy = o["centre"]
            px = im[cy, cx]
            rgb = np.asarray(o["rgb"])
            assert np.abs(px - rgb).max() <= 45, (s["image"], o, px)
            assert np.linalg.norm(px - rgb) < np.linalg.norm(px - bg)
            others = [np.asarray(c) for name, c in demo.COLOURS.items() if name != o["colour"]]
            assert all(np.linalg.norm(px - rgb) < np.linalg.norm(px - c) for c in others)


def test_objects_stand_out_from_every_background():
    for rgb in demo.COLOURS.values():
        for bg in demo.BACKGROUND_COLOURS.values():
            assert np.linalg.norm(np.subtract(rgb, bg)) > 80
    colours = list(demo.COLOURS.values())
    assert len(colours) >= 8 and len(demo.SHAPES) >= 6
    assert min(np.linalg.norm(np.subtract(a, b)) for i, a in enumerate(colours) for b in colours[:i]) > 75


def test_scene_geometry(built):
    for s in _scenes(built):
        objs = s["objects"]
        assert 1 <= len(objs) <= 3
        for o in objs:
            x0, y0, x1, y1 = o["bbox"]
            assert 0 <= x0 < x1 <= W and 0 <= y0 < y1 <= W
        for i, a in enumerate(objs):
            for b in objs[:i]:  # boxes do not overlap
                assert a["bbox"][2] <= b["bbox"][0] or b["bbox"][2] <= a["bbox"][0] or \
                    a["bbox"][3] <= b["bbox"][1] or b["bbox"][3] <= a["bbox"][1]
        for r in s["relations"]:
            rel = {"left of": "left", "right of": "right", "above": "above", "below": "below",
                   "next to": "next"}[r["relation"]]
            assert _holds(rel, objs[r["subject"]], objs[r["object"]])


# ====================================================================== tags and labels
def test_tags_and_labels(built):
    doc = json.loads((built / "dataset_demo.json").read_text())
    for e, s in zip(doc["images"], _scenes(built)):
        tags = e["tags"]
        assert len(tags) == len(set(tags))
        truth = set()
        for o in s["objects"]:
            truth |= {o["shape"], o["colour"], o["size"]}
        truth |= {s["background"]["kind"], s["background"]["colour"]}
        assert set(tags) == truth
        assert e["labels"] == [f"{o['colour']} {o['shape']}" for o in s["objects"]]
        n = len(s["objects"])
        assert e["label"] == s["label"]
        assert e["label"] in {1: ["one object"],
                              2: ["pair side by side", "pair stacked", "pair diagonal"],
                              3: ["three in a row", "three in a column", "three scattered"]}[n]
        xs = [o["centre"][0] for o in s["objects"]]
        ys = [o["centre"][1] for o in s["objects"]]
        sx, sy = max(xs) - min(xs), max(ys) - min(ys)
        if e["label"] in ("pair side by side", "three in a row"):
            assert sy < sx / 2
        if e["label"] in ("pair stacked", "three in a column"):
            assert sx < sy / 2
        if e["label"] == "pair diagonal":
            assert sx / 2 < sy < 2 * sx


def test_layout_classes_all_occur():
    labels = {s.label for s in demo.make_scenes(100)}
    assert labels == set(demo.LAYOUTS) and len(labels) >= 6


# ====================================================================== web set
def test_web_noise_rates():
    for drop, add in ((demo.WEB_DROP_RATE, demo.WEB_ADD_RATE), (0.5, 0.0)):
        items = demo.make_web_items(400, seed=0, web_drop=drop, web_add=add)
        n_true = sum(len(i.true_tags) for i in items)
        n_dropped = sum(len(i.dropped) for i in items)
        n_added = sum(len(i.added) for i in items)
        assert abs(n_dropped / n_true - drop) < 0.03
        assert abs(n_added / n_true - add) < 0.03
        for i in items:
            assert i.tags and len(i.tags) == len(set(i.tags))
            assert set(i.tags) == (set(i.true_tags) - set(i.dropped)) | set(i.added)
            assert not set(i.added) & set(i.true_tags)
            assert set(i.true_tags) == set(i.scene.tags)


def test_web_files_match_specs(built):
    web = json.loads((built / "web" / "scenes.json").read_text())["scenes"]
    lines = [json.loads(x) for x in (built / "web" / "tags.jsonl").read_text().splitlines()]
    items = demo.make_web_items(N_WEB, seed=0)
    assert [x["tags"] for x in lines] == [w["noisy_tags"] for w in web] == [i.tags for i in items]
    assert [w["true_tags"] for w in web] == [i.true_tags for i in items]
    captioned = {json.dumps(s["objects"]) for s in _scenes(built)}
    assert not any(json.dumps(w["objects"]) in captioned for w in web)  # another seed stream


# ====================================================================== cache and atomic writes
def test_load_demo_builds_once_then_hits_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    ds = demo.load_demo(seed=2, n_scenes=14, n_web=4, progress=lambda d, t: calls.append((d, t)))
    path = tmp_path / "cache" / "demo" / f"v{demo.DEMO_VERSION}-seed2-n14-w4"
    assert (path / demo.MARKER).is_file()
    assert calls[-1] == (18, 18) and len(calls) == 18
    assert ds.name == "demo" and ds.n_images == 14 and ds.n_captions == 70 and ds.tags is not None
    assert ds.label_names and set(ds.label_names) <= set(demo.LAYOUTS)
    mtime = (path / demo.MARKER).stat().st_mtime_ns

    def no_rebuild(*args, **kwargs):
        raise AssertionError("rebuilt the demo")

    monkeypatch.setattr(demo.cache, "_build", no_rebuild)
    again = demo.load_demo(seed=2, n_scenes=14, n_web=4)
    assert again.fingerprint() == ds.fingerprint()
    assert (path / demo.MARKER).stat().st_mtime_ns == mtime
    assert demo.demo_path(2, 14, 4) == path
    web = demo.load_demo_web(seed=2, n_scenes=14, n_web=4)
    assert web.n_images == 4 and web.n_captions == 0 and all(web.tags)
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_default_seed_and_folder_name(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CROSSVIEW_DEMO_SEED", "7")
    monkeypatch.setattr(demo.cache, "DEFAULT_N_WEB", 3)
    path = demo.demo_path(n_scenes=6, n_web=3)
    assert path == tmp_path / "demo" / f"v{demo.DEMO_VERSION}-seed7-n6"
    assert json.loads((path / demo.MARKER).read_text())["seed"] == 7


def test_interrupted_build_leaves_nothing(tmp_path):
    def stop(done, total):
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        demo.write_demo(tmp_path / "out", n_scenes=10, n_web=2, progress=stop)
    assert list(tmp_path.iterdir()) == []


def test_concurrent_builds_do_not_corrupt(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path))
    barrier = threading.Barrier(2)
    results, errors = [], []

    def build():
        try:
            barrier.wait()
            results.append(demo.demo_path(seed=4, n_scenes=12, n_web=3))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 2 and results[0] == results[1]
    assert [p.name for p in (tmp_path / "demo").iterdir()] == [results[0].name]
    reference = demo.write_demo(tmp_path / "ref", n_scenes=12, n_web=3, seed=4)
    assert _files(results[0]) == _files(reference)


def test_write_demo_over_existing_folders(tmp_path):
    out = demo.write_demo(tmp_path / "out", n_scenes=6, n_web=1)
    before = _files(out)
    demo.write_demo(out, n_scenes=6, n_web=1)  # the same build: ours is discarded
    assert _files(out) == before
    demo.write_demo(out, n_scenes=8, n_web=1)  # other parameters: replaced
    assert len(json.loads((out / "dataset_demo.json").read_text())["images"]) == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(DatasetError, match="not a CrossView demo folder"):
        demo.write_demo(foreign, n_scenes=6, n_web=1)
    assert (foreign / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "out"]


def test_bad_arguments():
    with pytest.raises(ValueError):
        demo.write_demo("/nonexistent/never", n_scenes=0)
    with pytest.raises(ValueError):
        demo.write_demo("/nonexistent/never", seed=-1)
    with pytest.raises(ValueError):
        demo.write_demo("/nonexistent/never", web_drop=1.5)


def test_load_dataset_demo_entry_point(tmp_path, monkeypatch):
    from crossview.data.readers import load_dataset

    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path))
    seen = {}

    def fake_load_demo():
        seen["called"] = True
        return "ds"

    monkeypatch.setattr(demo, "load_demo", fake_load_demo)
    assert load_dataset("demo") == "ds" and seen
