"""The papers' experiments as functions (the ``crossview experiment ...`` commands call them).

- :mod:`crossview.experiments.bitr_table`: Experiment 1 of the BITR paper (paper 001, Tables 2 and 7):
  image <-> caption retrieval with CCA, WSABIE and BITR-M/E/C on one representation, plus Im2Text
  against an independent caption corpus.
- :mod:`crossview.experiments.loss_compare`: paper 004's loss comparison: the VSE++ model trained with the
  hardest-negative triplet loss, its sum-of-negatives form, SmoothAP and InfoNCE, seeds, a paired test per query.

Runners are plain generators of :mod:`crossview.core.events` (no Qt); the last event is a
``Finished`` whose ``summary`` is the result.
"""

from __future__ import annotations

__all__ = ["bitr_table", "loss_compare"]
