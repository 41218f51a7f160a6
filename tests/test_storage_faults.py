"""A full disk and unwritable places (issue 31, item 2): one line naming the path (and the bytes needed when
known), never a traceback; a failing feature-cache write is warned about once and the work goes on uncached.

Permissions are not enough to test with (the tests may run as root, whom chmod does not stop), so the writes are
patched to fail as a full disk fails, and a folder under /sys stands for a place nobody may write."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import numpy as np
import pytest

from crossview.cli import main
from crossview.core import io as cio
from crossview.core.errors import CrossViewError, StorageError


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _precomp(folder: Path) -> Path:
    """A tiny VSE++ ``*_precomp`` dataset: 12 train / 6 test images of 8-d features, 2 captions each."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    words = ["dog", "cat", "red", "ball", "park", "car", "tree", "sky"]
    for split, n in (("train", 12), ("test", 6)):
        np.save(folder / f"{split}_ims.npy", rng.normal(size=(n, 8)).astype(np.float32))
        caps = [" ".join(rng.choice(words, 4)) for _ in range(2 * n)]
        (folder / f"{split}_caps.txt").write_text("\n".join(caps) + "\n", encoding="utf-8")
    return folder


def _unwritable_place() -> Path:
    p = Path("/sys/crossview-test")
    try:
        p.mkdir()
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EACCES, errno.EROFS):
            return p
        pytest.skip(f"no unwritable place to test with ({e})")
    p.rmdir()
    pytest.skip("/sys is writable here")


def test_atomic_write_on_a_full_disk_names_the_file_and_the_size(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_text("old")
    monkeypatch.setattr(cio.os, "fsync", _full_disk)
    with pytest.raises(StorageError) as e:
        cio.atomic_write_bytes(target, b"x" * 3000)
    msg = str(e.value)
    assert str(target) in msg and "the disk is full" in msg and "2.9 KiB were needed" in msg
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOSPC
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_event_log_on_a_full_disk(tmp_path, monkeypatch):
    log = cio.EventLog(tmp_path / "metrics.jsonl", fsync=True)
    monkeypatch.setattr(cio.os, "fsync", _full_disk)
    with pytest.raises(StorageError, match="metrics.jsonl: the disk is full"):
        log.write({"kind": "log", "message": "x"})
    log.close()


def test_train_on_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    data = _precomp(tmp_path / "toy_precomp")
    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cio.os, "fsync", _full_disk)
    rc = main(["train", "cca", "--data", str(data), "--run-dir", str(tmp_path / "run"), "--text-encoder", "tfidf",
               "--set", "n_components=4"])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("crossview: error:")]
    assert len(lines) == 1 and str(tmp_path / "run") in lines[0] and "the disk is full" in lines[0], err
    assert "Traceback" not in err


def test_unwritable_run_dir_and_explain_out_are_one_line(tmp_path, capsys):
    place = _unwritable_place()
    data = _precomp(tmp_path / "toy_precomp")
    rc = main(["train", "cca", "--data", str(data), "--run-dir", str(place / "run"), "--text-encoder", "tfidf"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"crossview: error: {place / 'run'}: it cannot be written here")

    from crossview.commands.explain import _check_out

    with pytest.raises(StorageError, match=r"--out /sys: it cannot be written here"):
        _check_out("/sys/map.png")


def test_cache_write_failure_warns_once_and_work_goes_on(tmp_path, monkeypatch, caplog):
    from crossview.features import cache as cache_mod
    from crossview.features import extract_features
    from crossview.data import load_dataset

    monkeypatch.setattr(cache_mod, "_UNWRITABLE", set())
    store = cache_mod.FeatureCache(tmp_path / "cache")
    monkeypatch.setattr(cio.os, "fsync", _full_disk)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with caplog.at_level(logging.WARNING, logger="crossview.features.cache"):
        got = store.save(store.make_key(x=1), a)
        again = store.save(store.make_key(x=2), a + 1)
    np.testing.assert_array_equal(got, a)
    np.testing.assert_array_equal(again, a + 1)
    warned = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warned) == 1 and str(tmp_path / "cache") in warned[0], caplog.text
    assert store.entries() == [] and not list((tmp_path / "cache").rglob("*.npy"))

    # through extraction: the caption features are made and returned, uncached
    ds = load_dataset(str(_precomp(tmp_path / "toy_precomp")))
    feats = extract_features(ds, text_encoder="tfidf", cache=store)
    assert feats.text.shape[0] == ds.n_captions and not feats.text_cache_hit
    assert store.entries() == []


def test_storage_error_is_a_crossview_error():
    e = StorageError(errno.EROFS, "/x: read-only", "/x")
    assert isinstance(e, CrossViewError) and isinstance(e, OSError) and str(e) == "/x: read-only"


def test_features_extract_out_on_a_full_disk(tmp_path, monkeypatch, capsys):
    data = str(_precomp(tmp_path / "toy_precomp"))
    argv = ["features", "extract", "--data", data, "--text-encoder", "tfidf", "--no-cache"]
    assert main([*argv, "--out", str(tmp_path / "feats")]) == 0
    with np.load(tmp_path / "feats.npz") as z:
        assert z["image"].shape == (18, 8)
    monkeypatch.setattr(cio.os, "fsync", _full_disk)
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "again.npz")]) == 2
    err = capsys.readouterr().err
    assert f"crossview: error: {tmp_path / 'again.npz'}: the disk is full;" in err and "were needed" in err
    assert not (tmp_path / "again.npz").exists()
