"""The BITR paper's large-collection retrieval (Experiment 2: every Pascal / IAPR query against all one million SBU
captions) as ``crossview experiment bitr-table --index``: the top-5 retrieval step timed on a million-row
collection, dense score matrix (the baseline, as the experiment does without ``--index``) against the index
backends, in the same run.

The collection: ``--n`` caption embeddings of ``--dim`` dimensions (the modern representation's CCA space is
128-d), a seeded mixture of Gaussian clusters on the unit sphere (as bench/topk_scale.py; on uniform random data
approximate indexes are meaningless); the queries: ``--queries`` fresh draws (Pascal's 1,000 images). Every
backend's top-5 is checked against the exact one (recall@5). The BLEU / ROUGE scoring of the retrieved captions
that follows is not included (it costs the same whatever finds them: ~0.3 ms a sentence pair here).

    python bench/large_collection.py                 # 1,000,000 x 128, 1,000 queries
    python bench/large_collection.py --n 200000 --out -   # quick, printed only

Writes bench/results/large_collection_cpu.txt (``--out``), stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)


def mixture(n: int, dim: int, clusters: int, rng: np.random.Generator) -> np.ndarray:
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    x = centres[rng.integers(0, clusters, n)] + 0.1 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--clusters", type=int, default=2000)
    ap.add_argument("--backends", default="exact,exact-fp16,faiss-flat,faiss-sq8,faiss-ivf")
    _stamp.add_out_argument(ap, REPO / "bench" / "results" / "large_collection_cpu.txt")
    args = ap.parse_args(argv)
    data = [_stamp.synthetic(seed=0, n=args.n, dim=args.dim, clusters=args.clusters, queries=args.queries,
                             noise=0.1)]
    return _stamp.run_stamped(lambda: run(args), args.out, data)


def run(args: argparse.Namespace) -> int:
    """The measurement proper: prints one line per backend."""
    from crossview.eval.metrics import top_k
    from crossview.index import build_index

    rng = np.random.default_rng(0)
    gallery = mixture(args.n, args.dim, args.clusters, rng)
    queries = mixture(args.queries, args.dim, args.clusters, rng)
    print(f"machine: {platform.machine()}, numpy {np.__version__}; collection {args.n:,} x {args.dim} float32 "
          f"({gallery.nbytes / 2**30:.2f} GiB), {args.queries:,} queries, top-{args.k}")
    t0 = time.perf_counter()
    scores = queries @ gallery.T
    truth = top_k(scores, args.k)
    dense = time.perf_counter() - t0
    print(f"{'dense score matrix + top_k (baseline)':44s} {dense:8.2f} s   score matrix {scores.nbytes / 2**30:.2f} GiB")
    del scores
    for backend in [b for b in args.backends.split(",") if b]:
        t0 = time.perf_counter()
        index = build_index(gallery, backend)
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        found = index.search(queries, args.k).indices
        search = time.perf_counter() - t0
        recall = np.mean([len(set(a) & set(b)) / args.k for a, b in zip(found.tolist(), truth.tolist())])
        print(f"{'index ' + backend:44s} {search:8.2f} s   {dense / search:5.1f}x the baseline   recall@{args.k} "
              f"{recall:.3f}   build {built:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
