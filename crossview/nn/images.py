"""Image files as model inputs for end-to-end training: a torch ``Dataset`` over a split's image files and a
``DataLoader`` that decodes them in worker processes.

A :class:`~crossview.data.method_data.MethodData` built with image files (``image_paths``, and the
``image_transform`` that turns a decoded ``PIL.Image`` into a tensor: resize, the paper's random crop and
flip, normalisation) goes in; batches of ``(images (B, 3, H, W), image ids (B,))`` come out. A file that
cannot be read stops the loader with one line naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from crossview.core.errors import CrossViewError
from crossview.data.method_data import MethodData

__all__ = ["ImageFiles", "image_loader", "BatchImages", "batch_image_loader"]


class ImageFiles(torch.utils.data.Dataset):
    """``dataset[i] -> (transform(RGB image i), i)`` over a list of image files."""

    def __init__(self, paths: Sequence[str], transform: Callable[[Any], torch.Tensor] | None = None) -> None:
        self.paths = [str(p) for p in paths]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image, UnidentifiedImageError

        path = self.paths[i]
        try:
            with Image.open(path) as im:
                img = im.convert("RGB")
        except (OSError, UnidentifiedImageError, ValueError) as e:
            raise CrossViewError(f"{path}: cannot read this image ({type(e).__name__}: {e}); fix or remove "
                                 "the file") from None
        if self.transform is None:
            from torchvision.transforms.functional import pil_to_tensor

            return pil_to_tensor(img), i
        return self.transform(img), i


def image_loader(data: MethodData, batch_size: int, *, shuffle: bool = False, workers: int = 2, seed: int = 0,
                 indices: Sequence[int] | None = None) -> torch.utils.data.DataLoader:
    """Batches of ``(images, image ids)`` from ``data``'s image files, decoded by ``workers`` processes
    (0: in this process). ``indices`` restricts to those images (in that order unless ``shuffle``)."""
    if data.image_paths is None:
        raise CrossViewError(f"the {data.name or 'given'} data has no image files (feature rows only); "
                             "end-to-end training needs a dataset with images on disk")
    ds: torch.utils.data.Dataset = ImageFiles(data.image_paths, data.image_transform)
    if indices is not None:
        ds = torch.utils.data.Subset(ds, list(indices))
    gen = torch.Generator().manual_seed(int(seed))
    return torch.utils.data.DataLoader(ds, batch_size=int(batch_size), shuffle=shuffle, num_workers=int(workers),
                                       generator=gen)


class BatchImages(torch.utils.data.Dataset):
    """``dataset[k] -> (k, images (U, 3, H, W), rows (B,))``: the decoded images of training batch ``k`` of one
    epoch, each distinct image once (``rows`` maps the batch's items onto them).

    ``batch_images(k)`` gives the image ids of batch ``k`` (e.g. the images of its captions). The random
    augmentation of batch ``k`` is seeded by ``seed_of(k)``, so a batch decodes to the same tensors in any
    worker, and a resumed run sees the augmentation it would have seen."""

    def __init__(self, paths: Sequence[str], transform: Callable[[Any], torch.Tensor],
                 batch_images: Callable[[int], Any], seed_of: Callable[[int], int], start: int, stop: int) -> None:
        self.files = ImageFiles(paths, transform)
        self.batch_images, self.seed_of = batch_images, seed_of
        self.start, self.stop = int(start), int(stop)

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        k = self.start + int(i)
        ids = torch.as_tensor(self.batch_images(k), dtype=torch.int64)
        uniq, rows = torch.unique(ids, return_inverse=True)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed_of(k))
            images = torch.stack([self.files[int(j)][0] for j in uniq])
        return k, images, rows


def batch_image_loader(dataset: BatchImages, workers: int = 2) -> torch.utils.data.DataLoader:
    """Batches of :class:`BatchImages` in order, decoded ahead by ``workers`` processes (0: in this one),
    into pinned memory when a GPU is present."""
    workers = int(workers)
    return torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False, num_workers=workers,
                                       pin_memory=torch.cuda.is_available(),
                                       prefetch_factor=2 if workers > 0 else None,
                                       persistent_workers=False)
