"""Progress on stderr: a bar with ETA on a terminal, a plain line every few seconds elsewhere."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossview.commands._common import ProgressPrinter, format_seconds


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_line_at_most_every_interval_and_a_final_line():
    clock, out = Clock(), io.StringIO()
    p = ProgressPrinter("features: images", out, interval=5.0, clock=clock)
    for done in range(0, 3501, 50):          # 1 s per 50 images: 70 s in all
        p(done, 3500)
        clock.t += 1.0
    lines = out.getvalue().splitlines()
    assert lines[0] == "features: images 0/3,500 (0%)"
    assert lines[1] == "features: images 250/3,500 (7%) ETA 1 min 05 s"   # 5 s later, 50 images a second
    assert lines[-1] == "features: images 3,500/3,500 (100%) done in 1 min 10 s"
    assert len(lines) == 70 // 5 + 1              # t = 0, 5, ... 65 s, then the final line at 70 s
    assert "\r" not in out.getvalue() and "[" not in out.getvalue()


def test_off_a_terminal_fast_work_prints_a_first_and_a_final_line_only():
    clock, out = Clock(), io.StringIO()
    p = ProgressPrinter("features: captions", out, clock=clock)
    for done in (256, 512, 700):
        p(done, 700)
    p(700, 700)                                # the same stage reported done again: no second final line
    assert out.getvalue().splitlines() == ["features: captions 256/700 (36%)",
                                           "features: captions 700/700 (100%) done in 0 s"]


def test_on_a_terminal_a_bar_with_eta_then_the_time():
    clock, out = Clock(), Tty()
    p = ProgressPrinter("features: images", out, clock=clock)
    p(0, 100)
    clock.t += 10
    p(50, 100)
    clock.t += 0.05
    p(51, 100)                                 # within 0.2 s of the last draw: not redrawn
    clock.t += 10
    p(100, 100)
    text = out.getvalue()
    assert "features: images [#" in text and "51/100" not in text
    assert "50/100 (50%) 00:10<00:10" in text            # elapsed < ETA, from the injected clock
    assert text.rstrip("\n").endswith("100/100 (100%) 00:20<00:00") and text.endswith("\n")
    assert text.count("\n") == 1 and not p.line_open     # one line, redrawn in place, then ended


def test_on_a_terminal_notes_go_above_the_bar_and_a_new_stage_ends_the_last():
    from crossview.commands._common import EventPrinter
    from crossview.core.events import Log, Progress

    clock, out = Clock(), Tty()
    pr = EventPrinter(out, clock=clock, prefix="experiment: ")
    pr(Progress(1, 10, "epoch 1/10"))
    pr(Log("fold 1 of 3"))
    pr(Progress(5, 40, "features: images"))
    pr.close()
    lines = [ln.split("\r")[-1] for ln in out.getvalue().split("\n") if ln.strip()]
    assert any(ln == "experiment: fold 1 of 3" for ln in lines), lines
    assert lines[-1].startswith("features: images [") and "5/40 (12%)" in lines[-1]
    assert any(ln.startswith("epoch 1/10 [") for ln in lines)


def test_unknown_total_and_a_new_pass_of_the_same_stage():
    clock, out = Clock(), io.StringIO()
    p = ProgressPrinter("scan", out, clock=clock)
    p(3, 0)
    p(10, 10)
    p(2, 10)                                   # a second pass starts again
    assert out.getvalue().splitlines() == ["scan 3", "scan 10/10 (100%) done in 0 s", "scan 2/10 (20%)"]


def test_format_seconds():
    assert [format_seconds(s) for s in (0.4, 59, 65, 3725)] == ["0 s", "59 s", "1 min 05 s", "1 h 02 min"]


def test_train_event_printer_off_a_terminal_reports_each_stage():
    from crossview.commands._common import EventPrinter as _EventPrinter
    from crossview.core.events import Log, Progress

    clock, out = Clock(), io.StringIO()
    pr = _EventPrinter(out, clock=clock)
    for done in range(0, 701, 10):
        pr(Progress(done, 700, "features: images"))
        clock.t += 0.5
    for done in (1000, 2000, 3500):
        pr(Progress(done, 3500, "features: captions"))
    pr(Log("training cca"))
    for step, msg in ((0, "cca: covariances"), (5, "cca: image covariance"), (9, "cca: whitening and SVD"),
                      (10, "cca: done")):
        pr(Progress(step, 10, msg))
    lines = out.getvalue().splitlines()
    images = [ln for ln in lines if ln.startswith("features: images")]
    assert images[0] == "features: images 0/700 (0%)" and images[-1].endswith("done in 35 s")
    assert 7 <= len(images) <= 9                    # 35 s at one line per 5 s
    assert "features: captions 1,000/3,500 (28%)" in lines
    assert "training cca" in lines
    assert lines[-2:] == ["cca: covariances 0/10 (0%)", "cca: done 10/10 (100%) done in 0 s"]


def _tiny_dataset(folder: Path, n: int = 6) -> Path:
    from PIL import Image
    (folder / "images").mkdir(parents=True)
    colours = ["red", "green", "blue"]
    images = []
    for i in range(n):
        c = colours[i % 3]
        Image.new("RGB", (40, 40), c).save(folder / "images" / f"{i}.png")
        images.append({"filename": f"{i}.png", "split": "train" if i < 4 else "val",
                       "sentences": [{"raw": f"a {c} square number {i}"}, {"raw": f"{c} picture"}]})
    path = folder / "dataset_tiny.json"
    path.write_text(json.dumps({"images": images}))
    return path


@pytest.mark.slow
def test_features_extract_with_stderr_redirected_prints_progress_lines(tmp_path):
    data = _tiny_dataset(tmp_path / "tiny")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent),
               CROSSVIEW_CACHE_DIR=str(tmp_path / "cache"))
    with open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.run([sys.executable, "-m", "crossview.cli", "features", "extract", "--data", str(data),
                               "--image-encoder", "resnet18", "--random-init", "--text-encoder", "tfidf",
                               "--workers", "0"],
                              stdout=subprocess.PIPE, stderr=err, text=True, env=env, timeout=300)
    errtext = (tmp_path / "err.txt").read_text()
    assert proc.returncode == 0, errtext
    lines = errtext.splitlines()
    assert any(ln.startswith("features: images ") and "/6 " in ln for ln in lines), errtext
    assert "features: images 6/6 (100%) done in" in errtext
    assert "features: captions 12/12 (100%) done in" in errtext
    assert "\r" not in errtext
    assert "extracted" in proc.stdout


def test_data_info_demo_says_it_renders_the_demo_with_progress(demo_dataset, monkeypatch, capsys):
    from crossview.cli import main
    from crossview.data import demo

    real = demo.demo_path

    def first_use(seed=None, n_scenes=demo.DEFAULT_N_SCENES, n_web=demo.DEFAULT_N_WEB, progress=None):
        if progress is not None:            # what a first render reports (the real one takes ~10 s)
            for done in (1, 1600, 3200):
                progress(done, 3200)
        return real(seed, n_scenes, n_web)

    monkeypatch.setattr(demo, "demo_path", first_use)
    assert main(["data", "info", "demo"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("crossview: rendering the built-in demo dataset (first use only")
    assert err[1] == "rendering the demo 1/3,200 (0%)"
    assert err[-1].startswith("rendering the demo 3,200/3,200 (100%) done in")


def test_eval_overlap_reports_progress_off_a_terminal(tmp_path, capsys):
    """Caption overlap takes minutes on a 25,000-caption test set; it reports per direction."""
    import numpy as np

    from crossview.cli import main
    from crossview.eval.embeddings import Embeddings, save_embeddings

    rng = np.random.default_rng(0)
    n, per = 60, 5
    emb = Embeddings(image=rng.standard_normal((n, 8)).astype(np.float32),
                     text=rng.standard_normal((n * per, 8)).astype(np.float32),
                     caption_image=np.repeat(np.arange(n), per),
                     captions=[f"a dog number {i % 7} on grass" for i in range(n * per)])
    path = save_embeddings(tmp_path / "e.npz", emb)
    assert main(["eval", str(path), "--overlap"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("caption overlap i2t 60/60 (100%) done in")   # one call: fewer than 100 queries
    assert err[-1].startswith("caption overlap t2i 300/300 (100%) done in")
    assert "caption overlap t2i 100/300 (33%)" in err


def test_the_event_printer_says_the_whole_runs_progress_and_hides_cached_stages():
    """A run's plan (images cached, captions to encode, then fitting): the cached stage prints nothing, the
    caption lines carry the whole run's share and ETA, on a terminal as in a log."""
    from crossview.commands._common import EventPrinter
    from crossview.core.events import Plan, Progress

    for stream in (io.StringIO(), Tty()):
        clock = Clock()
        printer = EventPrinter(stream, interval=5.0, clock=clock)
        clock.t = 0.0
        printer(Plan([{"name": "images", "seconds": 30.0}, {"name": "captions", "seconds": 10.0},
                      {"name": "fit", "seconds": 10.0}]))
        printer(Progress(700, 700, "features: images", stage="images"))       # from the cache
        for done in range(0, 1001, 100):
            printer(Progress(done, 1000, "features: captions", stage="captions"))
            clock.t += 1.0
        printer.close()
        text = stream.getvalue()
        assert "features: images" not in text
        assert "features: captions" in text and "run " in text and "ETA" in text
        if not isinstance(stream, Tty):
            line = [x for x in text.splitlines() if x.startswith("features: captions 500/1,000")][0]
            # 5 s for half the captions: 5 s left in them, then fitting at the same pace (10 s prior x 1.0)
            assert line.endswith("; run 25%, ETA 15 s"), line


def test_a_stage_that_comes_back_keeps_its_count_and_time():
    """A piped search: "trials" progress between each trial's own stages; its last line says the whole search's
    time, not "done in 0 s" (the stage's printer used to start again after every trial)."""
    from crossview.commands._common import EventPrinter
    from crossview.core.events import Progress

    clock, out = Clock(), io.StringIO()
    printer = EventPrinter(out, interval=5.0, clock=clock)
    for trial in range(3):
        printer(Progress(trial, 3, "trials"))
        for step in range(0, 11):
            printer(Progress(step, 10, f"trial {trial + 1}: epoch 1/1"))
            clock.t += 1.0
    printer(Progress(3, 3, "trials"))
    printer.close()
    last = [x for x in out.getvalue().splitlines() if x.startswith("trials ")][-1]
    assert last == "trials 3/3 (100%) done in 33 s", last


def test_feature_progress_shows_work_and_hides_cache_hits():
    from crossview.commands._common import feature_progress

    out = io.StringIO()
    progress = feature_progress(out)
    progress("images", 700, 700)                 # from the cache: its end only
    progress("captions", 0, 12)                  # encoded: 0 first, then the end
    progress("captions", 12, 12)
    progress.close()
    text = out.getvalue()
    assert "images" not in text and "features: captions 12/12 (100%) done in" in text
