"""Image features are cached on the files' contents (issue 31, item 4): a photo replaced by another of the same
size whose mtime was put back is encoded again; an unchanged file is not read again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from crossview.features.file_hashes import MEMO_NAME, FileHashes


def _bmp(path: Path, colour: tuple[int, int, int], size: int = 32) -> Path:
    """An uncompressed BMP: two of the same dimensions have the same byte size whatever their pixels."""
    img = Image.new("RGB", (size, size), colour)
    img.paste((255 - colour[0], 40, 200), (4, 4, size // 2, size // 2))
    img.save(path, format="BMP")
    return path


def _replace_keeping_size_and_mtime(target: Path, colour: tuple[int, int, int]) -> None:
    """Write other pixels into ``target`` (same byte size; copied over it, so the inode stays) and put its
    access and modification times back: path, size, mtime and inode all as before."""
    st = target.stat()
    other = _bmp(target.with_name("other.bmp"), colour)
    assert other.stat().st_size == st.st_size
    shutil.copyfile(other, target)
    other.unlink()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = target.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def test_file_hashes_remember_unchanged_files_and_see_a_replaced_one(tmp_path):
    files = [_bmp(tmp_path / f"{i}.bmp", (30 * i, 100, 50)) for i in range(3)]
    memo = tmp_path / "memo"
    hashes = FileHashes(memo)
    first = hashes.digests(files + [tmp_path / "missing.bmp"])
    assert hashes.read == 3 and first[3] is None and len(set(first[:3])) == 3
    assert (memo / MEMO_NAME).is_file()

    again = FileHashes(memo)                     # another process: the memo answers, nothing is read
    assert again.digests(files) == first[:3] and again.read == 0

    _replace_keeping_size_and_mtime(files[1], (200, 10, 10))
    third = FileHashes(memo)
    now = third.digests(files)
    assert third.read == 1 and now[0] == first[0] and now[2] == first[2] and now[1] != first[1]
    assert third.peek(files[1]) == now[1]
    assert FileHashes(memo).digests(files) == now


def test_a_damaged_memo_is_rebuilt(tmp_path, caplog):
    f = _bmp(tmp_path / "a.bmp", (1, 2, 3))
    FileHashes(tmp_path).digests([f])
    (tmp_path / MEMO_NAME).write_bytes(b"PK\x03\x04 truncated")
    with caplog.at_level("WARNING"):
        h = FileHashes(tmp_path)
        assert h.digests([f])[0] is not None and h.read == 1
    assert "damaged" in caplog.text
    caplog.clear()
    (tmp_path / MEMO_NAME).write_bytes(bytes(range(7, 256)) * 8)       # not a zip: numpy would offer to unpickle it
    with caplog.at_level("WARNING"):
        FileHashes(tmp_path).digests([f])
    assert "is damaged (it is not a zip archive of arrays); the files are hashed again" in caplog.text
    assert "allow_pickle" not in caplog.text and "pickle.load" not in caplog.text


def test_image_features_of_a_replaced_photo_are_extracted_again(tmp_path, monkeypatch):
    from crossview.data.dataset import PairedDataset
    from crossview.features import FeatureCache, extract_features
    from crossview.features.image import DEFAULT_IMAGE_ENCODER, create_image_encoder

    try:
        create_image_encoder(DEFAULT_IMAGE_ENCODER).load()
    except Exception as e:  # noqa: BLE001 - no offline weights on this machine
        pytest.skip(f"no weights for {DEFAULT_IMAGE_ENCODER}: {e}")
    paths = [str(_bmp(tmp_path / f"im{i}.bmp", (60 * i, 120, 30))) for i in range(4)]
    ds = PairedDataset(name="bmp", captions=[f"a square {i}" for i in range(4)], caption_image=np.arange(4),
                       image_paths=paths, splits={"train": np.arange(4)})
    cache = FeatureCache(tmp_path / "cache")
    kw = dict(text_encoder="tfidf", cache=cache, num_workers=0)
    first = extract_features(ds, **kw)
    assert not first.image_cache_hit
    second = extract_features(ds, **kw)
    assert second.image_cache_hit

    _replace_keeping_size_and_mtime(Path(paths[2]), (250, 250, 0))
    third = extract_features(ds, **kw)
    assert not third.image_cache_hit, "a replaced photo must not be served the old features"
    np.testing.assert_allclose(third.image[[0, 1, 3]], first.image[[0, 1, 3]], atol=1e-5)
    assert not np.allclose(third.image[2], first.image[2], atol=1e-3)

    moved = tmp_path / "moved"                      # the same bytes elsewhere: the same features, from the cache
    moved.mkdir()
    for p in paths:
        shutil.copy(p, moved / Path(p).name)
    ds2 = PairedDataset(name="bmp", captions=ds.captions, caption_image=np.arange(4),
                        image_paths=[str(moved / Path(p).name) for p in paths], splits={"train": np.arange(4)})
    assert extract_features(ds2, **kw).image_cache_hit


class _MeanColour:
    """Stands for a run's features: a 'representation' whose image side is each image's mean colour."""

    spec = {"image": {"name": "mean-colour"}, "representation": {"kind": "mean-colour"}}
    representation = None
    image_transform = None

    def __init__(self) -> None:
        self.calls = 0

    def encode_new_images(self, paths, device="cpu"):
        self.calls += len(paths)
        return np.stack([np.asarray(Image.open(p).convert("RGB"), np.float32).mean(axis=(0, 1)) for p in paths])


def test_photo_store_encodes_a_replaced_photo_again(tmp_path):
    from crossview.features.photo_cache import PhotoStore, encode_photos, encoder_identity

    feats = _MeanColour()
    photos = [_bmp(tmp_path / f"p{i}.bmp", (40 * i, 90, 160)) for i in range(3)]
    root = tmp_path / "stores"
    first = encode_photos(feats, photos, cache=root)
    assert first.encoded == 3 and encode_photos(feats, photos, cache=root).encoded == 0

    _replace_keeping_size_and_mtime(photos[0], (255, 0, 0))
    again = encode_photos(feats, photos, cache=root)
    assert again.encoded == 1
    np.testing.assert_allclose(again.features[0], feats.encode_new_images([photos[0]])[0])
    assert not np.allclose(again.features[0], first.features[0])
    store = PhotoStore(encoder_identity(feats), root=root).load()
    assert len(store.rows) == 3 and sum(k[0] == str(photos[0]) for k in store.rows) == 1

    copy = tmp_path / "copy.bmp"                    # a copy of a known photo is not encoded again
    shutil.copy(photos[1], copy)
    assert encode_photos(feats, [*photos, copy], cache=root).encoded == 0
