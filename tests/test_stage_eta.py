"""crossview.core.progress.StageEta: the time left in the running stage, at its own rate, pauses excluded."""

from __future__ import annotations

import pytest

from crossview.core.progress import StageEta, stage_key


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_new_stage_restarts_the_clock():
    """Feature extraction took 900 s; training then runs at 1% a second: its ETA is 99 s at 1%, not the 89,100 s
    that (time since the start) x (what is left) / (fraction done) gives."""
    clock = Clock()
    eta = StageEta(clock)
    assert eta.update(stage_key("features: images", 700), 0.0) is None
    clock.t = 900.0
    assert eta.update(stage_key("features: images", 700), 1.0) is None        # a finished stage has no ETA
    assert eta.update(stage_key("epoch 1/10", 500), 0.0) is None
    clock.t = 901.0
    assert eta.update(stage_key("epoch 1/10", 500), 0.01) == pytest.approx(99.0)
    clock.t = 950.0
    assert eta.update(stage_key("epoch 5/10", 500), 0.5) == pytest.approx(50.0), "epochs are one stage"


def test_pauses_do_not_count():
    clock = Clock()
    eta = StageEta(clock)
    eta.update("s", 0.0)
    clock.t = 10.0
    assert eta.update("s", 0.1) == pytest.approx(90.0)
    eta.pause()
    clock.t = 1000.0
    assert eta.paused and eta.update("s", 0.1) == pytest.approx(90.0)
    eta.resume()
    clock.t = 1010.0
    assert not eta.paused and eta.update("s", 0.2) == pytest.approx(80.0), "the pause's 990 s are not in the rate"


def test_a_fraction_going_back_is_a_new_stage_and_too_little_work_gives_none():
    clock = Clock()
    eta = StageEta(clock, min_fraction=0.05)
    eta.update("s", 0.5)
    clock.t = 5.0
    assert eta.update("s", 0.52) is None                 # 2% of the stage done since it began: too little
    clock.t = 10.0
    assert eta.update("s", 0.6) == pytest.approx(10.0 * 0.4 / 0.1)
    assert eta.update("s", 0.1) is None                  # went back: a new stage begins here
    clock.t = 20.0
    assert eta.update("s", 0.2) == pytest.approx(80.0)


def test_stage_key_blanks_numbers_only():
    assert stage_key("epoch 3/20", 400) == stage_key("epoch 17/20", 400)
    assert stage_key("epoch 3/20", 400) != stage_key("epoch 3/20", 800)
    assert stage_key("features: images", 7) != stage_key("features: captions", 7)
