"""The fit stage alone (crossview.engine.fit_stage): it drives a method's ``fit_iter`` as a naive loop would,
checkpoints on the run settings' cadence and after each validation, and evaluates into the run folder's files
with the numbers a hand-written rank loop gives."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from _engine_helpers import make_toy_dataset, toy_features
from crossview.core.events import CheckpointSaved, Loss, Progress, Validation
from crossview.core.run_settings import RunSettings
from crossview.data.method_data import MethodData
from crossview.engine.fit_stage import FitStage
from crossview.features import Features
from crossview.methods import create_method


def _method():
    m = create_method("toy_iterative", epochs=3, batch_size=32)
    m.configure_run(RunSettings(device="cpu", seed=0))
    return m


@pytest.fixture(scope="module")
def toy():
    ds = make_toy_dataset(n_images=80)
    image, text = toy_features(ds)
    data = {s: MethodData.from_features(ds, image, text, s) for s in ("train", "val", "test")}
    return ds, Features(image=image, text=text, image_encoder="given", text_encoder="given"), data


def _stage(ds, method, run_dir, checkpoint_seconds):
    cfg = SimpleNamespace(method="toy_iterative", split="test", seed=0, data=None, train_split="train",
                          val_split="val", selection=None)
    settings = RunSettings(device="cpu", seed=0, checkpoint_seconds=checkpoint_seconds)
    logged, ckpts = [], []
    stage = FitStage(cfg, method, ds, settings, run_dir, emit=lambda ev: logged.append(ev) or ev,
                     checkpoint=lambda: ckpts.append(stage.events) or CheckpointSaved("ckpt", stage.events))
    return stage, logged, ckpts


def _drain(gen):
    events = []
    while True:
        try:
            events.append(next(gen))
        except StopIteration as end:
            return events, end.value


def test_fit_drives_fit_iter_like_a_naive_loop_and_checkpoints_after_each_validation(toy, tmp_path):
    ds, _features, data = toy
    ref = _method()
    ref_events = list(ref.fit_iter(data["train"], data["val"]))          # the naive loop
    stage, logged, ckpts = _stage(ds, _method(), tmp_path, checkpoint_seconds=1e9)
    events, _ = _drain(stage.fit(data["train"], data["val"], resume=False))
    assert logged == events                                              # every event went through the logger
    fit_events = [e for e in events if not isinstance(e, CheckpointSaved)]
    assert [type(e) for e in fit_events] == [type(e) for e in ref_events]
    assert [getattr(e, "terms", None) for e in fit_events] == [getattr(e, "terms", None) for e in ref_events]
    assert all(e.stage == "fit" for e in fit_events if isinstance(e, Progress))   # the plan's stage
    np.testing.assert_array_equal(stage.method.W_, ref.W_)
    assert stage.events == len(ref_events)
    assert stage.step == [e.step for e in ref_events if isinstance(e, (Loss, Progress))][-1]
    # the cadence is never due here: one checkpoint after each validation, at that validation's event count
    assert ckpts == [i + 1 for i, e in enumerate(ref_events) if isinstance(e, Validation)] and len(ckpts) == 3
    assert [e.step for e in events if isinstance(e, CheckpointSaved)] == ckpts
    assert stage.train_seconds > 0


def test_fit_checkpoints_on_the_cadence_and_counts_over_a_resume(toy, tmp_path):
    ds, _features, data = toy
    stage, _logged, ckpts = _stage(ds, _method(), tmp_path, checkpoint_seconds=0.0)
    events, _ = _drain(stage.fit(data["train"], data["val"], resume=False))
    n = sum(not isinstance(e, CheckpointSaved) for e in events)
    assert ckpts == list(range(1, n + 1))           # due after every event; a validation adds no second one
    # stopped after its first batch's two events (loss, progress), then resumed on the same method: the counts
    # carry over and the weights end as the uninterrupted fit's
    again, _logged, _ = _stage(ds, _method(), tmp_path, checkpoint_seconds=1e9)
    gen = again.fit(data["train"], data["val"], resume=False)
    next(gen), next(gen)
    gen.close()
    assert again.events == 2 and again.train_seconds > 0
    seconds = again.train_seconds
    _drain(again.fit(data["train"], data["val"], resume=True))
    assert again.events == n and again.train_seconds >= seconds
    np.testing.assert_array_equal(again.method.W_, stage.method.W_)


def _naive_ranks(scores, caption_image):
    """1-based ranks by a plain loop: i2t the best gold caption of each image, t2i each caption's image."""
    n_images, n_captions = scores.shape
    i2t = np.array([min(1 + int((scores[i] > scores[i, c]).sum()) for c in range(n_captions)
                        if caption_image[c] == i) for i in range(n_images)])
    t2i = np.array([1 + int((scores[:, c] > scores[caption_image[c], c]).sum()) for c in range(n_captions)])
    return i2t, t2i


def test_evaluate_writes_the_run_files_with_the_hand_computed_numbers(toy, tmp_path):
    from crossview.engine.run_folder import RANKS, read_summary

    ds, features, data = toy
    stage, _logged, _ = _stage(ds, _method(), tmp_path, checkpoint_seconds=1e9)
    _drain(stage.fit(data["train"], data["val"], resume=False))
    events, summary = _drain(stage.evaluate(data["test"], features, features_seconds=1.5))
    # each part of the evaluation is a progress event of the stage, labelled with it, rising to the end
    assert {e.stage for e in events} == {"evaluate"} and {e.total for e in events} == {1000}
    steps = [e.step for e in events]
    assert steps[0] == 0 and steps[-1] == 1000 and steps == sorted(steps) and len(set(steps)) == len(steps)
    assert [e.message for e in events] == ["evaluating on test: ranking", "evaluating on test: writing the embeddings",
                                           "evaluating on test: intervals and hubness", "evaluating on test"]
    test = data["test"]
    scores = stage.method.encode_images(test) @ stage.method.encode_texts(test).T
    i2t, t2i = _naive_ranks(scores, test.caption_image)
    ranks = np.load(tmp_path / RANKS)
    np.testing.assert_array_equal(ranks["i2t"], i2t)
    np.testing.assert_array_equal(ranks["t2i"], t2i)
    for direction, r in (("i2t", i2t), ("t2i", t2i)):
        for k in (1, 5, 10):
            assert summary[direction][f"R@{k}"] == pytest.approx(100.0 * (r <= k).mean())
        assert summary[direction]["MedR"] == pytest.approx(float(np.median(r)))
    assert summary["rsum"] == pytest.approx(sum(100.0 * (r <= k).mean() for r in (i2t, t2i) for k in (1, 5, 10)))
    assert summary["features_seconds"] == 1.5 and summary["train_seconds"] == round(stage.train_seconds, 3)
    assert summary["split"] == "test" and summary["image_encoder"] == "given" and summary["status"] == "finished"
    assert read_summary(tmp_path) == summary
    assert (tmp_path / "embeddings_test.npz").is_file()


def test_a_scored_evaluation_reports_its_parts_and_the_scores_as_they_go(toy, tmp_path, monkeypatch):
    """At COCO size the part of an evaluation after the ranking (the embeddings, the bank, the hubness figure and
    csls's products) was minutes under one ``0 / 1`` line. Each part is now an event of the stage, and the csls
    re-scoring reports its products block by block; the numbers are those of the scoring module."""
    import crossview.eval.scoring as S
    from crossview.engine.run_folder import read_summary
    from crossview.eval.embeddings import load_embeddings

    ds, features, data = toy
    stage, _logged, _ = _stage(ds, _method(), tmp_path, checkpoint_seconds=1e9)
    stage.cfg.scoring = {"scoring": "csls", "param_name": "k", "param": 3, "selected_on": "given"}
    _drain(stage.fit(data["train"], data["val"], resume=False))
    monkeypatch.setattr(S, "BLOCK_ELEMENTS", 200)            # small blocks: several progress events of the scores
    events, summary = _drain(stage.evaluate(data["test"], features, features_seconds=1.5, train=data["train"]))
    progress = [e for e in events if isinstance(e, Progress)]
    steps = [e.step for e in progress]
    assert steps[0] == 0 and steps[-1] == 1000 and steps == sorted(steps)
    parts = list(dict.fromkeys(e.message for e in progress))
    assert parts == ["evaluating on test: ranking", "evaluating on test: writing the embeddings",
                     "evaluating on test: the training bank", "evaluating on test: intervals and hubness",
                     "evaluating on test: csls scores against the bank", "evaluating on test"]
    scores = [e.step for e in progress if e.message.endswith("against the bank")]
    assert len(scores) > 5 and len(set(scores)) == len(scores)
    emb = load_embeddings(tmp_path / "embeddings_test.npz")
    bank = load_embeddings(tmp_path / "bank_train.npz")
    expected = S.evaluate_scoring(emb, bank, "csls", 3)
    assert read_summary(tmp_path)["rsum"] == pytest.approx(expected["rsum"]) == summary["rsum"]
