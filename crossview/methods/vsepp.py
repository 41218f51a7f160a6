"""VSE0 / VSE++ (Faghri, Fleet, Kiros & Fidler, BMVC 2018): a visual-semantic embedding trained with a hinge
loss over the negatives of a minibatch; VSE++ keeps only the hardest negative of each query.

One 1024-d space, dot-product (cosine) scores, the one model for both directions:

- image: precomputed CNN features (the run's image encoder, the feature cache or a ``*_precomp`` folder) ->
  FC -> L2 (the paper's frozen-CNN setting);
- text (``text_model``): ``gru`` a 1-layer GRU over learned 300-d word embeddings, the state at the last real
  token (the paper's); ``gru_glove`` the same with the embeddings initialised from GloVe 6B 50-d (offline);
  ``features`` the run's caption features (by default all-MiniLM-L6-v2 sentence embeddings, frozen: the
  feature cache serves them) -> FC; ``transformer`` a local BERT-like model (MiniLM, or ``bert_path``) over
  tokens, mean-pooled -> FC, its top ``train_layers`` layers fine-tuned (the frozen bottom is run once per
  caption and cached, so an epoch runs only the top layers).

Defaults: ``loss="vse0"`` over ``text_model="features"`` (frozen MiniLM sentence embeddings) -- the best of
loss x text encoder on real photos of Flickr8k size per second of training (bench/results/vsepp_flickr8k.md,
no epoch selection: val rsum ~368 against ~346 for VSE++, ~370 for fine-tuned MiniLM at 30x the time, and
~230-270 for GRUs learned from 3,000 captions); the paper's hardest negative and GRU (``loss="vsepp",
text_model="gru"``) are for much larger training sets and the paper's 30 epochs.

The loss (:func:`crossview.nn.losses.contrastive_loss`) is summed over a batch of ``batch_size`` captions with
their images; two captions of one image in a batch are not counted as each other's negatives. Adam at the
paper's lr 2e-4 and gradient clip 2, but 10 epochs with the lr /10 after 7 (the paper: 30, /10 after 15):
on a training set of Flickr8k-sample size the paper's schedule overfits, and a run whose val split is its
evaluation split has nothing else to choose the epoch by (3-fold cross-validation on the training images:
rsum 270 at 10 epochs, 246 at 30; ``holdout`` can hold training images out instead). With a validation split
the epoch with the best validation rsum is kept. Every caption of every training image is seen once an epoch.
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from crossview.core.errors import CrossViewError
from crossview.data.method_data import MethodData
from crossview.methods import register_method
from crossview.methods.torch_method import TorchMethod
from crossview.nn.sparse_rows import SparseRows, shared_tensor
from crossview.nn.encoders import (ROW_BUCKET, BackboneImageEncoder, FeatureImageEncoder, GRUTextEncoder,
                                    TransformerTextEncoder, cycle_rows)
from crossview.nn.losses import contrastive_loss
from crossview.nn.trainer import gather_rows, unwrap, world

__all__ = ["Vsepp", "VseModel", "LOSSES", "TEXT_MODELS", "IMAGE_MODELS"]

LOSSES = ("vsepp", "vse0")
#: the image side: the run's image features -> FC (the paper's frozen CNN), or a CNN over the image files (end to end)
IMAGE_MODELS = ("features", "cnn")
#: the text side: GRU over learned words (the paper's), GRU from GloVe, the run's caption features -> FC, or a
#: local transformer over tokens (top layers fine-tuned)
TEXT_MODELS = ("gru", "gru_glove", "features", "transformer")
_EMBED_BATCH = 512

#: ``1``: end to end (image_model=cnn), VSE++'s steps on the GPU are captured as CUDA graphs too (their images
#: decoded before each step into static tensors; :meth:`Vsepp._static_images`); off by default until measured
E2E_GRAPHS_ENV = "CROSSVIEW_E2E_GRAPHS"


class VseModel(torch.nn.Module):
    """``image`` and ``text`` encoders into one L2-normalised space (see the module docstring)."""

    def __init__(self, image: torch.nn.Module, text: torch.nn.Module) -> None:
        super().__init__()
        self.image = image
        self.text = text

    def forward(self, images: torch.Tensor, rows: torch.Tensor | None = None,
                **text: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(image embeddings, text embeddings)``: ``images`` are feature rows or decoded image tensors;
        ``rows`` picks the image of each text row among them (a batch decodes each distinct image once)."""
        im = self.image(images)
        return (im if rows is None else im[rows]), self.text(**text)


class _CaptionImages:
    """Picklable ``k -> image ids of batch k`` of one epoch (for loader workers)."""

    def __init__(self, sampler: Any, caption_image: np.ndarray, epoch: int) -> None:
        self.sampler, self.caption_image, self.epoch = sampler, caption_image, int(epoch)

    def __call__(self, k: int) -> np.ndarray:
        return self.caption_image[self.sampler.batch(self.epoch, k).numpy()]


class _AugmentSeed:
    """Picklable ``k -> the augmentation seed of batch k`` (seed, rank, epoch)."""

    def __init__(self, seed: int, rank: int, epoch: int) -> None:
        self.seed, self.rank, self.epoch = seed, rank, epoch

    def __call__(self, k: int) -> int:
        from crossview.nn.trainer import step_seed

        return step_seed(self.seed, self.rank, self.epoch, k, 7) & 0xFFFFFFFF


def _load_transformer_model(path: str) -> torch.nn.Module:
    """A private copy of the local transformer at ``path`` (``"minilm"``: all-MiniLM-L6-v2 of its package)."""
    from crossview.features.text.transformer import _check_model_folder, _load_transformer, minilm_path

    folder = str(minilm_path()) if path == "minilm" else path
    _check_model_folder(Path(folder), "vsepp transformer (bert_path)")
    return copy.deepcopy(_load_transformer(folder)[1])


def length_batches(lengths: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Row indices in batches of at most ``size``, shortest sequences first (stable): a batch trimmed to its
    longest member then pads little."""
    order = torch.argsort(torch.as_tensor(lengths).cpu(), stable=True)
    return list(order.split(int(size))) if len(order) else []


def _tokenizer(path: str) -> Any:
    from crossview.features.text.transformer import _load_transformer, minilm_path

    return _load_transformer(str(minilm_path()) if path == "minilm" else path)[0]


@register_method("vsepp")
class Vsepp(TorchMethod):
    """VSE0 / VSE++ (see the module docstring). Learned attributes besides :class:`TorchMethod`'s: none; the
    vocabulary of the GRU text models lives in ``model_spec_["vocab"]``."""

    loss_is_sum = True
    nan_hint = "lower the learning rate or keep grad_clip at 2"
    #: a run's image features are signed-square-rooted and L2-normalised unless told otherwise: the setting the
    #: defaults were chosen under (bench/vsepp_quality.py); on the Flickr8k sample 1-10 rsum above none
    default_image_norm = "ssr"
    #: chosen by 3-fold CV on the Flickr8k sample's training photos (bench/results/rich_features_flickr8k.md): both
    #: backbones, flip-averaged, and MiniLM + GloVe captions, CV rsum 270.0 -> 289.7 (paired +19.7, 95% interval
    #: +9.7 to +29.2; +8.0 to +31.2 widened for the 2 variants compared); val 368.2 -> 367.4. The subclasses
    #: (smoothap, webly, timam) say their own
    default_image_encoder = "efficientnet_lite0+mobilenet_v2:flip"
    default_text_encoder = "minilm+glove"
    #: loader workers decoding images (image_model="cnn") unless the run's settings say otherwise
    default_workers = 2
    supports_amp = True

    def __init__(self, *, loss: str = "vse0", margin: float = 0.2, embed_dim: int = 1024,
                 text_model: str = "features", image_model: str = "features", backbone: str = "efficientnet_lite0",
                 finetune_cnn: bool = False, word_dim: int = 300, min_count: int = 1, max_len: int = 64,
                 bert_path: str = "", train_layers: int = 0, max_epochs: int = 10, batch_size: int = 128,
                 lr: float = 2e-4, lr_decay_epoch: int = 7, lr_decay: float = 0.1, grad_clip: float = 2.0,
                 optimizer: str = "adam", weight_decay: float = 0.0, patience: int = 10, holdout: float = 0.0) -> None:
        self.loss = loss
        self.margin = margin
        self.embed_dim = embed_dim
        self.text_model = text_model
        self.image_model = image_model
        self.backbone = backbone
        self.finetune_cnn = finetune_cnn
        self.word_dim = word_dim
        self.min_count = min_count
        self.max_len = max_len
        self.bert_path = bert_path
        self.train_layers = train_layers
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.lr_decay_epoch = lr_decay_epoch
        self.lr_decay = lr_decay
        self.grad_clip = grad_clip
        self.optimizer = optimizer
        self.weight_decay = weight_decay
        self.patience = patience
        self.holdout = holdout

    # ------------------------------------------------------------------ the text side decides what the run extracts
    @property
    def needs_text_features(self) -> bool:   # type: ignore[override]
        """Only ``text_model="features"`` reads the run's caption features; the others read the captions."""
        return self.text_model == "features"

    @property
    def wants_image_files(self) -> bool:
        """``image_model="cnn"`` trains on the image files (the engine then hands them over with the features)."""
        return self.image_model == "cnn"

    # ------------------------------------------------------------------ checks
    def _check_loss(self) -> None:
        if self.loss not in LOSSES:
            raise CrossViewError(f"vsepp: loss {self.loss!r} must be 'vsepp' (hardest negative) or 'vse0' (sum)")

    def _check_params(self) -> None:
        self._check_loss()
        if self.image_model not in IMAGE_MODELS:
            raise CrossViewError(f"{self.name}: image_model {self.image_model!r} must be 'features' (the run's image "
                                 "features) or 'cnn' (end to end on the image files)")
        if self.text_model not in TEXT_MODELS:
            raise CrossViewError(f"{self.name}: text_model {self.text_model!r} must be one of {', '.join(TEXT_MODELS)}")
        if self.optimizer not in ("adam", "sgd"):
            raise CrossViewError(f"{self.name}: optimizer {self.optimizer!r} must be 'adam' (the paper's) or 'sgd'")
        for name in ("embed_dim", "word_dim", "min_count", "batch_size", "max_epochs", "log_every"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise CrossViewError(f"{self.name}: {name} must be a whole number >= 1, got {v!r}")
        if not isinstance(self.max_len, (int, np.integer)) or self.max_len < 3:
            raise CrossViewError(f"{self.name}: max_len must be a whole number >= 3 (tokens per caption), got {self.max_len!r}")
        for name in ("patience", "lr_decay_epoch", "train_layers", "workers"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise CrossViewError(f"{self.name}: {name} must be a whole number >= 0, got {v!r}")
        for name in ("lr", "margin", "lr_decay"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise CrossViewError(f"{self.name}: {name} must be a positive number, got {v!r}")
        if (not isinstance(self.holdout, (int, float)) or isinstance(self.holdout, bool)
                or not 0 <= self.holdout <= 0.5):
            raise CrossViewError(f"{self.name}: holdout must be a fraction from 0 to 0.5 (0 = keep the last epoch when "
                                 f"there is no validation split), got {self.holdout!r}")
        if self.grad_clip is not None and (not isinstance(self.grad_clip, (int, float)) or self.grad_clip < 0):
            raise CrossViewError(f"{self.name}: grad_clip must be >= 0 (0 = no clipping), got {self.grad_clip!r}")
        if self.bert_path and self.text_model != "transformer":
            raise CrossViewError(f"{self.name}: bert_path is only read with text_model=transformer")

    # ------------------------------------------------------------------ the model
    def _transformer_name(self) -> str:
        return str(self.bert_path) if self.bert_path else "minilm"

    def model_spec(self, train: MethodData, resume: bool) -> dict[str, Any]:
        self._check_params()
        if train.n_images < 2:
            raise CrossViewError(f"{self.name} needs captions of at least 2 training images (the loss ranks negatives)")
        spec: dict[str, Any] = {"embed_dim": int(self.embed_dim), "text_model": self.text_model}
        if self.image_model == "cnn":
            if train.image_paths is None:
                raise CrossViewError(f"{self.name} image_model=cnn trains on the image files, but the training data has "
                                     "feature rows only (a precomputed-features dataset); use image_model=features")
            from crossview.features.image import backbone_spec

            spec.update(image_model="cnn", backbone=str(self.backbone), finetune=bool(self.finetune_cnn),
                        feat_dim=int(backbone_spec(str(self.backbone)).dim))
        else:
            spec["image_dim"] = int(train.require_image_features(self.name).shape[1])
        if self.text_model in ("gru", "gru_glove"):
            from crossview.features.vocab import Vocabulary

            if resume and getattr(self, "model_spec_", None) and self.model_spec_.get("vocab"):
                vocab = list(self.model_spec_["vocab"])
            else:
                vocab = Vocabulary.from_captions(train.captions, min_count=int(self.min_count)).words
            word_dim = int(self.word_dim)
            if self.text_model == "gru_glove":
                from crossview.features.text.glove import _glove_tables

                word_dim = int(_glove_tables()[0].shape[1])
            spec.update(vocab=vocab, word_dim=word_dim)
        elif self.text_model == "features":
            spec["text_dim"] = int(train.require_text_features(self.name, sparse=True).shape[1])
        else:
            spec.update(transformer=self._transformer_name(), train_layers=int(self.train_layers))
        return spec

    def _glove_init(self, vocab: list[str]) -> np.ndarray:
        """GloVe vectors of the vocabulary's words; words GloVe lacks (and the special tokens) keep the
        paper's uniform(-0.1, 0.1) draw."""
        from crossview.features.text.glove import _glove_tables

        emb, index, _ = _glove_tables()
        rng = np.random.default_rng(int(self.seed))
        out = rng.uniform(-0.1, 0.1, size=(len(vocab), emb.shape[1])).astype(np.float32)
        rows = [(i, index[w]) for i, w in enumerate(vocab) if w in index]
        if rows:
            mine, theirs = zip(*rows)
            out[list(mine)] = np.asarray(emb[np.asarray(theirs)], dtype=np.float32)
        out[0] = 0.0                                      # <pad>
        return out

    def build_model(self, spec: dict[str, Any]) -> torch.nn.Module:
        d = int(spec["embed_dim"])
        image = self._cnn(spec) if spec.get("image_model") == "cnn" else FeatureImageEncoder(int(spec["image_dim"]), d)
        kind = spec["text_model"]
        text: torch.nn.Module
        if kind in ("gru", "gru_glove"):
            vocab = list(spec["vocab"])
            init = self._glove_init(vocab) if kind == "gru_glove" else None
            text = GRUTextEncoder(len(vocab), int(spec["word_dim"]), d, init=init)
        elif kind == "features":
            text = FeatureImageEncoder(int(spec["text_dim"]), d)
        else:
            text = TransformerTextEncoder(_load_transformer_model(str(spec["transformer"])), d,
                                          train_layers=int(spec["train_layers"]))
        return VseModel(image, text)

    @staticmethod
    def _cnn(spec: dict[str, Any]) -> torch.nn.Module:
        """The backbone from its local weights (never downloaded) -> FC -> L2."""
        from crossview.features.image import create_image_encoder

        mods = create_image_encoder(str(spec["backbone"])).load()
        body = torch.nn.Sequential(copy.deepcopy(mods["body"]), copy.deepcopy(mods["head"]))
        return BackboneImageEncoder(body, int(spec["feat_dim"]), int(spec["embed_dim"]),
                                    finetune=bool(spec["finetune"]))

    def _transforms(self) -> tuple[Any, Any]:
        """``(train, eval)`` image transforms of the backbone: the paper's random resized crop and flip for
        training, the encoder's own resize + centre crop otherwise; its normalisation in both."""
        from torchvision import transforms as T

        from crossview.features.image import backbone_spec, create_image_encoder

        bs = backbone_spec(str(self.model_spec_["backbone"]))
        train = T.Compose([T.RandomResizedCrop(bs.crop), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(bs.mean, bs.std)])
        return train, create_image_encoder(str(self.model_spec_["backbone"])).make_transform()

    # ------------------------------------------------------------------ text inputs
    def _text_inputs(self, captions: list[str]) -> dict[str, torch.Tensor]:
        """What the text encoder reads for ``captions``: ids + lengths (GRU) or ids + mask (transformer)."""
        spec = self.model_spec_
        if spec["text_model"] in ("gru", "gru_glove"):
            from crossview.features.vocab import Vocabulary

            vocab = getattr(self, "_vocab", None)
            if vocab is None or vocab.words != list(spec["vocab"]):
                vocab = Vocabulary(list(spec["vocab"])[4:])
                self._vocab = vocab
            # trimmed to the longest caption: every batch is cut to its own longest anyway (_text_batch,
            # embed_texts), and the padding past it was 3/4 of the table at COCO size (issue 34)
            ids, lengths = vocab.encode_batch(captions, max_len=int(self.max_len), trim=True)
            return {"ids": torch.as_tensor(ids), "lengths": torch.as_tensor(lengths)}
        tok = _tokenizer(str(spec["transformer"]))
        enc = tok(list(captions), padding=True, truncation=True, max_length=int(self.max_len), return_tensors="pt")
        return {"ids": enc["input_ids"].to(torch.int64), "mask": enc["attention_mask"].to(torch.int64)}

    def _text_batch(self, t: dict[str, torch.Tensor], rows: torch.Tensor,
                    rows_cpu: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The text encoder's keyword inputs for training rows ``rows`` of the prepared tensors ``t`` (token
        tensors trimmed to the batch's longest caption, found from the host-side copy of the lengths, so
        that no step waits on the device for it)."""
        kind = self.model_spec_["text_model"]
        if kind == "features":
            return {"x": t["txt"][rows]}
        host = rows.cpu().numpy() if rows_cpu is None else np.asarray(rows_cpu)
        widths = t["width_np"][host] if "width_np" in t else t["width_cpu"].numpy()[host]
        width = self._batch_width(t, widths)
        if kind in ("gru", "gru_glove"):
            # eager: the lengths stay on the host (packing reads them there); captured in a CUDA graph: on the
            # device, gathered from the batch's ids like everything else the graph reads (the GRU runs padded)
            lengths = t["lengths"][rows] if self._graphing and "lengths" in t else torch.from_numpy(widths)
            return {"ids": t["ids"][rows, :width], "lengths": lengths}
        hidden = t.get("hidden")
        return {"ids": t["ids"][rows, :width], "mask": t["mask"][rows, :width],
                "frozen_hidden": None if hidden is None else hidden[rows, :width]}

    #: under CUDA graphs a batch's captions are cut to their longest rounded up to a multiple of this many tokens:
    #: a few fixed widths (one captured graph each) for a little padding, which a one-way GRU's state and a masked
    #: mean never read
    GRAPH_WIDTH_STEP = 4
    _graphing = False      #: set while a trainer captures this method's steps (see crossview.nn.trainer)

    def _batch_width(self, t: dict[str, Any], widths: np.ndarray) -> int:
        """The token width of a batch whose captions have ``widths`` tokens: the longest (at least 1), rounded up
        to a multiple of :attr:`GRAPH_WIDTH_STEP` (within the padded tensor's width) while steps are captured."""
        width = max(int(widths.max()) if len(widths) else 1, 1)
        if self._graphing:
            step = self.GRAPH_WIDTH_STEP
            width = min(-(-width // step) * step, int(t["ids"].shape[1]))
        return width

    def _graph_width_tables(self) -> list[dict[str, Any]]:
        """The token tables whose batch widths shape a step (the captions'; webly adds its tag sentences')."""
        return [self._t] if self.model_spec_["text_model"] != "features" else []

    def _e2e_graph_off(self) -> str:
        """Why a step on decoded images (``image_model=cnn``) is not captured ('' when it may be): only with
        ``$CROSSVIEW_E2E_GRAPHS=1`` (off by default until measured on a GPU) and VSE++'s own step, which reads one
        image row per caption (SmoothAP's ranks each distinct image, TIMAM and webly have steps of their own)."""
        if os.environ.get(E2E_GRAPHS_ENV, "") != "1":
            return (f"the images are decoded and augmented per batch (image_model=cnn; {E2E_GRAPHS_ENV}=1 captures the "
                    "step on them, not yet measured on a GPU)")
        if type(self).training_step is not Vsepp.training_step:
            return "the images are decoded per batch and this method's step encodes each distinct image once"
        return ""

    def before_step_hook(self) -> Any:
        """End to end with captured steps (:meth:`_e2e_graph_off`): decode and augment the step's images before
        it, into the static tensors the captured step reads (:meth:`_static_images`)."""
        if "img" in self._t or self._e2e_graph_off():
            return None
        self._static = {}
        return self._static_images

    def _static_images(self, batch: torch.Tensor) -> None:
        """Before a step (outside the graph): the batch's decoded images, topped up with copies of its own to a
        multiple of ``ROW_BUCKET`` rows (a few fixed shapes; the copies are in no caption's row, so no loss reads
        them), and the caption -> image rows, copied into tensors kept per shape, which :meth:`_batch_images`
        hands the step (eager or captured: a captured step reads the same tensors at every replay)."""
        self._static_now = None
        if not self._graphing:
            return
        images, rows = self._decode_batch_images(batch)
        images = cycle_rows(images, ROW_BUCKET)
        key = (tuple(images.shape), int(rows.shape[0]))
        bufs = self._static.get(key)
        if bufs is None:
            bufs = (torch.empty(images.shape, dtype=images.dtype, device=images.device),
                    torch.empty(rows.shape, dtype=rows.dtype, device=images.device))
            self._static[key] = bufs
        bufs[0].copy_(images)
        bufs[1].copy_(rows)
        self._static_now = bufs

    def graph_key(self) -> tuple[Any, str]:
        """CUDA graphs (crossview.nn.trainer): a step on feature rows is fixed by the batch's size and its captions'
        width bucket; end-to-end images (decoded per batch) add the batch's distinct images rounded up to a multiple
        of ``ROW_BUCKET`` (only when :meth:`_e2e_graph_off` allows); the Bi-LSTM pool (packing reads the lengths
        on the host) runs eagerly."""
        e2e_rows = None
        if "img" not in self._t:
            why = self._e2e_graph_off()
            if why:
                return None, why
            caption_image = self._files[2]

            def e2e_rows(host: np.ndarray) -> int:
                return -(-len(np.unique(caption_image[host])) // ROW_BUCKET) * ROW_BUCKET
        if isinstance(self._t.get("txt"), SparseRows):
            return None, "the caption features are sparse (TF-IDF): a batch's rows are densified at a size read " \
                         "on the host"
        if self.model_spec_["text_model"] == "transformer" and str(self.model_spec_.get("pool", "mean")) == "bilstm":
            return None, "the Bi-LSTM pool packs captions by lengths read on the host"
        tables = self._graph_width_tables()

        def key(host: np.ndarray) -> tuple[int, ...]:
            was, self._graphing = self._graphing, True
            try:
                widths = tuple(self._batch_width(t, t["width_np"][host]) for t in tables)
            finally:
                self._graphing = was
            return widths if e2e_rows is None else (*widths, e2e_rows(host))
        return key, ""

    # ------------------------------------------------------------------ training
    def _text_description(self) -> str:
        spec = self.model_spec_
        return {"gru": f"GRU over learned {spec.get('word_dim')}-d words ({len(spec.get('vocab', []))} ids)",
                "gru_glove": f"GRU over GloVe-initialised words ({len(spec.get('vocab', []))} ids)",
                "features": f"the run's {spec.get('text_dim')}-d caption features",
                "transformer": f"transformer {spec.get('transformer')} "
                               + (f"(top {spec.get('train_layers')} layers fine-tuned)" if spec.get("train_layers")
                                  else "(frozen)")}[spec["text_model"]]

    def start_message(self, train: MethodData, n_items: int, n_batches: int, device: torch.device) -> str:
        return (f"vsepp ({'VSE++ hardest negative' if self.loss == 'vsepp' else 'VSE0 sum of negatives'}, "
                f"margin {self.margin}): {n_items} captions, {n_batches} batches per epoch, "
                f"text: {self._text_description()}, {self.embed_dim}-d, device {device}{self._amp_note(device)}"
                f"{self._image_path_note()}")

    def _amp_note(self, device: torch.device) -> str:
        from crossview.nn.trainer import amp_dtype

        if not self.amp:
            return ""
        dtype = amp_dtype(device)
        return f", mixed precision {str(dtype).replace('torch.', '')}" if dtype is not None else \
            " (amp ignored: this device has no fast half-precision arithmetic)"

    def prepare(self, train: MethodData, device: torch.device) -> None:
        t: dict[str, Any] = {"ci": torch.as_tensor(train.caption_image, dtype=torch.int64).to(device)}
        if self.model_spec_.get("image_model") == "cnn":
            self._set_image_files(list(train.image_paths or []), train.caption_image, device)
        else:
            # a split can be a read-only view of the run's features (data.take_rows): shared, not copied (batches
            # are gathered from it; on a GPU .to() makes the one copy there)
            t["img"] = shared_tensor(np.asarray(train.require_image_features(self.name), np.float32)).to(device)
        kind = self.model_spec_["text_model"]
        if kind == "features":
            text = train.require_text_features(self.name, sparse=True)
            # sparse caption features (TF-IDF) stay sparse: a batch densifies its own rows (a COCO-size set's dense
            # 500-word TF-IDF was 1.2 GB, issue 34); dense ones are shared, not copied
            t["txt"] = (SparseRows.from_csr(text, None, "none", device) if hasattr(text, "tocsr") else
                        shared_tensor(np.asarray(text, np.float32)).to(device))
        else:
            inputs = self._text_inputs(train.captions)
            # tokens per caption, on the host: each batch is trimmed to its longest caption without a sync
            t["width_cpu"] = (inputs["lengths"] if "lengths" in inputs else inputs["mask"].sum(1)).cpu()
            t["width_np"] = t["width_cpu"].numpy()
            t.update({k: v.to(device) for k, v in inputs.items()})
        self._t = t

    def _frozen_hidden(self, enc: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """The frozen bottom's hidden states of every training caption, computed once (None when too large to
        keep: above ~2 GB the top layers run from the tokens each step). Captions go through in batches of
        similar length, each trimmed to its longest (half the work of padding every batch to the longest
        caption of all, on captions like Flickr's)."""
        n, width = ids.shape
        lengths = mask.sum(1).cpu()
        batches = length_batches(lengths, 256)
        with torch.no_grad():
            out = None
            for rows in batches:
                w = int(lengths[rows].max())
                r = rows.to(ids.device)
                h = enc.frozen_hidden(ids[r, :w], mask[r, :w])
                if out is None:
                    if n * width * h.shape[-1] * h.element_size() > (2 << 30):
                        return None
                    out = h.new_zeros((n, width, h.shape[-1]))
                out[r, :w] = h
        return out if out is not None else torch.zeros((0, width, 1))

    def _set_image_files(self, paths: list[str], caption_image: np.ndarray, device: torch.device) -> None:
        """End to end: the training images' files, and which path decodes them: on the GPU (the JPEGs by
        nvJPEG, augmented on the device; :mod:`crossview.nn.device_images`) when the device is CUDA and the
        files are JPEGs, else loader workers on the CPU. :attr:`_image_note` says which, for the run's log."""
        from crossview.nn import device_images

        transform = self._transforms()[0]
        self._files = (paths, transform, np.asarray(caption_image).copy())
        self._prefetch = None
        self._device_images = None
        n_jpeg = sum(1 for p in paths if str(p).lower().endswith((".jpg", ".jpeg")))
        if n_jpeg and device_images.device_decode_available(device):
            try:
                self._device_images = device_images.DeviceImageBatches(paths, transform, device,
                                                                       workers=int(self.workers))
            except ValueError:      # a transform the device code does not do: the loader path applies it
                self._device_images = None
        if self._device_images is not None:
            other = len(paths) - n_jpeg
            dib = self._device_images
            ahead = (", each batch's decoded in a thread while the step before runs" if dib.decode_ahead else "")
            if dib.cpu_share:
                ahead += (f", {dib.cpu_share:.0%} of each batch's images decoded and cropped by {dib.workers} "
                          "worker processes on the CPU meanwhile")
            self._image_note = (f", images: JPEGs decoded on the device ({device}, torchvision decode_jpeg{ahead}) "
                                "and augmented there" + (f"; {other} other files decoded on the CPU one by one"
                                                         if other else ""))
        else:
            why = "not a CUDA device" if device.type != "cuda" else ("no JPEG files" if not n_jpeg else
                                                                     "no device JPEG decoder or transform")
            self._image_note = (f", images: decoded and augmented on the CPU by {int(self.workers)} loader "
                                f"workers ({why})")

    def _image_path_note(self) -> str:
        """For the start message: which path decodes the training images (empty without image files)."""
        return getattr(self, "_image_note", "") if self.model_spec_.get("image_model") == "cnn" else ""

    def _batch_images(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoded (augmented) images of the batch the trainer is at, decoded on the device
        (:meth:`_set_image_files`) or by loader workers that decode the batches of the epoch ahead; ``rows``
        maps the batch's captions onto them. Either way the augmentation of a batch is drawn from the same
        seed, in the same order."""
        static = getattr(self, "_static_now", None)
        if static is not None:           # decoded before the step, into the tensors a captured step reads
            return static
        return self._decode_batch_images(batch)

    def _decode_batch_images(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_batch_images`'s decoding: on the device or by the loader workers."""
        from crossview.nn.images import BatchImages, batch_image_loader

        trainer = self._live[1]
        epoch, pos = trainer.epoch, trainer.batch_pos
        on_device = getattr(self, "_device_images", None)
        if on_device is not None:
            caption_images = _CaptionImages(trainer.sampler, self._files[2], epoch)
            seeds = _AugmentSeed(int(self.seed), world()[0], epoch)
            images, rows = on_device.batch(caption_images(pos), seeds(pos))
            if pos + 1 < len(trainer.sampler):       # the next batch's files are read while this one trains
                on_device.read_ahead(caption_images(pos + 1), seeds(pos + 1))
            if len(rows) != len(batch):
                raise CrossViewError(f"{self.name}: image batch out of step (batch {pos})")
            return images, rows
        pre = getattr(self, "_prefetch", None)
        if pre is None or pre[0] != (epoch, pos):
            paths, transform, ci = self._files
            rank = world()[0]
            ds = BatchImages(paths, transform, _CaptionImages(trainer.sampler, ci, epoch),
                             _AugmentSeed(int(self.seed), rank, epoch), pos, len(trainer.sampler))
            pre = [(epoch, pos), iter(batch_image_loader(ds, int(self.workers)))]
        k, images, rows = next(pre[1])
        if k != pos or len(rows) != len(batch):   # cannot happen unless the sampler changed under the loader
            raise CrossViewError(f"{self.name}: image loader out of step (batch {k}, expected {pos})")
        pre[0] = (epoch, pos + 1)
        self._prefetch = pre
        dev = self._t["ci"].device
        return images.to(dev, non_blocking=True), rows

    def end_training(self) -> None:
        self._prefetch = None          # its worker processes exit with the iterator
        self._static, self._static_now = {}, None
        if getattr(self, "_device_images", None) is not None:
            self._device_images.close()
        self._device_images = None
        super().end_training()

    def _live_model(self) -> torch.nn.Module | None:
        live = getattr(self, "_live", None)
        return None if live is None else live[0]

    def optimizers(self, model: torch.nn.Module) -> list[torch.optim.Optimizer]:
        """Adam (the paper's) or SGD; the pretrained parts that are fine-tuned (CNN, transformer layers) learn at
        lr / 10."""
        m = unwrap(model)
        pretrained = []
        if hasattr(m.image, "backbone_parameters"):
            pretrained += list(m.image.backbone_parameters())
        if hasattr(m.text, "transformer_parameters"):
            pretrained += list(m.text.transformer_parameters())
        ids = {id(p) for p in pretrained}
        head = [p for p in m.parameters() if p.requires_grad and id(p) not in ids]
        body = [p for p in pretrained if p.requires_grad]
        groups = [{"params": head, "lr": float(self.lr)}]
        if body:
            groups.append({"params": body, "lr": float(self.lr) / 10})
        if self.optimizer == "sgd":
            return [torch.optim.SGD(groups, lr=float(self.lr), momentum=0.9, weight_decay=float(self.weight_decay))]
        # on a GPU the fused kernel updates every parameter in a few launches (the same Adam)
        fused = all(p.is_cuda for g in groups for p in g["params"])
        return [torch.optim.Adam(groups, lr=float(self.lr), weight_decay=float(self.weight_decay), fused=fused)]

    def _embed_batch(self, model: torch.nn.Module, batch: torch.Tensor, *,
                     distinct: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(image embeddings, their image ids, caption embeddings, the captions' image ids)`` of the training
        captions ``batch``: one image row per caption, or with ``distinct`` one per distinct image (each image
        encoded once: the ranking losses' B images x all their captions)."""
        t = self._t
        if self.model_spec_["text_model"] == "transformer" and int(self.model_spec_["train_layers"]) > 0 \
                and "hidden" not in t:      # once per training session: the frozen bottom of every caption
            t["hidden"] = self._frozen_hidden(unwrap(model).text, t["ids"], t["mask"])
        img_ids = t["ci"][batch]
        trainer = self._live[1] if getattr(self, "_live", None) is not None else None
        host = trainer.batch_host if trainer is not None else None
        text = self._text_batch(t, batch, host if host is not None and len(host) == len(batch) else None)
        if "img" in t:
            if distinct:
                # the batch's images, sorted: from the trainer's plan (on the device since the epoch began) when
                # the batch is the trainer's whole batch; torch.unique waits for the device (its size is data)
                units = trainer.batch_units if trainer is not None and world()[1] == 1 else None
                uniq = units if units is not None and host is not None and len(host) == len(batch) \
                    else torch.unique(img_ids)
                im, s = model(t["img"][uniq], **text)
                return im, uniq, s, img_ids
            im, s = model(t["img"][img_ids], **text)
            return im, img_ids, s, img_ids
        images, rows = self._batch_images(batch)      # the batch's distinct images, rows: caption -> image
        rows = rows.to(img_ids.device)
        if distinct:
            im, s = model(images, **text)
            ids = torch.zeros(len(im), dtype=img_ids.dtype, device=img_ids.device).scatter_(0, rows, img_ids)
            return im, ids, s, img_ids
        im, s = model(images, rows, **text)
        return im, img_ids, s, img_ids

    def training_step(self, model: torch.nn.Module, batch: torch.Tensor,
                      generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The summed VSE0 / VSE++ loss of a batch of captions and their images."""
        im, _, s, img_ids = self._embed_batch(model, batch)
        # under torchrun the loss ranks the global batch (every process's rows), as one process would
        im, s, img_ids = gather_rows(im), gather_rows(s), gather_rows(img_ids)
        i2t, t2i = contrastive_loss(im, s, margin=float(self.margin), hardest=self.loss == "vsepp",
                                    image_ids=img_ids)
        b = max(1, int(img_ids.numel()))
        world_size = world()[1]
        return {"loss": (i2t + t2i) / world_size, "i2t": i2t.detach() / b, "t2i": t2i.detach() / b}

    # ------------------------------------------------------------------ inference
    def _embed_device(self) -> torch.device:
        model = self._live_model()
        if model is not None:
            return next(model.parameters()).device
        return torch.device("cpu")

    def embed_images(self, data: MethodData) -> np.ndarray:
        if self.model_spec_.get("image_model") == "cnn":
            if data.meta.get("pooled_backbone"):      # rows of the CNN's pooled conv map (crossview.explain)
                return self._embed_pooled(data.require_image_features(self.name))
            return self._embed_image_files(data)
        x = data.require_image_features(self.name)
        want = int(self.model_spec_["image_dim"])
        if x.shape[1] != want:
            raise CrossViewError(f"{self.name}: the model expects {want}-d image features, the {data.name or 'given'} "
                                 f"data has {x.shape[1]}-d; use the image encoder it was trained with")
        enc = unwrap(self.model()).image
        dev = self._embed_device()
        out = _Rows(len(x), int(self.model_spec_["embed_dim"]))
        was = enc.training
        enc.eval()
        try:
            with torch.no_grad():
                for a in range(0, len(x), _EMBED_BATCH):
                    out.put(a, enc(torch.as_tensor(x[a:a + _EMBED_BATCH]).to(dev)).float().cpu().numpy())
        finally:
            enc.train(was)
        return out.rows

    def explain_backbone(self) -> tuple[torch.nn.Module, torch.nn.Module, Any, str] | None:
        """``(body, pool, transform, backbone name)`` of an end-to-end model (``image_model=cnn``): its own CNN
        (fine-tuned or not) up to the last conv map, the pooling after it, and the eval image transform; the
        embedding of pooled rows is :meth:`embed_images` on data with ``meta["pooled_backbone"]``. ``None`` for
        a model on feature rows (their backbone is the run's frozen encoder)."""
        if self.model_spec_.get("image_model") != "cnn":
            return None
        enc = unwrap(self.model()).image
        body, pool = enc.backbone[0], enc.backbone[1]
        return body, pool, self._transforms()[1], str(self.model_spec_["backbone"])

    def _embed_pooled(self, x: np.ndarray) -> np.ndarray:
        enc = unwrap(self.model()).image
        dev = self._embed_device()
        was = enc.training
        enc.eval()
        try:
            with torch.no_grad():
                out = [enc.head(torch.as_tensor(x[a:a + _EMBED_BATCH]).to(dev)).float().cpu().numpy()
                       for a in range(0, len(x), _EMBED_BATCH)]
        finally:
            enc.train(was)
        return np.concatenate(out) if out else np.zeros((0, int(self.model_spec_["embed_dim"])), np.float32)

    def _embed_image_files(self, data: MethodData) -> np.ndarray:
        from crossview.nn.images import files_loader

        if data.image_paths is None:
            raise CrossViewError(f"{self.name}: this model encodes image files (image_model=cnn) but the "
                                 f"{data.name or 'given'} data has feature rows only")
        enc = unwrap(self.model()).image
        dev = self._embed_device()
        workers = int(self.workers) if len(data.image_paths) > 64 else 0
        loader = files_loader(data.image_paths, self._transforms()[1], 64, workers=workers,
                              pin_memory=dev.type == "cuda")
        out = []
        was = enc.training
        enc.eval()
        try:
            with torch.no_grad():
                for images, _ in loader:
                    out.append(enc(images.to(dev, non_blocking=True)).float().cpu().numpy())
        finally:
            enc.train(was)
        return np.concatenate(out) if out else np.zeros((0, int(self.model_spec_["embed_dim"])), np.float32)

    def embed_texts(self, data: MethodData) -> np.ndarray:
        spec = self.model_spec_
        model = self.model()
        enc = unwrap(model).text
        dev = self._embed_device()
        n = data.n_captions
        out = _Rows(n, int(spec["embed_dim"]))
        was = enc.training
        enc.eval()
        try:
            with torch.no_grad():
                if spec["text_model"] == "features":
                    y = data.require_text_features(self.name, sparse=True)    # sparse: densified a batch at a time
                    if y.shape[1] != int(spec["text_dim"]):
                        raise CrossViewError(f"{self.name}: the model expects {spec['text_dim']}-d caption features, "
                                             f"the {data.name or 'given'} data has {y.shape[1]}-d; use the text "
                                             "encoder it was trained with")
                    for a in range(0, n, _EMBED_BATCH):
                        x = y[a:a + _EMBED_BATCH]
                        x = np.asarray(x.toarray() if hasattr(x, "toarray") else x, np.float32)
                        out.put(a, enc(torch.as_tensor(x).to(dev)).float().cpu().numpy())
                else:                     # batches of similar length, each trimmed to its longest caption
                    res = np.zeros((n, int(spec["embed_dim"])), np.float32)
                    if not n:
                        return res
                    inputs = self._text_inputs(list(data.captions))
                    lengths = inputs["lengths"] if "lengths" in inputs else inputs["mask"].sum(1)
                    for rows in length_batches(lengths, _EMBED_BATCH):
                        width = max(int(lengths[rows].max()), 1)
                        t = {k: v[rows].to(dev) for k, v in inputs.items()}
                        if spec["text_model"] == "transformer":
                            e = enc(t["ids"][:, :width], t["mask"][:, :width])
                        else:
                            e = enc(t["ids"][:, :width], t["lengths"])
                        res[rows.numpy()] = e.float().cpu().numpy()
                    return res
        finally:
            enc.train(was)
        return out.rows


class _Rows:
    """The ``(n, width)`` float32 embeddings of ``n`` rows, filled a batch at a time into one array (a list of batches
    joined at the end held them twice: 0.1 GB more for a 25K-caption split's 1,024-d embeddings, issue 34); the width
    is the first batch's."""

    def __init__(self, n: int, width: int) -> None:
        self.n, self.width, self._rows = int(n), int(width), None

    def put(self, start: int, batch: np.ndarray) -> None:
        if self._rows is None:
            self._rows = np.empty((self.n, batch.shape[1]), np.float32)
        self._rows[start:start + len(batch)] = batch

    @property
    def rows(self) -> np.ndarray:
        return self._rows if self._rows is not None else np.zeros((self.n, self.width), np.float32)
