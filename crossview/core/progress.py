"""Time left in a run and in a stage of work: one estimator for every front end (the app's progress line, the
CLI's). :class:`RunEta` covers a whole run from its stage plan; :class:`StageEta` one stage at its own rate."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any, Callable

__all__ = ["RunEta", "StageEta", "drive", "drive_stages", "format_seconds", "stage_key"]


def format_seconds(s: float) -> str:
    """``7 s``, ``3 min 05 s``, ``1 h 02 min``: a duration for a person."""
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def stage_key(message: str, total: int) -> str:
    """What identifies a stage across its progress events: the message with its numbers blanked ("epoch 3/20"
    and "epoch 4/20" are one stage) and the total."""
    return f"{re.sub(r'[0-9]+', '#', message)}|{total}"


class StageEta:
    """Seconds left in the running stage, from its own rate since it began, pauses excluded.

    A new stage (another :func:`stage_key`, or a fraction that goes back) restarts the clock, so the time spent in
    earlier stages (feature extraction before training) never inflates the estimate of this one; while paused the
    clock stands still. No estimate (None) until the stage has done ``min_fraction`` of its work."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, min_fraction: float = 0.01) -> None:
        self._clock = clock
        self.min_fraction = min_fraction
        self._key: str | None = None
        self._t0 = self._f0 = self._last = 0.0
        self._paused_at: float | None = None
        self._paused_total = 0.0

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = self._clock()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._paused_total += self._clock() - self._paused_at
            self._paused_at = None

    def active_seconds(self) -> float:
        """The clock less every pause (the current one included)."""
        now = self._clock()
        return now - self._paused_total - (now - self._paused_at if self._paused_at is not None else 0.0)

    def update(self, key: str, fraction: float) -> float | None:
        """Record that stage ``key`` is at ``fraction`` (0-1) now; returns the seconds it has left, or None."""
        t = self.active_seconds()
        if key != self._key or fraction < self._last:
            self._key, self._t0, self._f0 = key, t, fraction
        self._last = fraction
        done = fraction - self._f0
        if fraction >= 1.0 or done < self.min_fraction or t <= self._t0:
            return None
        return (t - self._t0) * (1.0 - fraction) / done


class _PlanStage:
    __slots__ = ("name", "label", "prior", "state", "started", "actual", "fraction", "first", "first_at",
                 "rate_from")

    def __init__(self, name: str, label: str, prior: float) -> None:
        self.name, self.label, self.prior = name, label, max(0.0, float(prior))
        self.state = "pending"          # pending -> running -> done, or skipped (cached: no work done)
        self.started = self.actual = self.fraction = 0.0
        self.first = 0.0                # the fraction at its first event: a resumed stage has work behind it
        self.first_at = 0.0             # when that event came (the stage's start-up, e.g. loading a model, is before)
        #: (time, fraction) of its first report of work done (after its first batch): the stage's own pace is
        #: measured from there, so loading a model after a "work starts" report does not count as pace
        self.rate_from: tuple[float, float] | None = None

    def share_done(self) -> float:
        """The share of the stage's work done in this execution."""
        if self.state == "done":
            return 1.0 - self.first
        return max(0.0, self.fraction - self.first) if self.state == "running" else 0.0


class RunEta:
    """Seconds left in a whole run (every stage: features, fitting, evaluation), pauses excluded.

    :meth:`plan` gives the stages in order with their expected seconds (the engine's :class:`~crossview.core.
    events.Plan`: priors from this machine's earlier runs, or a built-in cost model). As the run goes, the
    estimate learns from the run's own timings: the work done so far took ``k`` times its expected seconds, so
    every stage still to come takes ``k`` times its own; the running stage, once it has done a tenth of its
    work since its first batch, goes at its own pace measured from there (its start-up, such as loading a model
    after it said "work starts", does not recur); before that it is given what the pace leaves of its expected
    seconds once its first batch is reported (its start-up spent), and at least the time its own pace says once it
    has done ``min_fraction`` since (a run never ends before its running stage). Before anything has a pace but
    the first stage's first interval (start-up and first batch: a bound from above on the pace), the expected
    seconds stand, scaled down only if even that interval was faster. A stage that reports itself
    done at its first event (its features came from the cache) is skipped: neither its time nor its expected
    seconds count. Progress for a stage the plan does not name (or with no plan) falls back to
    :class:`StageEta`: that stage alone."""

    #: the running stage is timed at its own rate once it has done this share of its work
    OWN_RATE_FRACTION = 0.1

    def __init__(self, clock: Callable[[], float] = time.monotonic, min_fraction: float = 0.01) -> None:
        self._clock = clock
        self.min_fraction = min_fraction
        self._stages: list[_PlanStage] = []
        self._mark = 0.0                 # active seconds when the last stage ended (or the plan began)
        self._fallback = StageEta(clock, min_fraction)   # a stage the plan does not name; and the pause clock
        self._last_eta: float | None = None
        self._bar = 0.0

    # ------------------------------------------------------------------ clock (the fallback's: one pause clock)
    @property
    def paused(self) -> bool:
        return self._fallback.paused

    def pause(self) -> None:
        self._fallback.pause()

    def resume(self) -> None:
        self._fallback.resume()

    def active_seconds(self) -> float:
        """The clock less every pause (the current one included)."""
        return self._fallback.active_seconds()

    # ------------------------------------------------------------------ plan and progress
    def plan(self, stages: list[dict[str, Any]]) -> None:
        """Start over with ``stages`` (``[{"name", "label", "seconds"}, ...]``, in the order they run)."""
        self._stages = [_PlanStage(str(s.get("name", "")), str(s.get("label", s.get("name", ""))),
                                   float(s.get("seconds") or 0.0)) for s in stages]
        self._mark = self.active_seconds()
        self._last_eta = None
        self._bar = 0.0

    @property
    def planned(self) -> bool:
        return bool(self._stages)

    def stage(self, name: str) -> _PlanStage | None:
        return next((s for s in self._stages if s.name == name), None)

    def update(self, stage: str, fraction: float, key: str = "") -> float | None:
        """Record that ``stage`` is at ``fraction`` (0-1) of its work now; returns the seconds left in the
        whole run (None until enough is known). ``key`` identifies the stage for the fallback (no plan, or a
        stage it does not name): the :func:`stage_key` of the message and total."""
        t = self.active_seconds()
        idx = next((i for i, s in enumerate(self._stages) if s.name == stage), None)
        if idx is None:
            self._last_eta = self._fallback.update(key or stage, fraction)
            return self._last_eta
        fraction = min(1.0, max(0.0, float(fraction)))
        for s in self._stages[:idx]:         # earlier stages are over: done, or skipped if they never ran
            self._close(s, t, skipped=s.state == "pending")
        for s in self._stages[idx + 1:]:     # a stage reported again after later ones (a resume): start over
            if s.state != "pending":
                s.state, s.fraction, s.actual = "pending", 0.0, 0.0
        cur = self._stages[idx]
        if cur.state in ("done", "skipped") and fraction < 1.0:
            cur.state, cur.actual = "pending", 0.0          # the stage runs again (e.g. a refit)
        if cur.state == "pending":
            if fraction >= 1.0:
                cur.state = "skipped"         # done at once: nothing was computed (a cache hit)
                self._mark = t
            else:
                cur.state, cur.started, cur.fraction, cur.first = "running", self._mark, fraction, fraction
                cur.first_at = t
        elif cur.state == "running":
            if cur.rate_from is None and fraction > cur.first:
                cur.rate_from = (t, fraction)
            cur.fraction = max(cur.fraction, fraction)      # sub-steps of one stage never move it back
            if fraction >= 1.0:
                self._close(cur, t)
        self._last_eta = self._estimate(t)
        return self._last_eta

    def _close(self, s: _PlanStage, t: float, skipped: bool = False) -> None:
        if s.state == "running":
            s.state, s.actual, s.fraction = "done", max(0.0, t - s.started), 1.0
            self._mark = t
        elif skipped and s.state == "pending":
            s.state = "skipped"

    def _estimate(self, t: float) -> float | None:
        known = [s for s in self._stages if s.state != "skipped" and s.prior > 0]
        total_prior = sum(s.prior * (1.0 - s.first) for s in known)
        # the running stage counts from its first report of work done once it has done more since: its start-up
        # (loading a model after it said "work starts") is not a pace to scale the rest of the run by (a first-time
        # CCA run's ETA overshot 1.5x through the images stage, two backbones loading counted as pace); until then
        # it counts nothing while stages before it give a pace, else from its first event
        def paced(s: _PlanStage, early: bool) -> tuple[float, float]:
            if s.state == "done":
                return s.prior * s.share_done(), s.actual
            if s.state != "running":
                return 0.0, 0.0
            r = s.rate_from
            if r is not None and s.fraction - r[1] >= self.min_fraction:
                return s.prior * (s.fraction - r[1]), t - r[0]
            return (s.prior * s.share_done(), t - s.first_at) if early else (0.0, 0.0)

        pairs = [paced(s, early=False) for s in known]
        early = sum(p for p, _ in pairs) < self.min_fraction * total_prior
        if early:
            pairs = [paced(s, early=True) for s in known]
        done_prior = sum(p for p, _ in pairs)
        done_actual = sum(a for _, a in pairs)
        if total_prior <= 0 or done_prior < self.min_fraction * total_prior or done_actual <= 0:
            return None
        k = done_actual / done_prior
        if early:
            # nothing has a pace yet but the running stage's first interval, which holds its start-up as well as its
            # first batch: a bound from above on the pace, not the pace (a first run's first estimate said 86 s for
            # 38: two backbones loading taken as work); the expected seconds stand until a pace is measured
            k = min(k, 1.0)
        left = 0.0
        for s in self._stages:
            if s.state == "running":
                r = s.rate_from
                # its pace since its first batch: the start-up before it is spent and does not recur
                own = (t - r[0]) * (1.0 - s.fraction) / (s.fraction - r[1]) \
                    if r is not None and s.fraction - r[1] >= self.min_fraction and t > r[0] else None
                if own is not None and s.fraction - r[1] >= self.OWN_RATE_FRACTION:
                    left += own
                else:
                    # the run's pace so far; never less than this stage's own once it has one (a COCO-size epoch
                    # said "ETA 1 h 03 min" beside a run "ETA 7 min" while the run's pace caught up)
                    expected = k * s.prior * (1.0 - s.fraction)
                    if r is not None:
                        # its start-up is behind it: what the pace leaves of the stage's expected seconds after its
                        # first report, spread over the work left (the caption stage's ETA, MiniLM loaded, still
                        # held the load's share of its prior: 2x the truth); no less than that while on time
                        budget = k * s.prior * (1.0 - s.first) - (r[0] - s.first_at)
                        if budget > 0:
                            expected = budget * (1.0 - s.fraction) / max(1e-9, 1.0 - r[1])
                    left += max(expected, own or 0.0)
            elif s.state == "pending":
                left += k * s.prior
        return left

    def fraction(self) -> float:
        """How much of the whole run is done (0-1), for a progress bar over the run: the active seconds so far
        over those plus the estimate left once there is one, else the expected seconds of the work done over
        all of them; it never goes back within one plan."""
        if not self._stages:
            return 0.0
        if self._last_eta is not None:
            spent = self.active_seconds() - min((s.started for s in self._stages if s.state in ("running", "done")),
                                                default=self._mark)
            if spent > 0:
                self._bar = max(self._bar, min(1.0, spent / (spent + self._last_eta)))
                return self._bar
        known = [s for s in self._stages if s.state != "skipped"]
        total = sum(s.prior * (1.0 - s.first) for s in known)
        if total <= 0:
            return 0.0
        done = sum(s.prior * s.share_done() for s in known)
        self._bar = max(self._bar, min(1.0, max(0.0, done / total)))
        return self._bar


def drive(work: Iterator[tuple[int, int]], progress: Callable[[int, int], None] | None = None,
          should_stop: Callable[[], bool] | None = None,
          stopped: Callable[[int, int], str] = lambda done, total: f"cancelled after {done:,} of {total:,}") -> Any:
    """Run a unit of work written as a generator of ``(done, total)`` reports that *returns* its result (the
    encoders' ``iter_*``): each report goes to ``progress``, ``should_stop()`` is asked after each one (between two
    batches) and, when true, the generator is closed (its ``finally`` frees workers) and
    :class:`~crossview.core.errors.Cancelled` raised with ``stopped(done, total)``. Returns the work's result.

    This is how the callback interface of the encoders (``encode_paths(progress=, should_stop=)``) is kept on top
    of their generators, which the engine drives directly as events."""
    from crossview.core.errors import Cancelled

    while True:
        try:
            done, total = next(work)
        except StopIteration as end:
            return end.value
        if progress is not None:
            progress(done, total)
        if should_stop is not None and should_stop():
            close = getattr(work, "close", None)
            if close is not None:
                close()
            raise Cancelled(stopped(done, total))


def drive_stages(work: Iterator[tuple[str, int, int]], progress: Callable[[str, int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None,
                 stopped: Callable[[str, int, int], str] = lambda stage, done, total:
                 f"cancelled in {stage} after {done:,} of {total:,}") -> Any:
    """:func:`drive` for work whose reports name their stage, ``(stage, done, total)`` (feature extraction,
    :func:`crossview.features.iter_extract_features`; the TR / CTR representations of
    :mod:`crossview.features.topics`): each report goes to ``progress(stage, done, total)``, ``should_stop()`` is
    asked after each one and closes the work with :class:`~crossview.core.errors.Cancelled`. Returns its result."""
    from crossview.core.errors import Cancelled

    while True:
        try:
            stage, done, total = next(work)
        except StopIteration as end:
            return end.value
        if progress is not None:
            progress(stage, done, total)
        if should_stop is not None and should_stop():
            close = getattr(work, "close", None)
            if close is not None:
                close()
            raise Cancelled(stopped(stage, done, total))
