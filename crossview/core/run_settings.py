"""How a run is executed, apart from what is trained: one object the engine owns (as Lightning's ``Trainer`` holds
devices and precision apart from the ``LightningModule``).

A method's parameters are its model, loss and optimisation hyperparameters (its card in ``models/``); the device,
mixed precision, seed, data-loader workers, loss-logging cadence, checkpoint cadence, distributed place and the
splits a run trains, validates and reports on are the run's. The engine resolves them once per execution
(:func:`crossview.engine.run.train` / ``resume``), records them in ``config.json`` (``"run_settings"``), and hands
them to the method with :meth:`crossview.methods.base.Method.configure_run`; checkpoints never hold them, so a run
trained on ``cuda:0`` resumes or opens on the CPU when asked.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from crossview.core.errors import CrossViewError

__all__ = ["RunSettings", "RUN_SETTING_PARAMS", "RUN_SETTING_HELP", "split_run_settings", "SEED_MAX", "check_seed",
           "parse_seeds", "check_checkpoint_seconds"]

#: The largest seed every consumer accepts: numpy's legacy ``np.random.seed`` and scikit-learn's ``random_state``
#: take 0..2**32-1 (``default_rng`` and ``torch.manual_seed`` take more, but not negative numbers both).
SEED_MAX = 2**32 - 1


def check_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` as an int when it is an integer in 0..:data:`SEED_MAX`, else :class:`CrossViewError` naming
    ``name`` and the range (checked before any work, so a bad seed never leaves a failed run behind)."""
    ok = isinstance(seed, int) and not isinstance(seed, bool)
    if not ok and hasattr(seed, "__index__") and not isinstance(seed, bool):   # numpy integers
        seed, ok = int(seed.__index__()), True
    if not ok or not 0 <= seed <= SEED_MAX:
        raise CrossViewError(f"{name} {seed!r}: give an integer from 0 to {SEED_MAX} (2**32 - 1, the range numpy, "
                             "torch and scikit-learn all accept)")
    return int(seed)


def parse_seeds(value: Any) -> tuple[int, ...]:
    """``"0,1,2"`` (or an int, or a list) -> the distinct seeds in the given order, each a valid seed (0 to
    :data:`SEED_MAX`); else :class:`CrossViewError` in one line."""
    if isinstance(value, str):
        items: list[Any] = [v for v in value.replace(" ", ",").split(",") if v]
    elif isinstance(value, int) or hasattr(value, "__index__"):
        items = [value]
    else:
        items = list(value)
    out: list[int] = []
    for v in items:
        if isinstance(v, str):
            try:
                v = int(v)
            except ValueError:
                raise CrossViewError(f"seed {v!r} is not a whole number; give seeds like 0,1,2") from None
        if isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= SEED_MAX:
            raise CrossViewError(f"seed {v} is out of range; give seeds from 0 to {SEED_MAX}")
        out.append(check_seed(v))
    if not out:
        raise CrossViewError("no seed given; give seeds like 0,1,2")
    return tuple(dict.fromkeys(out))


def check_checkpoint_seconds(value: Any, name: str = "checkpoint_seconds") -> float:
    """``value`` as a float when it is a finite number >= 0 (0: a checkpoint after every event, which tests and
    tools use; the command line asks for > 0), else :class:`CrossViewError` naming ``name``: nan would mean
    "never", a negative number nothing."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if isinstance(value, bool) or not math.isfinite(v) or v < 0:
        raise CrossViewError(f"{name} {value!r}: give a finite number of seconds >= 0 (e.g. 60; 0: after every "
                             "event)")
    return v

#: Names a user may give among a method's parameters (``--set seed=3``) that are run settings, with the
#: :class:`RunSettings` field each goes to (``random_state`` and ``n_jobs`` are scikit-learn's names for the seed and
#: the workers). No method has a parameter of these names: a method reads them from its ``run_settings``.
RUN_SETTING_PARAMS: dict[str, str] = {"device": "device", "amp": "amp", "seed": "seed", "random_state": "seed",
                                      "workers": "workers", "n_jobs": "workers", "log_every": "log_every"}

#: What each run setting a user may give like a parameter does (``crossview train METHOD --help``, the app's tooltips).
RUN_SETTING_HELP: dict[str, str] = {
    "device": "auto, cpu, cuda, cuda:N or mps (auto: a GPU when there is one)",
    "amp": "mixed precision for the deep methods: float16 autocast with gradient scaling on a GPU, bfloat16 on a CPU "
           "with bfloat16 matrix units; ignored elsewhere; weights stay float32",
    "seed": "seed of python, numpy and torch, and of the method's random draws (folds, starts, batch order)",
    "workers": "processes or threads a method runs beside the training one (image loader workers of the deep "
               "methods, 0 = in the training process; BITR's cross-validation jobs; SVM's label threads); also "
               "n_jobs; default: the method's own",
    "log_every": "report the minibatch loss every this many steps (default: the method's own, 10)"}


@dataclass(frozen=True)
class RunSettings:
    """One execution's settings, resolved: ``device`` is a concrete device (``"cpu"``, ``"cuda:0"``), never
    ``"auto"``. ``None`` for ``workers`` / ``log_every`` keeps each method's own default."""

    device: str = "cpu"
    amp: bool = False
    seed: int = 0
    workers: int | None = None
    log_every: int | None = None
    checkpoint_seconds: float = 60.0
    rank: int = 0
    world_size: int = 1
    train_split: str = "train"
    val_split: str | None = "val"
    eval_split: str = "test"

    def __post_init__(self) -> None:
        check_seed(self.seed)
        check_checkpoint_seconds(self.checkpoint_seconds)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """``device cpu, seed 0, amp off, checkpoint every 60 s`` (the parts that are set)."""
        parts = [f"device {self.device}", f"seed {self.seed}", f"amp {'on' if self.amp else 'off'}"]
        if self.workers is not None:
            parts.append(f"{self.workers} loader worker(s)")
        if self.world_size > 1:
            parts.append(f"process {self.rank} of {self.world_size}")
        parts.append(f"checkpoint every {self.checkpoint_seconds:g} s")
        return ", ".join(parts)


def split_run_settings(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(hyperparameters, run settings)`` of a method's parameters as a user gave them (``--set amp=true``,
    ``--set seed=3``): the run settings keyed by their :class:`RunSettings` field."""
    hyper, run = {}, {}
    for k, v in params.items():
        if k in RUN_SETTING_PARAMS:
            run[RUN_SETTING_PARAMS[k]] = v
        else:
            hyper[k] = v
    return hyper, run
