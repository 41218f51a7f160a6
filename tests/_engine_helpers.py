"""Small deterministic data and a tiny iterative method for the engine tests (imported by child
processes too, so it must not depend on pytest)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from crossview.data.dataset import PairedDataset
from crossview.core.events import Event, Loss, Progress, Validation
from crossview.methods import register_method
from crossview.methods.base import Method, MethodData

N_CLASSES = 8
_FILLER = [f"filler{j}" for j in range(12)]


def make_toy_dataset(n_images: int = 160, caps_per_image: int = 2, seed: int = 0) -> PairedDataset:
    """Images of ``N_CLASSES`` latent classes (16-d features: class mean + noise) with captions that
    name the class among filler words; splits train / val / test = 60% / 20% / 20%."""
    rng = np.random.default_rng(seed)
    classes = np.arange(n_images) % N_CLASSES
    means = rng.normal(size=(N_CLASSES, 16)) * 2.0
    image = (means[classes] + rng.normal(size=(n_images, 16))).astype(np.float32)
    captions, caption_image = [], []
    for i, k in enumerate(classes):
        for _ in range(caps_per_image):
            words = [f"class{k}", f"shape{k}"] + list(rng.choice(_FILLER, size=3))
            rng.shuffle(words)
            captions.append(" ".join(words))
            caption_image.append(i)
    n_tr, n_va = int(0.6 * n_images), int(0.2 * n_images)
    splits = {"train": np.arange(n_tr), "val": np.arange(n_tr, n_tr + n_va),
              "test": np.arange(n_tr + n_va, n_images)}
    return PairedDataset(name="toy", captions=captions, caption_image=np.array(caption_image), image_features=image,
                         labels=classes, splits=splits, format="toy")


def toy_text_features(ds: PairedDataset) -> np.ndarray:
    """``(n_captions, vocab) float32`` bag-of-words counts of the toy captions, computed by hand."""
    vocab = sorted({w for c in ds.captions for w in c.split()})
    index = {w: j for j, w in enumerate(vocab)}
    out = np.zeros((ds.n_captions, len(vocab)), dtype=np.float32)
    for r, c in enumerate(ds.captions):
        for w in c.split():
            out[r, index[w]] += 1
    return out


def toy_features(ds: PairedDataset) -> tuple[np.ndarray, np.ndarray]:
    """``(image, text)`` features of the whole toy dataset, for ``train(..., features=...)``."""
    assert ds.image_features is not None
    return np.asarray(ds.image_features), toy_text_features(ds)


@register_method("toy_iterative")
class ToyIterative(Method):
    """Least-squares map ``W (p, q)`` from image to caption features by mini-batch gradient descent.

    Deterministic per (seed, epoch), so a resumed run ends with exactly the uninterrupted run's ``W_``.
    Yields ``Progress`` + ``Loss`` per batch and ``Validation`` per epoch. ``ballast_mb`` adds a dead
    array of that size to the state to make checkpoints large (the SIGKILL test).
    """

    iterative = True

    def __init__(self, epochs: int = 4, batch_size: int = 32, lr: float = 0.01, ballast_mb: float = 0.0) -> None:
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.ballast_mb = ballast_mb      # the seed is the run's (self.seed: Method.run_settings)

    def fit_iter(self, train: MethodData, val: MethodData | None = None, *,
                 resume: bool = False) -> Iterator[Event]:
        X, Y = train.caption_pairs()
        if not (resume and hasattr(self, "W_")):
            self.W_ = np.zeros((X.shape[1], Y.shape[1]))
            self.epoch_ = 0
            self.batches_done_ = 0
            self.ballast_ = np.zeros(int(self.ballast_mb * 2**20 / 8))
        n_batches = -(-len(X) // self.batch_size)
        while self.epoch_ < self.epochs:
            order = np.random.default_rng([self.seed, self.epoch_]).permutation(len(X))
            # Mid-epoch resume: skip the batches of this epoch that were done before the checkpoint.
            for b in range(self.batches_done_ - self.epoch_ * n_batches, n_batches):
                idx = order[b * self.batch_size:(b + 1) * self.batch_size]
                err = X[idx] @ self.W_ - Y[idx]
                self.W_ = self.W_ - self.lr * X[idx].T @ err / len(idx)
                self.batches_done_ += 1
                step = self.epoch_ * n_batches + b + 1
                # Loss first: a cancel at either yield then leaves metrics.jsonl with one loss line per
                # counted batch (the Ctrl-C test checks exactly that; Progress first raced it)
                yield Loss(step, self.epoch_, {"mse": float((err ** 2).mean())})
                yield Progress(step, self.epochs * n_batches, f"epoch {self.epoch_ + 1}/{self.epochs}")
            self.epoch_ += 1
            yield Validation(self.epoch_, {"epoch_done": self.epoch_})

    def encode_images(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        self.check_is_fitted()
        return (data.image_features @ self.W_).astype(np.float32)

    def encode_texts(self, data: MethodData, direction: str = "i2t") -> np.ndarray:
        return data.require_text_features("toy_iterative").astype(np.float32)


def write_toy_precomp(folder, ds: PairedDataset, splits=(("train", "train"), ("dev", "val"))) -> None:
    """Write ``ds`` as a VSE++ ``*_precomp`` folder with the given (file prefix, split) pairs (a file
    dataset whose image features are precomputed, so CLI tests need no image encoder)."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    assert ds.image_features is not None
    for prefix, split in splits:
        idx = ds.splits[split]
        keep = set(idx.tolist())
        np.save(folder / f"{prefix}_ims.npy", ds.image_features[idx])
        caps = [c for c, i in zip(ds.captions, ds.caption_image) if int(i) in keep]
        (folder / f"{prefix}_caps.txt").write_text("\n".join(caps) + "\n")


class PicklePayload:
    """Unpickling this runs ``exec``, which creates the file ``marker``: the attack a planted checkpoint makes."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def naive_ranks(scores: np.ndarray, caption_image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """1-based ranks by loops: i2t the best gold caption of each image, t2i the image of each caption; ties go
    to the smaller gallery index."""
    n_img, n_cap = scores.shape
    i2t = np.empty(n_img, np.int64)
    for i in range(n_img):
        order = sorted(range(n_cap), key=lambda j: (-scores[i, j], j))
        i2t[i] = min(order.index(j) for j in range(n_cap) if caption_image[j] == i) + 1
    t2i = np.empty(n_cap, np.int64)
    for j in range(n_cap):
        order = sorted(range(n_img), key=lambda i: (-scores[i, j], i))
        t2i[j] = order.index(int(caption_image[j])) + 1
    return i2t, t2i


def train_toy_runs(base, method_sets: dict[str, list[str]], extra: tuple[str, ...] = ()) -> dict:
    """One finished run folder per method of ``method_sets`` (its ``--set`` values), trained through the command line
    on one toy precomp folder (80 images; train / dev as val / test) under ``base``; ``"data"``: that folder.
    ``extra``: more ``crossview train`` arguments for every run (``("--scoring", "plain")``)."""
    from crossview.cli import main

    data = base / "toy_precomp"
    write_toy_precomp(data, make_toy_dataset(80), (("train", "train"), ("dev", "val"), ("test", "test")))
    out = {}
    for method, sets in method_sets.items():
        run_dir = base / f"run_{method}"
        argv = ["train", method, "--data", str(data), "--run-dir", str(run_dir), "--text-encoder", "bow",
                "--device", "cpu", *extra]
        for s in sets:
            argv += ["--set", s]
        assert main(argv) == 0, method
        out[method] = run_dir
    out["data"] = data
    return out


def image_folders_with_web(tmp_path):
    """A clean caption folder (24 coloured squares, train / val / test) and a web folder (9 images with .tags)."""
    import json

    from PIL import Image

    rng = np.random.default_rng(0)
    colours = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
    clean, web = tmp_path / "clean", tmp_path / "web"
    clean.mkdir()
    web.mkdir()
    rows = []
    for i in range(24):
        name = list(colours)[i % 3]
        img = np.clip(np.array(colours[name]) + rng.integers(-20, 20, (40, 40, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(clean / f"{i}.jpg")
        split = "train" if i < 16 else "val" if i < 20 else "test"
        rows += [{"image": f"{i}.jpg", "caption": f"a {name} square on a wall", "split": split},
                 {"image": f"{i}.jpg", "caption": f"the {name} colour fills the picture", "split": split}]
    (clean / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for i in range(9):
        name = list(colours)[i % 3]
        img = np.clip(np.array(colours[name]) + rng.integers(-20, 20, (40, 40, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(web / f"w{i}.jpg")
        (web / f"w{i}.tags").write_text(f"{name}, square")
    return clean, web
