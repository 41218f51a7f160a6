"""TIMAM: Text-Image Modality Adversarial Matching (Sarafianos, Xu & Kakadiaris, ICCV 2019; paper 002).

Two branches into one 512-d space, on the VSE++ model's encoders (:mod:`crossview.methods.vsepp`):

- image: the run's image features (a pooled CNN feature) -> FC, or end to end (``image_model="cnn"``: the backbone
  over the image files -> pooled -> FC);
- text: by default (``text_model="features"``) the run's caption features -> FC, the MiniLM + GloVe sentence
  features the other deep methods read (``default_text_encoder``); or (``text_model="bilstm"``, the paper's) a
  transformer's token states (all-MiniLM-L6-v2 offline, or any local BERT folder, ``bert_path``) -> a
  bidirectional LSTM (``lstm_hidden`` units a direction) -> the maximum over the real tokens -> FC
  (:class:`crossview.nn.encoders.TransformerTextEncoder` with ``pool="bilstm"``); or any of the vsepp text
  encoders.

The embeddings are not L2-normalised in training (CMPM projects an image on the *normalised* texts and reads the
image's norm as an inverse temperature); retrieval ranks by cosine (the rows are normalised when embedded).
Every caption of every training image once an epoch, ``batch_size`` captions with their images; each pair's
label ``Y_i`` is its image's identity / class (``labels="identity"``, e.g. CUHK-PEDES, or the demo's layout
classes) or the image itself (``labels="image"``, Flickr); ``auto`` takes identities on the identity / class
datasets (CUHK-PEDES, CUB / Flowers) and images elsewhere.
The loss (:mod:`crossview.nn.losses`), summed as the paper's Algorithm 1:

- identification ``L_I = L_I^V + L_I^T``: norm-softmax cross-entropy of each embedding over the training labels,
  one classifier (class vectors L2-normalised) shared by both modalities as in CMPM's code
  (:func:`~crossview.nn.losses.norm_softmax_id_loss`), weight ``id_weight``; with more than ``id_classes``
  classes (COCO: one per training image, 113K) each step's softmax runs over the batch's own classes and a
  uniform sample of the others (Partial FC, An et al. 2021), the sampled rows updated by their own optimiser:
  row-wise RMSprop (``id_optimizer="rowwise"``, :class:`~crossview.nn.row_optim.RowwiseRMSprop`: one number per
  class row, so the classifier costs its own size, 0.22 GB at COCO size, not three times that) or SparseAdam;
- cross-modal projection matching ``L_M = L_M^V + L_M^T`` (:func:`~crossview.nn.losses.cmpm_loss`), weight
  ``cmpm_weight``;
- the modality game, weight ``adv_weight`` (0 = no discriminator): a discriminator ``D`` =
  FC(256)-BN-LeakyReLU(0.2)-FC(1) tells image embeddings (1) from text embeddings (0) with the paper's tricks
  (a separate batch per modality, soft labels in [0.8, 1.2] / [0, 0.3], 20% of the labels flipped:
  :func:`~crossview.nn.losses.discriminator_loss`, on the embeddings detached from the encoders), while the
  encoders learn to fool it (:func:`~crossview.nn.losses.generator_loss` through ``D`` with its weights held:
  ``adv_target="confusion"``, the default, both modalities labelled 0.5, at rest where ``D`` cannot tell;
  ``"swapped"`` the non-saturating GAN form, each modality labelled as the other, which overshoots: ``D``'s
  accuracy falls well below chance. 3-fold CV on the Flickr8k sample: confusion 241.4 against swapped 237.5,
  better on every fold; no discriminator at all 242.8). Both updates come from one backward pass and one step of every optimiser
  (simultaneous gradient play rather than alternating steps: the trainer's one-backward contract); the
  discriminator's accuracy on the batch, ``D_acc``, is reported beside the losses: 0.5 means it cannot tell.

Optimisers: Adam for the text branch; for the image branch, the classifier and the discriminator Adam by default, or
the paper's SGD with momentum 0.9 (``image_optimizer="sgd"``: at the paper's lr 2e-4 the image side then learns
several times slower on a CPU-sized budget); lr divided by 10 when the validation rsum plateaus (the epoch's loss
without a validation split), down to ``min_lr``; weight decay 4e-4. Defaults for a CPU (3-fold cross-validation on
the Flickr8k sample's training photos): the caption features -> FC at lr 3e-3 for 10 epochs
(bench/results/timam_cv2_flickr8k.md: CV rsum under isoftmax 10, seeds 0-2,
275.9 -> 314.1, paired +38.2, 95% interval +30.3 to +45.7; the paper's
Bi-LSTM at lr 2e-4 learns slowly on 400-600 photos); with ``text_model="bilstm"`` a 256-unit Bi-LSTM (the paper:
512; bench/results/timam_flickr8k.md), trained at the paper's lr 2e-4 there (1e-3, screened on one seed among 14
configurations in timam_cv2_flickr8k.md: +12.0, +2.3 to +21.6, optimistic and not a finalist). ``lr=None``
(the default) takes the rate chosen for the text model (:data:`LR_BY_TEXT_MODEL`); a number overrides it.
With ``text_model="bilstm"`` (or ``"transformer"``), two phases in one run, as the paper: the language model frozen
(its token states computed once per caption text, ever: the token-state cache, :mod:`crossview.features.token_cache`,
shared between runs and read by a resume,
reported as the run's ``tokens`` stage) for ``max_epochs``, then its top ``finetune_layers`` layers unfrozen and the whole network fine-tuned at
``finetune_lr`` for ``finetune_epochs`` (0 = frozen throughout: an ablation); the curves mark where the second
phase begins, its epochs continue the first's, a resume lands in the phase it stopped in, and the epoch with the
best validation rsum over both phases is kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from crossview.core.errors import CrossViewError
from crossview.core.events import Log, Progress
from crossview.data.method_data import MethodData
from crossview.methods import register_method
from crossview.methods.vsepp import TEXT_MODELS, Vsepp, VseModel, _load_transformer_model
from crossview.nn.encoders import FeatureImageEncoder, GRUTextEncoder, TransformerTextEncoder, _xavier_fc
from crossview.nn.losses import (cmpm_loss, discriminator_accuracy, discriminator_loss, generator_loss,
                                 norm_softmax_id_loss)
from crossview.nn.row_optim import RowwiseRMSprop
from crossview.nn.trainer import PlateauScheduler, gather_rows, unwrap, world

__all__ = ["Timam", "TimamModel", "Discriminator", "LABELS", "TIMAM_TEXT_MODELS", "IDENTITY_FORMATS", "pair_labels"]

#: where each pair's label comes from: the dataset's identities / classes, the image itself, or the first when given
LABELS = ("auto", "identity", "image")

#: the first phase's lr with ``lr=None``, by text model (3-fold CV on the Flickr8k sample's training photos): the
#: caption features -> FC at 3e-3 (bench/results/timam_cv2_flickr8k.md), the paper's Bi-LSTM at its 2e-4
#: (1e-3 screened +12.0, +2.3 to +21.6, seed 0 of 14 configurations: bench/results/timam_cv2_flickr8k.md); the
#: others at 3e-3
LR_BY_TEXT_MODEL = {"features": 3e-3, "bilstm": 2e-4}
DEFAULT_LR = 3e-3
# the sampled classifier's optimisers (id_classes below the number of classes), as the logs name them
ID_OPTIMIZERS = {"rowwise": "row-wise RMSprop", "adam": "SparseAdam"}
#: the text side: the paper's Bi-LSTM over a transformer's token states, or the vsepp text encoders
TIMAM_TEXT_MODELS = ("bilstm",) + TEXT_MODELS


#: dataset formats whose labels are identities / classes that the evaluation counts by (CUHK-PEDES; CUB and
#: Flowers in Reed et al.'s layout): ``labels="auto"`` trains with them there
IDENTITY_FORMATS = ("cuhk-pedes", "reed")


def pair_labels(data: MethodData, kind: str) -> tuple[np.ndarray, str]:
    """``(labels of the images, what they are)``: ``(n_images,) int64`` ids in ``[0, n_classes)``.

    ``identity``: the dataset's labels (identities, classes), refused when they do not group its images (a
    dataset without labels numbers its images); ``image``: each image its own label; ``auto``: identities for the
    identity / class datasets (:data:`IDENTITY_FORMATS`, whose evaluation counts a hit by identity), else images
    (Flickr, COCO, the demo: an image and its own captions are the matches that count)."""
    labels = getattr(data, "labels", None)
    groups = labels is not None and len(labels) == data.n_images and \
        len(np.unique(np.asarray(labels))) < data.n_images
    if kind == "identity" and not groups:
        raise CrossViewError(f"timam: labels=identity needs identity / class labels shared by several images, and "
                             f"the {data.name or 'training'} data has none; use labels=image (each image its own "
                             "label, as on Flickr) or auto")
    fmt = str(getattr(getattr(data, "dataset", None), "format", "") or "")
    if kind == "identity" or (kind == "auto" and groups and fmt in IDENTITY_FORMATS):
        _, ids = np.unique(np.asarray(labels), return_inverse=True)
        return ids.reshape(-1).astype(np.int64), "identity"
    return np.arange(data.n_images, dtype=np.int64), "image"


class Discriminator(nn.Module):
    """The modality discriminator: FC(hidden)-BN-LeakyReLU(0.2)-FC(1), one logit per embedding (> 0: image)."""

    def __init__(self, embed_dim: int, hidden: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(_xavier_fc(embed_dim, hidden), nn.BatchNorm1d(hidden), nn.LeakyReLU(0.2),
                                 _xavier_fc(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).reshape(-1)


class TimamModel(VseModel):
    """:class:`VseModel` (image and text encoders, not normalised) with the shared norm-softmax classifier
    (``classifier``: ``(n_classes, embed_dim)``) and the modality discriminator (``disc``)."""

    def __init__(self, image: nn.Module, text: nn.Module, n_classes: int, embed_dim: int, d_hidden: int) -> None:
        super().__init__(image, text)
        self.classifier = nn.Parameter(torch.empty(int(n_classes), int(embed_dim)))
        bound = math.sqrt(6.0 / (int(n_classes) + int(embed_dim)))
        nn.init.uniform_(self.classifier, -bound, bound)
        self.disc = Discriminator(int(embed_dim), int(d_hidden))


def _held(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` with its weights held: the gradient reaches ``x`` only, and its BatchNorm running statistics
    are not updated (copies are used); batch statistics as in training."""
    params = {k: v.detach() for k, v in module.named_parameters()}
    buffers = {k: v.clone() for k, v in module.named_buffers()}
    return torch.func.functional_call(module, {**params, **buffers}, (x,))


@register_method("timam")
class Timam(Vsepp):
    """TIMAM (see the module docstring)."""

    second_stage_epochs = "finetune_epochs"
    #: chosen by 3-fold CV on the Flickr8k sample's training photos (bench/results/rich_features_flickr8k.md): both
    #: backbones, flip-averaged, CV rsum 280.8 -> 296.3 with MiniLM captions (paired +15.5, 95% interval +7.1 to
    #: +24.0; +6.3 to +24.6 widened for the 2 variants compared); val 386.6 -> 383.8 (-2.8, -22.2 to +17.6: val
    #: cannot resolve it).
    #: The caption pipeline of the other deep methods, read by the default text_model="features" (chosen by 3-fold CV
    #: on the sample's training photos with lr 3e-3, bench/results/timam_cv2_flickr8k.md: isoftmax-10 CV rsum
    #: 275.9 -> 314.1 against the Bi-LSTM over MiniLM's token states at lr 2e-4, paired +38.2, +30.3 to +45.7,
    #: seeds 0-2; plain +47.6); the Bi-LSTM (text_model=bilstm) reads the captions itself, no caption features
    default_image_encoder = "efficientnet_lite0+mobilenet_v2:flip"
    default_text_encoder = "minilm+glove"
    loss_terms = {
        "loss": "the total: id_weight L_I + cmpm_weight L_M + L_D + adv_weight L_G",
        "L_I": "identification: cross-entropy of each image and caption embedding over the training identities",
        "L_M": "cross-modal projection matching (CMPM): image and caption projections of one identity agree",
        "L_D": "the discriminator's loss telling image embeddings from text embeddings",
        "L_G": "the encoders' adversarial loss: fool the discriminator (at rest when it cannot tell)",
        "D_acc": "the discriminator's accuracy (0.5: the modalities are indistinguishable)"}

    def __init__(self, *, labels: str = "auto", id_weight: float = 1.0, cmpm_weight: float = 1.0,
                 adv_weight: float = 1.0, adv_target: str = "confusion", d_hidden: int = 256, soft_labels: bool = True, flip: float = 0.2,
                 id_classes: int = 16384, id_optimizer: str = "rowwise",
                 embed_dim: int = 512, text_model: str = "features", lstm_hidden: int = 256,
                 image_model: str = "features", backbone: str = "efficientnet_lite0", finetune_cnn: bool = False,
                 word_dim: int = 300, min_count: int = 1, max_len: int = 30, bert_path: str = "",
                 finetune_layers: int = 6, finetune_epochs: int = 0, finetune_lr: float = 2e-6,
                 max_epochs: int = 10, batch_size: int = 64, lr: float | None = None, image_optimizer: str = "adam",
                 momentum: float = 0.9, plateau_patience: int = 2, min_lr: float = 2e-6, weight_decay: float = 4e-4,
                 grad_clip: float = 0.0, patience: int = 0, holdout: float = 0.0) -> None:
        for name, value in dict(embed_dim=embed_dim, text_model=text_model, image_model=image_model,
                                backbone=backbone, finetune_cnn=finetune_cnn, word_dim=word_dim,
                                min_count=min_count, max_len=max_len, bert_path=bert_path, max_epochs=max_epochs,
                                batch_size=batch_size, lr=lr, grad_clip=grad_clip, weight_decay=weight_decay,
                                patience=patience, holdout=holdout).items():
            setattr(self, name, value)
        self.labels = labels
        self.id_weight = id_weight
        self.id_classes = id_classes
        self.id_optimizer = id_optimizer
        self.cmpm_weight = cmpm_weight
        self.adv_weight = adv_weight
        self.adv_target = adv_target
        self.d_hidden = d_hidden
        self.soft_labels = soft_labels
        self.flip = flip
        self.lstm_hidden = lstm_hidden
        self.finetune_layers = finetune_layers
        self.finetune_epochs = finetune_epochs
        self.finetune_lr = finetune_lr
        self.image_optimizer = image_optimizer
        self.momentum = momentum
        self.plateau_patience = plateau_patience
        self.min_lr = min_lr

    def learning_rate(self) -> float:
        """The first phase's lr: ``lr``, or with ``lr=None`` (the default) the one chosen for the text model by 3-fold
        CV on the Flickr8k sample (:data:`LR_BY_TEXT_MODEL`; 3e-3 for the others)."""
        if self.lr is not None:
            return float(self.lr)
        return LR_BY_TEXT_MODEL.get(str(self.text_model), DEFAULT_LR)

    # vsepp's parameters that timam does not have (read by the shared vsepp code)
    loss = "vsepp"
    margin = 0.2
    optimizer = "adam"
    lr_decay_epoch = 0
    lr_decay = 0.1

    @property
    def train_layers(self) -> int:        # vsepp's name for the transformer layers that are fine-tuned
        return int(self.finetune_layers) if self._uses_transformer() else 0

    # ------------------------------------------------------------------ checks
    def _uses_transformer(self) -> bool:
        return self.text_model in ("bilstm", "transformer")

    def _check_loss(self) -> None:
        pass

    def _check_params(self) -> None:
        if self.text_model not in TIMAM_TEXT_MODELS:
            raise CrossViewError(f"timam: text_model {self.text_model!r} must be one of {', '.join(TIMAM_TEXT_MODELS)}")
        if self.labels not in LABELS:
            raise CrossViewError(f"timam: labels {self.labels!r} must be auto, identity (the dataset's identities / "
                                 "classes) or image (each image its own label)")
        if self.image_optimizer not in ("sgd", "adam"):
            raise CrossViewError(f"timam: image_optimizer {self.image_optimizer!r} must be 'sgd' (the paper's, "
                                 "momentum 0.9) or 'adam'")
        if self.id_optimizer not in ID_OPTIMIZERS:
            raise CrossViewError(f"timam: id_optimizer {self.id_optimizer!r} must be one of "
                                 f"{', '.join(ID_OPTIMIZERS)}")
        if self.lr is not None and (not isinstance(self.lr, (int, float)) or isinstance(self.lr, bool)):
            raise CrossViewError(f"timam: lr must be a number > 0 or none (chosen for the text model), got {self.lr!r}")
        text_model, lr = self.text_model, self.lr
        self.lr = self.learning_rate()
        self.text_model = "transformer" if self.text_model == "bilstm" else self.text_model
        try:
            super()._check_params()
        finally:
            self.text_model, self.lr = text_model, lr
        for name in ("id_weight", "cmpm_weight", "adv_weight", "finetune_lr", "min_lr", "momentum"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise CrossViewError(f"timam: {name} must be a number >= 0, got {v!r}")
        if self.id_weight == 0 and self.cmpm_weight == 0:
            raise CrossViewError("timam: id_weight and cmpm_weight are both 0; nothing would match the modalities")
        if self.adv_target not in ("swapped", "confusion"):
            raise CrossViewError(f"timam: adv_target {self.adv_target!r} must be 'swapped' (the encoders' embeddings "
                                 "labelled as the other modality) or 'confusion' (both labelled 0.5)")
        if not isinstance(self.flip, (int, float)) or isinstance(self.flip, bool) or not 0 <= self.flip <= 1:
            raise CrossViewError(f"timam: flip must be a probability from 0 to 1, got {self.flip!r}")
        for name in ("d_hidden", "lstm_hidden"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise CrossViewError(f"timam: {name} must be a whole number >= 1, got {v!r}")
        for name in ("finetune_layers", "finetune_epochs", "plateau_patience", "id_classes"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise CrossViewError(f"timam: {name} must be a whole number >= 0, got {v!r}")

    # ------------------------------------------------------------------ the model
    def model_spec(self, train: MethodData, resume: bool) -> dict[str, Any]:
        if self._stage() == 2:                       # the second phase trains the first phase's model
            return dict(self.model_spec_)
        text_model, self.text_model = self.text_model, ("transformer" if self.text_model == "bilstm" else self.text_model)
        try:
            spec = super().model_spec(train, resume)
        finally:
            self.text_model = text_model
        ids, kind = pair_labels(train, str(self.labels))
        spec.update(n_classes=int(ids.max()) + 1 if len(ids) else 1, label_kind=kind, d_hidden=int(self.d_hidden))
        if text_model == "bilstm":
            spec.update(pool="bilstm", lstm_hidden=int(self.lstm_hidden))
        return spec

    def build_model(self, spec: dict[str, Any]) -> nn.Module:
        d = int(spec["embed_dim"])
        if spec.get("image_model") == "cnn":
            image = self._cnn({**spec})
            image.head.normalize = False
        else:
            image = FeatureImageEncoder(int(spec["image_dim"]), d, normalize=False)
        kind = spec["text_model"]
        text: nn.Module
        if kind in ("gru", "gru_glove"):
            vocab = list(spec["vocab"])
            text = GRUTextEncoder(len(vocab), int(spec["word_dim"]), d,
                                  init=self._glove_init(vocab) if kind == "gru_glove" else None, normalize=False)
        elif kind == "features":
            text = FeatureImageEncoder(int(spec["text_dim"]), d, normalize=False)
        else:    # the language model's top layers learn in the second phase only
            layers = int(spec["train_layers"]) if self._stage() == 2 else 0
            text = TransformerTextEncoder(_load_transformer_model(str(spec["transformer"])), d, train_layers=layers,
                                          normalize=False, pool=str(spec.get("pool", "mean")),
                                          lstm_hidden=int(spec.get("lstm_hidden", 512)))
        return TimamModel(image, text, int(spec["n_classes"]), d, int(spec["d_hidden"]))

    def _text_description(self) -> str:
        spec = self.model_spec_
        if spec.get("pool") == "bilstm":
            layers = int(spec.get("train_layers", 0))
            return (f"{spec.get('transformer')} token states -> Bi-LSTM ({spec.get('lstm_hidden')} a direction) -> max "
                    + (f"(its top {layers} layers fine-tuned in phase 2)" if layers and int(self.finetune_epochs)
                       else "(frozen)"))
        return super()._text_description()

    def start_message(self, train: MethodData, n_items: int, n_batches: int, device: torch.device) -> str:
        spec = self.model_spec_
        what = "identities" if spec.get("label_kind") == "identity" else "images"
        parts = [f"{w} x {n}" for w, n in ((self.id_weight, "L_I"), (self.cmpm_weight, "L_M"),
                                            (self.adv_weight, "adversarial")) if w]
        sampled = (f", the identification softmax over {int(self.id_classes):,} of them a step" if self.id_weight
                   and self._sampled_ids() else "")
        return (f"timam ({' + '.join(parts)}; labels: {spec.get('n_classes')} {what}{sampled}): {n_items} captions, "
                f"{n_batches} batches per epoch, {self.max_epochs} epochs"
                + (" with the language model frozen" if self._uses_transformer() else "")
                + (f", then {self.finetune_epochs} fine-tuning it at lr {self.finetune_lr}" if self.finetune_epochs
                   and self._uses_transformer() else "")
                + f"; text: {self._text_description()}; lr {self.learning_rate():g}"
                + ("" if self.lr is not None else f" (chosen for text_model={self.text_model})")
                + f"; {self.embed_dim}-d, device {device}{self._amp_note(device)}")

    def graph_key(self) -> tuple[Any, str]:
        if self.id_weight and self._sampled_ids():
            return None, (f"the identification softmax samples {int(self.id_classes):,} of "
                          f"{int(self.model_spec_['n_classes']):,} classes a step, updated by "
                          f"{ID_OPTIMIZERS[self.id_optimizer]}")
        return super().graph_key()

    # ------------------------------------------------------------------ the language model's token states, cached
    def plan_stages(self, n_captions: int) -> list[tuple[str, str, str, float]]:
        """The run's stages before fitting (the engine's plan): the token states of the ``n_captions`` captions
        that train and are evaluated on, when the text branch reads a transformer's token states."""
        from crossview.features.token_cache import STAGE

        if not self._uses_transformer():
            return []
        name = self._transformer_name()
        return [(STAGE, f"token states ({name})", name, float(n_captions))]

    def _token_cache(self, enc: TransformerTextEncoder) -> Any:
        """The cache of ``enc``'s frozen bottom (embeddings and its ``n_frozen`` layers) for this ``max_len``."""
        from crossview.features.text.transformer import minilm_path
        from crossview.features.token_cache import TokenCache, transformer_identity

        name = str(self.model_spec_["transformer"])
        folder = minilm_path() if name == "minilm" else name
        return TokenCache(transformer_identity(folder, name=name, max_len=int(self.max_len), layers=enc.n_frozen,
                                               computation="crossview.nn.encoders.TransformerTextEncoder.frozen_hidden/1"))

    def _compute_tokens(self, enc: TransformerTextEncoder, inputs: dict[str, torch.Tensor],
                        device: torch.device) -> Any:
        """``compute(rows)`` for :meth:`TokenCache.iter_states`: ``enc``'s frozen bottom over captions ``rows``."""
        ids, mask = inputs["ids"], inputs["mask"]
        lengths = mask.sum(1)

        def compute(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            r = torch.as_tensor(rows, dtype=torch.int64)
            w = max(int(lengths[r].max()), 1)
            with torch.no_grad():
                h = enc.frozen_hidden(ids[r, :w].to(device), mask[r, :w].to(device))
            return h.float().cpu().numpy(), lengths[r].numpy()
        return compute

    def before_training(self, train: MethodData, val: MethodData | None, model: nn.Module,
                        device: torch.device) -> Iterator[Any]:
        """The frozen bottom of the language model (all of it in the first phase) over every training and
        validation caption, from the token-state cache (:mod:`crossview.features.token_cache`): shared between
        runs, only captions never seen are encoded, with progress."""
        from crossview.features.token_cache import STAGE, caption_hash

        self._tokens = None
        enc = unwrap(model).text
        if self.model_spec_.get("text_model") != "transformer" or not isinstance(enc, TransformerTextEncoder) \
                or enc.n_frozen == 0:
            return
        captions = list(dict.fromkeys(list(train.captions) + (list(val.captions) if val is not None else [])))
        cache = self._token_cache(enc)
        inputs = self._text_inputs(captions)
        name = str(self.model_spec_["transformer"])
        label = f"token states ({name})"
        work = cache.iter_states(captions, self._compute_tokens(enc, inputs, device),
                                 lengths=inputs["mask"].sum(1).numpy(), batch_size=128)
        first = True
        while True:
            try:
                done, total = next(work)
            except StopIteration as end:
                states = end.value
                break
            if first and world()[0] == 0:
                first = False
                cached = len(captions) - total if done < total else len(captions)
                yield Log(f"{self.name}: {name} token states of {len(captions)} captions: {cached} from the cache"
                          + (f", {total} to encode" if done < total else ""), "info")
            for w in cache.warnings:
                yield Log(w, "warning")
            cache.warnings.clear()
            yield Progress(done, total, label, stage=STAGE)
        self._tokens = {"layers": enc.n_frozen, "states": states,
                        "rows": {caption_hash(c): i for i, c in enumerate(captions)}}

    def _token_rows(self, captions: list[str], layers: int) -> np.ndarray | None:
        """Rows of ``captions`` in the token states kept by :meth:`before_training` (None: not all there)."""
        from crossview.features.token_cache import caption_hash

        tok = getattr(self, "_tokens", None)
        if not tok or tok["layers"] != layers:
            return None
        rows = [tok["rows"].get(caption_hash(c)) for c in captions]
        return None if any(r is None for r in rows) else np.asarray(rows, dtype=np.int64)

    def prepare(self, train: MethodData, device: torch.device) -> None:
        super().prepare(train, device)
        tok = getattr(self, "_tokens", None)
        rows = None if tok is None else self._token_rows(list(train.captions), tok["layers"])
        if rows is not None:
            # each step reads its captions' frozen states from the packed float16 array (no padding kept)
            states = tok["states"]
            self._t["tok_states"] = torch.from_numpy(np.ascontiguousarray(states.states)).to(device)
            self._t["tok_off"] = torch.as_tensor(states.offsets[:-1][rows]).to(device)
            self._t["hidden"] = None          # not padded: vsepp's once-per-session bottom is not needed
        ids, _ = pair_labels(train, str(self.labels))
        if len(ids) and int(ids.max()) + 1 != int(self.model_spec_["n_classes"]):
            raise CrossViewError(f"timam: the training data has {int(ids.max()) + 1} labels, the model "
                                 f"{self.model_spec_['n_classes']}; train on the data the run started with")
        self._t["lab"] = torch.as_tensor(ids).to(device)

    def _text_batch(self, t: dict[str, torch.Tensor], rows: torch.Tensor,
                    rows_cpu: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if "tok_off" not in t:
            return super()._text_batch(t, rows, rows_cpu)
        host = rows.cpu().numpy() if rows_cpu is None else np.asarray(rows_cpu)
        widths = t["width_np"][host] if "width_np" in t else t["width_cpu"].numpy()[host]
        width = self._batch_width(t, widths)
        mask = t["mask"][rows, :width]
        pos = t["tok_off"][rows, None] + torch.arange(width, device=mask.device)[None, :]
        pos = torch.where(mask.bool(), pos, torch.zeros_like(pos))
        hidden = t["tok_states"][pos].float() * mask.unsqueeze(-1).float()
        return {"ids": t["ids"][rows, :width], "mask": mask, "frozen_hidden": hidden}

    def _embed_batch(self, model: nn.Module, batch: torch.Tensor, *,
                     distinct: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        t = self._t
        if self.model_spec_["text_model"] == "transformer" and "hidden" not in t:
            # the frozen part of the language model (all of it in the first phase) once per caption
            t["hidden"] = self._frozen_hidden(unwrap(model).text, t["ids"], t["mask"])
        return super()._embed_batch(model, batch, distinct=distinct)

    def training_step(self, model: nn.Module, batch: torch.Tensor,
                      generator: torch.Generator) -> dict[str, torch.Tensor]:
        """``id_weight L_I + cmpm_weight L_M + L_D + adv_weight L_G`` of a batch of captions and their images."""
        m = unwrap(model)
        im, _, s, img_ids = self._embed_batch(model, batch)
        im, s, img_ids = gather_rows(im), gather_rows(s), gather_rows(img_ids)
        lab = self._t["lab"][img_ids]
        out: dict[str, torch.Tensor] = {}
        loss = im.new_zeros(())
        if self.cmpm_weight:
            i2t, t2i = cmpm_loss(im, s, lab)
            loss = loss + float(self.cmpm_weight) * (i2t + t2i)
            out["L_M"] = (i2t + t2i).detach()
        if self.id_weight:
            weight, lab_in = self._id_classes(m, lab, generator)
            l_i = norm_softmax_id_loss(im, weight, lab_in) + norm_softmax_id_loss(s, weight, lab_in)
            loss = loss + float(self.id_weight) * l_i
            out["L_I"] = l_i.detach()
        if self.adv_weight:
            d_im, d_tx = m.disc(im.detach()), m.disc(s.detach())        # one batch per modality
            l_d = discriminator_loss(d_im, d_tx, rng=generator, soft=bool(self.soft_labels), flip=float(self.flip))
            l_g = generator_loss(_held(m.disc, im), _held(m.disc, s), target=str(self.adv_target))
            loss = loss + l_d + float(self.adv_weight) * l_g
            out["L_D"], out["L_G"] = l_d.detach(), l_g.detach()
            out["D_acc"] = discriminator_accuracy(d_im, d_tx)
        return {"loss": loss / world()[1], **out}

    def _sampled_ids(self) -> bool:
        """Whether the identification softmax runs over a sample of the classes (more than ``id_classes``)."""
        return 0 < int(self.id_classes) < int(self.model_spec_["n_classes"])

    def _id_classes(self, m: nn.Module, lab: torch.Tensor,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(class weights, labels into them)`` of a step's identification loss: every class's row and ``lab``
        itself, or (more than ``id_classes`` classes: a COCO-size set has one per training image, 113K) the rows
        of the batch's own classes and a uniform sample of the others, ``id_classes`` in all, with ``lab``
        renumbered into them (Partial FC, An et al. 2021: the softmax over a sample of the negative classes).
        The sampled rows are gathered with a sparse gradient, so the classifier's optimiser (see
        :meth:`optimizers`) updates those rows only: a step's classifier work follows ``id_classes``, not the
        number of classes."""
        if not self._sampled_ids():
            return m.classifier, lab
        n, k = int(m.classifier.shape[0]), int(self.id_classes)
        own = torch.unique(lab)                                         # sorted
        taken = torch.zeros(n, dtype=torch.bool, device=lab.device)
        taken[own] = True
        order = torch.randperm(n, generator=generator, device=generator.device).to(lab.device)
        others = order[~taken[order]][:max(0, k - own.numel())]
        idx = torch.cat([own, others])
        weight = torch.nn.functional.embedding(idx, m.classifier, sparse=True)
        return weight, torch.searchsorted(own, lab)

    def optimizers(self, model: nn.Module) -> list[torch.optim.Optimizer]:
        """SGD (momentum) for the image branch, the classifier and the discriminator, Adam for the text branch
        (the paper's split); the pretrained parts that learn (a fine-tuned CNN) at lr / 10; in the second phase
        every part at ``finetune_lr``. With a sampled identification softmax (:meth:`_id_classes`) the classifier
        has its own optimiser at the image side's lr, no weight decay, lazy (a step updates the sampled rows only):
        row-wise RMSprop (one number per row, ``id_optimizer="rowwise"``) or SparseAdam (two moments per weight)."""
        m = unwrap(model)
        sampled = self._sampled_ids()
        lr = float(self.finetune_lr) if self._stage() == 2 else self.learning_rate()
        wd = float(self.weight_decay)
        backbone = {id(p) for p in (m.image.backbone_parameters() if hasattr(m.image, "backbone_parameters") else [])}
        image = [p for p in m.image.parameters() if p.requires_grad and id(p) not in backbone]
        cnn = [p for p in m.image.parameters() if p.requires_grad and id(p) in backbone]
        image += ([] if sampled else [m.classifier]) + [p for p in m.disc.parameters()]
        groups = [{"params": image, "lr": lr}] + ([{"params": cnn, "lr": lr if self._stage() == 2 else lr / 10}]
                                                   if cnn else [])
        text = [p for p in m.text.parameters() if p.requires_grad]
        fused = all(p.is_cuda for p in text)
        first = (torch.optim.SGD(groups, lr=lr, momentum=float(self.momentum), weight_decay=wd)
                 if self.image_optimizer == "sgd" else torch.optim.Adam(groups, lr=lr, weight_decay=wd))
        out = [first, torch.optim.Adam([{"params": text, "lr": lr}], lr=lr, weight_decay=wd, fused=fused)]
        if not sampled:
            return out
        return out + [RowwiseRMSprop([m.classifier], lr=lr) if self.id_optimizer == "rowwise"
                      else torch.optim.SparseAdam([m.classifier], lr=lr)]

    def schedulers(self, optimizers: Any) -> list[Any]:
        if self._stage() == 2 or not int(self.plateau_patience):
            return []
        mode = "max" if self._has_val else "min"
        return [PlateauScheduler(o, mode=mode, factor=0.1, patience=int(self.plateau_patience),
                                 min_lr=float(self.min_lr)) for o in optimizers]

    def after_epoch(self, record: dict[str, Any]) -> list[Any]:
        """The plateau schedule: the validation rsum (or, without validation, the epoch's loss) watched."""
        live = getattr(self, "_live", None)
        if live is None:
            return []
        value = record.get("val", record.get("epoch_loss"))
        if value is None or not math.isfinite(float(value)):
            return []
        cut = None
        for s in live[1].schedulers:
            if isinstance(s, PlateauScheduler):
                cut = s.observe(float(value)) or cut
        if cut and world()[0] == 0:
            what = "validation rsum" if self._has_val else "training loss"
            return [Log(f"timam: the {what} has not improved for {self.plateau_patience} epochs; learning rate "
                        f"now {cut[0]:.1e}", "info")]
        return []

    def fit_iter(self, train: MethodData, val: MethodData | None = None, *, resume: bool = False) -> Iterator[Any]:
        self._has_val = val is not None or float(self.holdout or 0) > 0
        second = int(self.finetune_epochs) > 0 and self._uses_transformer() and int(self.finetune_layers) > 0
        stage = int(getattr(self, "stage_", 1)) if resume and getattr(self, "model_state_", None) is not None else 1
        if stage == 1:
            yield from self._train_first_stage(train, val, resume)
            if not second or not self.done_:
                return
        yield from self._train_second_stage(
            train, val, phase="language model fine-tuned",
            log=f"timam: phase 2 at step {self.step_}: the language model's top {self.finetune_layers} layers "
                f"unfrozen, the whole network fine-tuned at lr {self.finetune_lr} for {self.finetune_epochs} epochs")

    # ------------------------------------------------------------------ inference: cosine
    def embed_images(self, data: MethodData) -> np.ndarray:
        return _unit_rows(super().embed_images(data))

    def embed_texts(self, data: MethodData) -> np.ndarray:
        x = self._embed_texts_from_tokens(data)
        return _unit_rows(x if x is not None else super().embed_texts(data))

    def _embed_texts_from_tokens(self, data: MethodData) -> np.ndarray | None:
        """``(n, embed_dim)`` of ``data``'s captions over the language model's cached token states: those kept
        for this training session (the validation captions each epoch), else, for :data:`_TOKEN_CACHE_MIN` or
        more captions (an evaluation split), through the token-state cache; None when the text branch has no
        frozen transformer layers to skip, or for a few captions (a query: computed directly, nothing cached)."""
        from crossview.methods.vsepp import _EMBED_BATCH, length_batches

        spec = self.model_spec_
        if spec.get("text_model") != "transformer":
            return None
        enc = unwrap(self.model()).text
        captions = list(data.captions)
        n = len(captions)
        if not isinstance(enc, TransformerTextEncoder) or enc.n_frozen == 0 or n == 0:
            return None
        dev = self._embed_device()
        inputs = self._text_inputs(captions)
        lengths = inputs["mask"].sum(1)
        rows = self._token_rows(captions, enc.n_frozen)
        if rows is not None:
            states = self._tokens["states"]
        elif n >= _TOKEN_CACHE_MIN:
            states = self._token_cache(enc).states(captions, self._compute_tokens(enc, inputs, dev),
                                                   lengths=lengths.numpy(), batch_size=128)
            rows = np.arange(n)
        else:
            return None
        res = np.zeros((n, int(spec["embed_dim"])), np.float32)
        was = enc.training
        enc.eval()
        try:
            with torch.no_grad():
                for b in length_batches(lengths, _EMBED_BATCH):
                    w = max(int(lengths[b].max()), 1)
                    h = torch.from_numpy(states.padded(rows[b.numpy()], w)).to(dev)
                    e = enc(inputs["ids"][b, :w].to(dev), inputs["mask"][b, :w].to(dev), frozen_hidden=h)
                    res[b.numpy()] = e.float().cpu().numpy()
        finally:
            enc.train(was)
        return res


#: captions from which an evaluation reads (and fills) the token-state cache; fewer (a query) are computed directly
_TOKEN_CACHE_MIN = 64


def _unit_rows(x: np.ndarray) -> np.ndarray:
    from crossview.core.rownorm import row_norms

    n = row_norms(np.linalg.norm(x, axis=1, keepdims=True))
    return np.ascontiguousarray(np.where(n > 0, x / np.maximum(n, 1e-12), 0.0), dtype=np.float32)
