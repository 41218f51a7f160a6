"""The dataset readers: each format on tiny fixtures written here, and malformed input for each.

Every error must be a DatasetError whose message names the file and the entry; recoverable problems
(missing images, empty captions) must be skipped and counted in ``ds.warnings``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from crossview.data.dataset import PairedDataset, TextCorpus
from crossview.data.readers import detect_format, load_dataset
from crossview.data.readers import corpus, cuhk_pedes, folder, labels, precomp, reed, webtags
from crossview.core.errors import DatasetError


# ---------------------------------------------------------------------------------------------- helpers
def make_image(path: Path, color: tuple[int, int, int] = (200, 30, 30)) -> Path:
    """A tiny real image (JPEG or PNG from the suffix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), color).save(path)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def error_of(fn, *args, **kwargs) -> str:
    with pytest.raises(DatasetError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def resolved(path: Path) -> str:
    return str(path.resolve())


# ---------------------------------------------------------------------------------------------- folder
@pytest.fixture
def caption_folder(tmp_path: Path) -> Path:
    root = tmp_path / "pets"
    make_image(root / "img" / "a.jpg")
    make_image(root / "img" / "b.png")
    make_image(root / "img" / "c.jpg")
    write_jsonl(root / "captions.jsonl", [
        {"image": "img/a.jpg", "caption": "a  dog\trunning", "label": "dog", "tags": ["Dog", "grass"], "split": "train"},
        {"image": "img/b.png", "caption": "a cat", "label": "cat", "tags": "cat,sofa", "split": "test"},
        {"image": "img/a.jpg", "caption": "the dog runs", "tags": ["dog", "ball"]},
        {"image": "img/c.jpg", "caption": "another cat", "label": "cat", "split": "dev"},
    ])
    return root


def test_folder_jsonl(caption_folder: Path) -> None:
    ds = load_dataset(caption_folder)
    assert isinstance(ds, PairedDataset) and ds.format == "folder" and ds.name == "pets"
    assert ds.image_paths == [resolved(caption_folder / "img" / n) for n in ("a.jpg", "b.png", "c.jpg")]
    assert ds.captions == ["a dog running", "a cat", "the dog runs", "another cat"]
    assert ds.caption_image.tolist() == [0, 1, 0, 2]
    assert ds.label_names == ["cat", "dog"] and ds.labels.tolist() == [1, 0, 0]
    assert ds.tags == [["dog", "grass", "ball"], ["cat", "sofa"], []]
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0], "test": [1], "val": [2]}
    assert ds.warnings == [] and "generated_splits" not in ds.meta
    assert detect_format(caption_folder) == "folder"
    assert detect_format(caption_folder / "captions.jsonl") == "folder"
    again = folder.read(caption_folder / "captions.jsonl")
    assert again.fingerprint() == ds.fingerprint()


def test_folder_relative_path(caption_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(caption_folder)
    ds = load_dataset("captions.jsonl")
    assert ds.name == "pets" and ds.source == resolved(caption_folder / "captions.jsonl")
    assert ds.image_paths[0] == resolved(caption_folder / "img" / "a.jpg")


def test_folder_csv_generated_splits_and_image_root(tmp_path: Path) -> None:
    images = tmp_path / "pics"
    lines = ["image,caption"]
    for k in range(10):
        make_image(images / f"{k}.jpg", (k * 20, 0, 0))
        lines += [f"{k}.jpg,photo number {k}", f'{k}.jpg,"a picture, number {k}"']
    ann = write(tmp_path / "ann" / "captions.csv", "\n".join(lines) + "\n")
    ds = load_dataset(ann.parent, image_root=images)
    assert ds.n_images == 10 and ds.n_captions == 20
    assert ds.captions[:2] == ["photo number 0", "a picture, number 0"]
    assert ds.caption_image.tolist() == [k // 2 for k in range(20)]
    assert ds.meta["generated_splits"] is True
    assert sorted(np.concatenate(list(ds.splits.values())).tolist()) == list(range(10))
    assert ds.labels.tolist() == list(range(10)) and ds.tags is None and ds.label_names is None


def test_folder_csv_optional_columns(tmp_path: Path) -> None:
    make_image(tmp_path / "x.jpg")
    make_image(tmp_path / "y.jpg")
    write(tmp_path / "captions.csv", 'image,caption,label,tags,split\n'
          'x.jpg,a red square,1,"red;square",train\ny.jpg,a blue one,2,blue,\n')
    ds = folder.read(tmp_path)
    assert ds.label_names == ["1", "2"] and ds.labels.tolist() == [0, 1]
    assert ds.tags == [["red", "square"], ["blue"]]
    assert ds.splits["train"].tolist() == [0, 1]
    assert any("1 image(s) have no split" in w for w in ds.warnings)


def test_folder_missing_images_and_empty_captions(caption_folder: Path) -> None:
    (caption_folder / "img" / "b.png").unlink()
    rows = [json.loads(line) for line in (caption_folder / "captions.jsonl").read_text().splitlines()]
    rows.append({"image": "img/c.jpg", "caption": "   "})
    write_jsonl(caption_folder / "captions.jsonl", rows)
    ds = folder.read(caption_folder)
    assert ds.n_images == 2 and ds.captions == ["a dog running", "the dog runs", "another cat"]
    assert ds.caption_image.tolist() == [0, 0, 1]
    joined = " | ".join(ds.warnings)
    assert "1 of 3 images" in joined and "line 2 'img/b.png'" in joined
    assert "1 empty caption" in joined


def test_folder_all_images_missing(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "captions.jsonl", [{"image": "nowhere.jpg", "caption": "x"}])
    msg = error_of(folder.read, tmp_path)
    assert "captions.jsonl" in msg and "--image-root" in msg and "nowhere.jpg" in msg


def test_folder_malformed(tmp_path: Path) -> None:
    make_image(tmp_path / "a.jpg")
    f = write(tmp_path / "captions.jsonl", '{"image": "a.jpg", "caption": "ok"}\n{"image": "a.jpg", "caption": \n')
    msg = error_of(folder.read, f)
    assert "captions.jsonl (line 2)" in msg and "invalid JSON" in msg and "column" in msg
    write(f, '["a.jpg", "a caption"]\n')
    assert "(line 1)" in (msg := error_of(folder.read, f)) and "JSON object" in msg
    write_jsonl(f, [{"image": "a.jpg", "text": "a caption"}])
    msg = error_of(folder.read, f)
    assert "line 1 'a.jpg'" in msg and "'caption'" in msg
    write_jsonl(f, [{"caption": "no image"}])
    assert "(line 1)" in (msg := error_of(folder.read, f)) and "'image'" in msg
    write_jsonl(f, [{"image": "a.jpg", "caption": ["not", "text"]}])
    assert "must be a string" in error_of(folder.read, f)


def test_folder_conflicts_name_both_lines(tmp_path: Path) -> None:
    make_image(tmp_path / "a.jpg")
    make_image(tmp_path / "b.jpg")
    f = write_jsonl(tmp_path / "captions.jsonl", [
        {"image": "a.jpg", "caption": "one", "label": "x"},
        {"image": "b.jpg", "caption": "two", "label": "y"},
        {"image": "./a.jpg", "caption": "three", "label": "z"},
    ])
    msg = error_of(folder.read, f)
    assert "captions.jsonl (line 3 './a.jpg')" in msg and "line 1" in msg and "'x'" in msg
    write_jsonl(f, [{"image": "a.jpg", "caption": "one", "label": "x"}, {"image": "b.jpg", "caption": "two"}])
    msg = error_of(folder.read, f)
    assert "line 2 'b.jpg'" in msg and "no label" in msg


def test_folder_csv_errors(tmp_path: Path) -> None:
    make_image(tmp_path / "a.jpg")
    f = write(tmp_path / "captions.csv", "image,text\na.jpg,hello\n")
    msg = error_of(folder.read, f)
    assert "captions.csv (line 1)" in msg and "caption" in msg
    write(f, "image,caption\na.jpg,hello\na.jpg,hello,extra\n")
    msg = error_of(folder.read, f)
    assert "captions.csv (line 3)" in msg and "more fields" in msg
    write(f, "")
    assert "empty" in error_of(folder.read, f)


def test_folder_missing_file(tmp_path: Path) -> None:
    msg = error_of(load_dataset, tmp_path / "nope")
    assert "nope" in msg and "no such file" in msg
    (tmp_path / "empty").mkdir()
    msg = error_of(folder.read, tmp_path / "empty")
    assert "empty" in msg and "captions.jsonl" in msg
    msg = error_of(detect_format, tmp_path / "empty")
    assert "--format" in msg
    write(tmp_path / "both" / "captions.jsonl", "")
    write(tmp_path / "both" / "captions.csv", "")
    assert "both captions.jsonl and captions.csv" in error_of(folder.read, tmp_path / "both")


# ---------------------------------------------------------------------------------------------- webtags
def test_webtags_jsonl(tmp_path: Path) -> None:
    root = tmp_path / "web"
    for n in ("1.jpg", "2.jpg", "3.jpg"):
        make_image(root / "img" / n)
    write_jsonl(root / "tags.jsonl", [
        {"image": "img/1.jpg", "tags": ["Beach", "sea", "beach"]},
        {"image": "img/2.jpg", "tags": "dog, park"},
        {"image": "img/3.jpg", "tags": []},
        {"image": "img/4.jpg", "tags": ["lost"]},
    ])
    ds = load_dataset(root)
    assert ds.format == "webtags" and detect_format(root / "tags.jsonl") == "webtags"
    assert ds.n_images == 3 and ds.captions == [] and len(ds.caption_image) == 0
    assert ds.tags == [["beach", "sea"], ["dog", "park"], []]
    assert ds.splits["train"].tolist() == [0, 1, 2] and list(ds.splits) == ["train"]
    joined = " | ".join(ds.warnings)
    assert "1 of 3 image(s) have no tags" in joined and "1 of 4 images" in joined and "img/4.jpg" in joined


def test_webtags_txt_and_csv(tmp_path: Path) -> None:
    make_image(tmp_path / "a.jpg")
    make_image(tmp_path / "b c.jpg")
    write(tmp_path / "tags.txt", "a.jpg sky cloud\n\nb c.jpg\tred,blue car\n")
    ds = webtags.read(tmp_path / "tags.txt")
    assert ds.tags == [["sky", "cloud"], ["red", "blue car"]]
    assert ds.image_paths == [resolved(tmp_path / "a.jpg"), resolved(tmp_path / "b c.jpg")]
    assert detect_format(tmp_path / "tags.txt") == "webtags"  # not the corpus reader
    write(tmp_path / "sub" / "tags.csv", 'image,tags\na.jpg,"x,y"\n')
    ds = webtags.read(tmp_path / "sub", image_root=tmp_path)
    assert ds.tags == [["x", "y"]]


def test_webtags_folder_of_images_with_a_tag_file_each(tmp_path: Path) -> None:
    root = tmp_path / "crawl"
    for n in ("a/1.jpg", "a/2.png", "b/3.jpg", "4.jpg"):
        make_image(root / n)
    write(root / "a" / "1.tags", "Dog, beach\nsea")
    write(root / "a" / "2.txt", "cat sofa cat")
    write(root / "b" / "3.tags", "")                      # empty: kept
    write(root / "orphan.tags", "nothing")               # no image beside it: ignored
    assert detect_format(root) == "webtags"
    ds = load_dataset(root)
    assert ds.format == "webtags" and ds.meta["layout"] == "sidecar" and ds.captions == []
    assert [Path(p).relative_to(root).as_posix() for p in ds.image_paths] == ["4.jpg", "a/1.jpg", "a/2.png", "b/3.jpg"]
    assert ds.tags == [[], ["dog", "beach", "sea"], ["cat", "sofa"], []]
    joined = " | ".join(ds.warnings)
    assert "1 of 4 image(s) have no tag file" in joined and "1 of 4 image(s) have an empty tag file" in joined


def test_webtags_sidecar_folder_errors(tmp_path: Path) -> None:
    make_image(tmp_path / "only" / "1.jpg")
    assert "none of the 1 images has a tag file" in error_of(webtags.read, tmp_path / "only")
    (tmp_path / "empty").mkdir()
    assert "no images in the folder" in error_of(webtags.read, tmp_path / "empty")
    make_image(tmp_path / "bin" / "1.jpg")
    (tmp_path / "bin" / "1.tags").write_bytes(b"\x00\x01\xff\xfe")
    msg = error_of(webtags.read, tmp_path / "bin")
    assert "1.tags" in msg and ("binary" in msg or "text" in msg)
    make_image(tmp_path / "caps" / "1.jpg")
    write(tmp_path / "caps" / "1.tags", "x")
    write(tmp_path / "caps" / "captions.csv", "image,caption\n1.jpg,a thing\n")
    assert detect_format(tmp_path / "caps") == "folder", "a captions file makes it a caption folder"


def test_webtags_errors(tmp_path: Path) -> None:
    make_image(tmp_path / "a.jpg")
    f = write_jsonl(tmp_path / "tags.jsonl", [{"image": "a.jpg", "tags": ["x"]}, {"image": "b.jpg", "tags": []},
                                               {"image": "a.jpg", "tags": ["y"]}])
    msg = error_of(webtags.read, f)
    assert "tags.jsonl (line 3 'a.jpg')" in msg and "line 1" in msg and "duplicate" in msg
    write_jsonl(f, [{"image": "a.jpg", "labels": ["x"]}])
    assert "(line 1)" in (msg := error_of(webtags.read, f)) and "'tags'" in msg
    write_jsonl(f, [{"image": "a.jpg", "tags": {"x": 1}}])
    assert "list or a string" in error_of(webtags.read, f)
    write(f, "")
    assert "no images" in error_of(webtags.read, f)
    write_jsonl(f, [{"image": "gone.jpg", "tags": ["x"]}])
    assert "--image-root" in error_of(webtags.read, f)
    f.unlink()
    write(tmp_path / "tags.csv", "image\na.jpg\n")
    msg = error_of(webtags.read, tmp_path)
    assert "tags.csv (line 1)" in msg and "tags" in msg


# ---------------------------------------------------------------------------------------------- labels
def test_labels_single_label_gives_classes(tmp_path: Path) -> None:
    for n in ("a", "b", "c"):
        make_image(tmp_path / f"{n}.png")
    write_jsonl(tmp_path / "labels.jsonl", [{"image": "a.png", "labels": ["Zebra"]},
                                            {"image": "b.png", "labels": "ant"},
                                            {"image": "c.png", "labels": ["zebra"]}])
    ds = load_dataset(tmp_path)
    assert ds.format == "labels" and detect_format(tmp_path / "labels.jsonl") == "labels"
    assert ds.label_sets == [["zebra"], ["ant"], ["zebra"]]
    assert ds.label_names == ["ant", "zebra"] and ds.labels.tolist() == [1, 0, 1]
    assert ds.captions == [] and ds.splits["train"].tolist() == [0, 1, 2]


def test_labels_phrases_txt(tmp_path: Path) -> None:
    make_image(tmp_path / "a.jpg")
    make_image(tmp_path / "b.jpg")
    write(tmp_path / "labels.txt", "a.jpg\tred ball, small  dog\nb.jpg\tgrass\n")
    ds = labels.read(tmp_path / "labels.txt")
    assert detect_format(tmp_path / "labels.txt") == "labels"
    assert ds.label_sets == [["red ball", "small dog"], ["grass"]]
    assert ds.labels.tolist() == [0, 1] and ds.label_names is None
    write(tmp_path / "labels.txt", "a.jpg red ball\n")
    msg = error_of(labels.read, tmp_path / "labels.txt")
    assert "labels.txt (line 1)" in msg and "tab" in msg


def test_labels_errors(tmp_path: Path) -> None:
    make_image(tmp_path / "a.jpg")
    f = write(tmp_path / "labels.csv", 'image,labels\na.jpg,x\nb.jpg,y\n"a.jpg",z\n')
    msg = error_of(labels.read, f)
    assert "labels.csv (line 4 'a.jpg')" in msg and "line 2" in msg
    write(f, "image,labels\na.jpg,x,y\n")
    assert "labels.csv (line 2)" in (msg := error_of(labels.read, f)) and "more fields" in msg
    write(tmp_path / "labels.jsonl", "")
    assert "both labels.jsonl and labels.csv" in error_of(labels.read, tmp_path)


def test_attach_label_sets(caption_folder: Path) -> None:
    ds = folder.read(caption_folder)
    write(caption_folder / "labels.txt", "img/a.jpg\tdog,ball\nimg/c.jpg\tcat\nimg/zzz.jpg\tnothing\n")
    out = labels.attach_label_sets(ds, caption_folder / "labels.txt")
    assert out.label_sets == [["dog", "ball"], [], ["cat"]]
    assert out.captions == ds.captions and out.labels.tolist() == ds.labels.tolist()
    joined = " | ".join(out.warnings)
    assert "ignored 1 of 3 entries" in joined and "img/zzz.jpg" in joined and "1 of 3 image(s)" in joined
    assert ds.label_sets is None  # the original is untouched
    write(caption_folder / "labels.txt", "other/a.jpg\tdog\n")
    msg = error_of(labels.attach_label_sets, ds, caption_folder / "labels.txt")
    assert "labels.txt" in msg and "none of its 1 entries" in msg


# ---------------------------------------------------------------------------------------------- corpus
def test_corpus(tmp_path: Path) -> None:
    f = write(tmp_path / "extra_text.txt", "A man  rides a horse.\n\n   \nTwo dogs play\n")
    ds = load_dataset(f)
    assert isinstance(ds, TextCorpus) and detect_format(f) == "corpus"
    assert ds.captions == ["A man rides a horse.", "Two dogs play"] and ds.name == "extra_text"
    assert ds.warnings == ["skipped 2 blank line(s)"]


def test_corpus_errors(tmp_path: Path) -> None:
    f = write(tmp_path / "c.txt", "")
    assert "c.txt" in (msg := error_of(corpus.read, f)) and "empty" in msg
    write(f, "\n \n")
    assert "no caption" in error_of(corpus.read, f)
    f.write_bytes("ok\n".encode() + b"caf\xe9\n")
    msg = error_of(corpus.read, f)
    assert "c.txt" in msg and "UTF-8" in msg and "byte 6" in msg
    assert "expected a file" in error_of(load_dataset, tmp_path, format="corpus")
    assert not corpus.detect(tmp_path) and not corpus.detect(write(tmp_path / "tags.txt", "a.jpg x\n"))


# ---------------------------------------------------------------------------------------------- precomp
def _feats(n: int, d: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def test_precomp_splits(tmp_path: Path) -> None:
    root = tmp_path / "f30k_precomp"
    root.mkdir()
    train = np.repeat(_feats(2), 5, axis=0)                 # VSE++ repeats each image per caption
    np.save(root / "train_ims.npy", train)
    write(root / "train_caps.txt", "".join(f"train caption {k}\n" for k in range(10)))
    np.save(root / "dev_ims.npy", _feats(2, seed=1))        # 5 captions per image
    write(root / "dev_caps.txt", "".join(f"dev caption {k}\n" for k in range(10)))
    np.save(root / "test_ims.npy", _feats(3, seed=2))       # one caption per image, rows all differ
    write(root / "test_caps.txt", "t0\n\nt2\n")
    ds = load_dataset(root)
    assert ds.format == "precomp" and ds.name == "f30k" and not ds.has_image_files
    # test image 1 has only a blank caption: it is dropped with its feature row
    assert ds.image_features.shape == (6, 6) and ds.image_features.dtype == np.float32
    assert np.array_equal(ds.image_features[:2], train[::5])
    assert np.array_equal(ds.image_features[5], _feats(3, seed=2)[2])
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0, 1], "val": [2, 3], "test": [4, 5]}
    assert ds.n_captions == 22 and ds.captions[-2:] == ["t0", "t2"]
    assert ds.caption_image.tolist() == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5 + [4, 5]
    assert any("1 empty caption" in w and "test_caps.txt" in w for w in ds.warnings)
    assert any("1 image(s) of test_ims.npy" in w for w in ds.warnings)
    assert ds.split("val").captions[0] == "dev caption 0"


def test_precomp_single_split_stays_memory_mapped(tmp_path: Path) -> None:
    np.save(tmp_path / "testall_ims.npy", _feats(4))
    write(tmp_path / "testall_caps.txt", "".join(f"c{k}\n" for k in range(8)))
    ds = precomp.read(tmp_path)
    assert isinstance(ds.image_features, np.memmap)
    assert ds.splits["testall"].tolist() == [0, 1, 2, 3] and ds.caption_image.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_precomp_errors(tmp_path: Path) -> None:
    np.save(tmp_path / "test_ims.npy", _feats(3))
    write(tmp_path / "test_caps.txt", "a\nb\nc\nd\n")
    msg = error_of(precomp.read, tmp_path)
    assert "test_caps.txt" in msg and "4 captions" in msg and "3 images" in msg
    write(tmp_path / "test_caps.txt", "a\nb\n")
    msg = error_of(precomp.read, tmp_path)
    assert "test_ims.npy" in msg and "3 feature rows" in msg
    write(tmp_path / "test_caps.txt", "a\nb\nc\n")
    assert precomp.read(tmp_path).n_images == 3
    write(tmp_path / "train_caps.txt", "x\n")
    msg = error_of(precomp.read, tmp_path)
    assert "train_caps.txt" in msg and "train_ims.npy is missing" in msg
    np.save(tmp_path / "train_ims.npy", _feats(1, d=4))
    msg = error_of(precomp.read, tmp_path)
    assert "test_ims.npy" in msg and "feature size 6 differs from 4" in msg
    np.save(tmp_path / "train_ims.npy", np.zeros((1, 2, 3), dtype=np.float32))
    msg = error_of(precomp.read, tmp_path)
    assert "train_ims.npy" in msg and "2-d" in msg
    (tmp_path / "train_ims.npy").write_bytes(b"not an array at all")
    assert "train_ims.npy" in (msg := error_of(precomp.read, tmp_path)) and "not a .npy file" in msg
    np.save(tmp_path / "train_ims.npy", _feats(1))
    write(tmp_path / "train_caps.txt", "  \n")
    assert "train_caps.txt" in (msg := error_of(precomp.read, tmp_path)) and "blank" in msg
    for f in tmp_path.iterdir():
        f.unlink()
    write(tmp_path / "readme.md", "")
    assert not precomp.detect(tmp_path)
    assert "no {split}_ims.npy" in error_of(precomp.read, tmp_path)


# ---------------------------------------------------------------------------------------------- CUHK-PEDES
def _pedes(root: Path, entries: list[dict]) -> Path:
    path = root / "reid_raw.json"
    write(path, json.dumps(entries))
    return path


def _pedes_entry(fp: str, pid: int, split: str = "train", caps: list | None = None) -> dict:
    return {"split": split, "captions": caps if caps is not None else [f"person {fp} walking", f"{fp} in red"],
            "file_path": fp, "id": pid, "processed_tokens": [["x"]]}


def test_cuhk_pedes(tmp_path: Path) -> None:
    for fp in ("CUHK01/0107002.png", "CUHK01/0107004.png", "cam_a/9_0.jpg"):
        make_image(tmp_path / "imgs" / fp)
    f = _pedes(tmp_path, [_pedes_entry("CUHK01/0107002.png", 107), _pedes_entry("CUHK01/0107004.png", 107),
                          _pedes_entry("cam_a/9_0.jpg", 9, "test", ["  one caption ", ""])])
    ds = load_dataset(f)
    assert ds.format == "cuhk-pedes" and detect_format(tmp_path) == "cuhk-pedes" and detect_format(f) == "cuhk-pedes"
    assert ds.image_paths[0] == resolved(tmp_path / "imgs" / "CUHK01" / "0107002.png")
    assert ds.n_captions == 5 and ds.captions[4] == "one caption" and ds.caption_image.tolist() == [0, 0, 1, 1, 2]
    assert ds.labels.tolist() == [1, 1, 0] and ds.label_names == ["9", "107"]
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0, 1], "test": [2]}
    assert ds.warnings == ["skipped 1 empty caption(s)"]
    other = tmp_path / "elsewhere"
    make_image(other / "CUHK01" / "0107002.png")
    ds = cuhk_pedes.read(f, image_root=other)
    assert ds.n_images == 1 and "2 of 3 images" in ds.warnings[0]


def test_cuhk_pedes_errors(tmp_path: Path) -> None:
    make_image(tmp_path / "imgs" / "a.png")
    f = _pedes(tmp_path, [_pedes_entry("a.png", 1), _pedes_entry("b.png", 2), _pedes_entry("a.png", 3)])
    msg = error_of(cuhk_pedes.read, f)
    assert "reid_raw.json (entry 2 'a.png')" in msg and "entry 0" in msg and "duplicate" in msg
    entry = _pedes_entry("a.png", 1)
    del entry["id"]
    assert "(entry 0 'a.png')" in (msg := error_of(cuhk_pedes.read, _pedes(tmp_path, [entry]))) and "'id'" in msg
    entry = _pedes_entry("a.png", 1)
    del entry["captions"]
    assert "'captions'" in error_of(cuhk_pedes.read, _pedes(tmp_path, [entry]))
    assert "'file_path'" in error_of(cuhk_pedes.read, _pedes(tmp_path, [{"id": 1, "captions": []}]))
    assert "'id' must be an integer" in error_of(cuhk_pedes.read, _pedes(tmp_path, [_pedes_entry("a.png", "x")]))
    assert "'split'" in error_of(cuhk_pedes.read, _pedes(tmp_path, [_pedes_entry("a.png", 1, "holdout")]))
    msg = error_of(cuhk_pedes.read, _pedes(tmp_path, {"file_path": "a.png"}))
    assert "reid_raw.json" in msg and "JSON list" in msg
    write(f, '[{"file_path": "a.png",\n  "id": 1,,}]')
    msg = error_of(cuhk_pedes.read, f)
    assert "reid_raw.json" in msg and "line 2, column" in msg
    msg = error_of(cuhk_pedes.read, _pedes(tmp_path, [_pedes_entry("missing.png", 1)]))
    assert "--image-root" in msg and "missing.png" in msg


# ---------------------------------------------------------------------------------------------- Reed et al.
def _reed(root: Path, flat: bool) -> Path:
    """Three classes with two images each; B's second image has no caption file, C's has no image."""
    for cls, stems in (("001.Albatross", ("alb_1", "alb_2")), ("002.Bunting", ("bun_1", "bun_2")),
                       ("003.Crow", ("crow_1", "crow_2"))):
        for stem in stems:
            image = root / "jpg" / f"{stem}.jpg" if flat else root / "images" / cls / f"{stem}.jpg"
            if stem != "crow_2":
                make_image(image)
            if stem != "bun_2":
                write(root / "text_c10" / cls / f"{stem}.txt", f"this bird {stem} is small\n\nit has a beak\n")
    return root


def test_reed_cub_layout(tmp_path: Path) -> None:
    root = _reed(tmp_path / "cub", flat=False)
    write(root / "trainclasses.txt", "001.Albatross\n")
    write(root / "valclasses.txt", "002.Bunting\n")
    write(root / "testclasses.txt", "003.Crow\n\n")
    write(root / "trainvalclasses.txt", "001.Albatross\n002.Bunting\n")
    ds = load_dataset(root)
    assert ds.format == "reed" and detect_format(root) == "reed" and ds.name == "cub"
    assert ds.image_paths == [resolved(root / "images" / c / f"{s}.jpg") for c, s in
                              (("001.Albatross", "alb_1"), ("001.Albatross", "alb_2"), ("002.Bunting", "bun_1"),
                               ("003.Crow", "crow_1"))]
    assert ds.n_captions == 8 and ds.captions[:2] == ["this bird alb_1 is small", "it has a beak"]
    assert ds.caption_image.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert ds.label_names == ["001.Albatross", "002.Bunting", "003.Crow"] and ds.labels.tolist() == [0, 0, 1, 2]
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0, 1], "val": [2], "test": [3]}
    joined = " | ".join(ds.warnings)
    assert "1 of 5 images" in joined and "crow_2.txt" in joined           # caption file without an image
    assert "1 image(s)" in joined and "no caption file" in joined           # image without a caption file
    assert "4 empty caption line(s)" in joined


def test_reed_flowers_layout(tmp_path: Path) -> None:
    root = _reed(tmp_path / "flowers", flat=True)
    write(root / "trainvalclasses.txt", "001.Albatross\n002.Bunting\n")
    write(root / "testclasses.txt", "003.Crow\n")
    assert detect_format(root / "text_c10") == "reed"
    ds = reed.read(root / "text_c10")
    assert ds.image_paths[0] == resolved(root / "jpg" / "alb_1.jpg") and ds.n_images == 4
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0, 1, 2], "test": [3]}


def test_reed_no_split_files_and_errors(tmp_path: Path) -> None:
    root = _reed(tmp_path / "cub", flat=False)
    ds = reed.read(root)
    assert ds.splits["train"].tolist() == [0, 1, 2, 3] and any("all images are in 'train'" in w for w in ds.warnings)
    write(root / "testclasses.txt", "003.Crow\n004.Dodo\n")
    msg = error_of(reed.read, root)
    assert "testclasses.txt (line 2)" in msg and "004.Dodo" in msg
    write(root / "testclasses.txt", "003.Crow\n")
    write(root / "trainclasses.txt", "001.Albatross\n003.Crow\n")
    assert "also listed in" in error_of(reed.read, root)
    msg = error_of(reed.read, root, image_root=tmp_path)
    assert "--image-root" in msg and "text_c10" in msg
    assert not reed.detect(tmp_path) and "no text_c10/" in error_of(reed.read, tmp_path)
