"""The feature stage of a run: the features a method trains on, made (or taken) before fitting.

:class:`FeatureStage` checks, before any folder is made, what the run asked for (the method's own representation,
BITR's TR / CTR; a recorded representation; the encoders and their weights), extracts the features as events
(:meth:`FeatureStage.extract`; each progress event names its plan stage: ``images``, ``text model``,
``captions``, ``features`` for a representation, ``auxiliary`` for a second dataset), fits and applies the run's
normalisations on the training rows (:meth:`FeatureStage.normalize`), and hands a method the second datasets and
the caption encoder it asks for (:meth:`FeatureStage.auxiliary`). The run (:mod:`crossview.engine.run`) drives it
and logs what it yields.

All feature work is a generator of ``(stage, done, total)`` reports: the encoders' extraction
(:func:`crossview.features.iter_extract_features`, built on the encoders' ``iter_encode_paths`` / ``iter_encode``)
and the representations built from image regions (BITR's TR / CTR and the recorded modern / TR / CTR,
:mod:`crossview.features.topics`' ``iter_*``). It is driven here between two steps and yielded as the run's own
progress events: no thread, and a cancel (closing the run's generator) closes it at the next step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.events import Event, Log, Progress
from crossview.core.io import load_checkpoint
from crossview.engine.run_folder import CHECKPOINT, CONFIG

__all__ = ["FeatureStage"]


class FeatureStage:
    """The features of one execution of a run. ``features`` is given (tune passes them; an ``(image, text)`` pair
    or a :class:`crossview.features.Features`) or made by :meth:`extract`; ``emit`` is the run's logger of
    events (it returns the event). Construction checks everything and touches nothing."""

    def __init__(self, cfg: Any, dataset: Any, method: Any, device: str, *, features: Any = None, cache: Any = None,
                 run_dir: Path, resuming: bool = False, emit: Callable[[Event], Event] = lambda ev: ev) -> None:
        self.cfg = cfg
        self.dataset = dataset
        self.method = method
        self.device = device
        self.cache = cache
        self.run_dir = run_dir
        self.resuming = resuming
        self._emit = emit
        self.features = features
        self.norm_states: dict[str, Any] = {}
        self.text_note: str | None = None
        if not method.needs_text_features and cfg.text_encoder != "none":
            if cfg.text_encoder:
                self.text_note = (f"text encoder {cfg.text_encoder!r} is not used: {cfg.method} with these parameters "
                                  "reads the captions itself")
            cfg.text_encoder = "none"      # no caption features to make (nor to record in config.json)
        self.representation = self._check_representation()
        if self.representation is not None:
            self.features = None   # TR / CTR build their own; given encoder features (tune passes them) don't apply
        self.built = self._check_built_representation()
        if self.features is None and self.representation is None and self.built is None:
            from crossview.features.preflight import check_encoders
            check_encoders(self.dataset, cfg.image_encoder, cfg.text_encoder)

    def _path(self, name: str) -> Path:
        return self.run_dir / name

    def plan(self) -> list[tuple[str, str, str, float]]:
        """This stage's part of the run's plan: ``(stage, label, encoder, units)`` for each piece of work it will do
        (none when the features are given)."""
        from crossview.features.image import DEFAULT_IMAGE_ENCODER
        from crossview.features.text.base import DEFAULT_TEXT_ENCODER

        ds, work = self.dataset, []
        if self.features is None:
            if self.representation is not None or self.built is not None:
                name = str((self.representation or self.built or {}).get("name", "representation"))
                work.append(("features", f"{name} features", name, float(ds.n_images)))
            else:
                if getattr(ds, "image_paths", None) is not None and self.cfg.image_encoder != "precomp":
                    enc = self.cfg.image_encoder or DEFAULT_IMAGE_ENCODER
                    work.append(("images", f"image features ({enc})", enc, float(ds.n_images)))
                if self.cfg.text_encoder != "none":
                    from crossview.features.text import create_text_encoder

                    enc = self.cfg.text_encoder or DEFAULT_TEXT_ENCODER
                    try:
                        fits = create_text_encoder(enc).needs_fit
                    except (CrossViewError, ValueError, TypeError):
                        fits = True                            # say so at extraction; plan it meanwhile
                    if fits:    # MiniLM, GloVe: nothing to fit, no stage (it was planned anyway: 1.5 s of a 45 s
                        # run that never came, and the ETA's end overshot)
                        n_fit = int(np.isin(ds.caption_image, np.asarray(ds.splits[self.cfg.train_split])).sum())
                        work.append(("text model", f"text model ({enc})", enc, float(n_fit)))
                    work.append(("captions", f"caption features ({enc})", enc, float(ds.n_captions)))
        want = getattr(self.method, "auxiliary_datasets", None)
        if want is not None and want():
            work.append(("auxiliary", "second dataset's features", "auxiliary", 0.0))
        return work

    def spec(self) -> tuple[dict[str, Any], Any]:
        """``(feature spec, text model state)`` of the features made: what the checkpoint keeps so that a resume
        and ``open_run`` rebuild the same features (encoders, dimensions, normalisations, a fitted text model)."""
        f = self.features
        spec = {"image_encoder": f.image_encoder, "text_encoder": f.text_encoder, "image_dim": int(f.image.shape[1]),
                "text_dim": None if f.text is None else int(f.text.shape[1]), **(f.spec or {}),
                "norm_states": self.norm_states}
        tm, state = getattr(f, "text_model", None), None
        if tm is not None and hasattr(tm, "state_dict"):
            try:
                state = {"name": tm.name, "state": tm.state_dict()}
            except Exception:  # noqa: BLE001 - optional: queries can re-fit the encoder
                state = None
        return spec, state

    def _check_representation(self) -> dict[str, Any] | None:
        """The representation the method asks its features to be (BITR's ``representation=tr|ctr``),
        checked against the data and the encoders before anything is made; ``None`` for the encoders'."""
        from crossview.features.topics import check_run_representation, representation_request

        req = representation_request(self.method)
        if req is not None:
            check_run_representation(self.dataset, req, image_encoder=self.cfg.image_encoder,
                                     text_encoder=self.cfg.text_encoder)
        return req

    def _check_built_representation(self) -> dict[str, Any] | None:
        """The run's recorded representation (``cfg.representation``: modern / TR / CTR built by
        :func:`crossview.features.topics.build_representation`), checked against the data, the encoders and
        the method; ``None`` when the run is on its encoders' features."""
        from crossview.features.topics import check_representation, check_representation_record

        record = self.cfg.representation
        if record is None:
            return None
        name, params = check_representation_record(record)
        if self.representation is not None:
            raise CrossViewError(f"{self.cfg.method} is set to build its own representation "
                                 f"({self.representation.get('name')}) and the run is on representation {name}; "
                                 f"drop one of them")
        if self.cfg.image_encoder is not None and self.cfg.image_encoder != params.get("image_encoder"):
            raise CrossViewError(f"the run is on representation {name}, which names its own image encoder "
                                 f"({params.get('image_encoder') or 'the default'}); drop --image-encoder "
                                 f"{self.cfg.image_encoder} or put it in the representation")
        check_representation(self.dataset, name, image_encoder=params.get("image_encoder"),
                             text_encoder=None if self.cfg.text_encoder == "none" else self.cfg.text_encoder)
        return dict(record)

    def extract(self) -> Iterator[Event]:
        """The run's features: a generator of ``(stage, done, total)`` (:func:`crossview.features.
        iter_extract_features`, or a representation's, :mod:`crossview.features.topics`) driven here, between two
        steps, as the run's own events (closing the run closes it)."""
        if self.representation is not None:
            work = self._representation_features()
        elif self.built is not None:
            from crossview.features.topics import iter_rebuild_representation_features
            work = iter_rebuild_representation_features(self.dataset, self.built, fit_on=self.cfg.train_split,
                                                        cache=self.cache, device=self.device,
                                                        where=f"{self._path(CONFIG)}")
        else:
            from crossview.features import iter_extract_features
            work = iter_extract_features(self.dataset, self.cfg.image_encoder, self.cfg.text_encoder,
                                         fit_on=self.cfg.train_split, cache=self.cache, device=self.device)
        self.features = yield from self._events(work, "features", self.plan_stage_of)

    def _events(self, work: Iterator[tuple[str, int, int]], what: str,
                plan_stage: Callable[[str], str]) -> Iterator[Event]:
        """``work``'s ``(stage, done, total)`` reports as the run's progress events (``"features: images"``, plan
        stage ``images``); returns its result. Closing this (a cancelled run) closes ``work``, which frees its
        decoding workers."""
        try:
            while True:
                try:
                    stage, done, total = next(work)
                except StopIteration as end:
                    return end.value
                yield self._emit(Progress(done, total, f"{what}: {stage}", stage=plan_stage(stage)))
        finally:
            work.close()

    def plan_stage_of(self, stage: str) -> str:
        """The plan's stage of one of feature extraction's stages (``images``, ``fit text``, ``captions``)."""
        if self.representation is not None or self.built is not None:
            return "features"
        return {"fit text": "text model"}.get(stage, stage)

    def _representation_features(self) -> Iterator[tuple[str, int, int]]:
        """TR / CTR features fitted on the training split, as a generator of reports that returns them; the
        fitted state goes into the feature spec (``spec["representation"]``), hence into the checkpoint, and
        open_run rebuilds them from it."""
        from crossview.features.topics import (iter_representation_features, iter_restore_representation_features,
                                               representation_request)

        if self.resuming and self._path(CHECKPOINT).is_file():     # continue on the very features trained on
            saved = (load_checkpoint(self._path(CHECKPOINT)).get("features") or {}).get("representation")
            if saved:
                return iter_restore_representation_features(self.dataset, saved, fit_on=self.cfg.train_split,
                                                            cache=self.cache, device=self.device)
        req = representation_request(self.method) or {}   # again: the engine has set the method's seed since
        return iter_representation_features(self.dataset, image_encoder=self.cfg.image_encoder,
                                            fit_on=self.cfg.train_split, cache=self.cache, device=self.device,
                                            **req)

    def normalize(self) -> None:
        """Fit the run's feature normalisations on the training rows and apply them (queries too)."""
        from crossview.features.normalize import normalize_features

        ds = self.dataset
        train_images = np.asarray(ds.splits[self.cfg.train_split], dtype=np.int64)
        in_train = np.zeros(ds.n_images, dtype=bool)
        in_train[train_images] = True
        train_captions = np.flatnonzero(in_train[ds.caption_image])
        self.features, self.norm_states = normalize_features(self.features, self.cfg.image_norm,
                                                             self.cfg.text_norm, train_images, train_captions)

    def auxiliary(self) -> Iterator[Event]:
        """The second datasets a method trains on besides the run's (``auxiliary_datasets()``: name -> path,
        e.g. webly's web image-tag set): loaded, their images encoded with the run's image encoder (the feature
        cache serves a resume) and normalised as the run's, then handed to ``set_auxiliary``."""
        self.text_encoder()
        want = getattr(self.method, "auxiliary_datasets", None)
        if want is None or not want():
            return
        from crossview.features import iter_extract_features

        for name, source in want().items():
            if source == "demo":
                from crossview.data.demo import load_demo_web
                ds = load_demo_web()
            else:
                from crossview.data import load_dataset
                ds = load_dataset(str(source), format=getattr(self.method, "auxiliary_format", {}).get(name))
            if not getattr(ds, "image_paths", None):
                raise CrossViewError(f"{name} set {source}: no image files to encode (a {ds.format} dataset of "
                                     "feature rows); give a folder or list of images with their tags")
            encoder = self.features.image_encoder
            from crossview.features.image import parse_image_encoder
            try:
                parse_image_encoder(str(encoder))      # a backbone, NAME:flip or NAME+NAME: files encode as the run's
            except CrossViewError:
                raise CrossViewError(f"{name} set {source}: its images must be encoded as the run's are, but this "
                                     f"run's image features are {encoder!r} (precomputed); train on a dataset of "
                                     "image files with an image encoder") from None
            rows = self._own_rows(ds.image_paths)
            if rows is None:
                feats = yield from self._events(iter_extract_features(
                    ds, encoder, "none", fit_on="train", cache=self.cache, device=self.device),
                    f"{name} set features", lambda _stage: "auxiliary")
                rows = feats.image
                if self.features.image_transform is not None:
                    rows = self.features.image_transform(rows)
                how = ""
            else:
                how = "; its images are this dataset's own: their rows taken from the run's features, not encoded again"
            self.method.set_auxiliary(name, ds, rows)
            yield self._emit(Log(f"{name} set: {ds.name} ({ds.n_images:,} images, {encoder} features) from "
                                 f"{source}{how}"))

    def _own_rows(self, paths: Any) -> np.ndarray | None:
        """The run's (normalised) image rows of ``paths`` when every one of them is an image file of the run's own
        dataset (e.g. ``crossview data make-web``'s set of its training photos): the same files through the same
        encoder and normalisation, so encoding them again would give the same rows; None otherwise (a file that is
        not the dataset's, a dataset without image files, rows that are not one per image)."""
        own = getattr(self.dataset, "image_paths", None)
        image = self.features.image
        if not own or not paths or image is None or image.shape[0] != len(own):
            return None

        def key(p: Any) -> str:
            return os.path.normcase(os.path.realpath(str(p)))

        index = {key(p): i for i, p in enumerate(own)}
        rows = [index.get(key(p)) for p in paths]
        if any(r is None for r in rows):
            return None
        return np.ascontiguousarray(np.asarray(image)[np.asarray(rows, dtype=np.int64)])

    def text_encoder(self) -> None:
        """Hand a method that encodes strings of its own as the run's captions are (``set_text_encoder``, e.g.
        webly's tag strings through the sentence branch) the run's text encoder and normalisation."""
        take = getattr(self.method, "set_text_encoder", None)
        if take is None:
            return
        from crossview.features import encode_texts

        features, device = self.features, self.device
        take(lambda captions: encode_texts(features, captions, device=device))
