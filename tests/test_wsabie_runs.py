"""WSABIE on the shared trainer inside real runs: a SIGKILL mid-epoch and a resume give the uninterrupted
run's weights exactly, and ``torchrun`` with 2 CPU processes (gloo) trains one run that rank 0 alone writes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import _engine_helpers as H
from crossview.core.events import Finished
from crossview.engine.run import read_status, resume, train
from crossview.methods.base import Method

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PARAMS = {"dim": 8, "batch_size": 16, "max_epochs": 3, "lr": 0.01, "lr_decay_epoch": 2}

CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    import _engine_helpers as H
    from crossview.engine import train
    from crossview.core.events import CheckpointSaved

    ds = H.make_toy_dataset()
    for ev in train("wsabie", ds, run_dir=sys.argv[1], features=H.toy_features(ds), device="cpu",
                    params=dict(PARAMS), checkpoint_seconds=0.0):
        if isinstance(ev, CheckpointSaved):
            print("SAVED", ev.step, flush=True)
""").replace("dict(PARAMS)", repr(PARAMS))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _weights(run_dir: Path) -> dict[str, np.ndarray]:
    m = Method.load(run_dir / "checkpoint.pt")
    return {"V": np.asarray(m.V_), "Z": np.asarray(m.Z_)}


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_sigkill_mid_epoch_then_resume_is_exact(tmp_path) -> None:
    ds = H.make_toy_dataset()
    ref = tmp_path / "ref"
    events = list(train("wsabie", ds, run_dir=ref, features=H.toy_features(ds), device="cpu", params=PARAMS))
    assert isinstance(events[-1], Finished)
    n_batches = -(-ds.split("train").n_captions // PARAMS["batch_size"])

    killed = tmp_path / "killed"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen([sys.executable, str(script), str(killed), str(TESTS)], stdout=subprocess.PIPE,
                             text=True, env=_env())
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("SAVED") and int(line.split()[1]) == n_batches + 2:   # mid-epoch 2
                os.kill(child.pid, signal.SIGKILL)
                break
    finally:
        child.wait(timeout=120)
    assert child.returncode == -signal.SIGKILL
    assert read_status(killed)["status"] == "running"          # killed: nobody wrote "cancelled"

    events = list(resume(killed, data=ds, features=H.toy_features(ds)))
    assert isinstance(events[-1], Finished)
    want, got = _weights(ref), _weights(killed)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert json.loads((killed / "summary.json").read_text())["rsum"] == \
        json.loads((ref / "summary.json").read_text())["rsum"]


TORCHRUN_CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import torch
    torch.set_num_threads(1)
    import _engine_helpers as H
    from crossview.engine import train
    from crossview.core.events import Finished

    ds = H.make_toy_dataset()
    last = None
    for ev in train("wsabie", ds, run_dir=sys.argv[1], features=H.toy_features(ds), device="cpu",
                    params=dict(PARAMS)):
        last = ev
    print("RANK", os.environ["RANK"], type(last).__name__, flush=True)
""").replace("dict(PARAMS)", repr(PARAMS))


@pytest.mark.slow
def test_torchrun_two_cpu_processes_write_one_run(tmp_path) -> None:
    """``torchrun --nproc_per_node 2``: both processes train (gloo), rank 0 alone writes the folder, and the
    run's files are those of a normal run (one config, one summary, each step logged once)."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python")
    script = tmp_path / "child.py"
    script.write_text(TORCHRUN_CHILD)
    run_dir = tmp_path / "run"
    out = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(script), str(run_dir), str(TESTS)],
                         capture_output=True, text=True, env=_env(), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RANK 0 Finished" in out.stdout and "RANK 1" in out.stdout
    assert "RANK 1 Finished" not in out.stdout               # rank 1 trains but never evaluates or writes
    assert read_status(run_dir)["status"] == "finished"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["method"] == "wsabie" and summary["rsum"] > 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [x for x in lines if x.get("event") == "validation"]
    assert [x["epoch"] for x in epochs] == [1, 2, 3]           # logged once, by rank 0
    assert not list(run_dir.glob(".*.tmp"))
