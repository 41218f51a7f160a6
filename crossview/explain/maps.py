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

**Many images, one sentence** (a sentence query's results, issue 30): :meth:`Explainer.explain_many` gives the
same explanations as :meth:`Explainer.explain` image by image (to float tolerance), with the work shared: the
sentence, its words and its word-deletion variants are encoded once (their embeddings do not depend on the
image; only the final dot product does), the images' conv maps are read by one backbone pass per
:data:`_IMAGES_PER_PASS` images, and the held-scale passes carry many images at once, each image's rows in their
own block (:func:`crossview.core.rownorm.frozen_row_norms` with ``group``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import Cancelled, CrossViewError
from crossview.core.rownorm import frozen_row_norms
from crossview.core.text import check_sentence

__all__ = ["RegionMap", "WordImportance", "Explanation", "Explainer", "region_map", "word_importance",
           "caption_words"]

#: a batch for the held-scale passes of a conv map too large for :data:`_ROWS_PER_PASS`: the whole row first,
#: then at most this many parts (every normalisation in the pipeline must see the whole row as its first row)
_PARTS_PER_BATCH = 31
#: rows in one held-scale pass: as many images as fit, each a block of its whole row then its parts (the held
#: scales are per block). No method splits a batch this small (VSE++ embeds 512 rows at a time), so no block
#: is ever cut from its whole row
_ROWS_PER_PASS = 512
#: images whose conv maps one backbone pass reads when many are explained together (:meth:`Explainer.explain_many`):
#: on two CPU threads one image a pass pays every thread synchronisation alone (8 to a pass measured 8x cheaper a
#: image on the busy 2-core machine, 24 to a pass 1.5x more), and progress moves after each pass
_IMAGES_PER_PASS = 8
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
        why = getattr(run.method, "explain_refusal", None)     # a fused run: its members explain themselves
        if why:
            raise CrossViewError(str(why))
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
        self._word_rows: _LRU = _LRU(_CACHE_SIZE)

    def clear_caches(self) -> None:
        """Forget every cached pair, conv map and sentence (the next call computes from scratch; benchmarks)."""
        with self._lock:
            for c in (self._cache, self._local, self._sentences, self._word_rows):
                c.clear()

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
        if p.is_dir():
            raise CrossViewError(f"{p}: that is a folder, not an image file; give one image file")
        if not p.is_file():
            raise CrossViewError(f"{p}: no such image file")
        from crossview.data.images import verify_images

        bad = verify_images([str(p)])      # a query file: its problem, not the dataset's ("fix or remove it from ...")
        if bad:
            raise CrossViewError(f"{bad[0][1]}; give a readable image file to explain")
        return str(p)

    def text_of(self, text: str | int) -> str:
        if isinstance(text, (int, np.integer)):
            c = int(text)
            if not 0 <= c < self.dataset.n_captions:
                raise CrossViewError(f"caption {c} is not in dataset {self.dataset.name!r}")
            return str(self.dataset.captions[c])
        sentence = check_sentence(str(text).strip(), "the caption to explain")
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
            if any(b.spec.family == "vgg" for b in getattr(enc, "blocks", ())) or \
                    not hasattr(enc, "blocks") and backbone_spec(enc.name).family == "vgg":
                raise CrossViewError("VGG-19's feature (fc7) is not an average over its conv map, so the region map "
                                     "would not be exact; use a ResNet, MobileNet-V2 or EfficientNet-Lite0 run")
            self._encoder = enc
        return self._encoder

    def _conv_maps(self, paths: Sequence[str]) -> list[tuple[np.ndarray, int, int]]:
        """``(h*w, C)`` last conv map of each image file as the run's image side sees it (one backbone pass for
        all of them), the resize and the crop; a :class:`CrossViewError` when any file cannot be read."""
        own = self._own_backbone()
        if own is None:
            enc = self._image_encoder()
            locs = enc.encode_paths(list(paths), batch_size=max(1, len(paths)), num_workers=0, device=self.device,
                                    local=True)
            return [(loc, int(enc.resize), int(enc.spec.crop)) for loc in locs]
        import torch
        from PIL import Image

        from crossview.data.images import image_problem
        from crossview.features.image import backbone_spec, create_image_encoder

        body, pool, transform, name = own
        if backbone_spec(name).family == "vgg":
            raise CrossViewError("VGG-19's feature (fc7) is not an average over its conv map, so the region map "
                                 "would not be exact; use a ResNet, MobileNet-V2 or EfficientNet-Lite0 model")
        xs = []
        for path in paths:
            try:
                with Image.open(path) as im:
                    rgb = im.convert("RGB")
            except Exception as e:  # noqa: BLE001 - Pillow raises many types (image_problem)
                raise CrossViewError(f"{path}: {image_problem(e)}") from None
            xs.append(transform(rgb))
        dev = next(body.parameters()).device
        was = body.training
        body.eval()
        try:
            with torch.no_grad():
                fmap = body(torch.stack(xs).to(dev))
                pooled = pool(fmap).flatten(1).float().cpu().numpy()
        finally:
            body.train(was)
        locs = fmap.flatten(2).transpose(1, 2).float().cpu().numpy()
        if not np.allclose(locs.mean(axis=1), pooled, rtol=1e-4, atol=1e-5):
            raise CrossViewError(f"{name}: the model's pooled feature is not the average of its conv map, so it has "
                                 "no exact region map")
        enc = create_image_encoder(name)
        return [(loc, int(enc.resize), int(enc.spec.crop)) for loc in locs]

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
        got = self._local_features_many([path])[0]
        if isinstance(got, CrossViewError):
            raise got
        return got

    def _local_features_many(self, paths: Sequence[str], progress: Callable[[int, int], None] | None = None,
                             should_stop: Callable[[], bool] | None = None) -> list[Any]:
        """:meth:`_local_features` of each file, or the :class:`CrossViewError` that says why it has none. The
        files not cached yet are read :data:`_IMAGES_PER_PASS` to a backbone pass; ``progress(done, total)``
        after each pass (over all ``paths``; cached ones count as done at once), ``should_stop()`` before each
        (True: :class:`~crossview.core.errors.Cancelled`; what was read stays cached)."""
        out: list[Any] = [self._local.get(p) for p in paths]
        todo = list(dict.fromkeys(p for p, got in zip(paths, out) if got is None))
        total, done = len(paths), len(paths) - sum(got is None for got in out)
        if progress is not None:
            progress(done, total)
        read: dict[str, Any] = {}
        for a in range(0, len(todo), _IMAGES_PER_PASS):
            if should_stop is not None and should_stop():
                raise Cancelled(f"explaining stopped after {done} of {total} images")
            chunk = todo[a:a + _IMAGES_PER_PASS]
            try:
                maps: list[Any] = self._conv_maps(chunk)
            except CrossViewError:
                # one unreadable file fails its whole pass: read them one by one to say which
                maps = []
                for p in chunk:
                    try:
                        maps.append(self._conv_maps([p])[0])
                    except CrossViewError as e:
                        maps.append(e)
            for p, got in zip(chunk, maps):
                read[p] = got if isinstance(got, CrossViewError) else self._with_geometry(p, *got)
            done += sum(1 for p in paths if p in chunk)
            if progress is not None:
                progress(done, total)
        return [got if got is not None else read[p] for p, got in zip(paths, out)]

    def _with_geometry(self, path: str, loc: np.ndarray, resize: int,
                       crop_side: int) -> tuple[np.ndarray, tuple[float, float, float, float], tuple[int, int]] | CrossViewError:
        """The conv map as ``(h, w, C)`` with the crop box it covers and the image's size (cached), or the error."""
        from PIL import Image

        from crossview.data.images import image_problem

        side = int(round(np.sqrt(loc.shape[0])))
        if side * side != loc.shape[0]:
            return CrossViewError(f"a {loc.shape[0]}-position conv map is not square")
        try:
            with Image.open(path) as im:
                size = (int(im.width), int(im.height))
        except Exception as e:  # noqa: BLE001 - Pillow raises many types (image_problem)
            return CrossViewError(f"{path}: {image_problem(e)}")
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
        got = self._region_maps([self._local_features(path)], sentence, direction)[0]
        if isinstance(got, CrossViewError):
            raise got
        return got

    def _region_maps(self, locals_: Sequence[tuple[np.ndarray, Any, Any]], sentence: str,
                     direction: str) -> list[RegionMap | CrossViewError]:
        """The region maps of the images whose :meth:`_local_features` are ``locals_``, for one sentence: one
        unheld pass for their scores, held-scale passes carrying many images each (see :meth:`_held_scale_scores`)."""
        v = self._sentence_embedding(sentence, direction)
        out: list[RegionMap | CrossViewError] = [CrossViewError("no conv map")] * len(locals_)
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for k, (fmap, _, _) in enumerate(locals_):
            by_shape.setdefault(tuple(fmap.shape), []).append(k)
        for (h, w, c), ks in by_shape.items():
            parts = np.stack([locals_[k][0].reshape(h * w, c) for k in ks]).astype(np.float64)   # (m, P, C)
            pooled = parts.mean(axis=1)                                                          # (m, C)
            scores = self._embed_rows_in_passes(pooled.astype(np.float32), direction) @ v
            per = self._held_scale_scores(pooled, parts, v, direction)                           # (m, P)
            residual = np.abs(per.mean(axis=1) - scores)
            exact = residual <= _EXACT_RTOL * (1.0 + np.abs(scores) + np.abs(per).mean(axis=1))
            values, modes = per.copy(), np.where(exact, "exact", "first-order")
            loose = np.flatnonzero(~exact)
            if len(loose):
                delta = parts[loose] - pooled[loose, None]
                whole = pooled[loose]
                plus = self._held_scale_scores(whole, whole[:, None] + _FD_STEP * delta, v, direction)
                minus = self._held_scale_scores(whole, whole[:, None] - _FD_STEP * delta, v, direction)
                slope = (plus - minus) / (2 * _FD_STEP)
                values[loose] = scores[loose, None] + slope - slope.mean(axis=1, keepdims=True)
            for j, k in enumerate(ks):
                _, box, size = locals_[k]
                out[k] = RegionMap(values=values[j].reshape(h, w).astype(np.float32), score=float(scores[j]),
                                   mode=str(modes[j]), crop_box=box, image_size=size, residual=float(residual[j]),
                                   direction=direction)
        return out

    def _embed_rows_in_passes(self, rows: np.ndarray, direction: str) -> np.ndarray:
        """:meth:`_image_rows_to_embedding` of ``rows`` (unheld: each row its own scales), :data:`_ROWS_PER_PASS`
        at a time."""
        return np.vstack([self._image_rows_to_embedding(rows[a:a + _ROWS_PER_PASS], direction)
                          for a in range(0, len(rows), _ROWS_PER_PASS)])

    def _held_scale_scores(self, whole: np.ndarray, parts: np.ndarray, v: np.ndarray, direction: str) -> np.ndarray:
        """Score of each row of ``parts`` with every row scale held at its image's ``whole`` row.

        ``whole``: ``(C,)`` or ``(m, C)``; ``parts``: ``(P, C)`` or ``(m, P, C)``; returns ``(P,)`` or ``(m, P)``.
        Each image is a block of ``1 + P`` rows (its whole row first), as many blocks to a pass as
        :data:`_ROWS_PER_PASS` holds, the scales held per block; a conv map too large for one pass goes in
        pieces of :data:`_PARTS_PER_BATCH`, the whole row first in each."""
        one = np.ndim(whole) == 1
        whole = np.atleast_2d(whole)
        parts = parts[None] if one else parts
        m, n_parts = parts.shape[:2]
        out = np.empty((m, n_parts), dtype=np.float64)
        block = 1 + n_parts
        if block <= _ROWS_PER_PASS:
            per_pass = _ROWS_PER_PASS // block
            with frozen_row_norms(group=block):
                for a in range(0, m, per_pass):
                    b = min(m, a + per_pass)
                    rows = np.concatenate([whole[a:b, None], parts[a:b]], axis=1).reshape(-1, whole.shape[1])
                    emb = self._image_rows_to_embedding(rows.astype(np.float32), direction)
                    out[a:b] = (emb @ v).reshape(b - a, block)[:, 1:]
        else:
            with frozen_row_norms():
                for i in range(m):
                    for a in range(0, n_parts, _PARTS_PER_BATCH):
                        rows = np.vstack([whole[i][None], parts[i, a:a + _PARTS_PER_BATCH]]).astype(np.float32)
                        out[i, a:a + _PARTS_PER_BATCH] = self._image_rows_to_embedding(rows, direction)[1:] @ v
        return out[0] if one else out

    # ------------------------------------------------------------------ words
    def word_importance(self, image: int | str | Path, text: str | int, direction: str = "i2t") -> WordImportance:
        """Each word's share of the pair's score (see the module docstring)."""
        with self._lock:
            return self._word_importance(image, text, direction)

    def _word_importance(self, image: int | str | Path, text: str | int, direction: str) -> WordImportance:
        from crossview.methods.base import check_direction

        check_direction(direction)
        sentence = self.text_of(text)
        if isinstance(image, (int, np.integer)) and 0 <= int(image) < self.dataset.n_images:
            u = self._dataset_image_embedding(int(image), direction)
        else:
            fmap, _, _ = self._local_features(self.image_path(image))
            pooled = fmap.reshape(-1, fmap.shape[-1]).mean(axis=0, dtype=np.float64)
            u = self._image_rows_to_embedding(pooled[None].astype(np.float32), direction)[0]
        return self._words_for(u, sentence, direction)

    def _words_for(self, u: np.ndarray, sentence: str, direction: str) -> WordImportance:
        """The word importances of ``sentence`` against the image embedding ``u``: the sentence's side (its
        held word rows, its deletion variants) is encoded once per sentence and kept; only ``@ u`` is per image."""
        words = caption_words(sentence)
        score = float(self._sentence_embedding(sentence, direction) @ u)
        held_rows = self._sentence_rows(sentence, direction, "held")
        if held_rows is not None:
            held = held_rows @ u
            base = float(held[-1])
            contrib = held[1:-1] - base
            if abs(float(contrib.sum()) - (score - base)) <= _EXACT_RTOL * (1.0 + abs(score) + float(np.abs(contrib).sum())):
                return WordImportance(words, contrib.astype(np.float32), score, "exact", base)
        dropped_rows = self._sentence_rows(sentence, direction, "dropped")
        dropped = dropped_rows @ u if len(words) else np.zeros(0)
        return WordImportance(words, (score - dropped).astype(np.float32), score, "deletion")

    def _sentence_rows(self, sentence: str, direction: str, kind: str) -> np.ndarray | None:
        """The sentence's text-side rows for word importance, encoded once and kept: ``"held"``, the
        embeddings of ``[sentence, *words, ""]`` at the sentence's row scales (None where the split cannot be
        exact: no text features, or more words than one encoder batch holds); ``"dropped"``, the embeddings of
        the sentence with each word removed in turn."""
        key = (sentence, direction, kind)
        if key in self._word_rows:
            return self._word_rows.get(key)
        words = caption_words(sentence)
        if kind == "held":
            got = None
            if len(words) <= 250 and self.method.needs_text_features:   # one encoder batch (256) holds them all
                with frozen_row_norms():
                    got = self._text_embeddings([sentence, *words, ""], direction)
        else:
            variants = [" ".join(words[:i] + words[i + 1:]) for i in range(len(words))]
            got = self._text_embeddings(variants, direction) if variants else np.zeros((0, 0))
        self._word_rows[key] = got
        return got

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

    def explain_many(self, images: Sequence[int | str | Path], text: str | int, direction: str = "t2i",
                     progress: Callable[[int, int], None] | None = None,
                     should_stop: Callable[[], bool] | None = None) -> list[Explanation | CrossViewError]:
        """:meth:`explain` of each of ``images`` with one ``text`` (a sentence query's results), computed together.

        The same numbers as explaining the images one at a time (to float tolerance), for a fraction of the
        work: the sentence's side once, the conv maps :data:`_IMAGES_PER_PASS` images to a backbone pass, the
        held-scale passes many images at a time (module docstring). Pairs already explained come from the
        cache. Returns, per image in order, its :class:`Explanation` (cached like :meth:`explain`'s), or the
        :class:`CrossViewError` :meth:`explain` would have raised for it (an unreadable file). A bad ``text``
        or ``direction`` raises. ``progress(done, total)``: images whose conv maps are read, after each
        backbone pass; ``should_stop()`` before each pass (True: :class:`~crossview.core.errors.Cancelled`,
        the maps read so far kept)."""
        from crossview.methods.base import check_direction

        with self._lock:
            check_direction(direction)
            sentence = self.text_of(text)
            tkey = str(text) if not isinstance(text, (int, np.integer)) else int(text)
            keys = [(str(im) if not isinstance(im, (int, np.integer)) else int(im), tkey, direction) for im in images]
            out: list[Any] = [self._cache.get(k) for k in keys]
            todo = [j for j, got in enumerate(out) if got is None]
            # which image file each pair reads (or why it has none: explain's region_error, or its failure)
            paths: dict[int, str | CrossViewError] = {}
            for j in todo:
                try:
                    paths[j] = self.image_path(images[j])
                except CrossViewError as e:
                    paths[j] = e
            readable = [j for j in todo if isinstance(paths[j], str)]
            try:
                self._image_encoder_or_backbone()
                got = self._local_features_many([str(paths[j]) for j in readable], progress, should_stop)
                local = dict(zip(readable, got))
            except Cancelled:
                raise
            except CrossViewError as e:        # the run has no map at all (precomputed features, TR, VGG)
                local = {j: e for j in readable}
            maps = [j for j in readable if not isinstance(local[j], CrossViewError)]
            regions = dict(zip(maps, self._region_maps([local[j] for j in maps], sentence, direction)))
            us = self._image_embeddings_for([images[j] for j in todo], {j: local.get(j) for j in todo}, todo,
                                            direction)
            for j in todo:
                u = us[j]
                if isinstance(u, CrossViewError):
                    out[j] = u
                    continue
                words = self._words_for(u, sentence, direction)
                where = paths[j]
                region = regions.get(j)
                why = "" if region is not None else str(local.get(j) if j in local else where)
                if isinstance(region, CrossViewError):
                    region, why = None, str(region)
                e = Explanation(region=region, words=words, region_error=why,
                                image_path=where if isinstance(where, str) else "", text=sentence)
                self._cache[keys[j]] = out[j] = e
            return out

    def _image_encoder_or_backbone(self) -> None:
        """Raise the run-wide reason there is no region map (precomputed features, TR / CTR, VGG-19), if any."""
        if self._own_backbone() is None:
            self._image_encoder()

    def _image_embeddings_for(self, images: Sequence[int | str | Path], local: dict[int, Any], slots: Sequence[int],
                              direction: str) -> dict[int, np.ndarray | CrossViewError]:
        """The embedding ``u`` each image's words are scored against (as :meth:`_word_importance` takes it: a
        dataset image's own feature row, else the file's pooled conv map), in one method call per kind;
        ``local[slot]``: the file's :meth:`_local_features` (or why it has none), ``slots`` name the images."""
        from crossview.methods.base import MethodData

        out: dict[int, np.ndarray | CrossViewError] = {}
        rows_of = [(s, int(im)) for s, im in zip(slots, images)
                   if isinstance(im, (int, np.integer)) and 0 <= int(im) < self.dataset.n_images]
        if rows_of:
            idx = [i for _, i in rows_of]
            if self._own_backbone() is not None:      # the model reads the files itself
                data = MethodData(image_features=None, text_features=None, captions=[],
                                  caption_image=np.zeros(0, np.int64), name="explain",
                                  image_paths=[self.image_path(i) for i in idx])
            else:
                data = MethodData(image_features=np.asarray(self.features.image[idx], np.float32), text_features=None,
                                  captions=[], caption_image=np.zeros(0, np.int64), name="explain")
            emb = np.asarray(self.method.encode_images(data, direction=direction), dtype=np.float64)
            out.update({s: emb[k] for k, (s, _) in enumerate(rows_of)})
        files = [(s, im) for s, im in zip(slots, images) if s not in out]
        pooled, have = [], []
        for s, im in files:
            got = local.get(s)
            if got is None:               # not a readable path: what image_path said
                try:
                    got = self._local_features(self.image_path(im))
                except CrossViewError as e:
                    got = e
            if isinstance(got, CrossViewError):
                out[s] = got
                continue
            fmap = got[0]
            pooled.append(fmap.reshape(-1, fmap.shape[-1]).mean(axis=0, dtype=np.float64))
            have.append(s)
        if have:
            emb = self._embed_rows_in_passes(np.stack(pooled).astype(np.float32), direction)
            out.update({s: emb[k] for k, s in enumerate(have)})
        return out


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
