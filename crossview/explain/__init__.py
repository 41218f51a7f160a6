"""Why did a pair match: region maps over the image, word importances over the caption (no Qt).

``region_map(run, image, text) -> (H, W) array`` and ``word_importance(run, image, text)``; an
:class:`Explainer` keeps a run's backbone loaded and caches each pair; :func:`overlay` draws a map over its
image. See :mod:`crossview.explain.maps` for what is exact and what is first-order.
"""

from crossview.explain.maps import (Explainer, Explanation, RegionMap, WordImportance, caption_words,
                                    region_map, word_importance)
from crossview.explain.render import explain_figure, heat_colour, heat_rgba, overlay, word_colours

__all__ = ["Explainer", "Explanation", "RegionMap", "WordImportance", "caption_words", "region_map",
           "word_importance", "overlay", "explain_figure", "heat_colour", "heat_rgba", "word_colours"]
