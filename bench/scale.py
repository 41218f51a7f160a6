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
    wsabie crossview train wsabie --data DIR --text-encoder tfidf --set max_epochs=1
    vsepp  crossview train vsepp --data DIR --set text_model=gru --set max_epochs=1   (the captions through
           its own GRU: no caption features)
    smoothap, webly, timam
           crossview train METHOD --data DIR --text-encoder tfidf --set max_epochs=1   (webly: Stage I only, no
           web set)
    query  crossview query CCA_RUN --text "one sentence"                  (needs the cca step's run)
    vquery crossview query VSEPP_RUN --text "one sentence"                (needs the vsepp step's run: the
           sentence through the run's GRU, the gallery's images through its image side)
    eval   crossview eval CCA_RUN                                         (re-evaluates the saved embeddings)
    wsabie3, vsepp3, timam3
           the wsabie / vsepp / timam step over 3 epochs of their first 60 batches each, through
           bench/_cut_epochs.py: a run's later epochs (the best epoch's weights kept beside the live model,
           checkpoints between epochs, every epoch's validation) at a size whose whole epochs take up to an hour

Every training step of a deep method (wsabie, vsepp, smoothap, webly, timam) runs one whole epoch and then the
run's evaluation on the test split (as ``crossview train`` does), unless ``--cap-seconds S`` (default 0: no cap)
stops it S seconds after its first batch with SIGTERM, as a scheduler would (the run cancels between two batches
and keeps its checkpoint): its peak RSS is then that of training so far (the features loaded, the model and its
optimiser, the batches done), not of the evaluation after the epoch. The table then says ``capped`` and how many
of the epoch's batches ran (from the run's metrics.jsonl). ``--cap-steps`` names the steps the cap applies to
(default all five).

The feature cache (``CROSSVIEW_CACHE_DIR``) is one folder per size, emptied before the size's first step, so
the cca step pays the TF-IDF extraction and bitr reuses it (as a person training both would).

The table's ``ratio`` is peak RSS over the bytes of the run's feature matrices (column ``denom``): the image
features of all splits (``n_images x 2048 x 4``) plus, for the TF-IDF runs (cca, bitr, wsabie, and query / eval
of the cca run), the captions' TF-IDF features as the text encoder now hands them to the methods, a float32 CSR
matrix (``img+csr``: 4-byte values and column indices per non-zero, a 4-byte row pointer per caption; the
non-zeros are the distinct words of each caption, counted from the caption files); the vsepp GRU run has no
caption features (``img``). ``x dense`` is peak RSS over the image features plus a dense float32 ``n_captions x
500`` TF-IDF matrix, the denominator of the first version of this table; ``x img`` is peak RSS over the image
features alone. The issue's goal (#34) is ratio <= 2.5 for every step at L.

    .venv/bin/python bench/scale.py                       # S and M, all steps (about 25 minutes on 2 cores)
    .venv/bin/python bench/scale.py --sizes L,S,M         # everything (about two hours on 2 cores)
    .venv/bin/python bench/scale.py --sizes L --steps cca # one step at COCO size (about 1 GB of features)

Writes bench/results/scale_cpu.txt (``--out``; ``--device cuda``: the training steps on the GPU, scale_gpu.txt),
stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stamp  # noqa: E402  (bench/_stamp.py)

SIZES = {"S": 3_000, "M": 30_000, "L": 120_000}
STEPS = ("info", "cca", "bitr", "wsabie", "vsepp", "smoothap", "webly", "timam", "query", "vquery", "eval",
         "wsabie3", "vsepp3", "timam3")
#: steps that train for an epoch (stopped at --cap-seconds when one is given)
CAPPED = ("wsabie", "vsepp", "smoothap", "webly", "timam")
#: steps that train MULTI_EPOCHS epochs of EPOCH_BATCHES batches each (bench/_cut_epochs.py): what a run holds
#: from its second epoch on (the best epoch's weights, checkpoints between epochs, each validation) at a size
#: whose whole epochs take up to an hour here
MULTI = {"wsabie3": "wsabie", "vsepp3": "vsepp", "timam3": "timam"}
MULTI_EPOCHS = 3
EPOCH_BATCHES = 60
#: steps whose run has no caption features (the vsepp run reads captions through its own GRU)
IMAGE_ONLY = ("vsepp", "vquery", "vsepp3")
#: where the training steps train (--device)
DEVICE = "cpu"
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
    """``(image bytes, dense text bytes)``: ``n x DIM`` float32 and ``5n x VOCAB`` float32."""
    return n * DIM * 4, n * CAPS_PER_IMAGE * VOCAB * 4


def csr_text_bytes(folder: Path) -> int:
    """Bytes of the captions' TF-IDF rows as a float32 CSR matrix with int32 indices: 8 bytes per non-zero (the
    distinct words of a caption) and 4 per row pointer."""
    nnz = rows = 0
    for caps in sorted(folder.glob("*_caps.txt")):
        with open(caps, encoding="utf-8") as fh:
            for line in fh:
                nnz += len(set(line.split()))
                rows += 1
    return 8 * nnz + 4 * (rows + 1)


def batches_done(run: Path) -> tuple[int, int] | None:
    """``(batches done, batches in the epoch)`` of the first epoch from the run's metrics.jsonl progress events,
    or None when it has none."""
    done = total = 0
    try:
        lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if (ev.get("event") == "progress" and ev.get("stage") == "fit" and ev.get("total")
                and str(ev.get("message", "")).startswith("epoch 1/")):
            done, total = max(done, int(ev.get("step") or 0)), int(ev["total"])
    return (done, total) if total else None


def _stop(proc: subprocess.Popen, use_time: bool) -> None:
    """SIGTERM to the command (under /usr/bin/time: to time's child, which time then reports on)."""
    pids = [proc.pid]
    if use_time:
        try:
            pids = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()] or pids
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass


def _rss(proc: subprocess.Popen, use_time: bool) -> int:
    """The command's resident set size in bytes now (under /usr/bin/time: its child's), 0 when unknown."""
    pid = proc.pid
    if use_time:
        try:
            pid = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def measure(cmd: list[str], env: dict[str, str], log: Path, cap: float | None = None,
            run: Path | None = None) -> tuple[float, int, int, bool, int]:
    """Run ``cmd``; ``(wall seconds, peak RSS bytes, exit code, capped, epoch RSS bytes)``; its output goes to
    ``log``. With ``run`` (a training step's run folder) the command's RSS is sampled every second while its first
    epoch is in progress (from the first batch its metrics.jsonl reports to the last): ``epoch RSS`` is the largest
    sample (0 when none), so the peak's phase can be told: training, or the load / evaluation around it. With
    ``cap`` the command gets SIGTERM once it has trained for that many seconds (``capped`` True)."""
    use_time = os.access(TIME_V, os.X_OK)
    full = [TIME_V, "-v", *cmd] if use_time else cmd
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    capped = False
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(full, env=env, stdout=out, stderr=subprocess.STDOUT)
        started = None          # when the run's first training batch was reported (the cap counts from there)
        epoch_rss, in_epoch = 0, True
        while proc.poll() is None:
            time.sleep(1.0)
            if run is None:
                continue
            b = batches_done(run) if in_epoch else None
            if b is not None:
                started = started or time.perf_counter()
                epoch_rss = max(epoch_rss, _rss(proc, use_time))
                in_epoch = b[0] < b[1]
            if cap is not None and started is not None and time.perf_counter() - started > cap:
                capped = True
                _stop(proc, use_time)
                proc.wait()
    r = proc
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
    return wall, peak, rc, capped, epoch_rss


def step_command(step: str, folder: Path, runs: Path) -> list[str]:
    py = [sys.executable, "-m", "crossview"]
    if step in MULTI:
        cmd = step_command(MULTI[step], folder, runs)
        cut = [sys.executable, str(Path(__file__).resolve().parent / "_cut_epochs.py"), str(EPOCH_BATCHES)]
        cmd = [*cut, *cmd[len(py):]]
        cmd[cmd.index("max_epochs=1")] = f"max_epochs={MULTI_EPOCHS}"
        cmd[cmd.index("--run-dir") + 1] = str(runs / step)
        return cmd
    if step == "info":
        return [*py, "data", "info", str(folder)]
    if step in ("cca", "bitr"):
        return [*py, "train", step, "--data", str(folder), "--text-encoder", "tfidf", "--device", DEVICE,
                "--run-dir", str(runs / step)]
    if step in ("wsabie", "smoothap", "webly", "timam"):
        return [*py, "train", step, "--data", str(folder), "--text-encoder", "tfidf", "--device", DEVICE,
                "--set", "max_epochs=1", "--run-dir", str(runs / step)]
    if step == "vsepp":
        return [*py, "train", step, "--data", str(folder), "--device", DEVICE, "--set", "text_model=gru",
                "--set", "max_epochs=1", "--run-dir", str(runs / step)]
    if step == "query":
        return [*py, "query", str(runs / "cca"), "--text", QUERY, "--k", "5"]
    if step == "vquery":
        return [*py, "query", str(runs / "vsepp"), "--text", QUERY, "--k", "5"]
    if step == "eval":
        return [*py, "eval", str(runs / "cca")]
    raise ValueError(step)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="S,M", help="comma-separated among S, M, L (default S,M)")
    ap.add_argument("--steps", default=",".join(STEPS),
                    help=f"comma-separated among {', '.join(STEPS)} (default all, in that order)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default 0)")
    ap.add_argument("--work", default="/tmp/crossview-scale", metavar="DIR",
                    help="where the data sets, feature caches, runs and logs go (default /tmp/crossview-scale)")
    ap.add_argument("--cap-seconds", type=float, default=0.0, metavar="S",
                    help="stop a deep method's training step still training S seconds after its first batch "
                         "(SIGTERM; default 0: none, the whole epoch and its evaluation)")
    ap.add_argument("--cap-steps", default=",".join(CAPPED), metavar="STEPS",
                    help=f"the training steps --cap-seconds applies to (default all: {','.join(CAPPED)})")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where the training steps train (default cpu; cuda: the GPU, whose memory the table does "
                         "not show: peak RSS is the host's)")
    _stamp.add_out_argument(ap, _stamp.RESULTS / "scale_cpu.txt", "the results file (scale_gpu.txt for --device cuda)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and args.out == _stamp.display_path(_stamp.RESULTS / "scale_cpu.txt"):
        args.out = _stamp.display_path(_stamp.RESULTS / "scale_gpu.txt")
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("scale.py: --device cuda: no CUDA GPU here (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
    sizes = [s.strip().upper() for s in args.sizes.split(",") if s.strip()]
    steps = [s.strip().lower() for s in args.steps.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES] + [s for s in steps if s not in STEPS]
    if bad or not sizes or not steps:
        print(f"scale.py: unknown size or step {', '.join(bad) or '(none given)'}; sizes are "
              f"{', '.join(SIZES)} and steps {', '.join(STEPS)}", file=sys.stderr)
        return 2
    steps = [s for s in STEPS if s in steps]
    cap_steps = {s.strip().lower() for s in args.cap_steps.split(",") if s.strip()}
    if cap_steps - set(CAPPED):
        print(f"scale.py: --cap-steps {', '.join(sorted(cap_steps - set(CAPPED)))}: not a training step; choose "
              f"among {', '.join(CAPPED)}", file=sys.stderr)
        return 2
    work = Path(args.work).absolute()
    data = [_stamp.synthetic(seed=args.seed, sizes="/".join(f"{s}={SIZES[s]}" for s in sizes), dim=DIM,
                             captions_per_image=CAPS_PER_IMAGE, vocab=VOCAB, topics=TOPICS,
                             format="VSE++ precomp")]

    def body() -> int:
        how = "/usr/bin/time -v" if os.access(TIME_V, os.X_OK) else "getrusage(RUSAGE_CHILDREN)"
        print(f"peak RSS by {how}; one subprocess a step; load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores at the start")
        if DEVICE == "cuda":
            import torch  # noqa: F811 - imported in main() when the device was checked

            print(f"training steps on the GPU: {torch.cuda.get_device_name(0)} (the table's memory is the host's)")
        print("ratio = peak RSS / the run's feature bytes (denom: img+csr = image features + TF-IDF as float32 CSR; "
              "img = image features only, the vsepp GRU run)")
        print("x dense = peak RSS / (image features + dense float32 TF-IDF); x img = peak RSS / image features")
        capped_here = [s for s in CAPPED if s in cap_steps] if args.cap_seconds else []
        whole = [s for s in CAPPED if s not in capped_here]
        if capped_here:
            print(f"{' / '.join(capped_here)}: 1 epoch, stopped {args.cap_seconds:g} s after the first batch if "
                  "still training (capped: batches done of the epoch's)")
        if whole:
            print(f"{' / '.join(whole)}: 1 whole epoch and the test evaluation after it")
        multi = [s for s in MULTI if s in steps]
        if multi:
            print(f"{' / '.join(multi)}: {MULTI_EPOCHS} epochs of the first {EPOCH_BATCHES} batches each "
                  "(bench/_cut_epochs.py), each validated (the best epoch's weights kept), checkpoints between "
                  "them, then the test evaluation")
        print("epoch MB = the largest RSS sampled (every second) while a training step's epoch ran: below peak MB, "
              "the peak came from loading or the evaluation after the epoch")
        print()
        print(f"{'size':<4} {'step':<8} {'wall s':>8} {'peak MB':>9} {'epoch MB':>9} {'denom':>7} {'feat MB':>8} "
              f"{'ratio':>6} {'x dense':>7} {'x img':>6}  rc")
        failed = 0
        for size in sizes:
            folder = make_dataset(work, size, args.seed)
            n = SIZES[size]
            img_b, txt_b = feature_bytes(n)
            csr_b = csr_text_bytes(folder)
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
                cap = args.cap_seconds if step in cap_steps and args.cap_seconds > 0 else None
                wall, peak, rc, capped, epoch = measure(step_command(step, folder, runs), env, log, cap,
                                                        runs / step if step in CAPPED else None)
                failed += rc != 0 and not capped
                denom, feat = ("img", img_b) if step in IMAGE_ONLY else ("img+csr", img_b + csr_b)
                peak_s = f"{peak / 1e6:9.0f}" if peak >= 0 else f"{'?':>9}"
                ratio = f"{peak / feat:6.2f}" if peak >= 0 else f"{'?':>6}"
                xdense = f"{peak / (img_b + txt_b):7.2f}" if peak >= 0 else f"{'?':>7}"
                ximg = f"{peak / img_b:6.2f}" if peak >= 0 else f"{'?':>6}"
                note = ""
                if capped:
                    b = batches_done(runs / step)
                    note = f"  capped {args.cap_seconds:g} s into training" + (f": {b[0]} of {b[1]} batches" if b else "")
                elif rc != 0:
                    note = f"  (see {log})"
                epoch_s = f"{epoch / 1e6:9.0f}" if epoch > 0 else f"{'-':>9}"
                print(f"{size:<4} {step:<8} {wall:8.1f} {peak_s} {epoch_s} {denom:>7} {feat / 1e6:8.0f} {ratio} {xdense} {ximg}  "
                      f"{rc}{note}", flush=True)
        if failed:
            print(f"\n{failed} step(s) failed: their logs are under {work}", file=sys.stderr)
        return 1 if failed else 0

    return _stamp.run_stamped(body, args.out, data)


if __name__ == "__main__":
    raise SystemExit(main())
