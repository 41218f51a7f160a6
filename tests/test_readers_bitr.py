"""The readers of the BITR paper's datasets (Pascal Sentences, IAPR TC-12, SBU) on tiny samples of each
layout written here, malformed input for each (one DatasetError line naming the file), and the fuzz
contract of tests/test_readers_fuzz.py applied to their files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crossview.data.readers import detect_format, load_dataset
from crossview.data.readers import iapr_tc12, pascal_sentences, sbu
from crossview.core.errors import DatasetError
from test_readers import error_of, make_image, resolved, write
from test_readers_fuzz import FUZZ, PNG, SPECIAL_KINDS, Fixture, _dump, _mutate_bytes, _mutate_json, _special
from test_readers_fuzz import check_all_ways


def one_line_error(fn, *parts: str) -> str:
    """The DatasetError of ``fn()``: one line holding every part."""
    msg = error_of(fn)
    assert len(msg.splitlines()) == 1, msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


# ---------------------------------------------------------------------------------------------- Pascal Sentences
def _pascal(root: Path, image_dir: str = "dataset", text_dir: str = "sentence", dot: bool = False) -> Path:
    """Two classes of two images; rupy's sentence file names (``<stem>txt``) unless ``dot``."""
    for cls in ("bird", "aeroplane"):
        for k in (1, 2):
            stem = f"2008_{cls[:3]}{k}"
            make_image(root / image_dir / cls / f"{stem}.jpg")
            write(root / text_dir / cls / (f"{stem}.txt" if dot else f"{stem}txt"),
                  "".join(f"A {cls} {k}, sentence {s}.\n" for s in range(5)))
    return root


def test_pascal_rupy_layout(tmp_path: Path) -> None:
    root = _pascal(tmp_path / "pascal")
    assert detect_format(root) == "pascal-sentences"
    ds = load_dataset(root)
    assert ds.format == "pascal-sentences" and ds.name == "pascal-sentences" and ds.source == resolved(root)
    order = [("aeroplane", "2008_aer1"), ("aeroplane", "2008_aer2"), ("bird", "2008_bir1"), ("bird", "2008_bir2")]
    assert ds.image_paths == [resolved(root / "dataset" / c / f"{s}.jpg") for c, s in order]
    assert ds.n_captions == 20 and ds.captions[:2] == ["A aeroplane 1, sentence 0.", "A aeroplane 1, sentence 1."]
    assert ds.caption_image.tolist() == [i for i in range(4) for _ in range(5)]
    assert ds.labels.tolist() == [0, 0, 1, 1] and ds.label_names == ["aeroplane", "bird"]
    assert ds.label_sets is None and ds.tags is None
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0, 1, 2, 3]}
    assert ds.warnings == [] and "fold_splits" in ds.meta["splits"] and ds.meta["layout"] == "class folders"


def test_pascal_fork_layouts_and_skips(tmp_path: Path) -> None:
    root = _pascal(tmp_path / "p", image_dir="images", text_dir="sentences", dot=True)
    write(root / "sentences" / "bird" / "2008_bir1.txt", "A bird.\n\n   \nTwo birds.\n")
    (root / "images" / "bird" / "2008_bir2.jpg").unlink()                        # sentences, no image
    make_image(root / "images" / "bird" / "2008_extra.jpg")                      # image, no sentences
    write(root / "sentences" / "aeroplane" / "2008_aer2.txt", "\n")              # no sentence at all
    write(root / "sentences" / "aeroplane" / "notes.md", "ignored")
    ds = load_dataset(root)
    assert ds.format == "pascal-sentences" and ds.n_images == 2
    assert ds.image_paths == [resolved(root / "images" / "aeroplane" / "2008_aer1.jpg"),
                              resolved(root / "images" / "bird" / "2008_bir1.jpg")]
    assert ds.captions[5:] == ["A bird.", "Two birds."] and ds.labels.tolist() == [0, 1]
    joined = " | ".join(ds.warnings)
    assert "skipped 1 of 4 images whose file is missing" in joined and "2008_bir2.txt" in joined
    assert "skipped 3 empty sentence line(s)" in joined
    assert "skipped 1 image(s) whose sentence file has no sentence" in joined
    assert "skipped 1 image(s)" in joined and "with no sentence file in sentences/" in joined


def test_pascal_flat_layout_and_image_root(tmp_path: Path) -> None:
    root = tmp_path / "vidcap"
    for stem in ("2008_000002", "2008_000001"):
        make_image(root / "Images" / f"{stem}.jpg")
        write(root / "Sentences" / f"{stem}.txt", f"one {stem}\ntwo\n")
    ds = load_dataset(root)
    assert ds.format == "pascal-sentences" and ds.meta["layout"] == "flat"
    assert ds.image_paths == [resolved(root / "Images" / "2008_000001.jpg"), resolved(root / "Images" / "2008_000002.jpg")]
    assert ds.label_names is None and ds.labels.tolist() == [0, 1] and ds.caption_image.tolist() == [0, 0, 1, 1]
    # Images elsewhere: image_root/<class>/ (or image_root itself).
    root = _pascal(tmp_path / "p")
    moved = tmp_path / "elsewhere"
    (root / "dataset").rename(moved)
    one_line_error(lambda: pascal_sentences.read(root), str(root), "no dataset/, images/, Images/ image folder")
    ds = load_dataset(root, format="pascal-sentences", image_root=moved)
    assert ds.n_images == 4 and ds.image_paths[0] == resolved(moved / "aeroplane" / "2008_aer1.jpg")


def test_pascal_errors(tmp_path: Path) -> None:
    root = _pascal(tmp_path / "p")
    one_line_error(lambda: pascal_sentences.read(root, image_root=tmp_path / "nope"), "nope", "image root is not a folder")
    one_line_error(lambda: pascal_sentences.read(root, image_root=tmp_path), str(tmp_path / "p" / "sentence"),
                   "none of the 4 images", "--image-root")
    (root / "sentence" / "bird" / "2008_bir1txt").write_bytes("Un oiseau tr\xe8s beau.\n".encode("latin-1"))
    one_line_error(lambda: load_dataset(root), "2008_bir1txt", "not UTF-8")
    (root / "sentence" / "bird" / "2008_bir1txt").unlink()
    (root / "sentence" / "bird" / "2008_bir1txt").mkdir()                          # a folder where a file goes
    one_line_error(lambda: load_dataset(root), "2008_bir1txt", "expected a file, found a folder")
    empty = tmp_path / "empty"
    (empty / "sentence" / "bird").mkdir(parents=True)
    (empty / "dataset").mkdir()
    assert not pascal_sentences.detect(empty)                                    # no sentence file: not this format
    one_line_error(lambda: pascal_sentences.read(empty), str(empty / "sentence"), "no sentence files")
    one_line_error(lambda: pascal_sentences.read(tmp_path), str(tmp_path), "no sentence/, sentences/")
    assert not pascal_sentences.detect(tmp_path) and not pascal_sentences.detect(root / "sentence" / "bird")
    # A caption folder that also holds images/ and sentences/ stays the folder format.
    other = _pascal(tmp_path / "captions", image_dir="images", text_dir="sentences", dot=True)
    write(other / "captions.jsonl", json.dumps({"image": "images/bird/2008_bir1.jpg", "caption": "a bird"}) + "\n")
    assert detect_format(other) == "folder" and pascal_sentences.detect(other)


# ---------------------------------------------------------------------------------------------- IAPR TC-12
def _eng(key: str, description: str | None, image: str | None = "default", title: str = "Godchild") -> str:
    folder, stem = key.split("/")
    image = f"images/{key}.jpg" if image == "default" else image
    return ("<DOC>\n" f"<DOCNO>annotations/{key}.eng</DOCNO>\n<TITLE>{title}</TITLE>\n"
            + (f"<DESCRIPTION>{description}</DESCRIPTION>\n" if description is not None else "")
            + "<NOTES></NOTES>\n<LOCATION>Quilotoa, Ecuador</LOCATION>\n<DATE>April 2002</DATE>\n"
            + (f"<IMAGE>{image}</IMAGE>\n" if image is not None else "")
            + f"<THUMBNAIL>thumbnails/{key}.jpg</THUMBNAIL>\n</DOC>\n")


KEYS = ["00/3", "00/25", "01/1000", "01/1001"]


def _iapr(root: Path, keys: list[str] = KEYS) -> Path:
    for n, key in enumerate(keys):
        make_image(root / "images" / f"{key}.jpg")
        text = _eng(key, f"a dark-skinned boy {n} wearing a woolly hat;  a grey wall in the background;",
                    title="Taf\xed del Valle in Tucum\xe1n")
        p = root / "annotations_complete_eng" / f"{key}.eng"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text.encode("latin-1"))                      # the original distribution's encoding
    return root


WORDS = ["boy", "hat", "wall"]


def _labels(folder: Path, suffix: str = ".txt", train: tuple = ("00/25", "01/1000", "00/3"),
            test: tuple = ("01/1001",)) -> None:
    """TagProp's files for ``train`` / ``test`` (rows: word k is on for image i when (i + k) is even)."""
    write(folder / "iaprtc12_dictionary.txt", "\n".join(WORDS) + "\n")
    for split, keys in (("train", train), ("test", test)):
        write(folder / f"iaprtc12_{split}_list.txt", "".join(k + "\n" for k in keys))
        rows = np.array([[(i + k) % 2 == 0 for k in range(len(WORDS))] for i in range(len(keys))], dtype=np.uint16)
        path = folder / f"iaprtc12_{split}_annot{suffix}"
        if suffix == ".hvecs":
            path.write_bytes(np.hstack([np.full((len(rows), 1), len(WORDS)), rows]).astype("<u2").tobytes())
        else:
            sep = "," if suffix == ".csv" else " "
            write(path, "".join(sep.join(map(str, r)) + "\n" for r in rows))


def test_iapr_without_labels(tmp_path: Path) -> None:
    root = _iapr(tmp_path / "iaprtc12")
    write(root / "annotations_complete_eng" / "01" / "1001.eng", _eng("01/1001", "a man; a dog", image=None))  # UTF-8
    assert detect_format(root) == "iapr-tc12" and detect_format(root / "annotations_complete_eng") == "iapr-tc12"
    ds = load_dataset(root)
    assert ds.format == "iapr-tc12" and ds.name == "iapr-tc12" and ds.source == resolved(root)
    assert ds.image_paths == [resolved(root / "images" / f"{k}.jpg") for k in KEYS]   # folder, then numeric id
    assert ds.captions == [f"a dark-skinned boy {n} wearing a woolly hat; a grey wall in the background"
                           for n in range(3)] + ["a man; a dog"]
    assert ds.captions[0].split("; ") == ["a dark-skinned boy 0 wearing a woolly hat", "a grey wall in the background"]
    assert ds.caption_image.tolist() == [0, 1, 2, 3] and ds.labels.tolist() == [0, 1, 2, 3]
    assert ds.label_names is None and ds.label_sets is None and ds.tags is None
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0, 1, 2, 3]}
    assert ds.warnings == [] and "fold_splits" in ds.meta["splits"]
    assert ds.meta["latin1_files"] == 3 and ds.meta["sentence_separator"] == "; "


def test_iapr_skips_image_element_and_annotations_folder(tmp_path: Path) -> None:
    root = _iapr(tmp_path / "iaprtc12", KEYS[:3])
    write(root / "annotations_complete_eng" / "00" / "25.eng", _eng("00/25", " ; ;  "))       # empty description
    (root / "images" / "01" / "1000.jpg").unlink()                                           # missing image
    make_image(root / "photos" / "x.jpg")
    write(root / "annotations_complete_eng" / "00" / "3.eng", _eng("00/3", "moved", image="photos/x.jpg"))
    write(root / "annotations" / "02" / "7.eng", _eng("02/7", "only in annotations/"))          # the fallback folder
    write(root / "annotations" / "00" / "3.eng", _eng("00/3", "the older record"))              # loses to _complete_
    make_image(root / "images" / "02" / "7.jpg")
    ds = load_dataset(root)
    assert ds.image_paths == [resolved(root / "photos" / "x.jpg"), resolved(root / "images" / "02" / "7.jpg")]
    assert ds.captions == ["moved", "only in annotations/"]
    joined = " | ".join(ds.warnings)
    assert "skipped 1 of 4 images whose file is missing" in joined and "01/1000.eng" in joined
    assert "skipped 1 image(s) whose <DESCRIPTION> is empty" in joined
    # An image root replaces ROOT/images: the <IMAGE> path less its images/ is looked for under it.
    root = _iapr(tmp_path / "b", KEYS[:2])
    (root / "images").rename(tmp_path / "jpgs")
    ds = iapr_tc12.read(root, image_root=tmp_path / "jpgs")
    assert ds.image_paths == [resolved(tmp_path / "jpgs" / "00" / "3.jpg"), resolved(tmp_path / "jpgs" / "00" / "25.jpg")]
    one_line_error(lambda: load_dataset(root), "annotations_complete_eng", "none of the 2 images", "--image-root")


@pytest.mark.parametrize("suffix", [".txt", ".csv", ".hvecs"])
def test_iapr_tagprop_labels(tmp_path: Path, suffix: str) -> None:
    root = _iapr(tmp_path / "iaprtc12", KEYS + ["02/5"])
    _labels(root, suffix)
    ds = load_dataset(root)
    assert ds.image_paths == [resolved(root / "images" / f"{k}.jpg") for k in KEYS]          # 02/5: in no list
    # train rows in list order: 00/25 -> [boy, wall], 01/1000 -> [hat], 00/3 -> [boy, wall]; test 01/1001 -> [boy, wall]
    assert ds.label_sets == [["boy", "wall"], ["boy", "wall"], ["hat"], ["boy", "wall"]]
    assert ds.tags == ds.label_sets and ds.tags[0] is not ds.label_sets[0]
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0, 1, 2], "test": [3]}
    assert ds.warnings == ["1 of 5 annotated images are in neither iaprtc12_train_list.txt nor "
                           "iaprtc12_test_list.txt and were left out"]
    assert ds.meta["splits"] == "iaprtc12_train_list.txt / iaprtc12_test_list.txt"


def test_iapr_label_files_beside_the_root(tmp_path: Path) -> None:
    """iaprtc12.tgz and iaprtc12.20091111.tar.bz2 unpacked side by side (or the second inside the first)."""
    root = _iapr(tmp_path / "iaprtc12")
    _labels(tmp_path / "iaprtc12.20091111", ".hvecs")
    ds = load_dataset(root)
    assert ds.meta["labels_dir"] == resolved(tmp_path / "iaprtc12.20091111") and len(ds.splits["test"]) == 1
    # Lists alone: the splits, no label sets.
    root = _iapr(tmp_path / "lists")
    write(root / "iaprtc12.20091111" / "iaprtc12_train_list.txt", "00/3\nimages/00/25.jpg\n")
    write(root / "iaprtc12.20091111" / "iaprtc12_test_list.txt", "01/1000\n")
    ds = load_dataset(root)
    assert ds.label_sets is None and {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0, 1], "test": [2]}


def test_iapr_record_errors(tmp_path: Path) -> None:
    root = _iapr(tmp_path / "iaprtc12")
    eng = root / "annotations_complete_eng" / "00" / "25.eng"
    eng.write_bytes(b"")
    one_line_error(lambda: load_dataset(root), str(eng), "no <DESCRIPTION> element")
    write(eng, _eng("00/25", None))
    one_line_error(lambda: load_dataset(root), str(eng), "no <DESCRIPTION> element")
    eng.write_text(_eng("00/25", "a boy"), encoding="utf-16")
    one_line_error(lambda: load_dataset(root), str(eng), "UTF-16")
    eng.write_bytes(b"<DOC><DESCRIPTION>a\x00b</DESCRIPTION></DOC>")
    one_line_error(lambda: load_dataset(root), str(eng), "NUL bytes")
    eng.unlink()
    eng.mkdir()                                                                    # a folder where a file goes
    one_line_error(lambda: load_dataset(root), str(eng), "expected a file, found a folder")
    empty = tmp_path / "empty"
    (empty / "annotations_complete_eng" / "00").mkdir(parents=True)
    one_line_error(lambda: load_dataset(empty), "annotations_complete_eng", "no .eng annotation files")
    one_line_error(lambda: iapr_tc12.read(tmp_path), str(tmp_path), "no annotations_complete_eng/")
    (tmp_path / "coco" / "annotations").mkdir(parents=True)
    (tmp_path / "coco" / "images").mkdir()
    assert not iapr_tc12.detect(tmp_path / "coco") and not iapr_tc12.detect(tmp_path)


def test_iapr_label_errors(tmp_path: Path) -> None:
    root = _iapr(tmp_path / "iaprtc12")
    _labels(root)
    ann = root / "iaprtc12_train_annot.txt"
    write(ann, "1 0 1\n0 1\n1 0 1\n")
    one_line_error(lambda: load_dataset(root), f"{ann} (line 2)", "2 values, but the dictionary has 3 words")
    write(ann, "1 0 1\n0 2 0\n1 0 1\n")
    one_line_error(lambda: load_dataset(root), f"{ann} (line 2)", "'2' in column 2")
    write(ann, "1.0,0.0,1.0\n0 1 0\n1 0 1\n")                                    # floats are 0 and 1 too
    assert load_dataset(root).label_sets[1] == ["boy", "wall"]
    write(ann, "1 0 1\n0 1 0\n")
    one_line_error(lambda: load_dataset(root), str(ann), "2 label rows for the 3 images of iaprtc12_train_list.txt")
    write(ann, "")
    one_line_error(lambda: load_dataset(root), str(ann), "the file is empty")
    ann.unlink()
    (root / "iaprtc12_train_annot.hvecs").write_bytes(np.array([[4, 1, 0, 1, 0]] * 3, dtype="<u2").tobytes())
    one_line_error(lambda: load_dataset(root), "iaprtc12_train_annot.hvecs (row 1)", "rows of 4 values",
                   "dictionary has 3 words")
    (root / "iaprtc12_train_annot.hvecs").write_bytes(np.array([3, 1, 0, 1, 3, 0], dtype="<u2").tobytes()[:-2])
    one_line_error(lambda: load_dataset(root), "iaprtc12_train_annot.hvecs", "not a whole number of rows")
    (root / "iaprtc12_train_annot.hvecs").write_bytes(np.array([[3, 1, 0, 1], [2, 1, 0, 1]], dtype="<u2").tobytes())
    one_line_error(lambda: load_dataset(root), "iaprtc12_train_annot.hvecs", "row 2 has 2 values, row 1 has 3")
    (root / "iaprtc12_train_annot.hvecs").unlink()
    one_line_error(lambda: load_dataset(root), "iaprtc12_train_annot.hvecs", "not found (nor")
    _labels(root)
    lst = root / "iaprtc12_test_list.txt"
    write(lst, "01/1001\n\n31/31112\n")
    one_line_error(lambda: load_dataset(root), f"{lst} (line 3)", "unknown image '31/31112'")
    write(lst, "00/3\n")
    one_line_error(lambda: load_dataset(root), f"{lst} (line 1)", "'00/3' is also in iaprtc12_train_list.txt")
    write(lst, "01/1001\n01/1001\n")
    one_line_error(lambda: load_dataset(root), f"{lst} (line 2)", "also on line 1")
    write(lst, "\n")
    one_line_error(lambda: load_dataset(root), str(lst), "the list is empty")
    lst.unlink()
    one_line_error(lambda: load_dataset(root), str(lst), "not found, but iaprtc12_train_list.txt is in its folder")
    lst.mkdir()
    one_line_error(lambda: load_dataset(root), str(lst), "expected a file, found a folder")
    lst.rmdir()
    _labels(root)
    (root / "iaprtc12_dictionary.txt").unlink()
    one_line_error(lambda: load_dataset(root), "iaprtc12_dictionary.txt", "cannot be read without it")
    write(root / "iaprtc12_dictionary.txt", "boy\nhat\nboy\n")
    one_line_error(lambda: load_dataset(root), "iaprtc12_dictionary.txt (line 3)", "also on line 1")


# ---------------------------------------------------------------------------------------------- SBU
def _url(k: int) -> str:
    return f"http://static.flickr.com/27{k:02d}/43850589{k:02d}_b0f291553e.jpg"


def _sbu(folder: Path, n: int = 8, on_disk: tuple = (0, 2, 3, 5, 6), captions: list[str] | None = None,
         image_dir: str = "images") -> Path:
    captions = captions or [f"my dog number {k} at the beach" for k in range(n)]
    write(folder / sbu.URLS_NAME, "".join(_url(k) + "\n" for k in range(n)))
    write(folder / sbu.CAPTIONS_NAME, "".join(c + "\n" for c in captions))
    for k in on_disk:
        make_image(folder / image_dir / _url(k).rpartition("/")[2])
    return folder


def test_sbu_photos_on_disk_with_a_test_list(tmp_path: Path) -> None:
    root = _sbu(tmp_path / "sbu")
    (root / "images" / _url(5).rpartition("/")[2]).unlink()
    make_image(root / "images" / "shard1" / _url(5).rpartition("/")[2])             # in a subfolder
    (root / "images" / _url(6).rpartition("/")[2]).rename(root / "images" / ("2706_" + _url(6).rpartition("/")[2]))
    write(root / "test.txt", f"4\n{_url(3)}\n{_url(2).rpartition('/')[2]}\n\n2\n")    # line numbers, URLs, names
    assert detect_format(root) == "sbu"
    ds = load_dataset(root)
    assert ds.format == "sbu" and ds.name == "sbu" and ds.source == resolved(root / sbu.CAPTIONS_NAME)
    names = [_url(k).rpartition("/")[2] for k in (0, 2, 3, 5, 6)]
    assert ds.image_paths == [resolved(root / "images" / names[0]), resolved(root / "images" / names[1]),
                              resolved(root / "images" / names[2]), resolved(root / "images" / "shard1" / names[3]),
                              resolved(root / "images" / ("2706_" + names[4]))]
    assert ds.captions == [f"my dog number {k} at the beach" for k in (0, 2, 3, 5, 6)]
    assert ds.caption_image.tolist() == [0, 1, 2, 3, 4] and ds.labels.tolist() == [0, 1, 2, 3, 4]
    assert ds.label_names is None and ds.label_sets is None and ds.tags is None
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0, 3, 4], "test": [1, 2]}
    assert ds.warnings == ["3 of 8 images are not on disk; they are left out",
                           "1 of the 4 test photos of test.txt are not on disk (or have an empty caption)"]
    assert ds.meta["test_list"] == resolved(root / "test.txt") and ds.meta["lines"] == 8


def test_sbu_generated_test_split_and_line_pairing(tmp_path: Path) -> None:
    captions = [f"photo {k}" for k in range(30)]
    captions[1] = "a line\u2028separator and a \x85 next-line inside"            # not line breaks of the file
    captions[4] = "   "
    root = _sbu(tmp_path / "sbu", n=30, on_disk=tuple(range(25)), captions=captions)
    text = (root / sbu.URLS_NAME).read_text()
    write(root / sbu.URLS_NAME, text.replace(_url(9), _url(8)).replace("\n", "\r\n"))   # line 10 repeats line 9
    ds = load_dataset(root)
    assert ds.n_images == 23 and ds.n_captions == 24                              # 25 on disk, 1 empty, 1 repeat
    assert ds.captions[1] == "a line separator and a next-line inside" and ds.captions[2] == "photo 2"
    assert ds.caption_image.tolist()[7:9] == [7, 7] and ds.captions[7:9] == ["photo 8", "photo 9"]
    test = ds.splits["test"].tolist()
    assert len(test) == 2 and sorted(test + ds.splits["train"].tolist()) == list(range(23))
    assert test == load_dataset(root).splits["test"].tolist()                     # the same draw every time
    assert ds.warnings == ["5 of 30 images are not on disk; they are left out",
                           "skipped 1 photo(s) on disk with an empty caption",
                           "1 line(s) name a photo already listed; their captions were added to it",
                           "no test.txt: drew 2 of the 23 photos on disk as 'test' (numpy default_rng(0)); "
                           "the rest are 'train'"]
    assert ds.meta["generated_test_split"] is True and ds.meta["test_seed"] == 0
    few = _sbu(tmp_path / "few", n=3, on_disk=(0, 1))
    ds = load_dataset(few)
    assert list(ds.splits) == ["train"] and "too few to hold out a test split" in ds.warnings[-1]


def test_sbu_torchvision_layout_json_and_files_given_directly(tmp_path: Path) -> None:
    base = tmp_path / "torchvision"
    folder = _sbu(base / "dataset", image_dir="")                                 # images beside the text files
    assert detect_format(base) == "sbu"
    ds = load_dataset(base)
    assert ds.n_images == 5 and ds.meta["image_root"] == resolved(folder)
    for name in (sbu.URLS_NAME, sbu.CAPTIONS_NAME):
        assert detect_format(folder / name) == "sbu" and load_dataset(folder / name).n_images == 5
    js = tmp_path / "json"
    make_image(js / "images" / _url(1).rpartition("/")[2])
    make_image(js / "images" / _url(2).rpartition("/")[2])
    write(js / sbu.JSON_NAME, json.dumps({"image_urls": [_url(k) for k in range(3)], "user_ids": ["a", "b", "c"],
                                          "captions": ["zero", "one", None]}))
    for path in (js, js / sbu.JSON_NAME):
        assert detect_format(path) == "sbu"
        ds = load_dataset(path)
        assert ds.captions == ["one"] and ds.source == resolved(js / sbu.JSON_NAME)
        assert "1 of 3 images are not on disk; they are left out" in ds.warnings
        assert "skipped 1 photo(s) on disk with an empty caption" in ds.warnings
    ds = load_dataset(folder / sbu.URLS_NAME, image_root=js / "images")
    assert ds.image_paths == [resolved(js / "images" / _url(k).rpartition("/")[2]) for k in (1, 2)]


def test_sbu_latin1_captions_are_read_with_a_warning(tmp_path: Path) -> None:
    root = _sbu(tmp_path / "sbu", n=2, on_disk=(0, 1))
    (root / sbu.CAPTIONS_NAME).write_bytes("caf\xe9 at night\nthe beach\n".encode("latin-1"))
    ds = load_dataset(root)
    assert ds.captions == ["caf\xe9 at night", "the beach"]
    assert f"{sbu.CAPTIONS_NAME} is not UTF-8: read as Latin-1 (ISO-8859-1)" in ds.warnings


def test_sbu_errors(tmp_path: Path) -> None:
    root = _sbu(tmp_path / "sbu")
    caps = root / sbu.CAPTIONS_NAME
    write(caps, "one\ntwo\n")
    one_line_error(lambda: load_dataset(root), str(caps), "2 lines, but SBU_captioned_photo_dataset_urls.txt has 8")
    caps.unlink()
    one_line_error(lambda: load_dataset(root), str(caps), "not found, but SBU_captioned_photo_dataset_urls.txt")
    caps.mkdir()
    one_line_error(lambda: load_dataset(root), str(caps), "expected a file, found a folder")
    caps.rmdir()
    caps.write_text("".join(f"c{k}\n" for k in range(8)), encoding="utf-16")
    one_line_error(lambda: load_dataset(root), str(caps), "UTF-16")
    write(caps, "".join(f"c{k}\n" for k in range(8)))
    one_line_error(lambda: load_dataset(root, image_root=tmp_path / "none"), "none", "image root is not a folder")
    (tmp_path / "empty").mkdir()
    one_line_error(lambda: load_dataset(root, image_root=tmp_path / "empty"), str(caps),
                   "none of the 8 photos it lists are on disk", "--image-root")
    for text, part in (("9\n", "line number '9' is not in 1..8"), ("0\n", "line number '0'"),
                       ("1\nnot_there.jpg\n", "unknown photo 'not_there.jpg'")):
        write(root / "test.txt", text)
        one_line_error(lambda: load_dataset(root), str(root / "test.txt"), part)
    (root / "test.txt").unlink()
    write(root / sbu.URLS_NAME, "")
    write(caps, "")
    one_line_error(lambda: load_dataset(root), str(caps), "no photos listed")
    js = tmp_path / "json"
    write(js / sbu.JSON_NAME, json.dumps({"image_urls": ["a", "b"], "captions": ["x"]}))
    one_line_error(lambda: load_dataset(js), str(js / sbu.JSON_NAME), "2 image_urls but 1 captions")
    write(js / sbu.JSON_NAME, json.dumps([1, 2]))
    one_line_error(lambda: load_dataset(js), str(js / sbu.JSON_NAME), "'image_urls' and 'captions' lists")
    assert not sbu.detect(tmp_path) and not sbu.detect(tmp_path / "other.txt")


def test_sbu_many_lines_few_photos(tmp_path: Path) -> None:
    """The usual case: a big caption file and the photos someone has; one pass, one warning line."""
    n = 200_000
    write(tmp_path / sbu.URLS_NAME, "".join(f"http://static.flickr.com/1/{k}_ab.jpg\n" for k in range(n)))
    write(tmp_path / sbu.CAPTIONS_NAME, "".join(f"caption {k}\n" for k in range(n)))
    for k in (5, 50_000, 199_999):
        make_image(tmp_path / "images" / f"{k}_ab.jpg")
    start = time.perf_counter()
    ds = load_dataset(tmp_path)
    assert time.perf_counter() - start < 30                                      # about 0.3 s; generous on CI
    assert ds.captions == ["caption 5", "caption 50000", "caption 199999"]
    assert ds.warnings[0] == "199,997 of 200,000 images are not on disk; they are left out"


# ---------------------------------------------------------------------------------------------- fuzz contract
def _fixtures() -> dict[str, Fixture]:
    pascal = {f"dataset/{c}/2008_{c}{k}.jpg": PNG for c in ("bird", "cat") for k in (1, 2)}
    pascal.update({f"sentence/{c}/2008_{c}{k}txt": f"A {c} sits.\nThe {c} {k}.\n".encode()
                   for c in ("bird", "cat") for k in (1, 2)})
    iapr = {f"images/{k}.jpg": PNG for k in KEYS}
    iapr.update({f"annotations_complete_eng/{k}.eng": _eng(k, f"a boy {n}; a wall;", title="Taf\xed").encode("latin-1")
                 for n, k in enumerate(KEYS)})
    iapr.update({"iaprtc12_dictionary.txt": b"boy\nhat\nwall\n", "iaprtc12_train_list.txt": b"00/3\n00/25\n01/1000\n",
                 "iaprtc12_test_list.txt": b"01/1001\n", "iaprtc12_train_annot.txt": b"1 0 1\n0 1 0\n1 1 1\n",
                 "iaprtc12_test_annot.hvecs": np.array([3, 0, 1, 1], dtype="<u2").tobytes()})
    urls = "".join(_url(k) + "\n" for k in range(4)).encode()
    sbu_files = {sbu.URLS_NAME: urls, sbu.CAPTIONS_NAME: b"a dog\na cat\nthe sea\na hill\n", "test.txt": b"2\n",
                 **{f"images/{_url(k).rpartition('/')[2]}": PNG for k in range(4)}}
    sbu_json = {sbu.JSON_NAME: json.dumps({"image_urls": [_url(k) for k in range(4)],
                                           "captions": ["a dog", "a cat", "the sea", "a hill"]}).encode(),
                "test.txt": b"2\n", **{f"images/{_url(k).rpartition('/')[2]}": PNG for k in range(4)}}
    return {
        "pascal-sentences": Fixture("pascal-sentences", pascal, "sentence/cat/2008_cat1txt", "", "text"),
        "iapr-eng": Fixture("iapr-tc12", iapr, "annotations_complete_eng/00/25.eng", "", "text"),
        "iapr-dictionary": Fixture("iapr-tc12", iapr, "iaprtc12_dictionary.txt", "", "text"),
        "iapr-list": Fixture("iapr-tc12", iapr, "iaprtc12_train_list.txt", "", "text"),
        "iapr-annot": Fixture("iapr-tc12", iapr, "iaprtc12_train_annot.txt", "", "text"),
        "iapr-hvecs": Fixture("iapr-tc12", iapr, "iaprtc12_test_annot.hvecs", "", "npy"),
        "sbu-urls": Fixture("sbu", sbu_files, sbu.URLS_NAME, "", "text"),
        "sbu-captions": Fixture("sbu", sbu_files, sbu.CAPTIONS_NAME, "", "text"),
        "sbu-test": Fixture("sbu", sbu_files, "test.txt", "", "text"),
        "sbu-json": Fixture("sbu", sbu_json, sbu.JSON_NAME, "", "json"),
    }


FIXTURES = _fixtures()


@pytest.mark.parametrize("name", list(FIXTURES))
def test_every_fixture_is_valid(name: str, tmp_path: Path) -> None:
    fx = FIXTURES[name]
    path = fx.write(tmp_path)
    assert detect_format(path) == fx.format
    ds = load_dataset(path)
    assert ds.warnings == [] and ds.n_captions > 0


@pytest.mark.parametrize("name", list(FIXTURES))
@FUZZ
@given(data=st.data())
def test_fuzz_bytes(name: str, data: st.DataObject) -> None:
    """Byte-level damage to each file of these formats: a clean load, a counted warning, or one clear line."""
    fx = FIXTURES[name]
    check_all_ways(fx, _mutate_bytes(fx.files[fx.target], data))


@FUZZ
@given(data=st.data())
def test_fuzz_sbu_json_fields(data: st.DataObject) -> None:
    fx = FIXTURES["sbu-json"]
    check_all_ways(fx, _dump(_mutate_json(json.loads(fx.files[fx.target]), data)))


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
@pytest.mark.parametrize("name", list(FIXTURES))
def test_special_file_in_place_of_a_dataset_file(name: str, kind: str) -> None:
    """A FIFO, a symlink loop, a dangling link, /dev/null, a folder or an unreadable file in place of each
    file: never a hang, never a traceback."""
    fx = FIXTURES[name]
    check_all_ways(fx, prepare=lambda root: _special(kind)(root, root / fx.target))
