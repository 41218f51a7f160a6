"""Readers strict where the format is (issue 31, items 1 and 5): CSV quoting, image-name aliases, label
types, split names, degenerate precomputed features, and dataset strings escaped on the way to a terminal.

Each case is worked by hand: the file, the line or count the message must name, what the dataset holds.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from crossview.core.errors import DatasetError
from crossview.core.text import has_unsafe, printable
from crossview.data.readers import load_dataset
from crossview.data.stats import dataset_info, format_info


def _images(root: Path, n: int = 6) -> None:
    for k in range(n):
        Image.new("RGB", (4, 4), (10 * k, 0, 0)).save(root / f"im{k}.png")


def _rows(n: int = 6) -> str:
    return "".join(f"im{k}.png,a dog {k},train\n" for k in range(n))


def _error(path: Path, **kw) -> str:
    with pytest.raises(DatasetError) as info:
        load_dataset(path, **kw)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and "\x1b" not in msg
    return msg


# ---------------------------------------------------------------------------------------------- printable
@pytest.mark.parametrize("raw,shown", [
    ("a\x1b[31mred", "a\\x1b[31mred"),
    ("x\ud83dy", "x\\ud83dy"),
    ("a\rb\nc\td", "a\\rb\\nc\\td"),
    ("\x00\x7f\x85\x9f", "\\x00\\x7f\\x85\\x9f"),
    ("line\u2028sep\u202eevil", "line\\u2028sep\\u202eevil"),
    ("caf\u00e9 \U0001f436 \u4e2d", "caf\u00e9 \U0001f436 \u4e2d"),   # accents, emoji, CJK stay as they are
])
def test_printable_escapes_exactly_the_unsafe_characters(raw: str, shown: str) -> None:
    assert printable(raw) == shown
    assert has_unsafe(raw) == (raw != shown)
    printable(raw).encode("utf-8")  # never raises: no lone surrogate is left


def test_printable_can_keep_newlines_and_tabs_for_messages() -> None:
    assert printable("a\n\tb\x1b", newlines=True, tabs=True) == "a\n\tb\\x1b"
    assert printable("a\n\tb", newlines=True) == "a\n\\tb"
    assert printable("a\n\tb", tabs=True) == "a\\n\tb"
    # every code point below 0x100 that is a control character comes out as 4 printable ASCII characters
    for c in [*range(0x20), *range(0x7f, 0xa0)]:
        if chr(c) not in "\n\r\t":
            assert printable(chr(c)) == f"\\x{c:02x}"


# ---------------------------------------------------------------------------------------------- CSV quoting
def test_csv_unclosed_quote_at_the_end_names_the_line_its_row_starts(tmp_path: Path) -> None:
    _images(tmp_path)
    f = tmp_path / "captions.csv"
    # line 1 header, lines 2-3 rows im0, im1; line 4 opens a quote on im2's caption that never closes
    f.write_text("image,caption,split\n" + _rows().replace("a dog 2", '"a dog 2'))
    msg = _error(f)
    assert f"{f} (line 4)" in msg and "unclosed quote" in msg and "line 7" in msg


def test_csv_quote_closed_by_chance_rows_later_is_an_error(tmp_path: Path) -> None:
    _images(tmp_path)
    f = tmp_path / "captions.csv"
    # im2's quote opens on line 4 and closes on line 6 (im4's caption): im3's whole row is inside the field
    f.write_text("image,caption,split\n" + _rows().replace("a dog 2", '"a dog 2').replace("a dog 4", 'a dog 4"'))
    msg = _error(f)
    assert f"{f} (line 4)" in msg and "unclosed quote" in msg and "im3.png,a dog 3,train" in msg


def test_csv_quote_closed_right_before_a_delimiter_rows_later_is_an_error(tmp_path: Path) -> None:
    _images(tmp_path)
    f = tmp_path / "captions.csv"
    # line 4 opens a quote on im2's caption; im3's caption on line 5 ends in a stray quote just before its
    # comma, which closes the field: 6 rows would parse as 5 with no csv error at all
    f.write_text("image,caption,split\n" + _rows().replace("a dog 2", '"a dog 2').replace("a dog 3,", 'a dog 3",'))
    msg = _error(f)
    assert f"{f} (line 4)" in msg and "unclosed quote" in msg and "line 5 inside it" in msg


def test_csv_quoted_line_breaks_in_a_caption_are_kept(tmp_path: Path) -> None:
    _images(tmp_path)
    f = tmp_path / "captions.csv"
    # CSV allows a quoted field over several lines; the continuation lines hold fewer than 2 commas
    f.write_text('image,caption,split\nim0.png,"a dog,\nover two lines",train\n' + _rows())
    ds = load_dataset(f)
    assert ds.n_images == 6 and ds.n_captions == 7
    assert ds.captions[0] == "a dog, over two lines" and ds.warnings == []


def test_csv_row_with_too_few_fields_is_an_error_naming_it(tmp_path: Path) -> None:
    _images(tmp_path)
    f = tmp_path / "captions.csv"
    f.write_text("image,caption,split\n" + _rows(3) + "im3.png,a dog 3\n" + _rows(6)[len(_rows(4)):])
    msg = _error(f)
    assert f"{f} (line 5)" in msg and "fewer fields (2) than columns in the header (3)" in msg


def test_csv_quoted_commas_and_doubled_quotes_are_one_field(tmp_path: Path) -> None:
    _images(tmp_path, 2)
    f = tmp_path / "captions.csv"
    f.write_text('image,caption,split\nim0.png,"a dog, a cat and a ""ball""",train\nim1.png,plain,val\n')
    ds = load_dataset(f)
    assert ds.captions == ['a dog, a cat and a "ball"', "plain"]
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0], "val": [1]}


# ---------------------------------------------------------------------------------------------- path aliases
def test_folder_image_aliases_are_one_image(tmp_path: Path) -> None:
    _images(tmp_path, 2)
    (tmp_path / "sub").mkdir()
    f = tmp_path / "captions.jsonl"
    rows = [{"image": "im0.png", "caption": "one", "split": "train"},
            {"image": "./im0.png", "caption": "two"},
            {"image": "sub/../im0.png", "caption": "three"},
            {"image": str(tmp_path / "im0.png"), "caption": "four"},
            {"image": "im1.png", "caption": "five", "split": "val"}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = load_dataset(f)
    assert ds.n_images == 2 and ds.caption_image.tolist() == [0, 0, 0, 0, 1]
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0], "val": [1]}


def test_karpathy_image_aliases_are_a_duplicate(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    _images(tmp_path / "images", 2)
    doc = {"images": [{"filename": "im0.png", "split": "train", "sentences": [{"raw": "a"}]},
                      {"filename": "./im1.png", "split": "val", "sentences": [{"raw": "b"}]},
                      {"filename": "x/../im0.png", "split": "val", "sentences": [{"raw": "c"}]}]}
    f = tmp_path / "dataset_t.json"
    f.write_text(json.dumps(doc))
    msg = _error(f)
    assert "images[2]" in msg and "duplicate image" in msg and "images[0]" in msg


def test_cuhk_pedes_file_path_aliases_are_a_duplicate(tmp_path: Path) -> None:
    (tmp_path / "imgs" / "CUHK01").mkdir(parents=True)
    _images(tmp_path / "imgs" / "CUHK01", 2)
    doc = [{"split": "train", "captions": ["a"], "file_path": "CUHK01/im0.png", "id": 1},
           {"split": "test", "captions": ["b"], "file_path": "./CUHK01/im0.png", "id": 2}]
    f = tmp_path / "reid_raw.json"
    f.write_text(json.dumps(doc))
    msg = _error(f)
    assert "entry 1" in msg and "duplicate file_path" in msg


# ---------------------------------------------------------------------------------------------- split names
def test_unknown_split_names_are_one_warning_with_counts(tmp_path: Path) -> None:
    _images(tmp_path)
    f = tmp_path / "captions.csv"
    splits = ["train", "tset", "tset", "val", "Holdout", "dev"]
    f.write_text("image,caption,split\n" + "".join(f"im{k}.png,a dog {k},{s}\n" for k, s in enumerate(splits)))
    ds = load_dataset(f)
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0], "tset": [1, 2], "val": [3, 5],
                                                             "holdout": [4]}
    [w] = ds.warnings
    assert "3 image(s) are in 2 unknown split(s)" in w and "'tset' (2 images)" in w and "'holdout' (1 image)" in w


@pytest.mark.parametrize("split", ["../x", "a/b", "..", "x\\y", "te\x1b[31mst", "a\x00", "t\ud83d", "x" * 101])
def test_path_like_or_control_split_names_are_refused(tmp_path: Path, split: str) -> None:
    _images(tmp_path, 2)
    f = tmp_path / "captions.jsonl"
    f.write_text("".join(json.dumps({"image": f"im{k}.png", "caption": "c", "split": s}) + "\n"
                         for k, s in enumerate(["train", split])))
    msg = _error(f)
    assert f"{f} (line 2 'im1.png')" in msg and "is not a split name" in msg
    msg.encode("utf-8")


def test_karpathy_split_names_checked_too(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    _images(tmp_path / "images", 3)
    doc = {"images": [{"filename": f"im{k}.png", "split": s, "sentences": [{"raw": "a"}]}
                      for k, s in enumerate(["train", "Validation", "tets"])]}
    f = tmp_path / "dataset_t.json"
    f.write_text(json.dumps(doc))
    ds = load_dataset(f)
    assert {k: v.tolist() for k, v in ds.splits.items()} == {"train": [0], "val": [1], "tets": [2]}
    assert any("1 image(s) are in 1 unknown split(s)" in w and "'tets' (1 image)" in w for w in ds.warnings)
    doc["images"][2]["split"] = "../../etc"
    f.write_text(json.dumps(doc))
    assert "images[2]" in _error(f)


# ---------------------------------------------------------------------------------------------- label types
def _label_rows(tmp_path: Path, labels: list) -> Path:
    _images(tmp_path, len(labels))
    f = tmp_path / "captions.jsonl"
    f.write_text("".join(json.dumps({"image": f"im{k}.png", "caption": "c", "label": v}) + "\n"
                         for k, v in enumerate(labels)))
    return f


def test_number_and_text_spellings_of_one_label_are_reported(tmp_path: Path) -> None:
    ds = load_dataset(_label_rows(tmp_path, [1, "1", 2, "cat", 2, "cat"]))
    assert ds.label_names == ["1", "2", "cat"] and ds.labels.tolist() == [0, 0, 1, 2, 1, 2]
    [w] = ds.warnings
    assert "1 label(s) are written both as a number and as text ('1')" in w and "(2 label value(s))" in w


def test_decimal_labels_are_counted(tmp_path: Path) -> None:
    ds = load_dataset(_label_rows(tmp_path, [1.5, 2.0, 2, "x"]))
    assert ds.label_names == ["1.5", "2", "x"]
    assert any("2 label(s) are decimal numbers (e.g. 1.5)" in w for w in ds.warnings)


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_labels_are_refused(tmp_path: Path, bad: str) -> None:
    f = _label_rows(tmp_path, ["a", "b"])
    f.write_text(f.read_text().replace('"label": "b"', f'"label": {bad}'))
    msg = _error(f)
    assert f"{f} (line 2 'im1.png')" in msg and "not a class" in msg


def _label_csv(tmp_path: Path, labels: list[str]) -> Path:
    _images(tmp_path, len(labels))
    f = tmp_path / "captions.csv"
    f.write_text("image,caption,label,split\n" + "".join(f"im{k}.png,a dog {k},{v},train\n"
                                                         for k, v in enumerate(labels)))
    return f


@pytest.mark.parametrize("bad", ["nan", "NaN", " inf", "-Infinity", "1e999"])
def test_csv_labels_spelled_as_non_finite_numbers_are_refused(tmp_path: Path, bad: str,
                                                              capsys: pytest.CaptureFixture) -> None:
    """What pandas writes for a missing label (``nan``) is refused as the JSON NaN is: one line naming the
    file, the line and the value (not read as a class called "nan")."""
    from crossview.cli import main

    f = _label_csv(tmp_path, ["cat", "dog", bad, "cat"])
    msg = _error(f)
    assert f"{f} (line 4 'im2.png')" in msg and f"'label' is {bad.strip()!r}" in msg and "not a class" in msg
    assert main(["data", "info", str(f)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "line 4" in err and "Traceback" not in err


def test_csv_labels_that_only_look_like_numbers_are_classes(tmp_path: Path) -> None:
    ds = load_dataset(_label_csv(tmp_path, ["nano", "infant", "1", "2.5"]))
    assert ds.label_names == ["1", "2.5", "infant", "nano"]


@pytest.mark.parametrize("value", [[["a"]], [{"a": 1}], [None], [True], [float("nan")]])
def test_tag_lists_holding_non_text_items_are_refused(tmp_path: Path, value: list) -> None:
    _images(tmp_path, 2)
    f = tmp_path / "captions.jsonl"
    f.write_text("".join(json.dumps({"image": f"im{k}.png", "caption": "c", "tags": ["x"] if k == 0 else value})
                         + "\n" for k in range(2)))
    msg = _error(f)
    assert f"{f} (line 2 'im1.png')" in msg and "a list of tags or labels holds" in msg


def test_karpathy_label_nan_is_refused_and_1_vs_text_1_reported(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    _images(tmp_path / "images", 3)
    doc = {"images": [{"filename": f"im{k}.png", "split": "train", "label": v, "sentences": [{"raw": "a"}]}
                      for k, v in enumerate([1, "1", 7])]}
    f = tmp_path / "dataset_t.json"
    f.write_text(json.dumps(doc))
    ds = load_dataset(f)
    assert ds.label_names == ["1", "7"] and ds.labels.tolist() == [0, 0, 1]
    assert any("written both as a number and as text" in w for w in ds.warnings)
    f.write_text(json.dumps(doc).replace('"label": 7', '"label": NaN'))
    assert "images[2]" in _error(f)


# ---------------------------------------------------------------------------------------------- features
def _precomp(tmp_path: Path, feats: np.ndarray) -> Path:
    folder = tmp_path / "t_precomp"
    folder.mkdir(parents=True)
    np.save(folder / "train_ims.npy", feats)
    (folder / "train_caps.txt").write_text("".join(f"caption {i}\n" for i in range(len(feats))))
    return folder


def _normal(n: int = 6, d: int = 4) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(n, d))


@pytest.mark.parametrize("feats,needle", [
    (np.zeros((6, 4), np.float32), "all 6 feature rows are zero (6 x 4)"),
    (np.arange(6, dtype=np.float32)[:, None].repeat(4, axis=1), "every one of the 6 feature rows is constant"),
    (np.tile(_normal(1), (6, 1)), "all 6 feature rows are identical (all 4 columns constant)"),
    (np.where(np.arange(24).reshape(6, 4) == 5, 1e30, _normal()), "1 of 6 feature rows hold values over 1e+18"),
    (np.where(np.arange(24).reshape(6, 4) % 5 == 0, -1e300, _normal()), "5 of 6 feature rows hold values over 1e+18"),
    (np.array([[2**62, 1, 2, 3]] * 2 + [[1, 2, 3, 4], [4, 3, 2, 1]] * 2, np.int64), "2 of 6 feature rows hold"),
])
def test_degenerate_feature_matrices_are_refused(tmp_path: Path, feats: np.ndarray, needle: str) -> None:
    folder = _precomp(tmp_path, feats)
    msg = _error(folder)
    assert str(folder / "train_ims.npy") in msg and needle in msg


def test_partly_degenerate_feature_matrices_are_warned_with_counts(tmp_path: Path) -> None:
    feats = _normal(8, 5)
    feats[[2, 5]] = 0.0          # two all-zero rows
    feats[6] = 3.0               # one constant row
    ds = load_dataset(_precomp(tmp_path / "a", feats))
    assert ds.warnings == ["train_ims.npy: 3 of 8 feature rows are constant, 2 of them all zero (nothing to tell "
                           "those images apart)"]
    feats = _normal(8, 5)
    feats[:, [0, 2, 4]] = 7.0    # 3 of 5 columns constant: a majority
    ds = load_dataset(_precomp(tmp_path / "b", feats))
    assert ds.warnings == ["train_ims.npy: 3 of 5 feature columns are constant over all 8 rows (zero variance; "
                           "the features may be damaged)"]
    feats = _normal(8, 5)
    feats[:, [0, 2]] = 7.0       # 2 of 5: not a majority, no warning
    assert load_dataset(_precomp(tmp_path / "c", feats)).warnings == []


# ---------------------------------------------------------------------------------------------- terminal output
def test_data_info_escapes_dataset_strings(tmp_path: Path, capsys: pytest.CaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset whose name, captions and an (unknown) split name hold ESC and a lone surrogate: `crossview
    data info` prints them escaped, exits 0, and its real stdout (UTF-8, strict) never fails to encode."""
    from crossview.cli import main

    (tmp_path / "images").mkdir()
    _images(tmp_path / "images", 4)
    doc = {"dataset": "evil\x1b[31m\ud83d", "images": [
        {"filename": f"im{k}.png", "split": s, "sentences": [{"raw": "a \x1b[31mred\ud83d dog\r"}]}
        for k, s in enumerate(["train", "val", "test", "tset\u202e\ud83d"])]}
    # the right-to-left override and the surrogate make the split name unsafe: it is refused, escaped
    f = tmp_path / "dataset_x.json"
    f.write_text(json.dumps(doc))
    assert main(["data", "info", str(f)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "tset\\u202e\\ud83d" in err and len(err.splitlines()) == 1
    err.encode("utf-8")
    doc["images"][3]["split"] = "tset"
    f.write_text(json.dumps(doc))
    # stdout as a terminal's: UTF-8, strict (a lone surrogate printed raw would raise UnicodeEncodeError)
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["data", "info", str(f)]) == 0
    stdout.flush()
    out = raw.getvalue()
    assert b"\x1b" not in out and b"\r" not in out
    assert b"evil\\x1b[31m\\ud83d (karpathy)" in out and b"'tset' (1 image)" in out
    # and in-process, the captions themselves (what `query` prints) come out escaped
    ds = load_dataset(f)
    text = format_info(dataset_info(ds))
    assert not has_unsafe(text.replace("\n", ""))
    # a caption's lone surrogate is repaired to U+FFFD when the dataset is built (said in a warning); the ESC
    # stays in the data and is escaped for display
    assert printable(ds.captions[0]) == "a \\x1b[31mred\ufffd dog"
    assert printable("a \x1b[31mred\ud83d dog") == "a \\x1b[31mred\\ud83d dog"


def test_print_result_escapes_captions(capsys: pytest.CaptureFixture) -> None:
    from crossview.commands._common import print_result
    print_result("1. 0.91  a \x1b[2Jdog\ud83d\n2. 0.5\tcat")
    out = capsys.readouterr().out
    assert out == "1. 0.91  a \\x1b[2Jdog\\ud83d\n2. 0.5\tcat\n"


def test_precomputed_features_built_in_code_are_checked_too():
    """A dataset made in Python (no reader) gets the reader's degenerate-feature check when features are taken."""
    from crossview.core.errors import CrossViewError
    from crossview.data.dataset import PairedDataset
    from crossview.features import extract_features

    def dataset(image):
        return PairedDataset(name="inline", captions=[f"caption {i}" for i in range(6)],
                             caption_image=np.arange(6), image_features=image,
                             splits={"train": np.arange(4), "val": np.arange(4, 6)})

    with pytest.raises(CrossViewError, match="all 6 feature rows are zero"):
        extract_features(dataset(np.zeros((6, 4), np.float32)), text_encoder="bow", cache=False)
    with pytest.raises(CrossViewError, match="over 1e"):
        extract_features(dataset(np.full((6, 4), 3e20, np.float32) * np.arange(1, 7)[:, None]),
                         text_encoder="bow", cache=False)
    ok = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    assert extract_features(dataset(ok), text_encoder="bow", cache=False).image.shape == (6, 4)
