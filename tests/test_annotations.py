"""Annotation marks: saved at once, last mark wins, torn lines skipped, CSV/JSONL export."""

from __future__ import annotations

import csv
import json

import pytest

from crossview.engine.annotations import AnnotationStore, query_key
from crossview.core.errors import CrossViewError


def test_marks_persist_and_the_last_one_wins(tmp_path):
    store = AnnotationStore(tmp_path, annotator="ann")
    store.mark("i2t", {"image": 3}, 17, True, "a dog runs")
    store.mark("i2t", {"image": 3}, 18, False, "a cat")
    store.mark("i2t", {"image": 3}, 17, False, "a dog runs")      # changed mind
    store.mark("t2i", {"text": "red ball"}, 5, True)
    store.mark("t2i", {"text": "red ball"}, 5, None)                # cleared
    # on disk at once: a new store (another process, after a crash) sees the same state
    again = AnnotationStore(tmp_path)
    assert again.marks_for("i2t", {"image": 3}) == {17: False, 18: False}
    assert again.marks_for("t2i", {"text": "red ball"}) == {}
    assert len(again) == 2
    assert len((tmp_path / "annotations.jsonl").read_text().splitlines()) == 5


def test_torn_last_line_is_skipped(tmp_path):
    store = AnnotationStore(tmp_path)
    store.mark("i2t", {"image": 1}, 2, True)
    with open(tmp_path / "annotations.jsonl", "a") as f:
        f.write('{"direction": "i2t", "query": {"ima')        # a crash mid-write
    again = AnnotationStore(tmp_path)
    assert again.marks_for("i2t", {"image": 1}) == {2: True} and again.skipped_lines == 1
    again.mark("i2t", {"image": 1}, 3, True)                    # appending after a torn line still works
    assert AnnotationStore(tmp_path).marks_for("i2t", {"image": 1}) == {2: True, 3: True}


def test_export_csv_and_jsonl(tmp_path):
    store = AnnotationStore(tmp_path / "run", annotator="ann")
    store.mark("i2t", {"image": 3}, 17, True, 'a "quoted", caption')
    store.mark("t2i", {"caption": 9}, 4, False)
    rows = list(csv.DictReader(open(store.export(tmp_path / "marks.csv"), newline="")))
    assert rows[0]["item_text"] == 'a "quoted", caption' and rows[0]["relevant"] == "1"
    assert rows[1]["query_kind"] == "caption" and rows[1]["query"] == "9" and rows[1]["relevant"] == "0"
    lines = (store.export(tmp_path / "marks.jsonl")).read_text().splitlines()
    assert [json.loads(x)["item"] for x in lines] == [17, 4]
    with pytest.raises(CrossViewError, match="csv or .jsonl"):
        store.export(tmp_path / "marks.xlsx")


def test_bad_input():
    with pytest.raises(CrossViewError):
        query_key({"nothing": 1})
    with pytest.raises(CrossViewError, match="direction"):
        AnnotationStore("/tmp/never-used-crossview").mark("sideways", {"image": 1}, 1, True)


def test_lines_are_ascii_so_a_crash_cannot_cut_a_character(tmp_path):
    store = AnnotationStore(tmp_path, annotator="Zoë")
    store.mark("t2i", {"text": "un café ☕ au soleil"}, 4, True, "naïve – déjà vu")
    raw = (tmp_path / "annotations.jsonl").read_bytes()
    assert raw.isascii()
    again = AnnotationStore(tmp_path)
    rec = again.records()[0]
    assert rec["annotator"] == "Zoë" and rec["item_text"] == "naïve – déjà vu"
    assert again.marks_for("t2i", {"text": "un café ☕ au soleil"}) == {4: True}


def test_each_corrupt_line_costs_that_line_only(tmp_path):
    good = [json.dumps({"time": f"2026-01-01T00:00:0{i}", "annotator": "a", "direction": "i2t",
                        "query": {"image": i}, "item": i, "item_text": "", "relevant": True}).encode()
            for i in range(4)]
    torn_char = json.dumps({"time": "t", "annotator": "a", "direction": "i2t", "query": {"image": 9}, "item": 9,
                            "item_text": "é" * 3, "relevant": True}, ensure_ascii=False).encode()
    torn_char = torn_char[:torn_char.index("é".encode()) + 1]            # a multi-byte character cut by a crash
    bad = [
        b'{"time": "t", "direction": "i2t", "query": {"image": 5}, "item": 5, "relevant": true, "x": "\xff"}',
        torn_char,
        b"{not json",
        b'{"direction": "i2t", "query": {"image": 6}, "item": 6, "relevant": true}',          # no time
        b'{"time": 17, "direction": "i2t", "query": {"image": 6}, "item": 6, "relevant": true}',
        b'{"time": "t", "direction": "i2t", "query": {"image": "6"}, "item": 6, "relevant": true}',
        b'{"time": "t", "direction": "i2t", "query": {"image": 6}, "item": "6", "relevant": true}',
        b'{"time": "t", "direction": "i2t", "query": {"image": 6}, "item": 6, "relevant": "yes"}',
        b'{"time": "t", "direction": "i2t", "query": {"image": 6}, "item": 6, "relevant": 1}',
        b'{"time": "t", "direction": "up", "query": {"image": 6}, "item": 6, "relevant": true}',
        b'{"time": "t", "direction": "i2t", "query": [6], "item": 6, "relevant": true}',
        b'{"time": "t", "direction": "i2t", "query": {"image": 6}, "item": 6, "item_text": 3, "relevant": true}',
        b"[]",
        b"[" * 100_000,
    ]
    lines = [good[0], *bad[:7], good[1], good[2], *bad[7:], good[3]]
    (tmp_path / "annotations.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    store = AnnotationStore(tmp_path)
    assert store.skipped == store.skipped_lines == len(bad)
    assert len(store) == 4 and [r["item"] for r in store.records()] == [0, 1, 2, 3]
    rows = list(csv.DictReader(open(store.export(tmp_path / "out.csv"), newline="")))
    assert [int(r["item"]) for r in rows] == [0, 1, 2, 3]
    assert len(store.export(tmp_path / "out.jsonl").read_text().splitlines()) == 4
    store.mark("i2t", {"image": 7}, 7, True)                                 # still appends cleanly
    assert len(AnnotationStore(tmp_path)) == 5


def test_a_fifo_in_place_of_the_file_is_refused_not_waited_on(tmp_path):
    import os
    if not hasattr(os, "mkfifo"):
        pytest.skip("needs FIFOs")
    os.mkfifo(tmp_path / "annotations.jsonl")
    with pytest.raises(CrossViewError, match="not a regular file"):
        AnnotationStore(tmp_path)


def test_photo_marks_are_kept_by_path_apart_from_the_datasets(tmp_path):
    """A photo folder's photo index shifts when photos are added: its marks are keyed by the photo's path, and a
    sentence's marks on the dataset's images and on a photo folder never mix (issue 30)."""
    store = AnnotationStore(tmp_path, annotator="ann")
    q = {"text": "a red dog"}
    photos = {**q, "photos": "/home/me/photos"}
    store.mark("t2i", q, 3, True)                                      # a dataset image
    store.mark("t2i", photos, 3, False, "/home/me/photos/a.jpg")        # photo 3 is a.jpg today
    store.mark("t2i", photos, 3, True, "/home/me/photos/b.jpg")         # a photo added: photo 3 is b.jpg now
    again = AnnotationStore(tmp_path)
    assert again.marks_for("t2i", q) == {3: True}
    assert again.marks_by_path("t2i", photos) == {"/home/me/photos/a.jpg": False, "/home/me/photos/b.jpg": True}
    assert again.marks_by_path("t2i", {**q, "photos": "/elsewhere"}) == {} and again.marks_by_path("t2i", q) == {}
    store.mark("t2i", photos, 7, None, "/home/me/photos/a.jpg")         # cleared by path, whatever its index now
    assert AnnotationStore(tmp_path).marks_by_path("t2i", photos) == {"/home/me/photos/b.jpg": True}
    with pytest.raises(CrossViewError, match="photo's path"):
        store.mark("t2i", photos, 1, True)
    # a hand-edited photo mark without its path (or with a folder that is not a string) is skipped, not fatal
    with open(store.path, "a") as f:
        f.write(json.dumps({"time": "t", "direction": "t2i", "query": photos, "item": 1, "relevant": True}) + "\n")
        f.write(json.dumps({"time": "t", "direction": "t2i", "query": {**q, "photos": 5}, "item": 1,
                            "item_text": "/x.jpg", "relevant": True}) + "\n")
    assert AnnotationStore(tmp_path).skipped == 2


def test_a_mark_that_cannot_be_written_is_kept_and_written_by_retry(tmp_path, monkeypatch):
    """A read-only run folder or a full disk: the mark stays (pending, counted), the error says so in one
    line, later marks queue behind it in order, and retry writes them all once the file can be written."""
    import errno

    from crossview.engine.annotations import AnnotationStore, MarkNotSaved

    store = AnnotationStore(tmp_path / "run", annotator="ann")
    store.mark("t2i", {"text": "a dog"}, 1, True)
    real = AnnotationStore._write

    def refuse(self, recs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(AnnotationStore, "_write", refuse)
    with pytest.raises(MarkNotSaved, match=r"1 mark not saved \(Read-only file system\)"):
        store.mark("t2i", {"text": "a dog"}, 2, False)
    with pytest.raises(MarkNotSaved, match="2 marks not saved"):
        store.mark("t2i", {"text": "a dog"}, 1, None)          # clearing a saved mark queues too
    assert len(store) == 1 and len(store.pending) == 2           # item 2 marked, item 1 cleared, in memory
    assert store.marks_for("t2i", {"text": "a dog"}) == {2: False}
    with pytest.raises(MarkNotSaved):
        store.retry()
    monkeypatch.setattr(AnnotationStore, "_write", real)
    assert store.retry() == 2 and store.pending == [] and store.retry() == 0
    again = AnnotationStore(tmp_path / "run")
    assert again.marks_for("t2i", {"text": "a dog"}) == {2: False} and again.skipped == 0


def test_export_reads_every_processs_marks_and_counts_unreadable_lines(tmp_path):
    """Two stores on one run (two windows, two annotators): each one's export holds both's marks."""
    import csv

    from crossview.engine.annotations import AnnotationStore

    a = AnnotationStore(tmp_path / "run", annotator="a")
    b = AnnotationStore(tmp_path / "run", annotator="b")
    for i in range(3):
        b.mark("t2i", {"text": "a cat"}, i, True)
    a.mark("i2t", {"image": 4}, 9, False, "a caption")
    with open(tmp_path / "run" / "annotations.jsonl", "ab") as f:
        f.write(b"{not json\n")
    b.mark("t2i", {"text": "a cat"}, 0, None)                    # b clears one of its marks after a's mark
    out = a.export(tmp_path / "marks.csv")
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert sorted((r["annotator"], r["item"]) for r in rows) == [("a", "9"), ("b", "1"), ("b", "2")]
    assert a.skipped == 1 and len(a) == 3
