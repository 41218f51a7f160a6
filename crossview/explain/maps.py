"""Why did a pair match? Region maps over the image and word importances over the caption (issue 18).

**Region maps.** Every image side here starts from a backbone's pooled feature ``f = mean_p f_p``, the
average of its last conv map over the ``h x w`` positions ``p`` (ResNet, MobileNet-V2, EfficientNet-Lite0),
and goes through steps that are affine (a representation's PCA, centring and whitening, CCA's and BITR's
projections, WSABIE's ``V``, the deep methods' FC layer and BatchNorm in eval mode), elementwise (the signed
square root) or divide the row by a scalar (every L2 normalisation). Score ``s(f) = u(f) . v`` against the
caption's embedding ``v``.

- Hold each row scale at the value it takes for the whole image (:mod:`crossview.core.rownorm`), and the
  signed square root's per-channel scale likewise (``sign(x) sqrt|x| = x / sqrt|x|``, the divisor held at
  the whole image's). What is left is affine, so ``s(mean_p f_p) = mean_p s(f_p)``: the map ``m_p = s(f_p)``,
  each position's feature sent through the run's pipeline at the image's scales, averages **exactly** to the
  score (mode ``"exact"``). One forward pass of the backbone, no gradients. This holds for CCA, WSABIE,
  BITR, and VSE0 / VSE++ / SmoothAP / webly / TIMAM on precomputed features, with every feature
  normalisation (``none``, ``l2``, ``ssr``, ``center``, ``whiten``).
- With the scales held, a normalised score is read at the image's own scale: a region's share is what it
  adds *given* the rest of the image. That is the exact split of the score; what it does not say is how the
  score would change if the region were cut out (the norm would change too): that is a first-order question.
- Where the pipeline has an elementwise step that is not held (an MLP's ReLU), the map is the linearisation
  at the pooled feature, ``m_p = s(f) + grad s(f) . (f_p - f)`` (central differences along each ``f_p - f``;
  mode ``"first-order"``). It still averages to the score, by construction, but only to first order is it
  each position's score. (For the signed square root the two agree up to an affine change of the cells: the
  held-scale slope is twice the derivative, so the peak is the same.)
- Which of the two holds is checked numerically on every map (``mean_p s(f_p)`` against ``s(f)``), not assumed.
- End-to-end runs (``image_model=cnn``, the CNN fine-tuned or not) are read the same way at their *own* CNN's
  last conv map: the pooling, FC and L2 after it are the pipeline, so the split is exact there too, for the
  fine-tuned features. (Grad-CAM, the usual tool for fine-tuned CNNs, weights channels by their average
  gradient and clips negatives: it does not add up to the score, and it is not needed where the head is an
  average followed by affine steps.)
- Not covered (a clear error says so): VGG-19 (its fc7 is not an average of its conv map; that is where a
  Grad-CAM would be needed), precomputed image features (no map to read) and TR / CTR representations (visual
  words of local descriptors).

**Word importance.** The caption's words are its whitespace-separated tokens. For encoders whose feature is a
sum over words before the row scale (bag of words, TF-IDF, mean GloVe vectors) the same held-scale split is
exact: each word's contribution ``s(word) - s(empty)`` sums with the others to ``s(caption) - s(empty)``
(mode ``"exact"``, checked numerically). LDA topics split the same way through the words' topic
responsibilities (``gamma = alpha + sum_w n_w phi_w``; :meth:`LdaEncoder._held_parts`). Otherwise (MiniLM, a
local BERT, binary or sublinear counts of a repeated word, the deep methods' own text encoders) the
importance of a word is the drop in score when it is removed (mode ``"deletion"``), all variants scored in one
batched pass.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.rownorm import frozen_row_norms

__all__ = ["RegionMap", "WordImportance", "Explanation", "Explainer", "region_map", "word_importance",
           "caption_words"]

#: a batch for the held-scale passes: the whole row first, then at most this many parts (every normalisation
#: in the pipeline must see the whole row as its first row, so no method may split the batch)
_PARTS_PER_BATCH = 31
#: relative tolerance of the exactness checks: exact float32 pipelines land near 1e-7, an unheld signed
#: square root at 1e-2 and more (measured on the demo)
_EXACT_RTOL = 1e-5
#: step of the central differences (a fraction of each ``f_p - f``) for the first-order map
_FD_STEP = 1e-2
#: pairs, conv maps and sentence embeddings an :class:`Explainer` keeps (the least recently used go first)
_CACHE_SIZE = 512


@dataclass
class RegionMap:
    """Per-position contributions to one pair's score.

    Attributes:
        values: ``(h, w) float32`` over the backbone's last conv map; ``values.mean() == score`` (exact or
            first-order, see :attr:`mode`).
        score: the pair's score as the run computes it from this image file.
        mode: ``"exact"`` (each cell is its position's own score at the image's row scales) or
            ``"first-order"`` (the linearisation at the pooled feature).
        crop_box: ``(left, top, right, bottom)`` in the original image's pixels: the centre crop the backbone
            saw, which the map covers.
        image_size: ``(width, height)`` of the original image.
        residual: ``|mean(per-position scores) - score|``, the exactness check's measure.
        direction: ``"i2t"`` or ``"t2i"`` (BITR has a model per direction; the others score both alike).
    """

    values: np.ndarray
    score: float
    mode: str
    crop_box: tuple[float, float, float, float]
    image_size: tuple[int, int]
    residual: float
    direction: str = "i2t"

    @property
    def peak(self) -> tuple[int, int]:
        """``(row, col)`` of the cell with the largest contribution."""
        r, c = np.unravel_index(int(np.argmax(self.values)), self.values.shape)
        return int(r), int(c)

    def cell_box(self, row: int, col: int) -> tuple[float, float, float, float]:
        """The original-image pixel box ``(left, top, right, bottom)`` of cell ``(row, col)``."""
        h, w = self.values.shape
        l, t, r, b = self.crop_box
        cw, ch = (r - l) / w, (b - t) / h
        return l + col * cw, t + row * ch, l + (col + 1) * cw, t + (row + 1) * ch


@dataclass
class WordImportance:
    """How much each word of the caption adds to the pair's score.

    Attributes:
        words: the caption's whitespace-separated words, in order.
        values: ``(n_words,) float32``: the contribution (``"exact"``: they sum to ``score - baseline``) or
            the drop in score when the word is removed (``"deletion"``).
        score: the pair's score.
        mode: ``"exact"`` or ``"deletion"``.
        baseline: the empty caption's score at the caption's row scales (``"exact"`` only).
    """

    words: list[str]
    values: np.ndarray
    score: float
    mode: str
    baseline: float | None = None

    def ranked(self) -> list[tuple[str, float]]:
        """``(word, value)`` pairs, most important first."""
        order = np.argsort(-self.values, kind="stable")
        return [(self.words[i], float(self.values[i])) for i in order]


@dataclass
class Explanation:
    """Both views of one pair (what the app shows); ``region`` is None where the run has no map to read, and
    ``region_error`` then says why."""

    region: RegionMap | None
    words: WordImportance
    region_error: str = ""
    image_path: str = ""
    text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def caption_words(text: str) -> list[str]:
    """The words a caption is explained by: its whitespace-separated tokens."""
    return str(text).split()


class _LRU(OrderedDict):
    """A dict that forgets its least recently used entries beyond ``size``."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class Explainer:
    """Explanations for the pairs of one opened run (:class:`crossview.engine.session.OpenRun`, or anything
    with its ``method``, ``features`` and ``dataset``, e.g. a Retriever), with the backbone loaded once, and
    each pair, each image's conv map and each sentence's embedding cached (the app asks again as the user
    pages through; the least recently used go beyond :data:`_CACHE_SIZE`). One thread at a time: a lock
    serialises the public calls."""

    def __init__(self, run: Any, device: str = "cpu") -> None:
        self.run = run
        self.device = device
        self.method = run.method
        self.features = run.features
        self.dataset = run.dataset
        self._encoder: Any = None
        self._lock = threading.RLock()
        self._cache: _LRU = _LRU(_CACHE_SIZE)
        self._local: _LRU = _LRU(_CACHE_SIZE)
        self._sentences: _LRU = _LRU(_CACHE_SIZE)

    # ------------------------------------------------------------------ inputs
    def image_path(self, image: int | str | Path) -> str:
        """The file of ``image`` (a dataset image index or a path)."""
        if isinstance(image, (int, np.integer)):
            i = int(image)
            if not 0 <= i < self.dataset.n_images:
                raise CrossViewError(f"image {i} is not in dataset {self.dataset.name!r} ({self.dataset.n_images} images)")
            paths = getattr(self.dataset, "image_paths", None)
            if paths is None:
                raise CrossViewError(f"dataset {self.dataset.name!r} has precomputed image features only, so there "
                                     "is no image to draw a region map on")
            return str(paths[i])
        p = Path(image)
        if not p.is_file():
            raise CrossViewError(f"{p}: no such image file")
        return str(p)

    def text_of(self, text: str | int) -> str:
        if isinstance(text, (int, np.integer)):
            c = int(text)
            if not 0 <= c < self.dataset.n_captions:
                raise CrossViewError(f"caption {c} is not in dataset {self.dataset.name!r}")
            return str(self.dataset.captions[c])
        sentence = str(text).strip()
        if not sentence:
            raise CrossViewError("give a caption to explain (--text \"a dog runs on the grass\")")
        return sentence

    # ------------------------------------------------------------------ the run's pipelines
    def _own_backbone(self) -> tuple[Any, Any, Any, str] | None:
        """An end-to-end model's own CNN (:meth:`~crossview.methods.vsepp.Vsepp.explain_backbone`), or None."""
        if not getattr(self.method, "wants_image_files", False):
            return None
        get = getattr(self.method, "explain_backbone", None)
        parts = get() if callable(get) else None
        if parts is None:
            raise CrossViewError(f"this run's {self.method.name} model encodes the image files itself and does not "
                                 "say where its conv map is, so it has no region map")
        return parts

    def _image_encoder(self) -> Any:
        """The run's frozen image encoder (what made its feature rows), checked to give an exact pooled map."""
        if self._encoder is None:
            from crossview.features import PRECOMP, run_image_encoder
            from crossview.features.image import backbone_spec

            if (self.features.spec or {}).get("image", {}).get("name", self.features.image_encoder) == PRECOMP \
                    or str(self.features.image_encoder).endswith(PRECOMP):
                raise CrossViewError("this run uses precomputed image features: there is no conv map to draw a "
                                     "region map from; train on the image files to get one")
            if self._pooled_transform() is None:
                raise CrossViewError("this run's TR / CTR representation builds its image side from visual words, "
                                     "not from a pooled CNN feature, so it has no region map; use the default or "
                                     "modern representation")
            enc = run_image_encoder(self.features)
            if backbone_spec(enc.name).family == "vgg":
                raise CrossViewError("VGG-19's feature (fc7) is not an average over its conv map, so the region map "
                                     "would not be exact; use a ResNet, MobileNet-V2 or EfficientNet-Lite0 run")
            self._encoder = enc
        return self._encoder

    def _conv_map(self, path: str) -> tuple[np.ndarray, int, int]:
        """``(h*w, C)`` last conv map of the image file as the run's image side sees it, the resize and the crop."""
        own = self._own_backbone()
        if own is None:
            enc = self._image_encoder()
            loc = enc.encode_paths([path], num_workers=0, device=self.device, local=True)[0]
            return loc, int(enc.resize), int(enc.spec.crop)
        import torch
        from PIL import Image

        from crossview.features.image import backbone_spec, create_image_encoder

        body, pool, transform, name = own
        if backbone_spec(name).family == "vgg":
            raise CrossViewError("VGG-19's feature (fc7) is not an average over its conv map, so the region map "
                                 "would not be exact; use a ResNet, MobileNet-V2 or EfficientNet-Lite0 model")
        try:
            with Image.open(path) as im:
                x = transform(im.convert("RGB"))[None]
        except OSError as e:
            raise CrossViewError(f"{path}: cannot read the image ({e})") from None
        dev = next(body.parameters()).device
        was = body.training
        body.eval()
        try:
            with torch.no_grad():
                fmap = body(x.to(dev))
                pooled = pool(fmap).flatten(1)
        finally:
            body.train(was)
        loc = fmap.flatten(2).transpose(1, 2)[0].float().cpu().numpy()
        if not np.allclose(loc.mean(axis=0), pooled[0].float().cpu().numpy(), rtol=1e-4, atol=1e-5):
            raise CrossViewError(f"{name}: the model's pooled feature is not the average of its conv map, so it has "
                                 "no exact region map")
        enc = create_image_encoder(name)
        return loc, int(enc.resize), int(enc.spec.crop)

    def _pooled_transform(self) -> Any:
        """pooled backbone rows -> the run's image feature rows (before normalisation); None: not possible."""
        get = getattr(self.features, "image_from_pooled", None)
        if callable(get):
            return get()
        return lambda x: np.asarray(x, dtype=np.float32)

    def _image_rows_to_embedding(self, rows: np.ndarray, direction: str) -> np.ndarray:
        from crossview.methods.base import MethodData

        if self._own_backbone() is not None:     # the model pools its own CNN's map: rows go to its head
            data = MethodData(image_features=np.asarray(rows, np.float32), text_features=None, captions=[],
                              caption_image=np.zeros(0, np.int64), name="explain", meta={"pooled_backbone": True})
            return np.asarray(self.method.encode_images(data, direction=direction), dtype=np.float64)
        x = np.asarray(self._pooled_transform()(rows), dtype=np.float32)
        t = getattr(self.features, "image_transform", None)
        if t is not None:
            x = np.asarray(t(x), dtype=np.float32)
        data = MethodData(image_features=x, text_features=None, captions=[], caption_image=np.zeros(0, np.int64),
                          name="explain")
        return np.asarray(self.method.encode_images(data, direction=direction), dtype=np.float64)

    def _dataset_image_embedding(self, i: int, direction: str) -> np.ndarray:
        from crossview.methods.base import MethodData

        if self._own_backbone() is not None:      # the model reads the file itself
            data = MethodData(image_features=None, text_features=None, captions=[], caption_image=np.zeros(0, np.int64),
                              name="explain", image_paths=[self.image_path(i)])
            return np.asarray(self.method.encode_images(data, direction=direction), dtype=np.float64)[0]
        data = MethodData(image_features=np.asarray(self.features.image[[i]], np.float32), text_features=None,
                          captions=[], caption_image=np.zeros(0, np.int64), name="explain")
        return np.asarray(self.method.encode_images(data, direction=direction), dtype=np.float64)[0]

    def _text_embeddings(self, sentences: list[str], direction: str) -> np.ndarray:
        from crossview.features import encode_texts
        from crossview.methods.base import MethodData

        feats = encode_texts(self.features, sentences, device=self.device) if self.method.needs_text_features else None
        data = MethodData(image_features=None, text_features=feats, captions=list(sentences),
                          caption_image=np.full(len(sentences), -1, np.int64), name="explain")
        return np.asarray(self.method.encode_texts(data, direction=direction), dtype=np.float64)

    def _sentence_embedding(self, sentence: str, direction: str) -> np.ndarray:
        key = (sentence, direction)
        got = self._sentences.get(key)
        if got is None:
            got = self._sentences[key] = self._text_embeddings([sentence], direction)[0]
        return got

    def _local_features(self, path: str) -> tuple[np.ndarray, tuple[float, float, float, float], tuple[int, int]]:
        """``(h, w, C)`` conv map of the file, the crop box it covers, the image's size."""
        got = self._local.get(path)
        if got is None:
            from PIL import Image

            loc, resize, crop_side = self._conv_map(path)      # (h*w, C)
            side = int(round(np.sqrt(loc.shape[0])))
            if side * side != loc.shape[0]:
                raise CrossViewError(f"a {loc.shape[0]}-position conv map is not square")
            try:
                with Image.open(path) as im:
                    size = (int(im.width), int(im.height))
            except OSError as e:
                raise CrossViewError(f"{path}: cannot read the image ({e})") from None
            scale = min(size) / float(resize)
            crop = crop_side * scale
            left, top = (size[0] - crop) / 2.0, (size[1] - crop) / 2.0
            got = (loc.reshape(side, side, -1), (left, top, left + crop, top + crop), size)
            self._local[path] = got
        return got

    # ------------------------------------------------------------------ region maps
    def region_map(self, image: int | str | Path, text: str | int, direction: str = "i2t") -> RegionMap:
        """The region map of the pair (see the module docstring)."""
        with self._lock:
            return self._region_map(image, text, direction)

    def _region_map(self, image: int | str | Path, text: str | int, direction: str) -> RegionMap:
        from crossview.methods.base import check_direction

        check_direction(direction)
        path = self.image_path(image)
        sentence = self.text_of(text)
        fmap, box, size = self._local_features(path)
        h, w, c = fmap.shape
        parts = fmap.reshape(h * w, c).astype(np.float64)
        pooled = parts.mean(axis=0)
        v = self._sentence_embedding(sentence, direction)
        score = float(self._image_rows_to_embedding(pooled[None].astype(np.float32), direction)[0] @ v)
        per = self._held_scale_scores(pooled, parts, v, direction)
        residual = abs(float(per.mean()) - score)
        if residual <= _EXACT_RTOL * (1.0 + abs(score) + float(np.abs(per).mean())):
            values, mode = per, "exact"
        else:
            delta = parts - pooled
            plus = self._held_scale_scores(pooled, pooled + _FD_STEP * delta, v, direction)
            minus = self._held_scale_scores(pooled, pooled - _FD_STEP * delta, v, direction)
            slope = (plus - minus) / (2 * _FD_STEP)
            values, mode = score + slope - slope.mean(), "first-order"
        return RegionMap(values=values.reshape(h, w).astype(np.float32), score=score, mode=mode, crop_box=box,
                         image_size=size, residual=residual, direction=direction)

    def _held_scale_scores(self, whole: np.ndarray, parts: np.ndarray, v: np.ndarray, direction: str) -> np.ndarray:
        """Score of each row of ``parts`` with every row scale held at ``whole``'s (whole first in each batch)."""
        out = np.empty(len(parts), dtype=np.float64)
        with frozen_row_norms():
            for a in range(0, len(parts), _PARTS_PER_BATCH):
                rows = np.vstack([whole[None], parts[a:a + _PARTS_PER_BATCH]]).astype(np.float32)
                emb = self._image_rows_to_embedding(rows, direction)
                out[a:a + _PARTS_PER_BATCH] = emb[1:] @ v
        return out

    # ------------------------------------------------------------------ words
    def word_importance(self, image: int | str | Path, text: str | int, direction: str = "i2t") -> WordImportance:
        """Each word's share of the pair's score (see the module docstring)."""
        with self._lock:
            return self._word_importance(image, text, direction)

    def _word_importance(self, image: int | str | Path, text: str | int, direction: str) -> WordImportance:
        from crossview.methods.base import check_direction

        check_direction(direction)
        sentence = self.text_of(text)
        words = caption_words(sentence)
        if isinstance(image, (int, np.integer)) and 0 <= int(image) < self.dataset.n_images:
            u = self._dataset_image_embedding(int(image), direction)
        else:
            fmap, _, _ = self._local_features(self.image_path(image))
            pooled = fmap.reshape(-1, fmap.shape[-1]).mean(axis=0, dtype=np.float64)
            u = self._image_rows_to_embedding(pooled[None].astype(np.float32), direction)[0]
        score = float(self._sentence_embedding(sentence, direction) @ u)
        if len(words) <= 250 and self.method.needs_text_features:   # one encoder batch (256) holds them all
            with frozen_row_norms():
                held = self._text_embeddings([sentence, *words, ""], direction) @ u
            base = float(held[-1])
            contrib = held[1:-1] - base
            if abs(float(contrib.sum()) - (score - base)) <= _EXACT_RTOL * (1.0 + abs(score) + float(np.abs(contrib).sum())):
                return WordImportance(words, contrib.astype(np.float32), score, "exact", base)
        variants = [" ".join(words[:i] + words[i + 1:]) for i in range(len(words))]
        dropped = self._text_embeddings(variants, direction) @ u if variants else np.zeros(0)
        return WordImportance(words, (score - dropped).astype(np.float32), score, "deletion")

    # ------------------------------------------------------------------ both, cached
    def explain(self, image: int | str | Path, text: str | int, direction: str = "i2t") -> Explanation:
        """The region map (when the run has one) and the word importances of a pair, cached per pair."""
        key = (str(image) if not isinstance(image, (int, np.integer)) else int(image),
               str(text) if not isinstance(text, (int, np.integer)) else int(text), direction)
        with self._lock:
            return self._explain(key, image, text, direction)

    def _explain(self, key: tuple[Any, ...], image: int | str | Path, text: str | int, direction: str) -> Explanation:
        got = self._cache.get(key)
        if got is None:
            words = self.word_importance(image, text, direction)
            region, why, path = None, "", ""
            try:
                path = self.image_path(image)
                region = self.region_map(image, text, direction)
            except CrossViewError as e:
                why = str(e)
            got = Explanation(region=region, words=words, region_error=why, image_path=path, text=self.text_of(text))
            self._cache[key] = got
        return got


def _as_run(run: Any) -> Any:
    if isinstance(run, (str, Path)):
        from crossview.engine.session import open_run

        return open_run(run)
    return run


def region_map(run: Any, image: int | str | Path, text: str | int, direction: str = "i2t",
               device: str = "cpu") -> np.ndarray:
    """The ``(H, W)`` region map of ``image`` (a file or a dataset image index) for ``text`` (a sentence or a
    dataset caption index) under ``run`` (a run folder or an opened run); its mean is the pair's score.
    :meth:`Explainer.region_map` gives the full :class:`RegionMap` (mode, crop box)."""
    return Explainer(_as_run(run), device=device).region_map(image, text, direction).values


def word_importance(run: Any, image: int | str | Path, text: str | int, direction: str = "i2t",
                    device: str = "cpu") -> WordImportance:
    """Each word's share of the pair's score under ``run`` (see :meth:`Explainer.word_importance`)."""
    return Explainer(_as_run(run), device=device).word_importance(image, text, direction)
