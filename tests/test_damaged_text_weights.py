"""A ``bert:PATH`` folder whose weights file is damaged is one line naming that file (issue 31, item 2): no
SafetensorError / UnpicklingError traceback, and never advice to unpickle it."""

from __future__ import annotations

import shutil

import pytest

from crossview.core.errors import CrossViewError
from crossview.features.text import create_text_encoder


@pytest.fixture()
def model_folder(tmp_path):
    from crossview.features.text.transformer import minilm_path

    try:
        src = minilm_path()
    except CrossViewError as e:
        pytest.skip(str(e))
    out = tmp_path / "bert"
    out.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "pytorch_model.bin"):
            shutil.copy(f, out / f.name)
    return out


@pytest.mark.parametrize("name,payload", [
    ("model.safetensors", b"\xff" * 4096),                         # a header length far beyond the file
    ("model.safetensors", b""),                                    # empty
    ("pytorch_model.bin", b"\x80\x02garbage that is not a zip"),  # a pickle stream, not a tensor file
])
def test_damaged_weights_name_the_file(model_folder, name, payload):
    (model_folder / name).write_bytes(payload)
    enc = create_text_encoder(f"bert:{model_folder}")
    with pytest.raises(CrossViewError) as e:
        enc.encode(["a dog runs"])
    msg = str(e.value)
    assert msg.startswith(f"{model_folder / name}: the weights file is damaged"), msg
    assert "\n" not in msg and "weights_only=False" not in msg and "Re-running" not in msg


def test_damaged_tokenizer_names_the_folder(model_folder):
    from crossview.features.text.transformer import minilm_path

    shutil.copy(minilm_path() / "model.safetensors", model_folder / "model.safetensors")
    (model_folder / "tokenizer.json").write_bytes(b"\xe9\x00not json")
    with pytest.raises(CrossViewError, match=f"cannot load the tokenizer of {model_folder}"):
        create_text_encoder(f"bert:{model_folder}").encode(["a dog"])


class _Plant:
    """Unpickling this would create the file ``marker`` (code from the file running)."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_planted_pickle_in_the_weights_never_runs(model_folder, tmp_path):
    """A real torch zip file whose pickle would run code: refused by the restricted unpickler, named in one
    line, and the code did not run (its marker file does not exist)."""
    import torch

    marker = tmp_path / "ran"
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2, 2), "x": _Plant(marker)},
               model_folder / "pytorch_model.bin")
    with pytest.raises(CrossViewError) as e:
        create_text_encoder(f"bert:{model_folder}").encode(["a dog runs"])
    assert not marker.exists(), "code from the weights file ran"
    msg = str(e.value)
    assert msg.startswith(f"{model_folder / 'pytorch_model.bin'}: the weights file is damaged"), msg
    assert "\n" not in msg and "weights_only=False" not in msg


def test_a_model_folder_asking_for_its_own_code_is_refused(model_folder, tmp_path):
    """config.json naming code of the folder (``auto_map``, transformers' remote code): never imported."""
    import json

    from crossview.features.text.transformer import minilm_path

    shutil.copy(minilm_path() / "model.safetensors", model_folder / "model.safetensors")
    marker = tmp_path / "imported"
    (model_folder / "evil_model.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    cfg = json.loads((model_folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "evil_model.EvilModel", "AutoConfig": "evil_model.EvilConfig"}
    (model_folder / "config.json").write_text(json.dumps(cfg))
    try:
        create_text_encoder(f"bert:{model_folder}").encode(["a dog runs"])
    except CrossViewError as e:
        assert "\n" not in str(e)
    assert not marker.exists(), "code from the model folder was imported"
