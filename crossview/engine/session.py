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

from crossview.errors import CrossViewError

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
    def eval_split(self) -> str:
        """The split the run was evaluated on (``config.json``), which every view of the run defaults to."""
        split = self.config.get("split") or self.summary.get("split")
        if isinstance(split, str) and split in self.dataset.splits:
            return split
        return "test" if "test" in self.dataset.splits else next(iter(self.dataset.split_names), "all")

    def retriever(self, gallery: Any = None, index_backend: str = "exact", device: str = "cpu") -> Any:
        """A :class:`~crossview.engine.retriever.Retriever` over ``gallery`` (split name, ``"all"`` or a
        corpus); by default the run's evaluation split, so ranks match the run's metrics."""
        from crossview.engine.retriever import Retriever
        return Retriever(self.method, self.dataset, self.features,
                         gallery=self.eval_split if gallery is None else gallery, index_backend=index_backend,
                         device=device)


def open_run(run_dir: str | Path, dataset: Any = None, *, progress: Any = None,
             should_stop: Any = None) -> OpenRun:
    """Load the run in ``run_dir`` (see the module docstring); ``progress(stage, done, total)``."""
    from crossview.engine.io import load_checkpoint, read_json
    from crossview.engine.run import CHECKPOINT, CONFIG, SUMMARY, _load
    from crossview.features import extract_features
    from crossview.methods import create_method

    folder = Path(run_dir)
    if not (folder / CONFIG).is_file():
        raise CrossViewError(f"{folder}: not a run folder (no {CONFIG})")
    if not (folder / CHECKPOINT).is_file():
        raise CrossViewError(f"{folder}: the run has no checkpoint yet; let it train (or resume it) first")
    config = read_json(folder / CONFIG)
    summary = read_json(folder / SUMMARY) if (folder / SUMMARY).is_file() else {}
    ckpt = load_checkpoint(folder / CHECKPOINT)
    state = ckpt.get("method_state")
    if not state:
        raise CrossViewError(f"{folder / CHECKPOINT}: no method state in the checkpoint")
    method = create_method(state.get("method") or config["method"]).load_state_dict(state)
    if not method.is_fitted:
        raise CrossViewError(f"{folder}: the checkpoint was written before the method learned anything; "
                             f"resume the run with 'crossview train --resume {folder}'")
    if dataset is None:
        if not config.get("data"):
            raise CrossViewError(f"{folder}: the run was trained on an in-memory dataset; open it with that dataset")
        dataset, _ = _load(config["data"], config.get("data_format"), config.get("image_root"))
    want = config.get("dataset_fingerprint")
    if want and dataset.fingerprint() != want:
        raise CrossViewError(f"{folder}: dataset {dataset.name!r} is not the one this run was trained on "
                             f"(fingerprint {dataset.fingerprint()} != {want})")
    from crossview.engine.splits import apply_derived_splits
    dataset = apply_derived_splits(dataset, config.get("derived_splits"))
    text_model = None
    tm = ckpt.get("text_model")
    if tm and tm.get("state"):
        from crossview.features.text import TextEncoder
        text_model = TextEncoder.from_state_dict(tm["state"])
    spec = ckpt.get("features") or {}
    if spec.get("representation"):
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


def _representation_features(dataset: Any, config: dict[str, Any], spec: dict[str, Any], progress: Any,
                             should_stop: Any) -> Any:
    """A TR / CTR run's features, rebuilt from the representation its checkpoint saved (nothing refitted)."""
    from crossview.features.topics import restore_representation_features

    return restore_representation_features(dataset, spec["representation"], fit_on=config.get("train_split", "train"),
                                           progress=progress, should_stop=should_stop)


def list_runs(root: str | Path | None = None) -> list[Path]:
    """Run folders under ``root`` (default: the user's runs folder), newest first, the trials of searches
    (folders with a ``tune.json``) included."""
    from crossview.settings import get_settings

    base = Path(root) if root is not None else get_settings().runs_dir
    if not base.is_dir():
        return []
    runs = []
    for p in base.iterdir():
        if (p / "config.json").is_file():
            runs.append(p)
        elif (p / "tune.json").is_file():          # a search (crossview tune): its trials are runs too
            runs.extend(q for q in p.iterdir() if (q / "config.json").is_file())
    return sorted(runs, key=lambda p: (p / "config.json").stat().st_mtime, reverse=True)
