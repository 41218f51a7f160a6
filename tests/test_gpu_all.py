"""bench/gpu_all.sh, the one script of a GPU session, checked without a GPU: it parses (``bash -n``), its
``--dry-run`` lists every command, and every command it lists exists: the test functions it runs are defined,
the bench scripts are present and accept every flag given (their ``--help``), and ``crossview train`` accepts
its options and method parameters."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "gpu_all.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _dry_run() -> list[list[str]]:
    r = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "PY": sys.executable})
    assert r.returncode == 0, r.stderr
    return [shlex.split(line) for line in r.stdout.splitlines() if line.strip()]


def _flags(words: list[str]) -> set[str]:
    return {w.split("=", 1)[0] for w in words if w.startswith("--")}


def test_the_script_parses_and_refuses_unknown_arguments() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    r = subprocess.run(["bash", str(SCRIPT), "--fast"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown argument --fast" in r.stderr


def test_every_command_of_the_dry_run_exists_and_takes_its_flags() -> None:
    cmds = _dry_run()
    kinds = [c[0] if c[0] != "python" else (c[1] if c[1] != "-m" else c[2]) for c in cmds]
    assert kinds[0] == "pytest" and "crossview" in kinds
    scripts = {c[1] for c in cmds if c[0] == "python" and c[1].startswith("bench/")}
    # the registry's GPU entries are all covered, and every step runs under its own timeout
    assert {"bench/vsepp_epoch.py", "bench/vsepp_e2e.py", "bench/topk_scale.py", "bench/wsabie_train.py",
            "bench/scale.py"} <= scripts
    text = SCRIPT.read_text(encoding="utf-8")
    for entry in ("vsepp_epoch_gpu", "deep_step_gpu", "topk_scale_gpu", "wsabie_train_cuda", "scale_gpu"):
        assert re.search(rf'^wanted \w+ && step "{entry}" (\d+|"\$\{{\w+:-\d+\}}") entry {entry} ', text, re.M), entry
    # every step under its own limit, each one of --only's names
    steps = re.findall(r'^\s*(?:wanted (\w+) && )?step "', text, re.M)
    assert len(steps) == 8 and set(steps) == {"tests", "epoch", "deep", "e2e", "topk", "wsabie", "scale", ""}, steps
    assert "scale" not in re.search(r'^ONLY="([^"]*)"', text, re.M).group(1)      # opt-in: about 4 minutes more

    # the CUDA tests: files present, functions defined
    node_ids = [w for w in cmds[0] if "::" in w]
    assert node_ids and any("test_learns_on_a_gpu" in n for n in node_ids)
    for node in node_ids:
        path, name = node.split("::")
        assert re.search(rf"^def {name}\(", (REPO / path).read_text(encoding="utf-8"), re.M), node

    # the bench scripts: present, and their --help names every flag used (all --help run at once)
    used: dict[str, set[str]] = {}
    for c in cmds:
        if c[0] == "python" and c[1].startswith("bench/"):
            assert (REPO / c[1]).is_file(), c[1]
            used.setdefault(c[1], set()).update(_flags(c[2:]))
    train = next(c for c in cmds if c[0] == "crossview")
    helps = {s: subprocess.Popen([sys.executable, s, "--help"], cwd=REPO, stdout=subprocess.PIPE, text=True)
             for s in used}
    helps["train"] = subprocess.Popen([sys.executable, "-m", "crossview", "train", train[2], "--help"], cwd=REPO,
                                      stdout=subprocess.PIPE, text=True)
    out = {k: p.communicate(timeout=120)[0] for k, p in helps.items()}
    assert all(p.returncode == 0 for p in helps.values()), {k: p.returncode for k, p in helps.items()}
    for script, flags in used.items():
        missing = [f for f in flags if f not in out[script]]
        assert not missing, (script, missing)

    # crossview train: its options, and each --set NAME=VALUE a parameter of the method with that value allowed
    assert train[:3] == ["crossview", "train", "vsepp"]
    missing = [f for f in _flags(train[3:]) if f not in out["train"]]
    assert not missing, missing
    sets = [train[i + 1] for i, w in enumerate(train) if w == "--set"]
    assert sets
    for s in sets:
        name, value = s.split("=", 1)
        line = next((ln for ln in out["train"].splitlines() if ln.strip().startswith(f"{name} (")), None)
        assert line is not None, name
        if "{" in line:
            assert value in line.split("{", 1)[1], (name, value, line)


def test_the_end_to_end_bench_splits_decoding_from_augmenting(tmp_path: Path) -> None:
    """vsepp_e2e.py --phases on a GPU also times nvJPEG's decoding, the crops' drawing and the device's
    augmentation apart (decode_split): here on the CPU, whose decoder takes the same calls."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import vsepp_e2e
    finally:
        sys.path.remove(str(REPO / "bench"))
    paths = vsepp_e2e.write_jpegs(tmp_path, 130)
    dec, aug, draw = vsepp_e2e.decode_split(paths, "cpu", 1, "efficientnet_lite0")
    assert dec > 0 and aug > 0 and draw > 0
