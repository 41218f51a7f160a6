"""Paper 003's ablations as one experiment: which parts of webly supervised training carry its gain, in a design
that can detect one.

Every variant is method ``webly`` on the same features, once per seed, through the run engine
(:mod:`crossview.experiments.variants`: runs in one experiment folder, resumable, listed in the app; R@K and rsum
mean ± sd; the paired effect against the full method with intervals and the minimal detectable difference):

- ``full``: Stage I (``lambda1 L_IS + lambda2 L_IT``) then Stage II on the web set with the curriculum: the
  baseline every other variant is paired against;
- ``no-stage2``: Stage I only (``stage2_epochs=0``): does the web data help (the paper's claim)?
- ``no-curriculum``: Stage II over the whole web set from its first epoch (``curriculum=none``);
- ``no-lit``: no image-tag loss in Stage I (``lambda2=0``; Stage II still trains it);
- ``sentence-tags``: no tag branch: the sentence branch reads the tags as a string (``tag_branch=sentence``);
- ``sentence-only``: neither tags nor web data (``lambda2=0, stage2_epochs=0``): the VSE++ / VSE0 model alone,
  the paper's baseline rows;
- a positive control (below), known to change the result, so that a clear difference there shows the design can
  detect a change of that size and a null result elsewhere means something.

**Held-out concepts** (the default when no web set is given, e.g. on the Flickr8k sample): paper 003's web images
bring concepts the clean captions lack. Here a few frequent nouns of the training captions (``concepts``, or the
``n_concepts`` most frequent nouns each named by at most ``MAX_SHARE`` of the training images and by at least
``MIN_EVAL`` evaluation images) are *held out*: every training image whose captions name one leaves the clean
training set (split ``train-clean``) and becomes the web set, with the nouns and verbs of its captions as noisy tags
(:func:`crossview.features.web_set.make_web_set`: a fifth dropped, a fifth as many wrong ones added). Stage I never
sees those concepts; Stage II is where they can come in. Stage II gets a budget comparable to Stage I's (about as
many optimiser steps). The positive control ``oracle`` trains Stage I on every training image with its real
captions (the held-out images labelled): the gain that labelled data of the concepts brings. Besides all the
queries, the table compares the variants on the evaluation images whose captions name a held-out concept (and
their captions).

**A given web set** (``web=PATH`` or ``demo``): the ablations as before on all the training images, and the positive
control ``half-train``: ``full`` trained on a seeded half of the clean training images (a known loss).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.events import Event, Log
from crossview.experiments import variants as V

__all__ = ["VARIANTS", "DEFAULT_VARIANTS", "BASELINE", "STUDY", "study_for", "run_webly_ablation",
           "webly_ablation", "HeldOut", "held_out_design", "caption_nouns", "MAX_SHARE", "MIN_EVAL"]

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "full": ("webly", {}),
    "no-stage2": ("webly", {"stage2_epochs": 0}),
    "no-curriculum": ("webly", {"curriculum": "none"}),
    "no-lit": ("webly", {"lambda2": 0.0}),
    "sentence-tags": ("webly", {"tag_branch": "sentence"}),
    "sentence-only": ("webly", {"lambda2": 0.0, "stage2_epochs": 0}),
    "oracle": ("webly", {"stage2_epochs": 0}),
    "half-train": ("webly", {}),
}
LABELS = {"full": "Stage I + Stage II with the curriculum", "no-stage2": "Stage I only",
          "no-curriculum": "Stage II without the curriculum", "no-lit": "no L_IT in Stage I",
          "sentence-tags": "tags through the sentence branch", "sentence-only": "no tags, no web data: VSE alone",
          "oracle": "Stage I on every training image with its captions (the held-out concepts labelled)",
          "half-train": "full on half the clean training images"}
DEFAULT_VARIANTS = ("full", "no-stage2", "no-curriculum", "no-lit", "sentence-tags", "sentence-only")
BASELINE = "full"
#: variants that run Stage II (their Stage II budget is matched to Stage I in the held-out design)
STAGE2 = ("full", "no-curriculum", "no-lit", "sentence-tags", "half-train")
#: a held-out concept is named by at most this share of the training images (so most of them stay clean)
MAX_SHARE = 0.12
#: ... and by at least this many evaluation images (so the restricted comparison has queries)
MIN_EVAL = 5
STUDY = V.Study(kind="webly-ablation", title="Webly ablation (paper 003)", variants=VARIANTS, labels=LABELS,
                baseline=BASELINE, noun="variant", plural="variants", flag="--variants")


def study_for(web: str) -> V.Study:
    """The study with its web set (every variant's ``web``; ``demo`` for the demo's noisy web set)."""
    if not str(web or "").strip():
        raise CrossViewError("webly-ablation needs a web set: --web PATH (a webtags collection, e.g. one made by "
                             "'crossview data make-web D --out DIR') or --web demo, or the held-out-concepts design "
                             "(--held-out auto)")
    return STUDY.with_shared(web=str(web))


# ====================================================================== held-out concepts
def caption_nouns(caption: str) -> set[str]:
    """The lemmatised common nouns of a caption (Penn tags NN / NNS; :mod:`crossview.features.tags`)."""
    from crossview.features.tags import lemmatize, pos_tag

    return {lemmatize(w, "NOUN") for w, t in pos_tag(caption) if t in ("NN", "NNS") and w.isalpha() and len(w) > 1}


@dataclass
class HeldOut:
    """The held-out-concepts design: ``concepts``; the clean training images (``clean``), the training images that
    name a concept (``web``: the web set's images) and the evaluation images that name one (``eval_images``),
    dataset indices; ``counts``: concept -> (training images, evaluation images) naming it."""

    concepts: list[str]
    clean: np.ndarray
    web: np.ndarray
    eval_images: np.ndarray
    counts: dict[str, tuple[int, int]]

    def describe(self, eval_split: str) -> str:
        parts = ", ".join(f"{c} ({a} train / {b} {eval_split} images)" for c, (a, b) in self.counts.items())
        return (f"held-out concepts: {parts}; {len(self.web)} training images name one and become the web set "
                f"(noisy tags), {len(self.clean)} stay clean; {len(self.eval_images)} {eval_split} images name one")


def _nouns_by_image(dataset: Any, images: np.ndarray) -> dict[int, set[str]]:
    want = set(int(i) for i in images)
    out: dict[int, set[str]] = {int(i): set() for i in images}
    for c, i in enumerate(np.asarray(dataset.caption_image).tolist()):
        if i in want:
            out[i] |= caption_nouns(dataset.captions[c])
    return out


def held_out_design(dataset: Any, eval_split: str, concepts: str | Sequence[str] | None = "auto", *,
                    n_concepts: int = 3, train_split: str = "train") -> HeldOut:
    """The :class:`HeldOut` design of ``dataset`` (see the module docstring): ``concepts`` named, or ``"auto"``: the
    ``n_concepts`` most frequent nouns of the training captions that name at most :data:`MAX_SHARE` of the
    training images and at least :data:`MIN_EVAL` ``eval_split`` images."""
    for name in (train_split, eval_split):
        if name not in dataset.splits:
            raise CrossViewError(f"dataset {dataset.name!r} has no split {name!r} for the held-out design")
    if not getattr(dataset, "image_paths", None):
        raise CrossViewError(f"dataset {dataset.name!r} has no image files; the held-out design's web set lists "
                             "images, so it needs a dataset of image files (or give --web)")
    train = np.asarray(dataset.splits[train_split], dtype=np.int64)
    evals = np.asarray(dataset.splits[eval_split], dtype=np.int64)
    tr_nouns, ev_nouns = _nouns_by_image(dataset, train), _nouns_by_image(dataset, evals)
    tr_count = Counter(n for s in tr_nouns.values() for n in s)
    ev_count = Counter(n for s in ev_nouns.values() for n in s)
    if concepts is None or (isinstance(concepts, str) and concepts.strip().lower() == "auto"):
        k = int(n_concepts)
        if k < 1:
            raise CrossViewError(f"--n-concepts must be >= 1, got {n_concepts}")
        ok = [c for c, n in sorted(tr_count.items(), key=lambda cn: (-cn[1], cn[0]))
              if n <= MAX_SHARE * len(train) and ev_count[c] >= MIN_EVAL]
        chosen = ok[:k]
        if len(chosen) < k:
            raise CrossViewError(f"dataset {dataset.name!r}: only {len(chosen)} nouns name at most "
                                 f"{MAX_SHARE:.0%} of the training images and {MIN_EVAL}+ {eval_split} images; "
                                 "name the concepts with --held-out a,b,c or lower --n-concepts")
    else:
        items = concepts.split(",") if isinstance(concepts, str) else list(concepts)
        chosen = [str(c).strip().lower() for c in items if str(c).strip()]
        if not chosen:
            raise CrossViewError("--held-out: give concepts (nouns of the captions, e.g. dog,ball) or auto")
        missing = [c for c in chosen if tr_count[c] == 0]
        if missing:
            raise CrossViewError(f"--held-out: no training caption of {dataset.name!r} names {', '.join(missing)} "
                                 "(as a noun); choose nouns its captions use")
    held = set(chosen)
    web = np.array([i for i in train.tolist() if tr_nouns[i] & held], dtype=np.int64)
    clean = np.setdiff1d(train, web)
    ev = np.array([i for i in evals.tolist() if ev_nouns[i] & held], dtype=np.int64)
    if len(clean) < 10 or len(web) < 2:
        raise CrossViewError(f"--held-out {','.join(chosen)}: {len(web)} training images name them and "
                             f"{len(clean)} do not; choose concepts that leave both sides at least a few images")
    return HeldOut(chosen, clean, web, ev, {c: (int(tr_count[c]), int(ev_count[c])) for c in chosen})


def _stage2_epochs(dataset: Any, clean: np.ndarray, n_web: int, params: dict[str, Any]) -> int:
    """Stage II epochs giving about as many optimiser steps as Stage I on the clean images (batches of
    ``batch_size`` captions in Stage I, of ``batch_size`` web images in Stage II)."""
    from crossview.methods import method_class

    d = {**method_class("webly").default_params(), **params}
    bs, epochs = int(d["batch_size"]), int(d["max_epochs"])
    n_caps = int(np.isin(np.asarray(dataset.caption_image), clean).sum())
    stage1 = epochs * math.ceil(n_caps / bs)
    return max(1, round(stage1 / math.ceil(n_web / bs)))


def run_webly_ablation(dataset: Any, *, web: str | None = None, held_out: str | Sequence[str] | None = None,
                       n_concepts: int = 3, variants: Sequence[str] | None = None, split: str | None = None,
                       params: dict[str, dict[str, Any]] | None = None, seed: int = 0,
                       **kwargs: Any) -> Iterator[Event]:
    """Train every variant with every seed and compare them with ``full`` (see the module docstring and
    :func:`crossview.experiments.variants.run_study` for the keyword arguments and the result). ``web``: a given
    web set; otherwise the held-out-concepts design (``held_out``: ``"auto"`` or the concepts)."""
    given = {k: dict(v) for k, v in (params or {}).items()}
    splits = getattr(dataset, "splits", {}) or {}
    eval_split = split or ("test" if "test" in splits else "val" if "val" in splits else None)
    if eval_split is None:
        raise CrossViewError(f"dataset {dataset.name!r} has neither a test nor a val split to compare on; give --split")
    if web:
        if held_out not in (None, ""):
            raise CrossViewError("give either --web (a web set) or --held-out (the held-out-concepts design), not both")
        names = list(variants or (*DEFAULT_VARIANTS, "half-train"))
        train = np.asarray(splits.get("train", []), dtype=np.int64)
        half = np.sort(np.random.default_rng(seed).choice(train, size=len(train) // 2, replace=False))
        study = replace(study_for(web), controls=("half-train",))
        yield from V.run_study(study, dataset, variants=names, split=eval_split, params=given,
                               train_splits={"half-train": "train-half"}, derived_splits={"train-half": half},
                               notes=[f"half-train trains on a seeded half ({len(half)}) of the {len(train)} "
                                      "training images: a known loss the design should detect."], **kwargs)
        return
    design = held_out_design(dataset, eval_split, held_out or "auto", n_concepts=n_concepts)
    names = list(variants or (*DEFAULT_VARIANTS, "oracle"))
    names = [n for n in names if n != "half-train"] if variants is None else names
    common = given.get("*", {})
    for n in STAGE2:
        if n in names and "stage2_epochs" not in {**common, **given.get(n, {})}:
            coerced = {k: V._coerce("webly", k, v) for k, v in {**common, **given.get(n, {})}.items()}
            given.setdefault(n, {})["stage2_epochs"] = _stage2_epochs(dataset, design.clean, len(design.web), coerced)

    def prepare(folder: Path) -> Iterator[Event]:
        """The web set (the held-out images with noisy tags) in the experiment folder, once."""
        from crossview.engine.splits import apply_derived_splits
        from crossview.features.web_set import make_web_set

        if (folder / "web" / "tags.jsonl").is_file():
            return
        yield Log(f"writing the web set of the held-out images: {folder / 'web'}")
        make_web_set(apply_derived_splits(dataset, {"heldout-web": design.web.tolist()}), folder / "web",
                     split="heldout-web", seed=seed)

    from crossview.experiments._common import new_experiment_dir

    folder = Path(kwargs.pop("out", None) or new_experiment_dir(STUDY.kind, dataset.name))
    derived = {"train-clean": design.clean.tolist(), "heldout-web": design.web.tolist()}
    study = replace(STUDY.with_shared(web=str((folder / "web").resolve())), controls=("oracle",))
    yield Log(design.describe(eval_split))
    yield from V.run_study(study, dataset, variants=names, split=eval_split, params=given,
                           train_splits={n: "train" if n == "oracle" else "train-clean" for n in names},
                           derived_splits=derived, prepare=prepare, prepared_params=("web",), out=folder,
                           subsets={f"queries that name a held-out concept ({', '.join(design.concepts)})":
                                    design.eval_images},
                           notes=[design.describe(eval_split) + "; Stage II's epochs are set to about as many "
                                  "optimiser steps as Stage I's (see the steps column)."], **kwargs)


def webly_ablation(dataset: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_webly_ablation` drained; returns its result."""
    return V.drain(run_webly_ablation(dataset, **kwargs), "webly ablation")
