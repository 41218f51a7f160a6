"""``crossview explain RUN --image PATH|INDEX|NAME --text "..." [--out map.png]``: why a pair scored as it did.

Writes the image with its region map blended over it (``--out``) and prints each word's share of the score,
most important first. ``--caption INDEX`` explains a dataset caption instead of a typed sentence. See
:mod:`crossview.explain` for what the numbers are (exact splits of the score, or first-order / deletion
views, as printed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from crossview.commands._common import ProgressPrinter, print_result
from crossview.core.errors import CrossViewError

__all__ = ["register", "cmd_explain"]


_MODES = {
    "exact": "exact: the cells average to the score (each is its position's own score at the whole image's "
             "normalisation scales)",
    "first-order": "first-order: the linearisation at the pooled feature (the pipeline has an elementwise step the "
                   "scales do not cover); the cells still average to the score",
}
_WORD_MODES = {
    "exact": "exact: the contributions sum to the score minus the empty caption's ({base:.4f})",
    "deletion": "deletion: how much the score drops when the word is removed",
}


def _check_out(out: str | None) -> Path | None:
    if out is None:
        return None
    p = Path(out).expanduser()
    if p.suffix.lower() not in (".png", ".jpg", ".jpeg", ".webp", ".bmp"):
        raise CrossViewError(f"--out {p}: give an image file name ending in .png, .jpg, .webp or .bmp")
    if not p.parent.is_dir():
        raise CrossViewError(f"--out {p}: the folder {p.parent} does not exist; create it or choose another")
    from crossview.core.io import check_writable_folder

    check_writable_folder(p.parent, "--out")     # before the run is opened and the map computed
    return p


def cmd_explain(args: argparse.Namespace) -> int:
    from crossview.commands.query import _check_image_file, _check_run_dir, resolve_image
    from crossview.core.devices import select_device
    from crossview.core.io import atomic_write_bytes
    from crossview.engine.session import open_run
    from crossview.explain import Explainer, explain_figure

    if (args.text is None) == (args.caption is None):
        raise CrossViewError("give the caption to explain: --text SENTENCE or --caption INDEX (one of them)")
    if args.text is not None and not args.text.strip():
        raise CrossViewError("--text is empty: give the sentence to explain")
    if args.direction not in ("i2t", "t2i"):
        raise CrossViewError(f"--direction {args.direction!r}: give i2t or t2i")
    out = _check_out(args.out)
    run_dir = _check_run_dir(args.run)
    device = select_device(args.device)
    bars: dict[str, ProgressPrinter] = {}

    def progress(stage: str, done: int, total: int) -> None:
        bars.setdefault(stage, ProgressPrinter(f"features: {stage}"))(done, total)

    run = open_run(run_dir, progress=progress)
    for bar in bars.values():
        bar.close()
    ds = run.dataset
    image = resolve_image(ds, args.image)
    if isinstance(image, Path):
        _check_image_file(image)
    if args.caption is not None and not 0 <= args.caption < ds.n_captions:
        raise CrossViewError(f"--caption {args.caption}: index out of range; dataset {ds.name!r} has "
                             f"{ds.n_captions:,} captions (0 to {ds.n_captions - 1:,})")
    text: Any = args.caption if args.caption is not None else args.text
    ex = Explainer(run, device=device)
    got = ex.explain(image, text, args.direction)
    region, words = got.region, got.words
    if out is not None:
        if region is None:
            raise CrossViewError(f"no region map for this run: {got.region_error}")
        import io

        buf = io.BytesIO()
        title = f"{got.text[:90]}   (score {words.score:.3f})" if isinstance(got.text, str) else ""
        fmt = {".jpg": "JPEG", ".jpeg": "JPEG"}.get(out.suffix.lower(), out.suffix[1:].upper())
        explain_figure(got.image_path, region, title=title).save(buf, format=fmt)
        atomic_write_bytes(out, buf.getvalue())
    if args.json:
        doc: dict[str, Any] = {"run": str(run_dir), "method": run.method.name, "image": got.image_path,
                               "text": got.text, "direction": args.direction, "score": words.score,
                               "words": {"mode": words.mode, "baseline": words.baseline,
                                         "values": [{"word": w, "value": float(v)}
                                                    for w, v in zip(words.words, words.values)]}}
        if region is not None:
            doc["region"] = {"mode": region.mode, "score": region.score, "shape": list(region.values.shape),
                             "values": region.values.round(6).tolist(), "crop_box": list(region.crop_box),
                             "peak": list(region.peak), "residual": region.residual}
        else:
            doc["region"] = None
            doc["region_error"] = got.region_error
        if out is not None:
            doc["out"] = str(out)
        text_out = json.dumps(doc, indent=2, ensure_ascii=False)
    else:
        lines = [f"run {run.name} ({run.method.name} on {ds.name})  {args.direction}",
                 f"image {got.image_path}",
                 f"text  {got.text!r}",
                 f"score {words.score:.4f}"]
        if region is not None:
            r, c = region.peak
            l, t, rr, b = region.cell_box(r, c)
            h, w = region.values.shape
            lines.append(f"region map {h}x{w}, {_MODES[region.mode]}; peak cell ({r}, {c}) = pixels "
                         f"({l:.0f}, {t:.0f})-({rr:.0f}, {b:.0f}), {region.values.max():+.4f} against a mean of "
                         f"{region.values.mean():+.4f}")
            if out is not None:
                lines.append(f"wrote {out}")
        else:
            lines.append(f"region map: none ({got.region_error})")
        lines.append("words, " + _WORD_MODES[words.mode].format(base=words.baseline or 0.0) + ":")
        width = max((len(w) for w in words.words), default=4)
        for w, v in words.ranked():
            lines.append(f"  {w:<{width}}  {v:+.4f}")
        text_out = "\n".join(lines)
    print_result(text_out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``explain`` command to the ``crossview`` parser."""
    p = sub.add_parser(
        "explain", help="why a pair matched: a region map over the image and each word's share",
        description="Explain the score a trained run gives one image and one caption: which part of the image "
                    "(a map over the backbone's last conv map, blended over the image with --out) and which "
                    "words (their share of the score, printed most important first). For methods on pooled "
                    "CNN features the map is an exact split of the score; the output says when it is a "
                    "first-order view instead, and words are exact for bag-of-words / TF-IDF / GloVe features, "
                    "else the drop in score when each word is removed.",
        epilog="Examples: crossview explain RUN --image 12 --text 'a red circle' --out map.png | "
               "crossview explain RUN --image photo.jpg --caption 40 --json")
    p.add_argument("run", metavar="RUN", help="a run folder written by 'crossview train' (it needs its checkpoint)")
    p.add_argument("--image", required=True, metavar="PATH|INDEX|NAME",
                   help="an image file, or a dataset image by index or file name")
    p.add_argument("--text", metavar="SENTENCE", help="the caption to explain")
    p.add_argument("--caption", type=int, metavar="INDEX", help="a dataset caption by index, instead of --text")
    p.add_argument("--out", metavar="FILE.png", help="write the image with its region map blended over it")
    p.add_argument("--direction", default="i2t", help="i2t (default) or t2i: the model that scores the pair "
                   "(only BITR has one per direction)")
    p.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N | mps (default: cpu)")
    p.add_argument("--json", action="store_true", help="print the map and the word values as JSON")
    p.set_defaults(func=cmd_explain)
