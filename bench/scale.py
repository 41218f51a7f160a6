"""Wall time and peak memory of CrossView's commands on synthetic VSE++ ``*_precomp`` folders of three sizes.

Sizes (images; 5 captions an image; 2048-d float32 image features; splits train / dev / test with dev and
test ``min(5000, n // 6)`` images each):

    S 3,000    M 30,000    L 120,000 (MS-COCO size)

Each folder is seeded (``--seed``) and made once under ``--work`` (reused while its ``made.txt`` matches). Images
fall in 64 latent topics: a feature row is a non-negative mix of its topic's centre and noise; its captions draw
8-14 words from a 500-word vocabulary, half of them from the topic's own words, so CCA has something to find.

Each step is its own ``python -m crossview ...`` subprocess, measured from the outside: ``/usr/bin/time -v``
(wall clock and maximum resident set size) where present, else ``resource.getrusage(RUSAGE_CHILDREN)`` around
one child at a time. Steps (``--steps``, in this order):

    info   crossview data info DIR
    cca    crossview train cca --data DIR --text-encoder tfidf            (fit on train, evaluate on test)
    bitr   crossview train bitr --data DIR --text-encoder tfidf
    query  crossview query CCA_RUN --text "one sentence"                  (needs the cca step's run)
    eval   crossview eval CCA_RUN                                         (re-evaluates the saved embeddings)

The feature cache (``CROSSVIEW_CACHE_DIR``) is one folder per size, emptied before the size's first step, so
the cca step pays the TF-IDF extraction and bitr reuses it (as a person training both would).

The table's ``ratio`` is peak RSS over the bytes of the run's feature matrices: the image features of all splits
(``n_images x 2048 x 4``) plus the captions' TF-IDF features as a dense float32 ``n_captions x 500`` matrix
(what the text encoder hands the methods); ``x img`` is peak RSS over the image features alone. The issue's goal
(#34) is ratio <= 2.5 for every step at L.

    .venv/bin/python bench/scale.py                       # S and M, all steps (a few minutes on 2 cores)
    .venv/bin/python bench/scale.py --sizes L --steps cca # one step at COCO size (about 1 GB of features)

Writes bench/results/scale_cpu.txt (``--out``), stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stamp  # noqa: E402  (bench/_stamp.py)

SIZES = {"S": 3_000, "M": 30_000, "L": 120_000}
STEPS = ("info", "cca", "bitr", "query", "eval")
DIM = 2048
VOCAB = 500
TOPICS = 64
CAPS_PER_IMAGE = 5
QUERY = "a small dog runs across the green field"
GEN_VERSION = 1
TIME_V = "/usr/bin/time"


def split_sizes(n: int) -> dict[str, int]:
    """Images per split: dev and test ``min(5000, n // 6)`` each, train the rest."""
    held = min(5000, n // 6)
    return {"train": n - 2 * held, "dev": held, "test": held}


def _words() -> list[str]:
    """``VOCAB`` distinct pronounceable words (deterministic)."""
    cons, vow = "bcdfghklmnprstvz", "aeiou"
    out = [c1 + v1 + c2 + v2 for c1 in cons for v1 in vow for c2 in cons for v2 in vow]
    return out[::len(out) // VOCAB][:VOCAB]


def make_split(folder: Path, prefix: str, n: int, rng: np.random.Generator, centres: np.ndarray,
               topic_words: np.ndarray, words: list[str]) -> None:
    """``{prefix}_ims.npy (n, DIM) float32`` and ``{prefix}_caps.txt`` (``CAPS_PER_IMAGE`` lines an image),
    written in blocks so that making L needs little memory."""
    topics = rng.integers(0, TOPICS, n)
    ims = np.lib.format.open_memmap(folder / f"{prefix}_ims.npy", mode="w+", dtype=np.float32, shape=(n, DIM))
    step = 8192
    for a in range(0, n, step):
        b = min(n, a + step)
        x = centres[topics[a:b]] + rng.standard_normal((b - a, DIM), dtype=np.float32)
        np.maximum(x, 0, out=x)          # non-negative, as post-ReLU CNN features are
        ims[a:b] = x
    ims.flush()
    del ims
    vocab = np.asarray(words)
    with open(folder / f"{prefix}_caps.txt", "w", encoding="utf-8") as fh:
        for a in range(0, n, step):
            b = min(n, a + step)
            lines = []
            for t in topics[a:b]:
                for _ in range(CAPS_PER_IMAGE):
                    k = int(rng.integers(8, 15))
                    own = topic_words[t][rng.integers(0, topic_words.shape[1], k // 2)]
                    other = rng.integers(0, VOCAB, k - k // 2)
                    idx = np.concatenate([own, other])
                    rng.shuffle(idx)
                    lines.append(" ".join(vocab[idx]))
            fh.write("\n".join(lines) + "\n")


def make_dataset(root: Path, size: str, seed: int) -> Path:
    """The ``*_precomp`` folder of ``size`` under ``root`` (made unless ``made.txt`` matches)."""
    n = SIZES[size]
    folder = root / f"scale_{size}_precomp"
    stamp = json.dumps({"version": GEN_VERSION, "n": n, "seed": seed, "dim": DIM, "vocab": VOCAB})
    if (folder / "made.txt").is_file() and (folder / "made.txt").read_text() == stamp:
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    centres = 2.0 * rng.random((TOPICS, DIM), dtype=np.float32) - 1.0
    topic_words = rng.integers(0, VOCAB, (TOPICS, 20))
    words = _words()
    t = time.perf_counter()
    for prefix, m in split_sizes(n).items():
        make_split(folder, prefix, m, rng, centres, topic_words, words)
    (folder / "made.txt").write_text(stamp)
    print(f"# made {folder} ({n} images) in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return folder


def feature_bytes(n: int) -> tuple[int, int]:
    """``(image bytes, text bytes)``: ``n x DIM`` float32 and ``5n x VOCAB`` float32."""
    return n * DIM * 4, n * CAPS_PER_IMAGE * VOCAB * 4


def measure(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, int, int]:
    """Run ``cmd``; ``(wall seconds, peak RSS bytes, exit code)``; its output goes to ``log``."""
    use_time = os.access(TIME_V, os.X_OK)
    full = [TIME_V, "-v", *cmd] if use_time else cmd
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        r = subprocess.run(full, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t
    text = log.read_text(encoding="utf-8", errors="replace")
    if use_time:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
        peak = int(m.group(1)) * 1024 if m else -1
        m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
        if m:
            parts = [float(p) for p in m.group(1).split(":")]
            wall = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
        m = re.search(r"Command exited with non-zero status (\d+)", text)
        rc = int(m.group(1)) if m else r.returncode
    else:
        # ru_maxrss of the children is the largest child so far: exact only if this one is the largest, so
        # print it only when it grew (a smaller child's peak is unknown this way)
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        peak = after * 1024 if after > before else -1
        rc = r.returncode
    return wall, peak, rc


def step_command(step: str, folder: Path, runs: Path) -> list[str]:
    py = [sys.executable, "-m", "crossview"]
    if step == "info":
        return [*py, "data", "info", str(folder)]
    if step in ("cca", "bitr"):
        return [*py, "train", step, "--data", str(folder), "--text-encoder", "tfidf", "--device", "cpu",
                "--run-dir", str(runs / step)]
    if step == "query":
        return [*py, "query", str(runs / "cca"), "--text", QUERY, "--k", "5"]
    if step == "eval":
        return [*py, "eval", str(runs / "cca")]
    raise ValueError(step)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="S,M", help="comma-separated among S, M, L (default S,M)")
    ap.add_argument("--steps", default="info,cca,bitr,query,eval",
                    help=f"comma-separated among {', '.join(STEPS)} (default all, in that order)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default 0)")
    ap.add_argument("--work", default="/tmp/crossview-scale", metavar="DIR",
                    help="where the data sets, feature caches, runs and logs go (default /tmp/crossview-scale)")
    _stamp.add_out_argument(ap, _stamp.RESULTS / "scale_cpu.txt")
    args = ap.parse_args(argv)
    sizes = [s.strip().upper() for s in args.sizes.split(",") if s.strip()]
    steps = [s.strip().lower() for s in args.steps.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES] + [s for s in steps if s not in STEPS]
    if bad or not sizes or not steps:
        print(f"scale.py: unknown size or step {', '.join(bad) or '(none given)'}; sizes are "
              f"{', '.join(SIZES)} and steps {', '.join(STEPS)}", file=sys.stderr)
        return 2
    steps = [s for s in STEPS if s in steps]
    work = Path(args.work).absolute()
    data = [_stamp.synthetic(seed=args.seed, sizes="/".join(f"{s}={SIZES[s]}" for s in sizes), dim=DIM,
                             captions_per_image=CAPS_PER_IMAGE, vocab=VOCAB, topics=TOPICS,
                             format="VSE++ precomp")]

    def body() -> int:
        how = "/usr/bin/time -v" if os.access(TIME_V, os.X_OK) else "getrusage(RUSAGE_CHILDREN)"
        print(f"peak RSS by {how}; one subprocess a step; load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores at the start")
        print("ratio = peak RSS / (image features + dense float32 TF-IDF); x img = peak RSS / image features")
        print()
        print(f"{'size':<4} {'step':<6} {'wall s':>8} {'peak MB':>9} {'feat MB':>8} {'ratio':>6} {'x img':>6}  rc")
        failed = 0
        for size in sizes:
            folder = make_dataset(work, size, args.seed)
            n = SIZES[size]
            img_b, txt_b = feature_bytes(n)
            runs = work / f"runs_{size}"
            cache = work / f"cache_{size}"
            for d in (runs, cache):
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir(parents=True)
            env = {**os.environ, "CROSSVIEW_CACHE_DIR": str(cache), "CROSSVIEW_HOME": str(work / "home"),
                   "PYTHONPATH": os.pathsep.join([str(_stamp.REPO), os.environ.get("PYTHONPATH", "")]).rstrip(
                       os.pathsep)}
            for step in steps:
                log = work / f"{size}_{step}.log"
                wall, peak, rc = measure(step_command(step, folder, runs), env, log)
                failed += rc != 0
                peak_s = f"{peak / 1e6:9.0f}" if peak >= 0 else f"{'?':>9}"
                ratio = f"{peak / (img_b + txt_b):6.2f}" if peak >= 0 else f"{'?':>6}"
                ximg = f"{peak / img_b:6.2f}" if peak >= 0 else f"{'?':>6}"
                print(f"{size:<4} {step:<6} {wall:8.1f} {peak_s} {(img_b + txt_b) / 1e6:8.0f} {ratio} {ximg}  "
                      f"{rc}{'' if rc == 0 else '  (see ' + str(log) + ')'}", flush=True)
        if failed:
            print(f"\n{failed} step(s) failed: their logs are under {work}", file=sys.stderr)
        return 1 if failed else 0

    return _stamp.run_stamped(body, args.out, data)


if __name__ == "__main__":
    raise SystemExit(main())
