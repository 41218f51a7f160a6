"""SmoothAP for image-caption retrieval (Bleeker & de Rijke, ECIR 2022; paper 004), and the InfoNCE / NT-Xent
loss it compares against, on the VSE++ model (:mod:`crossview.methods.vsepp`: the same image and text encoders
and options).

A batch is ``batch_size`` *images* with all their captions (the sampler keeps an image's captions together).
Each image is encoded once; the batch's score matrix is ``(B images, ~5B captions)``:

- ``loss="smoothap"``: ``1 - AP`` with the sigmoid relaxation of temperature ``tau`` (0.1; the paper 0.01)
  (:func:`crossview.nn.losses.smooth_ap_loss`), i2t (each image ranks its ~5 captions among the batch's
  captions) and t2i (each caption ranks its image among the B images), averaged;
- ``loss="infonce"``: InfoNCE with ``temperature`` (:func:`crossview.nn.losses.info_nce_loss`) both ways,
  averaged; an image's other captions are not its negatives. Paper 004 trains NT-Xent on ordinary batches of
  image-caption pairs; with all captions of each image in the batch its t2i term is the same, and its i2t term
  counts each of an image's captions as a positive instead of one.

Defaults (3-fold cross-validation on the Flickr8k sample's 600 training photos, bench/results/
loss_compare_flickr8k.md): tau 0.1, not the paper's 0.01 (cv rsum 282 against 238: with a sharp sigmoid only
near-ties pass gradient), 100 epochs with the lr /10 after 70 (a batch of 128 images is a fifth of such a set).

Validation reports mean average precision both ways beside R@K (the epoch is still chosen by rsum, as for
``vsepp``, so that the losses are compared on one criterion). Under torchrun the loss is computed on the
global batch (an image whose captions fall on two processes is counted once).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from crossview.core.errors import CrossViewError
from crossview.data.method_data import MethodData
from crossview.methods import register_method
from crossview.methods.vsepp import Vsepp
from crossview.nn.losses import info_nce_loss, smooth_ap_loss
from crossview.nn.trainer import gather_rows, world

__all__ = ["SmoothAP", "LOSSES"]

LOSSES = ("smoothap", "infonce")


def _first_of_each(ids: torch.Tensor) -> torch.Tensor:
    """Indices of the first occurrence of each distinct value of ``ids`` (in order of the values)."""
    uniq, inverse = torch.unique(ids, return_inverse=True)
    first = torch.full((len(uniq),), len(ids), dtype=torch.int64, device=ids.device)
    return first.scatter_reduce(0, inverse, torch.arange(len(ids), device=ids.device), reduce="amin")


@register_method("smoothap")
class SmoothAP(Vsepp):
    """SmoothAP / InfoNCE on the VSE++ model (see the module docstring)."""

    group_by_image = True
    #: chosen by 3-fold CV on the Flickr8k sample's training photos (bench/results/rich_features_flickr8k.md): both
    #: backbones, flip-averaged, and MiniLM + GloVe captions, CV rsum 283.5 -> 297.3 (paired +13.8, 95% interval
    #: +3.9 to +23.2; +2.6 to +24.6 widened for the 2 variants compared); val 352.8 -> 366.6
    default_image_encoder = "efficientnet_lite0+mobilenet_v2:flip"
    default_text_encoder = "minilm+glove"
    #: the loss is a mean (1 - mAP, or InfoNCE averaged), reported as it is; under DDP every process computes it
    #: on the gathered batch and the all-gather's backward sums each process's share, so DDP's average is exact
    loss_is_sum = False
    nan_hint = "lower the learning rate, or raise tau / temperature"

    def __init__(self, *, loss: str = "smoothap", tau: float = 0.1, temperature: float = 0.1,
                 embed_dim: int = 1024, text_model: str = "features", image_model: str = "features",
                 backbone: str = "efficientnet_lite0", finetune_cnn: bool = False,
                 word_dim: int = 300, min_count: int = 1, max_len: int = 64, bert_path: str = "",
                 train_layers: int = 0, max_epochs: int = 100, batch_size: int = 128, lr: float = 2e-4,
                 lr_decay_epoch: int = 70, lr_decay: float = 0.1, grad_clip: float = 2.0, optimizer: str = "adam",
                 weight_decay: float = 0.0, patience: int = 10, holdout: float = 0.0) -> None:
        super().__init__(embed_dim=embed_dim, text_model=text_model, image_model=image_model, backbone=backbone,
                         finetune_cnn=finetune_cnn, word_dim=word_dim, min_count=min_count,
                         max_len=max_len, bert_path=bert_path, train_layers=train_layers, max_epochs=max_epochs,
                         batch_size=batch_size, lr=lr, lr_decay_epoch=lr_decay_epoch, lr_decay=lr_decay,
                         grad_clip=grad_clip, optimizer=optimizer, weight_decay=weight_decay, patience=patience,
                         holdout=holdout)
        self.loss = loss
        self.tau = tau
        self.temperature = temperature

    def _check_loss(self) -> None:
        if self.loss not in LOSSES:
            raise CrossViewError(f"smoothap: loss {self.loss!r} must be 'smoothap' (smoothed average precision) "
                                 "or 'infonce' (InfoNCE / NT-Xent)")
        for name in ("tau", "temperature"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise CrossViewError(f"smoothap: {name} must be a positive number, got {v!r}")

    def start_message(self, train: MethodData, n_items: int, n_batches: int, device: torch.device) -> str:
        what = (f"SmoothAP, tau {self.tau}" if self.loss == "smoothap"
                else f"InfoNCE, temperature {self.temperature}")
        return (f"smoothap ({what}): {train.n_images} images ({n_items} captions) in {n_batches} batches of "
                f"{self.batch_size} images with all their captions, text: {self._text_description()}, "
                f"{self.embed_dim}-d, device {device}{self._amp_note(device)}"
                f"{self._image_path_note()}")

    def prepare(self, train: MethodData, device: torch.device) -> None:
        super().prepare(train, device)
        # the most captions of one training image: the most positives an image has in any batch
        ci = np.asarray(train.caption_image, dtype=np.int64)
        self._most_captions = int(np.bincount(ci).max()) if len(ci) else 0

    def training_step(self, model: torch.nn.Module, batch: torch.Tensor,
                      generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The mean of the i2t and t2i ranking losses of a batch of images and all their captions."""
        im, im_ids, s, cap_ids = self._embed_batch(model, batch, distinct=True)
        world_size = world()[1]
        if world_size > 1:          # the global batch, each image once (its captions may sit on two processes)
            im, im_ids, s, cap_ids = gather_rows(im), gather_rows(im_ids), gather_rows(s), gather_rows(cap_ids)
            keep = _first_of_each(im_ids)
            im, im_ids = im[keep], im_ids[keep]
        scores = im @ s.T                                       # (images, captions)
        pos = im_ids[:, None] == cap_ids[None, :]
        if self.loss == "smoothap":      # the bounds on the positives keep the loss from waiting for the device
            most = int(getattr(self, "_most_captions", 0)) or None
            i2t = smooth_ap_loss(scores, pos, tau=float(self.tau), max_positives=most)
            t2i = smooth_ap_loss(scores.T, pos.T, tau=float(self.tau), max_positives=1)
        else:
            i2t = info_nce_loss(scores, pos, temperature=float(self.temperature))
            t2i = info_nce_loss(scores.T, pos.T, temperature=float(self.temperature))
        return {"loss": (i2t + t2i) / 2, "i2t": i2t.detach(), "t2i": t2i.detach()}

    def validation_score(self, val: MethodData) -> tuple[dict[str, Any], float]:
        """R@K both ways and rsum (the number the epoch is chosen by), with mean average precision both ways
        (``mAP`` in percent; t2i has one relevant image per caption, so its mAP is the mean reciprocal rank). The
        scores are formed block by block (a COCO-size 5K validation split's 5K x 25K matrix, with the argsort the
        full-matrix mAP made of it, held ~0.8 GB for 20 s at each epoch's end: issue 34)."""
        from crossview.eval import metrics as M

        img, txt = self.encode_images(val), self.encode_texts(val)
        res = M.evaluate_embeddings_blocked(img, txt, val.caption_image)
        ranks = res.pop("ranks")
        mean_ap = M.embedding_average_precision(img, txt, val.caption_image, t2i_ranks=ranks["t2i"])
        res["i2t"]["mAP"], res["t2i"]["mAP"] = mean_ap["i2t"], mean_ap["t2i"]
        return res, float(res["rsum"])
