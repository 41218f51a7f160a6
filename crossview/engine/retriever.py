"""Answer queries with a trained method: an image -> ranked captions, a sentence (or, with a tag branch, a tag
list) -> ranked images.

:class:`Retriever` holds a fitted method, its dataset and features, and a *gallery*: the images and
captions of one split (``"test"`` by default), of the whole dataset (``"all"``), or an independent
caption corpus with no images (the BITR setting; i2t only), or a folder of one's own photos with no captions
(:class:`~crossview.data.photos.PhotoFolder`; t2i only, no ground truth). Gallery embeddings are computed once and
put into a top-k index (:mod:`crossview.index`); a query is encoded by the method (new image files go
through the run's image encoder, new sentences through its fitted text encoder) and searched.

A corpus's caption features go through the feature cache like a dataset's (keyed by the corpus's
captions, the text encoder and its fitted state), so only the first retriever over a corpus encodes
it; ``progress(stage, done, total)`` reports that encoding. A photo folder's photos go through the run's
image encoder once, cached photo by photo (:mod:`crossview.features.photo_cache`; stage ``"photos"``).

Every :class:`Ranking` also carries the ground truth and its ranks over the *whole* gallery, however
far down they are, under the tie rule of :mod:`crossview.eval.metrics` (descending score, then the
smaller gallery position).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.text import check_sentence
from crossview.data.photos import PhotoFolder
from crossview.methods.base import MethodData, check_direction

__all__ = ["NO_CAPTIONS", "Ranking", "Retriever", "ranks_of"]

#: What a caption query on a photo gallery says.
NO_CAPTIONS = "a photo folder has no captions: query it with a sentence"
#: A retriever opened from the gallery cache (gallery_cache.open_cached_retriever) holds no dataset feature rows.
NO_ROWS = ("{what}: the run is open from its gallery cache, without its dataset's feature rows (still loading, or "
           "not loaded); query with a sentence or an image file, or wait until the run is open in full")


@dataclass
class Ranking:
    """The answer to one query.

    Attributes:
        direction: ``"i2t"`` (items are captions) or ``"t2i"`` (items are images).
        items: ``(k,) int64`` dataset caption / image indices, best first (corpus line numbers for a
            corpus gallery, photo indices of the folder for a photo gallery).
        scores: ``(k,) float32`` their scores.
        gold: ``(g,) int64`` the query's ground-truth items present in the gallery (dataset indices).
        gold_ranks: ``(g,) int64`` their 1-based ranks among all gallery items.
        gallery_size: number of items ranked.
        exact: False when an approximate index produced ``items``.
        query: what was asked (``{"image": i}``, ``{"caption": c}``, ``{"text": "..."}``, ``{"file": p}``,
            ``{"tags": "dog, grass"}`` for a tag list through a method's tag branch).
    """

    direction: str
    items: np.ndarray
    scores: np.ndarray
    gold: np.ndarray
    gold_ranks: np.ndarray
    gallery_size: int
    exact: bool = True
    query: dict[str, Any] = field(default_factory=dict)

    @property
    def best_gold_rank(self) -> int | None:
        """The rank of the best-ranked ground-truth item (the evaluation's rank), or None."""
        return int(self.gold_ranks.min()) if len(self.gold_ranks) else None

    def is_gold(self, item: int) -> bool:
        return bool(np.any(self.gold == item))


def ranks_of(scores: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """1-based ranks of gallery ``positions`` given one query's ``scores (n,)``, under the tie rule:
    ``rank(j) = 1 + #{s_i > s_j} + #{i < j : s_i == s_j}``."""
    s = np.asarray(scores)
    out = np.empty(len(positions), dtype=np.int64)
    idx = np.arange(s.shape[0])
    for n, j in enumerate(np.asarray(positions, dtype=np.int64)):
        sj = s[j]
        out[n] = 1 + int(np.count_nonzero(s > sj)) + int(np.count_nonzero((s == sj) & (idx < j)))
    return out


class Retriever:
    """Queries against one gallery with a fitted method (see the module docstring).

    ``features`` is what :func:`crossview.features.extract_features` returned for ``dataset`` (whole
    dataset, its numbering). ``gallery`` is a split name, ``"all"``, or a
    :class:`~crossview.data.dataset.TextCorpus` (captions only), or a
    :class:`~crossview.data.photos.PhotoFolder` (photos only: a sentence ranks them, items are photo indices,
    :meth:`gallery_image_path` gives a result's file). ``index_backend`` is a name of
    :data:`crossview.index.BACKENDS`. ``cache`` is the :class:`~crossview.features.cache.FeatureCache`
    for a corpus's caption features and a photo folder's photo features (``None``: the default one; ``False``:
    none). ``progress(stage, done, total)`` reports that encoding (stage ``"corpus captions"`` or ``"photos"``);
    ``should_stop()`` cancels it (checked between batches of ``photo_batch_size`` photos for a photo folder).
    ``model_key`` (:func:`crossview.engine.gallery_cache.model_key`, given by
    :meth:`crossview.engine.session.OpenRun.retriever`) caches a split's or a corpus's gallery embeddings under
    the run's checkpoint (:mod:`crossview.engine.gallery_cache`), so the next retriever over that gallery of the
    same run encodes nothing; None: computed every time.
    """

    def __init__(self, method: Any, dataset: Any, features: Any, *, gallery: Any = "test",
                 index_backend: str = "exact", device: str = "cpu", cache: Any = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, photo_batch_size: int = 32,
                 model_key: str | None = None) -> None:
        method.check_is_fitted()
        self.model_key = model_key
        #: for a split or corpus gallery: were its embeddings read from the gallery cache (None: not cached)?
        self.gallery_cache_hit: bool | None = None
        self.method = method
        self.dataset = dataset
        self.features = features
        self.device = device
        self.index_backend = index_backend
        self._image_encoder = None
        self.corpus = None
        self.photos = None    #: the PhotoFolder of a photo gallery
        self.photos_skipped: list[tuple[str, str]] = []   #: a photo gallery's undecodable files (path, problem)
        self.photos_encoded = 0   #: a photo gallery: how many photos were encoded now (the rest were cached)
        self._cache = cache
        self._progress = progress
        self._should_stop = should_stop
        self._photo_batch_size = photo_batch_size
        self.corpus_cache_hit: bool | None = None  #: for a corpus gallery: were its features cached?
        self._scorers: dict[str, Any] | None = None
        self._scoring_stats: dict[str, Any] = {}
        #: the scoring's choice record (crossview.engine.scoring.choose_scoring); plain until set_scoring
        self.scoring_record: dict[str, Any] = {"scoring": "plain"}
        if isinstance(gallery, str):
            if gallery == "all":
                self.gallery_images = np.arange(dataset.n_images, dtype=np.int64)
            elif gallery in dataset.splits:
                self.gallery_images = np.asarray(dataset.splits[gallery], dtype=np.int64)
            else:
                raise CrossViewError(f"gallery {gallery!r}: dataset {dataset.name!r} has splits "
                                     f"{', '.join(dataset.split_names) or 'none'}; use one of them or 'all'")
            self.gallery_name = gallery
            in_gallery = np.zeros(dataset.n_images, dtype=bool)
            in_gallery[self.gallery_images] = True
            self.gallery_captions = np.flatnonzero(in_gallery[dataset.caption_image]).astype(np.int64)
        elif isinstance(gallery, PhotoFolder):   # one's own photos: ranked for sentences only
            self.photos = gallery
            self.gallery_name = f"photos {gallery.name}"
            self.gallery_captions = np.zeros(0, dtype=np.int64)
            self.gallery_images = np.zeros(0, dtype=np.int64)   # the photos that could be read (set below)
        else:  # an independent caption corpus: ranks captions only
            self.corpus = gallery
            self.gallery_name = f"corpus {getattr(gallery, 'name', '')}".strip()
            self.gallery_images = np.zeros(0, dtype=np.int64)
            self.gallery_captions = np.arange(gallery.n_captions, dtype=np.int64)
        self._build_gallery()

    # ------------------------------------------------------------------ gallery
    def _text_rows(self, captions: list[str], rows: np.ndarray | None) -> np.ndarray | None:
        """Caption features: rows of the dataset's matrix, or new captions through the text encoder."""
        if not self.method.needs_text_features:
            return None
        if rows is not None:
            text = self.features.text
            if text is None or len(rows) and text.shape[0] <= int(np.max(rows)):
                raise CrossViewError(NO_ROWS.format(what=f"dataset caption {int(rows[0])}"))
            if hasattr(text, "tocsr"):      # TF-IDF rows stay sparse: the method densifies them if it must
                return text.tocsr()[rows].astype(np.float32)
            return np.asarray(text[rows], dtype=np.float32)
        from crossview.features import encode_texts

        return encode_texts(self.features, captions, device=self.device)

    def _corpus_features(self, captions: list[str]) -> np.ndarray | None:
        """The corpus's caption features, through the feature cache when the encoder has a cache key."""
        if not self.method.needs_text_features:
            return None
        from crossview.features import FeatureCache, encode_captions

        model = self.features.text_model
        encode = getattr(self.features, "encode_new_captions", None)   # a representation's own text side
        if model is None and encode is not None:     # CTR: topics projected by CCA; not cached
            self.corpus_cache_hit = False
            x = np.asarray(encode(captions, device=self.device), dtype=np.float32)
            transform = getattr(self.features, "text_transform", None)
            return x if transform is None else np.asarray(transform(x), dtype=np.float32)
        if model is None:
            raise CrossViewError("this run has no text encoder to encode the corpus's captions with")
        progress = self._progress
        report = (lambda done, total: progress("corpus captions", done, total)) if progress else None
        store = None
        if self._cache is not False and callable(getattr(model, "cache_parts", None)):
            store = self._cache if isinstance(self._cache, FeatureCache) else FeatureCache()
        if store is None:   # an encoder that cannot name its state is never cached
            self.corpus_cache_hit = False
            return np.asarray(model.encode(captions, device=self.device, progress=report,
                                           should_stop=self._should_stop), dtype=np.float32)
        feats, self.corpus_cache_hit = encode_captions(
            captions, model, cache=store, device=self.device, progress=report, should_stop=self._should_stop,
            dataset_name=f"corpus {getattr(self.corpus, 'name', '')}".strip())
        return feats if hasattr(feats, "tocsr") else np.asarray(feats, dtype=np.float32)

    def _gallery_data(self) -> MethodData:
        """What the method encodes for the gallery: the corpus's captions, or the split's images and captions."""
        ds, f = self.dataset, self.features
        if self.corpus is not None:
            caps = list(self.corpus.captions)
            return MethodData(image_features=None, text_features=self._corpus_features(caps), captions=caps,
                              caption_image=np.full(len(caps), -1, np.int64), name="corpus")   # text only
        gi, gc = self.gallery_images, self.gallery_captions
        pos = np.full(ds.n_images, -1, dtype=np.int64)
        pos[gi] = np.arange(len(gi))
        return MethodData(image_features=np.asarray(f.image[gi], np.float32),
                          text_features=self._text_rows([ds.captions[c] for c in gc], gc),
                          captions=[ds.captions[c] for c in gc], caption_image=pos[ds.caption_image[gc]],
                          name=self.gallery_name, image_paths=self._files([int(i) for i in gi]))

    def _build_gallery(self) -> None:
        if self.photos is not None:
            self._build_photo_gallery()
            return
        made: list[MethodData] = []

        def data() -> MethodData:      # built once, and only when something is not cached
            if not made:
                made.append(self._gallery_data())
            return made[0]

        def captions() -> np.ndarray:
            return np.ascontiguousarray(self.method.encode_texts(data(), direction="i2t"), np.float32)

        def images() -> np.ndarray:
            return np.ascontiguousarray(self.method.encode_images(data(), direction="t2i"), np.float32)

        cache = None
        if self.model_key is not None and self._cache is not False:
            from crossview.engine.gallery_cache import GalleryCache, gallery_identity
            cache = GalleryCache(self.model_key, gallery_identity(self.corpus if self.corpus is not None
                                                                  else self.gallery_name), self._cache)
        if cache is None:
            caption_emb, image_emb = captions(), images() if len(self.gallery_images) else None
        else:
            caption_emb, hit = cache.embeddings("captions", captions)
            image_emb = None
            if len(self.gallery_images):
                image_emb, image_hit = cache.embeddings("images", images)
                hit = hit and image_hit
            self.gallery_cache_hit = hit
            if self.corpus is not None:
                self.corpus_cache_hit = hit or bool(self.corpus_cache_hit)
                if hit and self._progress is not None:     # the whole stage done at once, as a features hit says
                    n = len(self.gallery_captions)
                    self._progress("corpus captions", n, n)
            from crossview.engine.gallery_cache import write_snapshot
            write_snapshot(cache, self)
        self._set_embeddings(caption_emb, image_emb)

    def _set_embeddings(self, caption_emb: np.ndarray | None, image_emb: np.ndarray | None) -> None:
        from crossview.index import build_index

        self._caption_emb = caption_emb
        self._caption_index = None if caption_emb is None else build_index(caption_emb, self.index_backend)
        self._image_emb = image_emb
        self._image_index = None if image_emb is None else build_index(image_emb, self.index_backend)

    @classmethod
    def from_embeddings(cls, method: Any, dataset: Any, features: Any, *, gallery: Any,
                        gallery_images: np.ndarray, gallery_captions: np.ndarray, image_emb: np.ndarray | None,
                        caption_emb: np.ndarray | None, index_backend: str = "exact", device: str = "cpu",
                        cache: Any = None) -> "Retriever":
        """A retriever over a gallery whose embeddings are given (``image_emb (len(gallery_images), d)``,
        ``caption_emb (len(gallery_captions), d)``, e.g. memory-mapped from the gallery cache): nothing is
        encoded but the queries. ``gallery``: the split's name or the caption corpus. A side given as None was not
        read: the queries that rank it are refused (one line)."""
        method.check_is_fitted()
        r = cls.__new__(cls)
        r.method, r.dataset, r.features, r.device, r.index_backend = method, dataset, features, device, index_backend
        r.model_key, r._image_encoder, r.photos = None, None, None
        r.photos_skipped, r.photos_encoded = [], 0
        r._cache, r._progress, r._should_stop, r._photo_batch_size = cache, None, None, 32
        r._scorers, r._scoring_stats, r.scoring_record = None, {}, {"scoring": "plain"}
        r.gallery_cache_hit = True
        if isinstance(gallery, str):
            r.corpus, r.gallery_name, r.corpus_cache_hit = None, gallery, None
        else:
            r.corpus, r.gallery_name = gallery, f"corpus {getattr(gallery, 'name', '')}".strip()
            r.corpus_cache_hit = True
        r.gallery_images = np.asarray(gallery_images, np.int64)
        r.gallery_captions = np.asarray(gallery_captions, np.int64)
        r._set_embeddings(caption_emb, image_emb if len(r.gallery_images) else None)
        return r

    def _build_photo_gallery(self) -> None:
        from crossview.features.cache import FeatureCache
        from crossview.features.photo_cache import encode_photos
        from crossview.index import build_index

        folder = self.photos
        assert folder is not None
        cache = self._cache if self._cache is False or isinstance(self._cache, FeatureCache) else None
        got = encode_photos(self.features, folder.image_paths, device=self.device, cache=cache,
                            batch_size=self._photo_batch_size, progress=self._progress,
                            should_stop=self._should_stop)
        self.photos_skipped, self.photos_encoded = got.skipped, got.encoded
        if not len(got.kept):
            raise CrossViewError(f"{folder.root}: none of its {folder.n_images} photos could be read "
                                 f"(first: {got.skipped[0][0]}: {got.skipped[0][1]})")
        self.gallery_images = got.kept
        files = [str(folder.path_of(int(i))) for i in got.kept] \
            if getattr(self.method, "wants_image_files", False) else None
        data = MethodData(image_features=got.features, text_features=None, captions=[],
                          caption_image=np.zeros(0, np.int64), name=self.gallery_name, image_paths=files)
        self._caption_emb = None
        self._caption_index = None
        self._image_emb = np.ascontiguousarray(self.method.encode_images(data, direction="t2i"), np.float32)
        self._image_index = build_index(self._image_emb, self.index_backend)

    def gallery_image_path(self, item: int) -> Path | None:
        """The file of gallery image ``item`` (a ranking's item): a photo of the folder for a photo gallery, a
        dataset image's file otherwise (``None`` for a dataset of precomputed features)."""
        if self.photos is not None:
            return self.photos.path_of(int(item))
        paths = getattr(self.dataset, "image_paths", None)
        return Path(paths[int(item)]) if paths is not None else None

    @property
    def n_gallery_images(self) -> int:
        return int(len(self.gallery_images))

    @property
    def n_gallery_captions(self) -> int:
        return int(len(self.gallery_captions))

    def gallery_caption_text(self, item: int) -> str:
        """The text of caption ``item`` (a dataset caption index, or a corpus line for a corpus gallery)."""
        return self.corpus.captions[item] if self.corpus is not None else self.dataset.captions[item]

    # ------------------------------------------------------------------ queries
    def _image_query_features(self, image: int | str | Path) -> tuple[np.ndarray, dict[str, Any]]:
        if isinstance(image, (int, np.integer)):
            i = int(image)
            if not 0 <= i < self.dataset.n_images:
                raise CrossViewError(f"image {i} is not in dataset {self.dataset.name!r} "
                                     f"({self.dataset.n_images} images)")
            if self.features.image is None or len(self.features.image) <= i:
                raise CrossViewError(NO_ROWS.format(what=f"dataset image {i}"))
            return np.asarray(self.features.image[[i]], np.float32), {"image": i}
        path = Path(image)
        if path.is_dir():
            raise CrossViewError(f"{path}: that is a folder, not an image file; give one image file")
        if not path.is_file():
            raise CrossViewError(f"{path}: no such image file")
        encode = getattr(self.features, "encode_new_images", None)   # a representation's own image side (TR/CTR)
        if encode is None and self._image_encoder is None and self._cache is not False:
            # a photo asked before (by its bytes) is a row of the photo store: no backbone to build (seconds:
            # torchvision / timm imports and the weights); a new one is encoded once and stored
            from crossview.data.images import verify_images
            from crossview.features.photo_cache import encode_photos

            bad = verify_images([str(path)])
            if bad:
                raise CrossViewError(bad[0][1])
            got = encode_photos(self.features, [str(path)], device=self.device, cache=self._cache)
            if len(got.kept):
                return np.asarray(got.features, np.float32), {"file": str(path)}
        if encode is None and self._image_encoder is None:
            from crossview.features import run_image_encoder
            self._image_encoder = run_image_encoder(self.features)
        x = encode([str(path)], device=self.device) if encode is not None else \
            self._image_encoder.encode_paths([str(path)], num_workers=0, device=self.device)
        if getattr(self.features, "image_transform", None) is not None:
            x = self.features.image_transform(x)
        return np.asarray(x, np.float32), {"file": str(path)}

    def _files(self, images: list[int]) -> list[str] | None:
        """The files of dataset images ``images`` when the method encodes image files itself (end to end)."""
        paths = getattr(self.dataset, "image_paths", None)
        if not getattr(self.method, "wants_image_files", False) or paths is None:
            return None
        return [str(paths[i]) for i in images]

    def query_image(self, image: int | str | Path, k: int = 10) -> Ranking:
        """Captions of the gallery ranked for ``image`` (a dataset image index or an image file)."""
        if self.photos is not None:
            raise CrossViewError(NO_CAPTIONS)
        x, query = self._image_query_features(image)
        files = self._files([query["image"]]) if "image" in query else (
            [query["file"]] if getattr(self.method, "wants_image_files", False) else None)
        data = MethodData(image_features=x, text_features=None, captions=[],
                          caption_image=np.zeros(0, np.int64), name="query", image_paths=files)
        q = np.asarray(self.method.encode_images(data, direction="i2t"), np.float32)
        indices, top, scores, exact = self._search("i2t", q, k)
        gold = np.zeros(0, dtype=np.int64)
        if "image" in query and self.corpus is None:
            mine = np.flatnonzero(self.dataset.caption_image[self.gallery_captions] == query["image"])
            gold_pos = mine
            gold = self.gallery_captions[mine]
        else:
            gold_pos = np.zeros(0, dtype=np.int64)
        return Ranking("i2t", items=self.gallery_captions[indices], scores=top,
                       gold=gold, gold_ranks=ranks_of(scores, gold_pos), gallery_size=self.n_gallery_captions,
                       exact=exact, query=query)

    def query_text(self, text: str | int, k: int = 10) -> Ranking:
        """Gallery images ranked for a sentence, or for dataset caption ``text`` when it is an int."""
        check_direction("t2i")
        if self._image_index is None:
            raise CrossViewError("a caption-corpus gallery has no images to rank; choose a split as the gallery")
        if self.photos is not None and isinstance(text, (int, np.integer)):
            raise CrossViewError(NO_CAPTIONS)
        if isinstance(text, (int, np.integer)):
            c = int(text)
            if not 0 <= c < self.dataset.n_captions:
                raise CrossViewError(f"caption {c} is not in dataset {self.dataset.name!r}")
            sentence, query, rows = self.dataset.captions[c], {"caption": c}, np.array([c])
        else:
            sentence = check_sentence(str(text).strip(), "the query sentence")
            if not sentence:
                raise CrossViewError("type a sentence to search for")
            query, rows = {"text": sentence}, None
            same = None if self.photos is not None else self._same_caption(sentence)
            if same is not None:      # a typed sentence that is a dataset caption has that caption's ground truth
                query["caption"] = same
        feats = self._text_rows([sentence], rows)
        data = MethodData(image_features=None, text_features=feats, captions=[sentence],
                          caption_image=np.full(1, -1, np.int64), name="query")                  # text only
        q = np.asarray(self.method.encode_texts(data, direction="t2i"), np.float32)
        return self._rank_images(q, query, k)

    def _same_caption(self, sentence: str) -> int | None:
        """The first dataset caption equal to ``sentence`` (stripped, any case), or None."""
        find = getattr(self.dataset, "find_caption", None)     # a cached run's snapshot: a hash look-up
        if find is not None:
            return find(sentence)
        low = sentence.strip().lower()
        return next((i for i, cap in enumerate(self.dataset.captions) if cap.strip().lower() == low), None)

    # ------------------------------------------------------------------ identities
    @property
    def identity_word(self) -> str | None:
        """``"identity"`` (person datasets: CUHK-PEDES) or ``"class"`` when the dataset's labels group its images
        (several images a label: identities, classes, the demo's layouts), else None (each image its own)."""
        labels = getattr(self.dataset, "labels", None)
        if self.photos is not None or labels is None or len(labels) != self.dataset.n_images:
            return None
        cached = getattr(self, "_groups", None)
        if cached is None:
            cached = self._groups = bool(len(np.unique(np.asarray(labels))) < self.dataset.n_images)
        if not cached:
            return None
        return "identity" if getattr(self.dataset, "format", "") == "cuhk-pedes" else "class"

    def identity_of(self, image: int) -> str | None:
        """The label of dataset image ``image`` as shown (its name when the dataset names its labels), or None
        when the dataset's labels do not group images (:attr:`identity_word`)."""
        if self.identity_word is None:
            return None
        v = int(self.dataset.labels[int(image)])
        names = getattr(self.dataset, "label_names", None)
        return str(names[v]) if names is not None and 0 <= v < len(names) else str(v)

    def query_identity(self, ranking: "Ranking") -> str | None:
        """The identity of what was asked (a dataset image, or a dataset caption's image), else None."""
        q = ranking.query
        if "image" in q:
            return self.identity_of(int(q["image"]))
        if "caption" in q:
            return self.identity_of(int(self.dataset.caption_image[int(q["caption"])]))
        return None

    def result_identities(self, ranking: "Ranking") -> list[str | None]:
        """The identity of each result (an image, or a caption's image; None for a corpus gallery's lines)."""
        if self.identity_word is None or (ranking.direction == "i2t" and self.corpus is not None):
            return [None] * len(ranking.items)
        images = ranking.items if ranking.direction == "t2i" else self.dataset.caption_image[ranking.items]
        return [self.identity_of(int(i)) for i in images]

    @property
    def has_tag_branch(self) -> bool:
        """Whether :meth:`query_tags` works: the method embeds tag lists (``embed_tags``, e.g. webly's tag branch)
        and its fitted model has that branch (``has_tag_branch``, default True), or it was trained reading tags
        through its sentence branch (``tags_as_sentences``)."""
        m = self.method
        return callable(getattr(m, "embed_tags", None)) and (bool(getattr(m, "has_tag_branch", True))
                                                             or bool(getattr(m, "tags_as_sentences", False)))

    def query_tags(self, tags: str | list[str], k: int = 10) -> Ranking:
        """Gallery images ranked for a tag list (``"dog, grass, run"`` or ``["dog", "grass"]``; a string is split
        as a web set's tags are: commas, semicolons, ``|``, else spaces) embedded through the method's tag
        branch (or, for a model trained with its tags through the sentence branch, as the tag string through that
        branch), scored against the same image embeddings as a sentence. A free tag list has no ground truth."""
        from crossview.data.readers._common import split_tags

        check_direction("t2i")
        if not self.has_tag_branch:
            raise CrossViewError(f"this run's method {self.method.name!r} has no tag branch, so it cannot rank "
                                 "images for a tag list; query with a sentence, or open a webly run")
        if self._image_index is None:
            raise CrossViewError("a caption-corpus gallery has no images to rank; choose a split as the gallery")
        tag_list = split_tags(tags)
        if not tag_list:
            raise CrossViewError("give at least one tag, e.g. dog, grass, run")
        if not bool(getattr(self.method, "has_tag_branch", True)):    # tags through the sentence branch
            from crossview.methods.webly import tag_sentences

            sentence = tag_sentences([tag_list])[0]
            data = MethodData(image_features=None, text_features=self._text_rows([sentence], None),
                              captions=[sentence], caption_image=np.full(1, -1, np.int64), name="query")
            q = np.asarray(self.method.encode_texts(data, direction="t2i"), np.float32)
            return self._rank_images(q, {"tags": ", ".join(tag_list)}, k)
        q = np.asarray(self.method.embed_tags([tag_list]), np.float32)
        if not q.any():
            raise CrossViewError(f"tags {', '.join(tag_list)}: none of their words is in the tag branch's "
                                 "vocabulary (GloVe 6B); try common English words")
        return self._rank_images(q, {"tags": ", ".join(tag_list)}, k)

    def _rank_images(self, q: np.ndarray, query: dict[str, Any], k: int) -> Ranking:
        """The gallery's images for one query embedding ``q (1, d)``; a ``"caption"`` in ``query`` names the
        ground truth (its image)."""
        indices, top, scores, exact = self._search("t2i", q, k)
        gold = np.zeros(0, dtype=np.int64)
        gold_pos = np.zeros(0, dtype=np.int64)
        if "caption" in query:
            img = int(self.dataset.caption_image[query["caption"]])
            hit = np.flatnonzero(self.gallery_images == img)
            gold_pos, gold = hit, self.gallery_images[hit]
        return Ranking("t2i", items=self.gallery_images[indices], scores=top, gold=gold,
                       gold_ranks=ranks_of(scores, gold_pos), gallery_size=self.n_gallery_images,
                       exact=exact, query=query)

    # ------------------------------------------------------------------ scoring
    @property
    def scoring(self) -> str:
        """The scoring queries are ranked by (:mod:`crossview.eval.scoring`): ``"plain"`` unless set."""
        return self.scoring_record.get("scoring", "plain")

    def set_scoring(self, scorers: dict[str, Any] | None, record: dict[str, Any] | None = None) -> None:
        """Rank by ``scorers`` from now on (``{"i2t", "t2i"}`` :class:`~crossview.eval.scoring.Scorer` over the
        run's training bank, :func:`crossview.engine.scoring.run_scorers`), or by the plain dot product (None).
        ``record`` is the choice (:func:`crossview.engine.scoring.choose_scoring`), shown by the app and the CLI."""
        plain = scorers is None or scorers["i2t"].scoring == "plain"
        self._scorers = None if plain else scorers
        self._scoring_stats = {}
        self.scoring_record = {"scoring": "plain"} if plain else dict(record or {"scoring": scorers["i2t"].scoring,
                                                                                 "param": scorers["i2t"].param})

    def _search(self, direction: str, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """``(top-k gallery positions, their scores (k,) float32, all the gallery's scores (n,), exact)`` of one
        query ``q (1, d)``: through the index for plain scoring, else re-scored over the whole gallery (the
        gallery's bank statistics computed once)."""
        emb = self._caption_emb if direction == "i2t" else self._image_emb
        index = self._caption_index if direction == "i2t" else self._image_index
        if emb is None or index is None:
            what = "captions" if direction == "i2t" else "images"
            raise CrossViewError(f"this retriever holds no {what} of gallery {self.gallery_name!r} to rank")
        scorers = getattr(self, "_scorers", None)
        if scorers is None:
            res = index.search(q, k)
            return res.indices[0], res.scores[0], emb @ q[0], res.exact
        from crossview.eval.metrics import top_k

        scorer = scorers[direction]
        if direction not in self._scoring_stats:
            self._scoring_stats[direction] = scorer.prepare(emb)
        scores = scorer.scores(q, emb, self._scoring_stats[direction])[0]
        idx = top_k(scores[None, :], k)[0]
        return idx, scores[idx].astype(np.float32), scores, True
