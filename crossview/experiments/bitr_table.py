"""Experiment 1 of the BITR paper (paper 001, section 7.5.1, Tables 2 and 7): image <-> caption retrieval.

For each method (CCA, WSABIE, BITR with the M, E and C losses; optionally a random-embedding
baseline) on one representation (:mod:`crossview.features.topics`: ``modern``, ``tr``, ``ctr`` or
``default``), the paper's two kinds of metric, both ways:

- **retrieval** (R@K, MedR): queries are the test images (Im2Text) or test captions (Text2Im), the
  gallery is the test captions / images (:meth:`Method.evaluate <crossview.methods.base.Method.evaluate>`;
  BITR ranks each direction with its own model);
- **caption overlap** (BLEU-1, ROUGE-1, percentages): "the samples in the test set comprise the query
  set, and retrieval is performed on the full training set" -- Im2Text scores each of the top-5
  *training* captions of a test image against that image's gold captions; Text2Im scores the query
  caption against the captions of each of its top-5 training images (multi-reference, sacrebleu
  sentence BLEU and rouge-score, as :mod:`crossview.eval.overlap`);
- **Im2Text from an independent corpus** (the BITR setting): the top-5 captions of a caption
  collection that has no images, scored against the query image's gold captions.

Protocols: ``folds=N`` (the paper's Pascal / IAPR protocol: N partitions of all images, each the test
set once, the rest training; metrics averaged over folds) or ``split=NAME`` (train on the ``train``
split, test on ``NAME``; the paper's SBU protocol). Representations are fitted on each fold's training
images only. A dataset ``val`` split that is not the test split is passed to the methods for early
stopping (WSABIE); otherwise methods get no validation data (WSABIE then runs its ``max_epochs`` passes,
as the paper stops it after 20).

Every (fold, method) is an ordinary run of the engine (:func:`crossview.engine.run.train`): a run folder
under one experiment folder, listed by :func:`crossview.engine.session.list_runs` (and the app's runs
list), resumable, its fold recorded as derived splits (:mod:`crossview.engine.splits`). Running the
experiment again on the same folder skips finished runs and resumes unfinished ones. Every number comes
from :mod:`crossview.eval` (ranks, R@K and MedR from :mod:`crossview.eval.metrics`, BLEU / ROUGE from
:mod:`crossview.eval.overlap`). The ``random`` row is not a run: it is computed by the same eval
functions from seeded random embeddings (:func:`random_baseline`), since it has nothing to train or open.

A table over several seeds (:func:`run_bitr_table_seeds`, ``--seeds 0,1,2``) is one such experiment per seed
(``OUT/seed-<s>``: the seed draws the folds, TR / CTR's k-means and LDA, and the methods' randomness), reported as the
mean over the builds with their standard deviation (:func:`combine_seeds`): one TR build's R@10 moves by several
points with the seed (``bench/results/tr_seed_spread_flickr8k.md``), so one build is not a number to compare.

:func:`run_bitr_table` is a generator of :mod:`crossview.core.events` (cancel by not iterating further;
the run in progress stays resumable); its last event is ``Finished(summary=result)``. :func:`bitr_table` drains it. :func:`format_table` and
:func:`format_markdown` lay the result out as the paper's table, with the paper's own numbers (from the
method cards in ``models/``) beside ours where the representation matches.
"""

from __future__ import annotations

import math
import re
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

from crossview.core.events import Event, Finished, Log, Progress
from crossview.core.errors import CrossViewError
from crossview.core.run_settings import parse_seeds
from crossview.experiments._common import (markdown_table, mean_std, new_experiment_dir, plain, relay_run,
                                           run_finished, run_seed_builds, seed_folder, several_seeds, text_table)
from crossview.methods.base import Method, MethodData

__all__ = ["TABLE_METHODS", "DEFAULT_METHODS", "METHOD_LABELS", "Fold", "make_folds", "parse_methods", "parse_ks",
           "run_bitr_table", "bitr_table", "evaluate_fold", "chance_levels", "paper_numbers", "format_table",
           "format_markdown", "random_baseline", "default_experiment_dir", "registry_of", "EXPERIMENT_FILE",
           "TRAIN_SPLIT", "TEST_SPLIT", "VAL_SPLIT", "seed_folder", "run_bitr_table_seeds",
           "combine_seeds", "paired_against", "PAPER_C_GRIDS", "with_paper_c_grid", "method_params_for",
           "table_params", "c_text", "mean_std_with_c", "chosen_c"]

#: The experiment folder's record: settings and one row of table metrics per finished trial.
EXPERIMENT_FILE = "experiment.json"
#: Experiment 2: each trial's ranks of the other dataset's queries (``<trial>.npz``: ``i2t``, ``t2i`` within each
#: part, the parts one after another, and ``caption_image`` into that order), what the paired section compares
CROSS_RANKS = "cross-ranks"
#: The derived splits a fold's runs record in config.json (crossview.engine.splits).
TRAIN_SPLIT, TEST_SPLIT, VAL_SPLIT = "exp-train", "exp-test", "exp-val"

#: Table rows: name -> (registry name, fixed parameters). ``random`` is the chance-level baseline
#: (:func:`random_baseline`, not a registered method).
TABLE_METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "cca": ("cca", {}),
    "wsabie": ("wsabie", {}),
    # the paper's BITR: each view reduced by its own PCA (not the CCA projection CrossView defaults to)
    "bitr-m": ("bitr", {"loss": "M", "reduce": "pca"}),
    "bitr-e": ("bitr", {"loss": "E", "reduce": "pca"}),
    "bitr-c": ("bitr", {"loss": "C", "reduce": "pca"}),
    "random": ("random", {}),
}
DEFAULT_METHODS: tuple[str, ...] = ("cca", "wsabie", "bitr-m", "bitr-e", "bitr-c")


def row_representation(method: str, representation: str) -> str:
    """The representation a table row trains on: the table's, except BITR on CTR, which trains on TR with its
    own CTR step (``reduce="ctr"``, :func:`_row_fixed`): the same CTR features, but BITR's cross-validation of C then
    refits that CCA inside each fold instead of choosing C on a CCA fitted on every fold."""
    return "tr" if representation == "ctr" and TABLE_METHODS[method][0] == "bitr" else representation


def _row_fixed(method: str, representation: str) -> dict[str, Any]:
    """The parameters that make a row that row (:data:`TABLE_METHODS`), on the table's representation."""
    fixed = dict(TABLE_METHODS[method][1])
    if row_representation(method, representation) != representation:
        fixed["reduce"] = "ctr"
    return fixed
METHOD_LABELS = {"cca": "CCA", "wsabie": "WSABIE", "bitr-m": "BITR-M", "bitr-e": "BITR-E", "bitr-c": "BITR-C",
                 "random": "random"}
OVERLAP_K = 5  # the paper scores the top five retrieved items
#: Parameters of the ``random`` row (:func:`random_baseline`).
RANDOM_PARAMS = {"dim": 64, "seed": 0}


# ====================================================================== arguments
def parse_methods(value: str | Sequence[str]) -> list[str]:
    """``"cca,bitr-c"`` (or a list) -> checked table method names, in the given order, no repeats."""
    names = [v.strip().lower() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]
    if not names:
        raise CrossViewError(f"no method given; choose from {', '.join(TABLE_METHODS)}")
    for n in names:
        if n not in TABLE_METHODS:
            raise CrossViewError(f"unknown method {n!r} for the BITR table; choose from {', '.join(TABLE_METHODS)} "
                                 f"(e.g. --methods cca,bitr-c)")
    return list(dict.fromkeys(names))


def parse_ks(value: int | str | Sequence[int]) -> tuple[int, ...]:
    """``50`` / ``"10,50"`` -> ``(10, 50)``: the K of R@K (sorted, positive)."""
    if isinstance(value, (int, np.integer)):
        items: list[Any] = [value]
    elif isinstance(value, str):
        items = [v for v in value.replace(" ", ",").split(",") if v]
    else:
        items = list(value)
    out = []
    for v in items:
        ok = isinstance(v, (int, np.integer)) or (isinstance(v, str) and v.strip().isdigit())
        k = int(v) if ok else 0
        if k < 1:
            raise CrossViewError(f"R@K needs positive whole numbers, got {v!r} (e.g. --k 50 or --k 10,50)")
        out.append(k)
    if not out:
        raise CrossViewError("no K given for R@K (e.g. --k 50)")
    return tuple(sorted(set(out)))

class Fold(NamedTuple):
    """One train / test partition (image indices of the dataset); ``val`` is optional. ``key`` names the
    fold's run folders (``fold03-cca``, ``val-bitr-c``)."""

    name: str
    train: np.ndarray
    test: np.ndarray
    val: np.ndarray | None
    key: str = ""

    def derived_splits(self) -> dict[str, list[int]]:
        """The fold as the derived splits its runs record in ``config.json`` (:data:`TRAIN_SPLIT`,
        :data:`TEST_SPLIT`, :data:`VAL_SPLIT`)."""
        out = {TRAIN_SPLIT: self.train.tolist(), TEST_SPLIT: self.test.tolist()}
        if self.val is not None:
            out[VAL_SPLIT] = self.val.tolist()
        return out


def make_folds(dataset: Any, *, folds: int | None = None, split: str | None = None,
               seed: int = 0) -> tuple[list[Fold], str]:
    """The partitions of the experiment and a description of the protocol.

    ``folds=N``: N partitions of all images (:func:`crossview.engine.splits.fold_splits`: scikit-learn's
    ``KFold`` over a seeded permutation; each image tested once). ``split=NAME``: train on the ``train``
    split (plus ``restval`` when present), test on ``NAME``. Neither: the ``test`` split if the dataset
    has one, else 10 folds.
    """
    from crossview.engine.splits import fold_splits

    if folds is not None and split is not None:
        raise CrossViewError("give either --folds N (cross-validation over all images) or --split NAME "
                             "(train on 'train', test on NAME), not both")
    if folds is None and split is None:
        if "test" in dataset.splits:
            split = "test"
        else:
            folds = 10
    n = dataset.n_images
    if split is not None:
        if split not in dataset.splits:
            have = ", ".join(dataset.split_names) or "none"
            raise CrossViewError(f"dataset {dataset.name!r} has no split {split!r} to test on (it has: {have}); "
                                 f"choose one with --split, or use --folds N")
        if split in ("train", "restval"):
            raise CrossViewError(f"--split {split} would test on the training images; choose a held-out split "
                                 f"such as val or test")
        test = np.asarray(dataset.splits[split], dtype=np.int64)
        if "train" in dataset.splits:
            parts = [dataset.splits["train"]] + ([dataset.splits["restval"]] if "restval" in dataset.splits else [])
            train = np.setdiff1d(np.concatenate(parts), test)
        else:
            train = np.setdiff1d(np.arange(n), test)
        if len(train) < 2 or len(test) < 1:
            raise CrossViewError(f"split {split!r} leaves {len(train)} training and {len(test)} test images; "
                                 f"need at least 2 and 1")
        val = None
        if split != "val" and "val" in dataset.splits:
            val = np.setdiff1d(np.asarray(dataset.splits["val"], dtype=np.int64), test)
            train = np.setdiff1d(train, val)
            val = val if len(val) else None
        desc = f"train on {len(train)} images ({'train' if 'train' in dataset.splits else 'all but ' + split}), " \
               f"test on the {len(test)} images of split {split!r}"
        from crossview.engine.run_folder import safe_name
        return [Fold(split, np.sort(train), np.sort(test), val, safe_name(split))], desc
    folds = int(folds)  # type: ignore[arg-type]
    if folds < 2:
        raise CrossViewError(f"--folds must be at least 2, got {folds}")
    if n < 2 * folds:
        raise CrossViewError(f"dataset {dataset.name!r} has {n} images, too few for {folds} folds (need at least "
                             f"{2 * folds}); lower --folds")
    width = len(str(folds))
    out = [Fold(f"fold {f + 1}/{folds}", train, test, None, f"fold{f + 1:0{max(2, width)}d}")
           for f, (train, test) in enumerate(fold_splits(n, folds, seed))]
    return out, f"{folds} folds over all {n} images (each fold the test set once, the rest training)"


# ====================================================================== the chance baseline
def _random_rows(n: int, what: str, data: MethodData, dim: int, seed: int) -> np.ndarray:
    key = zlib.crc32(f"{what}|{data.name}|{n}".encode())
    return np.random.default_rng([int(seed), key]).standard_normal((n, int(dim))).astype(np.float32)


def random_baseline(train: MethodData, test: MethodData, *, ks: Sequence[int] = (50,),
                    corpus: MethodData | None = None, overlap_k: int = OVERLAP_K, dim: int = RANDOM_PARAMS["dim"],
                    seed: int = RANDOM_PARAMS["seed"], index: str | None = None) -> dict[str, Any]:
    """The table's ``random`` row: every metric of :func:`evaluate_fold` for seeded random Gaussian
    ``dim``-d embeddings of every image and caption (what no learning gives).

    Not a method and not a run: there is nothing to train, resume or open, so it is computed here, by
    the same :mod:`crossview.eval` functions as the methods' rows, in milliseconds. A set's rows depend only
    on ``seed`` and the set (``train`` / ``test`` / ``corpus``), so a fold always gets the same row.
    """
    from crossview.eval import metrics as M

    def img(d: MethodData) -> np.ndarray:
        return _random_rows(d.n_images, "image", d, dim, seed)

    def txt(d: MethodData) -> np.ndarray:
        return _random_rows(d.n_captions, "text", d, dim, seed)

    res = M.evaluate(img(test) @ txt(test).T, test.caption_image, tuple(ks))
    return _with_overlap({d: res[d] for d in ("i2t", "t2i")}, train, test, corpus, overlap_k,
                         random_embedder(dim, seed), index)


def _make_method(table_name: str, params: dict[str, Any]) -> Method | None:
    """An unfitted method of table row ``table_name`` with ``params`` (checked); ``None`` for ``random``."""
    from crossview.methods import method_from_params

    registry, fixed = TABLE_METHODS[table_name]
    if registry == "random":
        bad = sorted(set(params) - set(RANDOM_PARAMS))
        if bad:
            raise CrossViewError(f"random has no parameter {bad[0]!r}; its parameters are: "
                                 f"{', '.join(RANDOM_PARAMS)}")
        return None
    method = method_from_params(registry, {**params, **fixed})
    method.check_params()
    return method


def _coerce(registry: str, key: str, value: Any) -> Any:
    """A parameter value from the command line, typed with the method's card when there is one."""
    if not isinstance(value, str):
        return value
    from crossview.methods.cards import run_setting_spec

    run_spec = run_setting_spec(key)     # seed, n_jobs ...: the run's, typed by its RunSettings field
    if run_spec is not None:
        return run_spec.coerce(value, registry)
    try:
        from crossview.methods.cards import find_card

        card = find_card(registry)
    except (ImportError, CrossViewError):
        card = None
    if card is not None and key in card.params:
        return card.params[key].coerce(value, registry) if hasattr(card.params[key], "coerce") else value
    import ast

    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


#: BITR's C in the paper's tables when the parameters name neither ``C`` nor ``c_grid``: chosen by 5-fold
#: cross-validation of the training images over 1e-5 ... 1e5, as the paper does (section 7.1); BITR-M over 1e-2 ...
#: 1e1, where its cutting plane converges on normalised features (at C >= 1e2 one fold of the Flickr8k sample
#: stalled for over 25 minutes). The card's fixed C is chosen for image-caption retrieval under CrossView's
#: defaults; with it these tables measured that default, not the method (the demo's BITR-C Im2Text R@10 93.5 at
#: C 1000, 74.5 at C 10; Experiment 4's BITR-C Im2Text mAP -3.6 against CCA at C 10, +12.7 with C cross-validated).
PAPER_C_GRIDS: dict[str, str] = {"bitr-m": "1e-2:1e1", "bitr-e": "paper", "bitr-c": "paper"}


def with_paper_c_grid(table_name: str, registry: str, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` with :data:`PAPER_C_GRIDS`'s ``c_grid`` added for a BITR row whose parameters name neither ``C``
    nor ``c_grid`` (``bitr.C=100`` fixes C; ``bitr.c_grid=none`` takes the card's)."""
    if registry != "bitr" or "C" in given or "c_grid" in given:
        return given
    return {**given, "c_grid": PAPER_C_GRIDS.get(table_name, "paper")}


def method_params_for(table_name: str, params: dict[str, dict[str, Any]] | None,
                      rows: Mapping[str, tuple[str, dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Parameters of table method ``table_name`` (a row of ``rows``: name -> (registry name, fixed parameters);
    :data:`TABLE_METHODS` unless given): those given for its registry name (``"bitr"`` applies to every BITR row),
    then those given for the row itself (``"bitr-c"``); a BITR row's C cross-validated as the paper does unless
    given (:func:`with_paper_c_grid`). Setting a parameter the row fixes is refused in one line."""
    registry, fixed = (TABLE_METHODS if rows is None else rows)[table_name]
    out: dict[str, Any] = {}
    for key in (registry, table_name):
        for k, v in ((params or {}).get(key) or {}).items():
            out[k] = _coerce(registry, k, v)
    clash = sorted(set(out) & set(fixed))
    if clash:
        todo = ("choose another row instead of setting it (e.g. bitr-m, bitr-e, bitr-c)" if registry == "bitr"
                else "the table needs it; drop that --param")
        raise CrossViewError(f"{table_name} fixes {', '.join(f'{k}={fixed[k]!r}' for k in clash)} in this table; "
                             f"{todo}")
    return with_paper_c_grid(table_name, registry, out)


def chosen_c(method: Any) -> dict[str, float] | None:
    """The C a fitted BITR model trained with, per direction (chosen by its cross-validation, or the one given)."""
    c = getattr(method, "C_", None)
    return {d: float(v) for d, v in c.items()} if isinstance(c, dict) and c else None


def mean_std_with_c(rows: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`mean_std` of metric rows (a fold's, or a build's means), a BITR row's ``C`` left out of it and kept as
    the values it took, per direction: ``{"i2t": [1e4, 1e3, ...], "t2i": [...]}``, fold by fold, build by build (a
    row's ``C``: one value per direction, or a list of them)."""
    mean, std = mean_std([{k: v for k, v in r.items() if k != "C"} for r in rows])
    cs = [r["C"] for r in rows if r.get("C")]
    if cs:
        mean["C"] = {d: [x for c in cs for x in (c[d] if isinstance(c[d], list) else [c[d]])] for d in cs[0]}
    return mean, std


def table_params(params: dict[str, dict[str, Any]] | None, methods: Sequence[str],
                 rows: Mapping[str, tuple[str, dict[str, Any]]] | None = None) -> dict[str, dict[str, Any]]:
    """:func:`method_params_for` of each of ``methods``; parameters given for a key that is neither one of them nor
    a registry name of one (``--param bitr.C=10`` without a BITR row) are refused in one line."""
    rows = TABLE_METHODS if rows is None else rows
    for key in params or {}:
        if not any(key in (m, rows[m][0]) for m in methods):
            raise CrossViewError(f"parameters given for {key}, but {key} is not among the methods "
                                 f"({', '.join(methods)}); add it to --methods or drop its --param")
    return {m: method_params_for(m, params, rows) for m in methods}


# ====================================================================== metrics of one fold
def _refs_by_image(data: MethodData) -> list[list[str]]:
    out: list[list[str]] = [[] for _ in range(data.n_images)]
    for c, i in enumerate(data.caption_image.tolist()):
        out[i].append(data.captions[c])
    return out


def _bleu_rouge(scores: dict[str, float]) -> dict[str, float]:
    """BLEU-1 and ROUGE-1 of :mod:`crossview.eval.overlap`, both in percent (as the paper)."""
    return {"BLEU-1": float(scores["BLEU-1"]), "ROUGE-1": 100.0 * float(scores["ROUGE-1"])}


#: ``embed(data, side, direction)``: the rows of ``data``'s images (``side="image"``) or captions (``"text"``)
#: a model ranks by inner product for ``direction``
Embed = Callable[[MethodData, str, str], np.ndarray]


def method_embedder(method: Method) -> Embed:
    """A fitted method's embeddings (its ``scores`` are their inner products)."""
    def embed(data: MethodData, side: str, direction: str) -> np.ndarray:
        return method.encode_images(data, direction=direction) if side == "image" else \
            method.encode_texts(data, direction=direction)
    return embed


def random_embedder(dim: int, seed: int) -> Embed:
    """Seeded random Gaussian rows for the ``random`` row (a set's rows depend only on the seed and the set)."""
    def embed(data: MethodData, side: str, direction: str) -> np.ndarray:
        return _random_rows(data.n_images if side == "image" else data.n_captions, side, data, dim, seed)
    return embed


def top_items(embed: Embed, queries: MethodData, query_side: str, gallery: MethodData, direction: str, k: int,
              index: str | None = None) -> np.ndarray:
    """``(n_queries, k)`` gallery rows best first for each query image (``query_side="image"``: the gallery's
    captions) or caption (its images): from the dense score matrix, or with ``index`` (a
    :mod:`crossview.index` backend: ``exact`` chunked, ``faiss-flat``, ``faiss-ivf``...) without ever holding
    it, as ranking a million-item collection (the paper's SBU) needs."""
    from crossview.eval.metrics import top_k

    q = np.ascontiguousarray(embed(queries, query_side, direction), dtype=np.float32)
    g = np.ascontiguousarray(embed(gallery, "text" if query_side == "image" else "image", direction), dtype=np.float32)
    if index is None:
        return top_k(q @ g.T, k)
    from crossview.index import build_index

    return build_index(g, index).search(q, k).indices


def _with_overlap(out: dict[str, Any], gallery: MethodData, queries: MethodData, corpus: MethodData | None,
                  overlap_k: int, embed: Embed, index: str | None = None) -> dict[str, Any]:
    """``out`` (R@K, MedR per direction) with BLEU-1 / ROUGE-1 of the top ``overlap_k`` items retrieved from
    ``gallery`` for every image and caption of ``queries`` (and from ``corpus`` for the images), and the seconds
    the searches took (``search_seconds``)."""
    from crossview.eval.overlap import SentenceOverlap, gallery_overlap_i2t, gallery_overlap_t2i

    scorer = SentenceOverlap()
    out = {d: {key: float(v) for key, v in out[d].items()} for d in ("i2t", "t2i")}
    t0 = time.monotonic()
    r_i2t = top_items(embed, queries, "image", gallery, "i2t", overlap_k, index)
    r_t2i = top_items(embed, queries, "text", gallery, "t2i", overlap_k, index)
    r_corpus = None if corpus is None else top_items(embed, queries, "image", corpus, "i2t", overlap_k, index)
    seconds = time.monotonic() - t0
    test_refs = _refs_by_image(queries)
    out["i2t"].update(_bleu_rouge(gallery_overlap_i2t(None, gallery.captions, test_refs, overlap_k, scorer,
                                                      ranked=r_i2t)))
    out["t2i"].update(_bleu_rouge(gallery_overlap_t2i(None, queries.captions, _refs_by_image(gallery), overlap_k,
                                                      scorer, ranked=r_t2i)))
    if r_corpus is not None:
        out["corpus_i2t"] = _bleu_rouge(gallery_overlap_i2t(None, corpus.captions, test_refs, overlap_k, scorer,
                                                            ranked=r_corpus))
    out["search_seconds"] = float(seconds)
    return out


def evaluate_fold(method: Method, train: MethodData, test: MethodData, *, ks: Sequence[int] = (50,),
                  corpus: MethodData | None = None, overlap_k: int = OVERLAP_K, index: str | None = None
                  ) -> dict[str, Any]:
    """The paper's metrics of a fitted method on one fold, all from :mod:`crossview.eval`.

    Returns ``{"i2t": {"BLEU-1", "ROUGE-1", "R@K"..., "MedR", "MeanR"}, "t2i": {...}}`` plus
    ``"corpus_i2t": {"BLEU-1", "ROUGE-1"}`` when a ``corpus`` is given (its ``text_features`` rows are the
    corpus captions). Retrieval (R@K, MedR) within the test set (:meth:`Method.evaluate`, i.e.
    :func:`crossview.eval.metrics.evaluate`); BLEU-1 / ROUGE-1 are percentages over the top ``overlap_k``
    items retrieved from the training set (and the corpus) (:func:`crossview.eval.overlap.gallery_overlap_i2t`
    / :func:`~crossview.eval.overlap.gallery_overlap_t2i`); ``index`` searches the training collection with
    that :mod:`crossview.index` backend instead of the dense score matrix (:func:`top_items`).
    """
    res = method.evaluate(test, ks=tuple(ks))
    return _with_overlap({d: res[d] for d in ("i2t", "t2i")}, train, test, corpus, overlap_k,
                         method_embedder(method), index)


def chance_levels(test: MethodData, ks: Sequence[int]) -> dict[str, dict[str, float]]:
    """Expected R@K and the median rank of random scoring on ``test`` (exact for a random order).

    i2t: an image with ``g`` gold captions among ``N``; P(none of them in the top r) =
    ``prod_{j<g} (N - r - j) / (N - j)``. t2i: one gold image among ``M``. MedR is the median of the
    per-query rank distribution, averaged over queries.
    """
    N, M = test.n_captions, test.n_images
    gold = np.bincount(test.caption_image, minlength=M)

    def p_none(r: np.ndarray, g: int, n: int) -> np.ndarray:
        out = np.ones_like(r, dtype=np.float64)
        for j in range(g):
            out *= np.clip((n - r - j) / (n - j), 0.0, 1.0)
        return out

    r = np.arange(0, max(N, M) + 1, dtype=np.float64)
    i2t: dict[str, float] = {}
    t2i: dict[str, float] = {}
    gs = gold[gold > 0]
    for k in ks:
        i2t[f"R@{k}"] = float(100.0 * np.mean([1.0 - p_none(np.array([min(k, N)], float), int(g), N)[0] for g in gs]))
        t2i[f"R@{k}"] = float(100.0 * min(k, M) / M)
    medians = []
    for g in np.unique(gs):
        cdf = 1.0 - p_none(r[: N + 1], int(g), N)
        medians.extend([float(np.argmax(cdf >= 0.5))] * int((gs == g).sum()))
    i2t["MedR"] = float(np.mean(medians))
    t2i["MedR"] = float(math.ceil(M / 2))
    return {"i2t": i2t, "t2i": t2i}


# ====================================================================== Experiment 2: another dataset
def cross_parts(n_images: int, parts: int, seed: int = 0) -> list[np.ndarray]:
    """The image partitions of the test dataset that R@K and MedR are computed within (the paper: its ten
    partitions of Pascal / IAPR, "for direct comparison with Experiment 1"): scikit-learn's ``KFold`` over a
    seeded permutation, as the folds of Experiment 1; one part (all images) when ``parts`` is 1."""
    from crossview.engine.splits import fold_splits

    if int(parts) <= 1:
        return [np.arange(n_images)]
    if n_images < 2 * int(parts):
        raise CrossViewError(f"the test dataset has {n_images} images, too few for {parts} parts; lower "
                             "--test-parts")
    return [np.sort(test) for _, test in fold_splits(n_images, int(parts), seed)]


def cross_metrics(embed: Embed, source: MethodData, target: MethodData, parts: Sequence[np.ndarray], *,
                  ks: Sequence[int] = (50,), corpus: MethodData | None = None, overlap_k: int = OVERLAP_K,
                  index: str | None = None, keep_ranks: bool = False) -> dict[str, Any]:
    """Experiment 2's metrics of a model trained on ``source``'s dataset, on another dataset ``target``.

    ``embed`` gives the model's rows (:func:`method_embedder`). R@K and MedR: within each part of ``target``
    (:func:`cross_parts`), averaged over the parts; BLEU-1 / ROUGE-1: every image (caption) of ``target`` a
    query, the top ``overlap_k`` captions (images) retrieved from the whole ``source`` collection (the paper:
    "retrieval on all the captions of SBU dataset"; ``index`` for a collection too large for a dense score
    matrix), scored against the query's gold captions as in Experiment 1; the corpus row likewise.

    ``keep_ranks``: also ``"ranks"``, every query's rank within its part (``{"i2t", "t2i", "caption_image"}``, the
    parts one after another, ``caption_image`` into that order): R@K over them is the table's mean over the parts
    when the parts are of one size, and they are what the paired comparison resamples."""
    from crossview.eval import metrics as M

    per = []
    kept: dict[str, list[np.ndarray]] = {"i2t": [], "t2i": [], "caption_image": []}
    offset = 0
    for k, rows in enumerate(parts):
        part = target.subset(rows, name=f"{target.name}-part{k + 1:02d}")
        r = {}
        for d, ranks in (("i2t", M.i2t_ranks), ("t2i", M.t2i_ranks)):
            s = embed(part, "image", d) @ embed(part, "text", d).T
            got = ranks(s, part.caption_image)
            r[d] = M.rank_metrics(got, ks)
            kept[d].append(np.asarray(got, dtype=np.int32))
        kept["caption_image"].append(np.asarray(part.caption_image, dtype=np.int64) + offset)
        offset += part.n_images
        per.append(r)
    mean, _ = mean_std(per)
    out = _with_overlap(mean, source, target, corpus, overlap_k, embed, index)
    if keep_ranks:
        out["ranks"] = {d: np.concatenate(v) for d, v in kept.items()}
    return out


def _save_cross_ranks(folder: Path, trial: str, ranks: dict[str, np.ndarray]) -> str:
    """A trial's cross-dataset ranks (:func:`cross_metrics` ``keep_ranks``) in ``folder/cross-ranks/<trial>.npz``,
    written whole or not at all; its path."""
    import io

    from crossview.core.io import atomic_write_bytes

    buf = io.BytesIO()
    np.savez(buf, **ranks)
    path = folder / CROSS_RANKS / f"{trial}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue())
    return str(path)


def _load_cross_ranks(path: str | Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """What :func:`_save_cross_ranks` wrote: ``({"i2t", "t2i"}, caption_image)``; one line when it is damaged."""
    from crossview.core.io import read_npz

    todo = "delete it and run the experiment again with the same --exp-dir (that trial's ranks are computed again)"
    z = read_npz(path, todo=todo)
    missing = [k for k in ("i2t", "t2i", "caption_image") if k not in z]
    if missing:
        raise CrossViewError(f"{path}: the cross-dataset ranks have no {', '.join(missing)}; {todo}")
    return {d: z[d] for d in ("i2t", "t2i")}, z["caption_image"]


def foreign_method_data(dataset: Any, rep: Any, name: str = "target", *, device: str = "cpu") -> MethodData:
    """All images and captions of another ``dataset`` in ``rep``, the representation fitted on the training
    dataset's images: for ``default`` / ``modern`` through the same encoder and the feature cache (precomputed
    features: its own rows, the same CNN's, e.g. two VSE++ ``*_precomp`` folders), for TR / CTR its image files
    through ``rep.encode_images``,
    its captions through ``rep.encode_captions`` (the fitted parts of the training data: nothing is refitted)."""
    from crossview.features import PRECOMP

    precomp = rep.info.get("image_encoder") == PRECOMP
    if precomp and dataset.image_features is None:
        raise CrossViewError(f"dataset {dataset.name!r} has image files and the training data precomputed "
                             "features; both must come from the same CNN")
    if rep.encode_dataset_images is not None and (precomp or getattr(dataset, "image_paths", None) is not None):
        image = np.asarray(rep.encode_dataset_images(dataset), dtype=np.float32)     # through the feature cache
        if image.shape[1] != rep.image.shape[1]:
            raise CrossViewError(f"dataset {dataset.name!r} has {image.shape[1]}-d image features, the training "
                                 f"data {rep.image.shape[1]}-d; both must come from the same CNN")
    elif rep.encode_images is not None and getattr(dataset, "image_paths", None) is not None:
        image = np.asarray(rep.encode_images(list(dataset.image_paths), device=device), dtype=np.float32)
    else:
        raise CrossViewError(f"dataset {dataset.name!r}: a cross-dataset test encodes its images with the training "
                             "data's representation; it needs image files (or, with --representation default, "
                             "precomputed features of the same CNN on both sides)")
    text = np.asarray(rep.encode_captions(list(dataset.captions)), dtype=np.float32)
    return MethodData(image_features=image, text_features=text, captions=list(dataset.captions),
                      caption_image=np.asarray(dataset.caption_image, dtype=np.int64), name=name,
                      image_paths=None if dataset.image_paths is None else list(dataset.image_paths),
                      meta={"representation": rep.name})


# ====================================================================== the paper's numbers
_PAPER_METRICS = ("BLEU-1", "ROUGE-1", "R@50", "MedR")


def _entry_text(entry: dict[str, Any]) -> str:
    return " ".join(str(v) for k, v in entry.items() if k != "metrics").lower()


def _words(text: str) -> set[str]:
    return set(re.split(r"[^a-z0-9@]+", text)) - {""}


def _variant_matches(entry: dict[str, Any], table_name: str) -> bool:
    """Whether a card entry is about ``table_name``: for BITR, the entry names this loss (``loss = "C"``,
    ``BITR-C`` in its text) or no loss at all."""
    if not table_name.startswith("bitr-"):
        return True
    loss = table_name[-1]
    named = {str(entry[k]).strip().lower() for k in ("loss", "variant") if k in entry}
    named |= {m.group(1) for m in re.finditer(r"bitr[-_ ]?([mec])\b", _entry_text(entry))}
    named = {n[-1] for n in named if n}
    return loss in named or not named


def paper_numbers(representation: str, methods: Sequence[str], dataset: str = "pascal",
                  table: str | None = None) -> dict[str, Any]:
    """The paper's Experiment-1 numbers for ``methods`` from their cards' ``paper_results``
    (``models/<method>.toml``, read by :mod:`crossview.methods.cards`), in the setting closest to
    ``representation``: Table 7 (CNN + word2vec) for ``modern`` / ``default``, Table 2 for ``tr`` / ``ctr``
    (entries whose text names TR or CTR); on ``dataset`` (Pascal sentences: 1,000 images with 5 captions,
    10 folds, the closest to small sets).

    Returns ``{"table", "dataset", "setting", "rows": {method: {"i2t": {...}, "t2i": {...}}}}``; ``rows``
    is empty when the cards are not there. ``table="table 4"``: Experiment 2 (trained on SBU, tested on
    ``dataset``), whatever the representation.
    """
    table = (table or ("table 7" if representation in ("modern", "default") else "table 2")).lower()
    out: dict[str, Any] = {"setting": "", "table": table.title(), "dataset": dataset, "rows": {}}
    try:
        from crossview.methods.cards import find_card
    except ImportError:
        return out
    for m in methods:
        registry = TABLE_METHODS[m][0]
        if registry == "random":
            continue
        try:
            card = find_card(registry)
        except CrossViewError:
            card = None
        if card is None:
            continue
        row: dict[str, dict[str, float]] = {}
        for entry in card.paper_results:
            if not isinstance(entry, dict) or str(entry.get("table", "")).strip().lower() != table:
                continue
            if not str(entry.get("dataset", "")).strip().lower().startswith(dataset):
                continue
            words = _words(_entry_text(entry))
            if representation in ("tr", "ctr") and words & {"tr", "ctr"} and representation not in words:
                continue
            d = str(entry.get("direction", "")).strip().lower()
            if d not in ("i2t", "t2i") or d in row or not _variant_matches(entry, m):
                continue
            metrics = entry.get("metrics") or {}
            row[d] = {k: float(v) for k, v in metrics.items() if k in _PAPER_METRICS}
            out["setting"] = out["setting"] or str(entry.get("setting", ""))
        if row:
            out["rows"][m] = row
    return out

def _paper_dataset(name: str) -> str:
    """The paper's dataset closest to a test dataset's name: IAPR when it says so, else Pascal."""
    return "iapr" if "iapr" in name.lower() else "pascal"


# ====================================================================== the runner
def default_experiment_dir(dataset_name: str, representation: str) -> Path:
    """``get_settings().runs_dir / "bitr-table-<dataset>-<representation>-<timestamp>"`` (a new name)."""
    return new_experiment_dir("bitr-table", f"{dataset_name}-{representation}")


def _representation_record(rep_kw: dict[str, Any]) -> dict[str, Any]:
    """What the representation's keyword arguments change (where features are cached and computed, and
    values equal to :func:`~crossview.features.topics.build_representation`'s defaults, left out), so that
    the command and the library compare equal when they ask for the same thing."""
    import inspect

    from crossview.features.topics import build_representation

    defaults = {k: p.default for k, p in inspect.signature(build_representation).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return plain({k: v for k, v in sorted(rep_kw.items()) if k not in ("cache", "device", "batch_size",
                                                                         "num_workers")
                   and not (k in defaults and defaults[k] == v)})


def _check_same_experiment(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The ``experiment.json`` already in ``folder`` (``{}`` for none); another experiment's is refused."""
    from crossview.core.io import read_json

    path = folder / EXPERIMENT_FILE
    if not path.is_file():
        return {}
    old = read_json(path)
    if not isinstance(old, dict) or old.get("experiment") != record["experiment"]:
        raise CrossViewError(f"{path}: not a BITR-table experiment (or damaged); give another --out folder")
    for key in ("dataset_fingerprint", "representation", "representation_params", "protocol", "seed",
                "test_dataset_fingerprint", "test_parts"):
        if old.get(key) != record[key]:
            raise CrossViewError(f"{folder} holds a BITR-table experiment with another {key.replace('_', ' ')} "
                                 f"({old.get(key)!r}, now {record[key]!r}); give a new --out folder to run this one")
    for m, p in (old.get("method_params") or {}).items():
        if m in record["method_params"] and p != record["method_params"][m]:
            raise CrossViewError(f"{folder}: its {m} runs were trained with {p}, now {record['method_params'][m]}; "
                                 f"give a new --out folder (or the same parameters) to run this one")
    return old


def run_bitr_table(dataset: Any, *, representation: str = "modern", methods: Sequence[str] = DEFAULT_METHODS,
                   folds: int | None = None, split: str | None = None, ks: Sequence[int] = (50,),
                   corpus: Sequence[str] | Any = None, method_params: dict[str, dict[str, Any]] | None = None,
                   representation_params: dict[str, Any] | None = None, seed: int = 0,
                   overlap_k: int = OVERLAP_K, out: str | Path | None = None,
                   test_dataset: Any = None, test_parts: int = 10, index: str | None = None,
                   feature_progress: Callable[[str, int, int], None] | None = None,
                   should_stop: Callable[[], bool] | None = None) -> Iterator[Event]:
    """Run Experiment 1; yields ``Progress`` / ``Log`` events and finally ``Finished(summary=result)``.

    Every (fold, method) is an ordinary run folder made by the engine
    (:func:`crossview.engine.run.train`) under one experiment folder ``out`` (default
    :func:`default_experiment_dir`)::

        OUT/
          experiment.json   the settings and one row of table metrics per finished trial
          val-cca/ ...      run folders ``<fold>-<method>`` (fold: the test split's name, or fold01 ...)

    A fold is recorded in its runs' ``config.json`` as derived splits (``exp-train`` / ``exp-test`` /
    ``exp-val``), so a run reopens (``open_run``, the app) on the fold it was trained and tested on; the
    ``modern`` / ``tr`` / ``ctr`` representation is recorded there too (``representation``: its name and
    settings), and ``open_run`` rebuilds it fitted on the fold's ``exp-train`` images (the same features).
    Running again with the same ``out`` skips finished trials and resumes unfinished ones (their
    checkpoints); stopping (``should_stop`` or closing the generator) leaves a resumable run.

    Args:
        dataset: a :class:`~crossview.data.dataset.PairedDataset`.
        representation: ``"modern"``, ``"tr"``, ``"ctr"`` or ``"default"`` (:mod:`crossview.features.topics`).
        methods: table rows (:data:`TABLE_METHODS`).
        folds / split: the protocol (:func:`make_folds`).
        ks: the K of R@K (the paper: 50).
        corpus: an independent caption collection (a list of strings or a
            :class:`~crossview.data.dataset.TextCorpus`) for Im2Text, or ``None``.
        method_params: ``{"bitr": {"C": 100}, "bitr-c": {...}, "wsabie": {...}}``.
        representation_params: keyword arguments of :func:`~crossview.features.topics.build_representation`.
        seed: the folds' permutation, and the runs' seed.
        out: the experiment folder.
        test_dataset: Experiment 2 (cross-dataset): another dataset the models trained on ``dataset`` are
            evaluated on, unchanged (its images and captions through the representation fitted on
            ``dataset``'s training images; :func:`cross_metrics`). One model per method, trained on the
            ``train`` split (``split`` names the held-out one; default ``test``, else ``val``).
        test_parts: the partitions of ``test_dataset`` that R@K and MedR are computed within (the paper: 10).
        index: search the training collection (and the corpus) for BLEU / ROUGE with this
            :mod:`crossview.index` backend (``exact``: chunked, never the whole score matrix; ``faiss-flat``,
            ``faiss-ivf``, ...) instead of a dense score matrix: a million-caption collection (the paper's SBU)
            fits; the search time is reported per method (``search_seconds``).
        feature_progress: ``progress(stage, done, total)`` of feature extraction (it runs outside the
            event stream); ``should_stop()`` cancels it.

    The result: ``{"dataset", "representation", "protocol", "ks", "methods": [...], "folds": n,
    "results": {method: {"i2t": {...}, "t2i": {...}, "corpus_i2t": {...}, "train_seconds"}},
    "std": {...}, "per_fold": {...}, "chance": {...}, "paper": {...}, "representation_info": {...},
    "experiment_dir", "runs": {method: [run folder per fold]}}``.
    """
    from crossview.core.io import atomic_write_json
    from crossview.engine.run import read_summary, train
    from crossview.engine.runs import ensure_run, load_fitted
    from crossview.features import Features
    from crossview.features.topics import (build_representation, built_representation_features,
                                           check_representation, method_data_for_images, representation_record)

    rep_kw = dict(representation_params or {})
    check_representation(dataset, representation, image_encoder=rep_kw.get("image_encoder"),
                         text_encoder=rep_kw.get("text_encoder"))
    methods = parse_methods(list(methods))
    ks = parse_ks(list(ks))
    if overlap_k < 1:
        raise CrossViewError(f"overlap_k must be >= 1, got {overlap_k}")
    params = table_params(method_params, methods)
    for m in methods:  # bad parameter names and values fail now, not after the first fold's features
        _make_method(m, params[m])
    corpus_captions = None
    if corpus is not None:
        corpus_captions = list(getattr(corpus, "captions", corpus))
        if not corpus_captions:
            raise CrossViewError("the caption corpus is empty; give a file with one caption a line")
    if index is not None:
        from crossview.index import list_backends
        if index not in list_backends():
            raise CrossViewError(f"--index {index!r}: choose one of {', '.join(list_backends())}")
    cross = test_dataset is not None
    if cross:
        if folds is not None:
            raise CrossViewError("a cross-dataset test (--test-data) trains one model per method on the training "
                                 "split; drop --folds (use --split NAME to name the held-out split)")
        if split is None:
            split = next((s for s in ("test", "val") if s in dataset.splits), None)
            if split is None:
                raise CrossViewError(f"dataset {dataset.name!r} has no test or val split to hold out; name one with "
                                     "--split")
        if int(test_parts) < 1:
            raise CrossViewError(f"--test-parts must be at least 1, got {test_parts}")
        cross_parts(test_dataset.n_images, test_parts, seed)      # too few images: fail now
    fold_list, protocol = make_folds(dataset, folds=folds, split=split, seed=seed)
    if cross:
        protocol += (f"; evaluated on {test_dataset.name} ({test_dataset.n_images} images, "
                     f"{test_dataset.n_captions} captions): R@K and MedR within each of {int(test_parts)} parts, "
                     f"BLEU-1 / ROUGE-1 of the top {overlap_k} from all of {dataset.name}")
    stop = should_stop or (lambda: False)
    folder = Path(out) if out is not None else default_experiment_dir(dataset.name, representation)
    if folder.exists() and not folder.is_dir():
        raise CrossViewError(f"--out {folder} is a file; give a folder for the experiment's runs")
    learned = [m for m in methods if TABLE_METHODS[m][0] != "random"]
    record: dict[str, Any] = {
        "experiment": "bitr-table", "data": getattr(dataset, "source", None) or None, "dataset": dataset.name,
        "dataset_fingerprint": dataset.fingerprint(), "representation": representation,
        "representation_params": _representation_record(rep_kw),
        "protocol": {"folds": folds, "split": split, "description": protocol}, "seed": int(seed),
        "method_params": {m: plain({**params[m], **_row_fixed(m, representation)}) for m in learned},
        "test_dataset": None if not cross else test_dataset.name,
        "test_dataset_fingerprint": None if not cross else test_dataset.fingerprint(),
        "test_parts": None if not cross else int(test_parts)}
    old = _check_same_experiment(folder, record)
    # what each trial's config.json records to rebuild its features (None: the encoders', by name); a row may
    # train on another representation than the table's (:func:`row_representation`: BITR on CTR = TR + its own
    # CTR step, so its cross-validation of C refits that CCA inside each fold)
    rep_records = {r: None if r == "default" else representation_record(r, record["representation_params"])
                   for r in {row_representation(m, representation) for m in methods}}
    eval_key = {"ks": list(ks), "overlap_k": int(overlap_k),
                "corpus": None if corpus_captions is None else
                zlib.crc32("\n".join(corpus_captions).encode("utf-8", "surrogateescape"))}
    if cross:
        eval_key["test"] = [record["test_dataset_fingerprint"], int(test_parts)]
    if index is not None:
        eval_key["index"] = index
    trials: dict[str, Any] = dict(old.get("trials") or {}) if isinstance(old.get("trials"), dict) else {}
    method_params_all = {**(old.get("method_params") or {}), **record["method_params"]}

    def save() -> None:   # recorded before it is announced; a kill between leaves the previous file whole
        atomic_write_json(folder / EXPERIMENT_FILE, {**record, "method_params": method_params_all,
                                                     "methods": sorted(set(old.get("methods") or []) | set(methods)),
                                                     "trials": trials})

    folder.mkdir(parents=True, exist_ok=True)
    save()
    yield Log(f"experiment {2 if cross else 1} on {dataset.name}: {protocol}; representation {representation}; methods "
              f"{', '.join(methods)}" + (f"; corpus of {len(corpus_captions):,} captions" if corpus_captions else "")
              + f"; runs in {folder}" + ("" if not old else " (continuing: finished trials are read back)"))

    total = len(fold_list) * (len(methods) + 1)
    step = 0
    per_fold: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    runs: dict[str, list[str]] = {m: [] for m in learned}
    cross_ranks: dict[str, list[str]] = {m: [] for m in methods}     # Experiment 2: each trial's ranks file
    chance: list[dict[str, Any]] = []
    rep_info: dict[str, Any] = dict(old.get("representation_info") or {})
    device = str(rep_kw.get("device", "cpu"))
    for fold in fold_list:
        names = {m: f"{fold.key}-{m}" for m in learned}
        done = {m: names[m] in trials and trials[names[m]].get("eval") == eval_key and run_finished(folder / names[m])
                and (not cross or (folder / CROSS_RANKS / f"{names[m]}.npz").is_file())     # older folders: none
                for m in learned}
        parts = cross_parts(test_dataset.n_images, test_parts, seed) if cross else []
        fold_data: dict[str, SimpleNamespace] = {}

        def data_of(rep_name: str, fold: Fold = fold) -> Iterator[Event]:
            """The fold's data in representation ``rep_name`` (built once per fold) into ``fold_data``."""
            if rep_name in fold_data:
                return
            yield Progress(step, total, f"{fold.name}: {rep_name} features")
            t0 = time.monotonic()
            rep = build_representation(dataset, rep_name, fit_images=fold.train, **rep_kw,
                                       progress=feature_progress, should_stop=stop)
            d = SimpleNamespace(rep=rep, source=None, target=None, corpus=None)
            d.train = method_data_for_images(dataset, rep, fold.train, "train")
            d.test = method_data_for_images(dataset, rep, fold.test, "test")
            d.val = method_data_for_images(dataset, rep, fold.val, "val") if fold.val is not None else None
            if cross:
                yield Progress(step, total, f"{test_dataset.name}: {rep_name} features")
                d.source = method_data_for_images(dataset, rep, np.arange(dataset.n_images), dataset.name)
                d.target = foreign_method_data(test_dataset, rep, test_dataset.name, device=device)
            if corpus_captions is not None:
                d.corpus = MethodData(image_features=np.zeros((1, rep.image.shape[1]), np.float32),
                                      text_features=rep.encode_captions(corpus_captions), captions=corpus_captions,
                                      caption_image=np.zeros(len(corpus_captions), np.int64), name="corpus")
            # The runs get the fold's representation as given features. For "default" they are the
            # encoders' own, so open_run rebuilds them from the encoder names (fitted on exp-train); the
            # others are recorded in config.json as the run's representation (rep_records), which open_run
            # and a resume rebuild with build_representation fitted on exp-train: the same features.
            if rep_name == "default":
                d.feats = Features(image=rep.image, text=rep.text, image_encoder=rep.info.get("image_encoder", "?"),
                                   text_encoder=rep.info.get("text_encoder", "?"))
            else:
                d.feats = built_representation_features(rep, rep_records[rep_name])
            fold_data[rep_name] = d
            yield Log(f"{fold.name}: {rep_name} features {d.train.image_dim}-d images / "
                      f"{d.train.text_dim}-d captions ({d.train.n_images} train, {d.test.n_images} test images) "
                      f"in {time.monotonic() - t0:.1f} s")

        if not all(done.values()) or "random" in methods:
            yield from data_of(representation)
            if not rep_info:
                rep_info = {k: v for k, v in fold_data[representation].rep.info.items()
                            if k not in ("cca", "correlations")}
        main = fold_data.get(representation)
        # the chance level needs only the test set's caption counts
        if cross:
            chance.append(mean_std([chance_levels(_caption_counts_only(test_dataset, rows), ks) for rows in parts])[0])
        else:
            chance.append(chance_levels(main.test if main is not None else
                                        _caption_counts_only(dataset, fold.test), ks))
        step += 1
        for m in methods:
            if stop():
                return
            if m not in names:           # the random baseline: no run (see random_baseline)
                assert main is not None
                if cross:
                    rp = {**RANDOM_PARAMS, **params[m]}
                    res = cross_metrics(random_embedder(int(rp["dim"]), int(rp["seed"])), main.source, main.target,
                                        parts, ks=ks, corpus=main.corpus, overlap_k=overlap_k, index=index,
                                        keep_ranks=True)
                    cross_ranks[m].append(_save_cross_ranks(folder, f"{fold.key}-{m}", res.pop("ranks")))
                else:
                    res = random_baseline(main.train, main.test, ks=ks, corpus=main.corpus, overlap_k=overlap_k,
                                          index=index, **{**RANDOM_PARAMS, **params[m]})
                res["train_seconds"] = 0.0
                per_fold[m].append(res)
                step += 1
                continue
            run_dir = folder / names[m]
            runs[m].append(str(run_dir))
            if done[m]:
                per_fold[m].append(trials[names[m]]["metrics"])
                if cross:
                    cross_ranks[m].append(str(folder / CROSS_RANKS / f"{names[m]}.npz"))
                step += 1
                yield Log(f"{fold.name} {m}: finished earlier ({run_dir.name}), read back")
                continue
            rep_name = row_representation(m, representation)
            yield from data_of(rep_name)
            d = fold_data[rep_name]
            how, it = ensure_run(run_dir, lambda: train(
                TABLE_METHODS[m][0], dataset, run_dir=run_dir, params={**params[m], **_row_fixed(m, representation)},
                split=TEST_SPLIT, train_split=TRAIN_SPLIT, val_split=VAL_SPLIT if fold.val is not None else None,
                derived_splits=fold.derived_splits(), device=device, seed=seed, features=d.feats,
                image_encoder=d.feats.image_encoder if rep_name == "default" else None,
                text_encoder=d.feats.text_encoder if rep_name == "default" else None,
                representation=rep_records[rep_name], image_norm="none", text_norm="none"),
                data=dataset, features=d.feats)
            if it is not None:
                if how == "resumed":
                    yield Log(f"{fold.name} {m}: resuming {run_dir.name}")
                yield Progress(step, total, f"{fold.name}: training {m}")
                if (yield from relay_run(it, f"{fold.name} {m}", folder, stop)):
                    return
            method = load_fitted(run_dir)
            if cross:
                res = cross_metrics(method_embedder(method), d.source, d.target, parts, ks=ks, corpus=d.corpus,
                                    overlap_k=overlap_k, index=index, keep_ranks=True)
                cross_ranks[m].append(_save_cross_ranks(folder, names[m], res.pop("ranks")))
            else:
                res = evaluate_fold(method, d.train, d.test, ks=ks, corpus=d.corpus, overlap_k=overlap_k,
                                    index=index)
            res["train_seconds"] = float(read_summary(run_dir).get("train_seconds", float("nan")))
            if registry_of(m) == "bitr" and (c := chosen_c(method)) is not None:
                res["C"] = c
            per_fold[m].append(res)
            trials[names[m]] = {"fold": fold.name, "method": m, "run_dir": run_dir.name, "eval": eval_key,
                                "metrics": plain(res)}
            save()
            step += 1
            k0 = f"R@{ks[-1]}"
            yield Log(f"{fold.name} {m}: trained in {res['train_seconds']:.1f} s ({run_dir.name}); i2t {k0} "
                      f"{res['i2t'][k0]:.1f} MedR {res['i2t']['MedR']:g}, t2i {k0} {res['t2i'][k0]:.1f} MedR "
                      f"{res['t2i']['MedR']:g}")
    results, stds = {}, {}
    for m in methods:
        results[m], stds[m] = mean_std_with_c(per_fold[m])
    chance_mean, _ = mean_std(chance)
    result = {"dataset": dataset.name, "source": getattr(dataset, "source", ""), "representation": representation,
              "representation_info": rep_info, "protocol": protocol, "folds": len(fold_list),
              "ks": list(ks), "methods": methods, "overlap_k": overlap_k,
              "corpus_size": len(corpus_captions) if corpus_captions else 0,
              "train_images": int(np.mean([len(f.train) for f in fold_list])),
              "test_images": int(np.mean([len(f.test) for f in fold_list])) if not cross else
              int(np.mean([len(p) for p in cross_parts(test_dataset.n_images, test_parts, seed)])),
              "test_dataset": None if not cross else test_dataset.name,
              "test_parts": None if not cross else int(test_parts), "index": index,
              "results": results, "std": stds, "chance": chance_mean,
              "per_fold": per_fold if len(fold_list) > 1 else {},
              "method_params": {m: {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
                                    for k, v in params[m].items()} for m in methods},
              "paper": paper_numbers(representation, methods) if not cross else
              paper_numbers(representation, methods, _paper_dataset(test_dataset.name), table="table 4"),
              "experiment_dir": str(folder), "runs": runs}
    if cross:
        result["cross_ranks"] = cross_ranks
        if learned and len(methods) > 1:    # one build: each other row (the random one too) against the first
            result["paired"] = paired_against([result], learned[0], [m for m in methods if m != learned[0]], ks)
    atomic_write_json(folder / EXPERIMENT_FILE, {**record, "method_params": method_params_all,
                                                 "methods": sorted(set(old.get("methods") or []) | set(methods)),
                                                 "representation_info": plain(rep_info), "trials": trials})
    yield Progress(total, total, "done")
    yield Finished(summary=result)


def run_bitr_table_seeds(dataset: Any, *, seeds: Sequence[int], out: str | Path | None = None,
                         representation: str = "modern", representation_params: dict[str, Any] | None = None,
                         should_stop: Callable[[], bool] | None = None, **kwargs: Any) -> Iterator[Event]:
    """The table built once per seed and averaged over the builds (:func:`combine_seeds`).

    Each seed is a whole :func:`run_bitr_table` experiment in its own folder ``OUT/seed-<seed>``
    (:func:`seed_folder`): the seed draws the folds, the representation's learned parts (TR / CTR: the
    k-means sample and start, both LDAs) and the methods' own randomness. Running again with the same ``out``
    skips finished builds and trials, as one experiment does. One seed is exactly :func:`run_bitr_table`.
    """
    seeds = parse_seeds(seeds)
    rep_kw = dict(representation_params or {})
    if len(seeds) == 1 and out is not None and Path(out).is_dir() and any(
            (d / EXPERIMENT_FILE).is_file() for d in Path(out).glob("seed-*")):
        raise CrossViewError(f"{out} holds a BITR table over several seeds (its seed-* folders); give --seeds to "
                             "continue it, or a new folder for a one-seed table")
    if len(seeds) == 1:
        yield from run_bitr_table(dataset, representation=representation, seed=seeds[0], out=out,
                                  representation_params={**rep_kw, "seed": seeds[0]}, should_stop=should_stop,
                                  **kwargs)
        return
    folder = Path(out) if out is not None else default_experiment_dir(dataset.name, representation)
    results = yield from run_seed_builds(
        folder, seeds, "BITR-table experiment", EXPERIMENT_FILE,
        lambda s, d: run_bitr_table(dataset, representation=representation, seed=s, out=d,
                                    representation_params={**rep_kw, "seed": s}, should_stop=should_stop, **kwargs))
    if results is None:
        return
    result = combine_seeds(results, seeds)
    result["experiment_dir"] = str(folder)
    learned = [m for m in result["methods"] if registry_of(m) != "random"]
    if result.get("test_dataset") and learned and len(result["methods"]) > 1:    # Experiment 2: the random row too
        result["paired"] = paired_against(results, learned[0], [m for m in result["methods"] if m != learned[0]],
                                          result["ks"])
    elif result["folds"] == 1 and len(learned) > 1:
        result["paired"] = paired_against(results, learned[0], learned[1:], result["ks"])
    yield Finished(summary=result)


def _plain_ranks(run_dir: Path) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """A trial run's plain ranks of its test queries (what the table's R@K counts) and its caption -> image map."""
    from crossview.engine.results import load_run_results

    r = load_run_results(run_dir, plain=True)
    ranks = r.ranks
    if "i2t" not in ranks or "t2i" not in ranks:
        raise CrossViewError(f"{run_dir / 'ranks.npz'}: needs both i2t and t2i ranks; run the table again with the "
                             "same --exp-dir to finish that trial")
    return ranks, r.caption_image


def paired_against(results: Sequence[dict[str, Any]], baseline: str, others: Sequence[str],
                   ks: Sequence[int]) -> dict[str, Any]:
    """Each method of ``others`` against ``baseline`` on the same test queries, paired
    (:func:`crossview.eval.paired.paired_effect`, effect = method - baseline): each query's rank averaged over the
    builds first (one observation per query), images resampled with their captions. ``results``: the builds
    (:func:`run_bitr_table` results of one split, one per seed), whose trial runs hold the ranks; for Experiment 2,
    the ranks of the other dataset's queries in their ``cross_ranks`` files (the random row's too)."""
    from crossview.eval.paired import paired_effect

    def ranks_of(m: str) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        per = [_load_cross_ranks(r["cross_ranks"][m][0]) if r.get("cross_ranks")
               else _plain_ranks(Path(r["runs"][m][0])) for r in results]
        return {d: np.stack([x[0][d] for x in per]) for d in ("i2t", "t2i")}, per[0][1]

    base, caption_image = ranks_of(baseline)
    rows: dict[str, Any] = {}
    eff: dict[str, Any] = {}
    for m in others:
        eff = paired_effect(base, ranks_of(m)[0], caption_image, ks=tuple(ks))
        rows[m] = {"i2t": {f"R@{k}": eff["i2t"][f"R@{k}"] for k in ks},
                   "t2i": {f"R@{k}": eff["t2i"][f"R@{k}"] for k in ks}, "sum": eff["rsum"],
                   "mde": float(eff["mde"]["rsum"])}
    return {"baseline": baseline, "rows": rows, "resampled": eff["resampled"], "resamples": eff["resamples"],
            "level": eff["level"], "n_images": eff["n_images"], "n_captions": eff["n_captions"]}


def combine_seeds(results: Sequence[dict[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """Several builds' results (:func:`run_bitr_table`, one per seed, same settings) as one table.

    Each cell is the mean over the builds. R@K, BLEU-1 and ROUGE-1 are means over queries, so that mean is
    also each query's value averaged over the seeds first, then over the queries (one observation per query);
    MedR is the mean of the builds' medians. ``seed_std`` holds the (population) standard deviation over the
    builds, ``per_seed`` each build's cells, ``seeds`` the seeds; the chance level and times are averaged too.
    """
    if len(results) != len(seeds) or not results:
        raise ValueError("one result per seed")
    first = results[0]
    out = dict(first)
    means, stds, per_seed = {}, {}, {}
    for m in first["methods"]:
        means[m], stds[m] = mean_std_with_c([r["results"][m] for r in results])
        per_seed[m] = [{k: v for k, v in r["results"][m].items() if k != "C"} for r in results]
    out.update(results=means, seed_std=stds, per_seed=per_seed, seeds=[int(s) for s in seeds],
               chance=mean_std([r["chance"] for r in results])[0] if first.get("chance") else first.get("chance"),
               std=mean_std([r["std"] for r in results])[0],
               per_fold={}, runs={m: [d for r in results for d in r["runs"].get(m, [])] for m in first["runs"]})
    if first.get("cross_ranks"):
        out["cross_ranks"] = {m: [p for r in results for p in r["cross_ranks"].get(m, [])]
                              for m in first["cross_ranks"]}
    return out


def _caption_counts_only(dataset: Any, images: np.ndarray) -> MethodData:
    """A featureless :class:`MethodData` of ``images`` (what :func:`chance_levels` reads: captions per image)."""
    sub = dataset.subset(np.asarray(images, dtype=np.int64))
    return MethodData(image_features=np.zeros((sub.n_images, 1), np.float32),
                      text_features=np.zeros((sub.n_captions, 1), np.float32), captions=list(sub.captions),
                      caption_image=sub.caption_image, name="test")


def registry_of(table_name: str) -> str:
    """The registry name of table row ``table_name`` (``"bitr-c"`` -> ``"bitr"``)."""
    return TABLE_METHODS[table_name][0]


def bitr_table(dataset: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_bitr_table` drained: the result dict."""
    from crossview.engine.runs import drain
    return drain(run_bitr_table(dataset, **kwargs), "BITR table (run it again with the same --out folder)")


# ====================================================================== layout
def _columns(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(direction, metric, header)`` of the table's columns, in the paper's order."""
    cols: list[tuple[str, str, str]] = []
    for d in ("i2t", "t2i"):
        cols += [(d, "BLEU-1", "%BLEU-1"), (d, "ROUGE-1", "%ROUGE-1")]
        cols += [(d, f"R@{k}", f"R@{k}") for k in result["ks"]]
        cols += [(d, "MedR", "MedR")]
    if result.get("corpus_size"):
        cols += [("corpus_i2t", "BLEU-1", "%BLEU-1"), ("corpus_i2t", "ROUGE-1", "%ROUGE-1")]
    return cols


def _fmt(v: Any, metric: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.2f}"


def _groups(result: dict[str, Any]) -> list[tuple[str, int]]:
    n = 3 + len(result["ks"])
    g = [("Im2Text", n), ("Text2Im", n)]
    if result.get("corpus_size"):
        g.append((f"Im2Text, corpus ({result['corpus_size']:,})", 2))
    return g


def _rows(result: dict[str, Any]) -> list[tuple[str, list[str]]]:
    cols = _columns(result)
    rows = []
    for m in result["methods"]:
        r = result["results"][m]
        rows.append((METHOD_LABELS[m], [_fmt(r.get(d, {}).get(k), k) for d, k, _ in cols]))
    ch = result.get("chance") or {}
    if ch:
        rows.append(("chance", [_fmt(ch.get(d, {}).get(k), k) if d != "corpus_i2t" else "-" for d, k, _ in cols]))
    return rows


def _sd_rows(result: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """The methods' standard deviations over the builds (:func:`combine_seeds`); none for one build."""
    if not several_seeds(result):
        return []
    cols = _columns(result)
    return [(METHOD_LABELS[m], [_fmt(result["seed_std"][m].get(d, {}).get(k), k) for d, k, _ in cols])
            for m in result["methods"]]


def _sd_title(result: dict[str, Any]) -> str:
    return (f"Standard deviation over the {len(result['seeds'])} builds (seeds "
            f"{', '.join(map(str, result['seeds']))}): how far one build's cell moves with the seed")


def _seeds_note(result: dict[str, Any]) -> str:
    return (f"each cell is the mean over {len(result['seeds'])} builds (seeds {', '.join(map(str, result['seeds']))}; "
            "a seed draws the folds, the representation's k-means / LDA and the methods' own randomness): R@K, "
            "BLEU-1 and ROUGE-1 are each query's value averaged over the seeds, then over the queries; MedR is the "
            "mean of the builds' medians")


def _builds(result: dict[str, Any]) -> str:
    n = len(result.get("seeds") or [1])
    return "one build of each" if n == 1 else f"{n} builds of each"


def _paired_table(result: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """The paired comparison against the first method (:func:`paired_against`): title, header, rows."""
    pr = result["paired"]
    ks = result["ks"]
    base = METHOD_LABELS[pr["baseline"]]
    cols = [(d, f"R@{k}") for d in ("i2t", "t2i") for k in ks]
    names = {"i2t": "Im2Text", "t2i": "Text2Im"}
    header = [f"Method - {base}", *(f"{names[d]} {k}" for d, k in cols),
              "sum of " + " + ".join(f"R@{k}" for k in ks) + " both ways", "minimal detectable (sum)"]

    def cell(v: dict[str, Any]) -> str:
        return f"{v['diff']:+.1f} ({v['ci'][0]:+.1f} to {v['ci'][1]:+.1f})"

    rows = [[METHOD_LABELS[m], *(cell(r[d][k]) for d, k in cols), cell(r["sum"]), f"{r['mde']:.1f}"]
            for m, r in pr["rows"].items()]
    where = (f"{result['test_dataset']} images / {pr['n_captions']} captions (each ranked within its part of "
             f"{result['test_dataset']}, as the table's R@K)" if result.get("test_dataset") else
             f"test images / {pr['n_captions']} captions")
    title = (f"Paired against {base} on the same {pr['n_images']} {where}: "
             f"method minus {base}, points, with the {100 * pr['level']:.0f}% interval "
             f"({_builds(result)}; resampled: {pr['resampled']}; "
             f"{pr['resamples']:,} resamples)")
    return title, header, rows


def _paired_lines(result: dict[str, Any], markdown: bool = True) -> list[str]:
    """:func:`_paired_table` as Markdown, or as aligned plain text; none without a paired comparison."""
    if not result.get("paired"):
        return []
    title, header, rows = _paired_table(result)
    return [title, "", *markdown_table(header, rows)] if markdown else [title, *text_table(header, rows)]


def _paper_rows(result: dict[str, Any]) -> list[tuple[str, list[str]]]:
    paper = result.get("paper") or {}
    if not paper.get("rows"):
        return []
    cols = _columns(result)
    rows = []
    for m in result["methods"]:
        pr = paper["rows"].get(m)
        if pr:
            rows.append((METHOD_LABELS[m], [_fmt(pr[d][k], k) if k in pr.get(d, {}) else "" for d, k, _ in cols]))
    return rows


def _title(result: dict[str, Any]) -> str:
    if result.get("test_dataset"):
        return (f"Experiment 2 (BITR paper): cross-dataset image <-> caption retrieval, trained on "
                f"{result['dataset']}, tested on {result['test_dataset']}, representation {result['representation']}; "
                f"{result['protocol']}"
                + (f"; the mean of {len(result['seeds'])} builds" if several_seeds(result) else ""))
    builds = f"; the mean of {len(result['seeds'])} builds" if several_seeds(result) else ""
    return (f"Experiment 1 (BITR paper): image <-> caption retrieval on {result['dataset']}, representation "
            f"{result['representation']}; {result['protocol']}{builds}")


def _paper_title(result: dict[str, Any]) -> str:
    p = result["paper"]
    closest = " (the closest setting: other data and other features)" if result["representation"] == "default" else ""
    what = "IAPR TC-12" if p.get("dataset") == "iapr" else f"{p.get('dataset', '').capitalize()} sentences"
    if result.get("test_dataset") and not p.get("setting"):
        what = f"trained on SBU, tested on {what}"
    return (f"The paper's numbers{closest}: {p.get('table', '')}, {what}"
            + (f", {p['setting']}" if p.get("setting") else "") + "; blank = not reported (other K, no corpus)")


def _where(result: dict[str, Any]) -> str:
    """Where each metric's queries and gallery come from."""
    corpus = f" and from the {result['corpus_size']:,}-caption corpus" if result.get("corpus_size") else ""
    if result.get("test_dataset"):
        return (f"BLEU-1 / ROUGE-1 (percent): each {result['test_dataset']} image / caption a query, the top "
                f"{result['overlap_k']} retrieved from all of {result['dataset']}{corpus}; R@K (percent) and MedR: "
                f"within each of the {result['test_parts']} parts of {result['test_dataset']} "
                f"(about {result['test_images']} images each), averaged")
    return (f"BLEU-1 / ROUGE-1 (percent): top {result['overlap_k']} retrieved from the training set{corpus}; "
            "R@K (percent) and MedR: within the test set")


def format_table(result: dict[str, Any]) -> str:
    """The result as a plain-text table in the paper's layout (Im2Text | Text2Im | corpus Im2Text)."""
    cols = _columns(result)
    w0 = max(8, *(len(METHOD_LABELS[m]) for m in result["methods"]))
    widths = [max(7, len(h)) for _, _, h in cols]
    lines = [_title(result), ""]
    head = " " * w0
    i = 0
    for name, n in _groups(result):
        span = sum(widths[i:i + n]) + 2 * n
        head += "  " + name.center(span - 2, "-")
        i += n
    lines.append(head)
    lines.append("Method".ljust(w0) + "".join("  " + h.rjust(w) for (_, _, h), w in zip(cols, widths)))

    def emit(rows: list[tuple[str, list[str]]]) -> None:
        for label, cells in rows:
            lines.append(label.ljust(w0) + "".join("  " + c.rjust(w) for c, w in zip(cells, widths)))

    emit(_rows(result))
    if several_seeds(result):
        lines += ["", _sd_title(result)]
        emit(_sd_rows(result))
    if result.get("paired"):
        lines += ["", *_paired_lines(result, markdown=False)]
    prows = _paper_rows(result)
    if prows:
        lines += ["", _paper_title(result)]
        emit(prows)
    info = result.get("representation_info") or {}
    lines += ["", f"features: {info.get('image_encoder', '?')} images ({info.get('image_dim', '?')}-d), "
                  f"{info.get('text_encoder', '?')} captions ({info.get('text_dim', '?')}-d); " + _where(result)]
    secs = {m: result["results"][m].get("train_seconds") for m in result["methods"]}
    lines.append("training time per fold: " + ", ".join(f"{METHOD_LABELS[m]} {s:.1f} s" for m, s in secs.items()
                                                       if s is not None))
    lines.append(_search_line(result))
    if several_seeds(result):
        lines.append(_seeds_note(result))
    return "\n".join(lines)


def _search_line(result: dict[str, Any]) -> str:
    """How the BLEU / ROUGE retrieval searched and how long it took per fold."""
    how = f"index {result['index']}" if result.get("index") else "dense score matrices"
    secs = {m: result["results"][m].get("search_seconds") for m in result["methods"]}
    return (f"overlap retrieval ({how}) per fold: "
            + ", ".join(f"{METHOD_LABELS[m]} {s:.2f} s" for m, s in secs.items() if s is not None))


def c_text(c: dict[str, Any]) -> str:
    """``{"i2t": 10.0, "t2i": [10.0, 100.0]}`` -> ``"i2t 10, t2i 10 / 100"`` (per fold when they differ)."""
    parts = []
    for d, v in c.items():
        vals = v if isinstance(v, list) else [v]
        uniq = list(dict.fromkeys(f"{x:g}" for x in vals))
        parts.append(f"{d} {' / '.join(uniq) if len(uniq) > 1 else uniq[0]}")
    return ", ".join(parts)


def format_markdown(result: dict[str, Any], command: str | None = None) -> str:
    """The result as a Markdown document (the table, the paper's numbers, the settings and the command)."""
    cols = _columns(result)
    groups = {"i2t": "Im2Text", "t2i": "Text2Im", "corpus_i2t": "Im2Text (corpus)"}
    head = "| Method | " + " | ".join(f"{groups[d]} {h}" for d, _, h in cols) + " |"
    sep = "|---|" + "---:|" * len(cols)
    out = [f"# {_title(result)}", ""]
    if command:
        out += ["Made with:", "", "```", command, "```", ""]
    out += [head, sep]
    out += ["| " + label + " | " + " | ".join(cells) + " |" for label, cells in _rows(result)]
    if several_seeds(result):
        out += ["", _sd_title(result), "", head, sep]
        out += ["| " + label + " | " + " | ".join(cells) + " |" for label, cells in _sd_rows(result)]
    if result.get("paired"):
        out += ["", *_paired_lines(result)]
    prows = _paper_rows(result)
    if prows:
        out += ["", _paper_title(result), "", head, sep]
        out += ["| " + label + " | " + " | ".join(c or "" for c in cells) + " |" for label, cells in prows]
    info = result.get("representation_info") or {}
    out += ["", "Settings:", "",
            f"- dataset `{result['dataset']}` ({result.get('source') or ''}): {result['protocol']}",
            f"- representation `{result['representation']}`: "
            + ", ".join(f"{k} = {v}" for k, v in info.items() if not isinstance(v, (list, dict))),
            "- " + _where(result) + "; 'chance' = expected value of a random ranking",
            *(["- " + _seeds_note(result)] if several_seeds(result) else []),
            "- training time per fold: " + ", ".join(
                f"{METHOD_LABELS[m]} {result['results'][m].get('train_seconds', float('nan')):.1f} s"
                for m in result["methods"]),
            "- " + _search_line(result)]
    for m in result["methods"]:
        extra = result["method_params"].get(m) or {}
        c = result["results"][m].get("C")
        if extra or c is not None:
            out.append(f"- {METHOD_LABELS[m]}: " + ", ".join(f"{k} = {v}" for k, v in extra.items())
                       + (f"{'; ' if extra else ''}C used: {c_text(c)}" if c is not None else ""))
    return "\n".join(out) + "\n"
