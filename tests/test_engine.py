"""The run engine: run folders, events as they happen, atomic files, cancel, resume, devices, the CLI."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import _engine_helpers as H
from crossview.core import io as eio
from crossview.core.devices import list_devices, select_device
from crossview.core.events import (CheckpointSaved, Finished, Log, Loss, Progress, Validation,
                                     event_from_dict)
from crossview.engine.run import SUMMARY_KEYS, read_status, resume, train
from crossview.core.errors import CrossViewError


@pytest.fixture(scope="module")
def toy():
    ds = H.make_toy_dataset()
    return ds, H.toy_features(ds)


def _drain(it):
    return list(it)


# ---------------------------------------------------------------------------- run folder
def test_run_folder_contents_and_summary(tmp_path, toy):
    ds, feats = toy
    run_dir = tmp_path / "run"
    events = _drain(train("cca", ds, run_dir=run_dir, features=feats, params={"n_components": 8}, device="cpu",
                          seed=3))
    assert isinstance(events[-1], Finished)
    names = {p.name for p in run_dir.iterdir()}
    assert {"config.json", "metrics.jsonl", "checkpoint.pt", "ranks.npz", "summary.json", "status.json"} <= names
    assert not [n for n in names if n.endswith(".tmp")]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary)[:len(SUMMARY_KEYS)] == list(SUMMARY_KEYS)
    assert (summary["method"], summary["dataset"], summary["split"]) == ("cca", "toy", "test")
    for d in ("i2t", "t2i"):
        assert set(summary[d]) == {"R@1", "R@5", "R@10", "MedR", "MeanR"}
    assert summary["rsum"] == pytest.approx(sum(summary[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10)))
    assert summary["train_seconds"] >= 0 and summary["status"] == "finished"
    assert events[-1].summary == summary

    # ranks.npz holds the per-query ranks the summary's metrics come from.
    ranks = np.load(run_dir / "ranks.npz")
    test = ds.split("test")
    assert ranks["i2t"].shape == (test.n_images,) and ranks["t2i"].shape == (test.n_captions,)
    assert summary["i2t"]["R@10"] == pytest.approx(100 * np.mean(ranks["i2t"] <= 10))
    assert summary["t2i"]["MedR"] == pytest.approx(np.median(ranks["t2i"]))
    np.testing.assert_array_equal(ranks["image_ids"], test.image_ids)

    config = json.loads((run_dir / "config.json").read_text())
    assert config["seeds"] == {"python": 3, "numpy": 3, "torch": 3}
    assert config["params"]["n_components"] == 8 and config["user_params"] == {"n_components": 8}
    assert config["device_selected"] == "cpu" and config["dataset_fingerprint"] == ds.fingerprint()
    assert read_status(run_dir)["status"] == "finished"

    # The checkpoint rebuilds the method and the run's fitted feature normalisation (CCA's default: ssr on
    # the images): same scores as the run's.
    from crossview.core.io import load_checkpoint
    from crossview.features import Features
    from crossview.features.normalize import restore_normalized
    from crossview.methods import Method
    from crossview.data.method_data import MethodData
    method = Method.load(run_dir / "checkpoint.pt")
    spec = load_checkpoint(run_dir / "checkpoint.pt")["features"]
    assert spec["norm_states"]["image"]["kind"] == "ssr" and config["image_norm"] == "ssr"
    f = restore_normalized(Features(image=feats[0], text=feats[1], image_encoder="given", text_encoder="given"),
                           spec["norm_states"])
    data = MethodData.from_features(ds, f.image, f.text, "test")
    r = method.evaluate(data)
    np.testing.assert_array_equal(r["ranks"]["i2t"], ranks["i2t"])


def test_metrics_jsonl_is_written_as_events_happen(tmp_path, toy):
    ds, feats = toy
    run_dir = tmp_path / "run"
    it = train("toy_iterative", ds, run_dir=run_dir, features=feats, params={"epochs": 2}, device="cpu",
               checkpoint_seconds=1e9)
    n_losses = n_val = 0
    for ev in it:
        lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        if isinstance(ev, Loss):
            n_losses += 1
            assert lines[-1]["event"] == "loss" and lines[-1]["step"] == ev.step
            assert sum(1 for x in lines if x["event"] == "loss") == n_losses
        elif isinstance(ev, Validation):
            n_val += 1
            assert lines[-1]["event"] == "validation" and lines[-1]["metrics"] == {"epoch_done": n_val}
        elif isinstance(ev, (Log, CheckpointSaved, Finished)):
            assert event_from_dict(lines[-1]) == ev
    assert n_val == 2 and n_losses > 2
    kinds = [json.loads(x)["event"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert kinds[0] == "log" and kinds[-1] == "finished" and "checkpoint" in kinds


def test_training_through_extract_features(tmp_path, toy):
    """No features given: the engine extracts them (precomputed image rows, bag-of-words captions)."""
    ds, _ = toy
    events = _drain(train("cca", ds, run_dir=tmp_path / "run", text_encoder="bow", device="cpu",
                          params={"n_components": 8}, cache=False))
    assert any(isinstance(e, Progress) and e.message.startswith("features") for e in events)
    s = events[-1].summary
    assert (s["image_encoder"], s["text_encoder"]) == ("precomp", "bow")
    # 32 test images of 8 classes: chance R@10 for t2i is 10/32; the classes are easy to learn.
    assert s["t2i"]["R@10"] > 2 * 100 * 10 / 32


def test_bad_input_is_refused_before_the_folder_exists(tmp_path, toy):
    ds, feats = toy
    with pytest.raises(CrossViewError, match=r"unknown method 'nope'.*cca"):
        train("nope", ds, run_dir=tmp_path / "a", features=feats)
    with pytest.raises(CrossViewError, match=r"no parameter 'bogus'.*n_components"):
        train("cca", ds, run_dir=tmp_path / "a", features=feats, params={"bogus": 1})
    with pytest.raises(CrossViewError, match=r"no split 'dev'.*train, val, test"):
        train("cca", ds, run_dir=tmp_path / "a", features=feats, split="dev")
    with pytest.raises(CrossViewError, match="cuda:9"):
        train("cca", ds, run_dir=tmp_path / "a", features=feats, device="cuda:9")
    with pytest.raises(CrossViewError, match="does-not-exist"):
        train("cca", str(tmp_path / "does-not-exist"), run_dir=tmp_path / "a")
    assert not (tmp_path / "a").exists()
    _drain(train("cca", ds, run_dir=tmp_path / "b", features=feats))
    with pytest.raises(CrossViewError, match=r"already holds a run.*--resume"):
        train("cca", ds, run_dir=tmp_path / "b", features=feats)


def test_a_bad_parameter_is_refused_before_the_run_folder_exists(tmp_path, toy):
    ds, feats = toy
    with pytest.raises(CrossViewError, match="n_components"):
        train("cca", ds, run_dir=tmp_path / "run", features=feats, params={"n_components": 0})
    assert not (tmp_path / "run").exists()


def test_a_failing_method_records_failed(tmp_path, toy, monkeypatch):
    ds, feats = toy
    from crossview.methods.cca import CCA

    def broken(self, train, val=None, *, resume=False):
        yield Log("about to fail")
        raise CrossViewError("cca: the covariance is singular (made up by the test)")
    monkeypatch.setattr(CCA, "fit_iter", broken)
    with pytest.raises(CrossViewError, match="singular"):
        _drain(train("cca", ds, run_dir=tmp_path / "run", features=feats))
    status = read_status(tmp_path / "run")
    assert status["status"] == "failed" and "singular" in status["error"]
    assert not (tmp_path / "run" / "summary.json").exists()


# ---------------------------------------------------------------------------- cancel and resume
def test_cancel_stops_within_one_batch_and_resume_continues(tmp_path, toy):
    ds, feats = toy
    params = {"epochs": 3, "batch_size": 16}
    # Reference: an uninterrupted run.
    ref = _drain(train("toy_iterative", ds, run_dir=tmp_path / "ref", features=feats, params=params))
    from crossview.methods import Method
    w_ref = Method.load(tmp_path / "ref" / "checkpoint.pt").W_

    run_dir = tmp_path / "run"
    it = train("toy_iterative", ds, run_dir=run_dir, features=feats, params=params, checkpoint_seconds=1e9)
    seen_loss = 0
    for ev in it:
        if isinstance(ev, Loss):
            seen_loss += 1
            if ev.epoch == 1 and seen_loss >= 12:   # in the middle of the second epoch
                break
    it.close()
    status = read_status(run_dir)
    assert status["status"] == "cancelled" and status["checkpoint"] == "checkpoint.pt"
    assert not (run_dir / "summary.json").exists()
    ckpt = eio.load_checkpoint(run_dir / "checkpoint.pt")
    # The method stopped at the batch it had just reported: no further batch ran.
    assert ckpt["method_state"]["state"]["batches_done_"] == seen_loss
    assert ckpt["phase"] == "training"

    events = _drain(resume(run_dir, data=ds, features=feats))
    assert any(isinstance(e, Log) and "continuing" in e.message for e in events)
    losses = [e for e in events if isinstance(e, Loss)]
    assert losses[0].step == seen_loss + 1          # picks up at the next batch
    assert isinstance(events[-1], Finished) and read_status(run_dir)["status"] == "finished"
    w = Method.load(run_dir / "checkpoint.pt").W_
    np.testing.assert_allclose(w, w_ref, rtol=1e-12)
    assert events[-1].summary["rsum"] == pytest.approx(ref[-1].summary["rsum"])
    # Resuming a finished run only reports it.
    again = _drain(resume(run_dir, data=ds, features=feats))
    assert isinstance(again[-1], Finished) and again[-1].summary == events[-1].summary


def test_closed_form_method_refits_on_resume(tmp_path, toy):
    ds, feats = toy
    run_dir = tmp_path / "run"
    it = train("cca", ds, run_dir=run_dir, features=feats, params={"n_components": 8})
    for ev in it:
        if isinstance(ev, Progress) and ev.message.startswith("cca"):
            break
    it.close()
    assert read_status(run_dir)["status"] == "cancelled"
    events = _drain(resume(run_dir, data=ds, features=feats))
    assert any(isinstance(e, Log) and "from the start" in e.message for e in events)
    assert events[-1].summary["status"] == "finished"


@pytest.mark.parametrize("damage", ["summary", "checkpoint", "embeddings", "ranks"])
def test_a_finished_run_missing_an_output_is_evaluated_again_by_resume(tmp_path, toy, damage):
    """Every reader of a finished run whose summary is damaged, or whose checkpoint, embeddings or ranks are gone,
    says "resume it"; resume said "nothing to resume" (a loop). It now evaluates the run again (from its checkpoint;
    without one, trains it again) and says why, with the parameters the run recorded, not today's defaults."""
    ds, feats = toy
    run_dir = tmp_path / "run"
    first = _drain(train("cca", ds, run_dir=run_dir, features=feats, params={"n_components": 8}))[-1].summary
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg["params"]["reg"] = 0.25                       # as a run made before a default moved records its reg
    (run_dir / "config.json").write_text(json.dumps(cfg))
    target = {"summary": run_dir / "summary.json", "checkpoint": run_dir / "checkpoint.pt",
              "embeddings": run_dir / f"embeddings_{first['split']}.npz", "ranks": run_dir / "ranks.npz"}[damage]
    if damage == "summary":
        target.write_text('{"rsum": ')
    else:
        target.unlink()
    events = _drain(resume(run_dir, data=ds, features=feats))
    said = [e.message for e in events if isinstance(e, Log) and "finished, but" in e.message]
    assert len(said) == 1 and {"summary": "summary.json is missing or damaged", "checkpoint": "checkpoint.pt is missing",
                               "embeddings": "embeddings_", "ranks": "ranks.npz is missing"}[damage] in said[0]
    assert ("trains again from the start" in said[0]) == (damage == "checkpoint")
    assert events[-1].summary["status"] == "finished" and target.is_file()
    assert json.loads((run_dir / "config.json").read_text())["params"]["reg"] == 0.25
    if damage == "checkpoint":      # trained again: with the reg the run recorded, not today's default
        again = _drain(train("cca", ds, run_dir=tmp_path / "direct", features=feats,
                             params={"n_components": 8, "reg": 0.25}))[-1].summary
        assert events[-1].summary["rsum"] == pytest.approx(again["rsum"]) != pytest.approx(first["rsum"])
    else:                           # the checkpoint's model evaluated again: the numbers it had
        assert events[-1].summary["rsum"] == pytest.approx(first["rsum"])
    assert "nothing to resume" in _drain(resume(run_dir, data=ds, features=feats))[0].message     # whole again


def test_cancel_during_feature_extraction(tmp_path, toy):
    ds, _ = toy
    run_dir = tmp_path / "run"
    it = train("cca", ds, run_dir=run_dir, text_encoder="bow", cache=False)
    for ev in it:
        if isinstance(ev, Progress) and ev.message.startswith("features"):
            break
    it.close()
    assert read_status(run_dir)["status"] == "cancelled"
    assert read_status(run_dir)["checkpoint"] is None  # nothing trained yet


def test_resume_refuses_other_data_and_non_runs(tmp_path, toy):
    ds, feats = toy
    with pytest.raises(CrossViewError, match="not a run folder"):
        resume(tmp_path)
    run_dir = tmp_path / "run"
    it = train("toy_iterative", ds, run_dir=run_dir, features=feats)
    next(it)
    it.close()
    other = H.make_toy_dataset(seed=1)
    with pytest.raises(CrossViewError, match="has changed"):
        resume(run_dir, data=other, features=H.toy_features(other))
    with pytest.raises(CrossViewError, match="in-memory dataset"):
        resume(run_dir)


# ---------------------------------------------------------------------------- atomic files
def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "summary.json"
    eio.atomic_write_json(target, {"v": 1})

    def boom(f):
        f.write(b'{"v": 2, "trunc')
        raise OSError("disk full")

    with pytest.raises(OSError):
        eio.atomic_writer(target, boom)
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]   # temp file removed
    eio.atomic_write_json(target, {"v": np.float32(2.5), "bad": float("nan")})
    assert json.loads(target.read_text()) == {"v": 2.5, "bad": None}


def test_event_log_survives_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with eio.EventLog(path) as log:
        log.write(Log("one"))
    with open(path, "a") as f:
        f.write('{"event": "loss", "st')          # a crash in the middle of an append
    with eio.EventLog(path) as log:
        log.write(Loss(2, 0, {"l": 0.5}))
    events = [event_from_dict(d) for d in eio.read_events(path)]
    assert events == [Log("one"), Loss(2, 0, {"l": 0.5})]


def test_load_checkpoint_errors_name_the_file(tmp_path):
    with pytest.raises(CrossViewError, match="checkpoint not found"):
        eio.load_checkpoint(tmp_path / "none.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CrossViewError, match=r"bad\.pt: cannot read the checkpoint"):
        eio.load_checkpoint(bad)


# ---------------------------------------------------------------------------- devices
def test_device_selection():
    assert select_device("cpu") == "cpu"
    assert select_device(" CPU ") == "cpu"
    names = [d.name for d in list_devices()]
    assert names[0] == "cpu"
    assert select_device("auto") in names
    for bad in ("tpu", "cpu:1", "cuda:x", ""):
        with pytest.raises(CrossViewError, match="unknown device"):
            select_device(bad)
    n_cuda = sum(1 for n in names if n.startswith("cuda"))
    with pytest.raises(CrossViewError, match=rf"cuda:{n_cuda + 3}.*not available.*use --device"):
        select_device(f"cuda:{n_cuda + 3}")
    if n_cuda == 0:
        with pytest.raises(CrossViewError, match="no CUDA GPU"):
            select_device("cuda")
    if "mps" not in names:
        with pytest.raises(CrossViewError, match="'mps' is not available"):
            select_device("mps")


# ---------------------------------------------------------------------------- command line
def _write_precomp(folder, ds):
    folder.mkdir()
    feats = np.asarray(ds.image_features)
    for prefix, split in (("train", "train"), ("dev", "val"), ("test", "test")):
        idx = ds.splits[split]
        np.save(folder / f"{prefix}_ims.npy", feats[idx])
        caps = [c for c, i in zip(ds.captions, ds.caption_image) if i in set(idx.tolist())]
        (folder / f"{prefix}_caps.txt").write_text("\n".join(caps) + "\n")


def test_cli_train_list_resume_and_errors(tmp_path, toy, capsys):
    from crossview.cli import main

    ds, _ = toy
    data = tmp_path / "toy_precomp"
    _write_precomp(data, ds)
    run_dir = tmp_path / "run"
    rc = main(["train", "cca", "--data", str(data), "--run-dir", str(run_dir), "--text-encoder", "bow",
               "--device", "cpu", "--set", "n_components=6", "--set", "pairs=images"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "R@1" in out and "MedR" in out and "i2t" in out and "t2i" in out and "rsum" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["params"]["n_components"] == 6 and summary["params"]["pairs"] == "images"
    i2t_line = next(line for line in out.splitlines() if line.startswith("i2t"))
    assert f"{summary['i2t']['R@10']:.1f}" in i2t_line

    assert main(["train", "--resume", str(run_dir)]) == 0
    assert "rsum" in capsys.readouterr().out

    assert main(["train", "--list"]) == 0
    listed = capsys.readouterr().out
    assert listed.splitlines()[0].startswith("cca") and "Regularised CCA" in listed

    for argv, msg in ((["train", "nope", "--data", str(data)], "unknown method 'nope'"),
                      (["train", "cca", "--data", str(data), "--set", "reg=lots"], "'reg': expected a number"),
                      (["train", "cca", "--data", str(data), "--set", "pairs=all"], "not one of"),
                      (["train", "cca", "--data", str(data), "--set", "size=3"], "no parameter 'size'"),
                      (["train", "cca", "--data", str(data), "--set", "reg"], "NAME=VALUE"),
                      (["train", "cca", "--data", str(data), "--device", "cuda:7"], "cuda:7"),
                      (["train"], "name a METHOD")):
        assert main(argv) == 2, argv
        assert msg in capsys.readouterr().err


def test_default_run_dir_is_under_the_runs_folder(tmp_path, toy, monkeypatch):
    monkeypatch.setenv("CROSSVIEW_HOME", str(tmp_path / "home"))
    ds, feats = toy
    it = train("cca", ds, features=feats)
    assert it.run_dir.parent == tmp_path / "home" / "runs"
    assert it.run_dir.name.startswith("cca-toy-")
    _drain(it)
    assert (it.run_dir / "summary.json").is_file()
    assert os.listdir(tmp_path / "home" / "runs") == [it.run_dir.name]


def test_unused_dir_never_reuses_a_folder_and_names_are_checked(tmp_path, monkeypatch):
    """One helper names every new run / search folder (the engine, the Train panel, the search view, tune)."""
    from datetime import datetime as real_datetime

    import crossview.engine.run_folder as rf
    from crossview.core.errors import CrossViewError

    class Frozen(real_datetime):
        @classmethod
        def now(cls, tz=None):
            return real_datetime(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(rf, "datetime", Frozen)
    first = rf.unused_dir(tmp_path, "cca", rf.safe_name("my data/set"))
    assert first == tmp_path / "cca-my_data_set-20260102-030405"
    first.mkdir()
    (tmp_path / f"{first.name}-2").mkdir()
    assert rf.unused_dir(tmp_path, "cca", rf.safe_name("my data/set")) == tmp_path / f"{first.name}-3"
    assert rf.safe_name("") == "data"
    assert rf.check_folder_name("run_1") == "run_1"
    for bad in ("a/b", "..", "x\\y"):
        with pytest.raises(CrossViewError, match="use letters"):
            rf.check_folder_name(bad, "search folder name")


def test_card_flags_become_train_options(tmp_path, toy, monkeypatch, capsys):
    """A card parameter with ``flag = "--ridge"`` gets its own `crossview train` option."""
    from crossview.cli import main
    from crossview.core.resources import models_dir

    cards = tmp_path / "models"
    cards.mkdir()
    text = (models_dir() / "cca.toml").read_text()
    (cards / "cca.toml").write_text(text.replace("[params.reg]\n", '[params.reg]\nflag = "--ridge"\n'))
    monkeypatch.setenv("CROSSVIEW_MODELS", str(cards))
    ds, _ = toy
    data = tmp_path / "toy_precomp"
    _write_precomp(data, ds)
    rc = main(["train", "cca", "--data", str(data), "--run-dir", str(tmp_path / "run"), "--text-encoder", "bow",
               "--ridge", "0.5", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["params"]["reg"] == 0.5
    assert main(["train", "cca", "--data", str(data), "--ridge", "-1"]) == 2
    assert "below the minimum" in capsys.readouterr().err
