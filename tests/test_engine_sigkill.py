"""A run killed with SIGKILL while it writes a checkpoint keeps the previous checkpoint, and resumes from it.

The child process trains the toy iterative method with a large state (a 12 MB checkpoint). Its
checkpoint writer is slowed down from the second checkpoint on: half of the bytes go to the temp file,
then it announces itself and waits. The parent kills it with SIGKILL at that moment, for real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import _engine_helpers as H
from crossview.core import io as eio
from crossview.core.events import Finished, Loss
from crossview.engine.run import read_status, resume
from crossview.data.method_data import MethodData

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[2])
    import _engine_helpers as H
    import crossview.core.io as eio
    from crossview.engine import train
    from crossview.core.events import CheckpointSaved

    files = []                  # the temp files written so far (a checkpoint is streamed in chunks, one file each)
    real_write = eio._write_payload

    def slow_write(f, data):
        if f not in files:
            files.append(f)
        if len(files) >= 2 and len(data) >= 2**20:
            # the second checkpoint, part written (what came before the ballast and half of it): wait for SIGKILL
            half = len(data) // 2
            f.write(data[:half])
            f.flush()
            os.fsync(f.fileno())
            print("WRITING", os.fstat(f.fileno()).st_size, flush=True)
            signal.pause()
        real_write(f, data)

    eio._write_payload = slow_write
    ds = H.make_toy_dataset()
    for ev in train("toy_iterative", ds, run_dir=sys.argv[1], features=H.toy_features(ds), device="cpu",
                    params={"epochs": 3, "ballast_mb": 12}, checkpoint_seconds=1e9):
        if isinstance(ev, CheckpointSaved):
            print("SAVED", ev.step, flush=True)
""")


def test_sigkill_mid_checkpoint_keeps_the_previous_one(tmp_path):
    run_dir = tmp_path / "run"
    tests_dir = Path(__file__).resolve().parent
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir), str(tests_dir)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    try:
        for line in proc.stdout:          # ends when the child exits (then the asserts below say why)
            lines.append(line.strip())
            if line.startswith("WRITING"):
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        if proc.poll() is None and not any(x.startswith("WRITING") for x in lines):
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, (lines, proc.stderr.read()[-2000:])
    saved = [x for x in lines if x.startswith("SAVED")]
    assert len(saved) == 1, lines                      # epoch 1's checkpoint was complete
    step_of_first = int(saved[0].split()[1])
    partial_size = int(lines[-1].split()[1])

    # The half-written temp file is there, the checkpoint is the previous one and loads.
    temps = list(run_dir.glob(".checkpoint.pt.*.tmp"))
    assert len(temps) == 1 and temps[0].stat().st_size == partial_size > 5 * 2**20
    ckpt = eio.load_checkpoint(run_dir / "checkpoint.pt")
    assert ckpt["events"] == step_of_first
    assert ckpt["method_state"]["state"]["epoch_"] == 1
    assert ckpt["method_state"]["state"]["ballast_"].nbytes == 12 * 2**20
    assert read_status(run_dir)["status"] == "running"    # it never got to say otherwise

    # Resume continues from epoch 1 and ends like an uninterrupted run.
    ds = H.make_toy_dataset()
    feats = H.toy_features(ds)
    events = list(resume(run_dir, data=ds, features=feats))
    assert isinstance(events[-1], Finished)
    losses = [e for e in events if isinstance(e, Loss)]
    assert losses[0].epoch == 1
    assert not list(run_dir.glob(".checkpoint.pt.*.tmp"))
    final = eio.load_checkpoint(run_dir / "checkpoint.pt")["method_state"]["state"]

    ref = H.ToyIterative(epochs=3).fit(MethodData.from_features(ds, feats[0], feats[1], "train"))
    np.testing.assert_allclose(final["W_"], ref.W_, rtol=1e-12)


CLI_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    import numpy as np
    import _engine_helpers as H
    import crossview.engine.run as R
    from crossview.cli import main

    real_save = R.save_checkpoint

    def save_and_tell(path, payload):   # the parent waits on this line, not on a clock
        out = real_save(path, payload)
        print("SAVED", flush=True)
        return out

    R.save_checkpoint = save_and_tell
    ds = H.make_toy_dataset()
    folder = sys.argv[3]
    import os
    os.makedirs(folder)
    for prefix, split in (("train", "train"), ("dev", "val"), ("test", "test")):
        idx = set(ds.splits[split].tolist())
        np.save(f"{folder}/{prefix}_ims.npy", np.asarray(ds.image_features)[sorted(idx)])
        with open(f"{folder}/{prefix}_caps.txt", "w") as f:
            f.write("\\n".join(c for c, i in zip(ds.captions, ds.caption_image) if i in idx) + "\\n")
    sys.exit(main(["train", "toy_iterative", "--data", folder, "--run-dir", sys.argv[1], "--text-encoder", "bow",
                   "--device", "cpu", "--set", "epochs=1000000"]))
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_in_the_cli_cancels_cleanly(tmp_path, sig):
    """Ctrl-C, and SIGTERM (a scheduler's or `timeout`'s stop) alike: the run checkpoints where it stopped, says
    how to continue, records "cancelled" and resumes from there."""
    run_dir = tmp_path / "run"
    tests_dir = Path(__file__).resolve().parent
    proc = subprocess.Popen([sys.executable, "-c", CLI_CHILD, str(run_dir), str(tests_dir), str(tmp_path / "data")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        for line in proc.stdout:          # ends early only if the child dies (the assert says why)
            if line.startswith("SAVED"):
                break
        assert (run_dir / "checkpoint.pt").exists(), proc.stderr.read() if proc.poll() is not None else ""
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err[-2000:]
    assert f"crossview train --resume {run_dir}" in err
    assert f"{sig.name} received" in err and ("stopped by SIGTERM" if sig == signal.SIGTERM else "cancelled") in err
    status = read_status(run_dir)
    assert status["status"] == "cancelled" and status["checkpoint"] == "checkpoint.pt"
    ckpt = eio.load_checkpoint(run_dir / "checkpoint.pt")
    state = ckpt["method_state"]["state"]
    # Checkpointed at the event where it stopped: the batch count matches the events it reported.
    assert ckpt["phase"] == "training" and state["batches_done_"] >= 1
    n_loss = sum(1 for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"event": "loss"' in line)
    assert state["batches_done_"] == n_loss
    # ... and a resume continues from that batch (the first loss it reports is the next step).
    it = resume(run_dir)
    try:
        first = next(ev for ev in it if isinstance(ev, Loss))
    finally:
        it.close()
    assert first.step == state["batches_done_"] + 1
