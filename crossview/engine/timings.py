"""How long each stage of a run takes on this machine: the priors of a run's stage plan.

A run says up front which stages it will go through (:class:`crossview.core.events.Plan`): image features,
the text model, caption features, a second dataset's features, fitting, evaluating. Each stage's expected
seconds are its units of work (images, captions, training images x epochs, evaluated captions) times the
seconds one unit took in this machine's earlier runs (``<cache>/timings.json``, one entry per stage, encoder
or method and device kind: an average of the last runs, updated when a stage that did work ends), or, before
any run, a built-in cost model measured on a 2-core CPU (``DEFAULTS``). Only the *relative* sizes of the
stages matter much: :class:`crossview.core.progress.RunEta` scales them by how fast this run actually goes.

The file is a cache: a damaged or foreign one is ignored (and rewritten at the next stage end), and a write
that fails is skipped. It holds numbers only and is never executed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["TimingBook", "DEFAULTS", "unit_key", "device_kind", "default_path"]

#: seconds per unit of work before this machine has run a stage (2-core CPU; a GPU divides the neural ones)
DEFAULTS: dict[str, float] = {
    # measured on the Flickr8k sample (bench/results/eta_whole_run_cpu.txt), start-up (loading the model) included
    "images": 0.013,          # one backbone, one pass, on one image (decoding included; efficientnet_lite0:
                              # bench/results/feature_throughput_cpu.txt, 73 images/s with the folded network)
    "image pass": 0.008,      # each further pass of a backbone over the decoded image (a flip's mirror)
    "captions:neural": 0.002,   # a transformer on one caption (MiniLM + GloVe: 3,500 captions in 6.4-7.8 s)
    "captions": 0.0002,       # a bag of words / word vectors / tags on one caption
    "tags": 0.0011,           # webly's nouns and verbs of one training caption (a COCO-size set's 550K: ~10 min)
    "text model": 0.0005,     # fitting TF-IDF, LDA ... per training caption
    "features": 0.05,         # a representation built from image regions (TR / CTR) per image
    "fit": 0.002,             # a method per training image (and per epoch, for those that have epochs)
    "evaluate": 0.0005,       # scoring and ranking per evaluated caption
}
_NEURAL_TEXT = ("minilm", "bert", "transformer", "sbert")
_GPU_SPEEDUP = 10.0
_KEEP = 0.5                   # weight of the newest measurement in the running average


def default_path() -> Path:
    """``<cache dir>/timings.json``."""
    from crossview.core.settings import get_settings
    return get_settings().cache_dir / "timings.json"


def device_kind(device: str | None) -> str:
    """``"cuda"`` / ``"mps"`` / ``"cpu"``: what a timing depends on (not which GPU)."""
    d = str(device or "cpu").lower()
    return "cuda" if d.startswith("cuda") else "mps" if d.startswith("mps") else "cpu"


def unit_key(stage: str, detail: str, device: str | None) -> str:
    """The book's key of ``stage`` (``"images"``, ``"fit"`` ...) done by ``detail`` (the encoder or method)."""
    return f"{stage}|{detail}|{device_kind(device)}"


def _image_cost(detail: str) -> float:
    """Seconds an image costs encoder ``detail`` (``A+B:flip``): every backbone decodes the image and runs once,
    and once more on its mirror with ``:flip`` (the Flickr8k sample's 700 photos through the default
    ``efficientnet_lite0+mobilenet_v2:flip``: 2 x (0.013 + 0.008) x 700 = 29 s, measured 30-35 s)."""
    name, _, option = detail.partition(":")
    backbones = max(1, len([b for b in name.split("+") if b]))
    return backbones * (DEFAULTS["images"] + (DEFAULTS["image pass"] if option == "flip" else 0.0))


def _default(stage: str, detail: str, device: str | None) -> float:
    if stage == "images":
        base = _image_cost(detail)
    elif stage == "tokens" or (stage == "captions" and any(n in detail.lower() for n in _NEURAL_TEXT)):
        base = DEFAULTS["captions:neural"]     # a language model's token states (timam): a transformer per caption
    else:
        base = DEFAULTS.get(stage, DEFAULTS["fit"])
    neural = stage in ("images", "features", "fit") or base == DEFAULTS["captions:neural"]
    return base / _GPU_SPEEDUP if neural and device_kind(device) != "cpu" else base


class TimingBook:
    """Seconds per unit of each stage on this machine, read from and written to ``path`` (default
    ``<cache dir>/timings.json``)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()

    def _read(self) -> dict[str, float]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return {}
        if not isinstance(raw, dict):
            return {}
        return {str(k): float(v) for k, v in raw.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0}

    def per_unit(self, stage: str, detail: str, device: str | None) -> float:
        """Seconds one unit of ``stage`` by ``detail`` takes here: measured, else the built-in default."""
        return self._read().get(unit_key(stage, detail, device), _default(stage, detail, device))

    def expect(self, stage: str, detail: str, device: str | None, units: float) -> float:
        """Expected seconds of ``units`` units of work."""
        return max(0.0, float(units)) * self.per_unit(stage, detail, device)

    def record(self, stage: str, detail: str, device: str | None, units: float, seconds: float) -> None:
        """A stage that did ``units`` units of work in ``seconds`` (pauses excluded): averaged into the book.
        Never raises: a book that cannot be written only costs the next plan's accuracy."""
        if units <= 0 or not seconds > 0 or not math.isfinite(seconds):
            return
        try:
            from filelock import FileLock

            from crossview.core.io import atomic_write_json

            self.path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(self.path) + ".lock", timeout=2):
                book = self._read()
                key = unit_key(stage, detail, device)
                new = seconds / units
                old = book.get(key)
                book[key] = new if old is None else _KEEP * new + (1 - _KEEP) * old
                atomic_write_json(self.path, dict(sorted(book.items())))
        except Exception:  # noqa: BLE001 - a cache: a read-only or locked folder is not the run's problem
            pass

    def entries(self) -> dict[str, Any]:
        """What the book holds (for tests and ``crossview runs``)."""
        return self._read()
