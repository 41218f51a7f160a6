"""SmoothAP's step time beside the hardest-negative triplet's (VSE++) at B = 128, in the same run, and the peak
memory of the SmoothAP loss beside the full difference tensor a direct transcription of paper 004 eq. 5 forms.

Two measurements:

- **loss**: forward + backward of the loss alone on random unit embeddings (1024-d): SmoothAP both ways on a
  batch of B images x 5 captions (``crossview.nn.losses.smooth_ap_loss``: only the positives' rows of the
  difference tensor, B x 5 x 5B for i2t), the same with the full ``(q, m, m)`` difference tensor (the
  reference formulation, written here), InfoNCE both ways, and the triplet loss (``contrastive_loss``,
  hardest negative) on B captions and on 5B captions. Peak memory: the largest total of tensors alive during
  forward + backward, counted by a ``TorchDispatchMode`` that tracks every tensor's storage (CPU; on CUDA
  ``torch.cuda.max_memory_allocated``).
- **step**: a whole training step of the models (``vsepp`` loss=vsepp on batches of B captions; ``smoothap`` on
  batches of B images with all their captions), on Flickr30K-like synthetic data (image features 2048-d,
  5 captions of 8-20 words each), text encoder the run's caption features (384-d, MiniLM size) or the
  paper's GRU. Reported per step and per caption: a SmoothAP step sees 5x the captions of a triplet step.

Run: ``python bench/smoothap_step.py [--device cpu|cuda] [--batch 128] [--steps 20]``. Writes
bench/results/smoothap_step_<cpu|cuda>.txt (``--out``), stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)


def full_difference_smooth_ap(scores: torch.Tensor, positives: torch.Tensor, tau: float = 0.01) -> torch.Tensor:
    """Paper 004 eq. 5 transcribed directly: the (q, m, m) difference tensor of every candidate pair."""
    d = scores[:, None, :] - scores[:, :, None]                  # D_ij = s_j - s_i
    g = torch.sigmoid(d / tau) * (1 - torch.eye(scores.shape[1], device=scores.device))
    pos = positives.float()
    r_all = 1 + g.sum(-1)
    r_pos = 1 + (g * pos[:, None, :]).sum(-1)
    ap = ((r_pos / r_all) * pos).sum(-1) / pos.sum(-1)
    return 1 - ap.mean()


class PeakMemory(TorchDispatchMode):
    """The largest total bytes of tensor storages alive at once while active (CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self.live or st.nbytes() == 0:
            return
        self.live[key] = st.nbytes()
        self.now += st.nbytes()
        self.peak = max(self.peak, self.now)

        def gone(k: int = key) -> None:
            self.now -= self.live.pop(k, 0)
        weakref.finalize(st, gone)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


def _batch(b: int, d: int, device: torch.device, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    im = torch.nn.functional.normalize(torch.randn(b, d, generator=gen), dim=1).to(device).requires_grad_(True)
    s = torch.nn.functional.normalize(torch.randn(5 * b, d, generator=gen), dim=1).to(device).requires_grad_(True)
    return im, s


def loss_bench(b: int, device: torch.device, reps: int) -> list[tuple[str, float, float]]:
    """``[(name, ms per forward + backward, peak MB)]`` of each loss at batch ``b``."""
    from crossview.nn.losses import contrastive_loss, info_nce_loss, smooth_ap_loss

    gen = torch.Generator().manual_seed(0)
    ci = torch.arange(b, device=device).repeat_interleave(5)
    pos = torch.arange(b, device=device)[:, None] == ci[None, :]

    def sap(im, s):
        sc = im @ s.T
        return (smooth_ap_loss(sc, pos) + smooth_ap_loss(sc.T, pos.T)) / 2

    def sap_full(im, s):
        sc = im @ s.T
        return (full_difference_smooth_ap(sc, pos) + full_difference_smooth_ap(sc.T, pos.T)) / 2

    def nce(im, s):
        sc = im @ s.T
        return (info_nce_loss(sc, pos) + info_nce_loss(sc.T, pos.T)) / 2

    def trip_b(im, s):            # B captions, one per image (the VSE++ batch)
        i2t, t2i = contrastive_loss(im, s[::5], margin=0.2, hardest=True)
        return i2t + t2i

    def trip_5b(im, s):           # 5B captions with their images (as many captions as the SmoothAP batch)
        i2t, t2i = contrastive_loss(im[ci], s, margin=0.2, hardest=True, image_ids=ci)
        return i2t + t2i

    out = []
    for name, fn in [("SmoothAP, B images x 5 captions (ours: positives' rows only)", sap),
                     ("SmoothAP, same, full (q, m, m) difference tensor", sap_full),
                     ("InfoNCE, B images x 5 captions", nce),
                     ("triplet hardest negative, B captions", trip_b),
                     ("triplet hardest negative, 5B captions", trip_5b)]:
        im, s = _batch(b, 1024, device, gen)
        for _ in range(2):
            fn(im, s).backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        for _ in range(reps):
            im.grad = s.grad = None
            fn(im, s).backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t) / reps * 1e3
        if device.type == "cuda":
            peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
        else:
            im.grad = s.grad = None
            with PeakMemory() as pm:
                fn(im, s).backward()
            peak = pm.peak / 2 ** 20
        out.append((name, ms, peak))
    return out


def _synthetic(n_images: int, seed: int = 0):
    from crossview.data.method_data import MethodData

    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(4000)]
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    caps = [" ".join(rng.choice(words, size=rng.integers(8, 21), p=p)) for _ in range(5 * n_images)]
    return MethodData(image_features=rng.standard_normal((n_images, 2048)).astype(np.float32),
                      text_features=rng.standard_normal((5 * n_images, 384)).astype(np.float32),
                      captions=caps, caption_image=np.repeat(np.arange(n_images), 5), name="train")


def step_bench(b: int, steps: int, device: torch.device, text_model: str) -> list[tuple[str, float, float]]:
    """``[(name, ms per step, captions per second)]`` of a vsepp step (B captions) and a smoothap step (B images
    with all their captions), ``steps`` timed steps after 3 warm-up ones."""
    from crossview.methods import create_method
    from crossview.nn.trainer import EpochSampler

    data = _synthetic(max(4 * b, b * (steps + 3) // 5 + 1))
    out = []
    for name, method, kw in [("vsepp (hardest negative), B captions", "vsepp", {"loss": "vsepp"}),
                             ("smoothap (SmoothAP), B images x 5 captions", "smoothap", {"loss": "smoothap"}),
                             ("smoothap (InfoNCE), B images x 5 captions", "smoothap", {"loss": "infonce"})]:
        m = create_method(method, text_model=text_model, batch_size=b, **kw).with_run(device=str(device))
        spec = m.model_spec(data, resume=False)
        m._fresh_state(spec)
        torch.manual_seed(0)
        model = m.build_model(spec).to(device)
        m.prepare(data, device)
        opt = m.optimizers(model)[0]
        groups = data.caption_image if m.group_by_image else None
        sampler = EpochSampler(data.n_captions, b, seed=0, groups=groups)
        gen = torch.Generator().manual_seed(0)
        n_caps = 0
        t = 0.0
        for k in range(steps + 3):
            if k == 3:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t, n_caps = time.perf_counter(), 0
            batch = sampler.batch(0, k % len(sampler)).to(device)
            opt.zero_grad(set_to_none=True)
            m.training_step(model, batch, gen)["loss"].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
            opt.step()
            n_caps += len(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        out.append((name, dt / steps * 1e3, n_caps / dt))
        m.end_training()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--text-models", default="features,gru")
    ap.add_argument("--out", metavar="FILE",
                    help="write the tables here, stamped with the command, commit, machine and data (default "
                         "bench/results/smoothap_step_<cpu|cuda>.txt by --device; '-' prints only)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here", file=sys.stderr)
        return 2
    out = args.out or str(REPO / "bench" / "results" / f"smoothap_step_{device.type}.txt")
    n_images = max(4 * args.batch, args.batch * (args.steps + 3) // 5 + 1)
    data = [_stamp.synthetic(what="loss", seed=0, batch=args.batch, captions_per_image=5, dim=1024),
            _stamp.synthetic(what="step", seed=0, images=n_images, image_dim=2048, text_dim=384, vocabulary=4000,
                             words="8-20 (Zipf)")]
    return _stamp.run_stamped(lambda: run(args, device), out, data)


def run(args: argparse.Namespace, device: torch.device) -> int:
    """The measurement proper: prints the tables."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    print(f"# SmoothAP vs triplet at B = {args.batch} on {device} ({where}), torch {torch.__version__}\n")
    print(f"## The loss alone, forward + backward (1024-d embeddings, {args.reps} repetitions)\n")
    print("| loss | ms | peak memory (MB) |\n|---|---|---|")
    rows = loss_bench(args.batch, device, args.reps)
    for name, ms, peak in rows:
        print(f"| {name} | {ms:.1f} | {peak:.1f} |", flush=True)
    for tm in args.text_models.split(","):
        print(f"\n## A training step (text_model={tm}; {args.steps} steps after 3 warm-up)\n")
        print("| model | ms per step | captions per second |\n|---|---|---|")
        res = step_bench(args.batch, args.steps, device, tm)
        for name, ms, cps in res:
            print(f"| {name} | {ms:.1f} | {cps:.0f} |", flush=True)
        base = res[0]
        for name, ms, cps in res[1:]:
            print(f"\n{name.split(',')[0]}: {ms / base[1]:.2f}x the triplet's step time, "
                  f"{cps / base[2]:.2f}x its captions per second", end="")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
