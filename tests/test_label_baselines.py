"""The label baselines of the BITR paper (Experiments 3 and 4): weighted kNN label transfer (``wknn``) and
one-vs-rest linear SVMs (``svm``), image <-> label metrics both ways (``label_retrieval_metrics``), their cards,
their state, their errors and a run through the engine."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import _engine_helpers as H
from crossview.core.errors import CrossViewError
from crossview.core.events import Finished, Log, Progress, Validation
from crossview.data.method_data import MethodData
from crossview.eval.protocols import label_retrieval_metrics
from crossview.methods import Method, create_method, list_methods, method_card, method_class


def _data(X, sets, names, name="train", captions=None, caption_image=None) -> MethodData:
    captions = captions or []
    ci = np.zeros(0, np.int64) if caption_image is None else np.asarray(caption_image)
    return MethodData(image_features=np.asarray(X, np.float32), text_features=None, captions=captions,
                      caption_image=ci, label_sets=sets, label_set_names=names, name=name)


def _clustered(n: int = 300, L: int = 20, p: int = 32, n_clusters: int = 10, seed: int = 0,
               name: str = "train") -> MethodData:
    """Images around ``n_clusters`` centres; each cluster has 3 labels of its own, each kept with probability
    0.8, plus a random label for 20 % of the images."""
    rng, crng = np.random.default_rng(seed), np.random.default_rng(99)
    centres = crng.normal(size=(n_clusters, p))
    own = [crng.choice(L, size=3, replace=False).tolist() for _ in range(n_clusters)]
    c = rng.integers(0, n_clusters, size=n)
    X = centres[c] + 0.7 * rng.normal(size=(n, p))
    sets = []
    for ci in c:
        s = {lab for lab in own[ci] if rng.random() < 0.8} or {own[ci][0]}
        if rng.random() < 0.2:
            s.add(int(rng.integers(L)))
        sets.append(sorted(s))
    return _data(X, sets, [f"label{i:02d}" for i in range(L)], name=name)


# ---------------------------------------------------------------------------- registry and cards
def test_registered_with_cards_holding_the_papers_numbers() -> None:
    assert {"wknn", "svm"} <= set(list_methods())
    assert method_class("wknn").name == "wknn" and method_class("svm").name == "svm"
    assert type(create_method("wknn")).__module__ == "crossview.methods.wknn"
    want = {  # Table 5 (phrases) and Table 6 (labels) of paper 001: (i2t P@5, mAP, t2i P@5, mAP)
        "wknn": {"Table 5": (8.38, 4.23, 2.04, 2.98), "Table 6": (19.31, 19.78, 8.25, 4.30)},
        "svm": {"Table 5": (6.85, 5.12, 1.92, 2.44), "Table 6": (19.15, 19.41, 5.22, 3.13)},
    }
    for name, tables in want.items():
        card = method_card(name)
        assert card.paper == "001_637cb05c9b729668.txt" and card.title and card.summary
        assert set(card.params) == set(method_class(name).param_names())
        assert card.params["target"].choices == ("label_sets", "labels", "tags")
        for table, (ip5, imap, tp5, tmap) in tables.items():
            rows = {r["direction"]: r for r in card.paper_results if r["table"] == table}
            assert {r["dataset"] for r in rows.values()} == {"IAPR TC-12"}
            assert rows["i2t"]["metrics"] == {"P@5": ip5, "mAP": imap}
            assert rows["t2i"]["metrics"] == {"P@5": tp5, "mAP": tmap}


# ---------------------------------------------------------------------------- wKNN by hand
_W = np.exp([0.0, -2.0, -4.0]) / np.exp([0.0, -2.0, -4.0]).sum()     # 0.866813, 0.117310, 0.015876


def _toy_knn():
    train = _data([[1, 0], [1.6, 1.2], [0.6, 0.8], [0, 5], [-1, 0], [1, 0.01]],
                  [[0], [0, 1], [2], [1], [3], []], ["a", "b", "c", "d"])
    queries = _data([[2, 0], [0, 3]], [[0], [1]], ["a", "b", "c", "d"], name="test")
    return train, queries


def test_wknn_scores_worked_by_hand() -> None:
    """Five labelled training images (and one unlabelled, x6, which is left out), labels a, b, c, d:

        x1 = (1, 0) {a}, x2 = (1.6, 1.2) {a, b}, x3 = (0.6, 0.8) {c}, x4 = (0, 5) {b}, x5 = (-1, 0) {d}.

    k = 3, T = 0.1, cosine similarity. Query q1 = (2, 0): cosines 1, 0.8, 0.6, 0, -1, so the neighbours are
    x1, x2, x3 with weights exp(s / T) normalised = (1, e^-2, e^-4) / (1 + e^-2 + e^-4)
    = (0.866813, 0.117310, 0.015876) =: (w1, w2, w3), and

        score(q1, a) = w1 + w2 = 0.984124, b = w2 = 0.117310, c = w3 = 0.015876, d = 0.

    Query q2 = (0, 3): cosines 0, 0.6, 0.8, 1, 0: neighbours x4, x3, x2 with the same weights, so
    a = w3 = 0.015876, b = w1 + w3 = 0.882690, c = w2 = 0.117310, d = 0.
    With T -> infinity the weights are 1/3 each (plain voting): q1 scores a 2/3, b 1/3, c 1/3, d 0.
    """
    train, queries = _toy_knn()
    w1, w2, w3 = _W
    assert (w1, w2, w3) == pytest.approx((0.866813, 0.117310, 0.015876), abs=1e-6)
    m = create_method("wknn", k=3, temperature=0.1).fit(train)
    assert m.label_names_ == ["a", "b", "c", "d"] and m.n_train_ == 5
    want = np.array([[w1 + w2, w2, w3, 0.0], [w3, w1 + w3, w2, 0.0]])
    got = m.label_scores(queries)
    assert got.dtype == np.float32 and got.shape == (2, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    ids, weights = m.neighbours(np.asarray([[1.0, 0.0], [0.0, 1.0]], np.float32))
    np.testing.assert_array_equal(ids, [[0, 1, 2], [3, 2, 1]])
    np.testing.assert_allclose(weights, [_W, _W], rtol=1e-5)
    # Im2Text ranks a row, Text2Im ranks a column; both rankings are right here
    res = m.evaluate_labels(queries, ks=(1,))
    assert res["P@1"] == 100.0 and res["mAP"] == 100.0 and res["t2i"]["mAP"] == 100.0
    assert res["t2i"]["n_excluded"] == 2          # labels c and d: no query image has them
    # plain voting in the limit of a large temperature
    vote = create_method("wknn", k=3, temperature=1e9).fit(train).label_scores(queries)
    np.testing.assert_allclose(vote[0], [2 / 3, 1 / 3, 1 / 3, 0.0], rtol=1e-5)
    # minus half the squared distance on unit vectors = the cosine minus 1: the same weights
    unit = _data(train.image_features / np.linalg.norm(train.image_features, axis=1, keepdims=True),
                 train.label_sets, train.label_set_names)
    unit_q = _data([[1, 0], [0, 1]], queries.label_sets, queries.label_set_names, name="test")
    euclid = create_method("wknn", k=3, temperature=0.1, normalize="none").fit(unit).label_scores(unit_q)
    np.testing.assert_allclose(euclid, want, rtol=1e-5, atol=1e-7)
    # k larger than the training set: every labelled training image is a neighbour
    big = create_method("wknn", k=99, temperature=0.1)
    logs = [e.message for e in big.fit_iter(train) if isinstance(e, Log)]
    assert "k = 5 (k capped from 99)" in logs[0] and "1 unlabelled training image(s) left out" in logs[0]
    d = big.label_scores(queries)[0, 3]                # x5 {d} is now a neighbour of q1: cosine -1
    assert d == pytest.approx(np.exp(-20.0) / (1 + np.exp(-2.0) + np.exp(-4.0) + np.exp(-10.0) + np.exp(-20.0)),
                              rel=1e-4)


def test_wknn_scores_of_a_query_sum_the_label_counts_of_its_neighbourhood() -> None:
    """Weights sum to 1 per query, so sum over labels of score = the weighted mean label-set size."""
    data = _clustered(n=120, seed=3)
    m = create_method("wknn", k=7).fit(data)
    test = _clustered(n=40, seed=4, name="test")
    X = test.image_features / np.linalg.norm(test.image_features, axis=1, keepdims=True)
    ids, w = m.neighbours(X.astype(np.float32))
    sizes = np.diff(m.label_indptr_)
    np.testing.assert_allclose(m.label_scores(test).sum(axis=1), (w * sizes[ids]).sum(axis=1), rtol=1e-5)
    assert np.all(np.diff(w, axis=1) <= 1e-12)      # nearest first


# ---------------------------------------------------------------------------- SVM against scikit-learn
def test_svm_equals_linear_svcs_fitted_directly() -> None:
    from sklearn.svm import LinearSVC

    from crossview.methods.svm import _fit_label

    data = _clustered(n=90, L=6, p=8, n_clusters=4, seed=1)
    # a label every training image has: no negatives, a constant score +1
    data.label_sets = [sorted(set(s) | {5}) for s in data.label_sets]
    m = create_method("svm", C=0.5).fit(data)
    X = data.image_features / np.linalg.norm(data.image_features, axis=1, keepdims=True)
    Y = np.zeros((len(X), 6), dtype=int)
    for i, s in enumerate(data.label_sets):
        Y[i, s] = 1
    test = _clustered(n=30, L=6, p=8, n_clusters=4, seed=2, name="test")
    Xt = test.image_features / np.linalg.norm(test.image_features, axis=1, keepdims=True)
    for j, name in enumerate(m.label_names_):
        assert name == f"label{j:02d}"
        if j == 5:
            np.testing.assert_array_equal(m.coef_[j], 0.0)
            assert m.intercept_[j] == 1.0
            continue
        clf = LinearSVC(loss="hinge", dual=True, C=0.5, max_iter=1000, random_state=0).fit(X, Y[:, j])
        np.testing.assert_allclose(m.coef_[j], clf.coef_[0], rtol=1e-5, atol=1e-6)
        assert m.intercept_[j] == pytest.approx(clf.intercept_[0], rel=1e-5, abs=1e-6)
        np.testing.assert_allclose(m.label_scores(test)[:, j], clf.decision_function(Xt), rtol=1e-4, atol=1e-5)
    assert m.C_ == 0.5 and m.cv_grid_.size == 0 and m.n_train_ == 90
    # a label without positives (possible in a cross-validation fold): w = 0, b = -1
    w, b, stopped = _fit_label(X, np.zeros(len(X), bool), 1.0, 10, 0)
    assert not w.any() and b == -1.0 and not stopped
    # threads give the same model up to liblinear's coordinate order: its random generator is one C-level state
    # shared by threads fitting at once (seen on a loaded machine: 1e-5 apart), so equal to a tolerance, not bits
    m2 = create_method("svm", C=0.5).with_run(n_jobs=2).fit(data)
    np.testing.assert_allclose(m2.coef_, m.coef_, rtol=1e-3, atol=1e-4)


def test_svm_cross_validates_c() -> None:
    data = _clustered(n=120, L=8, p=16, n_clusters=5, seed=5)
    m = create_method("svm", c_grid="1e-5,1", cv_folds=3)
    events = list(m.fit_iter(data))
    logs = [e.message for e in events if isinstance(e, Log)]
    assert len([t for t in logs if "mean held-out i2t mAP" in t]) == 2
    assert m.C_ == 1.0 and m.cv_grid_.tolist() == [1e-5, 1.0]
    assert m.cv_scores_[1] > m.cv_scores_[0] + 10        # C = 1e-5 leaves w ~ 0: near-constant scores
    progress = [e for e in events if isinstance(e, Progress)]
    assert progress[-1].step == progress[-1].total == (2 * 3 + 1) * 8
    assert "C = 1 (best of 2 by 3-fold cross-validation)" in logs[-1]
    # C="cv" is the paper's grid, five folds
    cv = create_method("svm", C="cv")
    assert cv._grid() == tuple(10.0 ** e for e in range(-5, 6)) and cv.cv_folds == 5
    from crossview.methods.svm import parse_c_grid
    assert parse_c_grid("1e-2:1e1") == (0.01, 0.1, 1.0, 10.0) and parse_c_grid("paper") == cv._grid()
    assert parse_c_grid(None) == () and parse_c_grid("10, 0.1") == (0.1, 10.0)


# ---------------------------------------------------------------------------- the metrics
def _naive(scores: np.ndarray, rel: np.ndarray, ks) -> dict:
    out = {}
    for d, (S, R) in {"i2t": (scores, rel), "t2i": (scores.T, rel.T)}.items():
        p = {k: [] for k in ks if k <= S.shape[1]}
        aps, excluded = [], 0
        for s, r in zip(S, R):
            if not r.any():
                excluded += 1
                continue
            order = sorted(range(len(s)), key=lambda j: (-s[j], j))     # ties: smaller index first
            hits = r[order]
            for k in p:
                p[k].append(hits[:k].sum() / k)
            ranks = np.flatnonzero(hits) + 1
            aps.append(np.mean([(i + 1) / rank for i, rank in enumerate(ranks)]))
        out[d] = {**{f"P@{k}": 100 * np.mean(v) for k, v in p.items()}, "mAP": 100 * np.mean(aps),
                  "n_queries": len(aps), "n_excluded": excluded}
    return out


def test_label_retrieval_metrics_by_hand() -> None:
    """3 images x 4 labels; image 2 has no label (no i2t query), label 3 no image (no t2i query).

    i2t: image 0 ranks l0, l2, l1, l3 -> its label l2 at rank 2: P@1 0, P@2 1/2, AP 1/2; image 1 ranks
    l1, l2, l0, l3 -> l1 at 1, l0 at 3: P@1 1, P@2 1/2, AP (1 + 2/3) / 2 = 5/6. Means: P@1 50, P@2 50,
    mAP 66.67. t2i: l0 ranks images 0, 1, 2 -> image 1 at 2 (AP 1/2, P@1 0); l1 ranks 1, 0, 2 -> at 1 (AP 1);
    l2 ranks 0, 1, 2 -> image 0 at 1 (AP 1). P@1 66.67, P@2 50, mAP 83.33. P@5 exceeds both galleries."""
    scores = np.array([[0.9, 0.1, 0.5, 0.05],
                       [0.2, 0.8, 0.3, 0.05],
                       [0.0, 0.0, 0.0, 0.9]])
    rel = np.array([[0, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=bool)
    res = label_retrieval_metrics(scores, rel, ks=(1, 2, 5))
    assert res["i2t"] == pytest.approx({"P@1": 50.0, "P@2": 50.0, "mAP": 200 / 3, "n_queries": 2, "n_excluded": 1})
    assert res["t2i"] == pytest.approx({"P@1": 200 / 3, "P@2": 50.0, "mAP": 250 / 3, "n_queries": 3,
                                        "n_excluded": 1})
    with pytest.raises(CrossViewError, match="no image has a relevant label"):
        label_retrieval_metrics(scores, np.zeros_like(rel))


def test_label_retrieval_metrics_equal_a_naive_loop() -> None:
    rng = np.random.default_rng(0)
    for trial in range(5):
        n, L = int(rng.integers(5, 40)), int(rng.integers(3, 15))
        scores = rng.integers(0, 4, size=(n, L)).astype(np.float32)      # many ties
        rel = rng.random((n, L)) < 0.25
        rel[0] = False                                                     # an image without labels
        if not rel.any():
            rel[1, 0] = True
        got = label_retrieval_metrics(scores, rel, ks=(1, 3, 5))
        want = _naive(scores, rel, (1, 3, 5))
        for d in ("i2t", "t2i"):
            assert got[d] == pytest.approx(want[d]), (trial, d)


# ---------------------------------------------------------------------------- learning
@pytest.mark.parametrize("name,params", [("wknn", {"k": 10}), ("svm", {})])
def test_learns_on_clustered_data(name: str, params: dict) -> None:
    train, test = _clustered(seed=0), _clustered(n=100, seed=1, name="test")
    m = create_method(name, **params)
    events = list(m.fit_iter(train, test))
    vals = [e for e in events if isinstance(e, Validation)]
    assert len(vals) == 1 and {"P@1", "P@5", "mAP"} <= set(vals[0].metrics["i2t"])
    res = m.evaluate_labels(test)
    # chance, both ways: the mean share of the 20 labels an image has = the mean share of images a label has
    chance = 100.0 * np.mean([len(s) for s in test.label_sets]) / 20
    print(name, res, "chance P@K", chance)
    assert res["P@1"] > 3 * chance and res["mAP"] > 60, res
    assert res["t2i"]["P@5"] > 3 * chance and res["t2i"]["mAP"] > 50, res
    assert vals[0].metrics["i2t"]["mAP"] == pytest.approx(res["mAP"])
    scores = m.label_scores(test)
    assert scores.shape == (100, 20) and scores.dtype == np.float32


@pytest.mark.parametrize("name", ["wknn", "svm"])
def test_class_labels_as_target(name: str) -> None:
    """``target="labels"``: one class label per image (Experiment 4 with single labels); names are the
    dataset's label names or the label values."""
    def with_classes(seed: int, n: int, split: str) -> MethodData:
        d = _clustered(n=n, seed=seed, name=split)
        d.labels = np.argmax(d.image_features @ np.random.default_rng(99).normal(size=(10, 32)).T, axis=1)
        d.label_sets = None
        return d

    train, test = with_classes(0, 200, "train"), with_classes(1, 60, "test")
    m = create_method(name, target="labels").fit(train)
    assert m.label_names_ == sorted({str(int(v)) for v in train.labels})
    res = m.evaluate_labels(test)
    assert res["P@1"] > 60 and res["n_excluded"] == 0, res


def test_wsabie_label_scores_are_its_image_and_label_embeddings() -> None:
    data = _clustered(n=60, L=5, p=8, n_clusters=3, seed=7)
    m = create_method("wsabie", target="label_sets", dim=4, max_epochs=1).with_run(device="cpu").fit(data)
    s = m.label_scores(data)
    assert s.shape == (60, 5) and s.dtype == np.float32
    np.testing.assert_allclose(s, m.encode_images(data) @ m.encode_labels().T, rtol=1e-6)
    np.testing.assert_allclose(m.evaluate_labels(data)["mAP"],
                               label_retrieval_metrics(s, _relevance(data), ks=())["i2t"]["mAP"], rtol=1e-9)


def _relevance(data: MethodData) -> np.ndarray:
    rel = np.zeros((data.n_images, len(data.label_set_names)), dtype=bool)
    for i, s in enumerate(data.label_sets):
        rel[i, s] = True
    return rel


# ---------------------------------------------------------------------------- captions through label names
@pytest.mark.parametrize("name", ["wknn", "svm"])
def test_captions_score_through_the_labels_they_name(name: str) -> None:
    train = _clustered(n=80, L=4, p=8, n_clusters=4, seed=2)
    train.label_set_names = ["red ball", "dog", "grass", "sky"]
    caps = ["a dog's red ball on the grass", "the sky", "nothing known here"]
    data = _data(train.image_features[:3], train.label_sets[:3], train.label_set_names, name="test",
                 captions=caps, caption_image=[0, 1, 2])
    m = create_method(name).fit(train)
    assert m.label_names_ == ["dog", "grass", "red ball", "sky"]        # sorted vocabulary
    img, txt = m.encode_images(data), m.encode_texts(data)
    np.testing.assert_array_equal(img, m.label_scores(data))
    np.testing.assert_allclose(txt, [[1 / 3, 1 / 3, 1 / 3, 0], [0, 0, 0, 1], [0, 0, 0, 0]])
    np.testing.assert_allclose(m.scores(data)[:, 0], img[:, :3].mean(axis=1), rtol=1e-6)
    assert set(m.evaluate(data, ks=(1,))) >= {"i2t", "t2i", "rsum", "ranks"}


# ---------------------------------------------------------------------------- state
@pytest.mark.parametrize("name,params", [("wknn", {"k": 5, "normalize": "none"}), ("svm", {"C": 2.0})])
def test_state_round_trips(tmp_path, name: str, params: dict) -> None:
    train, test = _clustered(n=80, seed=8), _clustered(n=20, seed=9, name="test")
    m = create_method(name, **params).fit(train)
    state = m.state_dict()
    for k, v in state["state"].items():     # plain arrays and values only: checkpoints hold no code
        assert isinstance(v, (np.ndarray, list, int, float, str)), (k, type(v))
    again = create_method(name).load_state_dict(state)
    assert again.get_params() == m.get_params()
    np.testing.assert_array_equal(again.label_scores(test), m.label_scores(test))
    path = m.save(tmp_path / "m.pt")
    loaded = Method.load(path)                  # weights-only checkpoint
    assert type(loaded) is type(m)
    np.testing.assert_array_equal(loaded.label_scores(test), m.label_scores(test))


# ---------------------------------------------------------------------------- errors a user can act on
def _one_line_error(fn, match: str) -> None:
    with pytest.raises(CrossViewError, match=match) as info:
        fn()
    assert "\n" not in str(info.value), str(info.value)


def test_bad_params_and_data_give_one_line() -> None:
    train = _clustered(n=40, seed=1)
    no_sets = MethodData(image_features=train.image_features, text_features=None, captions=[],
                         caption_image=np.zeros(0, np.int64), name="train")
    fit = lambda name, data=train, **p: create_method(name, **p).fit(data)      # noqa: E731
    _one_line_error(lambda: fit("wknn", k=0), r"wknn: k must be a whole number >= 1")
    _one_line_error(lambda: fit("wknn", k=2.5), r"wknn: k must be a whole number")
    _one_line_error(lambda: fit("wknn", temperature=-1.0), r"wknn: temperature must be a positive number")
    _one_line_error(lambda: fit("wknn", temperature=math.inf), r"wknn: temperature must be a positive number")
    for name in ("wknn", "svm"):
        _one_line_error(lambda: fit(name, target="captions"), rf"{name}: target 'captions' is not one of "
                                                                 rf"label_sets, labels, tags \({name} ranks labels")
        _one_line_error(lambda: fit(name, normalize="l1"), rf"{name}: normalize 'l1' must be 'l2' or 'none'")
        _one_line_error(lambda: fit(name, data=no_sets), rf"{name} target 'label_sets' needs per-image label sets "
                                                         "but the train data has none")
        _one_line_error(lambda: create_method(name).label_scores(train), "is not fitted yet")
        _one_line_error(lambda: fit(name, target="tags"), "needs per-image tags")
        m = create_method(name).fit(train)
        wrong = _data(train.image_features[:, :5], train.label_sets, train.label_set_names, name="test")
        _one_line_error(lambda: m.label_scores(wrong), rf"{name}: the model expects 32-d image features, the test "
                                                        "data has 5-d")
        empty = _data(train.image_features[:3], [[], [], []], train.label_set_names, name="test")
        _one_line_error(lambda: m.evaluate_labels(empty), "no image of the test data has a label the model knows")
        _one_line_error(lambda: fit(name, data=empty), "no image of the test data has a label")
    _one_line_error(lambda: fit("svm", C=-1.0), r"svm: C must be a positive number or 'cv'")
    _one_line_error(lambda: fit("svm", C="lots"), r"svm: C must be a positive number or 'cv'")
    _one_line_error(lambda: fit("svm", c_grid="1:0.1"), r"svm: c_grid range '1:0.1' must be 'LOW:HIGH'")
    _one_line_error(lambda: fit("svm", c_grid="a,b"), r"svm: c_grid 'a,b' must be 'paper'")
    _one_line_error(lambda: fit("svm", cv_folds=1, c_grid="1"), r"svm: cv_folds must be a whole number >= 2")
    _one_line_error(lambda: create_method("svm").with_run(n_jobs=0).fit(train),
                    r"svm: workers must be a whole number >= 1")
    _one_line_error(lambda: fit("svm", n_jobs=2), r"n_jobs is a run setting, not a parameter of method 'svm'.*"
                                                  r"with_run\(workers=\.\.\.\)")
    few = _data(train.image_features[:3], train.label_sets[:3], train.label_set_names)
    _one_line_error(lambda: fit("svm", data=few, c_grid="1"), r"5-fold cross-validation of C needs at least 5")
    # the engine checks the parameters before extracting anything
    from crossview.engine.run import train as run_train
    ds = H.make_toy_dataset(n_images=40)
    _one_line_error(lambda: run_train("svm", ds, run_dir="/nonexistent/never-created", features=H.toy_features(ds),
                                      params={"C": 0}, device="cpu"), "svm: C must be a positive number")


# ---------------------------------------------------------------------------- through the engine
@pytest.fixture(scope="module")
def labelled_toy():
    """The engine tests' toy dataset with label sets: each image's class and shape words, which its captions
    contain, so caption retrieval through the label names works too."""
    ds = H.make_toy_dataset()
    sets = [[f"class{k}", f"shape{k}"] for k in ds.labels.tolist()]
    return dataclasses.replace(ds, label_sets=sets)


@pytest.mark.parametrize("name,params", [("wknn", {"k": 10}), ("svm", {"c_grid": "0.1,10", "cv_folds": 3})])
def test_a_run_through_the_engine(tmp_path, labelled_toy, name: str, params: dict) -> None:
    from crossview.engine.run import read_summary, train

    ds = labelled_toy
    image, _ = H.toy_features(ds)
    events = list(train(name, ds, run_dir=tmp_path / "run", features=(image, None), params=params, device="cpu"))
    assert isinstance(events[-1], Finished)
    vals = [e for e in events if isinstance(e, Validation)]
    assert len(vals) == 1 and vals[0].metrics["i2t"]["P@1"] > 80, vals
    summary = read_summary(tmp_path / "run")
    assert summary["method"] == name and summary["i2t"]["R@10"] > 50     # captions name their class
    m = Method.load(tmp_path / "run" / "checkpoint.pt")
    assert m.name == name and m.label_names_ == sorted({x for s in ds.label_sets for x in s})
    from crossview.methods.base import MethodData as MD
    test = MD.from_features(ds, image, None, "test")
    res = m.evaluate_labels(test)
    assert res["P@1"] > 80 and res["t2i"]["mAP"] > 60, res


@pytest.mark.parametrize("method", ["wknn", "svm"])
def test_a_label_method_on_data_without_labels_is_refused_before_a_folder_is_made(method, tmp_path) -> None:
    """A start that could never train leaves nothing behind (it used to leave a '[failed]' run in the list)."""
    from _engine_helpers import make_toy_dataset
    from crossview.engine.run import train

    ds = make_toy_dataset(n_images=40)
    assert ds.label_sets is None
    rng = np.random.default_rng(0)
    feats = (rng.standard_normal((ds.n_images, 8)).astype(np.float32),
             rng.standard_normal((ds.n_captions, 8)).astype(np.float32))
    with pytest.raises(CrossViewError, match="needs per-image label sets but dataset"):
        train(method, ds, run_dir=tmp_path / "run", features=feats, device="cpu")
    assert not (tmp_path / "run").exists()
