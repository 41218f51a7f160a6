"""Evaluation: ranks and metrics, protocols (COCO 5K/1K, identity, P@K/mAP), caption overlap, and the paired
effect of two variants on the same queries (:func:`paired_effect`: seeds averaged per query, bootstrap over images).

Pure numpy (plus sacrebleu / rouge-score, imported only when caption overlap is computed).
See :mod:`crossview.eval.metrics` for the rank definitions and the tie rule.
"""

from crossview.eval.metrics import (
    evaluate,
    i2t_ranks,
    rank_metrics,
    recall_at_k,
    rsum_of,
    t2i_ranks,
    top_k,
)
from crossview.eval.overlap import caption_overlap, caption_overlap_i2t, caption_overlap_t2i
from crossview.eval.paired import paired_effect
from crossview.eval.protocols import (
    coco_1k,
    coco_5k,
    identity_hits,
    mean_average_precision,
    precision_at_k,
    relevance_from_label_sets,
)

__all__ = [
    "evaluate",
    "i2t_ranks",
    "t2i_ranks",
    "rank_metrics",
    "recall_at_k",
    "rsum_of",
    "top_k",
    "coco_5k",
    "coco_1k",
    "identity_hits",
    "precision_at_k",
    "mean_average_precision",
    "relevance_from_label_sets",
    "caption_overlap",
    "caption_overlap_i2t",
    "caption_overlap_t2i",
    "paired_effect",
]
