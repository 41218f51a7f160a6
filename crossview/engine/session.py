"""Open a finished (or checkpointed) run for querying: its method, dataset, features and a Retriever.

``open_run(run_dir)`` reads ``config.json`` and ``checkpoint.pt``, rebuilds the method from its state,
loads the run's dataset again (or takes the one given), gets the features through the feature cache
(a hit when the run extracted them on this machine) with the run's own fitted text encoder from the
checkpoint, and checks the dataset is the one the run was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossview.core.errors import CrossViewError
from crossview.engine.runs import list_runs, load_fitted  # noqa: F401  (list_runs: for older imports)

__all__ = ["OpenRun", "open_run", "list_runs"]


@dataclass
class OpenRun:
    """A run ready to answer queries."""

    run_dir: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    method: Any
    dataset: Any
    features: Any

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def model_key(self) -> str | None:
        """The run's key in the gallery cache (:func:`crossview.engine.gallery_cache.model_key`: its checkpoint's
        content and dataset), or None when the checkpoint cannot be read now."""
        from crossview.engine.gallery_cache import model_key

        try:
            return model_key(self.run_dir, self.config)
        except OSError:
            return None

    @property
    def eval_split(self) -> str:
        """The split the run was evaluated on (``config.json``), which every view of the run defaults to."""
        split = self.config.get("split") or self.summary.get("split")
        if isinstance(split, str) and split in self.dataset.splits:
            return split
        return "test" if "test" in self.dataset.splits else next(iter(self.dataset.split_names), "all")

    def retriever(self, gallery: Any = None, index_backend: str = "exact", device: str = "cpu",
                  scoring: str = "plain", param: float | None = None, choice: dict[str, Any] | None = None,
                  **options: Any) -> Any:
        """A :class:`~crossview.engine.retriever.Retriever` over ``gallery`` (split name, ``"all"``, a
        corpus or a :class:`~crossview.data.photos.PhotoFolder`); by default the run's evaluation split, so ranks
        match the run's metrics. ``scoring`` (:mod:`crossview.eval.scoring`) re-scores its queries with the run's
        training bank (:func:`crossview.engine.scoring.apply_scoring`; ``choice``'s parameter, a record made already,
        else ``param`` as given, else the cross-validated choice the run recorded, else chosen on a hold-out of
        train). ``options``: the Retriever's ``cache``, ``progress`` and ``should_stop`` (a corpus's or a photo
        folder's encoding) and ``model_key`` (default: the run's, so the gallery's embeddings are cached under its
        checkpoint: :mod:`crossview.engine.gallery_cache`)."""
        from crossview.engine.retriever import Retriever
        from crossview.eval.scoring import check_scoring

        check_scoring(scoring)
        if "model_key" not in options and options.get("cache") is not False:
            options["model_key"] = self.model_key
        r = Retriever(self.method, self.dataset, self.features,
                      gallery=self.eval_split if gallery is None else gallery, index_backend=index_backend,
                      device=device, **options)
        if scoring != "plain":
            from crossview.engine.scoring import apply_scoring
            apply_scoring(self, r, scoring, param, choice=choice)
        return r


def open_run(run_dir: str | Path, dataset: Any = None, *, progress: Any = None,
             should_stop: Any = None) -> OpenRun:
    """Load the run in ``run_dir`` (see the module docstring); ``progress(stage, done, total)``."""
    from crossview.core.io import load_checkpoint
    from crossview.engine.run import CHECKPOINT, CONFIG, SUMMARY, _load, read_config, read_summary
    from crossview.features import extract_features

    folder = Path(run_dir)
    if not (folder / CONFIG).is_file():
        raise CrossViewError(f"{folder}: not a run folder (no {CONFIG})")
    from crossview.engine.fuse import is_fused_run, open_fused_run
    if is_fused_run(folder):     # its members' methods and features, joined (crossview.engine.fuse)
        return open_fused_run(folder, dataset, progress=progress, should_stop=should_stop)
    if not (folder / CHECKPOINT).is_file():
        raise CrossViewError(f"{folder}: the run has no checkpoint yet; let it train (or resume it) first")
    config = read_config(folder)
    summary = read_summary(folder) if (folder / SUMMARY).is_file() else {}
    ckpt = load_checkpoint(folder / CHECKPOINT)      # weights-only: a planted pickle never runs
    method = load_fitted(folder, ckpt)
    if dataset is None:
        if not config.get("data"):
            raise CrossViewError(f"{folder}: the run was trained on an in-memory dataset; open it with that dataset")
        dataset, _ = _load(config["data"], config.get("data_format"), config.get("image_root"))
    if config.get("text_view") is not None and dataset.meta.get("text_view") is None:
        from crossview.data.views import apply_text_view
        dataset = apply_text_view(dataset, config["text_view"])
    want = config.get("dataset_fingerprint")
    if want and dataset.fingerprint() != want:
        raise CrossViewError(f"{folder}: dataset {dataset.name!r} is not the one this run was trained on "
                             f"(fingerprint {dataset.fingerprint()} != {want})")
    from crossview.engine.splits import apply_derived_splits
    dataset = apply_derived_splits(dataset, config.get("derived_splits"))
    text_model = None
    tm = ckpt.get("text_model")
    if isinstance(tm, dict) and tm.get("state"):
        from crossview.features.text import TextEncoder
        try:
            text_model = TextEncoder.from_state_dict(tm["state"])
        except CrossViewError:
            raise
        except Exception as e:  # noqa: BLE001 - a state the encoder cannot take: damaged
            raise CrossViewError(f"{folder / CHECKPOINT}: the saved text encoder is damaged ({type(e).__name__}: "
                                 f"{e}); train again") from None
    spec = ckpt.get("features")
    spec = spec if isinstance(spec, dict) else {}
    record, where = config.get("representation"), f"{folder / CONFIG}"
    if record is None and not spec.get("representation") and _old_experiment_trial(spec, config):
        record, where = _old_trial_representation(folder, spec), f"{folder.parent / 'experiment.json'}"
    if record is not None:      # modern / TR / CTR, rebuilt as the run built them
        from crossview.features.topics import rebuild_representation_features
        features = rebuild_representation_features(dataset, record, fit_on=config.get("train_split", "train"),
                                                   progress=progress, should_stop=should_stop, where=where)
    elif spec.get("representation"):
        features = _representation_features(dataset, config, spec, progress, should_stop)
    else:
        features = extract_features(dataset, spec.get("image_encoder") or config.get("image_encoder"),
                                    spec.get("text_encoder") or config.get("text_encoder"),
                                    fit_on=config.get("train_split", "train"), text_model=text_model,
                                    progress=progress, should_stop=should_stop)
    from crossview.features.normalize import restore_normalized
    features = restore_normalized(features, spec.get("norm_states"))
    return OpenRun(run_dir=folder, config=config, summary=summary, method=method, dataset=dataset,
                   features=features)


def _old_experiment_trial(spec: dict[str, Any], config: dict[str, Any]) -> bool:
    """A trial written by ``crossview experiment bitr-table`` before its runs recorded their representation:
    features named ``<encoder>+modern`` (or ``+tr`` / ``+ctr``), which no encoder is."""
    name = str(spec.get("image_encoder") or config.get("image_encoder") or "")
    return name.rsplit("+", 1)[-1] in ("modern", "tr", "ctr") and "+" in name


def _old_trial_representation(folder: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """The representation of an older trial, from its experiment's ``experiment.json`` (the folder above)."""
    from crossview.core.io import read_json
    from crossview.features.topics import check_representation_record

    path = folder.parent / "experiment.json"
    try:
        exp = read_json(path) if path.is_file() else None
    except CrossViewError:
        exp = None
    if isinstance(exp, dict) and isinstance(exp.get("representation_params"), dict):
        record = {"name": exp.get("representation"), **exp["representation_params"]}
        try:
            check_representation_record(record)
            return record
        except CrossViewError:
            pass
    raise CrossViewError(f"{folder}: a trial of a BITR-table experiment whose features ({spec.get('image_encoder')}) "
                         f"cannot be rebuilt without its experiment's {path.name} (missing or damaged); run the "
                         "experiment again with a new --out folder")


def _representation_features(dataset: Any, config: dict[str, Any], spec: dict[str, Any], progress: Any,
                             should_stop: Any) -> Any:
    """A TR / CTR run's features, rebuilt from the representation its checkpoint saved (nothing refitted)."""
    from crossview.features.topics import restore_representation_features

    return restore_representation_features(dataset, spec["representation"], fit_on=config.get("train_split", "train"),
                                           progress=progress, should_stop=should_stop)
