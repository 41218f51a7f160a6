"""How long the app waits for an explanation (region map + word importance) of one pair, against the query
itself: ``Explainer.explain`` per new pair, per cached pair, and the Retriever's ``query_image`` for the
same images given as files (the baseline: what the Query panel waits for when an image is dropped on it, a
backbone pass and a search), all in this process.

    .venv/bin/python bench/explain_latency.py RUN [--pairs 20] [--text "a dog runs on the grass"]

RUN is a run folder (``crossview train cca --run-dir RUN`` on the demo or the Flickr8k sample). Prints the
medians and the ratios; the first call (loading the backbone) is reported apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--text", default="a dog runs on the grass")
    args = ap.parse_args(argv)

    from crossview.engine.session import open_run
    from crossview.explain import Explainer

    run = open_run(args.run)
    retriever = run.retriever()
    images = [int(i) for i in retriever.gallery_images[: args.pairs + 1]]
    ex = Explainer(run)
    t = time.perf_counter()
    ex.explain(images[0], args.text)
    first = time.perf_counter() - t
    new, cached, query = [], [], []
    for i in images[1:]:
        t = time.perf_counter()
        ex.explain(i, args.text)
        new.append(time.perf_counter() - t)
        t = time.perf_counter()
        ex.explain(i, args.text)
        cached.append(time.perf_counter() - t)
        t = time.perf_counter()
        retriever.query_image(run.dataset.image_paths[i], k=10)
        query.append(time.perf_counter() - t)
    m_new, m_cached, m_query = (statistics.median(x) for x in (new, cached, query))
    e = ex.explain(images[1], args.text)
    print(f"run {run.name} ({run.method.name} on {run.dataset.name}), {len(new)} pairs, region map "
          f"{e.region.mode if e.region else 'none'}, words {e.words.mode}")
    print(f"first explanation (loads the backbone): {first:.2f} s")
    print(f"explain a new pair:    median {m_new * 1000:8.1f} ms")
    print(f"explain a cached pair: median {m_cached * 1000:8.3f} ms")
    print(f"baseline query_image:  median {m_query * 1000:8.1f} ms (the image as a file, top 10)")
    print(f"ratio new / baseline {m_new / m_query:.1f}x; cached / baseline {m_cached / m_query:.4f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
