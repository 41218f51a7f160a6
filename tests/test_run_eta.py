"""The whole-run ETA: a stage plan up front (crossview.core.events.Plan), priors from this machine's timings
(crossview.engine.timings), scaled by the run's own pace (crossview.core.progress.RunEta)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crossview.core.events import Plan, Progress, event_from_dict
from crossview.core.progress import RunEta, StageEta, stage_key
from crossview.engine import timings
from crossview.engine.timings import TimingBook


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _simulate(plan, truth, startup, step=0.5):
    """Drive a RunEta through stages whose true durations are ``truth`` (seconds, after ``startup`` seconds of
    set-up before each stage's first event), as the engine reports them; returns (time, eta, true left) rows."""
    clock = Clock()
    eta = RunEta(clock)
    eta.plan(plan)
    total = sum(truth.values()) + sum(startup.values())
    rows = []
    for s in plan:
        name = s["name"]
        clock.t += startup.get(name, 0.0)
        n = max(1, int(truth[name] / step))
        for i in range(n + 1):
            if i:
                clock.t += truth[name] / n
            left = eta.update(name, i / n)
            rows.append((clock.t, left, total - clock.t))
    return rows, total


def test_eta_is_within_a_factor_of_two_of_the_truth_from_a_tenth_of_the_run_on():
    """A first run on a slow machine: every stage 3x slower than its prior, and the priors' relative sizes off
    by up to 2x (captions 2x too cheap, fitting 2x too dear), a model loaded before each feature stage."""
    plan = [{"name": "images", "seconds": 24.0}, {"name": "text model", "seconds": 1.0},
            {"name": "captions", "seconds": 7.0}, {"name": "fit", "seconds": 4.0}, {"name": "evaluate", "seconds": 1.0}]
    truth = {"images": 72.0, "text model": 3.0, "captions": 42.0, "fit": 6.0, "evaluate": 3.0}
    startup = {"images": 3.0, "captions": 4.0}
    rows, total = _simulate(plan, truth, startup)
    judged = [(t, e, true) for t, e, true in rows if 0.1 * total <= t and true >= 0.1 * total]
    assert judged
    for t, e, true in judged:
        assert e is not None and 0.5 <= e / true <= 2.0, f"at {t:.1f} s: ETA {e} s, truth {true:.1f} s"


def test_the_old_per_stage_eta_misses_what_the_plan_sees():
    """The same run through the per-stage estimator: at the end of the image stage it says 'done soon' although
    half of the run is ahead. The plan is what makes the whole-run ETA possible."""
    clock = Clock()
    stage = StageEta(clock)
    for i in range(101):
        clock.t = 0.72 * i
        left = stage.update(stage_key("features: images", 700), i / 100)
    assert left is None or left < 1.0                      # images done: the stage has nothing left
    clock.t = 0.0
    run = RunEta(clock)
    run.plan([{"name": "images", "seconds": 24.0}, {"name": "captions", "seconds": 24.0}])
    for i in range(101):
        clock.t = 0.72 * i
        left = run.update("images", i / 100)
    assert left == pytest.approx(72.0, rel=0.01)           # the caption stage, at the pace the images went


def test_a_cached_stage_is_skipped_not_counted():
    """Images came from the cache (no event), captions too (done at their first event): only fitting is left,
    and its prior is scaled by the fitting's own pace, not by a near-zero 'pace' of the cached stages."""
    clock = Clock()
    eta = RunEta(clock)
    eta.plan([{"name": "images", "seconds": 100.0}, {"name": "captions", "seconds": 50.0},
              {"name": "fit", "seconds": 10.0}, {"name": "evaluate", "seconds": 10.0}])
    clock.t = 0.2
    assert eta.update("captions", 1.0) is None
    assert eta.stage("images").state == "skipped" and eta.stage("captions").state == "skipped"
    eta.update("fit", 0.0)
    clock.t = 2.2
    left = eta.update("fit", 0.1)          # its first interval: start-up and a first batch, no pace yet
    assert left == pytest.approx((10.0 - 2.0) + 10.0, rel=0.01)
    clock.t = 4.2
    left = eta.update("fit", 0.2)          # 2 s for 10% of a 10 s prior: the machine is 2x slower
    assert left == pytest.approx(2.0 * 8.0 + 2.0 * 10.0, rel=0.01)
    assert 0.0 < eta.fraction() < 0.3


def test_a_first_interval_bounds_the_pace_from_above_and_a_start_up_is_not_spread_over_the_stage():
    """A stage's first report of work comes after its start-up (two backbones loaded: 3 s) and a first batch: taken
    as pace, a first run's first estimate said 86 s for 38. Until a pace is measured the expected seconds stand (the
    first interval can only make the machine look slower than it is, so a faster one still scales them down); and
    once a stage's start-up is behind it, its ETA is what the pace leaves of its expected seconds, not their share
    for the work left (the caption stage's ETA, its model loaded, was 2x the truth)."""
    clock = Clock()
    eta = RunEta(clock)
    eta.plan([{"name": "images", "seconds": 30.0}, {"name": "captions", "seconds": 7.0},
              {"name": "fit", "seconds": 1.0}])
    eta.update("images", 0.0)
    clock.t = 3.5                                         # 3 s loading, 0.5 s for the first 5%
    assert eta.update("images", 0.05) == pytest.approx((30.0 - 3.5) + 7.0 + 1.0, rel=0.01)
    fast = RunEta(Clock())
    fast.plan([{"name": "images", "seconds": 30.0}])
    fast.update("images", 0.0)
    fast._clock.t = 0.75                                  # 5% in 0.75 s: twice the prior's pace, start-up and all
    assert fast.update("images", 0.05) == pytest.approx(0.5 * 30.0 - 0.75, rel=0.01)
    for i in range(2, 21):                                # the rest at the prior's pace: 1.5 s every 5%
        clock.t += 1.5
        eta.update("images", i / 20)
    eta.update("captions", 0.0)
    k = clock.t / 30.0                                    # the run's pace: the images' seconds over their prior
    clock.t += 2.5                                        # MiniLM loads (2 s) and encodes its first 10% (0.5 s)
    left = eta.update("captions", 0.1)
    assert left == pytest.approx((k * 7.0 - 2.5) + k * 1.0, rel=0.01)
    spread = k * 7.0 * (1.0 - 0.1) + k * 1.0                # the prior's share for the work left, load included
    assert left < spread - 1.5, "the load's share of the prior is spent, not spread over the work left"


def test_pauses_do_not_count_and_paused_is_said():
    clock = Clock()
    eta = RunEta(clock)
    eta.plan([{"name": "fit", "seconds": 100.0}])
    eta.update("fit", 0.0)
    clock.t = 20.0
    before = eta.update("fit", 0.2)
    eta.pause()
    assert eta.paused
    clock.t = 1000.0
    eta.resume()
    assert not eta.paused
    assert eta.update("fit", 0.2) == pytest.approx(before)
    clock.t = 1020.0
    assert eta.update("fit", 0.4) == pytest.approx(60.0)


def test_a_resumed_stage_is_timed_on_the_work_done_since():
    """A resume: training starts at 50% of its work; 5 s later it is at 60%: 20 s are left, not 5 s x 0.4 / 0.6."""
    clock = Clock()
    eta = RunEta(clock)
    eta.plan([{"name": "fit", "seconds": 50.0}, {"name": "evaluate", "seconds": 0.0}])
    eta.update("fit", 0.5)
    clock.t = 5.0
    assert eta.update("fit", 0.6) == pytest.approx(20.0)


def test_without_a_plan_it_is_the_stage_estimator():
    clock = Clock()
    run, stage = RunEta(clock), StageEta(clock)
    for t, f in ((0.0, 0.0), (10.0, 0.1), (20.0, 0.3)):
        clock.t = t
        key = stage_key("epoch 1/3", 90)
        assert run.update("", f, key) == stage.update(key, f)


def test_fraction_never_goes_back():
    clock = Clock()
    eta = RunEta(clock)
    eta.plan([{"name": "images", "seconds": 10.0}, {"name": "fit", "seconds": 10.0}])
    seen = []
    for i in range(11):
        clock.t = i * (3.0 if i < 5 else 0.5)
        eta.update("images", i / 10)
        seen.append(eta.fraction())
    assert seen == sorted(seen) and seen[-1] <= 1.0


def test_plan_event_round_trips():
    ev = Plan([{"name": "images", "label": "image features (x)", "seconds": 1.5}])
    assert event_from_dict(json.loads(json.dumps(ev.to_dict()))) == ev
    p = Progress(1, 2, "features: images", stage="images")
    assert event_from_dict(p.to_dict()) == p
    assert event_from_dict({"event": "progress", "step": 1, "total": 2}).stage == ""   # lines written before


def test_timing_book_averages_and_ignores_damage(tmp_path):
    book = TimingBook(tmp_path / "t.json")
    assert book.per_unit("images", "mobilenet_v2", "cpu") == timings.DEFAULTS["images"]
    assert book.per_unit("images", "mobilenet_v2", "cuda:0") < timings.DEFAULTS["images"]
    assert book.per_unit("captions", "minilm", "cpu") > book.per_unit("captions", "glove", "cpu")
    # two backbones, each over the image and its mirror: twice one backbone's decode and run, plus two passes
    both = book.per_unit("images", "efficientnet_lite0+mobilenet_v2:flip", "cpu")
    assert both == pytest.approx(2 * (timings.DEFAULTS["images"] + timings.DEFAULTS["image pass"]))
    book.record("images", "mobilenet_v2", "cpu", 100, 10.0)
    assert book.per_unit("images", "mobilenet_v2", "cpu") == pytest.approx(0.1)
    book.record("images", "mobilenet_v2", "cpu", 100, 30.0)
    assert book.per_unit("images", "mobilenet_v2", "cpu") == pytest.approx(0.2)     # the running average
    assert book.per_unit("images", "mobilenet_v2", "cuda") != pytest.approx(0.2)   # another device kind
    book.record("fit", "cca", "cpu", 0, 5.0)                                        # no work: nothing learned
    book.record("fit", "cca", "cpu", 10, float("nan"))
    assert "fit|cca|cpu" not in book.entries()
    (tmp_path / "t.json").write_text('{"images|mobilenet_v2|cpu": "rm -rf /", "fit|cca|cpu": -1, "x": 1e999}')
    assert book.entries() == {}
    (tmp_path / "t.json").write_text("[1, 2")
    assert book.per_unit("fit", "cca", "cpu") == timings.DEFAULTS["fit"]
    book.record("fit", "cca", "cpu", 10, 1.0)                                        # rewritten, readable again
    assert book.per_unit("fit", "cca", "cpu") == pytest.approx(0.1)


def test_a_run_says_its_plan_first_and_names_every_stage(tmp_path, monkeypatch):
    """A CCA run on image files (nine small PNGs; a random-weight backbone stands in for the pretrained one, so
    the test extracts in seconds): a Plan before the first progress, every progress event names a planned stage,
    the run ends with the evaluation stage done, and the timing book learns the stages that did work; a second run
    (features from the cache) teaches it fitting and evaluating only, never the cached stages."""
    from test_progress_printing import _tiny_dataset

    from crossview.engine.run import train
    from crossview.features import image as image_mod

    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    real = image_mod.create_image_encoder
    monkeypatch.setattr(image_mod, "create_image_encoder", lambda name, **kw: real("resnet18", allow_random=True))
    book = tmp_path / "timings.json"
    monkeypatch.setattr(timings, "default_path", lambda: book)
    data = str(_tiny_dataset(tmp_path / "tiny", n=9))
    kw = dict(image_encoder="resnet18", text_encoder="tfidf", params={"n_components": 2}, device="cpu")
    list(train("cca", data, run_dir=tmp_path / "first", **kw))      # extracts: images and captions do work
    assert any(k.startswith("images|resnet18|") for k in TimingBook(book).entries())
    book.unlink()
    events = list(train("cca", data, run_dir=tmp_path / "run", **kw))
    kinds = [type(e).__name__ for e in events]
    assert "Plan" in kinds and kinds.index("Plan") < kinds.index("Progress")
    plan = next(e for e in events if isinstance(e, Plan))
    names = [s["name"] for s in plan.stages]
    assert names[-2:] == ["fit", "evaluate"] and "images" in names and "captions" in names
    assert "text model" in names                                      # TF-IDF is fitted on the training captions
    assert all(s["seconds"] >= 0 for s in plan.stages)
    progress = [e for e in events if isinstance(e, Progress)]
    assert progress and all(e.stage in names for e in progress)
    assert progress[-1].stage == "evaluate" and progress[-1].step == progress[-1].total
    learned = TimingBook(book).entries()
    assert "fit|cca|cpu" in learned and "evaluate|cca|cpu" in learned
    assert not any(k.startswith(("images|", "captions|")) for k in learned), "cached stages teach nothing"
    # the run's metrics.jsonl keeps the plan, for a later look at what was planned
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(d.get("event") == "plan" for d in lines)
    eta = RunEta()
    eta.plan(plan.stages)
    for e in progress:
        eta.update(e.stage, e.fraction)
    assert eta.fraction() == pytest.approx(1.0) and np.isfinite(eta.fraction())
    # an encoder with nothing to fit plans no text-model stage (it was planned, never came, and the ETA overshot)
    gen = train("cca", data, run_dir=tmp_path / "glove", **{**kw, "text_encoder": "glove"})
    try:
        glove_plan = next(e for e in gen if isinstance(e, Plan))
    finally:
        gen.close()
    glove_names = [s["name"] for s in glove_plan.stages]
    assert "captions" in glove_names and "text model" not in glove_names


def test_feature_extraction_is_the_runs_own_events_no_thread_and_a_cancel_closes_it(tmp_path, monkeypatch):
    """First-time extraction on image files: its progress comes as the run's events from the run's own thread
    (no worker thread, no queue: the encoders are generators the run drives); stopping the run between two
    batches closes the extraction, the run says "cancelled", and a resume finishes it."""
    import threading

    from test_progress_printing import _tiny_dataset

    from crossview.core.events import Finished
    from crossview.engine import feature_stage
    from crossview.engine.run import read_status, resume, train

    monkeypatch.setenv("CROSSVIEW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(timings, "default_path", lambda: tmp_path / "timings.json")
    assert not hasattr(feature_stage.FeatureStage, "_in_thread"), "the callback thread bridge is gone"
    before = set(threading.enumerate())
    data = _tiny_dataset(tmp_path / "tiny", n=9)
    from crossview.features import image as image_mod
    real = image_mod.create_image_encoder
    monkeypatch.setattr(image_mod, "create_image_encoder",
                        lambda name, **kw: real("resnet18", allow_random=True))
    gen = train("cca", str(data), run_dir=tmp_path / "run", image_encoder="resnet18", text_encoder="tfidf",
                params={"n_components": 2}, device="cpu")
    seen = []
    for ev in gen:
        if isinstance(ev, Progress) and ev.stage == "images":
            seen.append((ev.step, ev.total, threading.current_thread() is threading.main_thread()))
            break                              # stop the run as the extraction starts
    assert seen == [(0, 9, True)]
    gen.close()
    assert read_status(tmp_path / "run")["status"] == "cancelled"
    assert set(threading.enumerate()) <= before, "no thread left behind"
    events = list(resume(tmp_path / "run"))
    assert isinstance(events[-1], Finished)


def test_the_run_never_ends_before_its_running_stage():
    """A stage far slower than its prior (a COCO-size epoch: 64 min where the plan said 4): before the stage has done
    a tenth of its work the run's ETA is scaled by the run's pace, which catches up slowly; it is never less than
    the stage's own ETA (the CLI printed 'epoch ETA 1 h 03 min; run ETA 7 min')."""
    clock = Clock()
    eta = RunEta(clock)
    eta.plan([{"name": "features", "seconds": 10.0}, {"name": "fit", "seconds": 240.0},
              {"name": "evaluate", "seconds": 20.0}])
    eta.update("features", 0.0)
    clock.t += 10.0
    eta.update("features", 1.0)
    eta.update("fit", 0.0)
    own = StageEta(clock)
    own.update("fit", 0.0)
    for i in range(1, 10):                     # 1% of the epoch every 38 s: 3,840 s in all
        clock.t += 38.4
        left = eta.update("fit", i / 100)
        mine = own.update("fit", i / 100)
        if i >= 2:                             # paced from its first batch's report (i = 1) on
            assert left is not None and mine is not None and left >= mine, (i, left, mine)
    assert left is not None and left > 3000


def test_relay_turns_each_report_into_an_event_and_returns_the_work_s_value():
    from crossview.core.events import relay

    def work():
        yield 0, 3
        yield 2, 3
        return "result"

    def outer():
        value = yield from relay(work(), lambda done, total: Progress(done, total, "w"))
        return value

    gen, events = outer(), []
    while True:
        try:
            events.append(next(gen))
        except StopIteration as end:
            assert end.value == "result"
            break
    assert [(e.step, e.total, e.message) for e in events] == [(0, 3, "w"), (2, 3, "w")]
