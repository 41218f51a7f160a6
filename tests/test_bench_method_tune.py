"""bench/method_tune.py at several seeds (``--seeds``): every trial's fold and each val run trained once per seed
(``trial-NNN-fK-sS``, ``val-NAME-sS``), the paired effects computed on each query's rank averaged over the seeds
(the folds' held-out queries pooled per seed, then stacked), and a folder of one seed laid out as before. CCA on a
toy precomp folder (deterministic: the seeds' runs agree, which the test uses), the pooling on hand-made ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from _engine_helpers import make_toy_dataset, write_toy_precomp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import method_tune as MT  # noqa: E402


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("method_tune") / "toy_precomp"
    write_toy_precomp(data, make_toy_dataset(100), (("train", "train"), ("dev", "val")))
    return data


def _default_reg() -> float:
    """CCA's default reg (the first stage must hold the defaults)."""
    from crossview.methods import method_class

    return method_class("cca").default_params()["reg"]


def _write_ranks(folder: Path, i2t, t2i, caption_image) -> str:
    folder.mkdir(parents=True)
    np.savez(folder / "ranks.npz", i2t=np.asarray(i2t), t2i=np.asarray(t2i), caption_image=np.asarray(caption_image))
    return str(folder)


def test_folds_are_pooled_per_seed_and_the_seeds_stacked(tmp_path) -> None:
    """runs[part][seed]: each seed's folds side by side (captions' images offset by the images before them)."""
    runs = [[_write_ranks(tmp_path / f"f{p}-s{s}", [1 + s, 2 + p], [3, 1 + s, 2], [0, 0, 1]) for s in (0, 1)]
            for p in (0, 1)]
    ranks, caps = MT._pooled_seeds(runs)
    assert ranks["i2t"].tolist() == [[1, 2, 1, 3], [2, 2, 2, 3]]
    assert ranks["t2i"].tolist() == [[3, 1, 2, 3, 1, 2], [3, 2, 2, 3, 2, 2]]
    assert caps.tolist() == [0, 0, 1, 2, 2, 3]


def test_several_seeds_train_each_run_per_seed_and_report_the_mean(toy, tmp_path, capsys) -> None:
    work = tmp_path / "w"
    out = tmp_path / "out.md"
    # reg 1 beats the default on the toy folds (453.3 against 425.8 at seed 0): a point other than the defaults is
    # chosen, so both paired comparisons are made
    assert MT.main(["--method", "cca", "--data", str(toy), "--stage", f"reg={_default_reg()},1", "--seeds", "0,1",
                    "--work", str(work), "--out", str(out)]) == 0
    names = sorted(p.name for p in (work / "stage1").iterdir() if p.is_dir())
    assert names == [f"trial-00{t}-f{f}-s{s}" for t in (1, 2) for f in (1, 2, 3) for s in (0, 1)]
    text = out.read_text()
    assert "trained at seeds 0, 1" in text and "each query's rank averaged over the 2 seeds first" in text
    assert "chosen minus defaults on val" in text.lower()
    assert any(p.name.startswith("val-chosen-") and p.name.endswith("-s1") for p in work.iterdir())
    assert (work / "val-defaults-s0").is_dir() and (work / "val-defaults-s1").is_dir()
    row = next(line for line in text.splitlines() if line.startswith("| defaults | (none)"))
    per_seed = row.split(" | ")[5].split(" / ")
    assert len(per_seed) == 2 and per_seed[0] == per_seed[1]          # CCA: the seeds agree
    assert row.split(" | ")[4] == per_seed[0]                          # the mean over them


def test_one_seed_keeps_the_old_layout(toy, tmp_path) -> None:
    work = tmp_path / "w"
    assert MT.main(["--method", "cca", "--data", str(toy), "--stage", f"reg={_default_reg()},5000", "--work", str(work),
                    "--out", str(tmp_path / "out.md")]) == 0
    assert (work / "stage1" / "trial-001-f1").is_dir() and (work / "val-defaults").is_dir()
    assert "seed 0 everywhere" in (tmp_path / "out.md").read_text()


def test_bad_seeds_are_refused_in_one_line(toy, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        MT.main(["--method", "cca", "--data", str(toy), "--stage", "reg=5", "--seeds", "0,x"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "seed 'x' is not a whole number" in err


def _trial(tmp_path: Path, name: str, score: float, point: dict, i2t: list[int], t2i: list[int]) -> dict:
    """A one-fold, one-seed trial whose held-out ranks are ``i2t`` (one per image) and ``t2i`` (two captions each)."""
    caps = np.repeat(np.arange(len(i2t)), 2)
    return {"point": point, "score": score, "runs": [[_write_ranks(tmp_path / name, i2t, t2i, caps)]]}


def test_a_later_stage_moves_the_point_only_on_evidence(tmp_path) -> None:
    """Stage 1's best is taken as it is; a later stage's best replaces it only when it scores higher and its paired
    interval over it lies above 0: a higher score within the noise, or a lower one, keeps the point so far."""
    n = 60
    rng = np.random.default_rng(0)
    base_i2t, base_t2i = rng.integers(5, 40, n), rng.integers(5, 40, 2 * n)
    current = _trial(tmp_path, "cur", 300.0, {"reg": 5.0, "n": 256}, base_i2t, base_t2i)
    first, note = MT._incumbent(None, current, {})
    assert first is current and note == ""
    lower = _trial(tmp_path, "low", 290.0, {"reg": 5.0, "n": 128}, base_i2t + 1, base_t2i + 1)
    kept, note = MT._incumbent(current, lower, {})
    assert kept is current and "n=128" in note and "does not beat it" in note
    noisy_i2t = base_i2t.copy()
    noisy_i2t[:2] = 1                       # two queries better, nothing else: a gain inside the noise
    noisy = _trial(tmp_path, "noisy", 300.5, {"reg": 5.0, "n": 512}, noisy_i2t, base_t2i)
    kept, note = MT._incumbent(current, noisy, {})
    assert kept is current and "n=512" in note and "within the noise" in note
    better = _trial(tmp_path, "better", 330.0, {"reg": 12.0, "n": 256}, np.ones(n, int), np.ones(2 * n, int))
    taken, note = MT._incumbent(current, better, {})
    assert taken is better and note.endswith(": taken") and "reg=12.0" in note and "n=" not in note


def test_the_chosen_points_val_run_is_named_by_its_point(tmp_path) -> None:
    """A work folder continued with another chosen point trains a new val run, never reads the old point's back."""
    a = MT._val_folder("chosen", {"reg": 12.0, "n_components": 512})
    assert a == MT._val_folder("chosen", {"n_components": 512, "reg": 12.0}) and a.startswith("val-chosen-")
    assert a != MT._val_folder("chosen", {"reg": 12.0}) and MT._val_folder("defaults", {}) == "val-defaults"


def test_when_the_search_keeps_the_defaults_it_compares_nothing(toy, tmp_path) -> None:
    """A search whose point is the defaults printed the defaults against themselves (+0.0, interval +0.0 to +0.0,
    detectable 0.0); it now says there is nothing to compare, and val shows the defaults alone."""
    from crossview.methods import method_class

    reg = method_class("cca").default_params()["reg"]
    out = tmp_path / "out.md"
    assert MT.main(["--method", "cca", "--data", str(toy), "--stage", f"reg={reg}", "--work", str(tmp_path / "w"),
                    "--out", str(out)]) == 0
    text = out.read_text()
    assert "The search chose the defaults: no other point beat them" in text
    assert "Chosen minus defaults" not in text and "| chosen |" not in text and "| defaults | (none)" in text
