"""The demo on disk: :func:`write_demo` builds the folder in a temporary sibling and renames it into
place; :func:`demo_path` / :func:`load_demo` keep one copy per version, seed and size in the cache."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

from crossview.data.dataset import PairedDataset
from crossview.data.demo.render import _save_jpeg, render_scene
from crossview.data.demo.scenes import make_scene, split_of
from crossview.data.demo.spec import (DEFAULT_N_SCENES, DEFAULT_N_WEB, DEMO_VERSION, IMAGE_SIZE, LAYOUTS, MARKER,
                                      WEB_ADD_RATE, WEB_DROP_RATE)
from crossview.data.demo.web import make_web_item
from crossview.data.text import tokenize
from crossview.core.errors import DatasetError
from crossview.core.settings import get_settings


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
