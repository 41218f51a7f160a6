"""The fit and evaluation stages of a run: the method trained on the run's features, then scored.

:class:`FitStage` drives ``method.fit_iter`` (:meth:`FitStage.fit`): every event is logged through the run's
logger, counted (``events``, the step of the last loss / progress, the training seconds over resumes), and the run
is checkpointed every ``checkpoint_seconds`` of its settings and after each validation event. :meth:`FitStage.
evaluate` scores the evaluation split and writes ``ranks.npz``, ``embeddings_<split>.npz`` and ``summary.json``
(:mod:`crossview.engine.run_folder`), each of its parts a progress event of the plan's stage ``evaluate``. The
run (:mod:`crossview.engine.run`) owns the folder, the lock, the phase and the checkpoint's content; it hands this
stage its logger (``emit``) and its checkpoint writer (``checkpoint``), and reads back ``events``, ``step`` and
``train_seconds`` for ``status.json`` and the checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.events import Event, Log, Loss, Progress, Validation, relay
from crossview.core.io import atomic_write_json, atomic_writer
from crossview.engine.run_folder import _METRIC_KEYS, RANKS, SUMMARY, _now

__all__ = ["FitStage", "selection_record"]


class _EvalSteps:
    """The parts of a run's evaluation as progress of the plan's stage ``evaluate``: ``(done, UNITS)`` from the
    parts' relative costs (in score products of the split: the ranking forms one, the hubness figure's top 10s most
    of another, csls's re-scoring four more with one model both ways), each event labelled with its part."""

    UNITS = 1000
    COST = {"ranking": 1.0, "embeddings": 0.1, "bank": 0.1, "summary": 0.7, "scores": 4.0}
    LABEL = {"ranking": "ranking", "embeddings": "writing the embeddings", "bank": "the training bank",
             "summary": "intervals and hubness", "scores": "{scoring} scores against the bank"}

    def __init__(self, split: str, scored: bool, scoring: str) -> None:
        self.split, self.scoring = split, scoring
        self.parts = [p for p in self.COST if scored or p != "scores"]
        self.total = sum(self.COST[p] for p in self.parts)

    def at(self, part: str, fraction: float = 0.0) -> Progress:
        before = sum(self.COST[p] for p in self.parts[:self.parts.index(part)]) if part in self.parts else 0.0
        done = int(self.UNITS * (before + min(1.0, max(0.0, fraction)) * self.COST.get(part, 0.0)) / self.total)
        label = self.LABEL[part].format(scoring=self.scoring)
        return Progress(min(done, self.UNITS - 1), self.UNITS, f"evaluating on {self.split}: {label}",
                        stage="evaluate")

    def end(self) -> Progress:
        return Progress(self.UNITS, self.UNITS, f"evaluating on {self.split}", stage="evaluate")


class FitStage:
    """Fitting and evaluating one execution of a run. ``cfg`` is the run's :class:`~crossview.engine.run.RunConfig`,
    ``settings`` its :class:`~crossview.core.run_settings.RunSettings`; ``emit`` logs an event and returns it;
    ``checkpoint()`` writes the run's checkpoint (and ``status.json``) and returns its ``CheckpointSaved`` event.
    ``events`` / ``train_seconds`` / ``step`` start at what a resumed checkpoint says (the run sets them)."""

    def __init__(self, cfg: Any, method: Any, dataset: Any, settings: Any, run_dir: Path, *,
                 emit: Callable[[Event], Event] = lambda ev: ev, checkpoint: Callable[[], Event]) -> None:
        self.cfg = cfg
        self.method = method
        self.dataset = dataset
        self.settings = settings
        self.device = settings.device
        self.run_dir = run_dir
        self._emit = emit
        self._checkpoint = checkpoint
        self.events = 0                 # events received from fit_iter so far
        self.train_seconds = 0.0        # accumulated over resumes
        self.step: int | None = None    # the step of the last Loss / Progress the method yielded
        self.features: Any = None       # the run's features (their encoders go into the summary)

    def _path(self, name: str) -> Path:
        return self.run_dir / name

    def fit(self, train: Any, val: Any, resume: bool) -> Iterator[Event]:
        """Drain ``method.fit_iter(train, val, resume=resume)``, yielding each event logged (a progress event
        without a stage is the plan's ``fit``), counting events and the training seconds, and checkpointing every
        ``checkpoint_seconds`` and after each validation. Closing this closes the method's generator (its own
        clean-up runs) with the training seconds up to date."""
        start = time.monotonic()
        base_seconds = self.train_seconds
        last_ckpt = time.monotonic()
        it = self.method.fit_iter(train, val, resume=resume)
        try:
            for ev in it:
                self.events += 1
                if isinstance(ev, (Loss, Progress)):
                    self.step = ev.step
                if isinstance(ev, Progress) and not ev.stage:
                    ev.stage = "fit"
                self.train_seconds = base_seconds + time.monotonic() - start
                yield self._emit(ev)
                due = time.monotonic() - last_ckpt >= self.settings.checkpoint_seconds
                if due or isinstance(ev, Validation):
                    yield self._emit(self._checkpoint())
                    last_ckpt = time.monotonic()
        finally:
            it.close()  # on cancel: the method's own clean-up runs here
            self.train_seconds = base_seconds + time.monotonic() - start

    def evaluate(self, test: Any, features: Any, features_seconds: float, train: Any = None) -> Iterator[Event]:
        """Score ``test`` (the evaluation split's :class:`~crossview.data.method_data.MethodData`) and write the
        ranks, the embeddings and the summary; returns the summary. ``features`` are the run's (their encoders
        are recorded), ``features_seconds`` the time their stage took. ``train`` (the training split's data)
        gives the scoring bank, ``bank_<train split>.npz`` (:mod:`crossview.engine.scoring`).

        Each part is a progress event of the stage ``evaluate`` naming it (:class:`_EvalSteps`), and the scoring's
        products report as they go: at COCO size the part after the ranking was minutes under one ``0 / 1`` line."""
        from crossview.engine.scoring import PLAIN_RECORD, run_scoring

        self.features = features
        record = run_scoring({"scoring": getattr(self.cfg, "scoring", None)})
        scored = record["scoring"] != "plain"
        steps = _EvalSteps(self.cfg.split, scored and self.cfg.split != self.cfg.train_split, record["scoring"])
        t1 = time.monotonic()
        yield self._emit(steps.at("ranking"))
        res = self.method.evaluate(test, hubness=True)
        eval_seconds = time.monotonic() - t1
        self._write_ranks(res["ranks"], test)
        yield self._emit(steps.at("embeddings"))
        self._write_embeddings(test)
        if scored and self.cfg.split == self.cfg.train_split:
            yield self._emit(Log(f"{record['scoring']} scoring needs a bank of training images apart from the "
                                 f"evaluated split ({self.cfg.split}); this run is scored plain", "warning"))
            record, scored = dict(PLAIN_RECORD), False
            self.cfg.scoring = record
            from crossview.engine.run_folder import CONFIG, read_config
            config = read_config(self.run_dir)
            config["scoring"] = record          # what eval, query and the app then read
            atomic_write_json(self._path(CONFIG), config)
        if train is not None and self.cfg.split != self.cfg.train_split \
                and (scored or not getattr(self.method, "wants_image_files", False)):
            # a model over feature rows encodes its training split in moments; one that reads the image files (a
            # CNN end to end) would add minutes to every plain run: its bank is made here only when the run's own
            # scoring needs it, else on first use
            from crossview.engine.scoring import write_bank
            yield self._emit(steps.at("bank"))
            write_bank(self.run_dir, self.cfg.train_split, self.method, train, seed=self.cfg.seed)
        yield self._emit(steps.at("summary"))
        summary = self._summary(res, test, features_seconds, eval_seconds)
        if scored:
            summary = yield from self._score(summary, record, steps)
        else:
            summary["scoring"] = {**record, "bank": None, "reported_on": self.cfg.split}
        atomic_write_json(self._path(SUMMARY), summary)
        yield self._emit(steps.end())
        return summary

    def _score(self, summary: dict[str, Any], record: dict[str, Any], steps: "_EvalSteps") -> Iterator[Event]:
        """The summary under the run's scoring ``record`` (:mod:`crossview.engine.scoring`): the evaluation
        embeddings just written re-scored against the training bank, ranks.npz rewritten under it (the plain ranks
        kept beside), and config.json's record completed when its parameter was chosen here."""
        from crossview.engine.run_folder import CONFIG, read_config
        from crossview.engine.scoring import (bank_path, describe_run_scoring, iter_score_run_evaluation,
                                              scored_summary, write_scored_ranks)
        from crossview.eval.embeddings import load_embeddings

        t = time.monotonic()
        emb = load_embeddings(self._path(f"embeddings_{self.cfg.split}.npz"))
        bank = load_embeddings(bank_path(self.run_dir, self.cfg.train_split))
        res, chosen = yield from relay(iter_score_run_evaluation(emb, bank, record, self.cfg.seed,
                                                                  self.cfg.train_split),
                                       lambda done, total: self._emit(steps.at("scores", done / total)))
        if chosen is not record:
            self.cfg.scoring = chosen
            config = read_config(self.run_dir)
            config["scoring"] = chosen
            atomic_write_json(self._path(CONFIG), config)
        write_scored_ranks(self.run_dir, res["ranks"])
        out = scored_summary(summary, {**res, "caption_image": emb.caption_image}, chosen, self.cfg.train_split,
                             self.cfg.seed)
        out["eval_seconds"] = round(float(summary.get("eval_seconds") or 0.0) + time.monotonic() - t, 3)
        yield self._emit(Log(f"{describe_run_scoring(chosen, self.cfg.train_split)}: rsum {out['rsum']:.1f} "
                             f"(plain {float(out['metrics_plain']['rsum']):.1f})"))
        return out

    def _write_ranks(self, ranks: dict[str, np.ndarray], test: Any) -> None:
        ds = test.dataset

        def write(f: Any) -> None:
            np.savez(f, i2t=np.asarray(ranks["i2t"], dtype=np.int64), t2i=np.asarray(ranks["t2i"], dtype=np.int64),
                     caption_image=test.caption_image,
                     image_ids=np.asarray(ds.image_ids if ds is not None else np.arange(test.n_images)),
                     caption_ids=np.asarray(ds.caption_ids if ds is not None else np.arange(test.n_captions)))

        atomic_writer(self._path(RANKS), write)

    def _write_embeddings(self, test: Any) -> None:
        """``embeddings_<split>.npz`` (crossview.eval.embeddings): what ``crossview eval RUN`` re-scores
        under any protocol (COCO 1K, identity, caption overlap) without loading the model."""
        from crossview.eval.embeddings import Embeddings, save_embeddings

        m = self.method
        two = getattr(m, "directions_differ", False)
        emb = Embeddings(
            image=m.encode_images(test, direction="i2t"), text=m.encode_texts(test, direction="i2t"),
            caption_image=test.caption_image,
            image_t2i=m.encode_images(test, direction="t2i") if two else None,
            text_t2i=m.encode_texts(test, direction="t2i") if two else None,
            image_labels=test.labels, captions=list(test.captions),
            info={"method": self.cfg.method, "dataset": self.dataset.name, "split": self.cfg.split})
        save_embeddings(self._path(f"embeddings_{self.cfg.split}.npz"), emb)

    def _summary(self, res: dict[str, Any], test: Any, features_seconds: float,
                 eval_seconds: float) -> dict[str, Any]:
        from crossview.eval.bootstrap import bootstrap_ci
        from crossview.eval.embeddings import embeddings_hubness, load_embeddings

        f = self.features
        return {
            "method": self.cfg.method,
            "dataset": self.dataset.name,
            "split": self.cfg.split,
            "i2t": {k: float(res["i2t"][k]) for k in _METRIC_KEYS},
            "t2i": {k: float(res["t2i"][k]) for k in _METRIC_KEYS},
            "rsum": float(res["rsum"]),
            "train_seconds": round(self.train_seconds, 3),
            "status": "finished",
            "params": self.method.saved_params(),
            "image_encoder": f.image_encoder,
            "text_encoder": f.text_encoder,
            "n_images": test.n_images,
            "n_captions": test.n_captions,
            "device": self.device,
            "seed": self.cfg.seed,
            "run_settings": self.settings.to_dict(),
            "features_seconds": round(features_seconds, 3),
            "eval_seconds": round(eval_seconds, 3),
            # how far the numbers can be trusted on this split (crossview.eval.bootstrap)
            "ci": bootstrap_ci(res["ranks"]["i2t"], res["ranks"]["t2i"], test.caption_image, seed=self.cfg.seed),
            # whether a few items fill every top-k list (crossview.eval.hubness): from the ranking's own score
            # blocks, else (a method whose scores are not the embeddings' dot product) from the embeddings just
            # written; only the top-10 indices of each query are kept
            "hubness": res.get("hubness") or embeddings_hubness(
                load_embeddings(self._path(f"embeddings_{self.cfg.split}.npz"))),
            "data": self.cfg.data,
            "run_dir": str(self.run_dir),
            # what was chosen on which images, and where the numbers above are reported (never the same images
            # unless marked optimistic)
            **selection_record(self.cfg, self.method),
            "finished": _now(),
        }


def selection_record(cfg: Any, method: Any) -> dict[str, Any]:
    """``{"selected_on", "reported_on", "optimistic", "choices"}`` of a run: every choice made from data (the
    search that chose its parameters, ``cfg.selection``; the method's own, :meth:`Method.selection_info`: the
    epoch on val, C by cross-validation of train) and the split its metrics are reported on. ``selected_on`` joins
    the distinct places (``"nothing"`` when no choice was made from data); ``optimistic`` is true when one of
    them is the reported split itself."""
    choices: list[dict[str, Any]] = []
    if cfg.selection:
        sel = dict(cfg.selection)
        choices.append({"what": str(sel.get("what", "parameters")), "on": str(sel.get("selected_on", "?")),
                        **({"by": sel["by"]} if "by" in sel else {}),
                        **({"search": sel["search"]} if "search" in sel else {})})
    info = getattr(method, "selection_info", None)
    if info is not None:
        choices.extend(dict(c) for c in info(cfg.train_split, cfg.val_split))
    places = list(dict.fromkeys(c["on"] for c in choices))
    optimistic = cfg.split in places or bool((cfg.selection or {}).get("optimistic"))
    return {"selected_on": ", ".join(places) or "nothing", "reported_on": cfg.split, "optimistic": optimistic,
            "choices": choices}
