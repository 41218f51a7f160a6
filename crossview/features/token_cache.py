"""A frozen language model's token states, cached once per caption text and shared between runs.

TIMAM's paper text branch reads every token state of a frozen transformer (all-MiniLM-L6-v2, or a local BERT)
and learns only the Bi-LSTM above them, so the transformer's work depends on the caption alone: computing it once
per caption, ever, instead of once per run, turns a run's start from a minute of encoding (on a CPU) into a read
of the cache.

The cache is keyed like the feature cache (:mod:`crossview.features.cache`): an *identity* (everything that
determines the states besides the caption: the model folder, the weights' and tokenizer files' content hashes,
``max_len``, how many transformer layers are applied, the computation's version) names a folder
``<features_dir>/tokens/<identity key>/``, which is itself a :class:`~crossview.features.cache.FeatureCache`
of *shards*. A shard holds the states of a batch of captions packed without padding, ``(sum of lengths, hidden)``
float16 (float32 where float16 would overflow), and its description lists each caption's SHA-256 (of the text)
and its number of tokens. Shards are written atomically as captions are encoded (every :data:`SHARD_CAPTIONS`
captions, and what was done when a run is stopped), so a later call encodes only the captions no shard holds
(incremental), and a stopped one loses at most a batch.

The cache is only an optimisation: a shard that is damaged, unreadable or inconsistent (checked on every read:
the feature cache's checksums, and the lengths against the array) is deleted with a warning, its captions are
encoded again, and a cache folder that cannot be written costs a warning, never the run.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from crossview.core.settings import get_settings
from crossview.features.cache import FeatureCache

__all__ = ["TokenStates", "TokenCache", "caption_hash", "token_store_dir", "transformer_identity", "STAGE",
           "SHARD_CAPTIONS", "FORMAT"]

log = logging.getLogger(__name__)

#: the progress stage of token-state caching (a run's plan names it)
STAGE = "tokens"
#: captions per shard written while encoding (a stopped run keeps every finished shard)
SHARD_CAPTIONS = 1024
#: the shard layout's version (a shard of another is ignored and rewritten)
FORMAT = 1
_KIND = "token-states"


def token_store_dir() -> Path:
    """Where token-state caches live by default: ``<features_dir>/tokens``."""
    return get_settings().features_dir / "tokens"


def caption_hash(text: str) -> str:
    """The key of one caption: 32 hex digits of the SHA-256 of its UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _files_digest(folder: Path, names: Sequence[str]) -> str:
    h = hashlib.sha256()
    for name in names:
        p = folder / name
        if p.is_file():
            h.update(name.encode() + b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()[:24]


def transformer_identity(folder: str | Path, *, name: str, max_len: int, layers: int,
                         computation: str) -> dict[str, Any]:
    """The identity of a local transformer's token states: ``name`` (``"minilm"`` or the folder given), the
    weights file's content hash, a hash of the tokenizer files, ``max_len`` (word pieces per caption, longer ones
    cut), ``layers`` (how many transformer layers are applied above the embeddings) and ``computation`` (a label
    that a caller changes when its way of computing the states changes)."""
    from crossview.features.text.transformer import _WEIGHT_FILES, _weights_digest

    folder = Path(folder)
    wf = next((folder / n for n in _WEIGHT_FILES if (folder / n).is_file()), None)
    weights = "none"
    if wf is not None:
        st = wf.stat()
        weights = f"{wf.name}:{_weights_digest(str(wf), st.st_size, st.st_mtime_ns)}"
    tokenizer = _files_digest(folder, ("tokenizer.json", "vocab.txt", "tokenizer_config.json",
                                       "special_tokens_map.json", "merges.txt", "vocab.json"))
    return {"kind": _KIND, "format": FORMAT, "model": str(name), "weights": weights, "tokenizer": tokenizer,
            "max_len": int(max_len), "layers": int(layers), "computation": str(computation)}


@dataclass
class TokenStates:
    """The token states of ``n`` captions packed without padding: caption ``i``'s ``(lengths[i], hidden)`` rows
    are ``states[offsets[i]:offsets[i + 1]]``."""

    states: np.ndarray     # (sum of lengths, hidden) float16 (or float32)
    offsets: np.ndarray    # (n + 1,) int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """``(n,) int64`` tokens of each caption."""
        return np.diff(self.offsets)

    @property
    def hidden(self) -> int:
        return int(self.states.shape[1])

    def of(self, i: int) -> np.ndarray:
        """``(lengths[i], hidden)``: caption ``i``'s states."""
        return self.states[self.offsets[i]:self.offsets[i + 1]]

    def padded(self, rows: Sequence[int] | np.ndarray | None = None, width: int | None = None,
               dtype: Any = np.float32) -> np.ndarray:
        """``(len(rows), width, hidden)``: the states of captions ``rows`` (default: all), zero after each
        caption's last token; ``width`` defaults to the longest of them (a longer caption is cut)."""
        rows = np.arange(len(self)) if rows is None else np.asarray(rows, dtype=np.int64)
        lengths = self.lengths[rows] if len(rows) else np.zeros(0, np.int64)
        w = int(lengths.max(initial=0)) if width is None else int(width)
        out = np.zeros((len(rows), w, self.hidden), dtype=dtype)
        for k, i in enumerate(rows):
            n = min(int(lengths[k]), w)
            out[k, :n] = self.states[self.offsets[i]:self.offsets[i] + n]
        return out


class _Pending:
    """States encoded since the last shard was written."""

    def __init__(self) -> None:
        self.hashes: list[str] = []
        self.parts: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.hashes)


class TokenCache:
    """The token-state shards of one identity (:func:`transformer_identity`) under ``root`` (default
    :func:`token_store_dir`). :meth:`iter_states` gives the states of any captions, encoding only those that no
    shard holds; ``warnings`` collects what was wrong with the cache (damaged shards, an unwritable folder)."""

    def __init__(self, identity: Mapping[str, Any], root: str | Path | None = None) -> None:
        self.identity = dict(identity)
        self.key = FeatureCache.make_key(**self.identity)[:32]
        self.folder = Path(root if root is not None else token_store_dir()) / self.key
        self.store = FeatureCache(self.folder)
        self.warnings: list[str] = []
        self.encoded = 0          # captions encoded by this object (a test counts them; a warm run has 0)

    # ------------------------------------------------------------------ the index of the shards
    def _warn(self, message: str) -> None:
        log.warning("%s", message)
        self.warnings.append(message)

    def index(self) -> dict[str, tuple[str, int, int]]:
        """``{caption hash: (shard key, first row, tokens)}`` of every shard whose description is sound; a shard
        whose description is not is deleted with a warning (its captions count as not cached)."""
        out: dict[str, tuple[str, int, int]] = {}
        for info in self.store.entries():
            key = str(info.get("key", ""))
            parts = info.get("parts") or {}
            problem = None
            hashes, lengths = parts.get("captions"), parts.get("lengths")
            if parts.get("identity") != self.identity:
                problem = "it was written for another model, max_len or layer choice"
            elif (not isinstance(hashes, list) or not isinstance(lengths, list) or len(hashes) != len(lengths)
                  or not all(isinstance(n, int) and n >= 0 for n in lengths)):
                problem = "its list of captions is malformed"
            elif not (isinstance(info.get("shape"), list) and len(info["shape"]) == 2
                      and info["shape"][0] == sum(lengths)):
                problem = f"its array is {info.get('shape')}, the captions' lengths add up to {sum(lengths)} rows"
            if problem is not None:
                self._drop(key, problem)
                continue
            start = 0
            for h, n in zip(hashes, lengths):
                out.setdefault(str(h), (key, start, int(n)))
                start += int(n)
        return out

    def _drop(self, key: str, problem: str) -> None:
        self._warn(f"token-state cache: shard {self.store.path_of(key)} is unusable ({problem}); deleted it, its "
                   "captions are encoded again")
        try:
            self.store.delete(key)
        except (OSError, ValueError):
            pass

    def _load_shard(self, key: str) -> np.ndarray | None:
        before = self.store.contains(key)
        arr = self.store.load(key)          # verified against its checksums; a damaged entry is deleted
        if arr is None:
            if before:
                self._warn(f"token-state cache: shard {self.store.path_of(key)} is damaged (it failed its "
                           "checksum or could not be read); deleted it, its captions are encoded again")
            return None
        if arr.ndim != 2 or arr.dtype not in (np.float16, np.float32) or not np.isfinite(arr).all():
            self._drop(key, f"an array of {arr.dtype}{list(arr.shape)} with non-finite or misshapen values")
            return None
        return arr

    def _write(self, pending: _Pending) -> None:
        """Store the pending captions' states as one shard (a failure to write is a warning, not an error)."""
        if not len(pending):
            return
        dtype = np.float16 if all(p.dtype == np.float16 for p in pending.parts) else np.float32
        states = np.concatenate(pending.parts, axis=0).astype(dtype, copy=False)
        lengths = [int(p.shape[0]) for p in pending.parts]
        shard = FeatureCache.make_key(identity=self.key, captions=pending.hashes)
        try:
            self.store.save(shard, states, {"identity": self.identity, "captions": list(pending.hashes),
                                            "lengths": lengths})
        except OSError as e:
            self._warn(f"token-state cache: cannot write {self.folder} ({e}); the token states are used but not "
                       "kept for the next run")
        pending.hashes, pending.parts = [], []

    # ------------------------------------------------------------------ states of captions
    def iter_states(self, captions: Sequence[str],
                    compute: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], *,
                    lengths: Sequence[int] | np.ndarray | None = None,
                    batch_size: int = 128) -> Generator[tuple[int, int], None, TokenStates]:
        """The token states of ``captions`` (a generator: ``x = yield from cache.iter_states(...)``).

        Captions already in a shard are read; the others (each distinct text once) are encoded by
        ``compute(rows)`` -> ``(states (len(rows), width, hidden), lengths (len(rows),))``, ``rows`` indexing
        ``captions``, in batches of ``batch_size`` of similar length (``lengths``: the callers' token counts,
        else the number of characters), and written as shards. Yields ``(done, total)`` captions to encode: at the
        start ``(0, total)`` and after each batch; with nothing to encode a single ``(n, n)`` (a cache hit
        reports only its end)."""
        n = len(captions)
        hashes = [caption_hash(c) for c in captions]
        first: dict[str, int] = {}
        for i, h in enumerate(hashes):
            first.setdefault(h, i)
        got: dict[str, np.ndarray] = {}
        index = self.index()
        by_shard: dict[str, list[str]] = {}
        for h in first:
            if h in index:
                by_shard.setdefault(index[h][0], []).append(h)
        for key, hs in by_shard.items():
            arr = self._load_shard(key)
            if arr is None:
                continue
            for h in hs:
                _, start, length = index[h]
                got[h] = arr[start:start + length]
        todo = np.array([first[h] for h in first if h not in got], dtype=np.int64)
        total = len(todo)
        if total:
            size = np.asarray(lengths)[todo] if lengths is not None else np.array([len(captions[i]) for i in todo])
            todo = todo[np.argsort(-size, kind="stable")]       # longest first: an early batch shows the pace
            yield 0, total
            pending = _Pending()
            done = 0
            try:
                for a in range(0, total, int(batch_size)):
                    rows = todo[a:a + int(batch_size)]
                    states, lens = compute(rows)
                    states, lens = np.asarray(states), np.asarray(lens).reshape(-1)
                    if states.ndim != 3 or len(states) != len(rows) or len(lens) != len(rows):
                        raise ValueError(f"compute gave states {states.shape} and {len(lens)} lengths for "
                                         f"{len(rows)} captions")
                    for k, i in enumerate(rows):
                        part = np.array(states[k, :int(lens[k])], dtype=np.float32)
                        half = part.astype(np.float16)
                        # stored as the cache keeps it, so that this run and a warm one see the same numbers
                        part = half if np.isfinite(half).all() else part
                        got[hashes[i]] = part
                        pending.hashes.append(hashes[i])
                        pending.parts.append(part)
                    self.encoded += len(rows)
                    done += len(rows)
                    if len(pending) >= SHARD_CAPTIONS:
                        self._write(pending)
                    yield done, total
            finally:                     # finished, or stopped between two batches: keep what was encoded
                self._write(pending)
        else:
            yield n, n
        parts = [got[h] for h in hashes]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        if not parts:
            return TokenStates(np.zeros((0, 0), np.float16), offsets)
        dtype = np.float16 if all(p.dtype == np.float16 for p in parts) else np.float32
        return TokenStates(np.concatenate(parts).astype(dtype, copy=False), offsets)

    def states(self, captions: Sequence[str], compute: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
               **kw: Any) -> TokenStates:
        """:meth:`iter_states` driven to its end (no progress)."""
        it = self.iter_states(captions, compute, **kw)
        while True:
            try:
                next(it)
            except StopIteration as end:
                return end.value
