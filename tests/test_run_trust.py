"""A run folder is data: a planted checkpoint never runs code, damaged files give one clear line, one
process writes a run at a time, and status.json / metrics.jsonl tell the truth after a kill (issue 10)."""

from __future__ import annotations

import io
import json
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import _engine_helpers as H
from crossview.cli import main
from crossview.core import io as eio
from crossview.core.events import CheckpointSaved, Finished, Log, Loss
from crossview.engine.run import read_status, read_summary, resume, run_is_locked, train
from crossview.engine.session import list_runs, open_run
from crossview.core.errors import CrossViewError
from crossview.methods.base import Method


@pytest.fixture(scope="module")
def toy():
    ds = H.make_toy_dataset()
    return ds, H.toy_features(ds)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, toy) -> Path:
    ds, feats = toy
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    events = list(train("toy_iterative", ds, run_dir=run_dir, features=feats, device="cpu", params={"epochs": 2}))
    assert isinstance(events[-1], Finished)
    return run_dir


def _copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


# ---------------------------------------------------------------------------- checkpoints are plain data
def test_checkpoint_round_trips_numpy_and_python_values_under_weights_only(tmp_path):
    random.seed(7)
    np.random.seed(7)
    value = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "f64_noncontig": np.arange(20.0)[::3],
        "u32": np.array([0, 2**32 - 1], dtype=np.uint32),
        "u64": np.array([2**64 - 1], dtype=np.uint64),
        "big_endian": np.array([1.5, -2.0], dtype=">f8"),
        "bool": np.array([True, False]),
        "strings": np.array(["dog", "café"]),
        "objects": np.array([{"a": 1}, None], dtype=object),
        "scalar": np.float32(2.5), "int_scalar": np.int64(-3),
        "empty": np.zeros((0, 5)),
        "python_rng": random.getstate(), "numpy_rng": np.random.get_state(), "torch_rng": torch.get_rng_state(),
        "a_set": {1, 2}, "tagged_lookalike": {"__ndarray__": "just a key"},
        "nested": [{"x": (1, None, "s", 2.0**0.5, 10**30)}],
        "tensor": torch.ones(2, 2),
    }
    path = eio.save_checkpoint(tmp_path / "c.pt", value)
    raw = torch.load(path, weights_only=True)            # no allowed globals beyond torch's defaults
    assert raw["format"] == eio.CHECKPOINT_FORMAT
    back = eio.load_checkpoint(path)
    for k in ("f32", "f64_noncontig", "u32", "u64", "big_endian", "bool", "strings", "empty"):
        assert back[k].dtype == value[k].dtype.newbyteorder("=") and np.array_equal(back[k], value[k]), k
    assert list(back["objects"]) == [{"a": 1}, None]
    assert back["scalar"] == np.float32(2.5) and back["scalar"].dtype == np.float32
    assert back["int_scalar"] == -3 and back["int_scalar"].dtype == np.int64
    random.setstate(back["python_rng"])
    np.random.set_state(back["numpy_rng"])
    torch.set_rng_state(back["torch_rng"])
    a, b = random.random(), np.random.rand()
    random.setstate(value["python_rng"])
    np.random.set_state(value["numpy_rng"])
    assert (a, b) == (random.random(), np.random.rand())
    assert back["a_set"] == {1, 2} and back["tagged_lookalike"] == {"__ndarray__": "just a key"}
    assert back["nested"] == value["nested"] and torch.equal(back["tensor"], value["tensor"])


def test_entries_of_numpy_arrays_are_read_without_torch_as_torch_reads_them(tmp_path):
    """``load_checkpoint(keys=...)`` (what the app reads to show a run from its gallery cache): entries whose
    tensors all carry numpy arrays are read without importing torch, equal to torch's reading; a bare tensor among
    them, a strided one or a planted global leaves the file to torch (and to its refusal)."""
    random.seed(3)
    arrays = {"f32": np.arange(12, dtype=np.float32).reshape(3, 4), "f64": np.arange(20.0)[::3],
              "u32": np.array([0, 2**32 - 1], dtype=np.uint32), "u64": np.array([2**64 - 1], dtype=np.uint64),
              "i8": np.array([-3, 4], dtype=np.int8), "big_endian": np.array([1.5, -2.0], dtype=">f8"),
              "bool": np.array([True, False]), "c128": np.array([1 + 2j]), "strings": np.array(["dog", "café"]),
              "objects": np.array([{"a": 1}, None], dtype=object), "scalar": np.float32(2.5),
              "empty": np.zeros((0, 5)), "one": np.ones((3, 1, 2)), "numpy_rng": np.random.get_state(),
              "python_rng": random.getstate(), "a_set": {1, 2}, "nested": [{"x": (1, None, "s", 10**30)}]}
    path = eio.save_checkpoint(tmp_path / "c.pt", {"method_state": arrays, "rng": {"torch": torch.get_rng_state()}})
    code = textwrap.dedent(f"""
        import sys
        from crossview.core.io import load_checkpoint
        got = load_checkpoint({str(path)!r}, keys=("method_state",))
        print(sorted(got), "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}).stdout
    assert out.split() == ["['format',", "'method_state']", "False"]     # torch was never imported

    assert eio._read_plain_without_torch(path, ("method_state",)) is not None     # read by the torch-free path here too
    fast, full = eio.load_checkpoint(path, keys=("method_state",))["method_state"], eio.load_checkpoint(path)
    for k, v in full["method_state"].items():
        if isinstance(v, np.ndarray) and v.dtype != object:
            assert fast[k].dtype == v.dtype and fast[k].shape == v.shape and np.array_equal(fast[k], v), k
            assert fast[k].flags.writeable, k
    assert str(fast["numpy_rng"]) == str(full["method_state"]["numpy_rng"])
    assert {k: v for k, v in fast.items() if not isinstance(v, (np.ndarray, tuple))} == \
        {k: v for k, v in full["method_state"].items() if not isinstance(v, (np.ndarray, tuple))}
    assert list(fast["objects"]) == [{"a": 1}, None] and fast["python_rng"] == full["method_state"]["python_rng"]

    assert eio._read_plain_without_torch(path, ("rng",)) is None                    # a bare tensor: torch's
    assert isinstance(eio.load_checkpoint(path, keys=("rng",))["rng"]["torch"], torch.Tensor)
    strided = tmp_path / "strided.pt"        # an array tag whose tensor is a strided view: torch's too
    torch.save({"format": eio.CHECKPOINT_FORMAT, "m": {"__ndarray__": torch.arange(10.0)[::2], "dtype": "<f8",
                                                       "shape": [5]}}, strided)
    assert eio._read_plain_without_torch(strided, ("m",)) is None
    assert np.array_equal(eio.load_checkpoint(strided, keys=("m",))["m"], np.arange(10.0)[::2])


def test_a_planted_pickle_is_refused_when_read_for_some_entries(tmp_path, evil):
    data, marker = evil
    (tmp_path / "m.pt").write_bytes(data)
    assert eio._read_plain_without_torch(tmp_path / "m.pt", ("method_state",)) is None
    with pytest.raises(CrossViewError, match=r"m\.pt: .*older CrossView or by another program"):
        eio.load_checkpoint(tmp_path / "m.pt", keys=("method_state",))
    assert not marker.exists()


def test_a_value_that_is_not_plain_data_is_refused_at_save(tmp_path):
    class Thing:
        pass
    with pytest.raises(CrossViewError, match="Thing in a checkpoint"):
        eio.save_checkpoint(tmp_path / "c.pt", {"x": Thing()})
    assert not (tmp_path / "c.pt").exists()


def test_run_checkpoints_hold_only_weights_only_data(finished_run):
    torch.load(finished_run / "checkpoint.pt", weights_only=True)    # raises if anything else were pickled


@pytest.mark.parametrize("name, params", [("tfidf", {}), ("bow", {}), ("lda", {"n_topics": 3, "max_iter": 5}),
                                          ("vocab", {})])
def test_fitted_text_encoders_survive_a_weights_only_checkpoint(tmp_path, name, params):
    from crossview.features.text import TextEncoder, create_text_encoder

    captions = ["a dog runs on grass", "a cat sleeps", "two dogs play with a ball", "a red ball on grass"] * 3
    enc = create_text_encoder(name, **params).fit(captions)
    path = eio.save_checkpoint(tmp_path / "t.pt", {"text_model": {"name": enc.name, "state": enc.state_dict()}})
    torch.load(path, weights_only=True)
    again = TextEncoder.from_state_dict(eio.load_checkpoint(path)["text_model"]["state"])
    np.testing.assert_array_equal(again.encode(captions), enc.encode(captions))


@pytest.mark.parametrize("method, params", [("cca", {"n_components": 4}), ("wsabie", {"max_epochs": 1, "dim": 8})])
def test_method_save_is_weights_only_and_loads_back(tmp_path, toy, method, params):
    from crossview.methods import create_method
    from crossview.data.method_data import MethodData

    ds, (image, text) = toy
    data = MethodData.from_features(ds, image, text, "train")
    m = create_method(method, **params).with_run(device="cpu")
    m.fit(data)
    path = m.save(tmp_path / "m.pt")
    torch.load(path, weights_only=True)
    back = Method.load(path)
    test = MethodData.from_features(ds, image, text, "test")
    np.testing.assert_allclose(back.encode_images(test), m.encode_images(test), rtol=1e-6)


# ---------------------------------------------------------------------------- a planted pickle never runs
_Payload = H.PicklePayload


@pytest.fixture
def evil(tmp_path) -> tuple[bytes, Path]:
    """The bytes of a malicious ``checkpoint.pt`` and the marker it would create; proven live here."""
    marker = tmp_path / "PWNED"
    buf = io.BytesIO()
    torch.save({"format": 2, "method_state": _Payload(marker), "events": 0, "phase": "training"}, buf)
    probe = tmp_path / "probe.pt"
    probe.write_bytes(buf.getvalue())
    torch.load(probe, weights_only=False)                 # what the old loader did: it runs
    assert marker.exists()
    marker.unlink()
    probe.unlink()
    return buf.getvalue(), marker


def _plant(run: Path, data: bytes) -> Path:
    (run / "checkpoint.pt").write_bytes(data)
    return run


def test_method_load_refuses_a_planted_pickle(tmp_path, evil):
    data, marker = evil
    (tmp_path / "m.pt").write_bytes(data)
    with pytest.raises(CrossViewError, match=r"m\.pt: .*older CrossView or by another program"):
        Method.load(tmp_path / "m.pt")
    assert not marker.exists()


def test_open_run_refuses_a_planted_pickle(tmp_path, evil, finished_run, toy):
    data, marker = evil
    run = _plant(_copy_run(finished_run, tmp_path / "run"), data)
    with pytest.raises(CrossViewError, match=r"checkpoint\.pt: .*older CrossView.*retrain"):
        open_run(run, dataset=toy[0])
    assert not marker.exists()


def test_cli_resume_refuses_a_planted_pickle(tmp_path, evil, toy, capsys):
    data, marker = evil
    ds, feats = toy
    run = tmp_path / "run"
    gen = train("toy_iterative", ds, run_dir=run, features=feats, device="cpu", params={"epochs": 50})
    for ev in gen:
        if isinstance(ev, CheckpointSaved):
            break
    gen.close()
    _plant(run, data)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("crossview: error: ") and "older CrossView" in err[0], err
    assert not marker.exists()
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before   # nothing was written


def test_older_and_foreign_checkpoints_get_one_clear_line(tmp_path):
    old = tmp_path / "old.pt"
    torch.save({"format": 1, "method_state": {"state": {"W_": np.zeros(3)}}}, old)   # a format-1 file
    with pytest.raises(CrossViewError, match=r"older CrossView.*numpy"):
        eio.load_checkpoint(old)
    nofmt = tmp_path / "nofmt.pt"
    torch.save({"model": torch.zeros(2)}, nofmt)                                   # someone else's weights
    with pytest.raises(CrossViewError, match=r"older CrossView or by another program; retrain"):
        eio.load_checkpoint(nofmt)
    listy = tmp_path / "list.pt"
    torch.save([1, 2], listy)
    with pytest.raises(CrossViewError, match="another program"):
        eio.load_checkpoint(listy)
    bad_fields = tmp_path / "fields.pt"
    eio.save_checkpoint(bad_fields, {"method_state": {"method": "cca", "params": "not a dict"}})
    with pytest.raises(CrossViewError, match="does not fit"):
        Method.load(bad_fields)


def test_a_cut_short_or_foreign_checkpoint_is_one_clean_sentence(tmp_path, finished_run):
    """torch's own text stops mid-sentence ("... your checkpoint file is") or advises weights_only=False."""
    data = (finished_run / "checkpoint.pt").read_bytes()
    for name, content, reason in (
            ("cut.pt", data[:len(data) // 2], "its archive is cut short or damaged"),
            ("empty.pt", b"", "it is empty"),
            ("text.pt", b"hello\n", "it is not a PyTorch file of tensors, or it is damaged (KeyError)"),
            ("noise.pt", np.random.default_rng(0).bytes(4000),
             "it is not a PyTorch file of tensors: neither torch.save's archive nor a pickle of tensors")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CrossViewError) as e:
            eio.load_checkpoint(tmp_path / name)
        assert str(e.value) == (f"{tmp_path / name}: cannot read the checkpoint ({reason}); it is damaged or from "
                                "another program; retrain (or resume from a checkpoint written by this version)")


def test_a_planted_or_garbage_weights_file_is_one_line_without_torchs_advice(tmp_path, evil, capsys):
    """``--weights F``: a planted pickle or noise is named as a file CrossView cannot read safely; torch's advice to
    re-run torch.load with weights_only=False (which would run the planted code) is never passed on."""
    data, marker = evil
    planted, noise = tmp_path / "planted.pth", tmp_path / "noise.pth"
    planted.write_bytes(data)
    noise.write_bytes(np.random.default_rng(1).bytes(3000))
    for f, reason in ((planted, "it asks to run or build exec, which CrossView never loads"),
                      (noise, "it is not a PyTorch file of tensors: neither torch.save's archive nor a pickle of "
                              "tensors")):
        assert main(["features", "extract", "--data", "demo", "--image-encoder", "resnet18", "--weights", str(f),
                     "--text-encoder", "tfidf", "--no-cache", "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == (f"crossview: error: weights file {f} for resnet18 is not a weights file CrossView can "
                           f"read safely ({reason}); copy it again if it was cut short, or pass a state dict saved "
                           "with torch.save(model.state_dict(), ...) to --weights")
        assert not any("weights_only" in line or "Traceback" in line for line in err)
    assert not marker.exists()


@pytest.mark.parametrize("content, reason", [
    (b"", "it is empty"),
    (np.random.default_rng(2).bytes(4000), "it is not a zip archive of arrays"),
    (b"\x80\x04\x95" + bytes(20), "it is not a zip archive of arrays"),          # a pickle: numpy offers to load it
    ("object", "it holds pickled Python objects, which CrossView never loads"),
    ("cut", "the archive is damaged or cut short"),
    ("npy", "it is a single .npy array, not an .npz archive"),
])
def test_read_npz_never_unpickles_and_says_why_in_one_line(tmp_path, content, reason):
    path = tmp_path / "x.npz"
    if content == "object":
        np.savez(path, a=np.array([{"a": 1}, None], dtype=object))
    elif content == "cut":
        np.savez(path, a=np.arange(1000))
        path.write_bytes(path.read_bytes()[:600])
    elif content == "npy":
        with open(path, "wb") as f:
            np.save(f, np.arange(3))
    else:
        path.write_bytes(content)
    with pytest.raises(eio.NpzFileError) as e:
        eio.read_npz(path, todo="do this")
    assert str(e.value) == (f"{path}: not a valid .npz written by CrossView ({reason}): it is damaged or comes from "
                            "elsewhere; do this")
    assert e.value.reason == reason and "allow_pickle" not in str(e.value) and "\n" not in str(e.value)
    np.savez(path, a=np.arange(3), b=np.ones(2))
    assert set(eio.read_npz(path, todo="")) == {"a", "b"} and set(eio.read_npz(path, ("b", "c"), todo="")) == {"b"}


# ---------------------------------------------------------------------------- one writer per run folder
def _npy_header(text: str) -> bytes:
    body = text.encode().ljust(118) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body + bytes(96)


@pytest.mark.parametrize("content, reason", [
    (b"", "it is empty"),
    (b"\x80\x04\x95" + bytes(20), "not a .npy file: another format, or pickled Python objects, which CrossView "
                                   "never loads"),
    (b"hello, world", "not a .npy file: another format, or pickled Python objects, which CrossView never loads"),
    ("object", "it holds Python objects, which CrossView never loads"),
    ("cut", "it is cut short: its data is shorter than its header says"),
    ("npz", "it is an .npz archive, not a single .npy array"),
    (_npy_header("{'descr': '<f4', 'shape': (4, 6 "), "its header is damaged"),       # numpy: tokenize.TokenError
    (_npy_header("[" * 100), "its header is damaged"),
    (_npy_header("__import__('os').system('touch pwned')"), "its header is damaged"),
    (_npy_header(f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({2**62}, 6)}}"), "its header is damaged"),
])
def test_open_npy_never_unpickles_and_says_why_in_one_line(tmp_path, content, reason, recwarn):
    """Every .npy from elsewhere (precomp features, a gallery, GloVe's vectors) is opened by ``open_npy``: numpy's
    header parser raised SyntaxError / TokenError / RecursionError on a damaged header, which its callers let
    through as a traceback."""
    path = tmp_path / "x.npy"
    if content == "object":
        np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    elif content == "cut":
        np.save(path, np.arange(1000, dtype=np.float32))
        path.write_bytes(path.read_bytes()[:600])
    elif content == "npz":
        with open(path, "wb") as f:
            np.savez(f, a=np.arange(3))
    else:
        path.write_bytes(content)
    with pytest.raises(eio.NpyFileError) as e:
        eio.open_npy(path, todo="do this")
    assert str(e.value) == f"{path}: not a readable .npy array ({reason}); do this"
    assert e.value.reason == reason and "\n" not in str(e.value)
    assert not (tmp_path / "pwned").exists()
    assert [w for w in recwarn if issubclass(w.category, RuntimeWarning)] == []     # numpy's overflow warning
    np.save(path, np.ones((3, 2), dtype=np.float32))
    arr = eio.open_npy(path, todo="")
    assert isinstance(arr, np.memmap) and arr.shape == (3, 2) and not arr.flags.writeable
    with pytest.raises(eio.NpyFileError, match="no such file; do this"):
        eio.open_npy(tmp_path / "missing.npy", todo="do this")
    with pytest.raises(CrossViewError, match="not a regular file"):
        eio.open_npy(tmp_path, todo="do this")


def test_a_second_writer_in_the_same_process_is_refused_and_the_lock_is_released(tmp_path, toy):
    ds, feats = toy
    run = tmp_path / "run"
    first = train("toy_iterative", ds, run_dir=run, features=feats, device="cpu", params={"epochs": 50})
    for ev in first:
        if isinstance(ev, CheckpointSaved):
            break
    assert run_is_locked(run) == os.getpid()
    with pytest.raises(CrossViewError, match=rf"PID {os.getpid()} .*wait for it to finish"):
        resume(run, data=ds, features=feats)
    first.close()
    assert run_is_locked(run) is None and not (run / "writer.json").exists()

    # Two resumes made before either runs: the lock, not the early check, decides.
    a = resume(run, data=ds, features=feats)
    b = resume(run, data=ds, features=feats)
    next(a)
    status_before = (run / "status.json").read_bytes()
    metrics_before = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(CrossViewError, match=rf"PID {os.getpid()}"):
        next(b)
    assert (run / "status.json").read_bytes() == status_before      # the refused writer touched nothing
    assert (run / "metrics.jsonl").read_bytes() == metrics_before
    a.close()
    assert read_status(run)["status"] == "cancelled" and run_is_locked(run) is None


def test_the_lock_is_released_when_a_run_fails(tmp_path, toy, monkeypatch):
    ds, feats = toy
    run = tmp_path / "run"

    def boom(self, *a, **k):
        raise RuntimeError("boom")
        yield  # pragma: no cover

    monkeypatch.setattr(H.ToyIterative, "fit_iter", boom)
    with pytest.raises(RuntimeError, match="boom"):
        list(train("toy_iterative", ds, run_dir=run, features=feats, device="cpu"))
    assert read_status(run)["status"] == "failed" and run_is_locked(run) is None


def _write_precomp(folder: Path, ds) -> Path:
    folder.mkdir(parents=True)
    for prefix, split in (("train", "train"), ("dev", "val"), ("test", "test")):
        idx = sorted(set(ds.splits[split].tolist()))
        np.save(folder / f"{prefix}_ims.npy", np.asarray(ds.image_features)[idx])
        (folder / f"{prefix}_caps.txt").write_text(
            "\n".join(c for c, i in zip(ds.captions, ds.caption_image) if i in set(idx)) + "\n")
    return folder


RESUME_CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import _engine_helpers  # registers toy_iterative
    import crossview.engine.run as R
    from crossview.cli import main

    real_save = R.save_checkpoint

    def save_and_tell(path, payload):   # the parent waits on these lines, not on a clock
        out = real_save(path, payload)
        print("SAVED", payload["events"], flush=True)
        return out

    R.save_checkpoint = save_and_tell
    sys.exit(main(["train", "--resume", sys.argv[1]]))
""")


def _loss_steps(run: Path) -> list[int]:
    return [d["step"] for d in eio.read_events(run / "metrics.jsonl") if d.get("event") == "loss"]


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL") or not hasattr(os, "pidfd_open"),
                    reason="needs POSIX signals and pidfd_open (Linux)")
def test_two_processes_resuming_one_run_then_a_sigkill_then_a_clean_resume(tmp_path, toy):
    ds, _ = toy
    data = _write_precomp(tmp_path / "data", ds)
    run = tmp_path / "run"
    gen = train("toy_iterative", str(data), run_dir=run, text_encoder="bow", device="cpu",
                params={"epochs": 10**6, "batch_size": 8})
    for ev in gen:
        if isinstance(ev, CheckpointSaved):
            break
    gen.close()

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tests_dir = str(Path(__file__).resolve().parent)
    # Output to files: a pipe nobody reads would fill up and stall the writer.
    errs = [open(tmp_path / f"stderr{i}.txt", "w+") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", RESUME_CHILD, str(run), tests_dir], stdout=subprocess.PIPE,
                              stderr=errs[i], env=env, text=True) for i in range(2)]
    pidfds = [os.pidfd_open(p.pid) for p in procs]   # readable once that process has exited
    try:
        ready, _, _ = select.select(pidfds, [], [], 180)
        assert ready, "neither process ended within 3 minutes"
        loser = procs[pidfds.index(ready[0])]
        winner = next(p for p in procs if p is not loser)
        loser.wait(timeout=30)
        err = (tmp_path / f"stderr{procs.index(loser)}.txt").read_text()
        assert loser.returncode == 2, err[-2000:]
        assert winner.poll() is None, (tmp_path / f"stderr{procs.index(winner)}.txt").read_text()[-2000:]
        winner_pid = winner.pid                                          # the other one proceeds
        lines = err.strip().splitlines()
        assert len(lines) == 1 and f"PID {winner_pid} " in lines[0] and "wait for it to finish" in lines[0], lines
        assert run_is_locked(run) == winner_pid
        # Let it train past a checkpoint at 100+ events and the next one (status.json is rewritten between
        # the two, so it says >= 100 too), then kill it for real.
        late_saves = 0
        for line in winner.stdout:
            if line.startswith("SAVED") and int(line.split()[1]) >= 100:
                late_saves += 1
                if late_saves == 2:
                    break
        assert late_saves == 2, (tmp_path / f"stderr{procs.index(winner)}.txt").read_text()[-2000:]
        os.kill(winner.pid, signal.SIGKILL)
        winner.wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        for f in errs:
            f.close()
        for fd in pidfds:
            os.close(fd)
        for p in procs:
            p.stdout.close()
    assert run_is_locked(run) is None                       # the OS dropped the dead process's lock
    status = read_status(run)
    ckpt = eio.load_checkpoint(run / "checkpoint.pt")
    assert status["status"] == "running"                    # it never got to say otherwise ...
    # ... but it says where the checkpoint is: status.json is rewritten just after each checkpoint, so a kill
    # landing between the two writes leaves it one checkpoint (one epoch: 24 losses, 24 progress, 1 validation)
    # behind; this toy checkpoints every few milliseconds, so that happens here often.
    behind = ckpt["events"] - status["checkpoint_events"]
    assert status["checkpoint_events"] >= 100 and behind in (0, 49), (status, ckpt["events"])
    assert status["checkpoint_step"] == ckpt["step"] - (24 if behind else 0)

    # A new writer takes the stale lock over, continues, and the curves read back never go backwards.
    again = resume(run)
    notes, losses = [], 0
    for ev in again:
        if isinstance(ev, Log):
            notes.append(ev.message)
        if isinstance(ev, Loss):
            losses += 1
            if losses == 20:
                break
    again.close()
    assert any(f"left by PID {winner_pid}" in n for n in notes), notes
    steps = _loss_steps(run)
    assert steps == sorted(set(steps)) and steps == list(range(1, len(steps) + 1))
    assert run_is_locked(run) is None


# ---------------------------------------------------------------------------- status and metrics tell the truth
def test_status_json_is_updated_at_each_checkpoint(tmp_path, toy):
    ds, feats = toy
    run = tmp_path / "run"
    gen = train("toy_iterative", ds, run_dir=run, features=feats, device="cpu", params={"epochs": 4})
    saved = 0
    for ev in gen:
        if isinstance(ev, CheckpointSaved):
            saved += 1
            if saved == 2:
                break
    status = read_status(run)
    ckpt = eio.load_checkpoint(run / "checkpoint.pt")
    assert status["status"] == "running" and status["phase"] == "training"
    assert status["checkpoint"] == "checkpoint.pt"
    assert status["checkpoint_events"] == ckpt["events"] == ev.step > 0
    assert status["checkpoint_step"] == ckpt["step"] == 12          # 2 epochs of 6 batches
    gen.close()


def test_resume_trims_the_metrics_logged_after_the_checkpoint(tmp_path, toy):
    ds, feats = toy
    run = tmp_path / "run"
    gen = train("toy_iterative", ds, run_dir=run, features=feats, device="cpu", params={"epochs": 3})
    after = None
    for ev in gen:
        if isinstance(ev, CheckpointSaved):
            after = 0
        elif after is not None and isinstance(ev, Loss):
            after += 1
            if after == 3:
                break
    # Stop the way a kill does: the last checkpoint stands, metrics.jsonl is 3 batches ahead of it.
    with pytest.raises(KeyboardInterrupt):
        gen._gen.throw(KeyboardInterrupt)
    assert read_status(run)["status"] == "cancelled"
    steps = _loss_steps(run)
    assert steps[-3:] == [7, 8, 9]
    events = list(resume(run, data=ds, features=feats))
    assert isinstance(events[-1], Finished)
    assert any(isinstance(e, Log) and "metrics.jsonl: dropped" in e.message for e in events)
    steps = _loss_steps(run)
    assert steps == list(range(1, 19)), steps                       # no step twice, none going backwards
    lines = [d for d in eio.read_events(run / "metrics.jsonl")]
    assert any(d.get("event") == "log" and "run cancelled" in d.get("message", "") for d in lines)


# ---------------------------------------------------------------------------- damaged run files
@pytest.mark.parametrize("content", [b"[]", b'{"method": 3}', b'{"method": "toy_iterative", "seed": "x"}',
                                     b'{"method": "toy_iterative", "data": "\xff\xfe"}', b"\x80\x81{",
                                     b"[" * 100_000])
def test_a_damaged_config_gives_one_clear_line(tmp_path, finished_run, toy, content, capsys):
    run = _copy_run(finished_run, tmp_path / "run")
    (run / "config.json").write_bytes(content)
    with pytest.raises(CrossViewError, match=r"config\.json: .*(damaged|restore)"):
        resume(run, data=toy[0], features=toy[1])
    with pytest.raises(CrossViewError, match=r"config\.json: "):
        open_run(run, dataset=toy[0])
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.json" in err[0]
    assert run in list_runs(tmp_path)


@pytest.mark.parametrize("content", [b"[]", b'{"status": 1}', b'{"status": "finished", "events": "many"}',
                                     b"\xff\xfe\x00"])
def test_a_damaged_status_gives_one_clear_line(tmp_path, finished_run, content):
    run = _copy_run(finished_run, tmp_path / "run")
    (run / "status.json").write_bytes(content)
    with pytest.raises(CrossViewError, match=r"status\.json: "):
        read_status(run)
    with pytest.raises(CrossViewError, match=r"status\.json: "):
        resume(run)                   # finished (a summary exists): the status decides, and is damaged


@pytest.mark.parametrize("content", [b"[]", b'{"rsum": "high"}', b'{"i2t": "x"}', b'{"i2t": {"R@1": "a"}}',
                                     b'{"method": ["cca"]}', b"\xc3\x28"])
def test_a_damaged_summary_gives_one_clear_line(tmp_path, finished_run, toy, content):
    run = _copy_run(finished_run, tmp_path / "run")
    (run / "summary.json").write_bytes(content)
    with pytest.raises(CrossViewError, match=r"summary\.json: "):
        read_summary(run)
    with pytest.raises(CrossViewError, match=r"summary\.json: "):
        open_run(run, dataset=toy[0])


def test_read_events_skips_only_the_bad_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"event": "loss", "step": 1, "epoch": 0}\n'
                     b'{"event": "loss", "step": \xff2}\n'          # not UTF-8
                     b'[]\n"text"\n' + b"[" * 50_000 + b"\n"
                     b'{"event": "loss", "step": 3, "epoch": 0}\n'
                     b'{"event": "lo')                               # torn
    assert [d["step"] for d in eio.read_events(path)] == [1, 3]
    assert list(eio.read_events(tmp_path / "missing.jsonl")) == []


def test_list_runs_survives_odd_entries(tmp_path, finished_run):
    good = _copy_run(finished_run, tmp_path / "good")
    bad = _copy_run(finished_run, tmp_path / "bad")
    (bad / "config.json").write_bytes(b"\xff")
    (tmp_path / "dangling").mkdir()
    (tmp_path / "dangling" / "config.json").symlink_to(tmp_path / "nowhere")
    (tmp_path / "plain-file").write_text("x")
    assert set(list_runs(tmp_path)) == {good, bad}


def test_read_json_object_names_the_key_and_type(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"a": True, "b": 1}))
    with pytest.raises(CrossViewError, match=r"'a' should be an integer, got True"):
        eio.read_json_object(p, required={"a": int})
    assert eio.read_json_object(p, optional={"b": float}) == {"a": True, "b": 1}
    with pytest.raises(CrossViewError, match=r"no 'c'; do this"):
        eio.read_json_object(p, required={"c": str}, hint="do this")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_place_of_a_run_file_is_refused_not_waited_on(tmp_path, finished_run):
    run = _copy_run(finished_run, tmp_path / "run")
    for name in ("status.json", "summary.json", "metrics.jsonl"):
        (run / name).unlink()
        os.mkfifo(run / name)
    with pytest.raises(CrossViewError, match=r"status\.json: not a regular file"):
        read_status(run)
    with pytest.raises(CrossViewError, match=r"summary\.json: .*not a regular file|no summary\.json"):
        read_summary(run)
    with pytest.raises(CrossViewError, match=r"metrics\.jsonl: not a regular file"):
        list(eio.read_events(run / "metrics.jsonl"))


# ---------------------------------------------------------------------------- run settings are the run's
def test_a_run_written_on_a_gpu_resumes_and_opens_on_the_device_asked_for_now(tmp_path, toy):
    """A checkpoint keeps learned state and the method's hyperparameters, never the device (nor worker counts):
    a run whose checkpoint and config say cuda:0 (as one written on a GPU machine does, before this rule too)
    resumes with --device cpu on the CPU, its log says so, and loading it for queries does not ask for CUDA."""
    ds, feats = toy
    run = tmp_path / "run"
    params = {"dim": 16, "max_epochs": 4, "batch_size": 32, "lr": 0.01}
    gen = train("wsabie", ds, run_dir=run, features=feats, device="cpu", params=params, checkpoint_seconds=0.0)
    for ev in gen:
        if isinstance(ev, CheckpointSaved):
            break
    gen.close()
    ckpt = eio.load_checkpoint(run / "checkpoint.pt")
    assert "device" not in ckpt["method_state"]["params"], "a checkpoint holds no run setting"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["device"] == "cpu" and "device" not in cfg["params"], "config.json: the run's device, once"
    # what a GPU machine wrote (and what checkpoints before this rule held)
    ckpt["method_state"]["params"]["device"] = "cuda:0"
    eio.save_checkpoint(run / "checkpoint.pt", ckpt)
    cfg.update(device="cuda:0", device_selected="cuda:0", user_params={**params, "device": "cuda:0"})
    (run / "config.json").write_text(json.dumps(cfg))
    events = list(resume(run, data=ds, features=feats, device="cpu"))
    assert isinstance(events[-1], Finished), events[-1]
    assert events[-1].summary["device"] == "cpu"
    logged = [e.message for e in events if isinstance(e, Log)]
    assert any("device cpu" in m for m in logged), logged
    # loading that checkpoint for queries (open_run's way) keeps the device of the object loading it
    from crossview.methods import create_method
    m = create_method("wsabie").with_run(device="cpu").load_state_dict(ckpt["method_state"])
    assert m.device == "cpu" and m.dim == 16 and "device" not in m.get_params()


def test_run_settings_are_one_object_recorded_once_and_never_in_the_method(tmp_path, toy):
    """Device, seed, amp, workers, loss-logging and checkpoint cadence are the run's settings: given among the
    method's parameters (``--set seed=3``) they are taken out into the run settings, which config.json and the
    summary record whole; the method's saved parameters (config.json and the checkpoint) hold none of them; a
    setting given two ways, differently, is refused before anything is written."""
    from crossview.core.run_settings import RunSettings
    from crossview.methods import method_class

    ds, feats = toy
    params = {"dim": 16, "max_epochs": 2, "batch_size": 32, "lr": 0.01, "seed": 3, "log_every": 5}
    events = list(train("wsabie", ds, run_dir=tmp_path / "r", features=feats, device="cpu", params=params,
                        checkpoint_seconds=30.0))
    assert isinstance(events[-1], Finished)
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    want = RunSettings(device="cpu", seed=3, log_every=5, checkpoint_seconds=30.0, train_split=cfg["train_split"],
                       val_split=cfg["val_split"], eval_split=cfg["split"]).to_dict()
    assert cfg["run_settings"] == want and events[-1].summary["run_settings"] == want
    assert cfg["seed"] == 3 and cfg["user_params"] == params, "what the user typed is kept as typed"
    run_names = method_class("wsabie").RUN_SETTINGS
    assert not set(cfg["params"]) & run_names and not set(events[-1].summary["params"]) & run_names
    ckpt = eio.load_checkpoint(tmp_path / "r" / "checkpoint.pt")
    assert not set(ckpt["method_state"]["params"]) & run_names, "a checkpoint holds no run setting"
    logged = " ".join(e.message for e in events if isinstance(e, Log))
    assert "device cpu, seed 3, amp off" in logged
    with pytest.raises(CrossViewError, match="seed is given twice"):
        train("wsabie", ds, run_dir=tmp_path / "x", features=feats, seed=5, params={**params, "seed": 3})
    assert not (tmp_path / "x").exists()


def test_a_start_makes_one_method_object(tmp_path, toy, monkeypatch):
    """One method object per start: the run makes it, gives it the run settings and the default normalisations
    are read from it (they used to be read from a second, throw-away object)."""
    import functools

    from crossview.methods import method_class

    cls = method_class("wsabie")
    made = []
    original = cls.__init__

    @functools.wraps(original)
    def counting(self, *args, **kwargs):
        made.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", counting)
    ds, feats = toy
    gen = train("wsabie", ds, run_dir=tmp_path / "r", features=feats, device="cpu",
                params={"dim": 8, "max_epochs": 1, "batch_size": 32})
    assert len(made) == 1
    events = list(gen)
    assert isinstance(events[-1], Finished) and len(made) == 1
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (cfg["image_norm"], cfg["text_norm"]) == (cls.default_image_norm, cls.default_text_norm)


def test_the_panel_previews_skip_a_run_whose_summary_is_damaged(tmp_path, finished_run, monkeypatch):
    """``crossview.gui.app.demo_run`` (the panels' ``python -m`` previews) read each run's summary with
    ``json.loads``: a summary holding a list raised AttributeError, and a pipe in its place would hang the read."""
    from crossview.core.settings import get_settings
    from crossview.gui.app import demo_run

    monkeypatch.setenv("CROSSVIEW_HOME", str(tmp_path / "home"))
    runs = get_settings().runs_dir
    good = _copy_run(finished_run, runs / "good")
    summary = json.loads((good / "summary.json").read_text())
    (good / "summary.json").write_text(json.dumps({**summary, "dataset": "demo"}))
    listed = _copy_run(good, runs / "a-list")
    (listed / "summary.json").write_text("[1, 2]")
    piped = _copy_run(good, runs / "a-pipe")
    (piped / "summary.json").unlink()
    os.mkfifo(piped / "summary.json")
    for age, run in enumerate((piped, listed, good)):      # the damaged ones newest: list_runs gives them first
        os.utime(run / "config.json", (1e9 - age, 1e9 - age))
    assert demo_run() == str(good)
