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

__all__ = ["ImageFiles", "image_loader", "files_loader", "BatchImages", "batch_image_loader"]


class _Failed:
    """What a loader's worker returns for a file it cannot read: the one-line message, raised in the main process
    by :class:`_Loader` (torch re-raises an exception from a worker with the worker's traceback in its message)."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


class _Loader:
    """Iterates a ``DataLoader`` like the loader itself, and stops at a :class:`_Failed` item with its
    :class:`CrossViewError` (one line naming the file, as when the file is read in this process)."""

    def __init__(self, loader: torch.utils.data.DataLoader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        for item in self.loader:
            if isinstance(item, _Failed):
                raise CrossViewError(item.message)
            yield item


def _collate(items: list[Any]) -> Any:
    """``default_collate``, or the first :class:`_Failed` of the batch."""
    failed = next((x for x in items if isinstance(x, _Failed)), None)
    return failed if failed is not None else torch.utils.data.default_collate(items)


class ImageFiles(torch.utils.data.Dataset):
    """``dataset[i] -> (transform(RGB image i), i)`` over a list of image files; a file that cannot be read raises
    a :class:`CrossViewError` naming it, or (``errors_as_values``, in a loader's workers) returns it as a value."""

    def __init__(self, paths: Sequence[str], transform: Callable[[Any], torch.Tensor] | None = None,
                 errors_as_values: bool = False) -> None:
        self.paths = [str(p) for p in paths]
        self.transform = transform
        self.errors_as_values = errors_as_values

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        from PIL import Image

        from crossview.data.images import image_problem

        path = self.paths[i]
        try:
            with Image.open(path) as im:
                img = im.convert("RGB")
        except Exception as e:  # noqa: BLE001 - Pillow raises many types (image_problem)
            message = f"{path}: {image_problem(e)}; fix or remove the file"
            if self.errors_as_values:
                return _Failed(message)
            raise CrossViewError(message) from None
        if self.transform is None:
            from torchvision.transforms.functional import pil_to_tensor

            return pil_to_tensor(img), i
        return self.transform(img), i


def image_loader(data: MethodData, batch_size: int, *, shuffle: bool = False, workers: int = 2, seed: int = 0,
                 indices: Sequence[int] | None = None) -> _Loader:
    """Batches of ``(images, image ids)`` from ``data``'s image files, decoded by ``workers`` processes
    (0: in this process). ``indices`` restricts to those images (in that order unless ``shuffle``). A file that
    cannot be read stops the loop with one line naming it, from a worker as from this process."""
    if data.image_paths is None:
        raise CrossViewError(f"the {data.name or 'given'} data has no image files (feature rows only); "
                             "end-to-end training needs a dataset with images on disk")
    return files_loader(data.image_paths, data.image_transform, batch_size, shuffle=shuffle, workers=workers,
                        seed=seed, indices=indices)


def files_loader(paths: Sequence[str], transform: Callable[[Any], torch.Tensor] | None, batch_size: int, *,
                 shuffle: bool = False, workers: int = 2, seed: int = 0, indices: Sequence[int] | None = None,
                 pin_memory: bool = False) -> _Loader:
    """Batches of ``(transform(image), index)`` of the files ``paths`` (see :func:`image_loader`)."""
    ds: torch.utils.data.Dataset = ImageFiles(paths, transform, errors_as_values=True)
    if indices is not None:
        ds = torch.utils.data.Subset(ds, list(indices))
    gen = torch.Generator().manual_seed(int(seed))
    return _Loader(torch.utils.data.DataLoader(ds, batch_size=int(batch_size), shuffle=shuffle,
                                               num_workers=int(workers), generator=gen, collate_fn=_collate,
                                               pin_memory=pin_memory))


class BatchImages(torch.utils.data.Dataset):
    """``dataset[k] -> (k, images (U, 3, H, W), rows (B,))``: the decoded images of training batch ``k`` of one
    epoch, each distinct image once (``rows`` maps the batch's items onto them).

    ``batch_images(k)`` gives the image ids of batch ``k`` (e.g. the images of its captions). The random
    augmentation of batch ``k`` is seeded by ``seed_of(k)``, so a batch decodes to the same tensors in any
    worker, and a resumed run sees the augmentation it would have seen."""

    def __init__(self, paths: Sequence[str], transform: Callable[[Any], torch.Tensor],
                 batch_images: Callable[[int], Any], seed_of: Callable[[int], int], start: int, stop: int) -> None:
        self.files = ImageFiles(paths, transform, errors_as_values=True)
        self.batch_images, self.seed_of = batch_images, seed_of
        self.start, self.stop = int(start), int(stop)

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __getitem__(self, i: int) -> Any:
        """``(k, images, rows)``, or a :class:`_Failed` naming the first file that cannot be read."""
        k = self.start + int(i)
        ids = torch.as_tensor(self.batch_images(k), dtype=torch.int64)
        uniq, rows = torch.unique(ids, return_inverse=True)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed_of(k))
            got = [self.files[int(j)] for j in uniq]
        failed = next((x for x in got if isinstance(x, _Failed)), None)
        return failed if failed is not None else (k, torch.stack([x[0] for x in got]), rows)


def batch_image_loader(dataset: BatchImages, workers: int = 2) -> _Loader:
    """Batches of :class:`BatchImages` in order, decoded ahead by ``workers`` processes (0: in this one),
    into pinned memory when a GPU is present; a file that cannot be read stops the loop with one line naming it."""
    workers = int(workers)
    return _Loader(torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False, num_workers=workers,
                                               pin_memory=torch.cuda.is_available(),
                                               prefetch_factor=2 if workers > 0 else None,
                                               persistent_workers=False))
