"""crossview.nn.encoders: unit rows out of every encoder; the GRU over packed sequences gives the state at the
last real token (padding never read); the transformer's frozen bottom + fine-tuned top equals the whole model,
only its top layers learn; a frozen backbone keeps its BatchNorm statistics and gets no gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from crossview.nn.encoders import BackboneImageEncoder, FeatureImageEncoder, GRUTextEncoder, TransformerTextEncoder


def test_feature_encoder_gives_unit_rows_and_xavier_init() -> None:
    torch.manual_seed(0)
    enc = FeatureImageEncoder(40, 8)
    y = enc(torch.randn(5, 40))
    assert y.shape == (5, 8)
    assert torch.allclose(y.norm(dim=1), torch.ones(5), atol=1e-6)
    r = (6 / (40 + 8)) ** 0.5
    w, b = enc.fc.weight.detach(), enc.fc.bias.detach()
    assert float(w.abs().max()) <= r and float(b.abs().max()) == 0.0


def test_gru_reads_each_caption_up_to_its_last_real_token() -> None:
    """Packed GRU == the GRU run on each caption alone (no padding), whatever the padding holds."""
    torch.manual_seed(1)
    enc = GRUTextEncoder(30, 6, 10)
    lengths = torch.tensor([4, 1, 7, 3])
    ids = torch.randint(1, 30, (4, 7))
    garbage = ids.clone()
    for i, n in enumerate(lengths):
        ids[i, n:] = 0
        garbage[i, n:] = torch.randint(1, 30, (7 - int(n),))
    out = enc(ids, lengths)
    assert torch.allclose(out, enc(garbage, lengths), atol=1e-6)   # padding is never read
    for i, n in enumerate(lengths):
        _, h = enc.gru(enc.embed(ids[i:i + 1, :n]))
        want = h[-1] / h[-1].norm()
        assert torch.allclose(out[i], want[0], atol=1e-5)


def test_gru_starts_from_given_vectors_and_can_freeze_them() -> None:
    init = torch.randn(12, 5)
    enc = GRUTextEncoder(12, 5, 7, init=init, freeze_words=True)
    assert torch.equal(enc.embed.weight.detach(), init)
    assert not enc.embed.weight.requires_grad
    with pytest.raises(ValueError, match="shape"):
        GRUTextEncoder(12, 4, 7, init=init)


def _tiny_bert(layers: int = 3) -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32)
    return BertModel(cfg).eval()


@pytest.mark.parametrize("train_layers", [0, 1, 3])
def test_transformer_frozen_bottom_plus_top_equals_the_whole_model(train_layers) -> None:
    bert = _tiny_bert()
    enc = TransformerTextEncoder(bert, 8, train_layers=train_layers).eval()
    ids = torch.randint(1, 50, (3, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
    ids = ids * mask
    with torch.no_grad():
        full = bert(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask[..., None].float()
        pooled = (full * m).sum(1) / m.sum(1)
        want = enc.head(pooled)
        got = enc(ids, mask)
        cached = enc(ids, mask, frozen_hidden=enc.frozen_hidden(ids, mask))
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(cached, want, atol=1e-5)


@pytest.mark.parametrize("train_layers", [0, 2])
def test_bilstm_pool_is_the_max_over_each_captions_real_tokens(train_layers) -> None:
    """TIMAM's text branch: token states -> Bi-LSTM -> max over the real tokens -> FC; each caption alone
    (unpadded, one at a time) gives the same row, so padding is never read; the LSTM and FC learn."""
    bert = _tiny_bert()
    enc = TransformerTextEncoder(bert, 8, train_layers=train_layers, pool="bilstm", lstm_hidden=5,
                                 normalize=False).eval()
    ids = torch.randint(1, 50, (3, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 1 + [0] * 5])
    ids = ids * mask
    with torch.no_grad():
        got = enc(ids, mask)
        cached = enc(ids, mask, frozen_hidden=enc.frozen_hidden(ids, mask))
        for r in range(3):
            n = int(mask[r].sum())
            h = bert(input_ids=ids[r:r + 1, :n], attention_mask=mask[r:r + 1, :n]).last_hidden_state
            out, _ = enc.lstm(h)                       # (1, n, 10): forward and backward halves
            assert out.shape == (1, n, 10)
            want = enc.head(out[0].max(0).values[None])
            assert torch.allclose(got[r:r + 1], want, atol=1e-5), r
    assert torch.allclose(cached, got, atol=1e-5)
    enc.train()
    enc(ids, mask).sum().backward()
    assert enc.lstm.weight_ih_l0.grad is not None and enc.head.fc.weight.grad is not None
    assert (bert.encoder.layer[2].attention.self.query.weight.grad is not None) == (train_layers > 0)
    with pytest.raises(ValueError, match="pool"):
        TransformerTextEncoder(_tiny_bert(), 8, pool="max")


def test_transformer_trains_only_its_top_layers() -> None:
    bert = _tiny_bert()
    enc = TransformerTextEncoder(bert, 8, train_layers=1).train()
    ids = torch.randint(1, 50, (4, 5))
    mask = torch.ones_like(ids)
    enc(ids, mask).sum().backward()
    top = {id(p) for p in enc.transformer_parameters()}
    assert top and top == {id(p) for p in bert.encoder.layer[2].parameters()}
    for name, p in bert.named_parameters():
        assert (p.grad is not None) == (id(p) in top), name
    assert not bert.embeddings.training and not bert.encoder.layer[1].training and bert.encoder.layer[2].training
    with pytest.raises(ValueError, match="layers"):
        TransformerTextEncoder(_tiny_bert(), 8, train_layers=4)


def test_frozen_backbone_keeps_batchnorm_statistics_and_gets_no_gradient() -> None:
    backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    before = backbone[1].running_mean.clone()
    enc = BackboneImageEncoder(backbone, 4, 6, finetune=False).train()
    out = enc(torch.randn(5, 3, 8, 8) + 3)
    out.sum().backward()
    assert torch.equal(backbone[1].running_mean, before)
    assert all(p.grad is None for p in backbone.parameters())
    assert enc.head.fc.weight.grad is not None
    assert torch.allclose(out.norm(dim=1), torch.ones(5), atol=1e-6)

    tuned = BackboneImageEncoder(backbone, 4, 6, finetune=True).train()
    tuned(torch.randn(5, 3, 8, 8) + 3).sum().backward()
    assert not torch.equal(backbone[1].running_mean, before)
    assert all(p.grad is not None for p in backbone.parameters())


def test_gru_under_cpu_bfloat16_autocast_gives_the_packed_states() -> None:
    """Under bfloat16 autocast on the CPU the GRU runs padded (faster there) and reads each caption's state at
    its last real token: the same rows as the packed float32 run, to bfloat16 rounding."""
    torch.manual_seed(2)
    enc = GRUTextEncoder(30, 8, 16)
    lengths = torch.tensor([5, 2, 7, 3])
    ids = torch.randint(1, 30, (4, 7))
    for i, n in enumerate(lengths):
        ids[i, n:] = 0
    want = enc(ids, lengths)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = enc(ids, lengths)
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, atol=3e-2)
    assert (got * want).sum(1).min() > 0.999
