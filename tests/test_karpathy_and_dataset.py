"""The data model and the Karpathy reader: fixtures written here, malformed input, the real Flickr8k sample."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from crossview.data import PairedDataset, detect_format, load_dataset
from crossview.data.images import open_image, verify_images
from crossview.data.stats import dataset_info, format_info
from crossview.core.errors import DatasetError


def _image(path: Path, colour=(200, 30, 30)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 12), colour).save(path)


def _karpathy(root: Path, entries: list[dict], name: str = "dataset_tiny.json") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    p = root / name
    p.write_text(json.dumps({"dataset": "tiny", "images": entries}))
    return p


def _entry(k: int, split: str, caps: list[str], **extra) -> dict:
    return {"filename": f"im{k}.jpg", "imgid": k, "split": split,
            "sentences": [{"raw": c, "tokens": c.lower().split()} for c in caps], **extra}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    for k in range(4):
        _image(tmp_path / "images" / f"im{k}.jpg")
    return _karpathy(tmp_path, [
        _entry(0, "train", ["A dog runs.", "A brown dog  running"]),
        _entry(1, "train", ["Two cats sleep"]),
        _entry(2, "val", ["A red car", "A car parked", "Red car on a street"]),
        _entry(3, "test", ["People at the beach"]),
    ])


def test_karpathy_reads_counts_map_and_splits(tiny: Path) -> None:
    ds = load_dataset(tiny)
    assert isinstance(ds, PairedDataset)
    assert ds.format == "karpathy" and ds.name == "tiny"
    assert (ds.n_images, ds.n_captions) == (4, 7)
    assert ds.captions[1] == "A brown dog running"  # whitespace normalised
    assert ds.caption_image.tolist() == [0, 0, 1, 2, 2, 2, 3]
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0, 1], "val": [2], "test": [3]}
    assert ds.image_paths[2] == str((tiny.parent / "images" / "im2.jpg").resolve())
    assert ds.labels.tolist() == [0, 1, 2, 3]  # default identity = the image
    assert ds.warnings == []


def test_detects_karpathy_from_file_and_folder(tiny: Path) -> None:
    assert detect_format(tiny) == "karpathy"
    assert detect_format(tiny.parent) == "karpathy"
    assert load_dataset(tiny.parent).n_captions == 7


def test_split_view_renumbers_and_keeps_ids(tiny: Path) -> None:
    ds = load_dataset(tiny)
    val = ds.split("val")
    assert (val.n_images, val.n_captions) == (1, 3)
    assert val.image_ids.tolist() == [2] and val.caption_ids.tolist() == [3, 4, 5]
    assert val.caption_image.tolist() == [0, 0, 0]
    assert val.captions_of(0) == [0, 1, 2]
    both = ds.split(("train", "test"))
    assert both.image_ids.tolist() == [0, 1, 3]
    assert both.splits["test"].tolist() == [2] and both.splits["train"].tolist() == [0, 1]
    with pytest.raises(DatasetError, match="no split named 'restval'.*train, val, test"):
        ds.split("restval")


def test_subset_keeps_caption_order_within_an_image(tiny: Path) -> None:
    ds = load_dataset(tiny)
    sub = ds.subset([2, 0])
    assert sub.image_ids.tolist() == [2, 0]
    assert sub.captions == ["A red car", "A car parked", "Red car on a street", "A dog runs.", "A brown dog running"]
    assert sub.caption_image.tolist() == [0, 0, 0, 1, 1]


def test_fingerprint_stable_across_reloads_and_sensitive_to_content(tiny: Path) -> None:
    a, b = load_dataset(tiny), load_dataset(tiny)
    assert a.fingerprint() == b.fingerprint()
    doc = json.loads(tiny.read_text())
    doc["images"][0]["sentences"][0]["raw"] = "A dog walks."
    tiny.write_text(json.dumps(doc))
    assert load_dataset(tiny).fingerprint() != a.fingerprint()


def test_coco_filepath_restval_and_extension_keys(tmp_path: Path) -> None:
    _image(tmp_path / "val2014" / "a.jpg")
    _image(tmp_path / "train2014" / "b.jpg")
    p = _karpathy(tmp_path, [
        {**_entry(0, "restval", ["x y"], label="cat", tags=["x", "Y"], labels=["p", "q"]), "filepath": "val2014",
         "filename": "a.jpg"},
        {**_entry(1, "test", ["z"], label="dog", tags="z", labels=["p"]), "filepath": "train2014",
         "filename": "b.jpg"},
    ])
    ds = load_dataset(p)
    assert ds.split_names == ["restval", "test"]
    assert ds.label_names == ["cat", "dog"] and ds.labels.tolist() == [0, 1]
    assert ds.tags == [["x", "y"], ["z"]]
    assert ds.label_sets == [["p", "q"], ["p"]]


# ---------------------------------------------------------------------------- malformed input
def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"nope\.json: no such file or folder"):
        load_dataset(tmp_path / "nope.json")


def test_invalid_json_gives_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "dataset_bad.json"
    p.write_text('{"images": [\n  {"filename": "a.jpg",,}\n]}')
    with pytest.raises(DatasetError, match=r"dataset_bad\.json: invalid JSON at line 2, column"):
        load_dataset(p, format="karpathy")


@pytest.mark.parametrize("doc, message", [
    ([1, 2], "expected a JSON object with an 'images' list"),
    ({"images": {}}, "expected a JSON object with an 'images' list"),
    ({"images": []}, "the 'images' list is empty"),
    ({"images": ["a.jpg"]}, r"images\[0\]\): expected an object, got str"),
    ({"images": [{"split": "train", "sentences": []}]}, r"images\[0\]\): missing or empty 'filename'"),
    ({"images": [{"filename": "a.jpg"}]}, r"images\[0\] 'a.jpg'\): missing 'sentences' list"),
])
def test_wrong_shape_is_one_clear_error(tmp_path: Path, doc, message: str) -> None:
    p = tmp_path / "dataset_x.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match=message) as info:
        load_dataset(p, format="karpathy")
    assert str(p.resolve()) in str(info.value) and "\n" not in str(info.value)


def test_duplicate_ids_and_files_are_errors(tmp_path: Path) -> None:
    for k in range(2):
        _image(tmp_path / "images" / f"im{k}.jpg")
    p = _karpathy(tmp_path, [_entry(0, "train", ["a"]), {**_entry(1, "train", ["b"]), "imgid": 0}])
    with pytest.raises(DatasetError, match=r"images\[1\] 'im1.jpg'\): duplicate imgid 0 \(also images\[0\]\)"):
        load_dataset(p)
    p = _karpathy(tmp_path, [_entry(0, "train", ["a"]), {**_entry(0, "train", ["b"]), "imgid": 7}])
    with pytest.raises(DatasetError, match=r"duplicate image: the same file as images\[0\]"):
        load_dataset(p)


def test_missing_images_skipped_with_count_and_all_missing_is_error(tmp_path: Path) -> None:
    _image(tmp_path / "images" / "im0.jpg")
    _image(tmp_path / "images" / "im2.jpg")
    p = _karpathy(tmp_path, [_entry(k, "train", [f"c{k}"]) for k in range(4)])
    ds = load_dataset(p)
    assert ds.n_images == 2 and ds.captions == ["c0", "c2"]
    assert ds.image_ids.tolist() == [0, 1]  # renumbered contiguously in file order
    assert any("skipped 2 of 4 images whose file is missing" in w and "im1.jpg" in w for w in ds.warnings)
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    with pytest.raises(DatasetError, match="none of the 4 images it lists exist under .*--image-root"):
        load_dataset(p, image_root=empty)


def test_empty_captions_skipped_and_captionless_images_dropped(tmp_path: Path) -> None:
    for k in range(2):
        _image(tmp_path / "images" / f"im{k}.jpg")
    p = _karpathy(tmp_path, [_entry(0, "train", ["fine", "  ", ""]), _entry(1, "train", [" "])])
    ds = load_dataset(p)
    assert ds.captions == ["fine"] and ds.n_images == 1
    assert "skipped 3 empty caption(s)" in ds.warnings
    assert "skipped 1 image(s) with no non-empty caption" in ds.warnings


def test_explicit_image_root(tmp_path: Path) -> None:
    _image(tmp_path / "pics" / "im0.jpg")
    p = _karpathy(tmp_path / "ann", [_entry(0, "test", ["c"])])
    ds = load_dataset(p, image_root=tmp_path / "pics")
    assert ds.image_paths == [str((tmp_path / "pics" / "im0.jpg").resolve())]


def test_unknown_format_lists_known_ones(tiny: Path) -> None:
    with pytest.raises(DatasetError, match="unknown dataset format 'coco'.*Known formats: demo, .*karpathy"):
        load_dataset(tiny, format="coco")


def test_undetectable_path(tmp_path: Path) -> None:
    p = tmp_path / "weird.bin"
    p.write_bytes(b"\x00\x01")
    with pytest.raises(DatasetError, match="cannot tell the dataset format.*--format"):
        load_dataset(p)


# ---------------------------------------------------------------------------- images
def test_truncated_and_non_image_files_named(tmp_path: Path) -> None:
    good = tmp_path / "good.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(good, quality=95)
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    text = tmp_path / "text.jpg"
    text.write_text("not an image")
    assert open_image(good).size == (64, 64)
    with pytest.raises(DatasetError, match=r"truncated\.jpg: unreadable image.*truncated or corrupt"):
        open_image(truncated)
    with pytest.raises(DatasetError, match=r"text\.jpg: not an image file"):
        open_image(text)
    with pytest.raises(DatasetError, match=r"absent\.jpg: image file not found"):
        open_image(tmp_path / "absent.jpg")
    bad = verify_images([str(good), str(truncated), str(text)])
    assert [i for i, _ in bad] == [1, 2]


# ---------------------------------------------------------------------------- the real sample
def test_flickr8k_sample(flickr8k_sample: Path) -> None:
    ds = load_dataset(flickr8k_sample / "dataset_flickr8k_sample.json")
    assert (ds.n_images, ds.n_captions) == (700, 3500)
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 600, "val": 100}
    assert np.all(np.bincount(ds.caption_image) == 5)
    assert ds.warnings == []
    info = dataset_info(ds)
    assert info["splits"] == {"train": {"images": 600, "captions": 3000}, "val": {"images": 100, "captions": 500}}
    assert info["captions_per_image"] == {"min": 5, "mean": 5.0, "max": 5}
    assert 2000 < info["vocabulary"] < 4000
    text = format_info(info)
    assert "3,500" in text and "train 600 images" in text
    assert all(Path(p).is_file() for p in ds.image_paths[:20])
