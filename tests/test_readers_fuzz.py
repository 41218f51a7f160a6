"""Hostile input to the dataset readers: property-based fuzzing of every format, plus one regression
test for each crash, hang or silent acceptance found by the survey of issue 10 (item 5).

The contract, for ANY input: ``load_dataset`` / ``detect_format`` either load it (any warning carries a
count), or raise :class:`~crossview.core.errors.CrossViewError` whose message is one line naming the file. Never
another exception, never a hang (every call runs in a thread joined with a timeout).

The examples are mutations of small valid datasets in each format: byte flips, truncation, inserted
bytes, byte-order marks, UTF-16, wrong JSON types in each field, huge numbers, deep nesting, huge fields,
duplicate columns, unclosed quotes, special files (FIFO, symlink loop, /dev/null, a folder, long names).

Since issue 31 some properties also generate what a dataset MEANS beside its file (rows, image aliases, split
names, label types, hostile characters in every string field, degenerate feature matrices) and check that the
reader returns exactly that or refuses it in one line naming the file: never silent loss.

Size: a few hundred examples in all by default (CI). A nightly run sets the number of examples per
property test through the environment, e.g.::

    CROSSVIEW_FUZZ_EXAMPLES=5000 pytest tests/test_readers_fuzz.py -k fuzz_

Without the variable the examples are derandomized (the same every run, so CI never flakes); with it,
fresh random ones are drawn each run. ``CROSSVIEW_FUZZ_TIMEOUT`` (seconds, default 30) is the limit past
which a call counts as a hang. 250 examples per property (6,000 in all) take about 4 minutes on 2 cores.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import math
import os
import random
import struct
import sys
import tempfile
import threading
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from crossview.core.text import has_unsafe
from crossview.data.dataset import PairedDataset, TextCorpus
from crossview.data.images import open_image, verify_images
from crossview.data.readers import READERS, detect_format, load_dataset
from crossview.data.readers._common import clean_caption
from crossview.core.hashing import repair_text
from crossview.data.readers.labels import attach_label_sets
from crossview.data.stats import dataset_info, format_info
from crossview.core.errors import CrossViewError, DatasetError

#: Examples per property test; the default keeps this file well under a minute on 2 cores.
EXAMPLES = int(os.environ.get("CROSSVIEW_FUZZ_EXAMPLES", "25"))
#: A call that takes longer than this is a hang (the slowest honest example takes well under a second).
TIMEOUT_S = float(os.environ.get("CROSSVIEW_FUZZ_TIMEOUT", "30"))

FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="CROSSVIEW_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------------------------------------- outcome check
def _unblock_fifos(root: Path) -> None:
    """Opens the write end of every FIFO under ``root``, so that a reader blocked on one returns."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            try:
                if p.is_fifo():
                    os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass


def call_with_timeout(fn: Callable[[], Any], root: Path) -> tuple[Any, BaseException | None]:
    """``fn()`` in a thread; fails the test if it has not returned after TIMEOUT_S (a hang)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - judged by the caller
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(TIMEOUT_S)
    if t.is_alive():
        _unblock_fifos(root)
        t.join(5)
        pytest.fail(f"hang: the call did not return within {TIMEOUT_S:.0f} s on {root}")
    return out.get("value"), out.get("error")


def assert_outcome(fn: Callable[[], Any], root: Path) -> Any:
    """Runs ``fn`` (a load) and checks the contract: a dataset whose warnings carry counts, or a
    CrossViewError of one line naming a path under ``root``. Returns the dataset or the error."""
    value, error = call_with_timeout(fn, root)
    if error is not None:
        if not isinstance(error, CrossViewError):
            tb = "".join(traceback.format_exception(error))
            pytest.fail(f"{type(error).__name__} escaped instead of a CrossViewError:\n{tb}")
        msg = str(error)
        assert len(msg.splitlines()) == 1 and "\n" not in msg, f"not one line: {msg!r}"
        assert str(root) in msg, f"the message does not name the file: {msg!r}"
        assert len(msg) < 2000, f"message of {len(msg)} characters"
        return error
    assert isinstance(value, (PairedDataset, TextCorpus)), value
    for w in value.warnings:
        assert any(ch.isdigit() for ch in w), f"a warning without a count: {w!r}"
        assert len(w.splitlines()) == 1, f"a warning of several lines: {w!r}"
    # What `crossview data info` does next must work on anything a reader accepted.
    format_info(dataset_info(value))
    return value


# ---------------------------------------------------------------------------------------------- fixtures
def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


PNG = _png()


@dataclass
class Fixture:
    """A small valid dataset: files (relative path -> bytes), the file mutations change, what to load."""

    format: str
    files: dict[str, bytes]
    target: str
    load: str = ""
    kind: str = "text"  # how the target is mutated: json, jsonl, csv, text, npy
    extra: dict[str, Any] = field(default_factory=dict)

    def write(self, root: Path, target_bytes: bytes | None = None) -> Path:
        for rel, data in self.files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(target_bytes if rel == self.target and target_bytes is not None else data)
        return root / self.load if self.load else root


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _fixtures() -> dict[str, Fixture]:
    imgs = {f"images/im{k}.png": PNG for k in range(4)}
    karpathy = {"dataset": "tiny", "images": [
        {"filename": f"im{k}.png", "imgid": k, "split": s, "label": k % 2, "tags": ["red", "box"],
         "sentences": [{"raw": f"a red box number {k}", "tokens": ["a", "red", "box"]}, {"raw": "a square"}]}
        for k, s in enumerate(("train", "train", "val", "test"))]}
    pedes = [{"split": s, "captions": [f"a person in red {k}", "a walker"], "file_path": f"CUHK01/{k:04d}.png",
              "id": 10 + k // 2, "processed_tokens": [["a", "person"]]}
             for k, s in enumerate(("train", "train", "val", "test"))]
    folder_rows = [{"image": f"images/im{k}.png", "caption": f"a red box {k}", "label": ["a", "b"][k % 2],
                    "tags": "red,box", "split": s} for k, s in enumerate(("train", "train", "val", "test"))]
    csv_text = "image,caption,label,tags,split\n" + "".join(
        f'{r["image"]},{r["caption"]},{r["label"]},"{r["tags"]}",{r["split"]}\n' for r in folder_rows)
    tag_rows = [{"image": f"images/im{k}.png", "tags": ["red", "box"]} for k in range(4)]
    label_rows = [{"image": f"images/im{k}.png", "labels": ["red box"]} for k in range(4)]
    feats = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    reed = {f"text_c10/00{c}.cls/im{k}.txt": f"a small bird number {k}\nit has red wings\n".encode()
            for c in (1, 2) for k in (c * 10, c * 10 + 1)}
    reed.update({f"images/00{c}.cls/im{k}.jpg": PNG for c in (1, 2) for k in (c * 10, c * 10 + 1)})
    reed["trainclasses.txt"] = b"001.cls\n"
    reed["testclasses.txt"] = b"002.cls\n"
    return {
        "karpathy": Fixture("karpathy", {**imgs, "dataset_tiny.json": json.dumps(karpathy).encode()},
                            "dataset_tiny.json", "dataset_tiny.json", "json"),
        "cuhk-pedes": Fixture("cuhk-pedes", {**{f"imgs/CUHK01/{k:04d}.png": PNG for k in range(4)},
                                             "reid_raw.json": json.dumps(pedes).encode()},
                              "reid_raw.json", "reid_raw.json", "json"),
        "folder-jsonl": Fixture("folder", {**imgs, "captions.jsonl": _jsonl(folder_rows)}, "captions.jsonl",
                                "", "jsonl"),
        "folder-csv": Fixture("folder", {**imgs, "captions.csv": csv_text.encode()}, "captions.csv", "", "csv"),
        "webtags-jsonl": Fixture("webtags", {**imgs, "tags.jsonl": _jsonl(tag_rows)}, "tags.jsonl", "", "jsonl"),
        "webtags-csv": Fixture("webtags", {**imgs, "tags.csv": ("image,tags\n" + "".join(
            f'images/im{k}.png,"red,box"\n' for k in range(4))).encode()}, "tags.csv", "", "csv"),
        "webtags-txt": Fixture("webtags", {**imgs, "tags.txt": "".join(
            f"images/im{k}.png\tred,box\n" for k in range(4)).encode()}, "tags.txt", "", "text"),
        "labels-jsonl": Fixture("labels", {**imgs, "labels.jsonl": _jsonl(label_rows)}, "labels.jsonl", "",
                                "jsonl"),
        "labels-csv": Fixture("labels", {**imgs, "labels.csv": ("image,labels\n" + "".join(
            f'images/im{k}.png,"red box,blue"\n' for k in range(4))).encode()}, "labels.csv", "", "csv"),
        "labels-txt": Fixture("labels", {**imgs, "labels.txt": "".join(
            f"images/im{k}.png\tred box\n" for k in range(4)).encode()}, "labels.txt", "", "text"),
        "corpus": Fixture("corpus", {"corpus.txt": b"a red box\na blue ball\nthe end\n"}, "corpus.txt",
                          "corpus.txt", "text"),
        "precomp-caps": Fixture("precomp", {"train_ims.npy": _npy(feats), "train_caps.txt": "".join(
            f"caption {k}\n" for k in range(8)).encode()}, "train_caps.txt", "", "text"),
        "precomp-npy": Fixture("precomp", {"train_ims.npy": _npy(feats), "train_caps.txt": "".join(
            f"caption {k}\n" for k in range(8)).encode()}, "train_ims.npy", "", "npy"),
        "reed-captions": Fixture("reed", reed, "text_c10/001.cls/im10.txt", "", "text"),
        "reed-splits": Fixture("reed", reed, "trainclasses.txt", "", "text"),
    }


FIXTURES = _fixtures()


@pytest.mark.parametrize("name", list(FIXTURES))
def test_every_fixture_is_valid(name: str, tmp_path: Path) -> None:
    """The unmutated fixtures load cleanly, detected as their format (so mutations start from valid data)."""
    fx = FIXTURES[name]
    path = fx.write(tmp_path)
    assert detect_format(path) == fx.format
    ds = load_dataset(path)
    assert ds.warnings == []
    assert ds.n_captions > 0 or fx.format in ("webtags", "labels")


def check_all_ways(fx: Fixture, target_bytes: bytes | None = None,
                   prepare: Callable[[Path], None] | None = None) -> list[Any]:
    """Writes the fixture (with the target replaced) and checks detection, loading with and without
    an explicit format, and for labels, attaching the file to a caption dataset."""
    with tempfile.TemporaryDirectory(prefix="cvfuzz-") as tmp:
        root = Path(tmp)
        path = fx.write(root, target_bytes)
        if prepare is not None:
            prepare(root)
        module = importlib.import_module(f"crossview.data.readers.{READERS[fx.format].module}")
        outcomes = [assert_outcome(lambda: detect_format(path) and load_dataset(path), root),
                    assert_outcome(lambda: load_dataset(path, format=fx.format), root),
                    assert_outcome(lambda: module.read(path), root)]  # a reader called directly
        for info in READERS.values():  # every format's detect() answers, without blocking or raising
            detect = importlib.import_module(f"crossview.data.readers.{info.module}").detect
            found, error = call_with_timeout(lambda: detect(path), root)
            assert error is None and isinstance(found, bool), (info.name, error)
        if fx.format == "labels":
            base = FIXTURES["folder-jsonl"].write(root)
            ds = load_dataset(base)
            outcomes.append(assert_outcome(lambda: attach_label_sets(ds, root / fx.target), root))
        _unblock_fifos(root)
        return outcomes


# ---------------------------------------------------------------------------------------------- strategies
#: Values no JSON encoder writes but a hostile file may hold: put in as raw text.
RAW_VALUES = ["1" * 5000, "-" + "9" * 4400, "1e400", "-1e400", "NaN", "Infinity", "1" + "0" * 40,
              "[" * 5000 + "]" * 5000, "{\"a\":" * 3000 + "1" + "}" * 3000, "[" * 200_000 + "]" * 200_000]

hostile_strings = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "\u2028", "a\x85b", "\x00", "a\nb", "\ufeff", "~nosuchuser/a.png", "/",
                     "..", "../../../../etc/passwd", "images/", "images/im0.png", "IMAGES/IM0.PNG",
                     "x" * 300 + ".png", "images/" + "y" * 5000, "dev", "validation", "TEST", "restval",
                     "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace")]),
    st.builds(lambda n: "w" * n, st.integers(100_000, 300_000)),
)
json_leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-2**70, 2**70),
                        st.floats(allow_nan=False, allow_infinity=False), hostile_strings,
                        st.sampled_from([f"\x00RAW{i}\x00" for i in range(len(RAW_VALUES))]))
json_values = st.recursive(json_leaves, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                               st.dictionaries(st.text(max_size=8), kids,
                                                                               max_size=4)),
                           max_leaves=12)


def _dump(doc: Any) -> bytes:
    text = json.dumps(doc)
    for i, raw in enumerate(RAW_VALUES):
        text = text.replace(json.dumps(f"\x00RAW{i}\x00"), raw)
    return text.encode("utf-8", "surrogatepass")


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key / index path into a JSON document."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.extend(_paths(v, prefix + (i,)))
    return out


def _mutate_json(doc: Any, data: st.DataObject) -> Any:
    """One structural change: a value replaced by a hostile one, a key deleted, an entry duplicated."""
    paths = _paths(doc)
    path = data.draw(st.sampled_from(paths), label="path")
    op = data.draw(st.sampled_from(["replace", "replace", "replace", "delete", "duplicate"]), label="op")
    value = data.draw(json_values, label="value") if op == "replace" else None
    if not path:
        return value if op == "replace" else doc
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if op == "replace":
        parent[last] = value
    elif op == "delete":
        del parent[last]
    elif isinstance(parent, list):
        parent.insert(last, json.loads(json.dumps(parent[last])))
    return doc


def _mutate_bytes(data_bytes: bytes, data: st.DataObject) -> bytes:
    """A few byte-level changes: flips, truncation, insertions, BOMs, re-encoding, doubling."""
    b = bytearray(data_bytes)
    for _ in range(data.draw(st.integers(1, 3), label="n_ops")):
        op = data.draw(st.sampled_from(["flip", "truncate", "insert", "bom", "utf16", "latin1", "double",
                                        "crlf", "nul", "huge_line"]), label="byte_op")
        pos = data.draw(st.integers(0, max(0, len(b))), label="pos")
        if op == "flip" and b:
            i = min(pos, len(b) - 1)
            b[i] ^= data.draw(st.integers(1, 255), label="mask")
        elif op == "truncate":
            del b[pos:]
        elif op == "insert":
            b[pos:pos] = data.draw(st.binary(max_size=16), label="ins")
        elif op == "bom":
            b[0:0] = b"\xef\xbb\xbf"
        elif op == "utf16":
            b = bytearray(bytes(b).decode("utf-8", "replace").encode("utf-16"))
        elif op == "latin1":
            b[pos:pos] = "é".encode("latin-1")
        elif op == "double":
            b = b + b
        elif op == "crlf":
            b = bytearray(bytes(b).replace(b"\n", b"\r\n"))
        elif op == "nul":
            b[pos:pos] = b"\x00"
        elif op == "huge_line":
            b[pos:pos] = b"z" * 140_000
    return bytes(b)


def _mutate_csv(text: str, data: st.DataObject) -> bytes:
    """CSV-specific changes: duplicate / renamed / dropped columns, huge fields, unclosed quotes, odd
    delimiters, extra fields, a hostile value in one cell."""
    rows = list(csv.reader(io.StringIO(text)))
    op = data.draw(st.sampled_from(["dup_col", "rename_col", "drop_col", "huge_field", "unclosed_quote",
                                    "delimiter", "extra_field", "cell", "empty_header", "bom_header"]),
                   label="csv_op")
    r = data.draw(st.integers(1, len(rows) - 1), label="row")
    c = data.draw(st.integers(0, len(rows[0]) - 1), label="col")
    delim = ","
    if op == "dup_col":
        rows[0].append(rows[0][c])
        for row in rows[1:]:
            row.append(row[c] + "x")
    elif op == "rename_col":
        rows[0][c] = data.draw(hostile_strings, label="name")
    elif op == "drop_col":
        for row in rows:
            del row[c]
    elif op == "huge_field":
        rows[r][c] = "h" * data.draw(st.integers(131_000, 140_000), label="size")
    elif op == "cell":
        rows[r][c] = data.draw(hostile_strings, label="cell")
    elif op == "extra_field":
        rows[r].append("surplus")
    elif op == "delimiter":
        delim = data.draw(st.sampled_from(["\t", ";", "|", " "]), label="delim")
    elif op == "empty_header":
        rows[0] = []
    out = io.StringIO()
    csv.writer(out, delimiter=delim, lineterminator="\n").writerows(rows)
    text = out.getvalue()
    if op == "unclosed_quote":
        lines = text.split("\n")
        lines[r] = '"' + lines[r]
        text = "\n".join(lines)
    if op == "bom_header":
        text = "\ufeff" + text
    return text.encode("utf-8", "surrogatepass")


def _mutate_npy(raw: bytes, data: st.DataObject) -> bytes:
    """A .npy with a damaged header (shape, dtype, version) or body, or another kind of array."""
    op = data.draw(st.sampled_from(["header", "bytes", "dtype", "shape", "pickle"]), label="npy_op")
    if op == "bytes":
        return _mutate_bytes(raw, data)
    if op == "pickle":
        buf = io.BytesIO()
        np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
        return buf.getvalue()
    if op == "dtype":
        dt = data.draw(st.sampled_from(["<U4", "|b1", "<c8", "|V4", "<M8[s]", "|O", "<f2", "<i8", "zz"]))
        arr_hdr = {"descr": dt, "fortran_order": False, "shape": (4, 6)}
    elif op == "shape":
        shape = data.draw(st.sampled_from([(), (0,), (4,), (4, 0), (0, 6), (4, 6, 2), (2**62, 6), (-1, 6),
                                           (10**30, 2), (8, 6), (2, 6)]), label="shape")
        arr_hdr = {"descr": "<f4", "fortran_order": False, "shape": shape}
    else:
        header_text = data.draw(st.sampled_from(["{", "{}", "{'descr': 1}", "[1, 2]", "__import__('os')",
                                                 "{'descr': '<f4', 'fortran_order': 'x', 'shape': (4, 6)}",
                                                 "{'descr': '<f4', 'fortran_order': False, 'shape': 'x'}"]))
        body = header_text.encode().ljust(118) + b"\n"
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body + raw[128:]
    body = repr(arr_hdr).encode().ljust(118) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body + raw[128:]


# ---------------------------------------------------------------------------------------------- properties
BYTE_TARGETS = list(FIXTURES)
JSON_TARGETS = [n for n, f in FIXTURES.items() if f.kind in ("json", "jsonl")]
CSV_TARGETS = [n for n, f in FIXTURES.items() if f.kind == "csv"]


@pytest.mark.parametrize("name", BYTE_TARGETS)
@FUZZ
@given(data=st.data())
def test_fuzz_bytes(name: str, data: st.DataObject) -> None:
    """Byte-level damage to any format's file: a clean load, a counted warning, or one clear line."""
    fx = FIXTURES[name]
    check_all_ways(fx, _mutate_bytes(fx.files[fx.target], data))


@pytest.mark.parametrize("name", JSON_TARGETS)
@FUZZ
@given(data=st.data())
def test_fuzz_json_fields(name: str, data: st.DataObject) -> None:
    """Every field of a JSON / JSONL dataset replaced with hostile values (wrong types, huge numbers,
    deep nesting, odd strings), deleted or duplicated."""
    fx = FIXTURES[name]
    raw = fx.files[fx.target]
    if fx.kind == "json":
        mutated = _dump(_mutate_json(json.loads(raw), data))
    else:
        rows = [json.loads(line) for line in raw.decode().splitlines()]
        rows = _mutate_json(rows, data)  # the list of lines; replacing it whole gives one line
        mutated = b"\n".join(_dump(r) for r in rows) + b"\n" if isinstance(rows, list) else _dump(rows)
    check_all_ways(fx, mutated)


@pytest.mark.parametrize("name", CSV_TARGETS)
@FUZZ
@given(data=st.data())
def test_fuzz_csv(name: str, data: st.DataObject) -> None:
    """CSV-specific damage: duplicate columns, huge fields, unclosed quotes, other delimiters."""
    fx = FIXTURES[name]
    check_all_ways(fx, _mutate_csv(fx.files[fx.target].decode(), data))


@FUZZ
@given(data=st.data())
def test_fuzz_npy(data: st.DataObject) -> None:
    """A precomp feature file with a damaged header, another dtype or shape, or a pickle."""
    fx = FIXTURES["precomp-npy"]
    check_all_ways(fx, _mutate_npy(fx.files[fx.target], data))


# ---------------------------------------------------------------------------------------------- special files
def _special(kind: str) -> Callable[[Path, Path], None]:
    """A function replacing the file ``p`` (under ``root``) by a special file of ``kind``."""
    def make(root: Path, p: Path) -> None:
        p.unlink()
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "loop":
            p.symlink_to(p.name)
        elif kind == "loop2":
            other = p.with_name(p.name + ".other")
            p.symlink_to(other.name)
            other.symlink_to(p.name)
        elif kind == "dangling":
            p.symlink_to(root / "nowhere")
        elif kind == "devnull":
            p.symlink_to("/dev/null")
        elif kind == "folder":
            p.mkdir()
        elif kind == "unreadable":
            p.write_bytes(b"x")
            p.chmod(0)
    return make


SPECIAL_KINDS = ["fifo", "loop", "loop2", "dangling", "devnull", "folder", "unreadable"]


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and symlinks")
@pytest.mark.parametrize("kind", SPECIAL_KINDS)
@pytest.mark.parametrize("name", list(FIXTURES))
def test_special_file_in_place_of_the_dataset_file(name: str, kind: str) -> None:
    """The dataset's main file (or one it refers to) replaced by a FIFO, a symlink loop, a dangling link,
    /dev/null, a folder or an unreadable file: never a hang, never a traceback."""
    fx = FIXTURES[name]
    check_all_ways(fx, prepare=lambda root: _special(kind)(root, root / fx.target))


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and symlinks")
@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_special_file_given_directly(kind: str) -> None:
    """The path given to load_dataset is itself special (named like a dataset file of each format)."""
    for fname in ("dataset_x.json", "reid_raw.json", "captions.csv", "tags.txt", "labels.jsonl", "c.txt"):
        with tempfile.TemporaryDirectory(prefix="cvfuzz-") as tmp:
            root = Path(tmp)
            p = root / fname
            p.write_bytes(b"{}")
            _special(kind)(root, p)
            # Root reads a file whatever its mode: then "unreadable" holds "x", a valid one-line corpus.
            must_fail = kind != "unreadable" or not os.access(p, os.R_OK)
            outcome = assert_outcome(lambda: load_dataset(p), root)
            assert isinstance(outcome, CrossViewError) or not must_fail
            for fmt in ("karpathy", "cuhk-pedes", "folder", "webtags", "labels", "corpus", "precomp", "reed"):
                outcome = assert_outcome(lambda: load_dataset(p, format=fmt), root)
                assert isinstance(outcome, CrossViewError) or not must_fail
            _unblock_fifos(root)


# ---------------------------------------------------------------------------------------------- regressions
# One test per finding of issue 10, item 5; each failed (traceback, hang or silent acceptance) before the fix.
def _karpathy(root: Path, entries: list[dict] | None = None, n: int = 2) -> Path:
    (root / "images").mkdir(parents=True, exist_ok=True)
    for k in range(n):
        (root / "images" / f"im{k}.png").write_bytes(PNG)
    if entries is None:
        entries = [{"filename": f"im{k}.png", "imgid": k, "split": "train", "sentences": [{"raw": f"box {k}"}]}
                   for k in range(n)]
    path = root / "dataset_t.json"
    path.write_text(json.dumps({"images": entries}))
    return path


def one_line_error(fn: Callable[[], Any], root: Path, *needles: str) -> str:
    """The message of the DatasetError ``fn`` raises (within the hang timeout): one line, naming a file
    under ``root`` and holding every needle."""
    outcome = assert_outcome(fn, root)
    assert isinstance(outcome, DatasetError), f"accepted: {outcome!r}"
    msg = str(outcome)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs")
def test_fifo_named_like_a_dataset_does_not_block_detection(tmp_path: Path) -> None:
    fifo = tmp_path / "dataset_x.json"
    os.mkfifo(fifo)
    try:
        one_line_error(lambda: detect_format(fifo), tmp_path, str(fifo), "FIFO", "not a regular file")
        one_line_error(lambda: load_dataset(fifo), tmp_path, str(fifo), "not a regular file")
        one_line_error(lambda: load_dataset(fifo, format="karpathy"), tmp_path, "not a regular file")
        # The same FIFO found by a folder's detection: the reader refuses to open it.
        one_line_error(lambda: load_dataset(tmp_path), tmp_path, str(fifo), "not a regular file")
    finally:
        _unblock_fifos(tmp_path)


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and devices")
@pytest.mark.parametrize("fmt", ["folder", "webtags", "labels", "karpathy", "corpus"])
def test_fifo_and_dev_null_are_not_called_a_folder(tmp_path: Path, fmt: str) -> None:
    from crossview.data.readers import folder, webtags
    fifo = tmp_path / "captions.csv"
    os.mkfifo(fifo)
    try:
        for target in (fifo, Path("/dev/null")):
            msg = one_line_error(lambda: load_dataset(target, format=fmt), tmp_path if target == fifo else
                                 Path("/dev/null"), "not a regular file")
            assert "found a folder" not in msg
        # The readers' own check says what the path is, too (FIFO, device), never "a folder".
        for read in (folder.read, webtags.read):
            msg = one_line_error(lambda: read(fifo), tmp_path, "FIFO")
            assert "found a folder" not in msg
        msg = one_line_error(lambda: folder.read(Path("/dev/null")), Path("/dev/null"), "device")
        assert "found a folder" not in msg
    finally:
        _unblock_fifos(tmp_path)


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_symlink_loop(tmp_path: Path) -> None:
    loop = tmp_path / "dataset_x.json"
    loop.symlink_to(loop.name)
    one_line_error(lambda: load_dataset(loop), tmp_path, str(loop), "symlink loop")
    one_line_error(lambda: detect_format(loop), tmp_path, "symlink loop")
    one_line_error(lambda: load_dataset(loop, format="karpathy"), tmp_path, "symlink loop")
    # A loop as the image root is named too.
    path = _karpathy(tmp_path / "ds")
    (tmp_path / "root").symlink_to("root")
    one_line_error(lambda: load_dataset(path, image_root=tmp_path / "root"), tmp_path, "symlink loop")


@pytest.mark.parametrize("name", ["dataset_x.json", "reid_raw.json", "captions.jsonl", "tags.jsonl",
                                  "labels.jsonl"])
def test_json_nested_200000_deep(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    deep = "[" * 200_000 + "]" * 200_000
    path.write_text({"dataset_x.json": '{"images": %s}', "reid_raw.json": '[{"file_path": "a.png", "id": %s}]'}
                    .get(name, '{"image": %s}\n') % deep)
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "nested too deeply")
    path.write_text(deep)
    one_line_error(lambda: load_dataset(path, format=detect_format(path) if name != "dataset_x.json"
                                        else "karpathy"), tmp_path, str(path), "nested too deeply")


@pytest.mark.parametrize("name,header", [("captions.csv", "image,caption"), ("tags.csv", "image,tags"),
                                         ("labels.csv", "image,labels")])
def test_csv_field_over_131072_characters(tmp_path: Path, name: str, header: str) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    path = tmp_path / name
    path.write_text(f"{header}\na.png,{'w' * 140_000}\n")
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "line 2", "field larger than field limit")
    # The usual cause: an unclosed quote swallowing the rest of the file.
    path.write_text(f'{header}\na.png,"never closed\n' + "a.png,x\n" * 20_000)
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "unclosed quote")


@pytest.mark.parametrize("imgid", [[1, 2], {"a": 1}, 1.5, True])
def test_karpathy_imgid_of_the_wrong_type(tmp_path: Path, imgid: Any) -> None:
    path = _karpathy(tmp_path)
    doc = json.loads(path.read_text())
    doc["images"][1]["imgid"] = imgid
    path.write_text(json.dumps(doc))
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "images[1]", "'imgid' must be an integer")


def test_karpathy_imgid_string_and_null_are_accepted(tmp_path: Path) -> None:
    path = _karpathy(tmp_path, n=3)
    doc = json.loads(path.read_text())
    doc["images"][0]["imgid"], doc["images"][1]["imgid"] = "COCO_1", None
    path.write_text(json.dumps(doc))
    assert load_dataset(path).n_images == 3


@pytest.mark.parametrize("name", ["dataset_x.json", "reid_raw.json", "captions.jsonl"])
def test_a_5000_digit_integer(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    big = "7" * 5000
    path.write_text({"dataset_x.json": '{"images": [{"filename": "a.png", "imgid": %s}]}',
                     "reid_raw.json": '[{"file_path": "a.png", "id": %s}]',
                     "captions.jsonl": '{"image": "a.png", "caption": "x", "label": %s}\n'}[name] % big)
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "too many digits")


@pytest.mark.parametrize("pid", [10**40, -(10**40), "1" * 40, "²"])
def test_cuhk_pedes_id_out_of_range(tmp_path: Path, pid: Any) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(PNG)
    path = tmp_path / "reid_raw.json"
    path.write_text(json.dumps([{"split": "train", "captions": ["a person"], "file_path": "a.png", "id": pid}]))
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "entry 0", "'id'")


def test_cuhk_pedes_largest_int64_id_is_kept(tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(PNG)
    path = tmp_path / "reid_raw.json"
    path.write_text(json.dumps([{"split": "train", "captions": ["a person"], "file_path": "a.png",
                                 "id": 2**63 - 1}]))
    assert load_dataset(path).label_names == [str(2**63 - 1)]


@pytest.mark.parametrize("fmt", ["karpathy", "cuhk-pedes", "folder"])
def test_image_name_over_255_characters(tmp_path: Path, fmt: str) -> None:
    """A name too long for the file system is a missing image (counted), not an OSError."""
    long = "x" * 300 + ".png"
    if fmt == "karpathy":
        path = _karpathy(tmp_path, n=2)
        doc = json.loads(path.read_text())
        doc["images"].insert(0, {"filename": long, "split": "train", "sentences": [{"raw": "long"}]})
        for k, e in enumerate(doc["images"]):
            e["imgid"] = k
        path.write_text(json.dumps(doc))
    elif fmt == "cuhk-pedes":
        (tmp_path / "imgs").mkdir()
        (tmp_path / "imgs" / "a.png").write_bytes(PNG)
        path = tmp_path / "reid_raw.json"
        path.write_text(json.dumps([{"split": "train", "captions": ["p"], "file_path": fp, "id": 1}
                                    for fp in (long, "a.png")]))
    else:
        (tmp_path / "a.png").write_bytes(PNG)
        path = tmp_path / "captions.jsonl"
        path.write_text(_jsonl([{"image": long, "caption": "x"}, {"image": "a.png", "caption": "y"}]).decode())
    ds = assert_outcome(lambda: load_dataset(path), tmp_path)
    n = 3 if fmt == "karpathy" else 2
    assert isinstance(ds, PairedDataset) and ds.n_images == n - 1
    assert any(f"skipped 1 of {n} images whose file is missing" in w for w in ds.warnings)


def _png_of_size(width: int, height: int) -> bytes:
    """A tiny PNG file whose header declares ``width`` x ``height`` pixels (a decompression bomb)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + chunk(b"IEND", b""))


def test_decompression_bomb_is_an_unreadable_image(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from crossview.cli import main
    path = _karpathy(tmp_path, n=2)
    bomb = tmp_path / "images" / "im1.png"
    bomb.write_bytes(_png_of_size(30_000, 30_000))
    with pytest.raises(DatasetError, match=r"im1\.png: image too large to decode"):
        open_image(bomb)
    ds = load_dataset(path)
    bad = verify_images(ds.image_paths)
    assert [i for i, _ in bad] == [1] and "too large" in bad[0][1]
    assert main(["data", "info", str(path), "--check-images"]) == 1
    out = capsys.readouterr().out
    assert "1 of 2 images unreadable" in out and "im1.png: image too large to decode" in out


def _jpeg_of_size(width: int, height: int) -> bytes:
    """The start of a baseline JPEG whose frame header (SOF0) declares ``width`` x ``height`` pixels."""
    sof = struct.pack(">HBHHB", 17, 8, height, width, 3) + b"".join(bytes([c, 0x11, 0]) for c in (1, 2, 3))
    return b"\xff\xd8" + b"\xff\xc0" + sof + b"\xff\xd9"


@pytest.mark.parametrize("kind", ["png", "jpeg"])
def test_every_place_that_opens_an_image_refuses_a_bomb_in_one_line(tmp_path: Path, kind: str,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """Pillow's DecompressionBombError is no OSError: each reader of image files (the query / explain / serve check,
    the end-to-end loaders, the region maps' overlay) names the file and says it is too large, no traceback, and
    the device path never hands a bomb to libjpeg-turbo / nvJPEG (no limit there: gigabytes)."""
    import torch

    from crossview.commands.query import _check_image_file
    from crossview.explain.render import overlay
    from crossview.nn import device_images as D
    from crossview.nn.images import ImageFiles

    bomb = tmp_path / f"big.{'png' if kind == 'png' else 'jpg'}"
    bomb.write_bytes(_png_of_size(60_000, 60_000) if kind == "png" else _jpeg_of_size(60_000, 60_000))
    # a JPEG's size comes from its frame header; Pillow's header read refuses a bomb (None: the caller decodes it)
    assert D.image_size(D.read_bytes(str(bomb))) == ((60_000, 60_000) if kind == "jpeg" else None)
    with pytest.raises(CrossViewError, match=r"--image .*big\.\w+: image too large to decode .*; resize it"):
        _check_image_file(bomb)
    with pytest.raises(CrossViewError, match=r"big\.\w+: image too large to decode"):
        ImageFiles([str(bomb)])[0]
    with pytest.raises(CrossViewError, match=r"big\.\w+: image too large to decode"):
        overlay(str(bomb), None)
    seen: list[int] = []

    def decode_jpeg(datas, **_kw):              # what the device decoder is handed
        seen.append(len(datas))
        raise AssertionError("a bomb reached the JPEG decoder")

    import torchvision.io
    orig = torchvision.io.decode_jpeg
    torchvision.io.decode_jpeg = decode_jpeg
    try:
        with pytest.raises(CrossViewError, match=r"big\.\w+: image too large to decode"):
            D.decode_images([str(bomb)], torch.device("cpu"))
    finally:
        torchvision.io.decode_jpeg = orig
    assert seen == []
    other = tmp_path / "notes.jpg"
    other.write_bytes(b"a text file named .jpg")
    with pytest.raises(CrossViewError, match=r"notes\.jpg: not an image file Pillow can read; give a JPEG, PNG"):
        _check_image_file(other)
    from crossview.cli import main
    assert main(["query", str(tmp_path / "no-run"), "--image", str(bomb)]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs")
def test_open_image_on_a_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "a.png"
    os.mkfifo(fifo)
    try:
        one_line_error(lambda: open_image(fifo), tmp_path, "not a regular file")
    finally:
        _unblock_fifos(tmp_path)


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = _karpathy(tmp_path / "k")
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert detect_format(path) == "karpathy" and load_dataset(path).n_images == 2
    (tmp_path / "c" / "imgs").mkdir(parents=True)
    (tmp_path / "c" / "imgs" / "a.png").write_bytes(PNG)
    pedes = tmp_path / "c" / "reid_raw.json"
    pedes.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"split": "train", "captions": ["p"], "file_path": "a.png",
                                                    "id": 1}]).encode())
    assert detect_format(pedes) == "cuhk-pedes" and load_dataset(pedes).n_images == 1
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "a.png").write_bytes(PNG)
    for name, text in (("captions.csv", "image,caption,split\na.png,a red box,train\n"),
                       ("captions.jsonl", '{"image": "a.png", "caption": "a red box", "split": "train"}\n')):
        path = tmp_path / "f" / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        ds = load_dataset(path)
        assert ds.captions == ["a red box"] and ds.warnings == [] and list(ds.splits) == ["train"]
        path.unlink()
    path = tmp_path / "f" / "tags.csv"
    path.write_bytes(b"\xef\xbb\xbfimage,tags\na.png,red\n")
    assert load_dataset(path).tags == [["red"]]


def test_utf16_is_named(tmp_path: Path) -> None:
    path = tmp_path / "captions.csv"
    path.write_text("image,caption\na.png,x\n", encoding="utf-16")
    one_line_error(lambda: load_dataset(path, format="folder"), tmp_path, "UTF-16", "Save the file as UTF-8")


@pytest.mark.parametrize("split", [["train"], {"a": 1}, 3, 2.5, True])
def test_split_of_another_json_type_is_an_error(tmp_path: Path, split: Any) -> None:
    path = _karpathy(tmp_path / "k")
    doc = json.loads(path.read_text())
    doc["images"][1]["split"] = split
    path.write_text(json.dumps(doc))
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "images[1]", "'split' must be a string")
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "a.png").write_bytes(PNG)
    path = tmp_path / "f" / "captions.jsonl"
    path.write_text(json.dumps({"image": "a.png", "caption": "x", "split": split}) + "\n")
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "line 1", "'split' must be a string")


def test_missing_or_null_split_is_counted(tmp_path: Path) -> None:
    path = _karpathy(tmp_path, n=3)
    doc = json.loads(path.read_text())
    doc["images"][0]["split"] = None
    del doc["images"][1]["split"]
    path.write_text(json.dumps(doc))
    ds = load_dataset(path)
    assert ds.splits["train"].tolist() == [0, 1, 2]
    assert "2 image(s) have no split and were put in 'train'" in ds.warnings


@pytest.mark.parametrize("label", [["dog"], {"a": 1}, True])
def test_folder_label_of_another_json_type_is_an_error(tmp_path: Path, label: Any) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    path = tmp_path / "captions.jsonl"
    path.write_text(json.dumps({"image": "a.png", "caption": "x", "label": label}) + "\n")
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "line 1", "'label' must be")


@pytest.mark.parametrize("name,header", [("captions.csv", "image,caption,caption"),
                                         ("captions.csv", "Image,caption,IMAGE"),
                                         ("tags.csv", "image,tags,tags"), ("labels.csv", "image,image,labels")])
def test_duplicate_csv_columns_are_an_error(tmp_path: Path, name: str, header: str) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    path = tmp_path / name
    path.write_text(f"{header}\na.png,first,second\n")
    dup = header.lower().split(",")
    dup = next(c for c in dup if dup.count(c) > 1)
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "line 1", f"column '{dup}' appears twice")


def test_line_separators_inside_captions_are_kept(tmp_path: Path) -> None:
    """U+2028 and \\x85 are valid inside JSON strings and CSV fields: not line breaks of the file."""
    (tmp_path / "a.png").write_bytes(PNG)
    path = tmp_path / "captions.jsonl"
    path.write_text('{"image": "a.png", "caption": "a red\u2028box"}\n{"image": "a.png", "caption": "b\x85c"}\n')
    assert load_dataset(path).n_captions == 2
    path.unlink()
    path = tmp_path / "captions.csv"
    path.write_text("image,caption\na.png,a red\u2028box\na.png,b\x85c\n")
    ds = load_dataset(path)
    assert ds.n_captions == 2 and ds.warnings == []


def test_tilde_user_that_does_not_exist_is_a_missing_image(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    path = tmp_path / "captions.jsonl"
    path.write_text(_jsonl([{"image": "~nosuchuser_cv/b.png", "caption": "x"},
                            {"image": "a.png", "caption": "y"}]).decode())
    ds = load_dataset(path)
    assert ds.n_images == 1 and any("skipped 1 of 2 images" in w for w in ds.warnings)
    one_line_error(lambda: load_dataset("~nosuchuser_cv/x.json"), Path("~nosuchuser_cv"), "nosuchuser_cv")


def test_a_stray_exception_becomes_one_line_naming_the_file(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The last line of defence: a reader bug (any exception) is still a DatasetError naming the file."""
    from crossview.data.readers import corpus
    path = tmp_path / "c.txt"
    path.write_text("a caption\n")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise KeyError("surprise\nsecond line")
    monkeypatch.setattr(corpus, "read", broken)
    msg = one_line_error(lambda: load_dataset(path), tmp_path, str(path), "KeyError")
    assert "surprise" in msg


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs")
def test_cli_data_info_on_bad_files_prints_one_error_line(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    from crossview.cli import main
    deep = tmp_path / "dataset_deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    fifo = tmp_path / "dataset_x.json"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop.name)
    dup = tmp_path / "captions.csv"
    dup.write_text("image,caption,caption\na.png,x,y\n")
    try:
        for bad in (deep, fifo, loop, dup):
            rc, error = call_with_timeout(lambda: main(["data", "info", str(bad)]), tmp_path)
            assert error is None and rc == 2
            err = capsys.readouterr().err
            assert len(err.splitlines()) == 1 and err.startswith("crossview: error: ") and str(bad) in err
    finally:
        _unblock_fifos(tmp_path)


@pytest.mark.parametrize("name", ["\x85", "\x1e", "\u2028", "\r"])
def test_warning_naming_an_odd_image_path_stays_one_line(tmp_path: Path, name: str) -> None:
    """Found by the fuzzer: a line separator inside a quoted CSV field was a line break (the name lost
    the character), and kept as it is, it split the missing-image warning."""
    (tmp_path / "a.png").write_bytes(PNG)
    path = tmp_path / "tags.csv"
    path.write_text(f'image,tags\na.png,red\n"b{name}c.png",blue\n', newline="")
    ds = load_dataset(path)
    assert ds.n_images == 1 and len(ds.warnings) == 1
    assert len(ds.warnings[0].splitlines()) == 1 and "skipped 1 of 2 images" in ds.warnings[0]
    assert f"b{repr(name)[1:-1]}c.png" in ds.warnings[0]  # the name kept, shown escaped (not cut or merged)


@pytest.mark.parametrize("name,text", [
    ("dataset_x.json", '{"images": [{"filename": "a.png", "filename": "b.png", "sentences": []}]}'),
    ("reid_raw.json", '[{"file_path": "a.png", "id": 1, "id": 2}]'),
    ("captions.jsonl", '{"image": "a.png", "caption": "x", "caption": "y"}\n'),
    ("tags.jsonl", '{"image": "a.png", "tags": ["x"], "image": "b.png"}\n')])
def test_a_json_key_given_twice_is_an_error(tmp_path: Path, name: str, text: str) -> None:
    """Like a duplicate CSV column: json would keep the last value without a word."""
    path = tmp_path / name
    path.write_text(text)
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "appears twice in one object")


@pytest.mark.parametrize("key,value", [("filepath", 3), ("filepath", ["a"]), ("label", ["dog"]), ("label", True),
                                       ("tags", {"a": 1}), ("tags", 3), ("labels", 2.5)])
def test_karpathy_optional_field_of_the_wrong_type(tmp_path: Path, key: str, value: Any) -> None:
    path = _karpathy(tmp_path)
    doc = json.loads(path.read_text())
    doc["images"][1][key] = value
    path.write_text(json.dumps(doc))
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "images[1]", f"'{key}' must be")


@pytest.mark.parametrize("tags", [{"a": 1}, 3, True])
def test_folder_tags_of_the_wrong_type(tmp_path: Path, tags: Any) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    path = tmp_path / "captions.jsonl"
    path.write_text(json.dumps({"image": "a.png", "caption": "x", "tags": tags}) + "\n")
    one_line_error(lambda: load_dataset(path), tmp_path, str(path), "line 1", "'tags' must be")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_precomp_non_finite_features_are_an_error(tmp_path: Path, bad: float) -> None:
    feats = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    feats[2, 3] = bad
    np.save(tmp_path / "train_ims.npy", feats)
    (tmp_path / "train_caps.txt").write_text("".join(f"caption {k}\n" for k in range(4)))
    one_line_error(lambda: load_dataset(tmp_path), tmp_path, "train_ims.npy", "1 of 4 feature rows hold NaN",
                   "first: row 2")


@pytest.mark.parametrize("module_name", [info.module for info in READERS.values()])
def test_readers_called_directly_on_unusable_paths(tmp_path: Path, module_name: str) -> None:
    """Each reader's own detect() / read(), not only load_dataset: a name too long for the file system,
    a symlink loop, a NUL character. detect() says False; read() raises one DatasetError line."""
    module = importlib.import_module(f"crossview.data.readers.{module_name}")
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    for path in (tmp_path / ("x" * 300 + ".json"), tmp_path / ("y" * 300) / "captions.csv", loop,
                 tmp_path / "nul\x00.txt"):
        found, error = call_with_timeout(lambda: module.detect(path), tmp_path)
        assert error is None and found is False, (path, error)
        one_line_error(lambda: module.read(path), tmp_path)


@pytest.mark.parametrize("header", ["{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), }\'\'\'",
                                    "{'descr': '<f4', 'shape': (4, 6 ", "[" * 100, "{}", "{'descr': 'zz'}",
                                    "{'descr': '<f4', 'fortran_order': False, 'shape': (2**62, 6)}"])
def test_precomp_damaged_npy_header(tmp_path: Path, header: str, recwarn: pytest.WarningsRecorder) -> None:
    """Found by the fuzzer: numpy's header parser raised tokenize.TokenError on an unclosed bracket or quote,
    and a huge shape printed an overflow RuntimeWarning to the terminal besides the error line."""
    body = header.replace("2**62", str(2**62)).encode().ljust(118) + b"\n"
    (tmp_path / "train_ims.npy").write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body
                                             + bytes(96))
    (tmp_path / "train_caps.txt").write_text("".join(f"caption {k}\n" for k in range(4)))
    one_line_error(lambda: load_dataset(tmp_path), tmp_path, "train_ims.npy", "cannot read as a .npy array")
    assert [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)] == []


# ---------------------------------------------------------------------------------------------- issue 31: intent
# The properties above check that a reader never crashes. Those below generate a dataset together with what it
# MEANS (its rows, images, splits, labels, features) and check that the reader returns exactly that, or raises
# one DatasetError line naming the file: never silent loss (rows swallowed by a quote, one photo as two images,
# an image moved out of train by a typo, labels merged without a word, features no method can learn from).

#: Characters that must never reach a terminal raw: ESC (ANSI sequences), CR, NUL, DEL, C1, line separators,
#: a bidirectional override and lone surrogates (legal in JSON, unencodable in UTF-8).
HOSTILE_CHARS = ["\x1b", "\x1b[31m", "\r", "\x00", "\x07", "\x7f", "\x85", "\x9b", "\u2028", "\u202e",
                 "\ud83d", "\udc00", "\t", "\n"]


def hostile_text(min_size: int = 0) -> st.SearchStrategy[str]:
    """Words with hostile characters mixed in."""
    piece = st.one_of(st.sampled_from(HOSTILE_CHARS), st.sampled_from(["a", "dog", " ", "caf\u00e9", "\U0001f436",
                                                                        ",", '"', ";", "|"]))
    return st.lists(piece, min_size=min_size, max_size=8).map("".join)


def _unsafe_in(text: str) -> bool:
    """Whether ``text`` holds a character that must not reach a terminal raw (newline and tab allowed)."""
    return has_unsafe(text.replace("\n", "").replace("\t", ""))


def _write_images(root: Path, n: int) -> None:
    (root / "images").mkdir(parents=True, exist_ok=True)
    for k in range(n):
        (root / "images" / f"im{k}.png").write_bytes(PNG)


def expect_error(fn: Callable[[], Any], root: Path, *needles: str) -> str:
    """``fn`` must raise one DatasetError line naming a file under ``root`` and containing ``needles``."""
    outcome = assert_outcome(fn, root)
    assert isinstance(outcome, DatasetError), f"accepted: {outcome!r}"
    msg = str(outcome)
    for needle in needles:
        assert needle in msg, (needle, msg)
    assert not _unsafe_in(msg), f"raw control characters in {msg!r}"
    return msg


def expect_dataset(fn: Callable[[], Any], root: Path) -> PairedDataset:
    outcome = assert_outcome(fn, root)
    assert isinstance(outcome, PairedDataset), f"refused: {outcome}"
    text = format_info(dataset_info(outcome))
    assert not _unsafe_in(text), f"raw control characters in `data info`: {text!r}"
    return outcome


# -- CSV quoting
@FUZZ
@given(data=st.data())
def test_fuzz_csv_quoting_keeps_every_row_or_names_the_line(data: st.DataObject) -> None:
    """Rows written with the csv module (quoted commas, quotes and line breaks inside captions) load with
    every row and caption intact; one quote then removed or added makes a file that is refused naming the
    file, or still holds every row (never rows swallowed into one caption)."""
    n = data.draw(st.integers(2, 7), label="rows")
    caption = st.lists(st.sampled_from(["a", "dog", ",", '"', "\n", "red, big", " ", "x"]), min_size=1,
                       max_size=6).map("".join).filter(lambda c: clean_caption(c) is not None)
    captions = data.draw(st.lists(caption, min_size=n, max_size=n), label="captions")
    with_split = data.draw(st.booleans(), label="split column")
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\n")
    header = ["image", "caption"] + (["split"] if with_split else [])
    writer.writerow(header)
    for k, c in enumerate(captions):
        writer.writerow([f"images/im{k}.png", c] + (["train"] if with_split else []))
    text = buf.getvalue()
    damage = data.draw(st.sampled_from(["none", "drop a quote", "add a quote"]), label="damage")
    if damage != "none":
        quotes = [i for i, ch in enumerate(text) if ch == '"']
        commas = [i + 1 for i, ch in enumerate(text) if ch == "," and i > text.index("\n")]
        if damage == "drop a quote" and quotes:
            i = data.draw(st.sampled_from(quotes), label="quote dropped")
            text = text[:i] + text[i + 1:]
        elif damage == "add a quote" and commas:
            i = data.draw(st.sampled_from(commas), label="quote added")
            text = text[:i] + '"' + text[i:]
        else:
            damage = "none"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write_images(root, n)
        (root / "captions.csv").write_text(text, encoding="utf-8", newline="")
        outcome = assert_outcome(lambda: load_dataset(root), root)
        if isinstance(outcome, DatasetError):
            msg = str(outcome)
            assert "captions.csv (line " in msg, msg
            if damage == "none":  # a valid file is refused only by the documented rule (see iter_csv): a line
                # after the first of a quoted caption holds a row's worth of commas (the caption's last line
                # is followed by the row's remaining fields on the same physical line)
                def looks_like_rows(c: str) -> bool:
                    lines = c.replace('"', '""').split("\n")[1:]
                    if lines:
                        lines[-1] += '"' + ",x" * (len(header) - 2)   # the caption's closing quote, next columns
                    return any(line.count(",") >= len(header) - 1 and not line.split(",")[0].endswith('"')
                               for line in lines)
                assert "unclosed quote" in msg and any(looks_like_rows(c) for c in captions), msg
            return
        assert isinstance(outcome, PairedDataset)
        if damage == "none" or (outcome.n_images, outcome.n_captions) != (n, n):
            # a damaged file may still read, its rows all kept, or with what it lost said and counted (a row
            # whose opening quote was dropped: an empty caption and a line naming a missing image, skipped)
            lost = [w for w in outcome.warnings if w.startswith("skipped")]
            assert (outcome.n_images, outcome.n_captions) == (n, n) or (damage != "none" and lost), \
                (damage, text, outcome.warnings)
        if damage == "none":
            assert outcome.captions == [clean_caption(c) for c in captions]


# -- dataset strings: control characters and surrogates in every string field
@FUZZ
@given(data=st.data())
def test_fuzz_hostile_strings_in_every_field_are_escaped_or_refused(data: st.DataObject) -> None:
    """ESC, CR, NUL, C1, line separators and lone surrogates in the caption, label, tags, split, image name and
    dataset name of a Karpathy file or a captions.jsonl: captions are kept (cleaned of whitespace only), a
    hostile split name is refused naming the entry, and nothing the reader says (error, warning, `data info`)
    holds a raw control character."""
    fmt = data.draw(st.sampled_from(["karpathy", "folder"]), label="format")
    n = data.draw(st.integers(1, 4), label="images")
    field = data.draw(st.sampled_from(["caption", "label", "tags", "split", "image", "name"]), label="field")
    value = data.draw(hostile_text(min_size=1), label="value")
    value = json.loads(json.dumps(value))  # what a reader sees: "\ud83d\udc00" in JSON is one character, a pair
    captions = [f"a red box {k}" for k in range(n)]
    labels: list[Any] = [f"c{k % 2}" for k in range(n)]
    tags: list[Any] = [["red"] for _ in range(n)]
    splits = ["train"] * n
    images = [f"im{k}.png" for k in range(n)]
    extra_image = None
    if field == "caption":
        captions[-1] = value + " box"
    elif field == "label":
        labels[-1] = value
    elif field == "tags":
        tags[-1] = [value, "ok"]
    elif field == "split":
        splits[-1] = value
    elif field == "image":  # a missing image with a hostile name, beside the real ones
        extra_image = value
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write_images(root, n)
        if fmt == "karpathy":
            entries = [{"filename": img, "split": s, "label": lab, "tags": t, "sentences": [{"raw": c}]}
                       for img, s, lab, t, c in zip(images, splits, labels, tags, captions)]
            if extra_image is not None:
                entries.append({"filename": extra_image, "split": "train", "label": "c0", "sentences": [{"raw": "x"}]})
            doc = {"dataset": value if field == "name" else "tiny", "images": entries}
            (root / "dataset_t.json").write_text(json.dumps(doc))
            target = root / "dataset_t.json"
        else:
            rows = [{"image": f"images/{img}", "caption": c, "label": lab, "tags": t, "split": s}
                    for img, s, lab, t, c in zip(images, splits, labels, tags, captions)]
            if extra_image is not None:
                rows.append({"image": f"images/{extra_image}", "caption": "x", "label": "c0", "split": "train"})
            (root / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            target = root / "captions.jsonl"
        outcome = assert_outcome(lambda: load_dataset(target), root)
        if isinstance(outcome, DatasetError):
            msg = str(outcome)
            assert not _unsafe_in(msg), msg
            clean_split = value.strip().lower()
            allowed = ((field == "split" and (has_unsafe(clean_split) or "/" in clean_split or "\\" in clean_split
                                              or clean_split in (".", "..")))
                       or (field == "label" and not value.strip())   # a blank label: the image has none
                       or (field == "image" and not value.strip()))   # a blank file name
            assert allowed, f"refused: {msg}"
            return
        ds = outcome
        assert not _unsafe_in(format_info(dataset_info(ds)))
        # a lone surrogate in a caption is repaired to U+FFFD when the dataset is built (and said in a warning)
        assert ds.n_images == n and ds.captions == [repair_text(clean_caption(c))[0] for c in captions]
        if field == "split":
            name = value.strip().lower()
            expected = {"dev": "val", "validation": "val", "valid": "val"}.get(name, name) or "train"
            assert ds.split_names and int(ds.splits[expected][-1]) == n - 1
        for w in ds.warnings:
            assert not _unsafe_in(w), w


# -- path aliases
def _alias(name: str, root: Path, how: str) -> str:
    return {"plain": name, "dot": f"./{name}", "up": f"sub/../{name}", "deep": f"./a/b/../.././{name}",
            "double slash": f"images//{name.split('/', 1)[1]}" if "/" in name else name,
            "absolute": str(root / name), "spaces": f"  {name} "}[how]


ALIASES = ["plain", "dot", "up", "deep", "double slash", "absolute", "spaces"]


@FUZZ
@given(data=st.data())
def test_fuzz_image_name_aliases_are_one_image(data: st.DataObject) -> None:
    """The same photo written as ``x.png``, ``./x.png``, ``a/../x.png``, ``images//x.png``, its absolute path
    or with spaces is one image: in a captions file its lines are its captions (so it cannot straddle two
    splits), in a Karpathy / tags / labels file a second entry for it is a duplicate error."""
    fmt = data.draw(st.sampled_from(["folder-jsonl", "folder-csv", "karpathy", "webtags", "labels"]), label="format")
    n = data.draw(st.integers(1, 4), label="photos")
    picks = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(ALIASES)), min_size=1, max_size=8),
                      label="rows")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write_images(root, n)
        (root / "sub").mkdir()
        used = sorted({k for k, _ in picks})
        first = {k: i for i, (k, _) in reversed(list(enumerate(picks)))}
        if fmt in ("folder-jsonl", "folder-csv"):
            rows = [(_alias(f"images/im{k}.png", root, how), f"caption {i} of photo {k}") for i, (k, how) in
                    enumerate(picks)]
            if fmt == "folder-jsonl":
                (root / "captions.jsonl").write_text("".join(json.dumps({"image": im, "caption": c}) + "\n"
                                                             for im, c in rows))
            else:
                buf = io.StringIO(newline="")
                w = csv.writer(buf, lineterminator="\n")
                w.writerow(["image", "caption"])
                w.writerows(rows)
                (root / "captions.csv").write_text(buf.getvalue())
            ds = expect_dataset(lambda: load_dataset(root), root)
            order = sorted(used, key=lambda k: first[k])           # images numbered by first appearance
            assert ds.n_images == len(used) and ds.n_captions == len(picks)
            assert [Path(p).name for p in ds.image_paths] == [f"im{k}.png" for k in order]
            for c, i in zip(ds.captions, ds.caption_image.tolist()):
                assert c.endswith(f"of photo {order[i]}")
            return
        duplicate = len(used) < len(picks)
        if fmt == "karpathy":
            doc = {"images": [{"filename": _alias(f"im{k}.png", root / "images", how).replace("images//", ""),
                               "split": "train", "sentences": [{"raw": f"photo {k}"}]} for k, how in picks]}
            (root / "dataset_t.json").write_text(json.dumps(doc))
            load = lambda: load_dataset(root / "dataset_t.json", image_root=root / "images")  # noqa: E731
        else:
            key = "tags" if fmt == "webtags" else "labels"
            (root / f"{key}.jsonl").write_text("".join(
                json.dumps({"image": _alias(f"images/im{k}.png", root, how), key: [f"t{k}"]}) + "\n"
                for k, how in picks))
            load = lambda: load_dataset(root / f"{key}.jsonl")  # noqa: E731
        if duplicate:
            expect_error(load, root, "duplicate")
        else:
            ds = expect_dataset(load, root)
            assert sorted(Path(p).name for p in ds.image_paths) == sorted(f"im{k}.png" for k in used)


# -- split names
SPLIT_WORDS = ["train", "val", "test", "restval", "testall", "dev", "Validation", "TRAIN", " test ", "tset",
               "trian", "holdout", "", "../x", "a/b", "..", "x\\y", "te\x1bst", "t\ud83d", "x" * 101]


def _split_refused(name: str) -> bool:
    s = name.strip().lower()
    return has_unsafe(s) or "/" in s or "\\" in s or s in (".", "..") or len(s) > 100 or "\t" in s


@FUZZ
@given(data=st.data())
def test_fuzz_split_names_known_warned_or_refused(data: st.DataObject) -> None:
    """Each image's split is a known name (or an alias: dev, validation), an unknown word (one warning line
    naming each with its image count), missing (train, counted), or path-like / control characters (refused
    naming the file). The splits returned are exactly the intended ones."""
    fmt = data.draw(st.sampled_from(["folder-csv", "folder-jsonl", "karpathy"]), label="format")
    names = data.draw(st.lists(st.one_of(st.sampled_from(SPLIT_WORDS),
                                         st.text(alphabet="abcxyz", min_size=1, max_size=5)),
                               min_size=1, max_size=8), label="splits")
    n = len(names)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write_images(root, n)
        if fmt == "karpathy":
            doc = {"images": [{"filename": f"im{k}.png", "split": s, "sentences": [{"raw": "a box"}]}
                              for k, s in enumerate(names)]}
            (root / "dataset_t.json").write_text(json.dumps(doc))
            target = root / "dataset_t.json"
        elif fmt == "folder-jsonl":
            (root / "captions.jsonl").write_text("".join(
                json.dumps({"image": f"images/im{k}.png", "caption": "a box", "split": s}) + "\n"
                for k, s in enumerate(names)))
            target = root / "captions.jsonl"
        else:
            if any(ch in s for s in names for ch in "\r\n\x00,\""):
                names = [s.replace("\x00", "") for s in names]
            buf = io.StringIO(newline="")
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(["image", "caption", "split"])
            w.writerows([f"images/im{k}.png", "a box", s] for k, s in enumerate(names))
            (root / "captions.csv").write_text(buf.getvalue(), encoding="utf-8", errors="surrogatepass")
            target = root / "captions.csv"
        if "\ud83d" in "".join(names) and fmt == "folder-csv":
            # a CSV file cannot hold a lone surrogate as UTF-8: the reader says the file is not UTF-8
            expect_error(lambda: load_dataset(target), root)
            return
        refused = [k for k, s in enumerate(names) if _split_refused(s)]
        if refused:
            expect_error(lambda: load_dataset(target), root, "is not a split name")
            return
        ds = expect_dataset(lambda: load_dataset(target), root)
        aliases = {"dev": "val", "validation": "val", "valid": "val"}
        intended: dict[str, list[int]] = {}
        for k, s in enumerate(names):
            s = s.strip().lower()
            intended.setdefault(aliases.get(s, s) or "train", []).append(k)
        assert {k: v.tolist() for k, v in ds.splits.items()} == intended
        unknown = {k: len(v) for k, v in intended.items() if k not in ("train", "val", "test", "restval", "testall")}
        said = [w for w in ds.warnings if "unknown split" in w]
        if unknown:
            assert len(said) == 1, ds.warnings
            for name, count in unknown.items():
                assert f"{name!r} ({count} image{'s' * (count != 1)})" in said[0], (name, said)
        else:
            assert said == []


# -- label types
LABEL_VALUES = st.one_of(st.integers(-3, 3), st.sampled_from(["1", "2", "-3", "cat", "dog", "01"]),
                         st.floats(allow_nan=True, allow_infinity=True, width=32).filter(lambda x: abs(x) < 1e6 or
                                                                                          not math.isfinite(x)),
                         st.sampled_from([1.0, 2.5, -0.5]), st.sampled_from([[1], ["a", "b"], {"a": 1}, True, False]))


@FUZZ
@given(data=st.data())
def test_fuzz_label_types_kept_apart_reported_or_refused(data: st.DataObject) -> None:
    """Per-image labels of every JSON type: text and whole numbers are class names; ``1`` and ``"1"`` are one
    label with one warning line; decimal numbers are class names counted in a warning; NaN, infinity,
    booleans, lists and objects are refused naming the file. The labels returned are the intended ones."""
    fmt = data.draw(st.sampled_from(["folder", "karpathy"]), label="format")
    values = data.draw(st.lists(LABEL_VALUES, min_size=1, max_size=6), label="labels")
    n = len(values)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write_images(root, n)
        if fmt == "karpathy":
            doc = {"images": [{"filename": f"im{k}.png", "split": "train", "label": v, "sentences": [{"raw": "a"}]}
                              for k, v in enumerate(values)]}
            (root / "dataset_t.json").write_text(json.dumps(doc))
            target = root / "dataset_t.json"
        else:
            (root / "captions.jsonl").write_text("".join(
                json.dumps({"image": f"images/im{k}.png", "caption": "a", "label": v}) + "\n"
                for k, v in enumerate(values)))
            target = root / "captions.jsonl"
        bad = [v for v in values if isinstance(v, (bool, list, dict)) or (isinstance(v, float) and not math.isfinite(v))]
        if bad:
            expect_error(lambda: load_dataset(target), root, "label")
            return
        ds = expect_dataset(lambda: load_dataset(target), root)

        def key(v: Any) -> str:  # naive: the text a class is known by
            if isinstance(v, float):
                return str(int(v)) if v == int(v) else repr(v)
            return str(v).strip()
        assert ds.label_names is not None
        assert [ds.label_names[j] for j in ds.labels.tolist()] == [key(v) for v in values]
        as_number = {key(v) for v in values if isinstance(v, (int, float))}
        as_text = {key(v) for v in values if isinstance(v, str)}
        both = [w for w in ds.warnings if "both as a number and as text" in w]
        assert len(both) == (1 if as_number & as_text else 0), ds.warnings
        n_float = sum(isinstance(v, float) for v in values)
        decimal = [w for w in ds.warnings if "decimal numbers" in w]
        assert (decimal[0].split(": ", 1)[1].startswith(f"{n_float} label(s)") if n_float else decimal == []), \
            ds.warnings


# -- degenerate feature matrices
@FUZZ
@given(data=st.data())
def test_fuzz_degenerate_feature_matrices_refused_or_warned(data: st.DataObject) -> None:
    """Precomputed features with zero rows, constant rows, constant columns, huge values, all zero or all
    identical: refused or warned exactly as a naive loop over the matrix says, with its row / column counts."""
    n = data.draw(st.integers(1, 8), label="rows")
    d = data.draw(st.integers(1, 6), label="columns")
    dtype = data.draw(st.sampled_from([np.float32, np.float64, np.int64]), label="dtype")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    x = rng.normal(size=(n, d)) * (100 if dtype is np.int64 else 1)
    for _ in range(data.draw(st.integers(0, 4), label="edits")):
        edit = data.draw(st.sampled_from(["zero row", "constant row", "constant column", "huge", "all zero",
                                          "all identical"]), label="edit")
        r, c = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, d - 1))
        if edit == "zero row":
            x[r] = 0
        elif edit == "constant row":
            x[r] = data.draw(st.sampled_from([1.0, -2.0, 7.0]))
        elif edit == "constant column":
            x[:, c] = data.draw(st.sampled_from([0.0, 3.0]))
        elif edit == "huge":
            x[r, c] = data.draw(st.sampled_from([1e19, -1e30, 1e300, 3e38]))
        elif edit == "all zero":
            x[:] = 0
        else:
            x[:] = x[r]
    with np.errstate(all="ignore"):
        if dtype is np.int64:
            x = np.clip(x, -2**62, 2**62)
        arr = x.astype(dtype)
    if dtype is np.float32 and not np.isfinite(arr).all():
        arr = np.where(np.isfinite(arr), arr, np.float32(3e38))
    rows = arr.astype(np.float64).tolist()
    # the naive verdict, one value at a time
    n_big = sum(any(abs(v) > 1e18 for v in row) for row in rows)
    n_zero = sum(all(v == 0 for v in row) for row in rows)
    n_const_rows = sum(all(v == row[0] for v in row) for row in rows)
    n_const_cols = sum(all(rows[i][j] == rows[0][j] for i in range(n)) for j in range(d))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "t_precomp"
        root.mkdir()
        np.save(root / "train_ims.npy", arr)
        # two captions an image: no VSE++ repeat detection in the way
        (root / "train_caps.txt").write_text("".join(f"caption {i}\n" for i in range(2 * n)))
        load = lambda: load_dataset(root)  # noqa: E731
        if n_big:
            expect_error(load, root, f"{n_big} of {n} feature rows hold values over 1e+18")
        elif n_zero == n:
            expect_error(load, root, f"all {n} feature rows are zero")
        elif n_const_rows == n and d > 1:
            expect_error(load, root, f"every one of the {n} feature rows is constant")
        elif n > 1 and n_const_cols == d:
            expect_error(load, root, f"all {n} feature rows are identical")
        else:
            ds = expect_dataset(load, root)
            expected = []
            if n_const_rows and d > 1:
                expected.append(f"train_ims.npy: {n_const_rows} of {n} feature rows are constant")
            if n > 1 and 2 * n_const_cols > d:
                expected.append(f"train_ims.npy: {n_const_cols} of {d} feature columns are constant")
            assert len(ds.warnings) == len(expected) and all(w.startswith(e) for w, e in zip(ds.warnings, expected)), \
                (ds.warnings, expected)
            assert ds.n_images == n and np.isfinite(np.asarray(ds.image_features)).all()
