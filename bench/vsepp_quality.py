"""VSE0 / VSE++ quality on real photos (bench/results/vsepp_flickr8k.md): each loss x text encoder, several seeds,
on the shared Flickr8k sample with the default image features (EfficientNet-Lite0, signed square root + L2).

Protocols:

- ``val`` (what ``crossview train vsepp`` reports): train on the 600 train images, the epoch with the best
  val rsum kept (the paper's model selection), val rsum of that epoch; the last epoch's val rsum beside it;
- ``cv``: 3-fold cross-validation over the 600 train images (train on 400, the held-out 200 both pick the
  epoch and are ranked), mean rsum over the folds -- the 100 val images play no part (choose defaults by it).

Text encoders: ``gru`` (learned 300-d words, the paper's), ``gru_glove`` (GloVe 6B 50-d initialised),
``minilm`` (frozen all-MiniLM-L6-v2 sentence embeddings from the feature cache -> FC: ``text_model=features``),
``minilm_ft`` (MiniLM over word pieces, its top 2 layers fine-tuned: ``text_model=transformer``). Losses:
``vsepp`` / ``vse0`` (method ``vsepp``), ``smoothap`` / ``infonce`` (method ``smoothap``: batches of images with all
their captions).

    python bench/vsepp_quality.py --configs vse0:minilm,vsepp:minilm --seeds 3
    python bench/vsepp_quality.py --export f8k.npz            # features + captions + GloVe rows, for a GPU box
    python bench/vsepp_quality.py --from f8k.npz --device cuda --configs vse0:gru,vsepp:gru --seeds 3

Its tables are part of bench/results/vsepp_flickr8k.md and loss_compare_flickr8k.md, which ``bench/regenerate.py``
assembles; ``--out FILE`` writes one table alone, stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)
SAMPLE = REPO.parent / "shared" / "data" / "flickr8k-sample" / "dataset_flickr8k_sample.json"

TEXT = {"gru": {"text_model": "gru"}, "gru_glove": {"text_model": "gru_glove"},
        "minilm": {"text_model": "features"}, "minilm_ft": {"text_model": "transformer", "train_layers": 2}}


def load(args: argparse.Namespace) -> SimpleNamespace:
    """image / text features, captions, caption_image, train / val image ids (from the dataset or a dump)."""
    if args.source:
        z = np.load(args.source, allow_pickle=False)
        meta = json.loads(str(z["meta"]))
        _patch_glove(z["glove_vectors"], meta["glove_words"])
        return SimpleNamespace(image=z["image"], text=z["text"], captions=meta["captions"],
                               caption_image=z["caption_image"], train=z["train"], val=z["val"])
    from crossview.data import load_dataset
    from crossview.features import extract_features

    ds = load_dataset(args.data)
    f = extract_features(ds, fit_on="train")
    return SimpleNamespace(image=f.image, text=f.text, captions=list(ds.captions),
                           caption_image=np.asarray(ds.caption_image), train=np.asarray(ds.splits["train"]),
                           val=np.asarray(ds.splits["val"]))


def export(d: SimpleNamespace, path: str) -> None:
    from crossview.data.text import tokenize
    from crossview.features.text.glove import _glove_tables

    emb, index, _ = _glove_tables()
    words = sorted({w for c in d.captions for w in tokenize(c)} & set(index))
    vectors = np.asarray(emb[[index[w] for w in words]], np.float32)
    meta = {"captions": d.captions, "glove_words": words}
    np.savez_compressed(path, image=d.image, text=d.text, caption_image=d.caption_image, train=d.train, val=d.val,
                        glove_vectors=vectors, meta=json.dumps(meta))
    print(f"wrote {path}: {len(d.image)} images, {len(d.captions)} captions, {len(words)} GloVe rows")


def _patch_glove(vectors: np.ndarray, words: list[str]) -> None:
    """Serve the dumped GloVe rows (every word of the captions GloVe has) in place of the package's table."""
    import crossview.features.text.glove as glove

    table = (np.asarray(vectors, np.float32), {w: i for i, w in enumerate(words)}, "glove-6b-50d rows")
    glove._glove_tables = lambda: table


def data_for(d: SimpleNamespace, images: np.ndarray, image: np.ndarray, name: str):
    from crossview.data.method_data import MethodData

    pos = {int(i): k for k, i in enumerate(images)}
    caps = np.flatnonzero(np.isin(d.caption_image, images))
    return MethodData(image_features=image[images], text_features=np.asarray(d.text[caps], np.float32),
                      captions=[d.captions[c] for c in caps],
                      caption_image=np.array([pos[int(d.caption_image[c])] for c in caps]), name=name)


def method_of(params: dict) -> str:
    """``smoothap`` for the ranking losses (SmoothAP, InfoNCE), ``vsepp`` for the hinge losses."""
    return "smoothap" if params.get("loss") in ("smoothap", "infonce") else "vsepp"


#: with ``--cache DIR``: each trial's result is kept there and read back by a later invocation (a regeneration
#: of hours stopped half way continues where it was)
CACHE: Path | None = None


def _trial_key(d: SimpleNamespace, train_ids: np.ndarray, test_ids: np.ndarray, params: dict, select: bool,
               refit: bool) -> str:
    """What a trial's result depends on: the rows (features, captions, their images), the split, the parameters."""
    import hashlib

    h = hashlib.sha256()
    for a in (d.image, d.text, d.caption_image, train_ids, test_ids):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    h.update(json.dumps([d.captions, params, bool(select), bool(refit)], sort_keys=True).encode())
    return h.hexdigest()[:24]


def trial(d: SimpleNamespace, train_ids: np.ndarray, test_ids: np.ndarray, params: dict, select: bool = True,
          refit: bool = False) -> dict:
    """One model trained on ``train_ids`` and scored on ``test_ids`` (read back from ``CACHE`` when it is there)."""
    path = None if CACHE is None else CACHE / f"{_trial_key(d, train_ids, test_ids, params, select, refit)}.json"
    if path is not None and path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))["result"]
    t = time.time()
    result = {**_trial(d, train_ids, test_ids, params, select, refit), "seconds": time.time() - t}
    if path is None:
        return result
    CACHE.mkdir(parents=True, exist_ok=True)
    _stamp.atomic_write_bytes(path, json.dumps({"params": params, "select": select, "refit": refit,
                                                "result": result}).encode("utf-8"))
    return result


def _trial(d: SimpleNamespace, train_ids: np.ndarray, test_ids: np.ndarray, params: dict, select: bool,
           refit: bool) -> dict:
    from crossview.features.normalize import FeatureNorm
    from crossview.methods import method_from_params

    norm = FeatureNorm("ssr").fit(d.image[train_ids])
    image = norm.transform(d.image).astype(np.float32)
    method = method_of(params)
    m = method_from_params(method, params)
    tr, te = data_for(d, train_ids, image, "train"), data_for(d, test_ids, image, "val")
    if not select:      # as a run without a validation split (holdout of train, else the last epoch), scored once
        m.fit(tr)
        epoch = int(m.best_epoch_) or len(m.history_)
        if refit and m.best_epoch_:     # the chosen number of epochs again on all the training images
            m = method_from_params(method, {**params, "holdout": 0.0, "max_epochs": epoch}).fit(tr)
        last = float(m.evaluate(te)["rsum"])
        return {"best": last, "best_epoch": epoch, "last": last}
    m.fit(tr, te)
    return {"best": float(m.best_score_), "best_epoch": int(m.best_epoch_),
            "last": float([h for h in m.history_ if "val" in h][-1]["val"])
            if any("val" in h for h in m.history_) else float("nan")}


def cca_rsum(d: SimpleNamespace, train_ids: np.ndarray, test_ids: np.ndarray) -> float:
    """CCA with its defaults on the same image normalisation (fitted on the training images) and split."""
    from crossview.features.normalize import FeatureNorm
    from crossview.methods import create_method

    image = FeatureNorm("ssr").fit(d.image[train_ids]).transform(d.image).astype(np.float32)
    m = create_method("cca").fit(data_for(d, train_ids, image, "train"))
    return float(m.evaluate(data_for(d, test_ids, image, "val"))["rsum"])


def curve(d: SimpleNamespace, splits: list, args: argparse.Namespace, extra: dict) -> int:
    """Where the deep model starts to win: rsum against the number of training images, CCA beside each config
    (mean ± sd over the seeds, each seed drawing its own subset; the evaluation images stay the same)."""
    configs = ["cca", *args.configs.split(",")]
    kept = "kept epoch, no selection" if args.no_select else "best epoch"
    print(f"| training images | {' | '.join(configs)} | ({args.protocol} rsum, {kept}, mean ± sd over "
          f"{args.seeds} seeds) |")
    print("|---" * (len(configs) + 2) + "|")
    for size in map(int, args.train_sizes.split(",")):
        cells = []
        for cfg in configs:
            got = []
            for seed in range(args.seeds):
                runs = []
                for a, b in splits:
                    sub = np.sort(np.random.default_rng(seed).choice(a, min(size, len(a)), replace=False))
                    if cfg == "cca":
                        runs.append(cca_rsum(d, sub, b))
                        continue
                    loss, text = cfg.split(":")
                    params = {"loss": loss, **TEXT[text], "device": args.device, **extra, "seed": seed}
                    runs.append(trial(d, sub, b, params, not args.no_select, args.refit)["best"])
                got.append(float(np.mean(runs)))
            cells.append(f"{np.mean(got):.1f} ± {np.std(got):.1f}")
            if args.json:
                with open(args.json, "a") as fh:
                    fh.write(json.dumps({"config": cfg, "train_images": size, "protocol": args.protocol,
                                         "rsum": got, "extra": extra}) + "\n")
        print(f"| {size} | {' | '.join(cells)} | |", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--from", dest="source", default="")
    ap.add_argument("--export", default="")
    ap.add_argument("--configs", default="vse0:minilm,vsepp:minilm")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--protocol", choices=["val", "cv"], default="val")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--set", action="append", default=[], help="key=value (JSON value) for every config")
    ap.add_argument("--json", default="", help="append one JSON line per config to this file")
    ap.add_argument("--cache", default="", metavar="DIR",
                    help="keep each trial's result in DIR and read it back when the same trial (same rows, split and "
                         "parameters) comes again: an interrupted invocation continues where it stopped")
    ap.add_argument("--no-select", action="store_true",
                    help="no validation during training: the last epoch is scored (what a run on a dataset with "
                         "no test split does, its val split being the evaluation split)")
    ap.add_argument("--refit", action="store_true",
                    help="with --no-select: train again on all the training images for the epochs the holdout chose")
    ap.add_argument("--cca", action="store_true", help="also CCA (its defaults) on the same features and splits")
    ap.add_argument("--train-sizes", default="",
                    help="a learning curve instead: comma-separated numbers of training images (drawn with each "
                         "seed), CCA and each config trained on them, scored on the evaluation split")
    ap.add_argument("--out", default="-", metavar="FILE",
                    help="also write the table here, stamped with the command, commit, machine and data (default "
                         "'-': print only)")
    args = ap.parse_args(argv)
    global CACHE
    CACHE = Path(args.cache) if args.cache else None
    if not args.source and args.data != "demo" and not Path(args.data).is_file():
        print(f"no dataset at {args.data}", file=sys.stderr)
        return 2

    def data() -> list[str]:
        if args.source:
            return [_stamp.file_fingerprint(args.source, "feature dump")]
        return [_stamp.dataset_fingerprint(args.data)]

    return _stamp.run_stamped(lambda: run(args), args.out, data)


def run(args: argparse.Namespace) -> int:
    """The trials proper: one table (or the learning curve) on stdout."""
    d = load(args)
    if args.export:
        export(d, args.export)
        return 0
    extra = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    if args.protocol == "cv":
        from sklearn.model_selection import KFold

        splits = [(d.train[a], d.train[b]) for a, b in KFold(3, shuffle=True, random_state=0).split(d.train)]
    else:
        splits = [(d.train, d.val)]
    if args.train_sizes:
        return curve(d, splits, args, extra)
    if args.cca:
        got = [cca_rsum(d, a, b) for a, b in splits]
        print(f"cca (defaults, same features and splits): {args.protocol} rsum {np.mean(got):.1f}", flush=True)
    kept = "the kept epoch, no selection" if args.no_select else "best epoch"
    print(f"| config | {args.protocol} rsum, {kept} (mean ± sd over {args.seeds} seeds) | per seed | "
          "last epoch | best epochs | time |")
    print("|---|---|---|---|---|---|")
    for cfg in args.configs.split(","):
        loss, text = cfg.split(":")
        params = {"loss": loss, **TEXT[text], "device": args.device, **extra}
        best, last, epochs, seconds = [], [], [], 0.0
        for seed in range(args.seeds):
            runs = [trial(d, a, b, {**params, "seed": seed}, not args.no_select, args.refit) for a, b in splits]
            best.append(float(np.mean([r["best"] for r in runs])))
            last.append(float(np.mean([r["last"] for r in runs])))
            epochs += [r["best_epoch"] for r in runs]
            seconds += sum(r["seconds"] for r in runs)     # the trials' own times (also when read back)
        row = {"config": cfg, "params": params, "protocol": args.protocol, "best": best, "last": last,
               "best_epochs": epochs, "seconds": seconds}
        print(f"| {cfg} | **{np.mean(best):.1f}** ± {np.std(best):.1f} | {' / '.join(f'{b:.1f}' for b in best)} | "
              f"{np.mean(last):.1f} | {','.join(map(str, epochs))} | {seconds:.0f} s |", flush=True)
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
