"""Paper 002's ablations as one experiment: what do TIMAM's parts add?

Every variant is method ``timam`` on the same features, once per seed, through the run engine
(:mod:`crossview.experiments.variants`: runs in one experiment folder, resumable, listed in the app; R@K and rsum
mean ± sd; a paired per-query test against the full method):

- ``full``: TIMAM with its defaults (identification + CMPM + the modality discriminator): the baseline every
  other variant is paired against;
- ``no-discriminator``: no adversarial game (``adv_weight=0``): the paper's claim is that the discriminator helps
  (~3 R@1 on CUHK-PEDES, ~1.8 on Flickr30K, supplementary);
- ``no-identification``: no identification losses (``id_weight=0``): CMPM (and the discriminator) alone;
- ``swapped-target``: the encoders' adversarial loss with each modality labelled as the other (the
  non-saturating GAN loss, ``adv_target="swapped"``) instead of the default confusion target (both 0.5);
- ``lm-frozen``: the paper's text side, a Bi-LSTM over the language model's token states (``text_model=bilstm``
  at its lr 2e-4) instead of the default caption features -> FC, the language model frozen throughout
  (``finetune_epochs=0``);
- ``lm-finetuned``: the same with a second phase fine-tuning the language model's top layers
  (``finetune_epochs=5``).

A variant whose settings are the method's defaults is ``full`` itself and is left out of the default list.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from crossview.core.events import Event
from crossview.experiments import variants as V

__all__ = ["VARIANTS", "default_variants", "BASELINE", "STUDY", "run_timam_ablation", "timam_ablation"]

#: epochs of the second phase in the lm-finetuned variant
FINETUNE_EPOCHS = 5
#: the paper's text side, which the lm-* variants train: the Bi-LSTM over the language model's token states at the
#: learning rate chosen for it (bench/results/timam_cv_flickr8k.md); the default is caption features -> FC
BILSTM = {"text_model": "bilstm", "lr": 2e-4}

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "full": ("timam", {}),
    "no-discriminator": ("timam", {"adv_weight": 0.0}),
    "no-identification": ("timam", {"id_weight": 0.0}),
    "swapped-target": ("timam", {"adv_target": "swapped"}),
    "lm-frozen": ("timam", {**BILSTM, "finetune_epochs": 0}),
    "lm-finetuned": ("timam", {**BILSTM, "finetune_epochs": FINETUNE_EPOCHS}),
}
LABELS = {"full": "identification + CMPM + discriminator", "no-discriminator": "no modality discriminator",
          "no-identification": "no identification losses",
          "swapped-target": "encoders aim D at the other modality's label (non-saturating GAN loss)",
          "lm-frozen": "the paper's Bi-LSTM over the language model, frozen throughout",
          "lm-finetuned": f"the paper's Bi-LSTM, the language model's top layers fine-tuned ({FINETUNE_EPOCHS} epochs)"}
BASELINE = "full"


def default_variants() -> tuple[str, ...]:
    """Every variant but those whose settings are the method's defaults already (imports the method: call it
    late)."""
    from crossview.methods import method_class

    defaults = method_class("timam").default_params()
    return tuple(v for v, (_, params) in VARIANTS.items()
                 if v == BASELINE or any(defaults.get(k) != val for k, val in params.items()))


#: what paper 002 reports for the ablated discriminator (its supplementary: "improvements of ~3% on CUHK-PEDES and
#: ~1.8% on Flickr30K when the adversarial discriminator is used"; text-to-image R@1 is the paper's headline metric)
EXPECTED = {"no-discriminator": {"metric": "t2i R@1", "value": -1.8,
                                 "source": "paper 002 (supplementary, Flickr30K: ~1.8 R@1 from the discriminator)"}}
STUDY = V.Study(kind="timam-ablation", title="TIMAM ablation (paper 002)", variants=VARIANTS, labels=LABELS,
                baseline=BASELINE, noun="variant", plural="variants", flag="--variants", expected=EXPECTED)


def run_timam_ablation(dataset: Any, *, variants: Sequence[str] | None = None, **kwargs: Any) -> Iterator[Event]:
    """Train every variant (default: :func:`default_variants`) with every seed and compare them with ``full`` (see
    the module docstring and :func:`crossview.experiments.variants.run_study` for the keyword arguments and the
    result)."""
    yield from V.run_study(STUDY, dataset, variants=list(variants or default_variants()), **kwargs)


def timam_ablation(dataset: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_timam_ablation` drained; returns its result."""
    return V.drain(run_timam_ablation(dataset, **kwargs), "timam ablation")
