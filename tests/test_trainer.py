"""The one training loop (crossview.nn.trainer): batches, exact resume (optimiser, scheduler and sampler
position), clipping, cancellation between batches, non-finite losses, and DDP over gloo with 2 CPU processes
giving the single-process result."""

from __future__ import annotations

import copy
import os
import socket

import numpy as np
import pytest
import torch

from crossview.core.events import Loss, Progress
from crossview.core.errors import CrossViewError
from crossview.nn.row_optim import RowwiseRMSprop
from crossview.nn.trainer import EpochSampler, Trainer, step_seed

torch.set_num_threads(1)


# ---------------------------------------------------------------------------- samplers
def test_every_item_once_an_epoch_and_a_new_order_each_epoch() -> None:
    s = EpochSampler(103, 10, seed=3)
    assert len(s) == 11
    for epoch in range(2):
        seen = torch.cat([s.batch(epoch, b) for b in range(len(s))]).numpy()
        assert sorted(seen.tolist()) == list(range(103))
    assert not torch.equal(s.batch(0, 0), s.batch(1, 0))
    assert torch.equal(EpochSampler(103, 10, seed=3).batch(1, 4), s.batch(1, 4))   # a function of (seed, epoch)


def test_group_sampler_keeps_the_captions_of_an_image_together() -> None:
    caption_image = np.repeat(np.arange(20), 5)[np.random.default_rng(0).permutation(100)]
    s = EpochSampler(100, 4, seed=1, groups=caption_image)
    assert len(s) == 5
    seen = []
    for b in range(len(s)):
        ids = s.batch(0, b).numpy()
        images = set(caption_image[ids].tolist())
        assert len(images) == 4 and len(ids) == 20       # 4 images x all their 5 captions
        seen += ids.tolist()
    assert sorted(seen) == list(range(100))


def test_ranks_split_every_batch() -> None:
    full = EpochSampler(50, 8, seed=2)
    parts = [EpochSampler(50, 8, seed=2, rank=r, world_size=3) for r in range(3)]
    for b in range(len(full)):
        got = sorted(torch.cat([p.batch(0, b) for p in parts]).tolist())
        assert got == sorted(full.batch(0, b).tolist())
    assert all(len(p) == len(full) for p in parts)


def test_step_seeds_differ_and_repeat() -> None:
    seeds = {step_seed(0, r, s) for r in range(2) for s in range(100)}
    assert len(seeds) == 200 and step_seed(0, 1, 5) == step_seed(0, 1, 5)
    assert all(0 <= x < 2**63 for x in seeds)


# ---------------------------------------------------------------------------- a toy regression
def _data(n: int = 64, p: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, p, generator=g, dtype=torch.float64)
    y = X @ torch.arange(1.0, p + 1, dtype=torch.float64) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


def _make(max_epochs: int = 3, rank_world: tuple[int, int] = (0, 1), dropout: float = 0.2,
          **kw) -> tuple[Trainer, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Dropout(dropout), torch.nn.Linear(8, 1)).double()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    sampler = EpochSampler(64, 16, seed=4, rank=rank_world[0], world_size=rank_world[1])
    t = Trainer(model, opt, sampler, max_epochs=max_epochs, device=torch.device("cpu"), seed=9, schedulers=[sched],
                grad_clip=1.0, log_every=2, **kw)
    return t, model


def _step(X: torch.Tensor, y: torch.Tensor, reduce: str = "mean", noise: float = 1e-3):
    def step(model: torch.nn.Module, batch: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
        noise_ = torch.rand(len(batch), generator=gen, dtype=torch.float64) * noise   # the step's generator
        err = model(X[batch]).squeeze(1) - y[batch] + noise_
        loss = (err ** 2).sum() if reduce == "sum" else (err ** 2).mean()
        return {"loss": loss, "abs": err.abs().mean()}
    return step


def _step_direct(X: torch.Tensor, y: torch.Tensor):
    """The same summed loss computed from the parameters directly, never calling the model's forward (as
    WSABIE's sampled rows do): DDP must still average its gradients."""
    def step(model: torch.nn.Module, batch: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
        first, last = model[0], model[2]
        h = torch.nn.functional.linear(X[batch], first.weight, first.bias)
        err = torch.nn.functional.linear(h, last.weight, last.bias).squeeze(1) - y[batch]
        return {"loss": (err ** 2).sum()}
    return step


def test_events_clipping_and_the_loss_goes_down() -> None:
    X, y = _data()
    t, model = _make(max_epochs=4)
    epochs = []
    events = list(t.fit_iter(_step(X, y), lambda e, terms: (epochs.append(terms) or [], False)))
    progress = [e for e in events if isinstance(e, Progress)]
    assert [e.step for e in progress] == list(range(1, 17)) and progress[-1].total == 16
    assert len([e for e in events if isinstance(e, Loss)]) == 8 + 4          # every 2 steps + once an epoch
    assert epochs[-1]["epoch_loss"] < 0.75 * epochs[0]["epoch_loss"] and "abs" in epochs[0]
    assert t.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05 * 0.7 ** 4)


def test_gradients_are_clipped_to_the_norm() -> None:
    """Plain SGD with lr 1: a clipped step moves the parameters by exactly the clip norm."""
    X, y = _data()
    model = torch.nn.Linear(5, 1).double()
    before = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    t = Trainer(model, torch.optim.SGD(model.parameters(), lr=1.0), EpochSampler(64, 64), max_epochs=1,
                device=torch.device("cpu"), grad_clip=0.25)
    list(t.fit_iter(_step(X, y * 100)))
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert float(torch.linalg.vector_norm(after - before)) == pytest.approx(0.25, rel=1e-9)


def test_resume_mid_epoch_is_exact() -> None:
    """Stop after 6 of 12 batches (mid-epoch 2), restore weights + trainer state into new objects, finish:
    bit-identical to an uninterrupted run (sampler order, per-step random numbers, Adam moments, schedule)."""
    X, y = _data()
    full, full_model = _make()
    list(full.fit_iter(_step(X, y)))

    part, part_model = _make()
    it = part.fit_iter(_step(X, y))
    n = 0
    for ev in it:
        if isinstance(ev, Progress):
            n += 1
            if n == 6:
                break
    it.close()
    state = copy.deepcopy(part.state_dict())
    weights = copy.deepcopy(part_model.state_dict())
    assert state["epoch"] == 1 and state["batch_pos"] == 2 and state["step"] == 6

    again, again_model = _make()
    again_model.load_state_dict(weights)
    again.load_state_dict(state)
    list(again.fit_iter(_step(X, y)))
    assert again.step == full.step == 12
    for a, b in zip(again_model.parameters(), full_model.parameters()):
        assert torch.equal(a, b)


def test_a_state_another_optimiser_saved_is_one_clear_error() -> None:
    """Resuming with an optimiser that cannot read the saved one's state (Adam's into RowwiseRMSprop) says so in
    one line instead of torch's error."""
    X, y = _data()
    t, _ = _make(max_epochs=1)
    list(t.fit_iter(_step(X, y)))
    state = copy.deepcopy(t.state_dict())
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)).double()
    opt = RowwiseRMSprop([model[0].weight], lr=0.1)
    again = Trainer(model, opt, EpochSampler(64, 16, seed=4), max_epochs=3, device=torch.device("cpu"), seed=9,
                    schedulers=[torch.optim.lr_scheduler.StepLR(opt, step_size=1)])
    with pytest.raises(CrossViewError, match="does not fit this model's RowwiseRMSprop .*start the run again"):
        again.load_state_dict(state)


def test_a_non_finite_loss_is_one_clear_error() -> None:
    """The error names the first step whose loss was not finite. The terms are read every log_every steps (a step
    never waits for the device), so the weights have moved past that step when it is found; a state saved since
    the last read would hold them, so saving reads first and raises instead of saving them."""
    X, y = _data()
    y[3] = float("nan")
    t, model = _make(nan_hint="lower the learning rate (lr=0.05)")
    first = next(k for k in range(len(t.sampler)) if 3 in t.sampler.batch(0, k).tolist())   # its 0-based step
    with pytest.raises(CrossViewError, match=rf"the loss became nan at step {first}; lower the learning rate "
                                             r"\(lr=0.05\)"):
        list(t.fit_iter(_step(X, y)))
    # stopped at the first read after it (a log_every=2 boundary), not later
    assert t.step == first + (2 - first % 2)

    t, model = _make()
    it = t.fit_iter(_step(X, y))
    for ev in it:       # the Progress event of the bad step itself: its terms are not read yet
        if isinstance(ev, Progress) and ev.step == first + 1:
            break
    with pytest.raises(CrossViewError, match=rf"the loss became nan at step {first}"):
        t.state_dict()


def test_amp_on_the_cpu_is_bfloat16_autocast_where_the_cpu_has_it() -> None:
    """amp=True on a CPU: bfloat16 autocast inside the step when the CPU has bfloat16 matrix units, else
    plain float32; never a gradient scaler (that is float16's)."""
    from crossview.nn.trainer import amp_dtype

    X, y = _data()
    t, _ = _make(max_epochs=1, amp=True)
    seen = []

    def step(model, batch, gen):
        seen.append(torch.is_autocast_enabled("cpu"))
        return _step(X, y)(model, batch, gen)

    list(t.fit_iter(step))
    assert t.scaler is None
    assert t.amp_dtype == amp_dtype(torch.device("cpu"))
    assert seen and all(v == (t.amp_dtype == torch.bfloat16) for v in seen)


def test_a_state_from_other_optimisers_is_refused() -> None:
    t, _ = _make()
    state = t.state_dict()
    state["optimizers"] = []
    with pytest.raises(CrossViewError, match="start the run again"):
        _make()[0].load_state_dict(state)


# ---------------------------------------------------------------------------- DDP, 2 CPU processes (gloo)
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        X, y = _data()
        for name, step in (("forward", _step(X, y, "sum", noise=0.0)), ("direct", _step_direct(X, y))):
            t, model = _make(rank_world=(rank, world), dropout=0.0, loss_is_sum=True)
            assert t.ddp is not None and t.world_size == world
            list(t.fit_iter(step, lambda e, terms: ([], rank == 0 and e == 2)))
            torch.save({"weights": model.state_dict(), "epoch": t.epoch}, f"{out}/{name}{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_with_two_cpu_processes_matches_one_process(tmp_path) -> None:
    """gloo, 2 processes, a deterministic model: each takes half of every batch, DDP averages the gradients (the summed loss is
    scaled by the world size), so both ranks end with the single-process weights; rank 0's stop reaches
    both (they stop after epoch 2 of 3)."""
    import torch.multiprocessing as mp

    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    X, y = _data()
    single, single_model = _make(dropout=0.0, loss_is_sum=True)
    list(single.fit_iter(_step(X, y, "sum", noise=0.0), lambda e, terms: ([], e == 2)))

    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for name in ("forward", "direct"):      # the step calls the model, or reads its parameters directly
        got = [torch.load(tmp_path / f"{name}{r}.pt", weights_only=True) for r in range(2)]
        assert got[0]["epoch"] == got[1]["epoch"] == 2
        for k, v in single_model.state_dict().items():
            torch.testing.assert_close(got[0]["weights"][k], got[1]["weights"][k], rtol=0, atol=0)
            # (no dropout or noise here: their random numbers come from per-rank seeds) to rounding: sums split
            torch.testing.assert_close(got[0]["weights"][k], v, rtol=1e-6, atol=1e-8)
