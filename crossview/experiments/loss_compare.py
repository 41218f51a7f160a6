"""Paper 004's question as one experiment: does the hardest-negative triplet loss still win for image-caption
retrieval against the losses of metric learning?

Each loss trains the same VSE++ model (same encoders, same features) through the run engine, once per seed:

- ``vsepp``: the triplet loss with the hardest negative (method ``vsepp``, ``loss=vsepp``): the baseline;
- ``vse0``: the triplet loss summed over all negatives (``vsepp``, ``loss=vse0``);
- ``smoothap``: SmoothAP (method ``smoothap``, ``loss=smoothap``);
- ``infonce``: InfoNCE / NT-Xent (``smoothap``, ``loss=infonce``);
- ``smoothap-paper``: SmoothAP at paper 004's temperature, tau = 0.01 (not chosen).

**A fair comparison** (paper 004 compares its losses under one protocol): every loss gets the same
:class:`~crossview.experiments.budget.Budget` (``budget``, default :data:`DEFAULT_BUDGET`: the same epochs,
batches of the same number of captions, hence the same optimiser steps, and the learning rate / 10 at the same
point), and each loss's own setting (the triplet's margin, SmoothAP's tau, InfoNCE's temperature:
:data:`TUNED`) is chosen before its runs by rsum under cross-validation of the training images (or on val when
the comparison reports on test), never on the split the table reports. ``budget="defaults"`` and
``choose=False`` give the methods' own defaults instead.

Every (loss, seed) is an ordinary run folder ``<loss>-seed<N>`` under one experiment folder (with an
``experiment.json``; the choosing trials in ``choose-<loss>/``), so the app's runs list shows them and its
Inspect panel compares any two; running the experiment again on the same folder reads finished runs back and
resumes unfinished ones.

The evaluation split is the dataset's ``test`` split (``val`` then chooses each run's epoch), else ``val``
(nothing then chooses the epoch: the last one is kept, as ``crossview train`` does). The result: R@1/5/10 both
ways, rsum and the optimiser steps, mean and standard deviation over the seeds, and the paired effect of each
loss against the baseline (:func:`crossview.eval.paired.paired_effect`: seeds averaged per query, a bootstrap
over the evaluated images, intervals, the minimal detectable difference).

:func:`run_loss_compare` is a generator of :mod:`crossview.core.events` whose last event is
``Finished(summary=result)``; :func:`loss_compare` drains it; :func:`format_table` and :func:`format_markdown`
lay the result out. The machinery is :mod:`crossview.experiments.variants` (shared with the ablations); this module
names the losses.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from crossview.core.events import Event, Finished
from crossview.experiments import variants as V
from crossview.experiments._common import new_experiment_dir
from crossview.experiments.variants import EXPERIMENT_FILE, KS, paired

__all__ = ["LOSSES", "DEFAULT_LOSSES", "BASELINE", "TUNED", "DEFAULT_BUDGET", "EXPERIMENT_FILE", "STUDY", "parse_losses", "parse_loss_params",
           "loss_params", "paired", "run_loss_compare", "loss_compare", "format_table", "format_markdown",
           "default_experiment_dir", "KS"]

#: loss name -> (registered method, the parameters that select the loss)
LOSSES: dict[str, tuple[str, dict[str, Any]]] = {
    "vsepp": ("vsepp", {"loss": "vsepp"}), "vse0": ("vsepp", {"loss": "vse0"}),
    "smoothap": ("smoothap", {"loss": "smoothap"}), "infonce": ("smoothap", {"loss": "infonce"}),
    "smoothap-paper": ("smoothap", {"loss": "smoothap", "tau": 0.01})}
LABELS = {"vsepp": "triplet, hardest negative: VSE++", "vse0": "triplet, sum of negatives: VSE0",
          "smoothap": "SmoothAP", "infonce": "InfoNCE / NT-Xent",
          "smoothap-paper": "SmoothAP at paper 004's tau 0.01"}
DEFAULT_LOSSES = ("vsepp", "vse0", "smoothap", "infonce", "smoothap-paper")
BASELINE = "vsepp"
#: each loss's own setting, chosen before its runs (never on the reported split)
TUNED: dict[str, dict[str, list[Any]]] = {
    "vsepp": {"margin": [0.1, 0.2, 0.4]}, "vse0": {"margin": [0.1, 0.2, 0.4]},
    "smoothap": {"tau": [0.01, 0.03, 0.1, 0.3]}, "infonce": {"temperature": [0.03, 0.05, 0.1, 0.2]}}
#: every loss's budget unless ``budget`` says otherwise: 20 epochs of 128-caption batches, lr / 10 after 14
DEFAULT_BUDGET = "20x128"
STUDY = V.Study(kind="loss-compare", title="Loss comparison (paper 004)", variants=LOSSES, labels=LABELS,
                baseline=BASELINE, noun="loss", plural="losses", flag="--losses", varied=("loss",), tuned=TUNED)


def parse_losses(value: str | Sequence[str]) -> list[str]:
    """``"vsepp,smoothap"`` -> ``["vsepp", "smoothap"]`` (checked, duplicates dropped, order kept)."""
    return V.parse_variants(STUDY, value)


def parse_loss_params(items: Sequence[str] | None, losses: Sequence[str]) -> dict[str, dict[str, str]]:
    """``["smoothap.tau=0.01", "embed_dim=512"]`` -> ``{"smoothap": {"tau": "0.01"}, "*": {"embed_dim": "512"}}``
    (``LOSS.NAME=VALUE`` for one loss, ``NAME=VALUE`` for every loss)."""
    return V.parse_variant_params(STUDY, items, losses)


def loss_params(loss: str, given: dict[str, dict[str, Any]] | None, epochs: int | None) -> dict[str, Any]:
    """The parameters of ``loss``'s runs (:func:`crossview.experiments.variants.variant_params`)."""
    return V.variant_params(STUDY, loss, given, epochs)


def default_experiment_dir(dataset_name: str) -> Path:
    """``<runs folder>/loss-compare-<dataset>-<timestamp>`` (a new name)."""
    return new_experiment_dir("loss-compare", dataset_name)


def run_loss_compare(dataset: Any, *, losses: Sequence[str] = DEFAULT_LOSSES, budget: Any = DEFAULT_BUDGET,
                     **kwargs: Any) -> Iterator[Event]:
    """Train every loss with every seed and compare them (:func:`crossview.experiments.variants.run_study`, with
    ``budget`` for every loss; the result also names the losses under ``"losses"``)."""
    if kwargs.get("epochs") is not None and budget == DEFAULT_BUDGET:
        budget = None                     # --epochs asks for the methods' own schedules, scaled
    for ev in V.run_study(STUDY, dataset, variants=losses, budget=budget, **kwargs):
        if isinstance(ev, Finished):
            ev = Finished(summary={**ev.summary, "losses": ev.summary["variants"]})
        yield ev


def loss_compare(dataset: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_loss_compare` drained; returns its result."""
    return V.drain(run_loss_compare(dataset, **kwargs), "loss comparison")


def format_table(result: dict[str, Any]) -> str:
    """The result as plain text: the metric table, then the paired comparison against the baseline."""
    return V.format_table(STUDY, result)


def format_markdown(result: dict[str, Any], command: str | None = None) -> str:
    """The result as a Markdown report (with the command that made it)."""
    return V.format_markdown(STUDY, result, command)
