"""CUDA graphs in the shared trainer (issue 32 item 2): each batch shape's step captured once and replayed.

On the CPU: what decides the shapes (the caption width buckets, the key a method gives, the padding a one-way GRU
never reads), the optimiser state handed between a capturing and a non-capturing run, and the reasons given when
steps are not captured. On a GPU (skipped elsewhere): a run whose steps are replayed from graphs ends with the weights
an eager run ends with, for VSE++ (GRU and feature captions), SmoothAP (B images x all their captions) and a
learning-rate change (the graphs are captured again), and a resumed captured run continues as an uninterrupted one."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import _engine_helpers as H
from crossview.core.events import Log
from crossview.data.method_data import MethodData
from crossview.methods import create_method
from crossview.nn.encoders import GRUTextEncoder
from crossview.nn.trainer import GRAPH_WARMUP, EpochSampler, Trainer

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA GPU")
FAST = {"embed_dim": 32, "word_dim": 16, "batch_size": 32, "max_epochs": 3, "lr": 0.003, "lr_decay_epoch": 2}


def _toy(split: str = "train") -> MethodData:
    ds = H.make_toy_dataset()
    img, txt = H.toy_features(ds)
    return MethodData.from_features(ds, img, txt, split)


# ---------------------------------------------------------------------------- on the CPU
def test_a_one_way_gru_state_does_not_read_the_padding_a_width_bucket_adds() -> None:
    """The width buckets pad a batch beyond its longest caption: the state at each caption's last real token is
    the same whatever comes after it (what lets a captured graph run a few fixed widths unpacked)."""
    torch.manual_seed(0)
    enc = GRUTextEncoder(50, word_dim=8, embed_dim=12, num_layers=2)
    lengths = torch.tensor([3, 7, 1, 5])
    ids = torch.zeros(4, 7, dtype=torch.int64)
    for i, n in enumerate(lengths.tolist()):
        ids[i, :n] = torch.randint(1, 50, (n,))
    wide = torch.cat([ids, torch.randint(1, 50, (4, 5))], 1)     # junk after the real tokens, even non-pad ids
    for i, n in enumerate(lengths.tolist()):
        wide[i, n:7] = 0
    a = enc(ids, lengths)
    b = enc(wide, lengths)
    assert torch.allclose(a, b, atol=1e-6)


def test_the_width_of_a_captured_batch_is_its_longest_caption_rounded_to_the_bucket() -> None:
    m = create_method("vsepp", text_model="gru", **FAST).with_run(device="cpu", seed=0)
    m.model_spec_ = {"text_model": "gru"}
    t = {"ids": torch.zeros(3, 30, dtype=torch.int64)}
    widths = np.array([5, 9, 2])
    assert m._batch_width(t, widths) == 9                        # eager: the longest
    m._graphing = True
    assert m._batch_width(t, widths) == 12                       # captured: up to a multiple of 4
    assert m._batch_width(t, np.array([29])) == 30               # never past the padded tensor
    assert m._batch_width(t, np.array([], dtype=np.int64)) == 4  # an empty batch reads one (pad) token


def test_the_graph_key_of_vsepp_is_the_batch_width_bucket_and_end_to_end_images_say_why_not() -> None:
    data = _toy()
    m = create_method("vsepp", text_model="gru", **FAST).with_run(device="cpu", seed=0)
    m.model_spec_ = m.model_spec(data, False)
    m.prepare(data, torch.device("cpu"))
    key, why = m.graph_key()
    assert why == "" and key is not None
    host = np.arange(32)
    longest = int(m._t["width_np"][host].max())
    table = int(m._t["ids"].shape[1])           # as wide as the longest caption (Vocabulary.encode_batch(trim=True))
    assert key(host) == (min(-(-longest // 4) * 4, table),)
    short = host[m._t["width_np"][host] < table - 4]
    if len(short):                              # a batch of shorter captions: rounded up to a multiple of 4
        w = int(m._t["width_np"][short].max())
        assert key(short) == (-(-w // 4) * 4,)
    assert not m._graphing                      # asking for a key leaves eager batches as they were
    m._t.pop("img")                             # as with image_model=cnn: images decoded per batch on the CPU
    key, why = m.graph_key()
    assert key is None and "image_model=cnn" in why
    w = create_method("wsabie").with_run(device="cpu")
    w.prepare(data, torch.device("cpu"))
    assert w.graph_key()[0] is not None           # the dense draw: batch x candidates fits
    w.GRAPH_DRAW_BYTES = 1000
    key, why = w.graph_key()
    assert key is None and "would take" in why and "GB" in why


def test_steps_on_a_cpu_are_not_captured_and_say_nothing() -> None:
    model = torch.nn.Linear(4, 1)
    tr = Trainer(model, torch.optim.Adam(model.parameters()), EpochSampler(8, 4), max_epochs=1,
                 device=torch.device("cpu"), graph_key=lambda host: ())
    assert tr.graph_off == "not on a GPU" and tr.graph_note == ""
    assert not any(g["capturable"] for g in tr.optimizers[0].param_groups)


def test_an_optimiser_state_saved_by_a_capturing_run_resumes_on_the_cpu() -> None:
    """A run trained on a GPU with captured steps saves capturable Adam groups (step counters on the device); the
    same state resumed on a CPU trains there (the groups and counters follow this run, not the saving one)."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randn(16, 1)

    def trainer() -> Trainer:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        return Trainer(model, torch.optim.Adam(model.parameters(), lr=0.01), EpochSampler(16, 4), max_epochs=2,
                       device=torch.device("cpu"))

    def step(model: torch.nn.Module, batch: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"loss": ((model(x[batch]) - y[batch]) ** 2).mean()}

    a = trainer()
    it = a.fit_iter(step)
    for _ in range(3):
        next(it)
    state = copy.deepcopy(a.state_dict())
    for g in state["optimizers"][0]["param_groups"]:
        g["capturable"] = True                   # as a capturing run saves it
    b = trainer()
    b.model.load_state_dict(copy.deepcopy(a.model.state_dict()))
    b.load_state_dict(state)
    assert not any(g["capturable"] for g in b.optimizers[0].param_groups)
    list(it)
    list(b.fit_iter(step))
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


# ---------------------------------------------------------------------------- on a GPU
def _fit(method: str, params: dict, data: MethodData, graphs: bool, monkeypatch, **run) -> tuple:
    monkeypatch.setenv("CROSSVIEW_CUDA_GRAPHS", "1" if graphs else "0")
    m = create_method(method, **params).with_run(device="cuda", seed=0, log_every=4, **run)
    seen = {}
    events = []
    for ev in m.fit_iter(data):
        events.append(ev)
        live = getattr(m, "_live", None)
        if live is not None:
            seen["trainer"] = live[1]
    tr = seen["trainer"]
    return m, tr, [e.message for e in events if isinstance(e, Log)]


@needs_cuda
@pytest.mark.parametrize("text_model", ["gru", "features"])
def test_vsepp_steps_replayed_from_graphs_end_where_eager_steps_end(text_model: str, monkeypatch) -> None:
    data = _toy()
    params = {**FAST, "text_model": text_model, "holdout": 0.0}
    eager, tr_e, _ = _fit("vsepp", params, data, False, monkeypatch)
    graphed, tr_g, logs = _fit("vsepp", params, data, True, monkeypatch)
    assert tr_e.graph_replays == 0 and "turned off" in tr_e.graph_note
    assert tr_g.graph_captures >= 1 and tr_g.graph_replays > tr_g.total_steps // 2, tr_g.graph_note
    assert any("CUDA graphs: each batch shape" in m for m in logs)
    assert [h["epoch_loss"] for h in eager.history_] == pytest.approx([h["epoch_loss"] for h in graphed.history_],
                                                                       rel=2e-3)
    # the eager GRU runs packed, the captured one padded (cuDNN sums in another order): Adam moves a weight by up
    # to ~lr a step whatever its gradient's size, so a weight whose gradient is near zero may move the other way,
    # at most 2 lr a step, while on average the weights agree to a small fraction of lr (a replay reading a stale
    # batch drifts far more). On feature rows the two are the same kernels
    lr, steps = float(FAST["lr"]), tr_g.total_steps
    diffs = np.concatenate([np.abs(v - graphed.model_state_[k]).ravel() for k, v in eager.model_state_.items()])
    if text_model == "features":
        assert float(diffs.max()) <= 2e-4
    assert float(diffs.max()) <= 2 * lr * steps and float(diffs.mean()) < lr / 20, (diffs.max(), diffs.mean())


@needs_cuda
def test_smoothap_steps_replayed_from_graphs_read_each_batch_s_images(monkeypatch) -> None:
    """B images x all their captions: the batch's images come from the trainer's plan through a static buffer."""
    data = _toy()
    params = {"embed_dim": 32, "batch_size": 16, "max_epochs": 3, "lr": 0.003, "text_model": "features"}
    eager, _, _ = _fit("smoothap", params, data, False, monkeypatch)
    graphed, tr, _ = _fit("smoothap", params, data, True, monkeypatch)
    assert tr.graph_replays > 0, tr.graph_note
    for k, v in eager.model_state_.items():
        assert np.allclose(v, graphed.model_state_[k], atol=2e-4), k


@needs_cuda
def test_a_learning_rate_change_captures_the_graphs_again() -> None:
    """The rate is a constant inside a graph: after a scheduler cuts it, the steps are captured again and the
    weights follow the new rate (the same as eager steps)."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 8, generator=g).to(dev), torch.randn(64, 1, generator=g).to(dev)

    def run(graphs: bool) -> tuple[Trainer, torch.nn.Module]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
        tr = Trainer(model, opt, EpochSampler(64, 16, seed=1), max_epochs=5, device=dev, schedulers=[sched],
                     grad_clip=1.0, graph_key=lambda host: (), cuda_graphs=graphs)

        def step(m: torch.nn.Module, batch: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
            return {"loss": ((m(x[batch]) - y[batch]) ** 2).mean()}

        list(tr.fit_iter(step))
        return tr, model

    tr_e, eager = run(False)
    tr_g, graphed = run(True)
    assert tr_g.graph_captures >= 3       # lr 0.01, 0.001, 0.0001: one capture each
    assert tr_g.graph_replays == tr_g.total_steps - GRAPH_WARMUP
    for p, q in zip(eager.parameters(), graphed.parameters()):
        assert torch.allclose(p, q, atol=1e-5)


@needs_cuda
def test_a_resumed_captured_run_continues_as_an_uninterrupted_one() -> None:
    """Stop after 7 of 15 captured steps, restore the weights and the trainer's state into new objects (capturing
    again), finish: the weights of the uninterrupted run (Adam's moments and counters on the device included)."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 8, generator=g).to(dev), torch.randn(60, 1, generator=g).to(dev)

    def make() -> tuple[Trainer, torch.nn.Module]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)          # not fused: capturable counters
        return Trainer(model, opt, EpochSampler(60, 12, seed=2), max_epochs=3, device=dev, grad_clip=1.0,
                       graph_key=lambda host: ()), model

    def step(m: torch.nn.Module, batch: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"loss": ((m(x[batch]) - y[batch]) ** 2).mean()}

    full, full_model = make()
    list(full.fit_iter(step))
    part, part_model = make()
    it = part.fit_iter(step)
    for ev in it:
        if getattr(ev, "step", None) == 7 and getattr(ev, "total", None):
            break
    it.close()
    state = copy.deepcopy(part.state_dict())
    weights = copy.deepcopy(part_model.state_dict())
    again, again_model = make()
    again_model.load_state_dict(weights)
    again.load_state_dict(state)
    list(again.fit_iter(step))
    assert part.graph_replays > 0 and again.graph_replays > 0
    for a, b in zip(again_model.parameters(), full_model.parameters()):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_bilstm_maximum_without_packing_is_the_packed_one() -> None:
    """TIMAM's Bi-LSTM pool on a GPU runs unpacked (nothing read on the host, capturable): the same maxima as over
    packed sequences, with rows of every length down to one step and a row as long as the batch."""
    from crossview.nn.encoders import bilstm_max_unpacked

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(6, 5, batch_first=True, bidirectional=True)
    x = torch.randn(5, 9, 6)
    lengths = torch.tensor([9, 1, 4, 7, 2])
    x = x * (torch.arange(9)[None, :, None] < lengths[:, None, None])      # zero padding, as token states are
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, _ = lstm(packed)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, padding_value=float("-inf"),
                                                    total_length=9)
    want = out.amax(1)
    got = bilstm_max_unpacked(lstm, x, lengths)
    assert torch.allclose(got, want, atol=1e-6)
    got.sum().backward()                      # gradients flow to the LSTM's weights
    assert lstm.weight_hh_l0_reverse.grad is not None and lstm.weight_hh_l0.grad is not None


def test_wsabie_learns_as_well_with_the_draws_a_captured_step_makes(monkeypatch) -> None:
    """The dense draw (every row from its full score row, what a captured step does) has the sampler's
    distribution: WSABIE trained with it retrieves as well as with the sampler's rounds (toy data, same seed)."""
    from crossview.methods.wsabie import Wsabie

    ds = H.make_toy_dataset()
    img, txt = H.toy_features(ds)
    train, test = (MethodData.from_features(ds, img, txt, s) for s in ("train", "test"))
    params = {"dim": 16, "lr": 0.01, "max_norm": 10.0, "max_epochs": 6, "patience": 0}
    rounds = create_method("wsabie", **params).with_run(device="cpu", seed=0)
    rounds.fit(train)
    real = Wsabie.training_step

    def captured(self: Wsabie, model, batch, gen):
        self._graphing = True
        return real(self, model, batch, gen)

    monkeypatch.setattr(Wsabie, "training_step", captured)
    dense = create_method("wsabie", **params).with_run(device="cpu", seed=0)
    dense.fit(train)
    a, b = rounds.evaluate(test)["rsum"], dense.evaluate(test)["rsum"]
    chance = 100.0                  # rsum by chance with 32 test images, 2 captions each (about 46 i2t + 50 t2i)
    assert a > 3 * chance and b > 3 * chance and abs(a - b) < 0.15 * max(a, b), (a, b)
