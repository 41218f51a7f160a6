"""Mixed precision end to end (issue 32 item 3, the ``--amp`` slowdown): a frozen backbone's weights are cast to
autocast's type once, not at every step (autocast caches casts only for weights that require gradients), with
the very numbers autocast gives; checked on the CPU under bfloat16 autocast by counting the casts a step
dispatches. On CUDA the cast copy also runs channels-last."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from crossview.nn.encoders import BackboneImageEncoder


class _Casts(TorchDispatchMode):
    """Counts ``aten._to_copy`` calls from float32 to ``dtype`` on tensors of the given shapes (the weights)."""

    def __init__(self, shapes: set[tuple[int, ...]], dtype: torch.dtype) -> None:
        super().__init__()
        self.shapes, self.dtype, self.n = shapes, dtype, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32 \
                and kwargs.get("dtype") == self.dtype and tuple(args[0].shape) in self.shapes:
            self.n += 1
        return func(*args, **kwargs)


def _encoder(finetune: bool = False) -> BackboneImageEncoder:
    torch.manual_seed(0)
    body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 16, 1), nn.AdaptiveAvgPool2d(1))
    with torch.no_grad():                         # BatchNorm statistics that are not the identity
        for m in body.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return BackboneImageEncoder(body, 16, 8, finetune=finetune).train()


def _weight_shapes(enc: BackboneImageEncoder) -> set[tuple[int, ...]]:
    return {tuple(m.weight.shape) for m in enc.backbone.modules() if isinstance(m, nn.Conv2d)}


def test_frozen_backbone_weights_are_cast_once_not_every_step() -> None:
    enc = _encoder()
    x = torch.randn(4, 3, 16, 16)
    shapes = _weight_shapes(enc)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with _Casts(shapes, torch.bfloat16) as before:        # what every step did: autocast over the backbone
            with torch.no_grad():
                ref = [enc.backbone(x) for _ in range(3)]
        assert before.n >= 3 * len(shapes)
        enc(x)                                                # the first step makes the cast copy
        with _Casts(shapes, torch.bfloat16) as after:
            with torch.no_grad():
                got = [enc.frozen_backbone(x)(x) for _ in range(3)]
                emb = enc(x)
        assert after.n == 0, after.n
        assert enc.frozen_backbone(x) is enc.frozen_backbone(x)
    for a, b in zip(ref, got):                                # autocast's own numbers, bit for bit
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert emb.shape == (4, 8)
    assert not any("_frozen_copy" in k for k in enc.state_dict())


def test_the_cast_copy_follows_the_weights_and_is_only_used_under_autocast() -> None:
    enc = _encoder()
    x = torch.randn(2, 3, 16, 16)
    assert enc.frozen_backbone(x) is enc.backbone              # float32: the backbone itself, as before
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first = enc.frozen_backbone(x)
        other = _encoder()
        with torch.no_grad():
            other.backbone[0].weight.mul_(2.0)
        enc.load_state_dict(other.state_dict())               # new weights (a resumed or loaded model)
        second = enc.frozen_backbone(x)
        assert second is not first
        with torch.no_grad():
            torch.testing.assert_close(second(x), enc.backbone(x), rtol=0, atol=0)


def test_a_fine_tuned_backbone_is_left_to_autocast() -> None:
    """A fine-tuned backbone's weights require gradients: autocast caches their casts within a step, and the
    weights change every step, so there is no copy to keep."""
    enc = _encoder(finetune=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        enc(torch.randn(2, 3, 16, 16)).sum().backward()
    assert "_frozen_copy" not in enc.__dict__
    assert enc.backbone[0].weight.grad is not None


def test_padding_a_frozen_batch_to_a_fixed_row_count_leaves_each_row_alone() -> None:
    """On CUDA under autocast the frozen backbone runs a multiple of ROW_BUCKET rows (fewer shapes for cuDNN to
    plan); in eval mode each image's output does not depend on the others, so the padded rows change nothing."""
    from crossview.nn.encoders import ROW_BUCKET, pad_rows

    enc = _encoder()
    for n in (1, 5, ROW_BUCKET, ROW_BUCKET + 3):
        x = torch.randn(n, 3, 16, 16)
        padded = pad_rows(x, ROW_BUCKET)
        assert padded.shape[0] % ROW_BUCKET == 0 and padded.shape[0] - n < ROW_BUCKET
        assert torch.equal(padded[:n], x) and not padded[n:].any()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            body = enc.frozen_backbone(x)
            torch.testing.assert_close(body(padded)[:n], body(x), rtol=1e-2, atol=1e-2)
        with torch.no_grad():
            torch.testing.assert_close(enc.backbone(padded)[:n], enc.backbone(x), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_cuda_amp_runs_the_frozen_backbone_channels_last_in_float16() -> None:
    enc = _encoder().cuda()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    with torch.no_grad():
        ref = enc(x)
        with torch.autocast("cuda", dtype=torch.float16):
            got = enc(x)
            body = enc.frozen_backbone(x)
    conv = body[0]
    assert conv.weight.dtype == torch.float16 and conv.weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):      # 3 rows, run as 32: the same 3
        torch.testing.assert_close(enc(x[:3]).float(), got[:3].float(), rtol=2e-2, atol=2e-2)


def test_a_fine_tuned_backbone_goes_channels_last_in_place_with_the_same_numbers(monkeypatch) -> None:
    """On CUDA under autocast a fine-tuned backbone runs channels-last (cuDNN's half-precision convolutions
    transpose NCHW at every layer otherwise). Forced here on the CPU: its weights change layout in place (the
    optimiser's parameters stay the same objects and keep training), outputs, gradients and a step are those of
    NCHW, and the checkpoint loads into a plain NCHW encoder."""
    import crossview.nn.encoders as encoders

    ref, enc = _encoder(finetune=True), _encoder(finetune=True)
    params = list(enc.parameters())
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(params, lr=0.1)
    x = torch.randn(encoders.ROW_BUCKET, 3, 16, 16)      # a full bucket: no rows added (tested below)
    for _ in range(2):
        for model, o, layout in ((enc, opt, True), (ref, opt_ref, False)):
            monkeypatch.setattr(encoders, "_channels_last", lambda images, layout=layout: layout)
            o.zero_grad()
            model(x).pow(2).sum().backward()
            o.step()
    conv = enc.backbone[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert [id(p) for p in enc.parameters()] == [id(p) for p in params]
    for a, b in zip(enc.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    plain = _encoder(finetune=True)
    plain.load_state_dict(enc.state_dict())
    monkeypatch.setattr(encoders, "_channels_last", lambda images: False)
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(x), enc.eval()(x), rtol=1e-5, atol=1e-6)


def test_a_fine_tuned_batch_is_topped_up_with_its_own_images_to_a_fixed_row_count(monkeypatch) -> None:
    """Channels-last under autocast (forced here on the CPU), a fine-tuned backbone runs a multiple of
    ROW_BUCKET rows: cuDNN plans (and compiles) its kernels per batch shape, and the count of distinct images
    changes from batch to batch (66 captions/s end to end on an H200). The added rows are the batch's own
    images, so BatchNorm's statistics are those of real images (updated once per step, as without them), the
    output is the batch's rows, and the gradient reaches the backbone through every row."""
    import crossview.nn.encoders as encoders
    from crossview.nn.encoders import cycle_rows

    monkeypatch.setattr(encoders, "ROW_BUCKET", 4)
    x = torch.randn(6, 3, 16, 16)
    got = cycle_rows(x, 4)
    assert got.shape[0] == 8 and torch.equal(got[:6], x) and torch.equal(got[6:], x[:2])
    assert cycle_rows(x[:4], 4) is not None and torch.equal(cycle_rows(x[:4], 4), x[:4])
    assert cycle_rows(x[:0], 4).shape[0] == 0

    seen = []
    enc = _encoder(finetune=True)
    enc.backbone.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    ref = _encoder(finetune=True)
    monkeypatch.setattr(encoders, "_channels_last", lambda images: True)
    out = enc(x)
    assert out.shape == (6, 8) and seen[0].shape[0] == 8
    assert torch.equal(seen[0][6:], x[:2]) and seen[0].is_contiguous(memory_format=torch.channels_last)
    # BatchNorm's running mean moved once, by the batch mean of the 8 rows the backbone saw
    bn = enc.backbone[1]
    monkeypatch.setattr(encoders, "_channels_last", lambda images: False)
    ref_bn = ref.backbone[1]
    with torch.no_grad():
        first = ref.backbone[0](seen[0].contiguous())
    expect = (1 - ref_bn.momentum) * ref_bn.running_mean + ref_bn.momentum * first.mean((0, 2, 3))
    torch.testing.assert_close(bn.running_mean, expect, rtol=1e-5, atol=1e-6)
    assert int(bn.num_batches_tracked) == 1
    # the output rows are those of the 8-row batch's first 6 (BatchNorm in training mode uses all 8)
    with torch.no_grad():
        torch.testing.assert_close(out, ref(seen[0].contiguous())[:6], rtol=1e-5, atol=1e-5)
    out.pow(2).sum().backward()
    assert enc.backbone[0].weight.grad is not None and enc.backbone[0].weight.grad.abs().sum() > 0
