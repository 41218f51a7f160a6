"""Encoders into a joint embedding space, shared by the deep methods (VSE++ first; SmoothAP, webly and TIMAM
reuse them): every one ends in an L2-normalised row, so dot products are cosines.

- :class:`FeatureImageEncoder` -- precomputed features (CNN features, sentence embeddings) -> FC -> L2, the
  FC initialised as VSE++'s ``EncoderImagePrecomp`` (uniform Xavier, zero bias);
- :class:`BackboneImageEncoder` -- a torchvision / timm backbone over decoded images -> FC -> L2, the
  backbone frozen (BatchNorm statistics included) or fine-tuned;
- :class:`GRUTextEncoder` -- word embeddings -> a GRU over packed sequences -> the state at each caption's
  last real token -> L2 (VSE++'s ``EncoderText``); embeddings learned from uniform(-0.1, 0.1) or
  initialised from given vectors (GloVe);
- :class:`TransformerTextEncoder` -- a local BERT-like model (``transformers``' ``AutoModel``) over word
  pieces, mean-pooled over the real tokens (sentence-transformers' pooling) -> FC -> L2; frozen, or its top
  ``train_layers`` layers fine-tuned. ``pool="bilstm"`` (TIMAM's text branch, after CMPM): the token states ->
  a bidirectional LSTM -> the maximum over the real tokens of its concatenated outputs -> FC. The frozen bottom's states do not change during training, so a method
  may compute them once per caption (:meth:`TransformerTextEncoder.frozen_hidden`) and pass them back in.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from crossview.core.rownorm import norms_frozen, row_norms

__all__ = ["l2norm", "FeatureImageEncoder", "BackboneImageEncoder", "GRUTextEncoder", "TransformerTextEncoder"]


def l2norm(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``x`` scaled to unit L2 norm along ``dim`` (a zero row stays zero). Inside
    :func:`crossview.core.rownorm.frozen_row_norms` (an explanation, 2-D rows) every row is divided by the
    first row's norm instead."""
    if x.dim() == 2 and norms_frozen():
        return x / row_norms(x.norm(p=2.0, dim=dim, keepdim=True)).clamp_min(1e-12)
    return F.normalize(x, p=2.0, dim=dim, eps=1e-12)


def _xavier_fc(in_dim: int, out_dim: int) -> nn.Linear:
    fc = nn.Linear(int(in_dim), int(out_dim))
    r = math.sqrt(6.0) / math.sqrt(in_dim + out_dim)
    nn.init.uniform_(fc.weight, -r, r)
    nn.init.zeros_(fc.bias)
    return fc


class FeatureImageEncoder(nn.Module):
    """``(n, in_dim)`` feature rows -> ``(n, embed_dim)`` unit rows: one FC layer, then L2 (``normalize``)."""

    def __init__(self, in_dim: int, embed_dim: int = 1024, *, normalize: bool = True) -> None:
        super().__init__()
        self.fc = _xavier_fc(in_dim, embed_dim)
        self.normalize = bool(normalize)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return l2norm(y) if self.normalize else y


class BackboneImageEncoder(nn.Module):
    """Decoded images ``(n, 3, H, W)`` -> ``backbone`` -> ``(n, feat_dim)`` -> FC -> L2.

    ``finetune=False`` keeps the backbone frozen: no gradients, and always in eval mode (its BatchNorm
    running statistics never move), run under ``no_grad`` so no activations are kept for it."""

    def __init__(self, backbone: nn.Module, feat_dim: int, embed_dim: int = 1024, *, finetune: bool = False,
                 normalize: bool = True) -> None:
        super().__init__()
        self.backbone = backbone
        self.finetune = bool(finetune)
        for p in self.backbone.parameters():
            p.requires_grad_(self.finetune)
        self.head = FeatureImageEncoder(feat_dim, embed_dim, normalize=normalize)

    def train(self, mode: bool = True) -> "BackboneImageEncoder":
        super().train(mode)
        if not self.finetune:
            self.backbone.eval()
        return self

    def backbone_parameters(self) -> Any:
        """The pretrained backbone's parameters (a method gives them their own learning rate)."""
        return self.backbone.parameters()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.finetune:
            if _channels_last(images):
                # half-precision convolutions over NCHW make cuDNN transpose every layer's input and output
                # (frozen_backbone's docstring); a fine-tuned backbone's own weights go channels-last once
                # (in place: the optimiser keeps the same parameters) and its input with them.
                # A fixed number of rows too: cuDNN builds its half-precision channels-last plans per batch shape
                # (compiling kernels at run time), ~2 s for each new count of distinct images a batch happens to
                # have: 66 captions/s end to end on an H200, 2,053 with the count fixed
                # (bench/results/gpu_logs/probe_gpu.txt). The extra rows are copies of the batch's own images, so
                # BatchNorm's batch statistics count a few images twice, as the paper's batches (one image per
                # caption) count an image shared by two captions; only the first n rows are the output
                self._finetune_channels_last()
                n = images.shape[0]
                f = self.backbone(cycle_rows(images, ROW_BUCKET).contiguous(memory_format=torch.channels_last))[:n]
            else:
                f = self.backbone(images)
        else:
            with torch.no_grad():
                body = self.frozen_backbone(images)
                if _channels_last(images):
                    # a fixed number of rows (a multiple of ROW_BUCKET): cuDNN then plans each layer for a few
                    # batch shapes instead of one per count of distinct images a batch happens to have; frozen,
                    # the backbone is in eval mode and each row's output is its own
                    n = images.shape[0]
                    f = body(_to_layout(pad_rows(images, ROW_BUCKET)))[:n]
                else:
                    f = body(images)
        return self.head(f.flatten(1))

    def _finetune_channels_last(self) -> None:
        """The fine-tuned backbone's 4-d weights in channels-last layout (once; a no-op when they already are).
        The values are unchanged, so a checkpoint saved afterwards loads into an NCHW model as before."""
        if self.__dict__.get("_finetune_layout") is torch.channels_last:
            return
        with torch.no_grad():
            for m in self.backbone.modules():
                for name, t in list(m.named_parameters(recurse=False)):
                    if t.dim() == 4 and not t.is_contiguous(memory_format=torch.channels_last):
                        t.data = t.data.contiguous(memory_format=torch.channels_last)
                        if t.grad is not None:
                            t.grad = t.grad.contiguous(memory_format=torch.channels_last)
        self.__dict__["_finetune_layout"] = torch.channels_last

    def frozen_backbone(self, images: torch.Tensor) -> nn.Module:
        """The module that runs the frozen backbone over ``images``: the backbone itself, or, under autocast, a
        copy made once (remade only when the backbone's weights or device change) whose conv and
        linear layers are already in autocast's type and, on CUDA, in channels-last layout.

        Why: autocast caches its casts only for weights that require gradients, so a frozen backbone's weights
        were cast again at every step (one cast kernel per layer); and half-precision convolutions over NCHW
        tensors make cuDNN transpose every layer's input and output to NHWC and back (depthwise convolutions,
        which EfficientNet and MobileNet are made of, worst), which made ``--amp`` end to end slower than
        float32. The copy computes what autocast computes (same casts, BatchNorm left in float32); its input
        goes in the copy's layout (:func:`_to_layout`)."""
        dtype = _autocast_dtype(images.device.type)
        if dtype is None:                   # float32: as it always ran (its speed is measured)
            return self.backbone
        channels_last = _channels_last(images)
        key = (dtype, images.device, channels_last,
               tuple((t.data_ptr(), t._version) for t in (*self.backbone.parameters(), *self.backbone.buffers())))
        cached = self.__dict__.get("_frozen_copy")      # in __dict__: not a submodule, never in the state dict
        if cached is None or cached[0] != key:
            body = copy.deepcopy(self.backbone).eval()
            if dtype is not None:
                for m in body.modules():
                    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
                        m.to(dtype)
            if channels_last:
                body.to(memory_format=torch.channels_last)
            self.__dict__["_frozen_copy"] = cached = (key, body)
        return cached[1]


class GRUTextEncoder(nn.Module):
    """Token ids ``(n, L)`` padded with 0 and ``lengths`` ``(n,)`` -> ``(n, embed_dim)`` unit rows: word
    embeddings, a GRU run over packed sequences on a GPU when the lengths are on the host (padding is never read),
    else over the padded batch (the state at a caption's last real token has not read the padding after it), the
    last layer's state at each caption's last real token, L2.

    ``init``: ``(vocab_size, word_dim)`` vectors to start the embeddings from (e.g. GloVe); else
    uniform(-0.1, 0.1) as VSE++. ``freeze_words`` keeps the embeddings fixed."""

    def __init__(self, vocab_size: int, word_dim: int = 300, embed_dim: int = 1024, *, num_layers: int = 1,
                 init: Any = None, freeze_words: bool = False, normalize: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(int(vocab_size), int(word_dim))
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        if init is not None:
            init = torch.as_tensor(init, dtype=self.embed.weight.dtype)
            if tuple(init.shape) != tuple(self.embed.weight.shape):
                raise ValueError(f"init has shape {tuple(init.shape)}, the embeddings "
                                 f"{tuple(self.embed.weight.shape)}")
            with torch.no_grad():
                self.embed.weight.copy_(init)
        self.embed.weight.requires_grad_(not freeze_words)
        self.gru = nn.GRU(int(word_dim), int(embed_dim), int(num_layers), batch_first=True)
        self.normalize = bool(normalize)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if ids.shape[0] == 0:
            return self.embed.weight.new_zeros((0, self.gru.hidden_size))
        lengths = lengths.clamp(min=1)            # an empty caption reads its one (pad) token
        # the rows of the embedding table by index_select rather than nn.Embedding's forward: the same values
        # and gradient, but its backward (index_add) never waits for the GPU, while the embedding backward
        # syncs the device once a step (it counts the distinct ids on the host)
        x = self.embed.weight.index_select(0, ids.reshape(-1)).view(*ids.shape, -1)
        if x.device.type == "cpu" or lengths.device.type != "cpu":
            # on the CPU the padded run is faster than the packed one (float32 a little: one batch size for every
            # time step; bfloat16 about twice, AMX), and gives the same states: a one-way GRU's output at a
            # caption's last real token has not read the padding after it. On a GPU with the lengths on the device
            # (a step captured as a CUDA graph), the same: packing would read them on the host
            out_all, _ = self.gru(x)
            rows = torch.arange(len(ids), device=out_all.device)   # (a host index would be a copy a step)
            out = out_all[rows, (lengths.to(out_all.device) - 1).to(torch.int64)]
        else:
            # packing reads the lengths on the host: the trainer hands them over from there (no wait for the device)
            host = lengths if lengths.device.type == "cpu" else lengths.cpu()
            packed = nn.utils.rnn.pack_padded_sequence(x, host, batch_first=True, enforce_sorted=False)
            _, h = self.gru(packed)               # h: (layers, n, hidden), rows back in input order
            out = h[-1]
        out = out.float()
        return l2norm(out) if self.normalize else out


class TransformerTextEncoder(nn.Module):
    """Word-piece ids and attention ``mask`` ``(n, L)`` -> a BERT-like ``model`` -> mean over the real tokens
    -> FC -> L2. ``train_layers`` top layers are fine-tuned; the embeddings and the layers below stay frozen
    (eval mode, no gradients). ``model`` is a ``transformers`` ``AutoModel`` with ``.embeddings`` and
    ``.encoder.layer`` (BERT, MiniLM, RoBERTa...).

    ``pool="bilstm"``: instead of the mean, the token states go through a bidirectional LSTM of ``lstm_hidden``
    units a direction, over packed sequences (padding is never read), and the element-wise maximum over each
    caption's real tokens of the concatenated ``(2 * lstm_hidden)`` outputs goes to the FC (the CMPM code's
    ``reduce_max`` over the Bi-LSTM outputs; there the padded steps' zero outputs join the maximum, here only
    real tokens do)."""

    def __init__(self, model: nn.Module, embed_dim: int = 1024, *, train_layers: int = 0,
                 normalize: bool = True, pool: str = "mean", lstm_hidden: int = 512) -> None:
        super().__init__()
        layers = _layers_of(model)
        if not 0 <= int(train_layers) <= len(layers):
            raise ValueError(f"train_layers={train_layers}: the model has {len(layers)} layers")
        self.model = model
        self.train_layers = int(train_layers)
        self.n_frozen = len(layers) - self.train_layers
        for p in self.model.parameters():
            p.requires_grad_(False)
        for layer in self.top_layers():
            for p in layer.parameters():
                p.requires_grad_(True)
        if pool not in ("mean", "bilstm"):
            raise ValueError(f"pool={pool!r}: 'mean' or 'bilstm'")
        self.pool = pool
        width = int(model.config.hidden_size)
        self.lstm = nn.LSTM(width, int(lstm_hidden), batch_first=True, bidirectional=True) if pool == "bilstm" \
            else None
        self.head = FeatureImageEncoder(2 * int(lstm_hidden) if self.lstm is not None else width, embed_dim,
                                        normalize=normalize)

    def top_layers(self) -> list[nn.Module]:
        return list(_layers_of(self.model))[self.n_frozen:]

    def transformer_parameters(self) -> list[nn.Parameter]:
        """The fine-tuned layers' parameters (a method gives them their own learning rate)."""
        return [p for layer in self.top_layers() for p in layer.parameters()]

    def train(self, mode: bool = True) -> "TransformerTextEncoder":
        super().train(mode)
        self.model.eval()                  # frozen parts: no dropout
        for layer in self.top_layers():
            layer.train(mode)
        return self

    def _mask4(self, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The additive ``(n, 1, 1, L)`` attention mask every layer reads (0 on tokens, a large negative on
        padding)."""
        m = mask[:, None, None, :].to(dtype)
        return (1.0 - m) * torch.finfo(dtype).min

    def _run_layers(self, h: torch.Tensor, mask: torch.Tensor, layers: list[nn.Module]) -> torch.Tensor:
        ext = self._mask4(mask, h.dtype)
        for layer in layers:
            out = layer(h, attention_mask=ext)
            h = out[0] if isinstance(out, (tuple, list)) else out
        return h

    def frozen_hidden(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(n, L, hidden)``: the states after the frozen bottom (embeddings and layers below the fine-tuned
        ones), which training never changes."""
        with torch.no_grad():
            h = self.model.embeddings(input_ids=ids)
            return self._run_layers(h, mask, list(_layers_of(self.model))[:self.n_frozen])

    def forward(self, ids: torch.Tensor, mask: torch.Tensor,
                frozen_hidden: torch.Tensor | None = None) -> torch.Tensor:
        h = self.frozen_hidden(ids, mask) if frozen_hidden is None else frozen_hidden
        if self.train_layers:
            h = self._run_layers(h, mask, self.top_layers())
        if self.lstm is not None:
            return self.head(self._bilstm_max(h, mask))
        m = mask.to(h.dtype).unsqueeze(-1)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return self.head(pooled)

    def _bilstm_max(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(n, 2 * lstm_hidden)``: the Bi-LSTM over each caption's real tokens, maximum over them."""
        assert self.lstm is not None
        if h.shape[0] == 0:
            return h.new_zeros((0, 2 * self.lstm.hidden_size))
        lengths = mask.sum(1).clamp(min=1)
        if h.is_cuda:
            return bilstm_max_unpacked(self.lstm, h.float(), lengths)
        packed = nn.utils.rnn.pack_padded_sequence(h.float(), lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, padding_value=float("-inf"),
                                                  total_length=h.shape[1])
        return out.amax(1)


def bilstm_max_unpacked(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The element-wise maximum over each row's first ``lengths`` steps of a one-layer bidirectional ``lstm``'s
    outputs, as over packed sequences, but with nothing read on the host (a GPU step never waits, and a CUDA graph
    can capture it). The maximum of ``[forward; backward]`` is the two halves' maxima, so: the forward half from a
    run over the rows as they are (padding after the real steps, which a forward state never reads), the backward
    half from a run over the rows shifted right (padding before them: the backward direction reads the real steps
    first). Twice the LSTM work of packing; the same numbers."""
    n, width = x.shape[0], x.shape[1]
    hid = lstm.hidden_size
    pos = torch.arange(width, device=x.device)
    real = pos[None, :] < lengths[:, None]                                  # (n, width) left-aligned real steps
    shift = (width - lengths)[:, None]                                      # right-aligned: step t at t + shift
    src = (pos[None, :] - shift).clamp(min=0)                               # where each right-aligned slot reads
    right = torch.where((pos[None, :] >= shift)[..., None], x.gather(1, src[..., None].expand(n, width, x.shape[2])),
                        x.new_zeros(()))
    fwd, _ = lstm(x)
    bwd, _ = lstm(right)
    neg = x.new_full((), float("-inf"))
    f_max = torch.where(real[..., None], fwd[..., :hid], neg).amax(1)
    b_max = torch.where((pos[None, :] >= shift)[..., None], bwd[..., hid:], neg).amax(1)
    return torch.cat([f_max, b_max], 1)


#: a backbone (frozen or fine-tuned) under CUDA autocast sees batches of a multiple of this many images (see forward)
ROW_BUCKET = 32


def pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """``x`` with zero rows appended up to a multiple of ``multiple`` rows (``x`` itself when it is one)."""
    extra = -x.shape[0] % int(multiple)
    return torch.cat([x, x.new_zeros((extra, *x.shape[1:]))]) if extra else x


def cycle_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """``x`` with rows appended up to a multiple of ``multiple`` rows, copies of its own rows from the first on
    (``x`` itself when it has a multiple, or no rows)."""
    n = x.shape[0]
    extra = -n % int(multiple)
    if not n or not extra:
        return x
    return x[torch.arange(n + extra, device=x.device) % n]


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The type autocast casts to on ``device_type`` (``"cuda"`` / ``"cpu"``), or None when it is off there."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    except (TypeError, RuntimeError, AttributeError):     # an older torch without the device argument
        return None


def _channels_last(images: torch.Tensor) -> bool:
    """Whether a backbone (frozen or fine-tuned) runs ``images`` in channels-last layout: a CUDA image batch
    under autocast."""
    return images.is_cuda and images.dim() == 4 and _autocast_dtype("cuda") is not None


def _to_layout(images: torch.Tensor) -> torch.Tensor:
    """``images`` in the layout :meth:`BackboneImageEncoder.frozen_backbone` runs them in."""
    return images.contiguous(memory_format=torch.channels_last) if _channels_last(images) else images


def _cpu_autocast() -> bool:
    try:
        return bool(torch.is_autocast_enabled("cpu"))
    except TypeError:                              # torch < 2.4
        return bool(torch.is_autocast_cpu_enabled())


def _layers_of(model: nn.Module) -> nn.ModuleList:
    enc = getattr(model, "encoder", None)
    layers = getattr(enc, "layer", None)
    if layers is None or not hasattr(model, "embeddings"):
        raise ValueError(f"{type(model).__name__} is not a BERT-like encoder (no .embeddings / .encoder.layer)")
    return layers
