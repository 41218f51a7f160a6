"""Fused runs: two or more finished runs on the same dataset combined by a weighted sum of their standardised
scores (issue 33, item 2).

Every member scores a pair by a dot product, ``s_m(i, j) = x_m(i) . y_m(j)`` (ARCHITECTURE.md, the method
contract). Each member's scores are standardised with the mean ``mu_m`` and standard deviation ``sd_m`` of its
scores over the pairs of its *training* bank (``bank_<train>.npz``, :mod:`crossview.engine.scoring`), one pair of
statistics per direction (BITR has two models), and the fused score is::

    s(i, j) = sum_m  w_m (s_m(i, j) - mu_m) / sd_m          w_m >= 0,  sum_m w_m = 1

The constant ``sum_m w_m mu_m / sd_m`` changes no ranking, so the fused score is itself a dot product: the image
embedding ``[a_1 x_1, ..., a_M x_M]`` (``a_m = w_m / sd_m``) against the caption embedding ``[y_1, ..., y_M]``.
A fused run is therefore a run like any other: its ``embeddings_<split>.npz`` and ``bank_<train>.npz`` are those
concatenations (``crossview eval``, hubness-aware scoring and compare work unchanged), and opened
(:func:`open_fused_run`) its method is :class:`FusedMethod` over the members' own fitted methods and features, so
the Query panel, ``crossview query`` and Inspect read it through the same code paths.

**Weights** are chosen on the training split only, by mean rsum over folds of the training images, each fold a
gallery of its images and their captions, every point of a grid over the simplex (step :func:`grid_step`) scored
(the first in grid order wins among equal rsum):

- ``"auto"`` (the default): :data:`FOLDS`-fold cross-validation (:func:`iter_cv_folds`): each member's method is
  trained again, with the member's own settings, on each fold's other training images and scores the fold's
  images it has not seen, standardised with the statistics of that fold run's own training bank. The fold runs
  are ordinary run folders under ``FUSED_DIR/cv/`` (resumable; a fusion that stopped continues them). It costs
  about ``FOLDS x 2/3`` of the members' training time.
- ``"bank"``: folds of the members' training banks, no training: quick, but the members were fitted on those
  images, so every weight is scored in-sample (a member that overfits its training set looks better than it is).

**Scoring.** What is fused are the members' plain embeddings (a member's own default scoring, e.g. inverted softmax
for CCA and CSLS for BITR, is a re-scoring against its bank, not part of its embedding); the fused run then has its
own scoring, like any run: :data:`crossview.engine.scoring.DEFAULT_SCORINGS` ``["fused"]`` (CSLS, its k chosen by
cross-validation in bench/results/quality_flickr8k.md) applied to the fused embeddings with the fused bank. The
weights are chosen under plain fused scores and the scoring applied after. The summary's metrics are under it, the
plain ones kept as ``metrics_plain``; ``crossview eval FUSED --scoring plain`` gives the plain ranking either way.

The evaluation split is read only to report the chosen weights' metrics (``selected_on``: the training folds;
``reported_on``: the evaluation split). Given weights are normalised to sum 1.

Scores are computed block by block over the queries (:data:`DEFAULT_BLOCK` rows, fewer where a row is so wide
that a block would pass :data:`crossview.eval.scoring.BLOCK_ELEMENTS` scores), never as a whole images x captions
matrix of a large gallery, from the members' float32 embeddings (added in float64), with no whole-matrix copies.

The run folder::

    FUSED_DIR/
      config.json    {"method": "fused", "members": [run folders], "weights": "auto" | [w...], the members' data,
                      split, train_split, dataset fingerprint}
      status.json    "finished" (or "running" / "failed" while / when it fails)
      metrics.jsonl  the fusion's events
      summary.json   like any run's, plus "fusion": the members, weights, statistics, candidates and choice
      ranks.npz, embeddings_<split>.npz, bank_<train>.npz   as a trained run writes them

A fused run that stopped before its summary is fused again from its ``config.json`` (:func:`fuse` with
``resume=True``; ``crossview train --resume`` does the same); a finished one is read back.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import CrossViewError
from crossview.core.events import Event, Finished, Log, Plan, Progress, relay
from crossview.eval.scoring import BLOCK_ELEMENTS
from crossview.engine.run_folder import CHECKPOINT, CONFIG, METRICS, RANKS, STATUS, SUMMARY, _METRIC_KEYS, _now

__all__ = ["FUSED", "FOLDS", "DEFAULT_BLOCK", "MAX_MEMBERS", "parse_weights", "simplex_grid", "grid_step",
           "check_members", "score_stats", "fused_ranks", "fused_embeddings", "choose_weights", "iter_choose_weights",
           "bank_folds", "iter_cv_folds", "check_cv_members", "SELECTIONS", "iter_fuse", "fuse",
           "is_fused_run", "FusedMethod", "FusedFeatures", "open_fused_run", "default_fused_dir"]

#: the method name a fused run records
FUSED = "fused"
#: folds of the training bank the weights are chosen on
FOLDS = 3
#: query rows per score block
DEFAULT_BLOCK = 1024
#: the most runs one fusion takes (the simplex grid grows fast)
MAX_MEMBERS = 6
#: how weights are chosen when not given: ``auto`` cross-validates (each member retrained on the folds), ``bank``
#: scores folds of the members' training banks (no training; the members were fitted on those images)
SELECTIONS = ("auto", "bank")


# ------------------------------------------------------------------------------------------ weights
def parse_weights(text: str | Sequence[float] | None, n_members: int) -> list[float] | None:
    """``None`` for ``"auto"`` (or None), else the weights (``"0.5,0.3,0.2"`` or numbers) normalised to sum 1;
    one clear :class:`CrossViewError` for a wrong count, a negative or non-number, or all zeros."""
    if text is None or (isinstance(text, str) and text.strip().lower() in SELECTIONS):
        return None
    if isinstance(text, str):
        parts = [p.strip() for p in text.split(",")]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise CrossViewError(f"--weights {text!r}: give 'auto', 'bank' or one number per run, separated by "
                                 "commas (e.g. 0.5,0.3,0.2)") from None
    else:
        values = [float(v) for v in text]
    if len(values) != n_members:
        raise CrossViewError(f"--weights: {len(values)} weight(s) for {n_members} runs; give one per run, in the "
                             "order of the runs, or 'auto'")
    if any(not np.isfinite(v) for v in values):
        raise CrossViewError(f"--weights: {values} has a value that is not a finite number")
    if any(v < 0 for v in values):
        raise CrossViewError(f"--weights: {', '.join(f'{v:g}' for v in values)} has a negative weight; weights are "
                             ">= 0 (a run that hurts gets 0)")
    total = sum(values)
    if total <= 0:
        raise CrossViewError("--weights: all weights are 0; give at least one positive weight")
    return [v / total for v in values]


def grid_step(n_members: int) -> float:
    """The simplex grid's step: 0.1 for two or three runs, 0.2 for more (the grid stays a few hundred points)."""
    return 0.1 if n_members <= 3 else 0.2


def simplex_grid(n_members: int, step: float | None = None) -> list[tuple[float, ...]]:
    """All weight vectors with ``n_members`` entries >= 0 that are multiples of ``step`` and sum to 1; equal
    weights first (where the step allows them), then lexicographic order."""
    step = grid_step(n_members) if step is None else step
    parts = int(round(1 / step))
    out = []
    for combo in itertools.product(range(parts + 1), repeat=n_members - 1):
        if sum(combo) <= parts:
            out.append(tuple(c / parts for c in (*combo, parts - sum(combo))))
    equal = tuple([1.0 / n_members] * n_members)
    out.sort(key=lambda w: not np.allclose(w, equal))
    return out


# ------------------------------------------------------------------------------------------ members
@dataclass
class Member:
    """One run of a fusion: its folder, config, summary, evaluation-split and training-bank embeddings."""

    run_dir: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    emb: Any = None
    bank: Any = None
    stats: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.run_dir.name} ({self.summary.get('method', self.config.get('method', '?'))})"


def _dataset_key(m: Member) -> tuple[str, str]:
    """What says two runs are on the same data: the dataset fingerprint when recorded, else the data path."""
    fp = m.config.get("dataset_fingerprint")
    if fp:
        return "fingerprint", str(fp)
    return "data", str(m.config.get("data") or m.summary.get("dataset") or "?")


def check_members(run_dirs: Sequence[str | Path], load: bool = True) -> list[Member]:
    """The member runs, checked: at least two distinct finished runs, on the same dataset (fingerprint),
    evaluated on the same split with the same training split, with the same images and captions in their
    evaluation embeddings. ``load``: read their ``embeddings_<split>.npz`` too. One clear line otherwise."""
    from crossview.engine.run_folder import read_config, read_summary
    from crossview.eval.embeddings import load_embeddings

    if len(run_dirs) < 2:
        raise CrossViewError(f"fusing needs at least two runs, got {len(run_dirs)}")
    if len(run_dirs) > MAX_MEMBERS:
        raise CrossViewError(f"fusing takes at most {MAX_MEMBERS} runs, got {len(run_dirs)}")
    folders = [Path(d).expanduser().resolve() for d in run_dirs]
    seen: set[Path] = set()
    members = []
    for f in folders:
        if f in seen:
            raise CrossViewError(f"{f} is given twice; give each run once")
        seen.add(f)
        if not f.is_dir():
            raise CrossViewError(f"{f}: no such run folder")
        if not (f / CONFIG).is_file():
            raise CrossViewError(f"{f}: not a run folder (no {CONFIG})")
        if not (f / SUMMARY).is_file():
            raise CrossViewError(f"{f}: the run has not finished (no {SUMMARY}); let it finish or resume it "
                                 f"('crossview train --resume {f}') before fusing")
        config = read_config(f)
        # a fused run encodes new queries through each member's model (a fused member: through its own members)
        if config.get("method") != FUSED and not (f / CHECKPOINT).is_file():
            raise CrossViewError(f"{f}: the run has no {CHECKPOINT} (its model), so a fused run could not answer "
                                 f"queries through it; resume it ('crossview train --resume {f}') before fusing")
        members.append(Member(f, config, read_summary(f)))
    first = members[0]
    for m in members[1:]:
        if _dataset_key(m) != _dataset_key(first):
            what, a = _dataset_key(first)
            _, b = _dataset_key(m)
            raise CrossViewError(f"{m.run_dir.name} and {first.run_dir.name} are not on the same dataset ({what} "
                                 f"{b} != {a}); fuse runs trained on one dataset")
        for key, default in (("split", "test"), ("train_split", "train")):
            x, y = m.config.get(key) or default, first.config.get(key) or default
            if x != y:
                raise CrossViewError(f"{m.run_dir.name} has {key} {x!r}, {first.run_dir.name} has {y!r}; fuse runs "
                                     "evaluated on the same split and trained on the same split")
    split = str(first.config.get("split") or "test")
    if split == str(first.config.get("train_split") or "train"):
        raise CrossViewError(f"{first.run_dir.name} is evaluated on its training split {split!r}; the fusion's "
                             "weights are chosen on that split, so its numbers would be optimistic: fuse runs "
                             "evaluated on val or test")
    if load:
        for m in members:
            path = m.run_dir / f"embeddings_{split}.npz"
            if not path.is_file():
                raise CrossViewError(f"{m.run_dir}: no embeddings_{split}.npz (a run written before they were "
                                     f"kept); resume or retrain it to fuse it")
            m.emb = load_embeddings(path)
        ref = members[0].emb
        for m in members[1:]:
            if m.emb.image.shape[0] != ref.image.shape[0] or not np.array_equal(m.emb.caption_image,
                                                                                ref.caption_image):
                raise CrossViewError(f"{m.run_dir.name} and {members[0].run_dir.name} evaluated different images or "
                                     f"captions on {split!r} ({m.emb.image.shape[0]} vs {ref.image.shape[0]} "
                                     "images); fuse runs on the same dataset and split")
    return members


def _load_banks(members: list[Member]) -> None:
    """Each member's training bank (:func:`crossview.engine.scoring.run_bank`), checked to hold the same training
    images and captions in every member (a bank sampled with another seed is encoded again with the first's)."""
    from crossview.engine.scoring import open_bank, run_bank

    for m in members:
        m.bank = run_bank(m.run_dir)
    ref = members[0]
    for m in members[1:]:
        if m.bank.image.shape[0] == ref.bank.image.shape[0] and np.array_equal(m.bank.caption_image,
                                                                               ref.bank.caption_image):
            continue
        from crossview.engine.session import open_run
        seed = int(ref.config.get("seed") or 0)
        m.bank = open_bank(open_run(m.run_dir), str(m.config.get("train_split") or "train"), seed)
        if m.bank.image.shape[0] != ref.bank.image.shape[0] or not np.array_equal(m.bank.caption_image,
                                                                                  ref.bank.caption_image):
            raise CrossViewError(f"the training banks of {m.run_dir.name} and {ref.run_dir.name} hold different "
                                 "images; fuse runs trained on the same training split")


# ------------------------------------------------------------------------------------------ scores
def _sides(emb: Any, direction: str) -> tuple[np.ndarray, np.ndarray]:
    """``(image, text)`` of ``emb`` in the model of ``direction`` (t2i's when the file has one)."""
    if direction == "t2i" and emb.image_t2i is not None:
        return emb.image_t2i, emb.text_t2i
    return emb.image, emb.text


def score_stats(emb: Any, direction: str, block_size: int = DEFAULT_BLOCK) -> tuple[float, float]:
    """``(mean, standard deviation)`` of ``image . text`` over every image x caption pair of ``emb`` (a training
    bank) in the model of ``direction``, accumulated block by block; the deviation is 1 when it is 0."""
    img, txt = _sides(emb, direction)
    img = np.asarray(img, np.float32)
    txt = np.asarray(txt, np.float32)
    n, total, sq = 0, 0.0, 0.0
    rows = int(min(block_size, max(1, BLOCK_ELEMENTS // max(1, txt.shape[0]))))
    for a in range(0, img.shape[0], rows):
        s = (img[a:a + rows] @ txt.T).astype(np.float64)
        n += s.size
        total += float(s.sum())
        sq += float((s * s).sum())
    if n == 0:
        raise CrossViewError("a training bank with no images or captions has no score statistics")
    mean = total / n
    sd = float(np.sqrt(max(sq / n - mean * mean, 0.0)))
    return float(mean), (sd if sd > 1e-12 else 1.0)


def _scales(stats: Sequence[dict[str, tuple[float, float]]], weights: Sequence[float], direction: str) -> list[float]:
    return [float(w) / s[direction][1] for w, s in zip(weights, stats)]


def fused_ranks(embs: Sequence[Any], scales: dict[str, Sequence[float]],
                block_size: int = DEFAULT_BLOCK) -> dict[str, np.ndarray]:
    """``{"i2t": (n_images,), "t2i": (n_captions,)}`` 1-based ranks of the fused score ``sum_m a_m s_m`` (``a_m``:
    ``scales[direction][m]``) over the members' embeddings ``embs`` (same images and captions), computed block by
    block of queries (tie rule of :mod:`crossview.eval.metrics`)."""
    from crossview.eval.metrics import first_relevant_ranks

    ci = np.asarray(embs[0].caption_image, np.int64)
    n_img = embs[0].image.shape[0]
    out: dict[str, np.ndarray] = {}
    for d in ("i2t", "t2i"):
        sides = [_sides(e, d) for e in embs]
        a = list(scales[d])
        # float32 embeddings as the members' own evaluations score them (no float64 copies of whole matrices:
        # at COCO size a member's captions are GBs in float64); each member's block of scores is added in float64
        qi, gi = (0, 1) if d == "i2t" else (1, 0)
        queries = [np.asarray(s[qi], np.float32) for s in sides]
        gallery = [np.asarray(s[gi], np.float32) for s in sides]
        if d == "i2t":
            q_labels, g_labels = np.arange(n_img, dtype=np.int64), ci
        else:
            q_labels, g_labels = ci, np.arange(n_img, dtype=np.int64)
        n_q, n_g = queries[0].shape[0], gallery[0].shape[0]
        rows = int(min(block_size, max(1, BLOCK_ELEMENTS // max(1, n_g))))    # a block stays ~32 MB
        r = np.empty(n_q, np.int64)
        for lo in range(0, n_q, rows):
            hi = min(lo + rows, n_q)
            s = np.zeros((hi - lo, n_g))
            for am, q, g in zip(a, queries, gallery):
                if am:
                    s += am * (q[lo:hi] @ g.T)
            r[lo:hi] = first_relevant_ranks(s, q_labels[lo:hi], g_labels)
        out[d] = r
    return out


def fused_embeddings(embs: Sequence[Any], scales: dict[str, Sequence[float]], info: dict[str, str] | None = None) -> Any:
    """The fused run's :class:`~crossview.eval.embeddings.Embeddings`: images ``[a_1 x_1, ..., a_M x_M]`` against
    captions ``[y_1, ..., y_M]`` (see the module docstring), with a t2i model when any member has one."""
    from crossview.eval.embeddings import Embeddings

    def cat(d: str, side: int, scaled: bool) -> np.ndarray:
        parts = []
        for am, e in zip(scales[d], embs):
            x = np.asarray(_sides(e, d)[side], np.float32)
            parts.append(x * np.float32(am) if scaled else x)
        return np.ascontiguousarray(np.hstack(parts), np.float32)

    two = any(e.image_t2i is not None for e in embs)
    first = embs[0]
    return Embeddings(image=cat("i2t", 0, True), text=cat("i2t", 1, False), caption_image=first.caption_image,
                      image_t2i=cat("t2i", 0, True) if two else None, text_t2i=cat("t2i", 1, False) if two else None,
                      image_labels=first.image_labels, captions=first.captions, info=dict(info or {}))


def _rsum(ranks: dict[str, np.ndarray]) -> float:
    from crossview.eval.metrics import rank_metrics, rsum_of

    return rsum_of(rank_metrics(ranks["i2t"]), rank_metrics(ranks["t2i"]))


def bank_folds(banks: Sequence[Any], stats: Sequence[dict[str, tuple[float, float]]], folds: int = FOLDS,
               seed: int = 0, train_split: str = "train") -> list[tuple[list[Any], list[Any]]]:
    """The ``bank`` selection's folds: ``folds`` parts of the training images of the members' ``banks`` (same
    images in each), each ``(its embeddings per member, the members' statistics)``."""
    from crossview.eval.scoring import subset_embeddings

    n = int(banks[0].image.shape[0])
    has_caption = np.bincount(np.asarray(banks[0].caption_image, np.int64), minlength=n) > 0
    usable = np.flatnonzero(has_caption)
    if usable.size < 2 * folds:
        raise CrossViewError(f"choosing the weights needs at least {2 * folds} training images with captions, the "
                             f"{train_split} bank has {usable.size}; give --weights")
    perm = np.random.default_rng(seed).permutation(usable)
    parts = [np.sort(p) for p in np.array_split(perm, folds)]
    return [([subset_embeddings(b, p) for b in banks], list(stats)) for p in parts]


def iter_choose_weights(fold_sets: Sequence[tuple[Sequence[Any], Sequence[dict[str, tuple[float, float]]]]],
                        grid: Sequence[Sequence[float]] | None = None,
                        block_size: int = DEFAULT_BLOCK) -> Iterator[tuple[int, int]]:
    """:func:`choose_weights` as a generator: yields ``(done, total)`` after each grid point and returns the
    record."""
    n_members = len(fold_sets[0][0])
    grid = [tuple(float(x) for x in w) for w in (simplex_grid(n_members) if grid is None else grid)]
    singles = [tuple(1.0 if j == i else 0.0 for j in range(n_members)) for i in range(n_members)]
    todo = grid + [w for w in singles if w not in grid]
    scores: dict[tuple[float, ...], float] = {}
    for k, w in enumerate(todo):
        rs = []
        for embs, stats in fold_sets:
            sc = {d: _scales(stats, w, d) for d in ("i2t", "t2i")}
            rs.append(_rsum(fused_ranks(embs, sc, block_size)))
        scores[w] = float(np.mean(rs))
        yield k + 1, len(todo)
    best = max(range(len(grid)), key=lambda i: (scores[grid[i]], -i))
    return {"weights": list(grid[best]), "by": "rsum", "folds": len(fold_sets),
            "fold_images": [int(embs[0].image.shape[0]) for embs, _ in fold_sets], "grid_step": grid_step(n_members),
            "candidates": [{"weights": list(w), "rsum": scores[w]} for w in grid],
            "members_rsum": [scores[w] for w in singles]}


def choose_weights(fold_sets: Sequence[tuple[Sequence[Any], Sequence[dict[str, tuple[float, float]]]]],
                   grid: Sequence[Sequence[float]] | None = None, block_size: int = DEFAULT_BLOCK) -> dict[str, Any]:
    """Choose the weights on training folds only (see the module docstring): every grid point's mean rsum over
    ``fold_sets``, each ``(the members' embeddings of one fold's held-out training images, the members'
    (mean, sd) statistics per direction)``; each fold is a gallery of its images and their captions
    (:func:`bank_folds`, or :func:`cv_folds`). Returns ``{"weights", "by": "rsum", "folds", "fold_images",
    "grid_step", "candidates": [{"weights", "rsum"}], "members_rsum"}`` (``members_rsum``: each member alone on the
    same folds)."""
    from crossview.core.progress import drive

    return drive(iter_choose_weights(fold_sets, grid, block_size))


def _fold_dir(folder: Path, k: int, member: Member, f: int) -> Path:
    return folder / "cv" / f"{k + 1}-{member.run_dir.name}-f{f + 1}"


def check_cv_members(members: Sequence[Member]) -> None:
    """That every member can be trained again on training folds (``--weights auto``); one clear line otherwise."""
    from crossview.engine.cv_runs import check_retrainable

    for m in members:
        check_retrainable(m.config, m.run_dir.name, "fuse its members instead, or use --weights bank (folds of the "
                          "training banks) or given weights" if m.config.get("method") == FUSED else
                          "use --weights bank (folds of the training banks) or give the weights")


def iter_cv_folds(members: Sequence[Member], folder: Path, folds: int = FOLDS, seed: int = 0,
                  block_size: int = DEFAULT_BLOCK) -> Iterator[Event]:
    """The ``auto`` selection's folds: ``folds``-fold cross-validation of the members' training images (by image,
    :func:`crossview.engine.splits.fold_splits`): each member's method is trained again with its own settings on
    each fold's other training images and evaluated on the fold (ordinary resumable runs under ``folder/cv/``;
    a finished one is read back; :mod:`crossview.engine.cv_runs`). Yields their events (progress and logs) and
    returns the fold sets :func:`choose_weights` takes: each fold's held-out embeddings per member with the
    statistics of that fold run's own training bank. Only training images are ever trained on or scored."""
    from crossview.engine.cv_runs import iter_fold_run, load_run_dataset, run_folds

    check_cv_members(members)
    cfg0 = members[0].config
    ds = load_run_dataset(cfg0)
    train_split = str(cfg0.get("train_split") or "train")
    parts = run_folds(ds, cfg0, folds, seed)
    total = len(members) * len(parts)
    yield Log(f"cross-validation: {len(parts)} folds of the {len(ds.splits[train_split]):,} {train_split} images; "
              f"each of the {len(members)} runs trained again on each fold's other images ({total} runs in "
              f"{folder / 'cv'})")
    done = 0
    sets: list[tuple[list[Any], list[Any]]] = [([], []) for _ in parts]
    for k, m in enumerate(members):
        for f, (tr, te) in enumerate(parts):
            fold = yield from iter_fold_run(m.config, ds, _fold_dir(folder, k, m, f), tr, te,
                                            f"cv fold {f + 1}/{len(parts)}, {m.run_dir.name}")
            sets[f][0].append(fold.emb)
            sets[f][1].append({d: score_stats(fold.bank, d, block_size) for d in ("i2t", "t2i")})
            done += 1
            yield Progress(done, total, "cross-validation runs", stage="cv")
    return sets


# ------------------------------------------------------------------------------------------ the run
def default_fused_dir(members: Sequence[str | Path], dataset_name: str) -> Path:
    """A new folder under the runs folder: ``fused-<dataset>-<timestamp>``."""
    from crossview.core.settings import get_settings
    from crossview.engine.run_folder import safe_name, unused_dir

    return unused_dir(get_settings().runs_dir, FUSED, safe_name(dataset_name))


def is_fused_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a fused run (its config.json says ``"method": "fused"``)."""
    import json

    path = Path(run_dir) / CONFIG
    try:
        return path.is_file() and json.loads(path.read_text(encoding="utf-8")).get("method") == FUSED
    except (OSError, ValueError, AttributeError, RecursionError):   # a damaged config: the run's opening says so
        return False


def _copy_ids(member_dir: Path) -> dict[str, np.ndarray]:
    """The query ids a member's ranks.npz records (the same evaluation split as the fusion's)."""
    out: dict[str, np.ndarray] = {}
    path = member_dir / RANKS
    if path.is_file():
        from crossview.core.io import read_npz

        try:
            out = read_npz(path, ("image_ids", "caption_ids"), todo="")
        except CrossViewError:
            pass                # the ids are extras: a damaged ranks.npz of a member leaves them out
    return out


def iter_fuse(run_dirs: Sequence[str | Path] | None = None, weights: str | Sequence[float] | None = "auto", *,
              run_dir: str | Path | None = None, folds: int = FOLDS, block_size: int = DEFAULT_BLOCK,
              should_stop: Any = None) -> Iterator[Event]:
    """Fuse the runs ``run_dirs`` into a run folder (``run_dir``; default: a new folder under the runs folder),
    yielding events (a :class:`Plan`, :class:`Progress` per stage, :class:`Log` lines and :class:`Finished` with
    the summary). With ``run_dirs`` None, ``run_dir`` is a fused run to finish from its config.json (a finished
    one yields its summary). Bad input raises one clear :class:`CrossViewError` before anything is written."""
    from crossview.core.io import EventLog, atomic_write_json
    from crossview.engine.run_folder import _WriterLock, read_config, read_summary

    resuming = run_dirs is None
    if run_dirs is None:
        if run_dir is None:
            raise CrossViewError("give the runs to fuse, or the folder of a fused run to finish")
        folder = Path(run_dir)
        if not is_fused_run(folder):
            raise CrossViewError(f"{folder}: not a fused run (no config.json with method 'fused')")
        cfg = read_config(folder)
        if (folder / SUMMARY).is_file() and (folder / STATUS).is_file():
            import json
            try:
                done = json.loads((folder / STATUS).read_text(encoding="utf-8")).get("status") == "finished"
            except (OSError, ValueError, AttributeError):
                done = False
            if done:
                yield Finished(summary=read_summary(folder))
                return
        run_dirs, weights = cfg.get("members") or [], cfg.get("weights", "auto")
        folds = int(cfg.get("folds") or folds)
    members = check_members(list(run_dirs))
    given = parse_weights(weights if weights is None or isinstance(weights, str) else list(weights), len(members))
    mode = "given" if given is not None else ("bank" if isinstance(weights, str) and weights.strip().lower() == "bank"
                                              else "auto")
    first = members[0]
    split = str(first.config.get("split") or "test")
    train_split = str(first.config.get("train_split") or "train")
    seed = int(first.config.get("seed") or 0)
    dataset_name = str(first.summary.get("dataset") or "data")
    folder = Path(run_dir) if run_dir is not None else default_fused_dir([m.run_dir for m in members], dataset_name)
    if not resuming and (folder / CONFIG).is_file():
        raise CrossViewError(f"{folder} holds a run already; give a new --run-dir for the fused run"
                             + (f", or finish that fusion with 'crossview fuse --resume {folder}'"
                                if is_fused_run(folder) else ""))
    if folder.resolve() in {m.run_dir for m in members}:
        raise CrossViewError(f"{folder} is one of the runs being fused; give a new --run-dir")
    if folds < 2:
        raise CrossViewError(f"choosing the weights needs at least 2 folds, got {folds}")
    if mode == "auto":
        check_cv_members(members)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CrossViewError(f"{folder}: cannot create the run folder ({e.strerror or e})") from None
    lock = _WriterLock(folder)
    lock.acquire()
    log = None
    t0 = time.monotonic()
    try:
        config = {"method": FUSED, "members": [str(m.run_dir) for m in members],
                  "weights": mode if given is None else given, "folds": int(folds),
                  "split": split, "train_split": train_split, "val_split": first.config.get("val_split"),
                  "seed": seed, "created": _now(),
                  # the fused run's scoring (plain unless DEFAULT_SCORINGS["fused"] says otherwise; _write_results)
                  "scoring": _fused_scoring()}
        for key in ("data", "data_format", "image_root", "dataset_fingerprint", "derived_splits", "text_view"):
            if first.config.get(key) is not None:
                config[key] = first.config[key]
        atomic_write_json(folder / CONFIG, config)
        atomic_write_json(folder / STATUS, {"status": "running", "phase": "fuse", "events": 0, "updated": _now()})
        log = EventLog(folder / METRICS)

        last_logged = [float("-inf")]

        def emit(ev: Event) -> Event:
            # progress is logged at most every 0.5 s (the cross-validation's runs report every batch), as a run does
            if isinstance(ev, Progress) and ev.step not in (0, ev.total):
                now = time.monotonic()
                if now - last_logged[0] < 0.5:
                    return ev
                last_logged[0] = now
            log.write(ev)
            return ev

        n_sel = 0 if given is not None else len(simplex_grid(len(members))) + len(members)
        # rough seconds (a grid point scores 3 folds of the bank; measured ~0.02 s each on the Flickr8k sample);
        # the cross-validation's runs are as long as the members' trainings (their own times, 2/3 of the images)
        cv_seconds = sum(float(m.summary.get("train_seconds") or 0) for m in members) * 2 / 3 * folds
        yield emit(Plan(stages=([{"name": "cv", "label": "cross-validation runs", "seconds": cv_seconds}]
                                if mode == "auto" else []) +
                               [{"name": "banks", "label": "training banks: score statistics",
                                 "seconds": 0.2 * len(members)},
                                {"name": "weights", "label": f"choosing weights on {train_split} folds",
                                 "seconds": 0.05 * n_sel},
                                {"name": "evaluate", "label": f"evaluating on {split}", "seconds": 0.5}]))
        yield emit(Log(f"fusing {len(members)} runs on {dataset_name}: " + ", ".join(m.label for m in members)))
        _load_banks(members)
        for k, m in enumerate(members):
            m.stats = {d: score_stats(m.bank, d, block_size) for d in ("i2t", "t2i")}
            yield emit(Progress(k + 1, len(members), "training banks: score statistics", stage="banks"))
            if should_stop is not None and should_stop():
                from crossview.core.errors import Cancelled
                raise Cancelled("fusion cancelled")
        stats = [m.stats for m in members]
        if given is None:
            if mode == "auto":
                fold_sets = yield from _forward(iter_cv_folds(members, folder, folds, seed, block_size), emit,
                                                should_stop)
                selected_on = f"{train_split}-cv{folds}"
                how = (f"{folds}-fold cross-validation of the {train_split} images: each run trained again on each "
                       "fold's other images, the fold's images scored")
            else:
                fold_sets = bank_folds([m.bank for m in members], stats, folds, seed, train_split)
                selected_on = f"{train_split} ({folds} folds of its bank)"
                how = (f"{folds} folds of the {train_split} bank (the runs' own training images, which they were "
                       "fitted on: every weight is scored in-sample)")
            label = f"choosing weights on {train_split} folds"
            choice = yield from _forward(relay(iter_choose_weights(fold_sets, block_size=block_size),
                                               lambda d, t: Progress(d, t, label, stage="weights")), emit, should_stop)
            choice = {**choice, "selected_on": selected_on, "how": how, "seed": seed}
        else:
            choice = {"weights": list(given), "by": "given", "selected_on": "given", "candidates": []}
        w = [float(x) for x in choice["weights"]]
        yield emit(Log("weights " + ", ".join(f"{m.run_dir.name} {x:.2f}" for m, x in zip(members, w)) +
                       f" ({'chosen by rsum on ' + choice['selected_on'] if given is None else 'given'})"))
        scales = {d: _scales(stats, w, d) for d in ("i2t", "t2i")}
        yield emit(Progress(0, 1, f"evaluating on {split}", stage="evaluate"))
        t1 = time.monotonic()
        ranks = fused_ranks([m.emb for m in members], scales, block_size)
        summary = _write_results(folder, members, w, choice, scales, ranks, split, train_split, seed,
                                 dataset_name, time.monotonic() - t0, time.monotonic() - t1)
        yield emit(Progress(1, 1, f"evaluating on {split}", stage="evaluate"))
        atomic_write_json(folder / STATUS, {"status": "finished", "phase": "finished", "events": 0,
                                            "train_seconds": summary["train_seconds"], "updated": _now()})
        yield emit(Finished(summary=summary))
    except BaseException as e:
        from crossview.core.errors import Cancelled
        status = "cancelled" if isinstance(e, (Cancelled, GeneratorExit)) else "failed"
        try:
            atomic_write_json(folder / STATUS, {"status": status, "phase": "fuse", "events": 0, "updated": _now(),
                                                "error": None if status == "cancelled" else str(e)[:500]})
        except OSError:
            pass
        raise
    finally:
        if log is not None:
            log.close()
        lock.release()


def _forward(work: Iterator[Event], emit: Any, should_stop: Any) -> Iterator[Event]:
    """Yield ``work``'s events through ``emit`` (checking ``should_stop`` after each) and return its result."""
    from crossview.core.errors import Cancelled

    try:
        while True:
            try:
                ev = next(work)
            except StopIteration as stop:
                return stop.value
            yield emit(ev)
            if should_stop is not None and should_stop():
                raise Cancelled("fusion cancelled")
    finally:
        work.close()        # a cross-validation run stopped here checkpoints and resumes with the fusion


def _fused_scoring() -> dict[str, Any]:
    from crossview.engine.scoring import default_scoring

    return default_scoring(FUSED)


def _write_results(folder: Path, members: list[Member], weights: list[float], choice: dict[str, Any],
                   scales: dict[str, list[float]], ranks: dict[str, np.ndarray], split: str, train_split: str,
                   seed: int, dataset_name: str, seconds: float, eval_seconds: float) -> dict[str, Any]:
    """Write ranks.npz, embeddings_<split>.npz, bank_<train>.npz and summary.json; returns the summary."""
    from crossview.core.io import atomic_write_json
    from crossview.engine.scoring import bank_path
    from crossview.eval.bootstrap import bootstrap_ci
    from crossview.eval.embeddings import embeddings_hubness, save_embeddings
    from crossview.eval.metrics import rank_metrics, rsum_of

    embs = [m.emb for m in members]
    ci = np.asarray(embs[0].caption_image, np.int64)
    ids = _copy_ids(members[0].run_dir)
    import io
    buf = io.BytesIO()
    np.savez(buf, i2t=ranks["i2t"].astype(np.int64), t2i=ranks["t2i"].astype(np.int64), caption_image=ci,
             image_ids=ids.get("image_ids", np.arange(embs[0].image.shape[0])),
             caption_ids=ids.get("caption_ids", np.arange(ci.size)))
    from crossview.core.io import atomic_write_bytes
    atomic_write_bytes(folder / RANKS, buf.getvalue())
    emb = fused_embeddings(embs, scales, {"method": FUSED, "dataset": dataset_name, "split": split})
    save_embeddings(folder / f"embeddings_{split}.npz", emb)
    bank = fused_embeddings([m.bank for m in members], scales, {"split": train_split, "what": "bank"})
    save_embeddings(bank_path(folder, train_split), bank)
    i2t, t2i = rank_metrics(ranks["i2t"]), rank_metrics(ranks["t2i"])
    member_rows = []
    for m, w in zip(members, weights):
        member_rows.append({"run": str(m.run_dir), "name": m.run_dir.name, "method": m.summary.get("method"),
                            "weight": float(w), "rsum": m.summary.get("rsum"),
                            "mean": {d: m.stats[d][0] for d in ("i2t", "t2i")},
                            "sd": {d: m.stats[d][1] for d in ("i2t", "t2i")},
                            "image_encoder": m.summary.get("image_encoder"),
                            "text_encoder": m.summary.get("text_encoder")})
    how = "rsum" if choice.get("by") == "rsum" else "given"
    selected_on = choice["selected_on"] if how == "rsum" else "nothing"
    choices = [{"what": "fusion weights", "on": choice["selected_on"], "by": how}] if how == "rsum" else []
    summary = {
        "method": FUSED,
        "dataset": dataset_name,
        "split": split,
        "i2t": {k: float(i2t[k]) for k in _METRIC_KEYS},
        "t2i": {k: float(t2i[k]) for k in _METRIC_KEYS},
        "rsum": float(rsum_of(i2t, t2i)),
        "train_seconds": round(seconds, 3),
        "status": "finished",
        "params": {"members": [m.run_dir.name for m in members], "weights": [round(float(w), 4) for w in weights]},
        "image_encoder": "+".join(str(m.summary.get("image_encoder")) for m in members),
        "text_encoder": "+".join(str(m.summary.get("text_encoder")) for m in members),
        "n_images": int(embs[0].image.shape[0]),
        "n_captions": int(ci.size),
        "seed": seed,
        "eval_seconds": round(eval_seconds, 3),
        "ci": bootstrap_ci(ranks["i2t"], ranks["t2i"], ci, seed=seed),
        "hubness": embeddings_hubness(emb),
        "data": members[0].config.get("data"),
        "run_dir": str(folder),
        "fusion": {"members": member_rows, "weights": [float(w) for w in weights], "choice": choice,
                   "normalisation": f"each run's scores standardised by their mean and sd over its {train_split} "
                                    "bank's pairs, per direction"},
        "selected_on": selected_on,
        "reported_on": split,
        "optimistic": False,
        "choices": choices,
        "finished": _now(),
    }
    # the fused run's own scoring (crossview.engine.scoring.DEFAULT_SCORINGS["fused"]; plain unless that entry says
    # otherwise): applied to the fused embeddings with the fused bank, the members' plain embeddings being what is
    # fused (a member's own csls is not part of its embedding); the plain numbers kept as metrics_plain
    from crossview.engine.scoring import scored_summary, write_scored_ranks
    from crossview.eval.scoring import evaluate_scoring

    record = _fused_scoring()
    if record["scoring"] == "plain":
        summary["scoring"] = {**record, "bank": None, "reported_on": split}
    else:
        res = evaluate_scoring(emb, bank, record["scoring"], record["param"])
        write_scored_ranks(folder, res["ranks"])
        summary = scored_summary(summary, {**res, "caption_image": ci}, record, train_split, seed)
    atomic_write_json(folder / SUMMARY, summary)
    return summary


def fuse(run_dirs: Sequence[str | Path] | None = None, weights: str | Sequence[float] | None = "auto", *,
         run_dir: str | Path | None = None, folds: int = FOLDS, block_size: int = DEFAULT_BLOCK) -> dict[str, Any]:
    """:func:`iter_fuse` drained: the fused run's summary (its folder is ``summary["run_dir"]``)."""
    from crossview.engine.runs import drain

    return drain(iter_fuse(run_dirs, weights, run_dir=run_dir, folds=folds, block_size=block_size), "fusion")


# ------------------------------------------------------------------------------------------ opening
class FusedMethod:
    """The fitted "method" of an opened fused run: each member's own method on its own columns of the fused
    features (:class:`FusedFeatures`), the image side scaled by ``a_m = w_m / sd_m`` per direction and the parts
    concatenated, so the dot product of the embeddings is the fused score (module docstring). Not trainable: it
    is only ever built from finished runs."""

    name = FUSED
    wants_image_files = False
    is_fitted = True

    def __init__(self, methods: Sequence[Any], image_slices: Sequence[slice], text_slices: Sequence[slice],
                 scales: dict[str, Sequence[float]]) -> None:
        self.methods = list(methods)
        self.image_slices = list(image_slices)
        self.text_slices = list(text_slices)
        self.scales = {d: [float(x) for x in v] for d, v in scales.items()}
        self.directions_differ = any(getattr(m, "directions_differ", False) for m in self.methods)
        self.needs_text_features = any(getattr(m, "needs_text_features", True) for m in self.methods)
        #: what an explanation of this run says (crossview.explain.maps.Explainer): set by open_fused_run
        self.explain_refusal = ("a fused run's score is a weighted sum of its member runs' scores, so it has no "
                                "region map or word importance of its own; explain one of its member runs")

    def check_is_fitted(self) -> None:
        for m in self.methods:
            m.check_is_fitted()

    def get_params(self) -> dict[str, Any]:
        return {}

    def _part(self, data: Any, k: int) -> Any:
        m = self.methods[k]
        img = data.image_features
        txt = data.text_features
        return replace(data, image_features=None if img is None else np.asarray(img)[:, self.image_slices[k]],
                       text_features=None if txt is None or not getattr(m, "needs_text_features", True)
                       else (txt.tocsr()[:, self.text_slices[k]] if hasattr(txt, "tocsr")
                             else np.asarray(txt)[:, self.text_slices[k]]))

    def encode_images(self, data: Any, direction: str = "i2t") -> np.ndarray:
        """``(n_images, sum D_m) float32``: each member's image embedding times its scale, side by side."""
        parts = [np.asarray(m.encode_images(self._part(data, k), direction=direction), np.float32)
                 * np.float32(self.scales[direction][k]) for k, m in enumerate(self.methods)]
        return np.ascontiguousarray(np.hstack(parts), np.float32)

    def encode_texts(self, data: Any, direction: str = "i2t") -> np.ndarray:
        """``(n_captions, sum D_m) float32``: each member's caption embedding, side by side."""
        parts = [np.asarray(m.encode_texts(self._part(data, k), direction=direction), np.float32)
                 for k, m in enumerate(self.methods)]
        return np.ascontiguousarray(np.hstack(parts), np.float32)


def _fused_features_class() -> type:
    from crossview.features import Features, encode_texts, run_image_encoder

    class FusedFeatures(Features):
        """The members' features side by side (image columns, caption columns), with each member's own encoders
        for new captions and new image files (:meth:`encode_new_captions`, :meth:`encode_new_images`)."""

        members: list[Any]

        def encode_new_captions(self, captions: Sequence[str], device: str = "cpu") -> np.ndarray:
            parts = []
            for f, m in zip(self.members, self.methods):
                if getattr(m, "needs_text_features", True) and f.text is not None:
                    parts.append(encode_texts(f, captions, device=device))
                else:
                    parts.append(np.zeros((len(captions), 0), np.float32))
            return np.hstack(parts).astype(np.float32)

        def encode_new_images(self, paths: Sequence[str], device: str = "cpu") -> np.ndarray:
            parts = []
            for f in self.members:
                enc = getattr(f, "encode_new_images", None)
                if enc is not None:
                    x = enc(list(paths), device=device)
                else:
                    x = run_image_encoder(f).encode_paths(list(paths), num_workers=0, device=device)
                if getattr(f, "image_transform", None) is not None:
                    x = f.image_transform(x)
                parts.append(np.asarray(x, np.float32))
            return np.hstack(parts).astype(np.float32)

    return FusedFeatures


def FusedFeatures(members: Sequence[Any], methods: Sequence[Any]) -> Any:
    """The features of an opened fused run from its members' features (see :class:`FusedMethod`)."""
    cls = _fused_features_class()
    img = np.hstack([np.asarray(f.image, np.float32) for f in members])
    n_caps = next((f.text.shape[0] for f in members if f.text is not None), 0)
    texts = [f.text if f.text is not None and getattr(m, "needs_text_features", True)
             else np.zeros((n_caps, 0), np.float32) for f, m in zip(members, methods)]
    if any(hasattr(t, "tocsr") for t in texts):     # a TF-IDF member: the side by side rows stay sparse
        import scipy.sparse as sp
        text = sp.hstack([sp.csr_matrix(t, dtype=np.float32) for t in texts], format="csr", dtype=np.float32)
    else:
        text = np.hstack([np.asarray(t, np.float32) for t in texts]) if texts else None
    feats = cls(image=img, text=text, image_encoder=FUSED, text_encoder=FUSED)
    feats.members = list(members)
    feats.methods = list(methods)
    return feats


def _slices(widths: Sequence[int]) -> list[slice]:
    out, a = [], 0
    for w in widths:
        out.append(slice(a, a + w))
        a += w
    return out


def open_fused_run(run_dir: str | Path, dataset: Any = None, *, progress: Any = None, should_stop: Any = None) -> Any:
    """The fused run in ``run_dir`` opened as an :class:`~crossview.engine.session.OpenRun`: each member opened
    (:func:`crossview.engine.session.open_run`, on one dataset) and joined by :class:`FusedMethod` /
    :class:`FusedFeatures` with the weights and statistics of its summary."""
    from crossview.engine.run_folder import read_config, read_summary
    from crossview.engine.session import OpenRun, open_run

    folder = Path(run_dir)
    config = read_config(folder)
    if not (folder / SUMMARY).is_file():
        raise CrossViewError(f"{folder}: the fusion has not finished; finish it with 'crossview fuse --resume "
                             f"{folder}'")
    summary = read_summary(folder)
    fusion = summary.get("fusion")
    rows = fusion.get("members") if isinstance(fusion, dict) else None
    if not isinstance(rows, list) or len(rows) < 2:
        raise CrossViewError(f"{folder / SUMMARY}: no members in its 'fusion' record; the summary is damaged: fuse "
                             "the runs again")
    opened = []
    for row in rows:
        path = Path(str(row.get("run", "")))
        if not (path / CONFIG).is_file():
            raise CrossViewError(f"{folder}: its member run {path} is gone; a fused run opens its members, so "
                                 "restore that run folder (its metrics stay readable in Inspect)")
        run = open_run(path, dataset if not opened else opened[0].dataset, progress=progress,
                       should_stop=should_stop)
        opened.append(run)
    try:
        scales = {d: [float(r["weight"]) / float(r["sd"][d]) for r in rows] for d in ("i2t", "t2i")}
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise CrossViewError(f"{folder / SUMMARY}: the members' weights or statistics are damaged; fuse the runs "
                             "again") from None
    methods = [r.method for r in opened]
    feats = [r.features for r in opened]
    widths_t = [(f.text.shape[1] if f.text is not None and getattr(m, "needs_text_features", True) else 0)
                for f, m in zip(feats, methods)]
    method = FusedMethod(methods, _slices([f.image.shape[1] for f in feats]), _slices(widths_t), scales)
    method.explain_refusal = (f"{folder.name} is a fused run: its score is a weighted sum of its member runs' "
                              "scores, so it has no region map or word importance of its own; explain one of its "
                              f"members ({', '.join(r.run_dir.name for r in opened)})")
    features = FusedFeatures(feats, methods)
    return OpenRun(run_dir=folder, config=config, summary=summary, method=method, dataset=opened[0].dataset,
                   features=features)
