"""VSE++ training speed on Flickr30K-size precomputed features: our ``vsepp`` (the shared trainer) against a
straightforward reference loop written here, in the same run, on the same data and model sizes.

Data (synthetic, the size of Flickr30K's training split as the VSE++ ``f30k_precomp`` folder holds it):
29,000 images x 2048-d features, 5 captions each (145,000), words drawn from a Zipf law over an 8,000-word
vocabulary, 8-20 words per caption (Flickr30K's captions average ~12).

- **ours**: ``Vsepp(text_model=gru)`` through :class:`~crossview.nn.trainer.Trainer`: captions tokenised once
  into one padded id tensor on the device, image features on the device, each batch's ids trimmed to its
  longest caption and run through a packed GRU (no work on padding), the loss on the batch's score matrix.
- **reference**: what one writes first: per batch, Python lists of captions tokenised and padded to the
  batch's longest caption, the batch's feature rows copied from numpy (no pinned memory), the GRU over the
  padded batch (no packing; the state at each caption's last real token picked afterwards), the official
  code's loss (score matrix, masked diagonal, max / sum), Adam, clipping at 2.

Both train the same model (FC 2048 -> 1024, 300-d words, a 1-layer GRU of 1024, L2) with batch 128. Timed:
``--batches`` batches (0: a whole epoch) after 3 warm-up batches. Prints examples (captions) per second and
the ratio ours / reference.

``--amp`` runs ours in mixed precision (``amp=True``: bfloat16 autocast on a GPU that has it, float16 + a gradient
scaler on older ones; bfloat16 autocast on a CPU with bfloat16 matrix units, where the GRU runs padded, about twice as
fast as in float32); the reference stays float32.

On a GPU, ours runs twice, with its steps captured as CUDA graphs (the default) and eagerly
(``CROSSVIEW_CUDA_GRAPHS=0``), and two more numbers come with it:

- **ceiling**: the same model and batch (FC 2048 -> 1024, 300-d words, GRU 1024, batch 128, captions padded to 20
  tokens, the reference's loss, Adam, clipping), its whole step captured once as a CUDA graph and replayed on
  fixed tensors: no data handling at all, the physical reference for what the hardware allows (issue 32);
- **GPU busy**: the share of the timed wall-clock in which a kernel ran, from torch's profiler (kernel intervals
  merged) over 300 of ours' steps, and the mean of NVML's utilisation sampled every 20 ms (the driver averages it
  over ~1/6 s, so it means something only over a window of a second or more).

Run: ``python bench/vsepp_epoch.py [--device cpu|cuda] [--batches 40] [--amp]``. Its lines are part of
bench/results/vsepp_epoch.txt (CPU) and vsepp_epoch_gpu.txt, which ``bench/regenerate.py`` assembles (float32 and
``--amp``); ``--out FILE`` writes one run alone, stamped with the command, commit, machine and data.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import _stamp  # noqa: E402  (bench/_stamp.py)

N_IMAGES, CAPS, DIM, VOCAB = 29_000, 5, 2048, 8_000


def synthetic(n_images: int, seed: int = 0) -> tuple[np.ndarray, list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    image = rng.standard_normal((n_images, DIM), dtype=np.float32)
    words = np.array([f"w{i}" for i in range(VOCAB)])
    p = 1.0 / np.arange(1, VOCAB + 1)
    p /= p.sum()
    n = n_images * CAPS
    lengths = rng.integers(8, 21, size=n)
    flat = rng.choice(VOCAB, size=int(lengths.sum()), p=p)
    cuts = np.cumsum(lengths)[:-1]
    captions = [" ".join(words[c]) for c in np.split(flat, cuts)]
    return image, captions, np.repeat(np.arange(n_images), CAPS)


# ---------------------------------------------------------------------------------------------- the reference
class RefModel(torch.nn.Module):
    def __init__(self, vocab: int, img_dim: int = DIM, word_dim: int = 300, embed: int = 1024) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(img_dim, embed)
        self.embed = torch.nn.Embedding(vocab, word_dim)
        self.gru = torch.nn.GRU(word_dim, embed, batch_first=True)

    def forward(self, images: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor):
        im = torch.nn.functional.normalize(self.fc(images), dim=1)
        out, _ = self.gru(self.embed(ids))                       # over the padding too (no packing)
        last = out[torch.arange(len(ids), device=out.device), lengths - 1]
        return im, torch.nn.functional.normalize(last, dim=1)


def ref_loss(im: torch.Tensor, s: torch.Tensor, margin: float = 0.2, max_violation: bool = True) -> torch.Tensor:
    scores = im @ s.t()
    diagonal = scores.diag().view(-1, 1)
    cost_s = (margin + scores - diagonal.expand_as(scores)).clamp(min=0)
    cost_im = (margin + scores - diagonal.t().expand_as(scores)).clamp(min=0)
    mask = torch.eye(scores.size(0), device=scores.device) > 0.5
    cost_s, cost_im = cost_s.masked_fill(mask, 0), cost_im.masked_fill(mask, 0)
    if max_violation:
        return cost_s.max(1)[0].sum() + cost_im.max(0)[0].sum()
    return cost_s.sum() + cost_im.sum()


def run_reference(image: np.ndarray, captions: list[str], ci: np.ndarray, device: torch.device, batches: int,
                  batch_size: int = 128, seed: int = 0) -> tuple[float, int]:
    from crossview.features.vocab import Vocabulary

    vocab = Vocabulary.from_captions(captions)
    torch.manual_seed(seed)
    model = RefModel(len(vocab)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=2e-4)
    order = np.random.default_rng(seed).permutation(len(captions))
    n_batches = len(order) // batch_size if batches <= 0 else batches + 3
    done = 0
    t0 = 0.0
    for b in range(n_batches):
        if b == 3:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        rows = order[b * batch_size:(b + 1) * batch_size]
        seqs = [vocab.encode(captions[r]) for r in rows]                     # per batch, in Python
        lengths = torch.tensor([len(q) for q in seqs])
        ids = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.int64)
        for i, q in enumerate(seqs):
            ids[i, :len(q)] = torch.tensor(q)
        images = torch.from_numpy(image[ci[rows]]).to(device)
        im, s = model(images, ids.to(device), lengths.to(device))
        loss = ref_loss(im, s)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()
        if b >= 3:
            done += len(rows)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, done


# ---------------------------------------------------------------------------------------------- ours
def run_ours(image: np.ndarray, captions: list[str], ci: np.ndarray, device: torch.device, batches: int,
             amp: bool = False, seed: int = 0, text_model: str = "gru", graphs: bool = True,
             profile: dict | None = None) -> tuple[float, int]:
    """Ours through the trainer; ``graphs``: CUDA graphs on (the default) or off. ``profile``: filled with the
    GPU's busy share over 50 steps after the timed ones (CUDA only)."""
    import os

    before = os.environ.get("CROSSVIEW_CUDA_GRAPHS")
    os.environ["CROSSVIEW_CUDA_GRAPHS"] = "1" if graphs else "0"
    try:
        return _run_ours(image, captions, ci, device, batches, amp, seed, text_model, profile)
    finally:
        if before is None:
            os.environ.pop("CROSSVIEW_CUDA_GRAPHS", None)
        else:
            os.environ["CROSSVIEW_CUDA_GRAPHS"] = before


def _run_ours(image: np.ndarray, captions: list[str], ci: np.ndarray, device: torch.device, batches: int,
              amp: bool, seed: int, text_model: str, profile: dict | None) -> tuple[float, int]:
    from crossview.core.events import Progress
    from crossview.data.method_data import MethodData
    from crossview.methods import create_method

    data = MethodData(image_features=image, text_features=None, captions=captions, caption_image=ci, name="train")
    m = create_method("vsepp", text_model=text_model, max_epochs=1, batch_size=128).with_run(
        device=str(device), seed=seed, amp=amp, log_every=1000)
    it = m.fit_iter(data)
    done = 0
    t0 = 0.0
    limit = None if batches <= 0 else batches + 3
    for ev in it:
        if not isinstance(ev, Progress):
            continue
        if ev.step == 3:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        elif ev.step > 3:
            done += 128
        if limit is not None and ev.step >= limit:
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    if profile is not None and device.type == "cuda":
        profile.update(gpu_busy(it, 300))
        trainer = m._live[1] if getattr(m, "_live", None) is not None else None
        if trainer is not None:
            profile["note"] = trainer.graph_note
    it.close()
    return elapsed, done


def _merged_seconds(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def gpu_busy(events, steps: int) -> dict:
    """The share of wall-clock time in which a GPU kernel ran while ``events`` (a training's event iterator)
    makes ``steps`` more steps: torch's profiler's kernel intervals merged, and NVML's utilisation sampled every
    20 ms (where pynvml is installed)."""
    import threading

    from crossview.core.events import Progress

    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                samples.append(float(torch.cuda.utilization()))
            except Exception:  # noqa: BLE001 - no NVML here: the profiler's number alone
                return
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        sampler.start()
        t0 = time.perf_counter()
        n = 0
        for ev in events:
            if isinstance(ev, Progress):
                n += 1
                if n >= steps:
                    break
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        stop.set()
    sampler.join()
    kernels = [(e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
    busy = _merged_seconds(kernels) / 1e6      # microseconds
    return {"profiler_busy": busy / wall if wall > 0 else float("nan"), "kernels": len(kernels),
            "nvml_busy": float(np.mean(samples)) / 100 if samples else float("nan"), "steps": n, "wall": wall}


def run_ceiling(device: torch.device, batches: int, amp: bool, batch_size: int = 128, width: int = 20,
                vocab: int = VOCAB) -> tuple[float, int]:
    """The reference model's whole step on fixed tensors, captured once as a CUDA graph and replayed (see the
    module docstring): the physical reference."""
    torch.manual_seed(0)
    model = RefModel(vocab).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=2e-4, capturable=True)
    images = torch.randn(batch_size, DIM, device=device)
    ids = torch.randint(1, vocab, (batch_size, width), device=device)
    lengths = torch.full((batch_size,), width, device=device)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp, cache_enabled=False):
            im, s = model(images, ids, lengths)
        loss = ref_loss(im.float(), s.float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    n = max(batches, 50)
    t0 = time.perf_counter()
    for _ in range(n):
        graph.replay()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, n * batch_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, default=40, help="timed batches (0 = a whole epoch)")
    ap.add_argument("--images", type=int, default=N_IMAGES)
    ap.add_argument("--amp", action="store_true", help="ours with mixed precision (float16 on CUDA, bfloat16 on a "
                    "CPU with AMX / AVX512-BF16; the reference stays float32)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default="-", metavar="FILE",
                    help="also write the lines here, stamped (default '-': print only)")
    args = ap.parse_args(argv)
    data = [_stamp.synthetic(seed=0, images=args.images, dim=DIM, captions_per_image=CAPS, vocabulary=VOCAB,
                             words="8-20 (Zipf)")]
    return _stamp.run_stamped(lambda: run(args), args.out, data)


def run(args: argparse.Namespace) -> int:
    """The measurement proper: reference and ours, ``--repeats`` times."""
    device = torch.device(args.device)
    t = time.perf_counter()
    image, captions, ci = synthetic(args.images)
    print(f"data: {len(image):,} images x {image.shape[1]}-d, {len(captions):,} captions "
          f"({time.perf_counter() - t:.1f} s to make)", flush=True)
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""), flush=True)
    cuda = device.type == "cuda"
    rows = []
    eager_rates = []
    for r in range(args.repeats):
        ref_s, ref_n = run_reference(image, captions, ci, device, args.batches)
        ours_s, ours_n = run_ours(image, captions, ci, device, args.batches, amp=args.amp)
        rows.append((ref_n / ref_s, ours_n / ours_s))
        print(f"repeat {r + 1}: reference {ref_n / ref_s:,.0f} captions/s ({ref_n:,} in {ref_s:.1f} s); ours "
              f"{ours_n / ours_s:,.0f} captions/s ({ours_n:,} in {ours_s:.1f} s); ratio {ref_s / ref_n * ours_n / ours_s:.2f}x",
              flush=True)
        if cuda:
            e_s, e_n = run_ours(image, captions, ci, device, args.batches, amp=args.amp, graphs=False)
            eager_rates.append(e_n / e_s)
            print(f"repeat {r + 1}: ours with CUDA graphs off (CROSSVIEW_CUDA_GRAPHS=0) {e_n / e_s:,.0f} captions/s "
                  f"({e_n:,} in {e_s:.1f} s)", flush=True)
    ref_rate = float(np.median([a for a, _ in rows]))
    ours_rate = float(np.median([b for _, b in rows]))
    epoch = len(captions)
    print(f"median: reference {ref_rate:,.0f} captions/s (epoch {epoch / ref_rate:,.0f} s), ours {ours_rate:,.0f} "
          f"captions/s (epoch {epoch / ours_rate:,.0f} s): ours / reference = {ours_rate / ref_rate:.2f}x "
          f"(goal >= {'4' if cuda else ('1.9' if args.amp else '1.0')}x)")
    if cuda:
        eager = float(np.median(eager_rates))
        print(f"ours eager (graphs off) {eager:,.0f} captions/s = {eager / ref_rate:.2f}x the reference; graphs "
              f"{ours_rate / eager:.2f}x eager", flush=True)
        c_s, c_n = run_ceiling(device, max(args.batches, 200), args.amp)
        ceiling = c_n / c_s
        print(f"ceiling (the reference model's step captured once, replayed on fixed tensors, "
              f"{'bf16' if args.amp else 'fp32'}): {ceiling:,.0f} captions/s; ours = {ours_rate / ceiling:.0%} of it "
              f"(goal >= 70%)", flush=True)
        prof: dict = {}
        run_ours(image, captions, ci, device, 20, amp=args.amp, profile=prof)   # (then 300 profiled steps)
        print(f"GPU busy over {prof.get('steps')} of ours' steps ({prof.get('wall', 0):.2f} s): profiler "
              f"{prof.get('profiler_busy', float('nan')):.0%} ({prof.get('kernels')} kernels), NVML "
              f"{prof.get('nvml_busy', float('nan')):.0%} (goal >= 70%); {prof.get('note', '')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
