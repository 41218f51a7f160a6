"""How long the app waits for an explanation (region map + word importance) of one pair, against the query
itself: ``Explainer.explain`` per new pair, per cached pair, and the Retriever's ``query_image`` for the
same images given as files (the baseline: what the Query panel waits for when an image is dropped on it, a
backbone pass and a search), all in this process.

    .venv/bin/python bench/explain_latency.py RUN [RUN ...] [--pairs 20] [--text "a dog runs on the grass"]

Each RUN is a run folder (``crossview train cca --run-dir RUN`` on the demo or the Flickr8k sample). Prints the
medians and the ratios per run; the first call (loading the backbone) is reported apart. The sentence explained
is ``--text``, by default one that fits the run's data (the demo's shapes, else a Flickr caption). Writes
bench/results/explain_latency_cpu.txt (``--out``), stamped with the command, commit, machine and data
(``bench/regenerate.py --only explain_latency_cpu`` trains the two runs it holds first).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)


DEFAULT_TEXT = {"demo": "a red circle above a blue square"}
FLICKR_TEXT = "a dog runs on the grass"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run folders")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--text", help=f"the sentence explained (default: {DEFAULT_TEXT['demo']!r} for a run on the "
                                   f"demo, else {FLICKR_TEXT!r})")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "explain_latency_cpu.txt")
    args = ap.parse_args(argv)

    def body() -> int:
        for k, run_dir in enumerate(args.runs):
            if k:
                print()
            rc = run(run_dir, args.pairs, args.text)
            if rc:
                return rc
        return 0

    return _stamp.run_stamped(body, args.out, lambda: [d for r in args.runs for d in run_data(r)])


def run_data(run_dir: str) -> list[str]:
    """``data:`` lines of a run folder: the dataset it was trained on and its checkpoint."""
    from crossview.engine.run import CHECKPOINT, read_config

    config = read_config(Path(run_dir))
    lines = [_stamp.dataset_fingerprint(config["data"])] if config.get("data") else []
    return lines + [_stamp.file_fingerprint(Path(run_dir) / CHECKPOINT, "run checkpoint")]


def run(run_dir: str, pairs: int, text: str | None) -> int:
    """The measurement on one run folder: prints the medians and ratios."""
    from crossview.engine.session import open_run
    from crossview.explain import Explainer

    run = open_run(run_dir)
    text = text or DEFAULT_TEXT.get(run.dataset.name, FLICKR_TEXT)
    retriever = run.retriever()
    images = [int(i) for i in retriever.gallery_images[: pairs + 1]]
    ex = Explainer(run)
    t = time.perf_counter()
    ex.explain(images[0], text)
    first = time.perf_counter() - t
    new, cached, query = [], [], []
    for i in images[1:]:
        t = time.perf_counter()
        ex.explain(i, text)
        new.append(time.perf_counter() - t)
        t = time.perf_counter()
        ex.explain(i, text)
        cached.append(time.perf_counter() - t)
        t = time.perf_counter()
        retriever.query_image(run.dataset.image_paths[i], k=10)
        query.append(time.perf_counter() - t)
    m_new, m_cached, m_query = (statistics.median(x) for x in (new, cached, query))
    e = ex.explain(images[1], text)
    print(f"run {run.name} ({run.method.name} on {run.dataset.name}), {len(new)} pairs, text {text!r}, region map "
          f"{e.region.mode if e.region else 'none'}, words {e.words.mode}")
    print(f"first explanation (loads the backbone): {first:.2f} s")
    print(f"explain a new pair:    median {m_new * 1000:8.1f} ms")
    print(f"explain a cached pair: median {m_cached * 1000:8.3f} ms")
    print(f"baseline query_image:  median {m_query * 1000:8.1f} ms (the image as a file, top 10)")
    print(f"ratio new / baseline {m_new / m_query:.1f}x; cached / baseline {m_cached / m_query:.4f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
