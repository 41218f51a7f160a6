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
