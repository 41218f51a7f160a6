"""WSABIE (caption version) training speed: the vectorised WARP sampler against the paper's per-example loop.

Setting: the BITR paper's Figure 3 WSABIE runs, ``--pairs`` (100K) image-caption pairs of ``--dim``
(150)-d synthetic features, 5 captions per image, up to 20 passes (the paper stops WSABIE after 20).
The captions are noisy linear maps of their images, noisy enough that held-out R@10 stays well below
100 % (as on real data; on trivially separable data every positive needs a scan of all negatives).

Baseline, measured in the same run: **sequential** = Algorithm 2 of paper 001 as written, one positive
at a time, negatives drawn one at a time until one violates, one SGD step and projection per positive
(torch on the CPU, the same maths as ours). A whole pass of it would take over an hour, so it runs
``--baseline-examples`` positives from our exact model's state after pass 1 and after its last pass
(N grows as the model improves) and its time per positive is scaled to a pass; it is compared with our
pass at the same stage.

Ours: ``crossview.methods.wsabie.Wsabie`` (minibatches of ``--batch-size`` positives, K negatives
drawn per positive at once, rows without a violator finished exactly from their full score row), for
each ``--max-draws`` variant: 0 = exact (the paper's distribution of N), 100 = N capped at 100 (a row
with no violator within 100 draws takes no step). Held-out R@10 shows the speed is not bought with quality.

    python bench/wsabie_train.py                                  # 100K pairs, 150-d, 20 passes
    python bench/wsabie_train.py --epochs 3 --baseline-examples 300
    python bench/wsabie_train.py --device cuda

Writes bench/results/wsabie_train_<cpu|cuda>.txt (``--out``, by ``--device``), stamped with the command, commit,
machine and data.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _stamp  # noqa: E402  (bench/_stamp.py)
from crossview.core.events import Loss  # noqa: E402
from crossview.methods import create_method  # noqa: E402
from crossview.data.method_data import MethodData  # noqa: E402
from crossview.nn.warp import harmonic_table, max_norm_columns_  # noqa: E402


def make_data(n_pairs: int, dim: int, caps: int, seed: int, name: str, noise: float = 4.0) -> MethodData:
    """Captions are noisy linear images of their image's features (a fixed map), 5 per image; the noise
    keeps the task from being trivially separable (held-out R@10 well below 100 %, as on real data)."""
    rng = np.random.default_rng(seed)
    A = np.random.default_rng(12345).standard_normal((dim, dim)).astype(np.float32) / math.sqrt(dim)
    n_img = n_pairs // caps
    x = rng.standard_normal((n_img, dim), dtype=np.float32)
    ci = np.repeat(np.arange(n_img), caps)
    y = x[ci] @ A + noise * rng.standard_normal((len(ci), dim), dtype=np.float32)
    return MethodData(image_features=x, text_features=y.astype(np.float32), captions=[""] * len(ci),
                      caption_image=ci, name=name)


@torch.no_grad()
def sequential_warp(V: torch.Tensor, Z: torch.Tensor, X: torch.Tensor, Y: torch.Tensor, ci: np.ndarray,
                    order: np.ndarray, lr: float, max_norm: float, margin: float,
                    rng: np.random.Generator) -> tuple[int, int]:
    """Paper 001, Algorithm 2, one positive at a time (negatives from other images' captions).
    Returns (steps taken, total draws)."""
    n_cap = Y.shape[0]
    per_image = np.bincount(ci)
    table = harmonic_table(n_cap, dtype=V.dtype)
    steps = draws = 0
    for c in order:
        i = int(ci[c])
        x, y = X[i], Y[c]
        u = V @ x
        f_pos = float(Z.T.matmul(u).dot(y))
        n_neg = n_cap - int(per_image[i])
        n = 0
        viol = -1
        while n < n_neg:
            j = int(rng.integers(n_cap))
            if ci[j] == i:
                continue                      # a caption of the same image is not a negative
            n += 1
            if float((Z @ Y[j]).dot(u)) > f_pos - margin:
                viol = j
                break
        draws += n
        if viol < 0:
            continue
        w = float(table[n_neg // n])
        dy = Y[viol] - y
        V.sub_(lr * w * torch.outer(Z @ dy, x))
        Z.sub_(lr * w * torch.outer(u, dy))
        max_norm_columns_(V, max_norm)
        max_norm_columns_(Z, max_norm)
        steps += 1
    return steps, draws


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=150, help="image and caption feature dimension")
    ap.add_argument("--embed-dim", type=int, default=100, help="WSABIE's P")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--max-draws", type=lambda t: [int(v) for v in t.split(",")], default=[0, 100],
                    help="variants of ours: comma-separated caps on N (0 = exact, as in the paper)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--baseline-examples", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (on a shared 2-core machine, 2 threads contend badly)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="where ours runs (the sequential baseline runs on the CPU)")
    ap.add_argument("--out", metavar="FILE",
                    help="write the results here, stamped with the command, commit, machine and data (default "
                         "bench/results/wsabie_train_<cpu|cuda>.txt by --device; '-' prints only)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    out = args.out or os.path.join(_stamp.RESULTS, f"wsabie_train_{kind}.txt")
    data = [_stamp.synthetic(what="train", seed=args.seed, pairs=args.pairs, dim=args.dim, captions_per_image=5,
                             map_seed=12345, noise=4.0),
            _stamp.synthetic(what="held out", seed=args.seed + 1, pairs=5000, dim=args.dim, captions_per_image=5)]
    return _stamp.run_stamped(lambda: run(args), out, data)


def run(args: argparse.Namespace) -> None:
    """The measurement proper: ours per pass, then the sequential baseline at the same stages."""
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} threads")
    train = make_data(args.pairs, args.dim, 5, args.seed, "train")
    test = make_data(5000, args.dim, 5, args.seed + 1, "test")
    runs = []            # (max_draws, seconds per pass, total seconds, passes, held-out metrics)
    state_after_one = None
    for cap in args.max_draws:
        # the paper's algorithm: one ranking direction, a constant learning rate, lambda 10
        m = create_method("wsabie", dim=args.embed_dim, batch_size=args.batch_size, max_epochs=args.epochs,
                          patience=0, max_draws=cap, directions="i2t",
                          lr_decay_epoch=0, max_norm=10.0).with_run(device=args.device, seed=args.seed)
        print(f"ours, max_draws={cap} ({'exact: up to every negative' if cap == 0 else 'capped'}):", flush=True)
        pass_times: list[float] = []
        t0 = last = time.perf_counter()
        for ev in m.fit_iter(train):
            if isinstance(ev, Loss) and "epoch_loss" in ev.terms:      # the end of a pass
                now = time.perf_counter()
                pass_times.append(now - last)
                last = now
                print(f"  pass {m.epoch_}: {pass_times[-1]:.2f} s, loss {ev.terms['epoch_loss']:.3f}, "
                      f"mean N {ev.terms['draws']:.1f}", flush=True)
                if state_after_one is None:
                    state_after_one = (m.state_dict(), m)
        if not runs:
            exact_times, final_state = list(pass_times), m.state_dict()
        runs.append((cap, float(np.median(pass_times)), time.perf_counter() - t0, len(pass_times),
                     m.evaluate(test), args.device))

    # The sequential baseline continues from the first variant's model after pass 1 and after its last
    # pass, and is compared with that variant's next / last pass (N grows as the model improves).
    assert state_after_one is not None
    m = state_after_one[1]
    X = torch.from_numpy(train.image_features / np.linalg.norm(train.image_features, axis=1, keepdims=True))
    Y = torch.from_numpy(train.text_features / np.linalg.norm(train.text_features, axis=1, keepdims=True))
    rng = np.random.default_rng(args.seed)
    seq = []
    for label, state, ours_time in (("after pass 1", state_after_one[0], exact_times[min(1, len(exact_times) - 1)]),
                                    (f"after pass {len(exact_times)}", final_state, exact_times[-1])):
        V = torch.from_numpy(np.array(state["state"]["model_state_"]["V"]))   # CPU numpy arrays
        Z = torch.from_numpy(np.array(state["state"]["model_state_"]["Z"]))
        order = rng.permutation(train.n_captions)[:args.baseline_examples]
        t = time.perf_counter()
        steps, draws = sequential_warp(V, Z, X, Y, train.caption_image, order, m.lr, m.max_norm, m.margin, rng)
        per_example = (time.perf_counter() - t) / len(order)
        seq.append((label, per_example * train.n_captions, per_example, draws / len(order), steps, len(order),
                    ours_time))

    print(f"pairs {train.n_captions}, {train.n_images} images, features {args.dim}-d, P = {args.embed_dim}, "
          f"batch {args.batch_size}")
    for label, seq_pass, per_example, mean_n, steps, n_ex, ours_time in seq:
        print(f"sequential (paper alg, cpu) {label}: {seq_pass:9.2f} s per pass, extrapolated from {n_ex} "
              f"positives ({per_example * 1e3:.2f} ms each, mean N = {mean_n:.1f}, {steps} steps); "
              f"ours exact, the same stage: {ours_time:.2f} s per pass = {seq_pass / ours_time:.0f}x faster")
    seq_pass = float(np.mean([x[1] for x in seq]))
    for cap, per_pass, total, passes, res, dev in runs:
        print(f"ours max_draws={cap:<6} ({dev}): {per_pass:9.2f} s per pass (median of {passes}), {total:.1f} s "
              f"in all; {seq_pass / per_pass:.0f}x the sequential's mean; held-out i2t R@10 "
              f"{res['i2t']['R@10']:.1f}, t2i R@10 {res['t2i']['R@10']:.1f}")
    print(f"(chance R@10 on the 5,000 held-out pairs: t2i {100 * 10 / test.n_images:.1f} %, "
          f"i2t about {100 * 10 * 5 / test.n_captions:.1f} %)")

if __name__ == "__main__":
    raise SystemExit(main())
