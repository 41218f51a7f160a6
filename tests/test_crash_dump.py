"""A crash in the test process (a segfault in Qt, torch or numpy) shows where it happened: the fault dump holds the
faulting thread's stack only, so it fits the head of a CI report (tests/conftest.py's pytest_configure)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGSEGV from a null read: Linux")
def test_a_segfault_dumps_the_faulting_thread_only(tmp_path) -> None:
    env = {**os.environ, "CROSSVIEW_SEGV_PROBE": "1", "TMPDIR": str(tmp_path)}   # the crashed session's temp folder
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "_segv_probe.py")],
                         cwd=HERE.parent, capture_output=True, text=True, timeout=300, env=env)
    dump = out.stderr + out.stdout
    assert out.returncode != 0 and "Fatal Python error: Segmentation fault" in dump, dump[-2000:]
    head = dump[dump.index("Fatal Python error"):][:1500]
    assert "test_the_interpreter_crashes_here" in head, head
    assert "Thread 0x" not in dump and "gate.wait" not in dump, "only the faulting thread's stack"
