"""Retrieval corpus index: many documents, frozen into shards, persisted, memory-mapped, filtered.

Terms
-----
- *document*: a token sequence with a name (`id`, a string) and optional tags (`repo=click`).
  A match never spans two documents. Documents are numbered 0..n_documents-1 in build order
  (the *document index*, what bitmaps hold); empty documents are skipped at build time.
- *position*: an index into the concatenation of all documents of the index, over all shards
  in order (shard s covers positions token_base[s] .. token_base[s] + n_tokens[s] - 1). The
  *end position* of an occurrence is the position of its last token, as in `automaton.py`.
- *shard*: a `FrozenAutomaton` over a bounded number of tokens plus its occurrence layout
  (see `_kernels/corpus.py`). Queries ask every shard: counts add up, the longest match is the
  maximum, continuations merge (counts summed, most recent end = maximum).
- *subset*: a `Subset` (compiled from a pyroaring `BitMap` of document indexes or from tags)
  restricting a query to some documents. A restricted query reads O(k) end positions per
  shard (default k = `DEFAULT_K`): counts and continuations are exact when the matched string
  occurs at most `k` times in a shard, else estimated from its `k` most recent occurrences (an
  evenly strided sample beyond 8 * k occurrences) and flagged `estimated`; the walk to the
  longest restricted match is exact unless a string occurring more than `k` times had to be
  judged by such a sample (then the length is a lower bound, also flagged `estimated`).
- *deleted* documents (a bitmap stored with the index) are excluded from every result: an index
  with deletions answers every query as a restricted one (so counts above `k` become
  estimates) until `merge_indexes` compacts them away. `delete_documents` (and `suffixspec
  delete`) marks them.

On disk an index is a directory::

    INDEX/manifest.ssx      tokenizer, counts, shard list (the commit point of every change)
    INDEX/shard-00000.ssx   one per shard: automaton arrays, occurrence layout, document table
    INDEX/deleted-XXXXXXXX.ssx  optional: serialized BitMap of deleted document indexes

Every file has the same container layout: a 64-byte header (magic, format version, kind,
file length, meta offset/length/crc32, payload crc32, header crc32), a table of 64-byte array
entries (name, dtype, offset, element count, crc32), a JSON meta block, then the arrays, each
64-byte aligned, mapped with zero copies. Opening checks headers, sizes, the manifest and
cheap invariants; `verify()` also checks every checksum. Files are written under temporary
names, fsynced, then renamed.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import mmap
import os
import shutil
import struct
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from . import __version__
from ._kernels import corpus as ck
from ._kernels import frozen as fk
from ._tokens import as_tokens
from .automaton import FrozenAutomaton, SuffixAutomaton
from .errors import BadInputError, IndexFormatError, TokenizerMismatchError

__all__ = [
    "CorpusIndex", "CorpusMatch", "Document", "Subset", "BuildStats",
    "build_index", "append_documents", "delete_documents", "merge_indexes", "read_documents",
    "FORMAT_VERSION", "DEFAULT_K", "DEFAULT_SHARD_TOKENS",
]

MAGIC = b"SFXSPIDX"
FORMAT_VERSION = 1
KIND_MANIFEST, KIND_SHARD, KIND_DELETED = 1, 2, 3
_KIND_NAMES = {KIND_MANIFEST: "manifest", KIND_SHARD: "shard", KIND_DELETED: "deleted-documents"}
MANIFEST = "manifest.ssx"
DEFAULT_K = 4096
DEFAULT_SHARD_TOKENS = 16_000_000
ALIGN = 64
# magic, version, kind, file_length, n_arrays, meta_crc, meta_offset, meta_length, payload_crc, reserved, header_crc
_HEADER = struct.Struct("<8sIIQIIQQI8sI")
# name, dtype, offset, count, crc32, reserved
_ENTRY = struct.Struct("<32s8sQQI4s")
assert _HEADER.size == 64 and _ENTRY.size == 64
_DTYPES = {"<i4", "<i8", "|u1", "|b1"}
_SHARD_ARRAYS = ("links", "lens", "counts", "lasts", "offsets", "etok", "eto", "tokens", "doc_starts", "occ", "occ_start", "doc_info")


# -- container files --------------------------------------------------------------------------


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_CRC_ZERO_OPS: list = []  # k -> the CRC-32 operator (GF(2) 32x32 matrix, columns as ints) of 2**k zero bytes


def _gf2_apply(mat: list, vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib.crc32(a + b) from crc1 = zlib.crc32(a), crc2 = zlib.crc32(b) and len2 = len(b): crc1
    advanced over len2 zero bytes (the register is linear over GF(2), and the pre- and
    post-inversions of a and b cancel), xor crc2. O(log len2) matrix-vector products."""
    if not _CRC_ZERO_OPS:
        op = [0xEDB88320] + [1 << i for i in range(31)]  # one zero bit (reflected polynomial)
        for _ in range(3):  # -> one zero byte
            op = [_gf2_apply(op, c) for c in op]
        for _ in range(64):
            _CRC_ZERO_OPS.append(op)
            op = [_gf2_apply(op, c) for c in op]
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _gf2_apply(_CRC_ZERO_OPS[k], crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2


def _plan(meta_b: bytes, specs) -> tuple[list[tuple], int]:
    """Layout of a container file holding arrays `specs` [(name, dtype, count)]:
    [(name, dtype code, offset, count, nbytes)] and the file length."""
    meta_off = _HEADER.size + _ENTRY.size * len(specs)
    off = _align(meta_off + len(meta_b))
    plan, end = [], meta_off + len(meta_b)
    for name, dtype, count in specs:
        dt = np.dtype(dtype)
        dt = dt.newbyteorder("<") if dt.byteorder == ">" else dt
        if dt.str not in _DTYPES:
            raise BadInputError(f"array {name}: unsupported dtype {dt}")
        nbytes = int(count) * dt.itemsize
        plan.append((name, dt.str, off, int(count), nbytes))
        end = off + nbytes
        off = _align(end)
    return plan, end


def _head(kind: int, file_length: int, n_arrays: int, meta_b: bytes, payload_crc: int) -> bytes:
    meta_off = _HEADER.size + _ENTRY.size * n_arrays
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, kind, file_length, n_arrays, zlib.crc32(meta_b),
                        meta_off, len(meta_b), payload_crc, b"", 0)
    return head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))


def _meta_bytes(meta: dict) -> bytes:
    return json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()


def _write_container(path: Path, kind: int, meta: dict, arrays: dict[str, np.ndarray]) -> dict:
    """Write one container file of in-memory `arrays` at `path` (the caller picks a temporary
    name); returns {"bytes", "payload_crc"}."""
    arrays = {k: np.ascontiguousarray(a) for k, a in arrays.items()}
    meta_b = _meta_bytes(meta)
    plan, file_length = _plan(meta_b, [(k, a.dtype, a.shape[0]) for k, a in arrays.items()])
    entries, bufs = [], []
    for (name, code, off, count, _), a in zip(plan, arrays.values()):
        buf = memoryview(a.astype(code, copy=False)).cast("B")
        entries.append(_ENTRY.pack(name.encode(), code.encode(), off, count, zlib.crc32(buf), b""))
        bufs.append((off, buf))
    crc = 0
    with open(path, "wb") as f:
        f.write(b"\0" * _HEADER.size)
        pos = _HEADER.size
        for chunk in [b"".join(entries), meta_b]:
            f.write(chunk)
            crc = zlib.crc32(chunk, crc)
            pos += len(chunk)
        for o, buf in bufs:
            pad = b"\0" * (o - pos)
            f.write(pad)
            crc = zlib.crc32(pad, crc)
            f.write(buf)
            crc = zlib.crc32(buf, crc)
            pos = o + buf.nbytes
        f.seek(0)
        f.write(_head(kind, file_length, len(arrays), meta_b, crc))
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": file_length, "payload_crc": crc}


class _MappedContainer:
    """A container file written in place: `arrays` are writable views of the new file's
    mapping, filled by the caller (kernels write straight into the page cache, no copy of the
    shard in memory); `finish()` adds checksums, table, meta and header, then syncs. The same
    bytes as `_write_container` would write. Every view must be dropped before `finish()`."""

    def __init__(self, path: Path, kind: int, meta: dict, specs):
        self.path, self.kind = path, kind
        self.meta_b = _meta_bytes(meta)
        self.plan, self.length = _plan(self.meta_b, specs)
        self.mm = None
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            try:  # reserve the blocks now: a full disk is an OSError here, not a SIGBUS later
                os.posix_fallocate(self.fd, 0, self.length)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                os.ftruncate(self.fd, self.length)
            self.mm = mmap.mmap(self.fd, self.length)
        except BaseException:
            self.close()
            raise
        self.arrays = {name: np.frombuffer(self.mm, np.dtype(code), count, off) for name, code, off, count, _ in self.plan}

    def finish(self, phases: dict | None = None) -> dict:
        """Checksums, array table, meta and header; msync and fsync. Returns {"bytes", "payload_crc"}."""
        clock = _PhaseClock(phases)
        self.arrays.clear()
        mv = memoryview(self.mm)
        try:
            crcs = [zlib.crc32(mv[off : off + nbytes]) for _, _, off, _, nbytes in self.plan]
            table = b"".join(_ENTRY.pack(name.encode(), code.encode(), off, count, c, b"")
                             for (name, code, off, count, _), c in zip(self.plan, crcs))
            meta_off = _HEADER.size + len(table)
            mv[_HEADER.size : meta_off] = table
            mv[meta_off : meta_off + len(self.meta_b)] = self.meta_b
            # the payload checksum from the arrays' own, not a second pass over the file
            # (padding is zero: the file was created empty)
            crc = zlib.crc32(self.meta_b, zlib.crc32(table))
            pos = meta_off + len(self.meta_b)
            for (_, _, off, _, nbytes), c in zip(self.plan, crcs):
                crc = _crc32_combine(zlib.crc32(bytes(off - pos), crc), c, nbytes)
                pos = off + nbytes
            if pos != self.length:
                raise AssertionError("container plan does not end at the file length")
            mv[: _HEADER.size] = _head(self.kind, self.length, len(self.plan), self.meta_b, crc)
        finally:
            mv.release()
        clock.lap("checksums")
        self.mm.flush()
        os.fsync(self.fd)
        self.close()
        clock.lap("write")
        return {"bytes": self.length, "payload_crc": crc}

    def close(self) -> None:
        self.arrays = {}
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # a view is still alive: the map closes when it goes
                pass
            self.mm = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Container:
    """One memory-mapped container file; arrays are zero-copy read-only views."""

    def __init__(self, path: Path, kind: int):
        self.path = path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < _HEADER.size:
                    self._fail(f"truncated: {size} bytes, shorter than the {_HEADER.size}-byte header")
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise IndexFormatError(f"{path}: missing file") from None
        mm = self._mm
        (magic, version, got_kind, length, n_arrays, meta_crc, meta_off, meta_len,
         self.payload_crc, _, head_crc) = _HEADER.unpack_from(mm, 0)
        if magic != MAGIC:
            self._fail(f"not a suffixspec index file (bad magic {magic!r})")
        if zlib.crc32(mm[: _HEADER.size - 4]) != head_crc:
            self._fail("damaged header (checksum mismatch)")
        if version != FORMAT_VERSION:
            self._fail(f"format version {version}, this suffixspec reads version {FORMAT_VERSION}")
        if got_kind != kind:
            self._fail(f"is a {_KIND_NAMES.get(got_kind, got_kind)} file, expected a {_KIND_NAMES[kind]} file")
        if length != size:
            self._fail(f"{'truncated' if size < length else 'has trailing bytes'}: {size} bytes on disk, header says {length}")
        table_end = _HEADER.size + _ENTRY.size * n_arrays
        if table_end > size or meta_off < table_end or meta_off + meta_len > size:
            self._fail("array table or meta block out of bounds")
        meta_b = mm[meta_off : meta_off + meta_len]
        if zlib.crc32(meta_b) != meta_crc:
            self._fail("damaged meta block (checksum mismatch)")
        try:
            self.meta = json.loads(meta_b)
        except ValueError:
            self._fail("damaged meta block (not JSON)")
        self.entries = {}
        for i in range(n_arrays):
            name, code, off, count, crc, _ = _ENTRY.unpack_from(mm, _HEADER.size + i * _ENTRY.size)
            name, code = name.rstrip(b"\0").decode("ascii", "replace"), code.rstrip(b"\0").decode("ascii", "replace")
            if code not in _DTYPES:
                self._fail(f"array {name}: unknown dtype {code!r}")
            nbytes = count * np.dtype(code).itemsize
            if off % ALIGN or off < meta_off + meta_len or off + nbytes > size:
                self._fail(f"array {name}: out of bounds (offset {off}, {nbytes} bytes, file {size} bytes)")
            self.entries[name] = (code, off, count, crc)
        self.nbytes = size

    def _fail(self, what):
        raise IndexFormatError(f"{self.path}: {what}")

    def array(self, name: str) -> np.ndarray:
        if name not in self.entries:
            self._fail(f"missing array {name}")
        code, off, count, _ = self.entries[name]
        return np.frombuffer(self._mm, dtype=np.dtype(code), count=count, offset=off)

    def verify(self) -> None:
        mm = self._mm
        for name, (code, off, count, crc) in self.entries.items():
            if zlib.crc32(mm[off : off + count * np.dtype(code).itemsize]) != crc:
                self._fail(f"array {name} is damaged (checksum mismatch)")
        if zlib.crc32(mm[_HEADER.size :]) != self.payload_crc:
            self._fail("damaged contents (checksum mismatch)")


# -- documents and build ----------------------------------------------------------------------


@dataclass
class Document:
    """A document to index: token ids, a name and tags."""

    tokens: np.ndarray
    id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class BuildStats:
    n_documents: int = 0
    n_tokens: int = 0
    n_shards: int = 0
    bytes_on_disk: int = 0
    seconds: float = 0.0
    empty_documents: int = 0
    phases: dict = field(default_factory=dict)  # seconds per build phase, summed over shards (and workers)

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_on_disk / max(self.n_tokens, 1)


def _tokenizer_info(tokenizer) -> dict:
    if isinstance(tokenizer, dict):
        info = tokenizer
    else:
        info = {"name": getattr(tokenizer, "name", None), "vocab_size": getattr(tokenizer, "vocab_size", None),
                "fingerprint": getattr(tokenizer, "fingerprint", None)}
    missing = [k for k in ("name", "vocab_size", "fingerprint") if info.get(k) is None]
    if missing:
        raise BadInputError(f"tokenizer: expected a Tokenizer or a dict with name, vocab_size and fingerprint; missing {', '.join(missing)}")
    return {"name": str(info["name"]), "vocab_size": int(info["vocab_size"]), "fingerprint": str(info["fingerprint"])}


class _PhaseClock:
    """Adds the seconds since the previous lap to `phases[name]` (does nothing without a dict)."""

    def __init__(self, phases: dict | None):
        self.phases = phases
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.phases is not None:
            t = time.perf_counter()
            self.phases[name] = self.phases.get(name, 0.0) + t - self.t
            self.t = t


ROOT_DENSE_LIMIT = 1 << 24  # largest token id + 1 for which a shard is built by the bulk builder (dense root row)


def _aligned_rows(rows: int, cols: int) -> np.ndarray:
    """int32[rows, cols] whose data starts on a 64-byte boundary (whole rows in a cache line)."""
    buf = np.empty(rows * cols + 16, np.int32)
    off = (-buf.ctypes.data % 64) // 4
    return buf[off : off + rows * cols].reshape(rows, cols)


def _hash_table(rows: int) -> np.ndarray:
    size = 1024
    while rows * ck.B_LOAD_DEN > size * ck.B_LOAD_NUM:
        size *= 2
    H = _aligned_rows(size, 4)
    H[:, ck.H_SRC] = -1
    return H


def _bulk_automaton(tokens: np.ndarray, doc_starts: np.ndarray, e_rows: int | None = None, h_rows: int | None = None):
    """The automaton of the documents of `tokens` (starting at `doc_starts`), built in one pass
    by `_kernels/corpus.build_run` (same states and edges as `SuffixAutomaton`): (S, E, R, P, BM).
    Room for every state is reserved up front (a token adds at most two); the overflow edges
    and their hash grow between kernel calls, sized by projecting the rate seen so far
    (e_rows, h_rows: initial room, for tests)."""
    n = tokens.shape[0]
    S = _aligned_rows(2 * n + 1, ck.B_COLS)
    E = np.empty((n // 2 + 1024 if e_rows is None else e_rows, 4), np.int32)  # ~0.39 overflow edges per token on code
    H = _hash_table(int(n * 0.3) + 1024 if h_rows is None else h_rows)
    R = np.empty(int(tokens.max()) + 1, np.int32)
    P = np.empty(n, np.int32)
    BM = np.zeros(ck.B_META, np.int64)
    ck.build_init(S, R, BM)
    while True:
        need = ck.build_run(S, E, H, R, tokens, doc_starts, P, BM)
        if need == 0:
            break
        ne, pos = int(BM[ck.B_NE]), int(BM[ck.B_POS])
        if ne + need > E.shape[0]:
            more = ne * (n - pos) // max(pos, 1)
            grown = np.empty((max(ne + need, ne + more + (more >> 4) + 4096, E.shape[0] + (E.shape[0] >> 2)), 4), np.int32)
            grown[:ne] = E[:ne]
            E = grown
        if (ne + need) * ck.B_LOAD_DEN > H.shape[0] * ck.B_LOAD_NUM:
            H = _hash_table(max(E.shape[0], ne + need))
            ck.build_rehash(E, H, ne)
    return S, E, R, P, BM


def _build_shard_file(path: str, tokens: np.ndarray, doc_lens: np.ndarray, ids: list, tags: list) -> dict:
    """Build one shard and write it at `path` (run in a worker process when jobs > 1): the
    automaton, then its frozen arrays and occurrence layout straight into the mapped file.
    Returns {"bytes", "payload_crc", "n_tokens", "n_documents", "phases"} (seconds per phase)."""
    phases = {}
    clock = _PhaseClock(phases)
    tokens = np.ascontiguousarray(tokens, np.int32)
    n_tokens, n_docs = tokens.shape[0], len(doc_lens)
    doc_starts = np.zeros(n_docs, np.int64)
    np.cumsum(doc_lens[:-1], out=doc_starts[1:])
    if n_docs == 0 or n_tokens == 0 or int(doc_starts[-1]) + int(doc_lens[-1]) != n_tokens or (doc_lens <= 0).any():
        raise AssertionError("document lengths disagree with the shard's tokens")
    bulk = int(tokens.max()) < ROOT_DENSE_LIMIT
    if bulk:
        S, E, R, pstate, BM = _bulk_automaton(tokens, doc_starts)
        n_states, n_edges = int(BM[ck.B_NS]), int(BM[ck.B_EDGES])
    else:  # huge token ids: the growable automaton (hashed root)
        sa = SuffixAutomaton()
        for i in range(n_docs):
            sa.add_document(tokens[doc_starts[i] : doc_starts[i] + doc_lens[i]])
        n_states, n_edges = sa.n_states, sa.n_edges
        if sa.n_documents != n_docs or len(sa) != n_tokens:
            raise AssertionError("automaton document count disagrees with the document lengths")
    clock.lap("automaton")
    doc_info = json.dumps({"ids": ids, "tags": tags}).encode()
    meta = {"n_tokens": n_tokens, "n_documents": n_docs, "n_states": n_states, "n_edges": n_edges}
    i4 = np.int32
    specs = [("links", i4, n_states), ("lens", i4, n_states), ("counts", i4, n_states), ("lasts", i4, n_states),
             ("offsets", i4 if n_edges < 2**31 else np.int64, n_states + 1),  # int32 halves the edge offsets
             ("etok", i4, n_edges), ("eto", i4, n_edges), ("tokens", i4, n_tokens), ("doc_starts", np.int64, n_docs),
             ("occ", i4, n_tokens), ("occ_start", i4, n_states), ("doc_info", np.uint8, len(doc_info))]
    assert tuple(name for name, _, _ in specs) == _SHARD_ARRAYS
    out = _MappedContainer(Path(path), KIND_SHARD, meta, specs)
    try:
        a = out.arrays
        if bulk:
            if ck.build_freeze(S, E, R, BM, a["links"], a["lens"], a["offsets"], a["etok"], a["eto"]) != n_edges:
                raise AssertionError("frozen edge count disagrees with the automaton's")
            a["tokens"][:] = tokens
            a["doc_starts"][:] = doc_starts
            clock.lap("freeze")
            # scratch in the spent builder arrays (mapped already): S holds 32 bytes per state, E >= 8 per token
            scratch_w = S.reshape(-1)[: 4 * n_states].reshape(n_states, 4)
            scratch_order = E.reshape(-1)[:n_states]
            if not ck.build_occurrences(a["links"], a["lens"], pstate, a["counts"], a["lasts"], a["occ"], a["occ_start"],
                                        scratch_w, scratch_order):
                raise AssertionError("occurrence layout disagrees with the automaton's counts")
            del S, E, R, scratch_w, scratch_order
        else:
            sa._freeze_into(a)
            del sa
            if not np.array_equal(a["doc_starts"], doc_starts):
                raise AssertionError("automaton document table disagrees with the document lengths")
            clock.lap("freeze")
            pstate = ck.prefix_states(a["offsets"], a["etok"], a["eto"], a["tokens"], a["doc_starts"])
            if pstate.shape[0] and pstate[0] == fk.CORRUPT:
                raise AssertionError("automaton does not spell its own documents")
            counts, lasts = a["counts"].copy(), a["lasts"].copy()
            if not ck.build_occurrences(a["links"], a["lens"], pstate, a["counts"], a["lasts"], a["occ"], a["occ_start"],
                                        np.empty((n_states, 4), np.int32), np.empty(n_states, np.int32)):
                raise AssertionError("occurrence layout disagrees with the automaton's suffix links")
            if not (np.array_equal(counts, a["counts"]) and np.array_equal(lasts, a["lasts"])):
                raise AssertionError("occurrence counts disagree with the automaton's")
        a["doc_info"][:] = np.frombuffer(doc_info, np.uint8)
        del a, pstate
        clock.lap("occurrences")
        result = out.finish(phases)
    finally:
        out.close()
    result.update(n_tokens=n_tokens, n_documents=n_docs, phases=phases)
    return result


class _ShardWriter:
    """Cuts documents into shards of about `shard_tokens` tokens and builds them, in `jobs`
    worker processes when jobs > 1 (at most jobs + 1 shards in flight, to bound memory)."""

    def __init__(self, directory: Path, shard_tokens: int, jobs: int, first_shard: int = 0, doc_base: int = 0, progress=None):
        if shard_tokens < 1:
            raise BadInputError(f"shard_tokens: expected a positive count, got {shard_tokens}")
        if jobs < 1:
            raise BadInputError(f"jobs: expected a positive count, got {jobs}")
        self.directory, self.shard_tokens, self.jobs = directory, int(shard_tokens), int(jobs)
        self.next_shard = first_shard
        self.doc_base = doc_base
        self.progress = progress
        self.pending = []  # (record, future or result)
        self.records = []
        self._reset()
        self.pool = None
        if self.jobs > 1:
            import multiprocessing

            # all workers fork now, before the caller's tokenizer starts its own threads
            self.pool = multiprocessing.get_context("fork").Pool(self.jobs)

    def _reset(self):
        self.buf, self.lens, self.ids, self.tags, self.n = [], [], [], [], 0

    def add(self, doc: Document) -> bool:
        toks = as_tokens(doc.tokens, "document tokens")
        if toks.shape[0] == 0:
            return False
        if self.n and self.n + toks.shape[0] > self.shard_tokens:
            self.flush()
        doc_index = self.doc_base + sum(r["n_documents"] for r in self.records) + len(self.lens)
        self.buf.append(toks)
        self.lens.append(toks.shape[0])
        self.ids.append(str(doc.id) if doc.id is not None else str(doc_index))
        self.tags.append({str(k): str(v) for k, v in (doc.tags or {}).items()})
        self.n += toks.shape[0]
        return True

    def flush(self):
        if not self.n:
            return
        name = f"shard-{self.next_shard:05d}.ssx"
        self.next_shard += 1
        tmp = self.directory / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        record = {"file": name, "tmp": tmp, "n_tokens": self.n, "n_documents": len(self.lens)}
        args = (str(tmp), np.concatenate(self.buf), np.asarray(self.lens, np.int64), self.ids, self.tags)
        self._reset()
        self.records.append(record)
        if self.pool is None:
            self._done(record, _build_shard_file(*args))
        else:
            self.pending.append((record, self.pool.apply_async(_build_shard_file, args)))
            while len(self.pending) > self.jobs:
                self._done(*self._pop())

    def _pop(self):
        record, fut = self.pending.pop(0)
        return record, fut.get()

    def _done(self, record, result):
        os.replace(record.pop("tmp"), self.directory / record["file"])
        record.update(bytes=result["bytes"], payload_crc=result["payload_crc"], phases=result["phases"])
        if self.progress is not None:
            self.progress(record)

    def finish(self) -> list[dict]:
        try:
            self.flush()
            while self.pending:
                self._done(*self._pop())
        finally:
            self.close()
        return self.records

    def close(self):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


def _manifest_meta(tokenizer: dict, records: list[dict], deleted: dict | None) -> dict:
    shards, tb, db = [], 0, 0
    for r in records:
        shards.append({"file": r["file"], "n_tokens": r["n_tokens"], "n_documents": r["n_documents"],
                       "token_base": tb, "doc_base": db, "bytes": r["bytes"], "payload_crc": r["payload_crc"]})
        tb += r["n_tokens"]
        db += r["n_documents"]
    return {"format": "suffixspec-corpus-index", "format_version": FORMAT_VERSION, "tokenizer": tokenizer,
            "n_tokens": tb, "n_documents": db, "shards": shards, "deleted": deleted,
            "suffixspec_version": __version__}


def _write_manifest(directory: Path, meta: dict) -> None:
    tmp = directory / f".{MANIFEST}.{uuid.uuid4().hex[:8]}.tmp"
    _write_container(tmp, KIND_MANIFEST, meta, {})
    os.replace(tmp, directory / MANIFEST)
    _fsync_dir(directory)


def _as_document(d) -> Document:
    if isinstance(d, Document):
        return d
    return Document(tokens=d)


def build_index(documents: Iterable, path, *, tokenizer, shard_tokens: int = DEFAULT_SHARD_TOKENS,
                jobs: int = 1, progress=None) -> BuildStats:
    """Build an index of `documents` (`Document`s or token arrays) at exactly `path`, atomically.

    `tokenizer`: the `Tokenizer` the tokens came from, or a dict {name, vocab_size, fingerprint}.
    An existing index at `path` is replaced; any other existing file or non-empty directory is
    an error. `progress(shard_record)` is called after each shard is written.
    """
    t0 = time.perf_counter()
    info = _tokenizer_info(tokenizer)
    path = Path(path)
    if path.exists() and not (path / MANIFEST).is_file() and not (path.is_dir() and not any(path.iterdir())):
        raise BadInputError(f"{path}: exists and is not a suffixspec index; refusing to overwrite it")
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir(parents=False)
    writer = None
    try:
        writer = _ShardWriter(tmp, shard_tokens, jobs, progress=progress)
        empty = 0
        for d in documents:
            if not writer.add(_as_document(d)):
                empty += 1
        records = writer.finish()
        if not records:
            raise BadInputError("empty corpus: no document has any token")
        meta = _manifest_meta(info, records, None)
        _write_manifest(tmp, meta)
        _replace_dir(tmp, path)
    except BaseException:
        if writer is not None:
            writer.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return BuildStats(meta["n_documents"], meta["n_tokens"], len(records), _disk_bytes(path), time.perf_counter() - t0, empty,
                      _sum_phases(records))


def _sum_phases(records) -> dict:
    out = {}
    for r in records:
        for k, v in r.get("phases", {}).items():
            out[k] = out.get(k, 0.0) + v
    return out


def _replace_dir(tmp: Path, path: Path) -> None:
    if path.exists():
        old = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.old"
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)
    _fsync_dir(path.parent)


def _disk_bytes(path: Path) -> int:
    meta = _Container(path / MANIFEST, KIND_MANIFEST).meta
    files = [MANIFEST] + [s["file"] for s in meta["shards"]] + ([meta["deleted"]["file"]] if meta.get("deleted") else [])
    return sum((path / f).stat().st_size for f in files)


def append_documents(path, documents: Iterable, *, tokenizer, shard_tokens: int = DEFAULT_SHARD_TOKENS, jobs: int = 1) -> BuildStats:
    """Add documents to an existing index as new shards (the manifest rename commits them)."""
    t0 = time.perf_counter()
    path = Path(path)
    index = CorpusIndex.open(path, tokenizer=tokenizer)
    meta = index._manifest
    writer = _ShardWriter(path, shard_tokens, jobs, first_shard=_next_shard_number(meta), doc_base=meta["n_documents"])
    try:
        for d in documents:
            writer.add(_as_document(d))
        records = writer.finish()
    except BaseException:
        writer.close()
        for r in writer.records:  # shards not yet named in the manifest: remove them
            for p in (r.get("tmp"), path / r["file"]):
                if p is not None:
                    Path(p).unlink(missing_ok=True)
        raise
    old = [dict(s) for s in meta["shards"]]
    new_meta = _manifest_meta(meta["tokenizer"], old + records, meta.get("deleted"))
    _write_manifest(path, new_meta)
    added_tokens = sum(r["n_tokens"] for r in records)
    return BuildStats(sum(r["n_documents"] for r in records), added_tokens, len(records), _disk_bytes(path),
                      time.perf_counter() - t0, phases=_sum_phases(records))


def _next_shard_number(meta) -> int:
    nums = [int(s["file"][6:11]) for s in meta["shards"] if s["file"][6:11].isdigit()]
    return max(nums, default=-1) + 1


def delete_documents(path, documents=None, *, ids: Iterable[str] | None = None, tags: dict | None = None) -> int:
    """Mark documents of the index at `path` deleted; returns how many are deleted afterwards.

    Selection as in `CorpusIndex.subset`: document indexes (ints or a BitMap) and/or the
    documents named in `ids` and carrying all `tags`; given together, all must hold. An index
    out of range, an id naming no document, tags matching no document or no selector at all is
    a BadInputError and changes nothing. The new bitmap file is written under a temporary name
    and renamed; the manifest rename commits it (one writer at a time per index).
    """
    path = Path(path)
    index = CorpusIndex.open(path)
    try:
        chosen = index.select_documents(documents, ids=ids, tags=tags)
        bm = index.deleted | chosen
        if len(bm) == len(index.deleted):
            return len(bm)  # nothing new: leave the files alone
        name = f"deleted-{uuid.uuid4().hex[:8]}.ssx"
        tmp = path / f".{name}.tmp"
        try:
            out = _write_container(tmp, KIND_DELETED, {"n_deleted": len(bm)},
                                   {"bitmap": np.frombuffer(bm.serialize(), np.uint8)})
            os.replace(tmp, path / name)
            meta = dict(index._manifest)
            old = meta.get("deleted")
            meta["deleted"] = {"file": name, "payload_crc": out["payload_crc"], "bytes": out["bytes"]}
            _write_manifest(path, meta)
        except BaseException:
            tmp.unlink(missing_ok=True)
            (path / name).unlink(missing_ok=True)
            raise
    finally:
        index.close()
    if old and old["file"] != name:
        (path / old["file"]).unlink(missing_ok=True)
    return len(bm)


def merge_indexes(paths, out, *, shard_tokens: int | None = None, jobs: int = 1) -> BuildStats:
    """Compact indexes (all built with one tokenizer) into one at `out`, dropping deleted
    documents; one shard unless `shard_tokens` is given."""
    indexes = [CorpusIndex.open(p) for p in paths]
    if not indexes:
        raise BadInputError("merge: expected at least one index")
    info = indexes[0].tokenizer_info
    for ix in indexes[1:]:
        if ix.tokenizer_info["fingerprint"] != info["fingerprint"]:
            raise TokenizerMismatchError(
                f"{ix.path}: built with tokenizer {ix.tokenizer_info['name']} ({ix.tokenizer_info['fingerprint'][:16]}), "
                f"{indexes[0].path} with {info['name']} ({info['fingerprint'][:16]}); cannot merge")

    def docs():
        for ix in indexes:
            yield from ix.iter_documents()

    if not any(ix.n_documents > len(ix.deleted) for ix in indexes):
        raise BadInputError("merge: every document of the input index(es) is deleted; nothing to merge")
    total = sum(ix.n_tokens for ix in indexes)
    return build_index(docs(), out, tokenizer=info, shard_tokens=shard_tokens or max(total, 1), jobs=jobs)


# -- opening and querying -----------------------------------------------------------------------


class _Shard:
    """One mapped shard: a FrozenAutomaton over its arrays plus the occurrence layout."""

    def __init__(self, path: Path, record: dict, number: int):
        self.path = path
        self.number = number
        self.file = _Container(path, KIND_SHARD)
        m = self.file.meta
        for key in ("n_tokens", "n_documents"):
            if m.get(key) != record[key]:
                self.file._fail(f"{key} is {m.get(key)}, the manifest says {record[key]}")
        if self.file.payload_crc != record["payload_crc"]:
            self.file._fail("does not belong to this index (checksum differs from the manifest's)")
        a = {name: self.file.array(name) for name in _SHARD_ARRAYS}
        try:
            self.fa = FrozenAutomaton(**{k: a[k] for k in FrozenAutomaton._FIELDS})
        except IndexFormatError as exc:
            self.file._fail(str(exc))
        self.occ, self.occ_start, self._doc_info = a["occ"], a["occ_start"], a["doc_info"]
        self.token_base, self.doc_base = record["token_base"], record["doc_base"]
        self.n_tokens, self.n_documents = record["n_tokens"], record["n_documents"]
        fa = self.fa
        checks = [
            (fa.tokens.shape[0] == self.n_tokens, "token array length"),
            (fa.doc_starts.shape[0] == self.n_documents, "document table length"),
            (self.occ.shape[0] == self.n_tokens and self.occ_start.shape[0] == fa.n_states, "occurrence layout size"),
            (fa.n_states == m.get("n_states") and fa.n_edges == m.get("n_edges"), "state/edge counts"),
            (int(fa.offsets[0]) == 0 and int(fa.offsets[-1]) == fa.n_edges, "edge offsets"),
            (int(fa.doc_starts[0]) == 0 and bool(np.all(np.diff(fa.doc_starts) > 0)) and int(fa.doc_starts[-1]) < self.n_tokens, "document starts"),
            (int(fa.counts[0]) == self.n_tokens and int(fa.links[0]) == -1, "root state"),
        ]
        for ok, what in checks:
            if not ok:
                self.file._fail(f"inconsistent {what}")

    def doc_info(self) -> dict:
        try:
            info = json.loads(bytes(self._doc_info))
            ids, tags = info["ids"], info["tags"]
            if len(ids) != self.n_documents or len(tags) != self.n_documents:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            self.file._fail("damaged document table")
        return info

    def _corrupt(self, what):
        self.file._fail(f"damaged arrays ({what}); run `suffixspec info` to check the index")


@dataclass
class CorpusMatch:
    """What an index knows about a matched string: `length` tokens long, `count` end positions
    (an estimate when `estimated`), and its continuations: `tokens` (sorted), their `counts`
    and the most recent end position (`last_ends`, global) of matched string + token."""

    length: int
    count: int
    estimated: bool
    tokens: np.ndarray
    counts: np.ndarray
    last_ends: np.ndarray

    def __len__(self) -> int:
        """Number of distinct continuation tokens."""
        return int(self.tokens.shape[0])

    def as_dict(self) -> dict[int, tuple[int, int]]:
        return {int(t): (int(c), int(e)) for t, c, e in zip(self.tokens, self.counts, self.last_ends)}

    def top(self, n: int = 5) -> list[tuple[int, int, int]]:
        """(token, count, last_end) of the `n` most frequent continuations, most recent first on ties."""
        order = np.lexsort((-self.last_ends, -self.counts))[:n]
        return [(int(self.tokens[i]), int(self.counts[i]), int(self.last_ends[i])) for i in order]


class Subset:
    """A compiled document filter of one index: a BitMap of document indexes, a bool mask
    (deleted documents already removed) and, per shard, the position runs of its selected
    documents (see `_kernels/corpus.py`). Build once per request, reuse for every query."""

    __slots__ = ("bitmap", "mask", "shard_live", "runs")

    def __init__(self, bitmap, mask: np.ndarray, shard_live: list[bool], runs: list[tuple[np.ndarray, np.ndarray]]):
        self.bitmap = bitmap
        self.mask = mask  # bool[n_documents]
        self.shard_live = shard_live  # per shard: does it hold a selected document?
        self.runs = runs  # per shard: (run_lo, run_hi) int64, shard-local positions

    def __len__(self):
        return int(self.mask.sum())

    def __repr__(self):
        return f"Subset({len(self)} documents)"


class CorpusIndex:
    """An opened corpus index (read-only, memory-mapped, safe to share across threads)."""

    def __init__(self, path: Path, manifest: _Container, shards: list[_Shard], deleted):
        self.path = path
        self._manifest_file = manifest
        self._manifest = manifest.meta
        self.shards = shards
        self.deleted = deleted  # BitMap of deleted document indexes
        self._doc_info = None
        self._live = None
        self._root = None  # unrestricted CorpusMatch of the empty string (read-only arrays)

    # -- opening --------------------------------------------------------------------------
    @classmethod
    def open(cls, path, *, tokenizer=None, verify: bool = False) -> CorpusIndex:
        """Map the index at `path`, checking headers, sizes and cheap invariants (all
        checksums too when `verify`); with `tokenizer`, also check it is the index's."""
        from pyroaring import BitMap

        path = Path(path)
        if not path.exists():
            raise IndexFormatError(f"{path}: no such index")
        if not path.is_dir():
            raise IndexFormatError(f"{path}: not a suffixspec index (expected a directory holding {MANIFEST})")
        manifest = _Container(path / MANIFEST, KIND_MANIFEST)
        manifest.verify()  # small: always fully checked
        meta = manifest.meta
        try:
            if meta["format"] != "suffixspec-corpus-index" or meta["format_version"] != FORMAT_VERSION:
                manifest._fail(f"unsupported format {meta['format']!r} version {meta['format_version']!r}")
            records = meta["shards"]
            tb = db = 0
            for r in records:
                if r["token_base"] != tb or r["doc_base"] != db or "/" in r["file"] or r["file"].startswith("."):
                    raise KeyError("shards")
                tb += r["n_tokens"]
                db += r["n_documents"]
            if tb != meta["n_tokens"] or db != meta["n_documents"] or not records:
                raise KeyError("n_tokens")
            _tokenizer_info(meta["tokenizer"])
        except (KeyError, TypeError, BadInputError):
            manifest._fail("inconsistent manifest")
        shards = [_Shard(path / r["file"], r, i) for i, r in enumerate(records)]
        deleted = BitMap()
        if meta.get("deleted"):
            dfile = _Container(path / meta["deleted"]["file"], KIND_DELETED)
            dfile.verify()
            if dfile.payload_crc != meta["deleted"]["payload_crc"]:
                dfile._fail("does not belong to this index")
            try:
                deleted = BitMap.deserialize(bytes(dfile.array("bitmap")))
            except Exception:
                dfile._fail("damaged bitmap")
            if len(deleted) and deleted.max() >= meta["n_documents"]:
                dfile._fail("deleted document index out of range")
        index = cls(path, manifest, shards, deleted)
        if verify:
            index.verify()
        if tokenizer is not None:
            index.check_tokenizer(tokenizer)
        return index

    def verify(self) -> None:
        """Check every checksum of every file; raises IndexFormatError naming the damaged file."""
        self._manifest_file.verify()
        for s in self.shards:
            s.file.verify()
            s.doc_info()

    def check_tokenizer(self, tokenizer) -> None:
        mine, theirs = self.tokenizer_info, _tokenizer_info(tokenizer)
        if mine["fingerprint"] != theirs["fingerprint"]:
            raise TokenizerMismatchError(
                f"{self.path}: index built with tokenizer {mine['name']} (vocab {mine['vocab_size']}, fingerprint "
                f"{mine['fingerprint'][:16]}), but {theirs['name']} (vocab {theirs['vocab_size']}, fingerprint "
                f"{theirs['fingerprint'][:16]}) is in use")

    def close(self) -> None:
        """Drop references to the mapped files (the maps close once no array view remains)."""
        self.shards = []

    # -- sizes and documents ----------------------------------------------------------------
    @property
    def tokenizer_info(self) -> dict:
        return dict(self._manifest["tokenizer"])

    @property
    def format_version(self) -> int:
        return int(self._manifest["format_version"])

    @property
    def n_tokens(self) -> int:
        return int(self._manifest["n_tokens"])

    @property
    def n_documents(self) -> int:
        return int(self._manifest["n_documents"])

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    def __len__(self) -> int:
        return self.n_tokens

    @property
    def bytes_on_disk(self) -> int:
        return _disk_bytes(self.path)

    def _docs(self):
        if self._doc_info is None:
            ids, tags = [], []
            for s in self.shards:
                info = s.doc_info()
                ids += info["ids"]
                tags += info["tags"]
            self._doc_info = (ids, tags)
        return self._doc_info

    @property
    def document_ids(self) -> list[str]:
        return self._docs()[0]

    @property
    def document_tags(self) -> list[dict]:
        return self._docs()[1]

    def document_span(self, doc: int) -> tuple[int, int]:
        """(first position, one past the last) of document index `doc`."""
        doc = int(doc)
        if not 0 <= doc < self.n_documents:
            raise BadInputError(f"doc: expected a document index in [0, {self.n_documents - 1}], got {doc}")
        for s in self.shards:
            if doc < s.doc_base + s.n_documents:
                ds = s.fa.doc_starts
                i = doc - s.doc_base
                stop = int(ds[i + 1]) if i + 1 < ds.shape[0] else s.n_tokens
                return s.token_base + int(ds[i]), s.token_base + stop
        raise AssertionError

    def document_tokens(self, doc: int) -> np.ndarray:
        lo, hi = self.document_span(doc)
        s = self._shard_of_position(lo)
        return np.array(s.fa.tokens[lo - s.token_base : hi - s.token_base], np.int32)

    def iter_documents(self, include_deleted: bool = False) -> Iterator[Document]:
        ids, tags = self._docs()
        for s in self.shards:
            ds = np.append(np.asarray(s.fa.doc_starts), s.n_tokens)
            for i in range(s.n_documents):
                d = s.doc_base + i
                if include_deleted or d not in self.deleted:
                    yield Document(np.array(s.fa.tokens[ds[i] : ds[i + 1]], np.int32), ids[d], dict(tags[d]))

    # -- subsets ------------------------------------------------------------------------------
    def find_documents(self, *, tags: dict | None = None, ids: Iterable[str] | None = None):
        """BitMap of the documents carrying all `tags` (key -> value) and, if given, named in `ids`."""
        from pyroaring import BitMap

        all_ids, all_tags = self._docs()
        want_ids = set(map(str, ids)) if ids is not None else None
        tags = {str(k): str(v) for k, v in (tags or {}).items()}
        return BitMap(i for i in range(self.n_documents)
                      if (want_ids is None or all_ids[i] in want_ids)
                      and all(all_tags[i].get(k) == v for k, v in tags.items()))

    def select_documents(self, documents=None, *, ids: Iterable[str] | None = None, tags: dict | None = None):
        """BitMap of document indexes chosen by `documents` (ints or a BitMap) and/or `ids` and
        `tags`, all of which must hold (deleted documents included). Strict, for destructive
        use: an index out of range, an unknown id, ids/tags selecting nothing or no selector at
        all raise BadInputError."""
        from pyroaring import BitMap

        if documents is None and ids is None and tags is None:
            raise BadInputError("select: expected document indexes, ids or tags; got none")
        bm = None
        if documents is not None:
            try:
                bm = BitMap(int(d) for d in documents) if not isinstance(documents, BitMap) else BitMap(documents)
            except (TypeError, ValueError, OverflowError):
                raise BadInputError(f"documents: expected document indexes in [0, {self.n_documents - 1}]") from None
            if len(bm) and bm.max() >= self.n_documents:
                raise BadInputError(f"documents: expected indexes in [0, {self.n_documents - 1}], got {bm.max()}")
        if ids is not None:
            ids = [str(i) for i in ids]
            known = set(self.document_ids)
            unknown = [i for i in ids if i not in known]
            if unknown:
                shown = ", ".join(repr(i) for i in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
                raise BadInputError(f"{self.path}: no document with id {shown}")
        if ids is not None or tags is not None:
            found = self.find_documents(tags=tags, ids=ids)
            bm = found if bm is None else bm & found
            if not len(bm):
                what = [f"{k}={v}" for k, v in (tags or {}).items()] + ([f"{len(ids)} given id(s)"] if ids is not None else [])
                raise BadInputError(f"{self.path}: no document matches {' and '.join(what)}")
        return bm

    def subset(self, documents=None, *, tags: dict | None = None, ids: Iterable[str] | None = None) -> Subset:
        """Compile a filter: document indexes (a BitMap or ints), and/or tags / document ids."""
        from pyroaring import BitMap

        bm = BitMap(documents) if documents is not None else None
        if tags is not None or ids is not None:
            found = self.find_documents(tags=tags, ids=ids)
            bm = found if bm is None else bm & found
        if bm is None:
            bm = BitMap(range(self.n_documents))
        mask = np.zeros(self.n_documents, np.bool_)
        arr = np.asarray(bm.to_array(), np.int64)
        if arr.size and (arr[0] < 0 or arr[-1] >= self.n_documents):
            raise BadInputError(f"documents: expected indexes in [0, {self.n_documents - 1}]")
        mask[arr] = True
        if len(self.deleted):
            mask[np.asarray(self.deleted.to_array(), np.int64)] = False
        live, runs = [], []
        for s in self.shards:
            sel = mask[s.doc_base : s.doc_base + s.n_documents]
            live.append(bool(sel.any()))
            runs.append(ck.selected_runs(s.fa.doc_starts, s.n_tokens, sel))
        return Subset(bm, mask, live, runs)

    def _mask(self, subset):
        if subset is None:
            if not len(self.deleted):
                return None
            if self._live is None:
                self._live = self.subset()
            return self._live
        if isinstance(subset, Subset):
            if subset.mask.shape[0] != self.n_documents:
                raise BadInputError("subset: compiled for another index")
            return subset
        return self.subset(subset)

    # -- queries ------------------------------------------------------------------------------
    def _shard_match(self, s: _Shard, toks, sub, k: int):
        """(state, length, exact) of the longest suffix of `toks` in the shard's (selected)
        documents; not `exact` when a restricted walk hit its work cap (see subset_match)."""
        fa = s.fa
        if sub is not None and not sub.shard_live[s.number]:
            return 0, 0, True  # no selected document in this shard
        st, ln = fk.advance(fa.offsets, fa.etok, fa.eto, fa.links, fa.lens, 0, 0, toks)
        if st == fk.CORRUPT:
            s._corrupt("while matching")
        exact = True
        if sub is not None and st != 0:
            run_lo, run_hi = sub.runs[s.number]
            st, ln, exact = ck.subset_match(fa.offsets, fa.etok, fa.eto, fa.links, fa.lens, s.occ, s.occ_start, fa.counts,
                                            run_lo, run_hi, st, ln, k)
            if st == fk.CORRUPT:
                s._corrupt("while matching in a subset")
        return int(st), int(ln), bool(exact)

    def match_length(self, context, subset=None, *, k: int = DEFAULT_K) -> int:
        """Length of the longest suffix of `context` that occurs in the (selected) documents
        (restricted: a lower bound when the walk hits its work cap, see `query`)."""
        toks = as_tokens(context, "context")
        sub = self._mask(subset)
        _check_k(k)
        return max(self._shard_match(s, toks, sub, k)[1] for s in self.shards)

    def query(self, context, subset=None, *, k: int = DEFAULT_K) -> CorpusMatch:
        """The longest suffix of `context` occurring in the (selected) documents, its count and
        continuations. Restricted, the work is O(k) positions per shard: counts and
        continuations come from at most k sampled positions of the matched string (all of them
        when it occurs at most k times in a shard), and the walk to the longest suffix reads
        O(k) positions (see `_kernels.corpus.subset_match`); `estimated` says either fell short."""
        toks = as_tokens(context, "context")
        sub = self._mask(subset)
        _check_k(k)
        found = [self._shard_match(s, toks, sub, k) for s in self.shards]
        length = max(ln for _, ln, _ in found)
        walk_exact = all(ex for _, _, ex in found)
        hits = [(s, st) for s, (st, ln, _) in zip(self.shards, found) if ln == length]
        if length == 0:
            if sub is None:  # the empty string: every token follows it; computed once
                if self._root is None:
                    self._root = self._combine(0, [(s, 0) for s in self.shards], None, k)
                    for a in (self._root.tokens, self._root.counts, self._root.last_ends):
                        a.flags.writeable = False
                return self._root
            hits = [(s, 0) for s in self.shards if sub.shard_live[s.number]]
        m = self._combine(length, hits, sub, k)
        if not walk_exact:
            m.estimated = True
        return m

    def lookup(self, pattern, subset=None, *, k: int = DEFAULT_K) -> CorpusMatch:
        """Count and continuations of exactly `pattern` (count 0 if it does not occur)."""
        toks = as_tokens(pattern, "pattern")
        sub = self._mask(subset)
        _check_k(k)
        hits = []
        for s in self.shards:
            st = int(fk.locate(s.fa.offsets, s.fa.etok, s.fa.eto, toks))
            if st == fk.CORRUPT:
                s._corrupt("while locating")
            if st >= 0 and (sub is None or sub.shard_live[s.number]):
                hits.append((s, st))
        return self._combine(int(toks.shape[0]), hits, sub, k)

    def count(self, pattern, subset=None, *, k: int = DEFAULT_K) -> int:
        """End positions of `pattern` in the (selected) documents; exact unrestricted, and
        restricted when at most `k` per shard, else an estimate (see `lookup().estimated`)."""
        return self.lookup(pattern, subset, k=k).count

    def continuations(self, pattern, subset=None, *, k: int = DEFAULT_K) -> dict[int, tuple[int, int]]:
        return self.lookup(pattern, subset, k=k).as_dict()

    def _combine(self, length, hits, sub, k) -> CorpusMatch:
        _check_k(k)
        total, estimated = 0, False
        tok_parts, cnt_parts, end_parts = [], [], []
        for s, st in hits:
            fa = s.fa
            if sub is None:
                if not 0 <= st < fa.n_states:
                    s._corrupt("state out of range")
                total += int(fa.counts[st])
                toks, dsts, ok = fk.out_edges(fa.offsets, fa.etok, fa.eto, st)
                if not ok:
                    s._corrupt(f"edges of state {st}")
                tok_parts.append(toks)
                cnt_parts.append(fa.counts[dsts].astype(np.int64))
                end_parts.append(fa.lasts[dsts].astype(np.int64) + s.token_base)
                continue
            run_lo, run_hi = sub.runs[s.number]
            h, sampled, ntoks, nends, ok = ck.subset_sample(s.occ, s.occ_start, fa.counts, fa.doc_starts, fa.tokens,
                                                            run_lo, run_hi, st, k)
            if not ok:
                s._corrupt("while sampling in a subset")
            c = int(fa.counts[st])
            if st == 0:  # the empty string: exact from document lengths
                total += self._subset_tokens(s, sub)
            else:
                total += h if sampled == c else int(round(h * c / max(sampled, 1)))
            if sampled != c:
                estimated = True
            if ntoks.shape[0] == 0:
                continue
            order = np.argsort(ntoks, kind="stable")
            uniq, cnt, last = ck.merge_sorted(ntoks[order], np.ones(ntoks.shape[0], np.int64), nends[order])
            if sampled != c:
                cnt = np.maximum(1, np.rint(cnt * (c / sampled))).astype(np.int64)
            tok_parts.append(uniq)
            cnt_parts.append(cnt)
            end_parts.append(last + s.token_base)
        if sub is not None and any(int(s.fa.counts[st]) > k for s, st in hits if st != 0):
            estimated = True
        if not tok_parts:
            e = np.empty(0, np.int64)
            return CorpusMatch(length, total, estimated, np.empty(0, np.int32), e, e.copy())
        toks = np.concatenate(tok_parts)
        cnts = np.concatenate(cnt_parts)
        ends = np.concatenate(end_parts)
        if len(tok_parts) > 1:
            order = np.argsort(toks, kind="stable")  # radix sort of int32
            toks, cnts, ends = ck.merge_sorted(toks[order], cnts[order], ends[order])
        return CorpusMatch(length, total, estimated, toks.astype(np.int32), cnts, ends)

    def _subset_tokens(self, s: _Shard, sub: Subset) -> int:
        lens = ck.doc_lengths(s.fa.doc_starts, s.n_tokens)
        return int(lens[sub.mask[s.doc_base : s.doc_base + s.n_documents]].sum())

    def _shard_of_position(self, pos: int) -> _Shard:
        for s in self.shards:
            if pos < s.token_base + s.n_tokens:
                return s
        raise AssertionError

    def following(self, end: int, n: int) -> np.ndarray:
        """Up to `n` tokens after global position `end`, stopping at the end of its document."""
        end = int(end)
        if not 0 <= end < self.n_tokens:
            raise BadInputError(f"end: expected a position in [0, {self.n_tokens - 1}], got {end}")
        s = self._shard_of_position(end)
        return s.fa.following(end - s.token_base, n)

    def document_of(self, pos: int) -> int:
        """Document index holding global position `pos`."""
        s = self._shard_of_position(int(pos))
        return s.doc_base + int(np.searchsorted(s.fa.doc_starts, int(pos) - s.token_base, side="right")) - 1

    def info(self) -> dict:
        return {"path": str(self.path), "format_version": self.format_version, "tokenizer": self.tokenizer_info,
                "n_tokens": self.n_tokens, "n_documents": self.n_documents, "n_shards": self.n_shards,
                "n_deleted": len(self.deleted), "bytes_on_disk": self.bytes_on_disk,
                "bytes_per_token": round(self.bytes_on_disk / max(self.n_tokens, 1), 2),
                "n_states": sum(s.fa.n_states for s in self.shards), "n_edges": sum(s.fa.n_edges for s in self.shards)}

    def __repr__(self):
        return f"CorpusIndex({str(self.path)!r}, tokens={self.n_tokens}, documents={self.n_documents}, shards={self.n_shards})"


def _check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise BadInputError(f"k: expected a positive sample size, got {k!r}")


# -- reading input files ---------------------------------------------------------------------

IGNORED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".tox",
                          ".mypy_cache", ".pytest_cache", ".ruff_cache", ".idea", ".vscode", ".eggs"})
JSONL_SUFFIXES = (".jsonl", ".ndjson")


@dataclass
class ReadStats:
    files: int = 0
    skipped_lines: int = 0
    skipped_files: int = 0
    bytes: int = 0


def list_input_files(inputs, glob: str | None = None) -> list[tuple[Path, str]]:
    """(file, document id prefix) for every input: files as given, directories walked
    recursively (sorted; IGNORED_DIRS, hidden directories and `*.egg-info` skipped; `glob`
    matched against file names)."""
    out = []
    for inp in inputs:
        p = Path(inp)
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS and not d.startswith(".") and not d.endswith(".egg-info"))
                for name in sorted(files):
                    if glob and not fnmatch.fnmatch(name, glob):
                        continue
                    if name.startswith(".") or name.endswith((".pyc", ".pyo")):
                        continue
                    f = Path(root) / name
                    out.append((f, str(Path(p.name) / f.relative_to(p))))
        elif p.exists():
            out.append((p, str(p)))
        else:
            raise BadInputError(f"{p}: no such file or directory")
    return out


def _tags_from(value, where) -> dict:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, str) and "=" in v for v in value):
        return dict(v.split("=", 1) for v in value)
    raise BadInputError(f"{where}: tags: expected an object or a list of 'key=value' strings, got {value!r}")


def read_documents(inputs, *, glob: str | None = None, field_name: str = "text", id_field: str | None = None,
                   tag_field: str | None = None, tags: dict | None = None, skip_bad: bool = False,
                   stats: ReadStats | None = None, files=None) -> Iterator[tuple[str, str, dict]]:
    """(text, id, tags) of every document in `inputs`: a text file is one document; each line of
    a `.jsonl` file is one (its `field_name`, optional `id_field`, `tag_field`). Explicit inputs
    that are unreadable, binary or malformed raise BadInputError naming the file (and line);
    `skip_bad` counts and skips them instead. Binary files found while walking are skipped."""
    stats = stats if stats is not None else ReadStats()
    extra = dict(tags or {})
    explicit = {Path(i) for i in inputs}
    for f, doc_id in (files if files is not None else list_input_files(inputs, glob)):
        try:
            data = f.read_bytes()
        except OSError as exc:
            if skip_bad:
                stats.skipped_files += 1
                continue
            raise BadInputError(f"{f}: cannot read ({exc.strerror or exc})") from None
        stats.files += 1
        stats.bytes += len(data)
        if f.suffix in JSONL_SUFFIXES:
            yield from _read_jsonl(f, data, field_name, id_field, tag_field, extra, skip_bad, stats)
            continue
        try:
            if b"\0" in data[:8192]:
                raise UnicodeDecodeError("utf-8", b"", 0, 1, "NUL byte")
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            if f in explicit and not skip_bad:
                raise BadInputError(f"{f}: not a UTF-8 text file (binary?)") from None
            stats.skipped_files += 1
            continue
        yield text, doc_id, dict(extra)


def _read_jsonl(f, data, field_name, id_field, tag_field, extra, skip_bad, stats):
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        where = f"{f}:{lineno}"
        try:
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise BadInputError(f"{where}: malformed JSON ({getattr(exc, 'msg', exc)})") from None
            if not isinstance(obj, dict):
                raise BadInputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            text = obj.get(field_name)
            if not isinstance(text, str):
                raise BadInputError(f"{where}: field {field_name!r}: expected a string, got {type(text).__name__ if text is not None else 'nothing'}")
            doc_id = f"{f.name}:{lineno}"
            if id_field is not None:
                if obj.get(id_field) is None:
                    raise BadInputError(f"{where}: missing id field {id_field!r}")
                doc_id = str(obj[id_field])
            tags = dict(extra)
            if tag_field is not None:
                tags.update(_tags_from(obj.get(tag_field), where))
        except BadInputError:
            if skip_bad:
                stats.skipped_lines += 1
                continue
            raise
        yield text, doc_id, tags
