"""Experiment 1 of the BITR paper (crossview.experiments.bitr_table and `crossview experiment bitr-table`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crossview.cli import main
from crossview.data.dataset import PairedDataset
from crossview.core.errors import CrossViewError
from crossview.eval.overlap import SentenceOverlap
from crossview.experiments import bitr_table as B
from crossview.features import FeatureCache
from crossview.methods.base import Method, MethodData

COLOURS = ["red", "green", "blue", "yellow"]
SHAPES = ["circle", "square", "star"]
PLACES = ["beach", "forest", "city"]


def _captions(c: str, s: str, p: str) -> list[str]:
    return [f"a {c} {s} at the {p}", f"the {s} is {c}", f"{c} {s} near a {p}", f"a {s} in the {p}",
            f"something {c} by the {p}"]


def _images(rng: np.random.Generator, n: int, mix: np.ndarray) -> tuple[np.ndarray, list[str]]:
    feats, caps = [], []
    for _ in range(n):
        c, s, p = rng.integers(0, 4), rng.integers(0, 3), rng.integers(0, 3)
        onehot = np.zeros(10, np.float32)
        onehot[[c, 4 + s, 7 + p]] = 1.0
        feats.append((onehot + 0.3 * np.abs(rng.standard_normal(10))) @ mix)
        caps += _captions(COLOURS[c], SHAPES[s], PLACES[p])
    return np.asarray(feats, np.float32), caps


@pytest.fixture(scope="module")
def precomp(tmp_path_factory) -> Path:
    """A tiny VSE++-style precomp folder: 60 train / 12 val / 40 test images, 5 captions each; the image
    features are a noisy non-negative mix of the colour, shape and place one-hots the captions name."""
    folder = tmp_path_factory.mktemp("tiny_precomp")
    rng = np.random.default_rng(0)
    mix = np.abs(rng.standard_normal((10, 16))).astype(np.float32)
    for prefix, n in (("train", 60), ("dev", 12), ("test", 40)):
        feats, caps = _images(rng, n, mix)
        np.save(folder / f"{prefix}_ims.npy", feats)
        (folder / f"{prefix}_caps.txt").write_text("\n".join(caps) + "\n", encoding="utf-8")
    corpus = [c for col in COLOURS for s in SHAPES for p in PLACES for c in _captions(col, s, p)[:2]]
    (folder / "corpus.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def tiny(precomp) -> PairedDataset:
    from crossview.data import load_dataset
    return load_dataset(precomp)


# Small settings for a small set: WSABIE needs more, smaller steps; BITR a larger C than its default, outputs
# on the sphere (L2) for every loss, and a cheaper search for the M loss's most violated constraint.
FAST = {"wsabie": {"batch_size": 32, "lr": 0.02, "max_epochs": 10, "dim": 16},
        "bitr": {"pca_dim": 0, "max_iter": 200, "C": 100.0, "normalize": "l2", "mv_starts": 2, "mv_steps": 10}}


# ---------------------------------------------------------------------------------- protocol pieces
def test_folds_partition_all_images_and_splits_train_on_train(tiny):
    folds, desc = B.make_folds(tiny, folds=4, seed=1)
    assert len(folds) == 4 and "4 folds" in desc
    tests = np.concatenate([f.test for f in folds])
    np.testing.assert_array_equal(np.sort(tests), np.arange(tiny.n_images))   # each image tested once
    for f in folds:
        assert not set(f.train) & set(f.test) and len(f.train) + len(f.test) == tiny.n_images
    (fold,), desc = B.make_folds(tiny, split="test")
    np.testing.assert_array_equal(fold.test, tiny.splits["test"])
    np.testing.assert_array_equal(fold.train, tiny.splits["train"])
    np.testing.assert_array_equal(fold.val, tiny.splits["val"])
    (fold,), _ = B.make_folds(tiny, split="val")       # testing on val: no validation data for the methods
    assert fold.val is None and not set(fold.train) & set(fold.test)
    assert B.make_folds(tiny)[0][0].name == "test"      # default: the test split when there is one
    for kw, msg in (({"folds": 3, "split": "test"}, "not both"), ({"split": "train"}, "training images"),
                    ({"split": "nope"}, "no split 'nope'"), ({"folds": 60}, "too few for 60 folds"),
                    ({"folds": 1}, "at least 2")):
        with pytest.raises(CrossViewError, match=msg):
            B.make_folds(tiny, **kw)


def test_chance_levels_hand_values_and_monte_carlo():
    # 4 images x 2 captions + 2 images x 1 caption: N = 10 captions, M = 6 images.
    ci = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 5])
    data = MethodData(image_features=np.zeros((6, 1)), text_features=np.zeros((10, 1)),
                      captions=[str(i) for i in range(10)], caption_image=ci)
    ch = B.chance_levels(data, ks=(3,))
    # P(a 2-caption image has one in the top 3) = 1 - C(8,3)/C(10,3) = 1 - 56/120; 1-caption: 3/10.
    expect = (4 * (1 - 56 / 120) + 2 * 0.3) / 6
    assert ch["i2t"]["R@3"] == pytest.approx(100 * expect)
    assert ch["t2i"]["R@3"] == pytest.approx(50.0)
    # Median best rank: 2 golds -> 3 (P(rank <= 3) = 0.533 >= 0.5 > P(rank <= 2) = 0.378); 1 gold -> 5.
    assert ch["i2t"]["MedR"] == pytest.approx((4 * 3 + 2 * 5) / 6)
    rng = np.random.default_rng(0)
    hits = [np.min(rng.permutation(10)[:2]) < 3 for _ in range(20000)]
    assert np.mean(hits) == pytest.approx(1 - 56 / 120, abs=0.01)


class Features(Method):
    """A fitted 'method' scoring by the dot product of the features themselves."""

    name = "features-test"

    def fit_iter(self, train, val=None, *, resume=False):
        self.fitted_ = True
        yield from ()

    def encode_images(self, data, direction="i2t"):
        return data.image_features

    def encode_texts(self, data, direction="i2t"):
        return data.text_features


def test_overlap_metrics_match_a_naive_loop():
    rng = np.random.default_rng(3)
    words = ["dog", "cat", "runs", "sits", "grass", "sofa", "a", "the"]

    def data(n_img: int, name: str) -> MethodData:
        caps = [" ".join(rng.choice(words, 5)) for _ in range(2 * n_img)]
        return MethodData(image_features=rng.standard_normal((n_img, 4)), text_features=rng.standard_normal(
            (2 * n_img, 4)), captions=caps, caption_image=np.repeat(np.arange(n_img), 2), name=name)

    train, test, corpus = data(7, "train"), data(4, "test"), data(5, "corpus")
    got = B.evaluate_fold(Features().fit(train), train, test, ks=(3,), corpus=corpus, overlap_k=2)
    sc = SentenceOverlap()
    refs = lambda d, i: [d.captions[c] for c in np.flatnonzero(d.caption_image == i)]  # noqa: E731
    rows = []
    for i in range(4):                                    # Im2Text: top-2 training captions per test image
        order = np.argsort(-(test.image_features[i] @ train.text_features.T), kind="stable")[:2]
        rows += [sc(train.captions[c], refs(test, i)) for c in order]
    assert got["i2t"]["BLEU-1"] == pytest.approx(np.mean([r["BLEU-1"] for r in rows]))
    assert got["i2t"]["ROUGE-1"] == pytest.approx(100 * np.mean([r["ROUGE-1"] for r in rows]))
    rows = []
    for j in range(8):                                    # Text2Im: query caption vs top-2 training images
        order = np.argsort(-(train.image_features @ test.text_features[j]), kind="stable")[:2]
        rows += [sc(test.captions[j], refs(train, i)) for i in order]
    assert got["t2i"]["BLEU-1"] == pytest.approx(np.mean([r["BLEU-1"] for r in rows]))
    assert got["t2i"]["ROUGE-1"] == pytest.approx(100 * np.mean([r["ROUGE-1"] for r in rows]))
    rows = []
    for i in range(4):                                    # corpus: top-2 corpus captions per test image
        order = np.argsort(-(test.image_features[i] @ corpus.text_features.T), kind="stable")[:2]
        rows += [sc(corpus.captions[c], refs(test, i)) for c in order]
    assert got["corpus_i2t"]["BLEU-1"] == pytest.approx(np.mean([r["BLEU-1"] for r in rows]))
    # Retrieval metrics are the method's own evaluation on the test set.
    ev = Features().fit(train).evaluate(test, ks=(3,))
    assert got["i2t"]["R@3"] == ev["i2t"]["R@3"] and got["t2i"]["MedR"] == ev["t2i"]["MedR"]


# ---------------------------------------------------------------------------------- the whole table
@pytest.fixture(scope="module")
def table(tiny, precomp, tmp_path_factory):
    corpus = (precomp / "corpus.txt").read_text().split("\n")[:-1]
    events = list(B.run_bitr_table(
        tiny, representation="default", methods=["cca", "wsabie", "bitr-m", "bitr-e", "bitr-c", "random"],
        split="test", ks=(5, 10), corpus=corpus, method_params=FAST,
        representation_params={"text_encoder": "tfidf", "cache": FeatureCache(tmp_path_factory.mktemp("c"))},
        out=tmp_path_factory.mktemp("exp")))
    return events


def test_table_is_full_and_methods_beat_random_embeddings(table):
    from crossview.core.events import Finished, Log, Progress

    assert isinstance(table[-1], Finished) and any(isinstance(e, Progress) for e in table)
    assert any(isinstance(e, Log) and "bitr-c: trained" in e.message for e in table)
    res = table[-1].summary
    assert res["protocol"].startswith("train on 60 images") and res["corpus_size"] == 72
    rnd = res["results"]["random"]
    for m in ("cca", "wsabie", "bitr-m", "bitr-e", "bitr-c"):
        r = res["results"][m]
        for d in ("i2t", "t2i"):
            for key in ("BLEU-1", "ROUGE-1", "R@5", "R@10", "MedR"):
                assert np.isfinite(r[d][key]), (m, d, key)
            assert r[d]["R@10"] > rnd[d]["R@10"] + 15, (m, d, r[d], rnd[d])        # far above random
            assert r[d]["R@10"] > res["chance"][d]["R@10"] + 15
            assert r[d]["MedR"] < rnd[d]["MedR"]
        assert r["i2t"]["ROUGE-1"] > rnd["i2t"]["ROUGE-1"] and r["corpus_i2t"]["ROUGE-1"] > rnd["corpus_i2t"]["ROUGE-1"]
    text = B.format_table(res)
    lines = text.splitlines()
    for label in ("CCA", "WSABIE", "BITR-M", "BITR-E", "BITR-C", "random"):
        row = next(line for line in lines if line.startswith(label + " "))
        assert len(row.split()) == 1 + 2 * 5 + 2 and "-" not in row.split()[1:] and "nan" not in row
    assert "Im2Text" in text and "Text2Im" in text and "corpus (72)" in text
    md = B.format_markdown(res, "crossview experiment bitr-table --data x")
    assert "| BITR-C |" in md and "crossview experiment bitr-table --data x" in md


def test_cli_json_and_markdown(precomp, tmp_path, capsys):
    out = tmp_path / "t.md"
    rc = main(["experiment", "bitr-table", "--data", str(precomp), "--representation", "default",
               "--text-encoder", "tfidf", "--methods", "cca,random", "--folds", "3", "--k", "5",
               "--corpus", str(precomp / "corpus.txt"), "--cache-dir", str(tmp_path / "cache"),
               "--json", "--out", str(out), "--exp-dir", str(tmp_path / "exp")])
    cap = capsys.readouterr()
    assert rc == 0
    res = json.loads(cap.out)
    assert res["folds"] == 3 and res["ks"] == [5] and set(res["results"]) == {"cca", "random"}
    assert len(res["per_fold"]["cca"]) == 3
    assert res["results"]["cca"]["i2t"]["R@5"] > res["results"]["random"]["i2t"]["R@5"]
    assert "experiment 1 on" in cap.err and "fold 3/3 cca: trained" in cap.err   # events on stderr
    md = out.read_text()
    assert "--methods cca,random --k 5 --folds 3" in md and "| CCA |" in md
    assert {Path(p).name for p in res["runs"]["cca"]} == {"fold01-cca", "fold02-cca", "fold03-cca"}
    assert all((tmp_path / "exp" / f"fold0{i}-cca" / "summary.json").is_file() for i in (1, 2, 3))


def test_a_table_over_seeds_is_the_mean_of_its_builds_each_one_experiment(precomp, tmp_path, capsys):
    """--seeds builds the table once per seed (OUT/seed-S, each an ordinary, resumable experiment) and reports
    the mean over the builds with their standard deviation; a build read back alone gives that build's cells."""
    out, exp = tmp_path / "t.md", tmp_path / "exp"
    args = ["experiment", "bitr-table", "--data", str(precomp), "--representation", "default",
            "--text-encoder", "tfidf", "--methods", "cca,wsabie,random", "--split", "test", "--k", "5",
            "--cache-dir", str(tmp_path / "cache"), "--param", "wsabie.max_epochs=3", "--param", "wsabie.dim=8",
            "--seeds", "0,1,1", "--exp-dir", str(exp)]
    assert main([*args, "--json", "--out", str(out)]) == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert res["seeds"] == [0, 1] and "seed 1 (2 of 2)" not in cap.out and "seed 1: test wsabie: trained" in cap.err
    assert sorted(p.name for p in exp.iterdir()) == ["seed-0", "seed-1"]
    kw = dict(representation="default", methods=["cca", "wsabie", "random"], split="test", ks=(5,),
              method_params={"wsabie": {"max_epochs": 3, "dim": 8}},
              representation_params={"text_encoder": "tfidf", "cache": FeatureCache(tmp_path / "cache")})
    from crossview.data import load_dataset

    ds, builds = load_dataset(precomp), []
    for s in (0, 1):      # each build alone: read back from its folder, nothing trained again
        rep = {**kw["representation_params"], "seed": s}
        events, r = _drain(B.run_bitr_table(ds, seed=s, out=exp / f"seed-{s}", **{**kw, "representation_params": rep}))
        assert r is not None and not any("training" in getattr(e, "message", "") for e in events), s
        builds.append(r)
    for m in ("cca", "wsabie", "random"):
        for d in ("i2t", "t2i"):
            for key in ("R@5", "MedR", "BLEU-1"):
                a, b = builds[0]["results"][m][d][key], builds[1]["results"][m][d][key]
                assert res["results"][m][d][key] == pytest.approx((a + b) / 2), (m, d, key)
                assert res["seed_std"][m][d][key] == pytest.approx(abs(a - b) / 2), (m, d, key)
                assert [r[d][key] for r in res["per_seed"][m]] == pytest.approx([a, b])
    assert builds[0]["results"]["wsabie"] != builds[1]["results"]["wsabie"]      # the seed reached the runs
    # CCA and the random row do not depend on the seed here (one split, no learned representation): no spread
    assert res["seed_std"]["cca"]["i2t"]["R@5"] == 0
    assert {Path(p).parent.name for p in res["runs"]["wsabie"]} == {"seed-0", "seed-1"}
    # paired against the first row, from the trial runs' ranks: its differences are the table's (the runs' plain
    # ranks are what the table counted), each with an interval; the random row is not a run and is not paired
    pr = res["paired"]
    assert pr["baseline"] == "cca" and list(pr["rows"]) == ["wsabie"] and pr["n_images"] == res["test_images"]
    for d in ("i2t", "t2i"):
        got = pr["rows"]["wsabie"][d]["R@5"]
        assert got["diff"] == pytest.approx(res["results"]["wsabie"][d]["R@5"] - res["results"]["cca"][d]["R@5"])
        assert got["ci"][0] <= got["diff"] <= got["ci"][1]
    assert pr["rows"]["wsabie"]["mde"] > 0
    md = out.read_text()
    assert "--seeds 0,1,1" in md and "the mean of 2 builds" in md
    assert "Standard deviation over the 2 builds (seeds 0, 1)" in md and "mean of the builds' medians" in md
    assert "Paired against CCA on the same" in md and "| WSABIE | " in md.split("Paired against CCA")[1]
    sd_table = md.split("Standard deviation over the 2 builds")[1].split("\n\n")[1]
    assert "| WSABIE | " in sd_table and "| CCA | 0.00 | 0.00 |" in sd_table
    # the whole table again: every build is read back
    assert main(args) == 0
    cap = capsys.readouterr()
    assert "trained" not in cap.err and "finished earlier" in cap.err and "Standard deviation over the 2" in cap.out


@pytest.mark.parametrize("value, message", [("0,x", "'x' is not a whole number"), ("-1", "out of range"),
                                            (",", "no seed given")])
def test_bad_seeds_are_one_line_errors(precomp, capsys, value, message):
    rc = main(["experiment", "bitr-table", "--data", str(precomp), "--representation", "default",
               "--text-encoder", "tfidf", "--methods", "cca", "--seeds", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err


def test_seed_and_seeds_together_and_a_one_seed_folder_are_refused(precomp, tmp_path, capsys):
    base = ["experiment", "bitr-table", "--data", str(precomp), "--representation", "default", "--text-encoder",
            "tfidf", "--methods", "cca", "--split", "test", "--k", "5", "--cache-dir", str(tmp_path / "c")]
    assert main([*base, "--seed", "2", "--seeds", "0,1"]) == 2
    assert "give --seed or --seeds, not both" in capsys.readouterr().err
    assert main([*base, "--exp-dir", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    assert main([*base, "--seeds", "0,1", "--exp-dir", str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a one-seed BITR-table experiment" in err[0]
    (tmp_path / "many" / "seed-1").mkdir(parents=True)          # and a one-seed table in a several-seed folder
    (tmp_path / "many" / "seed-1" / B.EXPERIMENT_FILE).write_text("{}")
    assert main([*base, "--exp-dir", str(tmp_path / "many")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a BITR table over several seeds" in err[0]


@pytest.mark.parametrize("extra, message", [
    (["--methods", "cca,foo"], "unknown method 'foo'"),
    (["--folds", "3", "--split", "test"], "not both"),
    (["--k", "0"], "R@K needs positive whole numbers"),
    (["--param", "bitr.C"], "METHOD.NAME=VALUE"),
    (["--methods", "bitr-c", "--param", "bitr-c.loss=M"], "bitr-c fixes loss"),
    (["--param", "wsabie.lr=0.1"], "wsabie is not among the methods"),
    (["--param", "cca.nope=1"], "no parameter 'nope'"),
    (["--out", "table.txt"], "ending in .md"),
    (["--n-topics", "0"], "--n-topics must be >= 1"),
    (["--split", "train"], "training images"),
    (["--representation", "tr"], "--text-encoder only applies to --representation default"),
])
def test_bad_arguments_give_one_line_errors(precomp, tmp_path, capsys, extra, message):
    rc = main(["experiment", "bitr-table", "--data", str(precomp), "--representation", "default",
               "--text-encoder", "tfidf", "--methods", "cca", "--cache-dir", str(tmp_path), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("crossview: error:") and message in err[0], err


def test_corpus_as_data_and_topics_without_images_are_refused(precomp, capsys):
    rc = main(["experiment", "bitr-table", "--data", str(precomp / "corpus.txt")])
    err = capsys.readouterr().err
    assert rc == 2 and "caption corpus without images" in err and "--corpus" in err
    rc = main(["experiment", "bitr-table", "--data", str(precomp), "--representation", "ctr"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "use --representation modern or default" in err[0]


def test_paper_numbers_come_from_the_cards():
    cards = pytest.importorskip("crossview.methods.cards")
    if cards.find_card("wsabie") is None:
        pytest.skip("models/wsabie.toml is not there")
    modern = B.paper_numbers("modern", ["wsabie"])
    assert modern["rows"]["wsabie"]["i2t"]["R@50"] == pytest.approx(35.40)      # Table 7, Pascal
    assert modern["rows"]["wsabie"]["t2i"]["MedR"] == pytest.approx(33.45)
    ctr = B.paper_numbers("ctr", ["wsabie", "random"])
    assert ctr["rows"]["wsabie"]["i2t"]["R@50"] == pytest.approx(13.50)         # Table 2, Pascal CTR
    assert "random" not in ctr["rows"]
    if cards.find_card("bitr") is not None:                                      # one row per loss
        rows = B.paper_numbers("modern", ["bitr-m", "bitr-c"])["rows"]
        assert rows["bitr-c"]["i2t"]["R@50"] == pytest.approx(75.10) and rows["bitr-c"]["i2t"]["MedR"] == 18.75
        assert rows["bitr-m"]["i2t"]["R@50"] == pytest.approx(70.50)


# ---------------------------------------------------------------------------------- trials are runs
TFIDF = {"text_encoder": "tfidf"}


def _drain(gen):
    events = list(gen)
    return events, next((e.summary for e in events if type(e).__name__ == "Finished"), None)


def test_fold_splits_are_kfold_partitions_and_reproducible():
    from sklearn.model_selection import KFold

    from crossview.engine.splits import fold_splits

    a, b = fold_splits(23, 4, seed=5), fold_splits(23, 4, seed=5)
    assert len(a) == 4
    for (tr, te), (tr2, te2) in zip(a, b):                      # same seed, same folds
        np.testing.assert_array_equal(tr, tr2)
        np.testing.assert_array_equal(te, te2)
        assert not set(tr) & set(te) and len(tr) + len(te) == 23
    np.testing.assert_array_equal(np.sort(np.concatenate([te for _, te in a])), np.arange(23))
    assert [len(te) for _, te in a] == [len(te) for _, te in KFold(4).split(np.arange(23))]   # 6, 6, 6, 5
    assert any(not np.array_equal(x[1], y[1]) for x, y in zip(a, fold_splits(23, 4, seed=6)))
    # a subset of images keeps its own indices
    sub = np.array([3, 8, 9, 14, 20, 21])
    assert set(np.concatenate([te for _, te in fold_splits(sub, 3)])) == set(sub.tolist())
    with pytest.raises(CrossViewError, match="at least 2 folds"):
        fold_splits(10, 1)


def test_experiment_trials_are_runs_listed_opened_and_on_their_fold(tiny, tmp_path):
    from crossview.engine.run import read_config, read_summary
    from crossview.engine.session import list_runs, open_run

    exp = tmp_path / "runs" / "exp"
    events, res = _drain(B.run_bitr_table(tiny, representation="default", methods=["cca", "random"], folds=3,
                                          ks=(5,), representation_params=TFIDF, out=exp))
    assert res is not None and res["experiment_dir"] == str(exp)
    folds, _ = B.make_folds(tiny, folds=3)
    names = [f"{f.key}-cca" for f in folds]
    assert [Path(p).name for p in res["runs"]["cca"]] == names and "random" not in res["runs"]
    listed = {p.name for p in list_runs(tmp_path / "runs")}
    assert set(names) <= listed                                  # the app's runs list shows every trial
    record = json.loads((exp / B.EXPERIMENT_FILE).read_text())
    assert set(record["trials"]) == set(names)
    for fold, name in zip(folds, names):
        cfg = read_config(exp / name)
        assert cfg["split"] == B.TEST_SPLIT and cfg["train_split"] == B.TRAIN_SPLIT
        assert cfg["derived_splits"][B.TEST_SPLIT] == fold.test.tolist()     # the fold, recorded
        assert cfg["derived_splits"][B.TRAIN_SPLIT] == fold.train.tolist()
    opened = open_run(exp / names[1], tiny)
    assert opened.eval_split == B.TEST_SPLIT
    np.testing.assert_array_equal(opened.dataset.splits[B.TEST_SPLIT], folds[1].test)
    test = MethodData.from_features(opened.dataset, opened.features.image, opened.features.text, B.TEST_SPLIT)
    again = opened.method.evaluate(test, ks=(5,))
    assert again["i2t"]["R@5"] == pytest.approx(read_summary(exp / names[1])["i2t"]["R@5"])
    assert again["i2t"]["R@5"] == pytest.approx(res["per_fold"]["cca"][1]["i2t"]["R@5"])   # the table's number


def _reopened_metrics(run_dir, dataset, ks):
    """A trial opened with the engine's open_run (the app's path), evaluated on its fold as the table did."""
    from crossview.engine.session import open_run

    opened = open_run(run_dir, dataset)
    f = opened.features
    train = MethodData.from_features(opened.dataset, f.image, f.text, B.TRAIN_SPLIT)
    test = MethodData.from_features(opened.dataset, f.image, f.text, B.TEST_SPLIT)
    return opened, B.evaluate_fold(opened.method, train, test, ks=ks)


def _assert_same_metrics(got, recorded):
    for d in ("i2t", "t2i"):
        assert set(recorded[d]) <= set(got[d])
        for k, v in recorded[d].items():
            assert got[d][k] == pytest.approx(v, abs=1e-6), (d, k)


def test_modern_trials_reopen_query_and_give_the_recorded_metrics(tiny, tmp_path):
    """Trials on the modern representation record it in config.json; open_run rebuilds the fold's features
    (PCA and GloVe fitted on exp-train), so the method, the Retriever and the metrics are the table's."""
    from crossview.engine.run import read_config

    exp = tmp_path / "exp"
    cache = FeatureCache(tmp_path / "cache")
    _, res = _drain(B.run_bitr_table(tiny, representation="modern", methods=["cca", "bitr-c"], folds=2, ks=(5,),
                                     method_params={"bitr": {**FAST["bitr"], "max_iter": 40}},
                                     representation_params={"cache": cache}, out=exp))
    record = json.loads((exp / B.EXPERIMENT_FILE).read_text())
    assert len(record["trials"]) == 4
    for name, trial in record["trials"].items():
        cfg = read_config(exp / name)
        assert cfg["representation"] == {"name": "modern"} and cfg["image_encoder"] is None
        opened, got = _reopened_metrics(exp / name, tiny, (5,))
        _assert_same_metrics(got, trial["metrics"])
        assert opened.features.image.shape[1] == 16 and opened.features.text.shape[1] == 50   # PCA'd, GloVe
    # The Retriever over the trial's test fold ranks as the evaluation did, and takes new sentences.
    name = next(iter(record["trials"]))
    opened, _ = _reopened_metrics(exp / name, tiny, (5,))
    r = opened.retriever()
    assert r.gallery_name == B.TEST_SPLIT
    hits = [r.query_image(int(i), k=5).best_gold_rank <= 5 for i in opened.dataset.splits[B.TEST_SPLIT]]
    assert 100.0 * np.mean(hits) == pytest.approx(record["trials"][name]["metrics"]["i2t"]["R@5"])
    ranking = r.query_text("a red circle at the beach", k=3)
    assert len(ranking.items) == 3 and set(ranking.items) <= set(opened.dataset.splits[B.TEST_SPLIT].tolist())
    with pytest.raises(CrossViewError, match="precomputed image features"):
        r.query_image(str(tmp_path / "exp" / B.EXPERIMENT_FILE))


def test_a_run_on_a_recorded_representation_builds_it_itself(tiny, tmp_path):
    """train(representation=...) without given features: the engine builds the representation fitted on the
    training split, records it in config.json, and open_run rebuilds the same features; bad records fail in
    one line before the folder exists."""
    from crossview.engine.run import read_config, read_summary, train
    from crossview.engine.session import open_run
    from crossview.features.topics import build_representation

    run_dir = tmp_path / "run"
    events = list(train("cca", tiny, run_dir=run_dir, split="test", representation={"name": "modern", "pca_dim": 8},
                        checkpoint_seconds=1e9, image_norm="none", text_norm="none"))
    assert type(events[-1]).__name__ == "Finished"
    assert read_config(run_dir)["representation"] == {"name": "modern", "pca_dim": 8}
    rep = build_representation(tiny, "modern", fit_images="train", pca_dim=8)
    opened = open_run(run_dir, tiny)
    np.testing.assert_allclose(opened.features.image, rep.image, atol=1e-6)
    np.testing.assert_allclose(opened.features.text, rep.text, atol=1e-6)
    test = MethodData.from_features(opened.dataset, opened.features.image, opened.features.text, "test")
    assert opened.method.evaluate(test)["i2t"]["R@5"] == pytest.approx(read_summary(run_dir)["i2t"]["R@5"])
    for bad, message in (({"name": "sift"}, "unknown representation 'sift'"),
                         ({"name": "tr"}, "needs image files"),
                         ({"name": "modern", "pca_dim": "big"}, "pca_dim is 'big', not a whole number"),
                         ({"name": "modern", "colour": 1}, "unknown setting 'colour'")):
        with pytest.raises(CrossViewError, match=message):
            train("cca", tiny, run_dir=tmp_path / "bad", split="test", representation=bad)
        assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("representation", ["tr", "ctr"])
def test_topic_trials_reopen_query_and_give_the_recorded_metrics(representation, tmp_path, monkeypatch):
    """TR / CTR trials (on image files; a fast patch encoder stands in for the CNN) reopen on their fold's
    visual words and topics; a new image file is encoded as the dataset's own row was."""
    from crossview.data.demo import load_demo
    from crossview.engine.run import read_config
    from crossview.features import image as image_mod
    from test_bitr_representation import PatchEncoder

    monkeypatch.setattr(image_mod, "create_image_encoder", lambda name, **kw: PatchEncoder())
    ds = load_demo(n_scenes=40, n_web=0)
    exp = tmp_path / "exp"
    _, res = _drain(B.run_bitr_table(ds, representation=representation, methods=["cca", "bitr-c"], split="test",
                                     ks=(5,), method_params={"bitr": {**FAST["bitr"], "max_iter": 40}},
                                     representation_params={"n_topics": 6, "n_words": 24,
                                                            "cache": FeatureCache(tmp_path / "cache")}, out=exp))
    record = json.loads((exp / B.EXPERIMENT_FILE).read_text())
    assert set(record["trials"]) == {"test-cca", "test-bitr-c"}
    for name, trial in record["trials"].items():
        # BITR on CTR trains on TR with its own CTR step (refitted inside each fold of its C cross-validation)
        rep = B.row_representation(trial["method"], representation)
        assert rep == ("tr" if (representation, trial["method"]) == ("ctr", "bitr-c") else representation)
        assert read_config(exp / name)["representation"] == {"name": rep, "n_topics": 6, "n_words": 24}
        if rep != representation:
            assert read_config(exp / name)["params"]["reduce"] == "ctr"
        opened, got = _reopened_metrics(exp / name, ds, (5,))
        _assert_same_metrics(got, trial["metrics"])
    r = opened.retriever()
    i = int(opened.dataset.splits[B.TEST_SPLIT][0])
    new = opened.features.encode_new_images([ds.image_paths[i]])
    np.testing.assert_allclose(new[0], opened.features.image[i], atol=1e-5)
    by_file = r.query_image(ds.image_paths[i], k=5)
    np.testing.assert_array_equal(by_file.items, r.query_image(i, k=5).items)
    assert len(r.query_text("a red circle", k=2).items) == 2


@pytest.mark.slow
def test_experiment_resumes_after_a_stop_and_skips_finished_runs(tiny, tmp_path):
    from crossview.engine.run import read_status

    kw = dict(representation="default", methods=["cca", "bitr-c"], split="test", ks=(5, 10),
              method_params={"bitr": {**FAST["bitr"], "max_iter": 60}}, representation_params=TFIDF)
    _, whole = _drain(B.run_bitr_table(tiny, out=tmp_path / "whole", **kw))
    exp = tmp_path / "exp"
    seen = {"n": 0}

    def stop() -> bool:          # stop in the middle of BITR's cutting-plane iterations
        seen["n"] += 1
        return (exp / "test-bitr-c" / "checkpoint.pt").is_file() and seen["n"] > 40

    events, res = _drain(B.run_bitr_table(tiny, out=exp, should_stop=stop,
                                          **{**kw, "method_params": {"bitr": {**kw["method_params"]["bitr"]}}}))
    assert res is None and any("stopped" in getattr(e, "message", "") for e in events)
    assert read_status(exp / "test-cca")["status"] == "finished"
    assert read_status(exp / "test-bitr-c")["status"] == "cancelled"
    cca_mtime = (exp / "test-cca" / "summary.json").stat().st_mtime_ns
    events, res = _drain(B.run_bitr_table(tiny, out=exp, **kw))
    messages = [getattr(e, "message", "") for e in events]
    assert any("test cca: finished earlier" in m for m in messages)          # skipped, read back
    assert any("test bitr-c: resuming" in m for m in messages)                # continued from its checkpoint
    assert (exp / "test-cca" / "summary.json").stat().st_mtime_ns == cca_mtime
    assert read_status(exp / "test-bitr-c")["status"] == "finished"
    for m in ("cca", "bitr-c"):
        for d in ("i2t", "t2i"):
            for key in ("R@5", "R@10", "MedR", "BLEU-1", "ROUGE-1"):
                assert res["results"][m][d][key] == pytest.approx(whole["results"][m][d][key]), (m, d, key)
    # a third time: everything is read back, nothing trained
    events, again = _drain(B.run_bitr_table(tiny, out=exp, **kw))
    assert not any("training" in getattr(e, "message", "") for e in events)
    assert again["results"]["bitr-c"]["i2t"] == res["results"]["bitr-c"]["i2t"]


def test_another_experiment_in_the_same_folder_is_refused(tiny, tmp_path):
    kw = dict(representation="default", methods=["cca"], split="test", ks=(5,), representation_params=TFIDF)
    _drain(B.run_bitr_table(tiny, out=tmp_path, **kw))
    with pytest.raises(CrossViewError, match="another seed"):
        _drain(B.run_bitr_table(tiny, out=tmp_path, seed=3, **kw))
    with pytest.raises(CrossViewError, match="its cca runs were trained with"):
        _drain(B.run_bitr_table(tiny, out=tmp_path, method_params={"cca": {"reg": 0.5}}, **kw))


def test_bleu_and_rouge_come_from_eval(tiny, tmp_path, monkeypatch):
    import crossview.eval.overlap as O

    def fixed(self, hypothesis, references):
        return {"BLEU-1": 12.5, "BLEU-2": 0.0, "BLEU-3": 0.0, "BLEU-4": 0.0, "ROUGE-1": 0.25, "ROUGE-L": 0.0}

    monkeypatch.setattr(O.SentenceOverlap, "__call__", fixed)
    _, res = _drain(B.run_bitr_table(tiny, representation="default", methods=["cca", "random"], split="test",
                                     ks=(5,), corpus=["a red star", "the blue circle"],
                                     representation_params=TFIDF, out=tmp_path))
    for m in ("cca", "random"):
        for d in ("i2t", "t2i", "corpus_i2t"):
            assert res["results"][m][d]["BLEU-1"] == 12.5 and res["results"][m][d]["ROUGE-1"] == 25.0


def test_gallery_overlap_matches_a_naive_loop():
    from crossview.eval.overlap import gallery_overlap_i2t, gallery_overlap_t2i

    sc = SentenceOverlap()
    gallery = ["a dog runs", "a cat sits", "the dog sits on grass", "birds fly"]
    refs = [["a dog runs on grass"], ["a cat on a sofa", "the cat sits"], []]
    s = np.array([[0.9, 0.1, 0.5, 0.0], [0.0, 0.8, 0.2, 0.3], [1.0, 1.0, 1.0, 1.0]])
    got = gallery_overlap_i2t(s, gallery, refs, k=2)
    rows = [sc(gallery[0], refs[0]), sc(gallery[2], refs[0]), sc(gallery[1], refs[1]), sc(gallery[3], refs[1])]
    assert got["BLEU-1"] == pytest.approx(np.mean([r["BLEU-1"] for r in rows]))       # the empty one skipped
    s_t2i = np.array([[0.9, 0.1], [0.2, 0.8], [1.0, 1.0]])     # 3 gallery images x 2 query captions
    got = gallery_overlap_t2i(s_t2i, ["a dog", "a cat"], refs, k=2)
    rows = [sc("a dog", refs[0]), sc("a cat", refs[1])]                # image 2 (top of both) has no caption
    assert got["ROUGE-1"] == pytest.approx(np.mean([r["ROUGE-1"] for r in rows]))
    assert got["BLEU-1"] == pytest.approx(np.mean([r["BLEU-1"] for r in rows]))
    with pytest.raises(CrossViewError, match="must be"):
        gallery_overlap_i2t(s, gallery[:3], refs)


@pytest.mark.slow
def test_a_killed_experiment_continues_where_it_died(precomp, tiny, tmp_path):
    """SIGKILL the command while BITR trains: the next run of the command skips the finished CCA run and
    resumes the BITR one (which then finishes)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from crossview.engine.run import read_status

    exp = tmp_path / "exp"
    bitr = {"c_grid": "paper", "cv_folds": "5", "max_iter": "200", "normalize": "l2", "pca_dim": "0"}
    cmd = [sys.executable, "-m", "crossview.cli", "experiment", "bitr-table", "--data", str(precomp),
           "--representation", "default", "--text-encoder", "tfidf", "--methods", "cca,bitr-c", "--split", "test",
           "--k", "5", "--cache-dir", str(tmp_path / "cache"), "--exp-dir", str(exp),
           *[a for k, v in bitr.items() for a in ("--param", f"bitr.{k}={v}")]]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        status = exp / "test-bitr-c" / "status.json"
        deadline = time.monotonic() + 300
        while not status.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the command ended before BITR started; nothing to kill"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert read_status(exp / "test-cca")["status"] == "finished"
    assert read_status(exp / "test-bitr-c")["status"] == "running"          # died without a word
    events, res = _drain(B.run_bitr_table(tiny, representation="default", methods=["cca", "bitr-c"],
                                          split="test", ks=(5,), method_params={"bitr": bitr},
                                          representation_params={**TFIDF, "cache": FeatureCache(tmp_path / "cache")},
                                          out=exp))
    messages = [getattr(e, "message", "") for e in events]
    assert any("test cca: finished earlier" in m for m in messages)
    assert any("test bitr-c: resuming" in m for m in messages)
    assert res is not None and read_status(exp / "test-bitr-c")["status"] == "finished"
    assert res["results"]["bitr-c"]["i2t"]["R@5"] > res["chance"]["i2t"]["R@5"] + 15


@pytest.mark.parametrize("representation", ["default", "modern"])
def test_the_app_opens_an_experiment_trial_on_its_fold(qtbot, window, tiny, representation):
    """A trial of the table opens in the app like any run, querying the fold's test images (on the
    encoders' features, or on the modern representation the trial recorded)."""
    from crossview.engine.session import list_runs

    _, res = _drain(B.run_bitr_table(tiny, representation=representation, methods=["cca"], split="test", ks=(5,),
                                     representation_params=TFIDF if representation == "default" else {}))
    run_dir = Path(res["runs"]["cca"][0])
    assert run_dir in list_runs()                       # in the user's runs folder (the window's home)
    task = window.open_run(str(run_dir))
    with qtbot.waitSignal(task.finished, timeout=120_000):
        pass
    assert window.run is not None and window.run.name == "test-cca"
    assert window.query_panel.retriever.gallery_name == B.TEST_SPLIT
    assert window.query_panel.retriever.dataset.n_images == tiny.n_images
    np.testing.assert_array_equal(window.run.dataset.splits[B.TEST_SPLIT], tiny.splits["test"])
    ranking = window.query_panel.retriever.query_image(int(tiny.splits["test"][0]), k=5)
    assert len(ranking.items) == 5 and ranking.best_gold_rank is not None


# ---------------------------------------------------------------------------- Experiment 2: cross-dataset
@pytest.fixture(scope="module")
def other(tmp_path_factory, precomp) -> PairedDataset:
    """A second tiny dataset of the same kind (the same CNN's feature mix, other images): 50 test images."""
    from crossview.data import load_dataset

    folder = tmp_path_factory.mktemp("other_precomp")
    rng = np.random.default_rng(0)
    mix = np.abs(rng.standard_normal((10, 16))).astype(np.float32)     # the same mix as `precomp`
    rng = np.random.default_rng(7)
    feats, caps = _images(rng, 50, mix)
    np.save(folder / "test_ims.npy", feats)
    (folder / "test_caps.txt").write_text("\n".join(caps) + "\n", encoding="utf-8")
    return load_dataset(folder)


def test_cross_metrics_are_experiment_ones_on_each_part_and_overlap_over_the_source():
    """R@K / MedR: the mean over the parts of the target of what each part alone gives; BLEU / ROUGE: the
    target's queries over the whole source collection (a naive scorer of dot products checks both)."""
    from crossview.eval import metrics as M
    from crossview.eval.overlap import gallery_overlap_i2t

    rng = np.random.default_rng(3)

    def md(n_img, name):
        caps = [f"w{int(rng.integers(0, 6))} w{int(rng.integers(0, 6))}" for _ in range(2 * n_img)]
        return MethodData(image_features=rng.standard_normal((n_img, 4)).astype(np.float32),
                          text_features=rng.standard_normal((2 * n_img, 4)).astype(np.float32), captions=caps,
                          caption_image=np.repeat(np.arange(n_img), 2), name=name)

    source, target = md(9, "src"), md(8, "tgt")

    def embed(data, side, direction):
        return data.image_features if side == "image" else data.text_features

    def score(images, texts, direction):
        return images.image_features @ texts.text_features.T

    parts = B.cross_parts(target.n_images, 2, seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(8)) and all(len(p) == 4 for p in parts)
    res = B.cross_metrics(embed, source, target, parts, ks=(1, 3), overlap_k=2)
    want = [M.evaluate(score(target.subset(p), target.subset(p), "i2t"), target.subset(p).caption_image, (1, 3))
            for p in parts]
    for d in ("i2t", "t2i"):
        for key in ("R@1", "R@3", "MedR"):
            assert res[d][key] == pytest.approx(np.mean([w[d][key] for w in want]))
    refs = [[target.captions[c] for c in np.flatnonzero(target.caption_image == i)] for i in range(8)]
    naive = gallery_overlap_i2t(score(target, source, "i2t"), source.captions, refs, 2, SentenceOverlap())
    assert res["i2t"]["BLEU-1"] == pytest.approx(naive["BLEU-1"])
    kept = B.cross_metrics(embed, source, target, parts, ks=(1, 3), overlap_k=2, keep_ranks=True)["ranks"]
    for k, p in enumerate(parts):          # each part's own ranks, the parts one after another
        sub = target.subset(p)
        np.testing.assert_array_equal(kept["i2t"][4 * k:4 * k + 4], M.i2t_ranks(score(sub, sub, "i2t"),
                                                                                 sub.caption_image))
        np.testing.assert_array_equal(kept["t2i"][8 * k:8 * k + 8], M.t2i_ranks(score(sub, sub, "t2i"),
                                                                                 sub.caption_image))
    assert kept["caption_image"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    assert B.cross_parts(5, 1) [0].tolist() == list(range(5))
    with pytest.raises(CrossViewError, match="too few"):
        B.cross_parts(5, 3)


def test_cross_dataset_table_tests_the_trained_models_on_the_other_data(tiny, other, tmp_path):
    """Experiment 2: one model per method trained on tiny's train split, evaluated unchanged on another
    dataset (its features through the representation fitted on tiny), far above random; the table says
    where it was trained and tested and shows the paper's Table 4; a second run reads the trials back;
    --folds is refused."""
    kw = dict(representation="default", methods=["cca", "random"], ks=(5,), test_dataset=other, test_parts=5,
              representation_params={**TFIDF, "cache": FeatureCache(tmp_path / "c")}, out=tmp_path / "exp")
    events, res = _drain(B.run_bitr_table(tiny, **kw))
    assert res["test_dataset"] == other.name and res["test_parts"] == 5 and res["test_images"] == 10
    assert "evaluated on" in res["protocol"] and len(res["runs"]["cca"]) == 1
    for d in ("i2t", "t2i"):
        assert res["results"]["cca"][d]["R@5"] > res["results"]["random"][d]["R@5"] + 20, res["results"]
        assert res["results"]["cca"][d]["R@5"] > res["chance"][d]["R@5"] + 20
    assert res["paper"]["table"] == "Table 4" and "cca" in res["paper"]["rows"]
    text = B.format_table(res)
    assert text.startswith("Experiment 2") and "within each of the 5 parts" in text
    again, res2 = _drain(B.run_bitr_table(tiny, **kw))
    assert any("finished earlier" in getattr(e, "message", "") for e in again)
    assert res2["results"]["cca"]["i2t"]["R@5"] == pytest.approx(res["results"]["cca"]["i2t"]["R@5"])
    with pytest.raises(CrossViewError, match="drop --folds"):
        _drain(B.run_bitr_table(tiny, **{**kw, "folds": 3, "out": tmp_path / "exp2"}))


def test_cross_dataset_rows_are_paired_against_the_first_on_the_other_datas_queries(tiny, other, tmp_path):
    """Experiment 2's paired section: each other row (the random one too) minus the first, on the other dataset's
    queries ranked within their parts; its differences are the table's (equal parts), its intervals hold them; the
    ranks are kept beside the runs and read back; an older folder without them gets them from its runs again (no
    training); two builds pair each query's rank averaged over the builds."""
    kw = dict(representation="default", methods=["cca", "bitr-c", "random"], ks=(5,), test_dataset=other,
              test_parts=5, representation_params={**TFIDF, "cache": FeatureCache(tmp_path / "c")},
              method_params={"bitr": FAST["bitr"]}, out=tmp_path / "exp")
    _, res = _drain(B.run_bitr_table(tiny, **kw))
    pr = res["paired"]
    assert pr["baseline"] == "cca" and list(pr["rows"]) == ["bitr-c", "random"]
    assert pr["n_images"] == 50 and pr["n_captions"] == other.n_captions
    for m in ("bitr-c", "random"):
        for d in ("i2t", "t2i"):
            cell = pr["rows"][m][d]["R@5"]
            want = res["results"][m][d]["R@5"] - res["results"]["cca"][d]["R@5"]
            assert cell["diff"] == pytest.approx(want)
            assert cell["ci"][0] <= cell["diff"] <= cell["ci"][1]
    assert pr["rows"]["random"]["sum"]["ci"][1] < 0            # CCA is far above chance on this data
    md = B.format_markdown(res)
    assert f"Paired against CCA on the same 50 {other.name} images" in md and "| random |" in md.split("Paired against")[1]
    ranks = sorted(p.name for p in (tmp_path / "exp" / B.CROSS_RANKS).iterdir())
    assert ranks == ["test-bitr-c.npz", "test-cca.npz", "test-random.npz"]

    import crossview.engine.run as run_mod

    def no_training(*a, **k):
        raise AssertionError("a finished trial was trained again")

    (tmp_path / "exp" / B.CROSS_RANKS / "test-cca.npz").unlink()       # as a folder made before the ranks were kept
    import unittest.mock as um
    with um.patch.object(run_mod, "train", no_training):
        _, again = _drain(B.run_bitr_table(tiny, **kw))
    assert (tmp_path / "exp" / B.CROSS_RANKS / "test-cca.npz").is_file()
    assert again["paired"]["rows"]["bitr-c"]["sum"]["diff"] == pytest.approx(pr["rows"]["bitr-c"]["sum"]["diff"])

    _, two = _drain(B.run_bitr_table_seeds(tiny, seeds=[0, 1], **{k: v for k, v in kw.items() if k != "out"},
                                           out=tmp_path / "seeds"))
    p2 = two["paired"]
    assert list(p2["rows"]) == ["bitr-c", "random"]
    for d in ("i2t", "t2i"):
        want = two["results"]["random"][d]["R@5"] - two["results"]["cca"][d]["R@5"]
        assert p2["rows"]["random"][d]["R@5"]["diff"] == pytest.approx(want)
    assert "the mean of 2 builds" in B.format_markdown(two).splitlines()[0]


def test_damaged_cross_ranks_are_one_line_naming_the_file(tmp_path):
    good = B._save_cross_ranks(tmp_path, "test-cca", {"i2t": np.array([1, 2]), "t2i": np.array([1, 1, 2]),
                                                      "caption_image": np.array([0, 0, 1])})
    ranks, caps = B._load_cross_ranks(good)
    assert ranks["t2i"].tolist() == [1, 1, 2] and caps.tolist() == [0, 0, 1]
    for name, content in (("garbage.npz", b"not a zip"), ("partial.npz", None)):
        path = tmp_path / name
        if content is None:
            np.savez(path, i2t=np.array([1]))                     # no t2i
        else:
            path.write_bytes(content)
        with pytest.raises(CrossViewError) as e:
            B._load_cross_ranks(path)
        assert str(path) in str(e.value) and "--exp-dir" in str(e.value) and "\n" not in str(e.value)


def test_cli_cross_dataset(precomp, other, tmp_path, capsys):
    out = tmp_path / "x.md"
    rc = main(["experiment", "bitr-table", "--data", str(precomp), "--representation", "default",
               "--text-encoder", "tfidf", "--methods", "cca", "--k", "5", "--test-data", str(other.source),
               "--test-parts", "2", "--no-cache", "--exp-dir", str(tmp_path / "e"), "--out", str(out)])
    assert rc == 0
    md = out.read_text()
    assert md.startswith("# Experiment 2") and "--test-data" in md and "--test-parts 2" in md
    assert "Table 4" in md


def test_an_index_gives_the_dense_results_and_reports_its_time(tiny, tmp_path):
    """The BLEU / ROUGE retrieval through the exact index (chunked, never the whole score matrix) equals the
    dense score matrix's; the search time is reported; an unknown backend is one line."""
    kw = dict(representation="default", methods=["cca", "random"], split="test", ks=(5,),
              corpus=["a red star", "the blue circle"], representation_params={**TFIDF, "cache": False})
    _, dense = _drain(B.run_bitr_table(tiny, out=tmp_path / "d", **kw))
    _, exact = _drain(B.run_bitr_table(tiny, out=tmp_path / "e", index="exact", **kw))
    for m in ("cca", "random"):
        for d in ("i2t", "t2i", "corpus_i2t"):
            for key in ("BLEU-1", "ROUGE-1"):
                assert exact["results"][m][d][key] == pytest.approx(dense["results"][m][d][key]), (m, d, key)
        assert exact["results"][m]["search_seconds"] >= 0
    assert exact["index"] == "exact" and "index exact" in B.format_table(exact)
    assert "dense score matrices" in B.format_table(dense)
    with pytest.raises(CrossViewError, match="--index 'annoy'"):
        _drain(B.run_bitr_table(tiny, out=tmp_path / "x", index="annoy", **kw))
