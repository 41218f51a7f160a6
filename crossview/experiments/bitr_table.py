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

:func:`run_bitr_table` is a generator of :mod:`crossview.core.events` (cancel by not iterating further);
its last event is ``Finished(summary=result)``. :func:`bitr_table` drains it. :func:`format_table` and
:func:`format_markdown` lay the result out as the paper's table, with the paper's own numbers (from the
method cards in ``models/``) beside ours where the representation matches.
"""

from __future__ import annotations

import math
import re
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from crossview.core.events import Event, Finished, Log, Progress
from crossview.core.errors import CrossViewError
from crossview.methods.base import Method, MethodData

__all__ = ["TABLE_METHODS", "DEFAULT_METHODS", "METHOD_LABELS", "Fold", "make_folds", "parse_methods", "parse_ks",
           "run_bitr_table", "bitr_table", "evaluate_fold", "chance_levels", "paper_numbers", "format_table",
           "format_markdown", "RandomEmbedding"]

#: Table rows: name -> (registry name, fixed parameters). ``random`` is the chance-level baseline.
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
METHOD_LABELS = {"cca": "CCA", "wsabie": "WSABIE", "bitr-m": "BITR-M", "bitr-e": "BITR-E", "bitr-c": "BITR-C",
                 "random": "random"}
OVERLAP_K = 5  # the paper scores the top five retrieved items


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
    """One train / test partition (image indices of the dataset); ``val`` is optional."""

    name: str
    train: np.ndarray
    test: np.ndarray
    val: np.ndarray | None


def make_folds(dataset: Any, *, folds: int | None = None, split: str | None = None,
               seed: int = 0) -> tuple[list[Fold], str]:
    """The partitions of the experiment and a description of the protocol.

    ``folds=N``: N seeded random partitions of all images (each the test set once). ``split=NAME``:
    train on the ``train`` split (plus ``restval`` when present), test on ``NAME``. Neither: the
    ``test`` split if the dataset has one, else 10 folds.
    """
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
        return [Fold(split, train, test, val)], desc
    folds = int(folds)  # type: ignore[arg-type]
    if folds < 2:
        raise CrossViewError(f"--folds must be at least 2, got {folds}")
    if n < 2 * folds:
        raise CrossViewError(f"dataset {dataset.name!r} has {n} images, too few for {folds} folds (need at least "
                             f"{2 * folds}); lower --folds")
    perm = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(perm, folds)
    out = [Fold(f"fold {f + 1}/{folds}", np.sort(np.concatenate([parts[g] for g in range(folds) if g != f])),
                np.sort(parts[f]), None) for f in range(folds)]
    return out, f"{folds} folds over all {n} images (each fold the test set once, the rest training)"


# ====================================================================== the chance baseline
class RandomEmbedding(Method):
    """Random Gaussian embeddings (``dim``-d) of every image and caption: the chance-level baseline.

    Not registered: it exists so that the table can show what no learning gives.
    """

    name = "random"

    def __init__(self, *, dim: int = 64, seed: int = 0) -> None:
        self.dim = dim
        self.seed = seed

    def fit_iter(self, train: MethodData, val: MethodData | None = None, *, resume: bool = False) -> Iterator[Event]:
        """Nothing to learn; yields one ``Log``."""
        self.fitted_ = True
        yield Log("random: no training (random embeddings)")

    def _rand(self, n: int, what: str, data: MethodData) -> np.ndarray:
        key = zlib.crc32(f"{what}|{data.name}|{n}".encode())
        return np.random.default_rng([int(self.seed), key]).standard_normal((n, int(self.dim))).astype(np.float32)

    def encode_images(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """``(n_images, dim) float32`` random rows."""
        return self._rand(data.n_images, "image", data)

    def encode_texts(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        """``(n_captions, dim) float32`` random rows."""
        return self._rand(data.n_captions, "text", data)


def _make_method(table_name: str, params: dict[str, Any]) -> Method:
    from crossview.methods import create_method

    registry, fixed = TABLE_METHODS[table_name]
    if registry == "random":
        return RandomEmbedding(**params)
    return create_method(registry, **{**params, **fixed})


def _coerce(registry: str, key: str, value: Any) -> Any:
    """A parameter value from the command line, typed with the method's card when there is one."""
    if not isinstance(value, str):
        return value
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


def method_params_for(table_name: str, params: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """Parameters of table method ``table_name``: those given for its registry name (``"bitr"`` applies
    to every BITR row), then those given for the row itself (``"bitr-c"``)."""
    registry = TABLE_METHODS[table_name][0]
    out: dict[str, Any] = {}
    for key in (registry, table_name):
        for k, v in ((params or {}).get(key) or {}).items():
            out[k] = _coerce(registry, k, v)
    fixed = TABLE_METHODS[table_name][1]
    clash = sorted(set(out) & set(fixed))
    if clash:
        raise CrossViewError(f"{table_name} fixes {', '.join(f'{k}={fixed[k]!r}' for k in clash)}; choose another "
                             f"row instead of setting it (e.g. bitr-m, bitr-e, bitr-c)")
    return out


# ====================================================================== metrics of one fold
class _OverlapScorer:
    """BLEU-1 and ROUGE-1 (percent) of a hypothesis against references, memoised: the same caption is
    retrieved for many queries and by many methods."""

    def __init__(self) -> None:
        from crossview.eval.overlap import SentenceOverlap

        self._scorer = SentenceOverlap()
        self._memo: dict[tuple[str, tuple[str, ...]], tuple[float, float]] = {}

    def __call__(self, hyp: str, refs: tuple[str, ...]) -> tuple[float, float]:
        key = (hyp, refs)
        got = self._memo.get(key)
        if got is None:
            s = self._scorer(hyp, list(refs))
            got = (float(s["BLEU-1"]), 100.0 * float(s["ROUGE-1"]))
            self._memo[key] = got
        return got


def _refs_by_image(data: MethodData) -> list[tuple[str, ...]]:
    out: list[list[str]] = [[] for _ in range(data.n_images)]
    for c, i in enumerate(data.caption_image.tolist()):
        out[i].append(data.captions[c])
    return [tuple(r) for r in out]


def _mean_pairs(rows: list[tuple[float, float]]) -> dict[str, float]:
    if not rows:
        return {"BLEU-1": float("nan"), "ROUGE-1": float("nan")}
    a = np.asarray(rows, dtype=np.float64)
    return {"BLEU-1": float(a[:, 0].mean()), "ROUGE-1": float(a[:, 1].mean())}


def _overlap_i2t(scores: np.ndarray, gallery_captions: Sequence[str], query_refs: list[tuple[str, ...]],
                 scorer: _OverlapScorer, k: int) -> dict[str, float]:
    """Top-``k`` gallery captions of each query image (rows of ``scores``) against its gold captions."""
    from crossview.eval.metrics import top_k

    ranked = top_k(scores, k)
    rows = []
    for q, refs in enumerate(query_refs):
        if refs:
            rows.extend(scorer(gallery_captions[c], refs) for c in ranked[q].tolist())
    return _mean_pairs(rows)


def _overlap_t2i(scores: np.ndarray, query_captions: Sequence[str], gallery_refs: list[tuple[str, ...]],
                 scorer: _OverlapScorer, k: int) -> dict[str, float]:
    """Each query caption (columns of ``scores (n_gallery_images, n_queries)``) against the captions of
    its top-``k`` gallery images."""
    from crossview.eval.metrics import top_k

    ranked = top_k(np.ascontiguousarray(scores.T), k)
    rows = []
    for q, cap in enumerate(query_captions):
        rows.extend(scorer(cap, gallery_refs[i]) for i in ranked[q].tolist() if gallery_refs[i])
    return _mean_pairs(rows)


def evaluate_fold(method: Method, train: MethodData, test: MethodData, *, ks: Sequence[int] = (50,),
                  corpus: MethodData | None = None, scorer: Any = None,
                  overlap_k: int = OVERLAP_K) -> dict[str, Any]:
    """The paper's metrics of a fitted method on one fold.

    Returns ``{"i2t": {"BLEU-1", "ROUGE-1", "R@K"..., "MedR", "MeanR"}, "t2i": {...}}`` plus
    ``"corpus_i2t": {"BLEU-1", "ROUGE-1"}`` when a ``corpus`` is given (its ``text_features`` rows are the
    corpus captions). BLEU/ROUGE are percentages over the top ``overlap_k`` items; retrieval over the test set.
    """
    scorer = scorer or _OverlapScorer()
    res = method.evaluate(test, ks=tuple(ks))
    out: dict[str, Any] = {}
    for d in ("i2t", "t2i"):
        out[d] = {key: float(v) for key, v in res[d].items()}
    test_refs = _refs_by_image(test)
    s_i2t = method.scores(test, "i2t", texts=train)              # (test images, train captions)
    out["i2t"].update(_overlap_i2t(s_i2t, train.captions, test_refs, scorer, overlap_k))
    s_t2i = method.scores(train, "t2i", texts=test)              # (train images, test captions)
    out["t2i"].update(_overlap_t2i(s_t2i, test.captions, _refs_by_image(train), scorer, overlap_k))
    if corpus is not None:
        s_c = method.scores(test, "i2t", texts=corpus)           # (test images, corpus captions)
        out["corpus_i2t"] = _overlap_i2t(s_c, corpus.captions, test_refs, scorer, overlap_k)
    return out


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


def paper_numbers(representation: str, methods: Sequence[str], dataset: str = "pascal") -> dict[str, Any]:
    """The paper's Experiment-1 numbers for ``methods`` from their cards' ``paper_results``
    (``models/<method>.toml``, read by :mod:`crossview.methods.cards`), in the setting closest to
    ``representation``: Table 7 (CNN + word2vec) for ``modern`` / ``default``, Table 2 for ``tr`` / ``ctr``
    (entries whose text names TR or CTR); on ``dataset`` (Pascal sentences: 1,000 images with 5 captions,
    10 folds, the closest to small sets).

    Returns ``{"table", "dataset", "setting", "rows": {method: {"i2t": {...}, "t2i": {...}}}}``; ``rows``
    is empty when the cards are not there.
    """
    table = "table 7" if representation in ("modern", "default") else "table 2"
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


# ====================================================================== the runner
def _mean_std(values: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Element-wise mean and standard deviation of nested metric dicts (one per fold)."""
    mean: dict[str, Any] = {}
    std: dict[str, Any] = {}
    for key in values[0]:
        if isinstance(values[0][key], dict):
            mean[key], std[key] = _mean_std([v[key] for v in values])
        else:
            a = np.asarray([float(v[key]) for v in values], dtype=np.float64)
            mean[key] = float(a.mean())
            std[key] = float(a.std()) if len(a) > 1 else 0.0
    return mean, std


def run_bitr_table(dataset: Any, *, representation: str = "modern", methods: Sequence[str] = DEFAULT_METHODS,
                   folds: int | None = None, split: str | None = None, ks: Sequence[int] = (50,),
                   corpus: Sequence[str] | Any = None, method_params: dict[str, dict[str, Any]] | None = None,
                   representation_params: dict[str, Any] | None = None, seed: int = 0,
                   overlap_k: int = OVERLAP_K,
                   feature_progress: Callable[[str, int, int], None] | None = None,
                   should_stop: Callable[[], bool] | None = None) -> Iterator[Event]:
    """Run Experiment 1; yields ``Progress`` / ``Log`` events and finally ``Finished(summary=result)``.

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
        seed: the folds' permutation.
        feature_progress: ``progress(stage, done, total)`` of feature extraction (it runs outside the
            event stream); ``should_stop()`` cancels it.

    The result: ``{"dataset", "representation", "protocol", "ks", "methods": [...], "folds": n,
    "results": {method: {"i2t": {...}, "t2i": {...}, "corpus_i2t": {...}, "train_seconds"}},
    "std": {...}, "per_fold": {...}, "chance": {...}, "paper": {...}, "representation_info": {...}}``.
    """
    from crossview.features.topics import build_representation, check_representation, method_data_for_images

    rep_kw = dict(representation_params or {})
    check_representation(dataset, representation, image_encoder=rep_kw.get("image_encoder"),
                         text_encoder=rep_kw.get("text_encoder"))
    methods = parse_methods(list(methods))
    ks = parse_ks(list(ks))
    if overlap_k < 1:
        raise CrossViewError(f"overlap_k must be >= 1, got {overlap_k}")
    for key in method_params or {}:
        if not any(key in (m, TABLE_METHODS[m][0]) for m in methods):
            raise CrossViewError(f"parameters given for {key}, but {key} is not among the methods "
                                 f"({', '.join(methods)}); add it to --methods or drop its --param")
    params = {m: method_params_for(m, method_params) for m in methods}
    for m in methods:  # bad parameter names fail now, not after the first fold's features
        _make_method(m, params[m])
    corpus_captions = None
    if corpus is not None:
        corpus_captions = list(getattr(corpus, "captions", corpus))
        if not corpus_captions:
            raise CrossViewError("the caption corpus is empty; give a file with one caption a line")
    fold_list, protocol = make_folds(dataset, folds=folds, split=split, seed=seed)
    stop = should_stop or (lambda: False)
    yield Log(f"experiment 1 on {dataset.name}: {protocol}; representation {representation}; methods "
              f"{', '.join(methods)}" + (f"; corpus of {len(corpus_captions):,} captions" if corpus_captions else ""))

    total = len(fold_list) * (len(methods) + 1)
    step = 0
    per_fold: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    chance: list[dict[str, Any]] = []
    rep_info: dict[str, Any] = {}
    scorer = _OverlapScorer()
    for fold in fold_list:
        yield Progress(step, total, f"{fold.name}: {representation} features")
        t0 = time.monotonic()
        rep = build_representation(dataset, representation, fit_images=fold.train, **rep_kw,
                                   progress=feature_progress, should_stop=stop)
        if not rep_info:
            rep_info = {k: v for k, v in rep.info.items() if k not in ("cca", "correlations")}
        train = method_data_for_images(dataset, rep, fold.train, "train")
        test = method_data_for_images(dataset, rep, fold.test, "test")
        val = method_data_for_images(dataset, rep, fold.val, "val") if fold.val is not None else None
        corpus_md = None
        if corpus_captions is not None:
            feats = rep.encode_captions(corpus_captions)
            corpus_md = MethodData(image_features=np.zeros((1, rep.image.shape[1]), np.float32),
                                   text_features=feats, captions=corpus_captions,
                                   caption_image=np.zeros(len(corpus_captions), np.int64), name="corpus")
        chance.append(chance_levels(test, ks))
        step += 1
        yield Log(f"{fold.name}: {representation} features {train.image_dim}-d images / {train.text_dim}-d captions "
                  f"({train.n_images} train, {test.n_images} test images) in {time.monotonic() - t0:.1f} s")
        for m in methods:
            if stop():
                return
            yield Progress(step, total, f"{fold.name}: training {m}")
            method = _make_method(m, params[m])
            t1 = time.monotonic()
            for ev in method.fit_iter(train, val):
                if isinstance(ev, Log) and ev.level in ("warning", "error"):
                    yield Log(f"{fold.name} {m}: {ev.message}", ev.level)
                elif isinstance(ev, Progress):
                    yield Progress(ev.step, ev.total, f"{fold.name} {m}: {ev.message}")
                if stop():
                    return
            secs = time.monotonic() - t1
            res = evaluate_fold(method, train, test, ks=ks, corpus=corpus_md, scorer=scorer, overlap_k=overlap_k)
            res["train_seconds"] = secs
            if m.startswith("bitr") and hasattr(method, "C_"):
                res["C"] = {d: float(c) for d, c in getattr(method, "C_", {}).items()}
            per_fold[m].append(res)
            step += 1
            k0 = f"R@{ks[-1]}"
            yield Log(f"{fold.name} {m}: trained in {secs:.1f} s; i2t {k0} {res['i2t'][k0]:.1f} MedR "
                      f"{res['i2t']['MedR']:g}, t2i {k0} {res['t2i'][k0]:.1f} MedR {res['t2i']['MedR']:g}")
    results, stds = {}, {}
    for m in methods:
        rows = [{k: v for k, v in r.items() if k != "C"} for r in per_fold[m]]
        results[m], stds[m] = _mean_std(rows)
        cs = [r["C"] for r in per_fold[m] if "C" in r]
        if cs:
            results[m]["C"] = cs[0] if len(cs) == 1 else {d: [c[d] for c in cs] for d in cs[0]}
    chance_mean, _ = _mean_std(chance)
    result = {"dataset": dataset.name, "source": getattr(dataset, "source", ""), "representation": representation,
              "representation_info": rep_info, "protocol": protocol, "folds": len(fold_list),
              "ks": list(ks), "methods": methods, "overlap_k": overlap_k,
              "corpus_size": len(corpus_captions) if corpus_captions else 0,
              "train_images": int(np.mean([len(f.train) for f in fold_list])),
              "test_images": int(np.mean([len(f.test) for f in fold_list])),
              "results": results, "std": stds, "chance": chance_mean,
              "per_fold": per_fold if len(fold_list) > 1 else {},
              "method_params": {m: {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
                                    for k, v in params[m].items()} for m in methods},
              "paper": paper_numbers(representation, methods)}
    yield Progress(total, total, "done")
    yield Finished(summary=result)


def bitr_table(dataset: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_bitr_table` drained: the result dict."""
    result: dict[str, Any] | None = None
    for ev in run_bitr_table(dataset, **kwargs):
        if isinstance(ev, Finished):
            result = ev.summary
    if result is None:
        raise CrossViewError("the experiment stopped before it finished")
    return result


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
    return (f"Experiment 1 (BITR paper): image <-> caption retrieval on {result['dataset']}, representation "
            f"{result['representation']}; {result['protocol']}")


def _paper_title(result: dict[str, Any]) -> str:
    p = result["paper"]
    closest = " (the closest setting: other data and other features)" if result["representation"] == "default" else ""
    return (f"The paper's numbers{closest}: {p.get('table', '')}, {p.get('dataset', '').capitalize()} sentences"
            + (f", {p['setting']}" if p.get("setting") else "") + "; blank = not reported (other K, no corpus)")


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
    prows = _paper_rows(result)
    if prows:
        lines += ["", _paper_title(result)]
        emit(prows)
    info = result.get("representation_info") or {}
    lines += ["", f"features: {info.get('image_encoder', '?')} images ({info.get('image_dim', '?')}-d), "
                  f"{info.get('text_encoder', '?')} captions ({info.get('text_dim', '?')}-d); BLEU-1/ROUGE-1 over "
                  f"the top {result['overlap_k']} retrieved from the training set (and the corpus); R@K and MedR "
                  f"within the test set"]
    secs = {m: result["results"][m].get("train_seconds") for m in result["methods"]}
    lines.append("training time per fold: " + ", ".join(f"{METHOD_LABELS[m]} {s:.1f} s" for m, s in secs.items()
                                                       if s is not None))
    return "\n".join(lines)


def _c_text(c: dict[str, Any]) -> str:
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
    prows = _paper_rows(result)
    if prows:
        out += ["", _paper_title(result), "", head, sep]
        out += ["| " + label + " | " + " | ".join(c or "" for c in cells) + " |" for label, cells in prows]
    info = result.get("representation_info") or {}
    out += ["", "Settings:", "",
            f"- dataset `{result['dataset']}` ({result.get('source') or ''}): {result['protocol']}",
            f"- representation `{result['representation']}`: "
            + ", ".join(f"{k} = {v}" for k, v in info.items() if not isinstance(v, (list, dict))),
            f"- BLEU-1 / ROUGE-1 (percent): top {result['overlap_k']} retrieved from the training set"
            + (f" and from the {result['corpus_size']:,}-caption corpus" if result.get("corpus_size") else "")
            + "; R@K (percent) and MedR: within the test set; 'chance' = expected value of a random ranking",
            "- training time per fold: " + ", ".join(
                f"{METHOD_LABELS[m]} {result['results'][m].get('train_seconds', float('nan')):.1f} s"
                for m in result["methods"])]
    for m in result["methods"]:
        extra = result["method_params"].get(m) or {}
        c = result["results"][m].get("C")
        if extra or c is not None:
            out.append(f"- {METHOD_LABELS[m]}: " + ", ".join(f"{k} = {v}" for k, v in extra.items())
                       + (f"{'; ' if extra else ''}C used: {_c_text(c)}" if c is not None else ""))
    return "\n".join(out) + "\n"
