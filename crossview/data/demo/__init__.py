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

Modules: :mod:`.spec` (the scene model), :mod:`.scenes` (drawing scenes, splits), :mod:`.captions`,
:mod:`.web` (the noisy-tag set), :mod:`.render` (Pillow), :mod:`.cache` (the folder on disk). The names
below are the package's public API (``from crossview.data.demo import load_demo``).
"""

from __future__ import annotations

from crossview.data.demo.cache import MARKER, demo_path, load_demo, load_demo_web, write_demo
from crossview.data.demo.captions import make_captions
from crossview.data.demo.render import render_background, render_scene
from crossview.data.demo.scenes import make_scene, make_scenes, split_of, split_sizes
from crossview.data.demo.spec import (BACKGROUND_COLOURS, BACKGROUND_KINDS, COLOURS, DEFAULT_N_SCENES,
                                      DEFAULT_N_WEB, DEMO_VERSION, IMAGE_SIZE, JPEG_QUALITY, LAYOUT_COUNTS,
                                      LAYOUTS, RELATIONS, SHAPES, SIZES, TAG_VOCABULARY, WEB_ADD_RATE,
                                      WEB_DROP_RATE, Scene, SceneObject, classify_layout, relations_between)
from crossview.data.demo.web import WebItem, make_web_item, make_web_items

__all__ = ["BACKGROUND_COLOURS", "BACKGROUND_KINDS", "COLOURS", "DEFAULT_N_SCENES", "DEFAULT_N_WEB", "DEMO_VERSION",
           "IMAGE_SIZE", "JPEG_QUALITY", "LAYOUT_COUNTS", "LAYOUTS", "MARKER", "RELATIONS", "SHAPES", "SIZES",
           "TAG_VOCABULARY", "WEB_ADD_RATE", "WEB_DROP_RATE", "Scene", "SceneObject", "WebItem", "classify_layout",
           "demo_path", "load_demo", "load_demo_web", "make_captions", "make_scene", "make_scenes", "make_web_item",
           "make_web_items", "relations_between", "render_background", "render_scene", "split_of", "split_sizes",
           "write_demo"]
