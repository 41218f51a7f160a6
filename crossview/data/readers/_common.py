"""Helpers every reader shares: reading files with clear errors, checking images, cleaning captions.

Dataset files come from elsewhere, so every helper here assumes hostile input: a FIFO or a device where
a file should be (opening it would block or never end), a symlink loop, a name too long for the file
system, JSON nested deeper than Python's stack, numbers with thousands of digits, CSV fields past the csv
module's limit, a byte-order mark. Each becomes a :class:`DatasetError` naming the file.
"""

from __future__ import annotations

import codecs
import csv
import errno
import functools
import io
import json
import math
import os
import posixpath
import re
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np

from crossview.core.errors import CrossViewError, DatasetError
from crossview.core.text import has_unsafe, printable
from crossview.data.dataset import KNOWN_SPLITS, SPLIT_ALIASES

_Read = TypeVar("_Read", bound=Callable[..., Any])

#: Image file suffixes the folder readers look for.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")

def one_line(text: str, limit: int = 300) -> str:
    """``text`` with line breaks, control characters and lone surrogates escaped (:func:`printable`, tabs
    kept) and cut to ``limit`` characters, for an error message."""
    text = printable(text, tabs=True)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def brief(value: Any, limit: int = 60) -> str:
    """The ``repr`` of a value from a file, cut to ``limit`` characters (a value may be megabytes long)."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # deeply nested, or an int past the digit limit
        text = f"<{type(value).__name__}>"
    return one_line(text, limit)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def _os_problem(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "a symlink loop (the link points back at itself)"
    if e.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system"
    return e.strerror or str(e)


def path_stat(path: Path, what: str = "file or folder") -> os.stat_result:
    """``os.stat`` of ``path`` (following links) with every failure as a :class:`DatasetError`."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise DatasetError(f"{what} not found", one_line(str(path)), hint="Check the path") from None
    except OSError as e:
        raise DatasetError(f"cannot open: {_os_problem(e)}", one_line(str(path))) from None
    except ValueError:  # an embedded NUL character
        raise DatasetError("not a valid path (it contains a NUL character)", one_line(repr(str(path)))) from None


def safe_resolve(path: str | Path) -> Path:
    """``Path(path).expanduser().resolve()``, with a symlink loop or a bad ``~user`` as a DatasetError."""
    try:
        return Path(path).expanduser().resolve()
    except RuntimeError as e:  # Python 3.11: "Symlink loop from ...", or "Could not determine home directory"
        problem = ("a symlink loop (the link points back at itself)" if "loop" in str(e).lower()
                   else f"cannot expand the path ({one_line(str(e))})")
        raise DatasetError(problem, one_line(str(path))) from None
    except OSError as e:
        raise DatasetError(f"cannot resolve the path: {_os_problem(e)}", one_line(str(path))) from None
    except ValueError:
        raise DatasetError("not a valid path (it contains a NUL character)", one_line(repr(str(path)))) from None


def require_file(path: Path, what: str = "file") -> Path:
    """``path`` when it is a regular file (after links); else an error saying what it is instead."""
    mode = path_stat(path, what).st_mode
    if not stat.S_ISREG(mode):
        kind = _kind(mode)
        raise DatasetError(f"expected a {what}, found {kind}" + ("" if kind == "a folder" else
                           " (not a regular file)"), path, hint="Give a regular file")
    return path


def check_source(path: str | Path) -> None:
    """A dataset path must be a folder or a regular file (links followed): a FIFO, device or socket is
    refused before any reader opens it (reading a FIFO blocks until someone writes to it; /dev/zero never
    ends). Errors name ``path`` as given, not where its links lead."""
    path = Path(path)
    if str(path).startswith("~"):
        path = safe_resolve(path)
    if not os.path.lexists(path):
        raise DatasetError("no such file or folder", one_line(str(path)),
                           hint="Give a dataset file or folder, or 'demo' for the built-in demo")
    mode = path_stat(path).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        require_file(path, "dataset file or folder")  # raises, saying what it is instead


def read_bytes(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a regular file (at most ``limit``). A FIFO, device or socket is refused before it
    can block: the file is opened non-blocking and checked with ``fstat`` on the open descriptor, so a
    file swapped for a FIFO after a check cannot slip through."""
    require_file(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise DatasetError(f"cannot read: {_os_problem(e)}", path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DatasetError(f"expected a file, found {_kind(mode)} (not a regular file)", path,
                               hint="Give a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read() if limit is None else f.read(limit)
    except OSError as e:
        raise DatasetError(f"cannot read: {_os_problem(e)}", path) from None
    except MemoryError:
        raise DatasetError("the file is too large to read into memory", path) from None
    finally:
        os.close(fd)


def read_head(path: Path, n: int = 4096) -> bytes:
    """The first ``n`` bytes of ``path`` for format detection; ``b""`` when it is not a readable
    regular file (detection must never block on a FIFO or raise)."""
    try:
        return read_bytes(path, n)
    except DatasetError:
        return b""


def read_text(path: Path) -> str:
    """A UTF-8 text file (a leading byte-order mark is dropped), with a clear error when it is not."""
    data = read_bytes(path)
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise DatasetError("UTF-16 text, not UTF-8", path, hint="Save the file as UTF-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"not UTF-8 text (byte {e.start}: {e.reason})", path,
                           hint="Save the file as UTF-8") from None


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object, refusing a key given twice (``json`` would keep the last one without a word)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _json_error(e: Exception) -> str:
    """The problem of a ``json.loads`` failure other than a syntax error."""
    if isinstance(e, _DuplicateKey):
        return f"the key {brief(e.key)} appears twice in one object"
    if isinstance(e, RecursionError):
        return "JSON nested too deeply to read"
    if "digits" in str(e):  # ValueError: Exceeds the limit (4300 digits) for integer string conversion
        return "a JSON number has too many digits (over 4,300)"
    return f"invalid JSON ({one_line(str(e), 120)})"


def load_json(text: str) -> Any:
    """``json.loads`` refusing duplicate keys; raises JSONDecodeError, RecursionError, ValueError or
    _DuplicateKey (see :func:`_json_error`)."""
    return json.loads(text, object_pairs_hook=_object)


def read_json(path: Path) -> Any:
    """A JSON file's document; any parse failure (syntax, nesting, huge numbers, duplicate keys) is one
    DatasetError naming the file."""
    text = read_text(path)
    try:
        return load_json(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}", path) from None
    except (RecursionError, ValueError, _DuplicateKey) as e:
        raise DatasetError(_json_error(e), path, hint="Check that the file is the dataset's JSON") from None


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yields (line number, object) for each non-blank line; a bad line is an error naming it."""
    for lineno, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = load_json(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"invalid JSON: {e.msg} (column {e.colno})", path, f"line {lineno}") from None
        except (RecursionError, ValueError, _DuplicateKey) as e:
            raise DatasetError(_json_error(e), path, f"line {lineno}") from None
        if not isinstance(obj, dict):
            raise DatasetError(f"expected a JSON object, got {type(obj).__name__}", path, f"line {lineno}")
        yield lineno, obj


#: Line ends as ``io.StringIO(newline="")`` and the csv module see them.
_LINE_ENDS = re.compile(r"\r\n|\r|\n")


def iter_csv(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict]]:
    """Yields (line number, row dict) of a CSV/TSV file with a header; checks the required columns.

    Column names are matched lower-cased; a column named twice is an error naming it. Parsing is strict,
    so that a quoting mistake is an error naming the line where its row starts instead of rows silently
    swallowed into one field:

    - a quote that is never closed (end of file inside a quoted field), or a closing quote followed by
      something other than the delimiter, is an error;
    - every row has as many fields as the header (more or fewer is an error; a blank line is skipped);
    - a quoted field may hold line breaks (CSV allows them: a caption written over two lines is kept),
      but no line after the row's first may look like a row: hold a whole row's worth of delimiters (as
      many as the header has columns, less one, counted without regard to quotes) with a first piece that
      does not end in the field's closing quote. That is the next rows swallowed by a quote opened earlier
      and closed by chance later. (So with two columns, a caption's second line may not hold a comma before
      its closing quote: ambiguous there, it is refused rather than guessed.)

    A field longer than the csv module's limit (131,072 characters, usually an unclosed quote) is an error
    naming the line.
    """
    text = read_text(path)
    if not text.strip():
        raise DatasetError("the file is empty", path)
    try:
        # The sniffer's regexes on a megabyte-long header line would take minutes: the start is enough. Only
        # its delimiter is used: from a header without quotes it also guesses doublequote=False, which would
        # read a quote written "" inside a quoted field as the field's end.
        delimiter = csv.Sniffer().sniff(text.lstrip("\r\n").splitlines()[0][:4096], delimiters=",\t;").delimiter
    except csv.Error:
        delimiter = ","
    # newline="": only \r and \n end a row (str.splitlines would also break a caption at U+2028 or \x85).
    reader = csv.reader(io.StringIO(text, newline=""), dialect=csv.excel, delimiter=delimiter, strict=True)
    physical = io.StringIO(text, newline="").readlines()  # the lines as the reader counts them
    header: list[str] = []
    try:
        while not header:
            header = next(reader)
    except StopIteration:
        raise DatasetError("the file is empty", path) from None
    except csv.Error as e:
        raise DatasetError(f"cannot parse the header ({one_line(str(e), 120)})", path, "line 1",
                           hint="Check for an unclosed quote in the first line") from None
    fields = [f.strip().lower() for f in header]
    seen: set[str] = set()
    for f in fields:
        if f in seen:
            raise DatasetError(f"column {brief(f)} appears twice in the header", path, "line 1",
                               hint="Name each column once")
        seen.add(f)
    missing = [c for c in required if c not in fields]
    if missing:
        raise DatasetError(f"missing column(s) {', '.join(missing)} in the header (found: "
                           f"{one_line(', '.join(fields), 200)})",
                           path, "line 1", hint=f"The first line must name the columns, e.g. {','.join(required)}")
    n_columns = len(fields)
    end = reader.line_num
    while True:
        start = end + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            problem = str(e)
            if "field larger than field limit" in problem:
                what = f"{one_line(problem, 80)}: a field over 131,072 characters (usually an unclosed quote)"
            elif "unexpected end of data" in problem or "expected after" in problem:
                what = (f"unclosed quote: the row that starts here runs on to line "
                        f"{reader.line_num} ({one_line(problem, 80)})")
            else:
                what = f"cannot parse CSV ({one_line(problem, 120)})"
            raise DatasetError(what, path, f"line {start}",
                               hint='Close the quote, and write a quote inside a quoted field as ""') from None
        end = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # a blank line
        if len(row) > n_columns:
            raise DatasetError(f"more fields ({len(row)}) than columns in the header ({n_columns}); quote fields "
                               f"that contain the delimiter", path, f"line {start}")
        if len(row) < n_columns:
            raise DatasetError(f"fewer fields ({len(row)}) than columns in the header ({n_columns})", path,
                               f"line {start}", hint="Give every column on every row (an empty value is allowed)")
        if end > start and n_columns > 1:
            # the physical lines after the row's first, read without regard to quotes: one with a whole row's
            # worth of delimiters is a row swallowed by a quote left open above it -- unless its first piece
            # ends in the quote that closes the field ('c.png",blue': the field ends, then the next column)
            for lineno in range(start + 1, end + 1):
                line = physical[lineno - 1]
                if (line.count(delimiter) >= n_columns - 1
                        and not line.split(delimiter, 1)[0].rstrip().endswith('"')):
                    raise DatasetError(
                        f"unclosed quote: a quoted field of the row that starts here runs on over {end - start + 1} "
                        f"lines, and line {lineno} inside it looks like a whole row ({brief(line.rstrip(), 60)})",
                        path, f"line {start}", hint='Close the quote, and write a quote inside a quoted field as ""')
        yield start, {f: v.strip() for f, v in zip(fields, row)}


@contextmanager
def guarded(path: str | Path | None) -> Iterator[None]:
    """The last line of defence around a reader: whatever escapes becomes one :class:`DatasetError` line
    naming ``path``. Readers raise precise errors themselves; this catches what they did not foresee
    (the exception's type stays in the message, and in ``__cause__``, so the gap can be fixed)."""
    where = None if path is None else one_line(str(path))
    try:
        yield
    except DatasetError as e:
        if e.path is None and where is not None and where not in str(e):
            raise DatasetError(one_line(e.problem), where, one_line(e.entry) if e.entry else None, e.hint) from None
        if len(str(e).splitlines()) > 1 or len(str(e)) > 1500:
            raise DatasetError(one_line(e.problem, 500), one_line(e.path, 500) if e.path else where,
                               one_line(e.entry) if e.entry else None,
                               one_line(e.hint) if e.hint else None) from None
        raise
    except CrossViewError:
        raise
    except RecursionError as e:
        raise DatasetError("nested too deeply to read", where, hint="Check that this is the dataset's file") from e
    except MemoryError as e:
        raise DatasetError("too large to read into memory", where) from e
    except Exception as e:  # noqa: BLE001 - the point of this guard: never a traceback on a dataset
        raise DatasetError(f"cannot read this dataset ({type(e).__name__}: {one_line(str(e), 160)})", where,
                           hint="The file looks damaged; check it, or report this message if it is valid") from e


def reader(read: _Read) -> _Read:
    """Decorates a reader's ``read(path, image_root=None)``: whatever it meets, it raises nothing but
    :class:`DatasetError` (one line naming ``path``), also when called directly rather than through
    ``load_dataset``."""
    @functools.wraps(read)
    def guarded_read(path: Path, image_root: Path | None = None) -> Any:
        with guarded(path):
            check_source(path)  # a FIFO or device is named as given, before links are resolved
            return read(path, image_root=image_root)
    return guarded_read  # type: ignore[return-value]


def detector(detect: Callable[[Path], bool]) -> Callable[[Path], bool]:
    """Decorates a reader's ``detect(path)``: a path that cannot be examined (a name too long for the
    file system, a NUL character, a loop) is not that format, rather than an exception."""
    @functools.wraps(detect)
    def safe_detect(path: Path) -> bool:
        try:
            return bool(detect(Path(path)))
        except (OSError, ValueError, RuntimeError):
            return False
    return safe_detect


def clean_caption(text: Any) -> str | None:
    """A caption with whitespace normalised, or None when it is empty or not text."""
    if not isinstance(text, str):
        return None
    text = " ".join(text.split())
    return text or None


def split_tags(value: Any) -> list[str]:
    """Tags from a JSON list or a string separated by commas, semicolons, '|' or spaces."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        for v in value:
            if (v is None or isinstance(v, (bool, list, tuple, dict))
                    or (isinstance(v, float) and not math.isfinite(v))):
                raise DatasetError(f"a list of tags or labels holds {type(v).__name__} {brief(v)}",
                                   hint="Give text items only, e.g. [\"dog\", \"grass\"]")
        items = [str(v) for v in value]
    else:
        s = str(value)
        for sep in (";", "|"):
            s = s.replace(sep, ",")
        items = s.split(",") if "," in s else s.split()
    out = []
    for t in items:
        t = " ".join(t.strip().lower().split())
        if t and t not in out:
            out.append(t)
    return out


def check_images_exist(paths: Sequence[str], source: Path, root: Path, entry_names: Sequence[str],
                       warnings: list[str], what: str = "image") -> np.ndarray:
    """Boolean mask of the images that exist. Missing ones are a warning with a count (the user
    usually wants the rest), but when none exist it is an error that points at the image root."""
    exists = np.fromiter((os.path.isfile(p) for p in paths), dtype=bool, count=len(paths))
    n_missing = int((~exists).sum())
    if len(paths) and n_missing == len(paths):
        raise DatasetError(
            f"none of the {len(paths)} {what}s it lists exist under {root} (first: {one_line(paths[0], 200)})",
            source,
            hint="Point --image-root at the folder that holds the images")
    if n_missing:
        first = [f"{one_line(entry_names[i], 200)} -> {one_line(paths[i], 200)}"
                 for i in np.flatnonzero(~exists)[:3]]
        warnings.append(f"skipped {n_missing} of {len(paths)} {what}s whose file is missing "
                        f"(first: {'; '.join(first)})")
    return exists


def relative_to_root(root: Path, name: str) -> str:
    """``name`` as an absolute path: ``~`` expanded, relative names joined to ``root``."""
    p = Path(name)
    if name.startswith("~"):
        try:
            p = p.expanduser()
        except RuntimeError:  # "~nosuchuser/a.jpg": kept as written, then reported missing
            pass
    return str(p if p.is_absolute() else (root / p))


def normalize_name(name: str) -> str:
    """An image name as written in a dataset file, normalised before it is used as the image's identity:
    ``./x.jpg``, ``x.jpg`` and ``a/../x.jpg`` are one image (``posixpath.normpath`` on the relative name),
    so the same photo cannot be two images (and straddle train and val). Absolute names stay absolute;
    ``~`` names are left for :func:`relative_to_root` to expand."""
    name = name.strip()
    if not name or name.startswith("~"):
        return name
    return posixpath.normpath(name)


def check_unique_images(abs_paths: Sequence[str], entry_names: Sequence[str], source: Path, word: str = "image",
                        hint: str = "Each image must appear once; merge their sentences") -> None:
    """An error naming both entries when two of ``abs_paths`` are one file once normalised (a relative name and
    the same file's absolute path, ``images//x.jpg`` and ``images/x.jpg``)."""
    seen: dict[str, int] = {}
    for k, p in enumerate(abs_paths):
        key = os.path.normpath(p)
        if key in seen:
            raise DatasetError(f"duplicate {word}: the same file as {entry_names[seen[key]]}", source, entry_names[k],
                               hint=hint)
        seen[key] = k


def split_name(value: str, path: Path, where: str) -> str:
    """A split name from a dataset file, lower-cased with its aliases mapped (``dev`` -> ``val``). A name that
    looks like a path (``../x``, ``a/b``) or holds control characters is an error naming ``where``: split
    names become file names and labels, and such a name is a mistake or an attack, never a split."""
    s = value.strip().lower()
    if has_unsafe(s) or "/" in s or "\\" in s or s in (".", "..") or len(s) > 100:
        raise DatasetError(f"split name {brief(value)} is not a split name (it looks like a path, holds control "
                           f"characters or is over 100 characters)", path, where,
                           hint=f"Use {', '.join(KNOWN_SPLITS[:-1])} (or leave the split empty for train)")
    return SPLIT_ALIASES.get(s, s)


def unknown_splits_warning(splits: dict[str, Sequence[int]], source: Path) -> list[str]:
    """One warning line naming the split names outside :data:`KNOWN_SPLITS` with how many images each holds
    (a typo such as ``tset`` takes its images out of train / val / test), or none."""
    unknown = sorted(((k, len(v)) for k, v in splits.items() if k not in KNOWN_SPLITS), key=lambda kv: -kv[1])
    if not unknown:
        return []
    listed = ", ".join(f"{brief(k, 40)} ({n} image{'s' * (n != 1)})" for k, n in unknown[:8])
    more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
    n_images = sum(n for _, n in unknown)
    return [f"{one_line(source.name, 80)}: {n_images} image(s) are in {len(unknown)} unknown split(s), kept as "
            f"their own split and not in train / val / test: {listed}{more} (known: {', '.join(KNOWN_SPLITS)})"]


def _non_finite_number(text: str) -> bool:
    """``text`` reads as a number that is NaN or infinite (``nan``, ``-inf``, ``Infinity``, ``1e999``)."""
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


class LabelReader:
    """Reads class labels from a dataset file, one value per image, as label names (text).

    JSON gives labels types: ``1`` and ``"1"`` are read as one label (a class name is text) and, when both
    spellings occur, one warning line says so with the number of images; a float label (``1.5``, ``2.0``)
    is read as its text and counted in a warning; NaN, infinity, booleans, lists and objects are errors
    naming the file and the entry.

    CSV cells have no types (``text_cells``): a cell spelled as a non-finite number (``nan``, ``NaN``, ``inf``,
    ``-Infinity``, ``1e999``: what pandas and spreadsheets write for a missing value) is refused as the JSON
    NaN / infinity is, naming the file, the line and the value; an empty cell is no label."""

    def __init__(self, path: Path, *, text_cells: bool = False) -> None:
        self.path = path
        self.text_cells = text_cells
        self._kinds: dict[str, set[str]] = {}
        self._count: dict[str, int] = {}
        self._floats = 0
        self._float_example: str | None = None

    def read(self, value: Any, where: str) -> str | None:
        """The label name of ``value`` (None when it is absent or blank)."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise DatasetError(f"'label' must be a string or a number, got {type(value).__name__} {brief(value)}",
                               self.path, where, hint="Give each image one label: a class name or number")
        if isinstance(value, float):
            if not math.isfinite(value):
                raise DatasetError(f"'label' is {value} (not a class)", self.path, where,
                                   hint="Give each image one label: a class name or number")
            text = str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
            self._floats += 1
            self._float_example = self._float_example or repr(value)
            kind = "number"
        elif isinstance(value, int):
            text, kind = str(value), "number"
        else:
            text, kind = value.strip(), "text"
            if not text:
                return None
            if self.text_cells and _non_finite_number(text):
                raise DatasetError(f"'label' is {brief(text)} (not a class: a missing or non-finite number)",
                                   self.path, where, hint="Give each image one label: a class name or number; "
                                   "fill in or drop the rows whose label is missing")
        self._kinds.setdefault(text, set()).add(kind)
        self._count[text] = self._count.get(text, 0) + 1
        return text

    def warnings(self) -> list[str]:
        out = []
        both = [t for t, kinds in self._kinds.items() if len(kinds) > 1]
        if both:
            n = sum(self._count[t] for t in both)
            out.append(f"{one_line(self.path.name, 80)}: {len(both)} label(s) are written both as a number and "
                       f"as text ({', '.join(brief(t, 20) for t in both[:5])}); read as one label each "
                       f"({n} label value(s))")
        if self._floats:
            out.append(f"{one_line(self.path.name, 80)}: {self._floats} label(s) are decimal numbers (e.g. "
                       f"{self._float_example}), read as class names; write whole numbers or text")
        return out


def guess_image_root(base: Path, sample: Sequence[str], candidates: Sequence[str]) -> Path:
    """The first folder among ``base/candidate`` that holds the first few sample images, else ``base``."""
    probe = [s for s in sample[:5]]
    for cand in candidates:
        root = base / cand if cand else base
        # os.path.isfile, not Path.is_file: it is False (not OSError) for a name over 255 characters.
        if os.path.isdir(root) and probe and all(os.path.isfile(root / s) for s in probe):
            return root
    for cand in candidates:  # a folder of that name exists even if the sample is incomplete
        root = base / cand if cand else base
        if cand and os.path.isdir(root) and probe and any(os.path.isfile(root / s) for s in probe):
            return root
    return base


def generated_splits(n: int, seed: int = 0, fractions: tuple[float, float] = (0.8, 0.1)) -> dict[str, np.ndarray]:
    """A reproducible 80/10/10 train/val/test split of ``n`` items, for sources that give none."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    n_train = int(round(n * fractions[0]))
    n_val = int(round(n * fractions[1]))
    if n >= 3:
        n_val = max(n_val, 1)
        n_train = min(n_train, n - n_val - 1)
    return {"train": np.sort(perm[:n_train]), "val": np.sort(perm[n_train:n_train + n_val]),
            "test": np.sort(perm[n_train + n_val:])}


def image_index(base: Path) -> tuple[dict[tuple[str, str], Path], dict[str, Path]]:
    """Images in ``base/<class>/`` keyed on (class, stem), and directly in ``base`` keyed on stem."""
    nested: dict[tuple[str, str], Path] = {}
    flat: dict[str, Path] = {}
    if not base.is_dir():
        return nested, flat
    for entry in sorted(base.iterdir()):
        if entry.is_dir():
            for f in sorted(entry.iterdir()):
                if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file():
                    nested.setdefault((entry.name, f.stem), f)
        elif entry.suffix.lower() in IMAGE_SUFFIXES:
            flat.setdefault(entry.stem, entry)
    return nested, flat


def read_text_or_latin1(path: Path) -> tuple[str, bool]:
    """A text file as UTF-8, else as Latin-1 (ISO-8859-1), and whether it was Latin-1. UTF-16 and binary
    data (a NUL byte) are errors naming the file; a UTF-8 byte-order mark is dropped."""
    data = read_bytes(path)
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise DatasetError("UTF-16 text, not UTF-8 or Latin-1", path, hint="Save the file as UTF-8")
    if b"\x00" in data:
        raise DatasetError("not a text file (it holds NUL bytes)", path, hint="Check that this is the dataset's file")
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("latin-1"), True


def read_caption_files(entries: Sequence[tuple[Path, Any, str]], exists: Sequence[bool], warnings: list[str],
                       word: str = "caption") -> tuple[list[tuple[Path, Any, str]], list[str], list[int]]:
    """The layouts with one text file of captions (one a line) per image (Reed et al.'s ``text_c10``, Pascal
    Sentences): of ``entries`` ``(text file, class, image path)`` whose image exists, those whose file holds a
    caption, with ``(kept entries, captions, caption -> kept-entry index)``; empty lines and files without a
    caption are counted in ``warnings`` (``word`` names a caption there)."""
    kept: list[tuple[Path, Any, str]] = []
    captions: list[str] = []
    cap_img: list[int] = []
    n_empty = n_nocap = 0
    for entry, ok in zip(entries, exists):
        if not ok:
            continue
        caps = []
        for line in read_text(entry[0]).splitlines():
            c = clean_caption(line)
            if c is None:
                n_empty += 1
            else:
                caps.append(c)
        if not caps:
            n_nocap += 1
            continue
        captions.extend(caps)
        cap_img.extend([len(kept)] * len(caps))
        kept.append(entry)
    if n_empty:
        warnings.append(f"skipped {n_empty} empty {word} line(s)")
    if n_nocap:
        warnings.append(f"skipped {n_nocap} image(s) whose {word} file has no {word}")
    return kept, captions, cap_img
