"""Opening Inspect on a COCO 5K-size evaluation (5,000 images, 25,000 captions): time to the first paint, memory,
and the latency of scrolling, sorting and filtering the per-query list (issue 34, item 4).

Each code (``--baseline REV``: the ``crossview`` package of commit REV, ``git archive``; then the current code) runs
in its own process, offscreen Qt, on the same synthetic run (ranks drawn with a seed, a dataset of 25,000 captions
without image files, so no thumbnails are decoded). Steps, each timed with ``time.perf_counter`` around the call
and the repaint of the list that follows it (``viewport().repaint()``: the paint happens inside the timing):

    open     set_run + set_dataset, t2i direction shown, the panel shown and its list painted (the first paint)
    scroll   the list's scroll bar moved 40 times from top to bottom, a repaint each: the worst and the median step
    sort     a click's worth of sorting: by rank ascending, then by query, each with its repaint
    filter   typing a filter that leaves 5 rows, then clearing it (the current code only: the baseline has none)

``MiB``: resident memory after ``open`` minus before it (``/proc/self/status`` VmRSS), which holds what the list
built. Run: ``QT_QPA_PLATFORM=offscreen python bench/inspect_latency.py --baseline 866e2b7``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if "--child" not in sys.argv:                # a child imports only the code it measures (_stamp imports crossview)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _stamp  # noqa: E402

N_IMAGES, PER = 5000, 5


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(work: Path, code: str) -> dict:
    """The measurements of the ``crossview`` package under ``code`` (run in a child process)."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    sys.path = [code] + [p for p in sys.path if p and Path(p).resolve() != REPO]
    import numpy as np
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    from crossview.data.dataset import PairedDataset
    from crossview.engine.results import load_run_results
    from crossview.gui.panels.inspect_panel import InspectPanel

    app = QApplication.instance() or QApplication([])
    rng = np.random.default_rng(0)
    run = work / "run"
    if not run.is_dir():
        run.mkdir(parents=True)
        m = {"R@1": 1.0, "R@5": 2.0, "R@10": 3.0, "MedR": 50.0, "MeanR": 60.0}
        (run / "summary.json").write_text(json.dumps({"method": "cca", "dataset": "coco-like", "split": "test",
                                                      "i2t": m, "t2i": m, "rsum": 12.0}))
        np.savez(run / "ranks.npz", i2t=rng.integers(1, 500, N_IMAGES),
                 t2i=rng.integers(1, N_IMAGES + 1, N_IMAGES * PER), image_ids=np.arange(N_IMAGES),
                 caption_ids=np.arange(N_IMAGES * PER))
    caps = [f"caption {j} of image {j // PER}" for j in range(N_IMAGES * PER)]
    ds = PairedDataset(name="coco-like", captions=caps, caption_image=np.repeat(np.arange(N_IMAGES), PER),
                       image_features=np.zeros((N_IMAGES, 2), np.float32), splits={"test": np.arange(N_IMAGES)})
    results = load_run_results(run)
    panel = InspectPanel()
    panel.resize(1280, 760)
    app.processEvents()
    out: dict = {}
    rss0 = _rss_mib()
    t0 = time.perf_counter()
    panel.direction_combo.setCurrentIndex(panel.direction_combo.findData("t2i"))
    panel.set_run(results)
    panel.set_dataset(ds)
    panel.show()
    app.processEvents()
    panel.queries.viewport().repaint()
    out["open_s"] = time.perf_counter() - t0
    out["open_mib"] = _rss_mib() - rss0
    rows = panel.queries.model().rowCount()
    out["rows"] = rows
    bar = panel.queries.verticalScrollBar()
    steps = []
    for i in range(1, 41):
        t = time.perf_counter()
        bar.setValue(int(bar.maximum() * i / 40))
        panel.queries.viewport().repaint()
        steps.append(time.perf_counter() - t)
    out["scroll_worst_ms"], out["scroll_median_ms"] = 1000 * max(steps), 1000 * statistics.median(steps)
    sorts = []
    for col, order in ((1, Qt.SortOrder.AscendingOrder), (0, Qt.SortOrder.AscendingOrder)):
        t = time.perf_counter()
        panel.queries.sortByColumn(col, order)
        panel.queries.viewport().repaint()
        sorts.append(time.perf_counter() - t)
    out["sort_worst_ms"] = 1000 * max(sorts)
    box = getattr(panel, "query_filter", None)
    if box is not None:
        t = time.perf_counter()
        box.setText("of image 4321")
        panel.queries.viewport().repaint()
        out["filter_ms"] = 1000 * (time.perf_counter() - t)
        out["filter_rows"] = panel.queries.model().rowCount()
        t = time.perf_counter()
        box.clear()
        panel.queries.viewport().repaint()
        out["unfilter_ms"] = 1000 * (time.perf_counter() - t)
    panel.close()
    import crossview
    out["code"] = str(Path(crossview.__file__).resolve().parent.parent)
    return out


def run(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="inspect_latency_"))
    codes = [("current", str(REPO))]
    if args.baseline:
        base = work / "baseline"
        base.mkdir()
        tar = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline, "crossview"], check=True,
                             capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=tar, check=True)
        codes.insert(0, (f"baseline {args.baseline}", str(base)))
    print(f"Inspect on {N_IMAGES:,} images / {N_IMAGES * PER:,} caption queries (the t2i list), offscreen Qt, "
          f"1280x760; the fastest of {args.repeat} processes per code")
    print()
    head = (f"{'code':<18} {'open s':>7} {'MiB':>6} {'scroll worst ms':>16} {'median':>7} {'sort worst ms':>14} "
            f"{'filter ms':>10} {'clear ms':>9}")
    print(head)
    print("-" * len(head))
    for label, path in codes:
        got = []
        for _ in range(args.repeat):
            env = {**os.environ, "PYTHONPATH": path, "QT_QPA_PLATFORM": "offscreen"}
            r = subprocess.run([sys.executable, __file__, "--child", str(work), "--code", path], env=env,
                               capture_output=True, text=True, cwd=work)
            if r.returncode != 0:
                print(f"{label}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
                break
            got.append(json.loads(r.stdout.strip().splitlines()[-1]))
        if not got:
            continue
        assert Path(got[0]["code"]) == Path(path).resolve(), (got[0]["code"], path)     # the code asked for
        best = {k: min(g[k] for g in got) for k in got[0] if k != "code"}
        f = (f"{best['filter_ms']:>10.1f} {best['unfilter_ms']:>9.1f}" if "filter_ms" in best
             else f"{'(none)':>10} {'':>9}")
        print(f"{label:<18} {best['open_s']:>7.2f} {best['open_mib']:>6.0f} {best['scroll_worst_ms']:>16.1f} "
              f"{best['scroll_median_ms']:>7.1f} {best['sort_worst_ms']:>14.1f} {f}")
    print()
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=None, metavar="REV", help="also measure this commit's code, first")
    ap.add_argument("--repeat", type=int, default=3, help="processes per code; the fastest is shown (default 3)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--code", default=None, help=argparse.SUPPRESS)
    if "--child" not in sys.argv:
        _stamp.add_out_argument(ap, _stamp.RESULTS / "inspect_latency_cpu.txt")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child), args.code)))
        return 0
    data = [_stamp.synthetic(seed=0, images=N_IMAGES, captions=N_IMAGES * PER, what="ranks of one run")]
    return _stamp.run_stamped(lambda: run(args), args.out, data)


if __name__ == "__main__":
    sys.exit(main())
