"""Datasets: the data model, one reader per format, the built-in demo."""

from crossview.data.dataset import PairedDataset, TextCorpus
from crossview.data.readers import READERS, detect_format, known_formats, load_dataset

__all__ = ["PairedDataset", "TextCorpus", "READERS", "detect_format", "known_formats", "load_dataset"]
