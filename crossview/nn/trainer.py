"""One training loop for every torch method: epochs and batches, seeds, optimiser / scheduler / AMP state,
clipping, cancellation within a batch, DDP under ``torchrun``, one number per loss term.

The loop knows nothing of methods (ARCHITECTURE.md, "Deep methods: one trainer"). A method hands it

- a model (``torch.nn.Module``) and its optimiser(s) (and optionally epoch schedulers);
- a :class:`EpochSampler` that cuts each epoch into batches of item ids (captions, or B images x all
  their captions);
- ``training_step(model, batch, generator) -> {term: tensor}``: the loss of one batch; the term
  ``"loss"`` is the one that is back-propagated, every term is reported (mean per epoch and every
  ``log_every`` steps);
- ``on_epoch_end(epoch, terms) -> (events, stop)``: validation, best-epoch weights, early stopping (the
  method's business: :class:`crossview.methods.torch_method.TorchMethod`).

No host work inside a step (nothing in it waits for a GPU): the epoch's batches go to the device once an epoch
(:meth:`EpochSampler.plan`) and a step slices them; its terms stay on the device and are read in one go every
``log_every`` steps, at the epoch's end and before a state is saved, which is also where a non-finite term is
found and named with its step. A step may read host-side tables through :attr:`Trainer.batch_host` (the batch's
ids as a numpy view) without a wait. ``tests/test_host_free_step.py`` counts a step's ops and host reads.

CUDA graphs (on a GPU): a method that can say, from a batch's ids on the host, everything that fixes the shapes of
its step (``graph_key``: e.g. the batch's size and its captions' length bucket) has each such shape's step captured
once as a CUDA graph (forward, backward, clipping, the optimiser's step) after :data:`GRAPH_WARMUP` eager steps of
that shape, and replayed from then on: one launch a step instead of a few hundred, the host free to run ahead. The
graph reads the batch from a static buffer (the ids and the batch's groups are copied in before each replay), the
optimisers are made capturable, autocast's weight cache is off, and a graph is captured again when a learning rate
changes (the rate is a constant inside the graph). A key of None, a float16 run (its gradient scaler reads the
device), DDP, or a capture that fails (the reason is logged once, the step runs eagerly) fall back to the eager
step, which computes the same thing. ``CROSSVIEW_CUDA_GRAPHS=0`` turns graphs off. Host work a captured step
cannot hold runs in the method's ``before_step`` hook, outside the graph, before every step (VSE++ end to end:
decoding the batch's images into the static tensors its captured step reads, with ``CROSSVIEW_E2E_GRAPHS=1``).

Exact resume without saving generator states: the random numbers of step ``s`` come from a generator
seeded with ``(seed, rank, s)`` and the order of epoch ``e`` from ``(seed, e)``, so a run restored to
``(epoch, batch position, step)`` with its weights and optimiser state draws the very numbers an
uninterrupted run would have drawn, on any number of processes.

Distributed: when ``torch.distributed`` is initialised (``torchrun`` sets the environment;
:func:`init_distributed` starts the process group, gloo on CPUs, NCCL on GPUs) the model is wrapped in
``DistributedDataParallel``, each process takes its share of every batch (the global batch is the same
as on one process), and gradients are averaged by DDP. Only rank 0 should write files; every rank runs
the same loop and the same validation (the weights are identical), so they stop together.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from crossview.core.events import Event, Log, Loss, Progress
from crossview.core.errors import CrossViewError

__all__ = ["EpochSampler", "Trainer", "TrainingStep", "EpochEnd", "init_distributed", "world", "unwrap", "amp_dtype",
           "step_seed", "PlateauScheduler", "cuda_graphs_wanted", "GRAPH_WARMUP"]

TrainingStep = Callable[[torch.nn.Module, torch.Tensor, torch.Generator], dict[str, torch.Tensor]]
"""``training_step(model, batch_ids, generator) -> {term: scalar tensor}`` (``"loss"`` is optimised)."""

EpochEnd = Callable[[int, dict[str, float]], tuple[Sequence[Event], bool]]
"""``on_epoch_end(epoch (1-based), mean terms) -> (events to yield, stop?)``."""


# ====================================================================== processes
def world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process: ``(0, 1)`` unless ``torch.distributed`` is initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed(device: torch.device) -> tuple[int, int]:
    """Start the process group when launched by ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) and
    it is not started yet: gloo for CPUs, NCCL for CUDA (each process on ``cuda:LOCAL_RANK``).
    Returns :func:`world`. A single process is left alone."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and dist.is_available() and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return world()


def amp_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast type of mixed precision on ``device``: bfloat16 on a GPU that has it (Ampere and later: float32's
    range, so no gradient scaler, and a step that CUDA graphs can capture), float16 on older GPUs; bfloat16 on a
    CPU that has bfloat16 matrix instructions (AMX tiles or AVX512-BF16), None where it would be slower than
    float32."""
    if device.type == "cuda":
        try:
            return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
        except TypeError:       # an older torch without the keyword
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu":
        cpu = getattr(torch, "cpu", None)
        probes = [getattr(cpu, n, None) for n in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
        try:
            if any(p is not None and p() for p in probes):
                return torch.bfloat16
        except RuntimeError:
            return None
    return None


def cuda_graphs_wanted() -> bool:
    """Whether steps may be captured as CUDA graphs: yes unless ``CROSSVIEW_CUDA_GRAPHS=0`` (for measuring the eager
    step, or a driver that misbehaves)."""
    return os.environ.get("CROSSVIEW_CUDA_GRAPHS", "1").strip().lower() not in ("0", "false", "no", "off")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a ``DistributedDataParallel`` wrapper (the model itself otherwise)."""
    return getattr(model, "module", model)


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Every process's rows of ``x`` in rank order (the global batch), gradients flowing back to each
    process's own rows (``torch.distributed.nn.all_gather``); ``x`` itself in a single process. Shares may
    differ in size by a few rows (the last batch of an epoch): they are padded for the exchange and trimmed.

    A loss computed on the gathered rows is the same on every process; return it divided by the world size
    from a ``loss_is_sum`` step, so that DDP's averaging gives exactly the single-process gradient."""
    rank, world_size = world()
    if world_size == 1:
        return x
    import torch.distributed as dist
    import torch.distributed.nn as dist_nn

    n = torch.tensor([x.shape[0]], device=x.device)
    sizes = [torch.zeros_like(n) for _ in range(world_size)]
    dist.all_gather(sizes, n)
    counts = [int(c) for c in sizes]
    most = max(counts)
    if x.shape[0] < most:
        x = torch.cat([x, x.new_zeros((most - x.shape[0], *x.shape[1:]))])
    parts = dist_nn.all_gather(x) if x.requires_grad else _all_gather_plain(x, world_size)
    return torch.cat([p[:c] for p, c in zip(parts, counts)])


def _all_gather_plain(x: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    import torch.distributed as dist

    out = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(out, x.contiguous())
    return out


def step_seed(seed: int, *key: int) -> int:
    """A 63-bit seed from ``seed`` and a key (e.g. rank and step), well mixed (numpy's SeedSequence)."""
    words = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *(int(k) for k in key)]).generate_state(2)
    return (int(words[0]) << 31 | int(words[1])) & ((1 << 63) - 1)


class _Stepper(torch.nn.Module):
    """What ``DistributedDataParallel`` wraps: its forward *is* the training step, so DDP's gradient
    averaging (armed by its own forward) covers every parameter the step uses, whether the step calls the
    model's forward or reads its parameters directly (WSABIE's sampled rows)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.module = model

    def forward(self, training_step: Any, batch: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return training_step(self.module, batch, generator)


# ====================================================================== batches
class EpochSampler:
    """The batches of one epoch as int64 item ids (caption ids for the caption methods).

    ``groups=None``: a seeded permutation of ``range(n_items)`` cut into batches of ``batch_size`` (every
    item once an epoch: one caption per step row). ``groups`` (the group of each item, e.g. each
    caption's image): a permutation of the groups cut into batches of ``batch_size`` groups, each batch
    holding every item of its groups (B images x all their captions). Under DDP, rank ``r`` of ``w``
    takes items ``r, r + w, ...`` of each batch, so every process sees the same number of batches.
    """

    def __init__(self, n_items: int, batch_size: int, *, seed: int = 0, groups: np.ndarray | None = None,
                 rank: int = 0, world_size: int = 1) -> None:
        if n_items < 1:
            raise CrossViewError("there is nothing to train on: the training data has no items")
        if batch_size < 1:
            raise CrossViewError(f"batch_size must be >= 1, got {batch_size}")
        self.n_items, self.batch_size, self.seed = int(n_items), int(batch_size), int(seed)
        self.rank, self.world_size = int(rank), int(world_size)
        self._members: list[np.ndarray] | None = None
        if groups is not None:
            groups = np.asarray(groups, dtype=np.int64)
            if groups.shape != (self.n_items,):
                raise CrossViewError(f"groups must have one entry per item ({self.n_items}), got {groups.shape}")
            order = np.argsort(groups, kind="stable")
            self._group_values, starts = np.unique(groups[order], return_index=True)
            self._members = np.split(order, starts[1:])
        self._epoch: int | None = None
        self._perm: np.ndarray | None = None

    @property
    def n_units(self) -> int:
        """How many units (items, or groups) an epoch shuffles."""
        return self.n_items if self._members is None else len(self._members)

    def __len__(self) -> int:
        return -(-self.n_units // self.batch_size)

    def _order(self, epoch: int) -> np.ndarray:
        if self._epoch != epoch:
            g = torch.Generator().manual_seed(step_seed(self.seed, 0x5EED, epoch))
            self._perm = torch.randperm(self.n_units, generator=g).numpy()
            self._epoch = epoch
        assert self._perm is not None
        return self._perm

    def batch(self, epoch: int, index: int) -> torch.Tensor:
        """The item ids of batch ``index`` of ``epoch`` on this process."""
        units = self._order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
        if self._members is None:
            items = units
        else:
            items = np.concatenate([self._members[u] for u in units])
        return torch.from_numpy(np.ascontiguousarray(items[self.rank::self.world_size]))

    def plan(self, epoch: int) -> dict[str, np.ndarray]:
        """The whole of ``epoch`` on this process at once (the trainer moves it to the device once an epoch, so a
        step only slices it): ``items`` every batch's item ids one after another, ``offsets`` ``(n_batches + 1,)``
        where each batch starts; with ``groups``, also ``units`` the sorted distinct group values of each batch
        (the images of a B-images batch) and ``unit_offsets``. Batch ``k`` is ``items[offsets[k]:offsets[k+1]]``,
        the same ids as :meth:`batch`."""
        parts = [self.batch(epoch, k).numpy() for k in range(len(self))]
        out = {"items": np.concatenate(parts) if parts else np.zeros(0, np.int64),
               "offsets": np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)}
        if self._members is not None:
            values = self._group_values
            units = [np.unique(values[self._order(epoch)[k * self.batch_size:(k + 1) * self.batch_size]])
                     for k in range(len(self))]
            out["units"] = np.concatenate(units) if units else np.zeros(0, np.int64)
            out["unit_offsets"] = np.concatenate([[0], np.cumsum([len(u) for u in units])]).astype(np.int64)
        return out


class CurriculumSampler(EpochSampler):
    """An :class:`EpochSampler` over items in curriculum order (the first ones the easiest): epoch ``e`` draws
    from the first ``fraction(e)`` of them, growing linearly from ``start`` to all of them at epoch ``ramp``;
    an epoch always has as many items as the whole set (the drawn prefix repeated in fresh permutations), so
    every epoch has the same number of batches and a resume lands on the same batch."""

    def __init__(self, n_items: int, batch_size: int, *, start: float = 0.5, ramp: int = 3, seed: int = 0,
                 rank: int = 0, world_size: int = 1) -> None:
        super().__init__(n_items, batch_size, seed=seed, rank=rank, world_size=world_size)
        if not 0 < start <= 1:
            raise CrossViewError(f"curriculum start must be a fraction in (0, 1], got {start}")
        self.start, self.ramp = float(start), max(0, int(ramp))

    def fraction(self, epoch: int) -> float:
        """The share of the items epoch ``epoch`` (0-based) draws from."""
        if self.ramp == 0 or epoch >= self.ramp:
            return 1.0
        return self.start + (1.0 - self.start) * epoch / self.ramp

    def _order(self, epoch: int) -> np.ndarray:
        if self._epoch != epoch:
            k = max(1, int(round(self.fraction(epoch) * self.n_units)))
            g = torch.Generator().manual_seed(step_seed(self.seed, 0x5EED, epoch))
            parts, have = [], 0
            while have < self.n_units:
                parts.append(torch.randperm(k, generator=g).numpy())
                have += k
            self._perm = np.concatenate(parts)[:self.n_units]
            self._epoch = epoch
        assert self._perm is not None
        return self._perm


class PlateauScheduler:
    """The learning rate of an optimiser divided by ``1 / factor`` when a watched number stops improving
    (torch's ``ReduceLROnPlateau``), in the trainer's scheduler list so that its state is checkpointed: the
    trainer's end-of-epoch ``step()`` does nothing; the method calls :meth:`observe` with the epoch's number
    (a validation score, ``mode="max"``, or a training loss, ``mode="min"``) once the epoch is scored."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, mode: str = "max", factor: float = 0.1,
                 patience: int = 2, min_lr: float = 0.0) -> None:
        self.inner = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode=mode, factor=factor,
                                                                patience=int(patience), min_lr=min_lr)
        self.optimizer = optimizer

    def step(self) -> None:
        """The trainer's end of epoch: nothing (:meth:`observe` decides)."""

    def observe(self, value: float) -> list[float] | None:
        """Take the epoch's number; returns the new learning rates when they were cut, else None."""
        before = [float(g["lr"]) for g in self.optimizer.param_groups]
        self.inner.step(float(value))
        after = [float(g["lr"]) for g in self.optimizer.param_groups]
        return after if after != before else None

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.inner.load_state_dict(d)


# ====================================================================== the loop
class Trainer:
    """The loop (see the module docstring). ``optimizers``: one optimiser or several (stepped in order
    after one backward pass); ``schedulers``: stepped once at the end of every epoch.

    ``loss_is_sum``: the step's loss is a sum over its rows (WARP's per-example SGD) rather than a mean;
    under DDP it is then scaled by the world size so that averaged gradients equal the single-process
    ones. ``after_step(model)`` runs under ``no_grad`` after each optimiser step (e.g. a norm projection).
    ``amp``: mixed precision: bfloat16 autocast on a GPU that has it (float16 and a gradient scaler on older ones);
    bfloat16 autocast on a CPU with
    bfloat16 matrix units (AMX or AVX512-BF16: about twice as fast for a GRU); ignored elsewhere (see
    :func:`amp_dtype`). The weights and the optimiser stay in float32 either way.
    """

    def __init__(self, model: torch.nn.Module, optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
                 sampler: EpochSampler, *, max_epochs: int, device: torch.device, seed: int = 0,
                 schedulers: Sequence[Any] = (), grad_clip: float | None = None, amp: bool = False,
                 loss_is_sum: bool = False, log_every: int = 10,
                 after_step: Callable[[torch.nn.Module], None] | None = None,
                 nan_hint: str = "lower the learning rate",
                 graph_key: Callable[[np.ndarray], Hashable | None] | None = None, graph_off: str = "",
                 cuda_graphs: bool = True, before_step: Callable[[torch.Tensor], None] | None = None) -> None:
        self.model = model
        self.optimizers = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
        self.schedulers = list(schedulers)
        self.sampler = sampler
        self.max_epochs, self.device, self.seed = int(max_epochs), device, int(seed)
        self.grad_clip = None if not grad_clip else float(grad_clip)
        self.amp_dtype = amp_dtype(device) if amp else None
        self.amp = self.amp_dtype is not None
        # a gradient scaler for float16 only (bfloat16 has float32's range)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 and device.type == "cuda" else None
        self.loss_is_sum, self.log_every = bool(loss_is_sum), max(1, int(log_every))
        self.after_step, self.nan_hint = after_step, nan_hint
        # host work before every step, outside any captured graph (e.g. a method decoding the step's images into
        # the static tensors its captured step reads)
        self.before_step = before_step
        self.rank, self.world_size = world()
        self._gen: torch.Generator | None = None
        self.batch_cpu: torch.Tensor | None = None   #: the current step's item ids, on the host (a view)
        self.batch_host: np.ndarray | None = None    #: the same ids as a numpy view (host tables without a sync)
        self.batch_units: torch.Tensor | None = None  #: a grouped sampler's batch groups (sorted), on the device
        # the epoch's plan (EpochSampler.plan), on the host and once an epoch on the device: a step only slices it
        self._plan_epoch: int | None = None
        self._plan: dict[str, np.ndarray] = {}
        self._plan_dev: dict[str, torch.Tensor] = {}
        # the terms of the steps since the last read, on the device: read (one wait) every log_every steps, at
        # the epoch's end and before the state is saved
        self._pending: list[tuple[int, int, torch.Tensor, int]] = []   # (step, epoch, stacked terms, rows)
        self._pending_names: list[str] | None = None
        self._last_values: dict[str, float] | None = None    # the terms of the last step read
        self._graph_failed_said = False
        self.ddp: torch.nn.Module | None = None
        if self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [device.index if device.index is not None else torch.cuda.current_device()] \
                if device.type == "cuda" else None
            self.ddp = DistributedDataParallel(_Stepper(model), device_ids=ids)
        # the position: the next batch is ``batch_pos`` of epoch ``epoch`` (0-based); ``step`` batches done
        self.epoch = 0
        self.batch_pos = 0
        self.step = 0
        self.stopped = False
        self.epoch_sums: dict[str, float] = {}
        self.epoch_rows = 0
        # CUDA graphs: one captured step per key (see the module docstring)
        self.graph_key = graph_key
        self._graphs: dict[Hashable, _Graph] = {}
        self._graph_seen: dict[Hashable, int] = {}
        self._graph_lrs: tuple[float, ...] | None = None
        self._graph_stream: Any = None
        self._graph_failed = ""
        self.graph_captures = 0     #: graphs captured so far (a learning-rate change captures again)
        self.graph_replays = 0      #: steps run by replaying a graph
        self.graph_off = self._graphs_off_reason(bool(cuda_graphs), graph_off)
        if not self.graph_off:
            for o in self.optimizers:
                _set_capturable(o, True)

    # ------------------------------------------------------------------ CUDA graphs
    def _graphs_off_reason(self, wanted: bool, method_reason: str) -> str:
        """Why this run's steps are not captured as CUDA graphs ('' when they are)."""
        if self.device.type != "cuda":
            return "not on a GPU"
        if not wanted:
            return "turned off (CROSSVIEW_CUDA_GRAPHS=0)"
        if not hasattr(torch.cuda, "CUDAGraph"):
            return "this torch has no CUDA graphs"
        if self.graph_key is None:
            return method_reason or "the method's step has no fixed shapes"
        if self.world_size > 1:
            return "several processes (DDP's gradient exchange is not captured)"
        if self.scaler is not None:
            return "float16 mixed precision: its gradient scaler reads the device every step (bfloat16 needs none)"
        return ""

    @property
    def graph_note(self) -> str:
        """One line for the log: whether steps are captured as CUDA graphs, and why not (empty on a CPU)."""
        if self.device.type != "cuda":
            return ""
        if self._graph_failed:
            return f"CUDA graphs off: {self._graph_failed}; steps run eagerly"
        if self.graph_off:
            return f"CUDA graphs off: {self.graph_off}; steps run eagerly"
        return (f"CUDA graphs: each batch shape's step is captured after {GRAPH_WARMUP} eager steps and replayed "
                f"({self.graph_captures} captured, {self.graph_replays} replayed steps so far)")

    def _graph_step(self, training_step: TrainingStep, batch: torch.Tensor) -> torch.Tensor | None:
        """The step on ``batch`` by a captured graph (capturing it when its key has been seen :data:`GRAPH_WARMUP`
        times); None when this batch runs eagerly. Returns the terms stacked (a copy: the graph's own output is
        overwritten by its next replay)."""
        if self.graph_off or self._graph_failed or self.graph_key is None:
            return None
        key = self.graph_key(self.batch_host if self.batch_host is not None else batch.cpu().numpy())
        if key is None:
            return None
        units = self.batch_units
        key = (key, int(batch.shape[0]), None if units is None else int(units.shape[0]))
        lrs = tuple(float(g["lr"]) for o in self.optimizers for g in o.param_groups)
        if lrs != self._graph_lrs:          # a learning rate is a constant inside a graph: capture again
            self._graphs.clear()
            self._graph_lrs = lrs
        entry = self._graphs.get(key)
        if entry is None:
            seen = self._graph_seen.get(key, 0) + 1
            self._graph_seen[key] = seen
            if seen <= GRAPH_WARMUP:         # eager, on a side stream (libraries set themselves up off the graph)
                return self._on_side_stream(lambda: self._step(training_step, batch))
            try:
                entry = self._capture(training_step, batch, units)
            except Exception as e:  # noqa: BLE001 - any capture failure: say it once, run eagerly from now on
                self._graph_failed = f"capturing the step failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
                self._graphs.clear()
                for o in self.optimizers:
                    o.zero_grad(set_to_none=True)
                torch.cuda.synchronize(self.device)
                return None
            self._graphs[key] = entry
        else:
            entry.batch.copy_(batch, non_blocking=True)
            if entry.units is not None and units is not None:
                entry.units.copy_(units, non_blocking=True)
        self._seed()
        entry.graph.replay()
        self.graph_replays += 1
        return entry.out.clone()

    def _on_side_stream(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self._graph_stream is None:
            self._graph_stream = torch.cuda.Stream(self.device)
        side, main = self._graph_stream, torch.cuda.current_stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out = fn()
        main.wait_stream(side)
        return out

    def _capture(self, training_step: TrainingStep, batch: torch.Tensor, units: torch.Tensor | None) -> "_Graph":
        """Capture one step on static copies of ``batch`` (and its groups), then replay it once (a capture records
        the work without doing it)."""
        static_batch = batch.clone()
        static_units = None if units is None else units.clone()
        self.batch_units = static_units
        self.model.train()
        for o in self.optimizers:
            o.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        if self._gen is None:
            self._gen = torch.Generator(device=self.device)
        register = getattr(graph, "register_generator_state", None)
        if register is not None:
            register(self._gen)
        self._seed()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = self._step_body(training_step, static_batch, self._gen, cache=False)
        self.graph_captures += 1
        return _Graph(graph, static_batch, static_units, out)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The position and the optimiser / scheduler / scaler state (the model's weights are the
        method's to save). The terms still on the device are read first (a non-finite one raises: a saved
        state has only checked steps behind it)."""
        self.flush()
        return {"epoch": self.epoch, "batch_pos": self.batch_pos, "step": self.step, "stopped": self.stopped,
                "epoch_sums": dict(self.epoch_sums), "epoch_rows": self.epoch_rows,
                "optimizers": [o.state_dict() for o in self.optimizers],
                "schedulers": [s.state_dict() for s in self.schedulers],
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s output."""
        self.epoch, self.batch_pos, self.step = int(d["epoch"]), int(d["batch_pos"]), int(d["step"])
        self.stopped = bool(d.get("stopped", False))
        self.epoch_sums = {str(k): float(v) for k, v in (d.get("epoch_sums") or {}).items()}
        self.epoch_rows = int(d.get("epoch_rows", 0))
        self._pending, self._plan_epoch = [], None
        opt_states, sched_states = list(d.get("optimizers") or []), list(d.get("schedulers") or [])
        if len(opt_states) != len(self.optimizers) or len(sched_states) != len(self.schedulers):
            raise CrossViewError("the training state does not fit this model (different optimisers or "
                                 "schedulers); start the run again instead of resuming it")
        for o, s in zip(self.optimizers, opt_states):
            try:
                o.load_state_dict(s)
            except (ValueError, KeyError) as e:     # another optimiser's state, or other parameter groups
                raise CrossViewError(f"the training state does not fit this model's {type(o).__name__} ({e}); "
                                     "start the run again instead of resuming it") from None
            _set_capturable(o, not self.graph_off)     # the saving run's choice is not this one's
        for sch, s in zip(self.schedulers, sched_states):
            sch.load_state_dict(s)
        if self.scaler is not None and d.get("scaler"):
            self.scaler.load_state_dict(d["scaler"])

    @property
    def total_steps(self) -> int:
        return self.max_epochs * len(self.sampler)

    # ------------------------------------------------------------------ the loop
    def _batch(self) -> torch.Tensor:
        """The item ids of the next batch on the device: a slice of the epoch's plan, which goes to the device
        once an epoch (no host-to-device copy, no numpy per step). Sets :attr:`batch_cpu` / :attr:`batch_host`
        (the same ids on the host) and :attr:`batch_units`."""
        if self._plan_epoch != self.epoch:
            self._plan = self.sampler.plan(self.epoch)
            self._plan_dev = {k: torch.from_numpy(v).to(self.device) for k, v in self._plan.items()
                              if k in ("items", "units")}
            self._plan_host = torch.from_numpy(self._plan["items"])
            self._plan_epoch = self.epoch
        k = self.batch_pos
        a, b = int(self._plan["offsets"][k]), int(self._plan["offsets"][k + 1])
        self.batch_host = self._plan["items"][a:b]
        self.batch_cpu = self._plan_host[a:b]
        if "units" in self._plan_dev:
            ua, ub = int(self._plan["unit_offsets"][k]), int(self._plan["unit_offsets"][k + 1])
            self.batch_units = self._plan_dev["units"][ua:ub]
        else:
            self.batch_units = None
        return self._plan_dev["items"][a:b]

    def _step(self, training_step: TrainingStep, batch: torch.Tensor) -> torch.Tensor:
        """One optimiser step on ``batch`` (item ids on the device). Returns the step's terms stacked on the
        device (in :attr:`_pending_names` order), unread: nothing in a step waits for the device."""
        self._seed()
        self.model.train()
        for o in self.optimizers:
            o.zero_grad(set_to_none=True)
        on_device = batch if batch.device == self.device else batch.to(self.device, non_blocking=True)
        return self._step_body(training_step, on_device, self._gen)

    def _seed(self) -> None:
        """Seed the step's generator and torch's own from ``(seed, rank, step)`` (host work, before the step)."""
        if self._gen is None:     # one generator, re-seeded every step: (seed, rank, step) fixes the draws
            self._gen = torch.Generator(device=self.device if self.device.type == "cuda" else "cpu")
        self._gen.manual_seed(step_seed(self.seed, self.rank, self.step))
        torch.manual_seed(step_seed(self.seed, self.rank, self.step, 1))   # dropout and friends

    def _step_body(self, training_step: TrainingStep, on_device: torch.Tensor, gen: torch.Generator,
                   cache: bool = True) -> torch.Tensor:
        """Forward, backward, clipping and the optimisers' step on ``on_device`` (no host work: a CUDA graph can
        capture it; ``cache=False`` turns autocast's weight cache off, as capturing needs)."""
        with torch.autocast(self.device.type if self.amp else "cpu", dtype=self.amp_dtype or torch.bfloat16,
                            enabled=self.amp, cache_enabled=None if cache else False):
            if self.ddp is not None:     # through DDP's forward, which arms its gradient averaging
                terms = self.ddp(training_step, on_device, gen)
            else:
                terms = training_step(self.model, on_device, gen)
        if "loss" not in terms:
            raise CrossViewError("training_step must return a 'loss' term")
        loss = terms["loss"].float()
        if self.loss_is_sum and self.world_size > 1:
            loss = loss * self.world_size
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        names = list(terms)
        if self._pending_names is None:
            self._pending_names = names
        elif names != self._pending_names:     # a step that reports other terms: read what came before
            self.flush()
            self._pending_names = names
        stacked = torch.stack([terms[k].detach().float().reshape(()) for k in names])
        if self.scaler is not None:
            for o in self.optimizers:
                self.scaler.unscale_(o)
        if self.grad_clip:
            params = [p for o in self.optimizers for g in o.param_groups for p in g["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        for o in self.optimizers:
            if self.scaler is not None:
                self.scaler.step(o)
            else:
                o.step()
        if self.scaler is not None:
            self.scaler.update()
        if self.after_step is not None:
            with torch.no_grad():
                self.after_step(self.model)
        return stacked

    def flush(self) -> dict[str, float] | None:
        """Read the terms of the steps since the last read (one wait for the device), add them to the epoch's
        sums in step order, and return the last step's terms (None when nothing was pending). A non-finite
        term raises, naming the first step that had one: the weights have then moved past it (the check no
        longer waits on every step), but no state saved since the last read holds them (:meth:`state_dict`
        reads first)."""
        if not self._pending:
            return None
        pending, self._pending = self._pending, []
        names = list(self._pending_names or [])
        table = torch.stack([t for _, _, t, _ in pending]).tolist()
        values: dict[str, float] = {}
        for (step, _, _, rows), row in zip(pending, table):
            values = dict(zip(names, row))
            if self.loss_is_sum:   # report the mean over the rows, whatever is optimised
                values["loss"] /= rows
            bad = [k for k, v in values.items() if not math.isfinite(v)]
            if bad:
                for o in self.optimizers:
                    o.zero_grad(set_to_none=True)
                raise CrossViewError(f"the {bad[0]} became {values[bad[0]]} at step {step}; {self.nan_hint}")
            for k, v in values.items():
                self.epoch_sums[k] = self.epoch_sums.get(k, 0.0) + v * rows
            self.epoch_rows += rows
        self._last_values = values
        return values

    def fit_iter(self, training_step: TrainingStep, on_epoch_end: EpochEnd | None = None,
                 describe: Callable[[int], str] | None = None) -> Iterator[Event]:
        """Train from the current position to ``max_epochs`` (or until ``on_epoch_end`` says stop),
        yielding ``Progress`` after every batch, ``Loss`` every ``log_every`` steps and the epoch's mean
        terms at its end, then whatever ``on_epoch_end`` returns. Stopping the iteration cancels
        between two batches; the position then says where to resume."""
        n_batches = len(self.sampler)
        total = self.total_steps
        while self.epoch < self.max_epochs and not self.stopped:
            while self.batch_pos < n_batches:
                batch = self._batch()
                if self.before_step is not None:
                    self.before_step(batch)
                stacked = self._graph_step(training_step, batch)
                if stacked is None:
                    stacked = self._step(training_step, batch)
                    if self._graph_failed and not self._graph_failed_said:
                        self._graph_failed_said = True
                        yield Log(self.graph_note, "warning")
                self._pending.append((self.step, self.epoch, stacked, max(1, len(batch))))
                self.batch_pos += 1
                self.step += 1
                msg = describe(self.epoch) if describe else f"epoch {self.epoch + 1}/{self.max_epochs}"
                yield Progress(self.step, total, msg)
                if self.step % self.log_every == 0:
                    self.flush()     # (a checkpoint taken at the Progress above may have read them already)
                    if self._last_values is not None:
                        yield Loss(self.step, self.epoch + 1, dict(self._last_values))
            self.flush()
            self.epoch += 1
            self.batch_pos = 0
            m = max(1, self.epoch_rows)
            terms = {f"epoch_{k}" if k == "loss" else k: v / m for k, v in self.epoch_sums.items()}
            self.epoch_sums, self.epoch_rows = {}, 0
            with warnings.catch_warnings():
                # after a resume the new scheduler has not seen the optimiser step yet and warns that
                # the order looks wrong; the loaded state already holds the epoch count, so it is not
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
                for s in self.schedulers:
                    s.step()
            events, stop = on_epoch_end(self.epoch, terms) if on_epoch_end is not None else ((), False)
            if self.world_size > 1:   # every rank validates the same weights; rank 0 has the last word
                import torch.distributed as dist

                flag = [bool(stop)]
                dist.broadcast_object_list(flag, src=0)
                stop = bool(flag[0])
            self.stopped = bool(stop)
            yield Loss(self.step, self.epoch, terms)
            yield from events


#: eager steps of a batch shape before its step is captured (libraries set up workspaces and the optimisers their
#: state in the first ones: a capture must not allocate state it would then reset at every replay)
GRAPH_WARMUP = 2


@dataclass
class _Graph:
    """One captured step: the graph, its static inputs and its output (the stacked terms)."""

    graph: Any
    batch: torch.Tensor
    units: torch.Tensor | None
    out: torch.Tensor


def _set_capturable(opt: torch.optim.Optimizer, on: bool) -> None:
    """Make ``opt`` capturable (its step counters on the parameters' device, no host read in its step) or not
    (counters on the host), whatever the state it was given was saved with. Optimisers without the option (SGD)
    need nothing."""
    for group in opt.param_groups:
        if "capturable" not in group:
            continue
        group["capturable"] = bool(on)
        for p in group["params"]:
            st = opt.state.get(p)
            if not st or not isinstance(st.get("step"), torch.Tensor):
                continue
            want = p.device if (on or group.get("fused")) else torch.device("cpu")   # fused: on the device anyway
            if st["step"].device != want:
                st["step"] = st["step"].to(want, torch.float32)
