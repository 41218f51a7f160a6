"""bench/regenerate.py: every file in bench/results/ has an entry, every entry can run, --list / --dry-run work.

Nothing here regenerates a real entry (hours of CPU); one toy entry of two tiny benchmark runs checks the assembly.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import _stamp  # noqa: E402
import regenerate as R  # noqa: E402


def test_every_results_file_has_an_entry():
    files = sorted(p.name for p in (REPO / "bench" / "results").iterdir() if p.is_file())
    assert files, "bench/results/ is empty"
    assert not set(files) - {e.file for e in R.ENTRIES}, "files with no entry in bench/regenerate.py"


def test_entries_are_unique_and_well_formed():
    assert len({e.name for e in R.ENTRIES}) == len(R.ENTRIES)
    assert len({e.file for e in R.ENTRIES}) == len(R.ENTRIES)
    for e in R.ENTRIES:
        assert e.steps and any(s.output for s in e.steps), e.name
        assert set(e.data) <= set(R.DATA_NEEDS), e.name
        assert e.minutes > 0, e.name
        for dep in e.all_deps():
            assert (REPO / dep).exists(), f"{e.name}: dependency {dep} does not exist"
        for s in e.steps:
            assert s.is_script or s.argv[0] == "crossview", f"{e.name}: {s.argv[0]}"
            assert "--out" not in s.argv or not s.output, f"{e.name}: --out is the runner's to add"


def test_every_files_stamp_parses_and_names_a_commit():
    for e in R.ENTRIES:
        if e.path.is_file():
            header, _ = _stamp.parse_header(e.path.read_text(encoding="utf-8"), e.path)
            assert header.get("command"), f"{e.file}: no stamp"
            assert _stamp.stamped_commit(header), f"{e.file}: no commit in its stamp"


HELP_ALL = """
import contextlib, io, json, runpy, sys
result = {}
for script in sys.argv[1:]:
    buf = io.StringIO()
    sys.argv = [script, "--help"]
    code = "did not exit"
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
    except BaseException as e:  # noqa: BLE001 - reported per script
        code = repr(e)
    result[script] = [code, "--out" in buf.getvalue()]
print(json.dumps(result))
"""


def test_every_script_exists_and_its_help_runs():
    import json

    scripts = sorted({s for e in R.ENTRIES for s in e.scripts()})
    assert all((REPO / s).is_file() for s in scripts)
    # one process for all of them: torch is imported once, not once a script
    r = subprocess.run([sys.executable, "-c", HELP_ALL, *scripts], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {s: [0, True] for s in scripts}


def test_took_is_read_from_a_stamp_and_an_estimate_is_marked(tmp_path):
    stamped = tmp_path / "r.md"
    stamped.write_text(_stamp.format_header(stamped, commands=["x"], data=["synthetic"], commit="abcdef1",
                                            took="41 min (every step)") + "body\n")
    header, _ = _stamp.parse_header(stamped.read_text(), stamped)
    assert _stamp.took_minutes(header) == 41.0 and header["took"] == ["41 min (every step)"]
    assert _stamp.took_minutes({"took": ["2.5 min"]}) == 2.5 and _stamp.took_minutes({"took": ["soon"]}) is None
    assert _stamp.took_minutes({"took": ["0.4 min (resumed: read back)"]}) is None      # not the whole cost
    e = R.Entry("toy", str(stamped), (R.S("bench/large_collection.py --n 10"),), ("synthetic",), 300, ())
    assert R.entry_minutes(e) == (41.0, True)
    stamped.write_text("no stamp\n")
    assert R.entry_minutes(e) == (300, False)


def test_list_shows_every_entry_with_its_needs_and_state(capsys):
    assert R.main(["--list"]) == 0
    out = capsys.readouterr().out
    for e in R.ENTRIES:
        line = next(ln for ln in out.splitlines() if ln.startswith(e.name + " "))
        assert e.file in line and R.needs(e) in line
        if e.path.is_file():
            assert any(w in line for w in ("fresh", "stale", "unknown")), line
        else:
            assert line.endswith("missing")
    assert "+GPU" in out


def test_state_compares_the_stamped_commit_with_the_sources_history(tmp_path):
    def entry_with(header_commit: str) -> R.Entry:
        path = tmp_path / "x.txt"
        entry = R.Entry("x", str(path), (R.S("bench/cca_fit.py"),), ("synthetic",), 1, ("README.md",))
        path.write_text(_stamp.format_header(path, commands=R.expected_commands(entry), data=["d"],
                                             commit=header_commit, machine="m") + "body\n")
        return entry

    root = subprocess.run(["git", "-C", str(REPO), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.split()[0]
    assert R.state(entry_with(root[:12])).startswith("stale: ")        # README.md changed since the first commit
    last = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h", "--", "README.md", "bench/cca_fit.py"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert R.state(entry_with(last + "+dirty (x)")) == "fresh"
    assert R.state(entry_with("0000000deadbeef")).startswith("unknown")
    (tmp_path / "x.txt").write_text("no stamp\n")
    assert R.state(R.Entry("x", str(tmp_path / "x.txt"), (), (), 1, ())) == "unstamped"
    assert R.state(R.Entry("y", str(tmp_path / "none.txt"), (), (), 1, ())) == "missing"


def test_stale_picks_the_stale_and_missing_entries_shortest_first(monkeypatch, capsys, tmp_path):
    entries = [R.Entry(n, f"{n}.txt", (R.S("bench/cca_fit.py"),), ("synthetic",), m, ()) for n, m in
               (("slow", 90), ("fresh", 1), ("quick", 5), ("gone", 30))]
    states = {"slow": "stale: x changed", "fresh": "fresh", "quick": "stale: y changed", "gone": "missing"}
    monkeypatch.setattr(R, "ENTRIES", entries)
    monkeypatch.setattr(R, "state", lambda e: states[e.name])
    assert [e.name for e in R.stale_entries()] == ["quick", "gone", "slow"]
    assert [e.name for e in R.stale_entries(30)] == ["quick", "gone"]
    assert R.main(["--stale", "--max-minutes", "10", "--dry-run", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("stale or missing: quick (at most 10 min each)") and "# quick ->" in out and "slow" not in out
    assert R.main(["--only", "x", "--max-minutes", "10"]) == 2
    assert "--max-minutes goes with --stale" in capsys.readouterr().err


def test_dry_run_prints_the_commands_and_runs_nothing(tmp_path, capsys):
    if not R.DATA_NEEDS["flickr8k"].exists():       # its entries are then skipped, not printed
        pytest.skip("../shared/data/flickr8k-sample is not present")
    before = {p: p.stat().st_mtime_ns for p in (REPO / "bench" / "results").iterdir()}
    assert R.main(["--only", "cca_fit,explain_latency_cpu,timam_flickr8k", "--dry-run", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ".venv/bin/python bench/cca_fit.py --out $WORK/step1.txt" in out or \
        "python bench/cca_fit.py --out $WORK/step1.txt" in out
    assert "crossview train cca --data ../shared/data/flickr8k-sample/dataset_flickr8k_sample.json " \
           "--run-dir $WORK/f8-cca" in out
    assert "bench/explain_latency.py $WORK/f8-cca $WORK/cca-demo --out $WORK/step3.txt" in out
    assert "experiment timam-ablation --data ../shared/data/flickr8k-sample" in out
    assert str(tmp_path) in out                       # where $WORK is
    assert list(tmp_path.iterdir()) == []
    assert before == {p: p.stat().st_mtime_ns for p in (REPO / "bench" / "results").iterdir()}


def test_bad_arguments_are_one_clear_line(tmp_path, capsys):
    assert R.main(["--only", "nope", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --only nope: no such entry; known: backbone_compare,") and err.count("\n") == 1
    assert R.main(["--only", "cca_fit", "--work", str(REPO / "scratch")]) == 2
    assert "inside the repository" in capsys.readouterr().err
    assert not (REPO / "scratch").exists()


def test_missing_shared_data_skips_the_entry(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(R.DATA_NEEDS, "flickr8k", tmp_path / "absent" / "dataset.json")
    monkeypatch.setattr(R, "regenerate", lambda *a, **k: pytest.fail("ran an entry whose data is missing"))
    assert R.main(["--only", "backbone_compare,defaults_flickr8k", "--work", str(tmp_path / "w")]) == 0
    lines = capsys.readouterr().out.splitlines()
    absent = _stamp.display_path(tmp_path / "absent" / "dataset.json")    # relative when beside the repository
    assert lines == [f"backbone_compare: skipped: needs {absent} (not on this machine)",
                     f"defaults_flickr8k: skipped: needs {absent} (not on this machine)"]


def test_gpu_entries_are_left_alone_without_cuda(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    before = (REPO / "bench" / "results" / "topk_scale_gpu.txt").read_bytes()
    assert R.main(["--only", "topk_scale_gpu", "--work", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == ("topk_scale_gpu: needs a GPU: run on a GPU machine "
                                               "(bench/results/topk_scale_gpu.txt left as it is)")
    assert (REPO / "bench" / "results" / "topk_scale_gpu.txt").read_bytes() == before


def test_an_entry_of_several_commands_becomes_one_stamped_file(tmp_path, capsys):
    out = tmp_path / "toy.txt"
    toy = R.Entry("toy", str(out), (R.S("bench/large_collection.py --n 2000 --queries 10 --backends exact"),
                                    R.S("bench/large_collection.py --n 3000 --queries 10 --backends exact")),
                  ("synthetic",), 1, ("crossview/index",))
    earlier = tmp_path / "work" / "toy" / "run-1"
    earlier.mkdir(parents=True)
    (earlier / "summary.json").write_text("{}")
    R.regenerate(toy, tmp_path / "work")
    # an earlier run's work folder is emptied (without --resume), and the log says so
    assert not earlier.exists()
    assert (f"regenerate toy: emptying {tmp_path / 'work' / 'toy'} (2 files and folders of an earlier run; --resume "
            "keeps them") in capsys.readouterr().out
    header, body = _stamp.parse_header(out.read_text(), out)
    assert [c.split("bench/")[1] for c in header["command"]] == [
        "large_collection.py --n 2000 --queries 10 --backends exact --out $WORK/step1.txt",
        "large_collection.py --n 3000 --queries 10 --backends exact --out $WORK/step2.txt"]
    assert header["data"] == [_stamp.synthetic(seed=0, n=n, dim=128, clusters=2000, queries=10, noise=0.1)
                              for n in (2000, 3000)]
    assert header["regenerate"][0].endswith("bench/regenerate.py --only toy")
    took = _stamp.took_minutes(header)        # the wall time of both steps, which --list then shows
    assert took is not None and 0 <= took < 30 and header["took"][0].split(" min ")[1].startswith("(every step")
    assert R.entry_minutes(toy) == (took, True)
    R.regenerate(toy, tmp_path / "work", resume=True)   # resumed: its time is not the entry's cost, so not shown
    header, body = _stamp.parse_header(out.read_text(), out)
    assert "(resumed: " in header["took"][0] and R.entry_minutes(toy) == (1, False)
    assert header["work"][0].startswith(f"$WORK = {tmp_path / 'work' / 'toy'}")
    parts = body.split("\n\n")
    assert parts[0].startswith("$ ") and "collection 2,000 x 128" in parts[0]
    assert parts[1].startswith("$ ") and "collection 3,000 x 128" in parts[1]
    assert "index exact" in parts[1] and str(tmp_path) not in body


def test_a_scripts_own_notes_stay_in_the_regenerated_file(tmp_path, monkeypatch):
    """A bench script's stamp notes (its design's caveats) survive regenerate.py's restamping, their paths as a
    reader at the repository root sees them."""
    script = tmp_path / "noted.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'bench')!r})\n"
        "import _stamp\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "_stamp.write_results(out, 'the body', data=['synthetic'], command='noted.py',\n"
        f"                    notes=['screened on the same folds: optimistic', 'runs in {tmp_path / 'work' / 'noted'}/x'])\n",
        encoding="utf-8")
    out = tmp_path / "noted.md"
    monkeypatch.setattr(R.Step, "is_script", property(lambda self: True))     # a script outside bench/
    R.regenerate(R.Entry("noted", str(out), (R.S(f"{script} --n 1"),), ("synthetic",), 1, ("crossview/index",)),
                 tmp_path / "work")
    header, body = _stamp.parse_header(out.read_text(), out)
    assert header["note"] == ["screened on the same folds: optimistic", "runs in $WORK/x"]
    assert body.strip() == "the body"


def test_paths_in_bodies_and_commands_read_from_the_repository_root(tmp_path):
    work = tmp_path / "w"
    text = f"{work}/f8-cca/checkpoint.pt; {REPO.parent}/shared/data/x.json; {REPO}/bench/results/a.txt; {work}/o.md"
    assert R._clean(text, work, {f"{work}/o.md": "bench/results/b.md"}) == \
        "$WORK/f8-cca/checkpoint.pt; ../shared/data/x.json; bench/results/a.txt; bench/results/b.md"
    assert R.shown([sys.executable, "bench/x.py", str(work / "a b"), "it's"], work).split(" ", 1)[1] == \
        "bench/x.py \"$WORK/a b\" 'it'\"'\"'s'"


def test_every_crossview_step_parses_with_todays_command_line():
    from crossview.cli import build_parser

    parser = build_parser()
    for e in R.ENTRIES:
        for s in e.steps:
            if s.is_script:
                continue
            argv = [R._expand(a, Path("/tmp/w")) for a in s.argv[1:]]
            try:
                parser.parse_args(argv + (["--out", "/tmp/w/x.md"] if s.is_experiment else []))
            except SystemExit:
                pytest.fail(f"{e.name}: 'crossview {' '.join(argv)}' no longer parses")


class _TinyRepo:
    """A git repository in ``root`` that ``regenerate`` reads (``R.REPO`` patched), a results file stamped at its
    first commit, and ``commit(path, text)``: write one file and commit it."""

    def __init__(self, root: Path, monkeypatch) -> None:   # noqa: ANN001 - pytest's fixture
        self.root = root
        root.mkdir(parents=True)
        self.git("init", "-q")
        monkeypatch.setattr(R, "REPO", root)

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.root), *args], capture_output=True, text=True,
                              check=True).stdout

    def commit(self, path: str, text: str, message: str = "change") -> str:
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_text(text, encoding="utf-8")
        self.git("add", "-A")
        self.git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD").strip()

    @staticmethod
    def stamped(results: Path, made: str) -> Path:
        results.write_text(_stamp.format_header(results, commands=["c"], data=["d"], commit=made[:12], machine="m")
                           + "body\n")
        return results


def test_a_cards_prose_does_not_make_a_result_stale_its_parameters_do(tmp_path, monkeypatch):
    """A model card's description is edited often (numbers quoted from results); only a change to its parameters
    (a default, a choice) can change a result, so only that makes the files that depend on the card stale."""
    repo = _TinyRepo(tmp_path / "repo", monkeypatch)

    def card(description: str, default: int, help_text: str = "the width") -> str:
        return (f'[method]\nname = "m"\ndescription = "{description}"\n\n'
                f'[params.dim]\ntype = "int"\ndefault = {default}\nhelp = "{help_text}"\n')

    made = repo.commit("models/m.toml", card("first words", 8), "card")
    entry = R.Entry("x", str(repo.stamped(tmp_path / "x.txt", made)), (), ("synthetic",), 1, ("models/m.toml",))
    assert R.state(entry) == "fresh"
    repo.commit("models/m.toml", card("other words, a new result quoted", 8), "prose")
    repo.commit("models/m.toml", card("other words, a new result quoted", 8, "width"), "help text")
    assert R.state(entry) == "fresh", "prose and help texts change no result"
    changed = repo.commit("models/m.toml", card("other words, a new result quoted", 16), "default")
    assert R.state(entry) == f"stale: models/m.toml changed at {changed[:7]} after {made[:7]}"


def test_a_file_made_with_another_command_than_its_entry_now_gives_is_stale(tmp_path):
    """The entry's command is part of what a file depends on: a file stamped with another command (another flag, a
    step fewer) is stale whatever the code did; the interpreter's path does not count."""
    out = tmp_path / "toy.txt"
    toy = R.Entry("toy", str(out), (R.S("bench/large_collection.py --n 2000 --queries 10 --backends exact"),),
                  ("synthetic",), 1, ("bench/large_collection.py",))
    made = R._git("rev-parse", "HEAD")[:12]
    [now] = R.expected_commands(toy)
    assert now.endswith(f"bench/large_collection.py --n 2000 --queries 10 --backends exact --out {out}")

    def stamp(command: str) -> None:
        out.write_text(_stamp.format_header(out, commands=[command], data=["d"], commit=made, machine="m") + "x\n")

    stamp(now)
    assert R.state(toy) == "fresh"
    stamp("python " + now.split(" ", 1)[1])                        # another interpreter path: the same command
    assert R.state(toy) == "fresh"
    stamp(now.replace("--n 2000", "--n 3000"))
    assert R.state(toy) == "stale: its command in regenerate.py differs from the one the file was made with"
    # a GPU entry's file is made by bench/gpu_all.sh with shorter runs that fit a lent machine: not compared
    assert R.state(R.Entry("toy", str(out), toy.steps, ("synthetic",), 1, toy.deps, gpu=True)) == "fresh"


def test_comments_docstrings_and_line_breaks_of_python_code_make_nothing_stale(tmp_path, monkeypatch):
    """A results file depends on code; a commit that only edits a .py file's comments or docstrings, or re-wraps a
    long string, changes no number, so the file stays fresh; a change to a value or a message string does not."""
    repo = _TinyRepo(tmp_path / "repo", monkeypatch)
    made = repo.commit("m.py", '"""The module."""\n\ndef f(x):\n    """Twice."""\n'
                               '    return f"{x} and " "more", 2 * x\n')
    entry = R.Entry("x", str(repo.stamped(tmp_path / "x.txt", made)), (), ("synthetic",), 1, ("m.py",))
    assert R.state(entry) == "fresh"
    repo.commit("m.py", '"""The module, described better."""\n\n\ndef f(x):  # doubles\n    """Twice x."""\n'
                '    return (f"{x} "\n            "and more"), 2 * x\n', "docs, a comment, a re-wrapped string")
    assert R.state(entry) == "fresh"
    changed = repo.commit("m.py", '"""The module."""\n\ndef f(x):\n    return f"{x} and more", 3 * x\n', "a value")
    assert R.state(entry) == f"stale: m.py changed at {changed[:7]} after {made[:7]}"
    repo.commit("m.py", "def f(x:\n", "broken")          # a file that does not parse counts as changed
    assert R.state(entry).startswith("stale: m.py changed at ")


def test_a_commit_listed_as_changing_no_result_keeps_the_files_fresh_for_its_scope(tmp_path, monkeypatch):
    """bench/unchanged_results.toml names commits that touch a result's sources without changing its numbers
    (scope "all", "cpu": only the entries that need no GPU, or "entries": those it names), each with its reason; any
    other commit still makes the file stale, and a record without a reason (or naming no known entry) is refused."""
    repo = _TinyRepo(tmp_path / "repo", monkeypatch)

    def commit(text: str) -> str:
        return repo.commit("src.py", text)

    made = commit("x = 1\n")
    results = repo.stamped(tmp_path / "x.txt", made)
    (repo.root / "bench").mkdir()
    cpu = R.Entry("x", str(results), (), ("synthetic",), 1, ("src.py",))
    gpu = R.Entry("y", str(results), (), ("synthetic",), 1, ("src.py",), gpu=True)
    cuda_only = commit("x = 1\nif False:  # a CUDA-only path\n    x = 3\n")
    assert R.state(cpu).startswith(f"stale: src.py changed at {cuda_only[:7]}")
    (repo.root / R.UNCHANGED).write_text(f'[[commit]]\nid = "{cuda_only[:9]}"\nscope = "cpu"\nwhy = "CUDA only"\n')
    assert R.state(cpu) == "fresh" and R.state(gpu).startswith("stale: ")
    (repo.root / R.UNCHANGED).write_text(f'[[commit]]\nid = "{cuda_only}"\nscope = "all"\nwhy = "no numbers"\n')
    assert R.state(gpu) == "fresh"
    real = commit("x = 2\n")
    assert R.state(cpu) == f"stale: src.py changed at {real[:7]} after {made[:7]}"
    (repo.root / R.UNCHANGED).write_text(f'[[commit]]\nid = "{real[:9]}"\nscope = "all"\nwhy = ""\n')
    with pytest.raises(SystemExit, match="a why"):
        R.state(cpu)
    # scope "entries": the commit changes no number of the entries it names; the others stay stale
    monkeypatch.setattr(R, "ENTRIES", (cpu, gpu))
    (repo.root / R.UNCHANGED).write_text(f'[[commit]]\nid = "{cuda_only}"\nscope = "all"\nwhy = "no numbers"\n\n'
                                         f'[[commit]]\nid = "{real[:9]}"\nscope = "entries"\nentries = ["y"]\n'
                                         'why = "y uses none of what changed"\n')
    assert R.state(gpu) == "fresh" and R.state(cpu).startswith(f"stale: src.py changed at {real[:7]}")
    for bad in ('scope = "entries"\nentries = ["nope"]', 'scope = "entries"', 'scope = "all"\nentries = ["x"]',
                'scope = "entries"\nentries = []'):
        (repo.root / R.UNCHANGED).write_text(f'[[commit]]\nid = "{real[:9]}"\n{bad}\nwhy = "w"\n')
        with pytest.raises(SystemExit, match="entries"):
            R.state(cpu)
