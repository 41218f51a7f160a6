"""The content-hash memo (crossview.features.file_hashes; issue 31): a first hash of many files reports progress
through the usual ``(done, total)`` generator, an already-hashed set is instant and silent, and the memo is
bounded (files that are gone go first, then the least recently used)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from crossview.features.file_hashes import FileHashes


class Clock:
    """One second passes at each reading."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def _files(folder: Path, stem: str, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        p = folder / f"{stem}{i}.bin"
        p.write_bytes(f"{stem} {i} ".encode() * 50)
        out.append(p)
    return out


def _drain(work):
    reports = []
    while True:
        try:
            reports.append(next(work))
        except StopIteration as end:
            return reports, end.value


def test_a_first_hash_reports_progress_and_a_known_set_is_silent(tmp_path):
    files = _files(tmp_path / "im", "a", 10)
    memo = tmp_path / "memo"
    # one second per file read, a report at most every 3 s: 0 first, then every third file, and the end
    reports, digests = _drain(FileHashes(memo).iter_digests(files, report_seconds=3.0, clock=Clock()))
    assert reports == [(0, 10), (3, 10), (6, 10), (9, 10), (10, 10)]
    assert all(d is not None for d in digests) and len(set(digests)) == 10

    again = FileHashes(memo)
    reports, same = _drain(again.iter_digests(files))
    assert reports == [] and same == digests and again.read == 0      # nothing to read: no stage at all

    files[4].write_bytes(b"other bytes")                               # one changed file: a stage of one
    reports, now = _drain(FileHashes(memo).iter_digests(files + [tmp_path / "missing.bin"]))
    assert reports == [(0, 1), (1, 1)] and now[4] != digests[4] and now[10] is None
    assert now[:4] == digests[:4] and now[5:10] == digests[5:]


def test_closing_the_hashing_keeps_what_was_hashed(tmp_path):
    files = _files(tmp_path / "im", "a", 6)
    memo = tmp_path / "memo"
    work = FileHashes(memo).iter_digests(files, report_seconds=0.0)
    assert [next(work) for _ in range(4)] == [(0, 6), (1, 6), (2, 6), (3, 6)]
    work.close()                                          # cancelled: the three hashed files are in the memo
    h = FileHashes(memo)
    reports, _ = _drain(h.iter_digests(files, report_seconds=0.0))
    assert reports[0] == (0, 3) and h.read == 3


def _memo_paths(memo: Path) -> list[str]:
    h = FileHashes(memo)
    h._load()
    return [Path(k).name for k in h.memo]


def test_the_memo_is_bounded_gone_files_first_then_least_recently_used(tmp_path):
    memo = tmp_path / "memo"
    a = _files(tmp_path / "im", "a", 8)
    b = _files(tmp_path / "im", "b", 4)
    c = _files(tmp_path / "im", "c", 2)
    FileHashes(memo, max_entries=10).digests(a)
    assert len(_memo_paths(memo)) == 8

    a[0].unlink()
    a[1].unlink()
    # 12 entries > 10: the two gone files go, then the oldest (a2), down to 9 (nine tenths of the cap)
    FileHashes(memo, max_entries=10).digests(b)
    assert _memo_paths(memo) == [f"a{i}.bin" for i in range(3, 8)] + [f"b{i}.bin" for i in range(4)]

    # a3, the oldest entry, is used again (unchanged: from the memo) while c0, c1 are hashed: it becomes the
    # newest, and the two least recently used after it (a4, a5) go
    h = FileHashes(memo, max_entries=10)
    h.digests([a[3], *c])
    assert h.read == 2
    assert _memo_paths(memo) == ["a6.bin", "a7.bin", "b0.bin", "b1.bin", "b2.bin", "b3.bin", "a3.bin",
                                 "c0.bin", "c1.bin"]
    h = FileHashes(memo, max_entries=10)
    h.digests([a[3], a[6], *b, *c])                      # what is kept is still known: nothing read again
    assert h.read == 0


def test_files_in_use_are_never_pruned_even_past_the_cap(tmp_path):
    memo = tmp_path / "memo"
    files = _files(tmp_path / "im", "a", 12)
    FileHashes(memo, max_entries=5).digests(files)
    assert len(_memo_paths(memo)) == 12                 # a set larger than the cap is not hashed again each time
    h = FileHashes(memo, max_entries=5)
    h.digests(files)
    assert h.read == 0


def test_feature_extraction_shows_the_hashing_as_a_stage_the_first_time_only(tmp_path):
    from PIL import Image

    from crossview.commands._common import feature_progress
    from crossview.data.dataset import PairedDataset
    from crossview.features import HASH_STAGE, FeatureCache, extract_features
    from crossview.features.image import DEFAULT_IMAGE_ENCODER, create_image_encoder

    try:
        create_image_encoder(DEFAULT_IMAGE_ENCODER).load()
    except Exception as e:  # noqa: BLE001 - no offline weights on this machine
        pytest.skip(f"no weights for {DEFAULT_IMAGE_ENCODER}: {e}")
    paths = []
    for i in range(5):
        p = tmp_path / f"im{i}.png"
        Image.new("RGB", (16, 16), (40 * i, 90, 10)).save(p)
        paths.append(str(p))
    ds = PairedDataset(name="five", captions=[f"a square {i}" for i in range(5)], caption_image=np.arange(5),
                       image_paths=paths, splits={"train": np.arange(5)})
    reports: list[tuple[str, int, int]] = []
    out = io.StringIO()
    printer = feature_progress(out)

    def progress(stage: str, done: int, total: int) -> None:
        reports.append((stage, done, total))
        printer(stage, done, total)

    kw = dict(text_encoder="tfidf", num_workers=0, progress=progress)
    extract_features(ds, cache=FeatureCache(tmp_path / "cache"), **kw)
    hashing = [r for r in reports if r[0] == HASH_STAGE]
    assert hashing[0] == (HASH_STAGE, 0, 5) and hashing[-1] == (HASH_STAGE, 5, 5)
    assert reports.index(hashing[-1]) < min(i for i, r in enumerate(reports) if r[0] == "images")
    assert "features: image hashes 0/5 (0%)" in out.getvalue()
    assert "features: image hashes 5/5 (100%) done in" in out.getvalue()

    reports.clear()
    second = extract_features(ds, cache=FeatureCache(tmp_path / "cache"), **kw)
    assert second.image_cache_hit and not [r for r in reports if r[0] == HASH_STAGE]
