"""bench/vsepp_quality.py's trial cache (``--cache DIR``): a trial is trained once, read back by a later call with the
same rows, split and parameters (its result and its own training time), and trained again when any of them changes.
A toy set of random features, 2 epochs of VSE0 (seconds)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import vsepp_quality as VQ  # noqa: E402


@pytest.fixture
def toy() -> SimpleNamespace:
    rng = np.random.default_rng(0)
    n = 30
    return SimpleNamespace(image=rng.normal(size=(n, 16)).astype(np.float32),
                           text=rng.normal(size=(2 * n, 12)).astype(np.float32),
                           captions=[f"caption {i}" for i in range(2 * n)],
                           caption_image=np.repeat(np.arange(n), 2), train=np.arange(20), val=np.arange(20, 30))


PARAMS = {"loss": "vse0", "text_model": "features", "device": "cpu", "max_epochs": 2, "lr_decay_epoch": 1,
          "batch_size": 8, "embed_dim": 8, "seed": 0}


def test_a_trial_is_trained_once_and_read_back(toy, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(VQ, "CACHE", tmp_path / "trials")
    calls = []
    real = VQ._trial

    def counted(*a, **k):
        calls.append(a[3])
        return real(*a, **k)

    monkeypatch.setattr(VQ, "_trial", counted)
    first = VQ.trial(toy, toy.train, toy.val, PARAMS, select=False)
    assert len(calls) == 1 and np.isfinite(first["best"]) and first["seconds"] > 0
    assert len(list((tmp_path / "trials").glob("*.json"))) == 1
    again = VQ.trial(toy, toy.train, toy.val, dict(PARAMS), select=False)
    assert len(calls) == 1 and again == first                    # read back, its own time kept
    VQ.trial(toy, toy.train, toy.val, {**PARAMS, "seed": 1}, select=False)        # another seed: trained
    VQ.trial(toy, toy.train[:15], toy.val, PARAMS, select=False)                  # another split: trained
    toy.image = toy.image + 1                                                      # other rows: trained
    VQ.trial(toy, toy.train, toy.val, PARAMS, select=False)
    assert len(calls) == 4 and len(list((tmp_path / "trials").glob("*.json"))) == 4


def test_without_a_cache_nothing_is_kept(toy, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(VQ, "CACHE", None)
    monkeypatch.chdir(tmp_path)
    r = VQ.trial(toy, toy.train, toy.val, PARAMS, select=False)
    assert np.isfinite(r["best"]) and not any(tmp_path.iterdir())
