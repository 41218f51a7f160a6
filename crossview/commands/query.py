"""``crossview query RUN``: ask a trained run one question and print the ranked answer.

::

    crossview query runs/cca-flickr8k --text "a dog runs on the beach"        # t2i: ranked images
    crossview query runs/cca-flickr8k --image 12                              # i2t: ranked captions
    crossview query runs/cca-flickr8k --image photo.jpg --corpus corpus.txt   # i2t over a caption corpus
    crossview query runs/cca-flickr8k --caption 1234 --k 5 --json             # a dataset caption, as JSON
    crossview query runs/webly-flickr8k --tags "dog, grass, run"              # a tag list (webly's tag branch)
    crossview query runs/cca-flickr8k --text "a dog on a beach" --images ~/Pictures   # one's own photos

Everything goes through :class:`crossview.engine.retriever.Retriever` (the Query panel's engine), so every
registered method answers the same way and the ground truth and its ranks follow the evaluation's tie rule.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from crossview.commands._common import (add_scoring_options, feature_progress, print_events, print_result,
                                        scoring_select)
from crossview.core.errors import CrossViewError

__all__ = ["register", "cmd_query", "resolve_image"]

#: The ground-truth mark in the table.
GT_MARK = "*"


def _check_args(args: argparse.Namespace) -> None:
    """Refuse contradictory or missing options before anything is loaded (one line each)."""
    given = [flag for flag, value in (("--text", args.text), ("--image", args.image), ("--caption", args.caption),
                                      ("--tags", args.tags))
             if value is not None]
    if len(given) != 1:
        what = "none" if not given else " and ".join(given)
        raise CrossViewError(f"give exactly one query: --text SENTENCE, --image PATH|INDEX|NAME, --caption INDEX or "
                             f"--tags 'TAG, TAG' (got {what})")
    if args.split is not None and args.corpus is not None:
        raise CrossViewError("give --split or --corpus, not both: the gallery is a split of the run's dataset or "
                             "a caption corpus")
    if args.images is not None and (args.split is not None or args.corpus is not None):
        other = "--split" if args.split is not None else "--corpus"
        raise CrossViewError(f"give --images or {other}, not both: the gallery is a photo folder, a split of the "
                             "run's dataset or a caption corpus")
    if args.images is not None and args.text is None:
        raise CrossViewError(f"--images {args.images}: a photo folder has no captions: query it with a sentence "
                             f"(--text SENTENCE), not {given[0]}")
    if args.corpus is not None and args.image is None:
        raise CrossViewError(f"--corpus {args.corpus}: a caption corpus has no images to rank for {given[0]}; "
                             "query it with --image, or rank a split's images with --split")
    if args.k < 1:
        raise CrossViewError(f"--k {args.k}: give a positive number of results")
    if args.text is not None and not args.text.strip():
        raise CrossViewError("--text is empty: give a sentence to search for")
    if args.tags is not None and not args.tags.replace(",", " ").replace(";", " ").replace("|", " ").strip():
        raise CrossViewError("--tags is empty: give a tag list, e.g. --tags 'dog, grass, run'")


def _load_corpus(path: str) -> Any:
    """The caption corpus in ``path`` (one caption a line), or one line saying why it cannot be read."""
    from crossview.data import load_dataset

    p = Path(path).expanduser()
    if p.is_dir():
        raise CrossViewError(f"--corpus {p}: that is a folder; give a text file with one caption a line")
    if not p.is_file():
        raise CrossViewError(f"--corpus {p}: no such file; give a text file with one caption a line")
    try:
        return load_dataset(p, format="corpus")
    except CrossViewError as e:
        raise CrossViewError(f"--corpus: {e}") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CrossViewError(f"--corpus {p}: cannot read it ({type(e).__name__}: {e}); give a UTF-8 text file "
                             "with one caption a line") from None


def _load_photos(path: str) -> Any:
    """The photo folder ``path`` (searched recursively), or one line saying why it cannot be a gallery."""
    from crossview.data.photos import load_photo_folder

    try:
        return load_photo_folder(path)
    except CrossViewError as e:
        raise CrossViewError(f"--images {e}") from None


def _check_run_dir(path: str) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise CrossViewError(f"{p}: no such run folder; give a folder written by 'crossview train'")
    if not p.is_dir():
        raise CrossViewError(f"{p}: not a folder; give a run folder written by 'crossview train'")
    return p


def _image_name(ds: Any, i: int) -> str | None:
    """An image's file name, or None when the dataset holds feature rows only."""
    return Path(ds.image_paths[i]).name if ds.image_paths is not None else None


def resolve_image(ds: Any, value: str) -> int | Path:
    """What ``--image VALUE`` names: a dataset image index (an integer, an image file name or path of the
    dataset) or a new image file (a :class:`~pathlib.Path`)."""
    text = value.strip()
    n = ds.n_images
    if text.lstrip("-").isdigit() and not Path(text).is_file():
        i = int(text)
        if not 0 <= i < n:
            raise CrossViewError(f"--image {text}: index out of range; dataset {ds.name!r} has {n:,} images "
                                 f"(0 to {n - 1:,})")
        return i
    path = Path(text).expanduser()
    if ds.image_paths is not None:
        if path.is_file():     # a dataset image given by its path: answer with its ground truth
            resolved = path.resolve()
            names = {path.name, resolved.name}     # only same-named files are resolved (a large dataset: fast)
            for i, p in enumerate(ds.image_paths):
                if os.path.basename(p) in names and Path(p).resolve() == resolved:
                    return i
            return path
        matches = [i for i, p in enumerate(ds.image_paths) if Path(p).name == text or str(p).endswith("/" + text)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise CrossViewError(f"--image {text}: {len(matches)} images of dataset {ds.name!r} have this name; "
                                 "give its index or a longer path")
    elif path.is_file():
        return path
    elif path.is_dir():
        raise CrossViewError(f"--image {text}: that is a folder, not an image file; give one image file (or --images "
                             "DIR to rank a folder of photos)")
    names = "an image index or file name of" if ds.image_paths is not None else "an image index of"
    raise CrossViewError(f"--image {text}: no such image file, nor {names} dataset {ds.name!r} ({n:,} images)")


def _check_image_file(path: Path, what: str | None = None) -> None:
    """Refuse a file that is not a readable image with one line naming it (``what``, default ``--image PATH``)
    before any encoder loads."""
    from PIL import Image

    from crossview.data.images import image_problem, problem_kind

    try:
        with Image.open(path) as im:
            im.verify()
    except Exception as e:  # noqa: BLE001 - Pillow raises many types (image_problem)
        todo = "resize it" if problem_kind(e) == "large" else "give a JPEG, PNG, BMP or WebP file"
        if what is None:
            what, todo = f"--image {path}", todo + ", or a dataset image by index or name"
        raise CrossViewError(f"{what}: {image_problem(e)}; {todo}") from None


def _describe_query(ds: Any, query: dict[str, Any], corpus: bool) -> str:
    if "file" in query:
        return f"image file {query['file']}"
    if "image" in query:
        name = _image_name(ds, query["image"])
        return f"image {query['image']}" + (f" ({name})" if name else "")
    if "text" in query:
        same = f" (= caption {query['caption']})" if "caption" in query else ""
        return f"sentence {query['text']!r}{same}"
    if "tags" in query:
        return f"tags {query['tags']!r} (the tag branch)"
    return f"caption {query['caption']} {ds.captions[query['caption']]!r}"


def _results(retriever: Any, ranking: Any) -> list[dict[str, Any]]:
    ds = retriever.dataset
    out = []
    for rank, (item, score) in enumerate(zip(ranking.items.tolist(), ranking.scores.tolist()), 1):
        row: dict[str, Any] = {"rank": rank, "score": float(score), "item": int(item)}
        if ranking.direction == "i2t":
            row["text"] = retriever.gallery_caption_text(item)
        else:
            row["file"] = ds.image_paths[item] if ds.image_paths is not None else None
        row["gt"] = ranking.is_gold(item)
        out.append(row)
    word = retriever.identity_word        # identity datasets: each result's identity / class
    if word is not None:
        for row, ident in zip(out, retriever.result_identities(ranking)):
            row[word] = ident
    return out


def _photo_results(retriever: Any, ranking: Any) -> list[dict[str, Any]]:
    return [{"rank": rank, "score": float(score), "item": int(item), "file": str(retriever.gallery_image_path(item))}
            for rank, (item, score) in enumerate(zip(ranking.items.tolist(), ranking.scores.tolist()), 1)]


def _format_photo_table(run: Any, retriever: Any, ranking: Any, rows: list[dict[str, Any]]) -> str:
    folder = retriever.photos
    n = retriever.n_gallery_images
    skipped = f", {len(retriever.photos_skipped)} unreadable skipped" if retriever.photos_skipped else ""
    lines = [f"run {run.name} ({run.method.name} on {retriever.dataset.name})  gallery photo folder {folder.root} "
             f"({n:,} photo{'s' if n != 1 else ''}{skipped})",
             f"query sentence {ranking.query['text']!r} -> ranked photos (t2i)"]
    width = max(4, len(str(len(rows))))
    score_width = 7 + any(r["score"] < 0 for r in rows)
    item_width = max(5, len(str(max((r["item"] for r in rows), default=0))))
    lines.append(f"{'rank':>{width}}  {'score':>{score_width}}  {'photo':>{item_width}}  file")
    for r in rows:
        lines.append(f"{r['rank']:>{width}}  {r['score']:>{score_width}.4f}  {r['item']:>{item_width}}  {r['file']}")
    return "\n".join(lines)


def _gallery_info(retriever: Any, corpus_path: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {"name": retriever.gallery_name, "images": retriever.n_gallery_images,
                            "captions": retriever.n_gallery_captions}
    if corpus_path is not None:
        info["corpus"] = str(corpus_path)
    if retriever.photos is not None:
        info["photos"] = str(retriever.photos.root)
        info["skipped"] = [{"file": p, "problem": why} for p, why in retriever.photos_skipped]
    return info


def _format_table(run: Any, retriever: Any, ranking: Any, rows: list[dict[str, Any]], corpus: bool) -> str:
    ds = retriever.dataset
    if corpus:
        gallery = f"{retriever.gallery_name} ({retriever.n_gallery_captions:,} captions)"
    else:
        name = "all images" if retriever.gallery_name == "all" else f"{retriever.gallery_name} split"
        gallery = (f"{name} ({retriever.n_gallery_images:,} images, "
                   f"{retriever.n_gallery_captions:,} captions)")
    what = "captions" if ranking.direction == "i2t" else "images"
    lines = [f"run {run.name} ({run.method.name} on {ds.name})  gallery {gallery}",
             f"query {_describe_query(ds, ranking.query, corpus)} -> ranked {what} ({ranking.direction})"]
    signed = any(r["score"] < 0 for r in rows)
    width = max(4, len(str(len(rows))))
    item_width = max(4, len(str(max((r["item"] for r in rows), default=0))))
    head = "line" if corpus else ("caption" if ranking.direction == "i2t" else "image")
    item_width = max(item_width, len(head))
    score_width = 7 + signed
    # the item's text (i2t) or file name (t2i; none for a dataset of precomputed features)
    last = "text" if ranking.direction == "i2t" else ("file" if ds.image_paths is not None else "")
    word = retriever.identity_word
    ident_width = max([len(word or "")] + [len(str(r.get(word) or "")) for r in rows]) if word else 0
    ident_head = f"{word:>{ident_width}}  " if word else ""
    lines.append(f"{'rank':>{width}}  {'score':>{score_width}}  gt  {head:>{item_width}}  {ident_head}{last}".rstrip())
    for r in rows:
        label = r["text"] if ranking.direction == "i2t" else (_image_name(ds, r["item"]) or "")
        mark = GT_MARK if r["gt"] else ""
        ident = f"{str(r.get(word) or ''):>{ident_width}}  " if word else ""
        lines.append(f"{r['rank']:>{width}}  {r['score']:>{score_width}.4f}  {mark:^2}  {r['item']:>{item_width}}  "
                     f"{ident}{label}".rstrip())
    lines.append(_gold_line(ranking, corpus))
    mine = retriever.query_identity(ranking) if word else None
    if mine is not None:
        same = sum(r.get(word) == mine for r in rows)
        lines.append(f"{word} of the query: {mine}; {same} of the top {len(rows)} share it")
    if not ranking.exact:
        lines.append("(approximate index: the top results may differ from an exact search)")
    return "\n".join(lines)


def _gold_line(ranking: Any, corpus: bool) -> str:
    """Where the ground truth is over the whole gallery, or why there is none."""
    kind = "caption" if ranking.direction == "i2t" else "image"
    n = len(ranking.gold)
    if n == 0:
        if corpus:
            why = "a caption corpus has no ground truth"
        elif "file" in ranking.query:
            why = "a new image file has no ground truth"
        elif "caption" in ranking.query or "image" in ranking.query:
            why = f"its true {kind}s are not in this gallery"
        elif "tags" in ranking.query:
            why = "a free tag list has no ground truth"
        else:
            why = "the sentence is not a dataset caption"
        return f"ground truth: none ({why})"
    pairs = sorted(zip(ranking.gold_ranks.tolist(), ranking.gold.tolist()))
    shown = ", ".join(f"{kind} {item} at rank {rank:,}" for rank, item in pairs[:10])
    more = f", and {n - 10} more" if n > 10 else ""
    return (f"ground truth ({GT_MARK}): {shown}{more} of {ranking.gallery_size:,}")


def _check_tag_branch(run_dir: Path) -> None:
    """Refuse ``--tags`` for a run whose method has no tag branch (one line naming the run and its method)."""
    from crossview.engine.run import read_config
    from crossview.methods import list_methods, method_class

    method = read_config(run_dir).get("method")
    if method in list_methods() and not callable(getattr(method_class(method), "embed_tags", None)):
        raise CrossViewError(f"--tags: run {run_dir} ({method}) has no tag branch; tag queries need a webly run "
                             "(query this one with --text)")


def _open_cached(args: argparse.Namespace, run_dir: Path, corpus: Any, photos: Any, scoring: str,
                 device: str, choice: dict[str, Any] | None = None) -> tuple[Any, Any] | None:
    """``(run, retriever)`` from the gallery cache alone (:func:`crossview.engine.gallery_cache.open_cached_retriever`:
    no dataset, no feature matrices, no gallery encoding), or None when the query needs the full run (a dataset
    caption or tag list, a photo folder, a scoring whose parameter is still to be chosen or whose bank file the run
    lacks, a cache not filled yet). A scoring with its parameter known (``choice``, the run's own; or ``--param``)
    re-scores the cached gallery against the run's ``bank_<train>.npz``: the same scores as the full path."""
    if photos is not None or args.caption is not None or args.tags is not None:
        return None
    if scoring != "plain" and choice is None and args.param is None:
        return None
    if args.image is not None and not Path(args.image).expanduser().is_file():
        return None      # a dataset image by index or name
    from crossview.engine.gallery_cache import open_cached_retriever
    from crossview.engine.run import read_config
    from crossview.engine.scoring import bank_path, retriever_scoring

    config = read_config(run_dir)
    train_split = str(config.get("train_split") or "train")
    if scoring != "plain" and not bank_path(run_dir, train_split).is_file():
        return None
    try:
        opened = open_cached_retriever(run_dir, corpus if corpus is not None else args.split, device=device,
                                       sides=("captions",) if args.image is not None else ("images",))
        if opened is not None and scoring != "plain":
            scorers, record = retriever_scoring(opened[1], scoring, run_dir=run_dir, train_split=train_split,
                                                seed=int(config.get("seed") or 0), param=args.param, choice=choice)
            opened[1].set_scoring(scorers, record)
            from crossview.engine.gallery_cache import cache_scoring_stats
            # the gallery's bank statistics from the cache (the costly part on a large gallery)
            cache_scoring_stats(opened[1], run_dir, corpus if corpus is not None else opened[1].gallery_name,
                                ("i2t",) if args.image is not None else ("t2i",))
        return opened
    except CrossViewError:
        return None      # the full path says what is wrong, in its words


def _open_full(args: argparse.Namespace, run_dir: Path, progress: Any) -> Any:
    """The run opened in full (dataset, features; :func:`crossview.engine.session.open_run`), ``--split`` checked."""
    from crossview.engine.session import open_run

    run = open_run(run_dir, progress=progress)
    ds = run.dataset
    if args.split is not None and args.split != "all" and args.split not in ds.splits:
        raise CrossViewError(f"--split {args.split!r}: dataset {ds.name!r} has splits "
                             f"{', '.join(ds.split_names) or 'none'}; use one of them or 'all'")
    return run


def _run_scoring(args: argparse.Namespace, run_dir: Path) -> tuple[str, dict[str, Any] | None, str]:
    """``(scoring, choice, note)``: the scoring to rank by, checked (one line for an unknown name). Without
    ``--scoring`` it is the run's own (config.json's record, plain for an old run) with its parameter as recorded
    (``choice``), or plain where it cannot apply (a gallery that is the run's training split: ``note`` says so);
    ``--scoring default`` is the method's default; a scoring named with no ``--param`` has its parameter chosen by
    ``--select`` (``choice`` None)."""
    from crossview.commands._common import scoring_name
    from crossview.engine.run import read_config
    from crossview.engine.scoring import default_scoring, pending_scoring, run_scoring

    config = read_config(run_dir)
    scoring = scoring_name(args, None, config)
    if scoring == "plain" or args.param is not None or args.select is not None:
        return scoring, None, ""
    if args.scoring == "default":
        return scoring, default_scoring(str(config.get("method") or "")), ""
    if args.scoring is not None:
        return scoring, None, ""
    record = run_scoring(config)
    if args.split is not None and args.split == str(config.get("train_split") or "train"):
        return "plain", None, (f"plain scores: the run's {scoring} does not apply to its training split "
                               f"{args.split!r}, the bank's")
    return scoring, None if pending_scoring(record) else record, ""


def cmd_query(args: argparse.Namespace) -> int:
    from crossview.core.devices import select_device

    _check_args(args)
    select = scoring_select(args)
    run_dir = _check_run_dir(args.run)
    scoring, choice, note = _run_scoring(args, run_dir)      # one line for an unknown name, before anything loads
    corpus = _load_corpus(args.corpus) if args.corpus is not None else None
    photos = _load_photos(args.images) if args.images is not None else None
    device = select_device(args.device)
    progress = feature_progress()         # a bar per feature stage that does work (none for the cached ones)

    if args.tags is not None:
        _check_tag_branch(run_dir)       # before the dataset and its features load
    opened = _open_cached(args, run_dir, corpus, photos, scoring, device, choice)
    run, retriever = opened if opened is not None else (_open_full(args, run_dir, progress), None)
    image = resolve_image(run.dataset, args.image) if args.image is not None else None
    if retriever is not None and isinstance(image, int):   # a dataset image: its feature row is in the full run
        run, retriever = _open_full(args, run_dir, progress), None
    ds = run.dataset
    if isinstance(image, Path):
        _check_image_file(image)
    if args.caption is not None and not 0 <= args.caption < ds.n_captions:
        raise CrossViewError(f"--caption {args.caption}: index out of range; dataset {ds.name!r} has "
                             f"{ds.n_captions:,} captions (0 to {ds.n_captions - 1:,})")
    if retriever is None:
        gallery = corpus if corpus is not None else (photos if photos is not None else args.split)
        if scoring != "plain" and args.param is None and choice is None:
            from crossview.engine.scoring import iter_run_choice

            # the run's recorded cross-validated choice, else --select's (auto: cv where it is cheap, see --help)
            choice = print_events(iter_run_choice(run_dir, scoring, select=select, use_recorded=True))
        retriever = run.retriever(gallery=gallery, device=device, progress=progress, scoring=scoring,
                                  param=args.param, choice=choice)
        if retriever.scoring != "plain" and photos is None:
            from crossview.engine.gallery_cache import cache_scoring_stats
            # stored for the next query's fast path (computed now all the same)
            cache_scoring_stats(retriever, run_dir, corpus if corpus is not None else retriever.gallery_name,
                                ("i2t",) if args.image is not None else ("t2i",))
    progress.close()
    if image is not None:
        ranking = retriever.query_image(image, args.k)
    elif args.tags is not None:
        ranking = retriever.query_tags(args.tags, args.k)
    else:
        ranking = retriever.query_text(args.caption if args.caption is not None else args.text, args.k)
    rows = _photo_results(retriever, ranking) if photos is not None else _results(retriever, ranking)
    if args.json:
        doc = {"run": str(run_dir), "method": run.method.name, "dataset": ds.name,
               "gallery": _gallery_info(retriever, args.corpus),
               "query": {"direction": ranking.direction, **ranking.query}, "k": args.k, "exact": ranking.exact,
               "scoring": retriever.scoring_record,
               "results": rows,
               "ground_truth": [{"item": int(i), "rank": int(r)}
                                for i, r in sorted(zip(ranking.gold.tolist(), ranking.gold_ranks.tolist()),
                                                   key=lambda ir: ir[1])]}
        text = json.dumps(doc, indent=2, ensure_ascii=False)
    elif photos is not None:
        text = _format_photo_table(run, retriever, ranking, rows)
    else:
        text = _format_table(run, retriever, ranking, rows, corpus is not None)
    if not args.json and retriever.scoring != "plain":
        from crossview.engine.scoring import describe_run_scoring
        from crossview.eval.scoring import describe_scoring

        rec = retriever.scoring_record
        text += "\nscores: " + (describe_run_scoring(rec, None, full=True) if rec.get("default")
                                else describe_scoring(rec))
    if not args.json and note:
        text += f"\n{note}"
    print_result(text)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``query`` command to the ``crossview`` parser."""
    p = sub.add_parser(
        "query", help="rank a run's gallery for a sentence or an image",
        description="Ask a trained run one question, as the app's Query panel does, and print the ranked "
                    "results with their scores; ground-truth items are marked '*'. --text or --caption ranks "
                    "the gallery's images (t2i), as does --tags through a webly run's tag branch; --image ranks its "
                    "captions (i2t). The gallery is a split of "
                    "the run's dataset (default: the split the run was evaluated on, so ranks match its "
                    "metrics), for --image a caption corpus file, or for --text a folder of your own photos "
                    "(--images DIR: searched recursively, no captions needed; each photo is encoded once by the "
                    "run's image encoder and cached).",
        epilog="Examples: crossview query RUN --text 'a dog runs on grass' | crossview query RUN --image 12 "
               "--k 5 | crossview query RUN --image photo.jpg --corpus corpus_captions.txt --json | "
               "crossview query RUN --text 'a dog on a beach' --images ~/Pictures --k 5")
    p.add_argument("run", metavar="RUN", help="a run folder written by 'crossview train' (it needs its checkpoint)")
    q = p.add_argument_group("query (exactly one)")
    q.add_argument("--text", metavar="SENTENCE",
                   help="a sentence: ranks the gallery's images (a sentence equal to a dataset caption gets "
                        "that caption's image as ground truth)")
    q.add_argument("--image", metavar="PATH|INDEX|NAME",
                   help="an image file, or a dataset image by index or file name: ranks the gallery's captions "
                        "(a dataset image's own captions are the ground truth)")
    q.add_argument("--caption", type=int, metavar="INDEX",
                   help="a dataset caption by index: ranks the gallery's images, its own image is the "
                        "ground truth")
    q.add_argument("--tags", metavar="'TAG, TAG'",
                   help="a tag list (separated by commas, or by spaces when there is no comma): ranks the "
                        "gallery's images through the run's tag branch (webly runs); no ground truth")
    g = p.add_argument_group("gallery (at most one)")
    g.add_argument("--split", default=None, metavar="S",
                   help="a split of the run's dataset, or 'all' (default: the split the run was evaluated on)")
    g.add_argument("--corpus", metavar="FILE",
                   help="a caption corpus, a UTF-8 text file with one caption a line (with --image only)")
    g.add_argument("--images", metavar="DIR",
                   help="a folder of your own photos (.jpg, .jpeg, .png, .webp, in subfolders too; hidden files "
                        "skipped; with --text only): ranks them for the sentence; results give each photo's path, "
                        "no ground truth. Photo features are cached, so only new or changed photos are encoded")
    p.add_argument("--k", type=int, default=10, help="number of results (default 10)")
    p.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N | mps, for encoding the query, photos "
                   "and a corpus (default: cpu)")
    add_scoring_options(p, param=True)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (run, method, gallery, query, results with rank, score, item, "
                        "text or file, gt; ground_truth with the true items' ranks over the whole gallery); with "
                        "--images the results are [{rank, score, item, file}]")
    p.set_defaults(func=cmd_query)
