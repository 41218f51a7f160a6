"""The language model's token-state cache (:mod:`crossview.features.token_cache`) and TIMAM over it: states are
stored per caption text (float16, no padding) and read back equal to freshly computed ones, a second use encodes
no caption and a third only the new ones, a damaged shard is encoded again with a warning, and a TIMAM run reports
its caching as a planned ``tokens`` stage whose second run reads everything from the cache."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest
import torch

import _engine_helpers as H
from crossview.core.events import Log, Plan, Progress
from crossview.features.token_cache import STAGE, TokenCache, caption_hash

CAPTIONS = ["a dog runs on the grass", "two children play", "a man rides a red bicycle down a hill",
            "a dog runs on the grass", "snow", "people wait for the bus at night"]


def _fake_states(text: str, hidden: int = 8) -> np.ndarray:
    """What a stand-in language model gives a caption: one state per word (a pure function of the text)."""
    words = text.split()
    rng = np.random.default_rng(int(caption_hash(text)[:8], 16))
    return rng.normal(size=(len(words) + 2, hidden)).astype(np.float32) * 3


class _Model:
    def __init__(self, captions: list[str]) -> None:
        self.captions = captions
        self.calls = 0        # captions encoded

    def __call__(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        parts = [_fake_states(self.captions[i]) for i in rows]
        self.calls += len(rows)
        w = max(len(p) for p in parts)
        out = np.full((len(parts), w, parts[0].shape[1]), 99.0, np.float32)      # padding: never read
        for k, p in enumerate(parts):
            out[k, :len(p)] = p
        return out, np.array([len(p) for p in parts])


def _drain(it):
    seen = []
    while True:
        try:
            seen.append(next(it))
        except StopIteration as end:
            return end.value, seen


IDENTITY = {"kind": "test", "model": "fake", "max_len": 30, "layers": 6}


def test_round_trip_incremental_and_no_second_encoding(tmp_path) -> None:
    model = _Model(CAPTIONS)
    states, seen = _drain(TokenCache(IDENTITY, tmp_path).iter_states(CAPTIONS, model, batch_size=2))
    assert model.calls == 5, "the repeated caption is encoded once"
    assert seen[0] == (0, 5) and seen[-1] == (5, 5) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    for i, c in enumerate(CAPTIONS):
        want = _fake_states(c)
        assert states.of(i).shape == want.shape
        np.testing.assert_allclose(states.of(i).astype(np.float32), want, rtol=1e-3, atol=1e-3)
    assert states.states.dtype == np.float16, "stored compactly"
    assert states.states.shape[0] == sum(len(c.split()) + 2 for c in CAPTIONS), "no padding"
    pad = states.padded([2, 4])
    assert pad.shape == (2, 11, 8) and not pad[1, 3:].any()

    again = _Model(CAPTIONS)
    cache = TokenCache(IDENTITY, tmp_path)
    warm, seen = _drain(cache.iter_states(CAPTIONS, again))
    assert again.calls == 0 and cache.encoded == 0 and seen == [(6, 6)], "a warm cache encodes nothing"
    assert np.array_equal(warm.states, states.states) and np.array_equal(warm.offsets, states.offsets)

    more = CAPTIONS + ["a brand new caption", "and another one here"]
    inc = _Model(more)
    both, seen = _drain(TokenCache(IDENTITY, tmp_path).iter_states(more, inc))
    assert inc.calls == 2 and seen[0] == (0, 2), "only the captions never seen are encoded"
    np.testing.assert_allclose(both.of(7).astype(np.float32), _fake_states(more[7]), rtol=1e-3, atol=1e-3)
    # another identity (e.g. another max_len) shares nothing
    other = _Model(CAPTIONS)
    TokenCache({**IDENTITY, "max_len": 12}, tmp_path).states(CAPTIONS, other)
    assert other.calls == 5


def test_damaged_shard_is_encoded_again_with_a_warning(tmp_path, caplog) -> None:
    TokenCache(IDENTITY, tmp_path).states(CAPTIONS, _Model(CAPTIONS))
    npy = next(tmp_path.rglob("*.npy"))
    raw = bytearray(npy.read_bytes())
    raw[-20:] = b"\x13" * 20
    npy.write_bytes(bytes(raw))
    model = _Model(CAPTIONS)
    cache = TokenCache(IDENTITY, tmp_path)
    with caplog.at_level(logging.WARNING):
        states = cache.states(CAPTIONS, model)
    assert model.calls == 5, "the damaged shard's captions are encoded again"
    assert cache.warnings and str(npy.name) in cache.warnings[0] and "encoded again" in cache.warnings[0]
    assert any("encoded again" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(states.of(2).astype(np.float32), _fake_states(CAPTIONS[2]), rtol=1e-3, atol=1e-3)
    # and the rewritten cache is whole again
    again = _Model(CAPTIONS)
    TokenCache(IDENTITY, tmp_path).states(CAPTIONS, again)
    assert again.calls == 0


def test_stopping_keeps_the_batches_done(tmp_path) -> None:
    model = _Model(CAPTIONS)
    it = TokenCache(IDENTITY, tmp_path).iter_states(CAPTIONS, model, batch_size=2)
    assert next(it) == (0, 5) and next(it) == (2, 5)
    it.close()                                  # a run stopped between two batches
    rest = _Model(CAPTIONS)
    TokenCache(IDENTITY, tmp_path).states(CAPTIONS, rest)
    assert rest.calls == 3


# ---------------------------------------------------------------------------- TIMAM over a tiny random BERT
@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A 2-layer, 16-wide random-weight BERT with MiniLM's tokenizer, saved as a local model folder."""
    transformers = pytest.importorskip("transformers")
    from crossview.core.errors import WeightsNotFoundError
    from crossview.features.text.transformer import minilm_path

    try:
        src = minilm_path()
    except WeightsNotFoundError:
        pytest.skip("all-MiniLM-L6-v2 (its tokenizer) is not installed")
    folder = tmp_path_factory.mktemp("tiny_bert")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, folder / name)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64)
    transformers.BertModel(cfg).save_pretrained(folder)
    return folder


def _timam_params(folder) -> dict:
    return {"text_model": "bilstm", "bert_path": str(folder), "lstm_hidden": 8, "embed_dim": 16, "max_epochs": 1,
            "batch_size": 32, "plateau_patience": 0, "finetune_epochs": 0}


def test_timam_caches_token_states_once_across_runs(tmp_path, tiny_bert, monkeypatch) -> None:
    from crossview.engine.run import train
    from crossview.nn.encoders import TransformerTextEncoder

    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    calls = {"n": 0}
    real = TransformerTextEncoder.frozen_hidden

    def counting(self, ids, mask):
        calls["n"] += int(ids.shape[0])
        return real(self, ids, mask)

    monkeypatch.setattr(TransformerTextEncoder, "frozen_hidden", counting)
    ds = H.make_toy_dataset(n_images=200)   # 80 test captions: the evaluation reads the cache too
    feats = H.toy_features(ds)

    first = list(train("timam", ds, run_dir=tmp_path / "a", features=feats, device="cpu", seed=0,
                       params=_timam_params(tiny_bert)))
    plan = next(e for e in first if isinstance(e, Plan))
    names = [s["name"] for s in plan.stages]
    assert STAGE in names and names.index(STAGE) < names.index("fit"), names
    tok = [e for e in first if isinstance(e, Progress) and e.stage == STAGE]
    n_fit = tok[0].total
    assert tok[0].step == 0 and tok[-1].step == tok[-1].total == n_fit > 0 and "token states" in tok[0].message
    encoded_first = calls["n"]
    assert encoded_first >= n_fit, "the caching computed every training and validation caption"

    # the cached states are the language model's own (to float16's precision)
    from crossview.data.method_data import MethodData
    from crossview.methods import create_method

    m = create_method("timam", **_timam_params(tiny_bert))
    train_d = MethodData.from_features(ds, feats[0], feats[1], "train")
    m._fresh_state(m.model_spec(train_d, resume=False))
    enc = m.build_model(m.model_spec_).text
    caps = list(train_d.captions[:5])
    inputs = m._text_inputs(caps)
    with torch.no_grad():
        fresh = real(enc, inputs["ids"], inputs["mask"]).numpy()
    cached = m._token_cache(enc).states(caps, lambda rows: (_ for _ in ()).throw(AssertionError("encoded")))
    for i in range(5):
        n = int(inputs["mask"][i].sum())
        np.testing.assert_allclose(cached.of(i).astype(np.float32), fresh[i, :n], rtol=2e-3, atol=2e-3)

    calls["n"] = 0
    second = list(train("timam", ds, run_dir=tmp_path / "b", features=feats, device="cpu", seed=0,
                        params=_timam_params(tiny_bert)))
    assert calls["n"] == 0, "a second run encodes no caption: training, validation and evaluation read the cache"
    tok2 = [e for e in second if isinstance(e, Progress) and e.stage == STAGE]
    assert len(tok2) == 1 and tok2[0].step == tok2[0].total, "a cache hit reports only its end"
    assert any(isinstance(e, Log) and "from the cache" in e.message for e in second)
    r1, r2 = first[-1].summary["rsum"], second[-1].summary["rsum"]
    assert r1 == pytest.approx(r2, abs=1e-6), "the same seed trains the same model over cached states"
