"""``crossview data make-web`` / :func:`crossview.features.web_set.make_web_set`: a web image-tag set from a
caption dataset, its tags the nouns and verbs of the captions with noise at the stated rates; the webtags
reader reads it back; bad input gets one line and nothing is overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.data.readers import load_dataset
from crossview.features.web_set import make_web_set, noisy_tags
from test_readers import make_image, write_jsonl


def _caption_set(tmp_path: Path) -> Path:
    root = tmp_path / "clean"
    rows = []
    for i, (a, b) in enumerate([("A dog runs on the beach .", "Two dogs play in the sand ."),
                                ("A man rides a bicycle .", "The cyclist climbs a hill ."),
                                ("A girl eats an apple .", "A child holds a red apple .")]):
        make_image(root / f"{i}.jpg")
        rows += [{"image": f"{i}.jpg", "caption": a, "split": "train"},
                 {"image": f"{i}.jpg", "caption": b, "split": "train"}]
    make_image(root / "9.jpg")
    rows.append({"image": "9.jpg", "caption": "A cat sleeps .", "split": "val"})
    write_jsonl(root / "captions.jsonl", rows)
    return root


def test_tags_are_the_captions_nouns_and_verbs_and_read_back(tmp_path) -> None:
    ds = load_dataset(_caption_set(tmp_path))
    path = make_web_set(ds, tmp_path / "web", drop=0.0, add=0.0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 3, "the train split only"
    # by how many captions name them (dog: 2), then in order of first mention
    assert rows[0]["true_tags"] == ["dog", "run", "beach", "play", "sand"]
    assert rows[1]["true_tags"] == ["man", "ride", "bicycle", "cyclist", "climb", "hill"]
    assert rows[2]["true_tags"] == ["apple", "girl", "eat", "child", "hold"]
    assert all(sorted(r["tags"]) == sorted(r["true_tags"]) for r in rows), "no noise at rates 0"
    web = load_dataset(tmp_path / "web")
    assert web.format == "webtags" and web.n_images == 3 and web.tags[1] == rows[1]["tags"]
    info = json.loads((tmp_path / "web" / "web.json").read_text())
    assert "not independent web data" in info["what"] and info["images"] == 3 and info["split"] == "train"


def test_noise_rates_are_what_they_say() -> None:
    rng = np.random.default_rng(0)
    pool = [f"t{i}" for i in range(200)]
    weights = np.linspace(1, 5, 200)
    dropped = added = total = 0
    for _ in range(2000):
        true = list(rng.choice(pool, size=8, replace=False))
        out = noisy_tags(true, rng, pool, weights, drop=0.3, add=0.25)
        assert out and len(set(out)) == len(out)
        dropped += len(set(true) - set(out))
        added += len(set(out) - set(true))
        total += len(true)
    assert dropped / total == pytest.approx(0.3, abs=0.015)
    assert added / total == pytest.approx(0.25, abs=0.015)
    assert noisy_tags(["only"], rng, pool, weights, drop=1.0, add=0.0) == ["only"], "one tag always stays"
    assert noisy_tags([], rng, pool, weights) == []


def test_bad_input_gets_one_line_and_nothing_is_overwritten(tmp_path, capsys) -> None:
    src = _caption_set(tmp_path)
    ds = load_dataset(src)
    with pytest.raises(CrossViewError, match="rate from 0 to 1"):
        make_web_set(ds, tmp_path / "w", drop=1.5)
    with pytest.raises(CrossViewError, match="no split 'test'"):
        make_web_set(ds, tmp_path / "w", split="test")
    make_web_set(ds, tmp_path / "w")
    before = (tmp_path / "w" / "tags.jsonl").read_bytes()
    assert main(["data", "make-web", str(src), "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip()
    assert "exists" in err and len(err.splitlines()) == 1
    assert (tmp_path / "w" / "tags.jsonl").read_bytes() == before
    run = tmp_path / "a-run"                  # a folder holding something else (a run) is not written into
    run.mkdir()
    (run / "config.json").write_text("{}")
    assert main(["data", "make-web", str(src), "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "exists and holds other files" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]
    import _engine_helpers as H

    with pytest.raises(CrossViewError, match="no image files"):
        make_web_set(H.make_toy_dataset(), tmp_path / "t")


@pytest.mark.slow
def test_on_the_flickr8k_sample(tmp_path, flickr8k_sample, capsys) -> None:
    assert main(["data", "make-web", str(flickr8k_sample / "dataset_flickr8k_sample.json"),
                 "--out", str(tmp_path / "web")]) == 0
    info = json.loads((tmp_path / "web" / "web.json").read_text())
    assert info["images"] == 600 and info["true_tags_per_image"] > 8
    assert info["dropped_fraction"] == pytest.approx(0.2, abs=0.03)
    assert info["added_per_true_tag"] == pytest.approx(0.2, abs=0.03)
    assert load_dataset(tmp_path / "web").n_images == 600
