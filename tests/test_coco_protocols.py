"""COCO 5K / 1K at size (issue 34): ``crossview eval --protocol coco1k`` one fold at a time (plain and under a
hubness-aware scoring), checked against a full-matrix computation by argsort; and the coco5k size check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crossview.cli import main
from crossview.core.errors import CrossViewError
from crossview.eval.embeddings import Embeddings, evaluate_embeddings, save_embeddings
from crossview.eval.scoring import evaluate_scoring

N_IMAGES, PER, DIM = 2000, 2, 6          # two COCO 1K folds


def _emb(rng: np.random.Generator, n: int = N_IMAGES, per: int = PER, two: bool = False) -> Embeddings:
    """Embeddings with some signal (a caption is its image plus noise), rounded so that ties occur."""
    img = rng.standard_normal((n, DIM)).astype(np.float32)
    ci = np.repeat(np.arange(n, dtype=np.int64), per)
    txt = np.round(img[ci] + rng.standard_normal((ci.size, DIM)).astype(np.float32), 1)
    img = np.round(img, 1)
    extra = {}
    if two:
        extra = {"image_t2i": np.round(rng.standard_normal((n, 3)), 1).astype(np.float32),
                 "text_t2i": np.round(rng.standard_normal((ci.size, 3)), 1).astype(np.float32)}
    return Embeddings(image=img, text=txt, caption_image=ci, **extra)


def _ranks_by_argsort(s: np.ndarray, ci: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """1-based ranks from a stable sort of the whole matrix (ties: the smaller index first)."""
    order = np.argsort(-s, axis=1, kind="stable")                    # images x captions
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(s.shape[1])[None, :], axis=1)
    i2t = np.full(s.shape[0], s.shape[1], np.int64)
    np.minimum.at(i2t, ci, pos[ci, np.arange(ci.size)])
    i2t += 1
    order_t = np.argsort(-s.T, axis=1, kind="stable")                # captions x images
    t2i = np.argmax(order_t == ci[:, None], axis=1) + 1
    return i2t, t2i


def _metrics(r: np.ndarray) -> dict[str, float]:
    return {**{f"R@{k}": 100.0 * np.mean(r <= k) for k in (1, 5, 10)}, "MedR": float(np.median(r)),
            "MeanR": float(np.mean(r))}


def _fold_means(score_fold, emb: Embeddings) -> dict[str, dict[str, float]]:
    """The mean over 1,000-image folds of the metrics of ``score_fold(fold embeddings) -> (i2t s, t2i s)``."""
    per = {"i2t": [], "t2i": []}
    for lo in range(0, emb.image.shape[0], 1000):
        caps = (emb.caption_image >= lo) & (emb.caption_image < lo + 1000)
        sub = Embeddings(image=emb.image[lo:lo + 1000], text=emb.text[caps], caption_image=emb.caption_image[caps] - lo,
                         image_t2i=None if emb.image_t2i is None else emb.image_t2i[lo:lo + 1000],
                         text_t2i=None if emb.text_t2i is None else emb.text_t2i[caps])
        s_i2t, s_t2i = score_fold(sub)
        per["i2t"].append(_metrics(_ranks_by_argsort(s_i2t, sub.caption_image)[0]))
        per["t2i"].append(_metrics(_ranks_by_argsort(s_t2i, sub.caption_image)[1]))
    return {d: {k: float(np.mean([m[k] for m in ms])) for k in ms[0]} for d, ms in per.items()}


def _assert_metrics(res: dict, expect: dict) -> None:
    for d in ("i2t", "t2i"):
        for k, v in expect[d].items():
            assert res[d][k] == pytest.approx(v, abs=1e-9), (d, k)
    assert res["rsum"] == pytest.approx(sum(expect[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10)))


@pytest.mark.parametrize("two", [False, True])
def test_coco1k_of_two_folds_matches_the_full_fold_matrices(two: bool) -> None:
    emb = _emb(np.random.default_rng(1), two=two)

    def plain(sub: Embeddings):
        s = sub.image @ sub.text.T
        return s, (s if sub.image_t2i is None else sub.image_t2i @ sub.text_t2i.T)

    res = evaluate_embeddings(emb, "coco1k")
    _assert_metrics(res, _fold_means(plain, emb))
    assert len(res["folds"]) == 2 and res["protocol"] == "coco1k"
    assert res["i2t"]["R@1"] > 5                   # the set has signal: a wrong fold split would show


def _csls(q: np.ndarray, g: np.ndarray, bank_q: np.ndarray, bank_g: np.ndarray, k: int) -> np.ndarray:
    """CSLS written out on whole matrices: 2 s - r_Q - r_G (eval/scoring.py's definition)."""
    top = lambda m: np.sort(m, axis=1)[:, -k:].mean(axis=1)       # noqa: E731
    q, g, bank_q, bank_g = (np.asarray(a, np.float64) for a in (q, g, bank_q, bank_g))
    return 2 * q @ g.T - top(q @ bank_g.T)[:, None] - top(g @ bank_q.T)[None, :]


def test_coco1k_under_csls_matches_the_scored_full_fold_matrices() -> None:
    rng = np.random.default_rng(2)
    emb, bank = _emb(rng), _emb(rng, n=300)
    k = 3

    def scored(sub: Embeddings):
        s_i2t = _csls(sub.image, sub.text, bank.image, bank.text, k)
        s_t2i = _csls(sub.text, sub.image, bank.text, bank.image, k).T
        return s_i2t, s_t2i

    expect = _fold_means(scored, emb)
    for block in (1024, 333):                       # block by block: the block size does not change a rank
        res = evaluate_scoring(emb, bank, "csls", k, protocol="coco1k", block_size=block)
        _assert_metrics(res, expect)
    assert res["scoring"] == "csls" and res["param"] == 3 and "ranks" not in res and len(res["folds"]) == 2
    plain = evaluate_embeddings(emb, "coco1k")
    assert res["rsum"] != pytest.approx(plain["rsum"])        # the scoring did re-score


def test_coco_sizes_are_checked_with_one_clear_line(tmp_path: Path, capsys) -> None:
    emb = _emb(np.random.default_rng(3))
    with pytest.raises(CrossViewError, match=r"COCO 5K needs the 5,000-image test split, got 2,000 images"):
        evaluate_embeddings(emb, "coco5k")
    small = _emb(np.random.default_rng(3), n=1500, per=1)
    with pytest.raises(CrossViewError, match=r"COCO 1K needs a multiple of 1,000 test images, got 1,500"):
        evaluate_embeddings(small, "coco1k")
    with pytest.raises(CrossViewError, match="COCO 5K"):
        evaluate_scoring(emb, emb, "csls", 3, protocol="coco5k")
    path = save_embeddings(tmp_path / "emb.npz", emb)
    assert main(["eval", str(path), "--protocol", "coco5k"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("crossview: error: COCO 5K needs the 5,000-image test split, got 2,000 images; use "
                          "--protocol standard") and err.count("\n") == 1


def test_coco5k_on_5000_images_is_the_standard_protocol() -> None:
    emb = _emb(np.random.default_rng(4), n=5000, per=1)
    a, b = evaluate_embeddings(emb, "coco5k"), evaluate_embeddings(emb, "standard")
    assert a["i2t"] == b["i2t"] and a["t2i"] == b["t2i"] and a["protocol"] == "coco5k"


def test_eval_cli_runs_coco1k_under_a_scoring(tmp_path: Path, capsys) -> None:
    """``crossview eval RUN --protocol coco1k --scoring csls``: a run folder with its embeddings and bank (no model
    needed with --param); the choice is not recorded as the split's whole-split result."""
    rng = np.random.default_rng(5)
    emb, bank = _emb(rng), _emb(rng, n=300)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"method": "cca", "split": "test", "train_split": "train",
                                                 "seed": 0}))
    save_embeddings(run / "embeddings_test.npz", emb)
    save_embeddings(run / "bank_train.npz", bank)
    assert main(["eval", str(run), "--protocol", "coco1k", "--scoring", "csls", "--param", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    ref = evaluate_scoring(emb, bank, "csls", 3, protocol="coco1k")
    assert got["protocol"] == "coco1k" and got["rsum"] == pytest.approx(ref["rsum"])
    assert got["scoring"]["param"] == 3 and got["scoring"]["reported_on"] == "test"
    assert not (run / "scoring.json").exists()
    assert main(["eval", str(run), "--protocol", "coco1k", "--scoring", "csls", "--param", "3",
                 "--ranks-out", str(tmp_path / "r.npz")]) == 2
    assert "gives no per-query ranks" in capsys.readouterr().err
