"""One query against a 10^7 x 100 float32 gallery: exact and approximate top-50 on the CPU.

Baselines, measured in the same run:
- bare product: ``gallery @ q`` in numpy, nothing else -- the memory-bandwidth floor;
- naive: ``np.argsort(-(gallery @ q))[:k]``, score everything and sort everything.

Candidates: ``ExactIndex`` float32 (exact); reduced precision: ``FaissIndex(kind="pq4")`` (4-bit
product-quantization fast-scan, exact re-scoring of 16k candidates), ``FaissIndex(kind="sq8")``
(int8 codes), ``ExactIndex(dtype="float16")`` and ``FaissIndex(kind="sqfp16")``; and FAISS IVF
with nprobe tuned on separate queries.
Times are the best of ``--repeats`` runs, interleaved across methods so that drifts in the
machine's speed hit all of them alike, with a short pause before each call so that one
library's idle-spinning threads do not slow the next.

The gallery is a seeded mixture of ``--clusters`` Gaussian clusters on the unit sphere (on uniform
random data IVF recall is poor and meaningless); queries are fresh draws from the same mixture.

    python bench/topk_scale.py              # full size, about 4 GB of gallery
    python bench/topk_scale.py --n 1000000 --out -   # quick run, printed only

Writes bench/results/topk_scale.txt (``--gpu-only``: topk_scale_gpu.txt; ``--out``), stamped with the command,
commit, machine and data.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _stamp  # noqa: E402  (bench/_stamp.py)
from crossview.index import ExactIndex, FaissIndex  # noqa: E402


def make_data(n: int, d: int, n_clusters: int, noise: float, n_queries: int,
              seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``gallery (n, d) float32`` and ``queries (n_queries, d) float32``, unit norm, built in chunks."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, d), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    gallery = np.empty((n, d), dtype=np.float32)
    step = 1 << 20
    for a in range(0, n, step):
        b = min(n, a + step)
        x = centres[rng.integers(0, n_clusters, b - a)]
        x += noise * rng.standard_normal((b - a, d), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        gallery[a:b] = x
    q = centres[rng.integers(0, n_clusters, n_queries)]
    q = q + noise * rng.standard_normal((n_queries, d), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return gallery, q.astype(np.float32)


def best_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best wall time of each function over ``repeats`` rounds, the functions interleaved."""
    for fn in fns.values():          # warm-up: first-touch, thread pools, imports
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            # let the previous library's spinning worker threads (OpenBLAS, torch's and FAISS's
            # OpenMP) go idle: on 2 cores they otherwise steal the next method's CPU time
            time.sleep(0.2)
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |found ∩ truth| / k; ``found``/``truth`` ``(m, k)``."""
    return float(np.mean([len(set(f.tolist()) & set(t.tolist())) / t.size
                          for f, t in zip(found, truth)]))


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.2f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="gallery size")
    ap.add_argument("--d", type=int, default=100, help="dimension")
    ap.add_argument("--k", type=int, default=50, help="top-k")
    ap.add_argument("--clusters", type=int, default=10_000, help="mixture components")
    ap.add_argument("--noise", type=float, default=0.1, help="per-dimension noise std around a centre")
    ap.add_argument("--nlist", type=int, default=2048, help="IVF lists (4*sqrt(n) makes the 10^7 build "
                    "several minutes on 2 cores)")
    ap.add_argument("--train", type=int, default=200_000, help="IVF k-means training sample")
    ap.add_argument("--eval-queries", type=int, default=50, help="queries for recall")
    ap.add_argument("--ivf-target", type=float, default=0.97,
                    help="pick the smallest nprobe reaching this recall on separate tuning queries")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu",
                    help="also time the exact index on this torch device (e.g. cuda), against a bare "
                         "torch product on the same device-resident gallery")
    ap.add_argument("--gpu-only", action="store_true",
                    help="only the exact float32 ground truth and the --device section (no FAISS needed)")
    ap.add_argument("--out", metavar="FILE",
                    help="write the results here, stamped with the command, commit, machine and data (default "
                         "bench/results/topk_scale.txt, with --gpu-only topk_scale_gpu.txt; '-' prints only)")
    args = ap.parse_args(argv)
    out = args.out or os.path.join(_stamp.RESULTS, "topk_scale_gpu.txt" if args.gpu_only else "topk_scale.txt")
    n_q = 1 + args.eval_queries if args.gpu_only else 1 + 2 * args.eval_queries
    data = [_stamp.synthetic(seed=args.seed, n=args.n, d=args.d, clusters=args.clusters, noise=args.noise,
                             queries=n_q)]
    return _stamp.run_stamped(lambda: run(args), out, data)


def run(args: argparse.Namespace) -> None:
    """The measurement proper: prints the timings, recalls and goals."""
    k = args.k

    import torch

    if args.gpu_only:
        gallery, queries = make_data(args.n, args.d, args.clusters, args.noise, 1 + args.eval_queries, args.seed)
        print(f"gallery: {args.n:,} x {args.d} float32 ({gallery.nbytes / 2**30:.2f} GiB); torch {torch.__version__}, "
              f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}")
        truth = ExactIndex(gallery).search(queries, k).indices
        gpu_section(gallery, queries[0], queries, truth, k, args.device, args.repeats)
        return

    import faiss

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; numpy "
          f"{np.__version__}, torch {torch.__version__}, faiss {faiss.__version__}; "
          f"torch threads {torch.get_num_threads()}, faiss threads {faiss.omp_get_max_threads()}")
    t = time.perf_counter()
    n_q = 1 + 2 * args.eval_queries
    gallery, queries = make_data(args.n, args.d, args.clusters, args.noise, n_q, args.seed)
    q1 = queries[0]                                     # the timed query
    q_eval = queries[: 1 + args.eval_queries]           # recall (includes the timed query)
    q_tune = queries[1 + args.eval_queries:]            # IVF nprobe choice only
    print(f"gallery: {args.n:,} x {args.d} float32 ({gallery.nbytes / 2**30:.2f} GiB), a mixture of "
          f"{args.clusters:,} clusters (unit centres + N(0, {args.noise}^2) per dimension, rows "
          f"normalised), seed {args.seed}; built in {time.perf_counter() - t:.1f} s")
    print(f"queries: 1 timed query; recall@{k} over {len(q_eval)} queries against exact float32 "
          f"search; times: best of {args.repeats}\n")

    exact = ExactIndex(gallery)
    t = time.perf_counter()
    truth = exact.search(q_eval, k).indices
    t_truth = time.perf_counter() - t
    truth_tune = exact.search(q_tune, k).indices

    # naive baseline must agree with the exact index (same scores; ties are measure-zero here)
    naive_top = np.argsort(-(gallery @ q1))[:k]
    exact_top = exact.search(q1, k).indices[0]
    assert set(naive_top.tolist()) == set(exact_top.tolist()), "exact index disagrees with numpy"

    # reduced precision: 4-bit PQ fast-scan and 8-bit scalar quantizer (timed against float32)
    builds: dict[str, float] = {}
    recalls: dict[str, float] = {}
    reduced: dict[str, object] = {}
    for name, kw in (("pq4", {"kind": "pq4"}), ("sq8", {"kind": "sq8"})):
        t = time.perf_counter()
        reduced[name] = FaissIndex(gallery, train_size=args.train, seed=args.seed, **kw)
        builds[name] = time.perf_counter() - t
        recalls[name] = recall_at(reduced[name].search(q_eval, k).indices, truth)
    pq4, sq8 = reduced["pq4"], reduced["sq8"]
    times = best_times({
        "bare": lambda: gallery @ q1,
        "naive": lambda: np.argsort(-(gallery @ q1))[:k],
        "exact32": lambda: exact.search(q1, k),
        "pq4": lambda: pq4.search(q1, k),
        "sq8": lambda: sq8.search(q1, k),
    }, args.repeats)
    del pq4, sq8, reduced
    gc.collect()

    # float16 options (2 GB each at full size), measured after the others are freed
    t = time.perf_counter()
    half = ExactIndex(gallery, dtype="float16")
    builds["half"] = time.perf_counter() - t
    recalls["half"] = recall_at(half.search(q_eval, k).indices, truth)
    t = time.perf_counter()
    sqfp16 = FaissIndex(gallery, kind="sqfp16")
    builds["sqfp16"] = time.perf_counter() - t
    recalls["sqfp16"] = recall_at(sqfp16.search(q_eval, k).indices, truth)
    times.update(best_times({"exact32_again": lambda: exact.search(q1, k),
                             "half": lambda: half.search(q1, k),
                             "sqfp16": lambda: sqfp16.search(q1, k)}, args.repeats))
    del half, sqfp16
    gc.collect()

    # IVF (build excluded from the query time)
    t = time.perf_counter()
    ivf = FaissIndex(gallery, kind="ivf", nlist=args.nlist, train_size=args.train, seed=args.seed)
    t_ivf_build = time.perf_counter() - t
    sweep = []
    chosen = None
    for nprobe in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        if nprobe > ivf.nlist:
            break
        ivf.nprobe = nprobe
        r_tune = recall_at(ivf.search(q_tune, k).indices, truth_tune)
        sweep.append((nprobe, r_tune))
        if r_tune >= args.ivf_target:
            chosen = nprobe
            break
    ivf.nprobe = chosen or sweep[-1][0]
    ivf_recall = recall_at(ivf.search(q_eval, k).indices, truth)
    times.update(best_times({"ivf": lambda: ivf.search(q1, k)}, args.repeats))
    per_query = []
    for q in q_eval:                     # distinct queries: lists mostly not in cache
        t = time.perf_counter()
        ivf.search(q, k)
        per_query.append(time.perf_counter() - t)

    bare, naive, ex32 = times["bare"], times["naive"], times["exact32"]
    # the float16 options were timed in a second round: compare them with float32 from that round
    ex32_b = times["exact32_again"]
    labels = {
        "pq4": "FaissIndex pq4 (4-bit PQ fast-scan, rerank 16k)",
        "sq8": "FaissIndex sq8 (int8 codes, rerank 4k)",
        "half": "ExactIndex float16 storage",
        "sqfp16": "FaissIndex sqfp16 (float16 codes, rerank 4k)",
    }
    print(f"{'bare numpy product  gallery @ q':50s}{ms(bare)}   memory-bandwidth floor "
          f"({gallery.nbytes / bare / 1e9:.1f} GB/s)")
    print(f"{'naive: numpy product + full np.argsort':50s}{ms(naive)}")
    print(f"{'ExactIndex float32, top-' + str(k):50s}{ms(ex32)}   exact")
    for name in ("pq4", "sq8"):
        print(f"{labels[name]:50s}{ms(times[name])}   recall@{k} {recalls[name]:.3f}   "
              f"build {builds[name]:.1f} s")
    print(f"{'ExactIndex float32 (second round)':50s}{ms(ex32_b)}")
    for name in ("half", "sqfp16"):
        print(f"{labels[name]:50s}{ms(times[name])}   recall@{k} {recalls[name]:.3f}   "
              f"build {builds[name]:.1f} s")
    print(f"{'FaissIndex IVF nlist=' + str(ivf.nlist) + ' nprobe=' + str(ivf.nprobe):50s}"
          f"{ms(times['ivf'])}   recall@{k} {ivf_recall:.3f}   build {t_ivf_build:.1f} s "
          f"(k-means on {min(args.train, args.n):,}; excluded)")
    print(f"{'  IVF, median over ' + str(len(per_query)) + ' distinct queries':50s}"
          f"{ms(float(np.median(per_query)))}")
    print(f"  IVF nprobe sweep on {len(q_tune)} separate tuning queries (recall@{k}): "
          + ", ".join(f"{p}: {r:.3f}" for p, r in sweep))
    print(f"  (exact batch search of {len(q_eval)} queries for the ground truth: {t_truth:.2f} s)\n")

    if args.device != "cpu":
        gpu_section(gallery, q1, q_eval, truth, k, args.device, args.repeats)

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    ratio_exact = ex32 / bare
    print("ratios and goals")
    print(f"  exact float32 / bare product          {ratio_exact:6.3f}   goal <= 1.15        "
          f"{verdict(ratio_exact <= 1.15)}")
    print(f"  naive / exact float32                 {naive / ex32:6.2f}x  (speed-up over the naive baseline)")
    for name, base in (("pq4", ex32), ("sq8", ex32), ("half", ex32_b), ("sqfp16", ex32_b)):
        r = times[name] / base
        print(f"  {name + ' / exact float32':38s}{r:6.3f}   goal < 0.5 at recall@{k} >= 0.99   "
              f"{verdict(r < 0.5 and recalls[name] >= 0.99)}")
    ok_ivf = times["ivf"] < 0.020 and ivf_recall >= 0.95
    print(f"  IVF {times['ivf'] * 1e3:.2f} ms at recall@{k} {ivf_recall:.3f}          goal < 20 ms at >= 0.95   "
          f"{verdict(ok_ivf)}")


def gpu_section(gallery: np.ndarray, q1: np.ndarray, q_eval: np.ndarray, truth: np.ndarray, k: int,
                device: str, repeats: int) -> None:
    """Exact top-k on a GPU: ours vs a bare ``torch.mv`` over the same resident gallery."""
    import torch

    for dtype in ("float32", "float16"):
        idx = ExactIndex(gallery, device=device, dtype=dtype)
        found = idx.search(q_eval, k).indices          # also uploads the gallery once
        rec = recall_at(found, truth)
        g = torch.from_numpy(gallery).to(device=device, dtype=getattr(torch, dtype))
        qt = torch.from_numpy(q1).to(device=device, dtype=g.dtype)

        def bare() -> None:
            torch.mv(g, qt)
            torch.cuda.synchronize()

        def naive() -> None:
            torch.argsort(torch.mv(g, qt), descending=True)[:k].cpu()

        def ours() -> None:
            idx.search(q1, k)

        t = best_times({"bare": bare, "naive": naive, "ours": ours}, max(repeats, 5))
        print(f"GPU {device} {dtype}: bare torch.mv {ms(t['bare'])}, naive full argsort {ms(t['naive'])}, "
              f"ExactIndex top-{k} {ms(t['ours'])} (incl. copy of results to host), recall@{k} {rec:.3f}; "
              f"ours / bare {t['ours'] / t['bare']:.2f}, naive / ours {t['naive'] / t['ours']:.2f}x")
        del idx, g
        torch.cuda.empty_cache()
    print()


if __name__ == "__main__":
    raise SystemExit(main())
