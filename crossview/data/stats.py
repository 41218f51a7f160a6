"""Dataset summaries: the numbers ``crossview data info`` prints and the Data panel shows."""

from __future__ import annotations

import numpy as np

from crossview.core.text import printable
from crossview.data.dataset import PairedDataset, TextCorpus
from crossview.data.text import tokenize, word_counts


def _length_stats(captions: list[str]) -> dict:
    if not captions:
        return {"min": 0, "mean": 0.0, "median": 0.0, "max": 0}
    lengths = np.fromiter((len(tokenize(c)) for c in captions), dtype=np.int64, count=len(captions))
    return {"min": int(lengths.min()), "mean": round(float(lengths.mean()), 2),
            "median": float(np.median(lengths)), "max": int(lengths.max())}


def caption_lengths(captions: list[str]) -> np.ndarray:
    """``(n_captions,) int64`` number of word tokens of each caption (for histograms)."""
    return np.fromiter((len(tokenize(c)) for c in captions), dtype=np.int64, count=len(captions))


def dataset_info(ds: PairedDataset | TextCorpus) -> dict:
    """A JSON-ready summary: counts, splits, labels, tags, vocabulary size, caption-length stats."""
    counts = word_counts(ds.captions)
    info: dict = {"name": ds.name, "format": ds.format, "source": ds.source}
    if isinstance(ds, TextCorpus):
        info.update(images=0, captions=ds.n_captions, vocabulary=len(counts),
                    vocabulary_min2=sum(1 for v in counts.values() if v >= 2),
                    caption_length=_length_stats(ds.captions), warnings=list(ds.warnings))
        return info
    per_image = np.bincount(ds.caption_image, minlength=ds.n_images) if ds.n_images else np.zeros(0, int)
    info.update(
        images=ds.n_images,
        captions=ds.n_captions,
        captions_per_image={"min": int(per_image.min()) if len(per_image) else 0,
                            "mean": round(float(per_image.mean()), 2) if len(per_image) else 0.0,
                            "max": int(per_image.max()) if len(per_image) else 0},
        splits={s: {"images": int(len(ds.splits[s])),
                    "captions": int(per_image[ds.splits[s]].sum()) if len(per_image) else 0}
                for s in ds.split_names},
        generated_splits=bool(ds.meta.get("generated_splits", False)),
        vocabulary=len(counts),
        vocabulary_min2=sum(1 for v in counts.values() if v >= 2),
        caption_length=_length_stats(ds.captions),
    )
    assert ds.labels is not None
    n_labels = len(np.unique(ds.labels)) if ds.n_images else 0
    info["labels"] = {"distinct": n_labels, "per_image_default": ds.label_names is None and n_labels == ds.n_images}
    if ds.label_names is not None:
        info["labels"]["names"] = list(ds.label_names[:20])
    if ds.tags is not None:
        all_tags = {t for ts in ds.tags for t in ts}
        info["tags"] = {"distinct": len(all_tags),
                        "per_image": round(float(np.mean([len(t) for t in ds.tags])), 2) if ds.tags else 0.0}
    if ds.label_sets is not None:
        all_sets = {t for ts in ds.label_sets for t in ts}
        info["label_sets"] = {"distinct": len(all_sets),
                              "per_image": round(float(np.mean([len(t) for t in ds.label_sets])), 2)}
    if ds.image_features is not None:
        info["feature_dim"] = int(ds.image_features.shape[1])
    info["warnings"] = list(ds.warnings)
    return info


def format_info(info: dict) -> str:
    """The summary as aligned text lines for the terminal."""
    # Dataset strings (name, source, split names, warnings quoting entries) are escaped: an ANSI sequence in a
    # split name must not recolour the terminal, nor a lone surrogate make print() fail.
    rows: list[tuple[str, str]] = [("dataset", f"{printable(info['name'])} ({info['format']})"),
                                   ("source", printable(info["source"])),
                                   ("images", f"{info['images']:,}"), ("captions", f"{info['captions']:,}")]
    if "captions_per_image" in info:
        cpi = info["captions_per_image"]
        rows.append(("captions per image", f"{cpi['mean']:g} (min {cpi['min']}, max {cpi['max']})"))
    if info.get("splits"):
        parts = [f"{printable(k)} {v['images']:,} images / {v['captions']:,} captions" for k, v in info["splits"].items()]
        label = "splits (generated 80/10/10)" if info.get("generated_splits") else "splits"
        rows.append((label, "; ".join(parts)))
    if "labels" in info:
        lab = info["labels"]
        rows.append(("labels", "none (each image is its own identity)" if lab["per_image_default"]
                     else f"{lab['distinct']:,} distinct"))
    if "tags" in info:
        rows.append(("tags", f"{info['tags']['distinct']:,} distinct, {info['tags']['per_image']:g} per image"))
    if "label_sets" in info:
        ls = info["label_sets"]
        rows.append(("label sets", f"{ls['distinct']:,} distinct, {ls['per_image']:g} per image"))
    if "feature_dim" in info:
        rows.append(("image features", f"precomputed, {info['feature_dim']}-d"))
    rows.append(("vocabulary", f"{info['vocabulary']:,} words ({info['vocabulary_min2']:,} seen at least twice)"))
    cl = info["caption_length"]
    rows.append(("caption length", f"mean {cl['mean']:g} words (min {cl['min']}, median {cl['median']:g}, "
                                    f"max {cl['max']})"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    for w in info.get("warnings", []):
        lines.append(f"warning: {printable(w)}")
    return "\n".join(lines)
