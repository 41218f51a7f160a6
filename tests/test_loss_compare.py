"""``crossview experiment loss-compare`` (paper 004's question): every (loss, seed) is an ordinary run the app
lists and opens, a second call reads finished runs back and resumes a stopped one, the paired per-query
statistics (seeds averaged per query, bootstrap over images) match a hand computation, and bad input gets one
line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest

import _engine_helpers as H
from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.core.events import Finished, Log
from crossview.experiments.loss_compare import (format_markdown, format_table, loss_params, paired,
                                                parse_loss_params, parse_losses, run_loss_compare)

QUICK = {"*": {"embed_dim": "16", "batch_size": "16"}}


def _run(folder: Path, **kw) -> tuple[list, dict]:
    events = list(run_loss_compare(H.make_toy_dataset(), out=folder, device="cpu", text_encoder="tfidf",
                                   **{"epochs": 2, "params": QUICK, "choose": False,
                                      "losses": ["vsepp", "vse0", "smoothap", "infonce"], **kw}))
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
        assert cfg["params"]["loss"] == loss and cfg["params"]["max_epochs"] == 2
        assert cfg["seed"] == 1 and cfg["run_settings"]["seed"] == 1 and "seed" not in cfg["params"], \
            "the seed is the run's setting, not the method's parameter"
    n_img, n_cap = result["test_images"], result["test_captions"]
    for loss, pr in result["paired"].items():     # one observation per query: the seeds are averaged, not pooled
        assert pr["i2t"]["won"] + pr["i2t"]["lost"] + pr["i2t"]["tied"] == n_img
        assert pr["t2i"]["won"] + pr["t2i"]["lost"] + pr["t2i"]["tied"] == n_cap
        assert (pr["n_images"], pr["n_captions"], pr["seeds_a"], pr["seeds_b"]) == (n_img, n_cap, 2, 2)
        assert pr["resampled"].startswith("images (each with its captions)"), "ranks.npz's caption_image is used"
        assert pr["rsum"]["diff"] == pytest.approx(result["results"][loss]["rsum"] - result["results"]["vsepp"]["rsum"])
    session = open_run(folder / "smoothap-seed0", dataset=H.make_toy_dataset())   # as the app opens a listed run
    assert session.method.name == "smoothap"
    text = format_table(result)
    assert "smoothap" in text and "Per query against vsepp" in text and "rsum B - A [95% CI]" in text
    flat = " ".join(text.split())          # the notes under the table are wrapped
    assert f"n = {n_img} images / {n_cap} captions, 2 seed(s) each" in flat
    assert "resampled: images (each with its captions); seeds averaged per query first" in flat
    assert "Minimal detectable difference" in flat and "smoothap rsum " in flat
    exp = json.loads((folder / "experiment.json").read_text())
    assert exp["experiment"] == "loss-compare" and exp["result"]["seeds"] == 2


def test_a_second_call_reads_finished_runs_back_and_resumes_a_stopped_one(tmp_path) -> None:
    folder = tmp_path / "exp"
    seen: list[str] = []

    def stop() -> bool:            # stop inside the second run (vse0), after some of its training
        return sum("vse0 seed 0: epoch" in s for s in seen) > 3

    events = []
    for ev in run_loss_compare(H.make_toy_dataset(), losses=["vsepp", "vse0"], seeds=1, epochs=2, params=QUICK,
                               out=folder, device="cpu", text_encoder="tfidf", should_stop=stop, choose=False):
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
    ci = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    loss = [{"i2t": np.array([1, 3, 2, 5]), "t2i": np.ones(8, int)},
            {"i2t": np.array([2, 2, 4, 1]), "t2i": np.ones(8, int)}]
    base = [{"i2t": np.array([2, 3, 1, 9]), "t2i": np.full(8, 2)},
            {"i2t": np.array([2, 5, 1, 3]), "t2i": np.ones(8, int)}]
    p = paired(loss, base, ci, {"i2t": np.array([10, 11, 12, 13])}, resamples=200)
    # i2t mean ranks over the seeds: loss 1.5, 2.5, 3, 3; base 2, 4, 1, 6: changes -0.5, -1.5, +2, -3,
    # one observation per query (not 2 seeds x 4 pooled): won 3, lost 1; the sign test over the 4 images
    i2t = p["i2t"]
    assert (i2t["won"], i2t["lost"], i2t["tied"], p["seeds_a"], p["seeds_b"]) == (3, 1, 0, 2, 2)
    assert i2t["p"] == pytest.approx(binomtest(3, 4, 0.5).pvalue)
    assert i2t["median_rank_change"]["value"] == pytest.approx(-1.0)
    # hits at 1 averaged over the seeds: loss 0.5, 0, 0, 0.5; base 0, 0, 1, 0: R@1 25 against 25
    assert (i2t["R@1"]["a"], i2t["R@1"]["b"], i2t["R@1"]["diff"]) == (25.0, 25.0, 0.0)
    assert p["i2t"]["most_won"] == [(13, -3.0), (11, -1.5), (10, -0.5)] and p["i2t"]["most_lost"] == [(12, 2.0)]
    # t2i: every caption from 1.5 to 1 (R@1 50 -> 100); 4 images better, so the sign test is 2 / 2^4, not 2 / 2^8
    t2i = p["t2i"]
    assert (t2i["won"], t2i["R@1"]["diff"], t2i["images_better"]) == (8, 50.0, 4)
    assert t2i["p"] == pytest.approx(2 / 2 ** 4) and t2i["most_won"][0] == (0, -0.5)
    # rsum: + 0 (i2t R@1) + 12.5 (i2t R@5: base's query 13 at 9 and 3) + 50 (t2i R@1)
    assert p["rsum"]["diff"] == pytest.approx(62.5) and p["rsum"]["ci"][0] <= 62.5 <= p["rsum"]["ci"][1]
    assert p["mde"]["rsum"] > 0 and "80% power" in p["mde"]["explanation"]
    same = paired(loss[:1], loss[:1], ci)
    assert (same["i2t"]["won"], same["i2t"]["lost"], same["i2t"]["tied"], same["i2t"]["p"]) == (0, 0, 4, 1.0)
    assert same["rsum"]["ci"] == [0.0, 0.0] and same["rsum"]["p"] == 1.0
    with pytest.raises(CrossViewError, match="same split"):
        paired([{"i2t": np.array([1, 2]), "t2i": np.ones(8, int)}], base, ci)
    with pytest.raises(CrossViewError, match="different query sets"):
        paired(loss, [base[0], {"i2t": np.array([1, 2]), "t2i": np.ones(8, int)}], ci)


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
    assert "| infonce | " in md.split("Per query against **vsepp**")[1], "the paired table names the loss"
    assert "seeds averaged per query first" in md and "Minimal detectable difference" in md


@pytest.mark.parametrize("argv, needle", [
    (["--losses", "vsepp,triplet"], "unknown loss 'triplet'"), (["--seeds", "0"], "--seeds must be >= 1"),
    (["--epochs", "0"], "--epochs must be >= 1"), (["--set", "smoothap.nope=1"], "no parameter 'nope'"),
    (["--set", "nope=1"], "no method of the losses compared has a parameter 'nope'"),
    (["--set", "smoothap.tau=-1"], "tau"), (["--budget", "20"], "--budget '20'"),
    (["--budget", "10x128", "--epochs", "3"], "either --budget")])
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


def test_every_loss_gets_one_budget_and_its_own_setting_chosen_off_the_reported_split(tmp_path) -> None:
    """Issue 28, item 3: the same epochs, captions a step and optimiser steps for every loss; each loss's margin or
    temperature chosen on val (the toy data reports on test), recorded with the runs and the report; paper 004's
    tau 0.01 as a row of its own, not chosen."""
    folder = tmp_path / "exp"
    events = list(run_loss_compare(H.make_toy_dataset(), out=folder, device="cpu", text_encoder="tfidf",
                                   losses=["vsepp", "smoothap", "smoothap-paper"], seeds=1, budget="3x16",
                                   params={"*": {"embed_dim": "16"}}))
    result = events[-1].summary
    # 96 training images x 2 captions: 12 batches of 16 captions, or of 8 images with both their captions
    steps = {n: result["results"][n]["steps"] for n in result["losses"]}
    assert steps == {"vsepp": 36.0, "smoothap": 36.0, "smoothap-paper": 36.0}
    for n, batch in (("vsepp", 16), ("smoothap", 8)):
        cfg = json.loads((folder / f"{n}-seed0" / "config.json").read_text())
        assert (cfg["params"]["max_epochs"], cfg["params"]["batch_size"], cfg["params"]["lr_decay_epoch"]) == \
            (3, batch, 2)
    chosen = result["chosen"]
    assert set(chosen) == {"vsepp", "smoothap"}, "paper 004's row keeps its tau"
    assert chosen["vsepp"]["selected_on"] == "val" and chosen["vsepp"]["point"]["margin"] in (0.1, 0.2, 0.4)
    assert json.loads((folder / "smoothap-paper-seed0" / "config.json").read_text())["params"]["tau"] == 0.01
    run_tau = json.loads((folder / "smoothap-seed0" / "config.json").read_text())["params"]["tau"]
    assert run_tau == chosen["smoothap"]["point"]["tau"]
    summary = json.loads((folder / "vsepp-seed0" / "summary.json").read_text())
    assert summary["reported_on"] == "test" and "val" in summary["selected_on"] and not summary["optimistic"]
    text = " ".join(format_table(result).split())
    assert "Budget, the same for every loss: 3 epochs of 16-caption batches" in text
    assert f"margin={chosen['vsepp']['point']['margin']} chosen by rsum on val, not on test" in text
    # a second call reads the choosing trials and the runs back
    again = list(run_loss_compare(H.make_toy_dataset(), out=folder, device="cpu", text_encoder="tfidf",
                                  losses=["vsepp", "smoothap", "smoothap-paper"], seeds=1, budget="3x16",
                                  params={"*": {"embed_dim": "16"}}))
    assert again[-1].summary["chosen"]["vsepp"]["point"] == chosen["vsepp"]["point"]
    assert any(isinstance(e, Log) and "vsepp seed 0: finished earlier" in e.message for e in again)
