"""Helpers shared by the command modules: progress printing and the dataset arguments."""

from __future__ import annotations

import argparse
from pathlib import Path
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from crossview.core.progress import RunEta, format_seconds
from crossview.core.text import printable

__all__ = ["EventPrinter", "ProgressPrinter", "feature_progress", "format_seconds", "load_dataset_reporting",
           "render_demo_reporting", "int_option", "float_option", "seed_option", "add_scoring_options",
           "scoring_select", "scoring_name", "check_param_applies", "default_scorings_text",
           "print_events", "out_file"]


def int_option(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for an integer option in ``lo..hi`` (``hi`` None: no upper bound): a value out of
    range is refused while the command line is parsed, before any work, with one line naming the option and the
    range (``argument --k: 0 is out of range: give an integer >= 1``)."""
    want = f">= {lo}" if hi is None else f"from {lo} to {hi}"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer: give an integer {want}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give an integer {want}")
        return v

    parse.__name__ = "int"
    return parse


def float_option(lo: float, hi: float | None = None, *, above: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a finite number >= ``lo`` (> ``lo`` when ``above``) and <= ``hi``; nan and inf are
    refused like any value out of range."""
    want = (f"> {lo:g}" if above else f">= {lo:g}") if hi is None else \
        f"from {lo:g} to {hi:g}" + (" (not 0)" if above and lo == 0 else "")
    import math

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: give a finite number {want}") from None
        if not math.isfinite(v) or v < lo or (above and v == lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give a finite number {want}")
        return v

    parse.__name__ = "float"
    return parse


def add_scoring_options(p: argparse.ArgumentParser, param: bool = True, training: bool = False) -> None:
    """``--scoring`` (checked by the command, so an unknown name gets one line naming the choices), ``--select``
    and, with ``param``, ``--param`` (a scoring's k or beta instead of the one chosen on the training images).
    ``training``: the option of ``crossview train`` (default: the method's default scoring); else of a command over a
    finished run (default: the scoring the run recorded)."""
    from crossview.eval.scoring import SCORINGS

    from crossview.engine.scoring import SELECTIONS

    defaults = default_scorings_text()
    if training:
        head = ("how the run ranks and is evaluated (its summary, 'crossview eval' and 'crossview query' and the app "
                "use it). default (the default): the method's default scoring, chosen by 3-fold cross-validation "
                f"on the Flickr8k sample's train photos ({defaults}; the others plain), its parameter fixed, the plain "
                "numbers kept beside; plain: the dot product. ")
    else:
        head = ("scoring to rank by (default: the one the run recorded at training, plain for a run without one; "
                f"default: the method's default, {defaults}). ")
    p.add_argument("--scoring", default="default" if training else None, metavar="default|" + "|".join(SCORINGS),
                   help=head + "The hubness-aware scorings normalise with a bank of the run's training images and "
                        "captions (never the evaluated split); their k / beta is the default's, --param's, or "
                        "chosen by rsum on the training images (--select). "
                        + "; ".join(f"{k}: {v}" for k, v in SCORINGS.items()).replace("%", "%%"))
    p.add_argument("--select", default=None, metavar="|".join(SELECTIONS),
                   help="how a scoring's k / beta is chosen instead of the method default's (default auto when the "
                        "scoring has no parameter fixed): "
                        + "; ".join(f"{k}: {v}" for k, v in SELECTIONS.items()).replace("%", "%%")
                        + ". The cross-validation runs are kept in RUN/scoring-cv and reused")
    if param:
        p.add_argument("--param", type=float_option(0, above=True), default=None, metavar="K_OR_BETA",
                       help="the scoring's parameter as given (csls: k, the neighbours averaged; isoftmax / "
                            "dsoftmax: beta, the inverse temperature) instead of the default or the choice on the "
                            "training images; the run then records it as given, not selected")


def default_scorings_text() -> str:
    """``cca: isoftmax beta=10, bitr: csls k=10, ...``: each method's default scoring, for --help texts."""
    from crossview.engine.scoring import DEFAULT_SCORINGS
    from crossview.eval.scoring import PARAMS

    return ", ".join(f"{m}: {s} {PARAMS[s]}={v:g}" for m, (s, v) in DEFAULT_SCORINGS.items())


def scoring_name(args: argparse.Namespace, method: str | None = None, config: dict[str, Any] | None = None) -> str:
    """The scoring ``--scoring`` names, checked (one line for an unknown name): ``"default"`` is ``method``'s
    default scoring; not given (None) is the run's recorded one (``config``); ``--param`` only where it applies."""
    from crossview.core.errors import CrossViewError
    from crossview.engine.scoring import default_scoring, run_scoring
    from crossview.eval.scoring import PARAMS, check_scoring

    name = args.scoring
    if name is None:
        name = run_scoring(config)["scoring"]
    elif name == "default":
        name = default_scoring(str(method or (config or {}).get("method") or ""))["scoring"]
    name = check_scoring(name)
    if getattr(args, "select", None) is not None and PARAMS[name] is None:
        raise CrossViewError(f"--select {args.select}: scoring {name!r} has no parameter to choose; give --scoring "
                             "csls, isoftmax or dsoftmax")
    check_param_applies(name, getattr(args, "param", None))
    return name


def check_param_applies(name: str, param: float | None) -> None:
    """One line when ``--param`` is given for a scoring that has no parameter (``plain``)."""
    from crossview.core.errors import CrossViewError
    from crossview.eval.scoring import PARAMS

    if param is not None and PARAMS[name] is None:
        raise CrossViewError(f"--param {param:g}: scoring {name!r} has no parameter; give --scoring csls "
                             "(k), isoftmax or dsoftmax (beta)")


def scoring_select(args: argparse.Namespace) -> str:
    """``--select`` checked against ``--scoring`` and ``--param`` (one clear line where it does not apply);
    ``"auto"`` when it is not given."""
    from crossview.core.errors import CrossViewError
    from crossview.engine.scoring import check_select
    from crossview.eval.scoring import PARAMS

    if args.select is None:
        return "auto"
    select = check_select(args.select)
    if args.scoring not in (None, "default") and PARAMS.get(args.scoring) is None:
        raise CrossViewError(f"--select {select}: scoring {args.scoring!r} has no parameter to choose; give "
                             "--scoring csls, isoftmax or dsoftmax")
    if getattr(args, "param", None) is not None:
        raise CrossViewError(f"--select {select} and --param {args.param:g}: a given parameter is not chosen; give "
                             "one of them")
    return select


def print_events(work: Any) -> Any:
    """Drive a generator of engine events that returns a result (a scoring's cross-validation runs,
    :func:`crossview.engine.scoring.iter_evaluate_run`) through an :class:`EventPrinter` on stderr: a progress line
    every few seconds. Returns the generator's result."""
    printer = EventPrinter()
    try:
        while True:
            try:
                ev = next(work)
            except StopIteration as stop:
                return stop.value
            printer(ev)
    finally:
        printer.close()
        work.close()


def out_file(value: str | None, option: str, suffixes: tuple[str, ...], example: str) -> Path | None:
    """The file an ``--out`` option names, checked before any work: ``suffixes`` (lower case, e.g. ``(".md",)``),
    not a folder, in a folder that exists (nothing creates folders the user did not ask for); None when not given.
    Each refusal is one line naming the option, the path and what to do."""
    from crossview.core.errors import CrossViewError

    if not value:
        return None
    p = Path(value).expanduser()
    if p.is_dir():
        raise CrossViewError(f"{option} {p}: that is a folder; give a file name, e.g. {p / example}")
    if p.suffix.lower() not in suffixes:
        raise CrossViewError(f"{option} {p}: give a file name ending in {' or '.join(suffixes)}")
    if not p.parent.is_dir():
        raise CrossViewError(f"{option} {p}: the folder {p.parent} does not exist; create it or choose another")
    return p


def seed_option(text: str) -> int:
    """An argparse ``type`` for a seed: an integer every random generator accepts
    (:data:`crossview.core.run_settings.SEED_MAX`)."""
    from crossview.core.run_settings import SEED_MAX

    return int_option(0, SEED_MAX)(text)


def print_result(text: str) -> None:
    """Print a command's result on stdout; a reader that closed the pipe early (``crossview query ... | head``)
    has what it wanted, so that is not an error."""
    import os
    import sys

    try:
        # results quote captions, file names and split names from the dataset: escape what would drive the
        # terminal (ANSI sequences, carriage returns) or fail to encode (lone surrogates)
        print(printable(text, newlines=True, tabs=True))
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class ProgressPrinter:
    """Progress of one stage on ``stream`` (default stderr), fed with ``printer(done, total)``: the CLI's one
    progress display (the train, tune and experiment event printers and every command use it).

    On a terminal: a ``tqdm`` bar with the count, elapsed time and ETA, redrawn at most 5 times a second and
    left on screen when the stage ends. Elsewhere (a log file, a pipe): a plain line such as ``features:
    images 1,234/3,500 (35%) ETA 40 s`` at the first call, then at most every ``interval`` seconds, and a
    final ``... done in 12 s`` line (tqdm off a terminal would write carriage returns into the log). ``total``
    0 means unknown (counts without percentage or ETA). ``label`` may be changed by a call
    (``printer(done, total, label="epoch 3/20")``). ``clock`` is for tests.
    """

    def __init__(self, label: str, stream: TextIO | None = None, *, interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else bool(tty)
        self.interval = float(interval)
        self.clock = clock
        self.start = clock()
        self._origin: tuple[float, int] | None = None   # (time, done) of the first call: the ETA's rate
        self._last_write: float | None = None
        self._done = -1
        self._bar: Any = None       # the tqdm bar on a terminal, while the stage runs
        self.suffix = ""            # said after the stage's own count and ETA (the whole run's progress)
        self.finished = False

    @property
    def line_open(self) -> bool:
        """A bar is on the terminal and its stage has not ended."""
        return self._bar is not None

    # ------------------------------------------------------------------ plain lines
    def _eta(self, now: float, done: int, total: int) -> str:
        if self._origin is None or total <= 0 or done >= total:
            return ""
        t0, d0 = self._origin
        if done <= d0 or now <= t0:
            return ""
        return f" ETA {format_seconds((total - done) * (now - t0) / (done - d0))}"

    def _count(self, done: int, total: int) -> str:
        if total <= 0:
            return f"{done:,}"
        return f"{done:,}/{total:,} ({int(100 * done / total)}%)"

    # ------------------------------------------------------------------ calls
    def __call__(self, done: int, total: int, label: str | None = None, suffix: str | None = None) -> None:
        now = self.clock()
        if label:
            self.label = label
        if suffix is not None:
            self.suffix = suffix
        done, total = int(done), int(total)
        if self.finished or done < self._done:
            if done >= self._done and done >= total > 0:
                return                      # the same stage reported done twice
            self._restart(now)               # a new pass of the stage
        if self._origin is None:
            self._origin = (now, done)
        self._done = done
        final = total > 0 and done >= total
        if self.tty:
            self._draw(done, total, final)
        elif final or self._last_write is None or now - self._last_write >= self.interval:
            if final:
                text = f"{self.label} {self._count(done, total)} done in {format_seconds(now - self.start)}"
            else:
                text = f"{self.label} {self._count(done, total)}{self._eta(now, done, total)}"
            if self.suffix:
                text += f"; {self.suffix}"
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last_write = now
        self.finished = final

    def _draw(self, done: int, total: int, final: bool) -> None:
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(total=total or None, initial=done, desc=self.label, file=self.stream, leave=True,
                             mininterval=0.2, miniters=1, smoothing=0, dynamic_ncols=True, ascii=True,
                             bar_format=_BAR if total else _COUNT)
            if self.suffix:
                self._bar.set_postfix_str(self.suffix, refresh=False)
            # tqdm reads time through this attribute; its own tests swap the timer the same way
            self._bar._time = self.clock
            self._bar.start_t = self.start            # a stage shown again (after another) keeps its elapsed time
            self._bar.last_print_t = self.clock()
        else:
            if (total or None) != self._bar.total:
                self._bar.total = total or None
                self._bar.bar_format = _BAR if total else _COUNT
            if self.label != self._bar.desc:
                self._bar.set_description_str(self.label, refresh=False)
            if self.suffix != self._bar.postfix:
                self._bar.set_postfix_str(self.suffix, refresh=False)
            self._bar.update(done - self._bar.n)
        if final:
            self.close()

    def close(self) -> None:
        """End the terminal bar (drawn one last time, then a newline); nothing to do off a terminal."""
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.close()

    def _restart(self, now: float) -> None:
        self.close()
        self.start, self._origin, self._last_write = now, None, None
        self._done, self.finished = -1, False

    def note(self, text: str) -> None:
        """A message line of its own (above an open bar, which is redrawn below it)."""
        if self._bar is not None:
            from tqdm import tqdm

            tqdm.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


_BAR = "{desc} [{bar:25}] {n_fmt}/{total_fmt} ({percentage:.0f}%) {elapsed}<{remaining}{postfix}"
_COUNT = "{desc} {n_fmt} {elapsed}{postfix}"


class feature_progress:  # noqa: N801 - used as the callback it makes: progress = feature_progress()
    """A ``progress(stage, done, total)`` callback for :func:`crossview.features.extract_features` and the corpus
    encoders: one :class:`ProgressPrinter` per stage (``features: images``), none for a stage whose first report is
    already its end (the encoders report 0 first when they work: that is a cache hit, nothing to show).
    :meth:`close` ends the bars; :meth:`clear` forgets them (the next report of a stage starts a new one)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.bars: dict[str, ProgressPrinter | None] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.bars:
            self.bars[stage] = (None if total > 0 and done >= total else
                                ProgressPrinter(f"features: {stage}", self.stream))
        bar = self.bars[stage]
        if bar is not None:
            bar(done, total)

    def close(self) -> None:
        for bar in self.bars.values():
            if bar is not None:
                bar.close()

    def clear(self) -> None:
        self.close()
        self.bars.clear()


class EventPrinter:
    """Turns engine events into progress (one :class:`ProgressPrinter` per stage) and log lines on ``stream``
    (stderr): ``crossview train``, ``tune`` and ``experiment`` print through it. ``prefix`` starts each log
    line (``"experiment: "``)."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, prefix: str = "") -> None:
        self.stream = stream or sys.stderr
        self.interval = interval
        self.clock = clock
        self.prefix = prefix
        self.stage: tuple[str, int] | None = None
        self.bar: ProgressPrinter | None = None
        # one printer per stage: a stage that comes back after another (a search's "trials" between its trials'
        # own stages) continues its count and its "done in" time instead of starting again
        self._printers: dict[tuple[str, int], ProgressPrinter] = {}
        # the whole run's progress and ETA, from the run's stage plan (crossview.core.events.Plan)
        self.run_eta = RunEta(clock)

    @staticmethod
    def _family(message: str) -> str:
        """What one bar covers: ``features: images`` (each feature stage), ``cca`` (its sub-steps), ``epoch``."""
        if message.startswith("features:"):
            return message
        return re.sub(r"\s*\d+\s*/\s*\d+", "", message.split(":")[0]).strip() or "training"

    def __call__(self, ev: Any) -> None:
        from crossview.core.events import Log, Plan, Progress, Validation

        if isinstance(ev, Plan):
            self.run_eta.plan(ev.stages)
        elif isinstance(ev, Progress):
            message = ev.message or "training"
            stage = (self._family(message), int(ev.total))
            suffix = self._run_suffix(ev)
            if ev.stage and ev.total and ev.step >= ev.total and stage != self.stage:
                return       # a planned stage done at its first event: its work was cached, nothing to show
            if stage != self.stage or self.bar is None:
                self.close()
                self.stage = stage
                self.bar = self._printers.get(stage)
                if self.bar is None or self.bar.finished:
                    self.bar = ProgressPrinter(message, self.stream, interval=self.interval, clock=self.clock)
                    self._printers[stage] = self.bar
            self.bar(min(ev.step, ev.total) if ev.total else ev.step, ev.total, label=message, suffix=suffix)
        elif isinstance(ev, Log):
            if ev.level != "debug":
                self.line(("" if ev.level == "info" else f"{ev.level}: ") + ev.message)
        elif isinstance(ev, Validation):
            m = ev.metrics
            if "rsum" in m and isinstance(m.get("i2t"), dict):
                self.line(f"validation {ev.epoch}: rsum {m['rsum']:.1f}  i2t R@1 {m['i2t']['R@1']:.1f}  "
                          f"t2i R@1 {m['t2i']['R@1']:.1f}")
            else:
                self.line(f"validation {ev.epoch}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                                for k, v in m.items()))
        # Loss and CheckpointSaved: losses go to metrics.jsonl; progress shows the run is alive

    def _run_suffix(self, ev: Any) -> str:
        """``run 35%, ETA 2 min 10 s``: the whole run, when the run said its plan and names this stage."""
        if not self.run_eta.planned or self.run_eta.stage(ev.stage) is None:
            return ""
        left = self.run_eta.update(ev.stage, ev.fraction)
        if left is None or left < 1.0:
            return ""
        return f"run {100 * self.run_eta.fraction():.0f}%, ETA {format_seconds(left)}"

    def line(self, text: str) -> None:
        """A log line (``prefix`` first), above the current bar if one is open."""
        text = printable(self.prefix + text, newlines=True, tabs=True)  # dataset strings reach log lines
        if self.bar is not None:
            self.bar.note(text)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        """End the current stage's bar (call before printing results)."""
        if self.bar is not None:
            self.bar.close()


def render_demo_reporting(stream: TextIO | None = None) -> None:
    """Render the built-in demo into the cache now if it is not there yet, saying so and showing progress."""
    from crossview.data.demo import demo_path

    stream = stream or sys.stderr
    said: dict[str, ProgressPrinter] = {}

    def progress(done: int, total: int) -> None:
        if "bar" not in said:
            said["bar"] = ProgressPrinter("rendering the demo", stream)
            said["bar"].note("crossview: rendering the built-in demo dataset (first use only; later runs read it "
                             "from the cache)")
        said["bar"](done, total)

    demo_path(progress=progress)


def load_dataset_reporting(source: str, format: str | None = None, image_root: str | None = None,
                           stream: TextIO | None = None) -> Any:
    """:func:`crossview.data.load_dataset`, with progress when the demo is rendered on first use."""
    from crossview.data import load_dataset

    if str(source) == "demo" or format == "demo":
        render_demo_reporting(stream)
    return load_dataset(source, format=format, image_root=image_root)


def _add_dataset_args(p: argparse.ArgumentParser) -> None:
    from crossview.data import known_formats
    p.add_argument("--format", choices=known_formats(), help="dataset format (default: detected from the path)")
    p.add_argument("--image-root", metavar="DIR", help="folder the dataset's image paths are relative to "
                   "(default: guessed next to the dataset file)")
