"""``TorchMethod``: the method contract on top of the one training loop (:mod:`crossview.nn.trainer`).

A torch method supplies only what is its own:

- ``model_spec(train) -> dict`` (plain values: dimensions, vocabulary sizes) and ``build_model(spec)``;
- ``optimizers(model) -> [optimiser, ...]`` (default: one, from the ``optimizer`` / ``lr`` parameters)
  and ``schedulers(optimizers)`` (default: ``lr`` divided by ``1 / lr_decay`` after ``lr_decay_epoch``
  epochs, when the method has those parameters);
- ``before_training(train, val, model, device)`` (optional, a generator): long set-up that yields its own
  progress events before ``prepare`` (timam: the language model's token states, cached per caption);
- ``prepare(train, device)``: move what ``training_step`` reads to the device;
- ``training_step(model, batch, generator) -> {term: loss}``;
- ``embed_images(data)`` / ``embed_texts(data)`` for inference (float32 numpy).

Here: validation each epoch through ``evaluate`` (rsum; ``validation_score`` may choose another number),
best-epoch weights, early stopping after ``patience`` epochs without improvement, the checkpointable
state at every yield (weights, optimiser / scheduler / scaler state, position, best weights, history)
and resume. Without ``val`` (a run whose val split is its evaluation split), a method with a ``holdout``
parameter holds that fraction of the training images out to choose the epoch; otherwise the last
epoch's weights are kept (the run's evaluation split is never used to choose an epoch).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from crossview.data.method_data import MethodData
from crossview.core.events import Log, Loss, Validation
from crossview.core.errors import CrossViewError
from crossview.core.io import drop_pages, mapped_arrays, scratch_array
from crossview.methods.base import Method
from crossview.nn.trainer import EpochSampler, Trainer, cuda_graphs_wanted, init_distributed, world

__all__ = ["TorchMethod", "tensor_tree", "numpy_tree"]

#: the fewest images on either side of a ``holdout`` split
MIN_HOLDOUT = 10


def numpy_tree(obj: Any) -> Any:
    """A tree with every tensor replaced by a CPU numpy copy (for checkpoints)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy().copy()
    if isinstance(obj, dict):
        return {k: numpy_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [numpy_tree(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(numpy_tree(v) for v in obj)
    return copy.deepcopy(obj)


#: a weight of at least this many bytes kept as the best epoch's goes to a file-backed scratch array (issue 34)
KEPT_SCRATCH_BYTES = 32 * 2**20


def kept_tree(obj: Any) -> Any:
    """:func:`numpy_tree` for weights kept aside while training goes on (the best epoch's): a tensor of
    ``KEPT_SCRATCH_BYTES`` or more is copied, ``KEPT_SCRATCH_BYTES`` at a time, into a file-backed scratch array
    (:func:`~crossview.core.io.scratch_array`) whose pages leave the resident set as they are written. A COCO-size
    TIMAM's identification classifier (0.22 GB) was held in memory beside the live one from the second epoch on;
    now it is on disk (the page cache) until the run ends or saves a checkpoint, which reads it a chunk at a time."""
    if isinstance(obj, torch.Tensor):
        src = obj.detach()
        if src.numel() * src.element_size() < KEPT_SCRATCH_BYTES:
            return numpy_tree(src)
        src = src.cpu().numpy()
        out = scratch_array(src.shape, src.dtype, min_bytes=KEPT_SCRATCH_BYTES)
        flat_src, flat_out = src.reshape(-1), out.reshape(-1)
        step = max(1, KEPT_SCRATCH_BYTES // src.itemsize)
        for start in range(0, flat_src.size, step):
            flat_out[start:start + step] = flat_src[start:start + step]
            drop_pages(out)
        return out
    if isinstance(obj, dict):
        return {k: kept_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [kept_tree(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return copy.deepcopy(obj)


def _numpy_views(obj: Any) -> Any:
    """:func:`numpy_tree` without the copies: a CPU tensor becomes a numpy view of its memory (a CUDA one is copied
    to the host, as it must be)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy()
    if isinstance(obj, dict):
        return {k: _numpy_views(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_numpy_views(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return copy.deepcopy(obj)


def _shared_tree(obj: Any) -> Any:
    """A copy of ``obj``'s containers and plain values whose numpy arrays are the same objects (for a state dict:
    the arrays a method holds are replaced whole, never written in place); tensors become numpy copies."""
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, torch.Tensor):
        return numpy_tree(obj)
    if isinstance(obj, dict):
        return {k: _shared_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_shared_tree(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return copy.deepcopy(obj)


def _tensor_views(obj: Any) -> Any:
    """:func:`tensor_tree` without the copies where it can (writable arrays become tensors over their memory), for
    a tree read once (``load_state_dict`` copies it into the model)."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj) if obj.flags.writeable else torch.from_numpy(np.array(obj))
    if isinstance(obj, dict):
        return {k: _tensor_views(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_tensor_views(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def tensor_tree(obj: Any) -> Any:
    """The inverse of :func:`numpy_tree`: numpy arrays become CPU tensors again."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj))
    if isinstance(obj, dict):
        return {k: tensor_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [tensor_tree(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(tensor_tree(v) for v in obj)
    return obj


class TorchMethod(Method):
    """Base of the torch methods (see the module docstring). Parameters it reads when the subclass has
    them: ``max_epochs``, ``batch_size``, ``lr``, ``optimizer`` (``"sgd"`` | ``"adam"``), ``momentum``,
    ``weight_decay``, ``lr_decay_epoch``, ``lr_decay``, ``grad_clip``, ``patience``, ``holdout``; and
    from the run's settings (:attr:`Method.run_settings`): ``device``, ``seed``, ``amp`` (when the method
    :attr:`~Method.supports_amp`) and ``log_every``.

    Learned attributes: ``model_spec_``, ``model_state_`` (the weights, numpy), ``train_state_`` (the
    trainer's position and optimiser state), ``best_state_``, ``best_score_``, ``best_epoch_``,
    ``bad_epochs_``, ``history_``, ``epoch_``, ``step_``, ``done_``.
    """

    iterative = True
    #: group the batches by image (B images x all their captions) instead of one caption per row
    group_by_image: ClassVar[bool] = False
    #: the training loss is a sum over rows (per-example SGD) rather than a mean
    loss_is_sum: ClassVar[bool] = False
    #: what a non-finite loss should make the user try
    nan_hint: ClassVar[str] = "lower the learning rate"

    # ------------------------------------------------------------------ what a subclass supplies
    def model_spec(self, train: MethodData, resume: bool) -> dict[str, Any]:
        """Plain values that :meth:`build_model` needs (dimensions ...), from the data; ``resume``: the
        learned state is being continued (keep vocabularies it fixed)."""
        raise NotImplementedError

    def build_model(self, spec: dict[str, Any]) -> torch.nn.Module:
        raise NotImplementedError

    def before_training(self, train: MethodData, val: MethodData | None, model: torch.nn.Module,
                        device: torch.device) -> Iterator[Any]:
        """Long set-up before :meth:`prepare`, as events (``Progress`` with a ``stage``, ``Log``), on the data
        that trains and validates (after any holdout). Default: nothing."""
        return iter(())

    def prepare(self, train: MethodData, device: torch.device) -> None:
        """Put what :meth:`training_step` reads on ``device`` (features, maps) and check the data."""

    def graph_key(self) -> tuple[Any, str]:
        """CUDA graphs (crossview.nn.trainer): ``(key, why not)``: ``key(batch ids on the host)`` gives what fixes the
        shapes of a step on them (None: run it eagerly), or ``key`` is None and ``why not`` says why no step of this
        method can be captured. Called after :meth:`prepare`."""
        return None, "its step draws a data-dependent number of rows"

    def training_step(self, model: torch.nn.Module, batch: torch.Tensor,
                      generator: torch.Generator) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def before_step_hook(self) -> Callable[[torch.Tensor], None] | None:
        """What the trainer runs before every step on its batch, outside any captured graph (host work a captured
        step cannot hold); None (the default): nothing. Called once the trainer's graph choice is known."""
        return None

    # ------------------------------------------------------------------ two stages in one run
    #: A method that trains in two stages within one run (webly: Stage I, then the web set; timam: the language
    #: model frozen, then fine-tuned) names the parameter holding the second stage's epochs; its ``fit_iter``
    #: calls :meth:`_train_first_stage` and then :meth:`_train_second_stage`. The second stage's curves and epoch
    #: numbers continue the first's (:meth:`run_offsets`), a Phase event marks the change, and ``stage_`` (kept
    #: in the checkpoint) sends a resume into the stage it stopped in.
    second_stage_epochs: ClassVar[str | None] = None

    def _stage(self) -> int:
        """2 while the second stage trains, else 1."""
        return int(getattr(self, "_stage_now", 1))

    def run_offsets(self) -> tuple[int, int]:
        """``(epochs, steps)`` trained before this call of :meth:`fit_iter` in the same run: the first stage's,
        while the second trains; ``(0, 0)`` otherwise."""
        if self._stage() == 2:
            return int(getattr(self, "stage1_epochs_", 0)), int(getattr(self, "stage1_steps_", 0))
        return 0, 0

    def n_epochs(self) -> int:
        """How many epochs the trainer runs: the ``max_epochs`` parameter, or in the second stage the parameter
        :attr:`second_stage_epochs` names."""
        if self._stage() == 2 and self.second_stage_epochs:
            return int(getattr(self, self.second_stage_epochs))
        return int(getattr(self, "max_epochs", 10))

    def _train_first_stage(self, train: MethodData, val: MethodData | None, resume: bool) -> Iterator[Any]:
        self._stage_now = 1
        self.stage_ = 1
        yield from TorchMethod.fit_iter(self, train, val, resume=resume)

    def _train_second_stage(self, train: MethodData, val: MethodData | None, *, log: str,
                            phase: str) -> Iterator[Any]:
        """Train the second stage on ``train``, continuing the first stage's model. Straight after the first
        stage (not on a resume inside the second) its epochs and steps are recorded as the offsets, the
        trainer's state and early stopping start afresh, and ``log`` and a Phase marker named ``phase`` go out."""
        from crossview.core.events import Phase

        if int(getattr(self, "stage_", 1)) == 1:
            self.stage1_epochs_, self.stage1_steps_ = len(self.history_), int(self.step_)
            self.stage_ = 2
            self.train_state_ = None
            self.done_ = self.stopped_ = False
            self.bad_epochs_ = 0
            yield Log(log, "info")
            if world()[0] == 0:
                yield Phase(int(self.step_), len(self.history_), phase)
        self._stage_now = 2
        try:
            yield from TorchMethod.fit_iter(self, train, val, resume=True)
        finally:
            self._stage_now = 1

    def make_sampler(self, train: MethodData, seed: int, rank: int, world_size: int) -> EpochSampler:
        """The batches of an epoch (default: every caption once, or ``batch_size`` images with all their
        captions when ``group_by_image``)."""
        groups = train.caption_image if self.group_by_image else None
        return EpochSampler(self.n_train_items(train), int(getattr(self, "batch_size", 128)), seed=seed,
                            groups=groups, rank=rank, world_size=world_size)

    def n_train_items(self, train: MethodData) -> int:
        """How many items an epoch visits (default: every caption once)."""
        return train.n_captions

    def start_message(self, train: MethodData, n_items: int, n_batches: int, device: torch.device) -> str:
        """The one line a fresh (not resumed) training starts with."""
        return f"{self.name}: {n_items} training items, {n_batches} batches per epoch, device {device}"

    def embed_images(self, data: MethodData) -> np.ndarray:
        raise NotImplementedError

    def embed_texts(self, data: MethodData) -> np.ndarray:
        raise NotImplementedError

    def after_step(self, model: torch.nn.Module) -> None:
        """Runs under ``no_grad`` after every optimiser step (e.g. a norm projection)."""

    def after_epoch(self, record: dict[str, Any]) -> list[Any]:
        """Runs at the end of every epoch with its record (the epoch's mean terms, ``val``: the validation score
        when there is one); returns events to report (e.g. a learning rate cut on a plateau). Default: none."""
        return []

    def end_training(self) -> None:
        """Runs when training stops (finished, cancelled or failed): release loaders, workers, caches."""
        self._t = None
        self._graphing = False

    def learning_rate(self) -> float:
        """The lr training starts at (the ``lr`` parameter; a method may choose it from others)."""
        return float(getattr(self, "lr", 1e-3))

    def optimizers(self, model: torch.nn.Module) -> list[torch.optim.Optimizer]:
        lr = self.learning_rate()
        wd = float(getattr(self, "weight_decay", 0.0) or 0.0)
        kind = str(getattr(self, "optimizer", "adam"))
        params = [p for p in model.parameters() if p.requires_grad]
        if kind == "sgd":
            return [torch.optim.SGD(params, lr=lr, momentum=float(getattr(self, "momentum", 0.0) or 0.0),
                                    weight_decay=wd)]
        if kind == "adam":
            return [torch.optim.Adam(params, lr=lr, weight_decay=wd)]
        raise CrossViewError(f"{self.name}: optimizer {kind!r} must be 'sgd' or 'adam'")

    def schedulers(self, optimizers: Sequence[torch.optim.Optimizer]) -> list[Any]:
        at = int(getattr(self, "lr_decay_epoch", 0) or 0)
        if at <= 0:
            return []
        gamma = float(getattr(self, "lr_decay", 0.1))
        return [torch.optim.lr_scheduler.StepLR(o, step_size=at, gamma=gamma) for o in optimizers]

    def validation_score(self, val: MethodData) -> tuple[dict[str, Any], float]:
        """Validation metrics and the number early stopping maximises (rsum)."""
        res = self.evaluate(val)
        res.pop("ranks", None)
        return res, float(res["rsum"])

    # ------------------------------------------------------------------ state
    def _fresh_state(self, spec: dict[str, Any]) -> None:
        self.model_spec_ = dict(spec)
        self.model_state_ = None
        self.train_state_ = None
        self.best_state_ = None
        self.best_score_ = -math.inf
        self.best_epoch_ = 0
        self.bad_epochs_ = 0
        self.stopped_ = False
        self.history_: list[dict[str, Any]] = []
        self.epoch_ = 0
        self.step_ = 0
        self.done_ = False

    def _sync(self, model_state: Any = None) -> None:
        """Hand the live model and trainer over to the learned attributes when training stops (finished, cancelled
        or failed); ``model_state``: the model's state as numpy arrays when the caller has it (the best epoch's, just
        loaded). The arrays are views of the CPU tensors, not copies: nothing trains them any more, and a copy of a
        COCO-size TIMAM's classifier and optimiser state was 0.7 GB more at every stop."""
        live = getattr(self, "_live", None)
        if live is None:
            return
        model, trainer = live
        self.model_state_ = _numpy_views(model.state_dict()) if model_state is None else model_state
        self.train_state_ = _numpy_views(trainer.state_dict())
        self.epoch_, self.step_, self.stopped_ = trainer.epoch, trainer.step, trainer.stopped

    def model(self) -> torch.nn.Module:
        """The trained model on the CPU (rebuilt from the learned state)."""
        self.check_is_fitted()
        live = getattr(self, "_live", None)
        if live is not None:
            return live[0]
        cached = getattr(self, "_model_cache", None)
        if cached is None or cached[0] is not self.model_state_:
            m = self.build_model(self.model_spec_)
            m.load_state_dict(tensor_tree(self.model_state_))
            m.eval()
            self._model_cache = (self.model_state_, m)
        return self._model_cache[1]

    def state_dict(self) -> dict[str, Any]:
        """The learned state, a snapshot; while training, the live model and optimiser copied once, into the returned
        dict only (kept on the method too, they stayed in memory between checkpoints: a COCO-size TIMAM's classifier
        and its optimiser's moments are ~0.7 GB, issue 34). Arrays already held as numpy (the best epoch's weights)
        are shared, not copied: they are replaced whole, never written in place."""
        return self._state(numpy_tree)

    def checkpoint_state(self) -> dict[str, Any]:
        """:meth:`state_dict` for a checkpoint written before training goes on: the live model's and optimiser's
        CPU tensors are shared, not copied (a copy of them doubled a COCO-size TIMAM's ~0.7 GB at every save)."""
        return self._state(_numpy_views)

    def _state(self, live_tree: Any) -> dict[str, Any]:
        learned = {k: getattr(self, k) for k in self._learned_names()}
        live = getattr(self, "_live", None)
        if live is not None:
            model, trainer = live
            learned.update(model_state_=live_tree(model.state_dict()), train_state_=live_tree(trainer.state_dict()),
                           epoch_=trainer.epoch, step_=trainer.step, stopped_=trainer.stopped)
            self.epoch_, self.step_, self.stopped_ = trainer.epoch, trainer.step, trainer.stopped
        return {"method": self.name, "params": self.saved_params(), "stream": self.stream_state(),
                "state": {k: _shared_tree(v) for k, v in learned.items()}}

    def load_state_dict(self, d: dict[str, Any]) -> "TorchMethod":
        super().load_state_dict(d)
        self._live = None
        self._model_cache = None
        return self

    # ------------------------------------------------------------------ training
    def fit_iter(self, train: MethodData, val: MethodData | None = None, *,
                 resume: bool = False) -> Iterator[Any]:
        """Train with :class:`~crossview.nn.trainer.Trainer` (see the module docstring)."""
        from crossview.core.devices import torch_device

        self.check_params()
        dev = torch_device(str(self.device))
        init_distributed(dev)
        rank, world_size = world()
        if world_size > 1 and dev.type == "cuda":
            dev = torch.device("cuda", torch.cuda.current_device())
        resume = bool(resume and getattr(self, "model_state_", None) is not None)
        spec = self.model_spec(train, resume)
        if resume:
            if getattr(self, "done_", False):
                yield Log(f"{self.name}: the loaded state has already finished training", "info")
                return
            if dict(self.model_spec_) != dict(spec):
                diff = [f"{k} {self.model_spec_.get(k)} in the checkpoint, {spec.get(k)} in the data"
                        for k in sorted(set(spec) | set(self.model_spec_)) if spec.get(k) != self.model_spec_.get(k)]
                raise CrossViewError(f"{self.name}: cannot resume: {'; '.join(diff)}; use the features (and "
                                     "parameters) the run was started with")
        else:
            self._fresh_state(spec)
        seed = int(self.seed)
        torch.manual_seed(seed)
        model = self.build_model(self.model_spec_)
        if resume:
            model.load_state_dict(tensor_tree(self.model_state_))
        model.to(dev)
        train, val, note = self._holdout(train, val, seed)
        yield from self.before_training(train, val, model, dev)
        self.prepare(train, dev)
        opts = self.optimizers(model)
        scheds = self.schedulers(opts)
        sampler = self.make_sampler(train, seed, rank, world_size)
        graph_key, graph_off = self.graph_key() if dev.type == "cuda" else (None, "")
        trainer = Trainer(model, opts, sampler, max_epochs=self.n_epochs(), device=dev,
                          seed=seed, schedulers=scheds, grad_clip=getattr(self, "grad_clip", None),
                          amp=bool(self.amp), loss_is_sum=self.loss_is_sum,
                          log_every=int(self.log_every), after_step=self.after_step,
                          nan_hint=f"{self.nan_hint} (lr={self.learning_rate():g})",
                          graph_key=graph_key, graph_off=graph_off, cuda_graphs=cuda_graphs_wanted(),
                          before_step=self.before_step_hook())
        self._graphing = not trainer.graph_off
        if resume and self.train_state_ is not None:
            trainer.load_state_dict(tensor_tree(self.train_state_))
        self._live = (model, trainer)
        self._model_cache = None
        patience = int(getattr(self, "patience", 0) or 0)
        if not resume and rank == 0:
            if note:
                yield Log(note, "info")
            yield Log(self.start_message(train, sampler.n_items, len(sampler), dev), "info")
            if trainer.graph_note:
                yield Log(f"{self.name}: {trainer.graph_note}", "info")

        off_epochs, off_steps = self.run_offsets()

        def on_epoch_end(epoch: int, terms: dict[str, float]) -> tuple[list[Any], bool]:
            epoch += off_epochs
            record: dict[str, Any] = {"epoch": epoch, **terms}
            events: list[Any] = []
            stop = False
            if val is not None:
                model.eval()
                # validation reads its own split: the training features' pages (file-backed at size) leave the
                # resident set meanwhile, and the next epoch maps them again from the page cache (at COCO size
                # 0.86 GB not held beside the validation's embeddings, issue 34)
                drop_pages(train.image_features)
                metrics, score = self.validation_score(val)
                record["val"] = score
                if score > self.best_score_:
                    self.best_score_, self.best_epoch_, self.bad_epochs_ = score, epoch, 0
                    self.best_state_ = kept_tree(model.state_dict())
                else:
                    self.bad_epochs_ += 1
                    stop = patience > 0 and self.bad_epochs_ >= patience
                events.append(Validation(epoch, metrics))
                if stop:
                    events.append(Log(f"{self.name}: validation has not improved for {self.bad_epochs_} epochs; "
                                      f"stopping at epoch {epoch} and keeping epoch {self.best_epoch_}", "info"))
            self.history_.append(record)
            events.extend(self.after_epoch(record))
            return events, stop

        best = None
        try:
            for ev in trainer.fit_iter(lambda m, b, g: self.training_step(m, b, g), on_epoch_end):
                self.epoch_, self.step_ = trainer.epoch, trainer.step     # the position, readable live
                if off_steps and isinstance(ev, Loss):       # a later stage continues the curves
                    ev = Loss(ev.step + off_steps, ev.epoch + off_epochs, ev.terms)
                yield ev
            best = self.best_state_
            if best is not None:
                # read in place (file-backed at size: the pages given back once copied), not copied first
                model.load_state_dict(_tensor_views(best))
                for a in mapped_arrays(best):
                    drop_pages(a)
            self.done_ = True
        finally:
            # done with the best epoch's weights loaded: they are the model's state (one copy of them, not two): on
            # the CPU views of the model's own tensors, and the model is what model() returns (not rebuilt from a
            # copy); on a GPU the host copy already made
            on_cpu = dev.type == "cpu"
            self._sync(best if self.done_ and not on_cpu else None)
            self.end_training()
            model.eval()
            self._live = None
            self.model_state_ = numpy_tree(model.state_dict()) if self.model_state_ is None else self.model_state_
            if on_cpu and self.done_:
                self._model_cache = (self.model_state_, model)
            if self.done_ and self.best_state_ is not None:
                # the same weights: one set of arrays (a checkpoint stores them once; the scratch files are freed)
                self.best_state_ = self.model_state_

    def selection_info(self, train_split: str, val_split: str | None) -> list[dict[str, str]]:
        """The epoch (best-epoch weights, early stopping) is chosen on ``val``, else on the ``holdout`` part of the
        training images, else nothing is chosen (the last epoch is kept)."""
        if val_split:
            return [{"what": "epoch", "on": val_split}]
        frac = float(getattr(self, "holdout", 0.0) or 0.0)
        return [{"what": "epoch", "on": f"{train_split}-holdout{round(100 * frac)}"}] if frac > 0 else []

    def _holdout(self, train: MethodData, val: MethodData | None,
                 seed: int) -> tuple[MethodData, MethodData | None, str]:
        """``(fit, val, note)``: without a validation split, ``holdout`` (a fraction) of the training images,
        drawn with ``seed`` (the same on every process and on resume), choose the epoch and stop early;
        the rest train. Too few images (under 10 either side) or ``holdout=0``: all train, the last epoch."""
        frac = float(getattr(self, "holdout", 0.0) or 0.0)
        if val is not None or frac <= 0:
            return train, val, ""
        n = train.n_images
        n_out = int(round(frac * n))
        if n_out < MIN_HOLDOUT or n - n_out < MIN_HOLDOUT:
            return train, None, (f"{self.name}: no validation split and too few training images ({n}) to hold "
                                 f"{frac:g} of them out; training on all of them and keeping the last epoch")
        held = np.sort(np.random.default_rng(seed).choice(n, size=n_out, replace=False))
        rest = np.setdiff1d(np.arange(n), held)
        note = (f"{self.name}: no validation split: {n_out} of the {n} training images (holdout={frac:g}) are "
                "held out to choose the epoch and stop early; holdout=0 trains on all and keeps the last epoch")
        return train.subset(rest), train.subset(held, f"{train.name or 'train'} (held out)"), note

    # ------------------------------------------------------------------ inference
    def encode_images(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        self.check_is_fitted()
        return np.ascontiguousarray(self.embed_images(data), dtype=np.float32)

    def encode_texts(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        self.check_is_fitted()
        return np.ascontiguousarray(self.embed_texts(data), dtype=np.float32)
