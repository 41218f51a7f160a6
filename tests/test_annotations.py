"""Annotation marks: saved at once, last mark wins, torn lines skipped, CSV/JSONL export."""

from __future__ import annotations

import csv
import json

import pytest

from crossview.engine.annotations import AnnotationStore, query_key
from crossview.errors import CrossViewError


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
