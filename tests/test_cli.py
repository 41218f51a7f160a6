"""The command line: help texts, data info, one-line errors, the no-display message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossview.cli import build_parser, main


def _subcommands(parser, prefix=()):
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _subcommands(sub, (*prefix, name))


def test_every_command_has_help(capsys) -> None:
    commands = list(_subcommands(build_parser()))
    assert ("data", "info") in [c for c, _ in commands]
    for cmd, _ in [((), None), *commands]:
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: crossview") and len(out) > 80, cmd


@pytest.mark.parametrize("method", ["cca", "wsabie", "bitr", "vsepp", "smoothap", "timam"])
def test_train_method_help_lists_the_cards_parameters(method: str, capsys) -> None:
    """``crossview train METHOD --help``: every parameter of the card, with its default from the signature."""
    from crossview.methods import method_card

    with pytest.raises(SystemExit) as e:
        main(["train", method, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    card = method_card(method)
    assert f"Parameters of {method}" in out
    for spec in card.params.values():
        assert f"  {spec.name} ({spec.type}, default {spec.default_text})" in out, spec.name
    with pytest.raises(SystemExit):
        main(["train", "no_such_method", "--help"])
    assert "no method 'no_such_method'" in capsys.readouterr().out


def test_a_default_shown_in_help_is_what_one_types_after_set() -> None:
    """``default None`` / ``default [1, 2]`` in the help could not be typed back; ``none`` and ``1,2`` can."""
    from crossview.methods import list_methods, method_card

    seen: set[str] = set()
    for name in list_methods():
        card = method_card(name)
        for spec in (card.params.values() if card is not None else ()):
            if spec.default is None or isinstance(spec.default, (list, tuple)):
                seen.add(type(spec.default).__name__)
                assert spec.coerce(spec.default_text, name) == spec.default, (name, spec.name, spec.default_text)
    assert "NoneType" in seen, seen
    from crossview.methods.cards import ParamSpec
    for spec in (ParamSpec("ks", [1, 5, 10], "list[int]"), ParamSpec("betas", [0.5, 2.0], "list[float]")):
        assert spec.coerce(spec.default_text) == spec.default, spec.default_text


def test_data_info_flickr8k(flickr8k_sample: Path, capsys) -> None:
    assert main(["data", "info", str(flickr8k_sample / "dataset_flickr8k_sample.json")]) == 0
    out = capsys.readouterr().out
    assert "images              700" in out
    assert "captions            3,500" in out
    assert "train 600 images / 3,000 captions; val 100 images / 500 captions" in out
    assert main(["data", "info", str(flickr8k_sample / "dataset_flickr8k_sample.json"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["images"] == 700 and info["captions"] == 3500


def test_malformed_dataset_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "dataset_bad.json"
    bad.write_text('{"images": 3}')
    assert main(["data", "info", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("crossview: error: ") and "dataset_bad.json" in err and "'images' list" in err
    assert main(["data", "info", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_data_info_check_images_reports_unreadable(tmp_path: Path, capsys) -> None:
    from PIL import Image
    (tmp_path / "images").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "images" / "a.jpg")
    (tmp_path / "images" / "b.jpg").write_bytes(b"garbage")
    doc = {"images": [{"filename": f, "split": "train", "sentences": [{"raw": "x"}]} for f in ("a.jpg", "b.jpg")]}
    (tmp_path / "dataset_t.json").write_text(json.dumps(doc))
    assert main(["data", "info", str(tmp_path / "dataset_t.json"), "--check-images"]) == 1
    out = capsys.readouterr().out
    assert "1 of 2 images unreadable" in out and "b.jpg" in out


def test_bare_command_without_display_explains_instead_of_crashing() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    out = subprocess.run([sys.executable, "-m", "crossview.cli"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "no display found" in out.stderr and "QT_QPA_PLATFORM=offscreen" in out.stderr
    assert "crossview data info demo" in out.stderr
    assert "Traceback" not in out.stderr


def test_data_info_demo_counts(demo_dataset, capsys) -> None:
    assert main(["data", "info", "demo", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["images"] == demo_dataset.n_images == 2400
    assert info["captions"] == 5 * 2400
    assert {k: v["images"] if isinstance(v, dict) else v for k, v in info["splits"].items()} == \
        {"train": 2000, "val": 200, "test": 200}
    assert main(["data", "info", "demo"]) == 0
    table = capsys.readouterr().out
    assert "2,400" in table and "12,000" in table


def test_data_demo_writes_a_folder_that_reads_back(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo-out"
    assert main(["data", "demo", "--out", str(out), "--n-scenes", "30", "--n-web", "5", "--seed", "3"]) == 0
    written = capsys.readouterr().out
    assert str(out) in written
    assert main(["data", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["images"] == 30 and info["captions"] == 150
    # a non-empty folder is refused rather than overwritten
    assert main(["data", "demo", "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err


def test_python_dash_m_crossview_is_the_command() -> None:
    out = subprocess.run([sys.executable, "-m", "crossview", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("usage: crossview "), out.stderr


def test_sigterm_stops_any_command_the_ctrl_c_way(monkeypatch, capsys) -> None:
    """A scheduler's or `timeout`'s SIGTERM in a command without its own handler goes the KeyboardInterrupt way
    (runs record where they stopped), prints one line and exits 143; the previous handler is put back."""
    import signal

    import crossview.cli as cli

    def stops_itself(args) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(cli, "cmd_data_info", stops_itself)
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["data", "info", "demo"]) == 143
    assert capsys.readouterr().err.strip() == "crossview: stopped by SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("command", ["gui", "screenshot"])
def test_the_app_keeps_sigterms_default(monkeypatch, tmp_path, command) -> None:
    """In Qt's event loop a Python handler would only run between two Python calls: `crossview gui` and
    `crossview screenshot` leave SIGTERM's default, immediate effect."""
    import signal

    import crossview.cli as cli
    import crossview.commands.screenshot as shot

    seen = {}

    def fake(args) -> int:
        seen["handler"] = signal.getsignal(signal.SIGTERM)
        return 0

    if command == "gui":
        monkeypatch.setattr(cli, "cmd_gui", fake)
        argv = ["gui"]
    else:
        fake.__module__ = shot.__name__
        monkeypatch.setattr(shot, "cmd_screenshot", fake)
        argv = ["screenshot", "--out", str(tmp_path)]
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(argv) == 0
    assert seen["handler"] is before


def _python_prints(code: str) -> list[str]:
    """The lines a fresh interpreter prints running ``code`` with this checkout first on its path."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}).stdout
    return out.strip().splitlines()


def test_a_command_imports_only_its_own_module() -> None:
    """``crossview query ...`` builds a parser with its own command module only: no method module (torch, scipy)
    is imported to parse it, while a bare ``crossview --help`` still lists every command."""
    code = ("import sys; from crossview.cli import build_parser, COMMAND_MODULES; p = build_parser('query'); "
            "names = p._subparsers._group_actions[0].choices; "
            "print(sorted(names)); print([m for m in ('crossview.methods', 'crossview.commands.train', 'torch') "
            "if m in sys.modules])")
    lines = _python_prints(code)
    assert lines[0] == str(sorted(["data", "gui", "query"]))
    assert lines[1] == "[]"
    from crossview.cli import COMMAND_MODULES
    full = build_parser()._subparsers._group_actions[0].choices
    assert set(COMMAND_MODULES) | {"data", "gui"} == set(full)


def test_the_bare_command_parses_as_the_app_alone() -> None:
    """Bare ``crossview`` opens the app: its parser registers no command module (each full parse imported torch
    and the method registry first, 2-3 s before the window showed)."""
    code = ("import sys; from crossview import cli; seen = []; "
            "cli.cmd_gui = lambda args: seen.append(args.data) or 0; "
            "rc = cli.main([]); print(rc, seen); print([m for m in ('crossview.methods', 'crossview.commands.train', "
            "'torch') if m in sys.modules])")
    assert _python_prints(code) == ["0 ['demo']", "[]"]
