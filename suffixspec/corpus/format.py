"""The container file format shared by every file of a corpus index, and its checksums.

Contract. A container file is a 64-byte header (magic, format version, kind, file length, array
count, meta crc32 / offset / length, payload crc32, reserved, header crc32), a table of 64-byte
array entries (name, dtype, offset, element count, crc32), a JSON meta block (an object), then
the arrays, each 64-byte aligned, in table order, laid out exactly as `plan` computes (so the
table is checked against the plan, not trusted). `Container` opens one file read-only and
memory-mapped: it refuses, with an `IndexFormatError` naming the file, anything that is not a
regular file (FIFO, device, directory, symlink loop: checked before reading, never a hang),
a missing file (`MissingFileError`), a bad magic, version or kind, a damaged header or meta
block (their checksums are always checked), a size other than the header's, and an array table
that differs from the plan or names other arrays / dtypes than the caller expects. Array
contents are checksummed only by `verify()` or `check_arrays(names)`. Writers: `write_container`
(in-memory arrays) and `MappedContainer` (arrays filled in place in the mapped new file) write
the same bytes; the caller picks a temporary name and renames.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import struct
import time
import zlib
from pathlib import Path

import numpy as np

from .._kernels.frozen import LEN_SATURATED
from ..errors import BadInputError, IndexFormatError, InternalError
from ..fileio import open_regular, start_writeback

__all__ = ["MAGIC", "FORMAT_VERSION", "KIND_MANIFEST", "KIND_SHARD", "KIND_DELETED", "MANIFEST", "ALIGN",
           "SHARD_ARRAYS", "SHARD_DTYPES", "DELETED_DTYPES", "MissingFileError", "Container", "MappedContainer",
           "write_container", "crc32_combine", "PhaseClock", "LEN_SATURATED"]

MAGIC = b"SFXSPIDX"
# 1: before the compact shards (occurrence layout stored, int32 token ids and lengths); 2: before the
# saturated uint16 state lengths (uint16 only when every length fit); 3: before the implicit states
# (every state stored, frozen.py)
FORMAT_VERSION = 4
KIND_MANIFEST, KIND_SHARD, KIND_DELETED = 1, 2, 3
KIND_NAMES = {KIND_MANIFEST: "manifest", KIND_SHARD: "shard", KIND_DELETED: "deleted-documents"}
MANIFEST = "manifest.ssx"
ALIGN = 64
# magic, version, kind, file_length, n_arrays, meta_crc, meta_offset, meta_length, payload_crc, reserved, header_crc
HEADER = struct.Struct("<8sIIQIIQQI8sI")
# name, dtype, offset, count, crc32, reserved
ENTRY = struct.Struct("<32s8sQQI4s")
if HEADER.size != 64 or ENTRY.size != 64:
    raise InternalError("container header and entry must be 64 bytes")
DTYPES = {"<i4", "<i8", "<u2", "|u1", "|b1"}
# the arrays of a shard file, in file order, and the dtypes each may have
SHARD_ARRAYS = ("links", "lens", "counts", "count_escapes", "lasts", "offsets", "etok", "eto", "tokens", "plink", "doc_starts",
                "doc_info")
SHARD_DTYPES = {name: ("<i4",) for name in SHARD_ARRAYS}
# token ids are uint16 in a shard whose ids all fit, state lengths in one whose suffix links' lengths
# fit below LEN_SATURATED (the longer lengths of other states stored as LEN_SATURATED); counts are
# uint16, those from frozen.COUNT_ESCAPED on found in count_escapes
SHARD_DTYPES.update(offsets=("<i4", "<i8"), etok=("<u2", "<i4"), tokens=("<u2", "<i4"), lens=("<u2", "<i4"), counts=("<u2",),
                    doc_starts=("<i8",), doc_info=("|u1",))
DELETED_DTYPES = {"bitmap": ("|u1",)}
MAX_ARRAYS = 64


def version_problem(version) -> str:
    """Why a file of format `version` is refused, and what to do about it."""
    if isinstance(version, int) and 0 < version < FORMAT_VERSION:
        return (f"format version {version}, from an older suffixspec; this suffixspec reads version {FORMAT_VERSION} "
                "(implicit states): rebuild the index from its sources with "
                "`suffixspec index` (or list its documents with the suffixspec that built it and index them again)")
    return f"format version {version}, this suffixspec reads version {FORMAT_VERSION} (a newer suffixspec wrote it)"


class MissingFileError(IndexFormatError):
    """A file an index names is not there (damage, or a concurrent writer's swap: see CorpusIndex.open)."""


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class PhaseClock:
    """Adds the seconds since the previous lap to `phases[name]` (does nothing without a dict)."""

    def __init__(self, phases: dict | None):
        self.phases = phases
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.phases is not None:
            t = time.perf_counter()
            self.phases[name] = self.phases.get(name, 0.0) + t - self.t
            self.t = t


# -- checksums ------------------------------------------------------------------------------

CRC_ZERO_OPS: list = []  # k -> the CRC-32 operator (GF(2) 32x32 matrix, columns as ints) of 2**k zero bytes


def gf2_apply(mat: list, vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib.crc32(a + b) from crc1 = zlib.crc32(a), crc2 = zlib.crc32(b) and len2 = len(b): crc1
    advanced over len2 zero bytes (the register is linear over GF(2), and the pre- and
    post-inversions of a and b cancel), xor crc2. O(log len2) matrix-vector products."""
    if not CRC_ZERO_OPS:
        op = [0xEDB88320] + [1 << i for i in range(31)]  # one zero bit (reflected polynomial)
        for _ in range(3):  # -> one zero byte
            op = [gf2_apply(op, c) for c in op]
        for _ in range(64):
            CRC_ZERO_OPS.append(op)
            op = [gf2_apply(op, c) for c in op]
    k = 0
    while len2:
        if len2 & 1:
            crc1 = gf2_apply(CRC_ZERO_OPS[k], crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2


# -- writing --------------------------------------------------------------------------------


def plan(meta_b: bytes, specs) -> tuple[list[tuple], int]:
    """Layout of a container file holding arrays `specs` [(name, dtype, count)]:
    [(name, dtype code, offset, count, nbytes)] and the file length."""
    meta_off = HEADER.size + ENTRY.size * len(specs)
    off = align(meta_off + len(meta_b))
    out, end = [], meta_off + len(meta_b)
    for name, dtype, count in specs:
        dt = np.dtype(dtype)
        dt = dt.newbyteorder("<") if dt.byteorder == ">" else dt
        if dt.str not in DTYPES:
            raise BadInputError(f"array {name}: unsupported dtype {dt}")
        nbytes = int(count) * dt.itemsize
        out.append((name, dt.str, off, int(count), nbytes))
        end = off + nbytes
        off = align(end)
    return out, end


def head(kind: int, file_length: int, n_arrays: int, meta_b: bytes, payload_crc: int) -> bytes:
    meta_off = HEADER.size + ENTRY.size * n_arrays
    h = HEADER.pack(MAGIC, FORMAT_VERSION, kind, file_length, n_arrays, zlib.crc32(meta_b),
                    meta_off, len(meta_b), payload_crc, b"", 0)
    return h[:-4] + struct.pack("<I", zlib.crc32(h[:-4]))


def meta_bytes(meta: dict) -> bytes:
    return json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()


def write_container(path: Path, kind: int, meta: dict, arrays: dict[str, np.ndarray]) -> dict:
    """Write one container file of in-memory `arrays` at `path` (the caller picks a temporary
    name and renames); returns {"bytes", "payload_crc"}."""
    arrays = {k: np.ascontiguousarray(a) for k, a in arrays.items()}
    meta_b = meta_bytes(meta)
    layout, file_length = plan(meta_b, [(k, a.dtype, a.shape[0]) for k, a in arrays.items()])
    entries, bufs = [], []
    for (name, code, off, count, _), a in zip(layout, arrays.values()):
        buf = memoryview(a.astype(code, copy=False)).cast("B")
        entries.append(ENTRY.pack(name.encode(), code.encode(), off, count, zlib.crc32(buf), b""))
        bufs.append((off, buf))
    crc = 0
    with open(path, "wb") as f:
        f.write(b"\0" * HEADER.size)
        pos = HEADER.size
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
        f.write(head(kind, file_length, len(arrays), meta_b, crc))
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": file_length, "payload_crc": crc}


class MappedContainer:
    """A container file written in place: `arrays` are writable views of the new file's
    mapping, filled by the caller (kernels write straight into the page cache, no copy of the
    shard in memory); `finish()` adds checksums, table, meta and header, then syncs. The same
    bytes as `write_container` would write. Every view must be dropped before `finish()`."""

    def __init__(self, path: Path, kind: int, meta: dict, specs):
        self.path, self.kind = path, kind
        self.meta_b = meta_bytes(meta)
        self.plan, self.length = plan(self.meta_b, specs)
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

    def finish(self, phases: dict | None = None, durable: bool = True) -> dict:
        """Checksums, array table, meta and header; then fsync, or with `durable=False` only the
        writeback started (the caller fsyncs the file before anything names it: `fileio.fsync_file`).
        Returns {"bytes", "payload_crc"}."""
        clock = PhaseClock(phases)
        self.arrays.clear()
        mv = memoryview(self.mm)
        try:
            crcs = [zlib.crc32(mv[off : off + nbytes]) for _, _, off, _, nbytes in self.plan]
            table = b"".join(ENTRY.pack(name.encode(), code.encode(), off, count, c, b"")
                             for (name, code, off, count, _), c in zip(self.plan, crcs))
            meta_off = HEADER.size + len(table)
            mv[HEADER.size : meta_off] = table
            mv[meta_off : meta_off + len(self.meta_b)] = self.meta_b
            # the payload checksum from the arrays' own, not a second pass over the file
            # (padding is zero: the file was created empty)
            crc = zlib.crc32(self.meta_b, zlib.crc32(table))
            pos = meta_off + len(self.meta_b)
            for (_, _, off, _, nbytes), c in zip(self.plan, crcs):
                crc = crc32_combine(zlib.crc32(bytes(off - pos), crc), c, nbytes)
                pos = off + nbytes
            if pos != self.length:
                raise InternalError("container plan does not end at the file length")
            mv[: HEADER.size] = head(self.kind, self.length, len(self.plan), self.meta_b, crc)
        finally:
            mv.release()
        clock.lap("checksums")
        if durable:
            self.mm.flush()
            os.fsync(self.fd)
        else:
            start_writeback(self.fd)
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


# -- reading --------------------------------------------------------------------------------


class Container:
    """One memory-mapped container file, structurally checked on open (see the module
    docstring); arrays are zero-copy read-only views. `expected`: {array name: allowed dtype
    codes}, the exact set of arrays the file must hold (None: any). `stat` is the opened file's."""

    def __init__(self, path: Path, kind: int, expected: dict | None = None):
        self.path = path
        fd, st = open_regular(path, error=IndexFormatError, missing=MissingFileError)
        try:
            size = st.st_size
            if size < HEADER.size:
                self.fail(f"truncated: {size} bytes, shorter than the {HEADER.size}-byte header")
            try:
                self.mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                self.fail(f"cannot map ({exc})")
        finally:
            os.close(fd)
        self.stat = st
        self.nbytes = size
        self._parse(kind, size, expected)

    def _parse(self, kind, size, expected):
        mm = self.mm
        (magic, version, got_kind, length, n_arrays, meta_crc, meta_off, meta_len,
         self.payload_crc, _, head_crc) = HEADER.unpack_from(mm, 0)
        if magic != MAGIC:
            self.fail(f"not a suffixspec index file (bad magic {magic!r})")
        if zlib.crc32(mm[: HEADER.size - 4]) != head_crc:
            self.fail("damaged header (checksum mismatch)")
        if version != FORMAT_VERSION:
            self.fail(version_problem(version))
        if got_kind != kind:
            self.fail(f"is a {KIND_NAMES.get(got_kind, got_kind)} file, expected a {KIND_NAMES[kind]} file")
        if length != size:
            self.fail(f"{'truncated' if size < length else 'has trailing bytes'}: {size} bytes on disk, header says {length}")
        table_end = HEADER.size + ENTRY.size * n_arrays
        if n_arrays > MAX_ARRAYS or meta_off != table_end or meta_off + meta_len > size:
            self.fail("array table or meta block out of bounds")
        meta_b = mm[meta_off : meta_off + meta_len]
        if zlib.crc32(meta_b) != meta_crc:
            self.fail("damaged meta block (checksum mismatch)")
        try:
            self.meta = json.loads(meta_b)
        except ValueError:
            self.fail("damaged meta block (not JSON)")
        if not isinstance(self.meta, dict):
            self.fail("damaged meta block (not a JSON object)")
        entries, specs = {}, []
        for i in range(n_arrays):
            raw_name, raw_code, off, count, crc, _ = ENTRY.unpack_from(mm, HEADER.size + i * ENTRY.size)
            try:
                name, code = raw_name.rstrip(b"\0").decode("ascii"), raw_code.rstrip(b"\0").decode("ascii")
            except UnicodeDecodeError:
                self.fail(f"array table entry {i}: damaged name or dtype")
            if code not in DTYPES:
                self.fail(f"array {name}: unknown dtype {code!r}")
            if name in entries:
                self.fail(f"array {name}: listed twice")
            if expected is not None and (name not in expected or code not in expected[name]):
                self.fail(f"array {name} ({code}): not an array of this kind of file")
            entries[name] = (code, off, count, crc)
            specs.append((name, code, count))
        if expected is not None and len(entries) != len(expected):
            self.fail(f"missing array(s) {', '.join(sorted(set(expected) - set(entries)))}")
        # the table must be exactly the layout its writer computes: offsets increasing, aligned,
        # in bounds, each array right after the previous one (no overlap, no gap)
        layout, end = plan(meta_b, [(n, np.dtype(c), k) for n, c, k in specs]) if specs else ([], meta_off + meta_len)
        for (name, _, off, _, nbytes), (_, (code, got_off, count, _)) in zip(layout, entries.items()):
            if got_off != off or off + nbytes > size:
                self.fail(f"array {name}: out of place (offset {got_off}, {nbytes} bytes, file {size} bytes)")
        if end != size:
            self.fail(f"arrays end at byte {end}, the file has {size}")
        self.entries = entries

    def fail(self, what):
        raise IndexFormatError(f"{self.path}: {what}")

    def array(self, name: str) -> np.ndarray:
        if name not in self.entries:
            self.fail(f"missing array {name}")
        code, off, count, _ = self.entries[name]
        return np.frombuffer(self.mm, dtype=np.dtype(code), count=count, offset=off)

    def check_arrays(self, names) -> None:
        """Check the checksums of the named arrays (cheap for small ones)."""
        mv = memoryview(self.mm)
        try:
            for name in names:
                code, off, count, crc = self.entries[name]
                if zlib.crc32(mv[off : off + count * np.dtype(code).itemsize]) != crc:
                    self.fail(f"array {name} is damaged (checksum mismatch)")
        finally:
            mv.release()

    def verify(self) -> None:
        """Every checksum: each array's and the whole payload's."""
        self.check_arrays(self.entries)
        mv = memoryview(self.mm)
        try:
            whole = zlib.crc32(mv[HEADER.size :])
        finally:
            mv.release()
        if whole != self.payload_crc:
            self.fail("damaged contents (checksum mismatch)")
