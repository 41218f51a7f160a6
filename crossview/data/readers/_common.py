"""Helpers every reader shares: reading files with clear errors, checking images, cleaning captions."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from crossview.errors import DatasetError

#: Image file suffixes the folder readers look for.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def require_file(path: Path, what: str = "file") -> Path:
    if not path.exists():
        raise DatasetError(f"{what} not found", path, hint="Check the path")
    if not path.is_file():
        raise DatasetError(f"expected a {what}, found a folder", path)
    return path


def read_text(path: Path) -> str:
    require_file(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"not UTF-8 text (byte {e.start}: {e.reason})", path,
                           hint="Save the file as UTF-8") from None
    except OSError as e:
        raise DatasetError(f"cannot read: {e.strerror}", path) from None


def read_json(path: Path) -> Any:
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}", path) from None


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yields (line number, object) for each non-blank line; a bad line is an error naming it."""
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"invalid JSON: {e.msg} (column {e.colno})", path, f"line {lineno}") from None
        if not isinstance(obj, dict):
            raise DatasetError(f"expected a JSON object, got {type(obj).__name__}", path, f"line {lineno}")
        yield lineno, obj


def iter_csv(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict]]:
    """Yields (line number, row dict) of a CSV/TSV file with a header; checks the required columns."""
    text = read_text(path)
    lines = text.splitlines()
    if not lines:
        raise DatasetError("the file is empty", path)
    try:
        dialect = csv.Sniffer().sniff(lines[0], delimiters=",\t;")
    except csv.Error:
        dialect = csv.excel
    reader = csv.DictReader(lines, dialect=dialect)
    fields = [f.strip().lower() for f in (reader.fieldnames or [])]
    missing = [c for c in required if c not in fields]
    if missing:
        raise DatasetError(f"missing column(s) {', '.join(missing)} in the header (found: {', '.join(fields)})",
                           path, "line 1", hint=f"The first line must name the columns, e.g. {','.join(required)}")
    for row in reader:
        lineno = reader.line_num
        if None in row:
            raise DatasetError("more fields than columns in the header (quote fields that contain the "
                               "delimiter)", path, f"line {lineno}")
        yield lineno, {(k or "").strip().lower(): (v or "").strip() for k, v in row.items()}


def clean_caption(text: Any) -> str | None:
    """A caption with whitespace normalised, or None when it is empty or not text."""
    if not isinstance(text, str):
        return None
    text = " ".join(text.split())
    return text or None


def split_tags(value: Any) -> list[str]:
    """Tags from a JSON list or a string separated by commas, semicolons, '|' or spaces."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
    else:
        s = str(value)
        for sep in (";", "|"):
            s = s.replace(sep, ",")
        items = s.split(",") if "," in s else s.split()
    out = []
    for t in items:
        t = " ".join(t.strip().lower().split())
        if t and t not in out:
            out.append(t)
    return out


def check_images_exist(paths: Sequence[str], source: Path, root: Path, entry_names: Sequence[str],
                       warnings: list[str], what: str = "image") -> np.ndarray:
    """Boolean mask of the images that exist. Missing ones are a warning with a count (the user
    usually wants the rest), but when none exist it is an error that points at the image root."""
    exists = np.fromiter((os.path.isfile(p) for p in paths), dtype=bool, count=len(paths))
    n_missing = int((~exists).sum())
    if len(paths) and n_missing == len(paths):
        raise DatasetError(
            f"none of the {len(paths)} {what}s it lists exist under {root} (first: {paths[0]})", source,
            hint="Point --image-root at the folder that holds the images")
    if n_missing:
        first = [f"{entry_names[i]} -> {paths[i]}" for i in np.flatnonzero(~exists)[:3]]
        warnings.append(f"skipped {n_missing} of {len(paths)} {what}s whose file is missing "
                        f"(first: {'; '.join(first)})")
    return exists


def relative_to_root(root: Path, name: str) -> str:
    p = Path(name).expanduser()
    return str(p if p.is_absolute() else (root / p))


def guess_image_root(base: Path, sample: Sequence[str], candidates: Sequence[str]) -> Path:
    """The first folder among ``base/candidate`` that holds the first few sample images, else ``base``."""
    probe = [s for s in sample[:5]]
    for cand in candidates:
        root = base / cand if cand else base
        if root.is_dir() and probe and all((root / s).is_file() for s in probe):
            return root
    for cand in candidates:  # a folder of that name exists even if the sample is incomplete
        root = base / cand if cand else base
        if cand and root.is_dir() and probe and any((root / s).is_file() for s in probe):
            return root
    return base


def generated_splits(n: int, seed: int = 0, fractions: tuple[float, float] = (0.8, 0.1)) -> dict[str, np.ndarray]:
    """A reproducible 80/10/10 train/val/test split of ``n`` items, for sources that give none."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    n_train = int(round(n * fractions[0]))
    n_val = int(round(n * fractions[1]))
    if n >= 3:
        n_val = max(n_val, 1)
        n_train = min(n_train, n - n_val - 1)
    return {"train": np.sort(perm[:n_train]), "val": np.sort(perm[n_train:n_train + n_val]),
            "test": np.sort(perm[n_train + n_val:])}
