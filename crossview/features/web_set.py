"""A web image-tag set built from a caption dataset, for datasets that have no web collection of their own
(Stage II of the webly method, paper 003, needs one).

What it is, stated in ``web.json`` beside the tags and wherever its numbers are reported: the dataset's own
images of one split (by default ``train``), each with the nouns and verbs of its captions as tags
(:func:`crossview.features.tags.extract_tags`, ordered by how many of its captions name them), then noise at
stated rates, as web tags have: each true tag is dropped with probability ``drop``, and ``Binomial(n_true, add)``
wrong tags are added, drawn from the set's own tags in proportion to their frequency (so that the wrong tags
are plausible ones, as users' tags are), never one of the image's true tags; an image keeps at least one tag.
It is not independent web data: the images are the clean set's, so Stage II on it tests learning from noisy
tags, not from more images.

``make_web_set(dataset, out)`` writes ``out/tags.jsonl`` (``{"image": absolute path, "tags": [...], "true_tags":
[...]}``; the webtags reader reads it) and ``out/web.json``; it returns the path of ``tags.jsonl``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError

__all__ = ["make_web_set", "noisy_tags", "WEB_DROP", "WEB_ADD"]

#: default rates: a fifth of the true tags dropped, a fifth as many wrong ones added (the demo's web set too)
WEB_DROP = 0.2
WEB_ADD = 0.2


def noisy_tags(true: list[str], rng: np.random.Generator, pool: list[str], weights: np.ndarray, *,
               drop: float = WEB_DROP, add: float = WEB_ADD) -> list[str]:
    """``true`` with each tag dropped with probability ``drop`` and ``Binomial(len(true), add)`` wrong tags added
    (drawn from ``pool`` with ``weights``, without replacement, never a true tag); at least one tag is kept."""
    if not true:
        return []
    keep = [t for t in true if rng.random() >= drop]
    n_add = int(rng.binomial(len(true), add)) if add > 0 else 0
    if n_add:
        mask = np.array([t not in set(true) for t in pool])
        w = weights * mask
        n_add = min(n_add, int(mask.sum()))
        if n_add and w.sum() > 0:
            picked = rng.choice(len(pool), size=n_add, replace=False, p=w / w.sum())
            keep += [pool[i] for i in sorted(picked)]
    if not keep:
        keep = [true[int(rng.integers(len(true)))]]
    return [keep[i] for i in rng.permutation(len(keep))]


def make_web_set(dataset: Any, out: str | Path, *, split: str = "train", drop: float = WEB_DROP,
                 add: float = WEB_ADD, seed: int = 0,
                 progress: Callable[[int, int], None] | None = None) -> Path:
    """Write the web set of ``dataset``'s ``split`` into the folder ``out`` (see the module docstring)."""
    from crossview.core.io import atomic_write_bytes, atomic_write_json
    from crossview.features.tags import extract_tags

    for name, v in (("drop", drop), ("add", add)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not 0 <= v <= 1:
            raise CrossViewError(f"--{name} must be a rate from 0 to 1, got {v!r}")
    splits = getattr(dataset, "splits", {}) or {}
    if split not in splits:
        raise CrossViewError(f"dataset {dataset.name!r} has no split {split!r} (it has: "
                             f"{', '.join(splits) or 'none'}); choose one with --split")
    paths = getattr(dataset, "image_paths", None)
    if not paths:
        raise CrossViewError(f"dataset {dataset.name!r} has no image files (feature rows only); a web set lists "
                             "images, so it needs a dataset of image files")
    if not dataset.captions:
        raise CrossViewError(f"dataset {dataset.name!r} has no captions to take the tags from")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CrossViewError(f"--out {out} is a file; give a folder for the web set")
    if (out / "tags.jsonl").exists():
        raise CrossViewError(f"{out / 'tags.jsonl'} exists; give a new --out folder (nothing is overwritten)")
    if out.is_dir() and any(out.iterdir()):
        raise CrossViewError(f"--out {out} exists and holds other files (a run, a dataset?); give a new or empty "
                             "folder for the web set")
    images = np.asarray(splits[split], dtype=np.int64)
    ci = np.asarray(dataset.caption_image)
    by_image: dict[int, list[int]] = {}
    for c, i in enumerate(ci):
        by_image.setdefault(int(i), []).append(c)
    true: list[list[str]] = []
    for k, i in enumerate(images):
        counts: Counter[str] = Counter()
        order: dict[str, int] = {}
        for c in by_image.get(int(i), []):
            for t in extract_tags(dataset.captions[c]):
                counts[t] += 1
                order.setdefault(t, len(order))
        true.append(sorted(counts, key=lambda t: (-counts[t], order[t])))
        if progress is not None:
            progress(k + 1, len(images))
    freq = Counter(t for tags in true for t in tags)
    pool = sorted(freq)
    weights = np.array([freq[t] for t in pool], dtype=np.float64)
    rng = np.random.default_rng(seed)
    rows, n_dropped, n_added = [], 0, 0
    for i, tags in zip(images, true):
        noisy = noisy_tags(tags, rng, pool, weights, drop=drop, add=add)
        n_dropped += len(set(tags) - set(noisy))
        n_added += len(set(noisy) - set(tags))
        rows.append({"image": str(Path(paths[int(i)]).resolve()), "tags": noisy, "true_tags": tags})
    n_true = sum(len(t) for t in true)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "tags.jsonl",
                       "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))
    atomic_write_json(out / "web.json", {
        "what": (f"a web set built from {dataset.name}'s own {split} images: tags = the nouns and verbs of their "
                 f"captions, each dropped with probability {drop}, plus Binomial(n_true, {add}) wrong tags drawn "
                 "from the set's tags by frequency; not independent web data"),
        "source": getattr(dataset, "source", "") or dataset.name, "split": split, "images": len(rows),
        "drop": drop, "add": add, "seed": seed, "tag_vocabulary": len(pool),
        "true_tags_per_image": n_true / max(1, len(rows)),
        "noisy_tags_per_image": sum(len(r["tags"]) for r in rows) / max(1, len(rows)),
        "dropped_fraction": n_dropped / max(1, n_true), "added_per_true_tag": n_added / max(1, n_true)})
    return out / "tags.jsonl"
