"""Not collected by the suite (its name does not start with ``test_``): ``test_crash_dump`` runs it in a fresh pytest
to crash the interpreter on purpose and read the fault dump."""

import os
import threading

import pytest


@pytest.mark.skipif(os.environ.get("CROSSVIEW_SEGV_PROBE") != "1", reason="only run by test_crash_dump")
def test_the_interpreter_crashes_here() -> None:
    import ctypes

    gate = threading.Event()
    threading.Thread(target=gate.wait, name="a-bystander", daemon=True).start()   # a thread the dump must leave out
    ctypes.string_at(0)                      # a read at address 0: SIGSEGV
