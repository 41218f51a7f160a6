"""The Query panel's long first uses, visible and stoppable (issue 30): a photo folder's photos or a caption
corpus's captions put through the run's own encoders in the background, with a progress bar, an ETA and Cancel.

:class:`GalleryLoader` is a small widget (a line, a bar, a Cancel button; hidden while idle) that owns one
:class:`~crossview.gui.workers.Task`. :meth:`GalleryLoader.load` builds a new
:class:`~crossview.engine.retriever.Retriever` from the one in use (same fitted method, dataset, features, device and
index) over the chosen gallery: ``photos:<folder>`` (scanned with :func:`crossview.data.photos.load_photo_folder`,
encoded through :mod:`crossview.features.photo_cache`, which keeps every batch encoded, so a cancelled folder
encodes only the rest the next time) or ``corpus:<file>`` (a text-only caption corpus, through the feature cache).
The outcome comes back as :attr:`~GalleryLoader.loaded`, :attr:`~GalleryLoader.cancelled` or
:attr:`~GalleryLoader.failed`; a newer :meth:`~GalleryLoader.load` supersedes the one in flight.

Run alone: ``python -m crossview.gui.gallery_loader FOLDER [RUN_DIR]`` encodes FOLDER's photos with the run (default:
a quick CCA on the demo) and shows the bar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QSizePolicy, QWidget

from crossview.core.progress import StageEta, format_seconds
from crossview.gui.galleries import CORPUS, PHOTOS, photos_label
from crossview.gui.workers import Task

__all__ = ["GalleryLoader", "gallery_source"]


def gallery_source(choice: str) -> tuple[str, str]:
    """``("photos" | "corpus", path)`` of a gallery choice ``photos:<folder>`` / ``corpus:<file>``; ValueError
    for any other choice (a split name is not loaded here)."""
    for prefix, kind in ((PHOTOS, "photos"), (CORPUS, "corpus")):
        if choice.startswith(prefix) and len(choice) > len(prefix):
            return kind, choice[len(prefix):]
    raise ValueError(f"not a photo folder or caption corpus gallery: {choice!r}")


class GalleryLoader(QWidget):
    """A gallery prepared in the background: what loads, a bar, the time left and Cancel (see the module docstring).

    Signals: :attr:`loaded` ``(retriever, choice)``; :attr:`cancelled` ``(choice, message)`` (the message says what
    was kept); :attr:`failed` ``(choice, message)``; :attr:`busy_changed` ``(bool)``.
    """

    loaded = Signal(object, str)
    cancelled = Signal(str, str)
    failed = Signal(str, str)
    busy_changed = Signal(bool)
    progress_changed = Signal(int, int)     # done, total of the stage shown

    #: photos a batch: cancel and the bar react within one batch (a CPU encodes a batch in about a second)
    photo_batch_size = 16

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.task: Task | None = None
        self.choice: str | None = None      #: the gallery loading now (None while idle)
        self.what = ""                       #: its name as the gallery box shows it
        self._eta = StageEta()
        self._done = self._total = 0
        self.label = QLabel("")
        self.label.setObjectName("galleryLoading")
        self.label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.bar = QProgressBar()
        self.bar.setMaximumWidth(320)
        self.bar.setMinimumWidth(160)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop encoding; what was encoded is kept in the cache, so choosing this "
                                      "gallery again encodes only the rest")
        self.cancel_button.clicked.connect(self.cancel)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label, 1)
        row.addWidget(self.bar)
        row.addWidget(self.cancel_button)
        self.hide()

    @property
    def busy(self) -> bool:
        return self.task is not None and self.task.is_running()

    # ------------------------------------------------------------------ asking
    def load(self, base: Any, choice: str) -> Task:
        """Prepare gallery ``choice`` (``photos:<folder>`` or ``corpus:<file>``) for the run that ``base`` (the
        :class:`~crossview.engine.retriever.Retriever` in use) queries; a load in flight is superseded."""
        from crossview.engine.retriever import Retriever

        kind, path = gallery_source(choice)
        if self.task is not None and self.task.is_running():
            self.task.cancel()                   # superseded: its outcome is dropped
        batch = self.photo_batch_size
        method, dataset, features = base.method, base.dataset, base.features
        options = dict(index_backend=base.index_backend, device=base.device, cache=getattr(base, "_cache", None),
                       model_key=getattr(base, "model_key", None))     # a corpus's embeddings cached per run

        def work(progress, should_stop):
            if kind == "photos":
                from crossview.data.photos import load_photo_folder
                gallery = load_photo_folder(path)
            else:
                from crossview.data.readers import load_dataset
                gallery = load_dataset(path, format="corpus")
            return Retriever(method, dataset, features, gallery=gallery, photo_batch_size=batch,
                             progress=lambda _stage, done, total: progress(done, total), should_stop=should_stop,
                             **options)

        self.choice = choice
        self.what = photos_label(path) if kind == "photos" else f"caption corpus {Path(path).name}"
        self._unit = "photos" if kind == "photos" else "captions"
        self._eta = StageEta()
        self._done = self._total = 0
        self._reported = False
        task = Task(work, name=f"gallery-{kind}", parent=self)
        self.task = task
        task.progress.connect(self._on_progress)
        task.succeeded.connect(self._on_succeeded)
        task.failed.connect(self._on_failed)
        task.finished.connect(self._on_finished)
        self.bar.setRange(0, 0)                  # busy until the first count: scanning, loading the encoder
        self.label.setText(f"Loading {self.what}: {'scanning the folder' if kind == 'photos' else 'reading'}...")
        self.cancel_button.setEnabled(True)
        self.show()
        self.busy_changed.emit(True)
        return task.start()

    def cancel(self) -> None:
        """Stop at the next batch; what was encoded is kept (:attr:`cancelled` says how much)."""
        if self.task is not None and self.task.is_running():
            self.task.cancel()
            self.cancel_button.setEnabled(False)
            self.label.setText(f"Cancelling {self.what} after this batch...")

    def stop(self, msecs: int = 5000) -> None:
        """Cancel and wait for the thread (closing)."""
        if self.task is not None and self.task.is_running():
            self.task.cancel()
            self.task.wait(msecs)

    # ------------------------------------------------------------------ outcome (bound slots: the sender is the task)
    def _current(self) -> bool:
        return self.sender() is self.task and self.task is not None

    def _on_progress(self, done: int, total: int) -> None:
        if not self._current():
            return
        self._done, self._total = done, total     # counted after Cancel too: the batch under way is kept
        self.bar.setRange(0, max(total, 1))
        self.bar.setValue(done)
        if self.task.cancelled:
            return
        eta = self._eta.update(self.choice or "", done / total if total else 1.0)
        left = f", about {format_seconds(eta)} left" if eta is not None else \
            (", estimating the time left..." if done < total else "")
        self.label.setText(f"Encoding {self.what} (first use only, then cached): {done:,} of {total:,} "
                           f"{self._unit}{left}")
        self.progress_changed.emit(done, total)

    def _on_succeeded(self, retriever: Any) -> None:
        if self._current():
            self._reported = True
            choice, self.choice = self.choice, None      # loaded: the gallery box no longer says "Loading"
            self.loaded.emit(retriever, choice)

    def _on_failed(self, message: str, details: str) -> None:
        if not self._current():
            return
        self._reported = True
        if self.task.cancelled:
            self._say_cancelled()
        else:
            self.failed.emit(self.choice, message)

    def _say_cancelled(self) -> None:
        done = f"{self._done:,} of {self._total:,} {self._unit} encoded" if self._total else "nothing encoded yet"
        if self._unit == "photos":     # the photo cache keeps every finished batch
            tail = " and kept; choosing it again encodes only the rest" if self._done else ""
        else:                          # a corpus is cached whole, once it is all encoded
            tail = "; a corpus is cached once it is all encoded, so choosing it again starts over" if self._done else ""
        self.cancelled.emit(self.choice, f"Cancelled {self.what}: {done}{tail}.")

    def _on_finished(self) -> None:
        if not self._current():
            return
        if not self._reported and self.task.cancelled:   # stopped after its last batch: nothing was raised
            self._say_cancelled()
        self.choice = None
        self.hide()
        self.busy_changed.emit(False)


if __name__ == "__main__":  # pragma: no cover - manual preview
    import sys

    from crossview.engine.session import open_run
    from crossview.gui.app import NO_DISPLAY, demo_run, ensure_app, exec_app, has_display
    if not has_display() or len(sys.argv) < 2:
        print(NO_DISPLAY if len(sys.argv) >= 2 else "usage: python -m crossview.gui.gallery_loader FOLDER [RUN_DIR]",
              file=sys.stderr)
        sys.exit(1)
    app = ensure_app()
    run = open_run(sys.argv[2] if len(sys.argv) > 2 else demo_run())
    loader = GalleryLoader()
    loader.loaded.connect(lambda r, c: print(f"{c}: {r.n_gallery_images} photos, {r.photos_encoded} encoded now"))
    loader.cancelled.connect(lambda c, m: print(m))
    loader.failed.connect(lambda c, m: print(m, file=sys.stderr))
    loader.busy_changed.connect(lambda busy: None if busy else app.quit())
    loader.load(run.retriever(), PHOTOS + str(Path(sys.argv[1]).resolve()))
    loader.resize(900, 40)
    sys.exit(exec_app(app))
