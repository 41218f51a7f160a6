"""Embeddings files and ``crossview eval``: protocols, both-model (BITR) files, malformed input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.eval import evaluate
from crossview.eval.embeddings import Embeddings, evaluate_embeddings, load_embeddings, save_embeddings
from crossview.eval.protocols import identity_hits, mean_average_precision, precision_at_k


def _emb(rng, n_images=40, per=5, d=8, **extra) -> Embeddings:
    image = rng.standard_normal((n_images, d)).astype(np.float32)
    ci = np.repeat(np.arange(n_images), per)
    text = (image[ci] + rng.standard_normal((ci.size, d)).astype(np.float32)).astype(np.float32)
    return Embeddings(image=image, text=text, caption_image=ci, **extra)


def test_standard_protocol_matches_evaluate_and_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    emb = _emb(rng, captions=[f"caption {i}" for i in range(200)], info={"method": "cca", "split": "test"})
    path = save_embeddings(tmp_path / "e.npz", emb)
    back = load_embeddings(path)
    assert back.captions == emb.captions and back.info == {"method": "cca", "split": "test"}
    res = evaluate_embeddings(back)
    ref = evaluate(emb.image @ emb.text.T, emb.caption_image)
    assert res["i2t"] == ref["i2t"] and res["t2i"] == ref["t2i"] and res["rsum"] == ref["rsum"]
    np.testing.assert_array_equal(res["ranks"]["t2i"], ref["ranks"]["t2i"])


def test_separate_t2i_model_is_used_for_t2i_only() -> None:
    rng = np.random.default_rng(1)
    base = _emb(rng)
    # a t2i model that is perfect: each caption's embedding is one-hot on its image
    n = base.image.shape[0]
    emb = Embeddings(image=base.image, text=base.text, caption_image=base.caption_image,
                     image_t2i=np.eye(n, dtype=np.float32), text_t2i=np.eye(n, dtype=np.float32)[base.caption_image])
    res = evaluate_embeddings(emb)
    assert res["t2i"]["R@1"] == 100.0 and res["t2i"]["MedR"] == 1
    assert res["i2t"] == evaluate(base.image @ base.text.T, base.caption_image)["i2t"]


def test_identity_coco1k_and_labels_protocols() -> None:
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 7, 40)
    emb = _emb(rng, image_labels=labels)
    res = evaluate_embeddings(emb, "identity")
    ref = identity_hits(emb.image @ emb.text.T, labels, labels[emb.caption_image])
    assert res["i2t"] == ref["i2t"] and res["t2i"] == ref["t2i"]

    big = _emb(rng, n_images=2000, per=2, d=4)
    r1k = evaluate_embeddings(big, "coco1k")
    s = big.image @ big.text.T
    folds = [evaluate(s[a:a + 1000][:, (big.caption_image >= a) & (big.caption_image < a + 1000)],
                      big.caption_image[(big.caption_image >= a) & (big.caption_image < a + 1000)] - a)
             for a in (0, 1000)]
    assert r1k["i2t"]["R@5"] == pytest.approx(np.mean([f["i2t"]["R@5"] for f in folds]), abs=1e-9)
    with pytest.raises(CrossViewError, match="multiple of 1,000"):
        evaluate_embeddings(emb, "coco1k")
    with pytest.raises(CrossViewError, match="5,000"):
        evaluate_embeddings(emb, "coco5k")

    lab_emb = rng.standard_normal((6, 8)).astype(np.float32)
    rel = rng.random((40, 6)) < 0.3
    emb_l = _emb(rng, label_embeddings=lab_emb, label_relevance=rel)
    res = evaluate_embeddings(emb_l, "labels", ks=(1, 3))
    s = emb_l.image @ lab_emb.T
    assert res["labels"]["P@3"] == precision_at_k(s, rel, (1, 3))["P@3"]
    assert res["labels"]["mAP"] == mean_average_precision(s, rel)["mAP"]
    with pytest.raises(CrossViewError, match="label_embeddings"):
        evaluate_embeddings(emb, "labels")


def test_inconsistent_embeddings_are_refused() -> None:
    rng = np.random.default_rng(3)
    good = _emb(rng)
    with pytest.raises(CrossViewError, match="caption_image"):
        Embeddings(image=good.image, text=good.text, caption_image=good.caption_image[:-1])
    with pytest.raises(CrossViewError, match="outside"):
        Embeddings(image=good.image, text=good.text, caption_image=good.caption_image + 1)
    with pytest.raises(CrossViewError, match="same"):
        Embeddings(image=good.image, text=good.text[:, :3], caption_image=good.caption_image)
    with pytest.raises(CrossViewError, match="come together"):
        Embeddings(image=good.image, text=good.text, caption_image=good.caption_image, image_t2i=good.image)
    # an image row that is not a whole number was truncated silently (i + 0.5 evaluated as i)
    with pytest.raises(CrossViewError, match="caption_image holds numbers that are not whole"):
        Embeddings(image=good.image, text=good.text, caption_image=good.caption_image + 0.5)
    with pytest.raises(CrossViewError, match="caption_image holds <U"):
        Embeddings(image=good.image, text=good.text, caption_image=good.caption_image.astype(str))
    whole = Embeddings(image=good.image, text=good.text, caption_image=good.caption_image.astype(np.float64))
    assert whole.caption_image.dtype == np.int64 and (whole.caption_image == good.caption_image).all()


def test_cli_eval_table_json_and_errors(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(4)
    path = save_embeddings(tmp_path / "e.npz", _emb(rng, captions=[f"a dog number {i % 7}" for i in range(200)]))
    assert main(["eval", str(path), "--k", "1,5,50"]) == 0
    out = capsys.readouterr().out
    assert "R@50" in out and "i2t" in out and "rsum" not in out      # rsum needs R@1, R@5 and R@10
    assert main(["eval", str(path), "--k", "1,5,10,50", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["rsum"] == pytest.approx(sum(res[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10)))
    assert main(["eval", str(path), "--json", "--overlap", "--ranks-out", str(tmp_path / "r.npz")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res["i2t"]) == {"R@1", "R@5", "R@10", "MedR", "MeanR"} and "BLEU-1" in res["overlap"]["i2t"]
    with np.load(tmp_path / "r.npz") as z:
        assert z["i2t"].shape == (40,) and z["t2i"].shape == (200,)

    # a run folder: its embeddings file per split; a clear message when it is missing
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    assert main(["eval", str(run)]) == 2
    assert "no embeddings" in capsys.readouterr().err
    save_embeddings(run / "embeddings_val.npz", _emb(rng))
    assert main(["eval", str(run), "--split", "test"]) == 2
    assert "embeddings_val.npz" in capsys.readouterr().err
    assert main(["eval", str(run), "--split", "val"]) == 0
    capsys.readouterr()

    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    assert main(["eval", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.npz" in err
    np.savez(tmp_path / "partial.npz", image=np.zeros((2, 2)))
    assert main(["eval", str(tmp_path / "partial.npz")]) == 2
    assert "missing text, caption_image" in capsys.readouterr().err
    assert main(["eval", str(path), "--k", "one"]) == 2
    capsys.readouterr()
    for ks in ("1,,5", "1,5,", ","):          # an empty item is a typo, not "skip it"
        assert main(["eval", str(path), "--k", ks]) == 2, ks
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "empty item" in err, (ks, err)
    assert main(["eval", str(tmp_path / "nothing")]) == 2


def test_cli_eval_csv_puts_intervals_in_columns_of_their_own(tmp_path: Path, capsys) -> None:
    import csv

    from crossview.eval.bootstrap import bootstrap_ci

    rng = np.random.default_rng(5)
    emb = _emb(rng)
    path = save_embeddings(tmp_path / "e.npz", emb)
    assert main(["eval", str(path), "--k", "1,5,10,50", "--json", "--csv", str(tmp_path / "m.csv")]) == 0
    res = json.loads(capsys.readouterr().out)
    with open(tmp_path / "m.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["direction"] for r in rows] == ["i2t", "t2i"]
    assert list(rows[0])[:4] == ["direction", "R@1", "R@1_low", "R@1_high"]
    ref = evaluate(emb.image @ emb.text.T, emb.caption_image)
    ci = bootstrap_ci(ref["ranks"]["i2t"], ref["ranks"]["t2i"], emb.caption_image, ks=(1, 5, 10, 50))
    rsum_ci = bootstrap_ci(ref["ranks"]["i2t"], ref["ranks"]["t2i"], emb.caption_image)["rsum"]
    for r in rows:
        d = r["direction"]
        for k in ("R@1", "R@5", "R@10", "R@50", "MedR", "MeanR"):
            assert float(r[k]) == pytest.approx(res[d][k], abs=1e-4)
        for k in ("R@1", "R@50"):
            assert (float(r[f"{k}_low"]), float(r[f"{k}_high"])) == pytest.approx(tuple(ci[d][k]), abs=1e-4)
        assert (float(r["rsum_low"]), float(r["rsum_high"])) == pytest.approx(tuple(rsum_ci), abs=1e-4)
        assert r["MedR_low"] == "" and all("±" not in c and "+-" not in c for c in r.values())
    assert main(["eval", str(path), "--csv", str(tmp_path / "no" / "such" / "m.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "m.csv" in err


def test_a_finished_run_is_evaluated_from_its_folder(tmp_path: Path, capsys) -> None:
    from _engine_helpers import make_toy_dataset, toy_features
    from crossview.engine.run import train

    ds = make_toy_dataset(n_images=120)
    for _ in train("cca", ds, run_dir=tmp_path / "run", params={"n_components": 8}, features=toy_features(ds),
                   device="cpu"):
        pass
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert main(["eval", str(tmp_path / "run"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["i2t"]["R@1"] == pytest.approx(summary["i2t"]["R@1"])
    assert res["t2i"]["MedR"] == pytest.approx(summary["t2i"]["MedR"])
    assert res["method"] == "cca" and res["split"] == "test"
    assert main(["eval", str(tmp_path / "run"), "--protocol", "identity"]) == 0   # toy labels = classes


def test_a_json_file_given_to_eval_gets_one_clear_line(tmp_path: Path, capsys) -> None:
    """Issue 9: a JSON file (e.g. a dataset or summary.json) passed to eval showed numpy's pickle message."""
    js = tmp_path / "summary.json"
    js.write_text(json.dumps({"method": "cca", "i2t": {"R@1": 1.0}}))
    assert main(["eval", str(js)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pickle" not in err
    assert f"{js} is not an embeddings .npz (it looks like JSON); give a run folder or an embeddings file" in err
    with pytest.raises(CrossViewError, match="looks like JSON"):
        load_embeddings(js)
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(CrossViewError, match="single .npy array"):
        load_embeddings(tmp_path / "one.npy")


def test_embeddings_with_nan_name_the_file(tmp_path: Path, capsys) -> None:
    emb = _emb(np.random.default_rng(6))
    emb.text[7, 3] = np.nan
    path = save_embeddings(tmp_path / "nan.npz", emb)
    assert main(["eval", str(path)]) == 2
    assert capsys.readouterr().err == (f"crossview: error: {path}: text holds NaN or infinity (first at row 7, column "
                                       "3), so its scores and ranks are undefined; write it again from the model "
                                       "that made it (arrays only, as numpy.savez writes them)\n")
    emb.text[7, 3], emb.image[2, 0] = 0.0, np.inf
    save_embeddings(path, emb)
    with pytest.raises(CrossViewError, match=r"nan\.npz: image holds NaN or infinity \(first at row 2, column 0\)"):
        load_embeddings(path)


def test_a_garbage_npz_is_one_line_without_numpys_unsafe_advice(tmp_path: Path, capsys) -> None:
    """Random bytes are not a zip, so numpy offers to unpickle them ("If you trust the file you can load it unsafely
    ..."); CrossView never does, and says the file is not an .npz it wrote, in one line naming it."""
    from _engine_helpers import make_toy_dataset, toy_features
    from crossview.engine.run import train

    garbage = np.random.default_rng(7).bytes(4000)
    bad = tmp_path / "random.npz"
    bad.write_bytes(garbage)
    assert main(["eval", str(bad)]) == 2
    assert capsys.readouterr().err == (f"crossview: error: {bad}: not a valid .npz written by CrossView (it is not a "
                                       "zip archive of arrays): it is damaged or comes from elsewhere; write it again "
                                       "from the model that made it (arrays only, as numpy.savez writes them)\n")
    ds = make_toy_dataset(n_images=120)
    for _ in train("cca", ds, run_dir=tmp_path / "run", params={"n_components": 8}, features=toy_features(ds),
                   device="cpu"):
        pass
    good = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    banks = [n for n in good if n.startswith("bank_")]
    assert banks == ["bank_train.npz"] and "embeddings_test.npz" in good and "ranks.npz" in good
    import shutil

    shutil.copytree(tmp_path / "run", tmp_path / "twin")     # an intact run to compare the damaged one with
    for name, argv, todo in (
            ("bank_train.npz", ["--scoring", "csls", "--param", "5"],
             "delete it and the run encodes its training split into it again"),
            ("embeddings_test.npz", [], "train the run again (its evaluation writes this file)"),
            ("ranks.npz", ["--compare", str(tmp_path / "twin")], "train the run again (its evaluation writes "
                                                                 "ranks.npz)")):
        for n, data in good.items():
            (tmp_path / "run" / n).write_bytes(data)
        (tmp_path / "run" / name).write_bytes(garbage)
        assert main(["eval", str(tmp_path / "run"), *argv]) == 2, name
        err = capsys.readouterr().err
        assert err == (f"crossview: error: {tmp_path / 'run' / name}: not a valid .npz written by CrossView (it is "
                       f"not a zip archive of arrays): it is damaged or comes from elsewhere; {todo}\n"), name


def _ranks_run(folder: Path, i2t, t2i, caption_image=None, split="test", dataset="toy") -> Path:
    """A finished run as far as --compare reads it: summary.json, config.json and ranks.npz."""
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"method": "cca", "dataset": dataset, "split": split,
                                                     "i2t": {}, "t2i": {}, "rsum": 0.0}))
    (folder / "config.json").write_text(json.dumps({"split": split}))
    extra = {} if caption_image is None else {"caption_image": np.asarray(caption_image)}
    np.savez(folder / "ranks.npz", i2t=np.asarray(i2t), t2i=np.asarray(t2i), image_ids=np.arange(len(i2t)),
             caption_ids=np.arange(len(t2i)), **extra)
    return folder


def test_compare_runs_seeds_against_seeds(tmp_path: Path, capsys) -> None:
    from crossview.eval.paired import paired_effect

    rng = np.random.default_rng(5)
    ci = np.repeat(np.arange(40), 5)
    a = [_ranks_run(tmp_path / f"a{s}", rng.integers(1, 30, 40), rng.integers(1, 30, 200), ci) for s in range(3)]
    b = [_ranks_run(tmp_path / f"b{s}", rng.integers(1, 20, 40), rng.integers(1, 20, 200), ci) for s in range(2)]
    assert main(["eval", *map(str, a), "--compare", *map(str, b), "--json", "--resamples", "500"]) == 0
    got = json.loads(capsys.readouterr().out)
    load = lambda runs: {d: np.stack([np.load(r / "ranks.npz")[d] for r in runs]) for d in ("i2t", "t2i")}  # noqa: E731
    want = paired_effect(load(a), load(b), ci, resamples=500)
    assert {k: got[k] for k in want} == json.loads(json.dumps(want))
    assert got["runs_a"] == [str(r) for r in a] and (got["seeds_a"], got["seeds_b"]) == (3, 2)
    assert (got["split"], got["dataset"]) == ("test", "toy")
    assert main(["eval", str(a[0]), "--compare", str(b[0]), "--k", "1,5"]) == 0
    out = capsys.readouterr().out
    assert "n = 40 images / 200 captions" in out and "i2t median rank change" in out and "R@10" not in out
    assert "resampled: images (each with its captions); seeds averaged per query first" in out
    assert "minimal detectable difference: rsum " in out


def test_compare_two_trained_runs_reads_their_ranks(tmp_path: Path, capsys) -> None:
    from _engine_helpers import make_toy_dataset, toy_features
    from crossview.engine.run import train

    ds = make_toy_dataset(n_images=120)
    feats = toy_features(ds)
    for name, k in (("a", 2), ("b", 8)):
        for _ in train("cca", ds, run_dir=tmp_path / name, params={"n_components": k}, features=feats, device="cpu"):
            pass
    assert main(["eval", str(tmp_path / "a"), "--compare", str(tmp_path / "b"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    sa, sb = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("a", "b"))
    assert res["rsum"]["a"] == pytest.approx(sa["rsum"]) and res["rsum"]["b"] == pytest.approx(sb["rsum"])
    assert res["n_images"] == sa["n_images"] and res["n_captions"] == sa["n_captions"]
    assert res["resampled"].startswith("images (each with its captions)"), "the run's caption_image is used"


def test_compare_bad_input_gets_one_line(tmp_path: Path, capsys) -> None:
    ci = np.repeat(np.arange(4), 2)
    a = _ranks_run(tmp_path / "a", [1, 2, 3, 4], [1] * 8, ci)
    val = _ranks_run(tmp_path / "val", [1, 2, 3, 4], [1] * 8, ci, split="val")
    small = _ranks_run(tmp_path / "small", [1, 2, 3], [1] * 6, ci[:6])
    old = _ranks_run(tmp_path / "old", [2, 2, 3, 1], [1, 2] * 4)        # ranks.npz before caption_image
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    emb = save_embeddings(tmp_path / "e.npz", _emb(np.random.default_rng(0)))
    for argv, needle in (
            ([str(a), "--compare", str(unfinished)], "no ranks.npz"),
            ([str(a), "--compare", str(val)], "evaluated on the same split"),
            ([str(a), "--compare", str(small)], "different i2t query sets"),
            ([str(a), "--compare", str(emb)], "an embeddings file"),
            ([str(a), str(val)], "several runs (seeds) only with --compare"),
            ([str(a), "--compare", str(old), "--split", "val"], "not --split val"),
            ([str(a), "--compare", str(old), "--protocol", "identity"], "--protocol does not apply"),
            ([str(a), "--compare", str(a)], "on both sides of --compare"),
            ([str(a), str(tmp_path / "x" / ".." / "a"), "--compare", str(old), str(val)], "on side A twice"),
            ([str(a), "--compare", str(old), str(old)], "on side B twice")):
        assert main(["eval", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, (argv, err)
    assert main(["eval", str(a), "--compare", str(old)]) == 0       # no caption map: each caption its own cluster
    assert "each caption its own cluster" in capsys.readouterr().out
