"""Opening an index: one manifest snapshot, its shards mapped and checked, its deleted bitmap.

Contract. `open_snapshot(path, verify=...)` reads the manifest once and opens exactly the files
it names. On every open it checks cheaply, and raises an `IndexFormatError` naming the file on:
the manifest (always fully checksummed, it is small) and its consistency; each shard's
container structure (format.py), its meta against the manifest record (counts, size, payload
checksum: a file of another index or generation is refused), array lengths against the counts,
the root state, the edge offsets' ends, the document table (checksummed, and increasing), and
every token id of the text and of the edges (uint16 or int32) in [0, vocabulary size) (one vectorised pass per
array, once per process for a file unchanged since: see TOKENS_CHECKED); the deleted bitmap (checksummed, indexes in range). Other array contents are checked
lazily: the kernels range-check every index they follow and report damage (`Shard.corrupt`);
`Shard.layout` computes the occurrence layout restricted queries read (once per shard, checked
against the counts and suffix links).
`verify=True` adds every checksum of every file. A writer removes the files of an older
manifest only after publishing the new one; a reader that opened the older manifest and then
misses one of its files (or finds another generation's) re-reads the manifest and tries again
when it has been replaced, so concurrent writers never cause a false "missing file" error.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np

from .._kernels import corpus_build as cbk
from .._kernels.frozen import CORRUPT
from ..draft.automaton import FrozenAutomaton
from ..errors import IndexFormatError
from .format import (
    DELETED_DTYPES,
    KIND_DELETED,
    KIND_MANIFEST,
    KIND_SHARD,
    MANIFEST,
    SHARD_DTYPES,
    Container,
    MissingFileError,
)
from .manifest import check_manifest
from .shards import FROZEN_FIELDS

__all__ = ["Shard", "Snapshot", "open_snapshot", "SWAP_RETRIES", "SMALL_ARRAYS"]

SWAP_RETRIES = 8  # manifest replacements a single open rides out before giving up
SMALL_ARRAYS = ("doc_starts", "doc_info", "count_escapes")  # small arrays: checksummed on every open
# shard files whose token ranges this process checked: (dev, inode, size, mtime, ctime, payload crc,
# vocabulary) -> True. Any write to a file changes its ctime, so a changed file is checked again.
TOKENS_CHECKED: dict = {}


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Shard:
    """One mapped, checked shard: a FrozenAutomaton over its arrays; the occurrence layout on demand."""

    def __init__(self, path: Path, record: dict, number: int, vocab_size: int):
        self.path = path
        self.number = number
        self.file = f = Container(path, KIND_SHARD, SHARD_DTYPES)
        m = f.meta
        for key in ("n_tokens", "n_documents", "n_states", "n_edges", "n_implicit"):
            if not _count(m.get(key)):
                f.fail(f"meta {key}: expected a count, got {m.get(key)!r}")
        for key in ("n_tokens", "n_documents"):
            if m[key] != record[key]:
                f.fail(f"{key} is {m[key]}, the manifest says {record[key]}")
        if f.payload_crc != record["payload_crc"] or f.nbytes != record["bytes"]:
            f.fail("does not belong to this index (size or checksum differs from the manifest's)")
        a = {name: f.array(name) for name in SHARD_DTYPES}
        try:
            self.fa = FrozenAutomaton(**{k: a[k] for k in FROZEN_FIELDS})
        except IndexFormatError as exc:
            f.fail(str(exc))
        self.doc_info_bytes = a["doc_info"]
        self._layout = None  # (occ, occ_start), computed on the first restricted query
        self._layout_lock = threading.Lock()
        self.token_base, self.doc_base = record["token_base"], record["doc_base"]
        self.n_tokens, self.n_documents = record["n_tokens"], record["n_documents"]
        self.n_implicit = m["n_implicit"]
        fa = self.fa
        f.check_arrays(SMALL_ARRAYS)  # first: the root's count may be among the escapes
        checks = [
            (lambda: fa.tokens.shape[0] == self.n_tokens and fa.plink.shape[0] == self.n_tokens, "token array length"),
            (lambda: fa.doc_starts.shape[0] == self.n_documents, "document table length"),
            (lambda: fa.n_stored == m["n_states"] and fa.n_edges == m["n_edges"] and m["n_implicit"] <= self.n_tokens,
             "state/edge counts"),
            (lambda: int(fa.offsets[0]) == 0 and int(fa.offsets[-1]) == fa.n_edges, "edge offsets"),
            (lambda: fa.count_at(0) == self.n_tokens and int(fa.links[0]) == -1 and int(fa.lens[0]) == 0, "root state"),
        ]
        for ok, what in checks:
            if not ok():
                f.fail(f"inconsistent {what}")
        esc = fa.count_escapes  # checksummed (small): every escape names a stored state, in order
        if esc.shape[0] and not (bool(np.all(esc[2::2] > esc[:-2:2])) and 0 <= int(esc[0]) and int(esc[-2]) < fa.n_stored):
            f.fail("inconsistent count escapes")
        ds = fa.doc_starts
        if not (int(ds[0]) == 0 and bool(np.all(ds[1:] > ds[:-1])) and int(ds[-1]) < self.n_tokens):
            f.fail("inconsistent document starts")
        st = f.stat
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, f.payload_crc, vocab_size)
        if key not in TOKENS_CHECKED:  # a file once checked in this process, unchanged since: not again
            for name, arr in (("tokens", fa.tokens), ("etok", fa.etok)):
                # one vectorised pass: seen unsigned, a negative id is larger than any vocabulary
                if arr.shape[0] and int(arr.view(np.dtype(f"<u{arr.dtype.itemsize}")).max()) >= vocab_size:
                    f.fail(f"array {name}: token ids outside the vocabulary [0, {vocab_size})")
            if len(TOKENS_CHECKED) >= 4096:
                TOKENS_CHECKED.clear()
            TOKENS_CHECKED[key] = True

    def layout(self) -> tuple[np.ndarray, np.ndarray]:
        """(occ, occ_start): the occurrence layout (`_kernels/corpus_build.py`) that restricted
        queries read, computed once per open shard from its automaton and text (a walk of the text,
        then one placement pass, both without the GIL: other threads' queries and drafts go on) and
        kept in memory; a damaged shard raises IndexFormatError."""
        got = self._layout
        if got is None:
            with self._layout_lock:
                got = self._layout
                if got is None:
                    got = self._layout = self._compute_layout()
        return got

    def _compute_layout(self) -> tuple[np.ndarray, np.ndarray]:
        fa = self.fa
        pstate = cbk.prefix_states(fa.offsets, fa.etok, fa.eto, fa.tokens, fa.plink, fa.doc_starts)
        if pstate.shape[0] and pstate[0] == CORRUPT:
            self.corrupt("while walking the text")
        # over every state id (implicit ones and holes too), scratch rows for the stored ones only
        ns = fa.n_stored
        occ, occ_start = np.empty(self.n_tokens, np.int32), np.empty(ns + self.n_tokens, np.int32)
        if not cbk.place_occurrences_frozen(fa.links, fa.counts, fa.count_escapes, fa.plink, pstate, occ, occ_start,
                                            np.empty((ns, cbk.P_COLS), np.int32)):
            self.corrupt("the counts disagree with the suffix links and the text")
        occ.flags.writeable = False
        occ_start.flags.writeable = False
        return occ, occ_start

    def doc_info(self) -> dict:
        try:
            info = json.loads(bytes(self.doc_info_bytes))
            ids, tags = info["ids"], info["tags"]
            good = (isinstance(ids, list) and isinstance(tags, list) and len(ids) == self.n_documents
                    and len(tags) == self.n_documents and all(isinstance(i, str) for i in ids)
                    and all(isinstance(t, dict) for t in tags))
        except (ValueError, TypeError, KeyError):
            good = False
        if not good:
            self.file.fail("damaged document table")
        return info

    def corrupt(self, what):
        self.file.fail(f"damaged arrays ({what}); run `suffixspec info` to check the index")


class Snapshot:
    """What one open read: the manifest container, its shards and the deleted BitMap."""

    def __init__(self, manifest: Container, shards: list[Shard], deleted, deleted_file: Container | None):
        self.manifest, self.shards, self.deleted, self.deleted_file = manifest, shards, deleted, deleted_file

    @property
    def bytes_on_disk(self) -> int:
        return self.manifest.nbytes + sum(s.file.nbytes for s in self.shards) + (
            self.deleted_file.nbytes if self.deleted_file is not None else 0)

    def verify(self) -> None:
        """Every checksum of every file; raises IndexFormatError naming the damaged file."""
        self.manifest.verify()
        for s in self.shards:
            s.file.verify()
            s.doc_info()
        if self.deleted_file is not None:
            self.deleted_file.verify()


def _load_deleted(path: Path, record: dict, n_documents: int):
    from pyroaring import BitMap

    dfile = Container(path / record["file"], KIND_DELETED, DELETED_DTYPES)
    dfile.verify()  # small: always fully checked
    if dfile.payload_crc != record["payload_crc"] or dfile.nbytes != record["bytes"]:
        dfile.fail("does not belong to this index")
    try:
        deleted = BitMap.deserialize(bytes(dfile.array("bitmap")))
    except Exception:  # pyroaring raises several types on malformed input
        dfile.fail("damaged bitmap")
    if len(deleted) and deleted.max() >= n_documents:
        dfile.fail("deleted document index out of range")
    return deleted, dfile


def _read(path: Path, verify: bool) -> Snapshot:
    from pyroaring import BitMap

    manifest = Container(path / MANIFEST, KIND_MANIFEST, {})
    try:
        manifest.verify()  # small: always fully checked
        meta = manifest.meta
        check_manifest(manifest.path, meta)
        vocab = meta["tokenizer"]["vocab_size"]
        shards = [Shard(path / r["file"], r, i, vocab) for i, r in enumerate(meta["shards"])]
        deleted, dfile = BitMap(), None
        if meta.get("deleted"):
            deleted, dfile = _load_deleted(path, meta["deleted"], meta["n_documents"])
        snap = Snapshot(manifest, shards, deleted, dfile)
        if verify:
            snap.verify()
    except IndexFormatError as exc:
        exc.manifest_stat = manifest.stat
        raise
    return snap


def _replaced(path: Path, st: os.stat_result) -> bool:
    try:
        now = os.stat(path / MANIFEST)
    except OSError:
        return True
    return (now.st_ino, now.st_dev, now.st_size, now.st_mtime_ns) != (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


def open_snapshot(path: Path, *, verify: bool = False) -> Snapshot:
    """The index at directory `path` as one consistent snapshot (see the module docstring)."""
    for attempt in range(SWAP_RETRIES + 1):
        try:
            return _read(path, verify)
        except MissingFileError as exc:
            if getattr(exc, "manifest_stat", None) is None:
                raise IndexFormatError(f"{path}: not a suffixspec index (no {MANIFEST})") from None
            if attempt < SWAP_RETRIES and _replaced(path, exc.manifest_stat):
                continue
            raise
        except IndexFormatError as exc:
            st = getattr(exc, "manifest_stat", None)
            if st is not None and attempt < SWAP_RETRIES and _replaced(path, st):
                continue  # a writer swapped the manifest while we read the old one's files
            raise
    raise IndexFormatError(f"{path}: the index kept changing while being opened")  # not reached
