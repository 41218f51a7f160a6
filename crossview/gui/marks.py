"""Relevance marks as the Query panel exports them: each mark's query and item named by file and caption.

The marks themselves live in the run's ``annotations.jsonl`` (:class:`crossview.engine.annotations.AnnotationStore`,
written at once on every mark); marking the current result, the buttons and the "n marks saved" line are the
Query panel's (:mod:`crossview.gui.panels.query_panel`). This module only turns a store into a file a person
reads, against the dataset the run ranks: it imports no Qt, so a script can call it too.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from crossview.core.io import atomic_write_bytes
from crossview.engine.annotations import AnnotationStore, query_key

__all__ = ["describe_query", "export_marks", "marks_summary", "CSV_COLUMNS"]

#: the columns of an exported marks CSV, in order
CSV_COLUMNS = ("time", "annotator", "direction", "query_kind", "query", "query_image_file", "query_caption",
               "item", "item_image_file", "item_text", "relevant")


def marks_summary(n: int) -> str:
    """``"3 marks saved"`` (``"1 mark saved"``): the line beside the mark buttons."""
    return f"{n} mark{'s' if n != 1 else ''} saved"


def describe_query(dataset: Any, query: dict[str, Any]) -> tuple[str, str]:
    """``(image file name, caption text)`` of a marked ``query``, as far as ``dataset`` (may be None) knows them."""
    ds = dataset
    image, caption = "", ""
    try:
        if "image" in query and ds is not None:
            i = int(query["image"])
            if ds.image_paths is not None and 0 <= i < ds.n_images:
                image = Path(str(ds.image_paths[i])).name
        elif "file" in query:
            image = Path(str(query["file"])).name
        elif "caption" in query and ds is not None:
            c = int(query["caption"])
            if 0 <= c < ds.n_captions:
                caption = ds.captions[c]
        elif "text" in query:
            caption = str(query["text"])
        elif "tags" in query:
            caption = f"tags: {query['tags']}"
    except (TypeError, ValueError):
        pass            # a hand-edited mark: its index columns still say what it is
    return image, caption


def export_marks(annotations: AnnotationStore, dataset: Any, path: str | Path) -> Path:
    """The marks of ``annotations`` to ``path`` (.csv or .jsonl, atomically); returns ``path``. The CSV
    (:data:`CSV_COLUMNS`) names each query by its image file name or caption text beside the index, and each
    item by its caption / image file, looked up in ``dataset`` (None: the index columns only)."""
    path = Path(path)
    if path.suffix.lower() != ".csv":
        return annotations.export(path)
    ds = dataset
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for r in annotations.records():
        kind, _, value = query_key(r["query"]).partition(":")
        image, caption = describe_query(ds, r["query"])
        item_file = ""
        if r["direction"] == "t2i" and ds is not None and ds.image_paths is not None and \
                0 <= int(r["item"]) < ds.n_images:
            item_file = Path(str(ds.image_paths[int(r["item"])])).name
        w.writerow([r.get("time", ""), r.get("annotator", ""), r["direction"], kind, value, image, caption,
                    r["item"], item_file, r.get("item_text", ""), int(bool(r["relevant"]))])
    return atomic_write_bytes(path, buf.getvalue().encode("utf-8"))
