"""The whole-run ETA against the truth, over a whole run that extracts its features for the first time.

A run's stage plan (crossview.core.events.Plan) and crossview.core.progress.RunEta, the estimator the app's
progress line and the CLI's use, are fed the run's own events as they come; when the run has ended, each
estimate is set against the time that was really left. Two scenarios, each with an empty feature cache:

* ``first``: an empty timing book too, so the plan's priors are the built-in cost model (a new machine);
* ``learned``: the timing book the first scenario left (this machine's measured seconds per unit).

Reported: each stage's planned and actual seconds, the estimate at every tenth of the run, and the worst ratio
estimate / truth from the first 10% of the run on while at least 10% of it is left (the goal: within 2x; at the
very end a few seconds' error is a large ratio and says nothing). The per-stage estimator used before (one stage at
its own rate) is shown beside it as the baseline.

Usage:  .venv/bin/python bench/eta_whole_run.py [--data PATH] [--method cca] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stamp  # noqa: E402  (bench/_stamp.py)


def one_run(method: str, data: str, cache: Path, book: Path | None) -> dict:
    os.environ["CROSSVIEW_CACHE_DIR"] = str(cache)
    cache.mkdir(parents=True, exist_ok=True)
    if book is not None:
        shutil.copy(book, cache / "timings.json")
    from crossview.core.events import Plan, Progress
    from crossview.core.progress import RunEta, StageEta, stage_key
    from crossview.engine.run import train

    eta, old = RunEta(), StageEta()
    rows, plan, spans = [], [], {}
    t0 = time.monotonic()
    for ev in train(method, data, run_dir=cache / "run"):
        t = time.monotonic() - t0
        if isinstance(ev, Plan):
            eta.plan(ev.stages)
            plan = ev.stages
        elif isinstance(ev, Progress):
            left = eta.update(ev.stage, ev.fraction)
            stage_left = old.update(stage_key(ev.message, ev.total), ev.fraction) if ev.total else None
            rows.append((t, left, stage_left, eta.fraction()))
            a, _b = spans.get(ev.stage, (t, t))
            spans[ev.stage] = (a, t)
    total = time.monotonic() - t0
    return {"rows": rows, "plan": plan, "spans": spans, "total": total}


def report(name: str, res: dict) -> None:
    total, rows = res["total"], res["rows"]
    print(f"\n## {name}: the whole run took {total:.1f} s\n")
    print("stage        planned s   actual s (first to last event)")
    for s in res["plan"]:
        a, b = res["spans"].get(s["name"], (None, None))
        actual = f"{b - a:9.1f}" if a is not None else "  skipped"
        print(f"{s['name']:<12} {s['seconds']:9.1f}  {actual}")
    print("\nrun done   elapsed s   ETA s   true left s   ratio   (per-stage ETA, the baseline)")
    for k in range(1, 10):
        t_k = total * k / 10
        before = [r for r in rows if r[0] <= t_k]
        if not before:
            continue
        t, left, stage_left, _f = before[-1]
        true = total - t
        ratio = f"{left / true:5.2f}" if left is not None and true > 0 else "    -"
        base = f"{stage_left:.1f}" if stage_left is not None else "-"
        shown = f"{left:7.1f}" if left is not None else "      -"
        print(f"{10 * k:7d}%   {t:9.1f} {shown}   {true:11.1f}   {ratio}   ({base})")
    judged = [(t, left, total - t) for t, left, _s, _f in rows
              if t >= 0.1 * total and total - t >= 0.1 * total]
    ratios = [left / true for _t, left, true in judged if left is not None]
    missing = sum(1 for _t, left, _true in judged if left is None)
    base = [s / (total - t) for t, _l, s, _f in rows if t >= 0.1 * total and total - t >= 0.1 * total and s is not None]
    if ratios:
        worst = max(ratios, key=lambda r: max(r, 1 / r))
        print(f"\nfrom 10% of the run on, while 10% is left: {len(ratios)} estimates, ratio estimate/truth "
              f"{min(ratios):.2f} to {max(ratios):.2f} (worst {worst:.2f}; goal: within 0.5-2.0: "
              f"{'met' if all(0.5 <= r <= 2.0 for r in ratios) else 'NOT met'}); {missing} events without an estimate")
    if base:
        print(f"the per-stage ETA over the same events: ratio {min(base):.2f} to {max(base):.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(_stamp.FLICKR8K), help="dataset (default: the shared Flickr8k sample)")
    ap.add_argument("--method", default="cca")
    _stamp.add_out_argument(ap, _stamp.RESULTS / "eta_whole_run_cpu.txt")
    args = ap.parse_args()
    if args.data != "demo" and not Path(args.data).is_file():
        print(f"{args.data}: not found; give --data (the shared Flickr8k sample is beside the repository)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="crossview-eta-"))

    def body() -> int:
        print(f"method {args.method} on {args.data}, default encoders, an empty feature cache in each scenario")
        first = one_run(args.method, args.data, work / "first", None)
        report("first: built-in priors (empty timing book)", first)
        second = one_run(args.method, args.data, work / "learned", work / "first" / "timings.json")
        report("learned: the timing book the first run left", second)
        return 0

    try:
        data = [_stamp.demo_fingerprint()] if args.data == "demo" else [_stamp.dataset_fingerprint(args.data)]
        return _stamp.run_stamped(body, args.out, data)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
