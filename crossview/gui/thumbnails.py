"""Thumbnails decoded off the GUI thread and kept in a bounded cache.

Decoding happens in a QThreadPool with QImageReader (scaled while decoding, which is much faster than
decoding full size and shrinking); the GUI thread only turns the finished QImage into a QPixmap.
Requests for items that scrolled out of view are cheap to drop: the newest requests run first.
"""

from __future__ import annotations

from collections import OrderedDict

from PySide6.QtCore import QObject, QRunnable, QSize, Qt, QThreadPool, Signal
from PySide6.QtGui import QColor, QImage, QImageReader, QPainter, QPixmap


class _Signals(QObject):
    loaded = Signal(str, QImage)


class _Decode(QRunnable):
    def __init__(self, path: str, size: int, signals: _Signals, upscale: bool = False) -> None:
        super().__init__()
        self.path, self.size, self.signals, self.upscale = path, size, signals, upscale
        self.setAutoDelete(True)

    def run(self) -> None:
        reader = QImageReader(self.path)
        reader.setAutoTransform(True)
        src = reader.size()
        if src.isValid() and (src.width() > self.size or src.height() > self.size):
            reader.setScaledSize(src.scaled(self.size, self.size, Qt.AspectRatioMode.KeepAspectRatio))
        img = reader.read()
        if self.upscale and not img.isNull() and max(img.width(), img.height()) < self.size:
            img = img.scaled(self.size, self.size, Qt.AspectRatioMode.KeepAspectRatio,
                             Qt.TransformationMode.SmoothTransformation)
        self.signals.loaded.emit(self.path, img)  # a null QImage marks an unreadable file


def placeholder(size: int, text: str = "") -> QPixmap:
    pm = QPixmap(size, size)
    pm.fill(QColor("#e6e8eb"))
    if text:
        p = QPainter(pm)
        p.setPen(QColor("#8a9099"))
        p.drawText(pm.rect(), Qt.AlignmentFlag.AlignCenter, text)
        p.end()
    return pm


class ThumbnailCache(QObject):
    """``get(path)`` returns a pixmap now (cached) or None and schedules a decode; ``ready`` fires later."""

    ready = Signal(str)

    def __init__(self, size: int = 112, capacity: int = 4000, threads: int = 2, parent: QObject | None = None,
                 upscale: bool = False) -> None:
        super().__init__(parent)
        self.size = size
        self.upscale = upscale   #: also enlarge images smaller than ``size`` (presentation mode)
        self.capacity = capacity
        self._cache: OrderedDict[str, QPixmap] = OrderedDict()
        self._pending: set[str] = set()
        self._failed: set[str] = set()
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(threads)
        self._signals = _Signals()
        self._signals.loaded.connect(self._on_loaded)
        self.broken = placeholder(size, "unreadable")
        self.loading = placeholder(size)
        # Decoder threads must be idle before Python finalises: a decode finishing during interpreter
        # shutdown emits into half-destroyed objects (seen as a "bool_dealloc" abort at exit).
        from PySide6.QtCore import QCoreApplication
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)

    def get(self, path: str) -> QPixmap | None:
        pm = self._cache.get(path)
        if pm is not None:
            self._cache.move_to_end(path)
            return pm
        if path in self._failed:
            return self.broken
        if path not in self._pending:
            self._pending.add(path)
            # newest first: what the user just scrolled to is what they look at
            self._pool.start(_Decode(path, self.size, self._signals, self.upscale), priority=len(self._pending))
        return None

    def clear_pending(self) -> None:
        """Drop decodes not started yet (e.g. after a big scroll or a new dataset)."""
        self._pool.clear()
        self._pending.clear()

    def shutdown(self, msecs: int = 5000) -> bool:
        """Drop queued decodes and wait for the running ones (at exit)."""
        self.clear_pending()
        return self._pool.waitForDone(msecs)

    def wait_idle(self, msecs: int = 10000) -> bool:
        return self._pool.waitForDone(msecs)

    def _on_loaded(self, path: str, img: QImage) -> None:
        self._pending.discard(path)
        if img.isNull():
            self._failed.add(path)
        else:
            self._cache[path] = QPixmap.fromImage(img)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        self.ready.emit(path)

    def thumbnail_size(self) -> QSize:
        return QSize(self.size, self.size)
