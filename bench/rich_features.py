"""Richer frozen features per method, chosen by 3-fold cross-validation on the Flickr8k sample's training photos.

Feature pipelines (issue 33, item 3), each a choice of the run's ``--image-encoder`` / ``--text-encoder``:

- ``plain``: EfficientNet-Lite0 pooled features, MiniLM captions (today's defaults);
- ``flip``: ``efficientnet_lite0:flip`` (each image's feature averaged with its mirror's);
- ``concat``: ``efficientnet_lite0+mobilenet_v2`` (each backbone's block L2-normalised, then concatenated);
- ``concat+flip``: ``efficientnet_lite0+mobilenet_v2:flip``;
- ``minilm+tfidf`` / ``minilm+glove``: MiniLM with TF-IDF or averaged GloVe, each block L2-normalised;
- ``best image + best text``: per method, the image pipeline and the text pipeline that won CV (when both differ
  from plain), so the combination is scored too.

That is the ``all`` set, run for the linear methods (seconds a fit). The deep methods (minutes a fit on two shared
cores) get the ``three`` set, fixed before any of them was scored: ``plain`` (their default until now), ``concat+flip``
(the image pipeline that won for both linear methods) and ``concat+flip & minilm+glove`` (with the caption pipeline
that won for CCA; GloVe's 50 dense dimensions, where TF-IDF would add a few thousand sparse ones to every text
layer); a method that reads the captions itself (TIMAM's Bi-LSTM over MiniLM tokens) gets no caption variant.

Protocol: the 600 training photos in 3 folds (train on 400, rank the other 200 and their 1,000 captions); the 100
val photos untouched until the end. Each method gets its default parameters and default feature normalisation
(fitted on the fold's training rows). TF-IDF is fitted on the fold's training captions only. CV rsum is over the
pooled held-out queries of the three folds (600 images, 3,000 captions; ranks within each fold's gallery of 200),
with a 95% bootstrap interval over images (each with its captions), and the paired difference from ``plain`` on the
same queries with its 95% interval (:func:`crossview.eval.paired.paired_effect`). The configuration with the best CV
rsum is then trained once on all 600 and reported on val (beside ``plain``); it beats plain only when its CV
difference's interval (widened for the comparisons made) lies above 0. Each choice is printed beside the method's
default at this commit: a method ranks by its default scoring, not plain dot products, so its default may come from
a later comparison under that scoring (bench/text_encoder_cv.py for CCA's captions).

    .venv/bin/python bench/rich_features.py --methods cca,bitr,wsabie,vsepp,smoothap,webly,timam \
        --out bench/results/rich_features_flickr8k.md
    .venv/bin/python bench/rich_features.py --methods timam --merge --out bench/results/rich_features_flickr8k.md

``--merge`` keeps the sections (and val rows) of the methods not named from the ``--out`` file already there, and
says in the stamp which commit made them: one method at a time, without rerunning the others.

Feature extraction is cached (crossview.features): the first run extracts the flip and MobileNet-V2 features of the
700 photos (minutes per backbone on a CPU), later runs only fit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)

SAMPLE = REPO.parent / "shared" / "data" / "flickr8k-sample" / "dataset_flickr8k_sample.json"

PLAIN_IMAGE, PLAIN_TEXT = "efficientnet_lite0", "minilm"
CONCAT_FLIP = "efficientnet_lite0+mobilenet_v2:flip"
#: (label, image encoder, text encoder): the ``all`` set (the best image & best text pair is added after it)
CONFIGS = [
    ("plain", PLAIN_IMAGE, PLAIN_TEXT),
    ("flip", "efficientnet_lite0:flip", PLAIN_TEXT),
    ("concat", "efficientnet_lite0+mobilenet_v2", PLAIN_TEXT),
    ("concat+flip", CONCAT_FLIP, PLAIN_TEXT),
    ("minilm+tfidf", PLAIN_IMAGE, "minilm+tfidf"),
    ("minilm+glove", PLAIN_IMAGE, "minilm+glove"),
]
#: the ``three`` set, fixed up front for the deep methods (see the module docstring)
THREE = [
    ("plain", PLAIN_IMAGE, PLAIN_TEXT),
    ("concat+flip", CONCAT_FLIP, PLAIN_TEXT),
    ("concat+flip & minilm+glove", CONCAT_FLIP, "minilm+glove"),
]
#: methods scored on the ``all`` set when ``--configs auto`` (fits of seconds); the others get ``three``
ALL_SET_METHODS = ("cca", "bitr")
VAL_HEADING = "## Val, once"


class Blocks:
    """The feature rows of every pipeline, from the feature cache (read on first use); TF-IDF blocks fitted on the
    captions given."""

    def __init__(self, ds) -> None:
        self.ds = ds
        self._image: dict[str, np.ndarray] = {}
        self._text: dict[str, np.ndarray] = {}

    def image(self, enc: str) -> np.ndarray:
        """``(n_images, d)`` features of image pipeline ``enc``."""
        from crossview.features import extract_features

        if enc not in self._image:
            t0 = time.time()
            self._image[enc] = extract_features(self.ds, enc, "none").image
            print(f"<!-- image features {enc}: {self._image[enc].shape[1]}-d, {time.time() - t0:.0f} s -->",
                  file=sys.stderr)
        return self._image[enc]

    def _plain_text(self, enc: str) -> np.ndarray:
        from crossview.features import extract_features

        if enc not in self._text:
            self._text[enc] = extract_features(self.ds, PLAIN_IMAGE, enc).text
        return self._text[enc]

    def text(self, name: str, fit_images: np.ndarray) -> np.ndarray:
        """``(n_captions, e)`` caption features of pipeline ``name``; TF-IDF fitted on ``fit_images``' captions."""
        from crossview.features.text import CombinedTextEncoder, create_text_encoder

        if name in ("minilm", "glove"):
            return self._plain_text(name)
        if name == "minilm+glove":
            return CombinedTextEncoder.combine([self._plain_text("minilm"), self._plain_text("glove")])
        if name == "minilm+tfidf":
            caps = [c for c, i in zip(self.ds.captions, self.ds.caption_image) if int(i) in set(map(int, fit_images))]
            tfidf = create_text_encoder("tfidf").fit(caps).encode(list(self.ds.captions))
            return CombinedTextEncoder.combine([self._plain_text("minilm"), tfidf])
        raise ValueError(name)


def reads_text_features(method: str) -> bool:
    """Whether ``method`` with its default parameters trains on the run's caption features (a GRU or TIMAM's
    Bi-LSTM, when they are the default, read the captions themselves)."""
    from crossview.methods import method_from_params

    return bool(getattr(method_from_params(method, {}), "needs_text_features", True))


def configs_for(method: str, which: str) -> list[tuple[str, str, str]]:
    """The configurations ``method`` is scored on: ``which`` is ``all``, ``three`` or ``auto`` (see the docstring)."""
    if which == "auto":
        which = "all" if method in ALL_SET_METHODS else "three"
    configs = list(CONFIGS if which == "all" else THREE)
    if not reads_text_features(method):         # caption pipelines would change nothing it trains on
        configs = [c for c in configs if c[2] == PLAIN_TEXT]
    return configs


def score(method: str, blocks: Blocks, image_enc: str, text_enc: str, splits, seed: int = 0):
    """Train ``method`` on each split's first part, rank its second: pooled ranks, caption -> image map, seconds."""
    from crossview.features.normalize import FeatureNorm
    from crossview.methods import default_norms_of, method_from_params
    from method_cv import fold_data

    img_norm, txt_norm = default_norms_of(method)
    r_i, r_t, ci, secs, offset = [], [], [], [], 0
    for a, b in splits:
        image = FeatureNorm(img_norm).fit(blocks.image(image_enc)[a]).transform(blocks.image(image_enc))
        text = blocks.text(text_enc, a)
        caps_a = np.flatnonzero(np.isin(blocks.ds.caption_image, a))
        text = FeatureNorm(txt_norm).fit(text[caps_a]).transform(text)
        m = method_from_params(method, {"seed": seed})
        t0 = time.time()
        for _ in m.fit_iter(fold_data(blocks.ds, text, a, image.astype(np.float32), "train"), None):
            pass
        secs.append(time.time() - t0)
        test = fold_data(blocks.ds, text, b, image.astype(np.float32), "test")
        res = m.evaluate(test)
        r_i.append(res["ranks"]["i2t"])
        r_t.append(res["ranks"]["t2i"])
        ci.append(np.asarray(test.caption_image) + offset)
        offset += len(b)
    return {"i2t": np.concatenate(r_i), "t2i": np.concatenate(r_t)}, np.concatenate(ci), float(np.sum(secs))


def rsum(ranks) -> float:
    from crossview.eval.metrics import rank_metrics, rsum_of

    return float(rsum_of(rank_metrics(ranks["i2t"]), rank_metrics(ranks["t2i"])))


def kept_parts(path: Path, methods: list[str]) -> tuple[dict[str, list[str]], list[tuple[str, str]], list[str]]:
    """From results file ``path`` (as this script writes it): its header, the ``## method`` sections of the methods
    *not* in ``methods`` and their val rows, ``[(method, section text)]`` and ``[val row]`` in the file's order."""
    header, body = _stamp.parse_header(path.read_text(encoding="utf-8"), path)
    sections, rows = [], []
    for part in body.split("\n## ")[1:]:
        title = part.split("\n", 1)[0].strip()
        if ("## " + title).startswith(VAL_HEADING):
            rows = [ln for ln in part.splitlines() if ln.startswith("| ") and ln.split("|")[1].strip() not in
                    ("method", *methods) and not ln.startswith("|---")]
        elif title not in methods:
            text = "## " + part.rstrip("\n") + "\n"
            if PROVENANCE not in text:       # made before sections said where they came from: the file's stamp
                text += "\n" + provenance(", ".join(header.get("commit", ["?"])), ", ".join(header.get("date", ["?"])),
                                          " ; ".join(header.get("command", ["?"])))
            sections.append((title, text))
    return header or {}, sections, rows


PROVENANCE = "_This section: commit"


def default_now(method: str, image_enc: str, text_enc: str) -> str:
    """What the method's defaults are at this commit, beside the CV choice: the same pipeline, or another one chosen
    by a later comparison (this file scores under plain dot products; a method that ranks by another scoring may be
    better served by other features under it: bench/text_encoder_cv.py)."""
    from crossview.methods import method_class

    cls = method_class(method)
    now = (cls.default_image_encoder, cls.default_text_encoder)
    if now == (image_enc, text_enc):
        return f"Default now: this choice ({now[0]}, {now[1]})."
    return (f"Default now: {now[0]}, {now[1]}, not this choice: chosen by a later comparison that its card names "
            "(this file scores under plain dot products, one change at a time).")


def provenance(commit: str, date: str, command: str) -> str:
    """The line that ends each method's section: what made it, so a merged file says it per section."""
    return f"{PROVENANCE} {commit}, {date}, `{command}`._\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="cca,bitr")
    ap.add_argument("--configs", choices=["auto", "all", "three"], default="auto",
                    help="the configurations scored: 'all' (six and the best pair), 'three' (plain, concat+flip, "
                         "concat+flip & minilm+glove) or 'auto' (all for cca and bitr, three for the deep methods)")
    ap.add_argument("--data", default=str(SAMPLE))
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--out", default="-", metavar="FILE",
                    help="also write the tables here, stamped with the command, commit, machine and data (default "
                         "'-': print only)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the sections and val rows of the methods not named from the --out file as it is when "
                         "this run ends (so runs of different methods may go on side by side)")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"rich_features: no dataset at {args.data}; pass --data with the Flickr8k sample's JSON", file=sys.stderr)
        return 2
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    from crossview.methods import list_methods

    unknown = [m for m in methods if m not in list_methods()]
    if unknown:
        print(f"rich_features: unknown method {unknown[0]!r} in --methods; known: {', '.join(list_methods())}",
              file=sys.stderr)
        return 2
    if args.merge and (args.out == "-" or not Path(args.out).is_file()):
        print(f"rich_features: --merge needs an --out file already there to keep sections from, got {args.out!r}",
              file=sys.stderr)
        return 2
    commit = _stamp.commit_info()          # the code that runs: a commit made while it runs is not it
    intro, sections, val_rows = run(args, methods, commit)
    if args.out == "-":
        return 0
    notes: list[str] = []
    if _stamp.commit_info().split(" ")[0] != commit.split(" ")[0]:
        notes.append(f"the tree changed while this ran (at the end: {_stamp.commit_info()})")
    kept_sections, kept_rows = [], []
    if args.merge:          # read now, not at the start: another method's run may have written it meanwhile
        _, kept_sections, kept_rows = kept_parts(Path(args.out), methods)
        if kept_sections:
            notes.append(f"--merge: the sections of {', '.join(t for t, _ in kept_sections)} (and their val rows) "
                         "were kept from the file already there; each section's last line says which commit and "
                         "command made it (the machine line is this command's)")
    title = ("# Richer frozen features per method: flip averaging, two backbones, combined captions (3-fold CV on the "
             "Flickr8k sample's training photos, then val once)\n\n")
    body = title + intro + "\n" + "".join(text + "\n" for _, text in [*kept_sections, *sections]) + val_table(
        [*kept_rows, *val_rows])
    header = _stamp.format_header(args.out, commands=[_stamp.command_line()], commit=commit,
                                  data=[_stamp.dataset_fingerprint(args.data)], notes=notes)
    path = _stamp.atomic_write_bytes(Path(args.out), (header + body.rstrip("\n") + "\n").encode("utf-8"))
    print(f"wrote {_stamp.display_path(path)}", file=sys.stderr)
    return 0


def val_table(rows: list[str]) -> str:
    """The val section: a heading, what it is, and one row per method."""
    return (f"{VAL_HEADING}: each method trained on the 600 training photos, scored on the 100 val photos\n\n"
            "The configuration was chosen by CV above, never on val; plain is shown beside it for reference.\n\n"
            "| method | CV choice | val rsum plain | val rsum CV choice | 95% CI (choice) | Δ | Δ 95% CI |\n"
            "|---|---|---|---|---|---|---|\n" + "".join(r + "\n" for r in rows))


def run(args: argparse.Namespace, methods: list[str], commit: str) -> tuple[str, list[tuple[str, str]], list[str]]:
    """Score ``methods``: the intro paragraph, ``[(method, its section)]`` and the val rows (each printed as it
    comes)."""
    from sklearn.model_selection import KFold

    from crossview.data import load_dataset
    from crossview.eval.bootstrap import bootstrap_ci
    from crossview.eval.paired import paired_effect

    ds = load_dataset(args.data)
    train, val = np.asarray(ds.splits["train"]), np.asarray(ds.splits["val"])
    folds = [(train[a], train[b]) for a, b in KFold(args.folds, shuffle=True, random_state=0).split(train)]
    blocks = Blocks(ds)
    intro = (f"Data: {ds.name}, {len(train)} train photos in {args.folds} folds (train on {len(folds[0][0])}, rank the "
             f"other {len(folds[0][1])} and their captions), {len(val)} val photos kept for the end. Default "
             "parameters and feature normalisation of each method; seed 0. rsum = R@1+5+10 both ways over the pooled "
             "held-out queries of the folds; CI: 95% bootstrap over images (with their captions); Δ: paired "
             "difference from plain on the same queries. plain = EfficientNet-Lite0 images, MiniLM captions (every "
             "method's default before this bench). Configurations: the six single changes and the best pair for the "
             "linear methods; three fixed up front for the deep methods (plain, concat+flip, concat+flip & "
             "minilm+glove; no caption variant where the method reads the captions itself).\n")
    print(intro, flush=True)
    sections: list[tuple[str, str]] = []
    chosen = {}
    for method in methods:
        lines = [f"## {method}\n",
                 "| config | image encoder | text encoder | CV rsum | 95% CI | Δ vs plain | Δ 95% CI | train s (3 folds) |",
                 "|---|---|---|---|---|---|---|---|"]
        print("\n".join(lines), flush=True)
        rows, kept_ranks, base = {}, {}, None
        first = configs_for(method, args.configs)
        configs = list(first)
        k = 0
        while k < len(configs):
            label, ie, te = configs[k]
            k += 1
            ranks, ci, secs = score(method, blocks, ie, te, folds)
            rs = rsum(ranks)
            lo, hi = bootstrap_ci(ranks["i2t"], ranks["t2i"], ci, resamples=args.resamples)["rsum"]
            if base is None:
                base = ranks
                d, dci = 0.0, (0.0, 0.0)
            else:
                eff = paired_effect(base, ranks, ci, resamples=args.resamples)["rsum"]
                d, dci = eff["diff"], eff["ci"]
            rows[label] = (rs, d, dci, ie, te)
            kept_ranks[label] = (ranks, ci)
            lines.append(f"| {label} | {ie} | {te} | {rs:.1f} | {lo:.1f}-{hi:.1f} | {d:+.1f} | {dci[0]:+.1f} to "
                         f"{dci[1]:+.1f} | {secs:.0f} |")
            print(lines[-1], flush=True)
            if k == len(first) and first == CONFIGS:   # the best image and text pipelines together, both beat plain
                best_i = max((r for r in rows if rows[r][4] == PLAIN_TEXT), key=lambda r: rows[r][0])
                best_t = max((r for r in rows if rows[r][3] == PLAIN_IMAGE), key=lambda r: rows[r][0])
                if best_i != "plain" and best_t != "plain":
                    configs.append((f"{best_i} & {best_t}", rows[best_i][3], rows[best_t][4]))
        best = max(rows, key=lambda r: rows[r][0])
        rs, d, dci, ie, te = rows[best]
        if best == "plain":
            verdict = "today's default."
        else:
            # the best of several variants: its interval widened for the number of comparisons (Bonferroni)
            level = 1 - 0.05 / (len(rows) - 1)
            adj = paired_effect(base, kept_ranks[best][0], kept_ranks[best][1], resamples=max(args.resamples, 4000),
                                level=level)["rsum"]["ci"]
            verdict = (f"its interval widened for the {len(rows) - 1} variant{'s' * (len(rows) > 2)} compared "
                       f"({100 * level:.1f}%: {adj[0]:+.1f} to {adj[1]:+.1f}) " +
                       ("lies above 0: better than plain." if adj[0] > 0 else
                        "includes 0: not shown better than plain."))
        chosen[method] = (best, ie, te)
        lines.append(f"\nCV choice for {method}: **{best}** (CV rsum {rs:.1f}, Δ {d:+.1f}, 95% CI {dci[0]:+.1f} to "
                     f"{dci[1]:+.1f}); " + verdict + " " + default_now(method, ie, te) + "\n")
        lines.append(provenance(commit, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                _stamp.command_line()))
        print("\n".join(lines[-2:]), flush=True)
        sections.append((method, "\n".join(lines)))

    val_rows = []
    for method in methods:
        best, ie, te = chosen[method]
        base, ci, _ = score(method, blocks, PLAIN_IMAGE, PLAIN_TEXT, [(train, val)])
        if best == "plain":
            lo, hi = bootstrap_ci(base["i2t"], base["t2i"], ci, resamples=args.resamples)["rsum"]
            val_rows.append(f"| {method} | plain | {rsum(base):.1f} | {rsum(base):.1f} | {lo:.1f}-{hi:.1f} | +0.0 | - |")
        else:
            ranks, ci, _ = score(method, blocks, ie, te, [(train, val)])
            lo, hi = bootstrap_ci(ranks["i2t"], ranks["t2i"], ci, resamples=args.resamples)["rsum"]
            eff = paired_effect(base, ranks, ci, resamples=args.resamples)["rsum"]
            val_rows.append(f"| {method} | {best} ({ie}, {te}) | {rsum(base):.1f} | {rsum(ranks):.1f} | "
                            f"{lo:.1f}-{hi:.1f} | {eff['diff']:+.1f} | {eff['ci'][0]:+.1f} to {eff['ci'][1]:+.1f} |")
        print(val_rows[-1], flush=True)
    return intro, sections, val_rows


if __name__ == "__main__":
    raise SystemExit(main())
