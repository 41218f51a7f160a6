"""VSE++ / SCAN precomputed features: a ``*_precomp`` folder (``f30k_precomp``, ``coco_precomp``).

For each split present, ``{split}_ims.npy`` (an ``(n_ims, d)`` feature array) and ``{split}_caps.txt``
(one caption a line) sit side by side, for split in ``train``, ``dev`` (read as ``val``), ``val``,
``test`` and ``testall``. Captions map to images as in VSE++:

- fewer feature rows than captions: each image has ``n_caps // n_ims`` consecutive captions (the
  counts must divide exactly);
- as many rows as captions: when every 5 consecutive rows are identical (images repeated once per
  caption), they collapse to one image per 5 captions; otherwise one image per caption.

All splits are concatenated into one :class:`PairedDataset` with ``image_features`` and no image
files; ``splits`` maps each split to its image indices. Arrays are memory-mapped; a single float32 split
stays memory-mapped, several are concatenated in memory. Empty caption lines are skipped and counted
(the caption -> image map still follows line positions).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.data.readers._common import clean_caption, detector, one_line, read_text, reader, require_file
from crossview.data.readers._common import safe_resolve
from crossview.core.errors import DatasetError
from crossview.core.io import NpyFileError, drop_pages, open_npy

#: (file prefix, split name), in concatenation order.
SPLITS = (("train", "train"), ("dev", "val"), ("val", "val"), ("test", "test"), ("testall", "testall"))
#: VSE++ repeats each image once per caption, 5 captions an image.
REPEAT = 5


@detector
def detect(path: Path) -> bool:
    if not path.is_dir():
        return False
    return any((path / f"{p}_ims.npy").is_file() or (path / f"{p}_caps.txt").is_file() for p, _ in SPLITS)


def _load_features(path: Path) -> np.ndarray:
    require_file(path, ".npy file")  # np.load on a FIFO would block
    try:
        arr = open_npy(path, todo="save the features with numpy.save")
    except NpyFileError as e:
        raise DatasetError(f"cannot read as a .npy array ({e.reason})", path,
                           hint="Save the features with numpy.save as an (n_images, d) array") from None
    if arr.ndim != 2:
        hint = "Average region features over the regions to get (n_images, d)" if arr.ndim == 3 else None
        raise DatasetError(f"expected a 2-d array (images x feature dims), got shape {arr.shape}", path, hint=hint)
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise DatasetError(f"expected numeric features, got dtype {arr.dtype}", path)
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise DatasetError(f"the feature array is empty (shape {arr.shape})", path)
    bad = _non_finite_rows(arr)
    drop_pages(arr)
    if len(bad):
        raise DatasetError(f"{len(bad)} of {arr.shape[0]} feature rows hold NaN or infinite values (first: row "
                           f"{bad[0]})", path, hint="Re-extract the features; no method can use such rows")
    return arr


def _non_finite_rows(arr: np.ndarray) -> np.ndarray:
    """Indices of the rows of a (possibly memory-mapped) ``(n, d)`` array holding NaN or inf, read in
    ~16 MB blocks."""
    if not np.issubdtype(arr.dtype, np.floating):
        return np.zeros(0, dtype=np.int64)
    per_block = max(1, (1 << 24) // max(1, arr.shape[1] * arr.dtype.itemsize))
    bad = [start + np.flatnonzero(~np.isfinite(np.asarray(arr[start:start + per_block])).all(axis=1))
           for start in range(0, arr.shape[0], per_block)]
    return np.concatenate(bad)


#: Feature values past this magnitude overflow float32 arithmetic: a dot product of two 2048-d rows of
#: 1e18 is 2e39 > float32's 3.4e38.
MAX_MAGNITUDE = 1e18


def check_degenerate(arr: np.ndarray, where: Path, warnings: list[str]) -> None:
    """Refuses a feature matrix no method can learn from, or warns when part of it is degenerate.

    ``arr`` is ``(n, d)`` (possibly memory-mapped; read in ~16 MB blocks). Errors (naming ``where`` and the
    row / column counts): values over :data:`MAX_MAGNITUDE` in magnitude, every value zero, every row
    constant (each row one value repeated), every row the same. Warnings: some rows constant, or most
    columns (over half) constant over all rows (zero variance: they carry nothing).
    """
    n, d = arr.shape
    per_block = max(1, (1 << 24) // max(1, d * 8))
    n_big = n_const_rows = n_zero_rows = 0
    largest = 0.0
    col_min = np.full(d, np.inf)
    col_max = np.full(d, -np.inf)
    for start in range(0, n, per_block):
        block = np.asarray(arr[start:start + per_block], dtype=np.float64)
        mag = np.abs(block)
        row_max = mag.max(axis=1)
        n_big += int((row_max > MAX_MAGNITUDE).sum())
        largest = max(largest, float(row_max.max()))
        row_lo, row_hi = block.min(axis=1), block.max(axis=1)
        n_const_rows += int((row_lo == row_hi).sum())
        n_zero_rows += int((row_max == 0).sum())
        np.minimum(col_min, block.min(axis=0), out=col_min)
        np.maximum(col_max, block.max(axis=0), out=col_max)
    hint = "Re-extract the features; no method can learn from them"
    if n_big:
        raise DatasetError(f"{n_big} of {n} feature rows hold values over {MAX_MAGNITUDE:g} in magnitude (largest "
                           f"{largest:.3g}): float32 arithmetic on them overflows", where,
                           hint="Scale the features (e.g. L2-normalise each row) or re-extract them")
    if n_zero_rows == n:
        raise DatasetError(f"all {n} feature rows are zero ({n} x {d})", where, hint=hint)
    if n_const_rows == n and d > 1:
        raise DatasetError(f"every one of the {n} feature rows is constant (one value repeated over its {d} "
                           f"columns)", where, hint=hint)
    n_const_cols = int((col_min == col_max).sum())
    if n > 1 and n_const_cols == d:
        raise DatasetError(f"all {n} feature rows are identical (all {d} columns constant)", where, hint=hint)
    if n_const_rows and d > 1:
        zero = f", {n_zero_rows} of them all zero" if n_zero_rows else ""
        warnings.append(f"{one_line(where.name, 80)}: {n_const_rows} of {n} feature rows are constant{zero} "
                        f"(nothing to tell those images apart)")
    if n > 1 and 2 * n_const_cols > d:
        warnings.append(f"{one_line(where.name, 80)}: {n_const_cols} of {d} feature columns are constant over "
                        f"all {n} rows (zero variance; the features may be damaged)")


def _rows_repeated(ims: np.ndarray, k: int) -> bool:
    """Whether every group of ``k`` consecutive rows is made of identical rows (read in ~16 MB blocks)."""
    n, d = ims.shape
    groups = n // k
    per_block = max(1, (1 << 24) // max(1, k * d * ims.dtype.itemsize))
    start = 0
    step = 1  # the first block is one group: unrepeated features are rejected at once
    while start < groups:
        stop = min(groups, start + step)
        block = np.asarray(ims[start * k:stop * k]).reshape(stop - start, k, d)
        if not (block == block[:, :1]).all():
            return False
        start, step = stop, per_block
    return True


def _read_split(prefix: str, ims_path: Path, caps_path: Path, warnings: list[str]
                ) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Features ``(n, d)``, captions and their image indices for one split."""
    ims = _load_features(ims_path)
    lines = read_text(caps_path).splitlines()
    while lines and not lines[-1].strip():  # a trailing blank line is not a caption
        lines.pop()
    if not lines:
        raise DatasetError("no captions in the file (it is empty or blank)", caps_path,
                           hint=f"It needs one caption a line for the images of {ims_path.name}")
    n_ims, n_caps = int(ims.shape[0]), len(lines)
    if n_ims > n_caps:
        raise DatasetError(f"{n_ims} feature rows but only {n_caps} captions in {caps_path.name}", ims_path,
                           hint="Each image needs at least one caption line; check that the two files match")
    if n_ims < n_caps:
        if n_caps % n_ims:
            raise DatasetError(f"{n_caps} captions do not divide evenly over the {n_ims} images of "
                               f"{ims_path.name} ({n_caps / n_ims:.2f} per image)", caps_path,
                               hint="Each image needs the same number of consecutive captions")
        per = n_caps // n_ims
    elif n_ims % REPEAT == 0 and _rows_repeated(ims, REPEAT):
        drop_pages(ims)
        ims, per = ims[::REPEAT], REPEAT
    else:
        drop_pages(ims)
        per = 1
    captions: list[str] = []
    cap_img: list[int] = []
    n_empty = 0
    for j, line in enumerate(lines):
        c = clean_caption(line)
        if c is None:
            n_empty += 1
        else:
            captions.append(c)
            cap_img.append(j // per)
    if not captions:
        raise DatasetError(f"all {n_caps} caption lines are blank", caps_path)
    if n_empty:
        warnings.append(f"skipped {n_empty} empty caption(s) in {caps_path.name}")
    cap_arr = np.asarray(cap_img, dtype=np.int64)
    has_cap = np.zeros(ims.shape[0], dtype=bool)
    has_cap[cap_arr] = True
    if not has_cap.all():
        # Dropping rows copies the features, but only in this rare case.
        warnings.append(f"skipped {int((~has_cap).sum())} image(s) of {ims_path.name} with no non-empty caption")
        ims = ims[has_cap]
        cap_arr = (np.cumsum(has_cap) - 1)[cap_arr]
    return ims, captions, cap_arr


#: Stacked features at least this large go to a memory-mapped temporary file instead of anonymous memory.
STACK_FILE_BYTES = 64 * 1024 * 1024


def _stack_target(shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """Where the splits are stacked: for a large set, a memory-mapped temporary file (deleted at once, so it lives
    as long as the mapping; its space reserved first, so a full disk is an ``OSError`` here and not a crash on a
    later write), whose pages leave the resident set once read (``drop_pages``), as the cached features' do: a
    run that normalises the features then holds one image matrix, not two (issue 34: 0.98 GB each at COCO size).
    In memory when small, or when no temporary file of that size can be made."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes >= STACK_FILE_BYTES:
        import logging
        import tempfile

        try:
            with tempfile.TemporaryFile(prefix="crossview-stack-") as fh:
                os.posix_fallocate(fh.fileno(), 0, nbytes)
                return np.memmap(fh, dtype=dtype, mode="r+", shape=shape)
        except (OSError, ValueError, AttributeError) as e:
            logging.getLogger(__name__).warning(
                "precomp: no temporary file of %.2f GB for the stacked image features in %s (%s): they are held in "
                "memory, so a run that normalises them holds two copies; free disk space there or set TMPDIR",
                nbytes / 1e9, tempfile.gettempdir(), getattr(e, "strerror", None) or e)
    return np.empty(shape, dtype=dtype)


def _concatenate(feats: list[np.ndarray]) -> np.ndarray:
    """The splits' ``(n_k, d)`` feature arrays (memory-mapped) stacked into one array (:func:`_stack_target`), copied a
    block at a time with each mapping's pages dropped after its copy: the peak is the result plus one block, not
    twice it."""
    dtype = np.result_type(*[f.dtype for f in feats])
    out = _stack_target((sum(f.shape[0] for f in feats), feats[0].shape[1]), dtype)
    per_block = max(1, (1 << 24) // max(1, out.shape[1] * dtype.itemsize))
    at = 0
    for f in feats:
        for start in range(0, f.shape[0], per_block):
            block = f[start:start + per_block]
            out[at + start:at + start + block.shape[0]] = block
            drop_pages(f)
            drop_pages(out)
        at += f.shape[0]
    return out


@reader
def read(path: Path, image_root: Path | None = None) -> PairedDataset:
    """Reads every split of a ``*_precomp`` folder; ``image_root`` is ignored (there are no image files)."""
    path = safe_resolve(path)
    if not path.is_dir():
        raise DatasetError("expected a *_precomp folder with {split}_ims.npy and {split}_caps.txt", path)
    found: list[tuple[str, str, Path, Path]] = []
    for prefix, split in SPLITS:
        ims_path, caps_path = path / f"{prefix}_ims.npy", path / f"{prefix}_caps.txt"
        if ims_path.is_file() != caps_path.is_file():
            have, lack = (ims_path, caps_path) if ims_path.is_file() else (caps_path, ims_path)
            raise DatasetError(f"{lack.name} is missing beside it", have,
                               hint=f"Each split needs both {prefix}_ims.npy and {prefix}_caps.txt")
        if ims_path.is_file():
            if any(s == split for _, s, _, _ in found):
                raise DatasetError("both dev_* and val_* files are present; both would be the 'val' split", path,
                                   hint="Keep one of them")
            found.append((prefix, split, ims_path, caps_path))
    if not found:
        raise DatasetError("no {split}_ims.npy + {split}_caps.txt pair in the folder", path,
                           hint=f"Expected split names: {', '.join(p for p, _ in SPLITS)}")

    warnings: list[str] = []
    if image_root is not None:
        warnings.append("--image-root is ignored: a precomp folder holds features, not image files")
    feats: list[np.ndarray] = []
    captions: list[str] = []
    cap_img: list[np.ndarray] = []
    splits: dict[str, np.ndarray] = {}
    n_images = 0
    for prefix, split, ims_path, caps_path in found:
        ims, caps, ci = _read_split(prefix, ims_path, caps_path, warnings)
        if feats and ims.shape[1] != feats[0].shape[1]:
            raise DatasetError(f"feature size {ims.shape[1]} differs from {feats[0].shape[1]} in "
                               f"{found[0][2].name}", ims_path, hint="All splits must come from the same encoder")
        feats.append(ims)
        captions.extend(caps)
        cap_img.append(ci + n_images)
        splits[split] = np.arange(n_images, n_images + ims.shape[0], dtype=np.int64)
        n_images += ims.shape[0]
    # Checked before the cast to float32, which would turn values past float32's range into inf.
    features = feats[0] if len(feats) == 1 else _concatenate(feats)
    check_degenerate(features, found[0][2] if len(feats) == 1 else path, warnings)
    drop_pages(features)
    if features.dtype != np.float32:
        features = features.astype(np.float32)
    return PairedDataset(
        name=path.name.removesuffix("_precomp") or path.name,
        captions=captions,
        caption_image=np.concatenate(cap_img),
        image_features=features,
        splits=splits,
        source=str(path),
        format="precomp",
        warnings=warnings,
        meta={"precomp_splits": {split: prefix for prefix, split, _, _ in found}},
    )
