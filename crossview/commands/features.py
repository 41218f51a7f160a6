"""``crossview features ...``: extract and cache image and caption features, list encoders and the cache."""

from __future__ import annotations

import argparse
import time

from crossview.commands._common import (ProgressPrinter, _add_dataset_args, int_option, load_dataset_reporting,
                                        out_file)
from crossview.core.text import printable


def cmd_extract(args: argparse.Namespace) -> int:
    import numpy as np

    from crossview.features import FeatureCache, extract_features

    if args.out:                   # checked before the extraction (as np.savez names it: .npz added)
        out_file(args.out if str(args.out).endswith(".npz") else f"{args.out}.npz", "--out", (".npz",),
                 "features.npz")
    ds = load_dataset_reporting(args.data, format=args.format, image_root=args.image_root)
    splits = getattr(ds, "splits", {}) or {}
    if args.fit_on != "train" and args.fit_on not in splits:   # "train" absent: every caption, as the library does
        from crossview.core.errors import CrossViewError
        raise CrossViewError(f"--fit-on {args.fit_on}: dataset {printable(ds.name)!r} has no split {args.fit_on!r} "
                             f"(it has: {', '.join(sorted(splits)) or 'none'})")
    bars: dict[str, ProgressPrinter] = {}

    def progress(stage: str, done: int, total: int) -> None:
        bars.setdefault(stage, ProgressPrinter(f"features: {stage}"))(done, total)

    cache = False if args.no_cache else FeatureCache(args.cache_dir) if args.cache_dir else None
    t = time.monotonic()
    feats = extract_features(ds, args.image_encoder, args.text_encoder, device=args.device,
                             batch_size=args.batch_size, num_workers=args.workers, image_weights=args.weights,
                             allow_random=args.random_init, fit_on=args.fit_on, cache=cache, progress=progress)
    secs = time.monotonic() - t
    print(f"dataset {printable(ds.name)}: {ds.n_images:,} images, {ds.n_captions:,} captions")
    print(f"image features  {feats.image_encoder:<20} {feats.image.shape[0]:>8,} x {feats.image.shape[1]:<5}"
          f" {'cache hit' if feats.image_cache_hit else 'extracted'}")
    print(f"text features   {feats.text_encoder:<20} {feats.text.shape[0]:>8,} x {feats.text.shape[1]:<5}"
          f" {'cache hit' if feats.text_cache_hit else 'extracted'}")
    print(f"{secs:.1f} s")
    if args.out:
        from pathlib import Path

        from crossview.core.io import atomic_writer

        out = Path(args.out) if str(args.out).endswith(".npz") else Path(f"{args.out}.npz")   # as np.savez names it
        from crossview.core.linalg import to_dense

        text = to_dense(feats.text)     # the file's "text" is dense (n_captions, dim), whatever the encoder
        need = feats.image.nbytes + text.nbytes + ds.caption_image.nbytes
        atomic_writer(out, lambda f: np.savez(f, image=feats.image, text=text, caption_image=ds.caption_image),
                      size=need)
        print(f"wrote {out}")
    return 0


def cmd_encoders(args: argparse.Namespace) -> int:
    from crossview.features import image, text

    print("image encoders (default " + image.DEFAULT_IMAGE_ENCODER + "):")
    for name in image.list_image_encoders():
        print(f"  {name}")
    print("  NAME:flip         the mean of the image's and its mirror's features, e.g. "
          f"{image.IMAGE_ENCODER_EXAMPLES[0]}")
    print("  NAME+NAME[:flip]  backbones concatenated, each block L2-normalised, e.g. "
          f"{image.IMAGE_ENCODER_EXAMPLES[1]}")
    print("text encoders (default " + text.DEFAULT_TEXT_ENCODER + "):")
    for name in text.list_text_encoders():
        print(f"  {name}")
    print(f"  A+B               encoders combined, each block L2-normalised, e.g. "
          f"{', '.join(text.TEXT_ENCODER_EXAMPLES)}")
    from crossview.methods import default_encoders_of, list_methods

    own = {m: default_encoders_of(m) for m in list_methods()}
    own = {m: e for m, e in own.items() if any(e)}
    if own:
        print("methods with their own defaults (a run uses them unless --image-encoder / --text-encoder say otherwise):")
        for m, (img, txt) in own.items():
            print(f"  {m:<8} {img or image.DEFAULT_IMAGE_ENCODER}, {txt or text.DEFAULT_TEXT_ENCODER}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from crossview.features import FeatureCache

    store = FeatureCache(args.cache_dir) if args.cache_dir else FeatureCache()
    entries = store.entries()
    print(f"feature cache {store.root}: {len(entries)} entries, {store.size_bytes() / 2**20:,.1f} MiB")
    for e in entries:
        parts = e.get("parts", {})
        enc = parts.get("encoder", {})
        name = enc.get("name", "?") if isinstance(enc, dict) else enc
        sparse = e.get("sparse") if isinstance(e.get("sparse"), dict) else None
        shape = (f"{'x'.join(map(str, sparse.get('shape', [])))} CSR, {sparse.get('nnz', '?'):,} non-zeros"
                 if sparse else f"{'x'.join(map(str, e['shape']))} {e['dtype']}")
        print(f"  {e['key'][:12]}  {parts.get('kind', '?'):<5} {name:<22} {str(parts.get('dataset', '')):<16} "
              f"{shape}")
    bad = 0
    if args.verify and not args.clear:
        bar = ProgressPrinter("verifying")
        for n, e in enumerate(entries, 1):
            problem = store.verify(e["key"])
            if problem is not None:
                bad += 1
                store.delete(e["key"])
                bar.note(f"  {e['key'][:12]}  corrupt ({problem}): deleted; it is extracted again when next used")
            bar(n, len(entries))
        print(f"verified {len(entries)} entries: " + (f"{bad} corrupt, deleted" if bad else "all intact"))
    if args.clear:
        for e in entries:
            store.delete(e["key"])
        print(f"removed {len(entries)} entries")
    return 1 if bad else 0


def register(sub: argparse._SubParsersAction) -> None:
    feats = sub.add_parser("features", help="extract and cache image / caption features",
                           description="Extract image and caption features with frozen encoders and keep them "
                                       "in the content-addressed feature cache.")
    fsub = feats.add_subparsers(dest="features_command", metavar="SUBCOMMAND", required=True)

    p = fsub.add_parser("extract", help="extract (or find in the cache) a dataset's features",
                        description="Encode every image and caption of a dataset. A second extraction of the "
                                    "same files with the same encoders is a cache hit. Weights are found offline "
                                    "only; fitted text encoders (tfidf, bow, lda) learn on --fit-on captions.")
    p.add_argument("--data", default="demo", help="dataset path or 'demo' (default: demo)")
    _add_dataset_args(p)
    p.add_argument("--image-encoder", help="image backbone, NAME:flip or NAME+NAME (see 'crossview features encoders')")
    p.add_argument("--text-encoder", help="text encoder: minilm, glove, tfidf, bow, lda, bert:PATH, or two joined "
                                          "with '+' (e.g. minilm+tfidf)")
    p.add_argument("--weights", metavar="FILE", help="image backbone weights file (overrides the lookup)")
    p.add_argument("--random-init", action="store_true", help="allow random backbone weights when none are found")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    p.add_argument("--batch-size", type=int_option(1, 65_536), help="images per batch")
    p.add_argument("--workers", type=int_option(0, 256), help="image decoding worker processes")
    p.add_argument("--fit-on", default="train",
                   help="split whose captions fitted text encoders learn from (default train; a dataset without a train "
                        "split: every caption)")
    p.add_argument("--cache-dir", metavar="DIR", help="feature cache folder (default: the user cache)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--out", metavar="FILE.npz", help="also write image, text and caption_image arrays here")
    p.set_defaults(func=cmd_extract)

    p = fsub.add_parser("encoders", help="list the image and text encoders",
                        description="List the registered image and text encoders and the defaults.")
    p.set_defaults(func=cmd_encoders)

    p = fsub.add_parser("cache", help="list (or clear) the feature cache",
                        description="List the feature cache's entries; --verify checks every entry's "
                                    "checksums over its whole file and deletes corrupt ones (exit 1 if any); "
                                    "--clear removes them all. Every load verifies an entry anyway.")
    p.add_argument("--cache-dir", metavar="DIR", help="feature cache folder (default: the user cache)")
    p.add_argument("--verify", action="store_true", help="check every entry's checksums; delete corrupt ones")
    p.add_argument("--clear", action="store_true", help="remove every entry")
    p.set_defaults(func=cmd_cache)
