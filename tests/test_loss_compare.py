"""``crossview experiment loss-compare`` (paper 004's question): every (loss, seed) is an ordinary run the app
lists and opens, a second call reads finished runs back and resumes a stopped one, the paired per-query
statistics match a hand computation and scipy, and bad input gets one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest, wilcoxon

import _engine_helpers as H
from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.core.events import Finished, Log
from crossview.experiments.loss_compare import (format_markdown, format_table, loss_params, paired,
                                                parse_loss_params, parse_losses, run_loss_compare)

QUICK = {"*": {"embed_dim": "16", "batch_size": "16"}}


def _run(folder: Path, **kw) -> tuple[list, dict]:
    events = list(run_loss_compare(H.make_toy_dataset(), out=folder, device="cpu", text_encoder="tfidf",
                                   **{"epochs": 2, "params": QUICK, **kw}))
    assert isinstance(events[-1], Finished)
    return events, events[-1].summary


def test_four_losses_two_seeds_are_runs_the_app_lists_and_opens(tmp_path) -> None:
    from crossview.engine.session import list_runs, open_run

    folder = tmp_path / "exp"
    _, result = _run(folder, seeds=2)
    assert result["losses"] == ["vsepp", "vse0", "smoothap", "infonce"] and result["seeds"] == 2
    assert result["split"] == "test" and result["val_split"] == "val" and result["baseline"] == "vsepp"
    runs = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert runs == sorted(f"{loss}-seed{s}" for loss in result["losses"] for s in (0, 1))
    listed = {p.name for p in list_runs(tmp_path)}
    assert set(runs) <= listed, "the runs list shows every trial"
    for loss in result["losses"]:
        r, per = result["results"][loss], result["per_seed"][loss]
        assert len(per) == 2 and r["rsum"] == pytest.approx(np.mean([p["rsum"] for p in per]))
        assert result["std"][loss]["rsum"] == pytest.approx(np.std([p["rsum"] for p in per]))
        cfg = json.loads((folder / f"{loss}-seed1" / "config.json").read_text())
        assert cfg["params"]["loss"] == loss and cfg["params"]["seed"] == 1 and cfg["params"]["max_epochs"] == 2
    n_img, n_cap = result["test_images"], result["test_captions"]
    for loss, pr in result["paired"].items():
        assert pr["i2t"]["won"] + pr["i2t"]["lost"] + pr["i2t"]["tied"] == 2 * n_img
        assert pr["t2i"]["won"] + pr["t2i"]["lost"] + pr["t2i"]["tied"] == 2 * n_cap
    session = open_run(folder / "smoothap-seed0", dataset=H.make_toy_dataset())   # as the app opens a listed run
    assert session.method.name == "smoothap"
    text = format_table(result)
    assert "smoothap" in text and "Per query against vsepp" in text
    exp = json.loads((folder / "experiment.json").read_text())
    assert exp["experiment"] == "loss-compare" and exp["result"]["seeds"] == 2


def test_a_second_call_reads_finished_runs_back_and_resumes_a_stopped_one(tmp_path) -> None:
    folder = tmp_path / "exp"
    seen: list[str] = []

    def stop() -> bool:            # stop inside the second run (vse0), after some of its training
        return sum("vse0 seed 0: epoch" in s for s in seen) > 3

    events = []
    for ev in run_loss_compare(H.make_toy_dataset(), losses=["vsepp", "vse0"], seeds=1, epochs=2, params=QUICK,
                               out=folder, device="cpu", text_encoder="tfidf", should_stop=stop):
        events.append(ev)
        seen.append(getattr(ev, "message", ""))
    assert not isinstance(events[-1], Finished)
    assert any(isinstance(e, Log) and "stopped; run the experiment again" in e.message for e in events)
    first = (folder / "vsepp-seed0" / "checkpoint.pt").stat().st_mtime_ns
    events, result = _run(folder, losses=["vsepp", "vse0"], seeds=1)
    logs = [e.message for e in events if isinstance(e, Log)]
    assert any("vsepp seed 0: finished earlier" in m for m in logs)
    assert any("vse0 seed 0: resuming" in m for m in logs)
    assert (folder / "vsepp-seed0" / "checkpoint.pt").stat().st_mtime_ns == first, "not retrained"
    assert set(result["results"]) == {"vsepp", "vse0"}


def test_paired_statistics_by_hand() -> None:
    loss = [np.array([1, 3, 2, 5]), np.array([2, 2, 4, 1])]
    base = [np.array([2, 3, 1, 9]), np.array([2, 5, 1, 3])]
    # differences (loss - base): seed 0: -1, 0, +1, -4; seed 1: 0, -3, +3, -2
    p = paired(loss, base, query_ids=np.array([10, 11, 12, 13]))
    assert (p["won"], p["lost"], p["tied"], p["n"], p["seeds"]) == (4, 2, 2, 8, 2)
    assert p["sign_p"] == pytest.approx(binomtest(4, 6, 0.5).pvalue)
    assert p["wilcoxon_p"] == pytest.approx(wilcoxon([-1, 1, -4, -3, 3, -2]).pvalue)
    # mean change per query: 10: -0.5, 11: -1.5, 12: +2, 13: -3
    assert p["most_won"] == [(13, -3.0), (11, -1.5), (10, -0.5)] and p["most_lost"] == [(12, 2.0)]
    same = paired([np.array([1, 2])], [np.array([1, 2])])
    assert (same["won"], same["lost"], same["tied"], same["wilcoxon_p"], same["sign_p"]) == (0, 0, 2, 1.0, 1.0)
    with pytest.raises(CrossViewError, match="different query sets"):
        paired([np.array([1, 2])], [np.array([1, 2, 3])])


def test_parameters_per_loss_and_epochs_in_proportion() -> None:
    assert parse_losses("smoothap, vsepp,smoothap") == ["smoothap", "vsepp"]
    given = parse_loss_params(["margin=0.1", "smoothap.tau=0.01", "embed_dim=64"], ["vsepp", "smoothap"])
    assert given == {"*": {"margin": "0.1", "embed_dim": "64"}, "smoothap": {"tau": "0.01"}}
    v, s = loss_params("vsepp", given, 20), loss_params("smoothap", given, 20)
    assert v == {"max_epochs": 20, "lr_decay_epoch": 14, "margin": 0.1, "embed_dim": 64, "loss": "vsepp"}
    assert s == {"max_epochs": 20, "lr_decay_epoch": 14, "embed_dim": 64, "tau": 0.01, "loss": "smoothap"}
    assert loss_params("infonce", None, None) == {"loss": "infonce"}
    for bad, needle in ((["loss=vse0"], "varies"), (["vse0.margin=1"], "not among"), (["x"], "NAME=VALUE")):
        with pytest.raises(CrossViewError, match=needle):
            parse_loss_params(bad, ["vsepp", "smoothap"])


def test_markdown_report_has_the_command_and_every_loss(tmp_path) -> None:
    _, result = _run(tmp_path / "exp", losses=["vsepp", "infonce"], seeds=1)
    md = format_markdown(result, "crossview experiment loss-compare --data toy")
    assert "crossview experiment loss-compare --data toy" in md
    assert "| vsepp (triplet, hardest negative: VSE++) |" in md and "| infonce |" in md


@pytest.mark.parametrize("argv, needle", [
    (["--losses", "vsepp,triplet"], "unknown loss 'triplet'"), (["--seeds", "0"], "--seeds must be >= 1"),
    (["--epochs", "0"], "--epochs must be >= 1"), (["--set", "smoothap.nope=1"], "no parameter 'nope'"),
    (["--set", "nope=1"], "no method of the losses compared has a parameter 'nope'"),
    (["--set", "smoothap.tau=-1"], "tau")])
def test_bad_input_gets_one_line(argv, needle, tmp_path, capsys) -> None:
    code = main(["experiment", "loss-compare", "--data", "demo", "--exp-dir", str(tmp_path / "e"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "e").exists(), "nothing is created for bad input"


def test_another_folder_is_refused(tmp_path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(CrossViewError, match="not empty"):
        _run(tmp_path / "busy", losses=["vsepp"], seeds=1)
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
