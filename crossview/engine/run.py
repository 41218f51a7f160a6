"""The training loop: a run in a folder, driven by a generator of events.

This module orchestrates one execution (:class:`_Run`): checks, the lock, config / status / checkpoint, the stage
plan and its timing, resume and cancel. The work is done by its stages, each a module: the run folder's files and
lock (:mod:`crossview.engine.run_folder`), the features (:mod:`crossview.engine.feature_stage`), and fitting and
evaluating (:mod:`crossview.engine.fit_stage`).

:func:`train` loads the dataset, gets features through :func:`crossview.features.extract_features`,
builds :class:`~crossview.methods.base.MethodData` for the train / val / evaluation splits, drains the
method's ``fit_iter`` while logging every event, checkpoints periodically and at the end, evaluates on
the chosen split and writes the run folder::

    RUN_DIR/
      config.json     what was asked for: method, params, data, split, encoders, device, seeds, versions
      metrics.jsonl   one event per line, appended and flushed as it happens
      status.json     "running" | "finished" | "cancelled" | "failed", the phase, the events so far and
                      where the last checkpoint is (checkpoint_events, checkpoint_step), rewritten just after
                      every checkpoint so that after a SIGKILL it says what a resume continues from (a kill
                      between the two writes leaves it one checkpoint behind; the checkpoint itself decides)
      writer.lock     the OS lock held by the one process writing the run (writer.json: its PID, host,
                      start time); a second writer is refused, a lock left by a dead process is taken over
      checkpoint.pt   method state + feature spec + RNG states (temp file in the folder, then os.replace)
      ranks.npz       per-query ranks of the final evaluation: i2t (n_images,), t2i (n_captions,)
      embeddings_<split>.npz  the evaluated split's embeddings (crossview.eval.embeddings), for `crossview eval`
      bank_<train split>.npz  the training split's embeddings (at most 5,000 images): the bank that hubness-aware
                      scoring normalises with (crossview.engine.scoring; `crossview eval RUN --scoring csls`)
      summary.json    {"method", "dataset", "split", "i2t": {R@1, R@5, R@10, MedR, MeanR}, "t2i": {...},
                       "rsum", "train_seconds", ...}  (R@K in percent, ranks 1-based)

Every JSON file and the checkpoint are written atomically, so a crash or a SIGKILL at any moment
leaves the previous version readable. Cancelling is the consumer stopping the iteration (``close()``
on the generator, or just dropping it): the run stops at the current event, i.e. within one batch or
cutting-plane iteration, writes a checkpoint and ``status.json`` = ``"cancelled"``, and
:func:`resume` continues it later (iterative methods from their saved state, closed-form ones refit).

On resume, the lines of ``metrics.jsonl`` that training wrote after the checkpoint (its byte offset
is in the checkpoint) are superseded: they are **trimmed** (the file rewritten through a temp file and
``os.replace``; ``log`` lines are kept), so the curves read back never go backwards.
"""

from __future__ import annotations

import glob
import os
import platform
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.events import CheckpointSaved, Event, Finished, Log, Plan, Progress
from crossview.core.io import EventLog, atomic_write_json, drop_pages, load_checkpoint, save_checkpoint
from crossview.core.errors import Cancelled, CrossViewError, is_storage_error, storage_error
from crossview.core.run_settings import RunSettings, check_checkpoint_seconds, check_seed, split_run_settings
# the folder's files, readers, lock and checkpoint checks (re-exported: scripts import them from here)
from crossview.engine.run_folder import (CHECKPOINT, CONFIG, LOCK, LOCK_INFO, METRICS, RANKS, STATUS, SUMMARY,  # noqa: F401
                                         SUMMARY_KEYS, _FORMAT, _METRIC_KEYS, _Loaded, _WriterLock, _check_checkpoint,
                                         _checkpoint_info, _holder_info, _locked_message, _new_lock, _now,
                                         _trim_metrics, _stat_key, default_run_dir, read_config, read_status,
                                         read_summary, run_is_locked)
# Light modules imported here, not lazily: the app calls train() on its GUI thread (checks only, no heavy
# work), and a first import there holds the GIL (bench/gui_latency.py saw a 0.5 s stall).
from crossview.engine import splits as _splits  # noqa: F401
from crossview.engine.feature_stage import FeatureStage
from crossview.engine.fit_stage import FitStage, selection_record
from crossview.features import normalize as _normalize, preflight as _preflight  # noqa: F401

__all__ = ["train", "resume", "RunConfig", "RunIterator", "selection_record", "SUMMARY_KEYS", "CONFIG", "METRICS", "CHECKPOINT", "RANKS",
           "SUMMARY", "STATUS", "LOCK", "default_run_dir", "read_summary", "read_status", "read_config",
           "run_is_locked"]

# Progress events are logged at most this often (all of them still reach the consumer).
_PROGRESS_LOG_SECONDS = 0.5


@dataclass
class RunConfig:
    """What a run was asked to do (the content of ``config.json``, less the recorded environment)."""

    method: str
    data: str | None
    params: dict[str, Any]
    split: str | None = None
    train_split: str = "train"
    val_split: str | None = "val"
    data_format: str | None = None
    image_root: str | None = None
    image_encoder: str | None = None
    text_encoder: str | None = None
    #: feature normalisations (crossview.features.normalize); runs written before they existed used "none";
    #: None (a new run not told): the method's defaults, filled in when the run's method is made
    image_norm: str | None = "none"
    text_norm: str | None = "none"
    # the run settings as asked (crossview.core.run_settings.RunSettings holds them resolved, once per execution)
    device: str = "auto"
    seed: int = 0
    checkpoint_seconds: float = 60.0
    amp: bool = False
    #: data-loader workers / n_jobs, and the loss-logging cadence (None: each method's own default)
    workers: int | None = None
    log_every: int | None = None
    #: splits the run made itself (a held-out part of train), applied whenever the run is opened or resumed
    derived_splits: dict[str, list[int]] | None = None
    #: the representation the run's features are built on instead of its encoders' (``{"name": "modern" |
    #: "tr" | "ctr", ...}``, crossview.features.topics.representation_record), rebuilt by resume and open_run
    representation: dict[str, Any] | None = None
    #: the dataset's text view the run trains on (its labels or its captions' phrases as the text side,
    #: crossview.data.views), applied again by resume and open_run to the dataset they load
    text_view: dict[str, Any] | None = None
    #: the method's parameters as the user gave them (run settings among them included); None: ``params``
    user_params: dict[str, Any] | None = None
    #: how the run's parameters were chosen before it started (a search's refit: ``{"what": "parameters",
    #: "by": "search", "selected_on": "train-cv3", "reported_on": "val", ...}``); ``None``: given by the user
    selection: dict[str, Any] | None = None
    #: the scoring the run ranks by (crossview.engine.scoring.resolve_run_scoring: ``{"scoring", "param_name",
    #: "param", "selected_on"}``); its evaluation, summary and ranks are under it. None (a run written before runs
    #: recorded one): plain
    scoring: dict[str, Any] | None = None


def _distributed(device: str) -> tuple[int, int]:
    """``(rank, world_size)``: ``(0, 1)`` for one process; under ``torchrun`` (``WORLD_SIZE`` > 1) the
    process group is started (gloo on CPUs, NCCL on GPUs) and this process's place in it returned."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    from crossview.core.devices import torch_device
    from crossview.nn.trainer import init_distributed

    return init_distributed(torch_device(device))


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _broadcast_path(folder: Path) -> Path:
    """Rank 0's run folder on every rank (a default folder name carries a time stamp)."""
    import torch.distributed as dist

    box = [str(folder)]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def _seed_everything(seed: int) -> dict[str, int]:
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return {"python": seed, "numpy": seed % 2**32, "torch": seed}


def _rng_state() -> dict[str, Any]:
    import torch
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch
    if "python" in state:
        random.setstate(state["python"])
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "torch" in state:
        torch.set_rng_state(state["torch"])


def _coerce_features(features: Any) -> Any:
    """A :class:`crossview.features.Features`, or ``(image, text)`` arrays wrapped as one."""
    from crossview.features import Features

    if features is None or isinstance(features, Features):
        return features
    if isinstance(features, (tuple, list)) and len(features) == 2:
        image, text = features
        return Features(image=np.asarray(image, dtype=np.float32),
                        text=None if text is None else (text.tocsr().astype(np.float32) if hasattr(text, "tocsr")
                                                        else np.asarray(text, dtype=np.float32)),  # type: ignore
                        image_encoder="given", text_encoder="given")
    raise CrossViewError(f"features must be a crossview.features.Features or an (image, text) pair of arrays, "
                         f"got {type(features).__name__}")


class _Run:
    """One execution of a run (a fresh start or a resume). Use through :func:`train` / :func:`resume`."""

    def __init__(self, cfg: RunConfig, run_dir: Path, dataset: Any, features: Any, resuming: bool,
                 cache: Any = None, checkpoint: _Loaded | None = None, split_note: str | None = None) -> None:
        from crossview.core.devices import select_device
        from crossview.engine.splits import apply_derived_splits, plan_splits
        from crossview.methods import create_method

        # Everything a user typed is checked here, before the folder is made and before any feature
        # extraction or training: splits, device, method parameters (ranges, grids), encoders and weights.
        self.cfg = cfg
        self.run_dir = run_dir
        self.dataset = apply_derived_splits(dataset, cfg.derived_splits)
        self.resuming = resuming
        self.cache = cache
        self.split_note = split_note
        self.default_notes: list[str] = []     # why a method's own default was not taken as it is
        plan_splits(self.dataset, cfg.split, cfg.train_split, cfg.val_split, cfg.seed)
        self.device = select_device(cfg.device)
        # under torchrun every process trains; rank 0 alone writes the run folder (see _follow)
        self.rank, self.world_size = _distributed(self.device)
        # how this execution runs, resolved once: the method gets it (configure_run), config.json records it
        self.settings = RunSettings(device=self.device, amp=bool(cfg.amp), seed=int(cfg.seed), workers=cfg.workers,
                                    log_every=cfg.log_every, checkpoint_seconds=float(cfg.checkpoint_seconds),
                                    rank=self.rank, world_size=self.world_size, train_split=cfg.train_split,
                                    val_split=cfg.val_split, eval_split=str(cfg.split))
        # the one method object of this execution
        self.method = create_method(cfg.method, **cfg.params)   # checks the parameter names
        self.method.configure_run(self.settings)
        self.method.check_params()
        self.method.check_dataset(self.dataset)       # labels / tags it trains on: said before the folder is made
        from crossview.features.normalize import check_norm
        from crossview.methods import default_norms_for
        if cfg.image_norm is None or cfg.text_norm is None:      # not given: the method's own defaults
            own = default_norms_for(self.method)
            cfg.image_norm = own[0] if cfg.image_norm is None else cfg.image_norm
            cfg.text_norm = own[1] if cfg.text_norm is None else cfg.text_norm
        check_norm(cfg.image_norm, "image normalisation (--image-norm)")
        check_norm(cfg.text_norm, "text normalisation (--text-norm)")
        if features is None and cfg.representation is None:     # not given: the method's own feature pipelines
            from crossview.methods import default_encoders_for
            own_image, own_text = default_encoders_for(self.method)
            if cfg.image_encoder is None and own_image and getattr(self.dataset, "image_paths", None) is not None:
                cfg.image_encoder = own_image
                from crossview.features.image import MIRROR_WORDS_SHARE, mirror_words_share, parse_image_encoder, \
                    without_flip
                if parse_image_encoder(own_image)[1]:
                    train_caps = _split_captions(self.dataset, cfg.train_split)
                    share = mirror_words_share(train_caps)
                    if share >= MIRROR_WORDS_SHARE:       # mirror-invariant features cannot tell left from right
                        cfg.image_encoder = without_flip(own_image)
                        self.default_notes.append(
                            f"image encoder {cfg.image_encoder}, not the method's {own_image}: {share:.0%} of the "
                            "training captions say left or right, which features averaged with the mirror image "
                            "cannot tell apart")
            if cfg.text_encoder is None and own_text:
                cfg.text_encoder = own_text
        # the features: given, or extracted / built by the feature stage (checked now, made in execute)
        self.stage = FeatureStage(cfg, self.dataset, self.method, self.device, features=_coerce_features(features),
                                  cache=cache, run_dir=run_dir, resuming=resuming, emit=lambda ev: self._emit(ev))
        # fitting and evaluating: counts the method's events and training seconds, checkpoints on its cadence
        self.fitting = FitStage(cfg, self.method, self.dataset, self.settings, run_dir, emit=lambda ev: self._emit(ev),
                                checkpoint=lambda: self._checkpoint())
        self.phase = "start"            # start -> training -> trained -> finished
        self.feature_spec: dict[str, Any] = {}
        self.text_model_state: Any = None
        self._log: EventLog | None = None
        self._last_progress_log = 0.0
        self._ckpt_info: dict[str, Any] = {}   # where the last checkpoint is, for status.json
        self._loaded = checkpoint              # read by resume() before the dataset (see _Loaded)
        self._lock = _WriterLock(run_dir)
        # the stage plan (crossview.core.events.Plan) and each stage's timing: seconds are *active* ones, the
        # time the consumer held the generator at a yield (a paused app, a slow terminal) left out
        self._suspended = 0.0    # added to by the RunIterator between handing out an event and being asked again
        self._stage_work: dict[str, tuple[str, float]] = {}     # stage -> (detail, units) for the timing book
        self._stage_now: dict[str, Any] | None = None           # the stage being timed
        self._stage_mark: float | None = None                   # active seconds when the last stage ended

    @property
    def features(self) -> Any:
        """The run's features (the feature stage's: given, extracted, normalised)."""
        return self.stage.features

    # the fit stage's counts, which the checkpoint and status.json record (a resume restores them)
    @property
    def events(self) -> int:
        """Events received from ``fit_iter`` so far, over resumes."""
        return self.fitting.events

    @events.setter
    def events(self, value: int) -> None:
        self.fitting.events = value

    @property
    def train_seconds(self) -> float:
        """Seconds spent fitting, accumulated over resumes."""
        return self.fitting.train_seconds

    @train_seconds.setter
    def train_seconds(self, value: float) -> None:
        self.fitting.train_seconds = value

    @property
    def step(self) -> int | None:
        """The step of the last Loss / Progress the method yielded."""
        return self.fitting.step

    @step.setter
    def step(self, value: int | None) -> None:
        self.fitting.step = value

    # ------------------------------------------------------------------ files
    def _path(self, name: str) -> Path:
        return self.run_dir / name

    def _status(self, status: str, **extra: Any) -> None:
        atomic_write_json(self._path(STATUS), {"status": status, "phase": self.phase, "events": self.events,
                                               "train_seconds": round(self.train_seconds, 3),
                                               "updated": _now(), **self._ckpt_info, **extra})

    def _emit(self, ev: Event) -> Event:
        if isinstance(ev, Progress) and ev.stage:
            self._time_stage(ev)
        if self._log is None:          # a process of rank > 0 under torchrun writes nothing
            return ev
        if isinstance(ev, Progress):
            now = time.monotonic()
            if now - self._last_progress_log < _PROGRESS_LOG_SECONDS and ev.step not in (0, ev.total):
                return ev
            self._last_progress_log = now
        self._log.write(ev)
        return ev

    # ------------------------------------------------------------------ the stage plan
    def _active(self) -> float:
        """Seconds of work so far: the clock less the time spent suspended at a yield."""
        return time.monotonic() - self._suspended

    def _plan(self) -> Plan:
        """The stages this execution will go through, with the seconds each is expected to take here (the
        timing book of :mod:`crossview.engine.timings`); a stage whose work is cached reports itself done at
        once and the estimators skip it."""
        from crossview.engine.timings import TimingBook

        book, ds, dev = TimingBook(), self.dataset, self.device
        work: list[tuple[str, str, str, float]] = self.stage.plan()    # (stage, label, detail, units)
        if self.phase != "trained":
            params = self.method.get_params()
            epochs = next((params[k] for k in ("max_epochs", "epochs", "n_epochs") if isinstance(params.get(k), int)
                           and not isinstance(params.get(k), bool)), 1)
            n_train = len(ds.splits[self.cfg.train_split])
            n_caps = int(np.isin(ds.caption_image, np.asarray(ds.splits[self.cfg.train_split])).sum()) + \
                int(np.isin(ds.caption_image, np.asarray(ds.splits[self.cfg.split])).sum())
            extra = getattr(self.method, "plan_stages", None)     # e.g. timam's token states before fitting
            work.extend(extra(n_caps) if callable(extra) else [])
            work.append(("fit", f"fitting {self.cfg.method}", self.cfg.method, n_train * max(1, epochs)))
        n_eval = int(np.isin(ds.caption_image, np.asarray(ds.splits[self.cfg.split])).sum())
        work.append(("evaluate", f"evaluating on {self.cfg.split}", self.cfg.method, n_eval))
        self._stage_work = {stage: (detail, float(units)) for stage, _label, detail, units in work}
        return Plan([{"name": stage, "label": label,
                      "seconds": round(book.expect(stage, detail, dev, units), 3) if units else 0.0}
                     for stage, label, detail, units in work])

    def _time_stage(self, ev: Progress) -> None:
        """Time the stages named by progress events; a stage that did work records its seconds per unit."""
        now = self._active()
        frac = ev.fraction if ev.total else 0.0
        cur = self._stage_now
        if cur is not None and cur["name"] != ev.stage:
            self._end_stage(now)
            cur = None
        if cur is None:
            start = now if self._stage_mark is None else self._stage_mark
            cur = self._stage_now = {"name": ev.stage, "start": start, "first": frac, "last": frac}
        cur["last"] = max(cur["last"], frac)
        if ev.total and ev.step >= ev.total:
            self._end_stage(now)

    def _end_stage(self, now: float) -> None:
        cur, self._stage_now = self._stage_now, None
        self._stage_mark = now
        if cur is None or cur["first"] >= 1.0:        # done at its first event: cached, nothing measured
            return
        detail, units = self._stage_work.get(cur["name"], ("", 0.0))
        share = max(0.0, cur["last"] - cur["first"])
        if units > 0 and share > 0.5:                 # a stage stopped early says little about its speed
            from crossview.engine.timings import TimingBook
            TimingBook().record(cur["name"], detail, self.device, units * share, now - cur["start"])

    def _checkpoint(self, status: str | None = "running") -> CheckpointSaved:
        """Write the checkpoint, then (unless ``status`` is None) ``status.json`` saying where it is."""
        payload = {
            "phase": self.phase,
            "events": self.events,
            "step": self.step,
            # metrics.jsonl up to here matches this state; a resume trims what training logged after it
            "log_bytes": self._log.size() if self._log is not None else None,
            "train_seconds": self.train_seconds,
            "method_state": self.method.checkpoint_state(),
            "features": self.feature_spec,
            "text_model": self.text_model_state,
            "rng": _rng_state(),
            "config": self.cfg.__dict__,
            "saved": _now(),
        }
        save_checkpoint(self._path(CHECKPOINT), payload)
        self._ckpt_info = _checkpoint_info(payload)
        if status is not None:
            self._status(status)
        return CheckpointSaved(str(self._path(CHECKPOINT)), self.events)

    def _write_config(self, seeds: dict[str, int]) -> None:
        import torch

        from crossview import __version__

        cfg = dict(self.cfg.__dict__)
        cfg.update({
            "format": _FORMAT,
            "params": self.method.saved_params(),
            "user_params": dict(self.cfg.params if self.cfg.user_params is None else self.cfg.user_params),
            "dataset": self.dataset.name,
            "dataset_fingerprint": self.dataset.fingerprint(),
            "device_selected": self.device,
            "run_settings": self.settings.to_dict(),
            "seeds": seeds,
            "created": _now(),
            "versions": {"crossview": __version__, "python": platform.python_version(),
                         "numpy": np.__version__, "torch": torch.__version__},
        })
        atomic_write_json(self._path(CONFIG), cfg)

    # ------------------------------------------------------------------ stages
    def _initial_state(self) -> Iterator[Event]:
        """A fresh run of a method that starts from another run's trained state (``initial_run()`` names its
        folder, e.g. webly's ``init_from``: Stage II from a finished Stage I run): that run's checkpoint is read
        as data, its features must be this run's (encoders, dimensions, normalisations), and the method takes
        its state (``set_initial_state``)."""
        want = getattr(self.method, "initial_run", None)
        source = str(want() or "") if want is not None else ""
        if not source:
            return
        src = Path(source).expanduser()
        path = src / CHECKPOINT
        if not path.is_file():
            raise CrossViewError(f"init_from {source}: no {CHECKPOINT} there; give the folder of a finished run")
        ckpt = load_checkpoint(path)
        _check_checkpoint(ckpt, path)
        theirs = ckpt.get("features") if isinstance(ckpt.get("features"), dict) else {}
        cfg = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
        f = self.features
        mine = {"image_encoder": f.image_encoder, "text_encoder": f.text_encoder, "image_dim": int(f.image.shape[1]),
                "text_dim": None if f.text is None else int(f.text.shape[1])}
        differ = [f"{k} {theirs.get(k)!r} there, {mine.get(k)!r} here" for k in
                  ("image_encoder", "text_encoder", "image_dim", "text_dim") if theirs.get(k) != mine.get(k)]
        differ += [f"{k} {cfg.get(k, 'none')!r} there, {getattr(self.cfg, k)!r} here" for k in
                   ("image_norm", "text_norm") if cfg.get(k, "none") != getattr(self.cfg, k)]
        if differ:
            raise CrossViewError(f"init_from {source}: that run's features are not this run's ({'; '.join(differ)});"
                                 " start this run with the same encoders and normalisations")
        note = self.method.set_initial_state(ckpt["method_state"], str(src))
        if cfg.get("data") and self.cfg.data and str(cfg.get("data")) != str(self.cfg.data):
            note = f"{note}; note: that run trained on {cfg.get('data')}, this one on {self.cfg.data}"
        yield self._emit(Log(note))

    def _method_data(self) -> tuple[Any, Any, Any]:
        from crossview.data.method_data import MethodData

        f = self.features
        text = f.text
        ds = self.dataset
        names = None
        if ds.label_sets is not None:
            names = sorted({str(x) for s in ds.label_sets for x in s})
        # a method that trains end to end (vsepp image_model=cnn) gets the image files beside the feature rows
        files = bool(getattr(self.method, "wants_image_files", False)) and getattr(ds, "image_paths", None) is not None
        train = MethodData.from_features(ds, f.image, text, self.cfg.train_split, label_set_names=names,
                                         with_paths=files)
        val = None
        vs = self.cfg.val_split
        if vs and vs in ds.splits and vs not in (self.cfg.split, self.cfg.train_split):
            val = MethodData.from_features(ds, f.image, text, vs, label_set_names=names, with_paths=files)
        test = MethodData.from_features(ds, f.image, text, self.cfg.split, label_set_names=names, with_paths=files)
        return train, val, test

    def _continues(self, ckpt: dict[str, Any] | None) -> bool:
        """Whether training continues from ``ckpt`` (iterative methods, or a finished fit) or starts over."""
        return ckpt is not None and (ckpt["phase"] == "trained" or bool(self.method.iterative))

    def _restore(self) -> bool:
        """Load the last checkpoint when resuming; True when training continues from it."""
        ckpt = self._loaded.ckpt if self._loaded is not None else None
        if ckpt is None:
            return False
        self.events = ckpt["events"]
        self.train_seconds = float(ckpt["train_seconds"])
        if not self._continues(ckpt):
            return False  # closed form: refit
        try:
            self.method.load_state_dict(ckpt["method_state"])
        except CrossViewError:
            raise
        except Exception as e:  # noqa: BLE001 - a state this method cannot take: damaged or foreign
            raise CrossViewError(f"{self._path(CHECKPOINT)}: the method state does not fit {self.cfg.method!r} "
                                 f"({type(e).__name__}: {e}); the checkpoint is damaged: start a new run") from None
        if isinstance(ckpt.get("rng"), dict):
            try:
                _set_rng_state(ckpt["rng"])
            except (TypeError, ValueError, KeyError, RuntimeError):
                pass   # a damaged RNG state only costs exact reproducibility
        self.phase = ckpt["phase"]
        self.step = _checkpoint_info(ckpt)["checkpoint_step"]
        return True

    def _start_writing(self) -> str | None:
        """Under the lock: drop killed writes' temp files, re-read a checkpoint that changed since
        :func:`resume` read it, and trim ``metrics.jsonl`` of what training logged after it."""
        for tmp in glob.glob(str(self.run_dir / ".*.tmp")):
            try:
                os.unlink(tmp)   # a write that was killed (checkpoint, JSON); the previous file is intact
            except OSError:
                pass
        if not self.resuming:
            return None
        path = self._path(CHECKPOINT)
        if self._loaded is None or self._loaded.stat != _stat_key(path):
            self._loaded = _Loaded.read(path)
        ckpt = self._loaded.ckpt
        if ckpt is not None:
            self._ckpt_info = _checkpoint_info(ckpt)
        keep = ckpt.get("log_bytes") if ckpt is not None and self._continues(ckpt) else 0
        dropped = _trim_metrics(self._path(METRICS), keep if isinstance(keep, int) else None,
                                ckpt["events"] if ckpt is not None else None)
        return (f"metrics.jsonl: dropped {dropped} line(s) logged after the checkpoint (superseded by this resume)"
                if dropped else None)

    # ------------------------------------------------------------------ the run
    def _follow(self) -> Iterator[Event]:
        """A process of rank > 0 under ``torchrun``: the same data, features and training as rank 0 (DDP
        keeps the weights equal), but nothing written: no folder, lock, log, checkpoint or summary. Its
        events are yielded to the caller only (the CLI of a rank > 0 prints nothing)."""
        _seed_everything(self.cfg.seed)
        _barrier()                        # rank 0 has extracted the features (into the cache) by now
        if self.features is None:
            for _ in self.stage.extract():
                pass
        self.stage.normalize()
        train, val, _test = self._method_data()
        for _ in self.stage.auxiliary():
            pass
        continued = self.resuming and self._restore()
        if not continued:
            for _ in self._initial_state():
                pass
        if self.phase != "trained":
            yield from self.method.fit_iter(train, val, resume=continued)

    def execute(self) -> Iterator[Event]:
        if self.rank != 0:
            yield from self._follow()
            return
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise (storage_error(e, self.run_dir) if is_storage_error(e) else e) from None
        took_over = self._lock.acquire()      # raises, touching nothing, when another process writes the run
        try:
            if not self.resuming and self._path(CONFIG).exists():
                raise CrossViewError(f"{self.run_dir} already holds a run; continue it with 'crossview train "
                                     f"--resume {self.run_dir}' or choose another --run-dir")
            trimmed = self._start_writing()
            self._log = EventLog(self._path(METRICS), fsync=False)
        except BaseException:
            self._lock.release()
            raise
        try:
            yield from self._execute(took_over, trimmed)
        finally:
            self._lock.release()

    def _execute(self, took_over: str | None, trimmed: str | None) -> Iterator[Event]:
        assert self._log is not None
        status = "failed"
        error: str | None = None
        try:
            seeds = _seed_everything(self.cfg.seed)
            if not self.resuming:
                self._write_config(seeds)
            self._status("running")
            yield self._emit(Log(f"{'resuming' if self.resuming else 'starting'} {self.cfg.method} on "
                                 f"{self.dataset.name} ({self.dataset.n_images} images, "
                                 f"{self.dataset.n_captions} captions), {self.settings.describe()}"))
            for warning in self.dataset.warnings:      # what the reader skipped or repaired (never in silence)
                yield self._emit(Log(f"dataset: {warning}", "warning"))
            for note in (took_over, trimmed):
                if note:
                    yield self._emit(Log(note, "warning" if note is took_over else "info"))
            for note in self.default_notes:
                yield self._emit(Log(note))
            if self.split_note:
                yield self._emit(Log(self.split_note))
            if self.stage.text_note:
                yield self._emit(Log(self.stage.text_note))
            yield self._emit(Log(f"splits: training on {self.cfg.train_split} "
                                 f"({len(self.dataset.splits[self.cfg.train_split]):,} images), "
                                 + (f"early stopping on {self.cfg.val_split}, " if self.cfg.val_split and
                                    self.cfg.val_split in self.dataset.splits else "")
                                 + f"evaluating on {self.cfg.split} "
                                   f"({len(self.dataset.splits[self.cfg.split]):,} images)"))
            yield self._emit(self._plan())
            self._stage_mark = self._active()
            t0 = time.monotonic()
            if self.features is None:
                yield from self.stage.extract()
            if self.world_size > 1:
                _barrier()                # the other ranks now read the features from the cache
            self.stage.normalize()
            f = self.features
            features_seconds = time.monotonic() - t0
            self.feature_spec, self.text_model_state = self.stage.spec()
            text = (f"text {f.text_encoder} {f.text.shape[1]}-d" if f.text is not None
                    else "no caption features (the method reads the captions itself)")
            yield self._emit(Log(f"features: image {f.image_encoder} {f.image.shape[1]}-d, {text} "
                                 f"({features_seconds:.1f} s)"))
            train, val, test = self._method_data()
            yield from self.stage.auxiliary()

            continued = self.resuming and self._restore()
            if self.resuming:
                yield self._emit(Log("continuing from the last checkpoint" if continued else
                                     "no usable checkpoint state: training from the start"))
            if not continued:
                yield from self._initial_state()
            if self.phase != "trained":
                self.phase = "training"
                yield from self.fitting.fit(train, val, resume=continued)
                self.phase = "trained"
                yield self._emit(self._checkpoint())
            # training read every row of the features; the evaluation reads its split's and the bank's: a
            # file-backed matrix (the normalised features at COCO size, the feature cache's) gives the rest back
            drop_pages(self.features.image)
            summary = yield from self.fitting.evaluate(test, self.features, features_seconds, train)
            self.phase = "finished"
            status = "finished"
            self._status("finished")
            yield self._emit(Finished(summary))
        except GeneratorExit:
            status = "cancelled"
            raise
        except Cancelled as e:
            status, error = "cancelled", str(e)
            raise
        except KeyboardInterrupt:
            # Raised in the middle of the method's work, not at a yield: its state may be half-updated,
            # so the last complete checkpoint stands (the CLI turns Ctrl-C into a clean close()).
            status, error = "interrupted", "interrupted (KeyboardInterrupt); the last checkpoint is kept"
            raise
        except BaseException as e:
            error = f"{type(e).__name__}: {e}"
            raise
        finally:
            if status != "finished":
                self._finish_unfinished(status, error)
            self._log.close()

    def _finish_unfinished(self, status: str, error: str | None) -> None:
        """A cancelled or failed run: checkpoint the training state reached (so resume continues
        there) and record the status. Never raises over the original exception."""
        try:
            # The method is suspended at a yield (between batches / iterations), so its state is consistent.
            if status == "cancelled" and self.phase == "training":
                self._checkpoint(status=None)
            if status == "interrupted":
                status = "cancelled"      # the last complete checkpoint stands
            ckpt = CHECKPOINT if self._path(CHECKPOINT).is_file() else None
            self._status(status, error=error, checkpoint=ckpt)
            if self._log is not None:
                self._log.write(Log(f"run {status}" + (f": {error}" if error else ""),
                                    "warning" if status == "cancelled" else "error"))
        except Exception:  # noqa: BLE001 - the original exception matters more
            pass



class RunIterator:
    """The events of a run (what :func:`train` and :func:`resume` return): iterate it to drive the run,
    ``close()`` it (or stop iterating and drop it) to cancel. ``run_dir`` is the run's folder."""

    def __init__(self, gen: Iterator[Event], run_dir: Path, run: Any = None) -> None:
        self._gen = gen
        self.run_dir = run_dir
        self._run = run                       # told how long the consumer held each event (see _Run._active)
        self._returned: float | None = None

    def __iter__(self) -> "RunIterator":
        return self

    def __next__(self) -> Event:
        if self._run is not None and self._returned is not None:
            self._run._suspended += time.monotonic() - self._returned    # a pause is not the run's time
        ev = next(self._gen)
        self._returned = time.monotonic()
        return ev

    def close(self) -> None:
        """Cancel: the run stops at the current event, checkpoints and records ``"cancelled"``."""
        close = getattr(self._gen, "close", None)
        if close is not None:
            close()


def _load(data: Any, data_format: str | None, image_root: str | None) -> tuple[Any, str | None]:
    """``(dataset, source)``: a PairedDataset passed in, or one loaded from a path / ``"demo"``."""
    from crossview.data.dataset import PairedDataset

    if isinstance(data, PairedDataset):
        return data, (data.source or None)
    from crossview.data import load_dataset
    ds = load_dataset(str(data), format=data_format, image_root=image_root)
    if not isinstance(ds, PairedDataset):
        raise CrossViewError(f"{data}: this is a text-only corpus ({type(ds).__name__}); training needs images "
                             "paired with captions")
    return ds, str(data)


def _merge_run_settings(from_params: dict[str, Any], given: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """The run settings asked for: each keyword's value (``given``: name -> (value, its default)) unless it is at
    its default and the method's parameters name the setting; a setting given both ways, differently, is refused."""
    out: dict[str, Any] = {}
    for name, (value, default) in given.items():
        if name in from_params:
            theirs = from_params[name]
            if value != default and value != theirs:
                raise CrossViewError(f"{name} is given twice ({value!r} as the run's {name}, {theirs!r} among the "
                                     f"method's parameters); {name} is a run setting: give it once")
            out[name] = theirs
        elif value is not None:
            out[name] = value
    return out


def train(method: str, data: Any = "demo", *, run_dir: str | Path | None = None,
          params: dict[str, Any] | None = None, split: str | None = None, train_split: str = "train",
          val_split: str | None = "val", image_encoder: str | None = None, text_encoder: str | None = None,
          data_format: str | None = None, image_root: str | None = None, device: str = "auto", seed: int = 0,
          checkpoint_seconds: float = 60.0, features: Any = None, cache: Any = None,
          image_norm: str | None = None, text_norm: str | None = None,
          derived_splits: dict[str, Any] | None = None,
          representation: dict[str, Any] | None = None, text_view: Any = None,
          selection: dict[str, Any] | None = None, amp: bool | None = None, workers: int | None = None,
          log_every: int | None = None, scoring: Any = None, scoring_param: float | None = None) -> RunIterator:
    """Train ``method`` on ``data`` in a new run folder, yielding events (the last one ``Finished``).

    ``data`` is a dataset path, ``"demo"``, or a :class:`~crossview.data.dataset.PairedDataset`;
    ``features`` (a :class:`crossview.features.Features` or an ``(image (n_images, d), text
    (n_captions, e))`` pair for the whole dataset) skips extraction. ``run_dir`` defaults to
    :func:`default_run_dir`. The method is trained on ``train_split`` (with ``val_split`` for early
    stopping when the dataset has it) and evaluated on ``split``; ``split=None`` evaluates on ``test``, else
    ``val``, else a held-out part of train (:mod:`crossview.engine.splits`), and the run records which.
    ``image_norm`` / ``text_norm`` normalise the features first (:mod:`crossview.features.normalize`;
    default: the method's ``default_image_norm`` / ``default_text_norm``). ``derived_splits`` (split name
    -> image indices, e.g. an experiment's fold from :func:`crossview.engine.splits.fold_splits`) are added
    to the dataset's splits before the split rule runs and recorded in ``config.json``, like ``heldout``, so
    a resume or ``open_run`` sees them again. ``representation`` (``{"name": "modern" | "tr" | "ctr", ...}``,
    :func:`crossview.features.topics.representation_record`) builds the features on that representation of
    paper 001 (fitted on ``train_split``) instead of the encoders', and is recorded in ``config.json`` so that
    a resume and ``open_run`` rebuild them; given ``features`` must then be that representation's.
    ``text_view`` (``"labels"`` or ``{"kind": "phrases", "min_images": N}``, :mod:`crossview.data.views`) trains
    on the dataset's labels or its captions' phrases as the text side, and is recorded likewise. ``selection``
    says how ``params`` were chosen (a search's refit, :func:`crossview.engine.tune.tune`); the summary carries it
    with the method's own choices (:func:`selection_record`). ``device``, ``seed``, ``amp``, ``workers``,
    ``log_every`` and ``checkpoint_seconds`` are the run's settings (:class:`crossview.core.run_settings.RunSettings`),
    never the method's parameters: given in ``params`` (``--set amp=true``) they are taken out of them into the
    settings; given both ways with different values they are refused. ``scoring`` is how the run ranks and is
    evaluated (:func:`crossview.engine.scoring.resolve_run_scoring`): None / ``"plain"`` (the library's default, so
    the papers' experiments and searches stay plain), ``"default"`` (the method's default scoring, what the command
    line and the app ask for), or a scoring name with ``scoring_param`` (else chosen on a hold-out of the training
    bank); it is recorded in config.json, and the summary's metrics are under it (the plain ones kept as
    ``metrics_plain``). Stop iterating to cancel.

    Bad input (unknown method or parameter, missing split, a folder that already holds a run, an
    unavailable device) raises :class:`CrossViewError` before the folder is created.
    """
    from crossview.engine.splits import plan_splits
    from crossview.data.views import apply_text_view, check_text_view

    hyper, asked = split_run_settings(dict(params or {}))
    run = _merge_run_settings(asked, {"device": (device, "auto"), "seed": (seed, 0), "amp": (amp, None),
                                      "workers": (workers, None), "log_every": (log_every, None)})
    # run settings are checked before any work: a bad seed must not fail the run after its training
    device, seed = str(run.get("device", device)), check_seed(run.get("seed", seed))
    checkpoint_seconds = check_checkpoint_seconds(checkpoint_seconds)
    ds, source = _load(data, data_format, image_root)
    view = check_text_view(text_view)
    if view is not None and ds.meta.get("text_view") is None:
        ds = apply_text_view(ds, view)
    given = _splits.checked_derived_splits(ds, derived_splits)
    ds = _splits.apply_derived_splits(ds, given)
    plan = plan_splits(ds, split, train_split, val_split, seed)
    from crossview.engine.scoring import resolve_run_scoring
    scoring_record = resolve_run_scoring(method, scoring, scoring_param)
    cfg = RunConfig(method=method, data=source, params=hyper, split=plan.eval,
                    train_split=plan.train, val_split=plan.val, data_format=data_format, image_root=image_root,
                    image_encoder=image_encoder, text_encoder=text_encoder, device=device, seed=seed,
                    checkpoint_seconds=checkpoint_seconds, derived_splits={**given, **plan.derived} or None,
                    representation=None if representation is None else dict(representation), text_view=view,
                    image_norm=image_norm, text_norm=text_norm,     # None: the method's (set by _Run)
                    selection=None if selection is None else dict(selection), amp=bool(run.get("amp", False)),
                    workers=run.get("workers"), log_every=run.get("log_every"), user_params=dict(params or {}),
                    scoring=scoring_record)
    folder = Path(run_dir) if run_dir is not None else default_run_dir(method, ds.name)
    rank, world_size = _distributed(device)
    if world_size > 1:
        folder = _broadcast_path(folder)
    if rank == 0 and (folder / CONFIG).exists():
        raise CrossViewError(f"{folder} already holds a run; continue it with 'crossview train --resume {folder}' "
                             "or choose another --run-dir")
    if folder.exists() and not folder.is_dir():
        raise CrossViewError(f"{folder} is a file; give a folder for --run-dir")
    run = _Run(cfg, folder, ds, features, resuming=False, cache=cache, split_note=plan.note)
    return RunIterator(run.execute(), folder, run)


def resume(run_dir: str | Path, *, data: Any = None, features: Any = None, device: str | None = None,
           cache: Any = None) -> RunIterator:
    """Continue the run in ``run_dir`` from its last checkpoint, yielding events like :func:`train`.

    Iterative methods continue from their saved state; closed-form ones refit. The dataset is loaded
    again from the run's ``config.json`` unless ``data`` (and optionally ``features``) is given; it
    must be the same data (same fingerprint). A finished run just yields its ``Finished`` summary.
    A run another process is writing, a damaged ``config.json`` / ``status.json`` or a checkpoint
    that is not one this version wrote raise :class:`CrossViewError` (before the data is loaded).
    """
    folder = Path(run_dir)
    if not (folder / CONFIG).is_file():
        raise CrossViewError(f"{folder}: not a run folder (no {CONFIG}); give the --run-dir of an earlier "
                             "'crossview train'")
    raw = read_config(folder)
    if raw.get("method") == "fused":     # a fused run is finished by fusing its members again
        from crossview.engine.fuse import iter_fuse
        return RunIterator(iter_fuse(run_dir=folder), folder)
    fields = set(RunConfig.__dataclass_fields__)
    cfg = RunConfig(**{k: v for k, v in raw.items() if k in fields})
    # the method's parameters as the run recorded them, every default resolved (the user's alone would take today's
    # defaults: a run resumed after a default moved would go on, or refit, as another model), less the run settings
    # among them (a run written before they were kept apart has its amp / seed / workers there): those are the run's,
    # and a device asked now wins
    recorded = raw.get("params") if isinstance(raw.get("params"), dict) else raw.get("user_params", cfg.params)
    cfg.params, asked = split_run_settings(dict(recorded))
    old_run = "run_settings" not in raw     # its seed param, if any, seeded the method; the run's seed did not
    for name, value in asked.items():
        if name not in raw or (old_run and name != "device"):
            setattr(cfg, name, value)
    if device is not None:
        cfg.device = device
    rank, _ = _distributed(cfg.device)
    holder = run_is_locked(folder) if rank == 0 else None    # under torchrun rank 0 alone writes
    if holder is not None:
        raise CrossViewError(_locked_message(folder, _holder_info(folder)))
    redo = ""
    if (folder / STATUS).is_file() and read_status(folder).get("status") == "finished":
        redo = _missing_outputs(folder, cfg.split)
        if not redo:
            summary = read_summary(folder)

            def done() -> Iterator[Event]:
                yield Log(f"{folder} has already finished; nothing to resume")
                yield Finished(summary)
            return RunIterator(done(), folder)
    loaded = _Loaded.read(folder / CHECKPOINT)   # before loading the data: a bad checkpoint fails fast
    if data is None:
        if not cfg.data:
            raise CrossViewError(f"{folder}: this run was trained on an in-memory dataset with no source file; "
                                 "pass the same dataset again (resume(run_dir, data=dataset))")
        data = cfg.data
    ds, _ = _load(data, cfg.data_format, cfg.image_root)
    if cfg.text_view is not None and ds.meta.get("text_view") is None:
        from crossview.data.views import apply_text_view
        ds = apply_text_view(ds, cfg.text_view)
    want = raw.get("dataset_fingerprint")
    if want and ds.fingerprint() != want:
        raise CrossViewError(f"{folder}: the dataset {cfg.data or ds.name!r} has changed since the run started "
                             f"(fingerprint {ds.fingerprint()} != {want}); start a new run instead of resuming")
    run = _Run(cfg, folder, ds, features, resuming=True, cache=cache, checkpoint=loaded)
    if not redo:
        return RunIterator(run.execute(), folder, run)
    how = ("evaluating it again from its checkpoint" if loaded.ckpt is not None else
           "its checkpoint is missing too, so it trains again from the start with the same settings")

    def again() -> Iterator[Event]:
        yield Log(f"{folder} finished, but {redo}: {how}", "warning")
        yield from run.execute()
    return RunIterator(again(), folder, run)


def _missing_outputs(folder: Path, split: str | None) -> str:
    """What a finished run lacks of what it wrote when it finished (its summary, checkpoint, evaluation embeddings,
    ranks), damaged counting as missing; ``""`` when it is whole. A resume then evaluates it again instead of
    answering "nothing to resume" (the advice every reader of such a run gives)."""
    missing = []
    try:
        read_summary(folder)
    except CrossViewError:
        missing.append(f"its {SUMMARY} is missing or damaged")
    if not (folder / CHECKPOINT).is_file():
        missing.append(f"its {CHECKPOINT} is missing")
    if split and not (folder / f"embeddings_{split}.npz").is_file():
        missing.append(f"its embeddings_{split}.npz is missing")
    if not (folder / RANKS).is_file():
        missing.append(f"its {RANKS} is missing")
    return "; ".join(missing)


def _split_captions(ds: Any, split: str) -> list[str]:
    """The captions of the images of ``split`` of ``ds`` (all captions when it has no such split)."""
    captions = list(getattr(ds, "captions", []) or [])
    splits = getattr(ds, "splits", {}) or {}
    if split not in splits:
        return captions
    keep = set(int(i) for i in splits[split])
    ci = getattr(ds, "caption_image", None)
    if ci is None:
        return captions
    return [c for c, i in zip(captions, ci) if int(i) in keep]
