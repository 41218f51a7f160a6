"""One rule for the splits of a run, used by the CLI, the library and the app alike.

A run trains on ``train_split``, stops early on ``val_split`` (when the dataset has it and it is not the
evaluation split) and is evaluated on one split, which it records in ``config.json`` and ``summary.json``;
every later view (``crossview eval RUN``, ``open_run(RUN).retriever()``, the app's Query gallery) defaults
to that split. When no evaluation split is named (``split=None``):

1. ``test`` when the dataset has it;
2. else ``val`` (which then is not also used for early stopping: it would leak into the model choice);
3. else a held-out part of the training split: ``HELDOUT_FRACTION`` of its images, drawn with the run's
   seed, becomes the split ``heldout`` and the training split loses them. Both derived splits are recorded
   in ``config.json`` (``"derived_splits"``) and applied again whenever the run is opened or resumed, so the
   held-out images never leak into training, whichever view asks.

An experiment (:mod:`crossview.experiments`) trains one run per fold: :func:`fold_splits` gives the
k-fold partitions of the images (scikit-learn's ``KFold``; a caption always goes with its image), and
:func:`train <crossview.engine.run.train>` records a fold as derived splits (``derived_splits=``) in the
same way, so a fold's run is reopened, resumed and evaluated on the very images it was tested on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError

__all__ = ["SplitPlan", "plan_splits", "apply_derived_splits", "checked_derived_splits", "fold_splits", "HELDOUT", "HELDOUT_FRACTION", "MIN_HELDOUT",
           "AUTO_SPLIT_HELP", "describe_auto_split"]

HELDOUT = "heldout"
HELDOUT_FRACTION = 0.1
#: Fewest images a held-out evaluation split may have (R@10 over fewer images says nothing).
MIN_HELDOUT = 10

AUTO_SPLIT_HELP = ("test if the dataset has it, else val, else a held-out 10%% of train; the run records it "
                   "and later views default to it")


@dataclass
class SplitPlan:
    """Which split a run trains on, stops early on and is evaluated on, and the splits it derives."""

    train: str
    val: str | None
    eval: str
    derived: dict[str, list[int]] = field(default_factory=dict)
    note: str | None = None


def _has(ds: Any, name: str | None) -> bool:
    return bool(name) and name in ds.splits and len(ds.splits[name]) > 0


def plan_splits(ds: Any, split: str | None = None, train_split: str = "train", val_split: str | None = "val",
                seed: int = 0) -> SplitPlan:
    """The :class:`SplitPlan` for ``ds`` (see the module docstring); ``split=None`` picks automatically.

    Raises :class:`CrossViewError` naming the dataset and its splits when a named split is missing or the
    training split is too small to hold a part out.
    """
    have = ", ".join(ds.split_names) or "none"
    where = f"dataset {ds.name!r} ({getattr(ds, 'source', None) or 'in memory'})"
    if not _has(ds, train_split):
        raise CrossViewError(f"{where} has no split {train_split!r} to train on; it has: {have}. "
                             "Choose one with --train-split")
    if split is not None:
        if split == HELDOUT and split not in ds.splits:
            split = None  # asking for the held-out part by name: derive it as auto would
        elif not _has(ds, split):
            raise CrossViewError(f"{where} has no split {split!r} for evaluation; it has: {have}. "
                                 "Choose one with --split, or leave --split out to evaluate on test, else val, "
                                 "else a held-out part of train")
        elif split == train_split:
            raise CrossViewError(f"{where}: the evaluation split {split!r} is the training split; evaluating on "
                                 "training images says nothing. Choose another --split, or leave it out")
    val = val_split if _has(ds, val_split) else None
    if split is not None:
        return SplitPlan(train=train_split, val=None if val == split else val, eval=split)
    if _has(ds, "test") and train_split != "test":
        return SplitPlan(train=train_split, val=None if val == "test" else val, eval="test")
    if val is not None and val != train_split:
        n = len(ds.splits[val])
        return SplitPlan(train=train_split, val=None, eval=val,
                         note=f"{where} has no test split: evaluating on {val} ({n:,} images); {val} is therefore "
                              "not used for early stopping")
    images = np.asarray(ds.splits[train_split], dtype=np.int64)
    n_out = max(MIN_HELDOUT, int(round(HELDOUT_FRACTION * len(images))))
    if len(images) - n_out < MIN_HELDOUT:
        raise CrossViewError(f"{where} has neither a test nor a val split, and its {train_split!r} split has only "
                             f"{len(images)} images, too few to hold {n_out} out for evaluation; add a val or test "
                             "split to the dataset, or name one with --split")
    rng = np.random.default_rng(seed)
    held = np.sort(rng.choice(images, size=n_out, replace=False))
    rest = np.setdiff1d(images, held)
    return SplitPlan(train=train_split, val=None, eval=HELDOUT,
                     derived={train_split: rest.tolist(), HELDOUT: held.tolist()},
                     note=f"{where} has neither a test nor a val split: {n_out:,} of its {len(images):,} "
                          f"{train_split} images (seed {seed}) are held out as split {HELDOUT!r} for evaluation "
                          "and not trained on")


def apply_derived_splits(ds: Any, derived: dict[str, Any] | None) -> Any:
    """``ds`` with the run's derived splits applied (a shallow copy; ``ds`` itself is not changed).

    The indices are checked against the dataset: a run folder from elsewhere is data, and a bad entry gets
    one clear line.
    """
    if not derived:
        return ds
    import copy

    if not isinstance(derived, dict):
        raise CrossViewError(f"config.json: 'derived_splits' must be an object of split name -> image indices, "
                             f"got {type(derived).__name__}; the run folder is damaged")
    splits = dict(ds.splits)
    for name, idx in derived.items():
        if not isinstance(name, str) or not isinstance(idx, list) or \
                not all(isinstance(i, int) and not isinstance(i, bool) for i in idx):
            raise CrossViewError(f"config.json: derived split {name!r} must be a list of image indices; the run "
                                 "folder is damaged")
        arr = np.asarray(idx, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= ds.n_images):
            raise CrossViewError(f"config.json: derived split {name!r} names images outside the dataset "
                                 f"(0..{ds.n_images - 1}); the run was trained on other data")
        splits[name] = np.sort(arr)
    out = copy.copy(ds)
    out.splits = splits
    return out


def describe_auto_split(ds: Any, train_split: str = "train", val_split: str | None = "val") -> str:
    """One line saying what ``split=None`` resolves to for ``ds`` (for the app's Train panel)."""
    try:
        plan = plan_splits(ds, None, train_split, val_split)
    except CrossViewError as e:
        return str(e)
    n = len(plan.derived[HELDOUT]) if plan.eval == HELDOUT else len(ds.splits[plan.eval])
    if plan.eval == "test":
        return f"evaluates on test ({n:,} images)" + (f"; early stopping on {plan.val}" if plan.val else "")
    if plan.eval == HELDOUT:
        return f"no test or val split: evaluates on {n:,} held-out train images (recorded in the run)"
    return f"no test split: evaluates on {plan.eval} ({n:,} images); no early stopping on it"


def checked_derived_splits(ds: Any, derived: dict[str, Any] | None) -> dict[str, list[int]]:
    """``derived`` (split name -> image indices, arrays or lists) as the plain JSON lists ``config.json``
    records, checked against ``ds``; ``{}`` for none."""
    if not derived:
        return {}
    out: dict[str, list[int]] = {}
    for name, idx in derived.items():
        arr = np.asarray(idx)
        if not isinstance(name, str) or not name or arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise CrossViewError(f"derived split {name!r}: give a split name and a flat list of image indices")
        out[name] = sorted({int(i) for i in arr.tolist()})
    apply_derived_splits(ds, out)   # raises on indices outside the dataset
    return out


def fold_splits(images: Any, n_folds: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n_folds`` ``(train, test)`` partitions of the image indices ``images`` (or ``range(images)`` for
    an int), each image in exactly one test part; both sorted ``int64``.

    scikit-learn's ``KFold`` over a permutation drawn by numpy's ``default_rng(seed)`` (the project's
    generator): the first ``n % n_folds`` parts have one image more. The same ``seed`` always gives the
    same folds. Folds are of images, so all the captions of an image stay together.
    """
    from sklearn.model_selection import KFold

    imgs = np.arange(int(images), dtype=np.int64) if np.ndim(images) == 0 else np.asarray(images, dtype=np.int64)
    k = int(n_folds)
    if k < 2:
        raise CrossViewError(f"k-fold needs at least 2 folds, got {n_folds}")
    if len(imgs) < k:
        raise CrossViewError(f"{k} folds need at least {k} images, there are {len(imgs)}")
    perm = imgs[np.random.default_rng(int(seed)).permutation(len(imgs))]
    return [(np.sort(perm[tr]), np.sort(perm[te])) for tr, te in KFold(n_splits=k).split(perm)]
