"""A lone UTF-16 surrogate in a dataset (``"\\ud83d"`` in a JSON file, half an emoji) crashes nothing
(issue 31, item 2): captions are repaired (U+FFFD) and the dataset says how many; hashes and keys take any
text; the CLI prints what the terminal cannot take as a backslash escape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crossview.core.hashing import repair_text, utf8_bytes
from crossview.data.dataset import PairedDataset, TextCorpus

ROOT = Path(__file__).resolve().parents[1]


def test_repair_text():
    assert repair_text("a \ud83d dog") == ("a \ufffd dog", 1)
    assert repair_text("\udc80x\ud800") == ("\ufffdx\ufffd", 2)
    assert repair_text("x\ud83d\ude00y") == ("x\U0001f600y", 0)     # a pair is one character, not an error
    assert repair_text("plain \ufffd") == ("plain \ufffd", 0)


def test_utf8_bytes_keeps_old_keys_and_takes_any_surrogate():
    assert utf8_bytes("caf\xe9") == "caf\xe9".encode()
    assert utf8_bytes("x\udcff") == b"x\xff"              # a file name's undecodable byte, as before
    assert utf8_bytes("x\ud83d") == b"x\xed\xa0\xbd"


def _dataset(captions):
    n = len(captions) // 2
    return PairedDataset(name="s", captions=captions, caption_image=np.repeat(np.arange(n), 2),
                         image_features=np.random.default_rng(0).normal(size=(n, 6)).astype(np.float32),
                         splits={"train": np.arange(n - 3), "test": np.arange(n - 3, n)})


def test_dataset_repairs_captions_once_and_says_how_many():
    caps = [f"a dog {i} runs" for i in range(20)]
    caps[3], caps[7] = "a dog \ud83d runs", "\ud83d\ud83d cat"
    ds = _dataset(caps)
    assert ds.captions[3] == "a dog \ufffd runs" and ds.captions[7] == "\ufffd\ufffd cat"
    assert len(ds.warnings) == 1 and "2 caption(s) held invalid text" in ds.warnings[0]
    assert "first: caption 3" in ds.warnings[0]
    ds.fingerprint()
    sub = ds.split("train")                         # a subset keeps the one warning, adds none
    assert sub.warnings == ds.warnings
    corpus = TextCorpus(name="c", captions=["ok", "bad \udbff"])
    assert corpus.captions[1] == "bad \ufffd" and len(corpus.warnings) == 1
    corpus.fingerprint()


def test_training_on_captions_with_surrogates(tmp_path, monkeypatch):
    from crossview.core.events import Finished, Log
    from crossview.engine.run import train

    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(1)
    words = ["dog", "cat", "ball", "red", "park", "tree"]
    caps = [" ".join(rng.choice(words, 4)) for _ in range(40)]
    caps[0], caps[11] = caps[0] + " \ud83d", "\ud83e " + caps[11]
    events = list(train("cca", _dataset(caps), run_dir=tmp_path / "run", text_encoder="tfidf",
                        params={"n_components": 3}))
    assert isinstance(events[-1], Finished)
    said = [e.message for e in events if isinstance(e, Log) and "invalid text" in e.message]
    assert len(said) == 1 and "2 caption(s)" in said[0]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["method"] == "cca"


def test_data_info_prints_surrogates_as_escapes(tmp_path):
    def info(split0: str) -> subprocess.CompletedProcess:
        images = [{"filename": f"im{i}.jpg", "split": "train" if i else split0,
                   "sentences": [{"raw": f"a dog \ud83d {i}"}, {"raw": "a cat"}]} for i in range(4)]
        for i in range(4):
            (tmp_path / f"im{i}.jpg").write_bytes(b"not decoded by data info")
        path = tmp_path / "dataset_s.json"
        path.write_text(json.dumps({"dataset": "na\ud83dme", "images": images}), encoding="ascii")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
        return subprocess.run([sys.executable, "-m", "crossview", "data", "info", str(path)], capture_output=True,
                              env=env, timeout=120)

    r = info("test")
    out, err = r.stdout.decode("utf-8"), r.stderr.decode("utf-8")
    assert r.returncode == 0 and "Traceback" not in err, err
    assert "na\\ud83dme" in out and "4 caption(s) held invalid text" in out + err
    # a split name holding one is refused (a split name is an identifier), in one escaped line
    r = info("te\ud83dst")
    err = r.stderr.decode("utf-8")
    assert r.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("crossview: error:") and "te\\ud83dst" in err, err
