"""bench/rich_features.py: which configurations each method is scored on, and --merge keeping the sections of the
methods a run does not score (text only: nothing is trained here)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import _stamp  # noqa: E402
import rich_features as rf  # noqa: E402


def test_the_deep_methods_get_the_three_fixed_configs() -> None:
    assert [c[0] for c in rf.configs_for("cca", "auto")] == [c[0] for c in rf.CONFIGS]
    assert rf.configs_for("vsepp", "auto") == rf.THREE
    assert rf.configs_for("wsabie", "auto") == rf.THREE
    assert rf.configs_for("cca", "three") == rf.THREE
    # TIMAM's default reads the run's caption features (bench/results/timam_cv2_flickr8k.md), as the others do
    assert rf.reads_text_features("timam") and rf.reads_text_features("smoothap")
    assert rf.configs_for("timam", "auto") == rf.THREE


def _section(method: str, prov: str = "") -> str:
    return (f"## {method}\n\n| config | x |\n|---|---|\n| plain | {method} |\n\nCV choice for {method}: **plain**; "
            f"today's default.\n" + (f"\n{prov}" if prov else ""))


def test_merge_keeps_the_other_methods_sections_and_val_rows_and_says_where_they_came_from(tmp_path) -> None:
    old_prov = rf.provenance("aaaaaaaaaaaa", "2026-01-01 00:00 UTC", "python bench/rich_features.py --methods vsepp")
    body = ("# Title\n\nData: intro.\n\n" + _section("cca") + "\n" + _section("vsepp", old_prov) + "\n"
            + _section("wsabie") + "\n" + rf.val_table(["| cca | plain | 1 | 1 | 0-2 | +0.0 | - |",
                                                         "| vsepp | plain | 2 | 2 | 0-3 | +0.0 | - |",
                                                         "| wsabie | plain | 3 | 3 | 0-4 | +0.0 | - |"]))
    path = _stamp.write_results(tmp_path / "r.md", body, data=["d"], command="python bench/rich_features.py --methods cca")
    header, sections, rows = rf.kept_parts(path, ["wsabie"])
    assert [t for t, _ in sections] == ["cca", "vsepp"]
    assert [r.split("|")[1].strip() for r in rows] == ["cca", "vsepp"]
    cca, vsepp = (text for _, text in sections)
    # a section made before sections named their commit gets the file's stamp; one that names its own keeps it
    assert rf.PROVENANCE in cca and _stamp.commit_info().split(" ")[0] in cca and "--methods cca`" in cca
    assert vsepp.count(rf.PROVENANCE) == 1 and "aaaaaaaaaaaa" in vsepp
    assert "| plain | cca |" in cca and "Val, once" not in cca + vsepp
    # the file's own methods, all named: nothing kept
    assert rf.kept_parts(path, ["cca", "vsepp", "wsabie"])[1:] == ([], [])


def test_a_merged_run_writes_the_kept_and_new_sections_under_one_stamp(tmp_path, monkeypatch) -> None:
    data = tmp_path / "d.json"
    data.write_text("{}")
    out = tmp_path / "r.md"
    body = "# Title\n\nData: old intro.\n\n" + _section("cca") + "\n" + rf.val_table(["| cca | plain | 1 | 1 | 0-2 | +0.0 | - |"])
    _stamp.write_results(out, body, data=["d"], command="python bench/rich_features.py --methods cca")
    new = _section("timam", rf.provenance("bbbbbbbbbbbb", "now", "cmd"))
    monkeypatch.setattr(rf, "run", lambda args, methods, commit: ("Data: new intro.\n", [("timam", new)],
                                                                  ["| timam | plain | 9 | 9 | 0-9 | +0.0 | - |"]))
    argv = ["--methods", "timam", "--merge", "--data", str(data), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", [str(REPO / "bench" / "rich_features.py"), *argv])     # the stamp's command
    assert rf.main(argv) == 0
    header, text = _stamp.parse_header(out.read_text(), out)
    assert "--methods timam --merge" in header["command"][0] and len(header["command"]) == 1
    assert any("sections of cca" in n for n in header["note"])
    assert text.index("## cca") < text.index("## timam") < text.index(rf.VAL_HEADING)
    assert "Data: new intro." in text and "old intro" not in text
    assert text.split(rf.VAL_HEADING)[1].count("| cca | plain") == 1 and "| timam | plain | 9" in text
    # rerunning timam replaces its section and row, keeps cca's
    assert rf.main(argv) == 0
    text = out.read_text()
    assert text.count("## timam") == 1 and text.count("| timam | plain | 9") == 1 and text.count("## cca") == 1


def test_bad_arguments_are_one_line(tmp_path, capsys) -> None:
    assert rf.main(["--methods", "nosuch", "--data", str(tmp_path / "none.json")]) == 2
    assert "no dataset at" in capsys.readouterr().err
    data = tmp_path / "d.json"
    data.write_text("{}")
    assert rf.main(["--methods", "nosuch", "--data", str(data)]) == 2
    assert "unknown method 'nosuch'" in capsys.readouterr().err
    assert rf.main(["--methods", "cca", "--data", str(data), "--merge", "--out", str(tmp_path / "no.md")]) == 2
    assert "--merge needs an --out file" in capsys.readouterr().err


def test_each_choice_is_printed_beside_the_methods_default_at_this_commit() -> None:
    from crossview.methods import method_class

    cls = method_class("cca")
    same = rf.default_now("cca", cls.default_image_encoder, cls.default_text_encoder)
    assert same == f"Default now: this choice ({cls.default_image_encoder}, {cls.default_text_encoder})."
    other = rf.default_now("cca", cls.default_image_encoder, "bow")
    assert other.startswith(f"Default now: {cls.default_image_encoder}, {cls.default_text_encoder}, not this choice")
