"""Embedding files: what a trained model produces for one split, and their evaluation.

An embeddings file is a ``.npz`` (a run writes ``embeddings_<split>.npz`` into its folder; anyone can
write one from their own model) holding:

==================  =============================  ===========================================
key                 shape / type                   meaning
==================  =============================  ===========================================
``image``           ``(n_images, D) float``        image embeddings (i2t model)
``text``            ``(n_captions, D) float``      caption embeddings (i2t model)
``caption_image``   ``(n_captions,) int``          the image (row of ``image``) of each caption
``image_t2i``       ``(n_images, D') float``       optional: a separate t2i model (BITR)
``text_t2i``        ``(n_captions, D') float``     optional, with ``image_t2i``
``image_labels``    ``(n_images,) int``            optional: identity / class (``identity``)
``label_embeddings`` ``(n_labels, D) float``       optional: label / phrase embeddings (``labels``)
``label_relevance`` ``(n_images, n_labels) bool``  optional: which labels are true of each image
``captions``        ``(n_captions,) str``          optional: caption text (BLEU / ROUGE overlap)
``method``, ``dataset``, ``split``  0-d str        optional: shown in the report
==================  =============================  ===========================================

The score of image ``i`` and caption ``j`` is ``image[i] . text[j]`` (ARCHITECTURE.md, the method
contract); i2t ranks come from ``image``/``text``, t2i ranks from ``image_t2i``/``text_t2i`` when present.
Every caption protocol also reports the hubness of both directions over the whole split
(:mod:`crossview.eval.hubness`): a model that returns the same few captions for every image shows it there
even where R@K on a small gallery looks fine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.io import read_npz
from crossview.eval.hubness import describe_hubness, hubness_of_embeddings
from crossview.eval.metrics import evaluate_embeddings_blocked, rsum_of
from crossview.eval.protocols import check_coco_size, coco_1k_folds, identity_hits, mean_average_precision, precision_at_k

__all__ = ["Embeddings", "load_embeddings", "save_embeddings", "evaluate_embeddings", "PROTOCOLS",
           "format_report", "embeddings_hubness"]

PROTOCOLS = {
    "standard": "every image against every caption of the split (Flickr, COCO 5K when the split is COCO's 5K)",
    "coco5k": "COCO 5K: the whole 5,000-image test split (same as standard, checks the size)",
    "coco1k": "COCO 1K: mean over five folds of 1,000 images and their captions",
    "identity": "a hit when a top-K item shares the query's identity / class (CUHK-PEDES, CUB, Flowers)",
    "labels": "image -> labels / phrases: P@K and mAP (needs label_embeddings and label_relevance)",
}


@dataclass
class Embeddings:
    """The contents of an embeddings file (see the module docstring)."""

    image: np.ndarray
    text: np.ndarray
    caption_image: np.ndarray
    image_t2i: np.ndarray | None = None
    text_t2i: np.ndarray | None = None
    image_labels: np.ndarray | None = None
    label_embeddings: np.ndarray | None = None
    label_relevance: np.ndarray | None = None
    captions: list[str] | None = None
    info: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        raw = np.asarray(self.caption_image)
        problems = []
        if raw.dtype.kind == "f" and raw.size and not np.array_equal(raw, np.round(raw)):
            problems.append("caption_image holds numbers that are not whole (image rows are whole numbers)")
        elif raw.dtype.kind not in "iuf" and raw.size:
            problems.append(f"caption_image holds {raw.dtype} values, not image rows (whole numbers)")
        if problems:
            raise CrossViewError("inconsistent embeddings: " + "; ".join(problems))
        self.caption_image = raw.astype(np.int64)
        n_images, n_caps = self.image.shape[0], self.text.shape[0]
        if self.image.ndim != 2 or self.text.ndim != 2 or self.image.shape[1] != self.text.shape[1]:
            problems.append(f"image {self.image.shape} and text {self.text.shape} must be 2-D with the same "
                            "number of columns")
        if self.caption_image.shape != (n_caps,):
            problems.append(f"caption_image has shape {self.caption_image.shape}, expected ({n_caps},)")
        elif n_caps and (self.caption_image.min() < 0 or self.caption_image.max() >= n_images):
            problems.append(f"caption_image points outside the {n_images} images")
        if (self.image_t2i is None) != (self.text_t2i is None):
            problems.append("image_t2i and text_t2i come together")
        elif self.image_t2i is not None and (self.image_t2i.shape[0] != n_images or self.text_t2i.shape[0] != n_caps
                                           or self.image_t2i.shape[1] != self.text_t2i.shape[1]):
            problems.append(f"image_t2i {self.image_t2i.shape} / text_t2i {self.text_t2i.shape} do not match "
                            f"{n_images} images and {n_caps} captions")
        if self.image_labels is not None and np.shape(self.image_labels) != (n_images,):
            problems.append(f"image_labels has shape {np.shape(self.image_labels)}, expected ({n_images},)")
        if self.captions is not None and len(self.captions) != n_caps:
            problems.append(f"captions has {len(self.captions)} entries for {n_caps} caption embeddings")
        if (self.label_embeddings is None) != (self.label_relevance is None):
            problems.append("label_embeddings and label_relevance come together")
        elif self.label_embeddings is not None and (
                self.label_relevance.shape != (n_images, self.label_embeddings.shape[0])):
            problems.append(f"label_relevance has shape {self.label_relevance.shape}, expected "
                            f"({n_images}, {self.label_embeddings.shape[0]})")
        if problems:
            raise CrossViewError("inconsistent embeddings: " + "; ".join(problems))

    def scores(self, direction: str = "i2t") -> np.ndarray:
        """``(n_images, n_captions)`` similarities from the model of ``direction``."""
        if direction == "t2i" and self.image_t2i is not None:
            return np.asarray(self.image_t2i, np.float32) @ np.asarray(self.text_t2i, np.float32).T
        return np.asarray(self.image, np.float32) @ np.asarray(self.text, np.float32).T


def save_embeddings(path: str | Path, emb: Embeddings) -> Path:
    """Write ``emb`` to ``path`` (``.npz``) atomically."""
    import os
    import tempfile

    path = Path(path)
    arrays: dict[str, Any] = {"image": emb.image, "text": emb.text, "caption_image": emb.caption_image}
    for key in ("image_t2i", "text_t2i", "image_labels", "label_embeddings", "label_relevance"):
        if getattr(emb, key) is not None:
            arrays[key] = getattr(emb, key)
    if emb.captions is not None:
        arrays["captions"] = np.asarray(emb.captions, dtype=str)
    for k, v in emb.info.items():
        arrays[k] = np.asarray(str(v))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _looks_like(path: Path) -> str | None:
    """What a file that is not an ``.npz`` looks like (JSON, text, ...), from its first bytes; None for a zip."""
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(b"PK"):
        return None                       # a zip: numpy's reader says more if it is not a valid .npz
    if head.startswith(b"\x93NUMPY"):
        return "a single .npy array"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head:
        return "an empty file"
    if text[:1] in (b"{", b"["):
        return "JSON"
    if head.startswith(b"\x80"):
        return "a Python pickle"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return "a text file"


def _first_non_finite(a: np.ndarray, rows: int = 1 << 14) -> tuple[int, int] | None:
    """``(row, column)`` of the first NaN / infinity in ``a`` (2-d), or None: a block of ``rows`` rows at a time, so
    the check of a COCO-size matrix holds one block's flags, not a boolean copy of the whole."""
    a2 = a.reshape(len(a), -1) if a.ndim != 2 else a
    for start in range(0, len(a2), rows):
        ok = np.isfinite(a2[start:start + rows])
        if not ok.all():
            r, c = np.argwhere(~ok)[0]
            return start + int(r), int(c)
    return None


def load_embeddings(path: str | Path) -> Embeddings:
    """Read an embeddings file; a clear :class:`CrossViewError` names what is missing or wrong."""
    path = Path(path)
    if not path.is_file():
        raise CrossViewError(f"{path}: no such embeddings file")
    looks = _looks_like(path)
    if looks is not None:
        raise CrossViewError(f"{path} is not an embeddings .npz (it looks like {looks}); "
                             "give a run folder or an embeddings file")
    data = read_npz(path, todo=_rewrite_todo(path))
    missing = [k for k in ("image", "text", "caption_image") if k not in data]
    if missing:
        raise CrossViewError(f"{path}: missing {', '.join(missing)}; an embeddings file holds image, text and "
                             "caption_image arrays (see crossview.eval.embeddings)")
    info = {k: str(data[k]) for k in ("method", "dataset", "split") if k in data}
    try:
        emb = Embeddings(
            image=data["image"], text=data["text"], caption_image=data["caption_image"],
            image_t2i=data.get("image_t2i"), text_t2i=data.get("text_t2i"),
            image_labels=data.get("image_labels"), label_embeddings=data.get("label_embeddings"),
            label_relevance=None if "label_relevance" not in data else data["label_relevance"].astype(bool),
            captions=None if "captions" not in data else [str(c) for c in data["captions"]], info=info)
    except CrossViewError as e:
        raise CrossViewError(f"{path}: {e}") from e
    for key in ("image", "text", "image_t2i", "text_t2i", "label_embeddings"):
        a = getattr(emb, key)
        if a is None:
            continue
        if not np.issubdtype(a.dtype, np.number) or np.issubdtype(a.dtype, np.complexfloating):
            raise CrossViewError(f"{path}: {key} holds {a.dtype} values, not real numbers; "
                                 f"{_rewrite_todo(path)}")
        bad = _first_non_finite(a) if np.issubdtype(a.dtype, np.floating) else None
        if bad is not None:
            raise CrossViewError(f"{path}: {key} holds NaN or infinity (first at row {bad[0]}, column {bad[1]}), so "
                                 f"its scores and ranks are undefined; {_rewrite_todo(path)}")
    return emb


def _rewrite_todo(path: Path) -> str:
    """What to do about a damaged embeddings file: a run's own (its bank: made again when missing), or one given."""
    in_run = (path.parent / "config.json").is_file()
    if in_run and path.name.startswith("bank_"):
        return "delete it and the run encodes its training split into it again"
    if in_run:
        return "train the run again (its evaluation writes this file)"
    return "write it again from the model that made it (arrays only, as numpy.savez writes them)"


def embeddings_hubness(emb: Embeddings, k: int | None = None) -> dict[str, dict[str, Any] | None]:
    """``{"i2t": ..., "t2i": ...}``: :meth:`crossview.eval.hubness.Hubness.as_dict` of each direction (i2t:
    the images query the captions; t2i: the captions query the images, through the t2i model when there is
    one), or ``None`` for a direction whose gallery has fewer than 2 items."""
    out: dict[str, dict[str, Any] | None] = {}
    img_t2i = emb.image if emb.image_t2i is None else emb.image_t2i
    txt_t2i = emb.text if emb.text_t2i is None else emb.text_t2i
    for d, queries, gallery in (("i2t", emb.image, emb.text), ("t2i", txt_t2i, img_t2i)):
        if gallery.shape[0] < 2 or queries.shape[0] < 1:
            out[d] = None
        else:
            out[d] = hubness_of_embeddings(queries, gallery, k).as_dict()
    return out


def evaluate_embeddings(emb: Embeddings, protocol: str = "standard", ks: Sequence[int] = (1, 5, 10),
                        overlap: bool = False,
                        progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Metrics of ``emb`` under ``protocol`` (:data:`PROTOCOLS`); ``progress(stage, done, total)`` reports
    the caption overlap (minutes on a 25,000-caption test set).

    Returns a dict with ``"protocol"`` and, as the protocol gives them, ``"i2t"``/``"t2i"`` metric dicts,
    ``"rsum"``, ``"ranks"`` (per-query 1-based ranks), ``"labels"`` (P@K, mAP) and ``"overlap"``
    (BLEU-1..4, ROUGE-1/L of the top-5, when ``overlap`` and captions are present); every protocol but
    ``labels`` adds ``"hubness"`` (:func:`embeddings_hubness`, over the whole split).
    """
    if protocol not in PROTOCOLS:
        raise CrossViewError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    ks = tuple(int(k) for k in ks)
    out: dict[str, Any] = {"protocol": protocol, "n_images": int(emb.image.shape[0]),
                           "n_captions": int(emb.text.shape[0])}
    if protocol == "labels":
        if emb.label_embeddings is None:
            raise CrossViewError("protocol 'labels' needs label_embeddings and label_relevance in the "
                                 "embeddings (a model trained on labels, e.g. wsabie with labels)")
        s = np.asarray(emb.image, np.float32) @ np.asarray(emb.label_embeddings, np.float32).T
        out["labels"] = {**precision_at_k(s, emb.label_relevance, ks),
                         **mean_average_precision(s, emb.label_relevance)}
        return out
    if protocol == "identity":
        if emb.image_labels is None:
            raise CrossViewError("protocol 'identity' needs image_labels (identity / class ids) in the embeddings")
        s_i2t, s_t2i = _full_scores(emb)
        cap_labels = np.asarray(emb.image_labels)[emb.caption_image]
        a = identity_hits(s_i2t, emb.image_labels, cap_labels, ks)
        b = a if s_t2i is s_i2t else identity_hits(s_t2i, emb.image_labels, cap_labels, ks)
        out.update(i2t=a["i2t"], t2i=b["t2i"], ranks={"i2t": a["ranks"]["i2t"], "t2i": b["ranks"]["t2i"]},
                   hubness=embeddings_hubness(emb))
        return out
    n_folds = check_coco_size(protocol, emb.image.shape[0])
    two = emb.image_t2i is not None
    if protocol == "coco1k":
        # one fold's scores at a time, each formed block by block (never the 5K x 25K matrix)
        def fold(images: np.ndarray, caps: np.ndarray, fold_ci: np.ndarray) -> dict[str, Any]:
            sl = slice(int(images[0]), int(images[-1]) + 1)
            return evaluate_embeddings_blocked(
                emb.image[sl], emb.text[caps], fold_ci, ks, image_t2i=emb.image_t2i[sl] if two else None,
                text_t2i=emb.text_t2i[caps] if two else None)

        r = coco_1k_folds(fold, emb.caption_image, ks, n_folds=n_folds)
        out.update(i2t=r["i2t"], t2i=r["t2i"], rsum=_rsum(r["i2t"], r["t2i"]),
                   folds=[{"i2t": f["i2t"], "t2i": f["t2i"]} for f in r["folds"]],
                   hubness=embeddings_hubness(emb))
        return out
    # scores formed block by block: a 5K x 25K split never holds its whole score matrix
    # (the hubness from the same blocks: no further product)
    r = evaluate_embeddings_blocked(emb.image, emb.text, emb.caption_image, ks,
                                    image_t2i=emb.image_t2i if two else None, text_t2i=emb.text_t2i if two else None,
                                    hubness=True)
    out.update(i2t=r["i2t"], t2i=r["t2i"], rsum=_rsum(r["i2t"], r["t2i"]), ranks=r["ranks"], hubness=r["hubness"])
    if overlap:
        s_i2t, s_t2i = _full_scores(emb)
        if emb.captions is None:
            raise CrossViewError("caption overlap (BLEU / ROUGE) needs the caption texts in the embeddings file")
        from crossview.eval.overlap import caption_overlap_i2t, caption_overlap_t2i
        def stage(name: str) -> Callable[[int, int], None] | None:
            return None if progress is None else (lambda done, total: progress(name, done, total))
        out["overlap"] = {"i2t": caption_overlap_i2t(s_i2t, emb.caption_image, emb.captions,
                                                     progress=stage("caption overlap i2t")),
                          "t2i": caption_overlap_t2i(s_t2i, emb.caption_image, emb.captions,
                                                     progress=stage("caption overlap t2i"))}
    return out


def _full_scores(emb: Embeddings) -> tuple[np.ndarray, np.ndarray]:
    """``(i2t scores, t2i scores)``, each ``(n_images, n_captions) float32`` (the same array when one model)."""
    s_i2t = emb.scores("i2t")
    return s_i2t, (s_i2t if emb.image_t2i is None else emb.scores("t2i"))


def _rsum(i2t: dict[str, float], t2i: dict[str, float]) -> float | None:
    """rsum is always R@1 + R@5 + R@10 of both directions (whatever other K were asked for)."""
    if all(f"R@{k}" in d for k in (1, 5, 10) for d in (i2t, t2i)):
        return rsum_of(i2t, t2i, (1, 5, 10))
    return None


def format_report(res: dict[str, Any], title: str = "") -> str:
    """The metric table a person reads: one row per direction."""
    lines = [title] if title else []
    if "labels" in res:
        lab = res["labels"]
        cols = [k for k in lab if k.startswith("P@")] + ["mAP"]
        lines.append("  ".join(f"{c:>8}" for c in ["", *cols]))
        lines.append("  ".join([f"{'labels':>8}", *(f"{lab[c]:8.2f}" for c in cols)]))
        if lab.get("n_excluded"):
            lines.append(f"({lab['n_excluded']} queries without any relevant label are left out of mAP)")
        return "\n".join(lines)
    keys = list(res["i2t"])
    lines.append(f"{'':8}" + "".join(f"{k:>9}" for k in keys))
    for d in ("i2t", "t2i"):
        lines.append(f"{d:8}" + "".join(f"{res[d][k]:9.2f}" for k in keys))
    if res.get("rsum") is not None:
        lines.append(f"rsum {res['rsum']:.2f}   ({res['n_images']:,} images, {res['n_captions']:,} captions, "
                     f"protocol {res['protocol']})")
    hub = describe_hubness(res.get("hubness"))
    if hub:
        lines.append(hub)
    if "overlap" in res:
        for d in ("i2t", "t2i"):
            ov = res["overlap"][d]
            # BLEU comes 0-100 from sacrebleu, ROUGE 0-1 from rouge-score: both shown in percent
            lines.append(f"{d} top-5 overlap (%): " + ", ".join(
                f"{k} {v * (100 if k.startswith('ROUGE') else 1):.2f}" for k, v in ov.items() if isinstance(v, float)))
    return "\n".join(lines)
