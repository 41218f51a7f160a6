"""The run store (crossview.engine.runs) and ``crossview runs``: list / show / rename / delete, refused in one
line naming the PID while another process writes the run; nothing but a run folder is ever deleted."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import _engine_helpers as H
from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.core.events import CheckpointSaved, Finished
from crossview.engine.run import train
from crossview.engine.runs import delete_run, describe_run, list_runs, rename_run

HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from crossview.engine.run import _WriterLock
    lock = _WriterLock(Path(sys.argv[1]))
    lock.acquire()
    print("HELD", flush=True)
    sys.stdin.read()          # hold the run until the parent closes our stdin
    lock.release()
""")


@pytest.fixture(scope="module")
def toy():
    ds = H.make_toy_dataset()
    return ds, H.toy_features(ds)


def _finished(root: Path, name: str, toy) -> Path:
    ds, feats = toy
    events = list(train("cca", ds, run_dir=root / name, features=feats, device="cpu", params={"n_components": 4}))
    assert isinstance(events[-1], Finished)
    return root / name


class _Writer:
    """Another process holding a run's writer lock, as a training in a second terminal does."""

    def __init__(self, run: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.strip() == "HELD", self.proc.stderr.read()

    def __enter__(self) -> "_Writer":
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def test_list_and_describe_show_method_data_status_and_rsum(tmp_path, toy):
    run = _finished(tmp_path, "a", toy)
    ds, feats = toy
    gen = train("toy_iterative", ds, run_dir=tmp_path / "b", features=feats, device="cpu", params={"epochs": 50})
    for ev in gen:
        if isinstance(ev, CheckpointSaved):
            break
    gen.close()
    assert set(list_runs(tmp_path)) == {run, tmp_path / "b"}
    a, b = describe_run(run), describe_run(tmp_path / "b")
    assert (a.method, a.status, a.writer_pid) == ("cca", "finished", None) and a.rsum > 0
    assert (b.method, b.status, b.rsum) == ("toy_iterative", "cancelled", None)
    # "running" in status.json with no process holding the lock: a run that was killed
    status = json.loads((tmp_path / "b" / "status.json").read_text())
    (tmp_path / "b" / "status.json").write_text(json.dumps({**status, "status": "running"}))
    assert describe_run(tmp_path / "b").status == "interrupted"


def test_rename_and_delete_are_refused_while_another_process_writes_the_run(tmp_path, toy):
    run = _finished(tmp_path, "r", toy)
    with _Writer(run) as writer:
        assert describe_run(run).writer_pid == writer.proc.pid
        for act in (lambda: rename_run(run, "s"), lambda: delete_run(run)):
            with pytest.raises(CrossViewError) as e:
                act()
            assert f"PID {writer.proc.pid}" in str(e.value) and "\n" not in str(e.value)
        assert run.is_dir() and (run / "summary.json").is_file() and not (tmp_path / "s").exists()
    moved = rename_run(run, "s")
    assert moved == tmp_path / "s" and (moved / "summary.json").is_file() and not run.exists()
    delete_run(moved)
    assert not moved.exists()


@pytest.mark.parametrize("name,needle", [("", "plain folder name"), ("a/b", "plain folder name"),
                                         ("..", "plain folder name"), ("taken", "exists")])
def test_rename_refuses_bad_names_and_existing_targets(tmp_path, toy, name, needle):
    run = _finished(tmp_path, "r", toy)
    (tmp_path / "taken").mkdir()
    with pytest.raises(CrossViewError, match=needle):
        rename_run(run, name)
    assert (run / "config.json").is_file()


def test_nothing_but_a_run_folder_is_deleted(tmp_path):
    precious = tmp_path / "photos"
    precious.mkdir()
    (precious / "a.jpg").write_bytes(b"x")
    with pytest.raises(CrossViewError, match="not a run folder"):
        delete_run(precious)
    with pytest.raises(CrossViewError, match="no such run folder"):
        delete_run(tmp_path / "nope")
    assert (precious / "a.jpg").is_file()


def test_cli_runs_list_show_rename_delete(tmp_path, toy, capsys):
    run = _finished(tmp_path, "cca-toy", toy)
    assert main(["runs", "list", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["run", "method", "data", "status", "rsum", "scoring", "plain", "rsum", "created"]
    assert out[1].split()[:2] == ["cca-toy", "cca"] and "finished" in out[1] and "1 run(s)" in out[-1]
    assert main(["runs", "list", "--root", str(tmp_path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[0]["name"] == "cca-toy" and listed[0]["rsum"] == pytest.approx(describe_run(run).rsum)
    assert main(["runs", "show", str(run)]) == 0
    shown = capsys.readouterr().out
    assert "method    cca" in shown and "status    finished" in shown and "rsum" in shown
    with _Writer(run) as writer:
        assert main(["runs", "rename", str(run), "other"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"PID {writer.proc.pid}" in err[0]
        assert main(["runs", "list", "--root", str(tmp_path)]) == 0
        assert f"(PID {writer.proc.pid})" in capsys.readouterr().out
    # no terminal to ask on (pytest's stdin): deleting needs --yes
    assert main(["runs", "delete", str(run)]) == 2
    assert "--yes" in capsys.readouterr().err and run.is_dir()
    assert main(["runs", "rename", str(run), "other"]) == 0
    assert main(["runs", "delete", str(tmp_path / "other"), "--yes"]) == 0
    assert not (tmp_path / "other").exists()
    assert main(["runs", "list", "--root", str(tmp_path)]) == 0
    assert "no runs in" in capsys.readouterr().out


def test_cli_runs_list_refuses_a_root_that_is_not_a_folder(tmp_path, capsys):
    for root, what in ((tmp_path / "nonexist", "no such folder"), (tmp_path / "a-file", "a file, not a folder")):
        if what.startswith("a file"):
            root.write_text("x")
        for extra in ([], ["--json"]):
            assert main(["runs", "list", "--root", str(root), *extra]) == 2
            out, err = capsys.readouterr()
            assert out == "" and err == (f"crossview: error: --root {root}: {what}; give the folder that holds the "
                                         "run folders (default: the runs folder, $CROSSVIEW_HOME/runs)\n")
    (tmp_path / "empty").mkdir()
    assert main(["runs", "list", "--root", str(tmp_path / "empty")]) == 0           # a folder with no runs: fine
    assert capsys.readouterr().out == f"no runs in {tmp_path / 'empty'}\n"


def test_cli_runs_show_a_finished_run_without_its_summary_says_so(tmp_path, toy, capsys):
    run = _finished(tmp_path, "cca-toy", toy)
    (run / "summary.json").unlink()
    again = f"resume the run to evaluate it again ('crossview train --resume {run}')"
    assert main(["runs", "show", str(run)]) == 2
    assert capsys.readouterr().err == (f"crossview: error: {run}: no summary.json although status.json says the run "
                                       f"finished; the summary is missing (deleted or lost): {again}\n")
    (run / "summary.json").mkdir()
    assert main(["runs", "show", str(run), "--json"]) == 2
    assert capsys.readouterr().err == (f"crossview: error: {run / 'summary.json'}: not a regular file (a folder is "
                                       f"in its place); the summary is damaged: remove it, then {again}\n")
    (run / "summary.json").rmdir()
    (run / "status.json").write_text(json.dumps({"status": "running"}))             # truly unfinished: as before
    with pytest.raises(CrossViewError, match=r"no summary\.json; the run has not finished \(see status\.json\)"):
        from crossview.engine.run import read_summary
        read_summary(run)
