"""`ResponseCache`: the bounded cache of past responses, its upkeep and its file format.

* Contents: whole documents (the outputs of closed sessions), never split, in rotating
  *generations* of about `max_tokens / generations` tokens. The newest (live) generation fills up,
  then becomes a frozen generation; beyond `generations - 1` frozen generations the oldest is
  dropped whole. Memory is bounded by `max_tokens` plus one generation (plus the last document).
* Upkeep, amortised O(new tokens) (times a logarithm) per added document: the live generation is a
  short list of *levels*, each a `FrozenAutomaton` over some of its documents, oldest and largest
  first. A new document becomes a level of its own; then, while the level before the newest holds
  at most `MERGE_RATIO` times the newest, the two become one, in one kernel call
  (`FrozenAutomaton.from_documents`). Every level is exactly the automaton a fresh
  `SuffixAutomaton` builds over its documents. `add_many` adds several documents with one build per
  generation they reach (the same documents in the same generations as one by one).
* Sources (`sources()`): the frozen generations, then the live levels; every level and generation
  has an id never reused, so a session's cursor into an unchanged one carries over.
* Threads: `add` calls are serialised by their own lock and build outside the state lock, so
  `sources()` waits only for the final swap. `version` changes on every change of any cache (a
  process-wide counter), so a proposer given another cache resyncs.
* File (`save` / `load`, version `FORMAT_VERSION`, layout at `_HEADER`): only token ids and document
  boundaries are stored. `load` checks every field, size, offset, checksum, token id and boundary
  and the generation invariants, then rebuilds every automaton from the tokens with the code `add`
  uses: nothing a kernel follows comes from the file, and nothing is unpickled. Any damage is an
  `IndexFormatError` naming the file and what was wrong. Only regular files are opened.
"""

from __future__ import annotations

import itertools
import struct
import threading
import zlib
from pathlib import Path

import numpy as np

from ..errors import BadInputError, BadInputTypeError, IndexFormatError
from ..fileio import atomic_write_bytes, read_regular
from ..tokenids import as_tokens
from .automaton import FrozenAutomaton

__all__ = ["ResponseCache", "MAGIC", "FORMAT_VERSION", "MERGE_RATIO"]

MAGIC = b"SFXSPRC\0"
FORMAT_VERSION = 2  # version 1 was a pickle, never read
MERGE_RATIO = 4
THAW_MIN_TOKENS = 256  # a smaller first level is rebuilt with the rest, not thawed (no cheaper below ~300)
KIND_FROZEN, KIND_LIVE = 0, 1
MAX_ENTRIES = 1 << 16
MAX_GENERATIONS = 1 << 16

# The file, little-endian:
#   header  64 bytes: magic b"SFXSPRC\0", format version u32, entry count u32, file length u64,
#           max_tokens u64, generations u32, reserved u32, next id u64, reserved 8 bytes,
#           crc32 of the entry table u32, crc32 of the header's first 60 bytes u32
#   entries 64 bytes each, frozen generations (oldest first) then live levels (oldest first):
#           id u64, kind u32 (0 frozen, 1 live), reserved u32, tokens u64, documents u64,
#           offset of the tokens u64, offset of the document starts u64, crc32 of each u32,
#           reserved 8 bytes
#   arrays  per entry: tokens int32[tokens], then document starts int64[documents], each
#           starting at the next multiple of 8, in entry order, up to the file's end
_HEADER = struct.Struct("<8sIIQQIIQ8sII")
_ENTRY = struct.Struct("<QIIQQQQII8s")
if _HEADER.size != 64 or _ENTRY.size != 64:  # pragma: no cover - a layout typo
    raise ImportError("cache: header and entry structs must be 64 bytes")

_versions = itertools.count(1)  # process-wide: a cache's version never repeats another's


def _align8(n: int) -> int:
    return (n + 7) & ~7


def _build(tokens: np.ndarray, starts: np.ndarray) -> FrozenAutomaton:
    """The frozen automaton a fresh `SuffixAutomaton` builds over the documents
    tokens[starts[i]:starts[i + 1]], laid out for the kernels (on the caller's time, not the next
    proposal's): one kernel call (`FrozenAutomaton.from_documents`)."""
    return FrozenAutomaton.from_documents(tokens, starts)


def _merge(levels: list[tuple[int, FrozenAutomaton]], docs: list[np.ndarray]) -> FrozenAutomaton:
    """One automaton over the documents of `levels`, in order, then the documents `docs`: the first
    level's automaton extended by the others' documents and `docs` (the same automaton as `_build`
    over them all gives, without adding the first level's documents again)."""
    tokens = np.concatenate([fa.tokens for _, fa in levels] + docs)
    starts, base = [], 0
    for _, fa in levels:
        starts.append(np.asarray(fa.doc_starts, np.int64) + base)
        base += len(fa)
    starts.append(base + np.cumsum([0] + [d.shape[0] for d in docs[:-1]], dtype=np.int64))
    if not levels or len(levels[0][1]) < THAW_MIN_TOKENS:
        return _build(tokens, np.concatenate(starts))
    return FrozenAutomaton.from_documents(tokens, np.concatenate(starts), extending=levels[0][1])


class ResponseCache:
    """Bounded cache of past responses in rotating generations (see the module docstring)."""

    def __init__(self, max_tokens: int = 1 << 20, generations: int = 4):
        for name, value in (("max_tokens", max_tokens), ("generations", generations)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise BadInputError(f"ResponseCache: {name}: expected a positive integer, got {value!r}", param=name)
        if generations > MAX_GENERATIONS:
            raise BadInputError(f"ResponseCache: generations: expected at most {MAX_GENERATIONS}, got {generations}", param="generations")
        self.max_tokens = int(max_tokens)
        self.generations = int(generations)
        self._lock = threading.Lock()  # guards the state below (held briefly)
        self._add_lock = threading.Lock()  # serialises add()
        self._frozen: list[tuple[int, FrozenAutomaton]] = []  # oldest first
        self._levels: list[tuple[int, FrozenAutomaton]] = []  # the live generation, oldest first
        self._next_id = 0
        self._version = next(_versions)  # changes on every change, so sessions know to resync

    @property
    def generation_tokens(self) -> int:
        return max(1, self.max_tokens // self.generations)

    @property
    def version(self) -> int:
        return self._version

    def _new_id(self) -> int:
        i = self._next_id
        self._next_id += 1
        return i

    def add(self, tokens) -> None:
        """Add one document (a closed session's output); see the module docstring for the cost."""
        self._add_valid([as_tokens(tokens)])

    def add_many(self, documents) -> None:
        """Add documents in order (closed sessions' outputs), into the same generations as adding
        them one by one would put them, with one build per generation they reach instead of one
        per document: the documents up to the one that fills the live generation rotate with it,
        the rest become one new level (merged by its total size, as one document would be)."""
        if isinstance(documents, (str, bytes, dict)) or not hasattr(documents, "__iter__"):
            raise BadInputTypeError(f"documents: expected a list of token id sequences, got {type(documents).__name__}", param="documents")
        self._add_valid([as_tokens(d, f"documents[{i}]") for i, d in enumerate(documents)])

    def _add_valid(self, docs: list[np.ndarray]) -> None:
        docs = [d for d in docs if d.shape[0]]
        if not docs:
            return
        with self._add_lock:
            levels = list(self._levels)  # only adds change them, and adds are serialised
            frozen = list(self._frozen)
            first = 0
            while first < len(docs):
                held = sum(len(fa) for _, fa in levels)
                end, size = first, 0
                while end < len(docs) and held + size < self.generation_tokens:
                    size += int(docs[end].shape[0])
                    end += 1
                rotate = held + size >= self.generation_tokens
                gid = self._new_id()  # the new documents' level
                # The levels the new level is merged with, decided on sizes alone, so that the
                # result is built once: levels[j:] and the documents become one level (or, once
                # the generation is full, all of them one frozen generation). Every level built
                # takes a new id, as many as the merges would take one by one.
                sizes = [len(fa) for _, fa in levels]
                merged_size = size
                j = 0 if rotate else len(levels)
                while not rotate and j >= 1 and sizes[j - 1] <= MERGE_RATIO * merged_size:
                    j -= 1
                    merged_size += sizes[j]
                    gid = self._new_id()
                built = _merge(levels[j:], docs[first:end])
                if rotate:
                    frozen.append((self._new_id(), built))
                    levels = []
                    del frozen[: max(0, len(frozen) - (self.generations - 1))]
                else:
                    levels[j:] = [(gid, built)]
                first = end
            with self._lock:
                self._frozen, self._levels = frozen, levels
                self._version = next(_versions)

    def sources(self) -> tuple[int, list[tuple[int, FrozenAutomaton]]]:
        """(version, [(id, frozen automaton)...]) as of now: frozen generations, then live levels."""
        with self._lock:
            return self._version, self._frozen + self._levels

    def documents(self) -> list[list[np.ndarray]]:
        """The documents held, as of now: one list per frozen generation (oldest first), then one
        for the live generation (possibly empty), each in the order they were added."""
        with self._lock:
            frozen, levels = list(self._frozen), list(self._levels)
        return [fa.documents() for _, fa in frozen] + [[d for _, fa in levels for d in fa.documents()]]

    def _touch(self) -> None:
        """A new version with the same contents: sessions holding this cache resync."""
        with self._lock:
            self._version = next(_versions)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(a) for _, a in self._frozen) + sum(len(a) for _, a in self._levels)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(a.nbytes for _, a in self._frozen) + sum(a.nbytes for _, a in self._levels)

    def __repr__(self):
        with self._lock:
            return (f"ResponseCache(max_tokens={self.max_tokens}, generations={self.generations}, "
                    f"frozen={len(self._frozen)}, live_levels={len(self._levels)})")

    # -- file format ------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The file `save` writes (module docstring, File format)."""
        with self._lock:
            items = [(KIND_FROZEN, g, fa) for g, fa in self._frozen] + [(KIND_LIVE, g, fa) for g, fa in self._levels]
            next_id = self._next_id
        table_end = _HEADER.size + _ENTRY.size * len(items)
        entries, blobs, pos = [], [], table_end
        for kind, gid, fa in items:
            tok = np.ascontiguousarray(fa.tokens, dtype="<i4").tobytes()
            st = np.ascontiguousarray(fa.doc_starts, dtype="<i8").tobytes()
            tok_off = pos
            st_off = _align8(tok_off + len(tok))
            pos = st_off + len(st)
            entries.append(_ENTRY.pack(gid, kind, 0, len(fa), fa.doc_starts.shape[0], tok_off, st_off,
                                       zlib.crc32(tok), zlib.crc32(st), b""))
            blobs.append((tok_off, tok))
            blobs.append((st_off, st))
        table = b"".join(entries)
        head = _HEADER.pack(MAGIC, FORMAT_VERSION, len(items), pos, self.max_tokens, self.generations, 0, next_id,
                            b"", zlib.crc32(table), 0)
        head = head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))
        out = bytearray(pos)
        out[: _HEADER.size] = head
        out[_HEADER.size : table_end] = table
        for off, b in blobs:
            out[off : off + len(b)] = b
        return bytes(out)

    def save(self, path) -> None:
        """Write atomically (temporary file in the same directory, fsynced, then renamed)."""
        atomic_write_bytes(Path(path), self.to_bytes())

    @classmethod
    def load(cls, path) -> ResponseCache:
        """Read a cache `save` wrote; any damage raises `IndexFormatError` (module docstring)."""
        path = Path(path)
        return cls.from_bytes(read_regular(path, error=IndexFormatError, what="response cache"), str(path))

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "response cache") -> ResponseCache:
        def fail(what):
            raise IndexFormatError(f"{name}: not a valid suffixspec response cache: {what}")

        size = len(data)
        if size < _HEADER.size:
            fail(f"truncated: {size} bytes, shorter than the {_HEADER.size}-byte header")
        (magic, version, n_entries, file_length, max_tokens, generations, _, next_id, _, table_crc,
         head_crc) = _HEADER.unpack_from(data, 0)
        if magic != MAGIC:
            fail(f"bad magic {magic!r}, expected {MAGIC!r}")
        if zlib.crc32(data[: _HEADER.size - 4]) != head_crc:
            fail("header checksum mismatch")
        if version != FORMAT_VERSION:
            fail(f"format version {version}, expected {FORMAT_VERSION}")
        if file_length != size:
            fail(f"header says {file_length} bytes, the file has {size}")
        if not 0 < generations <= MAX_GENERATIONS or max_tokens <= 0 or max_tokens >= 1 << 62:
            fail(f"generations {generations} (expected 1..{MAX_GENERATIONS}) or max_tokens {max_tokens} out of range")
        if n_entries > MAX_ENTRIES:
            fail(f"{n_entries} entries, expected at most {MAX_ENTRIES}")
        table_end = _HEADER.size + _ENTRY.size * n_entries
        if table_end > size:
            fail(f"truncated: the entry table ends at {table_end}, the file at {size}")
        if zlib.crc32(data[_HEADER.size : table_end]) != table_crc:
            fail("entry table checksum mismatch")
        cache = cls(int(max_tokens), int(generations))
        gen_tokens = cache.generation_tokens
        pos = table_end
        seen: set[int] = set()
        parsed = []
        last_kind = KIND_FROZEN
        for i in range(n_entries):
            gid, kind, _, n_tok, n_docs, tok_off, st_off, tok_crc, st_crc, _ = _ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size)
            where = f"entry {i}"
            if kind not in (KIND_FROZEN, KIND_LIVE) or kind < last_kind:
                fail(f"{where}: kind {kind} (expected frozen generations, then live levels)")
            last_kind = kind
            if gid >= next_id or gid in seen:
                fail(f"{where}: id {gid} repeated or not below the next id {next_id}")
            seen.add(gid)
            if not 0 < n_docs <= n_tok:
                fail(f"{where}: {n_tok} tokens in {n_docs} documents (expected 1 <= documents <= tokens)")
            if tok_off != pos or st_off != _align8(tok_off + 4 * n_tok) or st_off + 8 * n_docs > size:
                fail(f"{where}: arrays at {tok_off} and {st_off} ({n_tok} tokens, {n_docs} documents) "
                     f"do not follow at {pos} within the {size}-byte file")
            tok_b = data[tok_off : tok_off + 4 * n_tok]
            st_b = data[st_off : st_off + 8 * n_docs]
            if zlib.crc32(tok_b) != tok_crc or zlib.crc32(st_b) != st_crc:
                fail(f"{where}: array checksum mismatch")
            pos = st_off + 8 * n_docs
            tokens = np.frombuffer(tok_b, dtype="<i4").astype(np.int32)
            starts = np.frombuffer(st_b, dtype="<i8").astype(np.int64)
            if int(tokens.min()) < 0:
                fail(f"{where}: negative token id {int(tokens.min())}")
            if starts[0] != 0 or (n_docs > 1 and not bool(np.all(np.diff(starts) > 0))) or starts[-1] >= n_tok:
                fail(f"{where}: document starts are not 0, strictly increasing and below {n_tok}")
            if kind == KIND_FROZEN and n_tok < gen_tokens:
                fail(f"{where}: a frozen generation of {n_tok} tokens, expected at least {gen_tokens}")
            parsed.append((kind, int(gid), tokens, starts))
        if pos != size:
            fail(f"{size - pos} bytes after the last array")
        n_frozen = sum(1 for kind, *_ in parsed if kind == KIND_FROZEN)
        if n_frozen > generations - 1:
            fail(f"{n_frozen} frozen generations, expected at most {generations - 1}")
        live_tokens = sum(t.shape[0] for kind, _, t, _ in parsed if kind == KIND_LIVE)
        if live_tokens >= gen_tokens:
            fail(f"a live generation of {live_tokens} tokens, expected fewer than {gen_tokens}")
        for kind, gid, tokens, starts in parsed:
            (cache._frozen if kind == KIND_FROZEN else cache._levels).append((gid, _build(tokens, starts)))
        cache._next_id = int(next_id)
        return cache
