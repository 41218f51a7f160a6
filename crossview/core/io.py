"""Files CrossView writes (run folders, the feature cache, checkpoints), so nothing the user made is ever half-written.

- :func:`atomic_write_bytes` / :func:`atomic_write_json`: a temp file in the same folder, flushed and
  fsync'ed, then ``os.replace``'d over the target (atomic on POSIX and Windows). A crash or SIGKILL at
  any point leaves either the old file or the new one, never a mixture.
- :func:`save_checkpoint` / :func:`load_checkpoint`: ``torch.save`` into such a temp file, read back
  with ``torch.load(weights_only=True)``: a checkpoint holds tensors and plain Python values only
  (numpy arrays and scalars are stored in a tagged form, see :func:`to_plain`), so opening a run
  folder someone sent you can never execute code. ``"format": 2`` is checked on load. Entries that hold numpy
  arrays only (``load_checkpoint(keys=...)``) are read without importing torch, by an unpickler as strict.
- :func:`read_npz` / :func:`open_npy` / :func:`load_torch_file`: every ``.npz`` archive, every ``.npy`` array from
  elsewhere and every ``torch.load`` of a file is read through these: arrays only (``allow_pickle=False``) and
  tensors only (``weights_only=True``), and a damaged, foreign or malicious file is one plain line naming it, never
  numpy's or torch's traceback or advice to load it unsafely.
- :class:`EventLog`: ``metrics.jsonl``, one event per line, appended and flushed as it happens;
  :func:`read_events` reads it back and skips a torn last line (a crash mid-append).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from crossview.core.errors import CrossViewError, StorageError, is_storage_error, storage_error

__all__ = ["atomic_write_bytes", "check_writable_folder", "atomic_write_json", "atomic_writer", "read_json", "read_json_object",
           "save_checkpoint", "load_checkpoint", "to_plain", "from_plain", "CHECKPOINT_FORMAT", "EventLog",
           "read_events", "drop_pages", "mapped_arrays", "scratch_array", "read_npz", "NpzFileError",
           "open_npy", "NpyFileError", "load_torch_file", "TorchFileError"]

#: The version of the checkpoint layout; files without it (or with another) are refused with a clear line.
CHECKPOINT_FORMAT = 2


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows cannot open folders; the rename is durable enough there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_writer(path: str | Path, write: Callable[[BinaryIO], None], size: int | None = None) -> Path:
    """Call ``write(f)`` on a temp file beside ``path`` and rename it over ``path`` once complete.

    If ``write`` raises (or the process dies) the temp file is removed (or left as ``.*.tmp``, which
    is never read) and ``path`` keeps its previous content. A full disk or an unwritable folder raises
    :class:`~crossview.core.errors.StorageError` (one line naming ``path``, and ``size``, the bytes the write
    needed, when given).
    """
    path = Path(path)
    try:
        return _atomic_writer(path, write)
    except OSError as e:
        if is_storage_error(e) and not isinstance(e, StorageError):
            raise storage_error(e, path, size) from None
        raise


def _atomic_writer(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def check_writable_folder(folder: str | Path, what: str = "") -> None:
    """Raise :class:`~crossview.core.errors.StorageError` (one line naming ``folder``, after ``what``, e.g.
    ``"--out"``) unless a file can be created in ``folder``; tried for real (a temp file made and removed), so a
    read-only file system and a folder of another user are caught wherever permission bits would not say."""
    folder = Path(folder)
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".crossview-write-test."):
            pass
    except OSError as e:
        if is_storage_error(e):
            err = storage_error(e, folder)
            if what:
                err = StorageError(err.errno, f"{what} {err.message}", err.filename)
            raise err from None
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_writer(path, lambda f: f.write(data), size=len(data))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically (numpy values converted)."""
    from crossview.core.events import _jsonable
    text = json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n"
    return atomic_write_bytes(path, text.encode("utf-8"))


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; a missing or malformed file raises :class:`CrossViewError` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CrossViewError(f"{path}: file not found") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CrossViewError(f"{path}: not valid JSON ({type(e).__name__}: {str(e)[:120]}); the file is damaged, "
                             "delete it or the run") from None
    except OSError as e:
        raise CrossViewError(f"{path}: cannot read ({e.strerror or e})") from None


_MAX_JSON_BYTES = 64 * 2**20   # config / status / summary files are a few KiB


def _check_regular_file(path: Path, todo: str, max_bytes: int | None = None) -> None:
    """Refuse what would hang or swamp a reader: a FIFO, a device or a folder in place of a file, or a
    file over ``max_bytes``. A missing file passes (the caller's read says so)."""
    import stat

    try:
        st = path.stat()
    except FileNotFoundError:
        return
    except (OSError, RuntimeError) as e:   # RuntimeError: a symlink loop on some Pythons
        raise CrossViewError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e}); {todo}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CrossViewError(f"{path}: not a regular file; {todo}")
    if max_bytes is not None and st.st_size > max_bytes:
        raise CrossViewError(f"{path}: {st.st_size} bytes, far too large for this file; {todo}")


_JSON_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true/false", dict: "an object",
                    list: "a list", type(None): "null"}


def _type_ok(value: Any, want: type | tuple[type, ...]) -> bool:
    wants = want if isinstance(want, tuple) else (want,)
    if isinstance(value, bool):          # JSON true/false is not a number here
        return bool in wants
    if isinstance(value, int) and float in wants:
        return True
    return isinstance(value, wants)


def _type_name(want: type | tuple[type, ...]) -> str:
    wants = want if isinstance(want, tuple) else (want,)
    return " or ".join(_JSON_TYPE_NAMES.get(w, w.__name__) for w in wants)


def read_json_object(path: str | Path, required: dict[str, Any] | None = None,
                     optional: dict[str, Any] | None = None, hint: str = "") -> dict[str, Any]:
    """A JSON file that must hold an object, checked: ``required`` keys must be present and, like the
    ``optional`` ones when present, of the given type(s) (``int``, ``float`` (an int is accepted),
    ``str``, ``dict``, ``list``, ``type(None)`` or a tuple of them).

    Anything else (missing, not UTF-8, not JSON, too deep, a list, a key of the wrong type) raises
    :class:`CrossViewError` with one line naming the file, the key and ``hint`` (what to do).
    """
    path = Path(path)
    todo = hint or "the file is damaged; restore it or delete the run folder"
    _check_regular_file(path, todo, max_bytes=_MAX_JSON_BYTES)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CrossViewError(f"{path}: file not found; {todo}") from None
    except OSError as e:
        raise CrossViewError(f"{path}: cannot read ({e.strerror or e}); {todo}") from None
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CrossViewError(f"{path}: not UTF-8 text (byte {e.start}); {todo}") from None
    except RecursionError:
        raise CrossViewError(f"{path}: JSON nested too deeply; {todo}") from None
    except ValueError as e:   # JSONDecodeError, and int() limits of huge numbers
        raise CrossViewError(f"{path}: not valid JSON ({str(e)[:120]}); {todo}") from None
    if not isinstance(obj, dict):
        raise CrossViewError(f"{path}: holds {_JSON_TYPE_NAMES.get(type(obj), type(obj).__name__)}, not a JSON "
                             f"object; {todo}")
    for key, want in (required or {}).items():
        if key not in obj:
            raise CrossViewError(f"{path}: no {key!r}; {todo}")
    for key, want in {**(optional or {}), **(required or {})}.items():
        if key in obj and not _type_ok(obj[key], want):
            raise CrossViewError(f"{path}: {key!r} should be {_type_name(want)}, got {obj[key]!r:.60}; {todo}")
    return obj


def _write_payload(f: BinaryIO, data: memoryview) -> None:
    """Write a chunk of a serialised checkpoint into the open temp file (a seam the SIGKILL test slows down)."""
    f.write(data)


# ---------------------------------------------------------------------------------------- plain trees
# Why torch.load(weights_only=True) and not safetensors + JSON: the method states are nested trees
# (dicts of arrays, lists of dicts, RNG tuples, big Python ints) that JSON would need a second encoding
# for, and torch's weights-only unpickler already refuses every global outside tensors and builtin
# containers. Numpy values are turned into tensors with their dtype named beside them.
_ND, _NPS, _SET, _DICT = "__ndarray__", "__npscalar__", "__set__", "__dict_items__"
_TAGS = (_ND, _NPS, _SET, _DICT)
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _array_to_plain(a: Any) -> dict[str, Any]:
    import numpy as np
    import torch

    dtype = a.dtype
    if dtype.kind in "biufc":
        native_dtype = dtype.newbyteorder("=")
        native = np.ascontiguousarray(a, dtype=native_dtype)
        if dtype.kind == "u" and dtype.itemsize > 1:   # torch has no general unsigned 16/32/64-bit storage
            native = native.view(f"i{dtype.itemsize}")
        if isinstance(a, np.memmap) and native.nbytes > _SINK_CHUNK and native.flags.writeable:
            # file-backed (the best epoch's weights at size): one storage per chunk, so torch reads (for its CRC)
            # and writes a chunk at a time and the sink gives each chunk's pages back (never resident whole)
            flat = native.reshape(-1)
            step = max(1, _SINK_CHUNK // native.itemsize)
            return {_ND: [torch.from_numpy(flat[i:i + step]) for i in range(0, flat.size, step)],
                    "dtype": native_dtype.str, "shape": list(a.shape), "chunked": True}
        if not native.flags.writeable:   # shared, not copied (torch.save only reads it; torch warns all the same)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                return {_ND: torch.as_tensor(native), "dtype": native_dtype.str, "shape": list(a.shape)}
        return {_ND: torch.from_numpy(native), "dtype": native_dtype.str, "shape": list(a.shape)}
    if dtype.kind in "US":
        return {_ND: a.tolist(), "dtype": dtype.str, "shape": list(a.shape)}
    if dtype.kind == "O":
        return {_ND: [to_plain(x) for x in a.ravel().tolist()], "dtype": "object", "shape": list(a.shape)}
    raise CrossViewError(f"cannot store a numpy array of dtype {dtype} in a checkpoint")


def to_plain(obj: Any, _memo: dict[int, tuple[Any, Any]] | None = None) -> Any:
    """``obj`` as a tree that ``torch.load(weights_only=True)`` reads: tensors, ``None``, bool, int,
    float, complex, str, bytes, lists, tuples and dicts. Numpy arrays become
    ``{"__ndarray__": tensor, "dtype": "<f8", "shape": [...]}`` (string arrays a list, object arrays a
    list of plain values), numpy scalars ``{"__npscalar__": value, "dtype": ...}``, sets
    ``{"__set__": [...]}``. :func:`from_plain` undoes it. Anything else raises :class:`CrossViewError`.

    An array met twice in ``obj`` (a finished run's weights are also its best epoch's) becomes one plain entry: the
    checkpoint holds its bytes once and reads back as two arrays over one memory."""
    import numpy as np
    import torch

    memo: dict[int, tuple[Any, Any]] = {} if _memo is None else _memo
    if isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, np.ndarray):
        seen = memo.get(id(obj))
        if seen is not None and seen[0] is obj:
            return seen[1]
        plain = _array_to_plain(obj)
        memo[id(obj)] = (obj, plain)
        return plain
    if isinstance(obj, np.generic):
        if obj.dtype.kind not in "biufcUS":
            raise CrossViewError(f"cannot store a numpy scalar of dtype {obj.dtype} in a checkpoint")
        return {_NPS: obj.item(), "dtype": obj.dtype.str}
    if isinstance(obj, dict):
        items = {to_plain(k) if not isinstance(k, str) else k: to_plain(v, memo) for k, v in obj.items()}
        if any(isinstance(k, str) and k in _TAGS for k in obj):   # a user dict that looks like a tag
            return {_DICT: [[k, v] for k, v in items.items()]}
        return items
    if isinstance(obj, tuple):
        return tuple(to_plain(x, memo) for x in obj)
    if isinstance(obj, list):
        return [to_plain(x, memo) for x in obj]
    if isinstance(obj, (set, frozenset)):
        return {_SET: [to_plain(x, memo) for x in obj]}
    if isinstance(obj, (torch.dtype, torch.Size)):
        return obj
    if isinstance(obj, os.PathLike):   # a path in a spec or a parameter: its text is what matters
        return os.fspath(obj)
    raise CrossViewError(f"cannot store a {type(obj).__module__}.{type(obj).__qualname__} in a checkpoint: "
                         "checkpoints hold tensors, arrays and plain Python values only (convert it in "
                         "state_dict())")


def from_plain(obj: Any) -> Any:
    """The tree :func:`to_plain` was given (numpy arrays, scalars and sets restored). An array's data may be
    a tensor or, read without torch (:func:`_read_plain_without_torch`), a numpy array of the tensor's dtype."""
    import sys

    import numpy as np

    if isinstance(obj, dict):
        if _ND in obj and "dtype" in obj:
            data, dtype = obj[_ND], np.dtype(str(obj["dtype"])) if obj["dtype"] != "object" else np.dtype(object)
            if dtype.kind not in "biufcUSO":
                raise ValueError(f"array dtype {dtype} is not one CrossView writes")
            shape = tuple(int(x) for x in obj.get("shape", ()))
            torch = sys.modules.get("torch")     # a tensor exists only when torch is imported
            if obj.get("chunked") is True and isinstance(data, list) and dtype.kind in "biufc":
                parts = [d if isinstance(d, np.ndarray) else d.numpy() if torch is not None and
                         isinstance(d, torch.Tensor) else None for d in data]
                if not parts or any(p is None for p in parts):
                    raise ValueError("a chunked array with a piece that is not an array")
                data = np.concatenate([p.reshape(-1) for p in parts])
            if isinstance(data, np.ndarray) or (torch is not None and isinstance(data, torch.Tensor)):
                arr = data if isinstance(data, np.ndarray) else data.numpy()
                if dtype.kind == "u" and dtype.itemsize > 1:
                    arr = arr.view(dtype)
                return arr.reshape(shape) if arr.shape != shape else arr
            if dtype.kind == "O":
                out = np.empty(len(data), dtype=object)
                out[:] = [from_plain(x) for x in data] if data else []
                return out.reshape(shape)
            return np.array(data, dtype=dtype).reshape(shape)
        if _NPS in obj and "dtype" in obj:
            if np.dtype(str(obj["dtype"])).kind not in "biufcUS":
                raise ValueError(f"scalar dtype {obj['dtype']} is not one CrossView writes")
            return np.array(obj[_NPS], dtype=np.dtype(str(obj["dtype"])))[()]
        if _SET in obj and len(obj) == 1:
            return {from_plain(x) for x in obj[_SET]}
        if _DICT in obj and len(obj) == 1:
            return {from_plain(k): from_plain(v) for k, v in obj[_DICT]}
        return {from_plain(k): from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_plain(x) for x in obj]
    if isinstance(obj, tuple):
        return tuple(from_plain(x) for x in obj)
    return obj


def save_checkpoint(path: str | Path, obj: dict[str, Any]) -> Path:
    """Write ``obj`` (a dict of tensors, numpy and plain Python values) to ``path`` atomically, as
    ``torch.save({"format": 2, ...})`` of its :func:`to_plain` form (temp file, then ``os.replace``). Memory-mapped
    arrays in ``obj`` (file-backed scratch, e.g. the best epoch's weights at COCO size) are read a chunk at a time:
    their pages leave the resident set as they are written."""
    import torch

    payload = to_plain({**obj, "format": CHECKPOINT_FORMAT})
    # streamed into the temp file as torch writes it, not serialised into memory first: a COCO-size TIMAM's
    # classifier and its optimiser's moments are ~0.7 GB, and a buffer of them doubled that at every save (issue 34)
    mapped = mapped_arrays(obj)
    return atomic_writer(path, lambda f: torch.save(payload, _Sink(f, mapped)), size=_tensor_bytes(payload))


#: the largest piece of a serialised checkpoint written at once (torch hands over each tensor's bytes whole)
_SINK_CHUNK = 16 * 2**20


def mapped_arrays(tree: Any, out: list[Any] | None = None) -> list[Any]:
    """The memory-mapped numpy arrays in a tree of dicts, lists and tuples."""
    import numpy as np

    out = [] if out is None else out
    if isinstance(tree, np.memmap):
        out.append(tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            mapped_arrays(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            mapped_arrays(v, out)
    return out


class _Sink:
    """The file-like object ``torch.save`` writes into: every chunk (at most ``_SINK_CHUNK`` bytes) goes through
    :func:`_write_payload`; after each, the pages of ``mapped`` (memory-mapped arrays being saved) read so far are
    given back (:func:`drop_pages`), so a file-backed array is never resident whole while it is written."""

    def __init__(self, f: BinaryIO, mapped: list[Any] | None = None) -> None:
        self.f = f
        self.mapped = mapped or []

    def write(self, data: Any) -> int:
        view = memoryview(data)
        try:
            view = view.cast("B")
        except TypeError:          # not C-contiguous: written as it is
            _write_payload(self.f, view)
            return view.nbytes
        for start in range(0, view.nbytes, _SINK_CHUNK):
            _write_payload(self.f, view[start:start + _SINK_CHUNK])
            for a in self.mapped:
                drop_pages(a)
        return view.nbytes

    def flush(self) -> None:
        self.f.flush()


def _tensor_bytes(tree: Any) -> int:
    """Bytes of the tensors in a :func:`to_plain` tree (what a checkpoint of it needs on disk, near enough)."""
    import torch

    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_tensor_bytes(v) for v in tree)
    return 0


def _numpy_file_reason(path: Path, e: BaseException, want: str) -> str:
    """Why ``np.load(path, allow_pickle=False)`` failed on what should be a ``want`` (``".npz"``, or ``".npy"``,
    memory-mapped), in plain words: numpy's own text for a file that is not a zip ("... contains pickled (object)
    data. If you trust the file you can load it unsafely ...") would advise running what may be a planted pickle,
    and its header parser raises SyntaxError, tokenize.TokenError, RecursionError... on a damaged ``.npy``."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as os_e:
        return f"cannot read it: {os_e.strerror or os_e}"
    if not head:
        return "it is empty"
    npy, npz = head.startswith(b"\x93NUMPY"), head.startswith(b"PK")
    text = str(e)
    if want == ".npz":
        if npy:
            return "it is a single .npy array, not an .npz archive"
        if not npz:
            return "it is not a zip archive of arrays"
        if isinstance(e, ValueError) and "allow_pickle" in text:
            return "it holds pickled Python objects, which CrossView never loads"
        return "the archive is damaged or cut short"
    if npz:
        return "it is an .npz archive, not a single .npy array"
    if not npy:
        return "not a .npy file: another format, or pickled Python objects, which CrossView never loads"
    if "Python objects" in text:
        return "it holds Python objects, which CrossView never loads"
    if "greater than file size" in text:
        return "it is cut short: its data is shorter than its header says"
    return "its header is damaged"


class NpzFileError(CrossViewError):
    """An ``.npz`` file :func:`read_npz` cannot read as arrays; ``reason``: why, in plain words."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def read_npz(path: str | Path, keys: tuple[str, ...] | None = None, *, todo: str) -> dict[str, Any]:
    """The arrays of the ``.npz`` archive at ``path`` (``keys``: only those of them it holds), read into memory
    without unpickling anything (``allow_pickle=False``).

    A missing file, a folder, or a file that is not an archive of plain arrays as CrossView writes them (damaged,
    cut short, another format, pickled objects) raises :class:`NpzFileError`: one line naming ``path``, saying
    why, and ``todo`` (what to do, e.g. ``"train the run again"``)."""
    import zipfile
    import zlib

    import numpy as np

    path = Path(path)
    _check_regular_file(path, todo)
    if not path.exists():
        raise NpzFileError(f"{path}: no such file; {todo}", "no such file")
    try:
        with np.load(path, allow_pickle=False) as z:     # an .npy gives an array, no context manager: TypeError
            return {k: np.asarray(z[k]) for k in z.files if keys is None or k in keys}
    except (OSError, ValueError, EOFError, KeyError, AttributeError, TypeError, zipfile.BadZipFile, zlib.error,
            NotImplementedError, RuntimeError) as e:
        if isinstance(e, (PermissionError, IsADirectoryError)):
            why = f"cannot read it: {e.strerror or e}"
            raise NpzFileError(f"{path}: {why}; {todo}", why) from None
        why = _numpy_file_reason(path, e, ".npz")
        raise NpzFileError(f"{path}: not a valid .npz written by CrossView ({why}): it is damaged or comes from "
                           f"elsewhere; {todo}", why) from None


class NpyFileError(CrossViewError):
    """A ``.npy`` file :func:`open_npy` cannot map as an array; ``reason``: why, in plain words."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def open_npy(path: str | Path, *, todo: str) -> Any:
    """The array in the ``.npy`` file at ``path``, opened as a read-only memmap (never unpickling anything).

    A missing file, a folder or FIFO, or a file that is not a plain ``.npy`` array (damaged header, cut short,
    an ``.npz`` archive, pickled or object data) raises :class:`NpyFileError`: one line naming ``path``, saying why
    and ``todo`` (what to do, e.g. ``"save the gallery with numpy.save"``)."""
    import numpy as np

    path = Path(path)
    _check_regular_file(path, todo)
    if not path.exists():
        raise NpyFileError(f"{path}: no such file; {todo}", "no such file")
    try:
        with np.errstate(all="ignore"):   # a huge shape in a damaged header overflows numpy's size check
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - numpy's header parser (tokenize + ast.literal_eval, never eval)
        if isinstance(e, (PermissionError, IsADirectoryError)):
            why = f"cannot read it: {e.strerror or e}"
        else:
            why = _numpy_file_reason(path, e, ".npy")
        raise NpyFileError(f"{path}: not a readable .npy array ({why}); {todo}", why) from None
    if not isinstance(arr, np.ndarray):    # np.load gives an NpzFile for a zip archive
        arr.close()
        why = "it is an .npz archive, not a single .npy array"
        raise NpyFileError(f"{path}: not a readable .npy array ({why}); {todo}", why)
    return arr


class TorchFileError(CrossViewError):
    """A file :func:`load_torch_file` cannot read safely. ``reason``: why, in plain words (never torch's advice to
    turn ``weights_only`` off); ``refused``: the pickled global it asked for (``"posix.system"``), if that was it."""

    def __init__(self, path: Path, reason: str, refused: str | None = None) -> None:
        super().__init__(f"{path}: not a file CrossView can read safely ({reason})")
        self.path, self.reason, self.refused = path, reason, refused


def _torch_reason(path: Path, e: BaseException) -> tuple[str, str | None]:
    """``(reason, refused global)`` of a ``torch.load(weights_only=True)`` failure, without torch's text: it tells
    the reader to re-run with weights-only loading turned off (which would run the file's code), or stops
    mid-sentence."""
    import pickle

    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as os_e:
        return f"cannot read it: {os_e.strerror or os_e}", None
    if not head:
        return "it is empty", None
    if isinstance(e, pickle.UnpicklingError):
        name = _refused_global(e)
        if name is not None:
            return f"it asks to run or build {name}, which CrossView never loads", name
        return "it is not a PyTorch file of tensors: neither torch.save's archive nor a pickle of tensors", None
    if head.startswith(b"PK"):      # torch.save's zip archive: missing its directory, or cut inside a record
        return "its archive is cut short or damaged", None
    if isinstance(e, EOFError):
        return "it ends too early: it is cut short", None
    return f"it is not a PyTorch file of tensors, or it is damaged ({type(e).__name__})", None


def load_torch_file(path: str | Path) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)``: tensors and plain Python values only, so a
    planted ``__reduce__`` never runs. Any failure raises :class:`TorchFileError` (one line naming ``path``; the
    caller may reword it from ``reason`` / ``refused``)."""
    import torch

    path = Path(path)
    try:
        with warnings.catch_warnings():   # torch warns about pickle protocols of foreign files
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError, KeyError, zip errors...
        raise TorchFileError(path, *_torch_reason(path, e)) from None


def _refused_global(e: BaseException) -> str | None:
    import re
    m = re.search(r"GLOBAL ([\w.]+)", str(e)) or re.search(r"allowlist this global.*?\[([\w.]+)\]", str(e))
    return m.group(1) if m else None


def load_checkpoint(path: str | Path, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (on the CPU), without executing any code.

    ``torch.load(weights_only=True)`` refuses every pickled global that is not a tensor or a builtin
    container, so a planted ``__reduce__`` payload never runs. A missing, damaged, older (format 1) or
    foreign file raises :class:`CrossViewError` with one line naming it and what to do.

    ``keys``: only these entries are wanted (the others may be left out): when they hold numpy arrays and plain
    values only (a CCA run's matrices and TF-IDF encoder, not a deep model's weights), the file is read
    without importing torch (:func:`_read_plain_without_torch`; the app shows a run that way).
    """
    path = Path(path)
    if not path.is_file():
        raise CrossViewError(f"{path}: checkpoint not found; give a checkpoint.pt written by "
                             "'crossview train' or Method.save()")
    older = (f"{path}: not a checkpoint this version of CrossView can read safely: it was written by an older "
             "CrossView or by another program")
    todo = "; retrain (or resume from a checkpoint written by this version)"
    obj = _read_plain_without_torch(path, keys) if keys is not None else None
    if isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT:
        try:
            return from_plain(obj)  # type: ignore[no-any-return]
        except (ValueError, TypeError, KeyError, RuntimeError):
            pass                  # torch's reading below says what is wrong, in its words
    try:
        obj = load_torch_file(path)
    except TorchFileError as e:
        if e.refused is not None:        # a pickled global: an older CrossView's numpy arrays, or a planted payload
            raise CrossViewError(f"{older} ({e.reason}){todo}") from None
        raise CrossViewError(f"{path}: cannot read the checkpoint ({e.reason}); it is damaged or from another "
                             f"program{todo}") from None
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT:
        fmt = obj.get("format") if isinstance(obj, dict) else None
        what = f" (format {fmt!r}, this version reads {CHECKPOINT_FORMAT})" if fmt is not None else ""
        raise CrossViewError(older + what + todo)
    try:
        return from_plain(obj)  # type: ignore[no-any-return]
    except (ValueError, TypeError, KeyError, RuntimeError) as e:
        raise CrossViewError(f"{path}: the checkpoint is damaged ({type(e).__name__}: {str(e)[:200]}){todo}") from None


#: torch's storage types in a checkpoint's pickle, and the numpy dtype of their elements (little-endian files)
_STORAGE_DTYPES = {"DoubleStorage": "<f8", "FloatStorage": "<f4", "HalfStorage": "<f2", "LongStorage": "<i8",
                   "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1", "ByteStorage": "u1",
                   "BoolStorage": "?", "ComplexDoubleStorage": "<c16", "ComplexFloatStorage": "<c8"}


class _Unreadable(Exception):
    """Something :func:`_read_plain_without_torch` does not read: torch reads the file instead."""


class _StorageType:
    """A torch storage type named by the pickle (never called: it only tags a storage's persistent id)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Tensor:
    """A tensor read without torch: its elements as a numpy array of its shape."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array


def _rebuild_tensor(storage: Any, offset: int, size: Any, stride: Any, requires_grad: bool = False,
                    hooks: Any = None, metadata: Any = None) -> _Tensor:
    """``torch._utils._rebuild_tensor_v2`` for a contiguous tensor of a storage read as a numpy array; any other
    tensor is kept without its elements (``array`` None: an entry holding it is left to torch)."""
    import math

    if not hasattr(storage, "dtype") or not isinstance(offset, int) or requires_grad or hooks or metadata:
        return _Tensor(None)
    size, stride = tuple(int(n) for n in size), tuple(int(n) for n in stride)
    n = math.prod(size)
    contiguous = tuple(math.prod(size[i + 1:]) for i in range(len(size)))
    if any(d < 0 for d in size) or offset < 0 or offset + n > len(storage) or len(stride) != len(size) or \
            (n > 1 and any(a != b for a, b, d in zip(stride, contiguous, size) if d > 1)):
        return _Tensor(None)
    return _Tensor(storage[offset:offset + n].reshape(size))


def _read_plain_without_torch(path: Path, keys: tuple[str, ...]) -> Any:
    """The entries ``keys`` (and ``"format"``) of what ``torch.load(path, weights_only=True)`` returns, when
    every tensor in them carries a numpy array (``{"__ndarray__": tensor, ...}``, :func:`to_plain`): the same
    tree with numpy arrays for those tensors, read without importing torch (2-3 s a process would spend only
    to read a CCA run's matrices). None otherwise (a bare tensor in them, a storage type, global or layout this
    does not know, a damaged file): torch reads the file.

    As safe as ``weights_only``: the unpickler finds no global but ``collections.OrderedDict``, torch's tensor
    rebuild (here :func:`_rebuild_tensor`, a contiguous view of a storage, bounds checked) and the storage types
    (tags, never called); storages are the zip's stored (uncompressed) entries of the size the pickle says."""
    import collections
    import pickle
    import zipfile

    import numpy as np

    def find_global(module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise _Unreadable(f"global {module}.{name}")

    def convert(obj: Any) -> Any:
        if isinstance(obj, _Tensor):
            raise _Unreadable("a tensor outside an array's tag")
        if isinstance(obj, dict):
            out = type(obj)()
            for k, v in obj.items():
                if k == _ND and isinstance(v, _Tensor) and isinstance(v.array, np.ndarray):
                    out[k] = v.array
                elif k == _ND and isinstance(v, list) and v and all(
                        isinstance(x, _Tensor) and isinstance(x.array, np.ndarray) for x in v):
                    out[k] = [x.array for x in v]         # a chunked array's pieces
                else:
                    out[convert(k)] = convert(v)
            return out
        if isinstance(obj, list):
            return [convert(x) for x in obj]
        if isinstance(obj, tuple):
            return tuple(convert(x) for x in obj)
        if obj is None or isinstance(obj, _PLAIN):
            return obj
        raise _Unreadable(f"a {type(obj).__name__}")

    try:
        with zipfile.ZipFile(path) as z:
            infos = {i.filename: i for i in z.infolist()}
            pickles = [name for name in infos if name.endswith("/data.pkl") and name.count("/") == 1]
            if len(pickles) != 1:
                return None
            prefix = pickles[0][:-len("data.pkl")]
            if prefix + "byteorder" in infos and z.read(prefix + "byteorder") != b"little":
                return None

            def load_storage(pid: Any) -> Any:
                if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                        and isinstance(pid[1], _StorageType) and isinstance(pid[2], str) and isinstance(pid[4], int)):
                    raise _Unreadable("a persistent id that is not a storage")
                dtype = np.dtype(_STORAGE_DTYPES[pid[1].name])
                info = infos.get(f"{prefix}data/{pid[2]}")
                if info is None or info.compress_type != zipfile.ZIP_STORED or \
                        info.file_size != pid[4] * dtype.itemsize:
                    raise _Unreadable("a storage that is not stored as its size says")
                return np.frombuffer(bytearray(z.read(info)), dtype)

            class Unpickler(pickle.Unpickler):
                def find_class(self, module: str, name: str) -> Any:
                    return find_global(module, name)

                def persistent_load(self, pid: Any) -> Any:
                    return load_storage(pid)

            obj = Unpickler(io.BytesIO(z.read(pickles[0]))).load()
            if not isinstance(obj, dict):
                return None
            return convert({k: obj[k] for k in (*keys, "format") if k in obj})
    except Exception:  # noqa: BLE001 - anything unexpected: torch reads the file and says what is wrong
        return None


class EventLog:
    """``metrics.jsonl``: one JSON object per line, appended, flushed and fsync'ed per event.

    Each line is ``event.to_dict()`` plus ``"time"`` (seconds since the epoch) and ``"t"`` (seconds
    since the log was opened).
    """

    def __init__(self, path: str | Path, fsync: bool = True) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._start = time.monotonic()
        try:
            self._open()
        except OSError as e:
            if is_storage_error(e):
                raise storage_error(e, self.path) from None
            raise

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A torn last line (crash mid-append) must not glue itself to the next event.
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            if torn:
                with open(self.path, "ab") as f:
                    f.write(b"\n")
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, event: Any) -> None:
        """Append one event (an :class:`~crossview.core.events.Event` or a plain dict)."""
        d = event.to_dict() if hasattr(event, "to_dict") else dict(event)
        d = {**d, "time": round(time.time(), 3), "t": round(time.monotonic() - self._start, 3)}
        line = json.dumps(d) + "\n"
        try:
            self._f.write(line)
            self._f.flush()
            if self._fsync:
                os.fsync(self._f.fileno())
        except OSError as e:
            if is_storage_error(e):
                raise storage_error(e, self.path, len(line.encode("utf-8"))) from None
            raise

    def size(self) -> int:
        """Bytes in the log so far (everything written is flushed): where the next event will start."""
        self._f.flush()
        return os.fstat(self._f.fileno()).st_size

    def close(self) -> None:
        if not self._f.closed:
            try:
                self._f.close()
            except OSError:     # the last buffered line on a full disk: the write that failed said so already
                pass

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_events(path: str | Path) -> Iterator[dict[str, Any]]:
    """The events of a ``metrics.jsonl`` as dicts, skipping lines that are not a JSON object in UTF-8
    (a torn write, a damaged byte): one bad line costs that line only. A missing file yields nothing."""
    _check_regular_file(Path(path), "it should be the run's metrics.jsonl")
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    except OSError as e:
        raise CrossViewError(f"{path}: cannot read ({e.strerror or e})") from None
    with f:
        for raw in f:
            try:
                line = raw.decode("utf-8").strip()
                if not line:
                    continue
                d = json.loads(line)
            except (ValueError, RecursionError):   # UnicodeDecodeError and JSONDecodeError are ValueErrors
                continue
            if isinstance(d, dict):
                yield d


def drop_pages(arr: Any) -> None:
    """Tell the kernel this process is done with the pages of a memory-mapped array read so far (``madvise
    MADV_DONTNEED``): they leave the resident set (a later read maps them again from the file or the page cache),
    so checking or copying a large ``.npy`` does not hold a second resident copy of it. A no-op for other arrays
    and where ``madvise`` is missing."""
    import mmap

    # the mapping of a np.memmap, or of a plain view of one (np.asarray and slices drop the memmap class but keep
    # it as a base)
    m, seen = None, 0
    while arr is not None and seen < 8:
        if isinstance(arr, mmap.mmap):
            m = arr
            break
        m = getattr(arr, "_mmap", None)
        if m is not None:
            break
        arr, seen = getattr(arr, "base", None), seen + 1
    if m is None or not hasattr(m, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    try:
        m.madvise(mmap.MADV_DONTNEED)
    except (OSError, ValueError):
        pass


#: arrays at least this large that a run derives from its features (the normalised image features) are backed by a
#: scratch file rather than by anonymous memory (:func:`scratch_array`)
SCRATCH_BYTES = 256 * 2**20


def scratch_array(shape: tuple[int, ...], dtype: Any = "float32", folder: str | Path | None = None, *,
                  min_bytes: int | None = None) -> Any:
    """A zeroed writable array of ``shape``: for ``min_bytes`` (default ``SCRATCH_BYTES``) or more, backed by an
    unlinked temporary file in ``folder`` (default: the cache folder's ``scratch``), else (and where no such file can
    be made: a full disk, an unwritable folder) in memory.

    A file-backed array is what the run's own derived data should be at COCO size (issue 34): its pages leave the
    resident set once a step is done with them (:func:`drop_pages`: the evaluation after training reads 10K rows of
    a 120K-row matrix) and are written back to the file under memory pressure instead of being swapped; the file has
    no name, so nothing is left behind whatever way the process ends."""
    import numpy as np

    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < (SCRATCH_BYTES if min_bytes is None else int(min_bytes)) or nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    if folder is None:
        from crossview.core.settings import get_settings

        folder = get_settings().cache_dir / "scratch"
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as f:
            f.truncate(nbytes)
            return np.memmap(f, dtype=dtype, mode="r+", shape=tuple(shape))   # the mapping keeps the file
    except (OSError, ValueError):
        return np.zeros(shape, dtype=dtype)
