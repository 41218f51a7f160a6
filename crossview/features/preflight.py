"""Cheap checks that the encoders of a feature extraction can run, done before any heavy work.

``crossview train`` and the app's Train panel call :func:`check_encoders` before extracting a single
feature: an unknown encoder name, missing offline weights or an image encoder asked of a dataset that
only ships precomputed features are reported in seconds, not after minutes of extraction.
"""

from __future__ import annotations

from typing import Any

from crossview.core.errors import CrossViewError

__all__ = ["check_encoders"]


def check_encoders(dataset: Any, image_encoder: str | None = None, text_encoder: str | None = None) -> None:
    """Raise :class:`CrossViewError` (or its ``WeightsNotFoundError``) naming the encoder and what to do
    when :func:`crossview.features.extract_features` would fail on ``dataset`` for lack of an encoder."""
    from crossview.features import PRECOMP
    from crossview.features import image as image_mod
    from crossview.features import text as text_mod

    if getattr(dataset, "image_features", None) is not None and getattr(dataset, "image_paths", None) is None:
        if image_encoder not in (None, PRECOMP):
            raise CrossViewError(
                f"dataset {dataset.name!r} ships precomputed image features and no image files, so image "
                f"encoder {image_encoder!r} cannot run on it; leave the image encoder unset (or 'precomp')")
    else:
        name = image_encoder or image_mod.DEFAULT_IMAGE_ENCODER
        if name == PRECOMP:
            raise CrossViewError(f"dataset {dataset.name!r} has no precomputed image features; "
                                 f"choose an image encoder ({', '.join(image_mod.list_image_encoders())})")
        image_mod.create_image_encoder(name)   # resolves the weights offline; says where to put missing ones
    if text_encoder != "none":     # "none": the method reads the captions itself
        text_mod.create_text_encoder(text_encoder or text_mod.DEFAULT_TEXT_ENCODER).check_available()
