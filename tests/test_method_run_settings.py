"""A method's parameters are its model, loss and optimisation hyperparameters only (issue 29): the run settings
(device, amp, seed, workers, log_every) are never among its parameters or its card, a method reads them from its
``run_settings`` (``configure_run`` / ``with_run``), and a user who gives one as a parameter is told where it goes."""

from __future__ import annotations

import json

import numpy as np
import pytest

import _engine_helpers as H
from crossview.core.errors import CrossViewError
from crossview.core.run_settings import RUN_SETTING_PARAMS, RunSettings
from crossview.data.method_data import MethodData
from crossview.methods import Method, create_method, list_methods, method_card, method_class
from crossview.methods.cards import run_setting_spec

METHODS = [m for m in list_methods() if not m.startswith(("toy_", "x_"))]


@pytest.mark.parametrize("name", METHODS)
def test_no_card_or_signature_holds_a_run_setting(name: str) -> None:
    cls = method_class(name)
    assert not set(cls.param_names()) & set(RUN_SETTING_PARAMS), cls.param_names()
    card = method_card(name)
    assert card is None or not set(card.params) & set(RUN_SETTING_PARAMS), sorted(card.params)
    m = create_method(name)
    assert m.run_settings == RunSettings() and m.device == "cpu" and m.seed == 0 and not m.amp
    assert not set(m.get_params()) & set(RUN_SETTING_PARAMS)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("setting", sorted(RUN_SETTING_PARAMS))
def test_a_run_setting_given_as_a_parameter_is_one_line_saying_where_it_goes(name: str, setting: str) -> None:
    field = RUN_SETTING_PARAMS[setting]
    for make in (lambda: method_class(name)(**{setting: 1}), lambda: create_method(name, **{setting: 1}),
                 lambda: create_method(name).set_params(**{setting: 1})):
        with pytest.raises(CrossViewError) as info:
            make()
        msg = str(info.value)
        assert "\n" not in msg and msg.startswith(f"{setting} is a run setting, not a parameter of method {name!r}")
        assert f"crossview.train(..., {field}=...)" in msg and f".with_run({field}=...)" in msg, msg


def test_with_run_sets_the_run_settings_and_the_method_defaults_fill_what_it_leaves() -> None:
    v = create_method("vsepp", max_epochs=2)
    assert v.with_run(seed=3, device="auto", amp=True) is v
    assert v.seed == 3 and v.device == "cpu" and v.amp            # this machine has no GPU in CI; auto resolved
    assert (v.workers, v.log_every) == (2, 10), "vsepp's own defaults while the run leaves them at None"
    v.with_run(workers=0, log_every=4)
    assert (v.workers, v.log_every, v.seed) == (0, 4, 3), "fields not given keep their values"
    assert v.get_params()["max_epochs"] == 2 and "seed" not in v.get_params()
    b = create_method("bitr").with_run(n_jobs=3, random_state=7)      # scikit-learn's names for the same fields
    assert (b.workers, b.seed) == (3, 7) and b.run_settings.workers == 3
    assert create_method("svm").workers == 1 and create_method("wsabie").log_every == 10
    assert not create_method("wsabie").with_run(amp=True).amp, "wsabie has no mixed precision"
    with pytest.raises(CrossViewError, match="'lr' is not a run setting"):
        v.with_run(lr=0.1)
    with pytest.raises(CrossViewError, match="unknown device 'tpu'"):
        v.with_run(device="tpu")
    with pytest.raises(CrossViewError, match="takes a crossview.core.run_settings.RunSettings"):
        v.configure_run({"device": "cpu"})
    with pytest.raises(AttributeError):
        v.seed = 4                       # read-only: the run's


def test_set_values_type_run_settings_by_their_run_settings_field() -> None:
    from crossview.commands.train import parse_set_values

    got = parse_set_values("wsabie", ["seed=3", "amp=yes", "n_jobs=2", "log_every=none", "dim=8"])
    assert got == {"seed": 3, "amp": True, "n_jobs": 2, "log_every": None, "dim": 8}
    assert isinstance(got["seed"], int) and got["amp"] is True
    for bad, needle in (("seed=x", "'seed': expected an integer"), ("amp=maybe", "'amp': expected true or false"),
                        ("workers=-1", "'workers': -1 is below the minimum 0")):
        with pytest.raises(CrossViewError, match=needle):
            parse_set_values("cca", [bad])
    assert run_setting_spec("lr") is None and run_setting_spec("device").type == "str"


def test_set_seed_on_the_command_line_reaches_the_run_settings(tmp_path, capsys) -> None:
    """``crossview train wsabie --set seed=3 --set log_every=4``: config.json's run settings have seed 3 and
    log_every 4; the method's saved parameters (config.json and the checkpoint) hold neither; the run trains as
    one started with ``seed=3`` (same weights)."""
    from crossview.cli import main
    from crossview.core.io import load_checkpoint
    from crossview.engine.run import train

    ds = H.make_toy_dataset(n_images=60)
    data = tmp_path / "toy_precomp"
    H.write_toy_precomp(data, ds, (("train", "train"), ("dev", "val"), ("test", "test")))
    run = tmp_path / "run"
    assert main(["train", "wsabie", "--data", str(data), "--run-dir", str(run), "--text-encoder", "bow",
                 "--device", "cpu", "--set", "seed=3", "--set", "log_every=4", "--set", "dim=8",
                 "--set", "max_epochs=2", "--json"]) == 0
    capsys.readouterr()
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["run_settings"]["seed"] == 3 and cfg["run_settings"]["log_every"] == 4 and cfg["seed"] == 3
    assert cfg["params"]["dim"] == 8 and cfg["params"]["max_epochs"] == 2
    assert not set(cfg["params"]) & set(RUN_SETTING_PARAMS), sorted(cfg["params"])
    ckpt = load_checkpoint(run / "checkpoint.pt")
    saved = ckpt["method_state"]["params"]
    assert not set(saved) & set(RUN_SETTING_PARAMS) and saved["dim"] == 8
    ref = tmp_path / "ref"
    for _ in train("wsabie", str(data), run_dir=ref, text_encoder="bow", device="cpu", seed=3, log_every=4,
                   params={"dim": 8, "max_epochs": 2}):
        pass
    again = load_checkpoint(ref / "checkpoint.pt")["method_state"]["state"]["model_state_"]
    for k, v in ckpt["method_state"]["state"]["model_state_"].items():
        np.testing.assert_array_equal(v, again[k], err_msg=k)


def _pairs(n: int = 60, seed: int = 0) -> MethodData:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    return MethodData(image_features=x, text_features=(x @ rng.normal(size=(6, 5))).astype(np.float32),
                      captions=[f"c{i}" for i in range(n)], caption_image=np.arange(n), name="train")


def test_a_loaded_method_takes_the_device_it_is_configured_with(tmp_path) -> None:
    """A method saved by a run on cuda:0 holds no device: loaded, it is on the CPU; configure_run switches it, and
    a resumed fit trains (and says it trains) on the device configured, with the saved seed's stream."""
    data = _pairs()
    m = create_method("wsabie", dim=4, max_epochs=2, batch_size=16).configure_run(
        RunSettings(device="cuda:0", seed=5))
    state = m.state_dict()                       # nothing fitted: the parameters and the stream only
    assert state["params"]["dim"] == 4 and not set(state["params"]) & set(RUN_SETTING_PARAMS)
    assert state["stream"] == {"seed": 5}
    m.configure_run(RunSettings(device="cpu", seed=5))
    it = m.fit_iter(data)
    for ev in it:
        if getattr(ev, "step", 0) == 3:
            break
    it.close()
    path = m.save(tmp_path / "m.pt")
    back = Method.load(path)
    assert back.device == "cpu" and back.seed == 5, "the device is this object's; the seed the stream's"
    target = "cuda:0" if _cuda() else "cpu"
    back.configure_run(RunSettings(device=target, seed=5))
    events = list(back.fit_iter(data, resume=True))
    assert back.device == target and back.epoch_ == 2
    full = create_method("wsabie", dim=4, max_epochs=2, batch_size=16).with_run(device="cpu", seed=5).fit(data)
    if target == "cpu":
        for k, v in full.model_state_.items():
            np.testing.assert_array_equal(back.model_state_[k], v, err_msg=k)
    assert all("device cuda" not in getattr(e, "message", "") for e in events) or target != "cpu"


def test_an_old_state_with_run_settings_among_its_params_still_loads() -> None:
    """Checkpoints written when device / seed / log_every were parameters: those keys are not restored (the
    seed is kept as the training's stream, as the state had no "stream" then)."""
    m = create_method("wsabie", dim=4, max_epochs=1).with_run(device="cpu").fit(_pairs())
    old = m.state_dict()
    old.pop("stream")
    old["params"] = {**old["params"], "device": "cuda:0", "seed": 9, "log_every": 3, "amp": True}
    back = create_method("wsabie").load_state_dict(old)
    assert back.device == "cpu" and back.seed == 9 and back.log_every == 10 and back.dim == 4
    np.testing.assert_array_equal(back.encode_images(_pairs()), m.encode_images(_pairs()))


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()
