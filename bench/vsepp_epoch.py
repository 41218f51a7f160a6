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

``--amp`` runs ours in mixed precision (``amp=True``: float16 autocast on CUDA; bfloat16 autocast on a CPU with
bfloat16 matrix units, where the GRU runs padded, about twice as fast as in float32); the reference stays float32.

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
        last = out[torch.arange(len(ids)), lengths - 1]
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
             amp: bool = False, seed: int = 0, text_model: str = "gru") -> tuple[float, int]:
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
    it.close()
    return elapsed, done


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
    rows = []
    for r in range(args.repeats):
        ref_s, ref_n = run_reference(image, captions, ci, device, args.batches)
        ours_s, ours_n = run_ours(image, captions, ci, device, args.batches, amp=args.amp)
        rows.append((ref_n / ref_s, ours_n / ours_s))
        print(f"repeat {r + 1}: reference {ref_n / ref_s:,.0f} captions/s ({ref_n:,} in {ref_s:.1f} s); ours "
              f"{ours_n / ours_s:,.0f} captions/s ({ours_n:,} in {ours_s:.1f} s); ratio {ref_s / ref_n * ours_n / ours_s:.2f}x",
              flush=True)
    ref_rate = float(np.median([a for a, _ in rows]))
    ours_rate = float(np.median([b for _, b in rows]))
    epoch = len(captions)
    print(f"median: reference {ref_rate:,.0f} captions/s (epoch {epoch / ref_rate:,.0f} s), ours {ours_rate:,.0f} "
          f"captions/s (epoch {epoch / ours_rate:,.0f} s): ours / reference = {ours_rate / ref_rate:.2f}x (goal >= 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
