"""Paper 003's ablations as one experiment: which parts of webly supervised training carry its gain?

Every variant is method ``webly`` on the same features and web set (``web``), once per seed, through the run
engine (:mod:`crossview.experiments.variants`: runs in one experiment folder, resumable, listed in the app;
R@K and rsum mean ± sd; a paired per-query test against the full method):

- ``full``: Stage I (``lambda1 L_IS + lambda2 L_IT``) then Stage II on the web set with the curriculum: the
  baseline every other variant is paired against;
- ``no-stage2``: Stage I only (``stage2_epochs=0``): does the web data help (the paper's claim)?
- ``no-curriculum``: Stage II over the whole web set from its first epoch (``curriculum=none``);
- ``no-lit``: no image-tag loss in Stage I (``lambda2=0``; Stage II still trains it);
- ``sentence-tags``: no tag branch: the sentence branch reads the tags as a string (``tag_branch=sentence``);
- ``sentence-only``: neither tags nor web data (``lambda2=0, stage2_epochs=0``): the VSE++ / VSE0 model alone,
  the paper's baseline rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from crossview.core.errors import CrossViewError
from crossview.core.events import Event
from crossview.experiments import variants as V

__all__ = ["VARIANTS", "DEFAULT_VARIANTS", "BASELINE", "STUDY", "study_for", "run_webly_ablation",
           "webly_ablation"]

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "full": ("webly", {}),
    "no-stage2": ("webly", {"stage2_epochs": 0}),
    "no-curriculum": ("webly", {"curriculum": "none"}),
    "no-lit": ("webly", {"lambda2": 0.0}),
    "sentence-tags": ("webly", {"tag_branch": "sentence"}),
    "sentence-only": ("webly", {"lambda2": 0.0, "stage2_epochs": 0}),
}
LABELS = {"full": "Stage I + Stage II with the curriculum", "no-stage2": "Stage I only",
          "no-curriculum": "Stage II without the curriculum", "no-lit": "no L_IT in Stage I",
          "sentence-tags": "tags through the sentence branch", "sentence-only": "no tags, no web data: VSE alone"}
DEFAULT_VARIANTS = tuple(VARIANTS)
BASELINE = "full"
STUDY = V.Study(kind="webly-ablation", title="Webly ablation (paper 003)", variants=VARIANTS, labels=LABELS,
                baseline=BASELINE, noun="variant", plural="variants", flag="--variants")


def study_for(web: str) -> V.Study:
    """The study with its web set (every variant's ``web``; ``demo`` for the demo's noisy web set)."""
    if not str(web or "").strip():
        raise CrossViewError("webly-ablation needs a web set: --web PATH (a webtags collection, e.g. one made by "
                             "'crossview data make-web D --out DIR') or --web demo")
    return STUDY.with_shared(web=str(web))


def run_webly_ablation(dataset: Any, *, web: str, variants: Sequence[str] = DEFAULT_VARIANTS,
                       **kwargs: Any) -> Iterator[Event]:
    """Train every variant with every seed and compare them with ``full`` (see the module docstring and
    :func:`crossview.experiments.variants.run_study` for the keyword arguments and the result)."""
    yield from V.run_study(study_for(web), dataset, variants=variants, **kwargs)


def webly_ablation(dataset: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_webly_ablation` drained; returns its result."""
    return V.drain(run_webly_ablation(dataset, **kwargs), "webly ablation")
