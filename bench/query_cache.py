"""``crossview query`` the first and the second time, with and without the gallery cache (issue 34, items 2-3).

    python bench/query_cache.py --baseline 4f330bd --out bench/results/query_cache_cpu.txt
    python bench/query_cache.py --cases synthetic --n 3000 --out -        # quick, printed only

For each case a run is trained here (so its checkpoint is new and nothing of it is cached), then each query is
run as its own process (``python -m crossview query ...``), first (the gallery cache emptied) and second time,
``--repeat`` rounds, each beside a floor process, and the fastest of each is shown (the machine is shared); wall
time and peak resident memory of each process come from ``os.wait4``; the load average is printed at the end. ``--baseline REV`` runs the same queries, on the same runs, with the
code of commit REV (``git archive``) before the current code; the current code's first query fills the cache.

Cases: ``flickr8k`` (the shared sample, images through ``efficientnet_lite0`` (:data:`PINNED_IMAGES`): a CCA run on
TF-IDF captions and a VSE++ run with its own GRU, 1 epoch;
sentence queries on the val split, and a new photo against the sample's 35K-line caption corpus), ``synthetic``
(a seeded VSE++-style precomp folder: ``--n`` images of 2048-d features, 5 captions each, 5,000 test images (a sixth below 30K); a CCA
run on TF-IDF captions), ``scale`` (``--sizes S,M,L``: the seeded sets of ``bench/scale.py``, made under
``--scale-work`` unless there already; a CCA run on TF-IDF captions each). ``--app`` also times opening each run in the
app (offscreen Qt, its own process: the main window made and shown, then ``MainWindow.open_run`` until Inspect shows the
run; wall time and peak memory from ``os.wait4``; with ``--baseline`` the baseline's app too, the two interleaved), and
the app's import of the engine's modules in the background once a run is shown (when it ends, and the longest stall
of the GUI thread meanwhile; also with no run, and done as a plain import for comparison).
``corpus``: the Flickr8k VSE++ GRU run (as in ``flickr8k``)
ranking a ``--corpus-lines`` caption corpus (the sample's 35K lines repeated with a few words appended) for a new
photo: the corpus's GRU embeddings are cached by the run's checkpoint on first use. ``floor`` is ``python -c "import crossview.cli, torch"``: interpreter start and the
imports every query pays. ``serve`` is the median time of one POST /query answer in a kept-open
:class:`~crossview.commands.serve.QueryService` (20 sentences).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stamp  # noqa: E402
from _stamp import REPO  # noqa: E402

SENTENCES = ["a dog runs on the grass", "two children play in the water", "a man rides a bike down a hill",
             "a woman in a red coat walks in the snow", "a group of people stand outside a building"]


#: the image encoder of the Flickr8k runs, pinned: the methods' defaults became fused encoders
#: (``efficientnet_lite0+mobilenet_v2:flip``) that a ``--baseline`` commit before them cannot read (every baseline
#: query then failed); one backbone is what both codes understand, and the cache's effect does not depend on it
PINNED_IMAGES = ("--image-encoder", "efficientnet_lite0")

def measure(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """``(wall s, peak RSS MiB, exit code, stderr tail)`` of one process."""
    # run outside the repository: 'python -m crossview' puts the working folder first on sys.path, so from the
    # repository root every process would import the current code, the baseline's PYTHONPATH notwithstanding
    with tempfile.TemporaryFile() as out, tempfile.TemporaryDirectory() as cwd:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.PIPE, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    err = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, proc.returncode, err.strip().splitlines()[-1:][0] if err.strip() else ""


def drop_gallery_cache(features_dir: Path) -> int:
    """Delete the gallery cache's entries (:mod:`crossview.engine.gallery_cache`) and the photo store (a query image
    file's row, :mod:`crossview.features.photo_cache`) from a feature cache folder, so that the next query is a first
    one again (a new photo too); the features stay. Returns how many entries were deleted."""
    from crossview.features.cache import FeatureCache

    store = FeatureCache(features_dir)
    gone = 0
    for info in store.entries():
        if (info.get("parts") or {}).get("kind") == "gallery":
            store.delete(info["key"])
            gone += 1
    if (features_dir / "photos").is_dir():
        gone += len(list((features_dir / "photos").glob("*.npz")))
        shutil.rmtree(features_dir / "photos")
    return gone


def make_synthetic(folder: Path, n: int, dim: int = 2048, seed: int = 0) -> None:
    """``n`` images (``min(5000, n // 6)`` of them test, a tenth up to 1,000 dev) of ``dim``-d features and 5 captions
    each (6-12 words of a 3,000-word vocabulary)."""
    import numpy as np

    test = min(5000, n // 6)
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(3000)]
    sizes = {"train": n - test - min(1000, n // 10), "dev": min(1000, n // 10), "test": test}
    folder.mkdir(parents=True, exist_ok=True)
    for split, m in sizes.items():
        np.save(folder / f"{split}_ims.npy", np.abs(rng.standard_normal((m, dim), dtype=np.float32)))
        lens = rng.integers(6, 13, m * 5)
        ids = rng.integers(0, len(words), int(lens.sum()))
        at = np.concatenate([[0], np.cumsum(lens)])
        lines = (" ".join(words[j] for j in ids[at[i]:at[i + 1]]) for i in range(m * 5))
        (folder / f"{split}_caps.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def make_corpus(source: Path, out: Path, lines: int) -> int:
    """``lines`` caption lines: the sample's corpus, then again with " in the park" and " at dusk" appended, and so
    on round; returns how many are distinct."""
    base = source.read_text(encoding="utf-8").splitlines()
    tails = ["", " in the park", " at dusk"]
    got = [base[i % len(base)].rstrip() + tails[(i // len(base)) % len(tails)] for i in range(lines)]
    out.write_text("\n".join(got) + "\n", encoding="utf-8")
    return len(set(got))


def run(args: argparse.Namespace) -> int:
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="query_cache_"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CROSSVIEW_HOME": str(work / "home"), "PYTHONPATH": str(REPO),
           "CROSSVIEW_CACHE_DIR": str(Path(args.cache_dir) if args.cache_dir else work / "cache")}
    py = sys.executable
    codes = [("current", str(REPO))]
    if args.baseline:
        base = work / "baseline"
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir()
        tar = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline, "crossview"], check=True,
                             capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=tar, check=True)
        codes.insert(0, (f"baseline {args.baseline}", str(base)))

    def train(name: str, argv: list[str]) -> Path:
        run_dir = work / name
        if args.reuse and (run_dir / "summary.json").is_file():
            print(f"reused {name} (trained before in {work})")
            return run_dir
        shutil.rmtree(run_dir, ignore_errors=True)
        t = measure([py, "-m", "crossview", "train", *argv, "--run-dir", str(run_dir), "--device", "cpu"], env)
        if t[2] != 0:
            raise SystemExit(f"training {name} failed: {t[3]}")
        print(f"trained {name} in {t[0]:.1f} s (peak {t[1]:,.0f} MiB)")
        return run_dir

    cases: list[tuple[str, Path, list[str]]] = []
    if "flickr8k" in args.cases:
        f8k = _stamp.FLICKR8K
        corpus = f8k.parent / "corpus_captions.txt"
        photo = work / "new_photo.jpg"       # a photo the dataset does not have (a copy under another name)
        shutil.copy(sorted((f8k.parent / "images").iterdir())[0], photo)
        cca = train("f8k-cca-tfidf", ["cca", "--data", str(f8k), "--text-encoder", "tfidf", *PINNED_IMAGES])
        gru = train("f8k-vsepp-gru", ["vsepp", "--data", str(f8k), "--set", "text_model=gru",
                                      "--set", "max_epochs=1", *PINNED_IMAGES])
        cases += [("flickr8k cca tfidf", cca, ["--text", SENTENCES[0]]),
                  ("flickr8k vsepp gru", gru, ["--text", SENTENCES[0]]),
                  ("flickr8k vsepp gru", gru, ["--image", str(photo), "--corpus", str(corpus)])]
    if "corpus" in args.cases:
        f8k = _stamp.FLICKR8K
        photo = work / "new_photo.jpg"
        shutil.copy(sorted((f8k.parent / "images").iterdir())[0], photo)
        gru = train("f8k-vsepp-gru", ["vsepp", "--data", str(f8k), "--set", "text_model=gru", "--set", "max_epochs=1",
                                      *PINNED_IMAGES])
        corpus = work / f"corpus_{args.corpus_lines}.txt"
        distinct = make_corpus(f8k.parent / "corpus_captions.txt", corpus, args.corpus_lines)
        cases.append((f"f8k vsepp gru {args.corpus_lines // 1000}K corpus", gru,
                      ["--image", str(photo), "--corpus", str(corpus)]))
        print(f"corpus: {args.corpus_lines:,} lines ({distinct:,} distinct) from the sample's corpus")
    if "scale" in args.cases:
        import scale                                   # bench/scale.py: its seeded sets

        for size in args.sizes:
            folder = scale.make_dataset(Path(args.scale_work), size, 0)
            run_dir = train(f"scale{size}-cca-tfidf", ["cca", "--data", str(folder), "--text-encoder", "tfidf"])
            cases.append((f"scale {size} {scale.SIZES[size]:,} cca tfidf", run_dir, ["--text", scale.QUERY]))
    if "synthetic" in args.cases:
        data = work / f"synthetic_{args.n}_precomp"
        if not (data / "test_caps.txt").is_file():
            t0 = time.perf_counter()
            make_synthetic(data, args.n)
            print(f"made {data.name} in {time.perf_counter() - t0:.1f} s")
        syn = train(f"syn{args.n}-cca-tfidf", ["cca", "--data", str(data), "--text-encoder", "tfidf"])
        cases.append((f"synthetic {args.n:,} cca tfidf", syn, ["--text", "w1 w2 w3 w4 w5 w6"]))

    floor_argv = [py, "-c", "import crossview.cli, torch"]
    print("Each row: the fastest of --repeat rounds; a round runs the floor, then each code's first query (its gallery")
    print("cache emptied) and second query back to back, so the three see the same load. '2nd - floor': the second's time above")
    print("that round's floor (interpreter start + the imports every query pays), the number the goal is about.")
    print()
    head = (f"{'case':<26} {'query':<24} {'code':<17} {'floor s':>7} {'first s':>8} {'MiB':>6} {'second s':>9} "
            f"{'MiB':>6} {'2nd - floor':>11}")
    print(head)
    print("-" * len(head))
    for name, run_dir, query in cases:
        shown = " ".join(q if len(q) < 20 else "..." + q[-16:] for q in query)[:24]
        rows: dict[str, list[tuple[tuple, tuple, tuple]]] = {label: [] for label, _ in codes}
        for _ in range(args.repeat):
            floor = measure(floor_argv, env)
            for label, code in codes:
                e = {**env, "PYTHONPATH": code}
                argv = [py, "-m", "crossview", "query", str(run_dir), *query, "--k", "10"]
                drop_gallery_cache(Path(env["CROSSVIEW_CACHE_DIR"]) / "features")
                got = (floor, measure(argv, e), measure(argv, e))
                for g in got[1:]:
                    if g[2] != 0:
                        print(f"  ({label}: exit {g[2]}: {g[3]})")
                rows[label].append(got)
        for label, _ in codes:
            failed = [g[2] for r in rows[label] for g in r[1:] if g[2] != 0]
            if failed:                                  # an error's time is not a query's: no numbers
                print(f"{name:<26} {shown:<24} {label:<17} failed (exit {failed[0]}, above)")
                continue
            fl, f, s2 = (min(r[i] for r in rows[label]) for i in range(3))
            above = min(r[2][0] - r[0][0] for r in rows[label])
            print(f"{name:<26} {shown:<24} {label:<17} {fl[0]:>7.2f} {f[0]:>8.2f} {f[1]:>6,.0f} {s2[0]:>9.2f} "
                  f"{s2[1]:>6,.0f} {above:>+11.2f}")
    print(f"load average when the queries ended: {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs)")
    print()
    if args.app:
        for name, run_dir, query in cases:
            if query[0] != "--text":
                continue
            for until, what, repeat in (("shown", "process start to Inspect showing the run and Query answering "
                                         "sentences", args.repeat),
                                        ("full", "process start to the run open in full: dataset, feature rows", 1)):
                best: dict[str, tuple] = {}
                for _ in range(repeat):                  # the codes interleaved, each round
                    for label, code in codes:
                        got = measure([py, str(Path(__file__).resolve()), "--app-child", str(run_dir), until],
                                      {**env, "PYTHONPATH": code})
                        if got[2] != 0:
                            print(f"app {name} ({label}): exit {got[2]}: {got[3]}")
                            continue
                        best[label] = got if label not in best or got[0] < best[label][0] else best[label]
                for label, _ in codes:
                    if label in best:
                        tag = f" [{label}]" if len(codes) > 1 else ""
                        print(f"app {name:<26} {until:<5} ({what}){tag}: {best[label][0]:.1f} s, "
                              f"peak {best[label][1]:,.0f} MiB")
            for target, variant, what in ((run_dir, "engine", "the run opened, as the app does it"),
                                          ("-", "engine", "no run opened, as the app does it"),
                                          ("-", "engine-plain", "no run opened, a plain import, for comparison")):
                rounds = []
                for _ in range(args.repeat):
                    got = measure([py, str(Path(__file__).resolve()), "--app-child", str(target), variant], env)
                    if got[2] != 0 or not got[3].startswith("engine:"):
                        print(f"app {name} {variant}: exit {got[2]}: {got[3]}")
                        break
                    rounds.append(dict(kv.split("=") for kv in got[3].split()[1:]))
                if rounds:
                    print(f"app {name if target != '-' else 'no run':<26} {variant:<12} (torch, torchvision, "
                          f"scikit-learn imported in the background; {what}): longest GUI stall while they load "
                          f"{', '.join(r['stall_ms'] + ' ms' for r in rounds)}; loaded "
                          f"{', '.join(r['loaded_s'] + ' s' for r in rounds)} after process start")
        print()
    os.environ.update({k: env[k] for k in ("CROSSVIEW_HOME", "CROSSVIEW_CACHE_DIR")})
    from crossview.commands.serve import QueryService

    for name, run_dir, query in cases:
        if query[0] != "--text":
            continue
        t0 = time.perf_counter()
        service = QueryService(run_dir, k=10)
        opened = time.perf_counter() - t0
        times = []
        for i in range(20):
            t0 = time.perf_counter()
            service.answer({"text": f"{SENTENCES[i % len(SENTENCES)]} {i}"})
            times.append(time.perf_counter() - t0)
        print(f"serve {name:<26} opened in {opened:.2f} s; one POST /query answer: median "
              f"{statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms (20 sentences)")
    return 0


def since_process_start() -> float:
    """Seconds since this process started (its interpreter's start-up included, as os.wait4's wall time counts
    it; Linux's /proc), else 0."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])     # field 22, starttime, in clock ticks after boot
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def app_child(run_dir: str, until: str = "full") -> int:
    """Open ``run_dir`` in the app (offscreen) and return once Inspect shows it and the Query panel answers
    sentences (``until`` "shown": from the gallery cache when it holds the run, the app's
    ``MainWindow.run_previewed``; the process then ends without waiting for the full opening in the background), or
    once the run is open in full ("full": its dataset and feature rows loaded) (``--app``). "engine": shown, then
    on until the engine's modules are imported in the background (``crossview.gui.workers.engine_loader``); the
    last line of stderr says when (seconds since process start) and the longest stall of the GUI thread while they
    were imported (how late a 10 ms timer ticked, the tests' ``LatencyProbe``; the GUI's own work meanwhile, such
    as drawing the run, counts too). "engine-plain": the same with the import done plainly (full garbage
    collections left on, torch's libraries mapped by the import itself). ``run_dir`` "-": no run opened."""
    started = time.perf_counter() - since_process_start()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEventLoop, QTimer

    from crossview.gui.app import ensure_app

    app = ensure_app()
    from crossview.gui.main_window import MainWindow

    engine = until.startswith("engine")
    if until == "engine-plain":
        import gc

        from crossview.gui import workers
        workers._load_torch_libraries = lambda: None
        gc.set_threshold = lambda *_: None    # this process only: the import as a plain one would run
    probe = None
    if engine:
        sys.path.insert(0, str(REPO / "tests"))
        from _latency import LatencyProbe   # the GUI tests' probe
        from crossview.gui import workers

        probe = LatencyProbe()
        start = workers.EngineLoader.start

        def start_probed(loader: object) -> None:       # the stall is measured while the import runs
            probe.start()
            start(loader)
        workers.EngineLoader.start = start_probed
    win = MainWindow()
    win.resize(1280, 800)
    win.show()
    ok = True
    if run_dir != "-":
        task = win.open_run(run_dir, show="inspect")
        loop = QEventLoop()
        task.finished.connect(loop.quit)
        if until == "shown" or engine:
            win.run_previewed.connect(loop.quit)
        QTimer.singleShot(900_000, loop.quit)
        loop.exec()
        app.processEvents()
        win.repaint()
        ok = win.inspect_panel.run_a is not None and win.query_panel.retriever is not None
    if engine:
        loader = workers.engine_loader()
        if loader.result is None:
            loop = QEventLoop()
            loader.loaded.connect(loop.quit)
            QTimer.singleShot(600_000, loop.quit)
            loop.exec()
        app.processEvents()
        stall = probe.stop()
        print(f"engine: loaded_s={time.perf_counter() - started:.1f} stall_ms={stall:.0f}", file=sys.stderr, flush=True)
        os._exit(0 if ok and loader.result is not None else 1)
    if until == "shown" and task.is_running():
        sys.stdout.flush()
        os._exit(0 if ok else 1)      # the full opening goes on in a worker thread: not waited for
    win.close()
    return 0 if ok else 1


def main() -> int:
    if "--app-child" in sys.argv:
        # the app under test is PYTHONPATH's code (the baseline's with --baseline), not this repository's, which
        # _stamp put first on sys.path and whose crossview.core it imported
        code = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
        if code and Path(code).resolve() != REPO.resolve():
            sys.path.insert(0, code)
            for name in [m for m in sys.modules if m == "crossview" or m.startswith("crossview.")]:
                del sys.modules[name]
        rest = sys.argv[sys.argv.index("--app-child") + 1:]
        return app_child(rest[0], *rest[1:2])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="flickr8k,synthetic", help="flickr8k, synthetic, scale, corpus (comma-separated)")
    ap.add_argument("--corpus-lines", type=int, default=100_000, help="with --cases corpus: the caption corpus's "
                    "lines, ranked for a new photo by the Flickr8k VSE++ GRU run (default 100000)")
    ap.add_argument("--sizes", default="L", help="with --cases scale: bench/scale.py's sizes, among S, M, L "
                    "(comma-separated; default L)")
    ap.add_argument("--scale-work", default="/tmp/crossview-scale", help="where bench/scale.py's sets are (made "
                    "there when missing; default /tmp/crossview-scale, scale.py's own --work)")
    ap.add_argument("--app", action="store_true", help="also time opening each sentence case's run in the app")
    ap.add_argument("--n", type=int, default=30000, help="images of the synthetic precomp set (default 30000)")
    ap.add_argument("--baseline", default=None, metavar="REV", help="also run the queries with this commit's code")
    ap.add_argument("--work", default=None, help="folder for runs and data (default: a new temporary one)")
    ap.add_argument("--cache-dir", default=None, help="feature cache (default: WORK/cache; give one that holds the "
                    "Flickr8k sample's image features to skip their extraction)")
    ap.add_argument("--repeat", type=int, default=3, help="times each query is run first and second; the table "
                    "gives the fastest of each (the machine is shared: the minimum is the least disturbed; default 3)")
    ap.add_argument("--reuse", action="store_true", help="reuse the runs of an earlier --work instead of training")
    ap.add_argument("--out", default="-", help="results file ('-': print only)")
    args = ap.parse_args()
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    args.sizes = [s.strip().upper() for s in args.sizes.split(",") if s.strip()]
    bad = [c for c in args.cases if c not in ("flickr8k", "synthetic", "scale", "corpus")] + \
        [s for s in args.sizes if s not in ("S", "M", "L")]
    if bad:
        ap.error(f"unknown case or size {', '.join(bad)}: cases are flickr8k, synthetic, scale, corpus; sizes S, M, L")
    data = []
    if "flickr8k" in args.cases or "corpus" in args.cases:
        data.append(_stamp.dataset_fingerprint(_stamp.FLICKR8K))
    if "synthetic" in args.cases:
        data.append(_stamp.synthetic(seed=0, n=args.n, dim=2048, captions_per_image=5, test=min(5000, args.n // 6), vocabulary=3000))
    if "scale" in args.cases:
        import scale

        data.append(_stamp.synthetic(seed=0, generator="bench/scale.py", sizes="/".join(
            f"{s}={scale.SIZES[s]}" for s in args.sizes), dim=scale.DIM, captions_per_image=scale.CAPS_PER_IMAGE,
            vocab=scale.VOCAB, topics=scale.TOPICS))
    return _stamp.run_stamped(lambda: run(args), args.out, data)


if __name__ == "__main__":
    sys.exit(main())
