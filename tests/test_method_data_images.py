"""MethodData carries image files (paths + transform) as well as feature rows; text-only data has no images;
the image loader decodes in worker processes and names an unreadable file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crossview.core.errors import CrossViewError
from crossview.data.method_data import MethodData
from crossview.methods import create_method
from crossview.nn.images import BatchImages, batch_image_loader, image_loader


def _transform():
    from torchvision import transforms

    return transforms.Compose([transforms.Resize((32, 32)), transforms.ToTensor()])


def test_a_split_as_image_files(demo_dataset) -> None:
    ds = demo_dataset
    text = np.zeros((ds.n_captions, 3), np.float32)
    files = MethodData.from_features(ds, None, text, "val", image_transform=_transform())
    assert files.image_features is None and files.has_images
    assert files.n_images == len(ds.splits["val"]) and len(files.image_paths) == files.n_images
    assert files.caption_image.max() == files.n_images - 1
    with pytest.raises(CrossViewError, match="needs image feature rows but the val data has image files only"):
        files.require_image_features("wsabie")
    with pytest.raises(CrossViewError, match="needs image feature rows"):
        create_method("wsabie").with_run(device="cpu").fit(files)
    both = MethodData.from_features(ds, np.ones((ds.n_images, 4), np.float32), text, "val", with_paths=True)
    assert both.image_dim == 4 and both.image_paths == files.image_paths


def test_text_only_data_has_no_images() -> None:
    q = MethodData(image_features=None, text_features=np.ones((2, 3), np.float32), captions=["a", "b"],
                   caption_image=np.full(2, -1))
    assert q.n_images == 0 and not q.has_images and q.text_dim == 3
    with pytest.raises(CrossViewError, match="must be -1"):
        MethodData(image_features=None, text_features=None, captions=["a"], caption_image=np.zeros(1))
    with pytest.raises(CrossViewError, match="refers to image -1 but there are only 2 images"):
        MethodData(image_features=np.ones((2, 3)), text_features=None, captions=["a"], caption_image=np.full(1, -1))
    with pytest.raises(CrossViewError, match="image_paths has 1 files for 2 image feature rows"):
        MethodData(image_features=np.ones((2, 3)), text_features=None, captions=[], caption_image=np.zeros(0),
                   image_paths=["x.png"])


@pytest.mark.slow
def test_the_loader_decodes_in_workers_in_order(demo_dataset) -> None:
    from PIL import Image

    data = MethodData.from_features(demo_dataset, None, None, "val", image_transform=_transform())
    batches = list(image_loader(data, 8, workers=2, indices=range(20)))
    ids = torch.cat([b[1] for b in batches])
    assert ids.tolist() == list(range(20)) and batches[0][0].shape == (8, 3, 32, 32)
    with Image.open(data.image_paths[5]) as im:
        want = _transform()(im.convert("RGB"))
    torch.testing.assert_close(batches[0][0][5], want)
    shuffled = torch.cat([b[1] for b in image_loader(data, 8, workers=0, shuffle=True, seed=1, indices=range(20))])
    assert sorted(shuffled.tolist()) == list(range(20)) and shuffled.tolist() != list(range(20))


@pytest.mark.parametrize("workers", [0, 1])
def test_an_unreadable_image_is_named(tmp_path, workers: int) -> None:
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not a jpeg")
    data = MethodData(image_features=None, text_features=None, captions=[], caption_image=np.zeros(0),
                      image_paths=[str(bad)], image_transform=_transform())
    # one line naming the file, from a worker process as from this one (torch re-raises a worker's exception
    # with the worker's traceback in its message: the loaders carry the error back as a value instead)
    one_line = r"^\S*broken\.jpg: not an image file Pillow can read; fix or remove the file$"
    with pytest.raises(CrossViewError, match=one_line):
        list(image_loader(data, 1, workers=workers))
    ds = BatchImages([str(bad)], _transform(), lambda k: [0], lambda k: k, 0, 2)
    with pytest.raises(CrossViewError, match=one_line):
        list(batch_image_loader(ds, workers=workers))
    with pytest.raises(CrossViewError, match="no image files"):
        image_loader(MethodData(image_features=np.ones((1, 2)), text_features=None, captions=[],
                                caption_image=np.zeros(0)), 1)


def test_subset_by_image_carries_rows_captions_files_and_labels(demo_dataset) -> None:
    """``subset`` keeps the given images in the given order with all their captions (in their order), and the
    feature rows, files, labels and the caption -> image map follow them."""
    ds = demo_dataset
    text = np.arange(ds.n_captions * 2, dtype=np.float32).reshape(ds.n_captions, 2)
    image = np.arange(ds.n_images * 3, dtype=np.float32).reshape(ds.n_images, 3)
    full = MethodData.from_features(ds, image, text, "val", with_paths=True)
    full.labels = np.arange(full.n_images) * 10
    pick = np.array([4, 1, 7])
    sub = full.subset(pick, "held")
    assert sub.name == "held" and sub.n_images == 3
    np.testing.assert_array_equal(sub.image_features, full.image_features[pick])
    assert sub.image_paths == [full.image_paths[i] for i in pick]
    np.testing.assert_array_equal(sub.labels, [40, 10, 70])
    want = [c for i in pick for c in np.flatnonzero(full.caption_image == i)]      # image by image, in order
    assert sub.captions == [full.captions[c] for c in want]
    np.testing.assert_array_equal(sub.text_features, full.text_features[want])
    np.testing.assert_array_equal(pick[sub.caption_image], full.caption_image[want])
    assert sub.n_captions == sum(int(np.sum(full.caption_image == i)) for i in pick)
    with pytest.raises(CrossViewError, match="without images"):
        MethodData(None, None, ["a"], np.array([-1])).subset([0])
